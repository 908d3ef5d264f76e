"""Normalisations: LayerNormalization, InstanceNormalization, GroupNormalization,
LpNormalization, MeanVarianceNormalization, LRN (ONNX operator spec, the section of each op).

Statistics are computed in two passes (mean, then the mean of squared deviations), which is
more accurate than E[x^2] - E[x]^2; f16 inputs are computed in f32.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tensorfuse.ir.kernel import Buffer, Const, Expr, KernelBuilder, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import check_float, norm_axis
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

I64 = DType.i64
_FLOATS = (DType.f16, DType.f32, DType.f64)


def _compute(dt: DType) -> DType:
    return DType.f32 if dt == DType.f16 else dt


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


# ----------------------------------------------------------------------------- row statistics
def emit_row_norm(kb: KernelBuilder, x: Buffer, y: Buffer, rows: int, n: int, eps: float,
                  ct: DType, post, mean_out: Buffer | None = None, inv_out: Buffer | None = None,
                  ctx: LowerCtx | None = None) -> None:
    """For each of ``rows`` contiguous rows of ``n`` elements of ``x``: mean and inverse std
    dev (two passes, in ``ct``), then ``y[o*n + j] = post(o, j, (x - mean) * inv)``; the one
    store to ``y`` per element. Optional per-row stats outputs. ``ctx``: the node's lowering
    context (None: the generic nest). A backend schedule registered for ``"row_norm"``
    (``ir.strategy``) may emit the kernel instead (which then must hold nothing else): on cuda
    a thread block per row; on llvm, f32 rows of at least two vectors sum in vector partial
    sums (``codegen/llvm/schedules/norm.py``). Else :func:`row_norm_nest` with one running
    sum per statistic."""
    m = kb.local(ct, (1,), hint="mean")
    v = kb.local(ct, (1,), hint="var")
    if ctx is not None and dispatch("row_norm", ctx, kb=kb, x=x, y=y, rows=rows, n=n, eps=eps, ct=ct, post=post,
                                    mean_out=mean_out, inv_out=inv_out, m=m, v=v) is not NO_SCHEDULE:
        return
    row_norm_nest(kb, x, y, rows, n, eps, ct, post, mean_out, inv_out, m, v)


def row_norm_nest(kb: KernelBuilder, x: Buffer, y: Buffer, rows: int, n: int, eps: float, ct: DType,
                  post, mean_out: Buffer | None, inv_out: Buffer | None, m: Buffer, v: Buffer,
                  row_sum=None, row_prologue=None) -> None:
    """The loop nest of :func:`emit_row_norm` over its rows, with the mean in ``m`` and the
    inverse std dev in ``v`` (locals of ``ct`` [1]). ``row_sum(acc, term)`` stores into
    ``acc[0]`` the sum over j < n of ``term(j, lanes)`` (the ``lanes`` elements from row
    position j as one Expr); default :func:`_row_sum`, one running sum in order. The llvm
    backend's ``row_norm`` schedule passes a sum in vector partial sums
    (``codegen/llvm/schedules/norm.py``). ``row_prologue(o, base)``, where given, emits code at
    the start of row ``o`` (flat offset ``base``) before its statistics: the fused LayerNorms'
    schedule stores the row's addend into ``x`` there."""
    if row_sum is None:
        def row_sum(acc, term):
            _row_sum(kb, acc, n, term)
    with kb.loop(rows, hint="o", role="spatial") as o:       # rows are independent
        base = o * n
        if row_prologue is not None:
            row_prologue(o, base)
        def row(j, lanes):                   # x[base + j : +lanes] (one element for 1 lane)
            return x.vload(base + j, lanes).cast(ct)
        row_sum(m, row)
        kb.store(m, 0, m[0] / as_expr(float(n), ct))

        def sq(j, lanes):
            d = row(j, lanes) - kb.broadcast(m[0], lanes)
            return d * d
        row_sum(v, sq)
        kb.store(v, 0, as_expr(1.0, ct) / unop("sqrt", v[0] / as_expr(float(n), ct) + as_expr(eps, ct)))
        with kb.loop(n, kind="vectorize", hint="j") as j:
            kb.store(y, base + j, post(o, j, (x.flat(base + j).cast(ct) - m[0]) * v[0]))
        if mean_out is not None:
            kb.store(mean_out, o, m[0].cast(mean_out.dtype))
        if inv_out is not None:
            kb.store(inv_out, o, v[0].cast(inv_out.dtype))


