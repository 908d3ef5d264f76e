"""Export an (optimised) graph IR back to an ONNX file that any ONNX runtime can run.

Default-domain ops are written at the newest opset the installed onnx defines (the IR's
semantics, see ``ir/registry.py``). Every fused op of the ``tensorfuse`` domain becomes a call
of an ONNX model-local function (ONNX IR "Functions", ``ModelProto.functions``) in that domain,
whose body is the op's decomposition into standard ONNX ops, so onnxruntime (which inlines
local functions) loads and runs the file and ``tensorfuse.compile`` re-imports it (the
frontend inlines them too):

- ``FusedConv``: Mul(X, S) (where it has S) -> Conv -> Add(Z) -> activation; ``FusedMatMul``: MatMul -> Add(bias) ->
  activation; ``FusedGemm``: Gemm -> activation (``ir/ops/fused.py`` defines each);
- ``Attention``: MatMul(Q, Transpose(K)) -> Mul(scale) -> Add(mask) -> Softmax(-1) -> MatMul(V);
- ``SkipLayerNormalization``: Add(X, skip, bias) -> LayerNormalization (stash_type 1), the sum
  as the optional second output; ``EmbedLayerNormalization``: Gather(axis 0) of each table,
  the addends summed -> LayerNormalization;
- activations (``ir.ops.activations.FUSED_ACTIVATIONS``) as the ONNX ops they stand for: Relu,
  Clip (bounds as Constant inputs), LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh, Gelu
  (GeluTanh: approximate="tanh"); SiLU as Mul(x, Sigmoid(x));
- a fuse_ops group (``FusedFunction``) as a function whose body is the group's nodes (fused ops
  in it call their own functions).

A fused op's function takes the node's present inputs and has its attributes in the body; one
function per distinct body (named after the op, ``FusedConv``, ``FusedConv_1`` ...). The call
node keeps the node's name and attributes (declared as function attributes, so viewers such as
Netron show them). Graph outputs carry their user-facing names (``graph.output_names``); every
intermediate gets a ``value_info`` with its type, so a viewer shows shapes.
"""
from __future__ import annotations

import os
import re

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.ops.fused import DOMAIN

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
    functions = _Functions(opset)
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
    model = helper.make_model(g, opset_imports=imports, producer_name="tensorfuse", functions=functions.protos)
    return model


class _Functions:
    """The model-local functions written so far: one per distinct body, each named uniquely."""

    def __init__(self, opset: int):
        self.opset = opset
        self.protos: list[onnx.FunctionProto] = []
        self._by_body: dict[tuple, str] = {}
        self._names: set[str] = set()

    def name(self, want: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", want) or "f"
        name, k = base, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def add_decomposition(self, n: Node, body: "_Body", inputs: list[str], outputs: list[str],
                          attr_names: list[str]) -> str:
        """The name of the function with this body (made on first use)."""
        key = (n.op, n.domain, tuple(inputs), tuple(outputs), tuple(attr_names),
               tuple(p.SerializeToString(deterministic=True) for p in body.nodes))
        name = self._by_body.get(key)
        if name is None:
            name = self._by_body[key] = self.name(n.op)
            self.protos.append(helper.make_function(
                n.domain, name, inputs, outputs, body.nodes, [helper.make_opsetid("", self.opset)],
                attributes=attr_names, doc_string=f"{n.qualified_op} as standard ONNX ops (tensorfuse export)"))
        return name


def _node_proto(n: Node, name_of, opset: int, functions: _Functions) -> onnx.NodeProto:
    """One node; a fused function (a node with a ``body`` graph) and a fused op of
    :data:`DECOMPOSE` become calls of ONNX local functions, added to ``functions``."""
    ins = ["" if v is None else name_of(v) for v in n.inputs]
    while ins and ins[-1] == "":
        ins.pop()
    outs = [name_of(o) for o in n.outputs]
    body = n.attrs.get("body")
    if isinstance(body, Graph):
        fname = functions.name(n.name)
        functions.protos.append(_function_proto(n, fname, body, opset, functions))
        attrs = {k: v for k, v in n.attrs.items() if not isinstance(v, Graph)}
        return helper.make_node(fname, ins, outs, name=n.name, domain=n.domain, **dict(sorted(attrs.items())))
    if n.domain == DOMAIN and n.op in DECOMPOSE:
        present = [i for i, v in enumerate(n.inputs) if v is not None]
        formal = [f"in{i}" for i in present]
        b = _Body(n)
        results = DECOMPOSE[n.op](b, n, {i: f for i, f in zip(present, formal)})
        fouts = [f"out{k}" for k in range(len(n.outputs))]
        b.rename_outputs(results[:len(n.outputs)], fouts)
        attr_names = sorted(n.attrs)
        fname = functions.add_decomposition(n, b, formal, fouts, attr_names)
        p = helper.make_node(fname, [name_of(n.inputs[i]) for i in present], outs, name=n.name, domain=n.domain)
        p.attribute.extend(_attribute(n, k, v) for k, v in sorted(n.attrs.items()))
        return p
    p = helper.make_node(n.op, ins, outs, name=n.name, domain=n.domain)
    p.attribute.extend(_attribute(n, k, v) for k, v in sorted(n.attrs.items()))
    return p


def _function_proto(n: Node, fname: str, body: Graph, opset: int, functions: _Functions) -> onnx.FunctionProto:
    """The local function of a fused function node: its body's nodes, with value types. Its
    string attributes (``kind``, ``anchor``) are declared as the function's attribute
    parameters, so the call node carries them (Netron shows them on the node)."""
    def name_of(v: Value) -> str:
        return v.name

    # the body's constants (a mover's shape or starts) as Constant nodes of the function
    nodes = [helper.make_node("Constant", [], [v.name], value=numpy_helper.from_array(np.asarray(v.data), v.name))
             for v in body.constants.values()]
    nodes += [_node_proto(m, name_of, opset, functions) for m in body.nodes]
    domains = sorted({m.domain for m in body.nodes if m.domain})
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, CUSTOM_DOMAIN_VERSION) for d in domains]
    attr_names = sorted(k for k, v in n.attrs.items() if not isinstance(v, Graph))
    f = helper.make_function(n.domain, fname, [v.name for v in body.inputs], [v.name for v in body.outputs],
                             nodes, imports, attributes=attr_names,
                             doc_string=f"{n.qualified_op}: a group of fuse_ops, one kernel")
    f.value_info.extend(helper.make_tensor_value_info(v.name, v.dtype.onnx, list(v.shape))
                        for v in list(body.inputs) + [o for m in body.nodes for o in m.outputs])
    return f


