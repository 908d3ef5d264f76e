"""ONNX control flow (If, Loop, Scan) for static programs, by inlining at import time.

tensorfuse compiles static shapes and has no control flow in its graph IR. The control-flow ops
whose decisions are known at compile time are therefore *inlined* by the frontend:

- **If** (ONNX spec: If-1/11/13/16/19/21/23/24/25): the condition must be known at compile time
  (a constant, a value computed from static shapes, or a graph input the compiler specialises
  on); only the taken branch's subgraph is imported, its outputs become the If's outputs.
- **Loop** (Loop-1/11/13/16/19/21/23/24/25): the trip count ``M`` and the initial condition must
  be known, and so must the body's condition output after every iteration (it is when it is
  computed from known values). The body is imported once per iteration with the loop-carried
  values threaded through; scan outputs are stacked along a new axis 0 (Unsqueeze + Concat).
  As in onnxruntime, the body's condition output stops the loop also when the ``cond`` input is
  omitted.
- **Scan** (Scan-9 and later: ``scan_input_axes``, ``scan_input_directions``,
  ``scan_output_axes``, ``scan_output_directions``; Scan-8: batch axis 0, sequence axis 1,
  ``directions``, optional ``sequence_lens`` with outputs padded with zeros, as onnxruntime
  does): the body is imported once per step, each scan input sliced with Gather.

Subgraph nodes keep unique names (``<outer node>/<iteration>/<inner node>``); outer-scope values
are visible by name through the import environment (``ImportCtx.env``); subgraph inputs are
bound per iteration. One node unrolls into at most :data:`MAX_UNROLL` body instances, a model
into at most :data:`MAX_TOTAL_UNROLL`.

Errors: a condition, trip count or sequence length computed at run time raises
``ir.registry.ShapeError`` naming the value (``needs_value``), which the frontend turns into
:class:`compiler.specialize.InputValuesNeeded` when graph inputs decide it (``compile`` then
specialises on their values) and into ``UnsupportedModelError`` otherwise; malformed nodes,
too many iterations and scan outputs whose shape changes between iterations raise
``UnsupportedModelError``.
"""
from __future__ import annotations

from collections import ChainMap

import numpy as np
import onnx
from onnx import numpy_helper

from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.graph import Value
from tensorfuse.ir.registry import ShapeError
from tensorfuse.ir.types import DType

#: body instances one Loop or Scan node may unroll into
MAX_UNROLL = 4096
#: body instances all control-flow nodes of one model may unroll into together
MAX_TOTAL_UNROLL = 65536


def import_control_flow(ctx, proto: onnx.NodeProto, version: int) -> list[Value | None]:
    """Inline one If, Loop or Scan node (``version``: the schema's since_version); returns the
    node's output Values in order."""
    name = ctx.node_name(proto)
    importer = {"If": _import_if, "Loop": _import_loop, "Scan": _import_scan}[proto.op_type]
    return importer(ctx, proto, version, name)


# ----------------------------------------------------------------------------- helpers
def _graph_attr(proto: onnx.NodeProto, attr: str, name: str) -> onnx.GraphProto:
    from tensorfuse.compiler.frontend.onnx import attr_value
    for a in proto.attribute:
        if a.name == attr:
            g = attr_value(a, allow_graphs=True)
            if isinstance(g, onnx.GraphProto):
                return g
            break
    raise UnsupportedModelError(f"{proto.op_type} node '{name}': attribute '{attr}' (a graph) is missing")


def _int_attrs(proto: onnx.NodeProto) -> dict:
    from tensorfuse.compiler.frontend.onnx import attr_value
    return {a.name: attr_value(a) for a in proto.attribute
            if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}


def _count_instances(ctx, n: int, name: str) -> None:
    total = getattr(ctx, "_cf_unrolled", 0) + n
    if total > MAX_TOTAL_UNROLL:
        raise UnsupportedModelError(
            f"node '{name}': control flow is unrolled at compile time and this model would need more "
            f"than {MAX_TOTAL_UNROLL} body instances in all")
    ctx._cf_unrolled = total


