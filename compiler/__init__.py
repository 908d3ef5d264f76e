"""tensorfuse compiler: ONNX model -> executable module.

The one public entry point is :func:`compile`. The names below are imported when first used
(PEP 562), so that importing a sub-module (``tensorfuse.compiler.cli`` for ``tensorfuse
--help``, ``tensorfuse.compiler.target``) does not import onnx, numpy or LLVM.
"""
from __future__ import annotations

import importlib

from tensorfuse import __version__  # noqa: F401  (one version, in the package root)

# public name -> (module, attribute)
_API = {
    "compile": ("tensorfuse.compiler.driver", "compile"),
    "cache_info": ("tensorfuse.compiler.driver", "cache_info"),
    "CompileOptions": ("tensorfuse.compiler.options", "CompileOptions"),
    "CompileReport": ("tensorfuse.compiler.report", "CompileReport"),
    "export_onnx": ("tensorfuse.compiler.export", "export_onnx"),
    "CompileError": ("tensorfuse.ir.errors", "CompileError"),
    "ModelLoadError": ("tensorfuse.ir.errors", "ModelLoadError"),
    "TensorfuseError": ("tensorfuse.ir.errors", "TensorfuseError"),
    "UnsupportedModelError": ("tensorfuse.ir.errors", "UnsupportedModelError"),
}

__all__ = ["compile", "cache_info", "CompileOptions", "CompileReport", "export_onnx", "CompileError",
           "ModelLoadError", "TensorfuseError", "UnsupportedModelError"]


def __getattr__(name: str):
    try:
        module, attr = _API[name]
    except KeyError:
        raise AttributeError(f"module 'tensorfuse.compiler' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))
