"""Lowering: graph IR -> kernel IR plus the slot table the runtime fills.

Every tensor the kernels touch gets a *slot*: graph inputs, graph outputs, constants and
intermediates ("temp"). Kernels take buffer parameters; a :class:`KernelCall` says which slots
feed them. The runtime's memory plan decides where temp slots live; codegen never sees slots
except through the entry function that runs the calls in order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tensorfuse.ir.errors import CompileError, UnsupportedModelError
from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.kernel import Buffer, Kernel, KernelBuilder
from tensorfuse.ir.knobs import KnobConfig, knob_config, workload_key, workload_summary
from tensorfuse.ir.lowering import LowerCtx, lowering_target
from tensorfuse.ir.registry import OpPatternKind, get_op, has_scalar
from tensorfuse.ir.schedule import ScheduleError, loaded_buffers
from tensorfuse.ir.types import DType, TensorType


@dataclass
class Slot:
    index: int
    name: str                 # the IR value's name
    kind: str                 # input | output | const | temp
    type: TensorType

    @property
    def nbytes(self) -> int:
        return self.type.nbytes


@dataclass
class KernelCall:
    kernel: str               # kernel (function) name
    slots: list[int]          # slot of each kernel parameter, in order
    nodes: list[str]          # IR node names this call covers
    ops: list[str]            # their op types
    flops: float | None = None
    #: (input param, output param) pairs whose buffers may be the same memory: the kernel reads
    #: input element i only to compute output element i (elementwise, same shape and dtype)
    inplace_ok: list[tuple[int, int]] = field(default_factory=list)
    #: the parameters the kernel writes (the node's outputs; it may read them too), so debug
    #: mode's memory check (runtime.memory_plan) knows which parameters are only read
    writes: list[int] | None = None


def elementwise_inplace_pairs(params: list[Buffer], n_inputs: int) -> list[tuple[int, int]]:
    """(input param, output param) pairs of an elementwise kernel that may run in place."""
    return [(i, o) for o in range(n_inputs, len(params)) for i in range(n_inputs)
            if params[i].shape == params[o].shape and params[i].dtype == params[o].dtype]


@dataclass
class LoweredGraph:
    kernels: list[Kernel] = field(default_factory=list)
    calls: list[KernelCall] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)     # slot per graph input
    outputs: list[int] = field(default_factory=list)    # slot per graph output
    consts: dict[int, np.ndarray] = field(default_factory=dict)
    status_slot: int | None = None                      # i64[2] run-time check word, if any
    messages: list[str] = field(default_factory=list)   # check error k is messages[k-1]
    #: workload key -> :class:`Workload`, one per distinct workload lowered (first node of each)
    workloads: dict[str, "Workload"] = field(default_factory=dict)
    #: temp slot -> the slot whose bytes it uses: a standalone reshape-only node
    #: (``OpDef.reshape_only``) lowers to no kernel; its output views its input, or, where the
    #: output is a graph output and the input an intermediate, the input lives in the output
    #: (``runtime.memory_plan``)
    aliases: dict[int, int] = field(default_factory=dict)
    #: alias slot -> the byte offset of its bytes in the slot it views (absent: 0): the inputs
    #: of a Concat that lowers to no kernel (:func:`_concat_views`) live in its output
    alias_offsets: dict[int, int] = field(default_factory=dict)


@dataclass
class Workload:
    """A distinct workload of a lowered graph (``ir.knobs.workload_key``): the first ``node``
    that has it, a one-line ``summary``, the knob ``space`` its lowering declared
    (``ir.knobs.Knob`` list), the ``knobs`` values used, the ``schedule`` name, whether those
    values came from a tuning record (``tuned``), the names of the ``kernels`` of every node
    with this workload, and ``count``, the number of such nodes."""

    key: str
    node: Node
    summary: str
    space: list
    knobs: dict
    schedule: str
    tuned: bool = False
    kernels: list[str] = field(default_factory=list)
    count: int = 0


def _ident(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if s and not s[0].isdigit() else "v" + s


#: dtypes the kernels of the llvm target cannot load or store yet
UNSUPPORTED_DTYPES = (DType.bf16,)


def _check_dtypes(graph: Graph, target) -> None:
    """Refuse (UnsupportedModelError, every offender listed) tensors of
    :data:`UNSUPPORTED_DTYPES` (and of the low-bit types for a target kind without
    ``KindTraits.lowbit``), and nodes other than ``ir.lowbit.LOWBIT_OPS`` that read or write a
    low-bit type (the frontend refuses those already; a rewrite must not make one)."""
    from tensorfuse.ir.lowbit import LOWBIT_OPS

    def unsupported(dt: DType) -> bool:
        return dt in UNSUPPORTED_DTYPES or (dt.is_lowbit and not target.traits.lowbit)
    bad: dict[str, list[str]] = {}
    for v in list(graph.inputs) + list(graph.constants.values()):
        if unsupported(v.dtype):
            bad.setdefault(v.dtype.value, []).append(f"'{v.name}'")
    for n in graph.nodes:
        for v in n.outputs:
            if unsupported(v.dtype):
                bad.setdefault(v.dtype.value, []).append(f"{n.op} node '{n.name}'")
                break
    if bad:
        lines = [f"  {dt}: {', '.join(where[:10])}{' ...' if len(where) > 10 else ''}" for dt, where in bad.items()]
        raise UnsupportedModelError(f"the {target.kind} target does not support these tensor dtypes yet:\n"
                                    + "\n".join(lines))
    low: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.qualified_op in LOWBIT_OPS:
            continue
        dts = sorted({v.dtype.value for v in list(n.inputs) + list(n.outputs) if v is not None and v.dtype.is_lowbit})
        if dts:
            low.setdefault(n.qualified_op, []).append(f"'{n.name}' ({', '.join(dts)})")
    if low:
        lines = [f"  {op}: {', '.join(where[:10])}{' ...' if len(where) > 10 else ''}" for op, where in sorted(low.items())]
        raise UnsupportedModelError("these nodes read or write low-bit tensors (float8, float4, int4, uint4, "
                                    "int2, uint2), which only " + ", ".join(sorted(LOWBIT_OPS)) +
                                    " support:\n" + "\n".join(lines))


def _is_alias(n: Node, slots: list[Slot], slot_of: dict[int, int]) -> bool:
    """Whether reshape-only node ``n`` can be a view of its input: its output is an
    intermediate (a graph output comes out as its own array) of the input's dtype and size."""
    if len(n.outputs) != 1 or not n.inputs or n.inputs[0] is None or id(n.inputs[0]) not in slot_of:
        return False
    x, y = n.inputs[0], n.outputs[0]
    return slots[slot_of[id(y)]].kind == "temp" and x.dtype == y.dtype and x.type.numel == y.type.numel


