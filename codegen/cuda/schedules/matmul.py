"""The cuda backend's schedule of MatMul, Gemm, MatMulInteger and their fused forms: schedule key
``"matmul"``, workload :class:`ir.ops.linalg.MatMulSpec`.

``matmul_tiled``: when M, N and K are each at least :data:`~.gemm.MATMUL_TILE`, the
shared-memory tiled GEMM (:func:`.gemm.tiled_gemm`, knobs ``tile``, ``thread_tile`` and
``k_slice`` from :func:`.gemm.gemm_knobs`). Smaller products take the generic nest of
``ir/ops/linalg.py`` (one dot product per output element, one running sum), which the cuda
launcher spreads one output element per thread.
"""
from __future__ import annotations

from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops.linalg import MatMulSpec
from tensorfuse.ir.strategy import register_schedule

from .gemm import MATMUL_TILE, gemm_knobs, tiled_gemm


def _tiled_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    return mm.M >= MATMUL_TILE and mm.N >= MATMUL_TILE and mm.K >= MATMUL_TILE


@register_schedule("matmul", "cuda", "matmul_tiled", plevel=10, applies=_tiled_applies)
def emit_matmul_tiled(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Shared-memory tiles, a thread block per output tile (module docstring); one kernel."""
    T, R, KT = gemm_knobs(ctx.target, mm.acc)
    kb = ctx.kernel()
    tiled_gemm(ctx, kb, mm.M, mm.N, mm.K, mm.batch, mm.load_a, mm.load_b,
               lambda bidx, i, j, v: mm.store(ctx, kb, bidx, i, j, v), mm.acc, T, R, KT)
