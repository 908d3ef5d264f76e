"""The ``tensorfuse`` command line (``python -m tensorfuse``): one subcommand per job.

    tensorfuse compile MODEL -o OUT.tfm [-O 0..3] [--target T] [--input-shape name=1,3,224,224] [--dump-ir DIR]
    tensorfuse run     MODEL_OR_MODULE [--inputs in.npz] [-o out.npz]
    tensorfuse bench   MODEL [--threads N] [--repeat N]
    tensorfuse ir      MODEL [--level graph|fused|kernel|llvm|asm] [--after PASS] [--diff]
    tensorfuse explain MODEL [--rule NAME] [--node NAME]
    tensorfuse verify  MODEL [--rtol R] [--atol A] [-O N]
    tensorfuse graph   MODEL -o FILE.svg|.dot|.html [--profile]
    tensorfuse tune    MODEL -o RECORDS.jsonl [--time-budget S] [--trials N] [--threads T] [--executor local|ray]

Each wraps a library call (``tensorfuse.compile``, ``load``, ``verify``, ``explain_report``,
``to_dot``) and uses only the public compile options and Module attributes. Exit codes: 0
success, 1 numerical mismatch (verify), 2 bad usage or bad input (a one-line error and a hint
on stderr), 3 an internal error (a bug; ``--debug`` shows the traceback). ``--debug`` shows
the traceback of any error. Progress bars go to stderr when it is a terminal, unless
``--quiet``. Rules under test join the pipeline with ``--rules FILE.py:Name`` or
``--rules package.module:Name``: the ``rules=`` option of ``tensorfuse.compile`` (each rule
tried before the built-in rules of its set; ``compiler.pipeline.rules_under_test``).
"""
from __future__ import annotations

import argparse
import difflib
import glob
import importlib
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings

# numpy, onnx and the compiler are imported by the commands that need them, so that
# `tensorfuse --help` and argument errors answer at once (tests/test_cli_io.py checks it)

PROG = "tensorfuse"
EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
LEVELS = ("graph", "fused", "kernel", "llvm", "asm")


class UsageError(Exception):
    """Bad command-line input found after parsing; ``hint`` says what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


# ----------------------------------------------------------------------------- helpers
def _say(*parts) -> None:
    print(*parts, flush=True)


def _note(msg: str, args) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr, flush=True)


def parse_shapes(items) -> dict[str, list[int]] | None:
    """``["input=1,3,224,224", ...]`` -> {"input": [1, 3, 224, 224]}."""
    if not items:
        return None
    out: dict[str, list[int]] = {}
    for it in items:
        name, sep, dims = it.rpartition("=")
        try:
            shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            shape = None
        if not sep or not name or shape is None or any(d < 0 for d in shape):
            raise UsageError(f"--input-shape {it!r} is not NAME=D1,D2,...", "example: --input-shape input=1,3,224,224")
        out[name] = shape
    return out


def load_rules(specs) -> list:
    """Rule classes from ``--rules`` specs: ``FILE.py[:Name]`` or ``package.module[:Name]``;
    without ``:Name``, every Rule subclass the module defines, in definition order."""
    from tensorfuse.compiler.rewrite import Rule
    rules: list = []
    for spec in specs or ():
        src, _, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
        try:
            if src.endswith(".py") or os.sep in src:
                if not os.path.exists(src):
                    raise UsageError(f"--rules {spec}: no file {src}", "give FILE.py:RuleName or package.module:RuleName")
                name = "tensorfuse_user_rules_" + os.path.splitext(os.path.basename(src))[0]
                mspec = importlib.util.spec_from_file_location(name, src)
                mod = importlib.util.module_from_spec(mspec)
                sys.modules[name] = mod
                mspec.loader.exec_module(mod)
            else:
                mod = importlib.import_module(src)
        except UsageError:
            raise
        except Exception as e:      # noqa: BLE001 - the user's file failed to import
            raise UsageError(f"--rules {spec}: cannot import {src} ({type(e).__name__}: {e})",
                             "rerun with --debug to see the traceback") from e
        if attr:
            if not hasattr(mod, attr):
                found = [k for k, v in vars(mod).items() if isinstance(v, type) and issubclass(v, Rule)
                         and v is not Rule and v.pattern is not None]
                raise UsageError(f"--rules {spec}: {src} has no {attr!r}", f"rules it defines: {', '.join(found) or 'none'}")
            obj = getattr(mod, attr)
            got = list(obj) if isinstance(obj, (list, tuple)) else [obj]
        else:
            got = [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, Rule)
                   and v.pattern is not None and v.__module__ == mod.__name__]
        for r in got:
            if not ((isinstance(r, type) and issubclass(r, Rule)) or isinstance(r, Rule)):
                raise UsageError(f"--rules {spec}: {r!r} is not a tensorfuse Rule",
                                 "a rule subclasses tensorfuse.compiler.rewrite.Rule (docs/writing-a-fusion-rule.md)")
        if not got:
            raise UsageError(f"--rules {spec}: {src} defines no rules", "name one: FILE.py:RuleName")
        rules += got
    return rules


class _Session:
    """The compile options of one command (from the shared flags)."""

    def __init__(self, args):
        self.args = args
        self.rules = load_rules(getattr(args, "rules", None))
        self.shapes = parse_shapes(getattr(args, "input_shape", None))
        self.disabled = list(getattr(args, "disable_rule", None) or [])
        self.tuning = tuning_paths(getattr(args, "tuning", None))

    def compile(self, model: str, opt_level: int | None = None, **kw):
        import tensorfuse
        _check_model_path(model)
        a = self.args
        level = a.opt_level if opt_level is None else opt_level
        kw.setdefault("cache", not self.rules)    # a rule file may import helpers the cache key cannot see
        t0 = time.perf_counter()
        mod = tensorfuse.compile(model, target=getattr(a, "target", "llvm"), opt_level=level,
                                 input_shapes=self.shapes, disabled_rules=self.disabled, rules=self.rules,
                                 num_threads=getattr(a, "threads", None), tuning=self.tuning, **kw)
        from tensorfuse.compiler.specialize import SpecializingModule
        if isinstance(mod, SpecializingModule):
            mod = self.specialized(mod)
        return mod, time.perf_counter() - t0

    def specialized(self, smod):
        """The module ``smod`` (a model whose shapes depend on input values) compiles for the
        values in ``--inputs``; UsageError when the command has none or they lack an input.
        The module's ``_cli_consumed`` names the inputs that became constants."""
        names = smod.specialized_on
        why = f"the shapes of this model depend on the values of input(s) {names}, so it compiles for given values"
        path = getattr(self.args, "inputs", None)
        if not path:
            if hasattr(self.args, "inputs"):
                raise UsageError(why, "give every input with --inputs IN.npz (numpy.savez(path, name=array, ...))")
            raise UsageError(why, "run it with 'tensorfuse run MODEL --inputs IN.npz', which compiles it for "
                                  "those values, or use tensorfuse.compile(...).module_for(...) from Python")
        given = _read_npz(path)
        missing = [n for n in smod.input_names if n not in given]
        if missing:
            raise UsageError(f"{path} lacks the model's input(s) {missing}; it has {sorted(given)}", why)
        try:
            mod, _ = smod.module_for(**{n: given[n] for n in smod.input_names})
        except ValueError as e:
            raise UsageError(f"{path}: {e}", why) from None
        mod._cli_consumed = set(names)
        mod._cli_model = smod.specialized_model(**{n: given[n] for n in names})    # what onnxruntime runs
        return mod


