"""The LLVM backend: kernel IR -> LLVM IR (``codegen.llvm.emit``) -> native code linked into
this process (``codegen.llvm.jit``), run by ``runtime.module.Module``.

A saved LLVM module holds the relocatable object code (``code.o``) and records what the code
was generated for (``host``: target string, triple, CPU, feature string, and ``needs``, the CPU
features the code may use); loading checks the triple and the features against this CPU.
"""
from __future__ import annotations

import functools

from tensorfuse.codegen.base import Backend, program_of


def host_info() -> dict:
    """This machine's triple, CPU and features (``codegen.llvm.jit.host_info``)."""
    from tensorfuse.codegen.llvm.jit import host_info as info
    return info()


def needed_features(saved: dict) -> set[str]:
    """The CPU features the saved code needs: its ``needs`` list, or for a file without one,
    every ``+feature`` of its feature string but the system-only ones the code never uses
    (``codegen.llvm.jit.SYSTEM_ONLY_FEATURES``)."""
    if isinstance(saved.get("needs"), list):
        return {str(f) for f in saved["needs"]}
    from tensorfuse.codegen.llvm.jit import SYSTEM_ONLY_FEATURES
    return {f[1:] for f in (saved.get("features") or "").split(",") if f.startswith("+")} - SYSTEM_ONLY_FEATURES


def lacking_features(info: dict) -> list[str]:
    """The features code generated as ``info`` says (a saved module's ``host`` record, or
    ``codegen.llvm.jit.target_info``) needs that this CPU lacks, sorted."""
    host = host_info()
    have = {f[1:] for f in host["features"].split(",") if f.startswith("+")}
    return sorted(needed_features(info) - have)


@functools.lru_cache(maxsize=None)
def request_amx_tiles() -> bool:
    """Ask Linux for this process's permission to use the AMX tile data registers
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, Linux 5.16+: without it the first
    tile instruction faults; the permission covers every thread of the process, the thread
    team's included). True when granted; False on another OS or architecture, or refused."""
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def cannot_run_reason(info: dict | None) -> str | None:
    """Why this CPU cannot run code generated as ``info`` says (it lacks features the code
    needs), or None."""
    if not info:
        return None
    lacking = lacking_features(info)
    if not lacking:
        if "amx-tile" in needed_features(info) and not request_amx_tiles():
            return (f"this module was compiled for target {info.get('target')!r} and its code uses AMX "
                    f"tiles, which the operating system did not let this process use "
                    f"(arch_prctl ARCH_REQ_XCOMP_PERM refused: Linux 5.16 or newer grants it)")
        return None
    return (f"this module was compiled for target {info.get('target')!r} and its code "
            f"needs {', '.join(lacking)}, which this CPU lacks: save it and run it on a "
            f"CPU that has {'them' if len(lacking) > 1 else 'it'}")


#: a module whose kernels are estimated at fewer LLVM instructions than this is generated in
#: one piece (forking and linking several objects cost more than they save); mobilenet_v2's
#: 33 kernels are about 48,000
PARALLEL_MIN_SIZE = 10000


def kernel_size(stmts) -> int:
    """An estimate of the LLVM instructions the emitter makes of ``stmts`` (kernel IR): the
    distinct expression nodes of each store, loops' bodies once (``unroll`` loops once per
    iteration). Within 1.1-1.7x of the IR's line count on mobilenet_v2's kernels."""
    from tensorfuse.ir.kernel import Const, For, If, Store
    from tensorfuse.ir.schedule import expr_nodes
    n = 0
    for st in stmts:
        if isinstance(st, Store):
            seen = {id(x) for e in (st.index, st.value) for x in expr_nodes(e)}
            n += 1 + len(seen)
        elif isinstance(st, For):
            k = int(st.extent.value) if st.kind == "unroll" and isinstance(st.extent, Const) else 1
            n += 3 + k * kernel_size(st.body)
        elif isinstance(st, If):
            n += 1 + kernel_size(st.then) + kernel_size(st.orelse)
        else:
            n += 1
    return n


