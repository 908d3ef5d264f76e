"""LLVM IR -> machine code for a CPU target (llvmlite 0.45+: new pass builder, opaque pointers).

A target machine is made from a target's triple, CPU name and feature string
(``ir.target.Target``; ``None`` is this machine: host triple, CPU name and features).
``compile_ir`` parses and verifies the module text, optimises it (O3 by default) for the target
and returns a :class:`NativeLibrary` holding an MCJIT engine and function addresses.
``STATS["codegen_calls"]`` counts code generations, so tests can assert that loading a saved
artifact generated no code.

What LLVM knows about this CPU and others (:func:`host_info`, :func:`isa_feature_names`,
:func:`query_target`, asked of LLVM in a child process) lives in ``ir.cpu``, beside the
``Target`` that validates its options with it; the names are kept here too.
"""
from __future__ import annotations

import functools
import os
import re
import sys

import llvmlite.binding as llvm

from tensorfuse.ir import cpu as _cpu
from tensorfuse.ir.cpu import isa_feature_names, query_target  # noqa: F401  (their home is ir.cpu)

STATS = {"codegen_calls": 0}


class LLVMError(RuntimeError):
    """LLVM rejected the generated IR: a tensorfuse bug; the message names the module."""


def module_name(name) -> str:
    """``name`` (a graph's name: any text, ONNX does not restrict it) as an LLVM module name:
    printable ASCII, with every other character, a double quote or a backslash written as
    Python's ``ascii()`` escapes it (``new\\nline``), "module" when empty. llvmlite prints the
    name unescaped in the ``; ModuleID = "..."`` comment of the IR text, where a newline ends the
    comment (LLVM then rejected the module: issue 24 item 9, a graph named ``new\\nline``) and a
    NUL ends the C string LLVM parses (the module came back empty: "symbol tf_run not found")."""
    s = ascii(str(name))[1:-1].replace('"', "\\x22")
    return s or "module"


def _init() -> None:
    _cpu.init_native()


def host_info() -> dict:
    """Triple, CPU name and feature string (``"+avx2,-avx512f,..."``, every feature LLVM's host
    detection knows, sorted) of this machine: ``ir.cpu.host_info``, looked up at each call (tests
    that pretend to be another CPU replace it there)."""
    return _cpu.host_info()


#: x86 features whose instructions LLVM emits only for their intrinsics (system, security and
#: cache-control instructions), which tensorfuse's code never calls: code compiled with them
#: on does not need them (virtual machines often hide some, e.g. mwaitx and rdpru on Zen).
SYSTEM_ONLY_FEATURES = frozenset({
    "cldemote", "clflushopt", "clwb", "clzero", "enqcmd", "fsgsbase", "hreset", "invpcid", "kl", "lwp",
    "movdir64b", "movdiri", "mwaitx", "pconfig", "pku", "prefetchi", "ptwrite", "raoint", "rdpid", "rdpru",
    "rdrnd", "rdseed", "rtm", "serialize", "sgx", "shstk", "tsxldtrk", "uintr", "usermsr", "waitpkg",
    "wbnoinvd", "widekl", "xsave", "xsavec", "xsaveopt", "xsaves"})


def target_info(target=None) -> dict:
    """What code compiled for ``target`` (None: this machine) was generated for, as saved
    artifacts record it: target string, triple, CPU name, feature string, and ``needs``, the
    sorted names of the enabled features the code may use: those this machine's feature
    detection knows (instruction sets, not tuning flags) but :data:`SYSTEM_ONLY_FEATURES`."""
    target = _as_target(target)
    if target is None:
        info = dict(host_info(), target="llvm")
    else:
        info = {"target": str(target), "triple": target.triple, "cpu": target.cpu, "features": target.features}
    known = set(isa_feature_names()) - SYSTEM_ONLY_FEATURES
    info["needs"] = sorted(f[1:] for f in info["features"].split(",") if f.startswith("+") and f[1:] in known)
    return info


