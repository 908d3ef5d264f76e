"""The llvm backend's pooling schedules: the global pools (GlobalAveragePool, GlobalMaxPool,
GlobalLpPool), schedule key ``"global_pool"`` (``ir.ops.pool.emit_global_pool``), and the
windowed 2-D MaxPool (f32, u8, i8) / AveragePool (f32), key ``"pool2d"`` (the ops' lowerings in
``ir.ops.pool``): :func:`pool2d_rows_vector`.

``global_pool_vector`` (plevel 5): float32 planes of at least one vector (``L`` lanes of the
target; LpPool: p 1 or 2) are read as L-lane vectors into U partial vector accumulators (sums:
another order of the additions than one running sum; max: NaN-propagating maxNum), combined,
reduced across lanes, then the tail elements one at a time. Parallel over (n, c). Knob
``accumulators`` (U: 1, 2, 4, 8, at most the plane's whole vectors; default
min(:data:`GLOBAL_ACCUMULATORS`, vectors)).
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import Load, Ramp, as_expr, maximum, maxnum, minimum, unop
from tensorfuse.ir.ops.conv import window_hi, window_lo
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from .reduce import row_partials

#: partial vector accumulators per plane by default (independent add chains)
GLOBAL_ACCUMULATORS = 4


def _vector_ok(ctx, x, y, kind, p, acc_dt, params) -> bool:
    L = ctx.target.lanes(DType.f32)
    return x.dtype == DType.f32 and math.prod(x.shape[2:]) >= L and (kind != "lp" or p in (1, 2))


@register_schedule("global_pool", "llvm", "global_pool_vector", plevel=5, applies=_vector_ok)
def global_pool_vector(ctx, x, y, kind: str, p: int, acc_dt, params):
    """Vector partial accumulators per plane (module docstring); one kernel."""
    L = ctx.target.lanes(DType.f32)
    n_, c_ = x.shape[:2]
    plane = math.prod(x.shape[2:])
    nvec = plane // L
    U = knob("accumulators", [u for u in (1, 2, 4, 8) if u <= nvec], max(1, min(GLOBAL_ACCUMULATORS, nvec)),
             doc="partial vector accumulators per plane")
    f32 = DType.f32
    init = as_expr(float("nan") if kind == "max" else 0.0, f32)

    def red(a, b):
        return maxnum(a, b) if kind == "max" else a + b

    def term(v):
        if kind == "lp":
            return v * v if p == 2 else unop("abs", v)
        return v

    kb = ctx.kernel(params=params)
    acc = kb.local(f32, (U * L,), hint="acc")
    tot = kb.local(f32, (1,), hint="tot")
    with kb.loop(n_ * c_, kind="parallel", hint="nc") as nc:
        row_partials(kb, x, nc * plane, plane, L, acc, tot, kb.broadcast(init, L),
                     lambda a, v: red(a, term(v)), red, lambda t, v: red(t, term(v)))
        v = tot[0]
        if kind == "avg":
            v = v / as_expr(float(plane), f32)
        elif kind == "lp" and p == 2:
            v = unop("sqrt", v)
        out_idx = [nc / c_ if c_ > 1 else nc, nc % c_ if c_ > 1 else as_expr(0)] + [as_expr(0)] * (len(x.shape) - 2)
        kb.store(y, out_idx, ctx.apply_epilogue(v.cast(y.dtype), out_idx))
    return kb


# ----------------------------------------------------------------------------- windowed 2-D pools
#: widest kernel (columns) the rows schedule unrolls in its horizontal pass
POOL_ROWS_MAX_KW = 16
#: bytes of the padded local row (one input row's window columns) the rows schedule keeps
POOL_ROWS_MAX_ROW_BYTES = 65536
#: outputs per parallel task the rows schedule aims at by default (knob ``rows_per_task``)
POOL_TASK_OUTPUTS = 256
#: output-row vectors narrower than this many lanes are not worth the schedule (the generic nest)
POOL_ROWS_MIN_LANES = 4


def _pool_dtype_ok(x, y, kind: str) -> bool:
    if x.dtype != y.dtype:
        return False
    return x.dtype == DType.f32 if kind == "avg" else x.dtype in (DType.f32, DType.u8, DType.i8)


def _row_span(geo, L: int) -> tuple[int, int]:
    """(OWp, span): output columns computed per row (OW rounded up to whole L-lane vectors) and
    the padded input columns [0, span) their windows read (input column w at pads_begin + w)."""
    owp = -(-geo.out_shape[1] // L) * L
    return owp, (owp - 1) * geo.strides[1] + (geo.kernel[1] - 1) * geo.dilations[1] + 1


def _pool_lanes(ctx, x, geo) -> list[int]:
    """Candidate vector widths: powers of two from :data:`POOL_ROWS_MIN_LANES` to the target's
    lanes of X's dtype whose padded row fits :data:`POOL_ROWS_MAX_ROW_BYTES`."""
    top = ctx.target.lanes(x.dtype)
    out, L = [], POOL_ROWS_MIN_LANES
    while L <= top:
        if (_row_span(geo, L)[1] + L) * x.dtype.itemsize <= POOL_ROWS_MAX_ROW_BYTES:
            out.append(L)
        L *= 2
    return out


