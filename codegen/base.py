"""Backends as objects: one interface per code generator, and the registry that finds them.

A :class:`Backend` turns a lowered graph (kernel IR plus the kernel-call sequence) into a
runnable module, and turns a saved module's code blob back into one. The compiler driver asks
``get_backend(target.kind)`` to build; the runtime asks ``get_backend(meta["backend"])`` to load
a saved module, so neither knows which code generator made a library.

Importing this module imports nothing of the compiler and no code generator: the registry
holds ``"module:Class"`` paths that are imported on first use (a process that only loads a
saved LLVM module never imports numba, and one that loads a cuda module never imports the
LLVM emitter).
"""
from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from typing import Any

#: backend name -> "module:Class" (imported lazily by :func:`get_backend`)
_REGISTRY: dict[str, str] = {
    "llvm": "tensorfuse.codegen.llvm.backend:LLVMBackend",
    "cuda": "tensorfuse.codegen.cuda.backend:CUDABackend",
}
_INSTANCES: dict[str, "Backend"] = {}
_LOCK = threading.Lock()


class Backend(ABC):
    """One code generator and the runtime side of what it makes.

    ``name``: the backend's name, recorded in saved modules (``"llvm"``, ``"cuda"``).
    ``code_member``: the name of the member of a saved module's zip that holds the code blob
    (``runtime.artifact``).
    """

    name: str = ""
    code_member: str = "code.o"
    #: the module whose import registers this backend's schedules in ``ir.strategy`` ("" for none)
    schedules_module: str = ""

    def load_schedules(self) -> None:
        """Import :attr:`schedules_module`, registering the backend's schedules (once)."""
        if self.schedules_module:
            import importlib
            importlib.import_module(self.schedules_module)

    def unavailable_reason(self) -> str | None:
        """Why code of this backend cannot run on this machine (one line), or None when it can.
        Default None (a CPU backend runs wherever tensorfuse does); the compiler refuses a
        target whose backend gives a reason, before compiling."""
        return None

    def schedule_kernel(self, kernel, target):
        """Schedule one kernel of a lowered graph for ``target`` (an ``ir.target.Target``), in
        place, and return it: called by ``compiler.lower.lower_graph`` for every kernel, while
        the kernel's node lowers (so knobs declared here are the node's, ``ir.knobs``). The
        default is the generic schedule every backend shares, ``ir.schedule.default_schedule``
        (a parallel spatial loop per nest, marked for a thread team or a GPU grid); a backend
        may add its own. Raises ``ir.schedule.ScheduleError`` for a schedule the kernel's
        semantics forbid (``ir.schedule.verify_schedule``)."""
        from tensorfuse.ir.schedule import default_schedule, verify_schedule
        default_schedule(kernel)
        verify_schedule(kernel)
        return kernel

    @abstractmethod
    def target_key(self, target) -> dict:
        """The compile cache key's target part for ``target`` (an ``ir.target.Target``):
        JSON values, including the canonical target string under ``"target"`` and whatever
        else changes the generated code (CPU features, compute capability ...)."""

    @abstractmethod
    def build(self, lowered, graph, input_names: list[str], output_names: list[str], target, *,
              log: list | None = None) -> tuple:
        """Generate code for a lowered graph (``compiler.lower.LoweredGraph``, duplicates of
        kernels already dropped or not) of ``graph`` for ``target`` (an ``ir.target.Target``,
        or None for the backend's default). Returns (the runnable module,
        ``runtime.module.ModuleBase``, its program made by :func:`program_of` with ``log``;
        the generated code as text for the compile report: LLVM IR, or None). The module's
        ``report`` is None: the compiler, which knows what it did, attaches its compile report
        (``compiler.driver.build_module``). Raises ``ir.errors.CompileError`` when code
        generation fails."""

    @abstractmethod
    def artifact_code(self, module) -> tuple[bytes, dict]:
        """(code blob, backend-specific metadata) that ``runtime.artifact.save_module`` writes
        for ``module``. Raises ArtifactError when the module has nothing to save."""

    @abstractmethod
    def check_compatible(self, meta: dict, path: str = "the file") -> None:
        """Raise ``runtime.artifact.ArtifactError`` unless this machine can run the saved module
        described by ``meta`` (its ``tensorfuse.json``); the format and tensorfuse version are
        checked by the artifact reader before this is called."""

    @abstractmethod
    def load(self, meta: dict, blob: bytes, program, plan, input_names: list[str], output_names: list[str],
             path: str = "the file"):
        """A runnable module from a saved module's parts: ``meta`` (checked with
        :meth:`check_compatible`), the code ``blob``, the ``runtime.module.Program`` (constants
        included) and its ``MemoryPlan``. Raises ArtifactError when the code cannot be loaded."""

    def __repr__(self) -> str:
        return f"<tensorfuse backend {self.name!r}>"


def backend_names() -> list[str]:
    """The registered backend names, sorted."""
    return sorted(_REGISTRY)


def register_backend(name: str, where: "str | Backend") -> None:
    """Register (or replace) a backend: ``where`` is a ``"module:Class"`` path imported on first
    use, or a Backend instance."""
    with _LOCK:
        _INSTANCES.pop(name, None)
        if isinstance(where, Backend):
            _INSTANCES[name] = where
            _REGISTRY[name] = f"{type(where).__module__}:{type(where).__qualname__}"
        else:
            _REGISTRY[name] = where


def get_backend(kind: str) -> Backend:
    """The backend named ``kind`` (a target kind: ``"llvm"``, ``"cuda"``), one instance per
    process. Raises ValueError for an unknown name (the message lists the known ones) and
    ImportError when the backend's module cannot be imported."""
    b = _INSTANCES.get(kind)
    if b is not None:
        return b
    with _LOCK:
        b = _INSTANCES.get(kind)
        if b is not None:
            return b
        where = _REGISTRY.get(kind)
        if where is None:
            raise ValueError(f"unknown backend {kind!r}; known backends: {', '.join(sorted(_REGISTRY))}")
        module, _, cls = where.partition(":")
        obj: Any = getattr(importlib.import_module(module), cls)
        b = _INSTANCES[kind] = obj()
        return b


def program_of(lowered, log: list | None = None):
    """The ``runtime.module.Program`` of a lowered graph, as every backend's
    :meth:`Backend.build` makes it: each call's ONNX nodes traced back through the rule ``log``
    (``runtime.profile.trace_sources``)."""
    from tensorfuse.runtime.module import Program
    from tensorfuse.runtime.profile import trace_sources
    log = list(log or [])
    program = Program.from_lowered(lowered)
    for c in program.calls:
        c.sources = trace_sources(c.nodes, log)
    return program
