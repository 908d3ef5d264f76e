"""The llvm backend's int8 schedule of 2-D convolutions with int32 accumulation
(ConvInteger, QLinearConv and the quantized convolutions that reach ``ir.ops.conv.emit_conv``
with ``acc_dtype=i32``): schedule key ``"conv2d"``, name ``conv2d_int8``.

Where it applies: x u8 or i8 [N, C, H, W] with a scalar zero point (any value, read at run
time), w u8 or i8 [M, C, KH, KW] a compile-time constant with a constant zero point (scalar
or per output channel [M]), any group (run group by group: the panel packs one group's
channels, depthwise convolutions included), any strides, dilations and pads; the target has an
integer dot product (:func:`int8.dot_forms`: VPDPBUSD, or VPMADDWD on AVX2).

Layout inside the kernel (the graph stays NCHW): the vector lanes are output pixels of one
row (``L`` = 16 or 8 int32 lanes), so the results store contiguously into Y's rows and the
epilogue runs on whole vectors, as in the float schedules.

- Weights: packed at compile time into ``Wp [MB, Cq, KH, KW, OCn]`` int32, each int32 holding
  the ``g`` (4 for VPDPBUSD, 2 for VPMADDWD) consecutive input channels of one tap of one
  output channel (offset as :mod:`.int8` says), zero beyond C and M. Their corrections
  (``corr``, ``d`` per channel) are a second packed constant.
- Activations: each parallel task takes one image and a band of ``band_rows`` output rows and
  packs the input rows the band reads into a per-thread panel ``Xp [Cq, NR, KR, COLS]`` int32:
  ``g`` input channels of one pixel per int32, offset to u8 (or widened to i16), the padding
  filled with the zero point, channels beyond C with 0. The columns are split by phase: with
  stride sw, copy k holds input columns c*sw + phase_k - pw, and tap kw (kw*dw = q*sw + phase)
  reads its phase's copy from column ow + q, a contiguous vector for consecutive output
  columns. KR copies, one per phase the taps use: 1 at stride 1 (the padded input row), 2 for
  resnet's 7x7 and 3x3 stride-2 convolutions. Rows: every input row the band reads, or, where
  the kernel's rows span less than the vertical stride (a 1x1 stride-2 downsample), only the
  rows the taps read (:func:`_row_steps`). The packing runs channel group by channel group
  (each group's rows of every band while its g channel planes are in L1). Rows of stride-1
  convolutions are packed in whole vectors of the target's widest width (that many bytes of
  each of the g channel rows, widened and interleaved, the words outside the row blended with
  the padding), column by column at x's first and last rows and at other strides; a 1x1
  kernel's band at stride 1 without padding, whose panel rows are consecutive rows of x, as one
  run of words per group.
- Micro-kernel: a tile of ``RP`` pixel vectors (consecutive vectors of the band's rows) x
  ``OCn`` output channels keeps RP*OCn int32 accumulator vectors in registers over the
  Cq x KH x KW reduction: per step RP vector loads of Xp, OCn broadcasts of Wp and RP*OCn
  ``DotAcc``; with a nonzero ``d`` also RP row sums (a ``DotAcc`` with ones).
- Epilogue on registers: the correction (``d * rowsum - a * corr``), the bias, the op's
  ``finish(acc, oc)`` (requantisation, or the float scale of ConvIntegerToFloat), then
  ``ctx.apply_epilogue`` on the vector and one store; a row's last partial vector (and the flat
  layout's runs of lanes in one output row) in vectors of 8, 4, 2 and 1 lanes. The stores go
  to a stage of the tile's RP*OCn vectors on the stack, then (a second pass over the same
  stores) to Y: with no store to Y among the epilogues LLVM loads (and divides) a channel's
  scales and zero points once per tile, where a store to Y, which may alias any parameter as
  far as it knows, made it reload them for every vector.
- u8 / i8 outputs (a requantizing epilogue) of a channel's consecutive whole pixel vectors that
  lie contiguous in Y (the contiguous flat band; rows of whole vectors) narrow 4 (or 2) at a
  time: one :class:`~ir.kernel.Concat` "x86pack" of their epilogue values, one store.

Knobs: ``int8_lanes`` (16 or 8: narrow rows waste fewer lanes at 8), ``int8_tile`` (RP, OCn),
``int8_narrow`` (``pack``: the narrowing together above, where the target has AVX-512BW at 16
lanes or AVX2 at 8; ``vector``: each vector by its own conversion), ``band_rows`` (a divisor of
OH; larger bands repack fewer overlapping input rows, the panel stays under :data:`PANEL_BYTES`
by default), ``oc_split`` (output-channel blocks split into
this many parallel tasks: images x bands alone may be too few tasks), ``int8_pack`` (with
``oc_split`` > 1: ``task``, the default, a thread's first task of a band packs its panel on the
thread's stack and the thread's later tasks of that band reuse it, so each band is packed once
per thread that works on it, with no extra phase of the team; ``shared``: a first kernel packs
every band's panel once into a scratch buffer [N*G*bands, Cq, plane] that the split tasks read,
its parallel tasks runs of channel groups of one image), ``int8_stage``
(``tile``: the staged epilogue above; ``none``: stores straight to Y), ``int8_layout`` (the
pixel layouts above; ``channels``: output channels as the lanes, any M from 16 up, the tile
transposed by register shuffles, ``int8_transpose``, before an epilogue per channel on
vectors of the tile's pixels), ``int8_ctile``. The epilogue runs on
whole vectors (lanes past a row's end computed and dropped) where it reads only scalars and
stores no side output (:func:`int8.epilogue_whole_vectors_ok`), else the lanes of each row
in runs.

AMX tiles (``int8_engine`` ``amx``, targets with AMX-INT8): TDPBSUD with 16 output channels
of packed weights as the A tile and 16 channel words of 16 pixels of the panel as the B tile;
where the channel words do not fill the 16 tile rows (``Cq`` not a multiple of 16: resnet's
stem, 3 channels in one word per tap), the B tiles are gathered: each pixel vector's (tap,
channel word) rows of the panel copied into a stack block once, which every channel block then
reads, the weights packed in the same (tap, channel word) order.

Depthwise convolutions (``group == C == M``) take :mod:`.conv2d_int8_dw` where it applies.
"""
from __future__ import annotations

import contextlib

import numpy as np

from tensorfuse.ir.kernel import (Expr, KernelBuilder, PixelIndex, Ramp, as_expr, binop, broadcast, concat, dot_acc,
                                  interleave, minimum, shuffle)
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from . import int8
from .conv2d import vector_registers

#: most words (tile rows) of a reduction gathered into AMX B tiles (``int8_engine`` ``amx`` where
#: the channel words do not fill whole tile rows): 16 KiB of stack per pixel vector
AMX_GATHER = 256
#: the gathered AMX tiles by default from this many kernel taps (resnet's 7x7 stem)
AMX_GATHER_MIN_TAPS = 9

#: default bound of a task's packed input panel (it lives on the thread's stack and should
#: stay in L2 while every channel block reads it)
PANEL_BYTES = 48 * 1024
#: the schedule does not apply when a band of one output row needs a larger panel
MAX_PANEL_BYTES = 256 * 1024
#: parallel tasks the default ``oc_split`` aims at
MIN_TASKS = 8


def _geometry_ok(geo) -> bool:
    return geo.rank == 2 and max(geo.kernel) <= 11


