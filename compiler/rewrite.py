"""Rewrite rules and the one driver that applies them (docs/architecture.md, "Rewrites as DAG patterns").

A rule is a small top-level class: a pattern (see :mod:`compiler.pattern`), an optional
condition, a replacement, a name (the class name) and a one-line docstring::

    class FoldAddZero(Rule):
        \"\"\"Add(x, 0) ==> x.\"\"\"
        pattern = P.Add(x=Any(), zero=Const(0.0))

        def condition(self, m):
            return m.x.type == m.add.outputs[0].type or Fail("the zero broadcasts x to a larger shape")

        def rewrite(self, m, build):
            return m.x

``condition(m)`` and ``rewrite(m, build)`` get the :class:`~compiler.pattern.Match` (captures by
name); ``build`` is an :class:`ir.Builder` on the graph. ``rewrite`` returns the replacement of
the pattern's output (a Value), a list (one per pattern output; or, for a one-output pattern
whose root node has several outputs, one per node output), or a dict {old Value: new Value}.
Either may return :class:`Fail` with the reason in words, which ``explain`` reports.

:func:`apply_rules` applies a list of rules to a fixed point: nodes in graph order, rules in
list order, first applicable rule wins, sweeps repeat until nothing fires; each application
is logged as an :class:`Application`. Replaced nodes that nothing reads any more are removed,
new nodes are placed where the match was (or earlier, before the first reader of a replaced
value), and the graph stays topologically sorted: every reader of a replacement comes after
it, whichever replaced value it reads (when no placement gives that, the readers move later;
a replacement that needs a reader of what it replaces is a RewriteError). Graph
outputs keep their user-facing names (``graph.output_names``); only ``graph.outputs`` moves.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from tensorfuse.ir.errors import CompileError
from tensorfuse.compiler.pattern import Match, MatchFailure, _Ctx, capture_names, match_at, root_ops
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph, Node, Value

__all__ = ["Rule", "Fail", "Application", "RewriteError", "apply_rules", "try_rule", "RewritePass",
           "application_limit"]


class Fail:
    """A condition or replacement that does not apply, with the reason in words. Falsy, so
    ``return ok or Fail("why")`` reads naturally."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.reason

    def __repr__(self) -> str:
        return f"Fail({self.reason!r})"


class RewriteError(CompileError):
    """A rule raised, or returned a replacement of the wrong type; names the rule and node."""


class Rule:
    """Base class of rewrite rules; see the module docstring.

    Class attributes: ``pattern`` (a Pattern, or a tuple of Patterns for several outputs),
    ``numerics_changing`` (True: only at O3; the docstring says by how much), ``name_from``
    (the capture whose node name the one node a rewrite makes takes; None: the match's first
    node in graph order, the anchor of an epilogue fusion), ``layouts`` (the pipeline layouts,
    "NCHW" / "NHWC", the rule runs in; None: every one). ``name`` is the class name; ``doc``
    the docstring's first line.
    """

    pattern = None
    numerics_changing = False
    name_from: str | None = None
    layouts: tuple | None = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.pattern is None:
            return      # an abstract intermediate class
        if not (cls.__doc__ or "").strip():
            raise TypeError(f"rule {cls.__name__} needs a one-line docstring saying what it rewrites into what")
        cls.captures = capture_names(cls.pattern)

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def doc(self) -> str:
        return (type(self).__doc__ or "").strip().splitlines()[0]

    def root_ops(self) -> frozenset | None:
        return root_ops(self.pattern)

    def condition(self, m: Match):
        """True, or Fail("why not"). Default: always."""
        return True

    def rewrite(self, m: Match, build: Builder):
        raise NotImplementedError(f"rule {self.name} has no rewrite()")

    def __repr__(self) -> str:
        return f"<Rule {self.name}>"


@dataclass
class Application:
    """One rule application: the rule's name, the matched nodes, the nodes it created and
    ``values``: {name of each replaced value: name of its replacement}, which lets tools
    (``tensorfuse.verify``) find a rewritten value's ONNX name. ``root`` / ``root_op``: the
    node the pattern matched at (its name and op, as they were then: ``tensorfuse.explain``
    reports the application there); empty for applications not made by a rule pattern."""

    rule: str
    nodes: list[str]
    created: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    root: str = field(default="", compare=False)
    root_op: str = field(default="", compare=False)

    def __str__(self) -> str:
        made = f" -> {', '.join(self.created)}" if self.created else ""
        return f"{self.rule}: {', '.join(self.nodes)}{made}"