# ----------------------------------------------------------------------------- target machines
@functools.lru_cache(maxsize=None)
def target_machine(target=None, opt: int = 3):
    """The target machine for ``target`` (an ``ir.target.Target``: its triple, CPU name and
    feature string; None: this machine), cached for optimisation and object emission. An
    execution engine takes ownership of its target machine, so engines get a fresh one from
    :func:`_new_target_machine`."""
    return _new_target_machine(opt, target)


def _new_target_machine(opt: int = 3, target=None):
    _init()
    target = _as_target(target)
    if target is None:
        info = host_info()
        triple, cpu, features = info["triple"], info["cpu"], info["features"]
    else:
        triple, cpu, features = target.triple, target.cpu, target.features
    # static relocations and the large code model: every address is an absolute 64-bit one that
    # MCJIT fills in when it links, with no GOT and no +-2 GiB reach. Code split into several
    # objects (compile_ir's jobs) read wrong constants with the PIC/GOT relocations MCJIT gave
    # the large model (mobilenet_v2's output changed), and the small model would overflow
    # silently once sections land far apart
    return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=opt,
                                                                 reloc="static", codemodel="large")


def optimize(mod, opt: int = 3, target=None):
    """Run LLVM's optimisation pipeline on ``mod`` for ``target``; returns the module to
    generate code from: ``mod`` itself, or a re-parsed copy in which the constant-mask masked
    loads were scalarised (:func:`scalarize_constant_masked_loads`)."""
    tm = target_machine(target, opt)
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = opt >= 2
    pto.slp_vectorization = opt >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    text = str(mod)
    if "@llvm.masked.load." not in text:
        return mod
    fixed = scalarize_constant_masked_loads(text)
    if fixed == text:
        return mod
    return parse_and_verify(fixed, mod.name)


# `%v = [tail] call <N x T> @llvm.masked.load.*(ptr [align A] %p, <N x i1> <i1 true, ...>, <N x T> pass)`
_MASKED_LOAD = re.compile(
    r"^(?P<indent>\s*)(?P<res>%[-\w.$]+|%\d+) = (?:tail |notail |musttail )?call (?:[\w ]+ )?"
    r"<(?P<n>\d+) x (?P<ty>[\w]+)> @llvm\.masked\.load\.[\w.]+\("
    r"ptr (?:[\w]+ )*?(?:align (?P<align>\d+) )?(?P<ptr>%[-\w.$]+|%\d+), "
    r"<\d+ x i1> <(?P<mask>(?:i1 (?:true|false)(?:, )?)+)>, "
    r"<\d+ x [\w]+> (?P<pass>[^)]+)\)(?P<rest>.*)$")

_ELEM_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat": 2, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "ptr": 8}


def scalarize_constant_masked_loads(text: str) -> str:
    """Replace each ``llvm.masked.load`` with a constant mask in optimised LLVM IR text by one
    scalar load per enabled lane and ``insertelement`` into the pass-through value.

    LLVM's SLP vectoriser (LLVM 21+, "masked load + compress") turns scalar loads with gaps
    between them (an unrolled strided or clipped loop, as ConvTranspose's kernels have) into a
    masked load of an odd width (``<11 x float>``) with a constant mask. On AVX-512 targets
    LLVM's instruction selection cannot always lower what the X86 DAG combiner makes of it and
    aborts the process (``LLVM ERROR: Cannot select: ... zero_extend_vector_inreg ...
    masked_load v16f32``, issue 9 defect 2). Loading the enabled lanes one by one reads the
    same memory (no lane the mask disables is read) and gives the same value; masked loads
    whose mask is computed at run time (the loop vectoriser's) are kept."""
    out, count = [], 0
    for line in text.split("\n"):
        m = _MASKED_LOAD.match(line) if "@llvm.masked.load." in line else None
        if m is None or m["ty"] not in _ELEM_BYTES:
            out.append(line)
            continue
        n, ty, ptr, ind = int(m["n"]), m["ty"], m["ptr"], m["indent"]
        lanes = [w == "true" for w in re.findall(r"true|false", m["mask"])]
        if len(lanes) != n:
            out.append(line)
            continue
        align = int(m["align"] or _ELEM_BYTES[ty])
        vec, acc, tag = f"<{n} x {ty}>", m["pass"].strip(), f"%tf.mload{count}"
        count += 1
        enabled = [i for i in range(n) if lanes[i]]
        if not enabled:
            out.append(f"{ind}{m['res']} = shufflevector {vec} {acc}, {vec} poison, "
                       f"<{n} x i32> <{', '.join(f'i32 {i}' for i in range(n))}>")
            continue
        for j, i in enumerate(enabled):
            a = align if i == 0 else min(align, _ELEM_BYTES[ty])
            out.append(f"{ind}{tag}.p{i} = getelementptr inbounds {ty}, ptr {ptr}, i64 {i}")
            out.append(f"{ind}{tag}.l{i} = load {ty}, ptr {tag}.p{i}, align {a}")
            res = m["res"] if j == len(enabled) - 1 else f"{tag}.v{i}"
            out.append(f"{ind}{res} = insertelement {vec} {acc}, {ty} {tag}.l{i}, i64 {i}")
            acc = res
    return "\n".join(out)


