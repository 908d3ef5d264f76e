"""``compile()``: frontend -> passes -> lowering -> codegen -> runtime.Module, through the compile cache.

One path: the options become a :class:`~compiler.options.CompileOptions`, the driver looks the
module up in the compile cache (``runtime.cache``, key from ``compiler.options.cache_key``) and
on a miss builds it and stores it with its compile report (``compiler.report``).
"""
from __future__ import annotations

import os
import warnings
from typing import Any

from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.compiler.lower import lower_graph
from tensorfuse.compiler.options import CompileOptions, cache_key
from tensorfuse.compiler.report import CompileReport
from tensorfuse.ir.target import Target


def compile(model: Any, target: str = "llvm", opt_level: int = 2, *,
            input_shapes: dict[str, Any] | None = None, disabled_rules=(), dump_ir=None,
            cache: bool = True, num_threads: int | None = None, max_memory: int | str | None = None,
            rules=(), tuning=None, precision: str | None = None):
    """Compile an ONNX model into an executable module: a :class:`tensorfuse.runtime.Module`
    for "llvm", a :class:`tensorfuse.runtime.cuda_module.CudaModule` for "cuda" (both
    :class:`~tensorfuse.runtime.module.ModuleBase`), or, for a model whose shapes depend on
    the values of some inputs, a :class:`~tensorfuse.compiler.specialize.SpecializingModule`
    that compiles per value at its first run (``module_for`` gives the compiled module).

    model: a path, bytes or ``onnx.ModelProto``. target: "llvm" (the host CPU; ``-mcpu=`` and
    ``-mattr=`` choose another, see ``ir.target``) or "cuda" (an NVIDIA GPU through
    numba.cuda, NHWC inside; numba's CUDA simulator with ``NUMBA_ENABLE_CUDASIM=1``). opt_level: 0..3 (docs/architecture.md "Optimisation levels":
    0 imports and lowers only, 1 adds constant folding, dead code and common subexpression
    elimination and the simplify rules, 2 adds the fold and fuse rule sets and fuse_ops, 3 adds
    rules that change numerics within rounding). input_shapes: {input name: shape} for inputs
    with dynamic dimensions. disabled_rules: a rule name or a list of rule names to switch off
    (``compiler.pipeline.all_rules()`` lists them; "fuse_ops" switches that pass off).
    dump_ir: a folder for the graph after each pass that changed it, the rule log, and each
    kernel's IR and the LLVM IR (``compiler.pipeline``). cache: look the module up in (and
    store it into) the compile cache (``runtime.cache``; keyed by model content, target, every
    other option and the version). num_threads: threads that run the parallel loops of each
    kernel (default: ``$TENSORFUSE_NUM_THREADS``, else the cores this process may use,
    ``os.sched_getaffinity``); ``Module.num_threads`` changes it after compiling. max_memory:
    the memory cap, bytes or a string like ``"64G"`` (default ``$TENSORFUSE_MAX_MEMORY``, else
    the physical memory; ``compiler.limits``): a model with a graph input or node output larger
    than it is refused with UnsupportedModelError naming the node and shape, instead of failing
    when it runs. rules: rules under test, Rule classes (or instances) that are not in the
    catalogue (docs/writing-a-fusion-rule.md): each joins the rule set its ``rule_set``
    attribute names ("simplify", "fold", "fuse" or "o3"; default "fuse") and is tried *before*
    that set's built-in rules, in the order given, so it can claim nodes a built-in rule would
    rewrite; their applications are in ``rewrite_log`` and ``disabled_rules`` may name them.
    The cache key includes them (names and source code). tuning: tuning records
    (``compiler.tuning``; written by ``tensorfuse tune``): a JSON-lines file path, a list of
    paths or records, or a ``TuningRecords``. Each workload with a usable record (status "ok",
    measured on this target's CPU and features by this tensorfuse version) lowers with the
    knobs of its fastest one (preferring records measured at the module's thread count); the
    others keep their default schedules. The cache key includes the chosen records' digest;
    ``report.tuned`` lists the workloads that used one.

    The module's ``report`` (``compiler.report.CompileReport``) says what the compiler did:
    ``graph`` (the optimised graph IR), ``kernels``, ``llvm_ir``, ``rewrite_log`` (the rule
    applications), ``passes`` and each kernel call's ONNX nodes; the Module's attributes of the
    same names read it. A cache hit (``Module.cache_hit``) serves the report stored with the
    entry: no recompile (see ``compiler.report`` for what the first ``graph`` and ``kernels``
    access costs).

    Raises ModelLoadError (not a valid ONNX model), UnsupportedModelError (unsupported ops, all
    listed with node names; dynamic shapes), CompileError (an internal failure, naming the pass
    or node; an unavailable target), ValueError (opt_level not 0..3, num_threads below 1, an
    unknown rule name, a rules= entry that is not a Rule or has a built-in rule's name),
    TypeError (disabled_rules, input_shapes or tuning of the wrong kind), FileNotFoundError /
    ValueError for a missing or corrupt tuning records file (naming the file and line).

    precision (target "cuda"): the GEMM/conv inner product's precision, "fp32" (the default:
    FMAs), "tf32" (tensor cores, ``mma.sync`` with TF32 operands and FP32 accumulation, sm_80+)
    or "auto" (PyTorch's convention: TF32 for convolutions, FP32 for MatMul/Gemm); tolerances in
    docs/cuda.md. For "llvm" only None or "fp32" (ValueError otherwise).
    When shapes depend on the values of graph inputs (Reshape's shape, reduction axes ... given
    as inputs), the result is a ``compiler.specialize.SpecializingModule`` that compiles at its
    first run for those inputs' values (see that module).
    """
    opts = CompileOptions.create(target, opt_level, input_shapes=input_shapes, disabled_rules=disabled_rules,
                                 dump_ir=dump_ir, cache=cache, num_threads=num_threads,
                                 max_memory=max_memory, rules=rules, tuning=tuning, precision=precision)
    return compile_with(model, opts)


