"""Conv epilogue fusion: Conv (+ bias) + Add (residual or constant) + activation ==> one
``tensorfuse::FusedConv`` whose epilogue runs in the Conv kernel before its single store.

Two rules, applied in graph order: the Add joins first (FuseConvAdd), then the activation
(FuseConvActivation) joins a Conv or a FusedConv that has none yet. A constant added per output
channel goes into the bias instead of the residual input.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, OneOf, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import activation, activation_of, build_or_fail

FUSED_CONV = "tensorfuse::FusedConv"

_conv = P.Conv(x=Any(), w=Any(), b=Optional()).single_use()


def _per_channel(z, out_shape) -> bool:
    """Is constant ``z`` (right-aligned against the output) 1 everywhere but the channel dim?"""
    s = (1,) * (len(out_shape) - z.type.rank) + tuple(z.shape)
    return len(s) == len(out_shape) and all(d == 1 for i, d in enumerate(s) if i != 1)


class FuseConvAdd(Rule):
    """Add(Conv(x, W, b), z) ==> FusedConv(x, W, b, Z=z) (a per-channel constant z goes into the bias instead)."""
    pattern = P.Add(_conv, z=Any())

    def condition(self, m):
        y, out = m.conv.outputs[0], m.add.outputs[0]
        if out.shape != y.shape:
            return Fail(f"{m.add.name}: '{m.z.name}' of shape {list(m.z.shape)} broadcasts the Conv output "
                        f"{list(y.shape)} to {list(out.shape)}")
        if m.z.dtype != y.dtype:
            return Fail(f"{m.add.name}: '{m.z.name}' is {m.z.dtype}, the Conv output is {y.dtype}")
        return True

    def rewrite(self, m, build):
        y = m.conv.outputs[0]
        attrs = dict(m.conv.attrs)
        out = m.add.outputs[0]
        if m.z.is_const and _per_channel(m.z, y.shape) and (m.b is None or m.b.is_const):
            ch = y.shape[1]
            zc = np.broadcast_to(m.z.data.reshape(-1), (ch,)).astype(np.float64)
            b0 = np.zeros(ch) if m.b is None else m.b.data.astype(np.float64)
            bias = build.const((b0 + zc).astype(y.dtype.numpy), "b_fused")
            return build_or_fail(build, "Conv", m.x, m.w, bias, expect=out, **attrs)
        return build_or_fail(build, "FusedConv", m.x, m.w, m.b, m.z, domain="tensorfuse", expect=out,
                             attributes=dict(attrs, activation="", activation_params=[]))


_anchor = OneOf(P.Conv(x=Any(), w=Any(), b=Optional()),
                P.__getattr__(FUSED_CONV)(x=Any(), w=Any(), b=Optional(), z=Optional())
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
        return build_or_fail(build, "FusedConv", m.x, m.w, m.b, z, domain="tensorfuse", expect=m.act,
                             attributes=attrs)


RULES = [FuseConvAdd, FuseConvActivation]
