"""The executable module: a kernel table, a slot table and the memory behind it.

``Module.run(*arrays, **named) -> list[np.ndarray]`` runs the whole graph with one native call
(the entry function runs every kernel in order). Inputs are checked against ``input_info``:
a missing input, an unknown name, a wrong dtype or a wrong shape raises ``ValueError`` naming
the input with expected and got. Outputs are fresh arrays in graph output order.

Memory (DESIGN.md "Runtime"): constants are held once, as the arrays the compiler produced, and
their addresses go straight into the slot table. Intermediates live at the offsets of the
static :class:`~runtime.memory_plan.MemoryPlan` inside one arena. A run takes an arena (with its
ready-filled slot table) from a pool, writes the input and output addresses into the table,
makes the native call and returns the arena: after the first run, ``run()`` allocates only its
outputs. Concurrency: runs from several threads at once each take their own arena from the
pool (the native call releases the GIL), so they never share intermediates; the pool grows to
the largest number of simultaneous runs and keeps those arenas for reuse.
"""
from __future__ import annotations

import ctypes
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .memory_plan import MemoryPlan, plan_memory

_ENTRY_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass(frozen=True)
class TensorInfo:
    """Name, dtype (numpy) and static shape of a graph input or output."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def __str__(self) -> str:
        from ir.types import DType, TensorType   # not at import: loading a saved module needs no IR
        return f"{self.name}: {TensorType(DType.from_numpy(self.dtype), self.shape)}"


@dataclass
class SlotInfo:
    """A tensor the kernels touch: kind is input | output | const | temp."""

    index: int
    name: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass
class CallInfo:
    """One native kernel call: kernel symbol, slot per parameter, IR nodes it covers."""

    kernel: str
    slots: list[int]
    nodes: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    flops: float | None = None
    inplace_ok: list = field(default_factory=list)


@dataclass
class Program:
    """What the runtime needs of a lowered graph: slots, calls, constants; no kernel IR."""

    slots: list[SlotInfo]
    inputs: list[int]
    outputs: list[int]
    calls: list[CallInfo]
    consts: dict[int, np.ndarray]

    @staticmethod
    def from_lowered(lg) -> "Program":
        slots = [SlotInfo(s.index, s.name, s.kind, np.dtype(s.type.dtype.numpy), tuple(s.type.shape))
                 for s in lg.slots]
        calls = [CallInfo(c.kernel, list(c.slots), list(c.nodes), list(c.ops), c.flops,
                          [tuple(p) for p in getattr(c, "inplace_ok", None) or ()]) for c in lg.calls]
        return Program(slots, list(lg.inputs), list(lg.outputs), calls, dict(lg.consts))


class _Arena:
    """One run's private memory: the intermediates' arena and a slot table pointing into it."""

    def __init__(self, module: "Module"):
        plan = module.memory_plan
        align = plan.alignment
        self.buffer = np.empty(plan.arena_bytes + align, np.uint8)
        base = self.buffer.ctypes.data
        base += (-base) % align
        self.table = (ctypes.c_void_p * max(len(module._program.slots), 1))()
        for i, a in module._consts.items():
            self.table[i] = a.ctypes.data
        for s, off in plan.offsets.items():
            self.table[s] = base + off
        self.addr = ctypes.addressof(self.table)


@dataclass
class ProfileRow:
    """One kernel call's timing: median over the repeats, its share of the summed medians,
    GFLOP/s (when the op declares a FLOP count) and the bytes of its distinct buffers."""

    kernel: str
    nodes: list[str]
    ops: list[str]
    median_ms: float
    share: float
    gflops: float | None
    bytes_moved: int


class Profile(list):
    """Per-kernel rows (:class:`ProfileRow`) sorted by time, slowest first; prints as a table."""

    @property
    def total_ms(self) -> float:
        return sum(r.median_ms for r in self)

    def __str__(self) -> str:
        rows = [("kernel", "nodes", "median ms", "share", "GFLOP/s", "MB moved")]
        for r in self:
            nodes = ",".join(r.nodes) or ",".join(r.ops)
            rows.append((r.kernel, nodes if len(nodes) <= 40 else nodes[:37] + "...", f"{r.median_ms:.4f}",
                         f"{100 * r.share:.1f}%", "" if r.gflops is None else f"{r.gflops:.2f}",
                         f"{r.bytes_moved / 1e6:.3f}"))
        w = [max(len(r[i]) for r in rows) for i in range(6)]
        lines = ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"total {self.total_ms:.3f} ms over {len(self)} kernel calls")
        return "\n".join(lines)


@dataclass
class Benchmark:
    """Whole-run wall times in milliseconds over ``repeat`` runs (after ``warmup`` runs)."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeat: int

    def __str__(self) -> str:
        return (f"median {self.median_ms:.3f} ms, min {self.min_ms:.3f} ms, max {self.max_ms:.3f} ms "
                f"over {self.repeat} runs")


