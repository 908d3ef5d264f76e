"""A strided 1x1 convolution rewritten as a subsampling Slice and a 1x1 convolution of stride 1.

ResNet's downsampling shortcuts (and the strided 1x1 convs of RegNet, DenseNet's transitions
without pooling, ...) are 1x1 convolutions of stride 2. With a 1x1 kernel and no padding each
output pixel reads exactly one input pixel (ONNX spec, Conv-11; pads 0, any dilation, since a
1x1 kernel has a single tap):

    Y[n, m, i, j] = b[m] + sum_c X[n, c, i*sh, j*sw] * W[m, c, 0, 0]

which is the stride-1 1x1 convolution of X[:, :, ::sh, ::sw] (ONNX Slice-13 with steps
[sh, sw] on axes [2, 3]; OH = ceil(H / sh) = (H - 1) // sh + 1 rows, as the Conv has). The
convolution schedules read a strided input a few pixels per cache line over every channel
for each block of output channels; the subsampled copy (1 / (sh * sw) of X) is contiguous and
small enough to stay in cache for all of them. 1 thread, weights and output not in cache as
in a model (AVX-512 host): resnet50's 512 -> 1024 at 28x28 2.42 -> 1.74 ms (onnxruntime
2.36), 1024 -> 2048 at 14x14 2.30 -> 2.11, 256 -> 512 at 56x56 1.81 -> 1.74.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail
from tensorfuse.ir.ops.conv import conv_geometry_of


class StridedPointwiseConvSubsample(Rule):
    """Conv(x, W, b) with a 1x1 kernel, strides > 1, no padding, constant W [M, C/group, 1, 1]
    ==> Conv(Slice(x, steps=strides on axes [2, 3]), W, b) with strides 1 (module docstring).
    The group is kept. NCHW pipelines only: the NHWC convolutions of the cuda target read a
    strided input as they read any other, and the layout pass would leave Transposes around
    the Slice."""
    pattern = P.Conv(x=Any(), w=Const(), b=Optional(Const()))
    layouts = ("NCHW",)

    def condition(self, m):
        conv, x, w = m.conv, m.x, m.w
        y = conv.outputs[0]
        if x.type.rank != 4 or w.type.rank != 4:
            return Fail(f"{conv.name}: not a 2-D convolution (input rank {x.type.rank})")
        if not x.dtype.is_float:
            return Fail(f"{conv.name}: input {x.dtype} is not a float type")
        if not all(isinstance(d, int) for d in list(x.shape) + list(y.shape)):
            return Fail(f"{conv.name}: shapes {list(x.shape)} -> {list(y.shape)} are not all known")
        if tuple(int(d) for d in w.shape[2:]) != (1, 1):
            return Fail(f"{conv.name}: a {w.shape[2]}x{w.shape[3]} kernel, not 1x1")
        geo = conv_geometry_of(conv)        # strides and pads resolved as Conv lowers them
        if geo.strides == [1, 1]:
            return Fail(f"{conv.name}: stride 1")
        if any(geo.pads_begin + geo.pads_end) or conv.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return Fail(f"{conv.name}: padded (pads {conv.attr('pads')}, auto_pad {conv.attr('auto_pad')})")
        return True

    def rewrite(self, m, build):
        conv, x = m.conv, m.x
        h, wd = int(x.shape[2]), int(x.shape[3])
        sh, sw = conv_geometry_of(conv).strides

        def i64(*vals):
            return build.const(np.array(vals, np.int64), "subsample")

        xs = build_or_fail(build, "Slice", x, i64(0, 0), i64(h, wd), i64(2, 3), i64(sh, sw))
        if isinstance(xs, Fail):
            return xs
        ins = [xs, m.w] + ([m.b] if m.b is not None else [])
        return build_or_fail(build, "Conv", *ins, expect=conv.outputs[0], kernel_shape=[1, 1],
                             group=int(conv.attr("group", 1)))


RULES = [StridedPointwiseConvSubsample]