def _instance(rule) -> Rule:
    return rule() if isinstance(rule, type) else rule


def try_rule(graph: Graph, rule: Rule, node: Node, ctx: _Ctx | None = None,
             apply: bool = True) -> "Application | Fail | MatchFailure":
    """Match ``rule`` at ``node``, check its condition and (if ``apply``) rewrite. Returns the
    Application, or the MatchFailure / Fail saying why not."""
    m = match_at(rule.pattern, node, graph, ctx)
    if not m:
        return m
    try:
        ok = rule.condition(m)
    except Exception as e:
        raise RewriteError(f"rule {rule.name}: condition failed at node {node.name} "
                           f"({type(e).__name__}: {e})") from e
    if not ok:
        return ok if isinstance(ok, Fail) else Fail(f"{node.name}: the condition of {rule.name} does not hold")
    if not apply:
        return Application(rule.name, [n.name for n in m.nodes], root=node.name, root_op=node.qualified_op)
    return _apply(graph, rule, m, node)


def _apply(graph: Graph, rule: Rule, m: Match, node: Node) -> "Application | Fail":
    root, root_op = node.name, node.qualified_op       # _adopt_names may give the node's name away
    n_nodes = len(graph.nodes)
    consts_before = set(graph.constants)
    build = Builder(graph)

    def undo():
        del graph.nodes[n_nodes:]
        for k in set(graph.constants) - consts_before:
            del graph.constants[k]

    try:
        res = rule.rewrite(m, build)
    except Exception as e:
        undo()
        raise RewriteError(f"rule {rule.name} failed at node {node.name}: {type(e).__name__}: {e}") from e
    if isinstance(res, Fail):
        undo()
        return res
    mapping = _mapping(rule, m, res)
    for old, new in mapping.items():
        if not isinstance(new, Value):
            undo()
            raise RewriteError(f"rule {rule.name} at node {node.name}: replacement for '{old.name}' is "
                               f"{new!r}, not a Value")
        if new.type != old.type:
            undo()
            raise RewriteError(f"rule {rule.name} at node {node.name}: replacement '{new.name}' is {new.type}, "
                               f"but '{old.name}' is {old.type}")
    if all(old is new for old, new in mapping.items()):
        undo()
        return Fail(f"rule {rule.name} returned the matched value unchanged")
    created = graph.nodes[n_nodes:]
    del graph.nodes[n_nodes:]
    saved = (list(graph.nodes), [(n, list(n.inputs)) for n in graph.nodes], list(graph.outputs))
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    at = _insertion_point(graph, created, pos, m, mapping)
    graph.nodes[at:at] = created
    for old, new in mapping.items():
        if old is not new:
            graph.replace_all_uses(old, new)
    _remove_dead(graph, m.nodes)
    if not _is_topological(graph):
        # a reader of a replaced value sits before a node the replacement needs: move readers
        # later (Graph.toposort keeps every node that is already in order where it is)
        try:
            graph.toposort()
        except ValueError as e:
            graph.nodes, graph.outputs = saved[0], saved[2]
            for n, ins in saved[1]:
                n.inputs = ins
            undo()
            raise RewriteError(f"rule {rule.name} at node {node.name}: the replacement depends on a "
                               f"reader of the value it replaces ({e})") from None
    _drop_unused_captured_constants(graph, m)
    _adopt_names(graph, m, created, mapping, build, getattr(rule, "name_from", None))
    return Application(rule.name, [n.name for n in m.nodes], [n.name for n in created],
                       {old.name: new.name for old, new in mapping.items() if old is not new},
                       root=root, root_op=root_op)


