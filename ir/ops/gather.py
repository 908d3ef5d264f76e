"""Indexing ops: Gather, GatherElements, GatherND, ScatterElements (and the deprecated Scatter),
ScatterND, OneHot, Compress, NonZero (ONNX operator spec, opset 28 semantics).

Indices are read at run time. ONNX makes an out-of-range index an error: a check kernel
(``LowerCtx.check_indices``) validates run-time indices first, and ``Module.run`` raises a
ValueError naming the node and the value; the main kernels still clamp into [0, dim-1] after
wrapping negative indices (i + dim), so memory stays safe. The numpy references raise IndexError.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import I64, Expr, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.ops._common import const_input, norm_axis
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

INJ = OpPatternKind.INJECTIVE
INDEX_DTYPES = (DType.i32, DType.i64)


def check_index_dtype(v, what: str = "indices", allowed=INDEX_DTYPES) -> None:
    if v.dtype not in allowed:
        raise ShapeError(f"{what} must be {' or '.join(d.value for d in allowed)}, got {v.dtype.value}")


def wrap_index(k: Expr, dim: int) -> Expr:
    """An index read at run time as i64: negative counts from the back, then clamped to
    [0, dim-1] (out-of-range indices are an ONNX error; clamping keeps the kernel in bounds)."""
    k = k.cast(I64)
    k = select(k < 0, k + dim, k)
    return select(k < 0, 0, select(k > dim - 1, dim - 1, k))


def np_wrap(idx: np.ndarray, dim: int, what: str = "index") -> np.ndarray:
    """Negative indices + dim; IndexError naming the first out-of-range index."""
    idx = np.asarray(idx).astype(np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if bad.any():
        raise IndexError(f"{what} {int(idx[bad].ravel()[0])} is out of range for a dimension of size {dim}")
    return np.where(idx < 0, idx + dim, idx)


@op("Gather", INJ, quant_passthrough="copy")
class Gather:
    """Gather(data, indices) -> data indexed along ``axis`` (default 0) by indices.

    data: any dtype, rank r >= 1; indices: int32/int64 of any rank q (negative values count
    from the back). Output: data.shape[:axis] + indices.shape + data.shape[axis+1:], data's
    dtype. Raises ShapeError for a scalar data input, a bad axis or index dtype.
    ONNX spec: Gather-13.
    """

    def infer(node):
        data, ind = node.inputs[0], node.inputs[1]
        check_index_dtype(ind)
        if data.type.rank == 0:
            raise ShapeError("data must have rank >= 1")
        a = norm_axis(node.attr("axis", 0), data.type.rank)
        return [TensorType(data.dtype, data.shape[:a] + ind.shape + data.shape[a + 1:])]

    def reference(node, ins):
        data, ind = ins
        a = norm_axis(node.attr("axis", 0), data.ndim)
        return [np.take(data, np_wrap(ind, data.shape[a]), axis=a)]

    def lower(ctx):
        data, ind = ctx.inputs
        y = ctx.outputs[0]
        a = norm_axis(ctx.attr("axis", 0), len(data.shape))
        q = len(ind.shape)
        ctx.check_indices(1, data.shape[a])
        kb = ctx.kernel()
        if y.numel == 0:
            return
        with kb.grid(y.shape) as idx:
            k = wrap_index(ind[idx[a:a + q]] if q else ind.flat(0), data.shape[a])
            kb.store(y, idx, data[idx[:a] + [k] + idx[a + q:]])


# ----------------------------------------------------------------------------- GatherElements
def _ge_axis(node, data, ind) -> int:
    if data.type.rank != ind.type.rank:
        raise ShapeError(f"data (rank {data.type.rank}) and indices (rank {ind.type.rank}) must have the same rank")
    return norm_axis(node.attr("axis", 0), data.type.rank)


@op("GatherElements", INJ)
class GatherElements:
    """GatherElements(data, indices) -> out[i] = data[i with i[axis] = indices[i]].

    data: any dtype, rank r >= 1; indices: int32/int64, rank r, each dim <= data's except along
    ``axis`` (negative indices count from the back). Output: indices' shape, data's dtype.
    ONNX spec: GatherElements-13.
    """

    def infer(node):
        data, ind = node.inputs[0], node.inputs[1]
        check_index_dtype(ind)
        _ge_axis(node, data, ind)
        return [TensorType(data.dtype, ind.shape)]

    def reference(node, ins):
        data, ind = ins
        a = norm_axis(node.attr("axis", 0), data.ndim)
        # only the leading part of data along the other axes is read (no broadcasting)
        part = data[tuple(slice(None) if d == a else slice(0, n) for d, n in enumerate(ind.shape))]
        return [np.take_along_axis(part, np_wrap(ind, data.shape[a]), axis=a)]

    def lower(ctx):
        data, ind = ctx.inputs
        y = ctx.outputs[0]
        a = _ge_axis(ctx.node, ctx.node.inputs[0], ctx.node.inputs[1])
        ctx.check_indices(1, data.shape[a])
        kb = ctx.kernel()
        if y.numel == 0:
            return
        with kb.grid(y.shape) as idx:
            k = wrap_index(ind[idx], data.shape[a])
            kb.store(y, idx, data[idx[:a] + [k] + idx[a + 1:]])


# ----------------------------------------------------------------------------- GatherND
def _gnd_shape(node, dshape, ishape) -> tuple[int, int, tuple[int, ...]]:
    b = int(node.attr("batch_dims", 0))
    r, q = len(dshape), len(ishape)
    if q < 1 or r < 1:
        raise ShapeError("data and indices must have rank >= 1")
    k = ishape[-1]
    if not 0 <= b < min(r, q):
        raise ShapeError(f"batch_dims {b} must be in [0, min(rank(data), rank(indices)) - 1]")
    if tuple(dshape[:b]) != tuple(ishape[:b]):
        raise ShapeError(f"the first {b} dims of data {list(dshape)} and indices {list(ishape)} differ")
    if not 1 <= k <= r - b:
        raise ShapeError(f"indices' last dim {k} must be in [1, rank(data) - batch_dims = {r - b}]")
    return b, k, tuple(ishape[:-1]) + tuple(dshape[b + k:])


@op("GatherND", INJ)
class GatherND:
    """GatherND(data, indices) -> slices of data addressed by the last dim of indices.

    data: any dtype, rank r; indices: int64 (int32 accepted), rank q, last dim k in
    [1, r - batch_dims]; the first batch_dims dims of both are batch dims. Output shape:
    indices.shape[:-1] + data.shape[batch_dims + k:]. Negative indices count from the back.
    ONNX spec: GatherND-13.
    """

    def infer(node):
        data, ind = node.inputs[0], node.inputs[1]
        check_index_dtype(ind)
        _, _, shape = _gnd_shape(node, data.shape, ind.shape)
        return [TensorType(data.dtype, shape)]

    def reference(node, ins):
        data, ind = ins
        b, k, shape = _gnd_shape(node, data.shape, ind.shape)
        ind = ind.astype(np.int64)
        out = np.empty(shape, data.dtype)
        bshape = ind.shape[:b]
        rest = ind.shape[b:-1]
        for bi in np.ndindex(*bshape):
            for ri in np.ndindex(*rest):
                t = tuple(int(np_wrap(v, data.shape[b + j])) for j, v in enumerate(ind[bi + ri]))
                out[bi + ri] = data[bi + t]
        return [out]

    def lower(ctx):
        data, ind = ctx.inputs
        y = ctx.outputs[0]
        b, k, _ = _gnd_shape(ctx.node, data.shape, ind.shape)
        q = len(ind.shape)
        ctx.check_indices(1, list(data.shape[b:b + k]))
        kb = ctx.kernel()
        if y.numel == 0:
            return
        with kb.grid(y.shape) as idx:
            lead = idx[:q - 1]
            src = list(idx[:b])
            for j in range(k):
                src.append(wrap_index(ind[lead + [j]], data.shape[b + j]))
            src += idx[q - 1:]
            kb.store(y, idx, data[src])


# ----------------------------------------------------------------------------- Scatter*
REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduce_expr(red: str, old, new):
    if red == "none":
        return new
    if red == "add":
        return old + new
    if red == "mul":
        return old * new
    if old.dtype == DType.bool:
        return (old | new) if red == "max" else (old & new)
    return maximum(old, new) if red == "max" else minimum(old, new)


def _np_reduce(red: str, old, new):
    if red == "none":
        return new
    if red == "add":
        return old + new
    if red == "mul":
        return old * new
    return np.maximum(old, new) if red == "max" else np.minimum(old, new)


def _check_reduction(node) -> str:
    red = node.attr("reduction", "none")
    if red not in REDUCTIONS:
        raise ShapeError(f"reduction {red!r} is not one of {', '.join(REDUCTIONS)}")
    return red


def emit_copy_then_scatter(ctx, data, y, body) -> None:
    """y = data, then ``body(kb)`` applies the updates serially (later updates win)."""
    kb = ctx.kernel()
    with kb.loop(y.numel, kind="vectorize") as i:
        kb.store(y, i, data.flat(i))
    body(kb)


def _se_infer(node):
    data, ind, upd = node.inputs[:3]
    check_index_dtype(ind)
    _check_reduction(node)
    if ind.shape != upd.shape:
        raise ShapeError(f"indices {list(ind.shape)} and updates {list(upd.shape)} must have the same shape")
    if upd.dtype != data.dtype:
        raise ShapeError(f"updates dtype {upd.dtype} differs from data's {data.dtype}")
    _ge_axis(node, data, ind)
    return [data.type]


def _se_reference(node, ins):
    data, ind, upd = ins
    red = _check_reduction(node)
    a = norm_axis(node.attr("axis", 0), data.ndim)
    out = data.copy()
    ind = np_wrap(ind, data.shape[a])
    for i in np.ndindex(*ind.shape):
        t = i[:a] + (int(ind[i]),) + i[a + 1:]
        out[t] = _np_reduce(red, out[t], upd[i])
    return [out]


def _se_lower(ctx):
    data, ind, upd = ctx.inputs
    y = ctx.outputs[0]
    red = _check_reduction(ctx.node)
    a = norm_axis(ctx.attr("axis", 0), len(data.shape))
    ctx.check_indices(1, data.shape[a])

    def body(kb):
        if upd.numel == 0:
            return
        with kb.grid(upd.shape) as idx:
            k = wrap_index(ind[idx], data.shape[a])
            dst = idx[:a] + [k] + idx[a + 1:]
            kb.store(y, dst, _reduce_expr(red, y[dst], upd[idx]))

    emit_copy_then_scatter(ctx, data, y, body)


@op("ScatterElements", OpPatternKind.OPAQUE)
class ScatterElements:
    """ScatterElements(data, indices, updates) -> data with out[i with i[axis] = indices[i]] =
    updates[i] (or combined by ``reduction``: add, mul, max, min), applied in row-major order of
    updates (so with reduction none a repeated index keeps the last update).

    data/updates: one dtype; indices: int32/int64 of updates' shape and data's rank. ONNX spec:
    ScatterElements-18 (reductions since 16, max/min since 18).
    """

    infer = _se_infer
    reference = _se_reference
    lower = _se_lower


def _scatter_import(ctx, proto, version):
    return ctx.default_import(proto, op="ScatterElements")


@op("Scatter", OpPatternKind.OPAQUE)
class Scatter:
    """Scatter(data, indices, updates): the deprecated name of ScatterElements without reduction
    (imported as ScatterElements). ONNX spec: Scatter-11."""

    infer = _se_infer
    reference = _se_reference
    lower = _se_lower
    importer = _scatter_import


def _snd_check(node, dshape, ishape, ushape):
    r, q = len(dshape), len(ishape)
    if q < 1:
        raise ShapeError("indices must have rank >= 1")
    k = ishape[-1]
    if not 1 <= k <= r:
        raise ShapeError(f"indices' last dim {k} must be in [1, rank(data) = {r}]")
    want = tuple(ishape[:-1]) + tuple(dshape[k:])
    if tuple(ushape) != want:
        raise ShapeError(f"updates shape {list(ushape)} must be {list(want)}")
    return k


@op("ScatterND", OpPatternKind.OPAQUE)
class ScatterND:
    """ScatterND(data, indices, updates) -> data with the slices addressed by indices[..., :k]
    replaced by (or combined by ``reduction`` add/mul/max/min with) updates, in row-major order.

    indices: int64 (int32 accepted), last dim k <= rank(data); updates: indices.shape[:-1] +
    data.shape[k:], data's dtype. ONNX spec: ScatterND-18.
    """

    def infer(node):
        data, ind, upd = node.inputs[:3]
        check_index_dtype(ind)
        _check_reduction(node)
        if upd.dtype != data.dtype:
            raise ShapeError(f"updates dtype {upd.dtype} differs from data's {data.dtype}")
        _snd_check(node, data.shape, ind.shape, upd.shape)
        return [data.type]

    def reference(node, ins):
        data, ind, upd = ins
        red = _check_reduction(node)
        k = _snd_check(node, data.shape, ind.shape, upd.shape)
        out = data.copy()
        for i in np.ndindex(*ind.shape[:-1]):
            t = tuple(int(np_wrap(v, data.shape[j])) for j, v in enumerate(ind[i]))
            out[t] = _np_reduce(red, out[t], upd[i])
        return [out]

    def lower(ctx):
        data, ind, upd = ctx.inputs
        y = ctx.outputs[0]
        red = _check_reduction(ctx.node)
        k = _snd_check(ctx.node, data.shape, ind.shape, upd.shape)
        q = len(ind.shape)
        ctx.check_indices(1, list(data.shape[:k]))

        def body(kb):
            if upd.numel == 0:
                return
            with kb.grid(upd.shape) as idx:
                lead = idx[:q - 1]
                dst = [wrap_index(ind[lead + [j]], data.shape[j]) for j in range(k)] + idx[q - 1:]
                kb.store(y, dst, _reduce_expr(red, y[dst], upd[idx]))

        emit_copy_then_scatter(ctx, data, y, body)


# ----------------------------------------------------------------------------- OneHot
def _onehot(node, ishape, depth):
    d = np.asarray(depth)
    if d.size != 1:
        raise ShapeError(f"depth must have one element, it has {d.size}")
    depth = int(d.reshape(()))
    if depth < 1:
        raise ShapeError(f"depth must be >= 1, got {depth}")
    r = len(ishape) + 1
    a = norm_axis(node.attr("axis", -1), r)
    return depth, a, tuple(ishape[:a]) + (depth,) + tuple(ishape[a:])


@op("OneHot", INJ, const_inputs=(1,))
class OneHot:
    """OneHot(indices, depth, values) -> out[..., d (at axis), ...] = values[1] where
    indices[...] == d (negative indices + depth), else values[0]; indices outside [-depth,
    depth-1] give an all-off row.

    indices: numeric; depth: scalar or 1-element numeric, known at compile time (fixes the
    shape); values: [off, on], any dtype (the output's). ONNX spec: OneHot-11/28.
    """

    def infer(node):
        ind, _, vals = node.inputs[:3]
        depth = const_input(node, 1, "depth")
        if vals.type.numel != 2:
            raise ShapeError(f"values must have two elements [off, on], it has {vals.type.numel}")
        _, _, shape = _onehot(node, ind.shape, depth)
        return [TensorType(vals.dtype, shape)]

    def reference(node, ins):
        ind, depth, vals = ins
        depth, a, _ = _onehot(node, ind.shape, depth)
        vals = np.asarray(vals).ravel()
        k = np.asarray(ind)
        k = np.trunc(k).astype(np.int64) if k.dtype.kind == "f" else k.astype(np.int64)
        k = np.where(k < 0, k + depth, k)
        rng = np.arange(depth).reshape((depth,) + (1,) * (ind.ndim - a))
        hot = np.expand_dims(k, a) == rng
        return [np.where(hot, vals[1], vals[0]).astype(vals.dtype)]

    def lower(ctx):
        ind, _, vals = ctx.inputs
        y = ctx.outputs[0]
        depth, a, _ = _onehot(ctx.node, ind.shape, ctx.const(1))
        kb = ctx.kernel(params=[ind, vals, y])
        if y.numel == 0:
            return
        with kb.grid(y.shape) as idx:
            iv = ind[idx[:a] + idx[a + 1:]] if ind.shape else ind.flat(0)
            k = (unop("trunc", iv) if ind.dtype.is_float else iv).cast(I64)
            k = select(k < 0, k + depth, k)
            kb.store(y, idx, select(k.eq(idx[a]), vals.flat(1), vals.flat(0)))


# ----------------------------------------------------------------------------- Compress / NonZero
def _compress_plan(node, shape, cond):
    cond = np.asarray(cond).astype(bool).ravel()
    axis = node.attr("axis", None)
    if axis is None:
        n = prod_(shape)
        if cond.size > n:
            raise ShapeError(f"condition has {cond.size} elements, the flattened input {n}")
        return None, int(cond.sum()), (int(cond.sum()),)
    a = norm_axis(axis, len(shape))
    if cond.size > shape[a]:
        raise ShapeError(f"condition has {cond.size} elements, axis {a} has {shape[a]}")
    out = list(shape)
    out[a] = int(cond.sum())
    return a, out[a], tuple(out)


def prod_(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


@op("Compress", INJ, const_inputs=(1,))
class Compress:
    """Compress(input, condition) -> the slices of input along ``axis`` (or the elements of the
    flattened input, without axis) where condition is true (numpy.compress).

    condition: bool 1-D, known at compile time: the output's shape depends on its values, so a
    condition computed at run time is refused ("output shape depends on data"). Any dtype.
    ONNX spec: Compress-11.
    """

    def infer(node):
        x, c = node.inputs[:2]
        if c.const_value() is None:
            raise ShapeError("the output shape depends on data: the condition input must be known at "
                             f"compile time, but '{c.name}' is computed at run time", needs_value=c.name)
        _, _, shape = _compress_plan(node, x.shape, c.const_value())
        return [TensorType(x.dtype, shape)]

    def reference(node, ins):
        x, c = ins
        axis = node.attr("axis", None)
        return [np.compress(np.asarray(c).astype(bool).ravel(), x,
                            axis=None if axis is None else norm_axis(axis, x.ndim))]

    def lower(ctx):
        x, c = ctx.inputs
        y = ctx.outputs[0]
        a, _, _ = _compress_plan(ctx.node, x.shape, ctx.const(1))
        kb = ctx.kernel()
        if y.numel == 0:
            return
        cnt = kb.local(I64, (1,), hint="cnt")
        kb.store(cnt, 0, 0)
        n = c.shape[0]
        with kb.loop(n, hint="j") as j:
            with kb.if_(c.flat(j)):
                if a is None:
                    kb.store(y, cnt.flat(0), x.flat(j))
                else:
                    outer = list(x.shape[:a])
                    inner = list(x.shape[a + 1:])
                    with kb.grid(outer + inner) as idx:
                        pre, post = idx[:len(outer)], idx[len(outer):]
                        kb.store(y, pre + [cnt.flat(0)] + post, x[pre + [j] + post])
                kb.store(cnt, 0, cnt.flat(0) + 1)


@op("NonZero", OpPatternKind.OPAQUE)
class NonZero:
    """NonZero(X) -> int64 [rank, n]: the indices of the non-zero elements of X in row-major order.

    X: any numeric/bool dtype, known at compile time: the output's shape depends on its values,
    so an X computed at run time is refused ("output shape depends on data"). ONNX spec: NonZero-13.
    """

    def infer(node):
        x = node.inputs[0]
        v = x.const_value()
        if v is None:
            raise ShapeError("the output shape depends on data: the input must be known at compile time, "
                             f"but '{x.name}' is computed at run time", needs_value=x.name)
        return [TensorType(DType.i64, (max(x.type.rank, 1), int(np.count_nonzero(v))))]

    def reference(node, ins):
        x = np.asarray(ins[0])
        if x.ndim == 0:
            return [np.zeros((1, int(x != 0)), np.int64)]
        return [np.asarray(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]

    def lower(ctx):
        x = ctx.inputs[0]
        y = ctx.outputs[0]
        kb = ctx.kernel()
        if y.numel == 0:
            return
        cnt = kb.local(I64, (1,), hint="cnt")
        kb.store(cnt, 0, 0)
        n = y.shape[1]
        with kb.grid(x.shape) as idx:
            v = x[idx] if x.shape else x.flat(0)
            nz = v.ne(False) if x.dtype == DType.bool else v.ne(0)
            with kb.if_(nz):
                for d, i in enumerate(idx or [as_expr(0, I64)]):
                    kb.store(y, cnt.flat(0) + d * n, i)
                kb.store(cnt, 0, cnt.flat(0) + 1)
