"""tensorfuse compiler: ONNX model -> executable module.

The one public entry point is :func:`compile`.
"""
from __future__ import annotations

from compiler.driver import compile
from compiler.errors import CompileError, ModelLoadError, TensorfuseError, UnsupportedModelError
from compiler.explain import explain
from compiler.export import export_onnx
from runtime.cache import cache_info

__all__ = ["compile", "cache_info", "explain", "export_onnx", "CompileError", "ModelLoadError", "TensorfuseError", "UnsupportedModelError"]
__version__ = "0.1.0"