def _row_sum(kb: KernelBuilder, acc: Buffer, n: int, term) -> None:
    """acc[0] = the sum over j < n of ``term(j, 1)``: one running sum, in order."""
    kb.store(acc, 0, as_expr(0.0, acc.dtype))
    with kb.loop(n, hint="j") as j:
        kb.store(acc, 0, acc[0] + term(j, 1))


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
    ld_s, ld_b = _row_loader(scale, shape, axis), _row_loader(bias, shape, axis)

    def post(o, j, normed):
        r = normed.cast(y.dtype) * ld_s(o, j)
        return r + ld_b(o, j) if ld_b is not None else r

    emit_row_norm(kb, x, y, outer, n, eps, stash, post, mean_out, inv_out, ctx=ctx)


def _stash(node) -> DType:
    st = node.attr("stash_type", 1)
    if st != 1:
        raise ShapeError(f"stash_type {st} is not supported (only 1: float32)")
    x = node.inputs[0].dtype
    return DType.f64 if x == DType.f64 else DType.f32


@op("LayerNormalization", OpPatternKind.OPAQUE, prologue=True)
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
        check_float(x, "X", _FLOATS)
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


# ----------------------------------------------------------------------------- InstanceNormalization
def _check_channel_param(v, c: int, x, what: str) -> None:
    if v is None:
        raise ShapeError(f"{what} is required")
    if v.dtype != x.dtype:
        raise ShapeError(f"{what} dtype {v.dtype} differs from input's {x.dtype}")
    if tuple(v.shape) != (c,):
        raise ShapeError(f"{what} must have shape [{c}], got {list(v.shape)}")


@op("InstanceNormalization", OpPatternKind.OPAQUE)
class InstanceNormalization:
    """y = scale[c] * (x - mean) / sqrt(var + epsilon) + B[c], statistics per (n, c) over the
    spatial dims. ONNX spec: InstanceNormalization-22 (same meaning since -6).

    x: [N, C, D1, ...] (rank >= 3), f16 (computed in f32), f32, f64; scale, B: [C]. Raises
    ShapeError for rank < 3, wrong scale/B shapes or dtypes.
    """

    def infer(node):
        x = node.inputs[0]
        check_float(x, "input", _FLOATS)
        if x.type.rank < 3:
            raise ShapeError(f"input must be [N, C, D1, ...] (rank >= 3), got {list(x.shape)}")
        _check_channel_param(node.input(1), x.shape[1], x, "scale")
        _check_channel_param(node.input(2), x.shape[1], x, "B")
        return [x.type]

    def reference(node, ins):
        x, s, b = ins[:3]
        ct = np.float64 if x.dtype == np.float64 else np.float32
        w = x.astype(ct)
        ax = tuple(range(2, x.ndim))
        mean = w.mean(axis=ax, keepdims=True)
        var = ((w - mean) ** 2).mean(axis=ax, keepdims=True)
        sh = (1, -1) + (1,) * (x.ndim - 2)
        y = (w - mean) / np.sqrt(var + ct(node.attr("epsilon", 1e-5))) * s.astype(ct).reshape(sh) \
            + b.astype(ct).reshape(sh)
        return [y.astype(x.dtype)]

    def lower(ctx):
        x, s, b = ctx.inputs[:3]
        y = ctx.outputs[0]
        N, C = x.shape[:2]
        n = int(np.prod(x.shape[2:], dtype=np.int64))
        ct = _compute(x.dtype)
        kb = ctx.kernel()

        def post(o, j, normed):
            c = o % C
            return (normed * s.flat(c).cast(ct) + b.flat(c).cast(ct)).cast(y.dtype)

        emit_row_norm(kb, x, y, N * C, n, float(ctx.attr("epsilon", 1e-5)), ct, post, ctx=ctx)

    def flops(node):
        return 8.0 * node.inputs[0].type.numel


