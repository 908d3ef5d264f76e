"""The llvm backend's schedules: importing this package registers each of them in
``ir.strategy`` (see docs/architecture.md, "Adding a schedule")."""
