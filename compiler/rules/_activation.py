"""Activation patterns shared by the anchor fusion rules (fuse_conv, fuse_matmul).

:func:`activation` wraps an anchor pattern in every activation that a fused anchor op takes
(see ``ir.ops.fused.ACTIVATIONS``); :func:`activation_of` reads the matched activation back as
(name, parameters) for the fused op's ``activation`` / ``activation_params`` attributes.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.compiler.pattern import Const, OneOf, Optional, P, Pattern
from tensorfuse.compiler.rewrite import Fail
from tensorfuse.ir.graph import Value
from tensorfuse.ir.registry import ShapeError


def activation(x: Pattern) -> Pattern:
    """The activation ops applied to ``x``, captured as ``act`` (the activation's output).

    SiLU is Mul(x, Sigmoid(x)) (x bound once: DAG semantics); Gelu is the ONNX op (the
    decomposed forms become it first, see fuse_gelu)."""
    return OneOf(
        P.Relu(x),
        P.Clip(x, Optional(Const(), name="clip_min"), Optional(Const(), name="clip_max")),
        P.LeakyRelu(x),
        P.Sigmoid(x),
        P.HardSigmoid(x),
        P.HardSwish(x),
        P.Mul(x, P.Sigmoid(x).single_use()),
        P.Tanh(x),
        P.Gelu(x),
        name="act")


def _scalar(v: Value | None, what: str, default: float):
    if v is None:
        return default
    d = np.asarray(v.data)
    if d.size != 1:
        return Fail(f"Clip {what} '{v.name}' has {d.size} elements, expected a scalar")
    return float(d.reshape(-1)[0])


def activation_of(act: Value):
    """(activation name, parameters) for the ``act`` value matched by :func:`activation`, or Fail."""
    n = act.producer
    if n.op == "Relu":
        return "Relu", []
    if n.op == "Clip":
        lo = _scalar(n.input(1), "min", -math.inf)
        hi = _scalar(n.input(2), "max", math.inf)
        for b in (lo, hi):
            if isinstance(b, Fail):
                return b
        return "Clip", [lo, hi]
    if n.op == "LeakyRelu":
        return "LeakyRelu", [float(n.attr("alpha"))]
    if n.op == "HardSigmoid":
        return "HardSigmoid", [float(n.attr("alpha")), float(n.attr("beta"))]
    if n.op == "Mul":
        return "SiLU", []
    if n.op == "Gelu":
        mode = n.attr("approximate", "none")
        if mode not in ("none", "tanh"):
            return Fail(f"{n.name}: Gelu approximate={mode!r} is not handled")
        return ("GeluTanh" if mode == "tanh" else "Gelu"), []
    if n.op in ("Sigmoid", "HardSwish", "Tanh"):
        return n.op, []
    return Fail(f"{n.name}: {n.op} is not an activation the fused ops take")


def build_or_fail(build, op: str, *inputs, expect: Value | None = None, **attrs):
    """``build.op(...)``; a ShapeError becomes Fail (the rewrite does not apply), and so does a
    result whose type differs from ``expect``'s."""
    try:
        out = build.op(op, *inputs, **attrs)
    except ShapeError as e:
        return Fail(f"{op} cannot replace the match: {e}")
    if expect is not None and out.type != expect.type:
        return Fail(f"{op} would give {out.type}, the matched value is {expect.type}")
    return out
