"""Tensor generators: ConstantOfShape, Range, EyeLike (ONNX operator spec, opset 28 semantics).

Their output shapes depend on input *values* (ConstantOfShape's shape, Range's bounds), which
must therefore be known at compile time; EyeLike depends on the input's type alone. The kernels
fill the output from values fixed at compile time and read no input buffer.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import I64, as_expr
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.ops.shape import ints
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

GEN = OpPatternKind.OPAQUE


# ----------------------------------------------------------------------------- ConstantOfShape
def _cos_value(node) -> np.ndarray:
    v = node.attr("value", None)
    if v is None:
        return np.zeros((), np.float32)
    v = np.asarray(v)
    if v.size != 1:
        raise ShapeError(f"the value attribute must hold one element, it has {v.size}")
    return v.reshape(())


def _cos_shape(shape) -> tuple[int, ...]:
    dims = ints(shape)
    if np.asarray(shape).ndim > 1:
        raise ShapeError(f"the shape input must be 1-D, it is {np.asarray(shape).ndim}-D")
    if any(d < 0 for d in dims):
        raise ShapeError(f"shape {dims} has a negative dimension")
    return tuple(dims)


@op("ConstantOfShape", GEN, const_inputs=(0,))
class ConstantOfShape:
    """ConstantOfShape(shape) -> a tensor of that shape filled with ``value`` (a one-element
    tensor attribute; default float32 0), of value's dtype.

    shape: int64 1-D, known at compile time (empty: a scalar). Raises ShapeError for negative
    dims or a value of more than one element. ONNX spec: ConstantOfShape-25.
    """

    def infer(node):
        shape = const_input(node, 0, "shape")
        val = _cos_value(node)
        return [TensorType(DType.from_numpy(val.dtype), _cos_shape(shape))]

    def reference(node, ins):
        val = _cos_value(node)
        return [np.full(_cos_shape(ins[0]), val, dtype=val.dtype)]

    def lower(ctx):
        y = ctx.outputs[0]
        val = _cos_value(ctx.node).item()
        kb = ctx.kernel(params=[y])
        with kb.loop(y.numel, kind="vectorize") as i:
            kb.store(y, i, as_expr(val, y.dtype))


# ----------------------------------------------------------------------------- Range
def _range_args(node, start, limit, delta):
    vals = []
    for what, a in (("start", start), ("limit", limit), ("delta", delta)):
        a = np.asarray(a)
        if a.size != 1:
            raise ShapeError(f"{what} must be a scalar, it has shape {list(a.shape)}")
        vals.append(a.reshape(()))
    return vals


def _stash(node, dt: np.dtype) -> np.dtype:
    """The computation type: f16/bf16 compute in f32 when stash_type=1 (Range-27)."""
    low = dt.name == "bfloat16" or (dt.kind == "f" and dt.itemsize < 4)
    return np.dtype(np.float32) if low and node.attr("stash_type", 1) == 1 else dt


def range_values(node, start, limit, delta) -> np.ndarray:
    """Range-27 output: n = max(ceil((limit - start) / delta), 0), y[i] = start + i * delta."""
    start, limit, delta = _range_args(node, start, limit, delta)
    dt = start.dtype
    if dt.kind in "iu":
        s, l, d = int(start), int(limit), int(delta)
        if d == 0:
            raise ShapeError("delta is 0")
        n = max(-((s - l) // d), 0)      # ceil((l - s) / d) in exact integers
        return (s + d * np.arange(n, dtype=np.int64)).astype(dt)
    ct = _stash(node, dt)
    s, l, d = start.astype(ct), limit.astype(ct), delta.astype(ct)
    if float(d) == 0.0:
        raise ShapeError("delta is 0")
    q = float(l - s) / float(d)
    if not math.isfinite(q):
        raise ShapeError(f"Range({float(s)}, {float(l)}, {float(d)}) has no finite length")
    n = max(math.ceil(q), 0)
    return (s + np.arange(n).astype(ct) * d).astype(dt)


def _range_infer(node):
    ins = [const_input(node, i, w) for i, w in enumerate(("start", "limit", "delta"))]
    if any(a is None for a in ins):
        raise ShapeError("start, limit and delta are required")
    dts = {v.dtype for v in node.inputs}
    if len(dts) != 1:
        raise ShapeError(f"start, limit and delta have different dtypes: {sorted(d.value for d in dts)}")
    return [TensorType(node.inputs[0].dtype, range_values(node, *ins).shape)]


def _range_import(ctx, proto, version):
    if version < 27:       # Range-11 had no stash_type (and no 16-bit float types)
        return ctx.default_import(proto, attrs={**ctx.attrs(proto), "stash_type": 0})
    return ctx.default_import(proto)


@op("Range", GEN, const_inputs=(0, 1, 2))
class Range:
    """Range(start, limit, delta) -> 1-D [start, start+delta, ...) up to limit (exclusive).

    Inputs: scalars of one dtype (f16, bf16, f32, f64, i16, i32, i64), known at compile time
    because they fix the output length n = max(ceil((limit-start)/delta), 0). y[i] = start +
    i*delta; with stash_type=1 (default) f16/bf16 compute in f32. Raises ShapeError for a zero
    delta or inputs not known at compile time. ONNX spec: Range-27.
    """

    infer = _range_infer

    def reference(node, ins):
        return [range_values(node, *ins[:3])]

    importer = _range_import

    def lower(ctx):
        y = ctx.outputs[0]
        start, _, delta = _range_args(ctx.node, ctx.const(0), ctx.const(1), ctx.const(2))
        ct = DType.from_numpy(_stash(ctx.node, start.dtype))
        kb = ctx.kernel(params=[y])
        with kb.loop(y.numel, kind="vectorize") as i:
            v = as_expr(start.item(), ct) + i.cast(ct) * as_expr(delta.item(), ct)
            kb.store(y, i, v.cast(y.dtype))


# ----------------------------------------------------------------------------- EyeLike
def _eye_dtype(node) -> DType:
    dt = node.attr("dtype", None)
    return node.inputs[0].dtype if dt is None else DType.from_onnx(int(dt))


@op("EyeLike", GEN)
class EyeLike:
    """EyeLike(input) -> 2-D tensor of input's shape with ones on diagonal ``k`` (j - i = k,
    default 0) and zeros elsewhere; dtype from the ``dtype`` attribute, else input's.

    input: rank 2, any numeric or bool dtype (only its type is read). Raises ShapeError for
    another rank. ONNX spec: EyeLike-22.
    """

    def infer(node):
        x = node.inputs[0]
        if x.type.rank != 2:
            raise ShapeError(f"input must be 2-D, it has rank {x.type.rank}")
        return [TensorType(_eye_dtype(node), x.shape)]

    def reference(node, ins):
        dt = _eye_dtype(node).numpy
        return [np.eye(*ins[0].shape, k=int(node.attr("k", 0)), dtype=dt)]

    def known(node):
        dt = _eye_dtype(node).numpy
        return [np.eye(*node.inputs[0].shape, k=int(node.attr("k", 0)), dtype=dt)]

    def lower(ctx):
        y = ctx.outputs[0]
        k = int(ctx.attr("k", 0))
        kb = ctx.kernel(params=[y])
        with kb.grid(y.shape) as (i, j):
            kb.store(y, [i, j], ((j - i).eq(k)).cast(y.dtype))