def _lane_use(ow: int, L: int) -> float:
    return ow / (-(-ow // L) * L)


def _row_steps(geo) -> tuple[int, int]:
    """(panel rows per output row, per kernel row). Where a kernel's rows span less than the
    vertical stride (a 1x1 stride-2 downsample: input rows 0, 2, 4 ...), the panel holds only
    the rows the taps read, output row oo's kernel row kh at panel row ``oo*KH + kh``: (KH, 1);
    else every input row of the band, ``oo*sh + kh*dh``: (sh, dh)."""
    (KH, _), (sh, _), (dh, _) = geo.kernel, geo.strides, geo.dilations
    return (KH, 1) if (KH - 1) * dh + 1 < sh else (sh, dh)


def _panel_shape(geo, L: int, rb: int, cq: int, flat: bool = False) -> tuple[int, int, int, int]:
    """(Cq, NR, KR, COLS) of a band of ``rb`` output rows at ``L`` lanes (``flat``: columns
    exactly as many as the band's output rows read, see :func:`_plane`)."""
    (KH, KW), (sh, sw), (dh, dw) = geo.kernel, geo.strides, geo.dilations
    OW = geo.out_shape[1]
    nvw = -(-OW // L)
    rs, ks = _row_steps(geo)
    nr = (rb - 1) * rs + (KH - 1) * ks + 1
    if flat:
        return cq, nr, 1, OW + (KW - 1) * dw
    phases, qmax = _phases(geo)
    return cq, nr, len(phases), nvw * L + qmax


def _phases(geo) -> tuple[list[int], int]:
    """The column phases (kw*dw mod sw) the taps read, in order, and the largest column
    offset (kw*dw div sw) of a tap."""
    KW, sw, dw = geo.kernel[1], geo.strides[1], geo.dilations[1]
    return sorted({kw * dw % sw for kw in range(KW)}), (KW - 1) * dw // sw


def _plane(geo, L: int, rb: int, flat: bool) -> int:
    """int32 words of one packed channel group of a band's panel: NR*KR*COLS, and for the flat
    layout a tail that the last vectors' taps may read past the band's last row (their lanes
    beyond it are discarded)."""
    _, nr, kr, cols = _panel_shape(geo, L, rb, 1, flat)
    return nr * kr * cols + (2 * L + (geo.kernel[1] - 1) * geo.dilations[1] if flat else 0)


def _flat_vectors(geo, L: int, rb: int) -> int:
    """Vectors of the flat layout covering a band of ``rb`` rows: positions r*COLS + ow."""
    cols = _panel_shape(geo, L, rb, 1, True)[3]
    return -(-((rb - 1) * cols + geo.out_shape[1]) // L)


#: kernels of at most this many taps run all of them in one step of the channel loop (larger
#: ones one kernel row per step)
MAX_UNROLLED_TAPS = 16
#: default bound of the flat layout's panel (a whole small plane: resnet's 7x7 x 512 channels
#: takes 59 KiB, in L2)
FLAT_PANEL_BYTES = 96 * 1024
#: ... or up to this share of the target's L2 (a 14x14 plane of 512 channels at a 1x1 stride-2
#: kernel, 117 KiB in one band)
FLAT_PANEL_L2_SHARE = 1 / 8
#: the flat layout's tiles are unrolled (their lanes' output positions are constants): at most
#: this many vectors per band
MAX_FLAT_VECTORS = 16
#: narrow vectors of the flat layout take the band in one tile where it has at most this many
ONE_TILE_VECTORS = 8


def conv_int8_applies(ctx: LowerCtx, *, x, w, y, group, geo, acc_dtype, x_zero=None, w_zero=None, **_) -> bool:
    """Module docstring: u8/i8 x and constant w, constant w zero point, scalar x zero point,
    2-D, int32 accumulation, a target with an integer dot product, and a panel of one
    output row within :data:`MAX_PANEL_BYTES`."""
    if not (acc_dtype == DType.i32 and x.dtype in int8.QUANT and w.dtype in int8.QUANT
            and _geometry_ok(geo)):
        return False
    forms = int8.dot_forms(ctx.target)
    if not forms or int8.const_input(ctx, w) is None:
        return False
    if w_zero is not None and int8.const_input(ctx, w_zero) is None:
        return False
    if x_zero is not None and x_zero.numel != 1:
        return False
    form = forms[-1]
    cq = -(-(x.shape[1] // group) // form.per_lane)
    return 4 * _prod(_panel_shape(geo, form.lanes, 1, cq)) <= MAX_PANEL_BYTES


def _prod(t) -> int:
    p = 1
    for v in t:
        p *= v
    return p


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tiles(regs: int, rowsum: bool, m: int, slots: int) -> list[tuple[int, int]]:
    """(RP, OCn) register tiles: RP*OCn accumulators, RP pixel vectors (and RP row sums), one
    broadcast and one spare within ``regs``."""
    out = []
    for rp in range(1, min(8, slots) + 1):
        for ocn in range(1, min(16, m) + 1):
            if rp * ocn + rp * (2 if rowsum else 1) + 2 <= regs:
                out.append((rp, ocn))
    return out


#: the channel layout is the default only where each output sums at least this many packed
#: words (Cq * KH * KW: its transposition per tile, about 2 operations per output, stays a few
#: percent of the dot products) ...
CHAN_MIN_REDUCTION = 256
#: ... and where the pixel layouts use fewer of their lanes than this (7-, 14- and 28-wide rows
#: at 16 lanes: 87.5%)
CHAN_MAX_LANE_USE = 0.95
#: a reduction of at least CHAN_SHORT_REDUCTION words suffices where the pixel layouts use
#: fewer than CHAN_SHORT_MAX_LANE_USE of their lanes (13x13 planes: 13 of 16; squeezenet1_1
#: u8s8, Zen 4, 1 thread: its 512->1000 classifier conv 0.548 -> 0.489 ms, the model 1.076x
#: -> 1.034x onnxruntime in one process; with 14- and 7-wide rows, 87.5% used, the 1x1 convs of
#: 576 and 960 channels keep their layouts: with a general bound of 128 words they moved and
#: mobilenet_v2 u8s8 went from 0.76x to 0.83x in one process)
CHAN_SHORT_REDUCTION = 128
CHAN_SHORT_MAX_LANE_USE = 0.85


#: default (RP, OCV) tile of the channel layout: 8 pixels x 3 vectors of 16 channels, 24
#: accumulators, 3 weight vectors and a broadcast in 32 registers (512x7x7 3x3: 0.556 ms;
#: (6, 4) 0.573, (12, 2) 0.560, (16, 1) 0.564)
CHAN_TILE = (8, 3)


#: the channel layout's band may take up to this share of L2 where it wastes fewer tile slots
#: (band pixels a whole number of the tile's RP) than the band within an eighth of it
CHAN_BAND_L2_SHARE = 0.25


#: a tile with fewer accumulators than this waits on the dot product's latency (VPDPBUSD:
#: about 5 cycles at 2 per cycle); the default tile's cost model counts it as this many
LATENCY_ACCUMULATORS = 16


#: where each output sums fewer packed words than this (Cq * KH * KW), the default pixel tile
#: keeps at most SHORT_REDUCTION_ACCUMULATORS accumulators: with a short reduction the tile's
#: epilogue (staging, requantization, stores) weighs as much as its dot products, and a 24-
#: accumulator tile spills there. Measured on a Zen 4 at 1 thread, u8s8 QDQ conv + Relu, default
#: (4, 6) or (3, 8) against (4, 4): 64->256 1x1 at 56x56 (16 words) 0.490 / 0.373 ms,
#: 128->512 1x1 at 28x28 0.391 / 0.331, 256->1024 1x1 at 14x14 0.395 / 0.329, 256->64 1x1 at
#: 56x56 0.448 / 0.418, 32->64 3x3 at 112x112 (72 words) 1.705 / 1.489; at 144 words (64->64
#: 3x3 at 56x56) equal, at 288 (128->128 3x3 stride 2) the larger tile 4% faster. Remeasured
#: with flat bands of up to 16 vectors (same machine, 1 thread), below 256 words (4, 4) is the
#: fastest or within 1%: 512->128 1x1 at 28x28 (128 words) 0.239 ms against (1, 16) 0.245 and
#: (4, 6) 0.254; 512->1024 1x1 stride 2 (128) 0.501 against 0.514 / 0.521; 64->64 3x3 at
#: 56x56 (144) 0.527 against (3, 8) 0.539; 96->192 3x3 at 28x28 (216) 0.614 against (2, 8)
#: 0.607 and (1, 16) 0.615
SHORT_REDUCTION = 256
SHORT_REDUCTION_ACCUMULATORS = 16


def _tile_cost(rp: int, ocn: int, m: int, slots: int) -> tuple[float, float]:
    """(dot-product slots per channel-group step over the whole output, loads per dot product)
    of the register tile (RP, OCn): ceil(M / OCn) channel blocks (padded channels computed and
    dropped) times the band's pixel vectors in tiles of RP (and a last, smaller one), each tile
    costing max(its accumulators, :data:`LATENCY_ACCUMULATORS`)."""
    full, rest = divmod(slots, rp)
    per_block = full * max(rp * ocn, LATENCY_ACCUMULATORS) + (max(rest * ocn, LATENCY_ACCUMULATORS) if rest else 0)
    return -(-m // ocn) * per_block, (rp + ocn) / (rp * ocn)


def _default_tile(regs: int, rowsum: bool, m: int, slots: int, words: int | None = None) -> tuple[int, int]:
    """With 32 registers: the (RP, OCn) of least :func:`_tile_cost` (the channels padded to a
    multiple of OCn and the pixel vectors to RP count: 64 channels take 8 blocks of 8, not 11
    of 6 with 2 computed in vain; 1-4% faster on resnet18 and mobilenet_v2 u8s8), among tiles
    of RP <= 4 with RP*OCn accumulators, RP pixel vectors (and RP row sums), one broadcast and
    one spare in the registers; within 1% the one with fewer loads per dot product. Where each
    output sums ``words`` < :data:`SHORT_REDUCTION` packed words: RP = min(4, slots) pixel
    vectors x :data:`SHORT_REDUCTION_ACCUMULATORS` / RP channels. With 16
    registers RP = 2 and at most 4 channels: VPMADDWD's product needs a register before its
    VPADDD, and 2 x 6 spilled (measured on the AVX2 form: 2 x 4 is 10-15% faster than 2 x 6)."""
    if regs < 32:
        rp = max(1, min(2, slots))
        return rp, max(1, min(m, (regs - 2 - rp * (2 if rowsum else 1)) // rp, 4))
    if words is not None and words < SHORT_REDUCTION:
        # the fewest loads per dot product within the accumulator bound: a square tile (the
        # cost model's padding count chose (1, 16) here, 1.2-1.3x slower than (4, 4))
        rp = max(1, min(4, slots))
        return rp, max(1, min(m, SHORT_REDUCTION_ACCUMULATORS // rp))
    best = None
    for rp in range(1, min(4, slots) + 1):
        ocn = min(m, (regs - 2 - rp * (2 if rowsum else 1)) // rp, 16)
        for o in range(max(1, ocn - 4), ocn + 1):
            cost, loads = _tile_cost(rp, o, m, slots)
            key = (rp, o, cost, loads)
            if best is None or cost < best[2] * 0.99 or (cost <= best[2] * 1.01 and loads < best[3]):
                best = key
    return best[0], best[1]


def vector_cost(target, lanes: int) -> float:
    """Issue slots of one int32 vector operation of ``lanes`` lanes, in units of the target's
    execution datapath (:attr:`~ir.target.Target.datapath_bits`): 1 for any vector within it,
    2 for a 512-bit one on a CPU that splits it (Zen 4)."""
    return max(1.0, 32 * lanes / max(32, target.datapath_bits))


def row_cost(target, ow: int, lanes: int) -> float:
    """Cost of one output row of ``ow`` pixels at ``lanes`` pixels per vector:
    ceil(ow / lanes) vectors times :func:`vector_cost`."""
    return -(-ow // lanes) * vector_cost(target, lanes)


def _widths(ctx: LowerCtx) -> list[int]:
    forms = int8.dot_forms(ctx.target)
    return [f.lanes for f in forms if f.isa == forms[0].isa]


def _form_of(ctx: LowerCtx, L: int):
    forms = int8.dot_forms(ctx.target)
    return next(f for f in forms if f.lanes == L and f.isa == forms[0].isa)


def _row_lanes(ctx: LowerCtx, OW: int) -> int:
    """Default lanes of a row of ``OW`` output pixels: the widest vector unless a narrower one
    uses clearly more of its lanes on short rows, or costs less per row where the target
    splits wide vectors (Zen 4: a 56-pixel row in seven 8-lane vectors, not four 16-lane ones
    of which 8 lanes compute nothing; 64x56x56 3x3 u8s8 conv 0.705 -> 0.66 ms at 1 thread)."""
    widths = _widths(ctx)
    best = widths[0]
    for L in widths[1:]:
        if (_lane_use(OW, L) > _lane_use(OW, best) + 0.15
                or row_cost(ctx.target, OW, L) < row_cost(ctx.target, OW, best)):
            best = L
    return best


def _form_for(ctx: LowerCtx, OW: int):
    """The dot-product form of rows of ``OW`` pixels; declares knob ``int8_lanes``."""
    L = knob("int8_lanes", _widths(ctx), _row_lanes(ctx, OW), doc="int32 lanes (output pixels) per vector")
    return _form_of(ctx, L)


def _flat_geometry(geo) -> bool:
    """Whether the flat layout applies: stride 1, or a 1x1 kernel at any stride (its panel rows
    are the rows it reads, :func:`_row_steps`, and its columns the columns it reads, so
    COLS == OW as at stride 1)."""
    return list(geo.strides) == [1, 1] or list(geo.kernel) == [1, 1]


def _contiguous_flat(ctx: LowerCtx, geo, y) -> bool:
    """Whether the flat layout's band is contiguous in Y (a 1x1 kernel: COLS == OW, so band
    position r*COLS + ow is the flat pixel offset) and every tensor the fused epilogue reads
    broadcasts over the spatial dims as a whole (a :class:`~ir.kernel.PixelIndex` addresses
    it): then the band's whole pixel vectors go through the epilogue and to Y as vectors, only
    its last one in runs, instead of each output row's run of lanes in pieces of 8, 4, 2, 1."""
    if geo.kernel[1] != 1 or not _flat_geometry(geo):
        return False
    return _pixel_addressable(ctx, y)


def _chan_tiles(regs: int, mbv: int) -> list[tuple[int, int]]:
    """(RP pixels, OCV channel vectors) register tiles of the channel layout: RP*OCV
    accumulators, OCV weight vectors and one broadcast within ``regs``."""
    return [(rp, ov) for rp in (4, 6, 8, 12, 16) for ov in range(1, min(4, mbv) + 1)
            if rp * ov + ov + 1 <= regs]


def _pixel_addressable(ctx: LowerCtx, y) -> bool:
    """Whether every tensor the fused epilogue reads broadcasts over the spatial dims as a whole
    (a :class:`~ir.kernel.PixelIndex` of consecutive pixels across rows addresses it)."""
    probe = PixelIndex([0] * len(y.shape), y.shape[2:])
    return all(probe.addresses(b.shape) for b in ctx.epilogue_inputs)


def _layout(ctx: LowerCtx, geo, Cq: int, prefer_flat: bool = False, chan_ok: bool = False, amx: bool = False):
    """(flat, form, band_rows): the flat layout where a stride-1 (or 1x1) convolution's short rows leave
    too many lanes of the row layout idle (7-column rows: 7 of 8 lanes per 8-lane vector in
    rows, 12.25 of 16 per 16-lane vector flat), or (``prefer_flat``: a contiguous flat band
    whose epilogue reads tensors, :func:`_contiguous_flat`) as many, the lanes, and the band of
    output rows. ``amx``: AMX tiles may take the conv, whose rows are 16 pixels: the widest
    vector only. A 1x1 conv takes the flat band at equal use."""
    OH, OW = geo.out_shape
    widths = _widths(ctx)[:1] if amx else _widths(ctx)
    split = ctx.target.datapath_bits < ctx.target.vector_bits
    flat_ok = _flat_geometry(geo)

    panel_max = max(FLAT_PANEL_BYTES, int(ctx.target.l2_bytes * FLAT_PANEL_L2_SHARE))

    def flat_bands(Lf):
        return [d for d in _divisors(OH) if _flat_vectors(geo, Lf, d) <= MAX_FLAT_VECTORS
                and 4 * Cq * _plane(geo, Lf, d, True) <= panel_max] if flat_ok else []

    def flat_band(Lf):
        """The default band of the flat layout at Lf lanes: the one whose vectors' lanes hold
        most output pixels (a 14x14 plane at 16 lanes: 14 rows, 196 pixels in 13 vectors, not 7
        rows in 7 with 14 lanes in vain), the larger of equals."""
        return max(flat_bands(Lf), key=lambda d: (d * OW / _flat_vectors(geo, Lf, d), d))

    def flat_use(Lf):
        """Output pixels per issue slot of the flat layout at Lf lanes (its default band)."""
        rb = flat_band(Lf)
        return rb * OW / _flat_vectors(geo, Lf, rb) / vector_cost(ctx.target, Lf)

    row_L = widths[0] if amx else _row_lanes(ctx, OW)
    # the flat layout at the widest vector; where the target splits wide vectors, at the width
    # that computes most output pixels per issue slot (a 7x7 plane: seven 8-lane vectors, not
    # four 16-lane ones with 15 lanes computing nothing)
    flat_widths = [Lf for Lf in widths if flat_bands(Lf)]
    flat_L = widths[0] if widths[0] in flat_widths else None
    if split and flat_widths:
        flat_L = max(flat_widths, key=lambda Lf: (flat_use(Lf), Lf))
    flat0 = False
    if flat_L is not None:
        useful_flat = flat_use(flat_L)
        if split:
            # pixels per issue slot, both layouts; at equal use a 1x1 conv takes the flat band
            # (no column of it is padding: 1x1 convs of 7x7 planes, 160->960 0.057 against
            # 0.077 ms in rows, 960->320 0.101 against 0.109; mobilenet_v2 u8s8 at 1 thread
            # 0.99x onnxruntime, 1.16x with the rows)
            useful_rows = OW / row_cost(ctx.target, OW, row_L)
            flat0 = useful_flat > useful_rows or (useful_flat == useful_rows and geo.kernel[1] == 1)
        else:
            # pixels per vector, a narrow vector counted as a whole wide one
            useful_rows = OW / -(-OW // row_L) * row_L / flat_L
            # a 1x1 conv's flat band has no padding columns and its vectors lie on whole cache
            # lines of Y (a 56-column row's do not), so it takes the band at equal use or
            # better (Emerald Rapids, 1 thread, QDQ u8s8: 128->512 at 28x28 0.357 -> 0.212
            # ms, 256->1024 at 14x14 0.305 -> 0.248, 192->32 at 28x28 0.075 -> 0.054;
            # ConvInteger's int32 output, 64-byte aligned: 64->256 at 56x56 0.376 -> 0.331,
            # 128->512 at 28x28 0.216 -> 0.147, 256->64 at 56x56 0.222 -> 0.133)
            one = tuple(geo.kernel) == (1, 1)
            flat0 = useful_flat >= useful_rows if (prefer_flat or one) else useful_flat > 1.15 * useful_rows
    # the channel layout: output channels as the lanes, so no lane waits on a short row; it
    # pays a transposition per tile, worth it where the rows leave lanes idle and the
    # reduction per output is long (CHAN_MIN_REDUCTION)
    widest = widths[0]
    use_rows = (OW / row_cost(ctx.target, OW, row_L)) / (widest / vector_cost(ctx.target, widest))
    use_flat = flat_use(flat_L) / (widest / vector_cost(ctx.target, widest)) if flat_L is not None else 0.0
    words, use = Cq * geo.kernel[0] * geo.kernel[1], max(use_rows, use_flat)
    chan0 = chan_ok and ((words >= CHAN_MIN_REDUCTION and use < CHAN_MAX_LANE_USE)
                         or (words >= CHAN_SHORT_REDUCTION and use < CHAN_SHORT_MAX_LANE_USE))
    layouts = ["rows"] + (["flat"] if flat_widths else []) + (["channels"] if chan_ok else [])
    layout = knob("int8_layout", layouts, "channels" if chan0 else "flat" if flat0 else "rows",
                  doc="pixel vectors along output rows, or over a band's rows flattened (stride 1 or a 1x1 kernel), "
                      "or output channels as the lanes")
    flat = layout == "flat"
    if layout == "channels":
        L = widest
        cands = [d for d in _divisors(OH) if 4 * Cq * _plane(geo, L, d, False) <= MAX_PANEL_BYTES]
        # a band of many pixels: its tiles of RP pixels run across rows; its panel, read by every
        # channel block, may take an eighth of L2 (7x7 x 512 channels, 3x3: 83 KiB in one band
        # 0.556 ms, in bands of 1 row 0.718, on a Zen 4 with 1 MiB L2)
        def panel(d):
            return 4 * Cq * _plane(geo, L, d, False)
        fit = [d for d in cands if panel(d) <= max(PANEL_BYTES, ctx.target.l2_bytes // 8)]
        rb0 = max(fit) if fit else 1
        # a band whose pixels are not a whole number of the default tile's RP ends in a short
        # tile that costs about a whole one (its dot products wait on their latency, and it is
        # transposed lane by lane): where a band of up to CHAN_BAND_L2_SHARE of L2 wastes fewer
        # tile slots over the plane, it is taken (128x56x56 3x3 stride 2, Zen 4, 1 thread:
        # bands of 7 rows, 196 pixels = 24.5 tiles of 8, 0.73 ms; of 14 rows, 49 tiles, 0.64)
        RP0 = CHAN_TILE[0]

        def waste(d):
            return (OH // d) * (-(-d * OW // RP0) * RP0 - d * OW)
        wide = [d for d in cands if panel(d) <= max(PANEL_BYTES, int(ctx.target.l2_bytes * CHAN_BAND_L2_SHARE))]
        if wide:
            best = min(wide, key=lambda d: (waste(d), d != rb0, -d))
            if waste(best) < waste(rb0):
                rb0 = best
        RB = knob("band_rows", cands, rb0,
                  doc="output rows per parallel task (its packed input panel)")
        return "channels", _form_of(ctx, L), RB
    if flat:
        L = knob("int8_lanes", flat_widths, flat_L if flat_L is not None else flat_widths[0],
                 doc="int32 lanes (output pixels) per vector")
        rbs_flat = flat_bands(L)
    else:
        L = knob("int8_lanes", widths, row_L, doc="int32 lanes (output pixels) per vector")
    form = _form_of(ctx, L)
    if flat:
        cands = rbs_flat
        rb0 = flat_band(L)
    else:
        cands = [d for d in _divisors(OH) if 4 * Cq * _plane(geo, L, d, False) <= MAX_PANEL_BYTES]
        fit = [d for d in cands if 4 * Cq * _plane(geo, L, d, False) <= PANEL_BYTES]
        rb0 = max(fit) if fit else 1
    RB = knob("band_rows", cands, rb0, doc="output rows per parallel task (its packed input panel)")
    return layout, form, RB


@register_schedule("conv2d", "llvm", "conv2d_int8", plevel=40, applies=conv_int8_applies)
def emit_conv_int8(ctx: LowerCtx, *, x, w, b, y, group, geo, x_zero=None, w_zero=None, hooks=(), params=None,
                   **_) -> KernelBuilder:
    """Integer convolution on the target's dot-product instruction (module docstring); one
    kernel. ``hooks``' last entry is ``finish(acc, oc)`` (None: the int32 value cast to Y's
    dtype)."""
    finish = hooks[-1] if hooks and hooks[-1] is not None else (lambda v, oc: v.cast(y.dtype))
    N, CX, H, W = x.shape
    G = group
    C, M = CX // G, y.shape[1] // G          # one group's input and output channels
    (KH, KW), (sh, sw), (dh, dw), (ph, pw) = geo.kernel, geo.strides, geo.dilations, geo.pads_begin
    OH, OW = geo.out_shape
    g = int8.dot_forms(ctx.target)[0].per_lane
    Cq = -(-C // g)
    contiguous = _contiguous_flat(ctx, geo, y)
    K = C * KH * KW
    wv = int8.const_input(ctx, w)
    wz = int8.const_input(ctx, w_zero)
    form0 = int8.dot_forms(ctx.target)[0]
    pw0 = int8.offset_weights(wv.reshape(G * M, K), wz, form0, w.dtype)
    chan_ok = (form0.isa == "vnni" and form0.lanes == 16 and G == 1 and M >= 16
               and not pw0.need_rowsum and _pixel_addressable(ctx, y))
    # AMX tiles (TDPBSUD: the packed weights, s8, as the 16-row A tiles, one output channel a
    # row; the panel's words of 16 pixels as the B tiles, one channel word a row; the same
    # exact sums as VPDPBUSD's) where the channels fill whole 64-byte tile rows and the weights
    # need no row sums; by default from AMX_MIN_STEPS tile products per accumulator tile, or
    # from one where the output is requantized or dequantized (Y not int32): that epilogue's
    # float work then has the vector ports to itself instead of sharing them with VPDPBUSD
    # (Emerald Rapids, 1 thread, QDQ u8s8 1x1 convs: 64->256 at 56x56 0.290 -> 0.209 ms in
    # the flat layout, 64->64 0.084 -> 0.066; ConvInteger's int32 64->256 0.217 -> 0.251, so
    # an int32 output keeps the dot products). On AMX the channel layout is not offered and
    # the pixel layouts take the widest vector, so form is form0
    amx_ok = (int8.has_amx(ctx.target) and form0.isa == "vnni" and form0.lanes == 16 and not pw0.need_rowsum
              and M >= 16)
    # a reduction whose channel words do not fill whole tile rows (resnet's stem: 3 channels,
    # one word per tap) is gathered: the B tiles' rows are the (tap, channel word) pairs of the
    # reduction, each tile's 16 pixel words copied from the panel into a stack block per pixel
    # vector (:data:`AMX_GATHER` words at most), so 49 taps x 1 word take 4 tile products
    # instead of 49 VPDPBUSD steps of one word
    T = KH * KW * Cq
    gathered = Cq % int8.AMX_KQ != 0
    TS = -(-T // int8.AMX_KQ)                   # tile steps of the gathered reduction
    amx_ok = amx_ok and (not gathered or TS * int8.AMX_KQ <= AMX_GATHER)
    float_epilogue = y.dtype != DType.i32
    if gathered:
        # from AMX_MIN_STEPS tile products and AMX_GATHER_MIN_TAPS taps (Emerald Rapids, 1
        # thread, QDQ u8s8: the 7x7 stem 3->64 at 112x112 0.685 -> 0.374 ms, 16->64 3x3 at
        # 55x55 0.213 -> 0.147, regnet's grouped 3x3 of 16-channel groups 5-20% faster; the
        # 3x3 stem 3->32, 9 words in one step, was even: it keeps the dot products)
        amx0 = int8.amx_by_default(T) and KH * KW >= AMX_GATHER_MIN_TAPS
    else:
        amx0 = int8.amx_by_default(T) or float_epilogue
    amx = amx_ok and knob("int8_engine", ["dot", "amx"], "amx" if amx0 else "dot",
                          doc="dot: VPDPBUSD on registers; amx: AMX tiles (TDPBSUD, 16 channels x 16 pixels a tile)") == "amx"
    layout, form, RB = _layout(ctx, geo, Cq, prefer_flat=contiguous and not int8.epilogue_whole_vectors_ok(ctx, y),
                               chan_ok=chan_ok and not amx, amx=amx)
    flat, chan = layout == "flat", layout == "channels"
    contiguous = contiguous and flat
    L = form.lanes

    # ---- weights, packed at compile time (offset for the chosen form's packing)
    pw_ = pw0 if form.packing == form0.packing else int8.offset_weights(wv.reshape(G * M, K), wz, form, w.dtype)
    rowsum = pw_.need_rowsum
    regs = vector_registers(ctx.target)
    nvw = -(-OW // L)
    slots = _flat_vectors(geo, L, RB) if flat else RB * nvw
    tile0 = _default_tile(regs, rowsum, M, slots, Cq * KH * KW) if not chan else None
    if flat and L < _widths(ctx)[0] and slots <= ONE_TILE_VECTORS:
        # the flat layout at narrow vectors (a split target's 7x7 planes: 7 vectors): the band
        # in one tile, every weight broadcast once per channel block; measured on a Zen 4 at 1
        # thread, u8s8 1x1 convs of 7x7 planes, tile (7, 3) against the cost model's (1, 16)
        # or (4, 6): 576->160 0.041 / 0.052 ms, 960->320 0.101 / 0.118, 160->960 0.057 / 0.060
        ocn = min(M, (regs - 2 - slots * (2 if rowsum else 1)) // slots, 16)
        if ocn >= 2:
            tile0 = (slots, ocn)
    if chan:
        # RP pixels x OCV vectors of 16 output channels; the weights packed per vector (OCn 16)
        slots = RB * OW
        RP, OCV = knob("int8_ctile", _chan_tiles(regs, -(-M // L)), CHAN_TILE if CHAN_TILE[1] <= -(-M // L) else (8, 1),
                       doc="register tile of the channel layout: pixels x vectors of output channels")
        OCn = L
        # the tile's transposition: shuffles in registers (a power-of-two RP) or a scatter
        shuffled = not RP & (RP - 1) and knob(
            "int8_transpose", ["shuffle", "scatter"], "shuffle",
            doc="channel layout: the tile transposed by register shuffles or stored lane by lane") == "shuffle"
    elif amx:
        # RP pixel vectors x OCn channels: RP * OCn / 16 accumulator tiles, OCn / 16 weight
        # tiles and RP panel tiles (at most 8)
        # gathered: one pixel vector x 32 channels where M > 16 (the stems: (1, 32) 0.374 ms,
        # (2, 32) 0.60, (1, 16) 0.45)
        tile0 = ((1, 32) if gathered else (min(2, slots), 32)) if M > 16 else (min(2, slots), 16)
        RP, OCn = knob("int8_tile", [(rp, ocn) for rp in (1, 2) for ocn in (16, 32) if rp <= slots],
                       tile0, doc="AMX tile: pixel vectors x output channels")
    else:
        RP, OCn = knob("int8_tile", _tiles(regs, rowsum, M, slots), tile0,
                       doc="register tile: pixel vectors x output channels")
    MB = -(-M // OCn)
    NBLK = -(-MB // OCV) if chan else MB         # the channel blocks tasks split
    bands = OH // RB
    split0 = 1 if N * G * bands >= MIN_TASKS else min(NBLK, -(-MIN_TASKS // (N * G * bands)))
    SPLIT = knob("oc_split", [s for s in (1, 2, 4, 8, 16) if s <= NBLK], split0,
                 doc="channel blocks split into this many parallel tasks")
    mb_per = -(-NBLK // SPLIT)

    MBP = MB * OCn
    wpad = np.zeros((G, MBP, Cq * g, KH, KW), np.int64)
    wpad[:, :M, :C] = pw_.w_p.reshape(G, M, C, KH, KW)
    # [G, MB, OCn, Cq, g, KH, KW] -> [G, MB, Cq, KH, KW, OCn, g]
    if amx and gathered:
        # [G, MB, OCn, Cq, g, KH, KW] -> [G, MB, OCn, KH, KW, Cq, g] -> reduction words t =
        # (kh * KW + kw) * Cq + cq, zero past T -> [G, MB, TS, OCn, 16, g]: one A tile a step
        wt = wpad.reshape(G, MB, OCn, Cq, g, KH, KW).transpose(0, 1, 2, 5, 6, 3, 4).reshape(G, MB, OCn, T, g)
        wt = np.concatenate([wt, np.zeros((G, MB, OCn, TS * int8.AMX_KQ - T, g), wt.dtype)], axis=3)
        wt = wt.reshape(G, MB, OCn, TS, int8.AMX_KQ, g).transpose(0, 1, 3, 2, 4, 5)
    elif amx:
        # [G, MB, OCn, Cq/16, 16, g, KH, KW] -> [G, MB, KH, KW, Cq/16, OCn, 16, g]: an A tile
        # (16 channels x 16 words of one tap) is 1 KB in one piece
        wt = wpad.reshape(G, MB, OCn, Cq // int8.AMX_KQ, int8.AMX_KQ, g, KH, KW).transpose(0, 1, 6, 7, 3, 2, 4, 5)
    else:
        wt = wpad.reshape(G, MB, OCn, Cq, g, KH, KW).transpose(0, 1, 3, 5, 6, 2, 4)
    wp = ctx.pack(int8.pack_lanes(wt, form), "wint8")
    corr = np.zeros((2, G, MBP), np.int32)
    corr[0, :, :M] = pw_.corr.reshape(G, M)
    corr[1, :, :M] = int8.wrap32(pw_.d).reshape(G, M)
    cb = ctx.pack(corr, "wcorr")
    base = params if params is not None else ctx.default_params()
    # w's zero point stays a parameter: CSE merges equal constants, so the buffer may also be
    # x's zero point or one the fused epilogue reads (a QuantizeLinear's)
    params_ = [p for p in base if p is not w] + [wp, cb]
    Cq_, NR, KR, COLS = _panel_shape(geo, L, RB, Cq, flat)
    RS, KS = _row_steps(geo)                    # panel rows per output row, per kernel row
    phases = _phases(geo)[0]
    PL = _plane(geo, L, RB, flat)
    # with the channel blocks split over tasks, a band's panel is packed by the first task of
    # the band a thread runs, into the thread's own panel, which its later tasks of that band
    # read ("task": the thread remembers the band it holds; packed by every task, the panel was
    # packed SPLIT times over: at 1 thread, 1x1 convolutions of 7x7 planes spent half their
    # time repacking); or once, by a first kernel, into a scratch buffer that every task reads
    # ("shared": one more phase of the team, whose synchronisation cost more than the packing
    # on the 2-vCPU machine: resnet50 u8s8's 45 packing kernels took 0.9-2.3 ms at 2 threads)
    shared = knob("int8_pack", ["task", "shared"] if SPLIT > 1 else ["task"], "task",
                  doc="each thread packs the panels of the bands its tasks use, or one kernel packs every band once") == "shared"
    PB = N * G * bands                          # panels of the shared layout
    xps = ctx.scratch(DType.i32, (PB * Cq * PL,), "xpanel") if shared else None
    kb0 = None
    if shared:
        kb0 = ctx.kernel("pack", params=[x] + ([x_zero] if x_zero is not None else []) + [xps])
        kb0.kernel.comment += f"  [int8 panels of {PB} band(s) packed for {form.isa} {form.packing}: {[PB, Cq, PL]} words]"
    kb = ctx.kernel(params=params_ + ([xps] if shared else []))
    kb.kernel.comment += (f"  [int8 {'amx tdpbsud' if amx else form.isa} {form.packing} x{L}: "
                          + (f"channels as lanes, tile {RP} pixels x {OCV} vectors of {L} channels, " if chan else
                             f"tile {RP} pixel vectors x {OCn} channels, ")
                          + f"{'flat ' if flat else ''}band {RB} rows, panel {[Cq_, NR, KR, COLS]}"
                          f"{' shared' if shared else ''}, weights {list(wp.shape)}]")
    xp = xps if shared else kb.local(DType.i32, (Cq * PL,), hint="xpanel")
    if chan:
        cacc = kb.local(DType.i32, (RP * OCV * L,), hint="acc")
        # the tile transposed: [OCV*16 channels, RP pixels]
        ctr = kb.local(DType.i32, (OCV * L, RP), hint="tr")
    acc = kb.local(DType.i32, (RP * (OCn + 1) * L,), hint="acc") if not chan else None
    # the gathered B tiles of the tile's pixel vectors: [RP, TS * 16 words, 16 pixels]
    gat = kb.local(DType.i32, (RP * TS * int8.AMX_KQ * L,), hint="gather") if amx and gathered else None
    lanes_buf = kb.local(DType.i32, (L,), hint="lanes")
    # the tile's results go to a stage on the stack first and then to Y: with no store to Y
    # among the epilogues, LLVM loads each channel's scale, zero point and corrections (and
    # divides the scales) once per tile, not once per pixel vector (Y may alias any
    # parameter as far as it knows)
    staged = not chan and knob("int8_stage", ["tile", "none"], "tile",
                               doc="epilogue results staged per tile before the stores to Y") == "tile"
    ystage = kb.local(y.dtype, (RP * OCn * L,), hint="ystage") if staged else None
    # staged, with an epilogue that reads no tensor but scalars (a Q's scale and zero point) and
    # stores no side output: the epilogue runs on whole vectors
    # (lanes past a row's end or from several rows of the flat layout are computed, only the
    # valid ones copied), one finish per vector instead of one per run of lanes
    whole_vectors = staged and int8.epilogue_whole_vectors_ok(ctx, y)
    epi_loop = not chan and knob("int8_epilogue", ["loop", "unrolled"], "loop" if OCn > 1 else "unrolled",
                                 doc="the tile's epilogues in a loop over its channels, or unrolled") == "loop"
    # u8 / i8 outputs of a channel's consecutive whole pixel vectors that lie contiguous in Y
    # (the contiguous flat band; rows of whole vectors) narrow together, 4 (or 2) at a time,
    # through the x86 packs (ir.kernel.Concat "x86pack") and store as one vector
    pack_ok = (not chan and y.dtype in (DType.u8, DType.i8) and ((flat and contiguous) or (not flat and OW % L == 0))
               and int8.packs_narrow(ctx.target, L))
    narrow_pack = pack_ok and knob("int8_narrow", ["pack", "vector"], "pack",
                                   doc="u8 / i8 outputs of 4 pixel vectors narrowed together by x86 packs, or each "
                                       "by its own conversion") == "pack"
    accs = kb.local(DType.i32, (RP * (OCn + 1) * L,), hint="accs") if epi_loop else None
    i32 = DType.i32
    s_off = int8.activation_offset(form, x.dtype)
    mask = (1 << form.bits) - 1

    def xu(v: Expr) -> Expr:
        """An activation (x's dtype) as the packed element, masked to its bits."""
        e = v.cast(i32) + s_off if s_off else v.cast(i32)
        return e & mask

    def packed(vals: list) -> Expr:
        out = None
        for t, v in enumerate(vals):
            if v is None:
                continue
            term = v if t == 0 else binop("shl", v, as_expr(t * form.bits, DType.i32))
            out = term if out is None else out | term
        return out if out is not None else as_expr(0, i32)

    vector_pack = knob("int8_vector_pack", [True, False], True,
                       doc="pack the input panel's rows in whole vectors (else word by word)")

    # the packing's vector width: the widest the target has that a panel row fills, whatever
    # the lanes of the tiles (the packing only writes words: 58-column rows of 64x56x56 3x3
    # packed 16 words at a time, not 8, 13.0 -> 9.1 us a panel at 1 thread)
    PV = next((w for w in _widths(ctx) if w <= COLS), L)

    def pad_words(kbx: KernelBuilder, zx: Expr):
        """The packed padding words (x_u of xz in every element of a full channel group, and of
        the tail group's valid ones) computed once into a local that :func:`pack_group` reads:
        written inline, each padding word reloaded the zero point (a store to the panel may
        alias it, as far as LLVM knows) and shifted it into place, more work than a whole
        vector of packed pixels (14-column rows: 2 padding words per 16)."""
        buf = kbx.local(i32, (2,), hint="pad")
        a_u = xu(zx)
        for k, valid in enumerate((g, C % g)):
            if valid:
                kbx.store(buf, k, packed([a_u if t < valid else None for t in range(g)]))
        return buf

    # a 1x1 kernel at stride 1 without padding in the flat layout: a band's panel rows are
    # consecutive rows of x, so each channel group's panel is one run of NR*W words read from
    # g contiguous runs of x (98 words of a 7-row band of 14-column rows: 7 vectors, not 7 rows
    # of 14 words packed column by column)
    RV = next((w for w in _widths(ctx) if w <= NR * W), 0)
    run = (flat and vector_pack and (KH, KW, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and (OH, OW) == (H, W)
           and COLS == W and RV > 0)

    def pack_run(kbx: KernelBuilder, dst: Expr, src0: Expr):
        """The run of NR*W words of one full channel group (``run``) from x's element src0
        (channel t of the group at src0 + t*H*W) into ``xp`` at ``dst``: whole vectors of RV
        words, the last one ending at the run's end (overlapping the one before it where RV
        does not divide the run)."""
        nw = NR * W

        def vec(c0):
            kbx.store(xp, dst + c0, packed([xu(x.vload(src0 + t * (H * W) + c0, RV)) for t in range(g)]))
        with kbx.loop(nw // RV, hint="v") as v:
            vec(v * RV)
        if nw % RV:
            vec(as_expr(nw - RV))

    def pack_rows(kbx: KernelBuilder, pb0: Expr, n: Expr, gi: Expr, band0: Expr, nbands: int, padw,
                  cq_lo: Expr | int = 0, cq_hi: Expr | int = Cq):
        """The panels of bands band0 .. band0+nbands-1 (image n, group gi; panel b from word
        pb0 + b*Cq*PL of ``xp`` on), channel groups [cq_lo, cq_hi), every row and (flat
        layout) the tail (kernel ``kbx``; ``padw``: the padding words, :func:`pad_words`).
        Channel groups outside, bands and rows inside: a group's g channel planes are read
        while their cache lines are in L1 (rows outside, each 64-byte line of a narrow plane
        was fetched from L2 once per row it holds: the 1024x14x14 panel of resnet50's 1x1
        convolutions took 13.1 us, against 6.6 this way)."""
        pads = {"full": padw.flat(0), "tail": padw.flat(1)}
        full = C // g

        def group(cq: Expr, valid: int, pad: Expr):
            with kbx.loop(nbands, hint="b") if nbands > 1 else contextlib.nullcontext(as_expr(0)) as b:
                pbase = pb0 + b * (Cq * PL) if nbands > 1 else pb0
                oh0 = (band0 + b) * RB
                if run and valid == g:
                    pack_run(kbx, pbase + cq * PL, ((n * CX + gi * C + cq * g) * H + oh0) * W)
                else:
                    with kbx.loop(NR, hint="r") as r:
                        pack_group(kbx, pbase, n, gi, oh0, r, cq, valid, pad)
                if flat:                    # the tail the last vectors may read: defined values
                    with kbx.loop(PL - NR * COLS, kind="vectorize", hint="c") as c:
                        kbx.store(xp, pbase + cq * PL + NR * COLS + c, as_expr(0, i32))

        if full:
            hi_full = min(cq_hi, full) if isinstance(cq_hi, int) else minimum(cq_hi, as_expr(full))
            with kbx.loop(hi_full, start=cq_lo, hint="cq") as cq:
                group(cq, g, pads["full"])
        if C % g:
            with contextlib.ExitStack() as st:
                if not isinstance(cq_hi, int):          # a run of the groups: the tail in the last
                    st.enter_context(kbx.if_(cq_hi > full))
                group(as_expr(full), C % g, pads["tail"])

    def pack_group(kbx: KernelBuilder, pbase: Expr, n: Expr, gi: Expr, oh0: Expr, r: Expr, cq: Expr,
                   valid: int, pad: Expr):
        """Panel row ``r`` of channel group ``cq`` (``valid`` of its g channels real), every
        phase, :func:`pack_rows`."""
        if RS == sh:
            ih = oh0 * sh - ph + r
        else:                                         # sparse rows (_row_steps)
            ih = oh0 * sh - ph + ((r / KH) * sh + (r % KH) * dh if KH > 1 else r * sh)
        row_in = (ih >= 0) & (ih < H)
        for kr, phase in enumerate(_phases(geo)[0] if not flat else [0]):
            # panel column col holds input column iw = col*cs + off
            cs, off = sw, phase - pw
            lo = min(max(-(-(-off) // cs), 0), COLS)                  # first col with iw >= 0
            hi = max(min(-(-(W - off) // cs), COLS), lo)              # first col with iw >= W
            rowbase = pbase + cq * PL + (r * KR + kr) * COLS

            def src(t: int, iw: Expr) -> Expr:
                return ((n * CX + gi * C + cq * g + t) * H + ih) * W + iw

            def scalar_cols(c0: int, c1: int):
                """Panel columns [c0, c1): the padding outside [lo, hi), packed words inside."""
                if min(lo, c1) > c0:
                    with kbx.loop(min(lo, c1), start=c0, kind="vectorize", hint="c") as col:
                        kbx.store(xp, rowbase + col, pad)
                if min(hi, c1) > max(lo, c0):
                    with kbx.loop(min(hi, c1), start=max(lo, c0), kind="vectorize", hint="c") as col:
                        vals = [xu(x.flat(src(t, col * cs + off))) if t < valid else None for t in range(g)]
                        kbx.store(xp, rowbase + col, packed(vals))
                if c1 > max(hi, c0):
                    with kbx.loop(c1, start=max(hi, c0), kind="vectorize", hint="c") as col:
                        kbx.store(xp, rowbase + col, pad)

            with kbx.if_(row_in) as inside:
                if vector_pack and cs == 1 and valid == g and COLS >= PV:
                    # whole vectors of PV words at 0, PV, 2PV ... and, where PV does not
                    # divide the row, a last one ending at the row's end (overlapping:
                    # the same words): PV contiguous bytes of each of the g channel rows,
                    # widened and interleaved, the words past the row's ends blended with
                    # the padding (one store, not one per padding word); a vector that
                    # would read outside x (the first and last rows of the tensor) packs
                    # column by column. (At stride 2 the even bytes of two loads each, then
                    # widened, took longer than the column loop LLVM vectorizes: 512x14x14
                    # 3x3 0.042 against 0.032 ms)
                    starts = list(range(0, COLS - PV + 1, PV))
                    if COLS % PV:
                        starts.append(COLS - PV)
                    for c0 in starts:
                        c1 = c0 + PV
                        if c1 <= lo or c0 >= hi:
                            kbx.store(xp, rowbase + c0, broadcast(pad, PV))
                            continue
                        first, last = src(0, c0 + off), src(g - 1, c0 + off)
                        with kbx.if_((first >= 0) & (last + PV <= x.numel)) as fits:
                            vals = [xu(x.vload(src(t, c0 + off), PV)) for t in range(g)]
                            vec = packed(vals)
                            if c0 < lo or c1 > hi:      # the words outside the row: padding, blended
                                vec = shuffle(vec, broadcast(pad, PV),
                                              [i if lo <= c0 + i < hi else PV + i for i in range(PV)])
                            kbx.store(xp, rowbase + c0, vec)
                        with kbx.else_(fits):
                            scalar_cols(c0, c1)
                else:
                    scalar_cols(0, COLS)
            with kbx.else_(inside):
                with kbx.loop(COLS, kind="vectorize", hint="c") as col:
                    kbx.store(xp, rowbase + col, pad)

    def zero_point():
        return x_zero.flat(0) if x_zero is not None else as_expr(0, x.dtype)

    if shared:
        # tasks of every image and group: its channel groups in CT runs (as many tasks as the
        # bands have panel rows, at most one per group), each run every band's rows
        CT = min(Cq, bands * NR)
        with kb0.loop(N * G * CT, kind="parallel", hint="ptask") as t:
            ng = t / CT if CT > 1 else t
            ct = t % CT if CT > 1 else as_expr(0)
            pack_rows(kb0, ng * (bands * Cq * PL), ng / G if G > 1 else ng, ng % G if G > 1 else as_expr(0),
                      as_expr(0), bands, pad_words(kb0, zero_point()), ct * Cq / CT, (ct + 1) * Cq / CT)

    ntasks = N * G * bands * SPLIT
    held = None
    if not shared and SPLIT > 1:
        # the panel this thread holds (image x group x band; -1: none yet): every thread sets
        # its own before its tasks, which keep it across the chunks they claim
        held = kb.local(DType.i64, (1,), hint="held")
        kb.store(held, 0, as_expr(-1, DType.i64))
    with kb.loop(ntasks, kind="parallel", hint="task") as task:
        ng = task / (bands * SPLIT) if ntasks > 1 else as_expr(0)       # image x group
        n = ng / G if G > 1 else ng
        gi = ng % G if G > 1 else as_expr(0)
        rest = task % (bands * SPLIT) if ntasks > 1 else as_expr(0)
        band = rest / SPLIT if SPLIT > 1 else rest
        part = rest % SPLIT if SPLIT > 1 else as_expr(0)
        oh0 = band * RB
        if amx:
            kb.tile_config([(16, 64)] * 8)
        zx = zero_point()
        a_corr = zx.cast(i32) + s_off                 # a of the correction
        if shared:
            pbase = (ng * bands + band) * (Cq * PL) if PB > 1 else as_expr(0)
        else:
            # ---- pack the band's input rows (unless this thread holds them already)
            pbase = as_expr(0)
            with contextlib.ExitStack() as st:
                if held is not None:
                    key = (ng * bands + band).cast(DType.i64)
                    st.enter_context(kb.if_(held.flat(0).ne(key)))
                    kb.store(held, 0, key)
                pack_rows(kb, pbase, n, gi, band, 1, pad_words(kb, zx))
        # ---- the tiles
        ones = broadcast(as_expr(int(int8.pack_lanes(np.ones((1, g), np.int64), form)[0]), i32), L)
        zero = broadcast(as_expr(0, i32), L)

        def corr_index(ocl: Expr) -> Expr:
            """The index into ``cb``'s rows of the group's channel ``ocl``."""
            return gi * MBP + ocl if G > 1 else ocl

        mode = ["compute"]

        def reduction(taps):
            """The reduction over channel groups and kernel rows: ``taps(cq, kh)`` emits one
            kernel row's steps. Kernels of at most MAX_UNROLLED_TAPS taps take every row in one
            step of the channel loop; large kernels (resnet's 7x7 stem, few channels) one
            kernel row per step: with all 49 taps in one straight block, LLVM's scheduler
            chained the updates of each accumulator (3x slower)."""
            if KH * KW <= MAX_UNROLLED_TAPS:
                with kb.reduce(Cq, hint="cq") as cq:
                    for kh in range(KH):
                        taps(cq, kh)
            else:
                with kb.reduce(Cq * KH, hint="ck") as ck:
                    taps(ck / KH if KH > 1 else ck, ck % KH if KH > 1 else as_expr(0))

        def put(idx, slot: int, wd: int, value):
            """Y[idx] (``wd`` lanes) = ``value()``; with the staged epilogue, in the "compute"
            pass into the stage at ``slot``, in the "copy" pass from there into Y."""
            if not staged:
                kb.store(y, idx, value())
            elif mode[0] == "compute":
                kb.store(ystage, slot, value())
            else:
                kb.store(y, idx, ystage.vload(slot, wd) if wd > 1 else ystage.flat(slot))

        def store_run(lane0: int, length: int, oc: Expr, oh: Expr, ow0: Expr, slot0: int = 0):
            """Output pixels ow0 .. ow0+length-1 of row oh from lanes lane0.. of ``lanes_buf``
            (the corrected accumulators): vectors of 8, 4, 2 lanes, then 1, each with finish
            and the epilogue on the vector before its store (a row's tail, the flat layout's
            runs), instead of one scalar epilogue per pixel."""
            off = 0
            while off < length:
                wd = 1 << ((length - off).bit_length() - 1)
                val = lanes_buf.vload(lane0 + off, wd) if wd > 1 else lanes_buf[lane0 + off]
                idx = [n, oc, oh, Ramp(ow0 + off, wd) if wd > 1 else ow0 + off]
                put(idx, slot0 + lane0 + off, wd, lambda val=val, idx=idx: ctx.apply_epilogue(finish(val, oc), idx))
                off += wd

        def store_pixels(length: int, oc: Expr, pix: Expr, slot0: int):
            """Flat pixels pix .. pix+length-1 (of a contiguous band) from ``lanes_buf``: as
            :func:`store_run`, indexed by :class:`PixelIndex`."""
            off = 0
            while off < length:
                wd = 1 << ((length - off).bit_length() - 1)
                val = lanes_buf.vload(off, wd) if wd > 1 else lanes_buf[off]
                idx = PixelIndex([n, oc, as_expr(0), Ramp(pix + off, wd) if wd > 1 else pix + off], (OH, OW))
                put(idx, slot0 + off, wd, lambda val=val, idx=idx: ctx.apply_epilogue(finish(val, oc), idx))
                off += wd

        def tile(mb: Expr, s0, rp: int, gather: bool = True, compute: bool = True):
            """The tile of ``rp`` pixel vectors from slot ``s0`` x channel block ``mb``: its
            reduction and epilogue. Gathered AMX tiles: ``gather`` fills the tile's B tile
            rows, ``compute`` (False: the gather alone, which the channel blocks then share)
            runs the rest."""
            # slot s -> (band row, vector of the row); flat: s0 is a constant
            if flat:
                rows = vecs = [as_expr(0)] * rp
            else:
                rows = [(s0 + p) / nvw if nvw > 1 else s0 + p for p in range(rp)]
                vecs = [(s0 + p) % nvw if nvw > 1 else as_expr(0) for p in range(rp)]

            def xaddr(cq, p, kh, kw):
                if flat:
                    return pbase + cq * PL + (s0 + p) * L + kh * dh * COLS + kw * dw
                kr = phases.index(kw * dw % sw)
                coff = kw * dw // sw
                return pbase + cq * PL + ((rows[p] * RS + kh * KS) * KR + kr) * COLS + vecs[p] * L + coff
            if amx:
                # accumulator tile p * NT + h: pixel vector p x channels h*16 ..; weight tiles
                # 4 + h, panel tiles 6 + p; stored to the accumulator block as the register
                # tile's (p, j) vectors, then the same epilogue
                NT = OCn // 16
                KQ = int8.AMX_KQ
                if gathered and gather:
                    # row t of pixel vector p's block: the 16 words of reduction word t
                    # (tap t // Cq, channel word t % Cq) from the panel; rows past T zero
                    for p in range(rp):
                        for kh in range(KH):
                            for kw in range(KW):
                                for cq in range(Cq):
                                    t = (kh * KW + kw) * Cq + cq
                                    kb.store(gat, (p * TS * KQ + t) * L, xp.vload(xaddr(as_expr(cq), p, kh, kw), L))
                        for t in range(T, TS * KQ):
                            kb.store(gat, (p * TS * KQ + t) * L, zero)
                if not compute:
                    return
                for q in range(rp * NT):
                    kb.tile_zero(q)
                if gathered:
                    with kb.reduce(TS, hint="ts") as ts:
                        for h in range(NT):
                            wo = ((((gi * MB + mb) * TS + ts) * OCn + h * 16) * KQ)
                            kb.tile_load(4 + h, wp, wo, KQ, 16, 64)
                        for p in range(rp):
                            kb.tile_load(6 + p, gat, (p * TS + ts) * KQ * L, L, 16, 64)
                        for p in range(rp):
                            for h in range(NT):
                                kb.tile_dpbsud(p * NT + h, 4 + h, 6 + p)
                else:
                    with kb.reduce(Cq // int8.AMX_KQ, hint="cs") as cs:
                        for kh in range(KH):
                            for kw in range(KW):
                                for h in range(NT):
                                    wo = (((((gi * MB + mb) * KH + kh) * KW + kw) * (Cq // int8.AMX_KQ) + cs) * OCn + h * 16) * int8.AMX_KQ
                                    kb.tile_load(4 + h, wp, wo, int8.AMX_KQ, 16, 64)
                                for p in range(rp):
                                    kb.tile_load(6 + p, xp, xaddr(cs * int8.AMX_KQ, p, kh, kw), PL, 16, 64)
                                for p in range(rp):
                                    for h in range(NT):
                                        kb.tile_dpbsud(p * NT + h, 4 + h, 6 + p)
                src = accs if epi_loop else acc
                for p in range(rp):
                    for h in range(NT):
                        kb.tile_store(p * NT + h, src, (p * (OCn + 1) + h * 16) * L, L, 16, 64)
                for mode[0] in (("compute", "copy") if staged else ("compute",)):
                    epilogue(mb, s0, rp, rows, vecs, src, epi_loop)
                return
            # each channel's accumulators start at minus its zero-point correction (the
            # subtraction the AMX tiles' epilogue makes, one VPSUBD per vector, done once per
            # channel instead; the same wrapping int32 sums)
            for j in range(OCn):
                start = broadcast(-(a_corr * cb.flat(corr_index(mb * OCn + j))), L)
                for p in range(rp):
                    kb.store(acc, (p * (OCn + 1) + j) * L, start)
            if rowsum:
                for p in range(rp):
                    kb.store(acc, (p * (OCn + 1) + OCn) * L, zero)
            def taps(cq, kh):
                for kw in range(KW):
                    xv = [xp.vload(xaddr(cq, p, kh, kw), L) for p in range(rp)]
                    wbase = ((((gi * MB + mb) * Cq + cq) * KH + kh) * KW + kw) * OCn
                    for j in range(OCn):
                        wb = broadcast(wp.flat(wbase + j), L)
                        for p in range(rp):
                            q = (p * (OCn + 1) + j) * L
                            kb.store(acc, q, dot_acc(acc.vload(q, L), xv[p], wb, form.packing, form.isa))
                    if rowsum:
                        for p in range(rp):
                            q = (p * (OCn + 1) + OCn) * L
                            kb.store(acc, q, dot_acc(acc.vload(q, L), xv[p], ones, form.packing, form.isa))
            reduction(taps)
            src = acc
            if epi_loop:
                # the accumulators to a second local read at run-time offsets (``acc`` keeps
                # constant offsets only, so it stays in registers through the reduction)
                src = accs
                for q in range(rp * (OCn + 1)):
                    kb.store(accs, q * L, acc.vload(q * L, L))
            for mode[0] in (("compute", "copy") if staged else ("compute",)):
                epilogue(mb, s0, rp, rows, vecs, src, epi_loop)

        def epilogue(mb: Expr, s0, rp: int, rows, vecs, src, looped: bool):
            """The tile's epilogues (the current ``mode`` pass) from the accumulators in
            ``src``: unrolled over channels and pixel vectors, or (``looped``) a loop over the
            OCn channels with the RP pixel vectors unrolled in it (one copy of the epilogue
            code per pixel vector instead of RP*OCn: LLVM's time on large tiles with fused
            epilogues; a channel's constants still load once per tile)."""
            def channel_of(j):
                """(tile channel j's channel in the group, in Y)"""
                ocl = mb * OCn + j
                return ocl, (gi * M + ocl if G > 1 else ocl)

            def in_m(ocl, emit):
                """``emit()``, inside a test that channel ``ocl`` exists where the last channel
                block runs past M."""
                if M % OCn == 0:
                    emit()
                else:
                    with kb.if_(ocl < M):
                        emit()

            def corrected(p, j):
                """Pixel vector p of channel j's corrected int32 accumulators."""
                ocl, oc = channel_of(j)
                cix = corr_index(ocl)
                v = src.vload((p * (OCn + 1) + j) * L, L)
                if rowsum:
                    v = v + src.vload((p * (OCn + 1) + OCn) * L, L) * cb.flat(G * MBP + cix)
                if amx:          # tiles start at zero; register accumulators at -correction
                    v = v - a_corr * cb.flat(cix)
                if b is not None:
                    v = v + b.flat(oc).cast(i32)
                return v

            def packed(ps, j):
                """Whole pixel vectors ``ps`` (consecutive, contiguous in Y) of channel j: each
                through finish and the epilogue, the u8 / i8 results concatenated
                (:class:`~ir.kernel.Concat` "x86pack") and stored, or staged and copied, as one
                vector."""
                ocl, oc = channel_of(j)
                pix0 = oh0 * OW + (s0 + ps[0]) * L
                idx = PixelIndex([n, oc, as_expr(0), Ramp(pix0, len(ps) * L)], (OH, OW))

                def value():
                    parts = []
                    for p in ps:
                        pidx = (PixelIndex([n, oc, as_expr(0), Ramp(oh0 * OW + (s0 + p) * L, L)], (OH, OW)) if flat
                                else [n, oc, oh0 + rows[p], Ramp(vecs[p] * L, L)])
                        parts.append(ctx.apply_epilogue(finish(corrected(p, j), oc), pidx))
                    return concat(parts, "x86pack")
                in_m(ocl, lambda: put(idx, (j * RP + ps[0]) * L, len(ps) * L, value))

            def one(p, j):
                oh = oh0 + rows[p]
                ow0 = vecs[p] * L
                slot0 = (j * RP + p) * L                 # a channel's vectors consecutive
                ocl, oc = channel_of(j)
                v = corrected(p, j)

                def store(v=v, oc=oc, oh=oh, ow0=ow0, p=p, slot0=slot0):
                    if whole_vectors and mode[0] == "compute":
                        # every lane through finish and the epilogue once; the copy pass
                        # stores the row's lanes (runs, the row's tail) from the stage
                        idx = [n, oc, oh0 if flat else oh, Ramp(as_expr(0) if flat else ow0, L)]
                        kb.store(ystage, slot0, ctx.apply_epilogue(finish(v, oc), idx))
                        return
                    if contiguous:
                        # band position = flat pixel offset from row oh0: whole vectors as
                        # vectors, the band's last one in runs
                        base = (s0 + p) * L
                        valid = min(L, RB * OW - base)
                        pix = oh0 * OW + base
                        if valid == L:
                            idx = PixelIndex([n, oc, as_expr(0), Ramp(pix, L)], (OH, OW))
                            put(idx, slot0, L, lambda: ctx.apply_epilogue(finish(v, oc), idx))
                        elif valid > 0:
                            if mode[0] == "compute":
                                kb.store(lanes_buf, 0, v)
                            store_pixels(valid, oc, pix, slot0)
                        return
                    if flat:
                        # lanes at band positions r*COLS + ow: each row's run of lanes
                        if mode[0] == "compute":
                            kb.store(lanes_buf, 0, v)
                        base = (s0 + p) * L
                        for ro in range(base // COLS, min(RB, -(-(base + L) // COLS))):
                            a0 = max(base, ro * COLS)
                            a1 = min(base + L, ro * COLS + OW)
                            if a1 > a0:
                                store_run(a0 - base, a1 - a0, oc, oh0 + ro, as_expr(a0 - ro * COLS), slot0)
                        return

                    def vector_store():
                        idx = [n, oc, oh, Ramp(ow0, L)]
                        put(idx, slot0, L, lambda: ctx.apply_epilogue(finish(v, oc), idx))
                    if OW % L == 0:
                        vector_store()
                    else:
                        with kb.if_(ow0 + L <= OW) as whole:
                            vector_store()
                        with kb.else_(whole):        # the row's last vector
                            if mode[0] == "compute":
                                kb.store(lanes_buf, 0, v)
                            store_run(0, OW % L, oc, oh, ow0, slot0)
                in_m(ocl, store)

            def whole(p) -> bool:
                return not flat or min(L, RB * OW - (s0 + p) * L) == L

            def groups():
                """The tile's pixel vectors in runs that narrow together (4, 2 or 1)."""
                out, p = [], 0
                while p < rp:
                    k = next((k for k in (4, 2) if narrow_pack and p + k <= rp and all(whole(q) for q in range(p, p + k))), 1)
                    out.append(list(range(p, p + k)))
                    p += k
                return out

            def channel(j):
                for ps in groups():
                    if len(ps) > 1:
                        packed(ps, j)
                    else:
                        one(ps[0], j)
            if looped:
                with kb.loop(OCn, hint="j") as jv:
                    channel(jv)
            elif narrow_pack:
                for j in range(OCn):
                    channel(j)
            else:
                for p in range(rp):
                    for j in range(OCn):
                        one(p, j)

        def ctile(blk: Expr, q0: Expr, rp: int, ocv: int):
            """The channel layout's tile: band pixels q0 .. q0+rp-1 (row q // OW, column q % OW,
            consecutive across rows) x ``ocv`` vectors of L output channels from block ``blk``:
            per reduction step ocv weight vectors, rp broadcast input words and rp*ocv
            ``DotAcc``; then the tile transposed through ``ctr`` into one vector of rp pixels
            per channel, which the epilogue gets with a PixelIndex (Y's channel plane is
            contiguous, so the pixels store as one run whatever rows they cross)."""
            for t in range(rp * ocv):
                kb.store(cacc, t * L, zero)
            offs = []
            for p in range(rp):
                q = q0 + p
                r = q / OW if OW > 1 else q
                ow = q % OW if OW > 1 else as_expr(0)
                offs.append(r * (RS * KR * COLS) + ow)
            mb0 = blk * OCV

            def ctaps(cq, kh):
                for kw in range(KW):
                    kr = phases.index(kw * dw % sw)
                    toff = (kh * KS * KR + kr) * COLS + kw * dw // sw
                    wvs = [wp.vload(((((gi * MB + mb0 + j) * Cq + cq) * KH + kh) * KW + kw) * L, L)
                           for j in range(ocv)]
                    for p in range(rp):
                        xb = broadcast(xp.flat(pbase + cq * PL + offs[p] + toff), L)
                        for j in range(ocv):
                            t = (p * ocv + j) * L
                            kb.store(cacc, t, dot_acc(cacc.vload(t, L), xb, wvs[j], form.packing, form.isa))
            reduction(ctaps)
            # channel c's rp pixels at ctr[c * cstride:]
            in_registers = shuffled and not rp & (rp - 1)
            cstride = rp if in_registers else RP
            if in_registers:
                # transposed in registers: the rp pixel vectors of each channel vector
                # interleaved (log2(rp) levels of shuffles), so channel c's rp pixels are
                # consecutive, and stored as one run of whole vectors instead of lane by lane
                # (also a band's last, shorter tile where its pixels are a power of two)
                for j in range(ocv):
                    kb.store(ctr, j * L * rp, interleave([cacc.vload((p * ocv + j) * L, L) for p in range(rp)]))
            else:
                for p in range(rp):
                    for j in range(ocv):
                        kb.store(ctr, [Ramp(as_expr(j * L), L), as_expr(p)], cacc.vload((p * ocv + j) * L, L))
            pix0 = oh0 * OW + q0
            # the channels of the block that Y has (the last block of M % 16 != 0 channels
            # computes zero-weight lanes past M; they are not stored)
            nc = ocv * L if M % L == 0 else minimum(as_expr(ocv * L), M - mb0 * L)
            with kb.loop(nc, hint="c") as cc:
                oc = mb0 * L + cc
                v = ctr.vload(cc * cstride, rp) if rp > 1 else ctr.flat(cc * cstride)
                v = v - a_corr * cb.flat(oc)
                if b is not None:
                    v = v + b.flat(oc).cast(i32)
                idx = PixelIndex([n, oc, as_expr(0), Ramp(pix0, rp) if rp > 1 else pix0], (OH, OW))
                kb.store(y, idx, ctx.apply_epilogue(finish(v, oc), idx))

        if chan:
            b_lo = part * mb_per if SPLIT > 1 else as_expr(0)
            b_hi = minimum(b_lo + mb_per, as_expr(NBLK)) if SPLIT > 1 else as_expr(NBLK)
            nfull, rem = MB // OCV, MB % OCV

            def pixel_tiles(blk, ocv):
                full = slots // RP
                if full:
                    with kb.loop(full, hint="s", role="spatial") as st:
                        ctile(blk, st * RP, RP, ocv)
                if slots % RP:
                    ctile(blk, as_expr(full * RP), slots % RP, ocv)
            if nfull:
                with kb.loop(minimum(b_hi, as_expr(nfull)), start=b_lo, hint="mb", role="spatial") as blk:
                    pixel_tiles(blk, OCV)
            if rem:
                # the last block's fewer vectors
                with kb.if_((b_lo <= nfull) & (b_hi > nfull)):
                    pixel_tiles(as_expr(nfull), rem)
            return kb

        mb_lo = part * mb_per if SPLIT > 1 else as_expr(0)
        mb_hi = minimum(mb_lo + mb_per, as_expr(MB)) if SPLIT > 1 else as_expr(MB)
        if amx and gathered:
            # pixel tiles outside, channel blocks inside: each tile's B tiles gathered once
            def span(s0, rp: int):
                tile(None, s0, rp, compute=False)
                with kb.loop(mb_hi, start=mb_lo, hint="mb", role="spatial") as mb:
                    tile(mb, s0, rp, gather=False)
            full = slots // RP
            if flat:
                for st in range(full):
                    span(st * RP, RP)
                if slots % RP:
                    span(full * RP, slots % RP)
            else:
                if full:
                    with kb.loop(full, hint="s", role="spatial") as st:
                        span(st * RP, RP)
                if slots % RP:
                    span(as_expr(full * RP), slots % RP)
            kb.tile_release()
            return kb
        with kb.loop(mb_hi, start=mb_lo, hint="mb", role="spatial") as mb:
            full = slots // RP
            if flat:
                for st in range(full):
                    tile(mb, st * RP, RP)
                if slots % RP:
                    tile(mb, full * RP, slots % RP)
            else:
                if full:
                    with kb.loop(full, hint="s", role="spatial") as st:
                        tile(mb, st * RP, RP)
                if slots % RP:
                    tile(mb, as_expr(full * RP), slots % RP)
        if amx:
            kb.tile_release()
    return kb


# the depthwise schedule (registered after this one; it imports helpers from here)
from . import conv2d_int8_dw  # noqa: E402,F401
