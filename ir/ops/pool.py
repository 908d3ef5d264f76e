"""Pooling: MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool,
MaxUnpool (ONNX operator spec, one section per op; IR semantics: MaxPool-22, AveragePool-22,
LpPool-22, Global*Pool-22, MaxUnpool-22).

X is [N, C, D1, ..., Dn] (N-D). Windows use the geometry of :mod:`ir.ops.conv` (pads,
auto_pad, strides, dilations) plus ``ceil_mode``, where the last window must start inside the
input or its left padding. Padding never wins a max and adds zero to sums; AveragePool divides
by the number of window taps inside the input (``count_include_pad=0``) or inside the padded
input (``count_include_pad=1``, onnxruntime's rule: taps beyond the end padding, which
``ceil_mode`` can add, are not counted).

Kernels follow the convolution's row scheme: a local accumulator per output row, the window
taps outside, the contiguous output columns innermost with clamped ranges. 2-D float32
MaxPool/AveragePool without Indices take :func:`emit_pool2d_rows` instead: per output row a
vertical pass (the window's rows reduced into a padded local row) and a horizontal one, in
L-lane vectors, parallel over (n, c, output row). Before both, MaxPool and AveragePool hand
over to a backend schedule registered for ``"pool2d"`` (``ir.strategy.dispatch`` with X, Y, the
geometry, kind, count_include_pad and Indices): on llvm, ``codegen/llvm/schedules/pool.py``
(2-D MaxPool over f32/u8/i8, AveragePool over f32).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from tensorfuse.ir.kernel import Buffer, Ramp, as_expr, binop, maximum, maxnum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.ops.conv import (FLOAT_TYPES, ROW_TILE, Geometry, _tiles, conv_geometry, flat_offset,
                         window_hi, window_lo)
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

POOL = OpPatternKind.OUT_ELEMWISE_FUSABLE
MAXPOOL_TYPES = FLOAT_TYPES + (DType.i8, DType.u8)


# ----------------------------------------------------------------------------- geometry
def pool_geometry(node) -> Geometry:
    """Window geometry of a MaxPool/AveragePool/LpPool node from X's type and attributes."""
    x = node.inputs[0]
    if x.type.rank < 3:
        raise ShapeError(f"X must be [N, C, D1, ...] with at least one spatial dim, got {list(x.shape)}")
    ks = node.attr("kernel_shape")
    if ks is None or len(ks) == 0:
        raise ShapeError("the kernel_shape attribute is required")
    ks = [int(k) for k in ks]
    if len(ks) != x.type.rank - 2:
        raise ShapeError(f"kernel_shape {ks} has {len(ks)} dims, X has {x.type.rank - 2} spatial dims")
    ceil_mode = bool(node.attr("ceil_mode", 0))
    return conv_geometry(node, x.shape[2:], ks, ceil_mode=ceil_mode)


def _max_init(dt: DType):
    """MaxPool's accumulator start: NaN for floats (maxNum skips it, so a window of NaN or
    padding only stays NaN), the lowest value for integers."""
    return float("nan") if dt.is_float else _lowest(dt)


def _lowest(dt: DType):
    if dt.is_float:
        return float("-inf")
    return int(np.iinfo(dt.numpy).min)


def _check_dtype(x, allowed, opname):
    if x.dtype not in allowed:
        raise ShapeError(f"X has dtype {x.dtype}; {opname} takes {', '.join(d.value for d in allowed)}")


