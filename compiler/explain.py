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

__all__ = ["explain", "Explanation", "ExplainRecord", "explain_report", "FusionReport", "TuningReport"]


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
    """A list of :class:`ExplainRecord`; ``str`` and ``repr`` are one line per candidate."""

    def __str__(self) -> str:
        if not self:
            return "no candidate nodes"
        return "\n".join(str(r) for r in self)

    __repr__ = __str__

    @property
    def reasons(self) -> dict[str, str | None]:
        return {r.node: r.reason for r in self}


def _rule(rule: Any, rules: tuple = ()) -> Rule:
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, type) and issubclass(rule, Rule):
        return rule()
    if isinstance(rule, str):
        from tensorfuse.compiler.pipeline import all_rules
        known = all_rules(rules)
        if rule not in known:
            raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(known)} (a rule under test is "
                             f"given as a class, or with rules=[...])")
        return _rule(known[rule])
    raise TypeError(f"rule must be a Rule class, instance or name, got {rule!r}")


def _with_rule(rule: Any, rules) -> tuple:
    """The rules under test of an ``explain``: ``rules``, and ``rule`` too when it is a Rule
    class or instance that is neither built in nor among them (it is then a rule under test)."""
    from tensorfuse.compiler.pipeline import all_rules, rules_under_test
    rules = rules_under_test(rules)
    if isinstance(rule, str):
        return rules
    r = _rule(rule)
    known = all_rules(rules)
    if r.name not in known:
        return rules_under_test(list(rules) + [rule])
    return rules


def _pass_of(passes, rule: Rule):
    """The index of the pass (or cleanup group) of ``passes`` that runs ``rule``, or None."""
    for i, (name, p) in enumerate(passes):
        members = p if isinstance(p, list) else [(name, p)]
        if any(rule.name in {r.name for r in getattr(q, "rules", ())} for _, q in members):
            return i
    return None


def _run_pass(name: str, p, g: Graph, res) -> None:
    from tensorfuse.compiler.pipeline import CLEANUP_ROUNDS, _Dumper, _run
    members = p if isinstance(p, list) else [(name, p)]
    for _ in range(CLEANUP_ROUNDS if isinstance(p, list) else 1):
        if not any([_run(n, q, g, res, False, _Dumper(None)) for n, q in members]):
            break


def _why_not_running(rule: Rule, opt_level: int, disabled: set) -> str:
    if rule.name in disabled:
        return "disabled_rules switches it off"
    if getattr(rule, "numerics_changing", False) and opt_level < 3:
        return "it changes numerics, so it runs only at O3"
    return f"its rule set does not run at O{opt_level}"


