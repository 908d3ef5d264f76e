"""LayerNorm family: the decomposed LayerNorm ==> ONNX LayerNormalization; Gather (embedding) +
Add chain + LayerNormalization ==> ``tensorfuse::EmbedLayerNormalization``; Add +
LayerNormalization ==> ``tensorfuse::SkipLayerNormalization``.

Rule order matters where roots coincide: EmbedLayerNorm is tried before SkipLayerNorm on a
LayerNormalization node, so an embedding sum is taken whole.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, OneOf, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail
from tensorfuse.ir.ops._common import norm_axis
from tensorfuse.ir.types import DType

# ----------------------------------------------------------------------------- decomposed form
_x = Any("x")
_mean = P.ReduceMean(_x, Optional(Const(), name="axes1")).named("rm1").single_use()
_d1 = P.Sub(_x, _mean).single_use()      # the two uses of x - mean may be one Sub node or two
_d2 = P.Sub(_x, _mean).single_use()
_var = P.ReduceMean(OneOf(P.Pow(_d1, Const(2.0)), P.Mul(_d1, _d1)).single_use(),
                    Optional(Const(), name="axes2")).named("rm2").single_use()
_std = P.Sqrt(P.Add(_var, Const(name="eps")).single_use()).single_use()
_norm = OneOf(P.Div(_d2, _std), P.Mul(_d2, P.Reciprocal(_std).single_use())).single_use()
_scaled = P.Mul(_norm, Any("gamma"))


def _reduce_axes(node, axes_value, rank: int):
    """Sorted normalised axes of a ReduceMean (input or attribute), or Fail."""
    if int(node.attr("keepdims", 1)) != 1:
        return Fail(f"{node.name}: keepdims=0, the LayerNorm form keeps the reduced dims")
    if axes_value is not None:
        axes = [int(a) for a in np.asarray(axes_value.data).ravel()]
    else:
        axes = [int(a) for a in (node.attr("axes") or [])]
    if not axes:
        if int(node.attr("noop_with_empty_axes", 0)):
            return Fail(f"{node.name}: reduces no axis (noop_with_empty_axes=1)")
        return list(range(rank))
    return sorted(a % rank for a in axes)


class LayerNormFromParts(Rule):
    """(x - mean) / Sqrt(ReduceMean((x - mean)^2) + eps) * gamma + beta ==> LayerNormalization(x, gamma, beta, axis, epsilon)."""
    pattern = OneOf(P.Add(_scaled.single_use(), Any("beta")), _scaled, name="y")

    def condition(self, m):
        x = m.x
        if m.beta is None:
            users = m.graph.users().get(m.y, [])
            if len(users) == 1 and users[0].op == "Add" and m.y not in m.graph.outputs:
                return Fail(f"{users[0].name}: an Add follows the scaling; the rule matches there, with its beta")
        if x.dtype != DType.f32:
            return Fail(f"'{x.name}' is {x.dtype}: only float32 is rewritten (LayerNormalization computes "
                        f"its statistics in float32, which would change f16/f64 results)")
        rank = x.type.rank
        a1 = _reduce_axes(m.rm1, m.axes1, rank)
        a2 = _reduce_axes(m.rm2, m.axes2, rank)
        for a in (a1, a2):
            if isinstance(a, Fail):
                return a
        if a1 != a2:
            return Fail(f"{m.rm1.name} reduces axes {a1} but {m.rm2.name} reduces {a2}")
        if not a1 or a1 != list(range(a1[0], rank)):
            return Fail(f"{m.rm1.name}: axes {a1} are not the trailing axes of rank {rank}")
        if m.eps.data.size != 1:
            return Fail(f"epsilon '{m.eps.name}' has shape {list(m.eps.shape)}, expected a scalar")
        if m.y.type != x.type:
            return Fail(f"the result {m.y.type} differs from x's type {x.type} (gamma or beta broadcast it)")
        for name in ("gamma", "beta"):
            v = m[name]
            if v is None:
                continue
            s = tuple(v.shape)
            if len(s) > rank or any(d not in (1, t) for d, t in zip(s[::-1], x.shape[::-1])):
                return Fail(f"{name} '{v.name}' of shape {list(s)} is not unidirectionally broadcastable "
                            f"to x {list(x.shape)}")
        return True

    def rewrite(self, m, build):
        axis = _reduce_axes(m.rm1, m.axes1, m.x.type.rank)[0]
        eps = float(np.asarray(m.eps.data).reshape(-1)[0])
        return build_or_fail(build, "LayerNormalization", m.x, m.gamma, m.beta, expect=m.y,
                             axis=axis, epsilon=eps)


# ----------------------------------------------------------------------------- LayerNorm checks
def _ln_condition(ln):
    """LayerNormalization with only its Y output and stash_type=1 (the fused ops' precision)."""
    if len([o for o in ln.outputs if o is not None]) != 1:
        return Fail(f"{ln.name}: LayerNormalization also returns Mean/InvStdDev, which the fused op does not")
    if int(ln.attr("stash_type", 1)) != 1:
        return Fail(f"{ln.name}: stash_type={ln.attr('stash_type')} (the fused op computes in float32)")
    return True


def _needs_sum(m, s) -> bool:
    """Is the sum read outside the match, or a graph output (so the fused op must return it)?"""
    g = m.graph
    ids = {id(n) for n in m.nodes}
    return any(v is s for v in g.outputs) or any(id(n) not in ids for n in g.users().get(s, []))


def _replace_with(m, out, s):
    ys = out if isinstance(out, list) else [out]
    repl = {m.layernormalization.outputs[0]: ys[0]}
    if len(ys) > 1:
        repl[s] = ys[1]
    return repl


# ----------------------------------------------------------------------------- embedding
def _leaf(i: int):
    return OneOf(P.Gather(Any(), Any()).attrs(axis=0).named(f"g{i}").single_use(), Any(), name=f"t{i}")


_L = [_leaf(i) for i in range(4)]
_add2 = P.Add(_L[0], _L[1])
_sum_chain = OneOf(
    P.Add(P.Add(_add2.single_use(), _L[2]).single_use(), _L[3]),
    P.Add(_add2.single_use(), P.Add(_L[2], _L[3]).single_use()),
    P.Add(_add2.single_use(), _L[2]),
    _add2,
    name="sum")


class EmbedLayerNorm(Rule):
    """LayerNormalization(Gather(table, ids) + ... + addends) ==> EmbedLayerNormalization (2 to 4 terms, at least one Gather on axis 0)."""
    pattern = P.LayerNormalization(_sum_chain, scale=Any(), B=Optional())

    def condition(self, m):
        ok = _ln_condition(m.layernormalization)
        if not ok:
            return ok
        gathers = [m[f"g{i}"] for i in range(4) if m[f"g{i}"] is not None]
        if not gathers:
            return Fail(f"{m.layernormalization.name}: no term of the sum is a Gather on axis 0 with no other consumer")
        for g in gathers:
            if g.inputs[1].dtype not in (DType.i32, DType.i64):
                return Fail(f"{g.name}: indices are {g.inputs[1].dtype}")
        if not m.sum.dtype.is_float:
            return Fail(f"the sum '{m.sum.name}' is {m.sum.dtype}, not a float type")
        return True

    def rewrite(self, m, build):
        ln = m.layernormalization
        ins, addends, k = [], [], 0
        for i in range(4):
            t, g = m[f"t{i}"], m[f"g{i}"]
            if t is None:
                continue
            if g is not None:
                ins += [g.inputs[0], g.inputs[1]]
                k += 1
            else:
                addends.append(t)
        ins += [m.scale, m.B] + addends
        n_out = 2 if _needs_sum(m, m.sum) else 1
        try:
            out = build.op("EmbedLayerNormalization", *ins, domain="tensorfuse", num_gathers=k,
                           axis=int(ln.attr("axis", -1)), epsilon=float(ln.attr("epsilon", 1e-5)),
                           num_outputs=n_out)
        except ValueError as e:     # ShapeError included
            return Fail(f"EmbedLayerNormalization cannot replace the match: {e}")
        ys = out if isinstance(out, list) else [out]
        if ys[0].type != ln.outputs[0].type or (n_out == 2 and ys[1].type != m.sum.type):
            return Fail(f"EmbedLayerNormalization would give {ys[0].type}, the match is {ln.outputs[0].type}")
        return _replace_with(m, out, m.sum)


# ----------------------------------------------------------------------------- skip
class SkipLayerNorm(Rule):
    """LayerNormalization(Add(x, skip)) ==> SkipLayerNormalization(x, skip, scale, B) (also returning the sum when it is read elsewhere)."""
    pattern = P.LayerNormalization(P.Add(x=Any(), skip=Any()), scale=Any(), B=Optional())

    def condition(self, m):
        ok = _ln_condition(m.layernormalization)
        if not ok:
            return ok
        s = m.add.outputs[0]
        return s.dtype.is_float or Fail(f"the sum '{s.name}' is {s.dtype}, not a float type")

    def rewrite(self, m, build):
        ln = m.layernormalization
        s = m.add.outputs[0]
        n_out = 2 if _needs_sum(m, s) else 1
        try:
            out = build.op("SkipLayerNormalization", m.x, m.skip, m.scale, m.B, domain="tensorfuse",
                           axis=int(ln.attr("axis", -1)), epsilon=float(ln.attr("epsilon", 1e-5)),
                           num_outputs=n_out)
        except ValueError as e:
            return Fail(f"SkipLayerNormalization cannot replace the match: {e}")
        ys = out if isinstance(out, list) else [out]
        if ys[0].type != ln.outputs[0].type:
            return Fail(f"SkipLayerNormalization would give {ys[0].type}, the match is {ln.outputs[0].type}")
        return _replace_with(m, out, s)


RULES = [LayerNormFromParts, EmbedLayerNorm, SkipLayerNorm]