def _known(v: Value, what: str, name: str, op: str) -> np.ndarray:
    a = v.const_value()
    if a is None:
        raise ShapeError(
            f"{op} with {what} computed at run time ('{v.name}'): tensorfuse compiles static programs "
            f"and inlines control flow at compile time, so it must be a constant, computed from static "
            f"shapes, or computed from graph inputs the compiler specialises on", needs_value=v.name)
    return a


def _scalar(a: np.ndarray, what: str, name: str, op: str):
    if a.size != 1:
        raise UnsupportedModelError(f"{op} node '{name}': {what} must hold one element, it has shape {list(a.shape)}")
    return a.reshape(-1)[0]


def _declared_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    """The static shape a body input declares for a scalar (iteration number, condition):
    () unless it declares rank 1."""
    tt = vi.type.tensor_type
    return (1,) if tt.HasField("shape") and len(tt.shape.dim) == 1 else ()


def inline_graph(ctx, body: onnx.GraphProto, bindings: list[Value], prefix: str, owner: str,
                 inits: dict | None = None) -> list[Value]:
    """Import ``body``'s nodes into ``ctx.graph`` with its inputs bound (by position) to
    ``bindings``; outer-scope names resolve through ``ctx.env``. Node names and new value names
    start with ``prefix``. ``inits`` caches the body's initializers as constants across the
    instances of one body (a Loop's or Scan's iterations). Returns the body's output Values."""
    from tensorfuse.compiler.frontend.onnx import import_node
    if len(bindings) != len(body.input):
        raise UnsupportedModelError(f"node '{owner}': its subgraph '{body.name}' takes {len(body.input)} "
                                    f"inputs, {len(bindings)} are bound")
    if len(body.sparse_initializer):
        raise UnsupportedModelError(f"node '{owner}': sparse initializers in subgraphs are not supported")
    scope: dict[str, Value] = {}
    inits = {} if inits is None else inits
    for t in body.initializer:
        if t.name not in inits:
            inits[t.name] = ctx.graph.add_const(numpy_helper.to_array(t), prefix + t.name)
        scope[t.name] = inits[t.name]
    for vi, v in zip(body.input, bindings):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type:
            try:
                want = DType.from_onnx(tt.elem_type)
            except TypeError:
                want = None
            if want is not None and want != v.dtype:
                raise UnsupportedModelError(f"node '{owner}': subgraph input '{vi.name}' is {want.name}, "
                                            f"the value bound to it is {v.dtype.name}")
        scope[vi.name] = v
    saved = ctx.env
    ctx.env = ChainMap(scope, saved)
    try:
        for n in body.node:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            for i, o in enumerate(n.output):
                if o:
                    m.output[i] = ctx.graph.fresh_name(prefix + o)
            m.name = prefix + (n.name or n.op_type)
            import_node(ctx, m)
            for o, new in zip(n.output, m.output):
                if o and new in scope:
                    scope[o] = scope[new]
        return [ctx.value(o.name) for o in body.output]
    finally:
        ctx.env = saved


def _dry_run_shapes(ctx, body, bindings, prefix, owner) -> list[tuple[int, ...]]:
    """Output shapes of one body instance, importing it and dropping what it added (used when a
    loop runs zero times but its scan outputs still need their element shapes)."""
    n0 = len(ctx.graph.nodes)
    consts = set(ctx.graph.constants)
    outs = inline_graph(ctx, body, bindings, prefix, owner)
    shapes = [o.shape for o in outs]
    del ctx.graph.nodes[n0:]
    for k in [k for k in ctx.graph.constants if k not in consts]:
        del ctx.graph.constants[k]
    return shapes


def _const(ctx, array, hint: str) -> Value:
    return ctx.builder.const(np.asarray(array), name=hint)


