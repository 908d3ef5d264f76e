"""Export an (optimised) graph IR back to an ONNX file, for Netron and other ONNX tools.

Default-domain ops are written at the newest opset the installed onnx defines (the IR's
semantics, see ``ir/registry.py``); fused ops keep their ``tensorfuse`` domain (any non-default
domain is declared in ``opset_import`` at version 1) with their parameters as attributes, as
ONNX Runtime's ``optimized_model_filepath`` does for its own fused ops. A fuse_ops group
(``tensorfuse::FusedFunction``) becomes a call of an ONNX local function named after the node,
in the ``tensorfuse`` domain, whose body is the group's nodes: where the body holds only ONNX
ops, onnxruntime runs the exported file (it inlines local functions). Graph outputs carry
their user-facing names (``graph.output_names``); every intermediate gets a ``value_info`` with
its type, so a viewer shows shapes.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

from tensorfuse.ir.graph import Graph, Node, Value

__all__ = ["export_onnx", "to_onnx"]

CUSTOM_DOMAIN_VERSION = 1


def _attribute(node: Node, name: str, value) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, (list, tuple)):
        value = [v.item() if isinstance(v, np.generic) else v for v in value]
        if not value:
            spec = node.opdef.attrs.get(name) if _has_opdef(node) else None
            kind = {"ints": onnx.AttributeProto.INTS, "floats": onnx.AttributeProto.FLOATS,
                    "strings": onnx.AttributeProto.STRINGS}.get(spec.type if spec else "ints",
                                                                onnx.AttributeProto.INTS)
            return helper.make_attribute(name, [], attr_type=kind)
        if all(isinstance(v, (bool, int)) for v in value):
            value = [int(v) for v in value]
        elif all(isinstance(v, (int, float)) for v in value):
            value = [float(v) for v in value]
    return helper.make_attribute(name, value)


def _has_opdef(node: Node) -> bool:
    from tensorfuse.ir.registry import find_op
    return find_op(node.op, node.domain) is not None


def to_onnx(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """The graph as an ``onnx.ModelProto`` that passes ``onnx.checker`` (see module docstring)."""
    opset = opset or onnx.defs.onnx_opset_version()
    names: dict[int, str] = {}
    taken: set[str] = set()

    def name_of(v: Value) -> str:
        return names[id(v)]

    def assign(v: Value, want: str) -> None:
        name, k = want, 0
        while name in taken:
            k += 1
            name = f"{want}_{k}"
        taken.add(name)
        names[id(v)] = name

    out_names = list(graph.output_names or [v.name for v in graph.outputs])
    # graph outputs produced by a node (once) take the user-facing name directly
    direct: dict[int, str] = {}
    for v, want in zip(graph.outputs, out_names):
        if v.producer is not None and id(v) not in direct:
            direct[id(v)] = want
    taken.update(direct.values())
    for v in graph.inputs:
        assign(v, v.name)
    for v in graph.constants.values():
        assign(v, v.name)
    for n in graph.nodes:
        for o in n.outputs:
            if id(o) in direct:
                names[id(o)] = direct[id(o)]
            else:
                assign(o, o.name)

    nodes = []
    domains: set[str] = set()
    functions: list[onnx.FunctionProto] = []
    for n in graph.nodes:
        if n.domain:
            domains.add(n.domain)
        nodes.append(_node_proto(n, name_of, opset, functions))
    outputs = []
    for v, want in zip(graph.outputs, out_names):
        if names[id(v)] != want:     # an input, a constant or a repeated value: copy it out
            nodes.append(helper.make_node("Identity", [names[id(v)]], [want], name=f"output_{want}"))
            taken.add(want)
        outputs.append(helper.make_tensor_value_info(want, v.dtype.onnx, list(v.shape)))
    inputs = [helper.make_tensor_value_info(name_of(v), v.dtype.onnx, list(v.shape)) for v in graph.inputs]
    inits = [numpy_helper.from_array(np.asarray(v.data), name_of(v)) for v in graph.constants.values()]
    out_set = set(out_names)
    vinfo = [helper.make_tensor_value_info(name_of(o), o.dtype.onnx, list(o.shape))
             for n in graph.nodes for o in n.outputs if name_of(o) not in out_set]
    g = helper.make_graph(nodes, graph.name, inputs, outputs, initializer=inits, value_info=vinfo)
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, CUSTOM_DOMAIN_VERSION)
                                                   for d in sorted(domains)]
    model = helper.make_model(g, opset_imports=imports, producer_name="tensorfuse", functions=functions)
    return model


def _node_proto(n: Node, name_of, opset: int, functions: list) -> onnx.NodeProto:
    """One node; a fused function (a node with a ``body`` graph) becomes a call of an ONNX local
    function named after the node, in its domain, appended to ``functions``."""
    ins = ["" if v is None else name_of(v) for v in n.inputs]
    while ins and ins[-1] == "":
        ins.pop()
    outs = [name_of(o) for o in n.outputs]
    body = n.attrs.get("body")
    if isinstance(body, Graph):
        functions.append(_function_proto(n, body, opset, functions))
        attrs = {k: v for k, v in n.attrs.items() if not isinstance(v, Graph)}
        return helper.make_node(n.name, ins, outs, name=n.name, domain=n.domain, **dict(sorted(attrs.items())))
    p = helper.make_node(n.op, ins, outs, name=n.name, domain=n.domain)
    p.attribute.extend(_attribute(n, k, v) for k, v in sorted(n.attrs.items()))
    return p


def _function_proto(n: Node, body: Graph, opset: int, functions: list) -> onnx.FunctionProto:
    """The local function of a fused function node: its body's nodes, with value types. Its
    string attributes (``kind``, ``anchor``) are declared as the function's attribute
    parameters, so the call node carries them (Netron shows them on the node)."""
    def name_of(v: Value) -> str:
        return v.name

    nodes = [_node_proto(m, name_of, opset, functions) for m in body.nodes]
    domains = sorted({m.domain for m in body.nodes if m.domain})
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, CUSTOM_DOMAIN_VERSION) for d in domains]
    attr_names = sorted(k for k, v in n.attrs.items() if not isinstance(v, Graph))
    f = helper.make_function(n.domain, n.name, [v.name for v in body.inputs], [v.name for v in body.outputs],
                             nodes, imports, attributes=attr_names,
                             doc_string=f"{n.qualified_op}: a group of fuse_ops, one kernel")
    f.value_info.extend(helper.make_tensor_value_info(v.name, v.dtype.onnx, list(v.shape))
                        for v in list(body.inputs) + [o for m in body.nodes for o in m.outputs])
    return f


def export_onnx(graph: Graph, path: str | os.PathLike, opset: int | None = None) -> onnx.ModelProto:
    """Write ``graph`` (e.g. ``compile(...).graph``) to ``path`` as ONNX, checked with
    ``onnx.checker``; returns the ModelProto. Raises ``onnx.checker.ValidationError`` if the
    result is not valid ONNX (a bug: please report it with the graph dump)."""
    model = to_onnx(graph, opset)
    onnx.checker.check_model(model)
    onnx.save(model, os.fspath(path))
    return model
