"""RMSNormalization (ONNX spec "RMSNormalization", opset 23), SwiGLU (opset 28), Swish (opset 24).

- ``RMSNormalization(X, scale) -> Y``: ``Y = X / sqrt(mean(X^2 over axes [axis, rank)) +
  epsilon) * scale``. X any float dtype; ``scale`` (dtype V, which is Y's dtype) broadcasts
  unidirectionally to X. ``stash_type`` is the precision of the mean and reciprocal: 1 (float32,
  the default; float64 inputs keep float64) or 11 (float64).
- ``SwiGLU(A, B) -> Y``: ``Y = A * sigmoid(alpha * A) * B``; A and B have identical shapes and
  dtypes (no broadcasting).
- ``Swish(X) -> Y``: ``Y = X * sigmoid(alpha * X)``.

Float16/bfloat16 compute in float32 and round where the ONNX function bodies round (the sigmoid
term and each product). Errors (ShapeError): non-float dtypes, an ``axis`` out of range, a
``scale`` that does not broadcast to X, SwiGLU inputs of different shapes or dtypes.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import as_expr, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import check_float, norm_axis
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

_LOWP = (DType.f16, DType.bf16)
_STASH = {1: DType.f32, 11: DType.f64, 10: DType.f16, 16: DType.bf16}


# ----------------------------------------------------------------------------- RMSNormalization
def _rms_acc(node, dt: DType) -> DType:
    stash = node.attr("stash_type", 1)
    if stash not in _STASH:
        raise ShapeError(f"stash_type {stash} is not a float type code (1, 10, 11, 16)")
    s = _STASH[stash]
    return DType.f64 if DType.f64 in (s, dt) else DType.f32


def _rms_infer(node) -> list[TensorType]:
    x, scale = node.inputs[0], node.input(1)
    if scale is None:
        raise ShapeError("input 1 (scale) is required")
    check_float(x, "X")
    check_float(scale, "scale")
    r = x.type.rank
    if r == 0:
        raise ShapeError("X must have rank >= 1")
    norm_axis(node.attr("axis", -1), r)
    _rms_acc(node, x.dtype)
    if scale.type.rank > r or any(s not in (1, d) for s, d in zip(reversed(scale.shape), reversed(x.shape))):
        raise ShapeError(f"scale {list(scale.shape)} does not broadcast unidirectionally to X {list(x.shape)}")
    return [TensorType(scale.dtype, x.shape)]


def _rms_reference(node, ins):
    x, scale = ins[0], ins[1]
    axis = norm_axis(node.attr("axis", -1), x.ndim)
    acc = _rms_acc(node, DType.from_numpy(x.dtype)).numpy
    xa = x.astype(acc)
    ms = np.mean(xa * xa, axis=tuple(range(axis, x.ndim)), keepdims=True)
    normed = xa * (1.0 / np.sqrt(ms + acc.type(node.attr("epsilon", 1e-5))))
    if x.dtype != acc:
        normed = normed.astype(x.dtype)
    return [(normed.astype(acc) * scale.astype(acc)).astype(scale.dtype)]


def _rms_lower(ctx: LowerCtx) -> None:
    x, scale = ctx.inputs[0], ctx.inputs[1]
    y = ctx.outputs[0]
    if y.numel == 0:
        return
    node = ctx.node
    axis = norm_axis(node.attr("axis", -1), len(x.shape))
    acc = _rms_acc(node, x.dtype)
    n = int(np.prod(x.shape[axis:], dtype=np.int64))
    eps = as_expr(node.attr("epsilon", 1e-5), acc)
    kb = ctx.kernel()
    ss = kb.local(acc, (1,), hint="sumsq")
    with kb.grid(x.shape[:axis], kind="parallel") as outer:
        base = x.offset(list(outer) + [0] * (len(x.shape) - axis))
        kb.store(ss, 0, as_expr(0.0, acc))
        with kb.loop(n, kind="vectorize", hint="t") as t:
            v = x.flat(base + t).cast(acc)
            kb.store(ss, 0, ss[0] + v * v)
        kb.store(ss, 0, as_expr(1.0, acc) / unop("sqrt", ss[0] / float(n) + eps))
        with kb.grid(x.shape[axis:]) as inner:
            full = list(outer) + list(inner)
            normed = x[full].cast(acc) * ss[0]
            if x.dtype != acc:
                normed = normed.cast(x.dtype).cast(acc)
            kb.store(y, full, (normed * scale.bcast(full).cast(acc)).cast(y.dtype))


@op("RMSNormalization", OpPatternKind.OPAQUE)
class RMSNormalization:
    """Y = X / sqrt(mean(X^2 over [axis, rank)) + epsilon) * scale. ONNX spec:
    RMSNormalization-23. X [d0..dr-1] (f16/bf16/f32/f64), scale broadcastable to X; Y has X's
    shape and scale's dtype. One kernel per row: the sum of squares, then the scaled row."""

    infer = _rms_infer
    reference = _rms_reference
    lower = _rms_lower