# ----------------------------------------------------------------------------- references
def pool_reference(x: np.ndarray, geo: Geometry, kind: str, count_include_pad: int = 0, p: int = 2,
                   storage_order: int = 0, want_indices: bool = False):
    """Numpy pooling. kind: "max", "avg" or "lp". Returns y (and int64 indices for max)."""
    nsp = geo.rank
    cd = np.float64 if x.dtype == np.float64 else np.float32
    pad, ends = [], []
    for i in range(nsp):
        need = (geo.out_shape[i] - 1) * geo.strides[i] + (geo.kernel[i] - 1) * geo.dilations[i] + 1
        end = max(0, need - geo.in_shape[i] - geo.pads_begin[i])
        pad.append((geo.pads_begin[i], end))
    if kind == "max":
        xv = x if x.dtype.kind in "iu" else x.astype(cd)
        fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else np.nan   # padding: no value
    else:
        xv = np.abs(x.astype(cd)) ** p if kind == "lp" else x.astype(cd)
        fill = 0
    xp = np.pad(xv, [(0, 0), (0, 0)] + pad, constant_values=fill)
    # taps counted by AveragePool: inside the input, or inside the padded input
    lim = [(0, geo.in_shape[i]) if not count_include_pad else
           (-geo.pads_begin[i], geo.in_shape[i] + geo.pads_end[i]) for i in range(nsp)]
    counted = np.ones([b + geo.in_shape[i] + e for i, (b, e) in enumerate(pad)], np.int64)
    for i in range(nsp):
        pos = np.arange(counted.shape[i]) - pad[i][0]
        keep = (pos >= lim[i][0]) & (pos < lim[i][1])
        counted *= keep.reshape([-1 if j == i else 1 for j in range(nsp)])
    acc = np.full(x.shape[:2] + tuple(geo.out_shape), fill, xp.dtype)
    cnt = np.zeros(geo.out_shape, np.int64)
    idx = np.zeros(acc.shape, np.int64)
    in_strides = [int(np.prod(geo.in_shape[i + 1:])) for i in range(nsp)] if storage_order == 0 else \
        [int(np.prod(geo.in_shape[:i])) for i in range(nsp)]
    plane = int(np.prod(geo.in_shape))
    for k in np.ndindex(*geo.kernel):
        sl = tuple(slice(k[i] * geo.dilations[i],
                         k[i] * geo.dilations[i] + (geo.out_shape[i] - 1) * geo.strides[i] + 1,
                         geo.strides[i]) for i in range(nsp))
        xs = xp[(slice(None), slice(None)) + sl]
        if kind == "max":
            if want_indices:
                pos = 0
                for i in range(nsp):
                    o = np.arange(geo.out_shape[i]) * geo.strides[i] - geo.pads_begin[i] + k[i] * geo.dilations[i]
                    pos = np.add.outer(pos, o * in_strides[i]) if i else o * in_strides[i]
                better = (xs > acc) | np.isnan(acc)
                idx = np.where(better, pos, idx)
            acc = np.fmax(acc, xs)
        else:
            acc = acc + xs
            cnt = cnt + counted[sl]
    if kind == "max":
        y = acc
        if want_indices:
            nc = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * nsp)
            return y.astype(x.dtype), idx + nc * plane
        return y.astype(x.dtype)
    if kind == "avg":
        return (acc / cnt).astype(x.dtype)
    return np.power(acc, 1.0 / p).astype(x.dtype)


# ----------------------------------------------------------------------------- lowering
def _tap_range(o, geo: Geometry, d: int, lim_lo, lim_hi):
    """Kernel taps k of dim d whose input index o*s - pb + k*dil lies in [lim_lo, lim_hi)."""
    o0 = o * geo.strides[d] - geo.pads_begin[d]
    return (window_lo(lim_lo - o0, geo.dilations[d]),
            window_hi(lim_hi - o0, geo.dilations[d], geo.kernel[d]))


