"""The cuda shared-memory GEMM (:func:`tiled_gemm`) and its knobs (:func:`gemm_knobs`): the
building block of the MatMul/Gemm schedule and of the implicit-GEMM ConvNHWC schedule
(``conv_nhwc.py``). Registers nothing itself.

Knobs (declared by :func:`gemm_knobs`, defaults the schedule's fixed values before knobs):

- ``tile``: the side T of a block's square output tile (8, 16, 32, 64; default 16);
- ``thread_tile``: R, each thread computes R x R outputs of the tile, at rows ``ty + a T/R``
  and columns ``tx + b T/R`` (1, 2, 4; default 1), so a block has (T/R)^2 threads (at most the
  target's ``max_threads_per_block``);
- ``k_slice``: KT, the K extent of the A [T, KT] and B [KT, T] slices staged through shared
  memory per step (8, 16, 32; default T; 2 T KT elements of the accumulator dtype must fit
  the target's ``max_shared_bytes``).
"""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import LaunchShape, as_expr, minimum, select
from tensorfuse.ir.knobs import knob

from .blocks import pow2_range, unravel

#: the square output tile of the cuda matmul schedule: a block of MATMUL_TILE^2 threads, one
#: output element each, A and B staged through shared memory in MATMUL_TILE-wide K slices
MATMUL_TILE = 16


