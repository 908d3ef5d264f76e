"""A zero Pad of the spatial dims folded into the Conv that reads it.

Exporters that follow TensorFlow's "SAME" padding (Hugging Face's MobileNetV2 and EfficientNet
ports, TF-converted models) write an explicit ``Pad`` before a convolution, often asymmetric
(one more row and column at the end). A constant-mode Pad with value 0 of the spatial dims only
is exactly the convolution's own zero padding (ONNX spec, Conv-11: ``pads`` holds the begin
and end padding per spatial axis, and may be asymmetric), so

    Conv(Pad(x, [0, 0, b1, ..., 0, 0, e1, ...], value 0), W, B; pads=[p_b..., p_e...])
      == Conv(x, W, B; pads=[p_b + b..., p_e + e...])

and the Pad's copy of the whole tensor (a kernel of its own, memory-bound: 15% of MobileNetV2-HF's
time at 1 thread) goes away; the convolution schedules handle the border in their loops.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail
from tensorfuse.ir.ops.pad import pad_plan


class FoldPadIntoConv(Rule):
    """Conv(Pad(x, pads, 0), W, B) with a constant-mode zero Pad of the spatial dims only (no
    cropping, nothing on N and C) and a Conv with explicit pads (auto_pad NOTSET, or VALID: none)
    ==> Conv(x, W, B) with the Pad's begin/end amounts added to the Conv's ``pads``."""
    pattern = P.Conv(x=P.Pad(data=Any(), pads=Const(), value=Optional(Const()), axes=Optional(Const())).single_use(),
                     w=Any(), b=Optional(Any()))

    def condition(self, m):
        pad, conv = m.x, m.conv      # (a keyword on an op pattern captures the node)
        mode = pad.attr("mode", "constant")
        if mode != "constant":
            return Fail(f"{pad.name}: mode {mode!r}, not constant (zero) padding")
        if m.value is not None and np.any(np.asarray(m.value.data) != 0):
            return Fail(f"{pad.name}: pads with {np.asarray(m.value.data).reshape(-1)[:1].item()}, not 0")
        if conv.attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
            return Fail(f"{conv.name}: auto_pad {conv.attr('auto_pad')} (its padding depends on the input size)")
        x = m.data
        if not all(isinstance(d, int) for d in x.shape):
            return Fail(f"{pad.name}: input shape {list(x.shape)} is not known")
        plan = pad_plan(x.shape, m.pads.data, None if m.axes is None else m.axes.data)
        for axis, (lo, n, b, e) in enumerate(plan):
            if lo or n != x.shape[axis]:
                return Fail(f"{pad.name}: crops axis {axis} (negative pads)")
            if axis < 2 and (b or e):
                return Fail(f"{pad.name}: pads axis {axis} ({'N' if axis == 0 else 'C'}), which a Conv cannot")
        return True

    def rewrite(self, m, build):
        x = m.data
        plan = pad_plan(x.shape, m.pads.data, None if m.axes is None else m.axes.data)
        nsp = len(x.shape) - 2
        valid = m.conv.attr("auto_pad", "NOTSET") == "VALID"       # VALID: no padding of its own
        cp = [0] * (2 * nsp) if valid else [int(p) for p in (m.conv.attr("pads") or [0] * (2 * nsp))]
        pads = [cp[i] + plan[2 + i][2] for i in range(nsp)] + [cp[nsp + i] + plan[2 + i][3] for i in range(nsp)]
        attrs = dict(m.conv.attrs)
        attrs["pads"] = pads
        attrs.pop("auto_pad", None)
        ins = [x, m.w] + ([m.b] if m.b is not None else [])
        return build_or_fail(build, "Conv", *ins, expect=m.conv.outputs[0], **attrs)


RULES = [FoldPadIntoConv]
