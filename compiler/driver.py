"""``compile()``: frontend -> passes -> lowering -> codegen -> runtime.Module."""
from __future__ import annotations

from typing import Any

from llvmlite import ir as lir

from tensorfuse.compiler.errors import CompileError
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.compiler.lower import lower_graph
from tensorfuse.compiler.target import Target


def compile(model: Any, target: str = "llvm", opt_level: int = 2, *,
            input_shapes: dict[str, Any] | None = None, disabled_rules=(), dump_ir=None,
            cache: bool = True, num_threads: int | None = None, max_memory: int | str | None = None):
    """Compile an ONNX model into an executable :class:`runtime.Module`.

    model: a path, bytes or ``onnx.ModelProto``. target: "llvm" (host CPU). opt_level: 0..3
    (DESIGN.md "Optimisation levels"). input_shapes: {input name: shape} for inputs with
    dynamic dimensions. disabled_rules: names of rewrite rules to switch off. dump_ir: a
    folder for the graph after each pass that changed it, the rule log, and each kernel's IR
    and the LLVM IR (``compiler.pipeline``). The module's ``graph`` is the optimised graph IR,
    ``rewrite_log`` the rule applications. cache: look the module up in (and store it into) the compile cache
    (``runtime.cache``; keyed by model content, target, every other option and the version).
    num_threads: threads that run the parallel loops of each kernel (default:
    ``$TENSORFUSE_NUM_THREADS``, else the cores this process may use, ``os.sched_getaffinity``);
    ``Module.num_threads`` changes it after compiling. Raises ValueError if it is not >= 1.
    max_memory: the memory cap, bytes or a string like ``"64G"`` (default
    ``$TENSORFUSE_MAX_MEMORY``, else the physical memory; ``compiler.limits``): a model with a
    graph input or node output larger than it is refused with UnsupportedModelError naming the
    node and shape, instead of failing when it runs.

    Raises ModelLoadError (not a valid ONNX model), UnsupportedModelError (unsupported ops, all
    listed with node names; dynamic shapes), CompileError (an internal failure, naming the pass
    or node).

    When shapes depend on the values of graph inputs (Reshape's shape, reduction axes ... given
    as inputs), the result is a ``compiler.specialize.SpecializingModule`` that compiles at its
    first run for those inputs' values (see that module).
    """
    # every option but these is part of the compile cache's key: keep this line first
    # (the thread count is a run-time setting of the module: the code does not depend on it)
    options = {k: v for k, v in locals().items() if k not in ("model", "target", "cache", "num_threads")}
    from tensorfuse.compiler.limits import resolve_max_memory
    options["max_memory"] = max_memory = resolve_max_memory(max_memory)   # the resolved cap is in the key
    tgt = Target.parse(target)
    from tensorfuse.runtime.threads import resolve_num_threads
    num_threads = resolve_num_threads(num_threads)
    if tgt.kind != "llvm":
        raise CompileError(f"target {tgt.kind!r} is not available yet")
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
    from tensorfuse.compiler.specialize import InputValuesNeeded, specialize
    if cache:
        from tensorfuse.runtime.cache import cached_compile
        try:    # cache=None: the inner call leaves specialising to this one
            m = cached_compile(model, str(tgt), options, lambda: compile(model, target, cache=None, **options))
            m.num_threads = num_threads
            return m
        except InputValuesNeeded as e:
            return specialize(e, model, target, {**options, "num_threads": num_threads})
    try:
        graph = import_onnx(model, input_shapes=input_shapes, max_memory=max_memory)
    except InputValuesNeeded as e:
        if cache is None:
            raise
        return specialize(e, model, target, {**options, "num_threads": num_threads})
    output_names = list(graph.output_names or [v.name for v in graph.outputs])
    input_names = [v.name for v in graph.inputs]
    from tensorfuse.compiler.pipeline import dump_kernels, optimize
    opt = optimize(graph, opt_level, disabled_rules=disabled_rules, dump_ir=dump_ir)
    lowered = lower_graph(graph, tgt)
    m = build_module(lowered, graph, input_names, output_names, tgt)
    m.num_threads = num_threads
    m.rewrite_log, m.pass_records = opt.log, opt.passes
    if dump_ir is not None:
        dump_kernels(dump_ir, m)
    return m


def _structural_key(kernel) -> str:
    """The kernel's text with its own name and buffer names replaced by positional ones: two
    kernels with the same key compute the same function of their arguments."""
    bufs = list(kernel.params) + list(kernel.locals)
    saved = (kernel.name, [b.name for b in bufs])
    try:
        kernel.name = "k"
        for i, b in enumerate(kernel.params):
            b.name = f"p{i}"
        for i, b in enumerate(kernel.locals):
            b.name = f"l{i}"
        kernel.comment, comment = "", kernel.comment
        return str(kernel)
    finally:
        kernel.comment = comment
        kernel.name = saved[0]
        for b, n in zip(bufs, saved[1]):
            b.name = n


def dedupe_kernels(lowered) -> int:
    """Emit one function per distinct kernel (repeated layers share code): calls of a duplicate
    are pointed at the first kernel of its kind. Returns the number of kernels dropped."""
    first: dict[str, str] = {}
    rename: dict[str, str] = {}
    kept = []
    for k in lowered.kernels:
        key = _structural_key(k)
        if key in first:
            rename[k.name] = first[key]
        else:
            first[key] = k.name
            kept.append(k)
    for c in lowered.calls:
        c.kernel = rename.get(c.kernel, c.kernel)
    dropped = len(lowered.kernels) - len(kept)
    lowered.kernels = kept
    return dropped


def build_module(lowered, graph, input_names, output_names, target=None):
    from tensorfuse.codegen.llvm.emit import emit_entry, emit_kernel, kernel_is_parallel
    from tensorfuse.codegen.llvm.jit import compile_ir
    from tensorfuse.runtime.module import Module

    dedupe_kernels(lowered)
    mod = lir.Module(name=graph.name)
    for k in lowered.kernels:
        emit_kernel(mod, k)
    emit_entry(mod, "tf_run", [(c.kernel, c.slots) for c in lowered.calls],
               {k.name: kernel_is_parallel(k) for k in lowered.kernels})
    try:
        lib, obj, opt_ir = compile_ir(str(mod), graph.name, target=target)
    except Exception as e:
        raise CompileError(f"LLVM code generation failed: {e}") from e
    m = Module(lowered, lib, "tf_run", input_names, output_names, graph=graph, llvm_ir=str(mod),
               target=str(target) if target is not None else "llvm")
    m._object_code = obj
    return m
