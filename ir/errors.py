"""Errors users see. Each says what is wrong with *their* input, never an internal traceback.

They live here, in the lowest layer, so that ``ir``, ``codegen`` and ``runtime`` raise them
without importing the compiler; ``tensorfuse`` and ``tensorfuse.compiler.errors`` re-export them."""
from __future__ import annotations


class TensorfuseError(Exception):
    """Base of every error tensorfuse raises on purpose."""


class ModelLoadError(TensorfuseError, ValueError):
    """The file or bytes are not a valid ONNX model (missing, corrupt, fails onnx.checker)."""


class UnsupportedModelError(TensorfuseError, ValueError):
    """The model uses ops, opsets, types or dynamic shapes tensorfuse cannot compile.

    ``unsupported`` maps each unsupported op type to the names of its nodes.
    """

    def __init__(self, message: str, unsupported: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.unsupported = unsupported or {}


class CompileError(TensorfuseError, RuntimeError):
    """A pass, the lowering or the code generator failed; names the pass and the node."""


class DeclaredShapeWarning(UserWarning):
    """A graph output or ``value_info`` entry declares a definite shape that contradicts the one
    tensorfuse infers. A warning, not an error: ``onnx.shape_inference`` itself writes such
    declarations for some valid models (Resize at a rounding boundary, pools with ``ceil_mode``,
    NonMaxSuppression, STFT), and onnxruntime runs them, warning, with the shape tensorfuse
    infers. A contradicting dtype, or an initializer whose shape contradicts its graph-input
    entry, is a ``ModelLoadError``."""
