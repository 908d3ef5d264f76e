"""Activation patterns shared by the anchor fusion rules (fuse_conv, fuse_matmul).

:func:`activation` wraps an anchor pattern in every activation that a fused anchor op takes
(``ir.ops.activations.FUSED_ACTIVATIONS``, the one description of them); :func:`activation_of`
reads the matched activation back as (name, parameters) for the fused op's ``activation`` /
``activation_params`` attributes.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Const, OneOf, Optional, P, Pattern
from tensorfuse.compiler.rewrite import Fail
from tensorfuse.ir.graph import Value
from tensorfuse.ir.ops.activations import FUSED_ACTIVATIONS, FusedActivation
from tensorfuse.ir.registry import ShapeError


def _op_pattern(act: FusedActivation, x: Pattern) -> Pattern:
    if act.params_are_inputs:      # Clip(x, min?, max?): constant bounds, captured as clip_min ...
        bounds = [Optional(Const(), name=f"{act.op.lower()}_{p}") for p in act.params]
        return P.__getattr__(act.op)(x, *bounds)
    if act.times_x:                # SiLU: Mul(x, Sigmoid(x)), x bound once (DAG semantics)
        return P.Mul(x, P.__getattr__(act.op)(x).single_use())
    return P.__getattr__(act.op)(x)


def activation(x: Pattern) -> Pattern:
    """The activation ops applied to ``x``, captured as ``act`` (the activation's output): one
    alternative per op form of :data:`FUSED_ACTIVATIONS`, in its order (Gelu and GeluTanh are
    one Gelu pattern, told apart by :func:`activation_of`; the decomposed forms of Gelu become
    the op first, see fuse_gelu)."""
    forms: dict = {}
    for act in FUSED_ACTIVATIONS.values():
        forms.setdefault((act.op, act.times_x), _op_pattern(act, x))
    return OneOf(*forms.values(), name="act")


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
    for a in FUSED_ACTIVATIONS.values():
        core = n
        if a.times_x:
            if n.op != "Mul":
                continue
            core = next((v.producer for v in n.inputs if v is not None and v.producer is not None
                         and v.producer.op == a.op), None)
            if core is None:
                continue
        if core.op != a.op or any(core.attr(k) != v for k, v in a.attrs):
            continue
        if a.params_are_inputs:
            params = [_scalar(core.input(i + 1), p, d) for i, (p, d) in enumerate(zip(a.params, a.defaults))]
            fail = next((p for p in params if isinstance(p, Fail)), None)
            if fail is not None:
                return fail
        else:
            params = [float(core.attr(p)) for p in a.params]
        return a.name, params
    attrs = ", ".join(f"{k}={n.attr(k)!r}" for k in sorted({k for a in FUSED_ACTIVATIONS.values() for k, _ in a.attrs
                                                           if a.op == n.op}))
    return Fail(f"{n.name}: {n.op}{' with ' + attrs if attrs else ''} is not an activation the fused ops take")


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


def rebuild_activation(build, act: Value, x: Value):
    """The activation matched as ``act`` (:func:`activation`) applied to ``x`` instead: the same
    op (SiLU: Mul(x, Sigmoid(x))), domain, attributes and constant inputs (Clip's bounds).
    Returns the new value, or Fail when the ops reject ``x`` (a ShapeError)."""
    n = act.producer
    dom = {"domain": n.domain} if n.domain else {}
    try:
        if n.op == "Mul":           # SiLU, x * Sigmoid(x) (activation_of accepted only that form)
            sig = next(v.producer for v in n.inputs if v is not None and v.producer is not None
                       and v.producer.op == "Sigmoid")
            return build.op("Mul", x, build.op("Sigmoid", x, **sig.attrs), **n.attrs)
        return build.op(n.op, x, *n.inputs[1:], **dom, **n.attrs)
    except ShapeError as e:
        return Fail(f"{n.op} cannot be applied to {x.name}: {e}")
