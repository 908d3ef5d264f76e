"""The llvm backend's int8 schedule of depthwise 2-D convolutions (one input and one output
channel per group: ``group == C == M``, weights [C, 1, KH, KW]) with int32 accumulation:
schedule key ``"conv2d"``, name ``conv2d_int8_dw``, chosen over :mod:`.conv2d_int8` (which
runs depthwise convolutions group by group with one channel in each 4-byte dot product, 3 of
every 4 bytes zero) where it applies.

Where it applies: as :mod:`.conv2d_int8` (x u8/i8 [N, C, H, W] with a scalar zero point, w a
u8/i8 constant with a constant scalar or per-channel [C] zero point, 2-D, a target with an
integer dot product), and ``g * dw`` a multiple of ``sw`` (``g`` = 4 taps per int32 for
VPDPBUSD, 2 for VPMADDWD; so strides 1 and 2 at any dilation), at most 16 taps per kernel
row and 11 kernel rows.

Packing taps, not channels (the graph stays NCHW): an int32 lane holds ``g`` consecutive taps
of one kernel row of the same channel at one output pixel, zero-padded past KW, so a 3x3
kernel is KH * ceil(KW / g) = 3 ``DotAcc`` per output vector on VPDPBUSD (6 on VPMADDWD)
instead of 9.

- Weights: ``Wp [C, KH, NW]`` int32 (NW = ceil(KW / g) words per kernel row), word j of row kh
  holding w[c, kh, j*g .. j*g+g-1] offset as :mod:`.int8` says, 0 past KW; the corrections
  ``corr`` and ``d`` per channel (:func:`int8.offset_weights` with K = KH*KW).
- Activations: each parallel task takes one image, one channel and a band of ``band_rows``
  output rows, and packs the input rows the band reads into a panel ``Xp [NR, COLS]`` int32
  (on the thread's stack): column c of row r holds the ``g`` input columns
  ``c*sw - pw + t*dw`` (t < g) of input row ``oh0*sh - ph + r``, offset to u8 (or widened to
  i16), positions outside the image holding the zero point (which adds 0 through the
  correction). Word j of output column ow is then column ``ow + j*g*dw/sw``: one copy of the
  row serves every word and every stride 1 or 2 tap, and output columns ow .. ow+L-1 read L
  consecutive int32.
- Micro-kernel: ``dw_rows`` output rows x one vector of L output columns: per output row
  KH*NW vector loads of Xp (rows shared between output rows at stride 1) and DotAcc with the
  channel's broadcast weight words (loaded once per channel into a local). With some ``d``
  nonzero (u8 weights, a weight zero point) also the row sums of the real taps (a ``DotAcc``
  with a ones word that is 0 in the lanes past KW, whose x values are padding).
- Epilogue on registers, as :mod:`.conv2d_int8`: ``d * rowsum - a * corr`` (with
  ``a = xz + s``), the bias, the op's ``finish(acc, oc)``, ``ctx.apply_epilogue``, one vector
  store into a staging buffer of the band's output rows (on the stack), copied to Y once the
  band is done: with no store to Y among the tiles LLVM keeps the channel's scales, zero
  points and corrections in registers (Y may alias any other parameter as far as it knows,
  so it reloaded them, with the scale's division, for every vector). The vectors of a row
  run from its last to its first, so a last partial vector stored whole spills into columns
  the next row overwrites afterwards (knob ``dw_tail``).
- Input rows: first copied into byte rows with the padding (the zero point) in place, all
  the band's rows in one loop, then packed from them in a second loop in explicit vectors
  (contiguous loads at stride 1, even elements of two loads at stride 2), no bounds tests per
  column (one loop doing both let LLVM forward the bytes just stored through scalar
  registers: 96x112 stride 2 packed 1.6x slower).

The zero-point algebra is :mod:`.int8`'s (exact modulo 2**32; ONNX ConvInteger / QLinearConv).

Knobs: ``int8_lanes`` (16 or 8 output pixels per vector, as :mod:`.conv2d_int8` chooses it
for short rows), ``band_rows`` (a divisor of OH; larger bands repack fewer overlapping input
rows, the panel stays under :data:`DW_PANEL_BYTES` by default), ``dw_rows`` (output rows per
register tile, 1..8), ``dw_tail`` (``whole``: a row's last partial vector is computed and
stored whole into the band's staging buffer, its extra lanes overwritten by the next row;
``runs``: stored in pieces of 8, 4, 2, 1 lanes; only ``runs`` where the fused epilogue reads
a tensor other than scalars, which ``whole`` would read past a row, or stores a side output:
:func:`int8.epilogue_whole_vectors_ok`).
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import Expr, KernelBuilder, Load, Ramp, as_expr, binop, broadcast, dot_acc
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from . import int8
from .conv2d_int8 import _divisors, _form_for

#: default bound of a task's packed panel (one channel's band: L1-resident while its rows are
#: read KH times)
DW_PANEL_BYTES = 32 * 1024
#: largest kernel the schedule takes (kernel rows; taps per row are bounded by MAX_WORDS)
MAX_KH = 11
#: most int32 words per kernel row
MAX_WORDS = 4
#: above :mod:`.conv2d_int8`'s plevel (40)
PLEVEL = 45


def _words(kw: int, g: int) -> int:
    return -(-kw // g)


def dw_int8_applies(ctx: LowerCtx, *, x, w, y, group, geo, acc_dtype, x_zero=None, w_zero=None, **_) -> bool:
    """Module docstring: a depthwise (``group == C == M``) u8/i8 convolution with constant
    weights and weight zero point, a scalar x zero point, int32 accumulation, and strides the
    packed taps serve (``g * dw % sw == 0``)."""
    if not (acc_dtype == DType.i32 and x.dtype in int8.QUANT and w.dtype in int8.QUANT and geo.rank == 2):
        return False
    C = x.shape[1]
    if not (group == C and y.shape[1] == C and w.shape[1] == 1 and C > 1):
        return False
    forms = int8.dot_forms(ctx.target)
    if not forms or int8.const_input(ctx, w) is None:
        return False
    if w_zero is not None and int8.const_input(ctx, w_zero) is None:
        return False
    if x_zero is not None and x_zero.numel != 1:
        return False
    g = forms[0].per_lane
    (KH, KW), (sh, sw), (dh, dw) = geo.kernel, geo.strides, geo.dilations
    return KH <= MAX_KH and _words(KW, g) <= MAX_WORDS and (g * dw) % sw == 0


@register_schedule("conv2d", "llvm", "conv2d_int8_dw", plevel=PLEVEL, applies=dw_int8_applies)
def emit_conv_int8_dw(ctx: LowerCtx, *, x, w, b, y, group, geo, x_zero=None, w_zero=None, hooks=(), params=None,
                      **_) -> KernelBuilder:
    """Depthwise integer convolution with the taps of a kernel row packed into each dot
    product (module docstring); one kernel. ``hooks``' last entry is ``finish(acc, oc)``
    (None: the int32 value cast to Y's dtype)."""
    finish = hooks[-1] if hooks and hooks[-1] is not None else (lambda v, oc: v.cast(y.dtype))
    i32 = DType.i32
    N, C, H, W = x.shape
    (KH, KW), (sh, sw), (dh, dw), (ph, pw) = geo.kernel, geo.strides, geo.dilations, geo.pads_begin
    OH, OW = geo.out_shape
    form = _form_for(ctx, OW)
    L, g = form.lanes, form.per_lane
    NW = _words(KW, g)
    joff = g * dw // sw                       # panel columns between consecutive words
    nvw = -(-OW // L)
    nfull = OW // L                           # whole vectors per output row
    COLS = nvw * L + (NW - 1) * joff

    def nrows(rb: int) -> int:
        return (rb - 1) * sh + (KH - 1) * dh + 1
    cands = [d for d in _divisors(OH) if d == 1 or 4 * nrows(d) * COLS <= 8 * DW_PANEL_BYTES]
    fit = [d for d in cands if 4 * nrows(d) * COLS <= DW_PANEL_BYTES]
    RB = knob("band_rows", cands, max(fit) if fit else 1, doc="output rows per parallel task (its packed panel)")
    RR = knob("dw_rows", list(range(1, min(8, RB) + 1)), min(4, RB), doc="output rows per register tile")
    NR = nrows(RB)
    bands = OH // RB

    # ---- weights, packed at compile time
    wv = int8.const_input(ctx, w).reshape(C, KH * KW)
    wz = int8.const_input(ctx, w_zero)
    pw_ = int8.offset_weights(wv, wz, form, w.dtype)
    rowsum = pw_.need_rowsum
    wt = np.zeros((C, KH, NW * g), np.int64)
    wt[:, :, :KW] = pw_.w_p.reshape(C, KH, KW)
    wp = ctx.pack(int8.pack_lanes(wt.reshape(C, KH, NW, g), form), "wint8")      # [C, KH, NW]
    corr = np.zeros((2, C), np.int32)
    corr[0] = pw_.corr
    corr[1] = int8.wrap32(pw_.d)
    cb = ctx.pack(corr, "wcorr")
    base = params if params is not None else ctx.default_params()
    params_ = [p for p in base if p is not w] + [wp, cb]
    kb = ctx.kernel(params=params_)
    kb.kernel.comment += (f"  [int8 depthwise {form.isa} {form.packing} x{L}: {NW} word(s) per kernel row, "
                          f"tile {RR} rows x 1 vector, band {RB} rows, panel {[NR, COLS]}]")
    xp = kb.local(i32, (NR * COLS,), hint="xpanel")
    wl = kb.local(i32, (KH * NW,), hint="wwords")
    lanes_buf = kb.local(i32, (L,), hint="lanes")
    # the band's results, copied to Y after its tiles: with no store to Y among them, LLVM
    # keeps the per-channel values that the epilogue loads (scales, zero points, corrections)
    # in registers instead of reloading them per vector (Y may alias any parameter for it)
    # with an epilogue that reads no other tensor, a row's last vector is computed and stored
    # whole: its lanes past OW land on the next row's first columns (or the stage's slack),
    # which that row's own first vector overwrites later (the vectors of a row run from the
    # last to the first); else its lanes are stored in runs
    tails = ["whole", "runs"] if int8.epilogue_whole_vectors_ok(ctx, y) else ["runs"]
    whole = knob("dw_tail", tails, tails[0], doc="a row's last partial vector stored whole (into the stage) or in runs") == "whole"
    ystage = kb.local(y.dtype, (RB * OW + L,), hint="ystage")
    s_off = int8.activation_offset(form, x.dtype)
    mask = (1 << form.bits) - 1

    def xu(v: Expr) -> Expr:
        e = v.cast(i32) + s_off if s_off else v.cast(i32)
        return e & mask

    def packed(vals: list) -> Expr:
        out = None
        for t, v in enumerate(vals):
            term = v if t == 0 else binop("shl", v, as_expr(t * form.bits, i32))
            out = term if out is None else out | term
        return out

    # the ones words of the row sums: 1 in the taps of the kernel, 0 past KW
    ones_w = []
    for j in range(NW):
        o = np.array([[1 if j * g + t < KW else 0 for t in range(g)]], np.int64)
        ones_w.append(broadcast(as_expr(int(int8.pack_lanes(o, form)[0]), i32), L))
    zero = broadcast(as_expr(0, i32), L)

    # the padded input row in x's dtype: position p holds input column p - pw (the zero point
    # outside the row); panel column c's taps are positions c*sw + t*dw
    BL = (COLS - 1) * sw + (g - 1) * dw + 1
    c_lo, c_hi = min(pw, BL), min(max(pw + W, 0), BL)          # positions copied from x: [c_lo, c_hi)
    xb = kb.local(x.dtype, (NR * BL + 2 * L,), hint="xrows")

    def copy_run(dst, doff, src, soff, n: int, ch: int = 0):
        """dst[doff + i] = src(soff + i) for i < n (n static): vectors of ``ch`` elements (64
        bytes by default) in a loop, then constant pieces of half as many, ... 1 (short rows:
        no scalar loop)."""
        ch = ch or max(1, 64 // dst.dtype.itemsize)
        full = n // ch
        if full == 1:
            kb.store(dst, doff, src(soff, ch))
        elif full > 1:
            with kb.loop(full, hint="cp") as k:
                kb.store(dst, doff + k * ch, src(soff + k * ch, ch))
        off = full * ch
        while off < n:
            wd = 1 << ((n - off).bit_length() - 1)
            kb.store(dst, doff + off, src(soff + off, wd))
            off += wd

    ntasks = N * C * bands
    with kb.loop(ntasks, kind="parallel", hint="task") as task:
        nc = task / bands if bands > 1 else task            # image x channel
        band = task % bands if bands > 1 else as_expr(0)
        c = nc % C
        oh0 = band * RB
        zx = x_zero.flat(0) if x_zero is not None else as_expr(0, x.dtype)
        a_corr = zx.cast(i32) + s_off
        # ---- the channel's weight words, its corrections and bias
        with kb.loop(KH * NW, hint="wk") as q:
            kb.store(wl, q, wp.flat(c * (KH * NW) + q))
        # ---- the band's input rows: first into padded byte rows (one loop), then packed
        # from them (a second loop: LLVM cannot forward the bytes just stored through scalar
        # registers, which it did for a row copied and packed in one unrolled block)
        with kb.loop(NR, hint="r") as r:
            ih = oh0 * sh - ph + r
            xrow = (nc * H + ih) * W
            rb_ = r * BL
            with kb.if_((ih >= 0) & (ih < H)) as inside:
                if c_lo:
                    copy_run(xb, rb_, lambda o, n: broadcast(zx, n) if n > 1 else zx, 0, c_lo)
                if c_hi > c_lo:
                    copy_run(xb, rb_ + c_lo, lambda o, n: x.vload(o, n) if n > 1 else x.flat(o), xrow + c_lo - pw,
                             c_hi - c_lo)
                if BL > c_hi:
                    copy_run(xb, rb_ + c_hi, lambda o, n: broadcast(zx, n) if n > 1 else zx, 0, BL - c_hi)
            with kb.else_(inside):
                copy_run(xb, rb_, lambda o, n: broadcast(zx, n) if n > 1 else zx, 0, BL)
        with kb.loop(NR, hint="r") as r:
            rowbase = r * COLS
            rb_ = r * BL
            mid = 0
            if sw <= 2 and COLS >= L:
                # explicit vectors: L consecutive panel columns from g loads of the byte row
                # (contiguous, or the even elements of two loads at stride 2)
                nvec = COLS // L
                with kb.loop(nvec, hint="cv") as cv:
                    col0 = cv * L
                    vals = [xu(Load(xb, rb_ + col0 * sw + t * dw, L, sw)) for t in range(g)]
                    kb.store(xp, rowbase + col0, packed(vals))
                mid = nvec * L
            if COLS > mid:
                with kb.loop(COLS, start=mid, kind="vectorize", hint="c") as col:
                    vals = [xu(xb.flat(rb_ + col * sw + t * dw)) for t in range(g)]
                    kb.store(xp, rowbase + col, packed(vals))

        # ---- the tiles: rows r0 .. r0+rr-1 of the band, output columns ow0 .. ow0+L-1
        def store_run(lane0: int, length: int, oh: Expr, ow0: Expr):
            off = 0
            while off < length:
                wd = 1 << ((length - off).bit_length() - 1)
                val = lanes_buf.vload(lane0 + off, wd) if wd > 1 else lanes_buf[lane0 + off]
                idx = [nc / C if N > 1 else as_expr(0), c, oh0 + oh, Ramp(ow0 + off, wd) if wd > 1 else ow0 + off]
                kb.store(ystage, oh * OW + ow0 + off, ctx.apply_epilogue(finish(val, c), idx))
                off += wd

        def tile(r0: Expr, rr: int, ow0: Expr, partial: bool):
            wb = [[broadcast(wl[kh * NW + j], L) for j in range(NW)] for kh in range(KH)]
            for i in range(rr):
                acc, rs = zero, zero
                for kh in range(KH):
                    for j in range(NW):
                        xv = xp.vload((r0 * sh + (i * sh + kh * dh)) * COLS + ow0 + j * joff, L)
                        acc = dot_acc(acc, xv, wb[kh][j], form.packing, form.isa)
                        if rowsum:
                            rs = dot_acc(rs, xv, ones_w[j], form.packing, form.isa)
                v = acc
                if rowsum:
                    v = v + rs * cb.flat(C + c)
                v = v - a_corr * cb.flat(c)
                if b is not None:
                    v = v + b.flat(c).cast(i32)
                oh = r0 + i                              # the band's row
                if not partial:
                    idx = [nc / C if N > 1 else as_expr(0), c, oh0 + oh, Ramp(ow0, L)]
                    kb.store(ystage, oh * OW + ow0, ctx.apply_epilogue(finish(v, c), idx))
                else:
                    kb.store(lanes_buf, 0, v)
                    store_run(0, OW % L, oh, ow0)

        def row_tiles(r0: Expr, rr: int):
            if OW % L:
                tile(r0, rr, as_expr(nfull * L), not whole)
            if nfull == 1:
                tile(r0, rr, as_expr(0), False)
            elif nfull:
                with kb.loop(nfull, hint="v", role="spatial") as vv:
                    tile(r0, rr, (nfull - 1 - vv) * L, False)

        nt = RB // RR
        if nt == 1:
            row_tiles(as_expr(0), RR)
        elif nt:
            with kb.loop(nt, hint="rt", role="spatial") as rt:
                row_tiles(rt * RR, RR)
        if RB % RR:
            row_tiles(as_expr(nt * RR), RB % RR)
        # ---- the band's rows to Y (contiguous: RB whole rows of one channel plane)
        copy_run(y, (nc * OH + oh0) * OW, lambda o, n: ystage.vload(o, n) if n > 1 else ystage.flat(o), 0, RB * OW,
                 max(L, 64 // y.dtype.itemsize) if y.dtype.itemsize == 1 else L)
    return kb