def kernel_groups(kernels, jobs: int) -> list[list]:
    """``kernels`` dealt into at most ``jobs`` groups of about equal :func:`kernel_size`
    (largest first into the lightest group; each group in the kernels' order): one group when
    ``jobs`` is 1, fork is not available, or the total is under :data:`PARALLEL_MIN_SIZE`."""
    from tensorfuse.codegen.llvm.jit import _can_fork
    if jobs < 2 or len(kernels) < 2 or not _can_fork():
        return [list(kernels)]
    sizes = [kernel_size(k.body) for k in kernels]
    if sum(sizes) < PARALLEL_MIN_SIZE:
        return [list(kernels)]
    k = min(jobs, len(kernels))
    load, owner = [0] * k, {}
    for i in sorted(range(len(kernels)), key=lambda i: -sizes[i]):
        g = load.index(min(load))
        owner[i] = g
        load[g] += sizes[i]
    return [[kern for i, kern in enumerate(kernels) if owner[i] == g] for g in range(k)]


def _build_in_parts(groups, emit, name: str, target):
    """Emit and compile each group of kernels as a module of its own: the first (with the
    entry, which declares the other groups' kernels) here, the others in forked children at
    the same time (``jit.fork_call``). Returns (library, packed object code, the LLVM IR text
    of the whole module as one module, ``jit.merge_modules``)."""
    from tensorfuse.codegen.llvm import jit
    target = jit._as_target(target)

    def part(i, kernels):
        text = emit(kernels, entry=i == 0, progress=i == 0)     # the children draw nothing
        obj, _ = jit._compile_part(text, f"{name}.part{i}", 3, target)
        return obj, text

    from tensorfuse import progress
    handles = [jit.fork_call(lambda i=i, g=g: part(i, g), f"{name}.part{i}") for i, g in enumerate(groups) if i]
    progress.stage(f"LLVM IR and machine code in {len(groups)} processes")
    try:
        first = part(0, groups[0])
        progress.advance(len(groups[0]))       # its kernels' machine code (part() counted their IR)
    finally:
        rest = []
        for h, g in zip(handles, groups[1:]):
            rest.append(jit.fork_result(h))
            progress.advance(2 * len(g))       # a child's part: its IR and its machine code
    objs = [first[0]] + [r[0] for r in rest] + [jit.team_runtime_object(target)]
    obj = jit.pack_objects(objs)
    lib = jit.load_object(obj)
    lib.target_info = jit.target_info(target)
    jit.STATS["codegen_calls"] += 1
    return lib, obj, jit.merge_modules([first[1]] + [r[1] for r in rest])


