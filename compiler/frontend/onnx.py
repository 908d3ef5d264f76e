"""ONNX -> ir.Graph.

Accepts a path, bytes or ``onnx.ModelProto``; validates with ``onnx.checker``; accepts
default-domain opsets 7 up to ``onnx.defs.onnx_opset_version()``. Each node is imported through
the op registry: ops whose semantics changed between versions provide ``OpDef.importer`` to
convert the node's version into the newest semantics, which is what IR ops mean. Initializers
(also those that are graph inputs) become constants; Constant nodes become constants too.

Every shape must be static: a symbolic or missing dimension of a graph input is taken from
``input_shapes={name: shape}``; otherwise :class:`UnsupportedModelError` names the input and the
dimension.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

from tensorfuse.ir.errors import ModelLoadError, UnsupportedModelError
from tensorfuse.ir.builder import Builder, propagate_known
from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.lowbit import LOWBIT_OPS
from tensorfuse.ir.registry import ShapeError, find_op, infer_types
from tensorfuse.ir.types import DType, TensorType

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
SUPPORTED_DOMAINS = ("", "ai.onnx")
#: further op domains whose ops the registry may hold (registered with that domain)
EXTRA_DOMAINS = ("ai.onnx.ml", "com.microsoft")


def registry_domain(domain: str) -> str | None:
    """The registry domain of an ONNX node domain ("" for the default one), None if unsupported."""
    return "" if domain in SUPPORTED_DOMAINS else domain if domain in EXTRA_DOMAINS else None


def load_model(model: Any) -> onnx.ModelProto:
    """Read a model from a path, bytes or ModelProto. Raises ModelLoadError if it is not ONNX."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise ModelLoadError(f"the given bytes are not a valid ONNX model ({type(e).__name__}: {e})") from None
        src = "the given bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ModelLoadError(f"model file not found: {path}")
        try:
            proto = onnx.load(path)
        except Exception as e:
            raise ModelLoadError(f"{path} is not a valid ONNX model: it could not be parsed "
                                 f"({type(e).__name__}: {str(e)[:200]})") from None
        src = path
    else:
        raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{src} is not a valid ONNX model: it has no graph")
    return proto