def _stack(ctx, vals: list[Value], axis: int, name: str, what: str) -> Value:
    """Stack same-shaped values along a new ``axis`` (Unsqueeze each, Concat)."""
    shape = vals[0].shape
    for t, v in enumerate(vals):
        if v.shape != shape or v.dtype != vals[0].dtype:
            raise UnsupportedModelError(
                f"node '{name}': {what} is {vals[0].dtype.name}{list(shape)} in iteration 0 but "
                f"{v.dtype.name}{list(v.shape)} in iteration {t}; stacked outputs keep one type")
    axes = _const(ctx, np.array([axis], np.int64), f"{name}_axes")
    b = ctx.builder
    ups = [b.op("Unsqueeze", v, axes, name=ctx.graph.fresh_node_name(f"{name}/unsqueeze")) for v in vals]
    if len(ups) == 1:
        return ups[0]
    return b.op("Concat", *ups, axis=axis, name=ctx.graph.fresh_node_name(f"{name}/concat"))


def _wanted(proto: onnx.NodeProto, i: int) -> bool:
    """Whether the node uses its output i (outputs may be left off or named "")."""
    return i < len(proto.output) and proto.output[i] != ""


def _empty(ctx, dtype: DType, shape, hint: str) -> Value:
    return _const(ctx, np.zeros(tuple(shape), dtype=dtype.numpy), hint)


# ----------------------------------------------------------------------------- If
def _import_if(ctx, proto, version, name):
    cond = ctx.value(proto.input[0]) if proto.input and proto.input[0] else None
    if cond is None:
        raise UnsupportedModelError(f"If node '{name}' has no condition input")
    c = bool(_scalar(_known(cond, "a condition", name, "If"), "the condition", name, "If"))
    branch = _graph_attr(proto, "then_branch" if c else "else_branch", name)
    outs = inline_graph(ctx, branch, [], f"{name}/{'then' if c else 'else'}/", name)
    if len(outs) != len(proto.output):
        raise UnsupportedModelError(f"If node '{name}' has {len(proto.output)} outputs, its "
                                    f"{'then' if c else 'else'} branch {len(outs)}")
    return outs


# ----------------------------------------------------------------------------- Loop
def _import_loop(ctx, proto, version, name):
    ins = list(proto.input)
    m_v = ctx.value(ins[0]) if len(ins) > 0 and ins[0] else None
    c_v = ctx.value(ins[1]) if len(ins) > 1 and ins[1] else None
    state = [ctx.value(n) for n in ins[2:]]
    if any(v is None for v in state):
        raise UnsupportedModelError(f"Loop node '{name}': loop-carried inputs cannot be omitted")
    body = _graph_attr(proto, "body", name)
    n_state = len(state)
    n_scan = len(body.output) - 1 - n_state
    if len(body.input) != n_state + 2 or n_scan < 0:
        raise UnsupportedModelError(
            f"Loop node '{name}': the body takes {len(body.input)} inputs and gives {len(body.output)} "
            f"outputs; with {n_state} loop-carried values it must take {n_state + 2} and give at least {n_state + 1}")
    if len(proto.output) > n_state + n_scan:
        raise UnsupportedModelError(f"Loop node '{name}' has {len(proto.output)} outputs, its body gives "
                                    f"{n_state} loop-carried values and {n_scan} scan outputs")
    trip = None if m_v is None else int(_scalar(_known(m_v, "a trip count", name, "Loop"), "the trip count M", name, "Loop"))
    cond = True if c_v is None else bool(_scalar(_known(c_v, "an initial condition", name, "Loop"),
                                                 "the condition", name, "Loop"))
    if trip is None and c_v is None:
        raise UnsupportedModelError(f"Loop node '{name}' has neither a trip count nor a condition: it never ends")
    i_shape, c_shape = _declared_shape(body.input[0]), _declared_shape(body.input[1])
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    inits: dict = {}
    it = 0
    while cond and (trip is None or it < trip):
        if it >= MAX_UNROLL:
            raise UnsupportedModelError(
                f"Loop node '{name}' runs more than {MAX_UNROLL} iterations; tensorfuse unrolls loops at "
                f"compile time and stops there")
        _count_instances(ctx, 1, name)
        i_val = _const(ctx, np.full(i_shape, it, np.int64), f"{name}_i{it}")
        c_val = _const(ctx, np.full(c_shape, cond, np.bool_), f"{name}_cond{it}")
        outs = inline_graph(ctx, body, [i_val, c_val, *state], f"{name}/{it}/", name, inits)
        state = outs[1:1 + n_state]
        for k in range(n_scan):
            scans[k].append(outs[1 + n_state + k])
        it += 1
        cond = bool(_scalar(_known(outs[0], "a condition", name, "Loop"), "the body's condition output", name, "Loop"))
    results = list(state)
    if it == 0 and any(_wanted(proto, n_state + k) for k in range(n_scan)):
        i_val = _const(ctx, np.zeros(i_shape, np.int64), f"{name}_i0")
        c_val = _const(ctx, np.ones(c_shape, np.bool_), f"{name}_cond0")
        shapes = _dry_run_shapes(ctx, body, [i_val, c_val, *state], f"{name}/dry/", name)
        for k in range(n_scan):
            vi = body.output[1 + n_state + k]
            dt = DType.from_onnx(vi.type.tensor_type.elem_type)
            results.append(_empty(ctx, dt, (0,) + tuple(shapes[1 + n_state + k]), f"{name}_scan{k}"))
    else:
        results += [_stack(ctx, vals, 0, f"{name}/scan{k}", f"scan output {k}") if _wanted(proto, n_state + k)
                    else None for k, vals in enumerate(scans)]
    return results[:len(proto.output)]