def explain(model_or_graph: Any, rule: Any, node: "str | Node | None" = None, *, opt_level: int = 2,
            input_shapes: dict | None = None, disabled_rules=(), rules=(), quiet: bool = False) -> Explanation:
    """Why ``rule`` does or does not apply at each candidate node (or only at ``node``).

    model_or_graph: an ``ir.Graph``, on which the rule is tried as it is (nothing is changed:
    a rule whose pattern matches is tried, condition and rewrite, on a copy); or an ONNX model
    (path, bytes, ModelProto), which goes through the pipeline of ``opt_level`` as
    ``tensorfuse.compile(model, opt_level=..., disabled_rules=..., rules=...)`` runs it, up to
    and including the pass that runs the rule, so what it says matches the compile's
    ``rewrite_log``: every application of the rule in that pass (also on nodes another rule
    made in the same pass), and for every other candidate the first thing that failed,
    on the graph the pass left (or, for a node that is gone, when the pass began; a node
    another rule rewrote first says which). A rule that does not run at this level (disabled,
    O3 only) is tried on the graph the rule passes leave (before layout and fuse_ops), and
    each record says so.

    rule: a Rule class, instance or name. A class or instance that is not built in is a rule
    under test: it joins ``rules``. rules: rules under test, as for ``tensorfuse.compile``
    (each tried before the built-in rules of its set). Returns the records as an
    :class:`Explanation` (whose ``str``/``repr`` is the report), in graph order; prints nothing
    (``quiet`` is accepted for old callers and has no effect).

    Raises ValueError for an unknown rule name, a bad rule under test, or a node name not in
    the graph.
    """
    rules = _with_rule(rule, rules)
    r = _rule(rule, rules)
    if isinstance(model_or_graph, Graph):
        return _explain_on(model_or_graph, r, node)
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.options import rule_names
    from tensorfuse.compiler.pipeline import PipelineResult, build_passes
    g = import_onnx(model_or_graph, input_shapes=input_shapes)
    res = PipelineResult(opt_level)
    passes = build_passes(opt_level, disabled_rules=disabled_rules, log=res.log, rules=rules, verify=False)
    at = _pass_of(passes, r)
    if at is None:         # the rule does not run: try it on what the rule passes leave
        for name, p in passes:
            if name in ("layout", "fuse_ops"):
                break
            _run_pass(name, p, g, res)
        why = _why_not_running(r, opt_level, set(rule_names(disabled_rules)))
        out = Explanation()
        for rec in _explain_on(g, r, node):
            rec.reason = (f"{r.name} does not run at O{opt_level} ({why}); here "
                          + (f"it would apply to {', '.join(rec.nodes)}" if rec.matched else rec.reason))
            rec.matched = False
            out.append(rec)
        return out
    for name, p in passes[:at]:
        _run_pass(name, p, g, res)
    ops = r.root_ops()
    before = {n.name: n.qualified_op for n in g.nodes}
    before_why = {rec.node: rec for rec in _explain_on(g, r, None, trial=False)}
    order = [n.name for n in g.nodes]
    start = len(res.log)
    _run_pass(*passes[at], g, res)
    apps = [a for a in res.log[start:] if a.rule == r.name]
    now = {rec.node: rec for rec in _explain_on(g, r, None)}
    now_order = [n.name for n in g.nodes]
    out = Explanation()
    done: set[str] = set()
    app_roots = {a.root: a for a in apps}

    def applied(a) -> ExplainRecord:
        return ExplainRecord(r.name, a.root, a.root_op, True, None, list(a.nodes))

    for name in order:                     # the candidates as the pass found them, in graph order
        if name in app_roots:
            out.append(applied(app_roots[name]))
        elif name in now:
            out.append(now[name])
        elif name in before_why:
            rec = before_why[name]
            if not rec.matched:
                out.append(rec)
            else:
                by = next((a for a in res.log[start:] if name in a.nodes), None)
                what = f"{by.rule} rewrote it first ({by})" if by is not None else "another rule removed it first"
                out.append(ExplainRecord(r.name, name, before[name], False,
                                         f"{name}: the rule matched when pass {passes[at][0]} began, but {what}"))
        else:
            continue
        done.add(name)
    for a in apps:                          # roots another rule made during the pass
        if a.root not in done:
            out.append(applied(a))
            done.add(a.root)
    out.extend(now[n] for n in now_order if n in now and n not in done)
    if node is not None:
        name = node.name if isinstance(node, Node) else node
        known = set(before) | set(now_order) | {x for a in res.log for x in a.nodes + a.created}
        if name not in known:
            raise ValueError(f"graph {g.name} has no node named {name!r}")
        picked = [rec for rec in out if rec.node == name or name in rec.nodes]
        if not picked:
            op = before.get(name) or next((n.qualified_op for n in g.nodes if n.name == name), "?")
            picked = [ExplainRecord(r.name, name, op, False,
                                    f"{name} is {op}; the pattern's root is {' or '.join(sorted(ops or ()))}")]
        out = Explanation(picked)
    return out


def _explain_on(g: Graph, r: Rule, node: "str | Node | None", trial: bool = True) -> Explanation:
    """The records of ``r`` on ``g`` as it is (see :func:`explain`); ``trial``: also try the
    rewrite of a rule that matches (on a copy)."""
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
        if isinstance(res, Application) and trial:
            res = _trial(g, r, n.name)      # the rewrite itself may still refuse
        if isinstance(res, Application):
            out.append(ExplainRecord(r.name, n.name, n.qualified_op, True, None, res.nodes))
        else:
            out.append(ExplainRecord(r.name, n.name, n.qualified_op, False, str(res.reason)))
    return out


def _trial(g: Graph, r: Rule, node_name: str) -> "Application | Fail":
    copy = g.copy()
    res = try_rule(copy, r, copy.node(node_name))
    return res if isinstance(res, (Application, Fail)) else Fail(str(res.reason))