def _insertion_point(graph: Graph, created: list[Node], pos: dict, m: Match, mapping: dict) -> int:
    """Where the new nodes go: right before the match's last node (all of whose inputs, the
    captures, are defined earlier), or earlier, before the first node outside the match that
    reads a replaced value (a pattern with several outputs, or a dict replacing an interior
    value such as SkipLayerNorm's sum), when every input of the new nodes is defined there.
    The caller still checks the order and sorts when no such point exists."""
    at = max((pos[id(n)] for n in m.nodes if id(n) in pos), default=len(graph.nodes))
    old_ids = {id(o) for o, n in mapping.items() if o is not n}
    in_match = {id(n) for n in m.nodes}
    first_reader = min((i for i, n in enumerate(graph.nodes) if id(n) not in in_match
                        and any(v is not None and id(v) in old_ids for v in n.inputs)), default=at)
    if first_reader >= at:
        return at
    made = {id(n) for n in created}
    need = max((pos.get(id(v.producer), -1) for n in created for v in n.inputs
                if v is not None and v.producer is not None and id(v.producer) not in made), default=-1)
    return first_reader if need < first_reader else at


def _adopt_names(graph: Graph, m: Match, created: list[Node], mapping: dict, build: Builder,
                 name_from: str | None = None) -> None:
    """Keep the model's names visible: when a rewrite made one node (Constants aside) and the
    match's first node (in graph order: the anchor of an epilogue fusion, the Conv of a
    BatchNormalization fold; or the rule's ``name_from`` capture) is gone, the new node takes that node's name; each new value
    that replaced a value no longer in the graph takes that value's name. Names the rule
    gave itself (``build.op(..., name=...)``, ``out_names``) are kept."""
    made = [n for n in created if n.op != "Constant"]
    if len(made) != 1 or not m.nodes:
        return
    new = made[0]
    alive = {id(n) for n in graph.nodes}
    anchor = m[name_from] if name_from is not None and m[name_from] is not None else m.nodes[0]
    if id(anchor) not in alive and anchor.name and id(new) in build.auto_names:
        new.name = anchor.name
    if id(new) not in build.auto_value_names:
        return
    live_names = None
    for old, val in mapping.items():
        if val.producer is not new or old is val or old.producer is None or id(old.producer) in alive:
            continue
        if live_names is None:
            live_names = {v.name for v in graph.inputs} | set(graph.constants) | \
                {o.name for n in graph.nodes for o in n.outputs}
        if old.name not in live_names:
            live_names.discard(val.name)
            val.name = old.name
            live_names.add(val.name)


def _mapping(rule: Rule, m: Match, res) -> dict:
    if isinstance(res, dict):
        return dict(res)
    if isinstance(res, Value):
        return {m.outputs[0]: res}
    if isinstance(res, (list, tuple)):
        res = list(res)
        if len(res) == len(m.outputs):
            return dict(zip(m.outputs, res))
        root = m.outputs[0].producer
        if len(m.outputs) == 1 and root is not None and len(res) == len(root.outputs):
            return {o: r for o, r in zip(root.outputs, res) if r is not None}
        raise RewriteError(f"rule {rule.name} returned {len(res)} values for {len(m.outputs)} pattern outputs")
    raise RewriteError(f"rule {rule.name} returned {res!r}; expected a Value, a list, a dict or Fail")


def _remove_dead(graph: Graph, candidates: list[Node]) -> None:
    """Remove matched nodes that nothing reads any more (consumers first)."""
    cand = {id(n) for n in candidates}
    outs = {id(v) for v in graph.outputs}
    uses: dict[int, int] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                uses[id(v)] = uses.get(id(v), 0) + 1
    dead: set[int] = set()
    for n in reversed(graph.nodes):
        if id(n) in cand and not any(uses.get(id(o), 0) or id(o) in outs for o in n.outputs):
            dead.add(id(n))
            for v in n.inputs:
                if v is not None:
                    uses[id(v)] -= 1
    if dead:
        graph.nodes = [n for n in graph.nodes if id(n) not in dead]


def _drop_unused_captured_constants(graph: Graph, m: Match) -> None:
    consts = [v for v in m.captures.values() if isinstance(v, Value) and v.is_const]
    for n in m.nodes:
        consts += [v for v in n.inputs if v is not None and v.is_const]
    if not consts:
        return
    used = {id(v) for n in graph.nodes for v in n.inputs if v is not None} | {id(v) for v in graph.outputs}
    for v in consts:
        if id(v) not in used and graph.constants.get(v.name) is v:
            del graph.constants[v.name]


def _is_topological(graph: Graph) -> bool:
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.constants.values()}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and id(v) not in defined:
                return False
        defined.update(id(o) for o in n.outputs)
    return True


#: the applications still allowed in this context (a one-element list), or None: no limit
_BUDGET: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_rewrite_budget", default=None)


