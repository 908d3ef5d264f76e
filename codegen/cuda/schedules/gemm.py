"""The cuda GEMM building blocks: the register-tiled shared-memory GEMM (:func:`tiled_gemm`) with
split-K, its knobs (:func:`gemm_knobs`), and the block-per-row GEMV for few rows
(:func:`gemv`). The MatMul/Gemm schedule (``matmul.py``) and the implicit-GEMM ConvNHWC schedule
(``conv_nhwc.py``) are built on them; this module registers nothing itself.

The tiled GEMM computes ``C[b, i, j] = sum_k A[b, i, k] B[b, k, j]`` (b over a batch, i < M,
j < N) in **block tiles** of BM x BN outputs (BM = BN = ``tile``), each thread holding a
**register tile** of R x R accumulators (R = ``thread_tile``) at rows ``ty + a BM/R`` and
columns ``tx + b BN/R`` (strided, so that a warp's shared-memory reads of B are consecutive
words, free of bank conflicts, those of A one broadcast word, and its output stores coalesce).
K runs in slices of KT (``k_slice``) staged through **double-buffered shared memory**
(A k-major [2, KT, BM + 4], B [2, KT, BN]): while a block multiplies slice s out of one buffer,
its threads' loads of slice s+1 from global memory are in flight into registers, stored into
the other buffer after the multiply, one barrier per slice. The multiply of a slice is straight
line code (the slice's k unrolled): per k, R loads of A and R of B from shared memory into
registers and R^2 FMAs, so a thread does R/2 FMAs per shared-memory load. The index arithmetic
is the kernel IR's (int64); the cuda emitter computes it in 32 bits wherever its intervals
prove that exact (``emit.py``), and NVVM hoists what does not depend on the slice out of the K
loop. Outputs outside M x N are never stored; loads outside it (and k >= K) read zeros, so
edge tiles need no other case.

**Tensor cores** (precision "tf32", ``mma.py``; f32 accumulation, K slices of 8, 16 or 32): the
block's NT / 32 warps tile the T x T output in warp tiles of 16 mf x 8 nf (mf x nf = R^2 / 4
m16n8k8 fragments: 1x1, 1x4, 2x8 for R = 2, 4, 8), and per k-step of 8 each lane loads its A
and B fragments from the same double-buffered shared slices (rows padded by :data:`MMA_PAD`
for conflict-free fragment loads) and calls the TF32 micro-kernel (:class:`~..mma.MmaTile`)
once per m16n8 fragment (:data:`MMA_CALL_N`), its accumulators staying in registers; the
epilogue is the FMA path's. Without the option ("fp32", the default) the FMA loop below runs.

**Split-K**: when the grid would leave SMs idle (fewer tiles than :data:`SM_COUNT`, late conv
layers at batch 1) and K is long, the K slices are divided among ``split_k`` blocks per tile.
Each writes its partial sums to a scratch buffer [S, batch, M, N] (``LowerCtx.scratch``); a
second kernel adds the S partials of each output in split order and applies the epilogue (bias,
folded BatchNorm, activation, residual) before the one store. Without a split the epilogue runs
on the accumulators, in registers, before the one store.

Knobs (:func:`gemm_knobs`; defaults by formula):

- ``tile``: BM = BN, 32, 64 or 128; default 64 when the 64 x 64 tiles of the problem fill
  :data:`SM_COUNT` SMs, else 32;
- ``thread_tile``: R, 2, 4 or 8 (2 or 4 with TF32) with 32 <= (tile / R)^2 <= the target's
  threads per block; default 4 (8 for 128 tiles: 256 threads);
- ``k_slice``: KT, 4, 8, 16 or 32 (not 4 with TF32; double-buffered A and B slices must fit the target's shared
  memory); default 16 (8 for 128 tiles);
- ``split_k``: S, 1 to 16 (powers of two, at most the K slices); default 1 unless the tiles do not
  fill the SMs: then the largest S with tiles x S <= :data:`SM_COUNT` and >= 4 slices per split.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tensorfuse.ir.kernel import LaunchShape, Ramp, as_expr, fma, minimum, select
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.types import DType

from .. import mma
from ..mma import MmaTile
from .blocks import block_reduce, unravel

#: the multiprocessors the tile and split-K defaults aim to fill: an H200's 132 (sm_90). More
#: SMs than this only make the defaults conservative; fewer, tiles wait a wave
SM_COUNT = 132
#: padding of a row of the k-major A slice in shared memory (elements): its transposing stores
#: (consecutive threads, consecutive k) then spread over banks; 4 keeps rows 16-byte aligned
A_PAD = 4
#: padding of a row of the A and B slices in shared memory on the tensor-core path (elements):
#: a warp's fragment loads (lane (g, q) reads row k0 + q, column g) then hit 32 distinct banks
MMA_PAD = 8
#: n-fragments per call of the TF32 micro-kernel (1 or the warp tile's nf): one fragment per
#: call keeps its 10 arguments and 4 results in registers under the CUDA calling convention
#: (ptxas 13.0, sm_90: no stack frame), where a 1x4 call's 28 arguments and 16 results take a
#: 136-byte stack frame (local memory) per call site and a 2x8 call's a 568-byte one; the price
#: is 6 operand conversions per mma instead of 3
MMA_CALL_N = 1
#: MatMul/Gemm with fewer rows than this (batch-1 classifiers, one token) take :func:`gemv`
GEMV_ROWS = 16
#: the GEMV block: threads, and the columns a block covers when B is contiguous along them
#: (a warp's lanes over 32 columns, 8 groups over k) or along k (a warp per column, 8 columns)
GEMV_THREADS = 256


@dataclass(frozen=True)
class GemmConfig:
    """The tiled GEMM's knob values: ``tile`` (BM = BN), ``thread_tile`` (R), ``k_slice`` (KT),
    ``split_k`` (S)."""

    tile: int = 64
    thread_tile: int = 4
    k_slice: int = 16
    split_k: int = 1
    precision: str = "fp32"

    @property
    def mma(self) -> tuple[int, int] | None:
        """The warp tile (m-fragments, n-fragments) of the tensor-core path, or None (FMAs)."""
        return mma.TILE_SHAPES.get(self.thread_tile) if self.precision == "tf32" else None


def _smem_bytes(T: int, KT: int, itemsize: int, tf32: bool = False) -> int:
    """Shared memory of a tile: double-buffered A and B slices, and the output tile."""
    if tf32:
        return (2 * KT * 2 * (T + MMA_PAD) + T * T) * itemsize
    return (2 * KT * ((T + A_PAD) + T) + T * T) * itemsize


def gemm_knobs(target, acc, M: int, N: int, K: int, batches: int = 1, conv: bool = False) -> GemmConfig:
    """Declare the knobs ``tile``, ``thread_tile``, ``k_slice`` and ``split_k`` (module doc) of a
    tiled GEMM of ``batches`` products of M x N x K accumulating in dtype ``acc``, and return
    their values with the precision. Candidates the target cannot launch (too many threads, too
    much shared memory) are left out, so every candidate runs. The precision ("fp32" or "tf32",
    ``mma.py``) is the compile option's (:func:`.mma.gemm_precision`; ``conv``: an implicit-GEMM
    convolution, for "auto"), "tf32" for f32 accumulation only. It is not a knob: a tuner
    chooses among kernels of the same numerics, never between precisions."""
    def tiles(t: int) -> int:
        return batches * -(-M // t) * -(-N // t)
    P = mma.gemm_precision(conv) if acc == DType.f32 else "fp32"
    tf32 = P == "tf32"
    maxt = target.max_threads_per_block
    ts = [t for t in (32, 64) if _smem_bytes(t, 4, acc.itemsize) <= target.max_shared_bytes]
    T = knob("tile", ts, 64 if min(M, N) > 32 and 64 in ts else ts[0], doc="side of a block's square output tile")
    # TF32: no 8x8 register tile (with the micro-kernel calls' operands it needs 255 registers
    # and spills 88 bytes, ptxas 13.0 sm_90; 4x4 takes 103 and none)
    rs = [r for r in ((2, 4) if tf32 else (2, 4, 8)) if r < T and 32 <= (T // r) ** 2 <= maxt]
    R = knob("thread_tile", rs, 4 if 4 in rs else rs[-1],
             doc="accumulators per thread along each side of the tile (registers)")
    ks = [k for k in ((8, 16, 32) if tf32 else (4, 8, 16, 32))
          if _smem_bytes(T, k, acc.itemsize, tf32) <= target.max_shared_bytes]
    kdef = 16
    KT = knob("k_slice", ks, kdef if kdef in ks else ks[-1], doc="K extent of the shared-memory slices")
    nk = -(-K // KT)
    ss = [s for s in (1, 2, 4, 8, 16) if s <= nk]
    sdef = 1
    while sdef * 2 in ss and tiles(T) * sdef * 2 <= SM_COUNT and nk // (sdef * 2) >= 4:
        sdef *= 2
    S = knob("split_k", ss, sdef, doc="blocks sharing one tile's K range (partials summed by a second kernel)")
    return GemmConfig(T, R, KT, S, P)


def tiled_gemm(ctx, M: int, N: int, K: int, batch, load_a, load_b, store, acc, cfg: GemmConfig = GemmConfig(),
               what: str = "") -> None:
    """Emit the register-tiled GEMM (module doc) for ``store(kb, bidx, i, j, sum over k of
    load_a(bidx, i, k) * load_b(bidx, k, j))`` for every ``bidx`` over ``batch`` (a shape; ()
    for none), i < M, j < N: one kernel (``ctx.kernel()``), or with ``cfg.split_k`` > 1 two
    (partial products into a scratch buffer, then their sums through ``store``).

    ``load_a``/``load_b`` return Exprs of dtype ``acc`` (or a pair (Expr, condition): the value
    is zero where the condition fails, an implicit GEMM's padding); they may gather (im2col
    loads). Their indices may lie past M, N or K at edge tiles: the value is then dropped by a
    conditional expression, which the cuda emitter makes lazy, so such loads never run (a
    cuda-only contract: the kernel IR's select evaluates both sides elsewhere). ``store`` gets the kernel builder to
    store with and the accumulated Expr (dtype ``acc``) of one in-range output. ``what`` is
    appended to the kernels' comments."""
    T, R, KT = cfg.tile, cfg.thread_tile, cfg.k_slice
    TR = T // R                                 # threads along each side of the tile
    NT = TR * TR
    tc = cfg.mma if acc == DType.f32 and KT % 8 == 0 else None    # tensor cores: (mf, nf)
    TA = T + (MMA_PAD if tc else A_PAD)         # a row of the k-major A slice
    TB = T + MMA_PAD if tc else T               # a row of the B slice
    mt, nt = -(-M // T), -(-N // T)
    nb = math.prod(batch) if batch else 1
    nk = -(-K // KT)                            # K slices
    per = -(-nk // cfg.split_k)                 # slices per split
    S = -(-nk // per)                           # splits that have slices
    ws = ctx.scratch(acc, (S, nb, M, N), hint="splitk") if S > 1 else None
    kb = ctx.kernel(params=ctx.default_params() + ([ws] if ws is not None else []),
                    suffix="partial" if S > 1 else "")
    sa = kb.shared(acc, (2 * KT * TA,), hint="ta")
    sb = kb.shared(acc, (2 * KT * TB,), hint="tb")
    sc = kb.shared(acc, (T * T,), hint="tc")      # the output tile, for the epilogue
    accs = kb.local(acc, (R * R,), hint="acc")
    # one k of the thread's A rows and B columns (FMAs), or one k-step's fragments (mma)
    fa = kb.local(acc, (4 * tc[0] if tc else R,), hint="fa")
    fb = kb.local(acc, (2 * tc[1] if tc else R,), hint="fb")
    na, nbl = -(-T * KT // NT), -(-KT * T // NT)   # slice elements each thread stages
    ga = kb.local(acc, (na,), hint="ga")        # the next slice, loaded while this one multiplies
    gb = kb.local(acc, (nbl,), hint="gb")
    zero = as_expr(0, acc)
    U = max(1, min(KT, 64 // (R * R)))          # k's per iteration of the slice loop

    with kb.loop(nb * mt * nt * S, kind="blockIdx.x", hint="blk") as blk:
        tile = blk % (mt * nt)
        rest = blk / (mt * nt)
        split = rest % S if S > 1 else as_expr(0)
        bidx = unravel(rest / S if S > 1 else rest, list(batch)) if batch else []
        i0 = (tile / nt) * T
        j0 = (tile % nt) * T
        kbase = split * (per * KT)
        nslices = minimum(as_expr(per), as_expr(nk) - split * per) if S > 1 else as_expr(nk)

        def masked(v, conds):
            """``v`` (or a loader's (value, condition) pair) where every condition holds, else 0:
            one conditional expression, which the cuda emitter makes lazy (the load runs only
            where selected), so out-of-range indices are never read and need no clamping."""
            if isinstance(v, tuple):
                v, c = v
                conds = conds + [c]
            conds = [c for c in conds if c is not None]
            if not conds:
                return v
            ok = conds[0]
            for c in conds[1:]:
                ok = ok & c
            return select(ok, v, zero)

        def fetch(t, s):
            """Thread t's elements of slice s (relative to the split) into ga/gb. Its A elements
            share one k (NT is a multiple of KT), so the k decomposition (an implicit GEMM's
            kh, kw, ic) is computed once per slice."""
            k0 = kbase + s * KT
            for r in range(na):
                e = t + r * NT
                i, k = i0 + e / KT, k0 + e % KT
                kb.store(ga, r, masked(load_a(bidx, i, k), [
                    i < M if M % T else None, k < K if K % KT or S > 1 else None,
                    e < T * KT if (T * KT) % NT else None]))
            for r in range(nbl):
                e = t + r * NT
                k, j = k0 + e / T, j0 + e % T
                kb.store(gb, r, masked(load_b(bidx, k, j), [
                    k < K if K % KT or S > 1 else None, j < N if N % T else None,
                    e < KT * T if (KT * T) % NT else None]))

        def deposit(t, buf):
            """ga/gb into shared buffer ``buf`` (0 or 1)."""
            for r in range(na):
                e = t + r * NT
                st = lambda: kb.store(sa, buf * (KT * TA) + (e % KT) * TA + e / KT, ga[r])  # noqa: E731
                if (T * KT) % NT:
                    with kb.if_(e < T * KT):
                        st()
                else:
                    st()
            for r in range(nbl):
                e = t + r * NT
                off = buf * (KT * TB) + ((e / T) * TB + e % T if TB != T else e)
                st = lambda: kb.store(sb, off, gb[r])  # noqa: E731
                if (KT * T) % NT:
                    with kb.if_(e < KT * T):
                        st()
                else:
                    st()

        with kb.loop(NT, kind="threadIdx.x", hint="t") as t:
            for o in range(R * R):
                kb.store(accs, o, zero)
            fetch(t, as_expr(0))
            deposit(t, as_expr(0))
        kb.barrier()
        with kb.reduce(nslices, hint="kt") as s:
            with kb.loop(NT, kind="threadIdx.x", hint="t") as t:
                ty, tx = t / TR, t % TR
                more = s + 1 < nslices
                with kb.if_(more):              # the next slice's loads, in flight during the FMAs
                    fetch(t, s + 1)
                cur = s % 2
                if tc:
                    _mma_slice(kb, t, cur, T, KT, TA, TB, tc, sa, sb, fa, fb, accs)
                else:
                    abase, bbase = cur * (KT * TA) + ty, cur * (KT * T) + tx
                    # the slice: per k, R + R shared loads into registers and R^2 FMAs; U consecutive
                    # k written out (their loads' offsets constants from one address), the rest a
                    # loop: straight-line code of all KT k's costs numba's compiler minutes (its
                    # passes are quadratic in a basic block's length)
                    with kb.loop(KT // U, hint="q") as qo:
                        qa, qb = abase + qo * (U * TA), bbase + qo * (U * T)
                        for u in range(U):
                            for a in range(R):
                                kb.store(fa, a, sa[qa + (u * TA + a * TR)])
                            for b in range(R):
                                kb.store(fb, b, sb[qb + (u * T + b * TR)])
                            for a in range(R):
                                for b in range(R):
                                    kb.store(accs, a * R + b, fma(fa[a], fb[b], accs[a * R + b]))
                with kb.if_(more):
                    deposit(t, 1 - cur)
            kb.barrier()
        # the tile's accumulators through shared memory, so that one loop (not R^2 copies of
        # the epilogue) stores them, consecutive threads at consecutive columns (coalesced)
        with kb.loop(NT, kind="threadIdx.x", hint="t") as t:
            if tc:
                _mma_to_tile(kb, t, T, tc, sc, accs)
            else:
                ty, tx = t / TR, t % TR
                for a in range(R):
                    for b in range(R):
                        kb.store(sc, (ty + a * TR) * T + tx + b * TR, accs[a * R + b])
        kb.barrier()
        with kb.loop(NT, kind="threadIdx.x", hint="t") as t:
            with kb.loop(R * R, hint="o") as o:
                e = t + o * NT
                i, j = i0 + e / T, j0 + e % T
                with kb.if_((i < M) & (j < N)):
                    if ws is None:
                        store(kb, bidx, i, j, sc[e])
                    else:
                        kb.store(ws, (split * nb + (rest / S if S > 1 else rest)) * (M * N) + i * N + j, sc[e])
        kb.barrier()                        # the next tile's first deposit overwrites buffer 0
    kb.kernel.launch = LaunchShape((max(1, min(nb * mt * nt * S, ctx.target.max_blocks)),), (NT,))
    kb.kernel.comment += (f"  [cuda: {T}x{T} output tiles, "
                          + (f"TF32 mma.sync m16n8k8, warp tiles of {16 * tc[0]}x{8 * tc[1]}, " if tc else "")
                          + f"{R}x{R} registers per thread, double-buffered "
                          f"shared-memory slices of K {KT}" + (f", split-K {S}" if S > 1 else "") + "]" + what)
    if ws is None:
        return
    # the partial sums, added in split order, then the epilogue and the one store
    kb2 = ctx.kernel(params=[ws] + ctx.default_params(), suffix="splitk_sum")
    with kb2.grid(list(batch) + [M, N]) as idx:
        bidx, i, j = idx[:-2], idx[-2], idx[-1]
        flat = as_expr(0)
        for d, v in zip(batch, bidx):
            flat = flat * d + v
        v = ws.flat(flat * (M * N) + i * N + j)
        for sp in range(1, S):
            v = v + ws.flat(((sp * nb) + flat) * (M * N) + i * N + j)
        store(kb2, bidx, i, j, v)
    kb2.kernel.comment += f"  [cuda: split-K sum of {S} partials]" + what


def _warp_origin(t, T: int, tc: tuple[int, int]):
    """Thread t's lane coordinates (g, q) and its warp tile's first row and column: the block's
    warps tile the T x T output in T / (16 mf) rows of T / (8 nf) warp tiles."""
    mf, nf = tc
    lane, warp = t % 32, t / 32
    wn = T // (8 * nf)
    return lane / 4, lane % 4, (warp / wn) * (16 * mf), (warp % wn) * (8 * nf)


def _mma_slice(kb, t, cur, T: int, KT: int, TA: int, TB: int, tc, sa, sb, fa, fb, accs) -> None:
    """The K slice ``cur`` of thread t's warp tile on tensor cores: per k-step of 8, the lane's
    A fragments (4 per m-fragment) from the k-major A slice and B fragments (2 per n-fragment)
    from the B slice into registers (PTX ISA fragment layout, ``mma.py``), then
    :class:`~..mma.MmaTile` calls of 1 x :data:`MMA_CALL_N` fragments updating the lane's
    4 mf nf accumulators."""
    mf, nf = tc
    g, q, r0, c0 = _warp_origin(t, T, tc)
    abase, bbase = cur * (KT * TA) + r0 + g, cur * (KT * TB) + c0 + g
    cn = MMA_CALL_N if nf % MMA_CALL_N == 0 else nf      # n-fragments per call
    for k0 in range(0, KT, 8):
        ra, rb = abase + (k0 + q) * TA, bbase + (k0 + q) * TB
        for mi in range(mf):
            for x, (dk, dr) in enumerate(((0, 0), (0, 8), (4, 0), (4, 8))):
                kb.store(fa, 4 * mi + x, sa[ra + (dk * TA + 16 * mi + dr)])
        for ni in range(nf):
            for x, dk in enumerate((0, 4)):
                kb.store(fb, 2 * ni + x, sb[rb + (dk * TB + 8 * ni)])
        for mi in range(mf):
            for n0 in range(0, nf, cn):
                o = 4 * (mi * nf + n0)             # the call's accumulators: contiguous
                kb.store(accs, [Ramp(as_expr(o), 4 * cn)],
                         MmaTile(tuple(fa[4 * mi + i] for i in range(4)),
                                 tuple(fb[2 * n0 + i] for i in range(2 * cn)),
                                 tuple(accs[o + i] for i in range(4 * cn)), 1, cn))


def _mma_to_tile(kb, t, T: int, tc, sc, accs) -> None:
    """Thread t's accumulators (C fragments: rows g and g + 8, columns 2q and 2q + 1 of each
    16 x 8 fragment) into the output tile ``sc`` [T, T]."""
    mf, nf = tc
    g, q, r0, c0 = _warp_origin(t, T, tc)
    for mi in range(mf):
        for ni in range(nf):
            o = 4 * (mi * nf + ni)
            base = (r0 + 16 * mi + g) * T + c0 + 8 * ni + 2 * q
            for h in range(2):
                for j in range(2):
                    kb.store(sc, base + (8 * h * T + j), accs[o + 2 * h + j])


def gemv(ctx, M: int, N: int, K: int, batch, load_a, load_b, store, acc, b_contiguous_in_j: bool,
         what: str = "") -> None:
    """C[b, i, j] = sum_k A[b, i, k] B[b, k, j] for few rows (M < :data:`GEMV_ROWS`): a block of
    :data:`GEMV_THREADS` threads per (batch, row, column group), the K range split among its
    threads and the partial sums added in shared memory (a tree, ``blocks.block_reduce``), so a
    batch-1 classifier's 1000 outputs take 32 to 125 blocks instead of four. With B contiguous
    along j (MatMul) a warp's lanes take 32 consecutive columns and 8 groups of lanes take every
    8th k (coalesced rows of B); with B contiguous along k (Gemm's transB) each warp takes one
    column, its lanes every 32nd k (coalesced rows of B'). ``store(kb, bidx, i, j, v)`` as
    :func:`tiled_gemm`'s, run by one thread per output."""
    if b_contiguous_in_j:
        cols, groups = 32, GEMV_THREADS // 32
    else:
        cols, groups = GEMV_THREADS // 32, 32
    nt = -(-N // cols)
    nb = math.prod(batch) if batch else 1
    kb = ctx.kernel()
    sh = kb.shared(acc, (GEMV_THREADS,), hint="part")
    part = kb.local(acc, (1,), hint="acc")
    with kb.loop(nb * M * nt, kind="blockIdx.x", hint="blk") as blk:
        ct = blk % nt
        i = (blk / nt) % M
        bidx = unravel(blk / (nt * M), list(batch)) if batch else []
        with kb.loop(GEMV_THREADS, kind="threadIdx.x", hint="t") as t:
            if b_contiguous_in_j:
                g, c = t / cols, t % cols
            else:
                g, c = t % groups, t / groups
            j = ct * cols + c
            jc = minimum(j, N - 1)
            kb.store(part, 0, as_expr(0, acc))
            with kb.reduce(-(-K // groups), hint="kq") as kq:
                k = kq * groups + g
                with kb.if_(k < K):
                    kb.store(part, 0, fma(load_a(bidx, i, k), load_b(bidx, k, jc), part[0]))
            kb.store(sh, g * cols + c, part[0])
        block_reduce(kb, sh, GEMV_THREADS, lambda x, y: x + y, hint="t", keep=cols)
        with kb.loop(GEMV_THREADS, kind="threadIdx.x", hint="t") as t:
            j = ct * cols + t
            with kb.if_((t < cols) & (j < N)):
                store(kb, bidx, i, j, sh[t])
        kb.barrier()                        # every thread read its sum before the next block's
    kb.kernel.launch = LaunchShape((max(1, min(nb * M * nt, ctx.target.max_blocks)),), (GEMV_THREADS,))
    kb.kernel.comment += (f"  [cuda GEMV: {cols} columns per block, K split over {groups} thread groups, "
                          f"shared-memory sums]" + what)
