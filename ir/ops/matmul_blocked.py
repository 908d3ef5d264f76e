"""The register-blocked schedule of float32 MatMul / Gemm with a constant B (docs/architecture.md "CPU
codegen"): Y[i, j] = finish(sum_k A[i, k] * B[k, j], i, j).

- B' [K, N] (a compile-time constant; Gemm's transB is resolved while packing) is packed once
  into panels ``Bp [NBLK, K, NB*L]`` (``L`` lanes of the target, ``NB`` vectors per panel,
  zero-padded beyond N), so one reduction step reads NB contiguous vectors.
- The micro-kernel keeps an ``R x NB`` tile of vector accumulators (R rows of A, NB*L columns)
  in registers over the whole K reduction: per k, NB vector loads, R broadcasts of A[i, k] and
  R*NB FMAs. Rows of every batch of A are one row range (A [..., M, K] is [rows, K]).
- Parallel over (row block, column panel) tiles; the rows left over (rows % R) form a second
  parallel loop over panels with a smaller tile.
- ``finish`` (alpha, beta*C) and the fused epilogue run on whole accumulator vectors (the
  output index's last entry is a :class:`~ir.kernel.Ramp`) before one vector store; a vector
  that crosses N runs them per lane.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tensorfuse.ir.kernel import Buffer, Expr, KernelBuilder, Ramp, as_expr, fma
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.types import DType


def choose_gemm_tile(target, rows: int, n: int) -> tuple[int, int, int]:
    """(L, R, NB): lanes, rows per tile, vectors per panel; R*NB accumulators + NB + 1 fit the
    target's vector registers."""
    L = target.lanes(DType.f32)
    # codegen.llvm.schedules.conv2d.vector_registers (ir imports nothing of codegen; this
    # schedule moves there next)
    regs = 32 if getattr(target, "has_avx512", False) else 16
    nb = 2 if n > L else 1
    if regs >= 32 and n > 2 * L:
        nb = 3
    r = min((regs - nb - 2) // nb, 8 if regs >= 32 else 6, max(rows, 1))
    return L, max(1, r), nb


def pack_panels(b: np.ndarray, L: int, nb: int) -> np.ndarray:
    """B' [K, N] -> Bp [NBLK, K, nb*L] (zeros beyond N)."""
    k, n = b.shape
    blk = nb * L
    nblk = -(-n // blk)
    bp = np.zeros((k, nblk * blk), np.float32)
    bp[:, :n] = b
    return np.ascontiguousarray(bp.reshape(k, nblk, blk).transpose(1, 0, 2))


def emit_matmul_blocked(ctx: LowerCtx, y: Buffer, b_packed: np.ndarray | None, *, rows: int,
                        N: int, K: int, a_elem: Callable[[Expr, Expr], Expr],
                        out_index: Callable[[Expr, Expr], list],
                        finish: Callable[[Expr, Expr, Expr], Expr],
                        drop: Buffer) -> KernelBuilder:
    """Emit the kernel. ``b_packed`` is B' [K, N] as f32 numpy; ``a_elem(i, k)`` the A element
    (f32 Expr) of flattened row ``i``; ``out_index(i, j)`` Y's index list; ``finish(v, i, j)``
    the value before the epilogue. ``drop`` is the B buffer the kernel no longer reads.
    Returns the KernelBuilder."""
    L, R, NB = choose_gemm_tile(ctx.target, rows, N)
    blk = NB * L
    nblk = -(-N // blk)
    bp = ctx.pack(pack_panels(b_packed, L, NB), "bpanel")
    params = [p for p in ctx.default_params() if p is not drop] + [bp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += f"  [register tile {R} rows x {NB}x{L} columns, B packed {list(bp.shape)}]"
    acc = kb.local(DType.f32, (R * NB * L,), hint="acc")
    lanes = kb.local(DType.f32, (L,), hint="lanes")

    def tile(i0: Expr, nrows: int, jb: Expr):
        for q in range(nrows * NB):
            kb.store(acc, q * L, kb.broadcast(as_expr(0.0, DType.f32), L))
        with kb.reduce(K, hint="k") as k:
            bv = [bp.vload((jb * K + k) * blk + v * L, L) for v in range(NB)]
            for r in range(nrows):
                av = a_elem(i0 + r, k)
                for v in range(NB):
                    q = (r * NB + v) * L
                    kb.store(acc, q, fma(av, bv[v], acc.vload(q, L)))
        for r in range(nrows):
            i = i0 + r
            for v in range(NB):
                j0 = jb * blk + v * L
                vec = acc.vload((r * NB + v) * L, L)

                def vector_store(vec=vec, j0=j0, i=i):
                    idx = out_index(i, Ramp(j0, L))
                    kb.store(y, idx, ctx.apply_epilogue(finish(vec, i, Ramp(j0, L)), idx))

                def lane_stores(vec=vec, j0=j0, i=i):
                    kb.store(lanes, 0, vec)
                    for ln in range(L):
                        with kb.if_(j0 + ln < N):
                            idx = out_index(i, j0 + ln)
                            kb.store(y, idx, ctx.apply_epilogue(finish(lanes[ln], i, j0 + ln), idx))
                if N % blk == 0:
                    vector_store()
                    continue
                if N % L == 0:               # vectors of the last panel are whole or past N
                    with kb.if_(j0 < N):
                        vector_store()
                    continue
                with kb.if_(j0 + L <= N) as full_vec:
                    vector_store()
                with kb.else_(full_vec):
                    lane_stores()

    full = rows // R
    if full:
        with kb.loop(full * nblk, kind="parallel", hint="t") as t:
            tile((t / nblk) * R, R, t % nblk if nblk > 1 else as_expr(0))
    if rows % R:
        with kb.loop(nblk, kind="parallel", hint="jb") as jb:
            tile(as_expr(full * R), rows % R, jb)
    return kb


def unravel(i: Expr, dims) -> list:
    """Row-major multi-index of flat ``i`` over ``dims`` (constant ints)."""
    out = []
    for d in reversed(list(dims)):
        out.append(i % d if d > 1 else as_expr(0))
        i = i / d if d > 1 else i
    return out[::-1]