class NativeLibrary:
    """Machine code loaded in this process; keeps the engine alive while addresses are used.
    ``target_info``: what the code was generated for (:func:`target_info`), None when unknown."""

    def __init__(self, engine, mod=None, target_info: dict | None = None):
        self._engine = engine
        self._mod = mod
        self.target_info = target_info

    def address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise LLVMError(f"symbol {name} not found in compiled module")
        return addr


def parse_and_verify(ir_text: str, name: str = "module"):
    _init()
    name = module_name(name)
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.name = name
        mod.verify()
    except RuntimeError as e:
        raise LLVMError(f"LLVM rejected the IR of {name}: {e}") from None
    return mod


def _compile_part(ir_text: str, name: str, opt: int, target) -> tuple[bytes, str]:
    """(object code, optimised IR text) of one module's text."""
    mod = optimize(parse_and_verify(ir_text, name), opt, target)
    return target_machine(target, opt).emit_object(mod), str(mod)


def compile_ir(ir_text: str, name: str = "module", opt: int = 3, target=None, extra_objects=()):
    """Compile LLVM IR text for ``target`` (an ``ir.target.Target``; None: this machine);
    returns (NativeLibrary, object_code bytes, optimized IR text). The library's
    ``target_info`` records the target, CPU and features the code was generated for.
    ``extra_objects``: object files linked with it and packed into the returned object code
    (:func:`pack_objects`), e.g. :func:`team_runtime_object`. LLVMError when LLVM rejects the
    IR. (A large module's kernels are emitted and compiled in forked children by
    ``codegen.llvm.backend``; see :func:`fork_call`.)"""
    STATS["codegen_calls"] += 1
    target = _as_target(target)
    obj, opt_text = _compile_part(ir_text, name, opt, target)
    if extra_objects:
        obj = pack_objects([obj, *extra_objects])
    lib = load_object(obj)
    lib.target_info = target_info(target)
    return lib, obj, opt_text


_TEAM_OBJECTS: dict[str, bytes] = {}


def team_runtime_object(target=None) -> bytes:
    """The object code of the thread team's native helpers (``codegen.llvm.emit.TEAM_HELPERS``,
    ``emit_team_helpers``) for ``target``: generated once per target and process, and linked
    into every module's object code, instead of optimised and compiled again with each module's
    kernels (about 20 ms of every compile). Every module still carries its own copy, so a saved
    module runs with the helpers it was compiled with."""
    import json

    target = _as_target(target)
    key = json.dumps(target_info(target), sort_keys=True, default=str)
    obj = _TEAM_OBJECTS.get(key)
    if obj is None:
        from llvmlite import ir

        from tensorfuse.codegen.llvm.emit import emit_team_helpers
        mod = ir.Module(name="tf_team")
        emit_team_helpers(mod)
        obj, _ = _compile_part(str(mod), "tf_team", 3, target)
        _TEAM_OBJECTS[key] = obj
    return obj


# ----------------------------------------------------------------------------- parallel codegen
_MULTI_MAGIC = b"TFOBJS1\0"