# ----------------------------------------------------------------------------- GroupNormalization
@op("GroupNormalization", OpPatternKind.OPAQUE)
class GroupNormalization:
    """Channels split into ``num_groups`` groups; per (n, group) over the group's channels and
    the spatial dims: y = (x - mean) / sqrt(var + epsilon) * scale[c] + bias[c].
    ONNX spec: GroupNormalization-21.

    x: [N, C, D...] (rank >= 2), C divisible by num_groups; scale, bias: [C]; f16/f32/f64,
    statistics in f32 (stash_type 1; f64 in f64). GroupNormalization-18 (scale and bias per
    group, [num_groups]) is imported by repeating them per channel (constants are expanded at
    import; otherwise through Gather). Raises ShapeError for a bad num_groups, shapes or dtypes.
    """

    def infer(node):
        x = node.inputs[0]
        check_float(x, "X", _FLOATS)
        if x.type.rank < 2:
            raise ShapeError(f"X must be [N, C, ...], got {list(x.shape)}")
        g = node.attr("num_groups")
        if g is None or g <= 0 or x.shape[1] % g:
            raise ShapeError(f"num_groups {g} must be positive and divide C = {x.shape[1]}")
        if node.attr("stash_type", 1) != 1:
            raise ShapeError(f"stash_type {node.attr('stash_type')} is not supported (only 1)")
        _check_channel_param(node.input(1), x.shape[1], x, "scale")
        _check_channel_param(node.input(2), x.shape[1], x, "bias")
        return [x.type]

    def reference(node, ins):
        x, s, b = ins[:3]
        ct = np.float64 if x.dtype == np.float64 else np.float32
        N, C = x.shape[:2]
        G = node.attr("num_groups")
        w = x.astype(ct).reshape(N, G, -1)
        mean = w.mean(axis=2, keepdims=True)
        var = ((w - mean) ** 2).mean(axis=2, keepdims=True)
        normed = ((w - mean) / np.sqrt(var + ct(node.attr("epsilon", 1e-5)))).reshape(x.shape)
        sh = (1, -1) + (1,) * (x.ndim - 2)
        return [(normed * s.astype(ct).reshape(sh) + b.astype(ct).reshape(sh)).astype(x.dtype)]

    def lower(ctx):
        x, s, b = ctx.inputs[:3]
        y = ctx.outputs[0]
        N, C = x.shape[:2]
        G = int(ctx.attr("num_groups"))
        spatial = int(np.prod(x.shape[2:], dtype=np.int64))
        n = C // G * spatial
        ct = DType.f64 if x.dtype == DType.f64 else DType.f32
        kb = ctx.kernel()

        def post(o, j, normed):
            c = (o % G) * (C // G) + j / spatial
            return (normed * s.flat(c).cast(ct) + b.flat(c).cast(ct)).cast(y.dtype)

        emit_row_norm(kb, x, y, N * G, n, float(ctx.attr("epsilon", 1e-5)), ct, post, ctx=ctx)

    def importer(ctx, proto, version):
        if version >= 21:
            return ctx.default_import(proto)
        x, s, b = (ctx.value(n) for n in proto.input[:3])
        attrs = ctx.attrs(proto)
        G = attrs["num_groups"]
        C = x.shape[1]
        if C % G:
            raise ShapeError(f"num_groups {G} does not divide C = {C}")
        idx = np.repeat(np.arange(G, dtype=np.int64), C // G)
        ins = [x]
        for v in (s, b):
            data = v.const_value()
            if data is not None:
                ins.append(ctx.builder.const(np.asarray(data)[idx], "gn_param"))
            else:
                ins.append(ctx.builder.Gather(v, ctx.builder.const(idx, "gn_idx"), axis=0))
        return ctx.default_import(proto, inputs=ins, attrs=attrs)

    def flops(node):
        return 8.0 * node.inputs[0].type.numel


# ----------------------------------------------------------------------------- LpNormalization
@op("LpNormalization", OpPatternKind.OPAQUE)
class LpNormalization:
    """y = x / ||x||_p along ``axis`` (default -1), p in {1, 2} (default 2).
    ONNX spec: LpNormalization-22 (same meaning since -1).

    x: f16 (computed in f32), f32, f64. A zero norm gives 0 (as onnxruntime). Raises
    ShapeError for p not 1 or 2 or an axis out of range.
    """

    def infer(node):
        x = node.inputs[0]
        check_float(x, "input", _FLOATS)
        norm_axis(node.attr("axis", -1), x.type.rank)
        if node.attr("p", 2) not in (1, 2):
            raise ShapeError(f"p must be 1 or 2, got {node.attr('p')}")
        return [x.type]

    def reference(node, ins):
        x = ins[0]
        axis = norm_axis(node.attr("axis", -1), x.ndim)
        w = x.astype(np.float32) if x.dtype == np.float16 else x
        if node.attr("p", 2) == 1:
            nrm = np.sum(np.abs(w), axis=axis, keepdims=True)
        else:
            nrm = np.sqrt(np.sum(w * w, axis=axis, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(nrm == 0, 0, w / nrm)
        return [y.astype(x.dtype)]

    def lower(ctx):
        from tensorfuse.ir.ops.reduce import Pass, emit_reduction
        x, y = ctx.inputs[0], ctx.outputs[0]
        axis = norm_axis(ctx.attr("axis", -1), len(x.shape))
        ct = _compute(x.dtype)
        p1 = ctx.attr("p", 2) == 1
        step = (lambda prev, a, v: a + unop("abs", v)) if p1 else (lambda prev, a, v: a + v * v)

        def wb(accs, v):
            nrm = accs[0] if p1 else unop("sqrt", accs[0])
            return select(nrm.eq(as_expr(0.0, ct)), as_expr(0.0, ct), v / nrm).cast(y.dtype)

        kb = ctx.kernel()
        emit_reduction(kb, x, None, (axis,), ct, [Pass(lambda dt: as_expr(0.0, dt), step)], None,
                       write_back=wb, wb_out=y)

    def flops(node):
        return 3.0 * node.inputs[0].type.numel


# ----------------------------------------------------------------------------- MeanVarianceNormalization
def _mvn_axes(node) -> tuple[int, ...]:
    rank = node.inputs[0].type.rank
    axes = [norm_axis(a, rank, "axes entry") for a in node.attr("axes", [0, 2, 3])]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"axes {node.attr('axes')} name an axis twice")
    return tuple(sorted(axes))


@op("MeanVarianceNormalization", OpPatternKind.OPAQUE)
class MeanVarianceNormalization:
    """y = (x - mean) / (sqrt(var) + 1e-9) over ``axes`` (default [0, 2, 3]).
    ONNX spec: MeanVarianceNormalization-13 (same meaning since -9).

    x: f16 (computed in f32), f32, f64. The variance is computed in two passes (the spec's
    E[x^2] - E[x]^2 is the same quantity, less accurately). Raises ShapeError for an axis
    out of range or named twice.
    """

    def infer(node):
        x = node.inputs[0]
        check_float(x, "input", _FLOATS)
        _mvn_axes(node)
        return [x.type]

    def reference(node, ins):
        x = ins[0]
        ax = _mvn_axes(node)
        w = x.astype(np.float32) if x.dtype == np.float16 else x
        mean = w.mean(axis=ax, keepdims=True)
        var = ((w - mean) ** 2).mean(axis=ax, keepdims=True)
        return [((w - mean) / (np.sqrt(var) + w.dtype.type(1e-9))).astype(x.dtype)]

    def lower(ctx):
        from tensorfuse.ir.ops.reduce import Pass, emit_reduction
        x, y = ctx.inputs[0], ctx.outputs[0]
        axes = _mvn_axes(ctx.node)
        ct = _compute(x.dtype)
        count = float(np.prod([x.shape[a] for a in axes]))
        inv_n = as_expr(1.0 / count if count else 0.0, ct)
        passes = [Pass(lambda dt: as_expr(0.0, dt), lambda prev, a, v: a + v),
                  Pass(lambda dt: as_expr(0.0, dt),
                       lambda prev, a, v: a + (v - prev[0] * inv_n) * (v - prev[0] * inv_n))]

        def wb(accs, v):
            std = unop("sqrt", accs[1] * inv_n)
            return ((v - accs[0] * inv_n) / (std + as_expr(1e-9, ct))).cast(y.dtype)

        kb = ctx.kernel()
        emit_reduction(kb, x, None, axes, ct, passes, None, write_back=wb, wb_out=y)

    def flops(node):
        return 7.0 * node.inputs[0].type.numel


# ----------------------------------------------------------------------------- LRN
@op("LRN", OpPatternKind.OPAQUE)
class LRN:
    """Local response normalisation across channels: y = x / (bias + alpha / size *
    sum_{c' in window(c)} x[c']^2) ** beta, window [c - floor((size-1)/2), c + ceil((size-1)/2)]
    clipped to [0, C). ONNX spec: LRN-13 (same meaning since -1).

    x: [N, C, D...] (rank >= 2), f16 (computed in f32), f32, f64. Attributes size (required,
    > 0), alpha (1e-4), beta (0.75), bias (1.0). Raises ShapeError for size <= 0 or rank < 2.
    """

    def infer(node):
        x = node.inputs[0]
        check_float(x, "input", _FLOATS)
        if x.type.rank < 2:
            raise ShapeError(f"input must be [N, C, ...], got {list(x.shape)}")
        size = node.attr("size")
        if size is None or size <= 0:
            raise ShapeError(f"size must be a positive integer, got {size}")
        return [x.type]

    def reference(node, ins):
        x = ins[0]
        size = node.attr("size")
        alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
        w = x.astype(np.float32) if x.dtype == np.float16 else x
        C = x.shape[1]
        lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
        sq = np.zeros_like(w)
        for c in range(C):
            a, b = max(0, c - lo), min(C, c + hi + 1)
            sq[:, c] = np.sum(w[:, a:b] ** 2, axis=1)
        return [(w / (bias + alpha / size * sq) ** beta).astype(x.dtype)]

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        if y.numel == 0:
            return
        size = int(ctx.attr("size"))
        ct = _compute(x.dtype)
        alpha, beta, bias = (float(ctx.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
        N, C = x.shape[:2]
        S = int(np.prod(x.shape[2:], dtype=np.int64))
        lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
        chunk = max(min(S, 1024), 1)
        kb = ctx.kernel()
        acc = kb.local(ct, (chunk,), hint="sq")

        def block(base_nc, n, c, t0, width):
            with kb.loop(width, kind="vectorize", hint="t") as t:
                kb.store(acc, t, as_expr(0.0, ct))
            with kb.loop(minimum(c + (hi + 1), C), start=maximum(c - lo, as_expr(0)), hint="cc") as cc:
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    v = x.flat((n * C + cc) * S + t0 + t).cast(ct)
                    kb.store(acc, t, acc[t] + v * v)
            with kb.loop(width, kind="vectorize", hint="t") as t:
                off = base_nc + t0 + t
                den = as_expr(bias, ct) + as_expr(alpha / size, ct) * acc[t]
                kb.store(y, off, (x.flat(off).cast(ct) / lrn_power(den, beta, bias > 0 and alpha >= 0)).cast(y.dtype))

        with kb.loop(N * C, kind="parallel", hint="nc") as nc:
            n, c = nc / C, nc % C
            base_nc = nc * S
            nblk = -(-S // chunk)
            if nblk == 1:
                block(base_nc, n, c, Const(0, I64), S)
            else:
                with kb.loop(nblk, hint="ib") as ib:
                    block(base_nc, n, c, ib * chunk, minimum(as_expr(chunk), S - ib * chunk))

    def flops(node):
        return float(node.inputs[0].type.numel) * (2 * node.attr("size", 1) + 4)


def lrn_power(den: Expr, beta: float, positive: bool) -> Expr:
    """``den ** beta`` for LRN: beta 0.75 (AlexNet's, the default) as sqrt(d) * sqrt(sqrt(d))
    and 0.5 as sqrt(d), both vector instructions with at most 3 roundings; other exponents as
    exp(beta * log(d)) through the vectorised float32 exp and log (codegen/llvm/vmath.py) where
    ``positive`` says d > 0 (bias > 0, alpha >= 0, d = bias + alpha/size * a sum of squares),
    else the scalar pow (a negative d with an integer beta has a real power)."""
    if beta == 1.0:
        return den
    if beta == 0.5:
        return unop("sqrt", den)
    if beta == 0.75:
        r = unop("sqrt", den)
        return r * unop("sqrt", r)
    if positive and den.dtype == DType.f32:
        return unop("exp", as_expr(beta, den.dtype) * unop("log", den))
    return binop_pow(den, as_expr(beta, den.dtype))


def binop_pow(a: Expr, b: Expr) -> Expr:
    from tensorfuse.ir.kernel import binop
    return binop("pow", a, b)
