"""tensorfuse compiler: ONNX model -> executable module.

The one public entry point is :func:`compile`.
"""
from __future__ import annotations

from compiler.driver import compile
from compiler.errors import CompileError, ModelLoadError, TensorfuseError, UnsupportedModelError

__all__ = ["compile", "CompileError", "ModelLoadError", "TensorfuseError", "UnsupportedModelError"]
__version__ = "0.1.0"