def compile_jobs() -> int:
    """How many processes a module's code generation may use: ``$TENSORFUSE_COMPILE_JOBS`` if
    set (1: never split), else the CPUs this process may run on (at most 8)."""
    env = os.environ.get("TENSORFUSE_COMPILE_JOBS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"TENSORFUSE_COMPILE_JOBS must be a whole number, got {env!r}") from None
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform != "win32"


_DEFINE = re.compile(r'^define (?P<mods>[^@]*)@(?P<name>"[^"]*"|[-\w.$]+)')


def _chunks(ir_text: str):
    """The top-level pieces of LLVM IR text as llvmlite prints a module, in order: ("define",
    name, is_local, lines) for a function (``define ...`` to the ``}`` line at column 0),
    ("declare", name, None, [line]), ("global", name, is_local, [line]) for ``@name = ...``,
    ("line", None, None, [line]) for anything else (header, blank lines)."""
    lines = ir_text.split("\n")
    i, n = 0, len(lines)
    while i < n:
        ln = lines[i]
        m = _DEFINE.match(ln)
        if m:
            j = i
            while j < n and lines[j] != "}":
                j += 1
            mods = m.group("mods").split()
            yield "define", m.group("name"), ("internal" in mods or "private" in mods), lines[i:j + 1]
            i = j + 1
            continue
        d = _DECLARE.match(ln)
        if d:
            yield "declare", d.group("name"), None, [ln]
        elif ln.startswith("@"):
            g = re.match(r'^@("[^"]*"|[-\w.$]+) = (private |internal )?', ln)
            yield "global", g.group(1) if g else ln, bool(g and g.group(2)), [ln]
        else:
            yield "line", None, None, [ln]
        i += 1


_DECLARE = re.compile(r'^declare [^@]*@(?P<name>"[^"]*"|[-\w.$]+)')


_MD_DEFINITION = re.compile(r"^!(\d+) = ")
#: a numbered metadata node attached to an instruction: ``, !llvm.loop !3``
_MD_ATTACHMENT = re.compile(r"(, ![A-Za-z_][-\w.]* )!(\d+)")


def _renumber_metadata(text: str, base: int) -> tuple[str, int]:
    """``text`` (LLVM IR as llvmlite prints it) with each numbered metadata node ``!N`` (its
    definition, the nodes it refers to, the instructions it is attached to) renumbered
    ``!(base + N)``; and the first number above them. Strings (``!"..."``, ``c"..."``) are
    left alone."""
    top = base

    def node(m) -> str:
        return f"!{base + int(m.group(1))}"

    out = []
    for line in text.split("\n"):
        d = _MD_DEFINITION.match(line)
        if d:
            top = max(top, base + int(d.group(1)) + 1)
            pieces = line.split('"')         # the even pieces lie outside strings
            line = '"'.join(re.sub(r"!(\d+)", node, p) if i % 2 == 0 else p for i, p in enumerate(pieces))
        elif ", !" in line:
            line = _MD_ATTACHMENT.sub(lambda m: m.group(1) + f"!{base + int(m.group(2))}", line)
        out.append(line)
    return "\n".join(out), top


def merge_modules(texts: list[str]) -> str:
    """Module texts that define disjoint sets of external functions (the parts of one module)
    as the text of one module: the first text's header, each external function's definition,
    each internal/private function, global and declaration once (a declaration only where no
    part defines the function), in the order they first appear; each part's numbered metadata
    (loop IDs) renumbered after the earlier parts' (:func:`_renumber_metadata`)."""
    if len(texts) == 1:
        return texts[0]
    renumbered, base = [], 0
    for t in texts:
        t, base = _renumber_metadata(t, base)
        renumbered.append(t)
    chunks = [list(_chunks(t)) for t in renumbered]
    defined = {name for cs in chunks for kind, name, local, _ in cs if kind == "define" and not local}
    out, seen = [], set()
    for i, cs in enumerate(chunks):
        for kind, name, local, block in cs:
            if kind == "line":
                if i == 0 or block[0].strip() and not block[0].startswith(("; ModuleID", "target ")):
                    out.extend(block)
                continue
            if kind == "declare" and name in defined:
                continue
            key = (kind == "define" and not local, name)
            if key in seen:
                continue
            seen.add(key)
            out.extend(block + [""])
    return "\n".join(out)


def pack_objects(objs: list[bytes]) -> bytes:
    """Several object files as one blob (what ``compile_ir`` returns and artifacts store): one
    object as itself, several as a magic, a count and (length, bytes) records."""
    if len(objs) == 1:
        return objs[0]
    out = [_MULTI_MAGIC, len(objs).to_bytes(4, "little")]
    for o in objs:
        out += [len(o).to_bytes(8, "little"), o]
    return b"".join(out)


def unpack_objects(blob: bytes) -> list[bytes]:
    """The object files of a :func:`pack_objects` blob; ValueError when it is cut short."""
    if not blob.startswith(_MULTI_MAGIC):
        return [blob]
    pos = len(_MULTI_MAGIC)
    count = int.from_bytes(blob[pos:pos + 4], "little")
    pos += 4
    objs = []
    for _ in range(count):
        size = int.from_bytes(blob[pos:pos + 8], "little")
        pos += 8
        if size <= 0 or pos + size > len(blob):
            raise ValueError("object code blob is truncated")
        objs.append(blob[pos:pos + size])
        pos += size
    return objs


def fork_call(fn, name: str):
    """Run ``fn()`` in a forked child (it sees this process's memory as it is now, so ``fn``
    may close over kernels and modules); a handle for :func:`fork_result`. The child writes
    its pickled result, or an error message, to a pipe and leaves without cleanup. llvmlite's
    lock is held across the fork, so no other thread is inside LLVM in the child's copy."""
    import pickle
    rfd, wfd = os.pipe()
    lock = getattr(getattr(llvm, "ffi", None), "lib", None)
    lock = getattr(lock, "_lock", None)
    if lock is not None:
        lock.__enter__()
    try:
        pid = os.fork()
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)     # the child releases its copy too
    if pid == 0:
        code = 1
        try:
            os.close(rfd)
            import faulthandler
            faulthandler.disable()      # LLVM says why it aborts; the parent names the signal
            try:
                data = pickle.dumps((True, fn()))
                code = 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                data = pickle.dumps((False, f"{type(e).__name__}: {e}"))
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view):]
        finally:
            os._exit(code)
    os.close(wfd)
    return pid, rfd, name


