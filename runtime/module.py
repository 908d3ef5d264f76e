"""The executable module: a kernel table, a slot table and the memory behind it.

``Module.run(*arrays, **named) -> list[np.ndarray]`` runs the whole graph with one native call
(the entry function runs every kernel in order). Inputs are checked against ``input_info``:
a missing input, an unknown name, a wrong dtype or a wrong shape raises ``ValueError`` naming
the input with expected and got. Outputs are fresh arrays in graph output order.

Memory (docs/architecture.md "Runtime"): constants are held once, as the arrays the compiler produced
(copied only where one does not start on a cache line, or, where they take megabytes, into one
buffer on transparent huge pages: :func:`aligned_consts`, :func:`aligned_empty`), and
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
import math
import mmap
import os
import threading
from dataclasses import dataclass, field

import ml_dtypes  # onnx depends on it: numpy's low-bit types
import numpy as np

from .memory_plan import ALIGNMENT, MemoryPlan, plan_memory

#: ``void entry(ptr slots, ptr team)`` and ``void kernel(ptr args, ptr team)``; a null team
#: runs everything on the calling thread
_ENTRY_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class RunCheckError(ValueError):
    """A run-time check of the input values failed: an index (Gather, ScatterND, ...) outside
    its axis, as onnxruntime refuses it too. The message names the node, the input and the
    offending value."""


class CPUFeaturesError(RuntimeError):
    """The module's code needs CPU features this CPU lacks (it was compiled for another CPU, e.g.
    ``target="llvm -mcpu=graniterapids"``): running it would die of an illegal instruction. The
    message names the target and the missing features; ``target`` is the target string. Save
    the module and run it on a CPU that has them."""

    def __init__(self, message: str, target: str | None = None):
        super().__init__(message)
        self.target = target


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
    writes: list[int] | None = None      # the parameters it writes (None: not recorded)


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
    #: temp slot -> the slot whose bytes it views (a reshape that runs no kernel; the memory
    #: plan records them as ``MemoryPlan.aliases``, which is what a run reads)
    aliases: dict[int, int] = field(default_factory=dict)
    #: alias slot -> the byte offset of its bytes in the slot it views (a Concat's inputs)
    alias_offsets: dict[int, int] = field(default_factory=dict)

    @staticmethod
    def from_lowered(lg) -> "Program":
        slots = [SlotInfo(s.index, s.name, s.kind, np.dtype(s.type.dtype.numpy), tuple(s.type.shape))
                 for s in lg.slots]
        calls = [CallInfo(c.kernel, list(c.slots), list(c.nodes), list(c.ops), c.flops,
                          [tuple(p) for p in getattr(c, "inplace_ok", None) or ()], None,
                          getattr(c, "writes", None)) for c in lg.calls]
        return Program(slots, list(lg.inputs), list(lg.outputs), calls, dict(lg.consts),
                       getattr(lg, "status_slot", None), list(getattr(lg, "messages", ())),
                       dict(getattr(lg, "aliases", None) or {}), dict(getattr(lg, "alias_offsets", None) or {}))


#: transparent huge pages (2 MiB on x86-64) for the host buffers the kernels read and write
#: (constants, arenas, loaded artifacts) of at least HUGE_PAGE_MIN_BYTES: a model's weights
#: stream through the data TLB once per run, and with 4 KiB pages resnet50's 25-100 MB took a
#: TLB miss every 4 KiB (Zen 4, resnet50 u8s8 at 1 thread, one process per setting against
#: onnxruntime: 0.972 / 0.987 on huge pages against 0.997 / 0.996; fp32 resnet50 at 2 threads
#: 0.925 against 0.942). Linux only (``madvise(MADV_HUGEPAGE)``; the system setting "madvise"
#: or "always"); ``TENSORFUSE_HUGE_PAGES=0`` switches it off
HUGE_PAGE_BYTES = 2 << 20
HUGE_PAGE_MIN_BYTES = 2 << 20


def _huge_pages_enabled() -> bool:
    return hasattr(mmap, "MADV_HUGEPAGE") and os.environ.get("TENSORFUSE_HUGE_PAGES", "1") != "0"


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). ``compile`` calls it once the compiler's structures are dropped: the constants
    copied onto huge pages (:func:`aligned_consts`) free their originals there, and without it
    the process kept their pages (resnet50 fp32 after compile and a run: 527 MB resident,
    against 463 without huge pages; 399 both with the trim)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def aligned_empty(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uint8 array of ``nbytes`` (zeroed where on huge pages, else uninitialised) whose
    data starts on an ``alignment``-byte boundary (default 64, a cache line). From
    :data:`HUGE_PAGE_MIN_BYTES` on, where :func:`_huge_pages_enabled`: a private anonymous
    mapping, 2 MiB aligned and advised ``MADV_HUGEPAGE`` before it is touched (the kernel backs
    it with huge pages as the pages fault in, where it has them; else 4 KiB pages as before);
    below, or elsewhere: a view into a numpy allocation ``alignment`` bytes larger. The array
    keeps its mapping alive."""
    if nbytes >= HUGE_PAGE_MIN_BYTES and _huge_pages_enabled():
        size = nbytes + HUGE_PAGE_BYTES
        try:
            mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError:
            mapping = None
        if mapping is not None:
            raw = np.frombuffer(mapping, np.uint8)
            off = (-raw.ctypes.data) % HUGE_PAGE_BYTES
            try:
                mapping.madvise(mmap.MADV_HUGEPAGE, off, (size - off) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES)
            except OSError:          # a kernel without transparent huge pages: 4 KiB pages
                pass
            return raw[off:off + nbytes]
    return _aligned_heap(nbytes, alignment)