def tuning_paths(paths: list[str] | None) -> list[str] | None:
    """``--tuning`` files (repeatable), checked to exist: UsageError naming a missing one."""
    if not paths:
        return None
    for p in paths:
        if not os.path.isfile(p):
            raise UsageError(f"no such tuning records file: {p}",
                             f"write one with '{PROG} tune MODEL -o {p}'")
    return list(paths)


def _tuned_summary(mod) -> list[str]:
    """'kernels with tuned schedules: N of K' and one line per tuned workload with its knobs."""
    rep = getattr(mod, "report", None)
    if rep is None:
        return []
    k = rep.num_distinct_kernels if rep.num_distinct_kernels is not None else len({c.kernel for c in mod.calls})
    return [f"kernels with tuned schedules: {rep.num_tuned_kernels} of {k}"] + rep.tuned_lines()


def _write_error(e: OSError, path: str) -> UsageError:
    """The UsageError for an output that cannot be written (``runtime.outfile.OutputError``,
    or ArtifactError from ``Module.save``, which carries its ``errno``): the reason in the
    message, what to do in the hint."""
    import errno as E
    msg = str(e) if str(e).startswith("cannot write") else f"cannot write {path}: {getattr(e, 'strerror', None) or e}"
    code = getattr(e, "errno", None)
    hint = {E.ENOSPC: "the device or file system is full: free some space or write elsewhere",
            E.ENOENT: "create the folder first (an output's folder is never created), or write elsewhere",
            E.ENOTDIR: "a part of the path is a file, not a folder: give another path",
            E.EISDIR: "give a file name inside that folder",
            E.EACCES: "the folder or file is not writable by this user: write elsewhere",
            E.EPERM: "the folder or file is not writable by this user: write elsewhere",
            E.EROFS: "the file system is read-only: write elsewhere"}.get(code)
    return UsageError(msg, hint or "write to another path")


def _check_output(path: str) -> None:
    """Refuse an output path that cannot be written before the work that makes it (a missing
    folder, a folder, a socket): ``runtime.outfile.classify``."""
    from tensorfuse.runtime.outfile import OutputError, classify
    try:
        classify(path)
    except OutputError as e:
        raise _write_error(e, path) from None


