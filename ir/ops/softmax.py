"""Softmax, LogSoftmax, Hardmax (ONNX operator spec, sections "Softmax", "LogSoftmax", "Hardmax").

IR semantics are those of opset 13: one ``axis`` (default -1). Versions 1 and 11 "coerce the
input to 2-D at ``axis`` and normalise over all dims from ``axis`` on" (default axis 1); their
importer builds Reshape([outer, inner]) -> op(axis=-1) -> Reshape(original shape), or imports
directly when ``axis`` is already the last dim.

Kernels view the input as [outer, n, inner] around the axis. When ``inner`` is 1 the three
passes (max, sum of exp, normalise) run over contiguous rows; otherwise a block of up to
``CHUNK`` inner positions is processed at once with local accumulators, so the innermost loop
is contiguous in memory either way.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import KernelBuilder, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import norm_axis
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

CHUNK = 1024
_FLOATS = (DType.f16, DType.f32, DType.f64)


def _acc(dt: DType) -> DType:
    return DType.f32 if dt == DType.f16 else dt


def split_axis(shape, axis: int) -> tuple[int, int, int]:
    """(outer, n, inner) of ``shape`` around ``axis`` (already normalised)."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, shape[axis], inner


def axis_blocks(kb: KernelBuilder, shape, axis: int, body) -> None:
    """Loop over [outer, inner-chunk] around ``axis``; calls ``body(base, width, inner, n, rbase)``
    where element (j, t) of the current block (0 <= j < n, 0 <= t < width) is at flat offset
    ``base + j * inner + t``, and ``rbase + t`` is its offset in a tensor with ``axis`` reduced."""
    outer, n, inner = split_axis(shape, axis)
    chunk = min(inner, CHUNK)
    nblk = -(-inner // chunk) if inner else 0
    # blocks write disjoint outputs (each reduces along axis alone): spatial, may run in parallel
    with kb.loop(outer, hint="o", role="spatial") as o:
        if nblk == 1:
            body(o * (n * inner), inner, inner, n, o * inner)
        elif nblk > 1:
            with kb.loop(nblk, hint="ib", role="spatial") as ib:
                t0 = ib * chunk
                body(o * (n * inner) + t0, minimum(as_expr(chunk), inner - t0), inner, n, o * inner + t0)


def _infer_float(node) -> list[TensorType]:
    x = node.inputs[0]
    if x.dtype not in _FLOATS:
        raise ShapeError(f"input dtype {x.dtype} is not supported (f16, f32, f64)")
    norm_axis(node.attr("axis", -1), x.type.rank)
    return [x.type]


def _lower_softmax(ctx: LowerCtx, log: bool) -> None:
    x, y = ctx.inputs[0], ctx.outputs[0]
    if y.numel == 0:
        return
    axis = norm_axis(ctx.attr("axis", -1), len(x.shape))
    acc = _acc(x.dtype)
    # a backend schedule of "softmax" (ir.strategy; cuda: a block per row) or the generic nest
    if dispatch("softmax", ctx, log=log, axis=axis, acc=acc) is not NO_SCHEDULE:
        return
    kb = ctx.kernel()
    chunk = min(split_axis(x.shape, axis)[2], CHUNK)
    m = kb.local(acc, (chunk,), hint="max")
    s = kb.local(acc, (chunk,), hint="sum")
    keep_exp = not log and acc == y.dtype   # store exp(x - max) in y, then scale in place

    def body(base, width, inner, n, _rbase):
        def at(j, t):
            return base + j * inner + t

        with kb.loop(width, kind="vectorize", hint="t") as t:
            kb.store(m, t, as_expr(-math.inf, acc))
            kb.store(s, t, as_expr(0.0, acc))
        with kb.loop(n, hint="j") as j:
            with kb.loop(width, kind="vectorize", hint="t") as t:
                kb.store(m, t, maximum(m[t], x.flat(at(j, t)).cast(acc)))
        with kb.loop(n, hint="j") as j:
            with kb.loop(width, kind="vectorize", hint="t") as t:
                e = unop("exp", x.flat(at(j, t)).cast(acc) - m[t])
                if keep_exp:
                    kb.store(y, at(j, t), e)
                    e = y.flat(at(j, t))     # reuse the stored value: y may alias x for LLVM
                kb.store(s, t, s[t] + e)
        if log:
            with kb.loop(width, kind="vectorize", hint="t") as t:
                kb.store(s, t, m[t] + unop("log", s[t]))
        with kb.loop(n, hint="j") as j:
            with kb.loop(width, kind="vectorize", hint="t") as t:
                if log:
                    v = x.flat(at(j, t)).cast(acc) - s[t]
                elif keep_exp:
                    v = y.flat(at(j, t)) / s[t]
                else:
                    v = unop("exp", x.flat(at(j, t)).cast(acc) - m[t]) / s[t]
                kb.store(y, at(j, t), v.cast(y.dtype))

    axis_blocks(kb, x.shape, axis, body)


def _ref_softmax(node, x: np.ndarray, log: bool) -> np.ndarray:
    axis = norm_axis(node.attr("axis", -1), x.ndim)
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    m = np.max(w, axis=axis, keepdims=True) if w.size else w
    z = w - m
    if log:
        r = z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
    else:
        e = np.exp(z)
        r = e / np.sum(e, axis=axis, keepdims=True)
    return r.astype(x.dtype)


def import_coerced_2d(ctx, proto, version: int, new_since: int = 13):
    """Import a Softmax/LogSoftmax/Hardmax node of a version before 13 ("coerce to 2-D at
    axis, default axis 1") as Reshape -> op(axis=-1) -> Reshape."""
    if version >= new_since:
        return ctx.default_import(proto)
    x = ctx.value(proto.input[0])
    attrs = ctx.attrs(proto)
    rank = x.type.rank
    axis = attrs.get("axis", 1)
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if axis == rank - 1:
        return ctx.default_import(proto, attrs={"axis": -1})
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis:], dtype=np.int64))
    b = ctx.builder
    flat = b.Reshape(x, b.const(np.array([outer, inner], np.int64), "shape2d"))
    mid = b.op(proto.op_type, flat, axis=-1)
    out = b.op("Reshape", mid, b.const(np.array(x.shape, np.int64), "shape"),
               name=ctx.node_name(proto), out_names=[proto.output[0]], exact_names=True)
    return out