def _aligned_heap(nbytes: int, alignment: int) -> np.ndarray:
    """``nbytes`` uninitialised uint8 starting on an ``alignment``-byte boundary: a view into a
    numpy allocation ``alignment`` bytes larger."""
    raw = np.empty(nbytes + alignment, np.uint8)
    off = (-raw.ctypes.data) % alignment
    return raw[off:off + nbytes]


def _aligned_output(shape, dtype) -> np.ndarray:
    """A fresh uninitialised output array starting on a cache line (:data:`ALIGNMENT`): the
    kernels' whole-vector stores then each fill one line instead of straddling two. On the
    heap, never a fresh mapping (:func:`aligned_empty`'s huge pages would fault in every run)."""
    dt = np.dtype(dtype)
    return _aligned_heap(math.prod(shape) * dt.itemsize, ALIGNMENT).view(dt).reshape(shape)


def _in_mapping(a: np.ndarray) -> bool:
    """Whether ``a`` views memory of a :func:`aligned_empty` mapping (a loaded artifact's
    constants: already there, not copied again)."""
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


def aligned_consts(consts: dict, alignment: int = ALIGNMENT) -> dict:
    """``consts`` (slot -> array) where the kernels can read them at full speed: every array
    whose data does not start on an ``alignment``-byte boundary (64: a cache line) replaced by
    an aligned copy, the others kept as they are (numpy places a large array 16 bytes past a
    page boundary, and a kernel's full-width vector loads from a packed weight that is not
    line-aligned each touch two cache lines: a GEMM then ran 5-15% slower, by where the
    allocator put the weight). Where the constants take at least :data:`HUGE_PAGE_MIN_BYTES`
    and huge pages are on, all of them are copied into one :func:`aligned_empty` instead, each
    at an aligned offset (unless every one already views such a buffer at an aligned offset,
    as a loaded artifact's do)."""
    total = sum(-(-a.nbytes // alignment) * alignment for a in consts.values())
    if (total >= HUGE_PAGE_MIN_BYTES and _huge_pages_enabled()
            and not all(_in_mapping(a) and a.ctypes.data % alignment == 0 for a in consts.values())):
        buf = aligned_empty(total, alignment)
        out, off = {}, 0
        for slot, a in consts.items():
            b = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
            b[...] = a
            out[slot] = b
            off += -(-a.nbytes // alignment) * alignment
        return out
    out = {}
    for slot, a in consts.items():
        if a.ctypes.data % alignment == 0 or a.nbytes == 0:
            out[slot] = a
            continue
        b = aligned_empty(a.nbytes, alignment).view(a.dtype).reshape(a.shape)
        b[...] = a
        out[slot] = b
    return out


class _Arena:
    """One run's private memory: the intermediates' arena and a slot table pointing into it."""

    def __init__(self, module: "Module"):
        plan = module.memory_plan
        align = plan.alignment
        self.buffer = aligned_empty(plan.arena_bytes + align, align)
        base = self.buffer.ctypes.data
        self.base_offset = (-base) % align      # where the planned offsets start in ``buffer``
        base += self.base_offset
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
        self.num_threads = module.num_threads   # what it was made for (its team's size, if it has one)
        self.call_args = None                   # debug mode's per-call argument arrays
        helpers = module._team_helpers() if module.num_threads > 1 else None
        if helpers is not None:                 # (a module saved by an older tensorfuse: none)
            import weakref

            from .threads import ThreadTeam
            self.team = ThreadTeam(module.num_threads, helpers)
            weakref.finalize(self, self.team.close)   # the workers exit with their arena

    def call(self, entry, table: int | None = None) -> None:
        """Run ``entry`` (the module's entry, or one kernel) on the slot table (or ``table``,
        the address of a kernel's argument array), with the team where there is one (a whole
        run adaptively: ``ThreadTeam.run``)."""
        if self.team is None:
            entry(self.addr if table is None else table, None)
        elif table is None:                     # a whole run: the team may choose to run it alone
            self.team.run(entry, self.addr, adaptive=True)
        else:                                   # one kernel (debug mode): always on the team
            self.team.run(entry, table)


#: numpy dtypes of the 4- and 2-bit integers (``ml_dtypes``), range-checked as integers
_LOWBIT_INT_NP = tuple(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))


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
    is_int = want_dt.kind in "iu" or want_dt in _LOWBIT_INT_NP      # int4 / int2: numpy kind 'V'
    if is_int and arr.size and not np.array_equal(out.astype(arr.dtype), arr):
        raise ValueError(f"input '{info.name}': values out of the range of {info.dtype}")
    return out


class ModuleBase:
    """What every compiled module has, whichever backend made it.

    Attributes: ``input_info`` / ``output_info`` (lists of TensorInfo), ``num_kernels`` (kernel
    calls per run), ``calls`` (those calls), ``memory_plan``
    (:class:`~runtime.memory_plan.MemoryPlan`), ``target`` (the target string), ``backend``
    (the name of the backend that made it, ``codegen.base.get_backend``), ``layout_report``
    (the layout pass's report for targets that run one, else None) and ``cache_hit`` (True /
    False when ``compile`` looked the module up in the compile cache, None when it did not or
    the module was loaded from a file).

    ``report`` is the compile report (``compiler.report.CompileReport``) of a module that
    ``tensorfuse.compile`` made, fresh or from the compile cache, and None for one loaded from a
    file (``tensorfuse.load``: code, memory plan and kernel-call sources only). These
    read it: ``graph`` (the optimised graph IR), ``kernels`` (kernel IR), ``llvm_ir`` (LLVM IR
    text), ``rewrite_log`` (the rule applications) and ``pass_records`` (the pass runs). Without
    a report ``graph``, ``llvm_ir``, ``rewrite_log`` and ``pass_records`` are None and
    ``kernels`` raises AttributeError. On a cache hit, the first ``graph`` access parses the
    stored graph and the first ``kernels`` access lowers it again (see ``compiler.report``);
    nothing is recompiled.

    Subclasses run the code (:meth:`run`) and may accept more kinds of input
    (:meth:`_check_input`); the input matching and checking is here, once.
    """

    #: the backend name recorded in saved modules (``codegen.base``)
    backend = "llvm"

    def __init__(self, lowered, input_names, output_names, target: str, *, plan: MemoryPlan | None = None,
                 report=None, alignment: int | None = None):
        self._program = lowered if isinstance(lowered, Program) else Program.from_lowered(lowered)
        prog = self._program
        #: the compile report (``compiler.report.CompileReport``), or None (loaded from a file)
        self.report = report
        self.cache_hit: bool | None = None
        self.target = target
        #: the layout pass's report (``compiler.passes.layout``) where the target runs it, else None
        self.layout_report = None
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        slots = prog.slots
        self.input_info = [TensorInfo(n, slots[s].dtype, slots[s].shape) for n, s in zip(input_names, prog.inputs)]
        self.output_info = [TensorInfo(n, slots[s].dtype, slots[s].shape) for n, s in zip(output_names, prog.outputs)]
        self._consts = prog.consts      # held once, never copied on the host
        if plan is None:
            kw = {} if alignment is None else {"alignment": alignment}
            plan = plan_memory(prog.slots, prog.calls, aliases=prog.aliases,
                               alias_offsets=getattr(prog, "alias_offsets", None) or {}, **kw)
        self.memory_plan = plan
        #: why this machine cannot run the code (set by the backend), or None
        self._cannot_run: str | None = None

    # -- introspection (the compile report) ---------------------------------------------
    @property
    def graph(self):
        """The optimised graph IR (``ir.Graph``), or None for a module loaded from a file."""
        return self.report.graph if self.report is not None else None

    @property
    def llvm_ir(self) -> str | None:
        """The LLVM IR text the code was generated from, or None for a module loaded from a file."""
        return self.report.llvm_ir if self.report is not None else None

    @property
    def rewrite_log(self) -> list | None:
        """The rule applications (``compiler.rewrite.Application``) in order, or None."""
        return self.report.rewrite_log if self.report is not None else None

    @property
    def pass_records(self) -> list | None:
        """The pass runs (``compiler.pipeline.PassRecord``) in order, or None."""
        return self.report.passes if self.report is not None else None

    @property
    def kernels(self):
        """The kernel IR, one per distinct kernel. Raises AttributeError for a module loaded
        from a file (it holds machine code, not kernel IR)."""
        if self.report is None:
            raise AttributeError("this module was loaded from a file: it holds machine code, not kernel IR")
        return self.report.kernels

    @property
    def calls(self) -> list[CallInfo]:
        """The native kernel calls of one run, in order."""
        return self._program.calls

    @property
    def runs_here(self) -> bool:
        """True when this CPU has every instruction-set feature the module's code needs (a module
        compiled for another CPU, ``llvm -mcpu=znver4`` on an Intel host say, may not: its
        :meth:`run` raises :class:`CPUFeaturesError`)."""
        return not self._cannot_run

    @property
    def num_kernels(self) -> int:
        return len(self._program.calls)

    # -- running ------------------------------------------------------------------------
    def _check_inputs(self, arrays, named) -> list:
        """The inputs of a run in graph input order: positional then named, each checked by
        :meth:`_check_input`. Raises ValueError for too many, unknown, repeated or missing
        inputs, :class:`CPUFeaturesError` (a RuntimeError) when this CPU cannot run the code."""
        if self._cannot_run:            # running it would die of an illegal instruction
            raise CPUFeaturesError(self._cannot_run, self.target)
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
            out.append(self._check_input(info, a))
        return out

    def _check_input(self, info: TensorInfo, a):
        """One input as the kernels take it: a C-contiguous ndarray of ``info``'s dtype and
        shape. Raises ValueError naming the input with expected and got (TypeError for what is
        not array-like; see ``_as_input_array``)."""
        if not isinstance(a, np.ndarray):
            a = _as_input_array(info, a)
        if a.dtype != info.dtype:
            raise ValueError(f"input '{info.name}': expected dtype {info.dtype}, got {a.dtype}")
        if tuple(a.shape) != info.shape:
            raise ValueError(f"input '{info.name}': expected shape {list(info.shape)}, got {list(a.shape)}")
        return np.ascontiguousarray(a)

    def run(self, *arrays, **named) -> list[np.ndarray]:
        """Run the model (see the subclass); inputs by position or by name."""
        raise NotImplementedError

    def __call__(self, *arrays, **named):
        return self.run(*arrays, **named)

    # -- measuring ----------------------------------------------------------------------
    def profile(self, *arrays, repeat: int = 10, warmup: int = 1, show: bool = False, **named):
        """Time every kernel call on its own (see the subclass); returns a
        :class:`~runtime.profile.Profile`."""
        raise NotImplementedError

    def benchmark(self, *arrays, repeat: int = 20, warmup: int = 2, **named):
        """Median, min and max wall time (ms) of whole ``run()`` calls over ``repeat`` runs
        (a :class:`~runtime.profile.Benchmark`)."""
        from .profile import benchmark_module
        return benchmark_module(self, arrays, named, repeat=repeat, warmup=warmup)

    def source_nodes(self, call: CallInfo) -> list[str]:
        """The ONNX node names a kernel call covers: its IR nodes traced back through the
        rewrites that made them (the compiler records them on each call; ``rewrite_log``
        otherwise), or as recorded in a saved module."""
        if call.sources is not None:
            return list(call.sources)
        from .profile import trace_sources
        return trace_sources(call.nodes, self.rewrite_log)

    # -- saving -------------------------------------------------------------------------
    def can_save(self) -> bool:
        """Whether :meth:`save` has code to write."""
        return True

    def save(self, path) -> None:
        """Write the module to one file (see :mod:`runtime.artifact`); ``runtime.load`` reads
        it back. A regular file or a new path is replaced atomically, a symbolic link written
        through, a device or FIFO written into (``runtime.outfile``); the folder must exist.
        Raises ArtifactError when the module has no code to save or the file cannot be written
        (``cannot write PATH: REASON``)."""
        from .artifact import save_module
        save_module(self, path)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_info))
        outs = ", ".join(map(str, self.output_info))
        return f"<tensorfuse.{type(self).__name__} target={self.target} ({ins}) -> ({outs}), {self.num_kernels} kernels>"