def _count(n: int, noun: str) -> str:
    """'1 rule application', '2 rule applications'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _check_dump_dir(path: str) -> None:
    """--dump-ir DIR: create it (with its parents) before the compile; UsageError naming the
    reason when it cannot be (a part of the path is a file, no permission)."""
    if path == "":
        raise UsageError("--dump-ir '' names no folder", "give a folder, e.g. --dump-ir ir_dump")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        err = _write_error(e, path)
        raise UsageError(f"--dump-ir {path}: cannot create the folder: {e.strerror or e}", err.hint) from None


def _compiled_how(mod) -> str:
    """' (from the compile cache)' for a module the compile cache served, else ''."""
    return " (from the compile cache)" if getattr(mod, "cache_hit", None) else ""


def _check_model_path(path: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"no such file: {path}", "give the path of an ONNX model (.onnx)")
    if os.path.isdir(path):
        raise UsageError(f"{path} is a folder, not a model file", "give the path of an ONNX model (.onnx)")


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name; UsageError when it is missing or not an .npz."""
    import numpy as np
    if not os.path.exists(path):
        raise UsageError(f"no such inputs file: {path}", "give an .npz written by numpy.savez(path, name=array, ...)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:          # noqa: BLE001 - numpy's own error is unhelpful
        raise UsageError(f"{path} is not a numpy .npz file ({type(e).__name__})",
                         "write one with numpy.savez(path, input=array)") from None


def _inputs_for(mod, args) -> dict[str, np.ndarray]:
    from tensorfuse.compiler.verify import index_limits, random_inputs
    path = getattr(args, "inputs", None)
    if not path:
        model = getattr(args, "model", None)
        limits = index_limits(model) if model and str(model).endswith(".onnx") and os.path.exists(model) else None
        return random_inputs(mod.input_info, getattr(args, "seed", 0), limits)
    given = _read_npz(path)
    consumed = getattr(mod, "_cli_consumed", set())     # inputs a specialisation made constants
    given = {k: v for k, v in given.items() if k not in consumed}
    names = [i.name for i in mod.input_info]
    missing = [n for n in names if n not in given]
    if missing:     # arrays are matched by name only: a wrongly named array is an error, never a guess
        has = ", ".join(f"{k!r} {v.dtype}{list(v.shape)}" for k, v in sorted(given.items())) or "no arrays"
        raise UsageError(f"{path} lacks the model's input(s) {missing}; it has {has}",
                         f"the model's inputs: {', '.join(str(i) for i in mod.input_info)}; save the arrays "
                         f"by those names: numpy.savez(path, {names[0]}=array, ...)")
    extra = sorted(set(given) - set(names))
    if extra:                       # a misspelt name would otherwise be ignored without a word
        raise UsageError(f"{path} has array(s) {extra} that are not inputs of the model",
                         f"the model's inputs: {', '.join(str(i) for i in mod.input_info)}")
    return {n: given[n] for n in names}


def _summary(name: str, a: np.ndarray) -> str:
    import numpy as np
    head = f"{name}: {a.dtype}{list(a.shape)}"
    if a.size == 0:
        return head + " (empty)"
    if a.dtype.kind in "fiub":
        f = a.astype(np.float64)
        s = f"{head}  min {f.min():.4g}  max {f.max():.4g}  mean {f.mean():.4g}  std {f.std():.4g}"
        flat = a.reshape(-1)
        s += "  first " + np.array2string(flat[:5], precision=4, separator=", ")
        if a.ndim == 2 and a.shape[0] == 1 and a.shape[1] >= 10 and a.dtype.kind == "f":
            top = np.argsort(-a[0], kind="stable")[:5]
            s += f"  top-5 {top.tolist()}"
        return s
    return head


# ----------------------------------------------------------------------------- commands
def cmd_compile(args) -> int:
    ses = _Session(args)
    from tensorfuse.runtime.artifact import ArtifactError
    if args.output == "":
        raise UsageError("-o '' names no file", "give the saved module's path, e.g. -o model.tfm")
    out = args.output or os.path.splitext(os.path.basename(args.model))[0] + ".tfm"
    _check_output(out)
    if args.dump_ir is not None:
        _check_dump_dir(args.dump_ir)
    mod, secs = ses.compile(args.model, dump_ir=args.dump_ir, cache=not ses.rules and not args.dump_ir)
    try:
        mod.save(out)
    except ArtifactError as e:
        if not str(e).startswith("cannot write"):
            raise
        raise _write_error(e, out) from None
    plan = mod.memory_plan
    distinct = len({c.kernel for c in mod.calls})
    _say(f"compiled {args.model} at O{args.opt_level} for {mod.target} in {secs:.2f} s{_compiled_how(mod)}: "
         f"{_count(mod.num_kernels, 'kernel call')} ({_count(distinct, 'distinct kernel')}), "
         f"{_count(len(getattr(mod, 'rewrite_log', None) or []), 'rule application')}, "
         f"arena {plan.arena_bytes / 2**20:.2f} MiB")
    if ses.tuning:
        for line in _tuned_summary(mod):
            _say(line)
    _say(f"inputs:  {', '.join(str(i) for i in mod.input_info)}")
    _say(f"outputs: {', '.join(str(o) for o in mod.output_info)}")
    from tensorfuse.runtime.outfile import classify
    regular = classify(out)[0] == "regular"     # not /dev/null or a FIFO: a file to run
    _say(f"wrote {out}" + (f" (run it with: {PROG} run {out})" if regular else ""))
    if args.dump_ir:
        _say(f"wrote the IR dumps to {args.dump_ir}/ (graph after each pass, kernels/, module.ll, module.opt.ll, module.s)")
    return EXIT_OK


def _load_module(path: str, args):
    import tensorfuse
    _check_model_path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04":          # a saved module is a zip file
        t0 = time.perf_counter()
        mod = tensorfuse.load(path)
        given = [flag for flag, on in (("--target", getattr(args, "target", "llvm") != "llvm"),
                                       ("-O", getattr(args, "opt_level", 2) != 2),
                                       ("--input-shape", getattr(args, "input_shape", None)),
                                       ("--disable-rule", getattr(args, "disable_rule", None)),
                                       ("--rules", getattr(args, "rules", None)),
                                       ("--tuning", getattr(args, "tuning", None))) if on]
        if given:       # they were ignored without a word
            _note(f"{path} is a saved module: it runs as it was compiled (target {mod.target!r}); "
                  f"{', '.join(given)} {'do' if len(given) > 1 else 'does'} not apply", args)
        return mod, time.perf_counter() - t0, "loaded"
    mod, secs = _Session(args).compile(path)
    return mod, secs, "compiled"


def _npz_path(path: str) -> str:
    """Where ``run -o PATH`` writes: PATH itself when it names a device or FIFO (or a link to
    one), else PATH with ``.npz`` appended when it lacks it (numpy.savez's rule)."""
    from tensorfuse.runtime.outfile import OutputError, classify
    try:
        kind, _ = classify(path)
    except OutputError as e:
        raise _write_error(e, path) from None
    return path if kind == "special" or path.endswith(".npz") else path + ".npz"


def cmd_run(args) -> int:
    out = _npz_path(args.output) if args.output else None
    mod, secs, how = _load_module(args.model, args)
    if args.threads:
        mod.num_threads = args.threads
    inputs = _inputs_for(mod, args)
    t0 = time.perf_counter()
    outs = mod.run(**inputs)
    ms = (time.perf_counter() - t0) * 1e3
    src = args.inputs or f"random inputs, seed {args.seed}"
    _say(f"{how} {args.model} in {secs:.2f} s{_compiled_how(mod)}; ran it once on {src} in {ms:.2f} ms")
    if how == "compiled" and getattr(args, "tuning", None):
        _say("  " + _tuned_summary(mod)[0])
    for i in mod.input_info:
        _say(f"  input  {_summary(i.name, inputs[i.name])}")
    for name, a in zip(mod.output_names, outs):
        _say(f"  output {_summary(name, a)}")
    if out:
        import io

        import numpy as np

        from tensorfuse.runtime.outfile import write_bytes
        buf = io.BytesIO()
        np.savez(buf, **dict(zip(mod.output_names, outs)))
        try:
            write_bytes(out, buf.getbuffer())
        except OSError as e:
            raise _write_error(e, out) from None
        _say(f"wrote {out}")
    return EXIT_OK


def _stats(ms: list[float]) -> str:
    import numpy as np
    p = np.percentile(ms, [10, 90, 99])
    return (f"median {statistics.median(ms):8.3f}  min {min(ms):8.3f}  max {max(ms):8.3f}  "
            f"p10 {p[0]:8.3f}  p90 {p[1]:8.3f}  p99 {p[2]:8.3f} ms")


def cmd_bench(args) -> int:
    from tensorfuse import progress
    if args.repeat < 1 or args.warmup < 0:
        raise UsageError("--repeat must be >= 1 and --warmup >= 0", "for example: --repeat 50")
    ses = _Session(args)
    mod, secs = ses.compile(args.model)
    threads = args.threads or mod.num_threads
    mod.num_threads = threads
    inputs = _inputs_for(mod, args)
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    sess = None
    if ort is not None:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        model = getattr(mod, "_cli_model", None)
        sess = ort.InferenceSession(model.SerializeToString() if model is not None else args.model, so,
                                    providers=["CPUExecutionProvider"])
    for _ in range(args.warmup):
        mod.run(**inputs)
        if sess is not None:
            sess.run(None, inputs)
    tf_ms, ort_ms = [], []
    clock = time.perf_counter
    for _ in progress.iterate(range(args.repeat), "bench", unit="run"):     # interleaved
        t0 = clock()
        mod.run(**inputs)
        tf_ms.append((clock() - t0) * 1e3)
        if sess is not None:
            t0 = clock()
            sess.run(None, inputs)
            ort_ms.append((clock() - t0) * 1e3)
    _say(f"{args.model}: O{args.opt_level}, {threads} thread{'s' if threads > 1 else ''}, {_count(args.repeat, 'run')} "
         f"after {args.warmup} warm-up (compiled in {secs:.2f} s{', from the compile cache' if _compiled_how(mod) else ''}, "
         f"{_count(mod.num_kernels, 'kernel call')})")
    if ses.tuning:
        _say("  " + _tuned_summary(mod)[0])
    _say(f"  tensorfuse   {_stats(tf_ms)}")
    if sess is not None:
        _say(f"  onnxruntime  {_stats(ort_ms)}  (optimisations on, {ort.__version__})")
        # one convention everywhere (examples/demo.py, benchmarks/): tensorfuse's time over
        # onnxruntime's, "x onnxruntime", lower is better
        r = statistics.median(tf_ms) / statistics.median(ort_ms)
        _say(f"  ratio (tensorfuse / onnxruntime median, lower is better): {r:.2f}x onnxruntime  -> tensorfuse is "
             + (f"{1 / r:.2f}x faster" if r <= 1 else f"{r:.2f}x slower"))
    else:
        _say("  onnxruntime is not installed: no comparison (pip install onnxruntime)")
    if args.top > 0:
        prof = mod.profile(**inputs, repeat=max(3, min(args.repeat, 20)), show=False)
        _say(f"  top {min(args.top, len(prof))} kernels by median time (single-threaded, each on its own):")
        for row in list(prof)[:args.top]:
            nodes = ", ".join(row.nodes)
            if len(nodes) > 70:
                nodes = nodes[:67] + "..."
            gf = f"{row.gflops:7.1f} GFLOP/s" if row.gflops else " " * 15
            _say(f"    {row.median_ms:8.3f} ms {row.share * 100:5.1f}%  {gf}  {row.kernel:<20} {nodes}")
    return EXIT_OK


def _dumps(d: str) -> list[tuple[str, str]]:
    """[(pass name, path)] of the graph dumps in order."""
    out = []
    for p in sorted(glob.glob(os.path.join(d, "[0-9][0-9]-*.txt"))):
        out.append((os.path.basename(p)[3:-4], p))
    return out


def _read(p: str) -> str:
    with open(p, encoding="utf-8") as f:
        return f.read()


def _diff(a: str, b: str, name_a: str, name_b: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), name_a, name_b, n=2))


