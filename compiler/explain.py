"""``explain``: why did a rule fire, or not, at each node (DESIGN.md, "Rewrites as DAG patterns").

For each candidate node (one whose op can be the root of the rule's pattern) it reports whether
the rule matched and would apply; if not, the first failed predicate in words with node names,
e.g. ``"Relu_3: input 0 is produced by MaxPool (pool1), expected Conv"``, or the reason the
rule's condition or rewrite gave (``Fail("BatchNormalization in training mode")``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensorfuse.compiler.rewrite import Application, Fail, Rule, try_rule
from tensorfuse.ir.graph import Graph, Node

__all__ = ["explain", "Explanation", "ExplainRecord"]


@dataclass
class ExplainRecord:
    """One candidate: node name and op, whether the rule applies there, and if not why."""

    rule: str
    node: str
    op: str
    matched: bool
    reason: str | None = None
    nodes: list[str] = field(default_factory=list)   # the matched nodes, when it matched

    def __str__(self) -> str:
        if self.matched:
            return f"{self.node} ({self.op}): {self.rule} applies to {', '.join(self.nodes)}"
        return f"{self.node} ({self.op}): {self.rule} does not apply: {self.reason}"


class Explanation(list):
    """A list of :class:`ExplainRecord`; prints one line per candidate."""

    def __str__(self) -> str:
        if not self:
            return "no candidate nodes"
        return "\n".join(str(r) for r in self)

    @property
    def reasons(self) -> dict[str, str | None]:
        return {r.node: r.reason for r in self}


def _rule(rule: Any) -> Rule:
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, type) and issubclass(rule, Rule):
        return rule()
    if isinstance(rule, str):
        from tensorfuse.compiler.pipeline import all_rules
        rules = all_rules()
        if rule not in rules:
            raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(rules)}")
        return _rule(rules[rule])
    raise TypeError(f"rule must be a Rule class, instance or name, got {rule!r}")


def _graph_for(model_or_graph: Any, rule: Rule, opt_level: int, input_shapes) -> Graph:
    """The graph as the rule sees it: for a model, imported and run through the passes of
    ``opt_level`` that come before the pass holding the rule."""
    if isinstance(model_or_graph, Graph):
        return model_or_graph
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import _Dumper, _run, PipelineResult, build_passes
    g = import_onnx(model_or_graph, input_shapes=input_shapes)
    res = PipelineResult(opt_level)
    for name, p in build_passes(opt_level):
        members = p if isinstance(p, list) else [(name, p)]
        if any(rule.name in {r.name for r in getattr(q, "rules", ())} for _, q in members):
            break
        for _ in range(4 if isinstance(p, list) else 1):
            if not any([_run(n, q, g, res, False, _Dumper(None)) for n, q in members]):
                break
    return g


def explain(model_or_graph: Any, rule: Any, node: "str | Node | None" = None, *, opt_level: int = 2,
            input_shapes: dict | None = None, quiet: bool = False) -> Explanation:
    """Why ``rule`` does or does not apply at each candidate node (or only at ``node``).

    model_or_graph: an ``ir.Graph`` (used as is), or an ONNX model (path, bytes, ModelProto),
    which is imported and optimised at ``opt_level`` up to the pass that runs the rule.
    rule: a Rule class, instance or name. Prints the records (unless ``quiet``) and returns
    them as an :class:`Explanation`. Nothing in the given graph is changed: a rule whose
    pattern matches is tried (condition and rewrite) on a copy.

    Raises ValueError for an unknown rule name or a node name not in the graph.
    """
    r = _rule(rule)
    g = _graph_for(model_or_graph, r, opt_level, input_shapes)
    ops = r.root_ops()
    if node is not None:
        name = node.name if isinstance(node, Node) else node
        try:
            cands = [g.node(name)]
        except KeyError:
            raise ValueError(f"graph {g.name} has no node named {name!r}") from None
    else:
        cands = [n for n in g.nodes if ops is None or n.qualified_op in ops]
    out = Explanation()
    for n in cands:
        if ops is not None and n.qualified_op not in ops:
            out.append(ExplainRecord(r.name, n.name, n.qualified_op, False,
                                     f"{n.name} is {n.qualified_op}; the pattern's root is "
                                     f"{' or '.join(sorted(ops))}"))
            continue
        res = try_rule(g, r, n, apply=False)
        if isinstance(res, Application):
            res = _trial(g, r, n.name)      # the rewrite itself may still refuse
        if isinstance(res, Application):
            out.append(ExplainRecord(r.name, n.name, n.qualified_op, True, None, res.nodes))
        else:
            out.append(ExplainRecord(r.name, n.name, n.qualified_op, False, str(res.reason)))
    if not quiet:
        print(out)
    return out


def _trial(g: Graph, r: Rule, node_name: str) -> "Application | Fail":
    copy = g.copy()
    res = try_rule(copy, r, copy.node(node_name))
    return res if isinstance(res, (Application, Fail)) else Fail(str(res.reason))
