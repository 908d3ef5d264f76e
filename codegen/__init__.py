"""Code generators: kernel IR -> target code (``codegen.llvm`` for CPU, ``codegen.cuda`` for GPU)."""
