"""Building IR nodes with type inference: the one way passes, rules and the frontend add nodes."""
from __future__ import annotations

from typing import Any

import numpy as np

from .graph import Graph, Node, Value
from .registry import find_op, infer_types, run_reference

#: values up to this many elements are computed at compile time when all inputs are known
#: (ONNX "data propagation"): shapes and indices, so Reshape and Slice see static arguments.
KNOWN_LIMIT = 4096


def propagate_known(node: Node) -> None:
    """Attach compile-time values to a node's outputs when every input is known and small."""
    od = find_op(node.op, node.domain)
    if od is None or any(v.type.numel > KNOWN_LIMIT for v in node.outputs):
        return
    if od.known is not None:   # outputs determined by the input types (Shape, Size)
        vals = od.known(node)
        if vals is not None:
            for v, a in zip(node.outputs, vals):
                v.known = np.asarray(a, dtype=v.type.dtype.numpy).reshape(v.shape)
        return
    ins = [None if v is None else v.const_value() for v in node.inputs]
    if any(a is None for v, a in zip(node.inputs, ins) if v is not None):
        return
    try:
        outs = run_reference(node, ins)
    except Exception:
        return
    for v, a in zip(node.outputs, outs):
        if tuple(a.shape) == v.shape:
            v.known = a


class Builder:
    """Appends typed nodes to a graph.

    ``b.op("Conv", x, w, kernel_shape=[3, 3])`` or ``b.Conv(x, w, kernel_shape=[3, 3])``
    returns the output Value (a list when ``num_outputs`` > 1). Types are inferred through
    the registry; raises ``ir.registry.ShapeError`` when they cannot be.
    """

    def __init__(self, graph: Graph, name_prefix: str = ""):
        self.graph = graph
        self.name_prefix = name_prefix
        self.created: list[Node] = []
        #: ids of created nodes whose node name (``auto_names``) or output names
        #: (``auto_value_names``) the builder made up rather than the caller gave
        self.auto_names: set[int] = set()
        self.auto_value_names: set[int] = set()

    def const(self, array: Any, name: str = "c", dtype=None) -> Value:
        return self.graph.add_const(np.asarray(array, dtype=dtype), name)

    def op(self, op: str, *inputs: Value | None, domain: str = "", num_outputs: int = 1,
           name: str | None = None, out_names: list[str] | None = None, exact_names: bool = False,
           attributes: dict[str, Any] | None = None, **attrs: Any):
        """Add one node. ``out_names`` are hints for the output names (made unique), or the
        exact names when ``exact_names`` (the caller reserved them, as the frontend does).
        ``attributes`` passes node attributes whose names clash with these keywords (Split-18's
        ``num_outputs``); keyword attributes override it."""
        g = self.graph
        if attributes:
            attrs = {**attributes, **attrs}
        node_name = name if name is not None else g.fresh_node_name(self.name_prefix + op)
        node = Node(op, list(inputs), [], attrs, node_name, domain)
        types = infer_types(node)
        n_out = max(num_outputs, 1) if out_names is None else len(out_names)
        hints = out_names or [node_name + ("" if n_out == 1 else f"_{i}") for i in range(n_out)]
        if len(types) < n_out:
            raise ValueError(f"{op} node '{node_name}' has {len(types)} outputs, {n_out} requested")
        names = hints if exact_names else [g.fresh_name(h) for h in hints]
        node.outputs = [Value(nm, t, producer=node) for nm, t in zip(names, types[:n_out])]
        propagate_known(node)
        g.nodes.append(node)
        self.created.append(node)
        if name is None:
            self.auto_names.add(id(node))
        if out_names is None:
            self.auto_value_names.add(id(node))
        return node.outputs[0] if n_out == 1 and out_names is None else node.outputs

    def __getattr__(self, op: str):
        if op.startswith("_") or not op[:1].isupper():
            raise AttributeError(op)
        return lambda *inputs, **attrs: self.op(op, *inputs, **attrs)
