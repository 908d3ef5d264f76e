"""A patch-embedding convolution rewritten as a MatMul over the image's patches.

Vision transformers cut the image into non-overlapping patches with a Conv whose strides equal
its kernel (ViT-B/16: 16x16 stride 16, 3 -> 768 channels; ViT-B/32, ViT-L/14, DeiT, CLIP's
image tower alike). Each output pixel is then the dot product of one patch with each filter,
and the patches do not overlap, so (ONNX spec, Conv-11, with pads 0, dilations 1, group 1):

    Y[n, m, i, j] = b[m] + sum_{c, u, v} X[n, c, i*kh + u, j*kw + v] * W[m, c, u, v]

is the product P @ W2 + b of the patch matrix P [N*OH*OW, C*kh*kw] (row (n, i, j) holds the
patch, in (c, u, v) order: a Reshape and a Transpose of X, after a Slice when H or W is not a
multiple of the kernel: the rows and columns no patch covers) and W2 = W reshaped to
[M, C*kh*kw], transposed. The result [N*OH*OW, M] goes back to NCHW with a Reshape and a
Transpose. The MatMul then takes the GEMM schedules (and a bias Add its epilogue): the direct
convolution loops are written for small kernels that overlap, and ran ViT-B/16's 16x16 patch
embedding at 6 GFLOP/s against the GEMM's ~200.

The quantized form (``tensorfuse::ConvIntegerToFloat``: a QDQ model's patch Conv, or
``quantize_dynamic``'s ConvInteger -> Cast -> Mul) becomes ``com.microsoft::MatMulIntegerToFloat``
over the u8/i8 patches the same way, the int8 GEMM's schedule instead of the generic int8 loop
nest (ViT-B/16 dynamically quantized: 12.6 ms for the patch embedding against onnxruntime's 6.6).
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail
from tensorfuse.ir.ops.conv import conv_geometry_of


def _patch_condition(conv, x, w, min_area: int):
    """Fail (or True) for a 2-D Conv-like node whose patches do not overlap (module docstring)."""
    y = conv.outputs[0]
    if x.type.rank != 4 or w.type.rank != 4:
        return Fail(f"{conv.name}: not a 2-D convolution (input rank {x.type.rank})")
    if not all(isinstance(d, int) for d in list(x.shape) + list(y.shape)):
        return Fail(f"{conv.name}: shapes {list(x.shape)} -> {list(y.shape)} are not all known")
    kh, kw = int(w.shape[2]), int(w.shape[3])
    if int(conv.attr("group", 1)) != 1:
        return Fail(f"{conv.name}: group {conv.attr('group')}")
    geo = conv_geometry_of(conv)        # strides, dilations and pads resolved as Conv lowers them
    if geo.strides != [kh, kw]:
        return Fail(f"{conv.name}: strides {geo.strides} differ from the kernel [{kh}, {kw}]: the patches overlap or skip")
    if geo.dilations != [1, 1]:
        return Fail(f"{conv.name}: dilations {conv.attr('dilations')}")
    if any(geo.pads_begin + geo.pads_end) or conv.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return Fail(f"{conv.name}: padded (pads {conv.attr('pads')}, auto_pad {conv.attr('auto_pad')})")
    if kh * kw < min_area:
        return Fail(f"{conv.name}: a {kh}x{kw} patch, below MIN_KERNEL_AREA = {min_area} taps")
    return True


def _patches(build, x, w, y):
    """The patch matrix [N*OH*OW, C*kh*kw] of x (a Slice where no patch covers the last rows or
    columns, a Reshape, a Transpose, a Reshape), W as [C*kh*kw, M], and a function taking the
    product [N*OH*OW, M] back to y's NCHW; a Fail where a Slice cannot be built."""
    n, c, h, wd = (int(d) for d in x.shape)
    mo, _, kh, kw = (int(d) for d in w.shape)
    oh, ow = int(y.shape[2]), int(y.shape[3])

    def i64(*vals):
        return build.const(np.array(vals, np.int64), "patch_shape")

    xs = x
    if oh * kh != h or ow * kw != wd:        # rows / columns no patch covers
        xs = build_or_fail(build, "Slice", x, i64(0, 0), i64(oh * kh, ow * kw), i64(2, 3))
        if isinstance(xs, Fail):
            return xs
    p = build.op("Reshape", xs, i64(n, c, oh, kh, ow, kw))
    p = build.op("Transpose", p, perm=[0, 2, 4, 1, 3, 5])                 # [N, OH, OW, C, kh, kw]
    p = build.op("Reshape", p, i64(n * oh * ow, c * kh * kw))
    w2 = np.ascontiguousarray(w.data.reshape(mo, c * kh * kw).T)        # [C*kh*kw, M]

    def to_nchw(out):
        out = build.op("Reshape", out, i64(n, oh, ow, mo))
        return build_or_fail(build, "Transpose", out, expect=y, perm=[0, 3, 1, 2])
    return p, w2, to_nchw


