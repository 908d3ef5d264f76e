"""CPU code generation through llvmlite."""