def compile_with(model: Any, options: CompileOptions):
    """``compile`` with its options as one :class:`~compiler.options.CompileOptions` (the CLI
    builds them once); see :func:`compile`."""
    from tensorfuse.compiler.specialize import InputValuesNeeded, specialize
    from tensorfuse.runtime.threads import resolve_num_threads
    num_threads = resolve_num_threads(options.num_threads)
    from tensorfuse.codegen.cuda.mma import precision_scope
    try:
        with precision_scope(options.precision):
            m = _cached_build(model, options) if options.cache else _build(model, options)
    except InputValuesNeeded as e:
        return specialize(e, model, options.target, options.kwargs())
    m.num_threads = num_threads
    from tensorfuse.runtime.module import trim_heap
    trim_heap()         # the compiler's memory and the constants' originals back to the system
    return m


def _cached_build(model: Any, options: CompileOptions):
    """The module through the compile cache (``runtime.cache``): a hit loads the saved module
    and its stored compile report; a miss builds, then stores both. ``dump_ir`` compiles
    bypass it (the dumps must be written); so does an unwritable cache place."""
    from tensorfuse.runtime import cache as rc
    d = rc.cache_dir()
    if options.dump_ir is not None or not rc.usable(d):
        return _build(model, options)
    try:
        parts = cache_key(model, options)
    except Exception:       # unreadable path, not a model ...: the compiler says what is wrong
        return _build(model, options)
    is_path = isinstance(model, (str, os.PathLike))
    entry = rc.lookup(parts, d, external=is_path)
    if entry is not None:
        try:
            m = entry.module
            m.report = CompileReport.from_stored(entry.report, m, options,
                                                 _lowerer(options.target, options.tuning))
            m.layout_report = m.report.layout
            m.cache_hit = True
            return m
        except (KeyError, TypeError, ValueError) as e:      # a report this version cannot read
            warnings.warn(f"tensorfuse compile cache: dropped an entry whose compile report cannot be read "
                          f"and rebuilding it ({type(e).__name__}: {e})", rc.CacheWarning, stacklevel=3)
    m = _build(model, options)
    ext = {p: rc.file_digest(p) for p in rc.external_files(os.fspath(model))} if is_path else {}
    data, arrays = m.report.to_stored(m._consts)
    rc.store(parts, m, d, ext, report=data, arrays=arrays)
    m.cache_hit = False
    return m


def _lowerer(target: str, tuning=None):
    """The kernel IR of a graph as ``compile`` makes it (lowered with the same tuning records,
    duplicates dropped): what a cache-hit report's ``kernels`` is computed with."""
    def lower(graph):
        lowered = lower_graph(graph, Target.parse(target), tuning=tuning)
        dedupe_kernels(lowered)
        return lowered.kernels
    return lower