# ----------------------------------------------------------------------------- decompositions
class _Body:
    """The nodes of a function body under construction; values are local names."""

    def __init__(self, node: Node):
        self.node = node
        self.np_dtype = np.dtype(node.outputs[0].dtype.numpy)
        self.nodes: list[onnx.NodeProto] = []
        self._k = 0

    def op(self, op: str, *inputs: str, **attrs) -> str:
        out = f"t{self._k}"
        self._k += 1
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=None) -> str:
        """A scalar (or array) Constant of the output's dtype (or ``dtype``)."""
        arr = np.asarray(value, dtype=dtype or self.np_dtype)
        return self.op("Constant", value=numpy_helper.from_array(arr))

    def rename_outputs(self, values: list[str], formal: list[str]) -> None:
        """Make the body's results carry the function's output names (an Identity where a
        result is an input or is returned twice)."""
        mapping: dict[str, str] = {}
        for v, f in zip(values, formal):
            if v in mapping or not any(v in p.output for p in self.nodes):
                self.nodes.append(helper.make_node("Identity", [mapping.get(v, v)], [f]))
            else:
                mapping[v] = f
        for p in self.nodes:
            for i, x in enumerate(p.input):
                if x in mapping:
                    p.input[i] = mapping[x]
            for i, x in enumerate(p.output):
                if x in mapping:
                    p.output[i] = mapping[x]


def _activation(b: _Body, x: str) -> str:
    """The node's activation (``ir.ops.activations.FUSED_ACTIVATIONS``) applied to ``x``: the
    op it stands for, its parameters as attributes or (Clip) Constant inputs, "" for an
    omitted one; SiLU as Mul(x, Sigmoid(x))."""
    from tensorfuse.ir.ops.activations import activation_params, fused_activation
    name, params = activation_params(b.node)
    if name == "":
        return x
    act = fused_activation(name)
    attrs, extra = act.call(params)
    ins = [""] * (len(act.params) if act.params_are_inputs else 0)
    for i, v in extra:
        ins[i - 1] = b.const(v)
    y = b.op(act.op, x, *ins, **{k: float(v) if isinstance(v, (int, float)) else v for k, v in attrs.items()})
    return b.op("Mul", x, y) if act.times_x else y



def _anchor_attrs(n: Node) -> list[onnx.AttributeProto]:
    from tensorfuse.ir.ops.activations import ACTIVATION_ATTRS
    return [_attribute(n, k, v) for k, v in sorted(n.attrs.items()) if k not in ACTIVATION_ATTRS]


