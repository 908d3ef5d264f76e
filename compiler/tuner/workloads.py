"""A model's workloads as the tuner sees them: compiled once with the default knobs, profiled,
and each distinct workload extracted into a graph of its own.

:func:`model_tasks` imports and optimises the model as ``tensorfuse.compile`` does (same opt
level and input shapes, so the workload keys are the ones a later ``compile(...,
tuning=RECORDS)`` looks up), lowers it (``compiler.lower.lower_graph``: each workload's node,
knob space, default values and kernels), generates code and profiles one run per kernel call
(``Module.profile``, one thread, random inputs of ``compiler.verify.random_inputs``). A
workload's *weight* is the summed time of every call of its kernels: its time per call times
the number of layers that share it. Without a usable profile (a run-time check failed on
random indices) the FLOP counts serve, else the call counts.

:func:`extract_node` makes the one-node graph a candidate is compiled and run in: the node's
inputs become graph inputs, except compile-time constants (weights, and values known at
compile time), which stay constants, so the extracted node has the same workload key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tensorfuse.ir.graph import Graph, Node, Value


@dataclass
class TuneTask:
    """One workload to tune: ``key`` (``ir.knobs.workload_key``), ``summary`` (a line for
    people), ``graph`` (the one-node graph, :func:`extract_node`), ``space`` (its knobs as
    ``Knob.to_json`` dicts), ``knobs`` (the default values), ``schedule`` (the default's
    schedule name), ``count`` (nodes of the model with this workload), ``weight_ms`` (the
    profiled time of all its calls, ms; module docstring) and ``share`` of the model's total."""

    key: str
    summary: str
    graph: Graph
    space: list = field(default_factory=list)
    knobs: dict = field(default_factory=dict)
    schedule: str = "generic"
    count: int = 1
    weight_ms: float = 0.0
    share: float = 0.0

    @property
    def size(self) -> int:
        """The number of points of the default lowering's space (the product of the candidate
        counts; 1 when it declares no knob with a choice)."""
        n = 1
        for k in self.space:
            n *= max(1, len(k["candidates"]))
        return n


def _clean(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name or "v")
    return s if s and not s[0].isdigit() else "v" + s


def extract_node(node: Node, opset: int | None = None) -> Graph:
    """A graph holding a copy of ``node`` alone: its non-constant inputs are graph inputs (a
    value used twice is one input), inputs with a compile-time value (``Value.const_value``:
    weights, propagated shapes) are constants with that value, its outputs are the graph's
    outputs. Attributes (a fused function's body included) are shared, not copied."""
    g = Graph(f"tune_{_clean(node.op).lower()}")
    g.opset = opset
    vmap: dict[int, Value] = {}
    for v in node.inputs:
        if v is None or id(v) in vmap:
            continue
        data = v.const_value()
        if data is not None:
            nv = Value(g.fresh_name(_clean(v.name)), v.type, data=np.asarray(data))
            g.constants[nv.name] = nv
        else:
            nv = Value(g.fresh_name(_clean(v.name)), v.type)
            g.inputs.append(nv)
        vmap[id(v)] = nv
    outs = [Value(g.fresh_name(_clean(o.name)), o.type) for o in node.outputs]
    g.nodes.append(Node(node.op, [None if v is None else vmap[id(v)] for v in node.inputs], outs,
                        dict(node.attrs), node.name, node.domain))
    g.outputs = list(outs)
    g.output_names = [o.name for o in outs]
    return g


