"""The typed graph IR: values, nodes and graphs.

A :class:`Graph` holds graph inputs, constants (initializers), nodes in topological order and
graph outputs. Every :class:`Value` carries a :class:`~ir.types.TensorType` (dtype + static
shape). Ops keep their ONNX names, domains and attribute names verbatim; attributes left out
take the registry's defaults (which are the ONNX spec defaults), see :meth:`Node.attr`.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

import numpy as np

from .types import DType, TensorType


class Value:
    """An SSA value: a graph input, a constant, or one output of a node.

    ``data`` is set for constants (initializers and folded values) and is authoritative.
    ``known`` may hold the value computed at compile time by data propagation (shapes of
    static tensors, for example) while the producing node is still in the graph; type
    inference of ops such as Reshape reads it through :meth:`const_value`.
    """

    __slots__ = ("name", "type", "producer", "data", "known")

    def __init__(self, name: str, type: TensorType, producer: "Node | None" = None,
                 data: np.ndarray | None = None):
        self.name = name
        self.type = type
        self.producer = producer
        self.data = data
        self.known: np.ndarray | None = None

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def is_const(self) -> bool:
        return self.data is not None

    def const_value(self) -> np.ndarray | None:
        """The compile-time value if known (constant data or propagated), else None."""
        return self.data if self.data is not None else self.known

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """One operator application. ``inputs`` may contain ``None`` for an omitted optional input."""

    __slots__ = ("op", "domain", "name", "inputs", "outputs", "attrs")

    def __init__(self, op: str, inputs: Sequence[Value | None], outputs: Sequence[Value],
                 attrs: dict[str, Any] | None = None, name: str = "", domain: str = ""):
        self.op = op
        self.domain = domain
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        for v in self.outputs:
            v.producer = self

    @property
    def opdef(self):
        from .registry import get_op
        return get_op(self.op, self.domain)

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value: as set on the node, else the registry default, else ``default``."""
        if name in self.attrs:
            return self.attrs[name]
        from .registry import find_op
        od = find_op(self.op, self.domain)
        if od is not None and name in od.attrs and od.attrs[name].default is not None:
            return od.attrs[name].default
        return default

    def input(self, i: int) -> Value | None:
        """The i-th input, or None when omitted or beyond the given inputs."""
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    def __repr__(self) -> str:
        return f"<Node {self.name or '?'}: {self.qualified_op}>"


class Graph:
    """A dataflow graph in topological order.

    Attributes: ``inputs`` (runtime graph inputs), ``outputs``, ``nodes``, ``constants``
    (name -> Value with ``data``), ``name``, ``opset`` (the source model's ONNX opset) and
    ``output_names`` (the names users see for the outputs, kept across rewrites).
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, Value] = {}
        self.opset: int | None = None            # ONNX default-domain opset of the source model
        self.output_names: list[str] | None = None  # user-facing output names (the source model's)
        self._names: set[str] = set()
        self._counter = itertools.count()

    # -- naming -------------------------------------------------------------------------
    def fresh_name(self, hint: str = "t") -> str:
        hint = hint or "t"
        if hint not in self._names:
            self._names.add(hint)
            return hint
        while True:
            cand = f"{hint}_{next(self._counter)}"
            if cand not in self._names:
                self._names.add(cand)
                return cand

    def reserve(self, name: str) -> None:
        self._names.add(name)

    def fresh_node_name(self, op: str) -> str:
        return self.fresh_name(f"{op}_n")

    # -- construction -------------------------------------------------------------------
    def add_input(self, name: str, type: TensorType) -> Value:
        v = Value(self.fresh_name(name), type)
        self.inputs.append(v)
        return v

    def add_const(self, array: np.ndarray, name: str = "c") -> Value:
        array = np.asarray(array)
        v = Value(self.fresh_name(name), TensorType.of(array), data=array)
        self.constants[v.name] = v
        return v

    def new_value(self, type: TensorType, hint: str = "t") -> Value:
        return Value(self.fresh_name(hint), type)

    # -- queries --------------------------------------------------------------------------
    def users(self) -> dict[Value, list[Node]]:
        """Map each value to the nodes that read it (in node order, a node once per value)."""
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            seen = set()
            for v in n.inputs:
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    out.setdefault(v, []).append(n)
        return out

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        yield from self.constants.values()
        for n in self.nodes:
            yield from n.outputs

    def value(self, name: str) -> Value:
        for v in self.values():
            if v.name == name:
                return v
        raise KeyError(name)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    # -- mutation -------------------------------------------------------------------------
    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every reader of ``old`` (nodes and graph outputs) at ``new``."""
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove_unused_constants(self) -> int:
        used = {id(v) for n in self.nodes for v in n.inputs if v is not None}
        used |= {id(v) for v in self.outputs}
        dead = [k for k, v in self.constants.items() if id(v) not in used]
        for k in dead:
            del self.constants[k]
        return len(dead)

    def toposort(self) -> None:
        """Reorder nodes topologically, keeping the current order where it is already valid."""
        defined = {id(v) for v in self.inputs} | {id(v) for v in self.constants.values()}
        pending = list(self.nodes)
        ordered: list[Node] = []
        while pending:
            rest = []
            for n in pending:
                if all(v is None or id(v) in defined for v in n.inputs):
                    ordered.append(n)
                    defined.update(id(o) for o in n.outputs)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                names = ", ".join(n.name or n.op for n in rest[:5])
                raise ValueError(f"graph has a cycle or an undefined value near: {names}")
            pending = rest
        self.nodes = ordered

    def copy(self) -> "Graph":
        """A structural copy (constant arrays are shared, not copied)."""
        g = Graph(self.name)
        g._names = set(self._names)
        g.opset = self.opset
        g.output_names = list(self.output_names) if self.output_names is not None else None
        m: dict[int, Value] = {}

        def cp(v: Value) -> Value:
            nv = Value(v.name, v.type, data=v.data)
            nv.known = v.known
            m[id(v)] = nv
            return nv

        g.inputs = [cp(v) for v in self.inputs]
        for k, v in self.constants.items():
            g.constants[k] = cp(v)
        for n in self.nodes:
            outs = [cp(o) for o in n.outputs]
            ins = [None if v is None else m[id(v)] for v in n.inputs]
            g.nodes.append(Node(n.op, ins, outs, dict(n.attrs), n.name, n.domain))
        g.outputs = [m[id(v)] for v in self.outputs]
        return g

    def op_histogram(self) -> dict[str, int]:
        h: dict[str, int] = {}
        for n in self.nodes:
            h[n.qualified_op] = h.get(n.qualified_op, 0) + 1
        return dict(sorted(h.items(), key=lambda kv: (-kv[1], kv[0])))

    def __str__(self) -> str:
        from .text import print_graph
        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.nodes)} nodes>"