class ConvPatchifyToMatMul(Rule):
    """Conv(x, W, b) with strides == kernel_shape (non-overlapping patches), no padding, no
    dilation, group 1, constant W [M, C, kh, kw] and a kernel of at least ``MIN_KERNEL_AREA``
    taps ==> Transpose(Reshape(MatMul(patches(x), W2) + b)) (module docstring)."""
    pattern = P.Conv(x=Any(), w=Const(), b=Optional(Const()))

    #: the least kh * kw this rule rewrites (a knob of the rule; 12x12 and up). Measured at 1 thread
    #: on an AVX-512 host, direct schedule vs this rule: 3->96 4x4 at 224 (Swin/ConvNeXt stem)
    #: 0.18 vs 0.34 ms, 96->192 2x2 at 56 0.52 vs 0.70, 3->256 8x8 at 224 0.44 vs 0.69; 3->768 16x16
    #: (ViT-B/16) 34.7 vs 1.22, 32x32 22.7 vs 1.13: the llvm conv schedules block kernels up to 11
    #: taps wide, larger ones fall to the generic loop nest
    MIN_KERNEL_AREA = 144

    def condition(self, m):
        x, w = m.x, m.w
        if not (x.dtype.is_float and w.dtype == x.dtype):
            return Fail(f"{m.conv.name}: input {x.dtype}, weights {w.dtype}: not one float type")
        return _patch_condition(m.conv, x, w, self.MIN_KERNEL_AREA)

    def rewrite(self, m, build):
        got = _patches(build, m.x, m.w, m.conv.outputs[0])
        if isinstance(got, Fail):
            return got
        p, w2, to_nchw = got
        out = build.op("MatMul", p, build.const(w2, "w_patch"))
        if m.b is not None:
            out = build.op("Add", out, build.const(m.b.data.reshape(w2.shape[1]), "b_patch"))
        return to_nchw(out)


class QuantizedConvPatchifyToMatMul(Rule):
    """tensorfuse::ConvIntegerToFloat(x, W, xs, ws, xz, wz, b) with the patch geometry of
    :class:`ConvPatchifyToMatMul` ==> Transpose(Reshape(MatMulIntegerToFloat(patches(x), W2, xs,
    ws, xz, wz, b))): x u8/i8, W constant; the scales, zero points and bias keep their meaning
    (per output channel is per column of W2)."""
    pattern = P.__getattr__("tensorfuse::ConvIntegerToFloat")(
        Any("x"), Const(name="w"), Any("xs"), Any("ws"), Optional(Any()).named("xz"),
        Optional(Any()).named("wz"), Optional(Any()).named("b")).named("conv")

    MIN_KERNEL_AREA = ConvPatchifyToMatMul.MIN_KERNEL_AREA

    def condition(self, m):
        return _patch_condition(m.conv, m.x, m.w, self.MIN_KERNEL_AREA)

    def rewrite(self, m, build):
        got = _patches(build, m.x, m.w, m.conv.outputs[0])
        if isinstance(got, Fail):
            return got
        p, w2, to_nchw = got
        out = build_or_fail(build, "MatMulIntegerToFloat", p, build.const(w2, "w_patch"), m.xs, m.ws, m.xz, m.wz, m.b,
                            domain="com.microsoft")
        return out if isinstance(out, Fail) else to_nchw(out)


RULES = [ConvPatchifyToMatMul, QuantizedConvPatchifyToMatMul]
