"""The vector schedule of 2-D float32 depthwise convolution (ONNX operator spec "Conv",
Conv-22 semantics, with group == C == M; docs/architecture.md "CPU codegen").

X [N, C, H, W], W [C, 1, KH, KW] (a compile-time constant), optional B [C], Y [N, C, OH, OW],
all f32, NCHW. Each output channel reads one input plane, so there are only KH*KW
multiply-adds per output element and nothing to block over channels: the schedule vectorises
along the output row and keeps every accumulator in a register.

- Parallel over (n, channel, band of output rows); a band is the whole plane unless the
  planes are too few for :data:`MIN_TASKS` tasks or a band's local copy of its input would
  exceed half the L1 cache. Per channel the KH*KW weights and the bias are copied into a local
  (registers after LLVM's SROA) so they stay live over the band.
- Rows: each run of output rows with the same valid kernel rows (the interior rows, and the
  few border rows at the top and bottom) gets its own loop, with the taps outside the image
  dropped at compile time: no padding test runs per row or per element. Kernels taller than
  :data:`LOOP_ROWS_ABOVE` rows (knob ``loop_kernel_rows``; dilation 1) instead loop over their
  kernel rows, the accumulators updated in place: the interior rows with the constant bounds
  [0, KH), each run of border rows in one loop with bounds computed per row. Two copies of the
  row code instead of one per run, each KH times smaller: a 7x7's compile time falls from
  about 10-30 s to 1-4 s.
- Columns are vectors of L = ``target.lanes(f32)`` lanes: the loop body is a tile of
  :func:`tile_vectors` vectors; after the whole tiles, vectors of L lanes the last of which
  ends at the row's last column and overlaps its predecessor (see :func:`_rest_vectors`).
  Each accumulator is one chain ``fma(broadcast weight, input vector, acc)`` over the taps,
  started from the bias.
- Stride 1, rows wider than 2*L and kernels narrower than :data:`PADDED_MIN_KW`: the input
  vector of tap (kh, kw) is a contiguous load of the input row. The columns where a tap falls
  outside the row (pad columns at each end) are computed one lane at a time with those taps
  dropped, so no load leaves the row.
- Stride 1, rows of at most 2*L or kernels at least :data:`PADDED_MIN_KW` wide (where those
  border columns would cost as much as the rest: a 7x7 kernel has 3 at each end of every row
  for each of its 7 rows): the band's input rows are copied, as vectors, into zero-padded local rows, and every
  column is a vector. Several channels are copied before the first is computed, so that the
  vector loads of the padded rows do not wait on the stores that filled them.
- Stride > 1: the input of a vector of outputs is strided and the kernel IR has no shuffle.
  The band's input rows are copied once, de-interleaved by phase, into a local: element g of
  the band (flat, from its first row) goes to ``phase[g % s][g // s]``; LLVM's loop
  vectoriser turns that copy loop (s interleaved loads per iteration) into wide loads and
  shuffles. The input of a stride-s vector of outputs is then a contiguous vector of one
  phase. Border columns are computed one lane at a time from X as above.
- Bias and the fused epilogue (``ctx.apply_epilogue``: activation, residual Add ...) run on
  whole vectors before one vector store per output vector (the index's last entry a
  :class:`Ramp`). Columns covered by two overlapping vectors are computed and stored twice
  with the same value; a Conv's output never shares memory with its inputs (the memory plan
  shares buffers only for elementwise kernels).

Registered as ``conv2d_depthwise`` (key ``"conv2d"``, llvm; it outranks the blocked schedules).
Knobs: ``tile_vectors`` (:func:`tile_vectors`), ``padded_rows`` (stride 1), ``min_parallel_tasks``
(:data:`MIN_TASKS`), ``loop_kernel_rows`` and, for padded rows in one band, ``copy_ahead`` (:data:`PADDED_COPY_AHEAD`).
"""
from __future__ import annotations

import contextlib

import numpy as np

from tensorfuse.ir.kernel import Buffer, Expr, KernelBuilder, Ramp, as_expr, fma, maximum, minimum
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from .conv2d import PLEVEL, pow2_candidates