@contextlib.contextmanager
def application_limit(n: int | None) -> Iterator[None]:
    """Inside this context, every :func:`apply_rules` together makes at most the first ``n``
    rule applications (None: no limit); the rest of the pipeline runs as usual. Since the
    driver is deterministic, compiling with the limit reproduces exactly the first ``n``
    entries of the unlimited ``rewrite_log``: ``tensorfuse.verify`` bisects over ``n`` to find
    the application that changed the numbers. Compile with ``cache=False`` inside it."""
    if n is not None and (not isinstance(n, int) or n < 0):
        raise ValueError(f"application_limit needs a count >= 0 or None, got {n!r}")
    token = _BUDGET.set(None if n is None else [n])
    try:
        yield
    finally:
        _BUDGET.reset(token)


def apply_rules(graph: Graph, rules: Iterable, *, max_steps: int | None = None,
                log: list | None = None, verify: bool | None = None, pass_name: str | None = None) -> int:
    """Apply ``rules`` to a fixed point; returns the number of applications (appended to ``log``).

    Deterministic: sweeps visit nodes in graph order and try the rules in the given order.
    Raises RewriteError when more than ``max_steps`` applications happen (default: 20 per node
    plus 1000), which means rules undo each other; the message names the last rules applied.
    ``verify`` (None: ``tensorfuse.debug.debug_mode()``): after each application, check the node order
    and definitions (``verify_graph(check_types=False)``); a RewriteError names the rule, the
    node and ``pass_name``.
    """
    rules = [_instance(r) for r in rules]
    if not rules:
        return 0
    if verify is None:
        from tensorfuse.debug import debug_mode
        verify = debug_mode()
    limit = max_steps if max_steps is not None else 20 * len(graph.nodes) + 1000
    by_op: dict[str, list[Rule]] = {}
    roots = [(r, r.root_ops()) for r in rules]

    def rules_for(op: str) -> list[Rule]:
        if op not in by_op:
            by_op[op] = [r for r, ops in roots if ops is None or op in ops]
        return by_op[op]

    steps = 0
    recent: list[Application] = []
    budget = _BUDGET.get()
    while True:
        progress = False
        alive = {id(n) for n in graph.nodes}
        ctx = _Ctx(graph)
        for node in list(graph.nodes):
            if id(node) not in alive:
                continue
            for rule in rules_for(node.qualified_op):
                if budget is not None and budget[0] <= 0:
                    return steps
                res = try_rule(graph, rule, node, ctx)
                if not isinstance(res, Application):
                    continue
                if budget is not None:
                    budget[0] -= 1
                steps += 1
                if verify:
                    _verify_after(graph, rule, node, pass_name)
                recent = (recent + [res])[-5:]
                if log is not None:
                    log.append(res)
                if steps > limit:
                    raise RewriteError(f"rewrite step limit {limit} reached: rules keep firing "
                                       f"(last: {'; '.join(map(str, recent))})")
                progress = True
                alive = {id(n) for n in graph.nodes}
                ctx = _Ctx(graph)
                break
        if not progress:
            return steps


def _verify_after(graph: Graph, rule: Rule, node: Node, pass_name: str | None) -> None:
    from tensorfuse.ir.verify import VerifyError, verify_graph
    try:
        verify_graph(graph, check_types=False)
    except VerifyError as e:
        where = f" in pass {pass_name}" if pass_name else ""
        raise RewriteError(f"the graph is invalid after rule {rule.name} at node {node.name}{where}: {e}") from e


class RewritePass:
    """A pass (``graph -> bool``) applying a named rule set to a fixed point; applications
    are appended to ``log``. ``verify``: see :func:`apply_rules`."""

    def __init__(self, name: str, rules: Iterable, log: list | None = None, max_steps: int | None = None,
                 verify: bool | None = None):
        self.name = name
        self.rules = [_instance(r) for r in rules]
        self.log = log if log is not None else []
        self.max_steps = max_steps
        self.verify = verify

    def __call__(self, graph: Graph) -> bool:
        return apply_rules(graph, self.rules, max_steps=self.max_steps, log=self.log,
                           verify=self.verify, pass_name=self.name) > 0

    def __repr__(self) -> str:
        return f"<RewritePass {self.name}: {', '.join(r.name for r in self.rules)}>"