# ----------------------------------------------------------------------------- Scan
def _norm_axis(axis: int, rank: int, what: str, name: str) -> int:
    if not -rank <= axis < rank:
        raise UnsupportedModelError(f"Scan node '{name}': {what} {axis} is out of range for rank {rank}")
    return axis % rank


def _flags(attrs: dict, key: str, n: int, name: str) -> list[int]:
    v = list(attrs.get(key) or [0] * n)
    if len(v) != n:
        raise UnsupportedModelError(f"Scan node '{name}': {key} has {len(v)} entries, expected {n}")
    return [int(x) for x in v]


def _scan_steps(ctx, body, state, seqs, axes, dirs, length, name, prefix, inits):
    """Run ``length`` steps of the body over ``seqs`` (sliced along ``axes``, read backwards
    where ``dirs`` is 1); returns the final states and the per-step scan-output values."""
    n_state = len(state)
    steps: list[list[Value]] = []
    _count_instances(ctx, length, name)
    for t in range(length):
        idx = {}
        slices = []
        for x, ax, d in zip(seqs, axes, dirs):
            pos = length - 1 - t if d else t
            if pos not in idx:
                idx[pos] = _const(ctx, np.array(pos, np.int64), f"{name}_t{pos}")
            slices.append(ctx.builder.op("Gather", x, idx[pos], axis=ax,
                                         name=ctx.graph.fresh_node_name(f"{prefix}{t}/slice")))
        outs = inline_graph(ctx, body, [*state, *slices], f"{prefix}{t}/", name, inits)
        state = outs[:n_state]
        steps.append(outs[n_state:])
    return state, steps


def _elem_dummies(ctx, seqs, axes, name):
    return [_empty(ctx, x.dtype, x.shape[:a] + x.shape[a + 1:], f"{name}_dummy") for x, a in zip(seqs, axes)]


