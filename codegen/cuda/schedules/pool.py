"""cuda schedules of the global pools: a block per contiguous NCHW plane
(``ir.ops.pool.emit_global_pool``, key ``"global_pool"``: GlobalAveragePool, GlobalMaxPool,
GlobalLpPool) and a block per (image, channel tile) for channels-last planes
(``ir.ops.layout_nhwc.emit_global_pool_nhwc``, key ``"global_pool_nhwc"``).
"""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import LaunchShape, as_expr, maxnum, minimum
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.ops.pool import _global_finish, _global_step, _global_store, _max_init
from tensorfuse.ir.strategy import register_schedule

from .blocks import block_reduce, block_row_reduce, block_strided, block_threads_knob, pow2_range, use_block_rows


def _plane_ok(ctx, x, y, kind, p, acc_dt, params) -> bool:
    return use_block_rows(math.prod(x.shape[2:]))


@register_schedule("global_pool", "cuda", "global_pool_block_per_plane", plevel=10, applies=_plane_ok)
def global_pool_planes(ctx, x, y, kind: str, p: int, acc_dt, params):
    """``emit_global_pool`` on cuda for planes of at least ``blocks.BLOCK_ROW_MIN`` elements: a
    thread block per contiguous (n, c) plane (block-stride), each thread folding a strided part
    (coalesced across the block), the partials combined in shared memory
    (:func:`.blocks.block_row_reduce`: maxNum for "max", NaN skipped as on the CPU; sums for
    "avg" and "lp", in ``acc_dt``), then thread 0 finishes (mean, p-th root), applies the
    epilogue and stores. Knob ``block_threads``."""
    n_, c_ = x.shape[:2]
    plane = math.prod(x.shape[2:])
    T = block_threads_knob(plane, ctx.target)
    kb = ctx.kernel(params=params)
    sh = kb.shared(acc_dt, (T,), hint="red")
    part = kb.local(acc_dt, (1,), hint="part")
    tot = kb.local(acc_dt, (1,), hint="tot")
    with kb.loop(n_ * c_, kind="blockIdx.x", hint="nc") as nc:
        def step(a, i):
            return _global_step(kind, p, acc_dt, a, x.flat(nc * plane + i).cast(acc_dt))
        init = as_expr(_max_init(acc_dt) if kind == "max" else 0, acc_dt)
        block_row_reduce(kb, sh, part, T, plane, init, step,
                         maxnum if kind == "max" else (lambda a, b: a + b), tot)
        with kb.loop(T, kind="threadIdx.x", hint="t") as t:
            with kb.if_(t.eq(0)):
                _global_store(ctx, kb, y, x, nc, c_, _global_finish(kind, p, plane, acc_dt, tot[0]))
    kb.kernel.launch = LaunchShape((max(1, min(n_ * c_, ctx.target.max_blocks)),), (T,))
    kb.kernel.comment += f"  [cuda: a block of {T} threads per plane, shared-memory reduction]"
    return kb


#: the cuda channels-last global pool: at most this many channels per block by default (a
#: warp's worth, so each row of loads is contiguous), threads per block at most by default,
#: and the smallest plane it takes (lower than the row schedules' 64: its threads over
#: channels are never idle, and a 7x7 plane of 512 channels would otherwise run 512 threads
#: in all)
GLOBAL_POOL_CHANNELS = 32
GLOBAL_POOL_THREADS = 256
GLOBAL_POOL_MIN_PLANE = 16


def _nhwc_ok(ctx, x, y, kind, acc_dt) -> bool:
    return x.shape[1] * x.shape[2] >= GLOBAL_POOL_MIN_PLANE


@register_schedule("global_pool_nhwc", "cuda", "global_pool_nhwc_channel_tiles", plevel=10, applies=_nhwc_ok)
def global_pool_nhwc(ctx, x, y, kind: str, acc_dt):
    """``emit_global_pool_nhwc`` on cuda. The H*W positions of one channel lie C apart, so a
    block takes a tile of CT channels (the smallest power of two >= C, at most the knob
    ``channels_per_block``, default 32) of one image, and its threads form RT rows (knob
    ``threads_per_block`` / CT, default 256 / CT, at most the largest power of two <= H*W):
    thread (r, cc) folds positions r, r+RT, ... of channel c0+cc, so each row of the block
    reads CT consecutive channels (coalesced). The RT partials per channel meet in shared memory
    (:func:`.blocks.block_reduce` down to CT values: maxNum for "max", NaN skipped as in the
    CPU kernel, sums for "avg", accumulated in ``acc_dt``); the first CT threads divide (avg),
    apply the epilogue and store. Block-stride over (n, channel tile)."""
    n_, h_, w_, c_ = x.shape
    plane = h_ * w_
    cmax = knob("channels_per_block", pow2_range(8, 64), GLOBAL_POOL_CHANNELS, doc="most channels of a block's tile")
    CT = 1
    while CT < min(c_, cmax):
        CT *= 2
    threads_max = knob("threads_per_block", [t for t in pow2_range(64, ctx.target.max_threads_per_block) if t >= CT],
                       GLOBAL_POOL_THREADS, doc="most threads per block (channels x position rows)")
    RT = max(1, threads_max // CT)
    while RT > plane:
        RT //= 2
    T = CT * RT
    ctn = -(-c_ // CT)
    kb = ctx.kernel()
    sh = kb.shared(acc_dt, (T,), hint="red")
    part = kb.local(acc_dt, (1,), hint="part")
    comb = maxnum if kind == "max" else (lambda a, b: a + b)

    def threads():
        return kb.loop(T, kind="threadIdx.x", hint="t")

    with kb.loop(n_ * ctn, kind="blockIdx.x", hint="blk") as blk:
        n = blk / ctn if ctn > 1 else blk
        c0 = (blk % ctn) * CT if ctn > 1 else as_expr(0)
        with threads() as t:
            c = minimum(c0 + t % CT, c_ - 1)       # a channel past C reads a real one, unstored
            kb.store(part, 0, as_expr(float("nan") if kind == "max" else 0.0, acc_dt))

            def step(hw):
                xv = x.flat((n * plane + hw) * c_ + c)
                kb.store(part, 0, maxnum(part[0], xv) if kind == "max" else part[0] + xv.cast(acc_dt))
            block_strided(kb, RT, t / CT, plane, step)
            kb.store(sh, t, part[0])
        block_reduce(kb, sh, T, comb, keep=CT)
        with threads() as t:
            c = c0 + t
            with kb.if_((t < CT) & (c < c_)):
                v = sh[t]
                if kind == "avg":
                    v = v / as_expr(float(plane), acc_dt)
                idx = [n, as_expr(0), as_expr(0), c]
                kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
        kb.barrier()                          # sh read before the next tile's partials
    kb.kernel.launch = LaunchShape((max(1, min(n_ * ctn, ctx.target.max_blocks)),), (T,))
    kb.kernel.comment += f"  [cuda: blocks of {CT} channels x {RT} position rows, shared-memory reduction]"
    return kb
