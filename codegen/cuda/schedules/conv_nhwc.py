"""cuda schedules of the channels-last convolution (``ir.ops.layout_nhwc.emit_conv_nhwc``,
schedule key ``"conv2d_nhwc"``; ConvNHWC and FusedConvNHWC): an implicit GEMM through
shared-memory tiles, and a depthwise schedule with the block's weights in shared memory.
Every other conv (few channels, 1-channel groups of a channel multiplier, tiny images) keeps
the generic form, one GPU thread per output element with its whole reduction serial.

The two schedules never apply to the same conv (the GEMM needs at least 16 output channels
per group, the depthwise one exactly one).
"""
from __future__ import annotations

from tensorfuse.ir.kernel import LaunchShape, as_expr, maximum, minimum, select
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.ops.conv import window_hi, window_lo
from tensorfuse.ir.ops.layout_nhwc import _acc_dtype, _conv_dims
from tensorfuse.ir.strategy import register_schedule

from .blocks import block_strided, pow2_range, unravel
from .gemm import gemm_knobs, tiled_gemm

#: the implicit-GEMM schedule applies when the GEMM of one group fills its default square
#: output tile: output pixels N*OH*OW, output channels per group M/group and K = KH*KW*C/group
#: all at least this (a smaller extent would leave most of a tile's threads idle or its K
#: slice mostly zeros)
CONV_TILE = 16
#: the depthwise schedule: channels per block by default (one warp's worth of consecutive
#: channels, so its loads and stores coalesce), threads per block by default, and the most
#: shared memory its [KH, KW, channel tile] weight tile may take at the default channel tile
#: for the schedule to apply (larger kernels keep the generic form)
DEPTHWISE_CHANNELS = 32
DEPTHWISE_THREADS = 256
DEPTHWISE_SHARED_BYTES = 16 * 1024


def _clamp(e, hi: int):
    """``e`` clamped to 0..hi (an in-range index for a load whose value a select may drop)."""
    return maximum(minimum(e, hi), 0)


def _tiled_ok(ctx, x, w, b, y, group, geo) -> bool:
    (n_, h_, w_, c_), (kh_, kw_, cg, m_), (oh_, ow_), mg, acc_dt, *_ = _conv_dims(x, w, group, geo)
    P, K = n_ * oh_ * ow_, kh_ * kw_ * cg
    return P >= CONV_TILE and mg >= CONV_TILE and K >= CONV_TILE


@register_schedule("conv2d_nhwc", "cuda", "conv2d_nhwc_implicit_gemm", plevel=10, applies=_tiled_ok)
def conv_tiled(ctx, x, w, b, y, group: int, geo):
    """ConvNHWC on cuda as an implicit GEMM (:func:`.gemm.tiled_gemm`: block tiles, per-thread
    register tiles, double-buffered shared-memory K slices, split-K for small grids; knobs
    ``tile``, ``thread_tile``, ``k_slice``, ``split_k``): per group g, A [P, K] with rows the
    output pixels p = (n, oh, ow) flattened and columns k = (kh, kw, ic) (ic innermost),
    gathered im2col-style from x [N, H, W, C] (zero outside the input: pads, any stride and
    dilation); B [K, M/group] = w[kh, kw, ic, g*M/group + j], which for the HWIO layout is w's
    memory read as a row-major [K, M] matrix. Consecutive threads load consecutive k of a pixel
    (consecutive channels of x) and consecutive output channels of w: coalesced. Each output's
    accumulator (f32 for f16/bf16) gets the bias, then ``ctx.apply_epilogue`` (folded BatchNorm
    arrives as bias and scaled weights; activation, residual Z), before its one store (after the
    split-K sum when K is split)."""
    (n_, h_, w_, c_), (kh_, kw_, cg, m_), (oh_, ow_), mg, acc_dt, (sh, sw), (dh, dw), (ph, pw) = \
        _conv_dims(x, w, group, geo)
    P, K = n_ * oh_ * ow_, kh_ * kw_ * cg
    cfg = gemm_knobs(ctx.target, acc_dt, P, mg, K, group, conv=True)
    inside_always = not any((ph, pw, geo.pads_end[0], geo.pads_end[1])) and \
        (oh_ - 1) * sh + (kh_ - 1) * dh < h_ and (ow_ - 1) * sw + (kw_ - 1) * dw < w_

    def group_of(bidx):
        return bidx[0] if group > 1 else as_expr(0)

    def load_a(bidx, i, k):
        n, oh, ow = unravel(i, [n_, oh_, ow_])
        kh, kw, ic = unravel(k, [kh_, kw_, cg])
        ih, iw = oh * sh - ph + kh * dh, ow * sw - pw + kw * dw
        c = group_of(bidx) * cg + ic if group > 1 else ic
        v = x[[n, ih, iw, c]].cast(acc_dt)
        if inside_always:
            return v                      # every tap inside the input
        # padding: zero outside; the GEMM's lazy select skips the load there (no clamping)
        return v, (ih >= 0) & (ih < h_) & (iw >= 0) & (iw < w_)

    def load_b(bidx, k, j):
        return w.flat(k * m_ + (group_of(bidx) * mg + j if group > 1 else j)).cast(acc_dt)

    def store(kb, bidx, i, j, v):
        n, oh, ow = unravel(i, [n_, oh_, ow_])
        oc = group_of(bidx) * mg + j if group > 1 else j
        if b is not None:
            v = v + b[oc].cast(acc_dt)
        idx = [n, oh, ow, oc]
        kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))

    tiled_gemm(ctx, P, mg, K, (group,) if group > 1 else (), load_a, load_b, store, acc_dt, cfg,
               what=f"  [implicit GEMM {P}x{mg}x{K}" + (f", {group} groups]" if group > 1 else "]"))
    return ctx.kernels[-1]