def _import_scan(ctx, proto, version, name):
    attrs = _int_attrs(proto)
    body = _graph_attr(proto, "body", name)
    if "num_scan_inputs" not in attrs:
        raise UnsupportedModelError(f"Scan node '{name}': attribute num_scan_inputs is missing")
    m = int(attrs["num_scan_inputs"])
    if version < 9:
        return _import_scan8(ctx, proto, attrs, body, m, name)
    vals = [ctx.value(n) for n in proto.input]
    if any(v is None for v in vals):
        raise UnsupportedModelError(f"Scan node '{name}': inputs cannot be omitted")
    n_state = len(vals) - m
    if m < 1 or n_state < 0:
        raise UnsupportedModelError(f"Scan node '{name}': num_scan_inputs={m} but the node has {len(vals)} inputs")
    n_out = len(body.output) - n_state
    if len(body.input) != n_state + m or n_out < 0:
        raise UnsupportedModelError(
            f"Scan node '{name}': the body takes {len(body.input)} inputs and gives {len(body.output)} outputs; "
            f"with {n_state} states and {m} scan inputs it must take {n_state + m}")
    state, seqs = vals[:n_state], vals[n_state:]
    axes = [_norm_axis(a, len(x.shape), "scan_input_axes entry", name)
            for a, x in zip(_flags(attrs, "scan_input_axes", m, name), seqs)]
    dirs = _flags(attrs, "scan_input_directions", m, name)
    out_axes_raw = _flags(attrs, "scan_output_axes", n_out, name)
    out_dirs = _flags(attrs, "scan_output_directions", n_out, name)
    lengths = {x.shape[a] for x, a in zip(seqs, axes)}
    if len(lengths) != 1:
        raise UnsupportedModelError(f"Scan node '{name}': the scan inputs have different sequence lengths "
                                    f"{[x.shape[a] for x, a in zip(seqs, axes)]}")
    length = lengths.pop()
    if length > MAX_UNROLL:
        raise UnsupportedModelError(f"Scan node '{name}' runs {length} steps; tensorfuse unrolls scans at "
                                    f"compile time and stops at {MAX_UNROLL}")
    final, steps = _scan_steps(ctx, body, state, seqs, axes, dirs, length, name, f"{name}/", {})
    if length == 0:
        shapes = _dry_run_shapes(ctx, body, [*state, *_elem_dummies(ctx, seqs, axes, name)], f"{name}/dry/", name)
        final = list(state)
    results = list(final)
    for k in range(n_out):
        if not _wanted(proto, n_state + k):
            results.append(None)
            continue
        if length == 0:
            elem = tuple(shapes[n_state + k])
            ax = _norm_axis(out_axes_raw[k], len(elem) + 1, "scan_output_axes entry", name)
            dt = DType.from_onnx(body.output[n_state + k].type.tensor_type.elem_type)
            results.append(_empty(ctx, dt, elem[:ax] + (0,) + elem[ax:], f"{name}_scan{k}"))
            continue
        seq = [s[k] for s in steps]
        if out_dirs[k]:
            seq = seq[::-1]
        ax = _norm_axis(out_axes_raw[k], len(seq[0].shape) + 1, "scan_output_axes entry", name)
        results.append(_stack(ctx, seq, ax, f"{name}/scan{k}", f"scan output {k}"))
    return results[:len(proto.output)]