def emit_pool(ctx: LowerCtx, x: Buffer, y: Buffer, geo: Geometry, kind: str, *,
              count_include_pad: int = 0, p: int = 2, indices: Buffer | None = None,
              storage_order: int = 0, params: list[Buffer] | None = None):
    """One kernel for MaxPool ("max"), AveragePool ("avg") or LpPool ("lp") over N-D windows.

    Parallel over (n, c); a local row accumulator (and a row of argmax positions when
    ``indices`` is given); window taps with clamped ranges, so padding costs nothing; the
    output columns innermost. The fused epilogue applies to output 0 before its store.
    """
    nsp = geo.rank
    n_, c_ = x.shape[:2]
    out, ins = geo.out_shape, geo.in_shape
    acc_dt = x.dtype if (kind == "max" or x.dtype in (DType.f32, DType.f64)) else DType.f32
    ow_n = out[-1]
    tile = min(ow_n, ROW_TILE)
    tiled = tile < ow_n
    kb = ctx.kernel(params=params)
    acc = kb.local(acc_dt, (tile,), hint="row")
    arg = kb.local(DType.i64, (tile,), hint="arg") if indices is not None else None
    plane = math.prod(ins)
    # strides of the spatial position in the index output (row- or column-major)
    pos_strides = ([math.prod(ins[i + 1:]) for i in range(nsp)] if storage_order == 0 else
                   [math.prod(ins[:i]) for i in range(nsp)])
    init = _max_init(acc_dt) if kind == "max" else 0
    s_l, d_l, p_l, k_l = geo.strides[-1], geo.dilations[-1], geo.pads_begin[-1], geo.kernel[-1]
    with kb.loop(n_ * c_, kind="parallel", hint="nc") as nc:
        with kb.grid(out[:-1]) as orow, _tiles(kb, ow_n, tile) as (ow0, tw):
            with kb.loop(tw, kind="vectorize", hint="j") as j:
                kb.store(acc, j, as_expr(init, acc_dt))
                if arg is not None:
                    kb.store(arg, j, as_expr(-1))
            st = contextlib.ExitStack()
            irow, pos = [], as_expr(0)
            for d in range(nsp - 1):
                lo, hi = _tap_range(orow[d], geo, d, 0, ins[d])
                kd = st.enter_context(kb.loop(hi, start=lo, hint=f"k{d}_"))
                i_d = orow[d] * geo.strides[d] - geo.pads_begin[d] + kd * geo.dilations[d]
                irow.append(i_d)
                pos = pos + i_d * pos_strides[d]
            with st, kb.loop(k_l, hint="kw") as kw:
                off = kw * d_l - p_l
                lo = window_lo(-off, s_l)
                hi = window_hi(ins[-1] - off, s_l, ow0 + tw if tiled else ow_n)
                if tiled:
                    lo = maximum(as_expr(lo), ow0)
                xrow = flat_offset([n_ * c_, *ins], [nc, *irow, 0])
                with kb.loop(hi, start=lo, kind="vectorize", hint="ow") as ow:
                    a = ow - ow0 if tiled else ow
                    xv = x.flat(xrow + ow * s_l + off)
                    if kind == "max" and arg is not None:
                        better = (xv > acc[a]) | unop("isnan", acc[a]) if acc_dt.is_float else xv > acc[a]
                        p_idx = nc * plane + pos + (ow * s_l + off) * pos_strides[-1]
                        kb.store(arg, a, select(better, p_idx, arg[a]))
                        kb.store(acc, a, select(better, xv, acc[a]))
                    elif kind == "max":
                        kb.store(acc, a, maxnum(acc[a], xv))
                    else:
                        v = xv.cast(acc_dt)
                        if kind == "lp":
                            v = v * v if p == 2 else unop("abs", v) if p == 1 else \
                                binop("pow", unop("abs", v), as_expr(float(p), acc_dt))
                        kb.store(acc, a, acc[a] + v)
            with kb.loop(tw, kind="vectorize", hint="j") as j:
                ow = ow0 + j if tiled else j
                v = acc[j]
                if kind == "avg":
                    lim = [(0, ins[d]) if not count_include_pad else
                           (-geo.pads_begin[d], ins[d] + geo.pads_end[d]) for d in range(nsp)]
                    cnt = as_expr(1)
                    for d, o in enumerate([*orow, ow]):
                        lo, hi = _tap_range(o, geo, d, *lim[d])
                        cnt = cnt * (as_expr(hi) - lo)
                    v = v / cnt.cast(acc_dt)
                elif kind == "lp":
                    v = unop("sqrt", v) if p == 2 else v if p == 1 else \
                        binop("pow", v, as_expr(1.0 / p, acc_dt))
                idx = [nc / c_ if c_ > 1 else nc, nc % c_ if c_ > 1 else as_expr(0), *orow, ow]
                kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
                if arg is not None:
                    kb.store(indices, idx, arg[j])
    return kb


def emit_global_pool(ctx: LowerCtx, x: Buffer, y: Buffer, kind: str, p: int = 2,
                     params: list[Buffer] | None = None):
    """Reduce every (n, c) plane of x to one value: "avg", "max" or "lp". Parallel over (n, c),
    one scalar running accumulator per plane (the generic nest). A backend schedule registered
    for ``"global_pool"`` (``ir.strategy``) may emit the kernel instead: on llvm, float32
    planes of at least one vector are read as vectors into partial accumulators
    (``codegen/llvm/schedules/pool.py``); on cuda, planes of at least 64 elements take a block
    per plane (``codegen/cuda/schedules/pool.py``)."""
    n_, c_ = x.shape[:2]
    plane = math.prod(x.shape[2:])
    acc_dt = x.dtype if (kind == "max" or x.dtype in (DType.f32, DType.f64)) else DType.f32
    kb = dispatch("global_pool", ctx, x=x, y=y, kind=kind, p=p, acc_dt=acc_dt, params=params)
    if kb is not NO_SCHEDULE:
        return kb
    kb = ctx.kernel(params=params)
    acc = kb.local(acc_dt, (1,), hint="acc")
    with kb.loop(n_ * c_, kind="parallel", hint="nc") as nc:
        kb.store(acc, 0, as_expr(_max_init(acc_dt) if kind == "max" else 0, acc_dt))
        with kb.loop(plane, hint="i") as i:
            xv = x.flat(nc * plane + i).cast(acc_dt)
            kb.store(acc, 0, _global_step(kind, p, acc_dt, acc[0], xv))
        _global_store(ctx, kb, y, x, nc, c_, _global_finish(kind, p, plane, acc_dt, acc[0]))
    return kb


def _global_step(kind: str, p: int, acc_dt: DType, a, xv):
    """One element ``xv`` folded into a global pool's accumulator ``a``: maxNum for "max",
    |x|^p added for "lp", x added for "avg"."""
    if kind == "max":
        return maxnum(a, xv)
    if kind == "lp":
        xv = xv * xv if p == 2 else unop("abs", xv) if p == 1 else \
            binop("pow", unop("abs", xv), as_expr(float(p), acc_dt))
    return a + xv


