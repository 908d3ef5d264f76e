"""The cuda backend's schedules of MatMul, Gemm, MatMulInteger and their fused forms: schedule key
``"matmul"``, workload :class:`ir.ops.linalg.MatMulSpec`.

- ``matmul_tiled``: M >= :data:`~.gemm.GEMV_ROWS` (16) and N, K >= 8: the register-tiled
  shared-memory GEMM of :func:`.gemm.tiled_gemm` (block tiles, R x R accumulators per thread,
  double-buffered K slices, split-K when the tiles do not fill the GPU; knobs ``tile``,
  ``thread_tile``, ``k_slice``, ``split_k`` from :func:`.gemm.gemm_knobs`), batched MatMul by
  block-striding over batch x tiles.
- ``matmul_gemv``: fewer rows (M < 16: batch-1 classifiers, one token) and K >= 32: a block per
  (row, column group) with the K range split over its threads and summed in shared memory
  (:func:`.gemm.gemv`), so a 1 x 512 x 1000 classifier runs on 32 to 125 blocks, not four.

Smaller products take the generic nest of ``ir/ops/linalg.py`` (one dot product per output
element), which the cuda launcher spreads one output element per thread. Every form applies the
epilogue (``MatMulSpec.store``: finish, then ``ctx.apply_epilogue``) before its one store.
"""
from __future__ import annotations

from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops.linalg import MatMulSpec
from tensorfuse.ir.strategy import register_schedule

from .gemm import GEMV_ROWS, gemm_knobs, gemv, tiled_gemm

#: the smallest N and K the tiled GEMM takes (a thinner product wastes most of a tile)
TILED_MIN = 8
#: the smallest K the GEMV takes (a shorter dot product is one thread's work)
GEMV_MIN_K = 32


def _tiled_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    return mm.M >= GEMV_ROWS and mm.N >= TILED_MIN and mm.K >= TILED_MIN


def _gemv_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    return 1 <= mm.M < GEMV_ROWS and mm.N >= 1 and mm.K >= GEMV_MIN_K


def _store(ctx, mm):
    return lambda kb, bidx, i, j, v: mm.store(ctx, kb, bidx, i, j, v)


@register_schedule("matmul", "cuda", "matmul_tiled", plevel=10, applies=_tiled_applies)
def emit_matmul_tiled(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """The register-tiled GEMM (module docstring): one kernel, two with split-K."""
    import math
    cfg = gemm_knobs(ctx.target, mm.acc, mm.M, mm.N, mm.K, math.prod(mm.batch) if mm.batch else 1)
    tiled_gemm(ctx, mm.M, mm.N, mm.K, mm.batch, mm.load_a, mm.load_b, _store(ctx, mm), mm.acc, cfg,
               what=f"  [GEMM {mm.M}x{mm.N}x{mm.K}]")


@register_schedule("matmul", "cuda", "matmul_gemv", plevel=10, applies=_gemv_applies)
def emit_matmul_gemv(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Few rows: the block-per-(row, column group) GEMV (module docstring); one kernel."""
    gemv(ctx, mm.M, mm.N, mm.K, mm.batch, mm.load_a, mm.load_b, _store(ctx, mm), mm.acc,
         mm.b_contiguous_in_j, what=f"  [GEMV {mm.M}x{mm.N}x{mm.K}]")