def fork_result(handle):
    """What the :func:`fork_call` child's ``fn()`` returned; LLVMError naming the part when it
    raised, CompileError when the child died (a signal: an LLVM abort)."""
    import pickle
    pid, rfd, name = handle
    chunks = []
    with os.fdopen(rfd, "rb") as f:
        while True:
            c = f.read(1 << 20)
            if not c:
                break
            chunks.append(c)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if os.WIFSIGNALED(status) or not data:
        from tensorfuse.ir.errors import CompileError
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        raise CompileError(f"LLVM code generation of {name} died in a child process ({how})")
    ok, value = pickle.loads(data)
    if not ok:
        raise LLVMError(f"LLVM code generation of {name} failed: {value}")
    return value




def emit_assembly(ir_text: str, name: str = "module", opt: int = 3, target=None) -> str:
    """The assembly ``compile_ir`` would generate for this IR and target (for inspecting which
    instructions and registers the code uses); generates no loadable code."""
    target = _as_target(target)
    mod = optimize(parse_and_verify(ir_text, name), opt, target)
    return target_machine(target, opt).emit_assembly(mod)


def _as_target(target):
    """None (this machine) or a Target; a target string is parsed (``ir.target``)."""
    if isinstance(target, str):
        from tensorfuse.ir.target import Target
        return Target.parse(target)
    return target


def load_object(obj: bytes) -> NativeLibrary:
    """Link previously emitted object code into this process without generating code."""
    tm = _new_target_machine(3)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    for o in unpack_objects(obj):       # several objects (parallel codegen) link as one
        engine.add_object_file(llvm.ObjectFileRef.from_data(o))
    engine.finalize_object()
    return NativeLibrary(engine)