def _global_finish(kind: str, p: int, plane: int, acc_dt: DType, v):
    """A global pool's result from its accumulator: the mean for "avg", the p-th root for "lp"."""
    if kind == "avg":
        return v / as_expr(float(plane), acc_dt)
    if kind == "lp":
        return unop("sqrt", v) if p == 2 else v if p == 1 else binop("pow", v, as_expr(1.0 / p, acc_dt))
    return v


def _global_store(ctx, kb, y: Buffer, x: Buffer, nc, c_: int, v) -> None:
    """Store plane ``nc``'s result ``v`` at y[n, c, 0, ...] through the epilogue."""
    out_idx = [nc / c_ if c_ > 1 else nc, nc % c_ if c_ > 1 else as_expr(0)] + [as_expr(0)] * (len(x.shape) - 2)
    kb.store(y, out_idx, ctx.apply_epilogue(v.cast(y.dtype), out_idx))


def _pool_flops(node) -> float:
    y = node.outputs[0]
    ks = node.attr("kernel_shape") or []
    return float(y.type.numel * math.prod(int(k) for k in ks))


def _global_flops(node) -> float:
    return float(node.inputs[0].type.numel)


def _lp_p(node) -> int:
    p = int(node.attr("p", 2))
    if p <= 0:
        raise ShapeError(f"p must be a positive integer, got {p}")
    return p


# ----------------------------------------------------------------------------- ops
@op("MaxPool", POOL, quant_passthrough="monotone")
class MaxPool:
    """N-D max pooling. ONNX spec: MaxPool-22.

    X [N, C, D1..Dn] (f16, bf16, f32, f64, i8, u8). Attributes kernel_shape (required),
    strides, pads, auto_pad, dilations, ceil_mode, storage_order. Outputs Y [N, C, O1..On]
    (X's dtype) and optional Indices (i64): the flat index of each max in X (row-major, or
    column-major over the spatial dims with storage_order=1, plus (n*C + c) * D1*...*Dn).
    Raises ShapeError for a missing kernel_shape, bad attribute lengths, an empty output.
    NaN is skipped (IEEE maxNum): a window gives NaN only when all its elements are NaN (README
    "NaN in max/min-like ops"; onnxruntime's result depends on the NaN's place in the window).
    """

    def infer(node):
        x = node.inputs[0]
        _check_dtype(x, MAXPOOL_TYPES, "MaxPool")
        geo = pool_geometry(node)
        if int(node.attr("storage_order", 0)) not in (0, 1):
            raise ShapeError(f"storage_order must be 0 or 1, got {node.attr('storage_order')}")
        shape = tuple(x.shape[:2]) + tuple(geo.out_shape)
        return [TensorType(x.dtype, shape), TensorType(DType.i64, shape)]

    def reference(node, ins):
        geo = pool_geometry(node)
        y, i = pool_reference(ins[0], geo, "max", storage_order=int(node.attr("storage_order", 0)),
                              want_indices=True)
        return [y, i][:max(1, len(node.outputs))]

    def lower(ctx):
        indices = ctx.outputs[1] if len(ctx.outputs) > 1 else None
        x, y, geo = ctx.inputs[0], ctx.outputs[0], pool_geometry(ctx.node)
        if dispatch("pool2d", ctx, x=x, y=y, geo=geo, kind="max", count_include_pad=0,
                    indices=indices) is not NO_SCHEDULE:
            return
        if pool2d_rows_ok(ctx, x, y, geo, "max", indices):
            emit_pool2d_rows(ctx, x, y, geo, "max")
            return
        emit_pool(ctx, x, y, geo, "max", indices=indices, storage_order=int(ctx.attr("storage_order", 0)))

    flops = _pool_flops


@op("AveragePool", POOL)
class AveragePool:
    """N-D average pooling. ONNX spec: AveragePool-22.

    X [N, C, D1..Dn] (f16, bf16, f32, f64). Attributes kernel_shape (required), strides, pads,
    auto_pad, dilations, ceil_mode, count_include_pad. Output Y [N, C, O1..On], X's dtype.
    Raises ShapeError for a missing kernel_shape, bad attribute lengths, an empty output.
    """

    def infer(node):
        x = node.inputs[0]
        _check_dtype(x, FLOAT_TYPES, "AveragePool")
        geo = pool_geometry(node)
        return [TensorType(x.dtype, tuple(x.shape[:2]) + tuple(geo.out_shape))]

    def reference(node, ins):
        return [pool_reference(ins[0], pool_geometry(node), "avg",
                               count_include_pad=int(node.attr("count_include_pad", 0)))]

    def lower(ctx):
        x, y, geo = ctx.inputs[0], ctx.outputs[0], pool_geometry(ctx.node)
        cip = int(ctx.attr("count_include_pad", 0))
        if dispatch("pool2d", ctx, x=x, y=y, geo=geo, kind="avg", count_include_pad=cip,
                    indices=None) is not NO_SCHEDULE:
            return
        if pool2d_rows_ok(ctx, x, y, geo, "avg", None):
            emit_pool2d_rows(ctx, x, y, geo, "avg", count_include_pad=cip)
            return
        emit_pool(ctx, x, y, geo, "avg", count_include_pad=cip)

    flops = _pool_flops