class Module:
    """A compiled model for one target.

    Attributes: ``input_info`` / ``output_info`` (lists of TensorInfo), ``graph`` (the optimised
    graph IR), ``kernels`` (kernel IR), ``llvm_ir`` (LLVM IR text), ``num_kernels`` (native kernel
    calls per run), ``memory_plan`` (:class:`~runtime.memory_plan.MemoryPlan`). A module loaded
    from a file (``runtime.load``) has no graph, kernel IR or LLVM IR unless it came from the
    compile cache, which rebuilds them on first access.
    """

    def __init__(self, lowered, library, entry: str, input_names, output_names, graph=None,
                 llvm_ir: str | None = None, target: str = "llvm", *, plan: MemoryPlan | None = None,
                 object_code: bytes | None = None, host: dict | None = None):
        self._lowered = None if isinstance(lowered, Program) else lowered
        self._program = lowered if isinstance(lowered, Program) else Program.from_lowered(lowered)
        prog = self._program
        self._lib = library
        self._entry_name = entry
        self._entry = _ENTRY_T(library.address(entry))
        self._graph = graph
        self._llvm_ir = llvm_ir
        self._object_code = object_code
        self._host = host
        self._rebuild: Callable[[], "Module"] | None = None
        self.target = target
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        slots = prog.slots
        self.input_info = [TensorInfo(n, slots[s].dtype, slots[s].shape) for n, s in zip(input_names, prog.inputs)]
        self.output_info = [TensorInfo(n, slots[s].dtype, slots[s].shape) for n, s in zip(output_names, prog.outputs)]
        self._consts = prog.consts      # held once; slot tables point at them, never copied
        self.memory_plan = plan if plan is not None else plan_memory(prog.slots, prog.calls)
        self._pool: list[_Arena] = []
        self._pool_lock = threading.Lock()
        self._kernel_fns: dict[str, object] = {}

    # -- introspection ------------------------------------------------------------------
    def _rebuilt(self) -> "Module | None":
        if self._rebuild is None:
            return None
        src = self._rebuild()
        self._rebuild = None
        self._graph, self._llvm_ir, self._lowered = src._graph, src._llvm_ir, src._lowered
        for k, v in vars(src).items():          # what the compiler attached (rewrite_log ...)
            if not k.startswith("_") and k not in self.__dict__:
                setattr(self, k, v)
        return src

    def __getattr__(self, name: str):
        # only reached for attributes a cached module lacks until the compiler rebuilds them
        if not name.startswith("_") and self.__dict__.get("_rebuild") is not None:
            self._rebuilt()
            if name in self.__dict__:
                return self.__dict__[name]
        if name in ("kernels",):
            raise AttributeError("this module was loaded from a file: it holds machine code, not kernel IR")
        raise AttributeError(f"{type(self).__name__!s} object has no attribute {name!r}")

    @property
    def graph(self):
        if self._graph is None:
            self._rebuilt()
        return self._graph

    @property
    def llvm_ir(self) -> str | None:
        if self._llvm_ir is None:
            self._rebuilt()
        return self._llvm_ir

    @property
    def kernels(self):
        if self._lowered is None:
            self._rebuilt()
        if self._lowered is None:
            raise AttributeError("kernels")       # __getattr__ explains
        return self._lowered.kernels

    @property
    def calls(self) -> list[CallInfo]:
        """The native kernel calls of one run, in order."""
        return self._program.calls

    @property
    def num_kernels(self) -> int:
        return len(self._program.calls)

    # -- running ------------------------------------------------------------------------
    def _check_inputs(self, arrays, named) -> list[np.ndarray]:
        infos = self.input_info
        if len(arrays) > len(infos):
            raise ValueError(f"run() got {len(arrays)} positional inputs, the model has {len(infos)}: "
                             f"{[i.name for i in infos]}")
        by_name = {i.name: k for k, i in enumerate(infos)}
        given: list = list(arrays) + [None] * (len(infos) - len(arrays))
        for name, a in named.items():
            if name not in by_name:
                raise ValueError(f"run() got an unknown input '{name}'; the model's inputs are {list(by_name)}")
            k = by_name[name]
            if given[k] is not None:
                raise ValueError(f"input '{name}' given twice (positionally and by name)")
            given[k] = a
        out = []
        for info, a in zip(infos, given):
            if a is None:
                raise ValueError(f"input '{info.name}' is missing: expected {info.dtype}{list(info.shape)}")
            if not isinstance(a, np.ndarray):
                a = np.asarray(a, dtype=info.dtype)
            if a.dtype != info.dtype:
                raise ValueError(f"input '{info.name}': expected dtype {info.dtype}, got {a.dtype}")
            if tuple(a.shape) != info.shape:
                raise ValueError(f"input '{info.name}': expected shape {list(info.shape)}, got {list(a.shape)}")
            out.append(np.ascontiguousarray(a))
        return out

    def _acquire(self) -> _Arena:
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        return _Arena(self)

    def _release(self, arena: _Arena) -> None:
        with self._pool_lock:
            self._pool.append(arena)

    def _bind(self, arena: _Arena, inputs, outs) -> None:
        table = arena.table
        for s, a in zip(self._program.inputs, inputs):
            table[s] = a.ctypes.data
        for s, a in zip(self._program.outputs, outs):
            table[s] = a.ctypes.data

    def run(self, *arrays, **named) -> list[np.ndarray]:
        """Run the model. Inputs by position (graph input order) or by name; returns fresh
        output arrays in graph output order. Safe to call from several threads at once."""
        inputs = self._check_inputs(arrays, named)
        outs = [np.empty(i.shape, i.dtype) for i in self.output_info]
        arena = self._acquire()
        try:
            self._bind(arena, inputs, outs)
            self._entry(arena.addr)
        finally:
            self._release(arena)
        return outs

    __call__ = run

    # -- measuring ----------------------------------------------------------------------
    def _kernel_fn(self, name: str):
        fn = self._kernel_fns.get(name)
        if fn is None:
            fn = self._kernel_fns[name] = _ENTRY_T(self._lib.address(name))
        return fn

    def profile(self, *arrays, repeat: int = 10, warmup: int = 1, show: bool = True, **named) -> Profile:
        """Time every kernel call on its own (each kernel's exported ``void name(ptr args)`` is
        called with its argument array, in run order), ``repeat`` times after ``warmup`` runs.
        Returns a :class:`Profile` (rows sorted by median time, slowest first) and prints it
        when ``show``. Inputs as for :meth:`run`; raises ValueError for bad inputs or repeat < 1."""
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        inputs = self._check_inputs(arrays, named)
        outs = [np.empty(i.shape, i.dtype) for i in self.output_info]
        prog = self._program
        arena = self._acquire()
        try:
            self._bind(arena, inputs, outs)
            calls = []
            for c in prog.calls:
                args = (ctypes.c_void_p * max(len(c.slots), 1))(*[arena.table[s] for s in c.slots])
                calls.append((self._kernel_fn(c.kernel), ctypes.addressof(args), args))
            times = [[0.0] * repeat for _ in calls]
            for _ in range(warmup):
                for fn, addr, _a in calls:
                    fn(addr)
            clock = time.perf_counter
            for r in range(repeat):
                for k, (fn, addr, _a) in enumerate(calls):
                    t0 = clock()
                    fn(addr)
                    times[k][r] = clock() - t0
        finally:
            self._release(arena)
        med = [statistics.median(t) * 1e3 for t in times]
        total = sum(med) or 1.0
        rows = Profile()
        for c, m in zip(prog.calls, med):
            moved = sum(prog.slots[s].nbytes for s in set(c.slots))
            gf = c.flops / (m * 1e-3) / 1e9 if c.flops and m > 0 else None
            rows.append(ProfileRow(c.kernel, list(c.nodes), list(c.ops), m, m / total, gf, moved))
        rows.sort(key=lambda r: -r.median_ms)
        if show:
            print(rows)
        return rows

    def benchmark(self, *arrays, repeat: int = 20, warmup: int = 2, **named) -> Benchmark:
        """Median, min and max wall time (ms) of whole ``run()`` calls over ``repeat`` runs."""
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        inputs = self._check_inputs(arrays, named)
        for _ in range(warmup):
            self.run(*inputs)
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self.run(*inputs)
            ts.append((time.perf_counter() - t0) * 1e3)
        return Benchmark(statistics.median(ts), min(ts), max(ts), repeat)

    # -- saving -------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the module to one file (see :mod:`runtime.artifact`); ``runtime.load`` reads
        it back. The write is atomic. Raises ArtifactError when the module has no object code."""
        from .artifact import save_module
        save_module(self, path)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_info))
        outs = ", ".join(map(str, self.output_info))
        return f"<tensorfuse.Module target={self.target} ({ins}) -> ({outs}), {self.num_kernels} kernels>"
