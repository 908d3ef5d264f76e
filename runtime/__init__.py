"""tensorfuse runtime: executable modules (kernels + memory plan), saved and loaded."""
from .module import Module, TensorInfo

__all__ = ["Module", "TensorInfo"]