@op("LpPool", POOL)
class LpPool:
    """N-D Lp pooling: y = (sum over the window of |x|^p)^(1/p), padding adds 0. ONNX spec:
    LpPool-22. X float [N, C, D1..Dn]; attributes kernel_shape (required), p (int, default 2),
    strides, pads, auto_pad, dilations, ceil_mode. Output Y [N, C, O1..On], X's dtype."""

    def infer(node):
        x = node.inputs[0]
        _check_dtype(x, FLOAT_TYPES, "LpPool")
        _lp_p(node)
        geo = pool_geometry(node)
        return [TensorType(x.dtype, tuple(x.shape[:2]) + tuple(geo.out_shape))]

    def reference(node, ins):
        return [pool_reference(ins[0], pool_geometry(node), "lp", p=_lp_p(node))]

    def lower(ctx):
        emit_pool(ctx, ctx.inputs[0], ctx.outputs[0], pool_geometry(ctx.node), "lp", p=_lp_p(ctx.node))

    flops = _pool_flops


def _infer_global(node, allowed, opname):
    x = node.inputs[0]
    _check_dtype(x, allowed, opname)
    if x.type.rank < 2:
        raise ShapeError(f"X must be [N, C, ...] (rank >= 2), got shape {list(x.shape)}")
    return [TensorType(x.dtype, tuple(x.shape[:2]) + (1,) * (x.type.rank - 2))]


def _global_ref(x, kind, p=2):
    axes = tuple(range(2, x.ndim))
    cd = np.float64 if x.dtype == np.float64 else np.float32
    if kind == "max":     # NaN skipped (maxNum): NaN only for a plane of NaN
        return np.fmax.reduce(x, axis=axes, keepdims=True) if axes else x.copy()
    xv = x.astype(cd)
    if kind == "avg":
        return np.mean(xv, axis=axes, keepdims=True).astype(x.dtype)
    return np.power(np.sum(np.abs(xv) ** p, axis=axes, keepdims=True), 1.0 / p).astype(x.dtype)


@op("GlobalAveragePool", POOL)
class GlobalAveragePool:
    """Mean over all spatial dims. ONNX spec: GlobalAveragePool-22. X float [N, C, D1..Dn] ->
    Y [N, C, 1, ..., 1], X's dtype."""

    def infer(node):
        return _infer_global(node, FLOAT_TYPES, "GlobalAveragePool")

    def reference(node, ins):
        return [_global_ref(ins[0], "avg")]

    def lower(ctx):
        emit_global_pool(ctx, ctx.inputs[0], ctx.outputs[0], "avg")

    flops = _global_flops


@op("GlobalMaxPool", POOL, quant_passthrough="monotone")
class GlobalMaxPool:
    """Max over all spatial dims. ONNX spec: GlobalMaxPool-22. X float [N, C, D1..Dn] ->
    Y [N, C, 1, ..., 1], X's dtype. NaN is skipped (IEEE maxNum, as onnxruntime for one NaN in
    a plane): NaN only for a plane of NaN (README "NaN in max/min-like ops")."""

    def infer(node):
        return _infer_global(node, FLOAT_TYPES, "GlobalMaxPool")

    def reference(node, ins):
        return [_global_ref(ins[0], "max")]

    def lower(ctx):
        emit_global_pool(ctx, ctx.inputs[0], ctx.outputs[0], "max")

    flops = _global_flops


@op("GlobalLpPool", POOL)
class GlobalLpPool:
    """(sum over all spatial dims of |x|^p)^(1/p). ONNX spec: GlobalLpPool-22. X float
    [N, C, D1..Dn] -> Y [N, C, 1, ..., 1]; attribute p (int, default 2)."""

    def infer(node):
        _lp_p(node)
        return _infer_global(node, FLOAT_TYPES, "GlobalLpPool")

    def reference(node, ins):
        return [_global_ref(ins[0], "lp", _lp_p(node))]

    def lower(ctx):
        emit_global_pool(ctx, ctx.inputs[0], ctx.outputs[0], "lp", _lp_p(ctx.node))

    flops = _global_flops