def _output_of_temp(n: Node, slots: list[Slot], slot_of: dict[int, int], aliases: dict[int, int]) -> bool:
    """Whether reshape-only node ``n`` makes a graph output of an intermediate that can live in
    that output's array instead (it is no view itself and no other output has taken it)."""
    if len(n.outputs) != 1 or not n.inputs or n.inputs[0] is None or id(n.inputs[0]) not in slot_of:
        return False
    x, y = n.inputs[0], n.outputs[0]
    xs, ys = slot_of[id(x)], slot_of[id(y)]
    return (slots[xs].kind == "temp" and slots[ys].kind == "output" and xs not in aliases
            and x.dtype == y.dtype and x.type.numel == y.type.numel)


def _concat_views(n: Node, lg: "LoweredGraph", slot_of: dict[int, int], uses: dict[int, int]) -> bool:
    """Make the inputs of Concat node ``n`` views of its output, so that their producers write
    straight into it and the Concat lowers to no kernel (as TVM's and XLA's buffer assignment
    place a concatenation's operands; squeezenet's Fire modules concatenate their two expand
    convs). Applies where each input is a contiguous byte range of the output (every
    dimension before ``axis`` is 1: NCHW channels at batch 1) and is an intermediate of the
    output's dtype, not empty, read by this Concat alone (once) and no view itself; the output
    is an intermediate or a graph output. Records ``lg.aliases`` / ``lg.alias_offsets`` and
    returns True, else changes nothing and returns False."""
    y = n.outputs[0] if len(n.outputs) == 1 else None
    if y is None or id(y) not in slot_of or len(n.inputs) < 2:
        return False
    ys = slot_of[id(y)]
    if lg.slots[ys].kind not in ("temp", "output") or ys in lg.aliases:
        return False
    rank = len(y.shape)
    axis = int(n.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(int(d) != 1 for d in y.shape[:axis]):
        return False
    seen: set[int] = set()
    for x in n.inputs:
        if x is None or id(x) not in slot_of or id(x) in seen:
            return False
        seen.add(id(x))
        xs = slot_of[id(x)]
        if (lg.slots[xs].kind != "temp" or xs in lg.aliases
                or x.dtype != y.dtype or x.type.numel == 0 or uses.get(id(x), 0) != 1):
            return False
    off = 0
    for x in n.inputs:
        xs = slot_of[id(x)]
        lg.aliases[xs] = ys
        lg.alias_offsets[xs] = off
        off += lg.slots[xs].nbytes
    if off != lg.slots[ys].nbytes:
        raise CompileError(f"Concat node '{n.name}': its inputs hold {off} bytes, its output {lg.slots[ys].nbytes}")
    return True


def lower_graph(graph: Graph, target=None, tuning=None) -> LoweredGraph:
    """Lower every node through its registry entry for ``target`` (an ``ir.target.Target``;
    default: the host CPU). ``tuning``: None, or an object whose ``knobs_for(workload_key)``
    gives the knob values to use for a workload (a dict) or None (``compiler.tuning.TuningRecords``
    for its target). Raises CompileError naming the node, and UnsupportedModelError for tensors
    of a dtype the target cannot hold (bfloat16; the low-bit types on a kind without
    ``KindTraits.lowbit``)."""
    from tensorfuse.codegen.base import get_backend
    from tensorfuse.ir.target import Target
    tgt = Target.parse(target if target is not None else "llvm")
    backend = get_backend(tgt.kind)
    backend.load_schedules()
    _check_dtypes(graph, tgt)
    with lowering_target(tgt):
        return _lower_graph(graph, tuning, lambda k: backend.schedule_kernel(k, tgt), views=tgt.kind == "llvm")


def _uses_amx(k: Kernel) -> bool:
    """Whether kernel ``k`` computes on AMX tiles (it keeps plain stores: the int8 7x7 stem on
    gathered tiles, 3->64 at 112x112 with its 3.2 MB int32 output, took 0.52 ms with plain
    stores and 0.86 streamed; the same conv on VPDPBUSD gained, 0.66 -> 0.63)."""
    from tensorfuse.ir.kernel import TileOp
    from tensorfuse.ir.schedule import walk_stmts
    return any(isinstance(s, TileOp) for s in walk_stmts(k.body))


#: a graph output (that no kernel reads) from this share of the target's L2 on is written by
#: non-temporal stores (:attr:`~ir.kernel.Kernel.stream`): nothing in the run reads it back,
#: and a plain store first reads each line for ownership and later writes it back through L3
#: (Emerald Rapids, 1 thread, same process: ConvInteger 64->256 at 56x56, a 3.2 MB int32
#: output, 0.80 -> 0.46 ms and 0.63 -> 0.39; its fp32 Conv 1.28 / 1.34 and 0.81 / 0.82, even;
#: MatMulInteger 197x768x3072, 2.4 MB, 1.08 -> 1.03)
STREAM_MIN_L2_SHARE = 1.0


def _lower_graph(graph: Graph, tuning, schedule, views: bool = False) -> LoweredGraph:
    """:func:`lower_graph` within its target; ``schedule(kernel)`` is the backend's
    ``schedule_kernel`` for that target; ``views``: the runtime binds aliases at byte offsets
    (the llvm target's), so a Concat may lower to views (:func:`_concat_views`)."""
    lg = LoweredGraph()
    uses: dict[int, int] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                uses[id(v)] = uses.get(id(v), 0) + 1
    read = set(uses)            # values some node reads
    for v in graph.outputs:
        uses[id(v)] = uses.get(id(v), 0) + 1
    slot_of: dict[int, int] = {}
    buf_of: dict[int, Buffer] = {}

    def new_slot(v: Value, kind: str) -> int:
        s = Slot(len(lg.slots), v.name, kind, v.type)
        lg.slots.append(s)
        return s.index

    for v in graph.inputs:
        slot_of[id(v)] = new_slot(v, "input")
        lg.inputs.append(slot_of[id(v)])
    for v in graph.constants.values():
        slot_of[id(v)] = new_slot(v, "const")
        lg.consts[slot_of[id(v)]] = np.ascontiguousarray(v.data)
    out_ids = set()
    copies: list[tuple[Value, int]] = []
    for v in graph.outputs:
        if id(v) in slot_of or id(v) in out_ids:   # an input, a constant or a repeated output
            s = Slot(len(lg.slots), v.name, "output", v.type)
            lg.slots.append(s)
            copies.append((v, s.index))
            lg.outputs.append(s.index)
        else:
            out_ids.add(id(v))
            lg.outputs.append(-1)
    for n in graph.nodes:
        for v in n.outputs:
            if id(v) not in slot_of:
                slot_of[id(v)] = new_slot(v, "output" if id(v) in out_ids else "temp")
    lg.outputs = [slot_of[id(v)] if s == -1 else s for v, s in zip(graph.outputs, lg.outputs)]

    def buf(v: Value) -> Buffer:
        b = buf_of.get(id(v))
        if b is None:
            b = Buffer(_ident(v.name), v.dtype.storage, v.shape)     # low-bit types: their bytes
            buf_of[id(v)] = b
        return b

    slot_by_buf: dict[int, int] = {}
    status = Buffer("status", DType.i64, (2,))
    for i, n in enumerate(graph.nodes):
        od = get_op(n.op, n.domain)
        if od.lower is None:
            raise CompileError(f"{n.qualified_op} node '{n.name}' has no lowering (it should have been "
                               f"rewritten before lowering)")
        ins = [None if v is None else buf(v) for v in n.inputs]
        outs = [buf(v) for v in n.outputs]
        for v in list(n.inputs) + list(n.outputs):
            if v is not None:
                slot_by_buf[id(buf(v))] = slot_of[id(v)]
        if n.outputs and all(v.type.numel == 0 for v in n.outputs):
            continue        # every output empty (a zero-sized dim): nothing to compute, no kernel
        if od.reshape_only and _is_alias(n, lg.slots, slot_of):
            lg.aliases[slot_of[id(n.outputs[0])]] = slot_of[id(n.inputs[0])]
            continue        # the same row-major bytes under another shape: a view, no kernel
        if od.reshape_only and _output_of_temp(n, lg.slots, slot_of, lg.aliases):
            lg.aliases[slot_of[id(n.inputs[0])]] = slot_of[id(n.outputs[0])]
            continue        # a graph output reshaping an intermediate: the intermediate lives in it
        if views and n.op == "Concat" and n.domain in ("", "ai.onnx") and _concat_views(n, lg, slot_of, uses):
            continue        # the producers write into the output: no kernel
        ctx = LowerCtx(n, ins, outs, f"{_ident(n.op).lower()}_{i}", status, lg.messages)
        wkey = workload_key(n)
        fixed = tuning.knobs_for(wkey) if tuning is not None else None
        cfg = KnobConfig(fixed or {})
        try:
            with knob_config(cfg):
                od.lower(ctx)
                for k in ctx.kernels:        # the backend's schedule may declare knobs of the node
                    schedule(k)
        except ScheduleError as e:
            raise CompileError(f"{n.qualified_op} node '{n.name}': {e}") from e
        except (UnsupportedModelError, CompileError):
            raise
        except Exception as e:
            raise CompileError(f"lowering {n.qualified_op} node '{n.name}' failed: {type(e).__name__}: {e}") from e
        if views and ctx.target.triple.startswith("x86_64"):
            # a graph output no kernel reads, larger than STREAM_MIN_L2_SHARE of L2: its
            # kernels' whole-line vector stores stream past the caches (Kernel.stream)
            big = {buf(v).name for v in n.outputs
                   if lg.slots[slot_of[id(v)]].kind == "output" and id(v) not in read
                   and v.type.numel * v.dtype.storage.itemsize >= STREAM_MIN_L2_SHARE * ctx.target.l2_bytes}
            for k in ctx.kernels:
                # (not one the kernel reads back, a softmax normalising what it wrote: those
                # lines stay in cache for it)
                names = big & {p.name for p in k.params} - loaded_buffers(k.body)
                if names and not _uses_amx(k):
                    k.stream = frozenset(names)
        for sbuf in ctx.scratch_buffers:        # a lowering's scratch (split-K partials): temps
            ss = len(lg.slots)
            lg.slots.append(Slot(ss, sbuf.name, "temp", TensorType(sbuf.dtype, sbuf.shape)))
            slot_by_buf[id(sbuf)] = ss
        for pbuf, arr in ctx.packed:            # packed constants: slots of their own
            ps = len(lg.slots)
            lg.slots.append(Slot(ps, pbuf.name, "const", TensorType(pbuf.dtype, pbuf.shape)))
            lg.consts[ps] = arr
            slot_by_buf[id(pbuf)] = ps
        if lg.messages and lg.status_slot is None:      # the first run-time check: its slot
            lg.status_slot = len(lg.slots)
            lg.slots.append(Slot(lg.status_slot, "status", "status", TensorType(DType.i64, (2,))))
            slot_by_buf[id(status)] = lg.status_slot
        flops = od.flops(n) if od.flops is not None else None
        # in place only for the registry's own per-element lowering of elementwise/broadcast ops
        elementwise = (has_scalar(n, od) and od.kind <= OpPatternKind.BROADCAST
                       and len(ctx.kernels) == 1 and ctx.epilogue is None)
        # a lowering may declare its one kernel elementwise (a fused loop of fuse_ops)
        elementwise = elementwise or (len(ctx.kernels) == 1 and getattr(ctx, "elementwise_inplace", False))
        covered = [n]
        if isinstance(n.attrs.get("body"), Graph):     # a fused function covers its body's nodes
            covered = n.attrs["body"].nodes
        wl = lg.workloads.get(wkey)
        if wl is None:
            wl = lg.workloads[wkey] = Workload(wkey, n, workload_summary(n), cfg.space, dict(cfg.values),
                                               cfg.schedule, fixed is not None)
        wl.count += 1
        scratch_seen: set[int] = set()     # a scratch buffer is written by the first kernel naming it
        for vid, vbase in ctx.view_of.items():  # a view (ctx.view) is its buffer's slot
            slot_by_buf[vid] = slot_by_buf[id(vbase)]
        for j, k in enumerate(ctx.kernels):
            k.schedule, k.knobs, k.workload = cfg.schedule, dict(cfg.values), wkey
            wl.kernels.append(k.name)
            lg.kernels.append(k)
            n_in = sum(1 for b in k.params if not any(ctx.base(b) is o for o in outs))
            lg.calls.append(KernelCall(k.name, [slot_by_buf[id(b)] for b in k.params],
                                       [m.name for m in covered], [m.op for m in covered],
                                       flops if j == 0 else None,
                                       elementwise_inplace_pairs(k.params, n_in) if elementwise else [],
                                       [p for p, b in enumerate(k.params) if any(ctx.base(b) is o for o in outs)
                                        or _first_scratch(b, ctx.scratch_buffers, scratch_seen)]))
    for v, out_slot in copies:
        src = Buffer(_ident(v.name), v.dtype.storage, v.shape)
        dst = Buffer(_ident(v.name) + "_out", v.dtype.storage, v.shape)
        kb = KernelBuilder(f"copy_output_{out_slot}", [src, dst], comment="copy to graph output")
        with kb.grid([src.numel]) as (j,):
            kb.store(dst, j, src.flat(j))
        lg.kernels.append(schedule(kb.kernel))
        lg.calls.append(KernelCall(kb.kernel.name, [slot_of[id(v)], out_slot], [], ["copy"], writes=[1]))
    # a module holds only the constants its calls read: a weight that a lowering packed into a
    # blocked layout of its own (ctx.packed) is read in that form only, so the original would
    # double the module's memory and its saved file (resnet18's .tfm: 95.5 MB for 46.8 MB of weights;
    # 48.8 MB with only what runs). The slot stays in the table (no call names it); the graph
    # keeps the original for the compile report.
    used = {s for c in lg.calls for s in c.slots} | set(lg.aliases.values())
    lg.consts = {s: a for s, a in lg.consts.items() if s in used}
    return lg


def _first_scratch(b, scratch, seen: set[int]) -> bool:
    """Whether ``b`` is one of the node's scratch buffers not named by an earlier kernel of it
    (that kernel fills it: a split-K GEMM's partials, a run-time packed B)."""
    if id(b) in seen or all(b is not s for s in scratch):
        return False
    seen.add(id(b))
    return True