# ============================================================================ the fusion report


@dataclass
class CandidateReport:
    """A node left after a rule pass (nothing applies there any more): for each rule of the
    pass that could root there, in pipeline order, the first failed predicate."""

    node: str
    op: str
    onnx_nodes: list[str]
    reasons: list[tuple[str, str]]          # (rule, why not)

    def __str__(self) -> str:
        src = f" [ONNX {', '.join(self.onnx_nodes)}]" if self.onnx_nodes != [self.node] else ""
        lines = [f"    {self.node} ({self.op}){src}: no rule applies"]
        lines += [f"      - {r}: {why}" for r, why in self.reasons]
        return "\n".join(lines)


@dataclass
class ApplicationReport:
    """A rule application: rule, matched nodes, their ONNX nodes, created nodes, and the other
    rules of the pass that matched the same root node but lost (tried later in pipeline order)."""

    rule: str
    nodes: list[str]
    onnx_nodes: list[str]
    created: list[str]
    also_matched: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        made = f" -> {', '.join(self.created)}" if self.created else " (removed)"
        s = f"    + {self.rule}: {', '.join(self.nodes)}{made}"
        if self.onnx_nodes and self.onnx_nodes != self.nodes:
            s += f"  [ONNX {', '.join(self.onnx_nodes)}]"
        if self.also_matched:
            s += (f"\n      {', '.join(self.also_matched)} matched here too; {self.rule} wins: "
                  f"it comes first in pipeline order")
        return s


@dataclass
class PassReport:
    """One rule pass: its rules in order, what they did, and why nothing more applies."""

    name: str
    rules: list[str]
    applied: list[ApplicationReport] = field(default_factory=list)
    not_applied: list[CandidateReport] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"  pass {self.name} (rules in order: {', '.join(self.rules) or 'none'}): "
                 f"{len(self.applied)} applications"]
        lines += [str(a) for a in self.applied]
        lines += [str(c) for c in self.not_applied]
        return "\n".join(lines)


@dataclass
class GroupReport:
    """A group formed by fuse_ops: the fused node (None for an anchor left alone), its pattern
    kind, anchor, members (IR name, op), their ONNX nodes, and for each neighbouring op that
    stayed outside, why."""

    fused: str | None
    kind: str
    anchor: str | None
    members: list[tuple[str, str]]
    onnx_nodes: list[str]
    not_fused: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = f"fused group {self.fused}" if self.fused else f"{self.members[0][1]} '{self.members[0][0]}' alone"
        anchor = f", anchor {self.anchor}" if self.anchor else ""
        lines = [f"  {head} [{self.kind}{anchor}]: {' -> '.join(f'{op} {n}' for n, op in self.members)}"]
        lines += [f"      not fused: {why}" for why in self.not_fused]
        return "\n".join(lines)


@dataclass
class AnchorFate:
    """An ONNX anchor node (Conv, Gemm ...): the node of the optimised graph that computes it,
    the rules that fused it there (in order) and the other ONNX nodes in the same kernel."""

    node: str
    op: str
    final: str | None
    final_op: str | None
    rules: list[str]
    with_nodes: list[str]

    def __str__(self) -> str:
        if self.final is None:
            return f"  {self.op} '{self.node}': removed (folded into constants or dead)"
        rules = ", ".join(self.rules) if self.rules else "no rule (it stays its own kernel)"
        others = f"; with {', '.join(self.with_nodes)}" if self.with_nodes else ""
        return f"  {self.op} '{self.node}' -> {self.final_op} '{self.final}': {rules}{others}"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass
class TuningReport:
    """What tuning records did for a model (``explain_report(..., tuning=)``): ``records``
    (``compiler.tuning.TuningRecords`` for the target), the lowered graph's ``workloads``
    (``LoweredGraph.workloads``), ``used`` (workload key -> record applied), ``not_applied``
    (usable records that did not fully apply: a workload not in this model, a knob value no
    longer among the candidates; ``(record, reason)``) and ``ignored`` (records for another
    target or version; ``(record, reason)``). ``str`` is the text."""

    source: str
    records: Any
    workloads: dict
    used: dict
    not_applied: list
    ignored: list

    #: lines listed per section before "... and N more"
    MAX_LINES = 12

    def __str__(self) -> str:
        r = self.records
        ident = r.identity
        where = f"{ident.get('target')}" + (f" (CPU {ident['cpu']})" if "cpu" in ident else "")
        tunable = sum(1 for w in self.workloads.values() if w.space)
        lines = [f"tuning records ({self.source}) for {where}, tensorfuse {r.version}: "
                 f"{_plural(len(r.records), 'record')}, {_plural(r.n_failed, 'failed trial')} (not usable)",
                 f"  used: records for {len(self.used)} of the {_plural(tunable, 'workload')} with knobs "
                 f"({_plural(len(self.workloads), 'workload')} in all)"]
        for key, rec in self.used.items():
            wl = self.workloads.get(key)
            summary = wl.summary if wl is not None else rec.summary
            nodes = f", {_plural(wl.count, 'node')}" if wl is not None else ""
            schedule = wl.schedule if wl is not None else rec.schedule
            knobs = " ".join(f"{k}={v}" for k, v in (wl.knobs if wl is not None else rec.knobs).items())
            speed = ""
            if rec.median_ms is not None:
                speed = f" ({rec.median_ms:.4g} ms"
                if rec.default_ms:
                    speed += f", default {rec.default_ms:.4g} ms: {rec.default_ms / rec.median_ms:.2f}x"
                vs = rec.extra.get("vs_default")
                if isinstance(vs, (int, float)) and not isinstance(vs, bool) and vs > 0 and vs != 1.0:
                    speed += f", {1.0 / vs:.2f}x the default timed beside it"
                speed += f", {_plural(rec.threads, 'thread')})"
            state = " [provisional: not confirmed]" if key in getattr(r, "provisional", ()) else ""
            lines.append(f"    {summary} [{key}{nodes}]: {schedule} {knobs or '(default knobs)'}{speed}{state}")
        kept = {k: why for k, why in getattr(r, "defaulted", {}).items() if k in self.workloads}
        if kept:
            lines.append(f"  default knobs kept: {_plural(len(kept), 'workload')} with records")
            for key, why in list(kept.items())[:self.MAX_LINES]:
                lines.append(f"    {self.workloads[key].summary} [{key}]: {why}")
            if len(kept) > self.MAX_LINES:
                lines.append(f"    ... and {len(kept) - self.MAX_LINES} more")
        if self.not_applied:
            lines.append(f"  usable but not applied: {_plural(len(self.not_applied), 'record')}")
            for rec, why in self.not_applied[:self.MAX_LINES]:
                lines.append(f"    {rec.workload} {rec.summary} {rec.describe_knobs()}: {why}")
            if len(self.not_applied) > self.MAX_LINES:
                lines.append(f"    ... and {len(self.not_applied) - self.MAX_LINES} more")
        if self.ignored:
            by_reason: dict[str, list] = {}
            for rec, why in self.ignored:
                by_reason.setdefault(why, []).append(rec)
            lines.append(f"  ignored: {_plural(len(self.ignored), 'record')}")
            for why, recs in list(by_reason.items())[:self.MAX_LINES]:
                keys = list(dict.fromkeys(x.workload for x in recs))
                in_model = sum(1 for k in keys if k in self.workloads)
                lines.append(f"    {_plural(len(recs), 'record')} of {_plural(len(keys), 'workload')} "
                             f"({in_model} in this model): {why}")
            if len(by_reason) > self.MAX_LINES:
                lines.append(f"    ... and {len(by_reason) - self.MAX_LINES} more reasons")
        return "\n".join(lines)

    __repr__ = __str__


def tuning_report(graph: Graph, target, tuning, source: str | None = None,
                  num_threads: int | None = None) -> TuningReport:
    """Lower the optimised ``graph`` for ``target`` with ``tuning`` (a records path, list or
    ``compiler.tuning.TuningRecords``) and say which records were used, which did not apply
    and which were ignored, and why (:class:`TuningReport`). num_threads: the thread count the
    module would run with, as for ``tensorfuse.compile`` (records measured at another count are
    ignored; default: the cores this process may use)."""
    import os

    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.tuning import as_tuning
    from tensorfuse.runtime.threads import resolve_num_threads
    records = as_tuning(tuning, target, resolve_num_threads(num_threads))
    if source is None:
        paths = tuning if isinstance(tuning, (list, tuple)) else [tuning]
        source = ", ".join(os.fspath(p) for p in paths if isinstance(p, (str, os.PathLike))) or "given records"
    lowered = lower_graph(graph, records.target, tuning=records)
    return TuningReport(source, records, lowered.workloads, dict(records.used), records.audit(lowered.workloads),
                        list(records.ignored))