class LLVMBackend(Backend):
    """CPUs through LLVM (target kind ``"llvm"``); modules are ``runtime.module.Module``."""

    name = "llvm"
    schedules_module = "tensorfuse.codegen.llvm.schedules"
    code_member = "code.o"

    def target_key(self, target) -> dict:
        """``{"target", "triple", "cpu", "features", "l1d_bytes", "l2_bytes"}`` of ``target``
        (an ``ir.target.Target``): what the code is generated and blocked for."""
        return {"target": str(target), "triple": target.triple, "cpu": target.cpu, "features": target.features,
                "l1d_bytes": target.l1d_bytes, "l2_bytes": target.l2_bytes}

    def schedule_kernel(self, kernel, target):
        """The generic schedule (``Backend.schedule_kernel``), then, for a kernel of the
        generic lowering (its node used no named schedule, ``ir.knobs.schedules_in_use``), its
        serial loops collapsed where they walk contiguous ranges (``ir.schedule.collapse_loops``):
        LLVM vectorises one long loop instead of unrolling a nest of short ones around a
        vectorised innermost loop, each copy with its own aliasing checks."""
        from tensorfuse.ir.knobs import schedules_in_use
        from tensorfuse.ir.schedule import collapse_loops
        super().schedule_kernel(kernel, target)
        if not schedules_in_use():
            collapse_loops(kernel)
        return kernel

    def build(self, lowered, graph, input_names, output_names, target, *, log=None):
        """Emit every kernel and the ``tf_run`` entry as one LLVM module, compile and link it;
        (the :class:`~runtime.module.Module`, the LLVM IR text). Raises CompileError when LLVM
        code generation fails."""
        from llvmlite import ir as lir

        from tensorfuse.codegen.llvm.emit import PTR, emit_entry, emit_kernel, kernel_is_parallel
        from tensorfuse.codegen.llvm.jit import _as_target, compile_ir, compile_jobs, module_name, team_runtime_object
        from tensorfuse.ir.errors import CompileError
        from tensorfuse import progress as bar
        from tensorfuse.runtime.module import Module

        calls = [(c.kernel, c.slots) for c in lowered.calls]
        parallel = {k.name: kernel_is_parallel(k) for k in lowered.kernels}
        avx512 = bool(_as_target(target or "llvm").has_avx512)      # exp's VSCALEFPS (vmath)

        def emit(kernels, progress=False, entry=True) -> str:
            mod = lir.Module(name=module_name(graph.name))
            for k in kernels:
                emit_kernel(mod, k, avx512)
                if progress:
                    bar.advance()
            if entry:
                for k in lowered.kernels:       # the entry calls kernels other parts define
                    if k.name not in mod.globals:
                        lir.Function(mod, lir.FunctionType(lir.VoidType(), [PTR, PTR]), name=k.name)
                emit_entry(mod, "tf_run", calls, parallel, team_helpers=False)     # linked in: team_runtime_object
            return str(mod)     # printing a large module takes seconds: once

        groups = kernel_groups(lowered.kernels, compile_jobs())
        bar.expect(2 * len(lowered.kernels))     # each kernel's LLVM IR, then its machine code
        try:
            if len(groups) == 1:
                bar.stage("LLVM IR")
                ir_text = emit(lowered.kernels, progress=True)
                bar.stage("LLVM: optimising, machine code")
                lib, obj, _opt_ir = compile_ir(ir_text, graph.name, target=target,
                                               extra_objects=[team_runtime_object(target)])
                bar.advance(len(lowered.kernels))
            else:
                lib, obj, ir_text = _build_in_parts(groups, emit, graph.name, target)
        except CompileError:
            raise
        except Exception as e:
            raise CompileError(f"LLVM code generation failed: {e}") from e
        module = Module(program_of(lowered, log), lib, "tf_run", input_names, output_names,
                        target=str(target) if target is not None else "llvm", object_code=obj,
                        cannot_run=cannot_run_reason(getattr(lib, "target_info", None)))
        return module, ir_text

    def artifact_code(self, module) -> tuple[bytes, dict]:
        """The object code and ``{"target", "host", "entry"}``; ArtifactError without object code."""
        from tensorfuse.runtime.artifact import ArtifactError
        code = module._object_code
        if not code:
            raise ArtifactError("this module has no object code")
        info = module._host or getattr(module._lib, "target_info", None)
        if info is None:
            from tensorfuse.codegen.llvm.jit import target_info
            info = target_info(None)
        info = dict(info)
        return bytes(code), {"target": info.get("target") or module.target, "host": info,
                             "entry": module._entry_name}

    def check_compatible(self, meta: dict, path: str = "the file") -> None:
        """The triple is this machine's and this CPU has every feature the code needs (the
        message names the missing ones); ArtifactError otherwise (CPUFeaturesArtifactError for
        missing features)."""
        from tensorfuse.runtime.artifact import ArtifactError, CPUFeaturesArtifactError
        saved, host = meta.get("host") or {}, host_info()
        if saved.get("triple") != host["triple"]:
            raise ArtifactError(f"{path} holds machine code for {saved.get('triple')}, this machine is {host['triple']}")
        lacking = lacking_features(saved)
        if lacking:
            target = saved.get("target") or meta.get("target") or "llvm"
            raise CPUFeaturesArtifactError(
                f"{path}: this module was compiled for {saved.get('cpu')} (target {target!r}) and "
                f"needs {', '.join(lacking)}; this CPU ({host['cpu']}) lacks "
                f"{'them' if len(lacking) > 1 else 'it'}: recompile it here",
                cannot_run=cannot_run_reason(dict(saved, target=target)))

    def load(self, meta, blob, program, plan, input_names, output_names, path="the file"):
        """Link the object code into this process (no LLVM code generation): a
        :class:`~runtime.module.Module`. ArtifactError when it cannot be linked."""
        from tensorfuse.codegen.llvm.jit import load_object
        from tensorfuse.runtime.artifact import ArtifactError
        from tensorfuse.runtime.module import Module
        try:
            entry, target, host = meta["entry"], meta["target"], meta["host"]
        except KeyError as e:
            raise ArtifactError(f"{path} is corrupt: its metadata is incomplete (KeyError: {e})") from None
        try:
            lib = load_object(blob)
        except Exception as e:
            raise ArtifactError(f"{path}: its object code cannot be linked into this process ({e})") from None
        return Module(program, lib, entry, input_names, output_names, target=target, plan=plan, object_code=blob,
                      host=host)