def model_tasks(model, target, opt_level: int = 2, input_shapes: dict | None = None, seed: int = 0,
                profile: bool = True) -> tuple[list[TuneTask], dict]:
    """The model's workloads as :class:`TuneTask`, heaviest first, and facts about the compile
    (``{"kernels", "calls", "total_ms", "weights_from"}``: "profile", "flops" or "count";
    ``"weight_bytes"``: :func:`weight_bytes`).

    Raises what ``tensorfuse.compile`` raises for a model it cannot compile, and
    UnsupportedModelError for a model whose shapes depend on input values (tune one compiled
    for given values: export it with those shapes fixed)."""
    from tensorfuse import progress
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.ir.errors import UnsupportedModelError
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.compiler.specialize import InputValuesNeeded
    from tensorfuse.ir.target import Target
    from tensorfuse.ir.knobs import workload_key
    tgt = Target.parse(target)
    try:
        progress.stage("importing")
        graph = import_onnx(model, input_shapes=input_shapes)
        output_names = list(graph.output_names or [v.name for v in graph.outputs])
        input_names = [v.name for v in graph.inputs]
        progress.stage("optimising")
        optimize(graph, opt_level, target=tgt)
        progress.stage("lowering")
        lg = lower_graph(graph, tgt)
    except InputValuesNeeded as e:
        raise UnsupportedModelError(f"tuning needs a model whose shapes do not depend on input values: {e}") from e
    kernel_wl = {k.name: getattr(k, "workload", None) for k in lg.kernels}
    call_wl = [kernel_wl.get(c.kernel) for c in lg.calls]
    call_flops = [c.flops for c in lg.calls]
    weights: dict[str, float] = {}
    how = "count"
    if profile:
        try:
            from tensorfuse.compiler.verify import index_limits, random_inputs
            progress.stage("generating code")
            mod = build_module(lg, graph, input_names, output_names, tgt)
            mod.num_threads = 1
            progress.stage("profiling")
            try:
                limits = index_limits(model)
            except Exception:       # noqa: BLE001 - bytes of another kind: no limits
                limits = None
            prof = mod.profile(**random_inputs(mod.input_info, seed, limits), repeat=3, warmup=1)
            if len(mod.calls) == len(call_wl):
                for r in prof.rows:
                    wk = call_wl[r.call]
                    if wk is not None:
                        weights[wk] = weights.get(wk, 0.0) + r.median_ms
                how = "profile"
        except Exception:           # noqa: BLE001 - a run-time check on random indices ...: FLOPs instead
            weights = {}
    if not weights:
        if any(f for f in call_flops):
            how = "flops"
            for wk, f in zip(call_wl, call_flops):
                if wk is not None:
                    weights[wk] = weights.get(wk, 0.0) + float(f or 0.0) / 1e9
        else:
            for wk in call_wl:
                if wk is not None:
                    weights[wk] = weights.get(wk, 0.0) + 1.0
    total = sum(weights.values()) or 1.0
    tasks = []
    for key, wl in lg.workloads.items():
        g = extract_node(wl.node, graph.opset)
        k2 = workload_key(g.nodes[0])
        if k2 != key:           # extraction must not change what the records are keyed by
            raise AssertionError(f"workload {key}: the extracted node's key is {k2}")
        w = weights.get(key, 0.0)
        tasks.append(TuneTask(key, wl.summary, g, [k.to_json() for k in wl.space], dict(wl.knobs), wl.schedule,
                              wl.count, w, w / total))
    tasks.sort(key=lambda t: -t.weight_ms)
    return tasks, {"kernels": len(lg.kernels), "calls": len(lg.calls), "total_ms": sum(weights.values()),
                   "weights_from": how, "weight_bytes": weight_bytes(graph)}


def weight_bytes(graph: Graph) -> int:
    """Bytes of the constants the optimised ``graph``'s nodes read in one run: every distinct
    constant input of a node (a fused function's inputs included), except the tables a Gather
    or an EmbedLayerNormalization indexes (they read only rows). What streams through the caches
    once per inference."""
    seen: set[int] = set()
    total = 0
    for n in graph.nodes:
        tables = {0} if n.op == "Gather" else set()
        if n.op == "EmbedLayerNormalization":       # (table_i, ids_i) pairs first
            tables = {2 * i for i in range(int(n.attr("num_gathers", 0) or 0))}
        for i, v in enumerate(n.inputs):
            if v is None or id(v) in seen or i in tables:
                continue
            data = v.const_value()
            if data is None:
                continue
            seen.add(id(v))
            total += int(np.asarray(data).nbytes)
    return total