def _anchored(b: _Body, n: Node, f: dict, anchor: str, n_anchor: int, addend: int | None) -> list[str]:
    ins = [f.get(i, "") for i in range(n_anchor)]
    while ins and ins[-1] == "":
        ins.pop()
    y = b.op(anchor, *ins)
    b.nodes[-1].attribute.extend(_anchor_attrs(n))
    if addend is not None and addend in f:
        y = b.op("Add", y, f[addend])
    return [_activation(b, y)]


def _scaled_input(b: _Body, f: dict) -> dict:
    """FusedConv's formals with X replaced by Mul(X, S) where it has input 4 (S, the input-channel scale)."""
    if 4 not in f:
        return f
    return {**f, 0: b.op("Mul", f[0], f[4])}


def _attention(b: _Body, n: Node, f: dict) -> list[str]:
    r = n.inputs[1].type.rank
    kt = b.op("Transpose", f[1], perm=list(range(r - 2)) + [r - 1, r - 2])
    s = b.op("Mul", b.op("MatMul", f[0], kt), b.const(float(n.attrs["scale"])))
    if 3 in f:
        s = b.op("Add", s, f[3])
    return [b.op("MatMul", b.op("Softmax", s, axis=-1), f[2])]


def _layer_norm(b: _Body, n: Node, s: str, scale: str, bias: str | None) -> str:
    return b.op("LayerNormalization", s, scale, *([bias] if bias else []), axis=int(n.attr("axis", -1)),
                epsilon=float(n.attr("epsilon", 1e-5)), stash_type=1)


def _skip_layernorm(b: _Body, n: Node, f: dict) -> list[str]:
    s = b.op("Add", f[0], f[1])
    if 4 in f:
        s = b.op("Add", s, f[4])
    return [_layer_norm(b, n, s, f[2], f.get(3)), s]


def _embed_layernorm(b: _Body, n: Node, f: dict) -> list[str]:
    k = int(n.attrs["num_gathers"])
    terms = [b.op("Gather", f[2 * i], f[2 * i + 1], axis=0) for i in range(k)]
    terms += [f[i] for i in sorted(f) if i >= 2 * k + 2]
    s = terms[0]
    for t in terms[1:]:
        s = b.op("Add", s, t)
    return [_layer_norm(b, n, s, f[2 * k], f.get(2 * k + 1)), s]


#: fused op -> its decomposition: (body, node, {input index: formal name}) -> result names
DECOMPOSE = {
    "FusedConv": lambda b, n, f: _anchored(b, n, _scaled_input(b, f), "Conv", 3, 3),
    "FusedMatMul": lambda b, n, f: _anchored(b, n, f, "MatMul", 2, 2),
    "FusedGemm": lambda b, n, f: _anchored(b, n, f, "Gemm", 3, None),
    "Attention": _attention,
    "SkipLayerNormalization": _skip_layernorm,
    "EmbedLayerNormalization": _embed_layernorm,
}


def export_onnx(graph: Graph, path: str | os.PathLike, opset: int | None = None) -> onnx.ModelProto:
    """Write ``graph`` (e.g. ``compile(...).graph``; a compiled module itself is also taken, for
    its ``graph``) to ``path`` as ONNX, checked with ``onnx.checker``; returns the ModelProto.
    The file is written by ``runtime.outfile``'s rules (a regular file replaced atomically, a
    symbolic link written through, a device or FIFO written into; the folder must exist).

    Raises ValueError when there is no graph: a module loaded from a file
    (``tensorfuse.load``) keeps only its machine code, so its ``graph`` is None (compile the
    model to get one; a compile cache hit has it); ``runtime.outfile.OutputError`` (an
    OSError) when the file cannot be written; ``onnx.checker.ValidationError`` if the result
    is not valid ONNX (a bug: please report it with the graph dump)."""
    if not isinstance(graph, Graph) and hasattr(graph, "input_info") and hasattr(graph, "graph"):
        graph = graph.graph                 # a module: its optimised graph
    if graph is None:
        raise ValueError("export_onnx: no graph to export: a module loaded from a file (tensorfuse.load) keeps only "
                         "its machine code, so its .graph is None; compile the model with tensorfuse.compile(...) "
                         "and export that module's .graph")
    if not isinstance(graph, Graph):
        raise ValueError(f"export_onnx: expected a tensorfuse graph (Module.graph), got {type(graph).__name__}")
    model = to_onnx(graph, opset)
    onnx.checker.check_model(model)
    from tensorfuse.runtime.outfile import write_bytes
    write_bytes(path, model.SerializeToString())
    return model
