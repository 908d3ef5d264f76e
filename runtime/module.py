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
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .memory_plan import MemoryPlan, plan_memory

#: ``void entry(ptr slots, ptr team)`` and ``void kernel(ptr args, ptr team)``; a null team
#: runs everything on the calling thread
_ENTRY_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


@dataclass(frozen=True)
class TensorInfo:
    """Name, dtype (numpy) and static shape of a graph input or output."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def __str__(self) -> str:
        from tensorfuse.ir.types import DType, TensorType   # not at import: loading a saved module needs no IR
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
    sources: list[str] | None = None     # ONNX node names, once traced (saved modules)


@dataclass
class Program:
    """What the runtime needs of a lowered graph: slots, calls, constants; no kernel IR."""

    slots: list[SlotInfo]
    inputs: list[int]
    outputs: list[int]
    calls: list[CallInfo]
    consts: dict[int, np.ndarray]
    status_slot: int | None = None       # i64[2] word the run-time checks write (code, value)
    messages: list[str] = field(default_factory=list)   # check error k is messages[k-1]

    @staticmethod
    def from_lowered(lg) -> "Program":
        slots = [SlotInfo(s.index, s.name, s.kind, np.dtype(s.type.dtype.numpy), tuple(s.type.shape))
                 for s in lg.slots]
        calls = [CallInfo(c.kernel, list(c.slots), list(c.nodes), list(c.ops), c.flops,
                          [tuple(p) for p in getattr(c, "inplace_ok", None) or ()]) for c in lg.calls]
        return Program(slots, list(lg.inputs), list(lg.outputs), calls, dict(lg.consts),
                       getattr(lg, "status_slot", None), list(getattr(lg, "messages", ())))


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
        self.status = np.zeros(2, np.int64)
        if module._program.status_slot is not None:
            self.table[module._program.status_slot] = self.status.ctypes.data
        self.addr = ctypes.addressof(self.table)
        self.team = None
        if module.num_threads > 1:
            import weakref

            from .threads import ThreadTeam
            self.team = ThreadTeam(module.num_threads)
            weakref.finalize(self, self.team.close)   # the workers exit with their arena

    def call(self, entry) -> None:
        if self.team is None:
            entry(self.addr, None)
        else:
            self.team.run(entry, self.addr)


def _as_input_array(info, a) -> np.ndarray:
    """A run-time input that is not an ndarray (a Python number or bool, a nested list or tuple
    of them, a numpy scalar, an object with ``__array__``) as an array of ``info``'s dtype.
    Raises TypeError naming the input for a str, bytes, dict, set or anything whose elements are
    not numbers, ValueError for a ragged nested list and for numbers the dtype cannot hold
    (floats for an integer input, integers out of its range, numbers for a bool input)."""
    want = f"a numpy array (or nested list of numbers) of dtype {info.dtype} and shape {list(info.shape)}"
    if isinstance(a, (str, bytes, bytearray, dict, set, frozenset)) or a is None:
        raise TypeError(f"input '{info.name}': expected {want}, got {type(a).__name__}")
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # old numpy: ragged lists only warn
            arr = np.asarray(a)
    except (ValueError, TypeError, np.exceptions.VisibleDeprecationWarning) as e:
        ragged = "inhomogeneous" in str(e) or "sequence" in str(e) or "ragged" in str(e)
        raise ValueError(f"input '{info.name}': expected {want}, got a {type(a).__name__} that is not "
                         f"{'rectangular (a ragged nested list)' if ragged else 'array-like'}") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"input '{info.name}': expected {want}, got a {type(a).__name__} of "
                        f"{'strings' if arr.dtype.kind in 'SU' else arr.dtype.name + ' elements'}")
    want_dt = np.dtype(info.dtype)
    if not np.can_cast(arr.dtype, want_dt, casting="same_kind"):
        raise ValueError(f"input '{info.name}': expected {want}, got {arr.dtype.name} values "
                         f"(convert them explicitly)")
    out = arr.astype(want_dt)
    if want_dt.kind in "iu" and arr.size and not np.array_equal(out.astype(arr.dtype), arr):
        raise ValueError(f"input '{info.name}': values out of the range of {info.dtype}")
    return out


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
        from .threads import resolve_num_threads
        self._num_threads = resolve_num_threads(None)
        #: why this CPU cannot run the code (compiled for features it lacks), or None
        self._cannot_run = None
        info = getattr(library, "target_info", None)
        if info:
            from .artifact import lacking_features
            lacking = lacking_features(info)
            if lacking:
                self._cannot_run = (f"this module was compiled for target {info.get('target')!r} and its code "
                                    f"needs {', '.join(lacking)}, which this CPU lacks: save it and run it on a "
                                    f"CPU that has {'them' if len(lacking) > 1 else 'it'}")

    @property
    def num_threads(self) -> int:
        """Threads that run each run's parallel loops (``compile(num_threads=...)``, else
        ``$TENSORFUSE_NUM_THREADS``, else the cores this process may use). Settable; raises
        ValueError for a count below 1."""
        return self._num_threads

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        from .threads import resolve_num_threads
        n = resolve_num_threads(n)
        if n != self._num_threads:
            with self._pool_lock:
                self._num_threads = n
                self._pool = []                 # arenas own teams of the old size

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
        if self._cannot_run:            # running it would die of an illegal instruction
            raise RuntimeError(self._cannot_run)
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
                a = _as_input_array(info, a)
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
            if (arena.team.size if arena.team else 1) == self._num_threads:
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
            arena.status[0] = 0
            arena.call(self._entry)
            code, value = int(arena.status[0]), int(arena.status[1])
        finally:
            self._release(arena)
        if code:
            raise ValueError(f"{self._program.messages[code - 1]}: got {value}")
        return outs

    __call__ = run

    # -- measuring ----------------------------------------------------------------------
    def _kernel_fn(self, name: str):
        fn = self._kernel_fns.get(name)
        if fn is None:
            fn = self._kernel_fns[name] = _ENTRY_T(self._lib.address(name))
        return fn

    def profile(self, *arrays, repeat: int = 10, warmup: int = 1, show: bool = True, **named):
        """Time every kernel call on its own (each kernel's exported ``void name(ptr args)`` is
        called with its argument array, in run order), ``repeat`` times after ``warmup`` runs.
        Returns a :class:`~runtime.profile.Profile`: rows (kernel, the ONNX nodes it covers,
        median ms, share, GFLOP/s where the FLOP count is known, bytes moved) sorted slowest
        first; prints it when ``show``. Inputs as for :meth:`run`; raises ValueError for bad
        inputs or repeat < 1."""
        from .profile import profile_module
        return profile_module(self, arrays, named, repeat=repeat, warmup=warmup, show=show)

    def benchmark(self, *arrays, repeat: int = 20, warmup: int = 2, **named):
        """Median, min and max wall time (ms) of whole ``run()`` calls over ``repeat`` runs
        (a :class:`~runtime.profile.Benchmark`)."""
        from .profile import benchmark_module
        return benchmark_module(self, arrays, named, repeat=repeat, warmup=warmup)

    def source_nodes(self, call: CallInfo) -> list[str]:
        """The ONNX node names a kernel call covers: its IR nodes traced back through the
        rewrites that made them (``rewrite_log``), or as recorded in a saved module."""
        if call.sources is not None:
            return list(call.sources)
        from .profile import trace_sources
        return trace_sources(call.nodes, self.__dict__.get("rewrite_log"))

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