def _import_scan8(ctx, proto, attrs, body, m, name):
    """Scan-8: batch axis 0, sequence axis 1, optional sequence_lens; outputs padded with zeros."""
    ins = list(proto.input)
    lens_v = ctx.value(ins[0]) if ins and ins[0] else None
    vals = [ctx.value(n) for n in ins[1:]]
    if any(v is None for v in vals):
        raise UnsupportedModelError(f"Scan node '{name}': states and scan inputs cannot be omitted")
    n_state = len(vals) - m
    if m < 1 or n_state < 0:
        raise UnsupportedModelError(f"Scan node '{name}': num_scan_inputs={m} but the node has {len(vals)} "
                                    f"states and scan inputs")
    n_out = len(body.output) - n_state
    if len(body.input) != n_state + m or n_out < 0:
        raise UnsupportedModelError(
            f"Scan node '{name}': the body takes {len(body.input)} inputs and gives {len(body.output)} outputs; "
            f"with {n_state} states and {m} scan inputs it must take {n_state + m}")
    state, seqs = vals[:n_state], vals[n_state:]
    dirs = _flags(attrs, "directions", m, name)
    for x in seqs:
        if len(x.shape) < 2:
            raise UnsupportedModelError(f"Scan-8 node '{name}': scan input '{x.name}' must have a batch and a "
                                        f"sequence axis, its shape is {list(x.shape)}")
    if len({x.shape[:2] for x in seqs}) != 1:
        raise UnsupportedModelError(f"Scan-8 node '{name}': the scan inputs' batch and sequence sizes differ: "
                                    f"{[list(x.shape[:2]) for x in seqs]}")
    batch, max_len = seqs[0].shape[:2]
    if batch == 0:
        raise UnsupportedModelError(f"Scan-8 node '{name}': the batch is empty")
    for s in state:
        if not s.shape or s.shape[0] != batch:
            raise UnsupportedModelError(f"Scan-8 node '{name}': state '{s.name}' must have batch size {batch} "
                                        f"on axis 0, its shape is {list(s.shape)}")
    if lens_v is None:
        lens = [max_len] * batch
    else:
        a = _known(lens_v, "sequence lengths", name, "Scan").reshape(-1)
        if a.size != batch or (a < 0).any() or (a > max_len).any():
            raise UnsupportedModelError(f"Scan-8 node '{name}': sequence_lens {a.tolist()} must hold {batch} "
                                        f"lengths in 0..{max_len}")
        lens = [int(x) for x in a]
    if sum(lens) > MAX_UNROLL:
        raise UnsupportedModelError(f"Scan node '{name}' runs {sum(lens)} steps; tensorfuse unrolls scans at "
                                    f"compile time and stops at {MAX_UNROLL}")
    b = ctx.builder
    finals: list[list[Value]] = [[] for _ in range(n_state)]
    outs: list[list[Value]] = [[] for _ in range(n_out)]
    elem_shapes = None
    inits: dict = {}
    for bi in range(batch):
        bidx = _const(ctx, np.array(bi, np.int64), f"{name}_b{bi}")
        pick = [b.op("Gather", v, bidx, axis=0, name=ctx.graph.fresh_node_name(f"{name}/b{bi}/pick"))
                for v in (*state, *seqs)]
        st, xs = pick[:n_state], pick[n_state:]
        final, steps = _scan_steps(ctx, body, st, xs, [0] * m, dirs, lens[bi], name, f"{name}/b{bi}/", inits)
        for j in range(n_state):
            finals[j].append(final[j])
        if lens[bi] < max_len and elem_shapes is None and n_out:
            if steps:
                elem_shapes = [v.shape for v in steps[0]]
            else:
                dummies = _elem_dummies(ctx, xs, [0] * m, name)
                elem_shapes = _dry_run_shapes(ctx, body, [*st, *dummies], f"{name}/dry/", name)[n_state:]
        for k in range(n_out):
            seq = [s[k] for s in steps]
            parts = [_stack(ctx, seq, 0, f"{name}/b{bi}/scan{k}", f"scan output {k}")] if seq else []
            if lens[bi] < max_len:
                dt = seq[0].dtype if seq else DType.from_onnx(body.output[n_state + k].type.tensor_type.elem_type)
                parts.append(_empty(ctx, dt, (max_len - lens[bi],) + tuple(elem_shapes[k]), f"{name}_pad"))
            outs[k].append(parts[0] if len(parts) == 1 else
                           b.op("Concat", *parts, axis=0, name=ctx.graph.fresh_node_name(f"{name}/b{bi}/pad")))
    results = [_stack(ctx, f, 0, f"{name}/state{j}", f"final state {j}") for j, f in enumerate(finals)]
    results += [_stack(ctx, o, 0, f"{name}/out{k}", f"scan output {k}") if _wanted(proto, n_state + k) else None
                for k, o in enumerate(outs)]
    return results[:len(proto.output)]
