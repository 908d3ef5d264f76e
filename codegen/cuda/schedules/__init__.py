"""The cuda backend's schedules: importing this package registers each of them in
``ir.strategy`` (see docs/architecture.md, "Adding a schedule").

- ``blocks``: block-per-row building blocks (strided rows, shared-memory tree reductions) and
  the ``block_threads`` knob; ``gemm``: the register-tiled GEMM (block tiles, R x R
  accumulators per thread, double-buffered shared-memory K slices, split-K through a scratch
  slot) and its knobs (``tile``, ``thread_tile``, ``k_slice``, ``split_k``), and the few-row
  GEMV. Neither registers a schedule.
- ``conv_nhwc``: ConvNHWC as an implicit GEMM, and depthwise ConvNHWC (key ``conv2d_nhwc``).
- ``pool``: global pools, NCHW planes and NHWC channel tiles (``global_pool``,
  ``global_pool_nhwc``).
- ``norm``: LayerNormalization, Instance/GroupNormalization and the fused Skip/Embed
  LayerNorms, a block per row (``row_norm``, ``layernorm_rows``).
- ``softmax``: Softmax/LogSoftmax, a block per row (``softmax``).
- ``reduce``: Reduce*, a block per output (``reduction``).
- ``matmul``: MatMul, Gemm, MatMulInteger and fused forms as register-tiled GEMMs, or a GEMV
  for fewer than 16 rows (``matmul``).

The generic schedule (every kernel without a hand schedule: launches over its spatial nests)
is ``codegen/cuda/launches.py``, applied when the library is built.
"""
from . import conv_nhwc, matmul, norm, pool, reduce, softmax  # noqa: F401  (registers the schedules)