def _pool_rows_ok(ctx, x, y, geo, kind, count_include_pad=0, indices=None, params=None) -> bool:
    return (indices is None and geo.rank == 2 and kind in ("max", "avg") and _pool_dtype_ok(x, y, kind)
            and geo.kernel[1] <= POOL_ROWS_MAX_KW and geo.out_shape[1] >= POOL_ROWS_MIN_LANES
            and bool(_pool_lanes(ctx, x, geo)))


def _default_lanes(cands: list[int], ow: int) -> int:
    """The widest candidate whose first vector is full (at most OW lanes), else the narrowest."""
    fit = [L for L in cands if L <= ow]
    return max(fit) if fit else min(cands)


@register_schedule("pool2d", "llvm", "pool2d_rows_vector", plevel=10, applies=_pool_rows_ok)
def pool2d_rows_vector(ctx, x, y, geo, kind: str, count_include_pad: int = 0, indices=None, params=None):
    """MaxPool ("max": X f32, u8 or i8) / AveragePool ("avg": f32) of X [N, C, H, W] into Y
    [N, C, OH, OW] of X's dtype, NCHW, as two separable passes per output row (ONNX
    MaxPool-22 / AveragePool-22; max and sum are associative, so a window may be reduced over
    its rows first). Semantics as ``ir.ops.pool.emit_pool``: padding never wins a max and adds
    0 to sums; float max skips NaN (maxNum, the accumulator starts as NaN: "no value"),
    integer max starts at the dtype's lowest value; AveragePool divides by the taps inside the
    input (``count_include_pad=0``) or inside the padded input (1; taps beyond the end padding
    that ``ceil_mode`` adds are not counted, onnxruntime's rule).

    Per output row, with L lanes (knob ``lanes``):

    1. vertical: the window's input rows, clamped to the image, reduced column by column into
       a local padded row (L-lane vectors, the last one overlapping the one before; rows
       narrower than L: narrower power-of-two vectors, then one column at a time), the
       padding columns holding the start value;
    2. horizontal, per L output columns: ``reduce over kw of row[ow*stride + kw*dilation]``.
       Stride 1: contiguous L-lane loads of the local row. Larger strides: knob ``strided``:
       ``"gather"`` (an L-lane load with the stride: one element per lane) or ``"loop"`` (a
       loop over output columns that LLVM's loop vectoriser widens into wide loads and
       deinterleaving shuffles of the local row, stored straight into Y);
    3. AveragePool: divided by (rows counted) x (columns counted), the columns a compile-time
       f32 [OWp] constant;
    4. Y's row stored in L-lane vectors through the fused epilogue, the last one overlapping
       the one before (its columns computed and stored twice, the same values); a row
       narrower than L goes through a local and out one lane at a time.

    Parallel tasks of ``rows_per_task`` output rows of one (n, c) plane (default: the fewest
    rows that make :data:`POOL_TASK_OUTPUTS` outputs, at most the plane).

    Knobs: ``lanes`` (powers of two from 4 to the target's lanes of X's dtype; default the
    widest that is at most OW), ``strided`` (stride > 1 only; default "gather", which LLVM
    turns into wide loads and shuffles), ``rows_per_task`` (1, 2, 4 ... 32 below OH, and OH)."""
    dt = x.dtype
    n_, c_ = x.shape[:2]
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    cands = _pool_lanes(ctx, x, geo)
    L = knob("lanes", cands, _default_lanes(cands, OW), doc="vector lanes of the row passes")
    mode = knob("strided", ["loop", "gather"], "gather", doc="horizontal pass at stride > 1") if sw > 1 else "dense"
    rows = [r for r in (1, 2, 4, 8, 16, 32) if r < OH] + [OH]
    R = knob("rows_per_task", rows, next((r for r in rows if r * OW >= POOL_TASK_OUTPUTS), OH),
             doc="output rows per parallel task")
    owp, span = _row_span(geo, L)
    wu = max(0, min(W, span - pw))            # input columns some window reads
    if kind == "max":
        init = as_expr(float("nan"), dt) if dt.is_float else as_expr(int(np.iinfo(dt.numpy).min), dt)
        red = maxnum if dt.is_float else maximum
    else:
        init, red = as_expr(0.0, dt), (lambda a, b: a + b)

    cnt_w = None
    if kind == "avg":
        lim = (0, W) if not count_include_pad else (-pw, W + geo.pads_end[1])
        cols = [sum(1 for k in range(KW) if lim[0] <= ow * sw - pw + k * dw < lim[1]) for ow in range(OW)]
        cnt_w = ctx.pack(np.asarray(cols + [1] * (owp - OW), np.float32), "cols")
    params = list(params or ctx.default_params()) + ([cnt_w] if cnt_w is not None else [])
    kb = ctx.kernel(params=params)
    kb.kernel.comment += f"  [rows: vertical then horizontal pass, {mode} taps, {L} lanes]"
    r = kb.local(dt, (span + L,), hint="row")
    o = kb.local(dt, (owp,), hint="out") if mode == "loop" and kind == "avg" else None
    acc = kb.local(dt, (L,), hint="acc")
    last = kb.local(dt, (L,), hint="last") if OW < L and not (mode == "loop" and kind == "max") else None

    def ld(buf, i, lanes):
        return buf.vload(i, lanes) if lanes > 1 else buf.flat(i)

    nblk = -(-OH // R)
    with kb.loop(n_ * c_ * nblk, kind="parallel", hint="task") as t, \
            kb.loop(R if OH % R == 0 else minimum(as_expr(R), OH - (t % nblk) * R), hint="r") as rr:
        oh = (t % nblk) * R + rr if nblk > 1 else rr
        nc = t / nblk if nblk > 1 else t
        ih0 = oh * sh - ph
        kh_lo = window_lo(-ih0, dh)
        kh_hi = window_hi(H - ih0, dh, KH)
        xrow = (nc * H + ih0) * W              # flat offset of (padded) input row ih0
        for p in range(min(pw, span)):         # the row's padding: before and after the columns read
            kb.store(r, p, init)
        for p in range(pw + wu, span, L):
            kb.store(r, p, kb.broadcast(init, L))

        def vertical(c0, lanes):
            a = ld(acc, 0, lanes)
            kb.store(acc, 0, ld(x, xrow + kh_lo * (dh * W) + c0, lanes))
            with kb.reduce(kh_hi, start=kh_lo + 1, hint="kh") as kh:
                kb.store(acc, 0, red(a, ld(x, xrow + kh * (dh * W) + c0, lanes)))
            kb.store(r, pw + c0, a)

        lv = L
        while lv > wu:
            lv //= 2
        if lv >= 2:
            with kb.if_(kh_lo < kh_hi) as rows:
                with kb.loop(wu // lv, hint="cv") as cv:
                    vertical(cv * lv, lv)
                if wu % lv:
                    vertical(as_expr(wu - lv), lv)        # overlaps the vector before
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

        if mode == "loop" and kind == "max":
            if OW >= L:
                with kb.loop((OW // L) * L, kind="vectorize", hint="ow") as ow:
                    idx = [n_i, c_i, oh, ow]
                    kb.store(y, idx, ctx.apply_epilogue(strided(ow, red), idx))
            if OW % L:
                with kb.loop(OW, start=(OW // L) * L, hint="ot") as ow:
                    idx = [n_i, c_i, oh, ow]
                    kb.store(y, idx, ctx.apply_epilogue(strided(ow, red), idx))
        elif mode == "loop":
            with kb.loop(owp, kind="vectorize", hint="ow") as ow:
                kb.store(o, ow, strided(ow, red))
        if kind == "avg":
            if count_include_pad:
                o0 = oh * sh - ph
                rlo = window_lo(-ph - o0, dh)
                rhi = window_hi(H + geo.pads_end[0] - o0, dh, KH)
            else:
                rlo, rhi = kh_lo, kh_hi
            cnt_h = (as_expr(rhi) - rlo).cast(DType.f32)

        def value(o0):
            if o is not None:
                v = o.vload(o0, L)
            else:
                base = as_expr(o0 * sw)
                v = Load(r, base, L, sw) if sw > 1 else r.vload(base, L)
                for k in range(1, KW):
                    tap = base + k * dw
                    v = red(v, Load(r, tap, L, sw) if sw > 1 else r.vload(tap, L))
            if kind == "avg":
                v = v / (cnt_w.vload(o0, L) * cnt_h)
            return v

        if not (mode == "loop" and kind == "max"):      # else stored by the loop above
            if OW >= L:
                with kb.loop(OW // L, hint="ov") as ov:
                    idx = [n_i, c_i, oh, Ramp(ov * L, L)]
                    kb.store(y, idx, ctx.apply_epilogue(value(ov * L), idx))
            if OW % L and OW >= L:                       # overlaps the vector before
                idx = [n_i, c_i, oh, Ramp(as_expr(OW - L), L)]
                kb.store(y, idx, ctx.apply_epilogue(value(as_expr(OW - L)), idx))
            elif OW % L:
                o0 = (OW // L) * L
                kb.store(last, 0, value(as_expr(o0)))
                with kb.loop(OW % L, hint="ot") as ot:
                    idx = [n_i, c_i, oh, ot + o0]
                    kb.store(y, idx, ctx.apply_epilogue(last[ot], idx))
    return kb
