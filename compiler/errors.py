"""The error classes, re-exported from their home :mod:`tensorfuse.ir.errors` (they moved there
so that ``ir``, ``codegen`` and ``runtime`` raise them without importing the compiler);
``tensorfuse.compiler.errors`` keeps working for code that imports them from here."""
from tensorfuse.ir.errors import (CompileError, DeclaredShapeWarning, ModelLoadError,  # noqa: F401
                                  TensorfuseError, UnsupportedModelError)

__all__ = ["CompileError", "DeclaredShapeWarning", "ModelLoadError", "TensorfuseError", "UnsupportedModelError"]
