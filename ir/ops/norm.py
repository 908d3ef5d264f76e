"""Normalisations: LayerNormalization, InstanceNormalization, GroupNormalization,
LpNormalization, MeanVarianceNormalization, LRN (ONNX operator spec, the section of each op).

Statistics are computed in two passes (mean, then the mean of squared deviations), which is
more accurate than E[x^2] - E[x]^2; f16 inputs are computed in f32.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ir.kernel import Buffer, Const, Expr, KernelBuilder, as_expr, maximum, minimum, select, unop
from ir.lowering import LowerCtx
from ir.ops._common import broadcast_shapes, norm_axis
from ir.registry import OpPatternKind, ShapeError, op
from ir.types import DType, TensorType

I64 = DType.i64
_FLOATS = (DType.f16, DType.f32, DType.f64)


def _compute(dt: DType) -> DType:
    return DType.f32 if dt == DType.f16 else dt


def _check_float(v, what: str) -> None:
    if v.dtype not in _FLOATS:
        raise ShapeError(f"{what} dtype {v.dtype} is not supported (f16, f32, f64)")


def _check_unidirectional(v, target: Sequence[int], what: str) -> None:
    s = tuple(v.shape)
    if len(s) > len(target) or any(d not in (1, t) for d, t in zip(s[::-1], tuple(target)[::-1])):
        raise ShapeError(f"{what} of shape {list(s)} does not broadcast to {list(target)}")


def _unravel(flat: Expr, shape: Sequence[int]) -> list[Expr]:
    """Multi-index of a flat offset into ``shape`` (div/mod; only used off the fast path)."""
    idx = []
    for k, d in enumerate(shape):
        inner = int(np.prod(shape[k + 1:], dtype=np.int64))
        idx.append((flat / inner) % d if k else flat / inner)
    return idx


def _row_loader(buf: Buffer | None, shape: Sequence[int], axis: int):
    """load(o, j) for a tensor broadcast unidirectionally against ``shape``, at row ``o`` and
    position ``j`` within the normalised dims [axis, rank). Flat ``j`` when ``buf`` has the
    normalised shape (after leading 1s), else a full multi-index."""
    if buf is None:
        return None
    rank = len(shape)
    bs = (1,) * (rank - len(buf.shape)) + tuple(buf.shape)
    if all(d == 1 for d in bs[:axis]) and tuple(bs[axis:]) == tuple(shape[axis:]):
        return lambda o, j: buf.flat(j)
    outer, inner = tuple(shape[:axis]), tuple(shape[axis:])
    return lambda o, j: buf.bcast(_unravel(o, outer) + _unravel(j, inner))


# ----------------------------------------------------------------------------- LayerNormalization
def emit_layernorm(ctx: LowerCtx, x: Buffer, scale: Buffer, bias: Buffer | None, y: Buffer,
                   mean_out: Buffer | None, inv_out: Buffer | None, axis: int, eps: float,
                   stash: DType) -> None:
    """Per row over dims [axis, rank): mean, inverse std dev (two passes, in ``stash`` dtype),
    then y = cast(normalised) * scale + bias. The y store is the only write to ``y``."""
    shape = x.shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    n = int(np.prod(shape[axis:], dtype=np.int64))
    kb = ctx.kernel()
    ct = stash
    ld_s, ld_b = _row_loader(scale, shape, axis), _row_loader(bias, shape, axis)
    m = kb.local(ct, (1,), hint="mean")
    v = kb.local(ct, (1,), hint="var")
    with kb.loop(outer, hint="o") as o:
        base = o * n
        kb.store(m, 0, as_expr(0.0, ct))
        with kb.loop(n, hint="j") as j:
            kb.store(m, 0, m[0] + x.flat(base + j).cast(ct))
        kb.store(m, 0, m[0] / as_expr(float(n), ct))
        kb.store(v, 0, as_expr(0.0, ct))
        with kb.loop(n, hint="j") as j:
            d = x.flat(base + j).cast(ct) - m[0]
            kb.store(v, 0, v[0] + d * d)
        kb.store(v, 0, as_expr(1.0, ct) / unop("sqrt", v[0] / as_expr(float(n), ct) + as_expr(eps, ct)))
        with kb.loop(n, kind="vectorize", hint="j") as j:
            r = ((x.flat(base + j).cast(ct) - m[0]) * v[0]).cast(y.dtype) * ld_s(o, j)
            if ld_b is not None:
                r = r + ld_b(o, j)
            kb.store(y, base + j, r)
        if mean_out is not None:
            kb.store(mean_out, o, m[0].cast(mean_out.dtype))
        if inv_out is not None:
            kb.store(inv_out, o, v[0].cast(inv_out.dtype))


def _stash(node) -> DType:
    st = node.attr("stash_type", 1)
    if st != 1:
        raise ShapeError(f"stash_type {st} is not supported (only 1: float32)")
    x = node.inputs[0].dtype
    return DType.f64 if x == DType.f64 else DType.f32


@op("LayerNormalization", OpPatternKind.OPAQUE)
class LayerNormalization:
    """Y = (X - mean) / sqrt(var + epsilon) * Scale + B over dims [axis, rank).
    ONNX spec: LayerNormalization-17.

    X: f16/f32/f64 of rank >= 1; Scale and B (optional) broadcast unidirectionally to X.
    Outputs: Y (X's type and shape); optional Mean and InvStdDev of shape
    X.shape[:axis] + [1] * (rank - axis) in the stash type f32 (f64 inputs are computed in
    f64, as onnxruntime does, and their statistics returned as f32). Attributes axis (default -1), epsilon (1e-5),
    stash_type (1 only). Raises ShapeError for an axis out of range, Scale/B that do not
    broadcast, mixed dtypes or stash_type other than 1.
    """

    def infer(node):
        x, scale, b = node.inputs[0], node.input(1), node.input(2)
        _check_float(x, "X")
        if scale is None:
            raise ShapeError("Scale (input 1) is required")
        for v, what in ((scale, "Scale"), (b, "B")):
            if v is not None:
                if v.dtype != x.dtype:
                    raise ShapeError(f"{what} dtype {v.dtype} differs from X's {x.dtype}")
                _check_unidirectional(v, x.shape, what)
        axis = norm_axis(node.attr("axis", -1), x.type.rank)
        st = _stash(node)
        stat = TensorType(DType.f32, x.shape[:axis] + (1,) * (x.type.rank - axis))
        return [x.type, stat, stat]

    def reference(node, ins):
        x, scale = ins[0], ins[1]
        b = ins[2] if len(ins) > 2 else None
        axis = norm_axis(node.attr("axis", -1), x.ndim)
        st = _stash(node).numpy
        eps = node.attr("epsilon", 1e-5)
        ax = tuple(range(axis, x.ndim))
        w = x.astype(st)
        mean = np.mean(w, axis=ax, keepdims=True)
        d = w - mean
        var = np.mean(d * d, axis=ax, keepdims=True)
        inv = (1.0 / np.sqrt(var + st.type(eps))).astype(st)
        y = (d * inv).astype(x.dtype) * scale
        if b is not None:
            y = y + b
        return [y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32)]

    def lower(ctx):
        x = ctx.inputs[0]
        scale = ctx.inputs[1]
        bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        outs = ctx.outputs + [None] * (3 - len(ctx.outputs))
        axis = norm_axis(ctx.attr("axis", -1), len(x.shape))
        emit_layernorm(ctx, x, scale, bias, outs[0], outs[1], outs[2], axis,
                       float(ctx.attr("epsilon", 1e-5)), _stash(ctx.node))

    def flops(node):
        return 8.0 * node.inputs[0].type.numel