@dataclass
class FusionReport:
    """What :func:`explain_report` found; ``str``/``repr`` is the report."""

    model: str
    opt_level: int
    passes: list[PassReport]
    groups: list[GroupReport]
    anchors: list[AnchorFate]
    rule: str | None = None
    node: str | None = None
    #: what tuning records did (``explain_report(..., tuning=)``), else None
    tuning: TuningReport | None = None
    #: the quantization section (compiler/qdq_report.py): integer kernels and every Q/DQ left in
    #: place with its reason; None for a model without quantization
    quant: object | None = None

    def __str__(self) -> str:
        filt = "".join([f", rule {self.rule}" if self.rule else "", f", node {self.node}" if self.node else ""])
        napps = sum(len(p.applied) for p in self.passes)
        nfused = sum(1 for g in self.groups if g.fused)
        lines = [f"fusion report for {self.model} at O{self.opt_level}{filt}: {napps} rule application{'' if napps == 1 else 's'}, "
                 f"{nfused} fused group{'' if nfused == 1 else 's'}",
                 "rule passes (each rule tried at every node its pattern can root at; first applicable rule wins):"]
        lines += [str(p) for p in self.passes] or ["  (none at this level)"]
        lines.append("groups (fuse_ops):")
        lines += [str(g) for g in self.groups] or ["  (none)"]
        lines.append("anchor ops of the model and the rules that fused them:")
        lines += [str(a) for a in self.anchors] or ["  (none)"]
        if self.quant is not None:
            lines.append(str(self.quant))
        if self.tuning is not None:
            lines.append(str(self.tuning))
        return "\n".join(lines)

    __repr__ = __str__


def _root_of(rule: Rule, nodes: list[str], graph: Graph) -> str | None:
    """The matched node a rule application rooted at: the last matched node whose op the
    pattern's root accepts."""
    ops = rule.root_ops()
    by = {n.name: n for n in graph.nodes}
    for name in reversed(nodes):
        n = by.get(name)
        if n is not None and (ops is None or n.qualified_op in ops):
            return name
    return None


def _evaluate(rules: list[Rule], graph: Graph, trial: bool) -> dict[str, list[tuple[str, str | None]]]:
    """{node name: [(rule, None if it applies else why not)]} over the candidate nodes."""
    from tensorfuse.compiler.pattern import _Ctx
    ctx = _Ctx(graph)
    out: dict[str, list[tuple[str, str | None]]] = {}
    for n in graph.nodes:
        for r in rules:
            ops = r.root_ops()
            if ops is not None and n.qualified_op not in ops:
                continue
            res = try_rule(graph, r, n, ctx, apply=False)
            if isinstance(res, Application) and trial:
                res = _trial(graph, r, n.name)
            out.setdefault(n.name, []).append((r.name, None if isinstance(res, Application) else str(res.reason)))
    return out


