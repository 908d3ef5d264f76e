"""Conv epilogue fusion: Conv (+ bias) + Add (residual or constant) + activation ==> one
``tensorfuse::FusedConv`` whose epilogue runs in the Conv kernel before its single store; and
the squeeze-excitation scale folded into the projection conv that reads it.

Three rules, applied in graph order: the input scale joins the Conv first (FuseConvInputScale,
rooted at the Conv, which comes before its Add), then the Add (FuseConvAdd), then the
activation (FuseConvActivation) joins a Conv or a FusedConv that has none yet. A constant added
per output channel goes into the bias instead of the residual input.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, OneOf, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import activation, activation_of, build_or_fail
from tensorfuse.ir.ops.conv import conv_geometry_of
from tensorfuse.ir.types import DType

FUSED_CONV = "tensorfuse::FusedConv"

FusedConvOp = P.__getattr__(FUSED_CONV)
#: a Conv, or a FusedConv that only scales its input (FuseConvInputScale): no residual, no activation
_conv = OneOf(P.Conv(x=Any(), w=Any(), b=Optional()),
              FusedConvOp(Any().named("x"), Any().named("w"), Optional(name="b"), Optional(), Any())
              .where(lambda n: n.input(3) is None and not n.attr("activation", ""), "no residual and no activation"),
              name="y").single_use()


def _input_scale(v):
    """Input S of a FusedConv producing ``v`` (None for a Conv)."""
    return v.producer.input(4) if v.producer.op == "FusedConv" else None


def _fused_conv(build, x, w, b, z, scale, expect, attrs):
    """FusedConv(x, W, b, Z, S) (S, input 4, only where there is one), or Fail."""
    ins = [x, w, b, z] + ([scale] if scale is not None else [])
    return build_or_fail(build, "FusedConv", *ins, domain="tensorfuse", expect=expect, attributes=attrs)


def _per_channel(z, out_shape) -> bool:
    """Is constant ``z`` (right-aligned against the output) 1 everywhere but the channel dim?"""
    s = (1,) * (len(out_shape) - z.type.rank) + tuple(z.shape)
    return len(s) == len(out_shape) and all(d == 1 for i, d in enumerate(s) if i != 1)


class FuseConvAdd(Rule):
    """Add(Conv(x, W, b), z) ==> FusedConv(x, W, b, Z=z) (a per-channel constant z goes into the bias instead)."""
    pattern = P.Add(_conv, z=Any())

    def condition(self, m):
        y, out = m.y, m.add.outputs[0]
        if out.shape != y.shape:
            return Fail(f"{m.add.name}: '{m.z.name}' of shape {list(m.z.shape)} broadcasts the Conv output "
                        f"{list(y.shape)} to {list(out.shape)}")
        if m.z.dtype != y.dtype:
            return Fail(f"{m.add.name}: '{m.z.name}' is {m.z.dtype}, the Conv output is {y.dtype}")
        return True

    def rewrite(self, m, build):
        y = m.y
        scale = _input_scale(y)
        attrs = {k: v for k, v in y.producer.attrs.items() if k not in ("activation", "activation_params")}
        out = m.add.outputs[0]
        if m.z.is_const and _per_channel(m.z, y.shape) and (m.b is None or m.b.is_const):
            ch = y.shape[1]
            zc = np.broadcast_to(m.z.data.reshape(-1), (ch,)).astype(np.float64)
            b0 = np.zeros(ch) if m.b is None else m.b.data.astype(np.float64)
            bias = build.const((b0 + zc).astype(y.dtype.numpy), "b_fused")
            if scale is None:
                return build_or_fail(build, "Conv", m.x, m.w, bias, expect=out, **attrs)
            return _fused_conv(build, m.x, m.w, bias, None, scale, out, dict(attrs, activation="", activation_params=[]))
        return _fused_conv(build, m.x, m.w, m.b, m.z, scale, out, dict(attrs, activation="", activation_params=[]))


_anchor = OneOf(P.Conv(x=Any(), w=Any(), b=Optional()),
                FusedConvOp(x=Any(), w=Any(), b=Optional(), z=Optional(), s=Optional())
                .attrs(activation=""),
                name="y").single_use()


class FuseConvActivation(Rule):
    """Act(Conv or FusedConv without activation) ==> FusedConv(..., activation=Act): Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish, SiLU, Tanh, Gelu."""
    pattern = activation(_anchor)

    def condition(self, m):
        a = activation_of(m.act)
        if isinstance(a, Fail):
            return a
        if m.act.type != m.y.type:
            return Fail(f"{m.act.producer.name}: changes the type {m.y.type} to {m.act.type}")
        return True

    def rewrite(self, m, build):
        name, params = activation_of(m.act)
        n = m.y.producer
        attrs = {k: v for k, v in n.attrs.items() if k not in ("activation", "activation_params")}
        attrs.update(activation=name, activation_params=params)
        z = n.input(3) if n.op == "FusedConv" else None
        return _fused_conv(build, m.x, m.w, m.b, z, _input_scale(m.y), m.act, attrs)


#: the input scale folds into 1x1 convs of at least this many output pixels. Below it the llvm
#: target's flat tiles (output channels as lanes) take the small planes, which have no input
#: scale, and the separate Mul over so few pixels is cheap. Measured on an AVX-512 host, an SE
#: block and its projection conv (+ residual) against the same with the Mul, same process:
#: folded at 7x7 (into the pixel tiles) 1.11-1.24x the time; at 14x14 0.82-1.00x at 1 thread and
#: 0.66-0.92x at 2; at 28x28 and larger 0.52-0.97x at 1 thread and 0.54-0.75x at 2
INPUT_SCALE_MIN_PIXELS = 100


def _channel_factors(shape) -> bool:
    """[?, ?, 1, 1]: one factor per (image and) channel of a 2-D conv's input."""
    return len(shape) == 4 and shape[2] == 1 and shape[3] == 1