def _ir_without_dumps(ses: _Session, args) -> bool:
    """``ir`` at a level that needs no per-pass dumps, without compiling from scratch: the
    graph as imported (no compile at all), or the fused graph, the kernel IR and the LLVM IR
    of a module the compile cache serves (cached as any compile is; the LLVM IR then goes
    through LLVM's passes and, for asm, its code generator again: ``pipeline.optimized_llvm``,
    as ``--dump-ir`` does). False when the graph level needs the compile (a model whose shapes
    depend on input values)."""
    if args.level == "graph":
        from tensorfuse.compiler.frontend.onnx import import_onnx
        from tensorfuse.compiler.specialize import InputValuesNeeded
        from tensorfuse.ir import print_graph
        _check_model_path(args.model)
        try:
            g = import_onnx(args.model, input_shapes=ses.shapes)
        except InputValuesNeeded:
            return False
        sys.stdout.write(print_graph(g))
        return True
    mod, _ = ses.compile(args.model)
    if args.level == "fused":
        sys.stdout.write(str(mod.graph).rstrip("\n") + "\n")
        return True
    if args.level == "kernel":
        for k in mod.kernels:
            sys.stdout.write(str(k).rstrip("\n") + "\n\n")
        return True
    if not getattr(mod, "llvm_ir", None):
        raise ValueError(f"--level {args.level} shows LLVM's output, and the {mod.target} target makes none: "
                         f"--level kernel shows its kernel IR (mod.cuda_sources in Python: the numba.cuda source)")
    from tensorfuse.compiler.pipeline import optimized_llvm
    opt, asm = optimized_llvm(mod.llvm_ir, getattr(mod, "target", "llvm"))
    if args.level == "asm":
        sys.stdout.write(asm)
    elif args.diff:
        sys.stdout.write(_diff(mod.llvm_ir, opt, "module.ll (emitted)", "module.opt.ll (after LLVM's passes)"))
    else:
        sys.stdout.write(opt)
    return True


def _check_pass_name(ses, args) -> None:
    """UsageError unless ``--after`` names a pass of the pipeline at this level (listing them)."""
    from tensorfuse.compiler.pipeline import build_passes, resolve_layout
    try:
        passes = build_passes(args.opt_level, disabled_rules=ses.disabled, rules=ses.rules,
                              layout=resolve_layout(args.target))
    except Exception:       # noqa: BLE001 - a bad rule or target: the compile says what is wrong
        return
    names: list[str] = []
    for name, p in passes:
        names += [n for n, _ in p] if isinstance(p, list) else [name]
    names = list(dict.fromkeys(names))
    if not names:
        raise UsageError(f"-O {args.opt_level} runs no graph passes, so there is no pass {args.after!r}",
                         f"--after needs -O 1 or more, e.g. {PROG} ir MODEL -O 2 --after fuse")
    if args.after not in names:
        raise UsageError(f"unknown pass {args.after!r}; passes at O{args.opt_level}: {', '.join(names)}",
                         f"for example: {PROG} ir MODEL --after {names[-1]}")