# ----------------------------------------------------------------------------- Swish, SwiGLU
def _sigmoid(x):
    return as_expr(1.0, x.dtype) / (unop("exp", -x) + 1.0)


def _swish_expr(a, alpha: float):
    """a * sigmoid(alpha * a) with f16/bf16 rounded as the reference: sigmoid, then product."""
    dt = a.dtype
    if dt in _LOWP:
        af = a.cast(DType.f32)
        s = _sigmoid(af * alpha).cast(dt).cast(DType.f32)
        return (af * s).cast(dt)
    return a * _sigmoid(a * alpha)


def _swish_np(a: np.ndarray, alpha: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        if a.dtype in (np.float16,) or a.dtype.name == "bfloat16":
            af = a.astype(np.float32)
            s = (1.0 / (1.0 + np.exp(-alpha * af))).astype(a.dtype).astype(np.float32)
            return (af * s).astype(a.dtype)
        return (a * (1.0 / (1.0 + np.exp(-a.dtype.type(alpha) * a)))).astype(a.dtype)


def _swish_infer(node) -> list[TensorType]:
    check_float(node.inputs[0], "X")
    return [node.inputs[0].type]


@op("Swish", OpPatternKind.ELEMWISE)
class Swish:
    """Y = X * sigmoid(alpha * X). ONNX spec: Swish-24. Any float dtype; Y like X."""

    infer = _swish_infer

    def reference(node, ins):
        return [_swish_np(ins[0], float(node.attr("alpha", 1.0)))]

    def scalar(node, x):
        return _swish_expr(x, float(node.attr("alpha", 1.0)))


def _swiglu_infer(node) -> list[TensorType]:
    a, b = node.inputs[0], node.input(1)
    if b is None:
        raise ShapeError("input 1 (B) is required")
    check_float(a, "A")
    if a.dtype != b.dtype:
        raise ShapeError(f"A ({a.dtype}) and B ({b.dtype}) must have the same dtype")
    if a.shape != b.shape:
        raise ShapeError(f"A {list(a.shape)} and B {list(b.shape)} must have identical shapes (no broadcasting)")
    return [a.type]


@op("SwiGLU", OpPatternKind.ELEMWISE)
class SwiGLU:
    """Y = A * sigmoid(alpha * A) * B. ONNX spec: SwiGLU-28. A, B same shape and float dtype."""

    infer = _swiglu_infer

    def reference(node, ins):
        a, b = ins
        sw = _swish_np(a, float(node.attr("alpha", 1.0)))
        return [(sw.astype(np.float32) * b.astype(np.float32)).astype(a.dtype) if a.dtype == np.float16
                else (sw * b).astype(a.dtype)]

    def scalar(node, a, b):
        sw = _swish_expr(a, float(node.attr("alpha", 1.0)))
        if a.dtype in _LOWP:
            return (sw.cast(DType.f32) * b.cast(DType.f32)).cast(a.dtype)
        return sw * b