class Module(ModuleBase):
    """A compiled model for a CPU: native code (``codegen.llvm``, through ``LLVMBackend``) run
    with one native call per run (see the module docstring), plus what every module has
    (:class:`ModuleBase`).

    ``num_threads`` sets the threads that run the parallel loops.
    """

    def __init__(self, lowered, library, entry: str, input_names, output_names, target: str = "llvm", *,
                 plan: MemoryPlan | None = None, object_code: bytes | None = None, host: dict | None = None,
                 report=None, cannot_run: str | None = None):
        """``lowered``: a :class:`Program` (or a lowered graph, made into one); ``library``: the
        linked native code, with ``address(symbol)`` for the ``entry`` symbol and each kernel;
        ``object_code``: its relocatable object code (what ``save`` writes); ``host``: what it
        was generated for, as saved; ``report``: the compile report, which the compiler passes
        (None for a module loaded from a file); ``cannot_run``: why this machine cannot run the
        code (the backend says; ``run`` then raises :class:`CPUFeaturesError` with it), or None."""
        super().__init__(lowered, input_names, output_names, target, plan=plan, report=report)
        # the native kernels read the constants in place: a copy only of those not on a cache line
        self._program.consts = self._consts = aligned_consts(self._program.consts)
        self._lib = library
        self._entry_name = entry
        self._entry = _ENTRY_T(library.address(entry))
        self._helpers = None
        self._object_code = object_code
        self._host = host
        self._pool: list[_Arena] = []
        self._pool_lock = threading.Lock()
        self._kernel_fns: dict[str, object] = {}
        from tensorfuse.debug import debug_mode
        #: debug mode's memory check on every run (see :meth:`run`); settable
        self.check_memory = debug_mode()
        self._plan_checked = False
        from .threads import resolve_num_threads
        self._num_threads = resolve_num_threads(None)
        #: why this CPU cannot run the code (compiled for features it lacks), or None
        self._cannot_run = cannot_run

    def _team_helpers(self) -> dict | None:
        """The thread team's native helpers, from this module's code (``runtime.threads.team_helpers``);
        None for a module saved by a tensorfuse whose kernels follow another thread protocol
        (it runs on the calling thread alone)."""
        if self._helpers is None:
            from .threads import team_helpers
            self._helpers = team_helpers(self._lib) or {}
        return self._helpers or None

    def can_save(self) -> bool:
        """Whether :meth:`save` has object code to write (a module built without it has none)."""
        return bool(self._object_code)

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

    def _acquire(self) -> _Arena:
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        return _Arena(self)

    def _release(self, arena: _Arena) -> None:
        with self._pool_lock:
            if arena.num_threads == self._num_threads:
                self._pool.append(arena)

    def _bind(self, arena: _Arena, inputs, outs) -> None:
        table = arena.table
        for s, a in zip(self._program.inputs, inputs):
            table[s] = a.ctypes.data
        for s, a in zip(self._program.outputs, outs):
            table[s] = a.ctypes.data
        offs = getattr(self.memory_plan, "alias_offsets", None) or {}
        for s, r in self.memory_plan.aliases.items():      # a reshape (a Concat's input) views its root's bytes
            table[s] = table[r] + offs.get(s, 0)

    def run(self, *arrays, **named) -> list[np.ndarray]:
        """Run the model. Inputs by position (graph input order) or by name; returns fresh
        output arrays in graph output order. Safe to call from several threads at once.

        With ``check_memory`` (on in debug mode, ``tensorfuse.debug``) the kernels run one by
        one (each on the thread team, as in a plain run): the memory plan is first checked against the calls
        (``runtime.memory_plan.check_plan``), every arena region and output starts poisoned
        (NaN, or 0xA5 bytes for integers), a region is poisoned again when its value dies, and
        before each call every value the kernel reads must be what its producer wrote (a CRC
        taken after the write); otherwise MemoryPlanError names the kernel and the values."""
        inputs = self._check_inputs(arrays, named)
        outs = [_aligned_output(i.shape, i.dtype) for i in self.output_info]
        arena = self._acquire()
        try:
            self._bind(arena, inputs, outs)
            arena.status[0] = 0
            if self.check_memory:
                self._run_checked(arena, outs)
            else:
                arena.call(self._entry)
            code, value = int(arena.status[0]), int(arena.status[1])
        finally:
            self._release(arena)
        if code:
            raise RunCheckError(f"{self._program.messages[code - 1]}: got {value}")
        return outs

    __call__ = run

    def _run_checked(self, arena: _Arena, outs) -> None:
        """One run kernel by kernel with the memory checks of :meth:`run`."""
        import zlib

        from .memory_plan import MemoryPlanError, call_writes, check_plan, lifetimes, poison, viewed_calls
        prog, plan = self._program, self.memory_plan
        viewed = viewed_calls(prog.calls, plan.aliases)     # an alias parameter reads its root
        if not self._plan_checked:
            check_plan(plan, prog.slots, prog.calls)
            self._plan_checked = True
        slots = prog.slots
        start = arena.base_offset
        region: dict[int, np.ndarray] = {}        # slot -> its bytes (temps and outputs)
        span: dict[int, tuple[int, int]] = {}     # temp slot -> arena byte range
        for b in plan.buffers:
            if slots[b.slot].kind == "temp":
                n = slots[b.slot].nbytes
                region[b.slot] = arena.buffer[start + b.offset:start + b.offset + n]
                span[b.slot] = (b.offset, b.offset + n)
        for s, a in zip(prog.outputs, outs):
            region[s] = a.reshape(-1).view(np.uint8)
        for s, r in region.items():
            poison(r, slots[s].dtype)
        life = lifetimes(slots, viewed)
        dies: dict[int, list[int]] = {}
        for s, (_, last) in life.items():
            dies.setdefault(last, []).append(s)
        writes = call_writes(prog.calls)
        sealed: dict[int, tuple[int, int]] = {}   # slot -> (crc, call that wrote it last)
        written_by: dict[int, int] = {}           # temp slot -> last call writing it

        def what(t: int) -> str:
            c = prog.calls[t]
            return f"call {t} ({c.kernel}{': ' + ', '.join(c.nodes) if c.nodes else ''})"

        if arena.call_args is None:             # kept with the arena: a late worker may read them
            arena.call_args = [(ctypes.c_void_p * max(len(c.slots), 1))() for c in prog.calls]
        for t, (c, cv) in enumerate(zip(prog.calls, viewed)):
            for p, s in enumerate(cv.slots):
                if p in writes[t] or s not in region or region[s].size == 0:
                    continue        # an empty tensor (a zero-sized dim) has nothing to read
                if s not in sealed:
                    raise MemoryPlanError(f"{what(t)} reads slot {s} '{slots[s].name}' before any kernel wrote it")
                crc, by = sealed[s]
                if zlib.crc32(region[s]) != crc:
                    lo, hi = span.get(s, (0, 0))
                    culprits = [f"slot {o} '{slots[o].name}' ({what(w)})" for o, w in written_by.items()
                                if o != s and w > by and span[o][0] < hi and lo < span[o][1]]
                    raise MemoryPlanError(
                        f"{what(t)} reads slot {s} '{slots[s].name}', written by {what(by)}, but its arena "
                        f"region was overwritten since" + (f" by {', '.join(culprits)}" if culprits else
                                                           " (poisoned when the plan took it for dead)"))
            args = arena.call_args[t]
            for p, s in enumerate(c.slots):
                args[p] = arena.table[s]
            arena.call(self._kernel_fn(c.kernel), ctypes.addressof(args))
            for p in writes[t]:
                s = cv.slots[p]
                if s in region:
                    sealed[s] = (zlib.crc32(region[s]), t)
                    if s in span:
                        written_by[s] = t
            for s in dies.get(t, ()):
                lo, hi = span[s]
                # the memory a live value holds (an in-place successor) is not poisoned
                if not any(o != s and life[o][0] <= t < life[o][1] and span[o][0] < hi and lo < span[o][1]
                           for o in span if o in life):
                    poison(region[s], slots[s].dtype)
                sealed.pop(s, None)

    # -- measuring ----------------------------------------------------------------------
    def _kernel_fn(self, name: str):
        fn = self._kernel_fns.get(name)
        if fn is None:
            fn = self._kernel_fns[name] = _ENTRY_T(self._lib.address(name))
        return fn

    def profile(self, *arrays, repeat: int = 10, warmup: int = 1, show: bool = False, **named):
        """Time every kernel call on its own (each kernel's exported ``void name(ptr args)`` is
        called with its argument array, in run order), ``repeat`` times after ``warmup`` runs.
        Each kernel runs on the calling thread alone, whatever ``num_threads`` is (waking the
        team per kernel would cost more than many kernels take): the times are 1-thread times.
        Returns a :class:`~runtime.profile.Profile` whose ``str`` / ``repr`` is the table: rows
        (call number, kernel, the ONNX nodes it covers, median ms, share, GFLOP/s where the FLOP
        count is known, bytes moved) sorted slowest first. Prints nothing unless ``show``.
        Inputs as for :meth:`run`; raises ValueError for bad inputs or repeat < 1."""
        from .profile import profile_module
        return profile_module(self, arrays, named, repeat=repeat, warmup=warmup, show=show)