def _inline_functions(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every call of a model-local function replaced by the function's body
    (``onnx.inliner``). Raises ModelLoadError when the functions cannot be inlined."""
    import onnx.inliner
    try:
        return onnx.inliner.inline_local_functions(proto)
    except Exception as e:
        raise ModelLoadError(f"the model's local functions cannot be inlined ({type(e).__name__}: {e})") from None


def _check(proto: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        raise ModelLoadError(f"the model fails onnx.checker: {str(e).strip().splitlines()[0]}") from None
    except ValueError as e:  # models over 2 GB: checked by path only; we accept them unchecked
        if "2GB" not in str(e):
            raise ModelLoadError(f"the model fails onnx.checker: {e}") from None


def opset_of(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in SUPPORTED_DOMAINS:
            return imp.version
    return MAX_OPSET     # no default-domain import: the model uses no default-domain op


def attr_value(a: onnx.AttributeProto, allow_graphs: bool = False) -> Any:
    """An ONNX attribute as a Python value: strings decoded, tensors as numpy arrays.

    Subgraph attributes (GRAPH, GRAPHS) come back as ``onnx.GraphProto`` (a list of them) when
    ``allow_graphs`` (the control-flow importers inline them); otherwise they are refused."""
    if a.type == onnx.AttributeProto.GRAPH or a.type == onnx.AttributeProto.GRAPHS:
        if allow_graphs:
            return a.g if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        raise UnsupportedModelError(f"attribute {a.name}: subgraph attributes are not supported")
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return tensor_array(v, f"attribute '{a.name}'")
    if isinstance(v, list):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else
                tensor_array(x, f"attribute '{a.name}'") if isinstance(x, onnx.TensorProto) else x for x in v]
    return v


def tensor_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """``numpy_helper.to_array(t)``, with a tensor whose data does not match its dims and type
    (raw_data of the wrong size, too many or too few values) or whose type tensorfuse lacks
    refused as ModelLoadError naming ``what``, not numpy's reshape error."""
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        dims = list(t.dims)
        need = None
        if t.HasField("raw_data"):
            try:
                need = int(np.prod(dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                tname = onnx.TensorProto.DataType.Name(t.data_type)
            except (KeyError, ValueError, TypeError):
                need = None
        if need is not None and need != len(t.raw_data):
            raise ModelLoadError(f"{what}: the tensor's raw_data has {len(t.raw_data)} bytes, its dims "
                                 f"{dims} and type {tname} need {need}") from None
        raise ModelLoadError(f"{what}: its tensor (dims {dims}) cannot be read: {type(e).__name__}: "
                             f"{str(e)[:200]}") from None
    return arr


def _where(n: onnx.NodeProto, i: int | None = None) -> str:
    """How error messages name an ONNX node."""
    if n.name:
        return f"node '{n.name}' ({n.op_type})"
    first = n.output[0] if n.output else ""
    return f"unnamed {n.op_type} node{f' #{i}' if i is not None else ''} (first output '{first}')"


def check_names(graph: onnx.GraphProto, _path: str = "") -> None:
    """Raise ModelLoadError if a name in ``graph`` (its own, a node's, an input's, an output's,
    a value's, an initializer's; subgraphs too) is not valid UTF-8. ONNX names are protobuf
    strings; the Python protobuf runtime returns bytes for invalid UTF-8 in them, which the rest
    of the compiler cannot use as names."""
    def bad(what: str, name) -> None:
        if isinstance(name, bytes):
            raise ModelLoadError(f"{_path}{what}: the name {name!r} is not valid UTF-8")

    bad("graph name", graph.name)
    for kind, vis in (("graph input", graph.input), ("graph output", graph.output),
                      ("value_info", graph.value_info)):
        for vi in vis:
            bad(kind, vi.name)
    for t in graph.initializer:
        bad("initializer", t.name)
    for i, n in enumerate(graph.node):
        where = f"node #{i} ({n.op_type})"
        for what, name in ([("node name", n.name), ("op type", n.op_type), ("domain", n.domain)] +
                           [("input", x) for x in n.input] + [("output", x) for x in n.output]):
            bad(f"{where} {what}", name)
        for a in n.attribute:
            bad(f"{where} attribute name", a.name)
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                check_names(sub, f"{_path}{n.name or f'#{i}'}/")


def _tensor_type(vi: onnx.ValueInfoProto, input_shapes: dict) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedModelError(f"input '{vi.name}' is not a tensor (sequences, maps and optionals are not supported)")
    try:
        dtype = DType.from_onnx(tt.elem_type)
    except TypeError as e:
        raise UnsupportedModelError(f"input '{vi.name}': {e}") from None
    if vi.name in input_shapes:
        shape = tuple(int(d) for d in input_shapes[vi.name])
        if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
            raise UnsupportedModelError(f"input_shapes['{vi.name}'] has rank {len(shape)}, the model says {len(tt.shape.dim)}")
        for i, d in enumerate(tt.shape.dim if tt.HasField("shape") else []):
            if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != shape[i]:
                raise UnsupportedModelError(f"input_shapes['{vi.name}'][{i}] = {shape[i]} but the model fixes it to {d.dim_value}")
        return TensorType(dtype, shape)
    if not tt.HasField("shape"):
        raise UnsupportedModelError(f"input '{vi.name}' has no shape; give it with input_shapes={{'{vi.name}': [...]}}")
    shape = []
    for i, d in enumerate(tt.shape.dim):
        if not d.HasField("dim_value") or d.dim_value < 0:   # a negative one: unknown, as onnxruntime reads it
            sym = f" ('{d.dim_param}')" if d.dim_param else ""
            raise UnsupportedModelError(
                f"input '{vi.name}' has a dynamic dimension {i}{sym}; tensorfuse compiles static shapes: "
                f"give it with input_shapes={{'{vi.name}': [...]}}")
        shape.append(d.dim_value)
    return TensorType(dtype, tuple(shape))


#: what ``ImportCtx.env`` binds the outputs of a node refused for its low-bit tensors to
#: (:func:`_refuse_lowbit`): the nodes after it are skipped, the import goes on to list every
#: such node, then raises
_REFUSED = object()


class _RefusedInput(Exception):
    """A node reads the output of a node refused for its low-bit tensors."""


class ImportCtx:
    """What an ``OpDef.importer`` gets: the graph builder and the mapping from ONNX names."""

    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.builder = Builder(graph)
        self.opset = opset
        self.env: dict[str, Value] = {}
        self.opset_imports: list = []       # the model's opset_import (versions of other domains)
        self._node_names: set[str] = set()
        #: op -> the nodes of that op refused for reading or writing a low-bit tensor
        self.lowbit_refused: dict[str, list[str]] = {}

    def value(self, name: str) -> Value | None:
        if name == "":
            return None
        try:
            v = self.env[name]
        except KeyError:
            raise UnsupportedModelError(f"value '{name}' is used but never defined") from None
        if v is _REFUSED:
            raise _RefusedInput(name)
        return v

    def attrs(self, proto: onnx.NodeProto) -> dict[str, Any]:
        try:
            return {a.name: attr_value(a) for a in proto.attribute}
        except ModelLoadError as e:
            raise ModelLoadError(f"{_where(proto)}: {e}") from None

    def default_import(self, proto: onnx.NodeProto, op: str | None = None, inputs=None, attrs=None):
        """Import as the same op with the node's attributes; returns the output Values."""
        ins = [self.value(n) for n in proto.input] if inputs is None else inputs
        while ins and ins[-1] is None:
            ins.pop()
        names = [o if o else self.graph.fresh_name(f"{proto.name or proto.op_type}_unused{i}")
                 for i, o in enumerate(proto.output)]
        outs = self.builder.op(op or proto.op_type, *ins, name=self.node_name(proto), out_names=names,
                               exact_names=True, attributes=self.attrs(proto) if attrs is None else attrs,
                               domain=registry_domain(proto.domain) or "")
        return outs

    def node_name(self, proto: onnx.NodeProto) -> str:
        """The ONNX node name, made unique among node names (ONNX does not require it)."""
        base = proto.name or f"{proto.op_type}_{len(self.graph.nodes)}"
        name, k = base, 0
        while name in self._node_names:
            k += 1
            name = f"{base}_{k}"
        self._node_names.add(name)
        return name


#: ops the frontend imports itself by inlining their subgraphs (compiler/frontend/control_flow.py)
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")


def unsupported_ops(proto: onnx.ModelProto | onnx.GraphProto, _missing=None, _prefix: str = "") -> dict[str, list[str]]:
    """Every op type the registry lacks, with the names of its nodes, subgraphs included
    (their nodes named ``outer/inner``)."""
    missing: dict[str, list[str]] = {} if _missing is None else _missing
    graph = proto.graph if isinstance(proto, onnx.ModelProto) else proto
    for i, n in enumerate(graph.node):
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                unsupported_ops(sub, missing, f"{_prefix}{n.name or f'#{i}'}/")
        if n.domain in SUPPORTED_DOMAINS and n.op_type in ("Constant",) + CONTROL_FLOW_OPS:
            continue
        dom = registry_domain(n.domain)
        if dom is None or find_op(n.op_type, dom) is None:
            key = f"{n.domain}::{n.op_type}" if n.domain not in SUPPORTED_DOMAINS else n.op_type
            missing.setdefault(key, []).append(_prefix + (n.name or f"#{i}"))
    return missing


def _upgrade_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """Models older than opset 7 go through onnx.version_converter to opset 7, the oldest whose
    semantics our importers implement (opset 6 -> 7 changed broadcasting and little else)."""
    import onnx.version_converter
    try:
        return onnx.version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:
        raise UnsupportedModelError(f"default-domain opset {opset} is older than {MIN_OPSET} and "
                                    f"onnx.version_converter could not upgrade it: {str(e)[:300]}") from None


def _constant_node_value(proto: onnx.NodeProto) -> np.ndarray:
    """The value of a Constant node (ONNX Constant: exactly one of value, sparse_value,
    value_float(s), value_int(s), value_string(s)). Raises ModelLoadError naming the node when
    it has none or several, or when its tensor's data does not match its dims."""
    if len(proto.attribute) != 1:
        got = ", ".join(a.name for a in proto.attribute) or "none"
        raise ModelLoadError(f"{_where(proto)}: a Constant needs exactly one value attribute "
                             f"(value, value_float, value_int, ...), it has {got}")
    a = proto.attribute[0]
    try:
        v = attr_value(a)
    except ModelLoadError as e:
        raise ModelLoadError(f"{_where(proto)}: {e}") from None
    if a.name == "value":
        return np.asarray(v)
    if a.name in ("value_float", "value_int", "value_string"):
        return np.asarray(v, dtype={"value_float": np.float32, "value_int": np.int64}.get(a.name))
    if a.name in ("value_floats", "value_ints"):
        return np.asarray(v, dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise UnsupportedModelError(f"Constant node '{proto.name}': attribute {a.name} is not supported")


#: default-domain attributes whose only values the ONNX spec allows are 0 and 1 (onnx.reference
#: takes any non-zero value as 1, onnxruntime and onnx shape inference some as 0: a value
#: outside {0, 1} has no meaning, so it is refused)
FLAG_ATTRS = frozenset({
    "keepdims", "noop_with_empty_axes", "select_last_index", "is_causal", "ceil_mode",
    "count_include_pad", "storage_order", "transA", "transB", "allowzero", "exclusive", "reverse",
    "center_point_box", "largest", "sorted", "training_mode", "detect_negative", "detect_positive",
    "upper", "linear_before_reset", "input_forget", "onesided", "inverse", "fmod", "saturate",
    "new_axis", "interleaved", "layout"})


def check_flag_attrs(n: onnx.NodeProto) -> None:
    """Raise ModelLoadError naming the node and attribute if a default-domain node gives a
    0/1 flag (:data:`FLAG_ATTRS`) another value."""
    if n.domain not in SUPPORTED_DOMAINS:
        return
    for a in n.attribute:
        if a.name in FLAG_ATTRS and a.type == onnx.AttributeProto.INT and a.i not in (0, 1):
            raise ModelLoadError(f"{_where(n)}: attribute '{a.name}' is {a.i}; the ONNX spec allows only 0 or 1")


def _declared(vi: onnx.ValueInfoProto):
    """(DType or None, dims or None) a ValueInfoProto declares: None where it declares nothing;
    a dim is an int or None (symbolic, unknown, or negative: read as unknown, as onnxruntime does)."""
    if not vi.type.HasField("tensor_type"):
        return None, None
    tt = vi.type.tensor_type
    dt = None
    if tt.elem_type:
        try:
            dt = DType.from_onnx(tt.elem_type)
        except TypeError:
            dt = None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None      # negative: unknown
            for d in tt.shape.dim] if tt.HasField("shape") else None
    return dt, dims


def check_declared(kind: str, vi: onnx.ValueInfoProto, t: TensorType, *, shape_is_error: bool = False) -> None:
    """Check ``vi`` (a graph output, value_info or input entry) against ``t``, the type tensorfuse
    inferred (or the initializer's). A contradicting dtype raises ModelLoadError naming the
    value; a contradicting definite shape raises it when ``shape_is_error`` (an initializer's
    graph-input entry), else warns with :class:`~ir.errors.DeclaredShapeWarning` (see
    there why). Symbolic, unknown and negative dims, and declarations without a shape, are fine."""
    dt, dims = _declared(vi)
    if dt is not None and dt != t.dtype:
        raise ModelLoadError(f"{kind} '{vi.name}' is declared {dt.value}, but it is {t.dtype.value} "
                             f"(shape {list(t.shape)})")
    if dims is None:
        return
    if len(dims) != len(t.shape) or any(d is not None and d != s for d, s in zip(dims, t.shape)):
        shown = [d if d is not None else "?" for d in dims]
        msg = f"{kind} '{vi.name}' is declared with shape {shown}, but its shape is {list(t.shape)}"
        if shape_is_error:
            raise ModelLoadError(msg)
        import warnings

        from tensorfuse.ir.errors import DeclaredShapeWarning
        warnings.warn(msg + " (the computed shape is used, as onnxruntime does)", DeclaredShapeWarning, stacklevel=2)


def import_node(ctx: ImportCtx, n: onnx.NodeProto) -> list:
    """Import one ONNX node into ``ctx.graph``, reading its inputs from ``ctx.env`` and binding
    its output names there; returns the output Values. Constant nodes become graph constants;
    If/Loop/Scan are inlined by compiler/frontend/control_flow.py. Raises InputValuesNeeded when
    a shape-deciding input is computed from graph inputs, UnsupportedModelError otherwise."""
    check_flag_attrs(n)
    if n.op_type == "Constant" and n.domain in SUPPORTED_DOMAINS:
        arr = _constant_node_value(n)
        try:
            ttype = TensorType.of(arr)
        except TypeError as e:       # a dtype tensorfuse lacks (complex64 ...), as for initializers
            raise UnsupportedModelError(f"{_where(n)}: {e}") from None
        v = Value(n.output[0], ttype, data=arr)
        ctx.graph.constants[v.name] = v
        ctx.env[n.output[0]] = v
        return [v]
    dom = registry_domain(n.domain)
    qop = f"{dom}::{n.op_type}" if dom else n.op_type
    ins = [ctx.env.get(name) for name in n.input if name]
    if any(v is _REFUSED for v in ins):      # after a refused node: that one is listed
        return _refuse_outputs(ctx, n)
    if qop not in LOWBIT_OPS and any(isinstance(v, Value) and v.dtype.is_lowbit for v in ins):
        return _refuse_lowbit(ctx, n, qop, ins)
    od = find_op(n.op_type, dom)
    dom_opset = ctx.opset if dom == "" else next((i.version for i in ctx.opset_imports if i.domain == dom), 1)
    try:
        version = onnx.defs.get_schema(n.op_type, dom_opset, dom).since_version
    except onnx.defs.SchemaError:       # onnx has no schema for a contrib op (com.microsoft)
        version = dom_opset
    try:
        if n.op_type in CONTROL_FLOW_OPS and dom == "":
            from tensorfuse.compiler.frontend.control_flow import import_control_flow
            outs = import_control_flow(ctx, n, version)
        elif od.importer is not None:
            outs = od.importer(ctx, n, version)
        else:
            outs = ctx.default_import(n)
    except _RefusedInput:                   # read a refused node's output (inside a subgraph)
        return _refuse_outputs(ctx, n)
    except ShapeError as e:
        # a shape-deciding input computed from graph inputs: compile() specialises on them
        from tensorfuse.compiler.specialize import InputValuesNeeded, graph_inputs_behind
        needed = graph_inputs_behind(ctx.graph, e.needs_value)
        where = (f"node '{n.name}' ({n.op_type})" if n.name else
                 f"unnamed {n.op_type} node (first output '{n.output[0] if n.output else ''}')")
        msg = e.reason      # without the IR node's own name: ``where`` names the ONNX node
        if needed:
            raise InputValuesNeeded(f"{where}: {msg}", needed) from None
        raise UnsupportedModelError(f"{where}: {msg}") from None
    if isinstance(outs, Value):
        outs = [outs]
    if any(v is _REFUSED for v in outs):    # a subgraph's result behind a refused node
        return _refuse_outputs(ctx, n)
    if qop not in LOWBIT_OPS and any(v is not None and v.dtype.is_lowbit for v in outs):
        return _refuse_lowbit(ctx, n, qop, list(outs))      # a Cast or ConstantOfShape making one
    for name, v in zip(n.output, outs):
        if name and v is not None:
            ctx.env[name] = v     # an importer's value may be named differently (a decomposition)
    return outs


def _refuse_outputs(ctx: ImportCtx, n: onnx.NodeProto) -> list:
    for name in n.output:
        if name:
            ctx.env[name] = _REFUSED
    return []


def _refuse_lowbit(ctx: ImportCtx, n: onnx.NodeProto, qop: str, values) -> list:
    """Record node ``n`` (op ``qop``), which reads or writes a low-bit tensor (``values``: its
    inputs or outputs) that only ``ir.lowbit.LOWBIT_OPS`` take; its outputs become refused."""
    dts = sorted({v.dtype.value for v in values if isinstance(v, Value) and v.dtype.is_lowbit})
    where = f"'{n.name}'" if n.name else f"unnamed (first output '{n.output[0] if n.output else ''}')"
    ctx.lowbit_refused.setdefault(qop, []).append(f"{where} ({', '.join(dts)})")
    return _refuse_outputs(ctx, n)


def lowbit_error(refused: dict[str, list[str]]) -> UnsupportedModelError:
    """The error listing every node refused for reading or writing a low-bit tensor."""
    lines = [f"  {op}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
             for op, names in sorted(refused.items())]
    return UnsupportedModelError(
        "the model gives low-bit tensors (float8, float4, int4, uint4, int2, uint2) to ops that do not "
        f"take them (only {', '.join(sorted(LOWBIT_OPS))} do):\n" + "\n".join(lines), dict(refused))


def import_onnx(model: Any, input_shapes: dict[str, Any] | None = None, check: bool = True,
                max_memory: int | str | None = None) -> Graph:
    """Import an ONNX model as an ir.Graph with static shapes.

    max_memory: the memory cap in bytes (``compiler.limits``: None is ``$TENSORFUSE_MAX_MEMORY``
    or the physical memory); a graph input or node output larger than it is refused.

    Raises ModelLoadError (not ONNX, fails the checker, names that are not UTF-8, a Constant
    without a value or with data that does not match its dims, a 0/1 flag attribute with another
    value, a graph output, value_info or initializer-input declaration whose dtype or definite
    dims contradict the inferred type), UnsupportedModelError (ops the
    registry lacks, listed all at once with node names; opset out of range; dynamic input
    dimensions; a tensor over the memory cap, naming the node and shape).
    """
    from tensorfuse.compiler.limits import check_memory, resolve_max_memory
    max_memory = resolve_max_memory(max_memory)
    proto = load_model(model)
    check_names(proto.graph)
    if check:
        _check(proto)
    if proto.functions:     # model-local functions (tensorfuse's own export writes fused ops so)
        proto = _inline_functions(proto)
    opset = opset_of(proto)
    if 1 <= opset < MIN_OPSET:
        proto, opset = _upgrade_opset(proto, opset), MIN_OPSET
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedModelError(f"default-domain opset {opset} is outside the supported range "
                                    f"{MIN_OPSET}..{MAX_OPSET}")
    missing = unsupported_ops(proto)
    if missing:
        lines = [f"  {op}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
                 for op, names in sorted(missing.items())]
        raise UnsupportedModelError("the model uses ops tensorfuse does not support:\n" + "\n".join(lines), missing)
    input_shapes = dict(input_shapes or {})
    g = Graph(proto.graph.name or "main")
    g.opset = opset
    ctx = ImportCtx(g, opset)
    ctx.opset_imports = list(proto.opset_import)
    inits = {t.name: t for t in proto.graph.initializer}
    for t in proto.graph.initializer:
        try:
            arr = numpy_helper.to_array(t)
            DType.from_numpy(arr.dtype)
        except Exception as e:
            raise UnsupportedModelError(f"initializer '{t.name}': {e}") from None
        v = Value(t.name, TensorType.of(arr), data=arr)
        g.reserve(t.name)
        g.constants[t.name] = v
        ctx.env[t.name] = v
    unknown = set(input_shapes) - {vi.name for vi in proto.graph.input}
    if unknown:     # before the inputs' own checks, which would blame the input the typo meant
        raise UnsupportedModelError(f"input_shapes names inputs the model lacks: {sorted(unknown)}; "
                                    f"its inputs are {[vi.name for vi in proto.graph.input if vi.name not in inits]}")
    for vi in proto.graph.input:
        if vi.name in inits:     # an initializer that is also an input: its declaration must fit it
            check_declared("graph input (an initializer)", vi, g.constants[vi.name].type, shape_is_error=True)
            continue
        v = Value(vi.name, _tensor_type(vi, input_shapes))
        g.reserve(vi.name)
        g.inputs.append(v)
        ctx.env[vi.name] = v
    for n in proto.graph.node:
        for o in n.output:
            if o:
                g.reserve(o)
    for n in proto.graph.node:
        import_node(ctx, n)
    if ctx.lowbit_refused:
        raise lowbit_error(ctx.lowbit_refused)
    for vi in proto.graph.output:
        if vi.name not in ctx.env:
            raise UnsupportedModelError(f"graph output '{vi.name}' is never defined")
        g.outputs.append(ctx.env[vi.name])
    g.output_names = [vi.name for vi in proto.graph.output]
    for vi in proto.graph.output:
        check_declared("graph output", vi, ctx.env[vi.name].type)
    for vi in proto.graph.value_info:
        if vi.name in ctx.env and ctx.env[vi.name] is not None:
            check_declared("value_info", vi, ctx.env[vi.name].type)
    check_memory(g, max_memory)
    return g