def cmd_ir(args) -> int:
    ses = _Session(args)
    if args.level in ("kernel", "asm") and args.diff:
        raise UsageError(f"--diff is for the graph levels and llvm, not --level {args.level}",
                         "--level fused --diff shows what each pass changed; --level llvm --diff what LLVM's passes changed")
    if args.after and args.level not in ("graph", "fused"):
        raise UsageError(f"--after names a graph pass; it goes with --level graph or fused, not {args.level}",
                         f"{PROG} ir MODEL --after fold_rules")
    if args.after:
        _check_pass_name(ses, args)
    if not args.after and not (args.diff and args.level in ("graph", "fused")):
        # no per-pass dumps needed: the compile cache serves the module and its report
        if _ir_without_dumps(ses, args):
            return EXIT_OK
    with tempfile.TemporaryDirectory(prefix="tensorfuse-ir-") as d:
        mod, _ = ses.compile(args.model, dump_ir=d, cache=False)
        dumps = _dumps(d)
        if args.level in ("graph", "fused"):
            if args.level == "graph" and not args.after and not args.diff:
                sys.stdout.write(_read(dumps[0][1]))
                return EXIT_OK
            names = [n for n, _ in dumps]
            if args.after:
                hits = [k for k, (n, _) in enumerate(dumps) if n == args.after]
                if not hits:
                    ran = sorted({p.name for p in getattr(mod, "pass_records", None) or []})
                    raise UsageError(f"no pass {args.after!r} changed the graph at O{args.opt_level}",
                                     f"passes that changed it: {', '.join(dict.fromkeys(names[1:])) or 'none'}"
                                     + (f"; passes that ran: {', '.join(ran)}" if ran else ""))
                k = hits[-1]
                if args.diff:
                    sys.stdout.write(_diff(_read(dumps[k - 1][1]), _read(dumps[k][1]),
                                           f"before {args.after}", f"after {args.after}"))
                else:
                    sys.stdout.write(_read(dumps[k][1]))
                return EXIT_OK
            if args.diff:
                if len(dumps) == 1:
                    _say(f"no pass changed the graph at O{args.opt_level}")
                for (na, pa), (nb, pb) in zip(dumps, dumps[1:]):
                    sys.stdout.write(_diff(_read(pa), _read(pb), f"after {na}", f"after {nb}"))
                return EXIT_OK
            sys.stdout.write(str(mod.graph).rstrip("\n") + "\n")
            return EXIT_OK
        if args.level == "kernel":
            for p in sorted(glob.glob(os.path.join(d, "kernels", "*.txt"))):
                sys.stdout.write(_read(p).rstrip("\n") + "\n\n")
            return EXIT_OK
        if args.level in ("llvm", "asm") and not os.path.exists(os.path.join(d, "module.ll")):
            raise ValueError(f"--level {args.level} shows LLVM's output, and the {mod.target} target makes none: "
                             f"--level kernel shows its kernel IR (mod.cuda_sources in Python: the numba.cuda source)")
        if args.level == "llvm":
            opt = _read(os.path.join(d, "module.opt.ll"))
            if args.diff:
                sys.stdout.write(_diff(_read(os.path.join(d, "module.ll")), opt, "module.ll (emitted)",
                                       "module.opt.ll (after LLVM's passes)"))
            else:
                sys.stdout.write(opt)
            return EXIT_OK
        sys.stdout.write(_read(os.path.join(d, "module.s")))
        return EXIT_OK


def cmd_explain(args) -> int:
    from tensorfuse.compiler.explain import explain_report
    ses = _Session(args)
    _check_model_path(args.model)
    rep = explain_report(args.model, opt_level=args.opt_level, rule=args.rule, node=args.node,
                         input_shapes=ses.shapes, disabled_rules=ses.disabled, rules=ses.rules,
                         target=args.target, tuning=ses.tuning, num_threads=args.threads)
    _say(str(rep))
    return EXIT_OK


def cmd_verify(args) -> int:
    from tensorfuse.compiler.verify import verify
    ses = _Session(args)
    _check_model_path(args.model)
    inputs, model = None, args.model
    if args.inputs:
        mod0, _ = ses.compile(args.model, opt_level=0)
        inputs = _inputs_for(mod0, args)
        model = getattr(mod0, "_cli_model", None) or model     # a specialisation's model
    res = verify(model, args.opt_level, rtol=args.rtol, atol=args.atol, inputs=inputs, seed=args.seed,
                 input_shapes=ses.shapes, disabled_rules=ses.disabled, rules=ses.rules, tuning=ses.tuning,
                 target=args.target, bisect=not args.no_bisect, groups=not args.no_groups,
                 num_threads=args.threads)
    _say(str(res))
    if args.float_model:
        from tensorfuse.compiler.quant_error import quant_error_report
        _check_model_path(args.float_model)
        _say(str(quant_error_report(model, args.float_model, res.inputs)))
    return EXIT_OK if res.ok else EXIT_MISMATCH