#: the largest kernel extent (per spatial dim) whose taps the schedule unrolls
MAX_KERNEL = 7
#: at most this many runs of output rows with distinct valid kernel rows (one loop each)
MAX_ROW_PATTERNS = 16
#: kernels with more rows than this loop over their kernel rows by default (knob
#: ``loop_kernel_rows``): a 7x7's 49 taps unrolled for each of its 7 runs of rows made
#: ConvNeXt's 18 depthwise kernels about a third of its compile time
LOOP_ROWS_ABOVE = 3
#: the parallel loop has at least this many (n, channel, band) tasks where the rows allow
MIN_TASKS = 64
#: padded rows: channels per task such that about this many floats are copied before the
#: first channel's compute loads them
PADDED_COPY_AHEAD = 512


def depthwise_conv_ok(x: Buffer, w: Buffer, y: Buffer, group: int, geo, acc_dtype, hooks) -> bool:
    """Whether :func:`emit_conv_depthwise` applies: X [N, C, H, W], W [C, 1, KH, KW] and Y
    all f32, group == C_in == C_out (one input channel per output channel, channel
    multiplier 1), no custom load/finish hooks, kernel extents at most :data:`MAX_KERNEL`
    and at most :data:`MAX_ROW_PATTERNS` row runs."""
    return (x.dtype == DType.f32 and y.dtype == DType.f32 and w.dtype == DType.f32
            and acc_dtype in (None, DType.f32) and not any(hooks) and geo.rank == 2
            and len(x.shape) == 4 and group == x.shape[1] == y.shape[1] and w.shape[1] == 1
            and max(geo.kernel) <= MAX_KERNEL and len(row_patterns(geo)) <= MAX_ROW_PATTERNS)


