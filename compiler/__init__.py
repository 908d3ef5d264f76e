"""tensorfuse compiler: ONNX model -> executable module.

The one public entry point is :func:`compile`.
"""
from __future__ import annotations

from tensorfuse.compiler.driver import cache_info, compile
from tensorfuse.compiler.errors import CompileError, ModelLoadError, TensorfuseError, UnsupportedModelError
from tensorfuse.compiler.explain import explain
from tensorfuse.compiler.export import export_onnx
from tensorfuse.compiler.options import CompileOptions
from tensorfuse.compiler.report import CompileReport

__all__ = ["compile", "cache_info", "CompileOptions", "CompileReport", "explain", "export_onnx", "CompileError", "ModelLoadError", "TensorfuseError", "UnsupportedModelError"]
from tensorfuse import __version__  # noqa: E402  (one version, in the package root)
