"""Scaled dot-product attention ==> ``tensorfuse::Attention``.

    MatMul(Softmax(MatMul(q, kT) * scale + mask, axis=-1), v)

The scale may be a Mul or a Div by a scalar constant on the scores, on q or on kT (or several of
them: the factors multiply); the mask is an Add of any value that broadcasts to the scores, or a
``Where(cond, scores, fill)`` with a bool condition and a scalar constant fill (GPT-2's causal
mask: the fused op's ``mask_fill``); the
Softmax must be on the last axis. The fused op takes K as [..., Sk, D]: kT is transposed back,
composed with the Transpose that produced it when there is one (the usual export reshapes the
keys to [b, s, h, d] and transposes with perm [0, 2, 3, 1]).
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, OneOf, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail


def _uniform(v) -> bool:
    """one value repeated"""
    d = np.asarray(v.data)
    return d.size > 0 and bool(np.all(d == d.reshape(-1)[0]))


def _scaled(x, name: str):
    """x, or x * c / x / c by a constant c of one repeated value, with no other consumer."""
    c = Const().where(_uniform, "a scale (one value repeated)")
    return OneOf(P.Mul(x, c.named(f"{name}_mul")).single_use().named(f"{name}_m"),
                 P.Div(x, c.named(f"{name}_div")).single_use().named(f"{name}_d"),
                 x)


_scores = P.MatMul(_scaled(Any("q"), "qs"), _scaled(Any("kt"), "ks")).named("qk").single_use()
_logits = _scaled(_scores, "ss")
_fill = Const().where(lambda v: np.asarray(v.data).size == 1, "a scalar fill value").named("fill")
_masked = OneOf(P.Add(_logits, Any("mask")).single_use().named("add_mask"),
                P.Where(Any("cond"), _logits, _fill).single_use().named("where_mask"),
                _logits)
pattern_ = P.MatMul(P.Softmax(_masked).single_use(), Any("v")).named("attn")


def _factor(m, name: str):
    """The scale factor contributed by capture ``name`` (1.0 when absent), or Fail."""
    c_mul, c_div = m[f"{name}_mul"], m[f"{name}_div"]
    c = c_mul if c_mul is not None else c_div
    if c is None:
        return 1.0
    d = np.asarray(c.data)
    node = m[f"{name}_m"] or m[f"{name}_d"]
    operand = node.inputs[1] if node.inputs[0] is c and node.op == "Mul" else node.inputs[0]
    if node.outputs[0].shape != operand.shape:
        return Fail(f"{node.name}: the scale '{c.name}' of shape {list(c.shape)} broadcasts its operand "
                    f"{list(operand.shape)} to {list(node.outputs[0].shape)}")
    v = float(d.reshape(-1)[0])
    if c_div is not None:
        if v == 0.0:
            return Fail(f"{node.name}: divides by zero")
        return 1.0 / v
    return v


def _softmax_axis_ok(m):
    sm = m.softmax
    rank = sm.inputs[0].type.rank
    ax = int(sm.attr("axis", -1))
    return ax in (-1, rank - 1)


class FuseAttention(Rule):
    """MatMul(Softmax(MatMul(q, kT) * scale + mask, axis=-1), v) ==> Attention(q, k, v, mask, scale)."""
    pattern = pattern_

    def condition(self, m):
        sm = m.softmax
        if not _softmax_axis_ok(m):
            return Fail(f"{sm.name}: Softmax on axis {sm.attr('axis')}, not the last axis")
        for nm in ("q", "kt", "v"):
            v = m[nm]
            if v.type.rank < 2:
                return Fail(f"'{v.name}' ({nm}) has rank {v.type.rank}; MatMul's 1-D semantics are not attention")
        if not m.q.dtype.is_float:
            return Fail(f"'{m.q.name}' is {m.q.dtype}, not a float type")
        for name in ("qs", "ks", "ss"):
            f = _factor(m, name)
            if isinstance(f, Fail):
                return f
        if m.mask is not None and m.mask.dtype != m.q.dtype:
            return Fail(f"mask '{m.mask.name}' is {m.mask.dtype}, the scores are {m.q.dtype}")
        if m.where_mask is not None:
            wm = m.where_mask
            if m.fill.dtype != m.q.dtype:
                return Fail(f"{wm.name}: the fill '{m.fill.name}' is {m.fill.dtype}, the scores are {m.q.dtype}")
            scores = wm.inputs[1]
            if wm.outputs[0].shape[-2:] != scores.shape[-2:]:
                return Fail(f"{wm.name}: the condition broadcasts the scores {list(scores.shape)} "
                            f"to {list(wm.outputs[0].shape)}")
        return True

    def rewrite(self, m, build):
        scale = 1.0
        for name in ("qs", "ks", "ss"):
            scale *= _factor(m, name)
        kt = m.kt
        rank = kt.type.rank
        swap = list(range(rank - 2)) + [rank - 1, rank - 2]
        src = kt.producer
        if src is not None and src.op == "Transpose":
            p = src.attr("perm")
            p = list(range(rank))[::-1] if not p else [int(i) for i in p]
            q = [p[j] for j in swap]
            k = src.inputs[0] if q == list(range(rank)) else build.Transpose(src.inputs[0], perm=q)
        else:
            k = build.Transpose(kt, perm=swap)
        if m.where_mask is not None:
            fill = float(np.asarray(m.fill.data).reshape(-1)[0])
            return build_or_fail(build, "Attention", m.q, k, m.v, m.cond, domain="tensorfuse",
                                 expect=m.attn.outputs[0], scale=float(scale), mask_fill=fill)
        return build_or_fail(build, "Attention", m.q, k, m.v, m.mask, domain="tensorfuse",
                             expect=m.attn.outputs[0], scale=float(scale))


RULES = [FuseAttention]