def _depthwise_ok(ctx, x, w, b, y, group, geo) -> bool:
    (n_, h_, w_, c_), (kh_, kw_, cg, m_), _, mg, acc_dt, *_ = _conv_dims(x, w, group, geo)
    return group > 1 and cg == 1 and mg == 1 and \
        kh_ * kw_ * min(DEPTHWISE_CHANNELS, c_) * acc_dt.itemsize <= DEPTHWISE_SHARED_BYTES


@register_schedule("conv2d_nhwc", "cuda", "conv2d_nhwc_depthwise", plevel=10, applies=_depthwise_ok)
def conv_depthwise(ctx, x, w, b, y, group: int, geo):
    """Depthwise ConvNHWC (group == C == M) on cuda: one thread per output (pixel, channel),
    channels innermost so neighbouring threads load neighbouring channels of x and w and store
    neighbouring channels of y (coalesced). A block covers CT = min(``channels_per_block``, C)
    channels times ``threads_per_block`` / CT pixels (block-stride over channel tiles x pixel
    tiles); its weights w[:, :, 0, channel tile] are staged once into shared memory
    ([KH*KW, CT], acc dtype), then each thread sums the taps inside the input (ranges clamped,
    as the generic form) in tap order, adds the bias and applies ``ctx.apply_epilogue`` before
    its one store. Knobs: ``channels_per_block`` (8..64, default 32; those whose weight tile
    fits the target's shared memory), ``threads_per_block`` (64..1024, default 256)."""
    n_, h_, w_, c_ = x.shape
    kh_, kw_, _, m_ = w.shape
    oh_, ow_ = geo.out_shape
    acc_dt = _acc_dtype(x.dtype)
    (sh, sw), (dh, dw), (ph, pw) = geo.strides, geo.dilations, geo.pads_begin
    P, taps = n_ * oh_ * ow_, kh_ * kw_
    cts = [ct for ct in pow2_range(8, 64)
           if taps * min(ct, c_) * acc_dt.itemsize <= ctx.target.max_shared_bytes and (ct <= c_ or ct // 2 < c_)]
    CT = min(knob("channels_per_block", cts, DEPTHWISE_CHANNELS, doc="channels of a block's tile"), c_)
    NTK = knob("threads_per_block", pow2_range(64, ctx.target.max_threads_per_block), DEPTHWISE_THREADS,
               doc="threads per block (channels x pixels)")
    PT = max(1, min(NTK // CT, P))
    NT = CT * PT
    ctn, ptn = -(-c_ // CT), -(-P // PT)
    kb = ctx.kernel()
    wsh = kb.shared(acc_dt, (taps * CT,), hint="wt")
    acc = kb.local(acc_dt, (1,), hint="acc")
    zero = as_expr(0, acc_dt)

    def threads():
        return kb.loop(NT, kind="threadIdx.x", hint="t")

    with kb.loop(ctn * ptn, kind="blockIdx.x", hint="blk") as blk:
        c0 = (blk / ptn) * CT if ctn > 1 else as_expr(0)
        p0 = (blk % ptn) * PT if ctn > 1 else blk * PT
        with threads() as t:
            def stage(e):
                ch = c0 + e % CT
                v = w.flat((e / CT) * m_ + minimum(ch, c_ - 1)).cast(acc_dt)
                kb.store(wsh, e, v if c_ % CT == 0 else select(ch < c_, v, zero))
            block_strided(kb, NT, t, taps * CT, stage)
        kb.barrier()
        with threads() as t:
            cc = t % CT
            c, p = c0 + cc, p0 + t / CT
            with kb.if_((c < c_) & (p < P)):
                n, oh, ow = unravel(p, [n_, oh_, ow_])
                kb.store(acc, 0, zero)
                ih0, iw0 = oh * sh - ph, ow * sw - pw
                with kb.reduce(window_hi(h_ - ih0, dh, kh_), start=window_lo(-ih0, dh), hint="kh") as kh:
                    with kb.reduce(window_hi(w_ - iw0, dw, kw_), start=window_lo(-iw0, dw), hint="kw") as kw:
                        xv = x[[n, ih0 + kh * dh, iw0 + kw * dw, c]].cast(acc_dt)
                        kb.store(acc, 0, acc[0] + xv * wsh[(kh * kw_ + kw) * CT + cc])
                v = acc[0]
                if b is not None:
                    v = v + b[c].cast(acc_dt)
                idx = [n, oh, ow, c]
                kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
        kb.barrier()                      # every thread has read the weights before the next tile's
    kb.kernel.launch = LaunchShape((max(1, min(ctn * ptn, ctx.target.max_blocks)),), (NT,))
    kb.kernel.comment += f"  [cuda depthwise: blocks of {CT} channels x {PT} pixels, shared-memory weights]"
    return kb
