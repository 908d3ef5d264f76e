"""Targets, re-exported from their home :mod:`tensorfuse.ir.target` (``Target`` moved there so
that lowerings and code generators read it without importing the compiler);
``tensorfuse.compiler.target`` keeps working for code that imports it from here.

Also :func:`cuda_unavailable_reason` and :func:`cuda_available`, which ask the runtime
(``runtime.cuda_module``) whether the cuda target can run here.
"""
from tensorfuse.ir.target import KIND_TRAITS, KindTraits, Target  # noqa: F401

__all__ = ["KIND_TRAITS", "KindTraits", "Target", "cuda_available", "cuda_unavailable_reason"]


def cuda_unavailable_reason() -> str | None:
    """Why the cuda target cannot run here, or None when it can: the CUDA simulator
    (``NUMBA_ENABLE_CUDASIM=1``) is checked first, then ``cuda.is_available()`` (the reason is
    ``cuda.cuda_error()``: no driver, no GPU), then whether libNVVM loads. Quick: nothing is
    compiled (``runtime.cuda_module.cuda_unavailable_reason``)."""
    from tensorfuse.runtime.cuda_module import cuda_unavailable_reason as reason
    return reason()


def cuda_available() -> bool:
    """True when the cuda target can run here: a GPU through numba.cuda with libNVVM, or the
    simulator (NUMBA_ENABLE_CUDASIM=1); :func:`cuda_unavailable_reason` says why not."""
    return cuda_unavailable_reason() is None
