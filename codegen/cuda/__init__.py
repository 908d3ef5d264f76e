"""CUDA code generation: kernel IR to numba.cuda source (emit), compiled and launched (jit), and the cuda backend (backend)."""
from tensorfuse.runtime import cuda_compat as _cuda_compat  # noqa: F401  (before numba.cuda is imported)