class FuseConvInputScale(Rule):
    """Conv(Mul(a, S), W, b), S [1 or N, C, 1, 1] (a per-input-channel scale: the
    squeeze-excitation block's output, Sigmoid or HardSigmoid of its second 1x1 conv) and W
    1x1 of stride 1, no padding, group 1 ==> FusedConv(a, W, b, S=S): the conv kernel multiplies
    each input vector by its channel's factor as it reads it, instead of a separate kernel
    reading and writing all of a [N, C, H, W] (EfficientNet, MobileNetV3, RegNet-Y: one per
    block). Exact up to rounding: sum_c W[m, c] * (a[c, p] * S[c]) is what the Mul then Conv
    compute, in the same order. Only where the Mul's output feeds this conv alone, f32, and the
    plane has at least :data:`INPUT_SCALE_MIN_PIXELS` pixels. NCHW pipelines only (the cuda
    target's NHWC convolutions have no input scale)."""
    _scaled = P.Mul(a=Any(), s=Any().shape(_channel_factors)).single_use()
    pattern = OneOf(P.Conv(x=_scaled, w=Any(), b=Optional()),
                    FusedConvOp(x=_scaled, w=Any(), b=Optional(), z=Optional()),
                    name="y")
    layouts = ("NCHW",)

    def condition(self, m):
        conv, a, sc = m.y.producer, m.a, m.s
        mul = m.x
        x = mul.outputs[0]
        if a.type.rank != 4 or conv.inputs[1].type.rank != 4:
            return Fail(f"{conv.name}: not a 2-D convolution")
        if x.dtype != DType.f32:
            return Fail(f"{conv.name}: input {x.dtype}, not f32")
        if a.shape != x.shape:
            return Fail(f"{mul.name}: '{sc.name}' {list(sc.shape)} broadcasts '{a.name}' {list(a.shape)}")
        n, c = x.shape[:2]
        if sc.shape[0] not in (1, n) or sc.shape[1] != c or tuple(sc.shape[2:]) != (1, 1):
            return Fail(f"{mul.name}: '{sc.name}' {list(sc.shape)} is not a scale per input channel "
                        f"[1 or {n}, {c}, 1, 1]")
        if int(conv.attr("group", 1)) != 1:
            return Fail(f"{conv.name}: group {conv.attr('group')}")
        if tuple(conv.inputs[1].shape[2:]) != (1, 1):
            return Fail(f"{conv.name}: a {conv.inputs[1].shape[2]}x{conv.inputs[1].shape[3]} kernel, not 1x1")
        geo = conv_geometry_of(conv)
        if geo.strides != [1, 1] or any(geo.pads_begin + geo.pads_end):
            return Fail(f"{conv.name}: strides {geo.strides}, pads {geo.pads_begin + geo.pads_end}")
        pixels = int(np.prod(m.y.shape[2:]))
        if pixels < INPUT_SCALE_MIN_PIXELS:
            return Fail(f"{conv.name}: {pixels} output pixels, fewer than {INPUT_SCALE_MIN_PIXELS}")
        return True

    def rewrite(self, m, build):
        n = m.y.producer            # a Conv, or a FusedConv whose residual and activation are kept
        z = n.input(3) if n.op == "FusedConv" else None
        return _fused_conv(build, m.a, m.w, m.b, z, m.s, m.y, {"activation": "", "activation_params": [], **n.attrs})


RULES = [FuseConvInputScale, FuseConvAdd, FuseConvActivation]