# ----------------------------------------------------------------------------- MaxUnpool
def _unpool_shapes(node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the unpooled shape the attributes give, the output shape)."""
    x, i = node.inputs[0], node.inputs[1]
    if x.type.rank < 3:
        raise ShapeError(f"X must be [N, C, D1, ...] with at least one spatial dim, got {list(x.shape)}")
    if i.dtype != DType.i64 or tuple(i.shape) != tuple(x.shape):
        raise ShapeError(f"I must be i64 with X's shape {list(x.shape)}, got {i.dtype}{list(i.shape)}")
    nsp = x.type.rank - 2
    ks = node.attr("kernel_shape")
    if ks is None or len(ks) != nsp:
        raise ShapeError(f"kernel_shape must have {nsp} values (one per spatial dim), got {ks}")
    from tensorfuse.ir.ops.conv import conv_pads, ints_attr
    strides = ints_attr(node, "strides", nsp, 1)
    pads = conv_pads(node, nsp)
    natural = tuple(x.shape[:2]) + tuple((x.shape[2 + d] - 1) * strides[d] + int(ks[d]) - pads[d] - pads[nsp + d]
                                         for d in range(nsp))
    if any(d <= 0 for d in natural):
        raise ShapeError(f"unpooled shape {list(natural)} is empty")
    out = const_input(node, 2, "output_shape")
    if out is None:
        return natural, natural
    shape = tuple(int(v) for v in np.asarray(out).reshape(-1))
    if len(shape) != x.type.rank:
        raise ShapeError(f"output_shape {list(shape)} must have rank {x.type.rank}")
    if shape[:2] != natural[:2] or any(o < n for o, n in zip(shape[2:], natural[2:])):
        raise ShapeError(f"output_shape {list(shape)} must keep N, C {list(x.shape[:2])} and be at least "
                         f"the unpooled size {list(natural[2:])}")
    return natural, shape


@op("MaxUnpool", OpPatternKind.OPAQUE, const_inputs=(2,))
class MaxUnpool:
    """Partial inverse of MaxPool. ONNX spec: MaxUnpool-22 (as onnx.reference and the ONNX node
    tests define it).

    Inputs: X [N, C, D1..Dn] (float), I (i64, X's shape), optional output_shape (i64 [rank],
    known at compile time). Attributes kernel_shape (required), strides, pads. The unpooled
    tensor U has shape [N, C, (D-1)*stride + kernel - pads ...]: zeros, then U.flat[I[j]] =
    X.flat[j]. Y is U, or with output_shape given, U placed at the origin of a zero tensor of
    that (not smaller) shape. onnxruntime instead scatters I straight into output_shape's
    layout; both agree when output_shape equals U's shape. Indices outside U are skipped.
    Raises ShapeError for shape mismatches or a run-time output_shape.
    """

    def infer(node):
        x = node.inputs[0]
        _check_dtype(x, FLOAT_TYPES, "MaxUnpool")
        return [TensorType(x.dtype, _unpool_shapes(node)[1])]

    def reference(node, ins):
        x, i = ins[0], ins[1]
        natural, shape = _unpool_shapes(node)
        u = np.zeros(natural, x.dtype)
        flat = i.reshape(-1)
        ok = (flat >= 0) & (flat < u.size)
        u.reshape(-1)[flat[ok]] = x.reshape(-1)[ok]
        y = np.zeros(shape, x.dtype)
        y[tuple(slice(0, d) for d in natural)] = u
        return [y]

    def lower(ctx):
        x, i = ctx.inputs[0], ctx.inputs[1]
        y = ctx.outputs[0]
        natural, shape = _unpool_shapes(ctx.node)
        kb = ctx.kernel()
        with kb.loop(y.numel, kind="vectorize", hint="z") as z:
            kb.store(y, z, as_expr(0, y.dtype))
        with kb.loop(x.numel, hint="j") as j:
            t = i.flat(j)
            with kb.if_((t >= 0) & (t < math.prod(natural))):
                if natural == shape:
                    kb.store(y, t, x.flat(j))
                else:   # coordinates in U, offset in Y
                    coords, rest = [], t
                    for d in reversed(natural):
                        coords.append(rest % d)
                        rest = rest / d
                    kb.store(y, flat_offset(shape, list(reversed(coords))), x.flat(j))

    def flops(node):
        return 0.0


# ----------------------------------------------------------------------------- 2-D float32 rows
#: the separable 2-D schedule unrolls the kernel columns; wider kernels keep emit_pool
ROWS_MAX_KW = 16
#: and keeps one padded input row in a local (stack) buffer of at most this many floats
ROWS_MAX_ROW = 16384


def nan_max_blend(a, b):
    """max(a, b) with NaN from either operand propagated (a NaN result is the default quiet
    NaN), as numpy.maximum, as a compare, a NaN test and a blend: three instructions on x86
    (vmaxps, vcmpunordps, vblendvps) where llvm.maximum's lowering takes five. Of two equal
    values (-0.0 and +0.0) it gives ``a``. For vectors, and for scalars in a loop LLVM
    vectorises: a float select left scalar becomes a branch, mispredicted on random data."""
    return select(unop("isnan", b), as_expr(float("nan"), b.dtype), select(b > a, b, a))


def nan_max(a, b):
    """:func:`nan_max_blend` for vectors, llvm.maximum (no branch) for scalars."""
    if a.lanes == 1 and b.lanes == 1:
        return maximum(a, b)
    return nan_max_blend(a, b)


def _rows_layout(geo: Geometry, L: int) -> tuple[int, int]:
    """(OWp, span): the output columns computed per row, OW rounded up to whole L-lane vectors,
    and the padded input columns [0, span) their windows cover (input column w at position
    pads_begin + w; positions outside the input hold the padding value)."""
    owp = -(-geo.out_shape[1] // L) * L
    return owp, (owp - 1) * geo.strides[1] + (geo.kernel[1] - 1) * geo.dilations[1] + 1


def pool2d_rows_ok(ctx: LowerCtx, x: Buffer, y: Buffer, geo: Geometry, kind: str,
                   indices: Buffer | None) -> bool:
    """Whether :func:`emit_pool2d_rows` applies: MaxPool or AveragePool over 2-D windows of a
    float32 X without the Indices output, kernel width up to :data:`ROWS_MAX_KW`, a padded row
    of at most :data:`ROWS_MAX_ROW` floats."""
    if not (kind in ("max", "avg") and indices is None and geo.rank == 2 and x.dtype == DType.f32
            and y.dtype == DType.f32 and geo.kernel[1] <= ROWS_MAX_KW):
        return False
    return _rows_layout(geo, ctx.target.lanes(DType.f32))[1] <= ROWS_MAX_ROW


def emit_pool2d_rows(ctx: LowerCtx, x: Buffer, y: Buffer, geo: Geometry, kind: str, *,
                     count_include_pad: int = 0, params: list[Buffer] | None = None):
    """MaxPool ("max") / AveragePool ("avg") of X f32 [N, C, H, W] into Y f32 [N, C, OH, OW]
    as two separable passes per output row (ONNX MaxPool-22 / AveragePool-22 semantics, as
    :func:`emit_pool`): max and sum are associative and commutative (max propagates NaN as
    numpy.maximum), so the window's reduction may run over its rows first.

    Parallel over (n, c, output row). For each output row, with L = ``ctx.target.lanes(f32)``:

    1. vertical: the input rows of the window (clamped to the image) reduced column by column
       into a local padded row ``r`` (L-lane vectors, the last one overlapping the one before,
       so no scalar tail; ``pads_begin`` and the end padding hold -inf / 0);
    2. horizontal: ``reduce over kw of r[ow*stride + kw*dilation]``. Stride 1: L-lane vectors
       for OW rounded up to whole vectors (the extra columns read padding, never stored).
       Larger strides: a loop LLVM vectorises over strided loads of the local row (the kernel
       IR has no strided vector load), straight into Y for MaxPool (a scalar tail), into a
       local row of sums for AveragePool;
    3. AveragePool: divided by (window rows counted) x (window columns counted), the rows from
       the clamped range (or the padded-input rule with ``count_include_pad``), the columns a
       compile-time f32 [OWp] constant;
    4. Y's row stored as L-lane vectors through the fused epilogue; the last partial vector
       goes through a local and out one lane at a time.

    Locals are read back with the offsets and widths they were stored with where possible: a
    load spanning two recent stores waits for them (store-to-load forwarding fails)."""
    n_, c_ = x.shape[:2]
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    L = ctx.target.lanes(DType.f32)
    owp, span = _rows_layout(geo, L)
    wu = max(0, min(W, span - pw))            # input columns some window reads
    init = as_expr(float("nan") if kind == "max" else 0.0, DType.f32)      # max: NaN is "no value"
    red = maxnum if kind == "max" else (lambda a, b: a + b)

    def ld(buf, i, lanes):
        return buf.vload(i, lanes) if lanes > 1 else buf.flat(i)

    cnt_w = None
    if kind == "avg":
        lim = (0, W) if not count_include_pad else (-pw, W + geo.pads_end[1])
        cols = [sum(1 for k in range(KW) if lim[0] <= ow * sw - pw + k * dw < lim[1]) for ow in range(OW)]
        cnt_w = ctx.pack(np.asarray(cols + [1] * (owp - OW), np.float32), "cols")
    params = list(params or ctx.default_params()) + ([cnt_w] if cnt_w is not None else [])
    kb = ctx.kernel(params=params)
    kb.kernel.comment += f"  [rows: vertical then horizontal pass, {L} lanes]"
    r = kb.local(DType.f32, (span + L,), hint="row")
    o = kb.local(DType.f32, (owp,), hint="out") if sw > 1 and kind == "avg" else None
    acc = kb.local(DType.f32, (L,), hint="acc")
    last = kb.local(DType.f32, (L,), hint="last") if OW % L and not (sw > 1 and kind == "max") else None
    with kb.loop(n_ * c_ * OH, kind="parallel", hint="nch") as t:
        oh = t % OH
        nc = t / OH
        ih0 = oh * sh - ph
        kh_lo = window_lo(-ih0, dh)
        kh_hi = window_hi(H - ih0, dh, KH)
        xrow = (nc * H + ih0) * W              # flat offset of (padded) input row ih0
        # padding of the row buffer: before the first and after the last input column read
        for p in range(min(pw, span)):
            kb.store(r, p, init)
        for p in range(pw + wu, span, L):
            kb.store(r, p, kb.broadcast(init, L))

        def vertical(c0, lanes):
            a = ld(acc, 0, lanes)
            kb.store(acc, 0, ld(x, xrow + kh_lo * (dh * W) + c0, lanes))
            with kb.reduce(kh_hi, start=kh_lo + 1, hint="kh") as kh:
                kb.store(acc, 0, red(a, ld(x, xrow + kh * (dh * W) + c0, lanes)))
            kb.store(r, pw + c0, a)

        if wu >= L:
            with kb.if_(kh_lo < kh_hi) as rows:
                with kb.loop(wu // L, hint="cv") as cv:
                    vertical(cv * L, L)
                if wu % L:
                    vertical(as_expr(wu - L), L)          # overlaps the vector before
            with kb.else_(rows):                          # every window row in the padding
                with kb.loop(wu, kind="vectorize", hint="cz") as cz:
                    kb.store(r, pw + cz, init)
        elif wu:
            with kb.loop(wu, hint="cs") as cs:
                kb.store(acc, 0, init)
                with kb.reduce(kh_hi, start=kh_lo, hint="kh") as kh:
                    kb.store(acc, 0, red(acc[0], x.flat(xrow + kh * (dh * W) + cs)))
                kb.store(r, pw + cs, acc[0])

        n_i = nc / c_ if n_ > 1 else as_expr(0)
        c_i = nc % c_ if n_ > 1 else nc
        def strided(ow, rd):
            v = r[ow * sw]
            for k in range(1, KW):
                v = rd(v, r[ow * sw + k * dw])
            return v

        # strided taps: loops LLVM's vectoriser widens (interleaved loads of the local row),
        # over whole vectors of outputs (MaxPool: straight into Y, the tail scalar; AveragePool:
        # the sums into a local, divided below)
        if sw > 1 and kind == "max":
            if OW >= L:
                with kb.loop((OW // L) * L, kind="vectorize", hint="ow") as ow:
                    kb.store(y, [n_i, c_i, oh, ow], ctx.apply_epilogue(strided(ow, maxnum),
                                                                       [n_i, c_i, oh, ow]))
            if OW % L:
                with kb.loop(OW, start=(OW // L) * L, hint="ot") as ow:
                    kb.store(y, [n_i, c_i, oh, ow], ctx.apply_epilogue(strided(ow, maxnum), [n_i, c_i, oh, ow]))
        elif sw > 1:
            with kb.loop(owp, kind="vectorize", hint="ow") as ow:
                kb.store(o, ow, strided(ow, red))
        if kind == "avg":
            if count_include_pad:
                rlo, rhi = _tap_range(oh, geo, 0, -ph, H + geo.pads_end[0])
            else:
                rlo, rhi = kh_lo, kh_hi
            cnt_h = (as_expr(rhi) - rlo).cast(DType.f32)

        def value(o0):
            if o is not None:
                v = o.vload(o0, L)
            else:
                v = r.vload(o0, L)
                for k in range(1, KW):
                    v = red(v, r.vload(o0 + k * dw, L))
            if kind == "avg":
                v = v / (cnt_w.vload(o0, L) * cnt_h)
            return v

        if not (sw > 1 and kind == "max"):                # else stored by the strided loop
            if OW >= L:
                with kb.loop(OW // L, hint="ov") as ov:
                    idx = [n_i, c_i, oh, Ramp(ov * L, L)]
                    kb.store(y, idx, ctx.apply_epilogue(value(ov * L), idx))
            if OW % L:
                o0 = (OW // L) * L
                kb.store(last, 0, value(as_expr(o0)))
                with kb.loop(OW % L, hint="ot") as ot:
                    idx = [n_i, c_i, oh, ot + o0]
                    kb.store(y, idx, ctx.apply_epilogue(last[ot], idx))
    return kb