def row_patterns(geo) -> list[tuple[int, int, int, int]]:
    """Runs of output rows with the same range of valid kernel rows, as (oh_start, oh_end,
    kh_lo, kh_hi), covering [0, OH) in order. Kernel row kh of output row oh reads input row
    oh*sh - ph + kh*dh, valid when inside [0, H); the valid kernel rows of a row are one range
    (empty for a row of pure padding)."""
    H = geo.in_shape[0]
    OH = geo.out_shape[0]
    KH, sh, dh, ph = geo.kernel[0], geo.strides[0], geo.dilations[0], geo.pads_begin[0]
    out: list[list[int]] = []
    for oh in range(OH):
        ih0 = oh * sh - ph
        lo = max(0, -(ih0 // dh))                  # ceil(-ih0 / dh), clamped at 0
        hi = max(lo, min(KH, -((ih0 - H) // dh)))  # ceil((H - ih0) / dh), capped at KH
        if out and out[-1][2] == lo and out[-1][3] == hi:
            out[-1][1] = oh + 1
        else:
            out.append([oh, oh + 1, lo, hi])
    return [tuple(r) for r in out]


#: stride-1 depthwise kernels at least this wide read zero-padded local rows whatever the row
#: width (knob ``padded_rows``): their border columns make many short runs in the rows read in
#: place. Measured on an AVX-512 host, 1 thread, padded / in place: 7x7 at 56x56 (ConvNeXt's
#: first stage) 0.40 / 1.02 ms, 7x7 at 112x112 0.94 / 1.62, 5x5 at 56x56 0.43 / 0.52, 5x5 at
#: 112x112 0.43 / 0.43; 3x3 kernels stay in place (3x3 at 56x56 0.16 / 0.14, 112x112 0.43 / 0.35)
PADDED_MIN_KW = 5
#: fused activations (FusedConv's ``activation``) that evaluate an exp, tanh or erf per element:
#: stride-1 convs with one read zero-padded local rows at any width (knob ``padded_rows``), so
#: every column is a vector, where the rows read in place compute each row's border columns
#: one lane at a time, a scalar exp each. Measured on a Zen 4, 1 thread, + SiLU, in place /
#: padded: 144x56x56 3x3 (EfficientNet) 0.391 / 0.301 ms (onnxruntime 0.331), 32x112x112 3x3
#: 0.262 / 0.217 (0.278); without an activation padded rows lose (144x56x56: 0.166 / 0.216)
COSTLY_ACTIVATIONS = frozenset({"Sigmoid", "SiLU", "Tanh", "Gelu", "GeluTanh"})


def tile_vectors(target) -> int:
    """Vectors of accumulators per column tile: 4 with AVX2 (the 9 weights of a 3x3 kernel,
    4 accumulators and the operands fit its 16 vector registers), 8 with AVX-512's 32. (On a
    2-core Zen 3, 2, 3, 4 and 6 measured the same.)"""
    return 8 if getattr(target, "has_avx512", False) else 4


def _rest_vectors(o: int, e: int, a: int, L: int) -> list[tuple[int, int]]:
    """(start, lanes) of vectors covering columns [o, e), the end of a run [a, e): vectors of
    L lanes, the last ending at e and overlapping its predecessor, when the run has at least L
    columns; for shorter runs the widest power of two that fits, the last one again ending at
    e. Every vector lies inside [a, e)."""
    if e <= o:
        return []
    lanes = L
    while lanes > e - a:
        lanes //= 2
    out = [(s, lanes) for s in range(o, e - lanes + 1, lanes)]
    if not out or out[-1][0] + lanes < e:
        out.append((e - lanes, lanes))
    return out


def emit_conv_depthwise(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                        params: list[Buffer] | None = None) -> KernelBuilder:
    """Emit the depthwise kernel Y = conv(X, W, group=C) + B, then the fused epilogue.
    X [N, C, H, W], W [C, 1, KH, KW], B [C] or None, Y [N, C, OH, OW], all f32; ``geo`` is
    the resolved geometry (``ir.ops.conv.conv_geometry``). See the module docstring for the
    schedule. Returns the KernelBuilder."""
    N, C = x.shape[:2]
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    L = ctx.target.lanes(DType.f32)
    T0 = tile_vectors(ctx.target)
    T = knob("tile_vectors", [t for t in (1, 2, 3, 4, 6, 8, 12, 16) if t <= 2 * T0], T0,
             doc=f"vectors of {L} output columns per tile (one accumulator each)")
    f32 = DType.f32
    zero = as_expr(0.0, f32)
    phased = sw > 1                           # de-interleaved input
    Wp = OW + (KW - 1) * dw                   # stride 1: the padded row the columns read
    # zero-padded local rows
    costly = ctx.node.attr("activation", "") in COSTLY_ACTIVATIONS
    padded = sw == 1 and knob("padded_rows", (False, True), W <= 2 * L or KW >= PADDED_MIN_KW or costly,
                              doc="stride 1: copy the input rows into zero-padded local rows (default: rows "
                                  f"of at most {2 * L} columns, kernels at least {PADDED_MIN_KW} wide, or an "
                                  "activation with an exp, tanh or erf) instead of reading X with the border "
                                  "columns apart")
    min_tasks = knob("min_parallel_tasks", pow2_candidates(8, 256), MIN_TASKS,
                     doc="(n, channel, band of output rows) tasks aimed at: bands split the planes")
    span = (KH - 1) * dh + 1                  # input rows an output row's window covers
    patterns = row_patterns(geo)
    # kernel rows in a loop (bounds computed per output row) instead of unrolled per run of rows
    loop_rows = dh == 1 and knob("loop_kernel_rows", (False, True), KH > LOOP_ROWS_ABOVE,
                                 doc="the kernel rows as a loop with per-row bounds (one copy of the row code) "
                                     f"instead of every tap unrolled for each run of rows (default: KH > {LOOP_ROWS_ABOVE})")

    # bands of output rows: at least MIN_TASKS tasks; a band's local copy within L1 / 2
    NB = min(OH, -(-min_tasks // (N * C)))
    if phased or padded:
        rows_cap = max(span, ctx.target.l1d_bytes // 2 // (4 * (Wp if padded else W)))
        NB = max(NB, -(-OH // max(1, (rows_cap - span) // sh + 1)))
    B = -(-OH // NB)                          # output rows per band
    NB = -(-OH // B)
    brows = min(H, (B - 1) * sh + span)       # input rows of a band, at most
    G = 1                                     # channels per task
    if padded and NB == 1:
        ahead = knob("copy_ahead", pow2_candidates(128, 4096), PADDED_COPY_AHEAD,
                     doc="padded rows: floats copied (channels) before the first channel's compute reads them")
        G = max(1, min(ahead // (brows * Wp), (N * C) // min_tasks, C))
    CG = -(-C // G)

    kb = ctx.kernel(params=params)
    how = (f"de-interleaved input (stride {sw})" if phased else
           f"zero-padded rows, {G} channels per task" if padded else "contiguous rows")
    kb.kernel.comment += f"  [depthwise: {T}x{L} columns per tile, {how}]"
    nk = KH * KW
    wl = kb.local(f32, (nk + 1,), hint="wtap")                 # the taps' weights, then the bias
    accs: dict[int, Buffer] = {}                               # lanes -> accumulators

    def acc_buf(lanes: int) -> Buffer:
        if lanes not in accs:
            accs[lanes] = kb.local(f32, (T * lanes,), hint=f"acc{lanes}_")
        return accs[lanes]

    # de-interleaved: element g of the band (flat) at phase[(g % s) * part + g // s]
    part = -(-brows * W // sw)
    phase = kb.local(f32, (sw * part,), hint="phase") if phased else None
    kpad = -(-pw // sw)                       # g + s*kpad >= 0 for every column read
    padbuf = kb.local(f32, (G * brows * Wp,), hint="padded") if padded else None

    with kb.loop(N * CG * NB, kind="parallel", hint="t") as t:
        band = t % NB if NB > 1 else as_expr(0)
        ncg = t / NB if NB > 1 else t
        n = ncg / CG if CG > 1 else ncg
        cg = ncg % CG if CG > 1 else as_expr(0)
        if NB > 1:
            oh_lo = band * B
            oh_hi = minimum(oh_lo + B, as_expr(OH))    # the last band may be shorter
            ih_a = maximum(oh_lo * sh - ph, 0)
            ih_b = minimum((oh_hi - 1) * sh + (span - ph), as_expr(H))
        else:
            oh_lo, oh_hi = as_expr(0), as_expr(OH)
            ih_a = as_expr(max(0, -ph))
            ih_b = as_expr(min(H, (OH - 1) * sh + span - ph))

        @contextlib.contextmanager
        def channels():
            """The task's channels, one after the other: yields (c, n*C + c)."""
            if G == 1:
                yield cg, n * C + cg
                return
            with kb.loop(G, hint="g") as g:
                c = cg * G + g
                if CG * G == C:
                    yield c, n * C + c
                else:
                    with kb.if_(c < C):
                        yield c, n * C + c

        if padded:
            # the band's input rows into padded rows, as vectors (vector loads of what scalar
            # stores wrote wait for those stores to reach the cache)
            with channels() as (c, nc):
                with kb.loop(ih_b - ih_a, hint="r") as j:
                    dst = ((c - cg * G) * brows + j) * Wp if G > 1 else j * Wp
                    src = (nc * H + ih_a + j) * W
                    for o in [*range(pw), *range(pw + W, Wp)]:
                        kb.store(padbuf, dst + o, zero)
                    nv = W // L
                    if nv > 1:
                        with kb.loop(nv, hint="v") as v:
                            kb.store(padbuf, dst + (pw + v * L), x.vload(src + v * L, L))
                    for o, lanes in _rest_vectors(nv * L if nv > 1 else 0, W, 0, L):
                        kb.store(padbuf, dst + (pw + o), x.vload(src + o, lanes))

        with channels() as (c, nc):
            pbase = (c - cg * G) * (brows * Wp) if G > 1 else as_expr(0)
            for k in range(nk):
                kb.store(wl, k, w.flat(c * nk + k))
            if b is not None:
                kb.store(wl, nk, b[c])
            if phased:
                # the band's input rows [ih_a, ih_b) de-interleaved, in one loop over them
                src = (nc * H + ih_a) * W
                if NB == 1:             # a known count (the loop's extent a constant)
                    cnt = (min(H, (OH - 1) * sh + span - ph) - max(0, -ph)) * W
                    full = as_expr(cnt // sw)
                else:
                    cnt = (ih_b - ih_a) * W
                    full = cnt / sw
                with kb.loop(full, kind="vectorize", hint="m") as m:
                    for r in range(sw):
                        kb.store(phase, r * part + m, x.flat(src + m * sw + r))
                for r in range(sw - 1):     # the last cnt % s elements
                    if NB == 1:
                        if r < cnt % sw:
                            kb.store(phase, r * part + full, x.flat(src + full * sw + r))
                    else:
                        with kb.if_(cnt % sw > r):
                            kb.store(phase, r * part + full, x.flat(src + full * sw + r))

            def row(oh: Expr, lo: int, hi: int) -> None:
                """Output row ``oh``, whose valid kernel rows are [lo, hi)."""
                ih0 = oh * sh - ph

                def xrow(kh: int) -> Expr:
                    return (nc * H + ih0 + kh * dh) * W

                pidx = {}     # de-interleaved: where tap (kh, kw) of column 0 would be
                if phased and not loop_rows:
                    for kh in range(lo, hi):
                        for kw in range(KW):
                            g = (ih0 + kh * dh - ih_a) * W + (kw * dw - pw + sw * kpad)
                            pidx[kh, kw] = (g % sw) * part + g / sw - kpad

                def tile(ow0: Expr, widths: list[int], col: int | None,
                         offs: list[int] | None = None) -> None:
                    """Vectors of ``widths`` lanes of the row's outputs at ow0 + ``offs``
                    (default: one after the other); ``col``: ow0 as a known int, for border
                    columns read from X with the taps outside the row dropped."""
                    if offs is None:
                        offs = [sum(widths[:i]) for i in range(len(widths))]
                    if loop_rows:
                        looped(ow0, widths, col, offs)
                        return
                    chains: list[Expr | None] = [None] * len(widths)
                    for kh in range(lo, hi):
                        for kw in range(KW):
                            wv = wl[kh * KW + kw]
                            iw = kw * dw - pw
                            for v, (off, lanes) in enumerate(zip(offs, widths)):
                                if col is not None and not 0 <= (col + off) * sw + iw < W:
                                    continue
                                xv = tap(kh, kw, ow0, off, lanes, col)
                                if chains[v] is None:       # the bias starts the chain
                                    chains[v] = wv * xv if b is None else fma(wv, xv, wl[nk])
                                else:
                                    chains[v] = fma(wv, xv, chains[v])
                    for v, lanes in enumerate(widths):
                        val = chains[v]
                        if val is None:                     # no tap inside the image
                            val = kb.broadcast(wl[nk] if b is not None else zero, lanes)
                        kb.store(acc_buf(lanes), v * lanes, kb.broadcast(val, lanes))
                    store_out(ow0, widths, offs)

                def tap(kh, kw: int, ow0: Expr, off: int, lanes: int, col: int | None) -> Expr:
                    """The input vector that tap (kh, kw) multiplies for the outputs at
                    ow0 + off (kh an int, or the kernel-row loop's Var)."""
                    if padded:
                        return padbuf.vload(pbase + (ih0 + kh * dh - ih_a) * Wp + ow0 + (off + kw * dw), lanes)
                    if phased and col is None:
                        if (kh, kw) in pidx:
                            return phase.vload(pidx[kh, kw] + ow0 + off, lanes)
                        g = (ih0 + kh * dh - ih_a) * W + (kw * dw - pw + sw * kpad)
                        return phase.vload((g % sw) * part + g / sw - kpad + ow0 + off, lanes)
                    return x.vload(xrow(kh) + (ow0 + off) * sw + (kw * dw - pw), lanes)

                def store_out(ow0: Expr, widths: list[int], offs: list[int]) -> None:
                    """The accumulators through the epilogue into Y (the epilogue gets a load:
                    it may use its value more than once)."""
                    for v, (off, lanes) in enumerate(zip(offs, widths)):
                        val = acc_buf(lanes).vload(v * lanes, lanes)
                        ow = ow0 + off
                        idx = [n, c, oh, Ramp(ow, lanes) if lanes > 1 else ow]
                        kb.store(y, idx, ctx.apply_epilogue(val, idx))

                def looped(ow0: Expr, widths: list[int], col: int | None, offs: list[int]) -> None:
                    """:func:`tile` with the kernel rows [lo, hi) (Exprs) in a loop: the
                    accumulators start from the bias and take one fma per tap in place."""
                    start = kb.broadcast(wl[nk], 1) if b is not None else zero
                    for v, lanes in enumerate(widths):
                        kb.store(acc_buf(lanes), v * lanes, kb.broadcast(start, lanes))
                    with kb.reduce(hi, start=lo, hint="kh") as kh:
                        for kw in range(KW):
                            wv = wl[kh * KW + kw]
                            iw = kw * dw - pw
                            for v, (off, lanes) in enumerate(zip(offs, widths)):
                                if col is not None and not 0 <= (col + off) * sw + iw < W:
                                    continue
                                a = acc_buf(lanes)
                                kb.store(a, v * lanes, fma(wv, tap(kh, kw, ow0, off, lanes, col),
                                                           a.vload(v * lanes, lanes)))
                    store_out(ow0, widths, offs)

                def columns(a: int, e: int) -> None:
                    """Columns [a, e), whose taps all lie inside the (padded) row: whole tiles
                    in a loop, then the rest (:func:`_rest_vectors`)."""
                    nt = (e - a) // (T * L)
                    if nt:
                        with kb.loop(nt, hint="tw") as i:
                            tile(a + i * (T * L), [L] * T, None)
                    vecs = _rest_vectors(a + nt * T * L, e, a, L)
                    for k in range(0, len(vecs), T):
                        grp = vecs[k:k + T]
                        tile(as_expr(grp[0][0]), [ln for _, ln in grp], None, [o - grp[0][0] for o, _ in grp])

                if padded:
                    columns(0, OW)
                    return
                # columns [ca, cb) read inside the row for every tap; the others one at a time
                ca = min(-(-pw // sw), OW)
                cb = max(ca, min(OW, (W - 1 + pw - (KW - 1) * dw) // sw + 1))
                for col in range(0, ca):
                    tile(as_expr(col), [1], col)
                columns(ca, cb)
                for col in range(cb, OW):
                    tile(as_expr(col), [1], col)

            if loop_rows:
                # the interior rows keep constant kernel-row bounds; each run of border rows
                # between them is one loop whose bounds are computed per row (row_bounds)
                runs: list[tuple[int, int, int | None, int | None]] = []
                for s0, e0, lo, hi in patterns:
                    if (lo, hi) != (0, KH) and runs and runs[-1][2] is None:
                        runs[-1] = (runs[-1][0], e0, None, None)
                    else:
                        runs.append((s0, e0, None, None) if (lo, hi) != (0, KH) else (s0, e0, lo, hi))
                patterns = runs

                def row_at(oh: Expr, lo, hi) -> None:
                    if lo is not None:
                        row(oh, lo, hi)
                        return
                    top = as_expr(ph) - oh * sh          # the valid kernel rows (dilation 1)
                    row(oh, maximum(top, 0), minimum(top + H, as_expr(KH)))
            else:
                row_at = row

            if NB == 1:                     # a loop per run of rows
                for s0, e0, lo, hi in patterns:
                    with kb.loop(e0, start=s0, hint="oh") as oh:
                        row_at(oh, lo, hi)
            else:
                # bands: the band's rows in one loop of constant extent (the default schedule
                # counts a loop of unknown extent as a few iterations: the kernel's work would
                # look too small to split across threads), each picking its run of rows
                def dispatch(oh: Expr, ps) -> None:
                    (_, e0, lo, hi), rest = ps[0], ps[1:]
                    if not rest and OH % B == 0:
                        row_at(oh, lo, hi)
                        return
                    with kb.if_(oh < e0) as br:
                        row_at(oh, lo, hi)
                    if rest:
                        with kb.else_(br):
                            dispatch(oh, rest)

                with kb.loop(B, hint="r") as r:
                    dispatch(oh_lo + r, patterns)
    return kb


def _depthwise_applies(ctx, *, x, w, y, group, geo, acc_dtype, hooks, **_) -> bool:
    return (depthwise_conv_ok(x, w, y, group, geo, acc_dtype, hooks)
            and ctx.const(1) is not None and ctx.inputs[1] is w)


@register_schedule("conv2d", "llvm", "conv2d_depthwise", plevel=PLEVEL["depthwise"], applies=_depthwise_applies)
def _depthwise(ctx, *, x, w, b, y, geo, params=None, **_) -> KernelBuilder:
    """Depthwise convolution (group == C == M), vectorised along output rows (module docstring)."""
    return emit_conv_depthwise(ctx, x, w, b, y, geo, params=params)


# ------------------------------------------------------------ small planes: channels as lanes
#: the channels-as-lanes schedule (:func:`emit_conv_depthwise_lanes`) applies where its
#: zero-padded transposed input plane (Hp x Wp x L float32, on the stack) takes at most this
#: many bytes, and is the default over the row schedule (:func:`_lanes_level`) where the kernel
#: is at least :data:`PADDED_MIN_KW` wide, the plane fits in the L1 cache, or the conv is
#: strided and the plane fits in :data:`LANES_STRIDED_L1` L1 caches; elsewhere it ranks below
#: the row schedule, for the "schedule" knob. Measured on a Zen 4 (AVX-512, 32 KiB L1d), 1
#: thread, depthwise conv + SiLU, rows / lanes, ms: 1152x7x7 5x5 0.210 / 0.071, 3x3 0.120 /
#: 0.056; 672x14x14 5x5 0.268 / 0.157, stride 2 0.280 / 0.086; 480x14x14 3x3 0.108 / 0.087;
#: 576x14x14 3x3 stride 2 0.093 / 0.044; 240x28x28 5x5 0.230 / 0.215, 3x3 stride 2 0.084 /
#: 0.069 (a 53 KB plane); 144x56x56 5x5 stride 2 0.330 / 0.187 (222 KB), 3x3 stride 2 0.130 /
#: 0.156 (208 KB); 192x28x28 3x3 0.104 / 0.139 (58 KB); 144x56x56 3x3 0.393 / 0.357 (215 KB);
#: 32x112x112 5x5 0.395 / 0.434 (861 KB: does not apply); without activation 768x7x7 7x7
#: 0.130 / 0.053, 384x14x14 7x7 0.156 / 0.112, 192x28x28 7x7 0.286 / 0.212, 96x56x56 7x7
#: (ConvNeXt's first stage, 246 KB) 0.533 / 0.404
LANES_MAX_PLANE_BYTES = 256 * 1024
#: strided convs take channels as lanes by default up to a plane of this many L1 caches
LANES_STRIDED_L1 = 2
#: output pixels of a row per register tile (one accumulator vector each), at most
LANES_MAX_TILE = 8


def lanes_plane(geo) -> tuple[int, int]:
    """(Hp, Wp): the zero-padded input window that :func:`emit_conv_depthwise_lanes` copies,
    just large enough for every output's taps."""
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    return (OH - 1) * sh + (KH - 1) * dh + 1, (OW - 1) * sw + (KW - 1) * dw + 1


def lanes_tile(ow: int, cap: int = LANES_MAX_TILE) -> int:
    """Output pixels per register tile of a row of ``ow``: the fewest tiles of at most ``cap``
    pixels that cover the row, as even as they go (7 -> 7, 14 -> 7, 28 -> 7, 56 -> 8)."""
    nt = -(-ow // cap)
    return -(-ow // nt)


def emit_conv_depthwise_lanes(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                              params: list[Buffer] | None = None) -> KernelBuilder:
    """Depthwise convolution with the channels as the vector lanes, for small output planes.
    X [N, C, H, W], W [C, 1, KH, KW] (constant), optional B [C], Y [N, C, OH, OW], all f32,
    NCHW, C >= L = ``target.lanes(f32)``; ``geo`` as :func:`emit_conv_depthwise`.

    Parallel over (n, block of L channels); the last block of a C that L does not divide
    starts at C - L and overlaps its predecessor (those channels are computed and stored
    twice, with the same values). A task copies its channels' input, transposed, into a
    zero-padded local plane [Hp, Wp, L] (one strided gather of L channels per input pixel;
    :func:`lanes_plane`), then computes each output row in tiles of P pixels
    (:func:`lanes_tile`, knob ``tile_pixels``): P accumulator vectors, each one ``fma`` chain
    over the KH*KW taps, started from the bias (a vector of the packed constant
    [C/L, KH*KW + 1, L] after the taps' weights, or of B where B is not a constant), the tap's
    weights a contiguous vector of that constant. Every lane does useful work whatever the
    plane's width or the stride, and the taps never test the padding. The P sums go to a local
    (the epilogue may read its value more than once: SiLU), then each through the fused
    epilogue and a store strided by the channel dim. A row's last tile, where P does not
    divide OW, ends at the row's end and overlaps its predecessor.

    Registered as ``conv2d_depthwise_lanes`` (key ``"conv2d"``, llvm); the default over the
    row schedule where :func:`_lanes_level` says (see the measurements at the module constants)."""
    N, C = x.shape[:2]
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    f32 = DType.f32
    L = ctx.target.lanes(f32)
    P = knob("tile_pixels", list(range(1, min(OW, 2 * LANES_MAX_TILE) + 1)), lanes_tile(OW),
             doc="output pixels of a row per register tile (one accumulator vector of L channels each)")
    Hp, Wp = lanes_plane(geo)
    # input rows / columns some window reads (none where the pads exceed the windows: a stride
    # larger than the input and its end pad, the output all bias)
    rows, cols = max(0, min(H, Hp - ph)), max(0, min(W, Wp - pw))
    CB = -(-C // L)
    nk = KH * KW
    wc = ctx.const(1).reshape(C, nk).astype(np.float32)
    bc = ctx.const(2) if b is not None else None        # a bias that is not constant is read from B
    packed = np.zeros((CB, nk + 1, L), np.float32)
    for cb in range(CB):
        c0 = min(cb * L, C - L)
        packed[cb, :nk] = wc[c0:c0 + L].T
        if bc is not None:
            packed[cb, nk] = np.asarray(bc, np.float32).reshape(-1)[c0:c0 + L]
    wp = ctx.pack(packed, "wlanes")
    params = [p for p in (params or ctx.default_params()) if p is not w and (p is not b or bc is None)] + [wp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += (f"  [depthwise: channels as lanes, {L} channels x {P} pixels per tile, "
                          f"input transposed into a padded {Hp}x{Wp}x{L} local]")
    xin = kb.local(f32, (Hp * Wp * L,), hint="xin")
    acc = kb.local(f32, (P * L,), hint="acc")
    zero = kb.broadcast(as_expr(0.0, f32), L)
    with kb.loop(N * CB, kind="parallel", hint="t") as t:
        n = t / CB if CB > 1 else (t if N > 1 else as_expr(0))
        cb = t % CB if CB > 1 else as_expr(0)
        c0 = cb * L if C % L == 0 else minimum(cb * L, as_expr(C - L))
        # the zero border: rows above and below the rows read, then columns left and right
        for r0, r1 in ((0, min(ph, Hp)), (min(ph + rows, Hp), Hp)):
            if r1 > r0:
                with kb.loop((r1 - r0) * Wp, hint="zb") as q:
                    kb.store(xin, (r0 * Wp + q) * L, zero)
        for c_a, c_b in ((0, min(pw, Wp)), (min(pw + cols, Wp), Wp)):
            if c_b > c_a and rows:
                with kb.loop(rows, hint="zr") as r:
                    for cc in range(c_a, c_b):
                        kb.store(xin, ((r + ph) * Wp + cc) * L, zero)
        # the task's channels, transposed: one gather of L channels per input pixel
        with kb.loop(rows, hint="ih") as ih:       # rows > 0: ih + ph < Hp; cols > 0 likewise
            with kb.loop(cols, hint="iw") as iw:
                kb.store(xin, ((ih + ph) * Wp + iw + pw) * L, x[[n, Ramp(c0, L), ih, iw]])
        wbase = cb * ((nk + 1) * L)

        def tile(oh: Expr, ow0: Expr) -> None:
            start = None if b is None else wp.vload(wbase + nk * L, L) if bc is not None else b[[Ramp(c0, L)]]
            chains = [start] * P
            for kh in range(KH):
                for kw in range(KW):
                    wv = wp.vload(wbase + (kh * KW + kw) * L, L)
                    for p in range(P):
                        xv = xin.vload(((oh * sh + kh * dh) * Wp + (ow0 + p) * sw + kw * dw) * L, L)
                        chains[p] = wv * xv if chains[p] is None else fma(wv, xv, chains[p])
            for p in range(P):      # through a local: the epilogue may use its value more than once
                kb.store(acc, p * L, chains[p])
            for p in range(P):
                idx = [n, Ramp(c0, L), oh, ow0 + p]
                kb.store(y, idx, ctx.apply_epilogue(acc.vload(p * L, L), idx))

        nt = OW // P
        with kb.loop(OH, hint="oh") as oh:
            if nt > 1:
                with kb.loop(nt, hint="tw") as i:
                    tile(oh, i * P)
            elif nt == 1:
                tile(oh, as_expr(0))
            if OW % P:
                tile(oh, as_expr(OW - P))
    return kb


def _lanes_applies(ctx, *, x, w, y, group, geo, acc_dtype, hooks, **_) -> bool:
    if not _depthwise_applies(ctx, x=x, w=w, y=y, group=group, geo=geo, acc_dtype=acc_dtype, hooks=hooks):
        return False
    L = ctx.target.lanes(DType.f32)
    Hp, Wp = lanes_plane(geo)
    return L > 1 and x.shape[1] >= L and Hp * Wp * L * 4 <= LANES_MAX_PLANE_BYTES


def _lanes_level(ctx, *, geo, **_) -> int:
    """Above the row schedule where the kernel is at least :data:`PADDED_MIN_KW` wide, the
    transposed plane fits in L1, or the conv is strided and the plane fits in
    :data:`LANES_STRIDED_L1` L1 caches; below it elsewhere."""
    Hp, Wp = lanes_plane(geo)
    plane = Hp * Wp * ctx.target.lanes(DType.f32) * 4
    l1 = ctx.target.l1d_bytes
    preferred = (geo.kernel[1] >= PADDED_MIN_KW or plane <= l1
                 or (any(s > 1 for s in geo.strides) and plane <= LANES_STRIDED_L1 * l1))
    return PLEVEL["depthwise"] + (1 if preferred else -1)


@register_schedule("conv2d", "llvm", "conv2d_depthwise_lanes", plevel=_lanes_level, applies=_lanes_applies)
def _depthwise_lanes(ctx, *, x, w, b, y, geo, params=None, **_) -> KernelBuilder:
    """Depthwise convolution of small planes with the channels as the vector lanes (:func:`emit_conv_depthwise_lanes`)."""
    return emit_conv_depthwise_lanes(ctx, x, w, b, y, geo, params=params)