def _build(model: Any, options: CompileOptions):
    """:func:`_build_steps` inside a ``tensorfuse.progress`` task: with progress enabled (the
    command line on a terminal) one bar covers the compile, its stages named, its code
    generation counted per kernel and per part LLVM compiles (``codegen.llvm.backend``)."""
    from tensorfuse import progress
    name = os.path.basename(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else "model"
    with progress.task(f"compiling {name}"):
        return _build_steps(model, options)


def _build_steps(model: Any, options: CompileOptions):
    """Import, optimise, lower and generate code: the module with its compile report. Raises
    InputValuesNeeded when shapes need input values (``compile_with`` specialises)."""
    from tensorfuse import progress
    tgt = Target.parse(options.target)
    progress.stage("importing")
    graph = import_onnx(model, input_shapes=options.input_shapes_dict, max_memory=options.max_memory)
    output_names = list(graph.output_names or [v.name for v in graph.outputs])
    input_names = [v.name for v in graph.inputs]
    from tensorfuse.compiler.pipeline import dump_kernels, optimize
    progress.stage("optimising")
    opt = optimize(graph, options.opt_level, disabled_rules=options.disabled_rules, dump_ir=options.dump_ir,
                   target=tgt, rules=options.rules)
    progress.stage("lowering")
    lowered = lower_graph(graph, tgt, tuning=options.tuning)
    progress.stage("generating code")
    m = build_module(lowered, graph, input_names, output_names, tgt, options=options, log=opt.log,
                     passes=opt.passes)
    m.report.tuned, m.report.num_distinct_kernels = tuned_workloads(lowered), len(lowered.kernels)
    m.layout_report = m.report.layout = opt.layout_report
    if options.dump_ir is not None:
        dump_kernels(options.dump_ir, m)
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
        kernel.schedule, schedule = "", kernel.schedule    # two schedules may emit the same code
        return str(kernel)
    finally:
        kernel.comment = comment
        kernel.schedule = schedule
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


def tuned_workloads(lowered) -> list[dict]:
    """The workloads of a lowered graph (``LoweredGraph.workloads``; after
    :func:`dedupe_kernels`) that took their knobs from a tuning record, as JSON: ``workload``
    (key), ``summary``, ``schedule``, ``knobs`` (the values used), ``nodes`` (how many nodes
    have it) and ``kernels`` (its distinct kernels in the module)."""
    from tensorfuse.compiler.tuning import _json_value
    kept = {k.name for k in lowered.kernels}
    return [{"workload": wl.key, "summary": wl.summary, "schedule": wl.schedule,
             "knobs": {n: _json_value(v) for n, v in wl.knobs.items()}, "nodes": wl.count,
             "kernels": len([k for k in wl.kernels if k in kept])}
            for wl in lowered.workloads.values() if wl.tuned]


def build_module(lowered, graph, input_names, output_names, target=None, *, options: CompileOptions | None = None,
                 log: list | None = None, passes: list | None = None):
    """Generate code for a lowered graph with the target's backend (``codegen.base.get_backend``
    of ``target.kind``; the host CPU's LLVM backend when ``target`` is None): the module, with
    its compile report (``log`` and ``passes`` from the pipeline; each kernel call's ONNX nodes
    traced through ``log``; ``options`` default to ``target`` at O0 without the cache).
    Duplicate kernels are dropped first (:func:`dedupe_kernels`). Raises CompileError when
    code generation fails."""
    from tensorfuse.codegen.base import get_backend
    tgt = Target.parse(target) if target is not None else None
    dedupe_kernels(lowered)
    backend = get_backend(tgt.kind if tgt is not None else "llvm")
    module, code_text = backend.build(lowered, graph, input_names, output_names, tgt, log=log)
    if options is None:
        options = CompileOptions.create(str(tgt) if tgt is not None else "llvm", 0, cache=False)
    module.report = CompileReport(options, code_text, list(log or []), list(passes or []),
                                  [list(c.sources) for c in module.calls], _graph=graph,
                                  _kernels=list(lowered.kernels))
    return module


def cache_info(model: Any, *args, **kwargs):
    """Would ``tensorfuse.compile(model, *args, **kwargs)`` hit the compile cache? Returns a
    ``runtime.cache.CacheInfo``; on a miss, ``differences`` names each key part (model content,
    target, host CPU, an option, the tensorfuse version or sources) that differs from the
    closest entry. Takes ``compile``'s arguments (raises as it does for bad options)."""
    import inspect

    from tensorfuse.runtime import cache as rc
    bound = inspect.signature(compile).bind(model, *args, **kwargs)
    bound.apply_defaults()
    opts = dict(bound.arguments)
    opts.pop("model")
    target = opts.pop("target")
    options = CompileOptions.create(target, **opts)
    return rc.explain(cache_key(model, options))
