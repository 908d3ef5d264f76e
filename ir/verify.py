"""The graph verifier (runs between passes in tests and debug mode) and a structural diff.

:func:`verify_graph` collects every problem it finds and raises one :class:`VerifyError`
listing them; each line names the node (its name and op). It checks:

- every node input is defined before it is used (graph input, constant, or an earlier node's
  output of this graph), and every graph output is defined;
- no value is defined twice and no two values share a name; each node output's ``producer``
  is that node, inputs and constants have none; constants have data matching their type and
  are keyed by their own name;
- every op is in the registry, and its type inference (``ir.registry.infer_types``) agrees
  with the node's output types (dtype and shape);
- graph-valued attributes (a fused function's ``body``) pass these checks themselves.

Inference of ops such as Reshape reads compile-time values (``Value.const_value()``). Where
a graph lacks them (read from text, say), the verifier works them out like the Builder does
and removes them again afterwards, so it leaves the graph as it found it.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.debug import debug_mode  # noqa: F401  (re-exported: the switch that runs the verifier)

from .graph import Graph, Node, Value
from .types import TensorType


class VerifyError(ValueError):
    """A graph failed verification; ``problems`` holds one line per problem."""

    def __init__(self, graph_name: str, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"graph {graph_name}: {n} problem{'s' if n != 1 else ''}"
        super().__init__(head + "\n" + "\n".join("  " + p for p in self.problems))


def _desc(n: Node) -> str:
    return f"node {n.name or '(unnamed)'} ({n.qualified_op})"


def verify_graph(g: Graph, *, check_types: bool = True) -> None:
    """Raise :class:`VerifyError` listing every problem in ``g`` (see module docstring)."""
    problems: list[str] = []
    defined: dict[int, str] = {}      # id(value) -> where it is defined
    names: dict[str, str] = {}        # value name -> where it is defined
    produced_later = {id(o): n for n in g.nodes for o in n.outputs}

    def define(v: Value, where: str) -> None:
        if id(v) in defined:
            problems.append(f"{where}: value %{v.name} is defined twice (also by {defined[id(v)]})")
            return
        if v.name in names:
            problems.append(f"{where}: name %{v.name} is used twice (also by {names[v.name]})")
        defined[id(v)] = where
        names.setdefault(v.name, where)

    for v in g.inputs:
        define(v, "graph input")
        if v.producer is not None:
            problems.append(f"graph input %{v.name} has a producer ({_desc(v.producer)})")
    for key, v in g.constants.items():
        where = f"constant %{v.name}"
        define(v, where)
        if key != v.name:
            problems.append(f"{where} is keyed by another name, {key!r}")
        if v.producer is not None:
            problems.append(f"{where} has a producer ({_desc(v.producer)})")
        if v.data is None:
            problems.append(f"{where} has no data")
        else:
            try:
                t = TensorType.of(np.asarray(v.data))
            except (TypeError, ValueError) as e:
                t = e
            if t != v.type:
                problems.append(f"{where}: type {v.type} but its data is {t}")

    set_known: list[Value] = []
    try:
        for n in g.nodes:
            where = _desc(n)
            inputs_ok = True
            for i, v in enumerate(n.inputs):
                if v is None or id(v) in defined:
                    continue
                inputs_ok = False
                if id(v) in produced_later:
                    problems.append(f"{where}: input {i} %{v.name} is used before it is defined "
                                    f"(by {_desc(produced_later[id(v)])})")
                else:
                    problems.append(f"{where}: input {i} %{v.name} is not defined in the graph")
            for o in n.outputs:
                define(o, where)
                if o.producer is not n:
                    other = "none" if o.producer is None else _desc(o.producer)
                    problems.append(f"{where}: output %{o.name} has another producer ({other})")
            _check_op(n, where, check_types and inputs_ok, problems, set_known)
            for key, sub in sorted((k, a) for k, a in n.attrs.items() if isinstance(a, Graph)):
                try:
                    verify_graph(sub, check_types=check_types)
                except VerifyError as e:
                    problems += [f"{where}: attribute {key} (graph {sub.name}): {p}" for p in e.problems]
    finally:
        for v in set_known:
            v.known = None

    for v in g.outputs:
        if id(v) not in defined:
            problems.append(f"graph output %{v.name} is not defined")
    if problems:
        raise VerifyError(g.name, problems)


def _check_op(n: Node, where: str, check_types: bool, problems: list[str],
              set_known: list[Value]) -> None:
    from .registry import find_op, infer_types
    if find_op(n.op, n.domain) is None:
        problems.append(f"{where}: op {n.qualified_op} is not in the registry")
        return
    if not check_types:
        return
    try:
        types = infer_types(n)
    except Exception as e:   # noqa: BLE001 - any failure of inference is a finding
        problems.append(f"{where}: type inference failed: {e}")
        return
    if len(types) < len(n.outputs):
        problems.append(f"{where}: has {len(n.outputs)} outputs but inference gives {len(types)}")
    for o, t in zip(n.outputs, types):
        if o.type != t:
            problems.append(f"{where}: output %{o.name} is {o.type} but inference gives {t}")
    _propagate_known(n, set_known)


def _propagate_known(n: Node, set_known: list[Value]) -> None:
    """Like ``ir.builder.propagate_known``, recording what it sets (skips stand-in constants)."""
    from .builder import KNOWN_LIMIT
    from .registry import find_op, run_reference
    from .text import placeholder_digest
    if all(o.known is not None for o in n.outputs) or any(o.type.numel > KNOWN_LIMIT for o in n.outputs):
        return
    od = find_op(n.op, n.domain)
    if od is not None and od.known is not None:   # outputs follow from input types (Shape, Size)
        vals = od.known(n)
        for o, a in zip(n.outputs, vals or []):
            if o.known is None and o.data is None:
                o.known = np.asarray(a, dtype=o.type.dtype.numpy).reshape(o.shape)
                set_known.append(o)
        return
    ins = []
    for v in n.inputs:
        a = None if v is None else v.const_value()
        if v is not None and (a is None or placeholder_digest(a) is not None):
            return
        ins.append(a)
    try:
        outs = run_reference(n, ins)
    except Exception:   # noqa: BLE001 - no value known then, as in the Builder
        return
    for o, a in zip(n.outputs, outs):
        if o.known is None and o.data is None and tuple(a.shape) == o.shape:
            o.known = a
            set_known.append(o)


# -- structural comparison ----------------------------------------------------------------------
def _attr_key(v):
    """Attribute values compared strictly: 1 differs from 1.0 and True, nan equals nan."""
    if isinstance(v, (bool, np.bool_)):
        return ("bool", bool(v))
    if isinstance(v, (int, np.integer)):
        return ("int", int(v))
    if isinstance(v, (float, np.floating)):
        return ("float", repr(float(v)))
    if isinstance(v, np.ndarray):
        return ("tensor", str(v.dtype), v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, (list, tuple)):
        return ("list", tuple(_attr_key(x) for x in v))
    if isinstance(v, Graph):    # a fused function's body: equal when it prints the same
        from .text import print_graph
        return ("graph", print_graph(v))
    return (type(v).__name__, v)


def _data_key(a):
    if a is None:
        return None
    a = np.asarray(a)
    return (str(a.dtype), a.shape, np.ascontiguousarray(a).tobytes())


def graph_diff(a: Graph, b: Graph) -> list[str]:
    """Where two graphs differ structurally (names, types, ops, attrs, wiring, constant bytes).

    Values are matched by name; ``known`` and the graphs' reserved names are not compared.
    An empty list means equal, e.g. ``graph_diff(g, parse_graph(print_graph(g), consts))``.
    """
    out: list[str] = []

    def sig(v: Value | None):
        return None if v is None else (v.name, str(v.type))

    def same(what: str, x, y) -> None:
        if x != y:
            out.append(f"{what}: {x!r} != {y!r}")

    same("graph name", a.name, b.name)
    same("inputs", [sig(v) for v in a.inputs], [sig(v) for v in b.inputs])
    same("constants", [sig(v) for v in a.constants.values()], [sig(v) for v in b.constants.values()])
    for va, vb in zip(a.constants.values(), b.constants.values()):
        if _data_key(va.data) != _data_key(vb.data):
            out.append(f"constant %{va.name}: data differs")
    same("node count", len(a.nodes), len(b.nodes))
    for i, (na, nb) in enumerate(zip(a.nodes, b.nodes)):
        w = f"node {i} ({na.name or na.qualified_op})"
        same(f"{w} op", (na.domain, na.op, na.name), (nb.domain, nb.op, nb.name))
        same(f"{w} inputs", [v and v.name for v in na.inputs], [v and v.name for v in nb.inputs])
        same(f"{w} outputs", [sig(v) for v in na.outputs], [sig(v) for v in nb.outputs])
        ka = {k: _attr_key(v) for k, v in na.attrs.items()}
        kb = {k: _attr_key(v) for k, v in nb.attrs.items()}
        if ka != kb:
            out.append(f"{w} attrs: {na.attrs!r} != {nb.attrs!r}")
    same("outputs", [v.name for v in a.outputs], [v.name for v in b.outputs])
    return out
