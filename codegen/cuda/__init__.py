"""CUDA code generation: kernel IR to numba.cuda source (emit), compiled and launched (jit), and the cuda backend (backend)."""
