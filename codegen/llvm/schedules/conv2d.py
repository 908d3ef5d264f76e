"""The register-blocked schedules of 2-D float32 convolution (docs/architecture.md "CPU codegen"),
for group 1 and, one group at a time, for grouped convolutions (:class:`ConvGroups`). Graph
layout stays NCHW. Each registers in ``ir.strategy`` for the key ``"conv2d"`` and the llvm
backend (``ir.ops.conv.emit_conv`` dispatches): ``conv2d_rows``, ``conv2d_flat``,
``conv2d_pointwise``, ``conv2d_im2row`` here, ``conv2d_winograd`` in :mod:`.conv2d_winograd`
(and ``conv2d_depthwise`` in :mod:`.conv2d_depthwise`). Where several apply, the one of highest
plevel (:data:`PLEVEL`, a function of the shape where a measured threshold decides) is the
default and the knob ``schedule`` picks another. Their tile sizes, chunk sizes and parallel
splits are knobs (``ir.knobs.knob``) whose defaults are the formulas below.

General convolutions (:func:`emit_conv_rows`): inside the kernel the output channels are
the vector lanes.

- W [M, C, KH, KW] is packed once at compile time into ``Wp [MB, KW, C, KH, OB*L]`` (or
  ``[MB, KW, KH, C, OB*L]`` for few input channels; ``L`` lanes of the target, ``OB`` vectors
  per block, ``MB`` blocks covering M, zero-padded beyond M), so the weights of one reduction
  step are ``OB`` contiguous vector loads.
- The micro-kernel keeps an ``OB x P`` tile of accumulators (OB*L output channels x P
  consecutive output columns) in vector registers over the whole C x KH x KW reduction: per
  step it loads OB weight vectors, broadcasts P input pixels and issues OB*P FMAs. Taps (kw)
  are the outermost reduction loop, so each loop body holds one tap.
- Rows: the tap range is clamped per output row. Columns: interior tiles (every tap inside
  the image) run in a loop; tiles at the borders sit at known positions, and their taps
  outside the image are dropped at compile time. No padded copy of the input.
- Bias and the fused epilogue (folded BatchNorm, activation, residual Add) run on each
  accumulator vector (its lanes are channels: operands and the store are strided by the
  channel dim) before the single store of each output element.
- Parallel over (n, channel block, output row).
- In a model the weights come from memory at every run (the layers between two runs evict
  them), so each reduction step prefetches (``Prefetch``, into L2; knob ``prefetch``) the same
  step's lines of the weights the task reads next: the next channel block's. The flat and
  pointwise tiles below do the same. resnet50 (25 M weights), 1 thread, against onnxruntime
  in the same process: 1.19x -> 1.12x with the pointwise order below.

Small output planes in narrow rows (:func:`emit_conv_flat`, resnet's 7x7 stage) tile the
flattened pixels instead, so a tile is not capped at one channel vector x one short row.

3x3 convolutions of stride 1 on larger planes take Winograd F(2x2, 3x3) instead
(:mod:`codegen.llvm.schedules.conv2d_winograd`), on the same register tile.

Pointwise convolutions (1x1, stride 1, no padding; :func:`emit_conv_pointwise`) are a GEMM
vectorised over pixels instead, with the epilogue on contiguous vectors; each pixel tile of X
is packed into a contiguous per-thread panel when enough channel blocks reuse it.

Tile sizes come from the target: L = ``target.lanes(f32)``; the accumulator tile takes at most
the vector registers the target has (16 with AVX2, 32 with AVX-512) less a few for operands
(the knobs' candidates keep to that too).
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np

from tensorfuse.ir.kernel import Buffer, Expr, KernelBuilder, PixelIndex, Ramp, as_expr, fma, select
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.ops.conv import window_hi, window_lo
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType


#: float32 elements in a 64-byte cache line (the stride of the weight prefetches)
LINE_F32 = 16


def prefetch_knob(what: str, applies: bool = True) -> int:
    """The ``prefetch`` knob of a blocked schedule (0: none; 1, the default: each reduction
    step prefetches the same step's lines of ``what`` into L2; 2: into L1); 0 where it does
    not ``applies`` (nothing is read next)."""
    return knob("prefetch", [0, 1, 2], 1,
                doc=f"0: none; 1: each reduction step prefetches the same step's lines of {what} "
                    "into L2; 2: into L1") if applies else 0


def prefetch_lines(kb: KernelBuilder, buf: Buffer, start, floats: int, level: int, offset=lambda o: o) -> None:
    """One Prefetch per cache line of ``buf[start : start + floats]`` (``offset`` maps a flat
    index, e.g. into a group's weights), at the ``prefetch`` knob's ``level`` (1: L2, 2: L1)."""
    for off in range(0, floats, LINE_F32):
        kb.prefetch(buf, offset(start + off), locality=2 if level == 1 else 3)


def vector_registers(target) -> int:
    """Vector registers of the target's ISA (``Target.vector_registers``; 16 for a stand-in
    without it)."""
    return getattr(target, "vector_registers", 16)


#: rows at most this wide may use tiles of one channel vector (all columns in one tile)
NARROW_ROW = 8


def _step_cycles(ob: int, w: int) -> float:
    """Estimated cycles of one reduction step of an ``ob`` x ``w`` tile on a core with two FMA
    pipes of latency 4 (Zen 3/4, Skylake and later): the FMAs, or the latency of each
    accumulator's chain when there are fewer than 8, or the loads; plus loop overhead."""
    return max(ob * w / 2, 4.0, (ob + w) / 2) + 1.0


def choose_tile(target, m_group: int, ow: int) -> tuple[int, int, int]:
    """(L, OB, P): lanes per vector, vectors of output channels, output columns per tile.

    The accumulators OB*P plus OB weight vectors and two more fit the vector registers; among
    those (OB = 2 channel vectors, or 1 for rows of at most :data:`NARROW_ROW` columns or a
    single vector of channels), the tile with the fewest estimated cycles per output row
    (:func:`_step_cycles` over the row's column tiles of width P, times the channel blocks),
    ties to the wider tile.
    Measured on a Zen 3: 6 columns x 16 channels for wide rows, 7 x 8 for 7-column rows, 5 x 16
    for 14-column rows."""
    L = target.lanes(DType.f32)
    regs = vector_registers(target)
    best = None
    for ob in (1, 2):
        if ob == 1 and ow > NARROW_ROW and m_group > L:
            continue                # measured: one channel vector x many columns is slower
        if ob > 1 and (ob - 1) * L >= m_group:
            break
        mb = -(-m_group // (ob * L))
        for p in range(1, min(ow, (regs - ob - 2) // ob) + 1):
            widths = [min(p, ow - c) for c in range(0, ow, p)]
            cost = mb * sum(_step_cycles(ob, w) for w in widths)
            key = (cost, -p, ob)
            if best is None or key < best[0]:
                best = (key, ob, p)
    return L, best[1], best[2]


#: the most channel vectors per register tile a knob offers
MAX_TILE_OC_VECTORS = 4


def tile_knobs(target, m_group: int, cols: int, default: tuple[int, int, int],
               what: str = "output columns", spare: int = 2) -> tuple[int, int, int]:
    """Knobs ``tile_oc_vectors`` (OB) and ``tile_cols`` (P) of a register tile of OB vectors of
    output channels x P ``what`` (at most ``cols``), ``default`` = (L, OB, P) the formula's
    choice. Candidates: OB from 1 to :data:`MAX_TILE_OC_VECTORS` without a block of only
    padding ((OB - 1) * L < ``m_group``); P such that the OB*P accumulators, OB weight vectors
    and ``spare`` more fit the vector registers. The P default is the formula's P, capped for
    another OB. Returns (L, OB, P)."""
    L, ob0, p0 = default
    regs = vector_registers(target)
    obs = [ob for ob in range(1, MAX_TILE_OC_VECTORS + 1)
           if ob == 1 or ((ob - 1) * L < m_group and (regs - ob - spare) // ob >= 1)]
    OB = knob("tile_oc_vectors", obs, ob0, doc=f"vectors of {L} output channels per register tile")
    pmax = max(1, min(cols, (regs - OB - spare) // OB))
    P = knob("tile_cols", range(1, pmax + 1), min(p0, pmax),
             doc=f"{what} per register tile (OB*P accumulators + OB weights + {spare} <= {regs} vector registers)")
    return L, OB, P


def pow2_candidates(lo: int, hi: int, *extra: int) -> list[int]:
    """Powers of two in [lo, hi], then ``extra`` values in that range (knob candidates)."""
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return out + [e for e in extra if lo <= e <= hi]


def blocked_conv_ok(x: Buffer, w: Buffer, y: Buffer, group: int, geo, acc_dtype, hooks,
                    target=None) -> bool:
    """Whether the blocked schedules apply: f32, 2-D, no custom load/finish hooks, and
    group 1, or a grouped convolution (:class:`ConvGroups`) whose groups have at least one
    vector of ``target``'s output channels or are pointwise (depthwise convolutions and groups
    of few channels, ResNeXt's 4, keep the row schedule)."""
    if not (x.dtype == DType.f32 and y.dtype == DType.f32 and w.dtype == DType.f32
            and acc_dtype in (None, DType.f32) and not any(hooks) and geo.rank == 2
            and max(geo.kernel) <= 11):
        return False
    if group == 1:
        return True
    mg = y.shape[1] // group
    return target is not None and mg >= (1 if unpadded_1x1(geo) else target.lanes(DType.f32))


def unpadded_1x1(geo) -> bool:
    """A 1x1 kernel without padding (what a pointwise convolution needs besides its epilogue)."""
    return list(geo.kernel) == [1, 1] and not any(geo.pads_begin) and not any(geo.pads_end)


class ConvGroups:
    """How the blocked schedules run a convolution of ``group`` G (ONNX Conv, attribute
    ``group``): as G independent convolutions of C/G input and M/G output channels. In NCHW the
    input channels of group g of image n, [g*C/G, (g+1)*C/G), are one contiguous run of planes,
    so they are image n*G + g of X viewed as [N*G, C/G, H, W], and likewise for Y: the schedules
    iterate over these N*G images (``n``, ``c``, ``m``: the view's batch and channel counts),
    the weights are packed per group and stacked as [G, ...] (:meth:`woff`), and the output
    index, the bias and the epilogue operands are mapped back (:meth:`out`). With G = 1 every
    mapping is the identity and adds nothing to the kernel."""

    def __init__(self, x: Buffer, y: Buffer, group: int = 1):
        self.G = group
        self.n, self.c, self.m = x.shape[0] * group, x.shape[1] // group, y.shape[1] // group

    def pack(self, ctx: LowerCtx, pack_group, hint: str) -> Buffer:
        """The node's constant weights [M, C/G, ...] packed per group by ``pack_group``
        (an array of group g's M/G output channels -> its packed array), stacked as [G, ...]."""
        w = ctx.const(1)
        if self.G == 1:
            return ctx.pack(pack_group(w), hint)
        parts = [pack_group(w[g * self.m:(g + 1) * self.m]) for g in range(self.G)]
        return ctx.pack(np.ascontiguousarray(np.stack(parts)), hint)

    def woff(self, wp: Buffer, n: Expr, off):
        """Flat offset ``off`` into image ``n``'s group of the packed weights ``wp`` (:meth:`pack`)."""
        return off if self.G == 1 else (n % self.G) * (wp.numel // self.G) + off

    def out(self, n: Expr, oc):
        """(image, output channel) of Y for channel ``oc`` of the view's image ``n``."""
        if self.G == 1:
            return n, oc
        return n / self.G, (n % self.G) * self.m + oc


#: below this many input channels the kernel rows (kh) go outside the channel loop: a long
#: channel loop then has too few iterations, and the few input planes stay in cache anyway
KH_OUTER_CHANNELS = 16


def pack_weights(w: np.ndarray, L: int, ob: int, kh_outer: bool) -> np.ndarray:
    """W [M, C, KH, KW] -> Wp [MB, KW, C, KH, ob*L], or [MB, KW, KH, C, ob*L] with
    ``kh_outer`` (zeros beyond M): the tiles' reduction order (taps outside; see
    :data:`KH_OUTER_CHANNELS`), so the weights stream contiguously."""
    m, c, kh, kw = w.shape
    blk = ob * L
    mb = -(-m // blk)
    wp = np.zeros((mb * blk, c, kh, kw), np.float32)
    wp[:m] = w
    order = (0, 4, 3, 2, 1) if kh_outer else (0, 4, 2, 3, 1)
    return np.ascontiguousarray(wp.reshape(mb, blk, c, kh, kw).transpose(order))


def emit_conv_rows(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                   params: list[Buffer] | None = None, grp: ConvGroups | None = None) -> KernelBuilder:
    """The row tiles (module docstring): parallel over (image of the
    grouped view ``grp``, channel block, output row), a register tile of OB channel vectors x P
    columns per step. Returns the KernelBuilder."""
    grp = grp or ConvGroups(x, y)
    n_, c_, m_ = grp.n, grp.c, grp.m
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    L, OB, P = tile_knobs(ctx.target, m_, OW, choose_tile(ctx.target, m_, OW))
    blk = OB * L
    MB = -(-m_ // blk)
    kh_outer = knob("weights_kh_outer", (False, True), c_ < KH_OUTER_CHANNELS,
                    doc="kernel rows outside the input-channel loop (weights packed [MB, KW, KH, C, OB*L]) "
                        "instead of inside ([MB, KW, C, KH, OB*L])")
    PF = prefetch_knob("the next channel block's weights", MB > 1)
    wp = grp.pack(ctx, lambda wg: pack_weights(wg, L, OB, kh_outer), "wpack")
    params = [p for p in (params or ctx.default_params()) if p is not w] + [wp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += f"  [register tile {OB}x{L} channels x {P} columns, weights packed {list(wp.shape)}]"
    block = KW * c_ * KH * blk          # floats of one channel block's packed weights
    acc = kb.local(DType.f32, (OB * P * L,), hint="acc")
    out = kb.local(DType.f32, (L,), hint="lanes")

    def valid_col(ow: int, kw: int) -> bool:
        iw = ow * sw - pw + kw * dw
        return 0 <= iw < W

    # column tiles of P (the last one narrower; measured: balancing the widths, e.g. 4 + 3 for
    # 7 columns, was slower than 6 + 1); a tile whose taps all fall inside the image is
    # interior, and a run of interior tiles becomes a loop
    tiles = [(c0, min(P, OW - c0)) for c0 in range(0, OW, P)]

    def interior(c0: int, wd: int) -> bool:
        return all(valid_col(c, k) for c in (c0, c0 + wd - 1) for k in range(KW))

    run = [t for t in tiles if t[1] == P and interior(*t)]
    first = run[0][0] if run else 0
    run = [t for t in run if (t[0] - first) // P < len(run)]    # contiguous from the first
    n_int = len(run)
    edges = [t for t in tiles if t not in run]
    with kb.loop(n_ * MB * OH, kind="parallel", hint="nbh") as t:
        oh = t % OH
        nb = t / OH
        mb = nb % MB if MB > 1 else as_expr(0)
        n = nb / MB if MB > 1 else nb
        ih0 = oh * sh - ph
        # from block mb's weights to the next block's (the block the next rows read), or back
        # to the first
        to_next = select(mb + 1 < MB, as_expr(block), as_expr(-(MB - 1) * block)) if PF else None
        kh_lo = window_lo(-ih0, dh)
        kh_hi = window_hi(H - ih0, dh, KH)

        def tile(ow0: Expr, width: int, static_cols: int | None):
            for i in range(OB * width):
                kb.store(acc, i * L, kb.broadcast(as_expr(0.0, DType.f32), L))
            def taps(kw, cols):
                # kw outside the (ic, kh) reduction: one tap per loop body, so the input loads of
                # neighbouring taps (the same pixels at stride 1) are not kept live across taps,
                # which would take more registers than the accumulators leave (spills)
                with contextlib.ExitStack() as st:
                    if kh_outer:
                        kh = st.enter_context(kb.reduce(kh_hi, start=kh_lo, hint="kh"))
                        ic = st.enter_context(kb.reduce(c_, hint="ic"))
                        wrow = (((mb * KW + kw) * KH + kh) * c_ + ic) * blk
                    else:
                        ic = st.enter_context(kb.reduce(c_, hint="ic"))
                        kh = st.enter_context(kb.reduce(kh_hi, start=kh_lo, hint="kh"))
                        wrow = (((mb * KW + kw) * c_ + ic) * KH + kh) * blk
                    xrow = ((n * c_ + ic) * H + ih0 + kh * dh) * W
                    wv = [wp.vload(grp.woff(wp, n, wrow + o * L), L) for o in range(OB)]
                    if PF:
                        prefetch_lines(kb, wp, wrow + to_next, blk, PF, lambda o: grp.woff(wp, n, o))
                    for p in cols:
                        xv = x.flat(xrow + (ow0 + p) * sw + (kw * dw - pw))
                        for o in range(OB):
                            a = (o * width + p) * L
                            kb.store(acc, a, fma(wv[o], xv, acc.vload(a, L)))

            for kw in range(KW):
                cols = [p for p in range(width) if static_cols is None or valid_col(static_cols + p, kw)]
                if cols:                 # border tiles: taps outside the image dropped
                    taps(kw, cols)
            for o in range(OB):
                oc0 = (mb * OB + o) * L
                for p in range(width):
                    store_channel_vector(ctx, kb, y, b, out, acc.vload((o * width + p) * L, L),
                                         n, oc0, [oh, ow0 + p], m_, blk, grp)

        if n_int:
            with kb.loop(n_int, hint="tw") as tw:
                tile(first + tw * P, P, None)
        for c0, wd in edges:
            tile(as_expr(c0), wd, c0)
    return kb


def store_channel_vector(ctx: LowerCtx, kb: KernelBuilder, y: Buffer, b: Buffer | None, out: Buffer,
                         vec: Expr, n: Expr, oc0: Expr, pix: list, m_: int, blk: int,
                         grp: ConvGroups | None = None) -> None:
    """Bias, the fused epilogue and the store of one accumulator vector whose L lanes are the
    output channels oc0 .. oc0+L-1 of output pixel ``pix`` ([oh, ow]) of image ``n`` (the
    operands and the store are strided by the channel dim); channels past ``m_`` (the zero
    padding of the last block of ``blk``) are not stored. ``out``: an L-lane local for the
    lane-by-lane tail. With ``grp``, ``n`` and ``oc0`` are the image and channel of its grouped
    view (:meth:`ConvGroups.out`) and ``m_`` the channels of a group."""
    L = vec.lanes
    yn, yc = grp.out(n, oc0) if grp is not None else (n, oc0)

    def vector_store():
        idx = [yn, Ramp(yc, L)] + list(pix)
        v = vec + b[[Ramp(yc, L)]] if b is not None else vec
        kb.store(y, idx, ctx.apply_epilogue(v, idx))

    def lane_stores():
        kb.store(out, 0, vec)
        for ln in range(L):
            with kb.if_(oc0 + ln < m_):
                idx = [yn, yc + ln] + list(pix)
                v = out[ln] + b[yc + ln] if b is not None else out[ln]
                kb.store(y, idx, ctx.apply_epilogue(v, idx))
    if m_ % blk == 0:
        vector_store()
    elif m_ % L == 0:
        with kb.if_(oc0 < m_):
            vector_store()
    else:
        with kb.if_(oc0 + L <= m_) as whole:
            vector_store()
        with kb.else_(whole):
            lane_stores()


def zero_fill(kb: KernelBuilder, buf: Buffer, count: int, lanes: int) -> None:
    """Zero the first ``count`` float32 elements of ``buf`` (a local): a loop of ``lanes``-wide
    vector stores, then the tail one element at a time."""
    if count // lanes:
        zero = kb.broadcast(as_expr(0.0, DType.f32), lanes)
        with kb.loop(count // lanes, hint="z", role="spatial") as z:
            kb.store(buf, z * lanes, zero)
    for i in range(count // lanes * lanes, count):
        kb.store(buf, i, as_expr(0.0, DType.f32))


def split_blocks(mb: int, groups: int) -> tuple[int, int]:
    """(blocks per group, groups): ``mb`` channel blocks dealt into at most ``groups`` groups of
    equal size, none of them empty (10 blocks asked into 8 groups give 5 groups of 2)."""
    per = -(-mb // max(1, min(mb, groups)))
    return per, -(-mb // per)


# ----------------------------------------------------------------- small planes: flat pixel tiles
#: an output plane of at most this many pixels, in rows of at most :data:`NARROW_ROW` columns,
#: is tiled over its flattened pixels (:func:`emit_conv_flat`); this bounds the per-task
#: panel of partial sums (channel blocks x pixels x block, on the stack)
FLAT_MAX_PIXELS = 64


def flat_ok(ctx: LowerCtx, c_: int, m_: int, geo) -> bool:
    """Whether :func:`emit_conv_flat` applies: rows of at most :data:`NARROW_ROW` columns (where
    the row tiles of :func:`emit_conv_rows` hold one channel vector), a plane of at most
    :data:`FLAT_MAX_PIXELS` pixels, and at least two channel vectors."""
    OH, OW = geo.out_shape
    if not (OW <= NARROW_ROW and OH * OW <= FLAT_MAX_PIXELS and m_ >= 2 * ctx.target.lanes(DType.f32)):
        return False
    L, OB, _ = choose_flat_tile(ctx.target, m_, OH * OW)
    Hp, Wp = _flat_geometry(geo)
    return flat_chunk(ctx.target, c_, OB * L, geo.kernel[0] * geo.kernel[1], Hp * Wp) > 0


def choose_flat_tile(target, m: int, pixels: int) -> tuple[int, int, int]:
    """(L, OB, P) for :func:`emit_conv_flat`: OB channel vectors x P pixels of accumulators,
    with OB weight vectors and a broadcast beside them in the vector registers, minimising the
    estimated cycles (:func:`_step_cycles`) over the plane's pixel tiles times the channel
    blocks; ties to more channel vectors. 512 channels at 7x7 get 2 x 5 with 16 registers
    (AVX2: 9 tiles of 5 pixels and one of 4 beat 8 of 6 and one of 1; 10 FMAs per 2 weight
    loads and 5 broadcasts) and 2 x 14 with 32 (AVX-512)."""
    L = target.lanes(DType.f32)
    regs = vector_registers(target)
    best = None
    for ob in (1, 2, 3, 4):
        if (ob - 1) * L >= m:
            break
        mb = -(-m // (ob * L))
        for p in range(1, min(pixels, (regs - ob - 1) // ob) + 1):
            widths = [min(p, pixels - c) for c in range(0, pixels, p)]
            cost = mb * sum(_step_cycles(ob, w) for w in widths)
            key = (cost, -ob, -p)
            if best is None or key < best[0]:
                best = (key, ob, p)
    return L, best[1], best[2]


#: the input channels of :func:`emit_conv_flat` are taken in chunks whose packed weights
#: (channel block x chunk x taps, float32) take at most this many times the L1 data cache
#: (they stream from L2; the chunk's padded input stays in L1). Measured on a noisy Zen 3
#: (32 KiB L1, 512 KiB L2), 1 thread, share of numpy sgemm in the same run, two runs:
#: 512->512 3x3 at 7x7, chunks of 64 / 128 channels 87-68 / 94-79% (row tiles 78-62%);
#: 256->512 3x3 stride 2 (chunks capped at 64 by FLAT_PAD_MAX_BYTES) 105-73% (row tiles 81-66%)
FLAT_CHUNK_L1_SHARE = 4.0
#: ... and whose zero-padded input planes (a per-task local) take at most this many bytes
FLAT_PAD_MAX_BYTES = 64 * 1024
#: the parallel loop of :func:`emit_conv_flat` has at least this many tasks per image where
#: the channel blocks allow; each task pads its image's input once and runs a group of blocks
FLAT_MIN_TASKS = 8


def flat_chunk(target, c: int, blk: int, taps: int, plane: int = 1) -> int:
    """The input channels per chunk of :func:`emit_conv_flat`: the largest divisor of ``c``
    whose packed weights (``blk`` channels x chunk x ``taps``, float32) fit
    :data:`FLAT_CHUNK_L1_SHARE` times the target's L1 data cache and whose padded input planes
    (chunk x ``plane`` floats) fit :data:`FLAT_PAD_MAX_BYTES`; 0 when no divisor of at least
    8 channels fits (a padded plane too large: the row tiles are used)."""
    l1 = int(getattr(target, "l1d_bytes", 0) or 32 * 1024)
    limit = max(1, int(l1 * FLAT_CHUNK_L1_SHARE) // (blk * taps * 4))
    limit = min(limit, FLAT_PAD_MAX_BYTES // (4 * plane), c)
    best = max(d for d in range(1, limit + 1) if c % d == 0) if limit >= 1 else 0
    return best if best >= min(8, c) else 0


#: the partial-sum panel of a task of :func:`emit_conv_flat` (blocks x pixels x block, on the
#: stack) takes at most this many bytes for the knob ``blocks_per_task``'s candidates
FLAT_PART_MAX_BYTES = 256 * 1024


def _largest_chunk(c: int, plane: int) -> int:
    """The largest divisor of ``c`` whose padded planes fit :data:`FLAT_PAD_MAX_BYTES` (at least 1)."""
    return max([d for d in range(1, c + 1) if c % d == 0 and d * plane * 4 <= FLAT_PAD_MAX_BYTES] or [1])


def _flat_geometry(geo):
    """(Hp, Wp): the zero-padded input plane :func:`emit_conv_flat` reads, just large enough
    for every output pixel's window."""
    (OH, OW), (KH, KW) = geo.out_shape, geo.kernel
    (sh, sw), (dh, dw) = geo.strides, geo.dilations
    return (OH - 1) * sh + (KH - 1) * dh + 1, (OW - 1) * sw + (KW - 1) * dw + 1


def emit_conv_flat(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                   params: list[Buffer] | None = None, grp: ConvGroups | None = None) -> KernelBuilder:
    """Convolution of a small output plane (resnet's 7x7 stage) over flattened pixel tiles.
    X [N, C, H, W], W [M, C, KH, KW] (a compile-time constant), Y [N, M, OH, OW], all f32.

    Row tiles of a 7-column row hold one channel vector x 7 columns (8 loads per 7 FMAs);
    here a tile is OB channel vectors x P consecutive pixels of the flattened OH x OW plane,
    which may cross rows (:func:`choose_flat_tile`; 2 x 5 for 7x7 with 16 registers). So that every
    pixel reads every tap, each task first copies a chunk of input channels into a zero-padded
    local [KC, Hp, Wp] (:func:`_flat_geometry`; the border is zeroed once per task); the
    tiles then run one loop nest (kh, kw, ic) whatever their position. The chunk's weights
    (packed at compile time as Wp [MB, NC, KH, KW, KC, OB*L], one contiguous run per chunk) stay
    in L1/L2 across the tiles (:func:`flat_chunk`); partial sums wait in a per-task panel
    between chunks. Bias and the fused epilogue run on the sums before the single store
    (:func:`store_channel_vector`). Parallel over (n, group of channel blocks), the input
    padded once per task (:data:`FLAT_MIN_TASKS`). ``grp``: the groups of a grouped convolution
    (:class:`ConvGroups`; W is then [M, C/group, KH, KW]). Returns the KernelBuilder."""
    grp = grp or ConvGroups(x, y)
    n_, c_, m_ = grp.n, grp.c, grp.m
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    Hp, Wp = _flat_geometry(geo)
    # no padding: every window lies inside the input, which the tiles then read in place
    direct = not any(geo.pads_begin) and Hp <= H and Wp <= W
    npix = OH * OW
    L, OB, P = tile_knobs(ctx.target, m_, npix, choose_flat_tile(ctx.target, m_, npix), "pixels", spare=1)
    blk = OB * L
    MB = -(-m_ // blk)
    plane = 1 if direct else Hp * Wp
    KC = knob("chunk_channels", [d for d in range(1, c_ + 1) if c_ % d == 0 and d * plane * 4 <= FLAT_PAD_MAX_BYTES],
              flat_chunk(ctx.target, c_, blk, KH * KW, plane) or _largest_chunk(c_, plane),
              doc=f"input channels per chunk (a divisor of {c_}; its padded input at most {FLAT_PAD_MAX_BYTES} bytes)")
    NC = c_ // KC
    g0 = max(1, MB // FLAT_MIN_TASKS)
    part_cap = max(g0, FLAT_PART_MAX_BYTES // (npix * blk * 4))
    G = knob("blocks_per_task", pow2_candidates(1, min(MB, part_cap), MB, g0), g0,
             doc=f"channel blocks per parallel task (default: enough tasks for {FLAT_MIN_TASKS} per image)")
    NG = -(-MB // G)
    PF = prefetch_knob("the chunk of weights the task reads next")
    chunk = KH * KW * KC * blk          # floats of one (channel block, input chunk) run of weights

    def pack_group(wg: np.ndarray) -> np.ndarray:
        # [MB, NC, KH, KW, KC, blk]: a task streams each block's weights front to back, one
        # contiguous run per chunk (the weights of resnet's last stage come from DRAM every run)
        wfull = np.zeros((MB * blk, c_, KH, KW), np.float32)
        wfull[:m_] = wg
        return np.ascontiguousarray(wfull.reshape(MB, blk, NC, KC, KH, KW).transpose(0, 2, 4, 5, 3, 1))
    wp = grp.pack(ctx, pack_group, "wpack")
    params = [p for p in (params or ctx.default_params()) if p is not w] + [wp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += (f"  [flat pixel tiles: register tile {OB}x{L} channels x {P} pixels of {OH}x{OW}, "
                          f"{G} channel blocks per task, input channels in {NC} chunks of {KC}"
                          + (" read in place" if direct else f" padded to {Hp}x{Wp}")
                          + f", weights packed {list(wp.shape)}]")
    acc = kb.local(DType.f32, (OB * P * L,), hint="acc")
    out = kb.local(DType.f32, (L,), hint="lanes")
    part = kb.local(DType.f32, (G * npix * blk,), hint="part")
    xpad = None if direct else kb.local(DType.f32, (KC * Hp * Wp,), hint="xpad")
    # the plane the tiles read: the padded local, or X itself
    RH, RW = (H, W) if direct else (Hp, Wp)
    rows, cols = min(H, Hp - ph), min(W, Wp - pw)     # input rows / columns some window reads

    def tile(n, g: Expr, mb: Expr, q0: Expr, width: int, cc: Expr, pf_line=None):
        """The sums of pixels q0 .. q0+width-1 over chunk ``cc`` (in xpad, or X read in place),
        added into the panel. ``pf_line``: None, no prefetch; "all": each step prefetches all
        its lines of the next run of weights; an index: only that line of each step's."""
        src, plane0 = (x, (n * c_ + cc * KC) * (H * W)) if direct else (xpad, as_expr(0))
        base = []
        for p in range(width):
            q = q0 + p
            base.append((q / OW) * (sh * RW) + (q % OW) * sw)
        slot = [(g * npix + q0 + p) * blk for p in range(width)]
        for o in range(OB):
            for p in range(width):
                kb.store(acc, (o * width + p) * L, part.vload(slot[p] + o * L, L))
        if PF and pf_line is not None:
            # the run a task reads after (mb, cc): its next block's for the same chunk, after
            # its last block the first block's next chunk (past the last chunk: the next task's)
            if G > 1:
                last = g >= G - 1
                nxt = (select(last, gi * G, mb + 1) * NC + select(last, cc + 1, cc)) % (MB * NC)
            else:
                nxt = (mb * NC + cc + 1) % (MB * NC)
            nbase = nxt * chunk
        with kb.reduce(KH, hint="kh") as kh, kb.reduce(KW, hint="kw") as kw, kb.reduce(KC, hint="ic") as ic:
            wrow = ((((mb * NC + cc) * KH + kh) * KW + kw) * KC + ic) * blk
            wv = [wp.vload(grp.woff(wp, n, wrow + o * L), L) for o in range(OB)]
            if PF and pf_line is not None:
                step = nbase + ((kh * KW + kw) * KC + ic) * blk
                if pf_line == "all":
                    prefetch_lines(kb, wp, step, blk, PF, lambda o: grp.woff(wp, n, o))
                else:
                    prefetch_lines(kb, wp, step + pf_line * LINE_F32, 1, PF, lambda o: grp.woff(wp, n, o))
            xoff = plane0 + ic * (RH * RW) + kh * (dh * RW) + kw * dw
            for p in range(width):
                xv = src.flat(xoff + base[p])
                for o in range(OB):
                    a = (o * width + p) * L
                    kb.store(acc, a, fma(wv[o], xv, acc.vload(a, L)))
        for o in range(OB):
            for p in range(width):
                kb.store(part, slot[p] + o * L, acc.vload((o * width + p) * L, L))

    nfull, rest = npix // P, npix % P
    lines = -(-blk // LINE_F32)         # cache lines of weights per reduction step
    with kb.loop(n_ * NG, kind="parallel", hint="t") as t:
        gi = t % NG if NG > 1 else as_expr(0)
        n = t / NG if NG > 1 else t
        if not direct:
            zero_fill(kb, xpad, KC * Hp * Wp, L)
        zero_fill(kb, part, G * npix * blk, L)
        with kb.reduce(NC, hint="cc") as cc:
            if not direct:
                with kb.loop(KC, hint="c", role="spatial") as c, kb.loop(rows, hint="h", role="spatial") as ih:
                    with kb.loop(cols, hint="w", role="spatial") as iw:
                        kb.store(xpad, (c * Hp + ih + ph) * Wp + iw + pw,
                                 x.flat(((n * c_ + cc * KC + c) * H + ih) * W + iw))
            with kb.loop(G, hint="g", role="spatial") as g:
                mb = gi * G + g
                with kb.if_(mb < MB):
                    if nfull >= lines:
                        # the first ``lines`` tiles prefetch one line of each step each: the
                        # next run's lines requested once, spread over the run's tiles
                        with kb.loop(lines, hint="tp", role="spatial") as tp:
                            tile(n, g, mb, tp * P, P, cc, tp)
                        if nfull > lines:
                            with kb.loop(nfull - lines, hint="tq", role="spatial") as tq:
                                tile(n, g, mb, (tq + lines) * P, P, cc)
                    elif nfull:
                        with kb.loop(nfull, hint="tp", role="spatial") as tp:
                            tile(n, g, mb, tp * P, P, cc, "all")
                    if rest:
                        tile(n, g, mb, as_expr(nfull * P), rest, cc, None if nfull >= lines else "all")
        with kb.loop(G, hint="g", role="spatial") as g:
            mb = gi * G + g
            with kb.if_(mb < MB):
                with kb.loop(npix, hint="q", role="spatial") as q:
                    for o in range(OB):
                        oc0 = (mb * OB + o) * L
                        store_channel_vector(ctx, kb, y, b, out, part.vload((g * npix + q) * blk + o * L, L),
                                             n, oc0, [q / OW, q % OW], m_, blk, grp)
    return kb


# ----------------------------------------------------------------------------- 1x1 convolution
def pointwise_ok(ctx: LowerCtx, x: Buffer, y: Buffer, geo, group: int = 1) -> bool:
    """Whether a blocked-eligible convolution is a pointwise one (1x1, no padding) whose
    epilogue operands (:func:`epilogue_operands`) all broadcast over the spatial dims as a
    whole (right-aligned to Y [N, M, OH, OW]: spatial dims [OH, OW] or [1, 1]; not [OW] nor
    [OH, 1]), so one flat pixel index (:class:`~ir.kernel.PixelIndex`) addresses them. A
    strided one (resnet's downsample) qualifies where its pixel tiles are packed (:func:`strided_pointwise_ok`)."""
    if not unpadded_1x1(geo):
        return False
    if geo.strides != [1, 1] and not strided_pointwise_ok(ctx, x, y, group):
        return False
    probe = PixelIndex([0] * len(y.shape), y.shape[2:])
    return all(probe.addresses(buf.shape) for buf in epilogue_operands(ctx))


def epilogue_operands(ctx: LowerCtx) -> list[Buffer]:
    """The buffers a conv's fused epilogue reads besides its own value: FusedConv's addend
    (input 3, after X, W, B) and the fused group's operands (``ctx.epilogue_inputs``)."""
    out: list[Buffer] = []
    for b in list(ctx.inputs[3:4]) + list(ctx.epilogue_inputs):
        if b is not None and all(b is not o for o in out):
            out.append(b)
    return out


class PointwiseTiling(NamedTuple):
    """How :func:`emit_conv_pointwise` covers ``hw`` output pixels: the register tile (L, R,
    NB; :func:`choose_pointwise_tile`), ``nfull`` whole pixel tiles of NB*L, ``nvec_rest``
    vectors for the pixels after them, and whether the tiles are packed into panels."""
    L: int
    R: int
    NB: int
    nfull: int
    nvec_rest: int
    pack: bool


def pointwise_tiling(target, m: int, c: int, hw: int) -> PointwiseTiling:
    """The :class:`PointwiseTiling` of a 1x1 conv with ``m`` output and ``c`` input channels
    over ``hw`` output pixels. Panels serve the vector tiles only (a plane of fewer pixels than
    a vector has none)."""
    L, R, NB = choose_pointwise_tile(target, m)
    pix = NB * L
    nfull = hw // pix
    nvec_rest = -(-(hw - nfull * pix) // L)
    pack = pack_pixels_ok(-(-m // R), c, pix) and (nfull > 0 or hw >= nvec_rest * L)
    return PointwiseTiling(L, R, NB, nfull, nvec_rest, pack)


#: a pointwise convolution whose pixel vectors use less than this share of their lanes (the
#: vectors of the tiles and of the rest, over the plane's pixels) takes the flat tiles instead
#: where they apply (channels as lanes: no pixel waste). Measured on a Zen 4, 1 thread, 1x1
#: convs at 7x7 (49 pixels in 4 vectors of 16: 77%): 160->960, 960->160, 960->320, 320->1280
#: 193/185/380/501 us pointwise, 171/155/302/393 us flat; with 8 lanes (88%) pointwise was
#: faster: 168/189/356/440 against 166/263/392/530 us
POINTWISE_MIN_LANE_USE = 0.8


#: the most pixel vectors per register tile the knob ``tile_pixel_vectors`` offers
MAX_PIXEL_VECTORS = 4


def pixel_tile_knobs(target, m: int, default: tuple[int, int, int], nb_ok=lambda nb: True) -> tuple[int, int, int]:
    """Knobs ``tile_oc`` (R) and ``tile_pixel_vectors`` (NB) of the pixel-vector micro-kernel
    (:func:`pixel_gemm_tile`) over ``m`` output channels; ``default`` = (L, R, NB) the
    formula's. Candidates: R up to half the vector registers (and ``m``), NB up to
    :data:`MAX_PIXEL_VECTORS` with R*NB accumulators + NB input vectors + 1 broadcast within
    the vector registers and ``nb_ok(NB)``. Returns (L, R, NB)."""
    L, r0, nb0 = default
    regs = vector_registers(target)
    R = knob("tile_oc", range(1, max(1, min(m, regs // 2)) + 1), r0,
             doc="output channels per register tile (one broadcast weight each)")
    nbs = [nb for nb in range(1, MAX_PIXEL_VECTORS + 1) if R * nb + nb + 1 <= regs and nb_ok(nb)]
    NB = knob("tile_pixel_vectors", nbs, nb0 if nb0 in nbs or not nbs else max(nbs),
              doc=f"vectors of {L} pixels per register tile (R*NB accumulators + NB + 1 <= {regs} vector registers)")
    return L, R, NB


def pointwise_tiling_knobs(target, m: int, c: int, hw: int, strided: bool, scaled: bool = False) -> PointwiseTiling:
    """:func:`pointwise_tiling` with its choices as knobs: the tile (:func:`pixel_tile_knobs`)
    and ``pack_pixels`` (whether pixel tiles are copied into panels; default
    :func:`pack_pixels_ok`, except where :func:`tiles_inner_ok` prefers the blocks over every
    unpacked tile, unless the conv is ``scaled``). A ``strided`` conv must pack and cover its
    last pixels with whole vectors (:func:`strided_pointwise_ok`), so its candidates keep to
    tiles that do. A ``scaled`` conv (an input-channel scale S) packs wherever the panel fits:
    the copy multiplies each element by S once, where unpacked tiles multiply every vector they
    load once per channel block (regnet_y_800mf's 320->320 at 14x14 with S, 1 thread, warm:
    0.418 -> 0.387 ms, onnxruntime 0.381; the whole model 1.00 -> 0.97-0.98x onnxruntime at 1
    thread, 1.02 -> 0.96x at 2, efficientnet_b0 unchanged)."""
    d = pointwise_tiling(target, m, c, hw)

    def shape(nb: int) -> tuple[int, int, bool]:
        pix = nb * d.L
        nfull = hw // pix
        nvec_rest = -(-(hw - nfull * pix) // d.L)
        can_pack = nfull > 0 or hw >= nvec_rest * d.L
        return nfull, nvec_rest, can_pack

    def strided_ok(nb: int) -> bool:
        nfull, nvec_rest, can_pack = shape(nb)
        return can_pack and hw >= nvec_rest * d.L

    L, R, NB = pixel_tile_knobs(target, m, (d.L, d.R, d.NB), strided_ok if strided else (lambda nb: True))
    nfull, nvec_rest, can_pack = shape(NB)
    if strided:
        pack = knob("pack_pixels", (True,), True, doc="copy each pixel tile into a contiguous panel "
                    "(a strided 1x1 conv always does: the copy gathers the strided pixels)")
    else:
        pack0 = (pack_pixels_ok(-(-m // R), c, NB * L) and (nfull > 0 or hw >= nvec_rest * L)
                 and (scaled or not tiles_inner_ok(target, m, c, hw, R, nfull)))
        pack = knob("pack_pixels", (False, True) if can_pack else (False,), pack0,
                    doc=f"copy each pixel tile into a contiguous panel (default: at least {PACK_MIN_BLOCKS} "
                        f"channel blocks read it and it takes at most {PACK_MAX_BYTES} bytes)")
    return PointwiseTiling(L, R, NB, nfull, nvec_rest, pack)


def pointwise_lane_use(target, m: int, c: int, geo) -> float:
    """The share of the pixel vectors' lanes of :func:`emit_conv_pointwise` that hold distinct
    output pixels (whole tiles plus the rest's vectors, :class:`PointwiseTiling`)."""
    hw = int(np.prod(geo.out_shape))
    t = pointwise_tiling(target, m, c, hw)
    lanes = (t.nfull * t.NB + t.nvec_rest) * t.L
    return hw / lanes if lanes else 1.0


def tiles_inner_ok(target, m: int, c: int, hw: int, R: int, nfull: int, n: int = 1) -> bool:
    """Whether an unstrided pointwise conv runs each channel block over every pixel tile by
    default (knob ``pixel_tiles_inner``, unpacked tiles): at least :data:`PACK_MIN_TASKS`
    channel blocks (of R channels) over the ``n`` images, whole pixel tiles, and one image's X
    (c x hw f32) within half of L2 (``Target.l2_bytes``), so the blocks re-read X from L2. A
    task then writes R output planes front to back, where the pixel tiles inner to the blocks
    wrote all M planes a few lines at a time: in a model the output (and a residual) are not in
    cache, and those scattered lines came from memory one by one (1 thread, weights and output
    cold as in a model: mobilenet_v2's 24->144 at 56x56 0.92 -> 0.31 ms, efficientnet's
    16->96 at 112x112 1.53 -> 0.51, resnet50's 64->256 + residual 1.56 -> 0.96; warm, within
    +-10% either way)."""
    return (n * -(-m // R) >= PACK_MIN_TASKS and nfull > 0
            and c * hw * 4 <= int(getattr(target, "l2_bytes", 0) or 0) // 2)


def strided_pointwise_ok(ctx: LowerCtx, x: Buffer, y: Buffer, group: int = 1) -> bool:
    """A strided 1x1 convolution runs as a pointwise one only through packed panels (the
    panel copy gathers the strided pixels; the unpacked tiles read pixels as contiguous
    vectors), with the pixels after the whole tiles covered by whole vectors too (never the
    scalar tail)."""
    hw = int(np.prod(y.shape[2:]))
    t = pointwise_tiling(ctx.target, y.shape[1] // group, x.shape[1] // group, hw)
    return t.pack and hw >= t.nvec_rest * t.L


def pack_pixel_gemm_weights(ctx: LowerCtx, grp: ConvGroups, red: int, R: int) -> Buffer:
    """The node's constant weights [M, ...] (``red`` values per output channel) packed for
    :func:`pixel_gemm_tile` as [MB, red, R] per group (zeros past a group's channels)."""
    m_ = grp.m
    MB = -(-m_ // R)

    def pack_group(wg: np.ndarray) -> np.ndarray:
        wmat = np.zeros((MB * R, red), np.float32)
        wmat[:m_] = wg.reshape(m_, red)
        return np.ascontiguousarray(wmat.reshape(MB, R, red).transpose(0, 2, 1))
    return grp.pack(ctx, pack_group, "wpack")


def pixel_gemm_tile(ctx: LowerCtx, kb: KernelBuilder, acc: Buffer, wp: Buffer, y: Buffer, b: Buffer | None,
                    grp: ConvGroups, n: Expr, R: int, red: int, mb: Expr, nvec: int, lanes: int, xvec,
                    out_idx, prefetch: int = 0, k0=0, steps: int | None = None,
                    carry: tuple[Buffer, Expr] | None = None, first: bool = True,
                    partial: bool = False) -> None:
    """The pixel-vector micro-kernel of :func:`emit_conv_pointwise` and :func:`emit_conv_im2row`:
    R output channels (block ``mb`` of the weights packed as [MB, red, R], broadcast) x ``nvec``
    vectors of ``lanes`` pixels (``xvec(k, v)``, the v-th pixel vector of reduction step k) of
    image ``n`` of the grouped view ``grp`` accumulated in ``acc`` over the ``red`` steps; then
    bias, the fused epilogue and one vector store per accumulator at ``out_idx(yn, oc, v)``
    (Y's image and channel), channels past a group's ``grp.m`` not stored. ``prefetch``: the
    ``prefetch`` knob's level (0: none) at which each reduction step prefetches the same step's
    weights of block ``mb + 1`` (the block the schedules read next).

    A chunk of the reduction (the pointwise schedule's knob ``panel_channels``): ``steps`` steps
    from step ``k0`` (``xvec`` gets the step relative to ``k0``); ``carry`` = (buffer, offset)
    of R*nvec*lanes partial sums: the accumulators start from them unless this is the
    ``first`` chunk (zeros), and where ``partial`` (not the last chunk) the sums go back there
    instead of through the epilogue to Y."""
    m_ = grp.m
    MB = wp.numel // (grp.G * red * R)
    steps = red if steps is None else steps
    for q in range(R * nvec):
        start = carry[0].vload(carry[1] + q * lanes, lanes) if carry is not None and not first \
            else kb.broadcast(as_expr(0.0, DType.f32), lanes)
        kb.store(acc, q * lanes, start)
    nxt = ((mb + 1) % MB) * red if prefetch and MB > 1 else None
    with kb.reduce(steps, hint="k") as k:
        if nxt is not None:
            prefetch_lines(kb, wp, (nxt + k0 + k) * R, R, prefetch, lambda o: grp.woff(wp, n, o))
        xv = [xvec(k, v) for v in range(nvec)]
        for r in range(R):
            wv = wp.flat(grp.woff(wp, n, (mb * red + k0 + k) * R + r))
            for v in range(nvec):
                q = (r * nvec + v) * lanes
                kb.store(acc, q, fma(wv, xv[v], acc.vload(q, lanes)))
    if partial:
        for q in range(R * nvec):
            kb.store(carry[0], carry[1] + q * lanes, acc.vload(q * lanes, lanes))
        return
    for r in range(R):
        oc = mb * R + r
        yn, yc = grp.out(n, oc)
        with kb.if_(oc < m_) if m_ % R else contextlib.nullcontext():
            for v in range(nvec):
                idx = out_idx(yn, yc, v)
                val = acc.vload((r * nvec + v) * lanes, lanes)
                if b is not None:
                    val = val + b[yc]
                kb.store(y, idx, ctx.apply_epilogue(val, idx))


def choose_pointwise_tile(target, m: int) -> tuple[int, int, int]:
    """(L, R, NB): lanes, output channels per tile, pixel vectors per tile. With 16 vector
    registers 6 x 2 vectors, or 4 x 3 where 4 rows pad at least 5% fewer of the ``m``
    channels."""
    L = target.lanes(DType.f32)
    if vector_registers(target) >= 32:
        return L, min(8, max(1, m)), 3
    if m > 6 and -(-m // 6) * 6 - -(-m // 4) * 4 >= 0.05 * m:
        # 12 accumulators either way; 4 rows pad at least 5% fewer channels (m = 16, 32, 40;
        # measured on a Zen 3: 128->16 at 55x55 0.22 -> 0.19 ms)
        return L, 4, 3
    return L, min(6, max(1, m)), 2


def emit_conv_pointwise(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                        params: list[Buffer] | None = None, grp: ConvGroups | None = None,
                        x_scale: Buffer | None = None) -> KernelBuilder:
    """A 1x1 convolution as Y[n] = W [M, C] @ X[n] [C, H*W], vectorised over pixels (contiguous
    in NCHW): an R x NB tile (R output channels x NB*L pixels) of accumulators over the C
    reduction, the weights packed at compile time as [MB, C, R] and broadcast, the inputs
    loaded as vectors, and bias plus the fused epilogue run on whole vectors before one vector
    store. The pixels after the last whole tile are covered by whole vectors ending at the last
    pixel (recomputing, with the same result, a few pixels of the tile before); an image of
    fewer pixels than a vector runs the tile one lane at a time.

    Loop order: the channel blocks are innermost, so each pixel tile of X is read by all of them
    while it is in cache. Where :func:`pack_pixels_ok` allows, each thread first copies the
    tile's C rows into a contiguous panel [C, NB*L] (a local buffer) that the blocks then
    stream; the parallel loop runs over (n, pixel tile, group of channel blocks) with enough
    groups for :data:`PACK_MIN_TASKS` tasks (:func:`pixel_tile_groups`). A panel larger than
    :data:`PANEL_L1_SHARE` of L1 (with a block's weights) is packed and run through the blocks
    a chunk of input channels at a time (knob ``panel_channels``; each block's partial sums
    kept in a local buffer between chunks, the epilogue after the last), so the blocks read it
    from L1. 1 thread, Emerald Rapids (48 KiB L1), each kernel timed in its model, chunks at
    0.75 of L1 against the whole panel: resnet50's 256->64 at 56x56 (2 chunks of 128) 0.96 ->
    0.85 ms; the changed kernels of resnet50 3.27 -> 3.10 ms, of regnet_y_800mf 2.71 -> 2.36,
    of efficientnet_b0 0.20 -> 0.19; 0.45 of L1 against 0.75 was 1-3% faster again. Measured on a Zen 3,
    1 thread, against onnxruntime in the same process: 320->1280 at 7x7 62 -> 75 GFLOP/s,
    512->1000 at 13x13 (squeezenet's classifier) 68 -> 85 GFLOP/s. Unpacked tiles with at
    least :data:`PACK_MIN_TASKS` channel blocks turn the order round instead (knob
    ``pixel_tiles_inner``): a task runs one block ([C, R] weights, from L1) over every pixel
    tile, X staying in L2, so W (which in a model comes from memory: resnet50's 1024->512 at
    14x14, 2 MiB) is read once per image, not once per pixel tile (1 thread, weights cold as in
    a model: 1.42 -> 1.30 ms; onnxruntime 1.48). Each reduction step prefetches the next block's
    weights (knob ``prefetch``). ``grp``: the groups of a grouped convolution
    (:class:`ConvGroups`). ``x_scale``: None, or S [1 or N, C, 1, 1] (group 1 only) multiplying
    each input channel where it is read (``tensorfuse::FusedConv``'s input S, the
    squeeze-excitation scale): one multiply per pixel vector loaded, in the panel copy where
    the tiles are packed, else per channel block; the separate Mul it replaces read and wrote
    all of X."""
    grp = grp or ConvGroups(x, y)
    if x_scale is not None and grp.G != 1:
        raise AssertionError("an input-channel scale needs group 1 (conv2d_pointwise_scaled applies)")
    n_, c_, m_ = grp.n, grp.c, grp.m
    hw = int(np.prod(y.shape[2:]))
    sh, sw = geo.strides
    strided = (sh, sw) != (1, 1)
    L, R, NB, nfull, nvec_rest, pack = pointwise_tiling_knobs(ctx.target, m_, c_, hw, strided, x_scale is not None)
    min_tasks = knob("min_parallel_tasks", pow2_candidates(1, 32), PACK_MIN_TASKS,
                     doc="parallel tasks (pixel tiles x groups of channel blocks) the packed tiles aim at") \
        if pack else PACK_MIN_TASKS
    MB = -(-m_ // R)
    PF = prefetch_knob("the next channel block's weights", MB > 1)
    PFX = knob("prefetch_next_tile", [0, 1, 2], PREFETCH_NEXT_TILE,
               doc="0: none; 1: the panel copy prefetches the same input channel's pixels of the "
                   "thread's next pixel tile into L2; 2: into L1") if pack else 0
    tiles_inner = knob("pixel_tiles_inner", (False, True), tiles_inner_ok(ctx.target, m_, c_, hw, R, nfull, n_),
                       doc="unpacked tiles: a task runs one channel block over every pixel tile "
                           "(False: one pixel tile of one block; the blocks innermost)") \
        if not pack and MB > 1 else False
    wp = pack_pixel_gemm_weights(ctx, grp, c_, R)
    params = [p for p in (params or ctx.default_params()) if p is not w] + [wp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += f"  [pointwise: register tile {R} channels x {NB}x{L} pixels, weights packed {list(wp.shape)}]"
    acc = kb.local(DType.f32, (R * NB * L,), hint="acc")
    pix = NB * L
    rest = hw - nfull * pix
    H, W = x.shape[2], x.shape[3]
    OW = y.shape[3]
    if strided and not pack:
        raise AssertionError("a strided pointwise conv needs packed panels (strided_pointwise_ok)")
    if strided:
        kb.kernel.comment += f"  [stride {sh}x{sw}: the panels gather the strided pixels]"
    l2 = int(getattr(ctx.target, "l2_bytes", 0) or 512 * 1024)
    kc0 = panel_channels(ctx.target, c_, pix, R)
    KC = knob("panel_channels", panel_channel_candidates(c_, kc0), kc0,
              doc="input channels per packed panel chunk: the pixel tile is packed and run through "
                  "every channel block of its group one chunk at a time, the partial sums kept "
                  "in a local buffer (default: a chunk and a block's weights fill at most "
                  f"{PANEL_L1_SHARE} of L1)") if pack else c_
    NK = -(-c_ // KC)
    xp = kb.local(DType.f32, (KC * pix,), hint="xpanel") if pack else None
    if pack:
        kb.kernel.comment += f"  [pixel tiles packed as panels [{KC}, {pix}]"
        kb.kernel.comment += f", {NK} chunks of the {c_} input channels]" if NK > 1 else "]"

    def scaled(v: Expr, n: Expr, ic: Expr, lanes: int) -> Expr:
        """``v`` (lanes of image n's input channel ic) times that channel's factor of S, if any."""
        if x_scale is None:
            return v
        return v * kb.broadcast(x_scale.flat((n * c_ if x_scale.shape[0] > 1 else 0) + ic), lanes)

    def tile(n: Expr, mb: Expr, p0: Expr, nvec: int, lanes: int, packed: bool, k0=0, steps: int | None = None,
             carry=None, first: bool = True, partial: bool = False):
        if packed:
            def xvec(ic, v):
                return xp.vload(ic * (nvec * lanes) + v * lanes, lanes)
        else:
            def xvec(ic, v):
                return scaled(x.vload((n * c_ + ic) * hw + p0 + v * lanes, lanes), n, ic, lanes)
        pixel_gemm_tile(ctx, kb, acc, wp, y, b, grp, n, R, c_, mb, nvec, lanes, xvec,
                        lambda yn, oc, v: PixelIndex([yn, oc] + [as_expr(0)] * (len(y.shape) - 3)
                                                     + [Ramp(p0 + v * lanes, lanes)], y.shape[2:]),
                        PF, k0=k0, steps=steps, carry=carry, first=first, partial=partial)

    def split(t):
        mb = t % MB if MB > 1 else as_expr(0)
        return (t / MB if MB > 1 else t), mb

    def packed_tiles(ntiles: int, nvec: int, p0_of):
        """Parallel over (n, pixel tile, group of channel blocks): X's pixels of the tile are
        copied once into a contiguous panel [C, nvec*L] (or one chunk of KC channels at a time)
        that every channel block of the group then reads (from L1, as a stream) instead of C
        rows spread over the image."""
        G0 = pixel_tile_groups(n_ * ntiles, MB, R * c_ * 4, l2, min_tasks)
        if NK > 1:
            # the partial sums of a group's blocks (per x R x nvec*L floats) stay on the stack
            G0 = max(G0, -(-MB * R * nvec * L * 4 // PANEL_CARRY_MAX_BYTES))
        per, G = split_blocks(MB, min(MB, G0))
        pixv = nvec * L
        cb = kb.local(DType.f32, (per * R * pixv,), hint="partial") if NK > 1 else None
        # pixel tiles innermost: a thread's consecutive tasks share one group's weights (a
        # slice of W sized for L2 when W is larger), so W streams from memory about once
        with kb.loop(n_ * ntiles * G, kind="parallel", hint="t") as t:
            pb = t % ntiles if ntiles > 1 else as_expr(0)
            ng = t / ntiles if ntiles > 1 else t
            g = ng % G if G > 1 else as_expr(0)
            n = ng / G if G > 1 else ng
            p0 = p0_of(pb)
            # the thread's next task packs the next pixel tile (or the first one again, of the
            # next group or image)
            p_next = p0_of((pb + 1) % ntiles) if PFX and ntiles > 1 else None

            def src_of(ic, q):
                # output pixel q of a strided conv reads input pixel (q / OW * sh, q % OW * sw)
                return (n * c_ + ic) * (H * W) + (q / OW) * (sh * W) + (q % OW) * sw

            def pack_chunk(k0, kc: int):
                """X's rows k0 .. k0 + kc of the tile into the panel (rows 0 .. kc), each row of
                the next tile prefetched (knob ``prefetch_next_tile``)."""
                with kb.loop(kc, hint="ic", role="spatial") as i:
                    ic = k0 + i
                    if strided:
                        for k in range(pixv):
                            kb.store(xp, i * pixv + k, scaled(x.flat(src_of(ic, p0 + k)), n, ic, 1))
                        if p_next is not None:
                            for k in range(0, pixv, max(1, LINE_F32 // sw)):
                                kb.prefetch(x, src_of(ic, p_next + k), locality=2 if PFX == 1 else 3)
                    else:
                        for v in range(nvec):
                            kb.store(xp, i * pixv + v * L,
                                     scaled(x.vload((n * c_ + ic) * hw + p0 + v * L, L), n, ic, L))
                        if p_next is not None:
                            prefetch_lines(kb, x, (n * c_ + ic) * hw + p_next, pixv, PFX)

            def blocks(k0, kc: int, first: bool, last: bool):
                with kb.loop(per, hint="j", role="spatial") as j:
                    mb = g * per + j
                    carry = (cb, j * (R * pixv)) if cb is not None else None

                    def run():
                        tile(n, mb, p0, nvec, L, True, k0, kc, carry, first, not last)
                    if MB % per:
                        with kb.if_(mb < MB):
                            run()
                    else:
                        run()

            if NK == 1:
                pack_chunk(as_expr(0), c_)
                blocks(0, c_, True, True)
                return
            # the first chunk starts the sums at zero, the last runs the epilogue; those
            # between carry them (one loop)
            pack_chunk(as_expr(0), KC)
            blocks(0, KC, True, False)
            if NK > 2:
                with kb.loop(NK - 2, hint="kc", role="spatial") as kc:
                    k0 = (kc + 1) * KC
                    pack_chunk(k0, KC)
                    blocks(k0, KC, False, False)
            k0 = (NK - 1) * KC
            pack_chunk(as_expr(k0), c_ - k0)
            blocks(k0, c_ - k0, False, True)

    if not pack and tiles_inner and nfull and (not rest or hw >= nvec_rest * L):
        # each channel block's weights ([C, R], from L1) serve every pixel tile of the image
        # in turn, X's rows staying in L2: W is read once per image instead of once per tile
        with kb.loop(n_ * MB, kind="parallel", hint="t") as t:
            n, mb = split(t)
            with kb.loop(nfull, hint="pb", role="spatial") as pb:
                tile(n, mb, pb * pix, NB, L, False)
            if rest:
                tile(n, mb, as_expr(hw - nvec_rest * L), nvec_rest, L, False)
        return kb
    if nfull:
        if pack:
            packed_tiles(nfull, NB, lambda pb: pb * pix)
        else:
            # the channel blocks innermost, so the few blocks share each pixel tile of X from
            # L1 (measured on a Zen 3, 128->16 at 55x55: 57 -> 74 GFLOP/s)
            with kb.loop(n_ * MB * nfull, kind="parallel", hint="t") as t:
                n_pb, mb = split(t)
                pb = n_pb % nfull if nfull > 1 else as_expr(0)
                n = n_pb / nfull if nfull > 1 else n_pb
                tile(n, mb, pb * pix, NB, L, False)
    if rest:
        if hw >= nvec_rest * L:
            # whole vectors ending at the last pixel: the first lanes overlap pixels done
            # above and store the same values again (no scalar tail over all of C)
            if pack:
                packed_tiles(1, nvec_rest, lambda pb: as_expr(hw - nvec_rest * L))
            else:
                with kb.loop(n_ * MB, kind="parallel", hint="t") as t:
                    n, mb = split(t)
                    tile(n, mb, as_expr(hw - nvec_rest * L), nvec_rest, L, False)
        else:                       # fewer pixels than a vector
            with kb.loop(n_ * MB, kind="parallel", hint="t") as t:
                n, mb = split(t)
                for p in range(nfull * pix, hw):
                    tile(n, mb, as_expr(p), 1, 1, False)
    return kb


#: a packed panel chunk (input channels x one pixel tile) plus one channel block's weights
#: for those channels fill at most this share of L1 by default (knob ``panel_channels``), so
#: the panel stays in L1 while every channel block of the group streams it
PANEL_L1_SHARE = 0.5
#: default of the knob ``prefetch_next_tile`` of packed pointwise convs (0: off, 1: L2, 2: L1).
#: A pixel tile's rows lie one plane apart in X, too many streams for the hardware prefetcher:
#: resnet50's 256->64 at 56x56 (X 3.2 MB, over L2), 1 thread, Emerald Rapids, each kernel timed
#: in the model: 0.875 -> 0.834 ms (regnet_y_800mf's, whose X fit L2, within +-1%)
PREFETCH_NEXT_TILE = 1
#: the partial sums of one task's channel blocks (a chunked panel) take at most this many
#: bytes on the stack; more blocks are split into more groups
PANEL_CARRY_MAX_BYTES = 32 * 1024


def panel_channels(target, c: int, pix: int, R: int) -> int:
    """The default input channels per packed panel chunk of :func:`emit_conv_pointwise`: all
    ``c`` where a panel [c, pix] and a block's weights [c, R] (float32) fit
    :data:`PANEL_L1_SHARE` of ``Target.l1d_bytes``, else ``c`` split into equal chunks that do."""
    l1 = int(getattr(target, "l1d_bytes", 0) or 32 * 1024)
    most = max(LINE_F32, int(l1 * PANEL_L1_SHARE) // ((pix + R) * 4))
    chunks = -(-c // most)
    return -(-c // chunks)


def panel_channel_candidates(c: int, default: int) -> list[int]:
    """Candidates of the knob ``panel_channels``: all ``c`` (one chunk), ``c`` split into 2, 3,
    4, 6 and 8 equal chunks of at least 16 channels, and the default."""
    out = {c, default}
    for k in (2, 3, 4, 6, 8):
        if c // k >= 16:
            out.add(-(-c // k))
    return sorted(out)


#: a pointwise convolution packs its pixel tiles (see :func:`emit_conv_pointwise`) when at
#: least this many channel blocks read each packed panel
PACK_MIN_BLOCKS = 4
#: ... and the panel (C x one pixel tile, float32) is at most this big
PACK_MAX_BYTES = 64 * 1024
#: the parallel loop of packed tiles has at least this many iterations where the channel
#: blocks allow (pixel tiles times groups of channel blocks), so 2-4 threads get even shares
PACK_MIN_TASKS = 8


def pack_pixels_ok(mb: int, c: int, pix: int) -> bool:
    """Whether :func:`emit_conv_pointwise` copies each pixel tile into a contiguous panel by
    default: enough channel blocks reuse it (:data:`PACK_MIN_BLOCKS`) and the whole panel
    [c, pix] (float32) takes at most :data:`PACK_MAX_BYTES`. Larger panels are possible (the
    knob ``pack_pixels``; they are packed a chunk of channels at a time, knob
    ``panel_channels``) but lost in a model: resnet50's 512->128 and 512->256 at 28x28, 1
    thread, Emerald Rapids, each kernel timed in the model: 0.656 -> 0.686 ms and 1.26 -> 1.36
    ms against X read in place (alone, with L2 flushed between runs, they won: 0.79 -> 0.70 and
    1.54 -> 1.33 ms)."""
    return mb >= PACK_MIN_BLOCKS and c * pix * 4 <= PACK_MAX_BYTES


def pixel_tile_groups(tiles: int, mb: int, block_bytes: int = 0, l2_bytes: int = 0,
                      min_tasks: int = PACK_MIN_TASKS) -> int:
    """Groups the ``mb`` channel blocks (of ``block_bytes`` packed weights each) are split
    into, each group packing every pixel tile again: enough that tiles x groups reaches
    ``min_tasks`` (:data:`PACK_MIN_TASKS`; the knob ``min_parallel_tasks``), and that one
    group's weights take at most half of ``l2_bytes`` (squeezenet's classifier: 2 MB of
    weights in 8 groups)."""
    g = -(-min_tasks // max(tiles, 1))
    if block_bytes and l2_bytes:
        g = max(g, -(-mb * block_bytes // (l2_bytes // 2)))
    return max(1, min(mb, g))


# ------------------------------------------------------------- few input channels: row panels
#: a convolution whose reduction (C x KH x KW) is at most this long, over fewer than
#: :data:`KH_OUTER_CHANNELS` input channels, runs as :func:`emit_conv_im2row`
IM2ROW_MAX_K = 64


def im2row_ok(ctx: LowerCtx, c_: int, geo) -> bool:
    """Whether :func:`emit_conv_im2row` applies (the caller has checked the blocked schedules'
    conditions): fewer than :data:`KH_OUTER_CHANNELS` input channels, a reduction of at most
    :data:`IM2ROW_MAX_K`, and output rows of at least one vector."""
    KH, KW = geo.kernel
    return (c_ < KH_OUTER_CHANNELS and c_ * KH * KW <= IM2ROW_MAX_K
            and geo.out_shape[1] >= ctx.target.lanes(DType.f32))


def emit_conv_im2row(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                     params: list[Buffer] | None = None, grp: ConvGroups | None = None) -> KernelBuilder:
    """A convolution with few input channels (a network's first layer: squeezenet's 3x3 stride
    2 over RGB) as a GEMM per output row. X [N, C, H, W], W [M, C, KH, KW] (a compile-time
    constant), Y [N, M, OH, OW], all f32.

    With channels as the vector lanes (the row tiles), a reduction of C*KH*KW = 27 steps ends in
    one channel-strided scatter per accumulator, which costs as much as the FMAs. Here each
    task (n, output row) first copies the row's K = C*KH*KW input rows, as its windows read
    them (strided, zeros where they fall in the padding), into a local panel [K, OW]; the
    pointwise micro-kernel (:func:`choose_pointwise_tile`: R output channels x NB pixel
    vectors, weights packed as [MB, K, R] and broadcast) then runs over the panel, and bias and
    the fused epilogue run on whole vectors of the row before one contiguous store. The
    pixels after the last whole tile are covered by whole vectors ending at the row's end.
    ``grp``: the groups of a grouped convolution (:class:`ConvGroups`)."""
    grp = grp or ConvGroups(x, y)
    n_, c_, m_ = grp.n, grp.c, grp.m
    H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw = geo.dims_2d()
    K = c_ * KH * KW
    L, R, NB = choose_pointwise_tile(ctx.target, m_)
    # a tile no wider than the row (OW >= L: im2row_applies)
    L, R, NB = pixel_tile_knobs(ctx.target, m_, (L, R, max(1, min(NB, OW // L))), lambda nb: nb <= OW // L)
    MB = -(-m_ // R)
    wp = pack_pixel_gemm_weights(ctx, grp, K, R)
    params = [p for p in (params or ctx.default_params()) if p is not w] + [wp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += (f"  [im2row: panels [{K}, {OW}] per output row, register tile {R} channels x "
                          f"{NB}x{L} pixels, weights packed {list(wp.shape)}]")
    acc = kb.local(DType.f32, (R * NB * L,), hint="acc")
    panel = kb.local(DType.f32, (K * OW,), hint="panel")
    fzero = as_expr(0.0, DType.f32)
    pix = NB * L
    nfull = OW // pix
    nvec_rest = -(-(OW - nfull * pix) // L)

    def cols(kw: int) -> tuple[int, int]:
        """The output columns whose tap kw reads inside the image: [lo, hi)."""
        lo = window_lo(pw - kw * dw, sw)
        hi = window_hi(W + pw - kw * dw, sw, OW)
        return lo, max(lo, hi)

    def tile(n, oh, mb, p0, nvec: int):
        pixel_gemm_tile(ctx, kb, acc, wp, y, b, grp, n, R, K, mb, nvec, L,
                        lambda k, v: panel.vload(k * OW + p0 + v * L, L),
                        lambda yn, oc, v: [yn, oc, oh, Ramp(p0 + v * L, L)])

    with kb.loop(n_ * OH, kind="parallel", hint="t") as t:
        oh = t % OH
        n = t / OH
        # one loop over the (c, kh) input rows, the taps kw unrolled inside (27 unrolled
        # copies of the fill cost LLVM 4 s for mobilenet's first conv)
        with kb.loop(c_ * KH, hint="ckh", role="spatial") as ckh:
            c = ckh / KH
            kh = ckh % KH
            ih = oh * sh + kh * dh - ph
            with kb.if_((ih >= 0) & (ih < H)) as inside:
                for kw in range(KW):
                    lo, hi = cols(kw)
                    dst = (ckh * KW + kw) * OW
                    for ow in list(range(lo)) + list(range(hi, OW)):
                        kb.store(panel, dst + ow, fzero)
                    if hi > lo:
                        src = ((n * c_ + c) * H + ih) * W + (kw * dw - pw)
                        with kb.loop(hi - lo, start=0, hint="ow", role="spatial") as j:
                            kb.store(panel, dst + lo + j, x.flat(src + (lo + j) * sw))
            with kb.else_(inside):
                with kb.loop(KW * OW, hint="ow", role="spatial") as j:
                    kb.store(panel, ckh * (KW * OW) + j, fzero)
        with kb.loop(MB, hint="mb", role="spatial") as mb:
            if nfull:
                with kb.loop(nfull, hint="tp", role="spatial") as tp:
                    tile(n, oh, mb, tp * pix, NB)
            if nvec_rest:
                tile(n, oh, mb, as_expr(OW - nvec_rest * L), nvec_rest)
    return kb


# ----------------------------------------------------------------------------- registration
#: plevels of the schedules of key "conv2d" (``ir.strategy``): the default among those that
#: apply is the highest; a schedule outside the shapes its thresholds were measured on
#: (:data:`FLAT_MAX_PIXELS`, :data:`IM2ROW_MAX_K`, ...) ranks below the row tiles
PLEVEL = {"depthwise": 30, "pointwise": 25, "flat": 20, "pointwise_low_lane_use": 15, "im2row": 12,
          "winograd": 11, "rows": 10, "flat_outside": 5, "im2row_outside": 4, "winograd_outside": 3}


def group_channels(x: Buffer, y: Buffer, group: int) -> tuple[int, int]:
    """(input channels, output channels) of one group of a convolution X [N, C, ...] ->
    Y [N, M, ...]."""
    return x.shape[1] // group, y.shape[1] // group


def blocked_applies(ctx: LowerCtx, *, x, w, y, group, geo, acc_dtype, hooks, **_) -> bool:
    """What every register-blocked schedule needs (:func:`blocked_conv_ok`) and W the node's
    compile-time constant input 1 (the schedules pack it)."""
    return (blocked_conv_ok(x, w, y, group, geo, acc_dtype, hooks, ctx.target)
            and ctx.const(1) is not None and ctx.inputs[1] is w)


def blocked_schedule(emit):
    """The ``ir.strategy`` form of a blocked schedule ``emit(ctx, x, w, b, y, geo, params, grp)``:
    keyword arguments of ``emit_conv``'s dispatch, the grouped view built here, and a grouped
    convolution's kernel comment naming its groups."""
    def run(ctx: LowerCtx, *, x, w, b, y, group, geo, params=None, **_) -> KernelBuilder:
        grp = ConvGroups(x, y, group)
        kb = emit(ctx, x, w, b, y, geo, params, grp)
        if group > 1:
            H, W = geo.in_shape
            kb.kernel.comment += (f"  [{group} groups of {grp.c}->{grp.m} channels, "
                                  f"run as {grp.n} images of [{grp.c}, {H}, {W}]]")
        return kb
    run.__doc__ = emit.__doc__
    run.__name__ = emit.__name__
    return run


def _pointwise_applies(ctx, **kw) -> bool:
    return blocked_applies(ctx, **kw) and pointwise_ok(ctx, kw["x"], kw["y"], kw["geo"], kw["group"])


def _pointwise_plevel(ctx, *, x, y, group, geo, **_) -> int:
    # pixel vectors that waste lanes lose to the flat tiles where those apply
    c_, m_ = group_channels(x, y, group)
    if flat_ok(ctx, c_, m_, geo) and pointwise_lane_use(ctx.target, m_, c_, geo) < POINTWISE_MIN_LANE_USE:
        return PLEVEL["pointwise_low_lane_use"]
    return PLEVEL["pointwise"]


#: the flat tiles also apply (below the row tiles, for the "schedule" knob) to output planes of
#: up to this many pixels in rows of any width
FLAT_APPLY_MAX_PIXELS = 256
#: im2row also applies (below the row tiles) to reductions C x KH x KW up to this long ...
IM2ROW_APPLY_MAX_K = 256
#: ... whose panel (K x OW float32, on the stack) takes at most this many bytes
IM2ROW_PANEL_MAX_BYTES = 256 * 1024


def flat_fits(ctx: LowerCtx, c_: int, m_: int, geo) -> bool:
    """Whether :func:`emit_conv_flat` can run a convolution beyond :func:`flat_ok`'s measured
    range: a plane of at most :data:`FLAT_APPLY_MAX_PIXELS` pixels whose padded input fits a
    chunk (:func:`flat_chunk` > 0)."""
    OH, OW = geo.out_shape
    if OH * OW > FLAT_APPLY_MAX_PIXELS:
        return False
    L, OB, _ = choose_flat_tile(ctx.target, m_, OH * OW)
    Hp, Wp = _flat_geometry(geo)
    return flat_chunk(ctx.target, c_, OB * L, geo.kernel[0] * geo.kernel[1], Hp * Wp) > 0


def im2row_fits(ctx: LowerCtx, c_: int, geo) -> bool:
    """Whether :func:`emit_conv_im2row` can run a convolution beyond :func:`im2row_ok`'s
    measured range: rows of at least one vector, a reduction of at most
    :data:`IM2ROW_APPLY_MAX_K` and a panel of at most :data:`IM2ROW_PANEL_MAX_BYTES`."""
    K = c_ * geo.kernel[0] * geo.kernel[1]
    OW = geo.out_shape[1]
    return (OW >= ctx.target.lanes(DType.f32) and K <= IM2ROW_APPLY_MAX_K
            and K * OW * 4 <= IM2ROW_PANEL_MAX_BYTES)


def register_thresholded(name: str, emit, ok, fits) -> None:
    """Register the blocked schedule ``conv2d_<name>`` (``emit``) for the shapes where its
    measured threshold ``ok(ctx, c, m, geo)`` holds, at plevel ``PLEVEL[name]``, and where it
    merely ``fits(ctx, c, m, geo)``, ranked below the row tiles at ``PLEVEL[name + "_outside"]``
    (the tuner's ``schedule`` knob may pick it there). ``c``, ``m``: one group's input and
    output channels."""
    def applies(ctx, **kw) -> bool:
        c_, m_ = group_channels(kw["x"], kw["y"], kw["group"])
        return blocked_applies(ctx, **kw) and (ok(ctx, c_, m_, kw["geo"]) or fits(ctx, c_, m_, kw["geo"]))

    def plevel(ctx, *, x, y, group, geo, **_) -> int:
        c_, m_ = group_channels(x, y, group)
        return PLEVEL[name] if ok(ctx, c_, m_, geo) else PLEVEL[name + "_outside"]

    register_schedule("conv2d", "llvm", f"conv2d_{name}", plevel=plevel, applies=applies)(blocked_schedule(emit))


register_schedule("conv2d", "llvm", "conv2d_pointwise", plevel=_pointwise_plevel,
                  applies=_pointwise_applies)(blocked_schedule(emit_conv_pointwise))


def _pointwise_scaled_applies(ctx, **kw) -> bool:
    xs = kw["x_scale"]
    return (kw["group"] == 1 and xs.dtype == DType.f32 and len(xs.shape) == 4
            and all(d == 1 for d in xs.shape[2:]) and _pointwise_applies(ctx, **kw))


@register_schedule("conv2d_input_scale", "llvm", "conv2d_pointwise_scaled", plevel=PLEVEL["pointwise"],
                   applies=_pointwise_scaled_applies)
def emit_conv_pointwise_scaled(ctx: LowerCtx, *, x, w, b, y, group, geo, params=None, x_scale=None, **_):
    """:func:`emit_conv_pointwise` of conv(X * S, W): the squeeze-excitation scale S [1 or N, C, 1, 1]
    applied to each pixel vector of X as it is read (``x_scale``)."""
    kb = emit_conv_pointwise(ctx, x, w, b, y, geo, params, ConvGroups(x, y, group), x_scale=x_scale)
    kb.kernel.comment += "  [input channels scaled by S as read]"
    return kb


register_thresholded("flat", emit_conv_flat, flat_ok, flat_fits)
register_thresholded("im2row", emit_conv_im2row, lambda ctx, c, m, geo: im2row_ok(ctx, c, geo),
                     lambda ctx, c, m, geo: im2row_fits(ctx, c, geo))
register_schedule("conv2d", "llvm", "conv2d_rows", plevel=PLEVEL["rows"],
                  applies=blocked_applies)(blocked_schedule(emit_conv_rows))
