"""The llvm backend's schedules: importing this package registers each of them in
``ir.strategy`` (see docs/architecture.md, "Adding a schedule").

- ``conv2d``: 2-D float32 convolutions, key ``"conv2d"`` (``ir.ops.conv.emit_conv``): row
  tiles, flat pixel tiles, pointwise (1x1) and im2row GEMMs (:mod:`.conv2d`), Winograd
  F(2x2, 3x3) (:mod:`.conv2d_winograd`), depthwise (:mod:`.conv2d_depthwise`); int8 with int32
  accumulation on VPDPBUSD / VPMADDWD (:mod:`.conv2d_int8`, helpers in :mod:`.int8`).
- ``matmul``: MatMul, Gemm, MatMulInteger and their fused forms, key ``"matmul"``
  (``ir.ops.linalg.emit_matmul_core``): register tiles over a packed constant B, i-k-j
  panels, dot products in partial sums (:mod:`.matmul`); integer products of u8/i8 by a
  constant B on VPDPBUSD / VPMADDWD (:mod:`.matmul_int8`).
- ``norm``: row statistics of Layer/Instance/GroupNormalization in vector partial sums,
  key ``"row_norm"`` (``ir.ops.norm.emit_row_norm``) (:mod:`.norm`).
- ``softmax``: Softmax / LogSoftmax over a contiguous f32 last axis in vectors, key
  ``"softmax"`` (``ir.ops.softmax``) (:mod:`.softmax`).
- ``pool``: global pools in vector partial accumulators, key ``"global_pool"``
  (``ir.ops.pool.emit_global_pool``) (:mod:`.pool`).
- ``reduce``: Reduce* over trailing axes (contiguous rows) in vector partial accumulators, key
  ``"reduction"`` (``ir.ops.reduce``) (:mod:`.reduce`).
"""
from . import conv2d, conv2d_depthwise, conv2d_int8, conv2d_winograd, matmul, matmul_int8, norm, pool, reduce, softmax, transpose  # noqa: F401  (registers the schedules)