def _why_not_grouped(pl, grp, n) -> str:
    """Why consumer ``n`` of group ``grp`` stayed outside it, in words (fuse_ops' rules)."""
    from tensorfuse.compiler.passes.fuse_ops import _is_anchor, _is_elementwise
    from tensorfuse.ir.registry import find_op
    od = find_op(n.op, n.domain)
    what = f"{n.op} '{n.name}'"
    head = grp.anchor.name if grp.anchor is not None else grp.nodes[0].name
    into = f"into {'the group of ' + head}"
    if _is_anchor(n, od):
        return f"{what} not fused {into}: it is an anchor op and starts its own group"
    if not _is_elementwise(n, od):
        kind = od.kind.name.lower() if od is not None else "unknown"
        return f"{what} not fused {into}: it is {kind}, and only elementwise/broadcast ops join a group"
    if grp.anchor is not None:
        out = grp.anchor.outputs[0]
        casts = od is not None and find_op(grp.anchor.op, grp.anchor.domain).epilogue_casts
        if n.outputs[0].type != out.type and not (casts and n.outputs[0].shape == out.shape):
            return (f"{what} not fused {into}: its output is {n.outputs[0].type}, the anchor's {out.type} "
                    f"(an epilogue keeps the anchor's dtype and shape)")
        if not pl.can_join_anchor(grp, n):
            return f"{what} not fused {into}: it reads a value of the group that is not the epilogue's"
    elif not pl.can_join_loop(grp, n):
        return (f"{what} not fused {into}: its shape {list(n.outputs[0].shape)} differs from the group's "
                f"{list(grp.shape)} and the group's values are read elsewhere")
    other = pl.group_of.get(id(n))
    if other is not None and other is not grp and len(other.nodes) > 1:
        oh = other.anchor.name if other.anchor is not None else other.nodes[0].name
        return f"{what} not fused {into}: it joined the group of {oh}, the latest of its producers' groups"
    if pl.makes_cycle([grp], n):
        return f"{what} not fused {into}: that would make a cycle through other groups"
    return f"{what} not fused {into}: it joined another group"