def gemm_knobs(target, acc) -> tuple[int, int, int]:
    """Declare the knobs ``tile``, ``thread_tile`` and ``k_slice`` (module doc) of a tiled GEMM
    accumulating in dtype ``acc`` and return their values (T, R, KT). Defaults: (16, 1, 16).
    Candidates that the target cannot launch (too many threads, too much shared memory) are
    left out, so every candidate runs."""
    T = knob("tile", (8, 16, 32, 64), MATMUL_TILE, doc="side of a block's square output tile")
    rs = [r for r in (1, 2, 4) if r <= T // 2 and (T // r) ** 2 <= target.max_threads_per_block]
    R = knob("thread_tile", rs, 1 if 1 in rs else rs[0], doc="outputs per thread along each side of the tile")
    ks = [k for k in pow2_range(8, 32) if 2 * T * k * acc.itemsize <= target.max_shared_bytes]
    KT = knob("k_slice", ks, T if T in ks else ks[-1], doc="K extent of the A and B slices staged in shared memory")
    return T, R, KT


def tiled_gemm(ctx, kb, M: int, N: int, K: int, batch, load_a, load_b, store, acc, T: int = MATMUL_TILE,
               R: int = 1, KT: int | None = None) -> None:
    """The cuda shared-memory GEMM schedule, into the empty kernel of ``kb``:
    ``store(bidx, i, j, sum over k of load_a(bidx, i, k) * load_b(bidx, k, j))`` for every
    ``bidx`` over ``batch`` (a shape; () for none), i < M, j < N.

    A thread block per T x T output tile (block-stride over batch x tiles, so any grid cap is
    fine) of (T/R)^2 threads, R x R outputs per thread; the K dimension runs in slices of KT
    (default T), each slice of A [T rows, KT k] and B [KT k, T cols] staged through shared
    memory (``acc`` dtype, 2 T KT elements) with zeros beyond M, N and K; one accumulator per
    output summing k in order; ``store`` only for i < M and j < N. ``load_a``/``load_b`` get
    in-range indices (they are clamped before the call) and return Exprs of dtype ``acc``;
    they may gather (an implicit GEMM's im2col loads) and return zero themselves for padding.
    Sets the kernel's launch shape. T, R and KT powers of two, R <= T. Used by MatMul/Gemm
    and ConvNHWC (``conv_nhwc.py``)."""
    KT = T if KT is None else KT
    if R == 1 and KT == T:
        return _tiled_gemm_square(ctx, kb, M, N, K, batch, load_a, load_b, store, acc, T)
    mt, nt = -(-M // T), -(-N // T)
    nb = math.prod(batch) if batch else 1
    TR = T // R                      # threads along each side of the tile
    NT = TR * TR
    sa = kb.shared(acc, (T * KT,), hint="ta")
    sb = kb.shared(acc, (KT * T,), hint="tb")
    part = kb.local(acc, (R * R,), hint="acc")
    zero = as_expr(0, acc)

    def threads():
        return kb.loop(NT, kind="threadIdx.x", hint="t")

    def staged(t, n, body):
        """body(e) for the elements e < n of a slice that thread t loads (n a power of two)."""
        if n <= NT:
            if n == NT:
                body(t)
            else:
                with kb.if_(t < n):
                    body(t)
        else:
            with kb.loop(n // NT, hint="e") as r:
                body(r * NT + t)

    with kb.loop(nb * mt * nt, kind="blockIdx.x", hint="blk") as blk:
        tile = blk % (mt * nt) if nb > 1 else blk
        bidx = unravel(blk / (mt * nt), list(batch)) if batch else []
        i0 = (tile / nt) * T if nt > 1 else tile * T
        j0 = (tile % nt) * T if nt > 1 else as_expr(0)
        with threads() as t:
            for o in range(R * R):
                kb.store(part, o, zero)
        with kb.reduce(-(-K // KT), hint="kt") as kt:
            k0 = kt * KT
            with threads() as t:
                def stage_a(e):
                    i, k = i0 + e / KT, k0 + e % KT
                    kb.store(sa, e, select((i < M) & (k < K), load_a(bidx, minimum(i, M - 1), minimum(k, K - 1)), zero))

                def stage_b(e):
                    kk, j = k0 + e / T, j0 + e % T
                    kb.store(sb, e, select((kk < K) & (j < N), load_b(bidx, minimum(kk, K - 1), minimum(j, N - 1)), zero))
                staged(t, T * KT, stage_a)
                staged(t, KT * T, stage_b)
            kb.barrier()
            with threads() as t:
                ty, tx = t / TR, t % TR
                with kb.reduce(KT, hint="q") as q:
                    for a in range(R):
                        for b in range(R):
                            o = a * R + b
                            kb.store(part, o, part[o] + sa[(ty + a * TR) * KT + q] * sb[q * T + tx + b * TR])
            kb.barrier()
        with threads() as t:
            ty, tx = t / TR, t % TR
            for a in range(R):
                for b in range(R):
                    i, j = i0 + ty + a * TR, j0 + tx + b * TR
                    with kb.if_((i < M) & (j < N)):
                        store(bidx, i, j, part[a * R + b])
    kb.kernel.launch = LaunchShape((max(1, min(nb * mt * nt, ctx.target.max_blocks)),), (NT,))
    kb.kernel.comment += (f"  [cuda: {T}x{T} output tiles, {R}x{R} per thread, shared-memory A and B "
                          f"slices of K {KT}]")


def _tiled_gemm_square(ctx, kb, M: int, N: int, K: int, batch, load_a, load_b, store, acc, T: int) -> None:
    """:func:`tiled_gemm` with one output per thread and K slices of T (the default knobs):
    T*T threads, thread t = (ty, tx) loads A[ty, tx] and B[ty, tx] of each slice."""
    mt, nt = -(-M // T), -(-N // T)
    nb = math.prod(batch) if batch else 1
    sa = kb.shared(acc, (T * T,), hint="ta")
    sb = kb.shared(acc, (T * T,), hint="tb")
    part = kb.local(acc, (1,), hint="acc")
    zero = as_expr(0, acc)

    def threads():
        return kb.loop(T * T, kind="threadIdx.x", hint="t")

    with kb.loop(nb * mt * nt, kind="blockIdx.x", hint="blk") as blk:
        tile = blk % (mt * nt) if nb > 1 else blk
        bidx = unravel(blk / (mt * nt), list(batch)) if batch else []
        i0 = (tile / nt) * T if nt > 1 else tile * T
        j0 = (tile % nt) * T if nt > 1 else as_expr(0)
        with threads() as t:
            kb.store(part, 0, zero)
        with kb.reduce(-(-K // T), hint="kt") as kt:
            k0 = kt * T
            with threads() as t:
                ty, tx = t / T, t % T
                i, k = i0 + ty, k0 + tx
                kb.store(sa, t, select((i < M) & (k < K), load_a(bidx, minimum(i, M - 1), minimum(k, K - 1)), zero))
                kk, j = k0 + ty, j0 + tx
                kb.store(sb, t, select((kk < K) & (j < N), load_b(bidx, minimum(kk, K - 1), minimum(j, N - 1)), zero))
            kb.barrier()
            with threads() as t:
                ty, tx = t / T, t % T
                with kb.reduce(T, hint="q") as q:
                    kb.store(part, 0, part[0] + sa[ty * T + q] * sb[q * T + tx])
            kb.barrier()
        with threads() as t:
            i, j = i0 + t / T, j0 + t % T
            with kb.if_((i < M) & (j < N)):
                store(bidx, i, j, part[0])
    kb.kernel.launch = LaunchShape((max(1, min(nb * mt * nt, ctx.target.max_blocks)),), (T * T,))
    kb.kernel.comment += f"  [cuda: {T}x{T} output tiles, shared-memory A and B slices]"