def _flops_per_elem(k: float):
    return lambda node: k * node.inputs[0].type.numel


@op("Softmax", OpPatternKind.OPAQUE, prologue=True)
class Softmax:
    """y = exp(x - max) / sum(exp(x - max)) along ``axis``. ONNX spec: Softmax-13.

    x: f16 (computed in f32), f32 or f64, any rank >= 1; y: same type. Softmax-1/-11 (coerce
    to 2-D at axis) are converted by the importer. Raises ShapeError for an axis out of range
    or an integer dtype.
    """
    infer = _infer_float

    def reference(node, ins):
        return [_ref_softmax(node, ins[0], log=False)]

    def lower(ctx):
        _lower_softmax(ctx, log=False)

    def importer(ctx, proto, version):
        return import_coerced_2d(ctx, proto, version)

    flops = _flops_per_elem(5.0)


@op("LogSoftmax", OpPatternKind.OPAQUE, prologue=True)
class LogSoftmax:
    """y = x - max - log(sum(exp(x - max))) along ``axis``. ONNX spec: LogSoftmax-13.

    Same types, shapes, versions and errors as Softmax.
    """
    infer = _infer_float

    def reference(node, ins):
        return [_ref_softmax(node, ins[0], log=True)]

    def lower(ctx):
        _lower_softmax(ctx, log=True)

    def importer(ctx, proto, version):
        return import_coerced_2d(ctx, proto, version)

    flops = _flops_per_elem(5.0)


@op("Hardmax", OpPatternKind.OPAQUE)
class Hardmax:
    """y = 1 at the first maximum along ``axis`` (default -1), 0 elsewhere. ONNX spec: Hardmax-13.

    Same types, shapes and errors as Softmax; Hardmax-1/-11 (coerce to 2-D at axis, default
    1) are converted by the importer.
    """
    infer = _infer_float

    def reference(node, ins):
        x = ins[0]
        axis = norm_axis(node.attr("axis", -1), x.ndim)
        if x.size == 0:
            return [np.zeros_like(x)]
        am = np.expand_dims(np.argmax(x, axis=axis), axis)
        y = np.zeros_like(x)
        np.put_along_axis(y, am, 1, axis=axis)
        return [y]

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        if y.numel == 0:
            return
        axis = norm_axis(ctx.attr("axis", -1), len(x.shape))
        kb = ctx.kernel()
        chunk = min(split_axis(x.shape, axis)[2], CHUNK)
        best = kb.local(x.dtype, (chunk,), hint="best")
        arg = kb.local(DType.i64, (chunk,), hint="arg")

        def body(base, width, inner, n, _rbase):
            with kb.loop(width, kind="vectorize", hint="t") as t:
                kb.store(best, t, x.flat(base + t))
                kb.store(arg, t, as_expr(0, DType.i64))
            with kb.loop(n, start=1, hint="j") as j:
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    v = x.flat(base + j * inner + t)
                    kb.store(arg, t, select(v > best[t], j, arg[t]))   # before best changes
                    kb.store(best, t, maximum(v, best[t]))
            with kb.loop(n, hint="j") as j:
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    kb.store(y, base + j * inner + t, select(arg[t].eq(j), as_expr(1.0, y.dtype),
                                                             as_expr(0.0, y.dtype)))

        axis_blocks(kb, x.shape, axis, body)

    def importer(ctx, proto, version):
        return import_coerced_2d(ctx, proto, version)

    flops = _flops_per_elem(1.0)