def explain_report(model: Any, *, opt_level: int = 2, rule: str | None = None, node: str | None = None,
                   input_shapes: dict | None = None, disabled_rules=(), rules=(), target="llvm",
                   tuning=None, num_threads: int | None = None) -> FusionReport:
    """The fusion report of a model: for each rule pass of ``opt_level``, in pipeline order,
    every rule application (with the ONNX nodes it matched and the other rules that matched
    the same root but lost, the first in pipeline order winning), and for every candidate node
    left afterwards the first failed predicate of each rule that could root there; then the
    groups fuse_ops formed, with the reason each neighbouring op stayed outside (e.g.
    ``Flatten '/Flatten' not fused into the group of Conv_1: it is injective, ...``); then every
    Conv/ConvTranspose/Gemm/MatMul of the model with the node that computes it and the rules
    that fused it.

    model: a path, bytes or ``onnx.ModelProto``. rule / node: keep only the entries of that
    rule / of that (ONNX or IR) node name. input_shapes, disabled_rules: as for
    ``tensorfuse.compile``; rules: rules under test, as for ``tensorfuse.compile`` (each tried
    before the built-in rules of its set). target: as for ``tensorfuse.compile`` (it chooses the
    layout the pipeline converts to, and the schedules). tuning: tuning records, as for
    ``tensorfuse.compile``: the report then lowers the graph with them and ends with a
    :class:`TuningReport` (which records were used, which ignored and why: another CPU or
    version, another thread count, a workload not in this model, knob values no longer among
    the candidates). num_threads: the thread count the records are chosen for, as for
    ``tensorfuse.compile`` (default: the cores this process may use). Returns a :class:`FusionReport` (``str``/``repr`` is the text); prints nothing; the
    model is imported and optimised here, nothing is compiled to code. Raises ModelLoadError /
    UnsupportedModelError as ``compile`` does, ValueError for an unknown rule name or level.
    """
    import os

    from tensorfuse.compiler.frontend.onnx import import_onnx, load_model
    from tensorfuse.compiler.passes.fuse_ops import FuseOps, _is_anchor, _Planner, fuse_ops
    from tensorfuse.ir.registry import find_op
    from tensorfuse.compiler.pipeline import CLEANUP_ROUNDS, PipelineResult, _Dumper, _run, all_rules, \
        build_passes, rules_under_test
    from tensorfuse.compiler.rewrite import RewritePass
    from tensorfuse.runtime.profile import trace_sources

    rules = rules_under_test(rules)
    known = all_rules(rules)
    if rule is not None and rule not in known and rule != "fuse_ops":
        raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(known) + ['fuse_ops']}")
    proto = load_model(model)
    label = os.fspath(model) if isinstance(model, (str, os.PathLike)) else (proto.graph.name or "model")
    g = import_onnx(proto, input_shapes=input_shapes)
    res = PipelineResult(opt_level)
    from tensorfuse.compiler.pipeline import resolve_layout
    from tensorfuse.ir.target import Target
    tgt = Target.parse(target)
    passes = build_passes(opt_level, disabled_rules=disabled_rules, log=res.log, rules=rules,
                          layout=resolve_layout(tgt))
    # an ONNX node without a name is labelled as the frontend names its IR node ("Conv_0": op type
    # and index), found through the value it computes, so that every part of the report (rule
    # applications, groups, anchors, --node) uses one label for it
    producer = {v.name: n.name for n in g.nodes for v in n.outputs if v is not None}
    onnx_labels = [n.name or producer.get(next((o for o in n.output if o), ""), f"{n.op_type}_{i}")
                   for i, n in enumerate(proto.graph.node)]
    onnx_ops = {lab: n.op_type for lab, n in zip(onnx_labels, proto.graph.node)}
    if node is not None and node not in onnx_ops and node not in {n.name for n in g.nodes}:
        some = ", ".join(list(onnx_ops)[:5])
        raise ValueError(f"no node {node!r} in the model (an ONNX node name such as {some})")
    reports: list[PassReport] = []
    groups: list[GroupReport] = []
    fuse_log: list[Application] = []
    dumper = _Dumper(None)

    def sources(names: list[str], upto: int | None = None) -> list[str]:
        return trace_sources(names, res.log if upto is None else res.log[:upto])

    def run_rewrite(name: str, p: RewritePass, runs: list) -> None:
        """Run a rule pass (``runs`` calls it, maybe several rounds) and report it."""
        start = len(res.log)
        before = _evaluate(p.rules, g, trial=False)
        runs()
        rep = PassReport(name, [r.name for r in p.rules])
        by_name = {r.name: r for r in p.rules}
        for k, app in enumerate(res.log[start:], start):
            root = _root_of(by_name[app.rule], app.nodes, g) if app.rule in by_name else None
            lost = []
            if root is None:
                for nm in reversed(app.nodes):
                    if nm in before:
                        root = nm
                        break
            ok_here = [r for r, why in before.get(root, []) if why is None]
            if app.rule in ok_here:
                lost = ok_here[ok_here.index(app.rule) + 1:]
            rep.applied.append(ApplicationReport(app.rule, list(app.nodes), sources(list(app.nodes), k),
                                                 list(app.created), lost))
        after = _evaluate(p.rules, g, trial=True)
        for n in g.nodes:
            if n.name in after:
                rep.not_applied.append(CandidateReport(n.name, n.qualified_op, sources([n.name]),
                                                       [(r, why) for r, why in after[n.name] if why is not None]))
        reports.append(rep)

    quant: list = []

    def triage(planned=None) -> None:
        """The quantization section, on the graph before grouping (compiler/qdq_report.py)."""
        from tensorfuse.compiler.qdq_report import quant_report
        reasons = {c.node: dict(c.reasons) for p in reports if p.name == "quantize" for c in p.not_applied}
        moved = [c for a in res.log if a.rule == "DropQDQAroundDataMovement" for c in a.created]
        quant.append(quant_report(g, planned, reasons, moved, sources))

    def run_fuse_ops() -> None:
        pl = _Planner(g)
        planned = pl.plan()
        triage(planned)
        users = g.users()
        members_of = {}
        for grp in planned:
            if len(grp.nodes) < 2 and grp.anchor is None:
                continue
            ids = {id(m) for m in grp.nodes}
            outside: list[str] = []
            seen: set[int] = set()
            for m in grp.nodes:
                for o in m.outputs:
                    for u in users.get(o, []):
                        if id(u) not in ids and id(u) not in seen:
                            seen.add(id(u))
                            if not _is_anchor(u, find_op(u.op, u.domain)):     # anchors start groups
                                outside.append(_why_not_grouped(pl, grp, u))
            if len(grp.nodes) < 2 and not outside:
                continue
            rep = GroupReport(None, grp.kind.name, grp.anchor.name if grp.anchor is not None else None,
                              [(m.name, m.qualified_op) for m in grp.nodes], sources([m.name for m in grp.nodes]),
                              outside)
            members_of[id(grp)] = rep
            groups.append(rep)
        fuse_ops(g, fuse_log)
        multi = [grp for grp in planned if len(grp.nodes) > 1]
        for grp, app in zip(multi, fuse_log):
            members_of[id(grp)].fused = app.created[0]

    for name, p in passes:
        members = p if isinstance(p, list) else [(name, p)]
        rewrite = [(n, q) for n, q in members if isinstance(q, RewritePass)]
        if isinstance(p, list):
            def rounds(members=members):
                for _ in range(CLEANUP_ROUNDS):
                    if not any([_run(n, q, g, res, False, dumper) for n, q in members]):
                        break
            if rewrite:
                run_rewrite(rewrite[0][0], rewrite[0][1], rounds)
            else:
                rounds()
        elif isinstance(p, RewritePass):
            run_rewrite(name, p, lambda name=name, p=p: _run(name, p, g, res, False, dumper))
        elif isinstance(p, FuseOps):
            run_fuse_ops()
        else:
            _run(name, p, g, res, False, dumper)

    if not quant:
        triage()
    # the fate of every anchor op: replay the rewrites in order (a rewrite may give its new node
    # the name of a node it replaced, so names are reused), carrying for each current node name
    # the rules that made it and the original nodes it covers
    state: dict[str, tuple[list[str], list[str]]] = {}
    for app in res.log:
        rules_made: list[str] = []
        covered: list[str] = []
        for m in app.nodes:
            r, leaves_m = state.get(m, ([], [m]))
            rules_made += [x for x in r if x not in rules_made]
            covered += [x for x in leaves_m if x not in covered]
        if app.rule not in rules_made:
            rules_made.append(app.rule)
        for c in app.created:
            state[c] = (rules_made, covered)
    fate: dict[str, tuple[str, str, list[str], list[str]]] = {}

    def lineage(name: str, rules_seen: list[str], leaves: list[str]) -> None:
        r, covered = state.get(name, ([], [name]))
        rules_seen += [x for x in r if x not in rules_seen]
        leaves += [x for x in covered if x not in leaves]

    for n in g.nodes:
        body = n.attrs.get("body") if n.op == "FusedFunction" else None
        parts = [m.name for m in body.nodes] if body is not None else [n.name]
        rules_seen: list[str] = []
        leaves: list[str] = []
        for part in parts:
            lineage(part, rules_seen, leaves)
        if body is not None:
            rules_seen.append("fuse_ops")
        for leaf in leaves:
            fate.setdefault(leaf, (n.name, n.qualified_op, rules_seen, leaves))
    anchors = []
    for lab, n in zip(onnx_labels, proto.graph.node):
        # the report's last section lists the fusion anchors (``OpDef.fusion_anchor``: Conv,
        # ConvTranspose, Gemm, MatMul), what users ask about: "was my Conv fused?"
        od = find_op(n.op_type, n.domain)
        if od is None or od.domain or not od.fusion_anchor:
            continue
        f = fate.get(lab)
        if f is None:
            anchors.append(AnchorFate(lab, n.op_type, None, None, [], []))
        else:
            others = [f"{onnx_ops.get(x, '?')} '{x}'" for x in f[3] if x != lab]
            anchors.append(AnchorFate(lab, n.op_type, f[0], f[1], list(f[2]), others))

    report = FusionReport(label, opt_level, reports, groups, anchors, rule, node, quant=quant[0])
    if tuning is not None:
        report.tuning = tuning_report(g, tgt, tuning, num_threads=num_threads)
    if rule is not None:
        for p in report.passes:
            p.applied = [a for a in p.applied if a.rule == rule or rule in a.also_matched]
            for c in p.not_applied:
                c.reasons = [(r, w) for r, w in c.reasons if r == rule]
            p.not_applied = [c for c in p.not_applied if c.reasons]
        report.passes = [p for p in report.passes if rule in p.rules or p.applied]
        if rule != "fuse_ops":
            report.groups = []
        report.anchors = [a for a in report.anchors if rule in a.rules]
    if node is not None:
        def hit(names) -> bool:
            return node in names
        for p in report.passes:
            p.applied = [a for a in p.applied if hit(a.nodes) or hit(a.onnx_nodes) or hit(a.created)]
            p.not_applied = [c for c in p.not_applied if c.node == node or hit(c.onnx_nodes)]
        report.groups = [gr for gr in report.groups if hit([m for m, _ in gr.members]) or hit(gr.onnx_nodes)
                         or gr.fused == node]
        report.anchors = [a for a in report.anchors if a.node == node or a.final == node or
                          any(w.endswith(f"'{node}'") for w in a.with_nodes)]
        report.passes = [p for p in report.passes if p.applied or p.not_applied]
    return report
