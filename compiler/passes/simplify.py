"""Identity elimination and Transpose/Reshape chain simplification, as rewrite rules.

Each rule keeps ONNX semantics exactly; shapes are static, so a "no-op" is decided by types.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, OneOf, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule, apply_rules
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import op_names

#: ops that only reinterpret row-major data with a new shape (``OpDef.reshape_only``: Flatten,
#: Reshape, Squeeze, Unsqueeze)
RESHAPES = op_names("reshape_only")


def _perm(node) -> list[int]:
    rank = len(node.inputs[0].shape)
    p = node.attr("perm")
    return list(range(rank))[::-1] if p is None or len(p) == 0 else [int(i) for i in p]


class RemoveIdentity(Rule):
    """Identity(x) ==> x."""
    pattern = P.Identity(x=Any())

    def rewrite(self, m, build):
        return m.x


class RemoveInferenceDropout(Rule):
    """Dropout(x) in inference mode ==> x (and its mask output ==> a constant of ones)."""
    pattern = P.Dropout(x=Any(), ratio=Optional(), training_mode=Optional(Const(False)))

    def rewrite(self, m, build):
        outs = m.dropout.outputs
        repl = {outs[0]: m.x}
        if len(outs) > 1:
            repl[outs[1]] = build.const(np.ones(outs[1].shape, np.bool_), "dropout_mask")
        return repl


class RemoveSameTypeCast(Rule):
    """Cast(x) to x's own dtype ==> x."""
    pattern = P.Cast(x=Any())

    def condition(self, m):
        return m.x.dtype == m.cast.outputs[0].dtype or Fail(
            f"{m.cast.name}: casts {m.x.dtype} to {m.cast.outputs[0].dtype}")

    def rewrite(self, m, build):
        return m.x


class RemoveNoopReshape(Rule):
    """Reshape/Flatten/Squeeze/Unsqueeze/Expand(x, ...) whose output shape is x's ==> x."""
    pattern = OneOf(*[P.__getattr__(op)(x=Any(), arg=Optional()) for op in RESHAPES],
                    P.Expand(x=Any(), arg=Any()), name="y")

    def condition(self, m):
        n = m.y.producer
        return m.x.shape == m.y.shape or Fail(f"{n.name}: changes shape {list(m.x.shape)} to {list(m.y.shape)}")

    def rewrite(self, m, build):
        return m.x


class RemoveIdentityTranspose(Rule):
    """Transpose(x) with the identity permutation ==> x."""
    pattern = P.Transpose(x=Any())

    def condition(self, m):
        p = _perm(m.transpose)
        return p == list(range(len(p))) or Fail(f"{m.transpose.name}: perm {p} is not the identity")

    def rewrite(self, m, build):
        return m.x


class ComposeTransposes(Rule):
    """Transpose(Transpose(x, p1), p2) ==> Transpose(x, p1[p2]) (or x when that is the identity)."""
    pattern = P.Transpose(P.Transpose(x=Any()).named("inner")).named("outer")

    def rewrite(self, m, build):
        p1, p2 = _perm(m.inner), _perm(m.outer)
        q = [p1[j] for j in p2]               # out dim j = inner dim p2[j] = x dim p1[p2[j]]
        if q == list(range(len(q))):
            return m.x
        return build.Transpose(m.x, perm=q)


class CollapseReshapes(Rule):
    """Reshape-like(Reshape-like(x)) ==> one Reshape(x, final shape) (Reshape, Flatten, Squeeze, Unsqueeze)."""
    pattern = OneOf(*[P.__getattr__(op)(OneOf(*[P.__getattr__(i)(x=Any(), a=Optional()) for i in RESHAPES]),
                                        b=Optional()) for op in RESHAPES], name="y")

    def rewrite(self, m, build):
        shape = build.const(np.array(m.y.shape, np.int64), "shape")
        if 0 in m.y.shape:
            # a 0 in Reshape's shape copies the input's dim unless allowzero=1 (ONNX Reshape-14):
            # the final shape's zero-sized dims are meant literally (issue 24 item 6: [2, 0, 3]
            # -> [0, 6] -> [0, 3, 2] with allowzero=1 became a Reshape to [2, 3, 2]: RewriteError)
            return build.Reshape(m.x, shape, allowzero=1)
        return build.Reshape(m.x, shape)


SIMPLIFY_RULES = [RemoveIdentity, RemoveInferenceDropout, RemoveSameTypeCast, RemoveNoopReshape,
                  RemoveIdentityTranspose, ComposeTransposes, CollapseReshapes]


def simplify(graph: Graph, log: list | None = None) -> bool:
    """Apply :data:`SIMPLIFY_RULES` to a fixed point; returns whether anything changed."""
    return apply_rules(graph, SIMPLIFY_RULES, log=log) > 0
