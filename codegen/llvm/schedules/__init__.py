"""The llvm backend's schedules: importing this package registers each of them in
``ir.strategy`` (see docs/architecture.md, "Adding a schedule").

- ``conv2d``: 2-D float32 convolutions, key ``"conv2d"`` (``ir.ops.conv.emit_conv``): row
  tiles, flat pixel tiles, pointwise (1x1) and im2row GEMMs (:mod:`.conv2d`), Winograd
  F(2x2, 3x3) (:mod:`.conv2d_winograd`), depthwise (:mod:`.conv2d_depthwise`).
"""
from . import conv2d, conv2d_depthwise, conv2d_winograd  # noqa: F401  (registers the schedules)