def _float_where(ok, bound: str, what: str = "a number"):
    """An argparse type: a float ``v`` with ``ok(v)``; errors say ``expected <what>, got 'x'`` and
    ``must be <bound>, got x``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return v
    return parse


#: seconds > 0 (--time-budget, --timeout)
_positive_seconds = _float_where(lambda v: v > 0, "> 0", "a number of seconds")
#: --min-gain: a number in (-1, 1)
_min_gain = _float_where(lambda v: -1 < v < 1, "in (-1, 1)")


def cmd_tune(args) -> int:
    import tensorfuse
    from tensorfuse import progress
    _check_model_path(args.model)
    if args.output == "":
        raise UsageError("-o '' names no file", "give the records file, e.g. -o RECORDS.jsonl")
    _check_output(args.output)
    if args.ray_address and args.executor != "ray":
        raise UsageError("--ray-address is for --executor ray", "add --executor ray, or drop --ray-address")
    try:
        res = tensorfuse.tune(args.model, args.output, target=args.target, time_budget=args.time_budget,
                              trials=args.trials, num_threads=args.threads, executor=args.executor,
                              ray_address=args.ray_address, seed=args.seed, progress=progress.active(),
                              opt_level=args.opt_level, input_shapes=parse_shapes(args.input_shape),
                              timeout=args.timeout, min_gain=args.min_gain,
                              cache_flush={"auto": "auto", "on": True, "off": False}[args.cache_flush],
                              check_model=not args.no_model_check)
    except ImportError as e:
        hint = ("install it: pip install 'tensorfuse[ray]'" if "ray" in str(e).lower()
                else "check the modules named in $TENSORFUSE_TUNE_PLUGINS")
        raise UsageError(str(e), hint) from e
    except RuntimeError as e:
        if "tensorfuse_measure" not in str(e):
            raise
        raise UsageError(str(e), "declare the resource on every node that measures") from e
    _say(str(res))
    _say(f"use them: {PROG} compile {args.model} --tuning {args.output} -o OUT.tfm")
    return EXIT_OK


def cmd_graph(args) -> int:
    from tensorfuse.compiler.dot import to_dot
    ses = _Session(args)
    ext = os.path.splitext(args.output)[1].lower()
    if ext not in (".svg", ".dot", ".gv", ".html"):
        raise UsageError(f"-o {args.output}: the picture must be .svg, .dot, .gv or .html", "for example: -o model.svg")
    _check_output(args.output)
    mod, _ = ses.compile(args.model)
    prof = None
    if args.profile:
        prof = mod.profile(**_inputs_for(mod, args), repeat=10, show=False)
    dot = to_dot(mod, profile=prof)
    try:
        with warnings.catch_warnings():     # the note below says it
            warnings.simplefilter("ignore", UserWarning)
            path, note = dot.write(args.output)
    except OSError as e:
        raise _write_error(e, args.output) from None
    _say(note)
    return EXIT_OK


# ----------------------------------------------------------------------------- parser
class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low`` (argparse names the option in its error)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v
    return parse


#: a number >= 0 (--rtol, --atol)
_float_at_least_0 = _float_where(lambda v: v >= 0, ">= 0")


NONNEG, POSITIVE = _int_at_least(0), _int_at_least(1)


def _common(p: argparse.ArgumentParser, compile_opts: bool = True, level_default: int = 2,
            min_level: int = 0) -> None:
    g = p.add_argument_group("general")
    g.add_argument("--debug", action="store_true", help="show the traceback of an error")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes on stderr")
    if not compile_opts:
        return
    c = p.add_argument_group("compile options")
    c.add_argument("-O", "--opt-level", type=int, choices=range(min_level, 4), default=level_default, metavar="N",
                   help=f"optimisation level {min_level}..3 (default {level_default})")
    c.add_argument("--target", default="llvm",
                   help="'llvm' (this CPU; default), e.g. 'llvm -mcpu=znver3', or 'cuda' (an NVIDIA GPU, "
                        "or numba's CUDA simulator with NUMBA_ENABLE_CUDASIM=1)")
    c.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="shape of an input with dynamic dimensions (repeatable)")
    c.add_argument("--disable-rule", action="append", metavar="RULE", help="switch a rewrite rule off (repeatable)")
    c.add_argument("--rules", action="append", metavar="FILE.py[:NAME]",
                   help="add rewrite rules under test: FILE.py:RuleName or package.module:RuleName; without "
                        ":NAME every rule the module defines. A rule joins the set named by its 'rule_set' "
                        "attribute (simplify, fold, fuse, o3; default fuse), before the built-in rules "
                        "(repeatable; skips the compile cache)")
    c.add_argument("--tuning", action="append", metavar="RECORDS.jsonl",
                   help="tuning records written by 'tensorfuse tune' (repeatable): each workload with a record "
                        "measured on this CPU by this version uses the knobs of its fastest one; 'explain "
                        "--tuning' says which records were used and why others were ignored")


EXAMPLE = "examples/models/mobilenet_v2.onnx"
#: how every -o writes (runtime.outfile), for the --help texts
OUTPUT_RULES = ("Its folder must exist (none is created: exit 2 naming it, before any work); a regular file is "
                "replaced atomically, a symbolic link written through, a device or FIFO (/dev/null, a named "
                "pipe) written into; a failed write (a full device, a folder not writable) is exit 2 with "
                "the reason")


def build_parser() -> argparse.ArgumentParser:
    from tensorfuse import __version__
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=_Formatter,
        description="tensorfuse: compile ONNX models to native code, run, benchmark, inspect and verify them.",
        epilog=(f"example:\n  {PROG} verify {EXAMPLE}\n\n"
                "exit codes: 0 success, 1 numerical mismatch (verify), 2 bad usage or input, 3 internal error.\n"
                f"'{PROG} COMMAND --help' shows a command's options and an example."))
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    short = {"compile": "compile a model into a saved module (.tfm)",
             "run": "run a model or saved module on given or random inputs",
             "bench": "time tensorfuse against onnxruntime",
             "ir": "print the IR at a level (graph, fused, kernel, llvm, asm)",
             "explain": "the fusion report: which rules fired where, and why not",
             "verify": "compare with onnxruntime; name the rewrite that broke the numbers",
             "graph": "draw the fused graph (svg, dot, html)",
             "tune": "measure schedule knobs per workload into tuning records"}

    def add(name, fn, help_, example, **kw):
        sp = sub.add_parser(name, help=short[name], description=help_, formatter_class=_Formatter,
                            epilog="example:\n  " + example, **kw)
        sp.set_defaults(func=fn)
        return sp

    s = add("compile", cmd_compile, "compile an ONNX model into a saved module (load it with tensorfuse.load)",
            f"{PROG} compile {EXAMPLE} -o mobilenet.tfm -O 2 --input-shape input=1,3,224,224")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("-o", "--output", metavar="OUT", help="the saved module to write (default: MODEL's base name with .tfm, in the current folder). "
                                                         + OUTPUT_RULES)
    s.add_argument("--dump-ir", metavar="DIR", help="write the graph after every pass, the kernels, the LLVM IR "
                                                    "(emitted and optimised) and the assembly into DIR (created "
                                                    "with its parents when missing)")
    s.add_argument("--threads", type=POSITIVE, metavar="N",
                   help="threads the saved module runs with (tuning records are chosen for this count; default: "
                        "the cores this process may use)")
    _common(s)

    s = add("run", cmd_run, "run a model (compiled first) or a saved module; print the outputs' names, shapes "
                            "and a summary",
            f"{PROG} run {EXAMPLE} --inputs in.npz -o out.npz")
    s.add_argument("model", metavar="MODEL_OR_MODULE", help="an ONNX model (.onnx) or a saved module (.tfm)")
    s.add_argument("--inputs", metavar="IN.npz", help="inputs by name (numpy.savez); default random, fixed seed")
    s.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs by name (numpy.savez; .npz is appended "
                                                             "to a name without it). " + OUTPUT_RULES)
    s.add_argument("--seed", type=NONNEG, default=0, help="seed of the random inputs (default 0)")
    s.add_argument("--threads", type=POSITIVE, metavar="N", help="threads per kernel (default: the cores this process may use)")
    _common(s)

    s = add("bench", cmd_bench, "time tensorfuse against onnxruntime (optimisations on) in this process: "
                                "median/min/max and percentiles, the ratio, the top kernels",
            f"{PROG} bench {EXAMPLE} --threads 1 --repeat 50")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("--threads", type=POSITIVE, metavar="N", help="threads for both (default: the cores this process may use)")
    s.add_argument("--repeat", type=POSITIVE, default=30, metavar="N", help="timed runs of each, interleaved (default 30)")
    s.add_argument("--warmup", type=NONNEG, default=3, metavar="N", help="untimed runs first (default 3)")
    s.add_argument("--top", type=NONNEG, default=10, metavar="K", help="kernels to list by time (default 10; 0: none)")
    s.add_argument("--seed", type=NONNEG, default=0, help="seed of the random inputs (default 0)")
    s.add_argument("--inputs", metavar="IN.npz", help="inputs by name instead of random ones")
    _common(s)

    s = add("ir", cmd_ir, "print the IR: graph (as imported), fused (optimised graph), kernel (loop nests), "
                          "llvm (optimised LLVM IR), asm (assembly for the target). The compile cache serves "
                          "fused, kernel, llvm and asm (llvm and asm then rerun only LLVM's passes); graph "
                          "only imports; --after and --diff of the graph levels compile afresh (they need the "
                          "graph after every pass)",
            f"{PROG} ir {EXAMPLE} --level fused --diff      # what each pass changed\n"
            f"  {PROG} ir {EXAMPLE} --after fold_rules       # the graph after one pass\n"
            f"  {PROG} ir {EXAMPLE} --level asm")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("--level", choices=LEVELS, default="fused", help="which IR (default fused)")
    s.add_argument("--after", metavar="PASS", help="the graph after this pass (its last run that changed it): "
                                                   "fold_constants, dce, cse, simplify, fold_rules, fuse, fuse_ops")
    s.add_argument("--diff", action="store_true", help="unified diffs of what each pass changed (with --after: "
                                                       "that pass only; --level llvm: LLVM's optimisation)")
    _common(s)

    s = add("explain", cmd_explain, "the fusion report: for each candidate node which rules matched in pipeline "
                                    "order and the first failed predicate of the others, which rule won, the fused "
                                    "groups and why neighbouring ops stayed out, every Conv/Gemm/MatMul with the "
                                    "rules that fused it",
            f"{PROG} explain {EXAMPLE} --rule FuseConvActivation")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("--rule", metavar="NAME", help="only this rule's entries")
    s.add_argument("--node", metavar="NAME", help="only this (ONNX or IR) node's entries")
    s.add_argument("--threads", type=POSITIVE, metavar="N",
                   help="with --tuning: the thread count to choose records for (records measured at another "
                        "count are ignored; default: the cores this process may use)")
    _common(s)

    s = add("verify", cmd_verify, "compile at O0 and -O N, run both and onnxruntime on the same inputs, compare "
                                  "every output; on a mismatch name the first rule application that broke them "
                                  "and the first fused group that diverges (exit 1)",
            f"{PROG} verify {EXAMPLE} -O 2 --rtol 1e-3 --atol 1e-4\n"
            f"  {PROG} verify model.onnx --rules my_rules.py:FoldMyPattern   # a rule under test")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("--rtol", type=_float_at_least_0, default=1e-3, help="relative tolerance (default 1e-3)")
    s.add_argument("--atol", type=_float_at_least_0, default=1e-4, help="absolute tolerance (default 1e-4)")
    s.add_argument("--seed", type=NONNEG, default=0, help="seed of the random inputs (default 0)")
    s.add_argument("--inputs", metavar="IN.npz", help="inputs by name instead of random ones")
    s.add_argument("--no-bisect", action="store_true", help="do not look for the rule application")
    s.add_argument("--no-groups", action="store_true", help="do not compare the fused groups")
    s.add_argument("--float-model", metavar="FLOAT.onnx",
                   help="a quantized MODEL's float original: also print each quantized tensor's error against "
                        "the float tensor of the same name (where quantization loses accuracy)")
    s.add_argument("--threads", type=POSITIVE, metavar="N",
                   help="threads the modules run with (tuning records are chosen for this count; default: the "
                        "cores this process may use)")
    _common(s, min_level=1)

    s = add("graph", cmd_graph, "draw the fused graph: one cluster per kernel, coloured by op pattern kind, "
                                "labelled with the kernel name (and its time with --profile)",
            f"{PROG} graph {EXAMPLE} -o mobilenet.svg --profile")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.svg, FILE.html, FILE.dot or FILE.gv. "
                                                                          + OUTPUT_RULES)
    s.add_argument("--profile", action="store_true", help="time each kernel and show it in its cluster")
    s.add_argument("--seed", type=NONNEG, default=0, help="seed of the random inputs for --profile (default 0)")
    s.add_argument("--inputs", metavar="IN.npz", help="inputs for --profile instead of random ones")
    _common(s)

    s = add("tune", cmd_tune, "measure candidate schedule knobs for each workload of the model (heaviest first, "
                              "each candidate compiled alone and run in a child process with a timeout; crashes, "
                              "hangs and wrong results are recorded as failed) and append one JSON line per "
                              "candidate to the records file. A run resumes: candidates already in the file for "
                              "this CPU, version and thread count are not measured again. Compile with the "
                              "records: --tuning RECORDS.jsonl",
            f"{PROG} tune {EXAMPLE} -o mobilenet.records.jsonl --time-budget 900 --threads 2\n"
            f"  {PROG} compile {EXAMPLE} --tuning mobilenet.records.jsonl -o mobilenet.tfm\n"
            f"  {PROG} tune model.onnx -o R.jsonl --executor ray --ray-address HEAD:6379   # a Ray cluster")
    s.add_argument("model", metavar="MODEL", help="the ONNX model (.onnx)")
    s.add_argument("-o", "--output", required=True, metavar="RECORDS.jsonl",
                   help="the tuning records file to append to (created when missing; its folder must exist)")
    s.add_argument("--time-budget", type=_positive_seconds, metavar="S",
                   help="seconds for the whole run, shared among the workloads by their weight (default: no limit)")
    s.add_argument("--trials", type=POSITIVE, metavar="N",
                   help="candidates per workload, the default knobs and earlier records included (default: 32 "
                        "without --time-budget, else no limit)")
    s.add_argument("--threads", type=POSITIVE, metavar="T",
                   help="threads the candidates run with: the count the tuned model will run with (default: the "
                        "cores this process may use)")
    s.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: a child process of this one (default); ray: Ray tasks, one measurement per node "
                        "that declares the resource tensorfuse_measure (pip install 'tensorfuse[ray]')")
    s.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster (default: a local Ray instance)")
    s.add_argument("--timeout", type=_positive_seconds, default=60.0, metavar="S",
                   help="seconds a candidate may take (compile, check, time) before it counts as hung (default 60)")
    s.add_argument("--seed", type=NONNEG, default=0, help="seed of the inputs and the search (default 0)")
    s.add_argument("--min-gain", type=_min_gain, default=0.03, metavar="G",
                   help="the least gain (1 - ratio to the default knobs' time) a candidate must show in the "
                        "search to be measured again, and again in that confirmation to be used; a workload "
                        "without a confirmed candidate keeps its default knobs (default 0.03)")
    s.add_argument("--cache-flush", choices=("auto", "on", "off"), default="auto",
                   help="time each candidate run after evicting the caches, so its weights come from memory as "
                        "in a model whose weights exceed the last-level cache; auto (default): when they do")
    s.add_argument("--no-model-check", action="store_true",
                   help="skip the last stage: the whole model timed with the records against without them, "
                        "settings that make it slower rejected (a 'model' record each)")
    c = s.add_argument_group("compile options (as for the compile that will use the records)")
    c.add_argument("-O", "--opt-level", type=int, choices=range(0, 4), default=2, metavar="N",
                   help="optimisation level 0..3 (default 2)")
    c.add_argument("--target", default="llvm", help="'llvm' (this CPU; default) or another target string")
    c.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="shape of an input with dynamic dimensions (repeatable)")
    _common(s, compile_opts=False)
    return p


# ----------------------------------------------------------------------------- main
def _one_line(e: BaseException) -> str:
    """The whole message of ``e`` (never cut): its first line, then any further lines (a list
    such as the unsupported ops with their node names) each on its own indented line."""
    lines = [ln.rstrip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    rest = [ln if ln[:1].isspace() else "  " + ln for ln in lines[1:]]
    return "\n".join([" ".join(lines[0].split())] + rest)


def _hint(e: BaseException, command: str, random_seed: int | None = None) -> str:
    """The hint line under the error ``e`` of ``tensorfuse COMMAND``; ``random_seed``: the seed of
    the random inputs the command ran the model on (None: it was given inputs, or ran none)."""
    from tensorfuse.ir.errors import CompileError, ModelLoadError, UnsupportedModelError
    from tensorfuse.runtime.artifact import ArtifactError, CPUFeaturesArtifactError
    from tensorfuse.runtime.module import CPUFeaturesError, RunCheckError
    if random_seed is not None and (isinstance(e, RunCheckError) or (
            str(e).startswith("onnxruntime cannot run the model") and any(w in str(e) for w in ("indices", "bounds")))):
        return (f"the values came from random inputs (integers drawn from 0..9, seed {random_seed}); an input "
                f"that holds indices needs real ones: give the inputs with --inputs IN.npz "
                f"(numpy.savez(path, name=array, ...))")
    if isinstance(e, CPUFeaturesError):
        target = e.target or "llvm -mcpu=CPU"
        return (f"this CPU cannot run code for that target: write it to a file with "
                f"'{PROG} compile MODEL --target \"{target}\" -o OUT.tfm' and run OUT.tfm on a CPU that has "
                f"these features ('{PROG} {command}' here needs a --target this CPU can run, e.g. the default)")
    if isinstance(e, CPUFeaturesArtifactError):
        return ("run the saved module on a CPU that has these features, or compile the model for this CPU: "
                f"'{PROG} compile MODEL -o OUT.tfm' (without --target's -mcpu/-mattr for another CPU)")
    if isinstance(e, ModelLoadError):
        return "MODEL must be an ONNX file (.onnx)" + ("; 'run' also takes a saved module (.tfm)" if command == "run" else "")
    if isinstance(e, UnsupportedModelError):
        msg = str(e)
        if "dynamic dimension" in msg:
            return "give the input's shape with --input-shape NAME=D1,D2,..."
        if "depend on the values" in msg:
            return "give every input with --inputs IN.npz (numpy.savez(path, name=array, ...))"
        if "opset" in msg:
            return "convert the model to a supported opset with onnx.version_converter.convert_version"
        if "not support" in msg:
            return ("export the model without these ops (another opset or exporter option, or rewrite them into "
                    "supported ops with onnx tooling), or register a lowering for each (ir/registry.py, ir/ops/)")
        return f"the model is valid ONNX that tensorfuse cannot compile as it stands; see '{PROG} {command} --help'"
    if "tensorfuse[cuda]" in str(e):
        return "install the GPU stack: pip install 'tensorfuse[cuda]' (make venv installs it into .venv)"
    if "cuda" in str(e) and ("not available" in str(e) or "simulator" in str(e)):
        return ("the cuda target needs an NVIDIA GPU with its driver, or numba's CUDA simulator: "
                "set NUMBA_ENABLE_CUDASIM=1 in the environment (slow: small models only)")
    if isinstance(e, ArtifactError) and ("write" in str(e) or "No such file or directory" in str(e)):
        return "check that the output's folder exists and is writable"
    if isinstance(e, ArtifactError):
        return f"saved modules come from '{PROG} compile MODEL -o OUT.tfm' with this tensorfuse version"
    if isinstance(e, CompileError):
        return "this is a compiler failure: rerun with --debug for the traceback and report it"
    return f"see '{PROG} {command} --help'" if command else f"see '{PROG} --help'"


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """tensorfuse's own warnings (the compile cache's, a declared shape's) as one line
    ``tensorfuse: warning: MESSAGE`` without Python's source-line echo; others as Python shows them."""
    if getattr(category, "__module__", "").startswith("tensorfuse"):
        print(f"{PROG}: warning: {' '.join(str(message).split())}", file=file or sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:         # argparse: --help (0) or a usage error (2, message printed)
        return int(e.code or 0)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from tensorfuse import progress
    from tensorfuse.ir.errors import TensorfuseError
    from tensorfuse.runtime.artifact import ArtifactError
    from tensorfuse.runtime.module import CPUFeaturesError
    show = sys.stderr.isatty() and not args.quiet
    try:
        with progress.enabled(show):
            return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:         # `tensorfuse explain M | head`: the reader left; not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except (UsageError, TensorfuseError, ArtifactError, CPUFeaturesError, ValueError, OSError) as e:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG} {args.command}: error: {_one_line(e)}", file=sys.stderr)
        random_seed = getattr(args, "seed", None) if args.command in ("run", "bench", "verify", "graph") \
            and not getattr(args, "inputs", None) else None
        hint = getattr(e, "hint", None) or _hint(e, args.command, random_seed)
        print(f"hint: {hint}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:          # noqa: BLE001 - a bug: say so, traceback only with --debug
        if args.debug:
            traceback.print_exc()
        print(f"{PROG} {args.command}: internal error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        print("hint: this is a bug in tensorfuse; rerun with --debug for the traceback and report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
