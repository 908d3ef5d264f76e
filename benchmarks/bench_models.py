"""Benchmark: tensorfuse beside onnxruntime, whole models and per kernel, in the same process.

What it measures, per model and per thread count N:

* tensorfuse: compile time of ``tensorfuse.compile(path, num_threads=N, cache=False)`` (seconds),
  then the wall time of whole ``Module.run`` calls;
* onnxruntime: an ``InferenceSession`` with ``ORT_ENABLE_ALL``, ``intra_op_num_threads=N`` and
  ``inter_op_num_threads=1``, wall time of ``session.run``;
* the max abs difference of their outputs (checked once, before timing), median / min / p90 ms
  of both and the ratio tensorfuse / onnxruntime (median over median), with the geometric mean
  of the ratios per thread count;
* with ``--tuning RECORDS.jsonl``: tensorfuse compiled with the records, and the same model compiled
  without them timed in the same interleaved blocks (``tuned / untuned``, median over median);
* per kernel (the 1-thread module, ``Module.profile``): each Conv / ConvTranspose / MatMul /
  Gemm kernel (or a fused kernel containing one) as GFLOP/s and as a share of numpy's
  single-thread sgemm measured in the same run; each memory-bound kernel of at least 0.05 ms
  (elementwise, reductions, pools, data movement) as GB/s (bytes of its distinct buffers / time)
  and as a share of single-thread ``np.copyto`` bandwidth (64 MiB float32, read + write bytes).

How: both sides are timed with ``runtime.profile.time_calls``, one call per sample. After a
warm-up of both, the runs are interleaved in ``--blocks`` blocks per side (a block of tensorfuse
runs, a block of onnxruntime runs, alternating, ``--repeat`` runs in all per side), so a slow
stretch of the machine hits both sides alike. Before each block the script sleeps ~0.15 s so the
CPU settles: onnxruntime's worker threads spin ~60 ms after each run at 2 threads and would
otherwise steal a core from whichever side runs next. Medians are reported (min and p90 too).

Models: by default the bundled ``examples/models/mobilenet_v2.onnx`` and every model of
``../shared/models`` (inputs from its ``models.json``: shapes and integer ranges). Any ``.onnx``
path works without models.json: inputs from the model's declared shapes (dynamic dims -> 1),
floats standard normal, integers in [0, 100) (fewer where the input indexes a constant table
directly), fixed seed. A folder argument means every model in it. A model that fails to compile
or run gets its error in its row; the others go on.

Usage::

    .venv/bin/python benchmarks/bench_models.py [--threads 1 2] [--repeat 30] [--blocks 5] [--tuning RECORDS.jsonl]
        [--models-dir DIR] [--no-kernels] [--json FILE] [model.onnx | folder | name-substring ...]
    .venv/bin/python benchmarks/bench_models.py --threads 1 --repeat 20 --blocks 2 examples/models/mobilenet_v2.onnx
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import tensorfuse  # noqa: E402
from oracle import model_inputs  # noqa: E402
from tensorfuse.runtime.profile import time_calls  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"
BUNDLED = ROOT / "examples" / "models" / "mobilenet_v2.onnx"
MIN_REPEAT = 20
SETTLE_S = 0.15
WARMUP_RUNS = 3
TOP_KERNELS = 15
MEM_MIN_MS = 0.05
# ops whose kernels are compared with sgemm: the op itself, or a fused op / fused group holding it
_MM_OP = re.compile(r"conv|matmul|gemm|attention", re.IGNORECASE)
_CHECK_KERNEL = re.compile(r"_check\d*$")   # run-time index checks lowered beside an op's kernel


# -- machine -----------------------------------------------------------------------------------
def machine_info() -> dict:
    import onnxruntime as ort
    info = {"onnxruntime": ort.__version__, "numpy": np.__version__, "cores": None}
    try:
        info["cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cores"] = os.cpu_count()
    try:
        import llvmlite.binding as llvm
        info["cpu"] = llvm.get_host_cpu_name()
        feats = llvm.get_host_cpu_features()
        info["features"] = {f: bool(feats.get(f, False)) for f in ("avx512f", "avx2", "fma")}
    except Exception as e:  # noqa: BLE001 - a report line, not a failure
        info["cpu"] = f"unknown ({type(e).__name__}: {e})"
        info["features"] = {}
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["model_name"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


_SGEMM_CODE = r"""
import json, time, numpy as np
out = {}
rng = np.random.default_rng(0)
for n in (512, 1024):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b; a @ b
    reps = 12 if n == 512 else 4
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    out[str(n)] = 2.0 * n ** 3 / best / 1e9
print(json.dumps(out))
"""


def measure_sgemm() -> tuple[dict, str]:
    """Single-thread numpy sgemm GFLOP/s for n = 512 and 1024 (best of several) and how the
    thread count was pinned."""
    try:
        import threadpoolctl
    except ImportError:
        threadpoolctl = None
    if threadpoolctl is not None:
        with threadpoolctl.threadpool_limits(1):
            ns = {}
            exec(_SGEMM_CODE.replace("print(json.dumps(out))", "RESULT = out"), ns)
        return ns["RESULT"], "threadpoolctl.threadpool_limits(1), in process"
    env = dict(os.environ)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = "1"
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    res = subprocess.run([sys.executable, "-c", _SGEMM_CODE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1]), (
        "subprocess, OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1, OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset "
        "(threadpoolctl not installed)")


def measure_copy_bw(reps: int = 7) -> float:
    """Single-thread np.copyto of a 64 MiB float32 array: best GB/s, read + write bytes."""
    n = 64 * 2 ** 20 // 4
    src = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


# -- models and inputs -------------------------------------------------------------------------
def _entries(models_dir: pathlib.Path) -> list[dict] | None:
    mj = models_dir / "models.json"
    if not mj.exists():
        return None
    return json.loads(mj.read_text())["models"]


def _in_dir(path: pathlib.Path, folder: pathlib.Path) -> bool:
    try:
        return path.resolve().parent == folder.resolve()
    except OSError:
        return False


def collect_models(args) -> list[tuple[pathlib.Path, dict | None]]:
    """(path, models.json entry or None) for every model to run."""
    out: list[tuple[pathlib.Path, dict | None]] = []

    def add_dir(folder: pathlib.Path) -> None:
        entries = _entries(folder)
        if entries is not None:
            out.extend((folder / e["file"], e) for e in entries)
        else:
            out.extend((p, entry_for(p)) for p in sorted(folder.glob("*.onnx")))

    def entry_for(path: pathlib.Path) -> dict | None:
        # models.json describes the files of its own folder only, and the quantized copies of
        # them (benchmarks/quantize_models.py names them NAME.qdq_u8s8.onnx ..., anywhere):
        # their inputs are the float model's
        for folder in {path.parent, args.models_dir}:
            if _in_dir(path, folder):
                for e in _entries(folder) or ():
                    if e["file"] == path.name:
                        return e
        for tag in (".qdq_", ".dynamic"):
            if tag in path.name:
                base = path.name[:path.name.index(tag)] + ".onnx"
                for e in _entries(args.models_dir) or ():
                    if e["file"] == base:
                        return dict(e, file=path.name)
        return None

    if not args.models:
        out.append((BUNDLED, None))
        if args.models_dir.is_dir():
            add_dir(args.models_dir)
        else:
            print(f"note: {args.models_dir} not found; only the bundled model runs "
                  f"(give the shared models with --models-dir)", file=sys.stderr)
        return out
    for m in args.models:
        p = pathlib.Path(m)
        if p.is_dir():
            add_dir(p)
        elif p.is_file():
            out.append((p, entry_for(p)))
        else:   # a name (substring) of a model in --models-dir
            hits = [(args.models_dir / e["file"], e) for e in _entries(args.models_dir) or () if m in e["file"]]
            if not hits:
                raise SystemExit(f"error: {m!r} is neither a file, a folder nor the name of a model in "
                                 f"{args.models_dir / 'models.json'}")
            out.extend(hits)
    return out


def _gather_bounds(model) -> dict[str, int]:
    """Graph inputs used directly as Gather indices of a constant table: rows of that table."""
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    bounds: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[0] in inits:
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            dims = inits[n.input[0]]
            if dims:
                size = dims[axis % len(dims)]
                bounds[n.input[1]] = min(bounds.get(n.input[1], size), size)
    return bounds


def declared_inputs(path: pathlib.Path, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    """Inputs from the model's declared shapes (dynamic dims -> 1): floats standard normal,
    integers in [0, 100) (or [0, rows) for a Gather index into a smaller constant table),
    booleans at random; and the shapes of inputs that had dynamic dims (for compile)."""
    import onnx
    from onnx import helper
    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    bounds = _gather_bounds(model)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    dynamic: dict[str, list[int]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        dims = list(tt.shape.dim) if tt.HasField("shape") else []
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
        if any(not (d.HasField("dim_value") and d.dim_value > 0) for d in dims):
            dynamic[vi.name] = shape
        if dt == np.bool_:
            a = rng.random(shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            a = rng.integers(0, max(1, min(100, bounds.get(vi.name, 100))), size=shape).astype(dt)
        else:
            a = rng.standard_normal(shape).astype(dt)
        feeds[vi.name] = np.asarray(a)
    return feeds, dynamic


def labels_for(models: list[tuple[pathlib.Path, dict | None]]) -> list[str]:
    """File names; where two differ only in their folders, enough trailing path parts to tell
    them apart (examples/models/mobilenet_v2.onnx, shared/models/mobilenet_v2.onnx)."""
    parts = [p.resolve().parts for p, _ in models]
    out = []
    for i, ps in enumerate(parts):
        k = 1
        while k < len(ps) and any(j != i and q != ps and q[-k:] == ps[-k:] for j, q in enumerate(parts)):
            k += 1
        out.append("/".join(ps[-k:]))
    return out


# -- timing ------------------------------------------------------------------------------------
def _one(fn) -> float:
    """One timed call (ms), with the same helper for both sides."""
    return time_calls(fn, repeat=1, warmup=0).median_ms


def interleaved(fn_a, fn_b, repeat: int, blocks: int) -> tuple[list[float], list[float]]:
    """Warm both up, then ``blocks`` alternating blocks of each (``repeat`` runs in all per
    side), sleeping SETTLE_S before every block. Returns the samples (ms) of both."""
    a, b = interleaved_many([fn_a, fn_b], repeat, blocks)
    return a, b


def interleaved_many(fns: list, repeat: int, blocks: int) -> list[list[float]]:
    """:func:`interleaved` for any number of sides: each warmed up, then ``blocks`` rounds in
    which every side runs a block in turn; the samples (ms) of each side."""
    for fn in fns:
        for _ in range(WARMUP_RUNS):
            fn()
        time.sleep(SETTLE_S)
    sizes = [repeat // blocks + (1 if i < repeat % blocks else 0) for i in range(blocks)]
    out: list[list[float]] = [[] for _ in fns]
    for n in sizes:
        for fn, acc in zip(fns, out):
            time.sleep(SETTLE_S)
            acc.extend(_one(fn) for _ in range(n))
    return out


def stats(ts: list[float]) -> dict:
    return {"median_ms": statistics.median(ts), "min_ms": min(ts),
            "p90_ms": float(np.percentile(ts, 90)), "n": len(ts)}


def max_abs_err(got, want) -> float:
    if len(got) != len(want):
        raise ValueError(f"{len(got)} outputs, onnxruntime has {len(want)}")
    err = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            raise ValueError(f"output {i}: shape {g.shape} != onnxruntime's {w.shape}")
        if g.size:
            err = max(err, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
    return err


# -- one model ---------------------------------------------------------------------------------
def ort_session(path: pathlib.Path, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def compile_model(path: pathlib.Path, threads: int, feeds: dict, dynamic: dict, tuning=None):
    """(module to time, plain Module for profiles, run function, compile seconds). A module
    that specialises on input values is compiled for these inputs here (counted in the time).
    ``tuning``: tuning record files for ``tensorfuse.compile(tuning=...)`` (None: untuned)."""
    kw = {"input_shapes": dynamic} if dynamic else {}
    if tuning:
        kw["tuning"] = [str(t) for t in tuning]
    t0 = time.perf_counter()
    mod = tensorfuse.compile(str(path), target="llvm", cache=False, num_threads=threads, **kw)
    if hasattr(mod, "module_for"):      # compiler.specialize.SpecializingModule
        inner, rest = mod.module_for(**feeds)
        compile_s = time.perf_counter() - t0
        return inner, rest, (lambda: mod.run(**feeds)), compile_s
    compile_s = time.perf_counter() - t0
    args = [feeds[i.name] for i in mod.input_info]
    return mod, feeds, (lambda: mod.run(*args)), compile_s


def bench_one(label: str, path: pathlib.Path, feeds: dict, dynamic: dict, threads: int, args) -> dict:
    row = {"model": label, "path": str(path), "threads": threads, "error": None}
    stage = "compile"
    try:
        mod, mod_feeds, tf_run, row["compile_s"] = compile_model(path, threads, feeds, dynamic, args.tuning)
        row["kernels"] = getattr(mod, "num_kernels", None)
        rep = getattr(mod, "report", None)
        row["tuned_kernels"] = getattr(rep, "num_tuned_kernels", None) if args.tuning else None
        stage = "onnxruntime session"
        sess = ort_session(path, threads)
        ort_feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
        stage = "check"
        row["max_abs_err"] = max_abs_err(tf_run(), sess.run(None, ort_feeds))
        stage = "timing"
        if args.tuning:     # the same model compiled without records, timed in the same blocks
            stage = "untuned compile"
            _m, _f2, untuned_run, _s = compile_model(path, threads, feeds, dynamic, None)
            stage = "timing"
            tf_ts, ort_ts, un_ts = interleaved_many([tf_run, lambda: sess.run(None, ort_feeds), untuned_run],
                                                    args.repeat, args.blocks)
            row["untuned"] = stats(un_ts)
            row["tuned_vs_untuned"] = statistics.median(tf_ts) / statistics.median(un_ts)
        else:
            tf_ts, ort_ts = interleaved(tf_run, lambda: sess.run(None, ort_feeds), args.repeat, args.blocks)
        row["tensorfuse"], row["onnxruntime"] = stats(tf_ts), stats(ort_ts)
        row["tensorfuse"]["samples_ms"], row["onnxruntime"]["samples_ms"] = tf_ts, ort_ts
        row["ratio"] = row["tensorfuse"]["median_ms"] / row["onnxruntime"]["median_ms"]
        row["_module"] = (mod, mod_feeds)
    except Exception as e:  # noqa: BLE001 - reported in the row, the run goes on
        row["error"] = f"{stage}: {type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()
    return row


# -- kernels -----------------------------------------------------------------------------------
def kernel_kind(r) -> str:
    """'matmul' for Conv/ConvTranspose/MatMul/Gemm kernels and fused ones holding them (the
    kernel that carries the op's FLOP count), else 'memory'."""
    if _CHECK_KERNEL.search(r.kernel):
        return "memory"
    if r.gflops is not None and (any(_MM_OP.search(op) for op in r.ops) or _MM_OP.search(r.kernel)):
        return "matmul"
    return "memory"


def kernel_rows(mod, feeds: dict, repeat: int, sgemm: float, copy_bw: float) -> tuple[list[dict], float]:
    time.sleep(SETTLE_S)
    prof = mod.profile(**feeds, repeat=repeat, warmup=2, show=False)
    out = []
    for r in prof:
        kind = kernel_kind(r)
        d = {"kernel": r.kernel, "nodes": list(r.nodes), "ops": list(r.ops), "median_ms": r.median_ms,
             "share": r.share, "kind": kind, "flops_gflops": r.gflops, "bytes_moved": r.bytes_moved,
             "gflops": None, "pct_sgemm": None, "gbps": None, "pct_copy": None}
        if kind == "matmul":
            d["gflops"] = r.gflops
            d["pct_sgemm"] = 100 * r.gflops / sgemm if sgemm else None
        elif r.median_ms >= MEM_MIN_MS and r.bytes_moved:
            d["gbps"] = r.bytes_moved / (r.median_ms * 1e-3) / 1e9
            d["pct_copy"] = 100 * d["gbps"] / copy_bw if copy_bw else None
        out.append(d)
    return out, prof.total_ms


# -- printing ----------------------------------------------------------------------------------
def md_table(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w[i]) if i in right else c.ljust(w[i]) for i, c in enumerate(cells)) + " |"
    sep = "|" + "|".join(("-" * (w[i] + 1) + ":") if i in right else ("-" * (w[i] + 2)) for i in range(len(w))) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def _f(x, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _trunc(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def print_summary(rows: list[dict], repeat: int, blocks: int) -> None:
    hdr = ["model", "threads", "compile s", "tensorfuse median ms", "onnxruntime median ms", "ratio",
           "max abs err", "tensorfuse min / p90", "onnxruntime min / p90"]
    tuned = any(r.get("tuned_vs_untuned") is not None for r in rows)
    if tuned:
        hdr[6:6] = ["untuned median ms", "tuned / untuned", "tuned kernels"]
    errors = any(r["error"] for r in rows)
    if errors:
        hdr.append("error")
    body = []
    for r in rows:
        if r["error"]:
            body.append([r["model"], str(r["threads"]), _f(r.get("compile_s"), ".2f"), "", "", ""]
                        + (["", "", ""] if tuned else [])
                        + [_f(r.get("max_abs_err"), ".2e"), "", "", _trunc(r["error"], 120)])
            continue
        t, o = r["tensorfuse"], r["onnxruntime"]
        body.append([r["model"], str(r["threads"]), f"{r['compile_s']:.2f}", f"{t['median_ms']:.3f}",
                     f"{o['median_ms']:.3f}", f"{r['ratio']:.2f}x"]
                    + ([f"{r['untuned']['median_ms']:.3f}", f"{r['tuned_vs_untuned']:.3f}", str(r["tuned_kernels"])]
                       if tuned else [])
                    + [f"{r['max_abs_err']:.2e}",
                     f"{t['min_ms']:.3f} / {t['p90_ms']:.3f}", f"{o['min_ms']:.3f} / {o['p90_ms']:.3f}"]
                    + ([""] if errors else []))
    print(f"\n## Whole models (repeat {repeat} per side in {blocks} interleaved blocks; "
          f"ratio = tensorfuse / onnxruntime, median over median)\n")
    print(md_table(hdr, body, right=set(range(1, len(hdr) - (1 if errors else 0)))))
    print()
    for th in sorted({r["threads"] for r in rows}):
        ratios = [r["ratio"] for r in rows if r["threads"] == th and not r["error"]]
        if ratios:
            gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(f"geometric mean ratio, {th} thread{'s' if th > 1 else ''}: {gm:.2f}x over {len(ratios)} model(s)")
        else:
            print(f"geometric mean ratio, {th} thread{'s' if th > 1 else ''}: no model ran")


def print_kernels(label: str, krows: list[dict], total_ms: float, whole_ms: float | None) -> None:
    hdr = ["kernel", "ONNX nodes", "ms", "share", "GFLOP/s", "% sgemm", "GB/s", "% copy"]
    body = []
    for d in krows[:TOP_KERNELS]:
        nodes = ", ".join(d["nodes"]) or "(" + ", ".join(d["ops"]) + ")"
        ms = d["median_ms"]
        body.append([d["kernel"], _trunc(nodes, 56), f"{ms:.3f}" if ms >= 0.01 else f"{ms:.4f}", f"{100 * d['share']:.1f}%",
                     _f(d["gflops"], ".1f"), _f(d["pct_sgemm"], ".0f"), _f(d["gbps"], ".1f"), _f(d["pct_copy"], ".0f")])
    mm = [d for d in krows if d["kind"] == "matmul"]
    mm_ms = sum(d["median_ms"] for d in mm)
    whole = f"; whole run (1 thread) median {whole_ms:.3f} ms" if whole_ms else ""
    print(f"\n### {label}: top {min(TOP_KERNELS, len(krows))} of {len(krows)} kernel calls, 1 thread\n")
    print(md_table(hdr, body, right={2, 3, 4, 5, 6, 7}))
    print(f"\nkernels sum {total_ms:.3f} ms{whole}; Conv/MatMul/Gemm kernels {len(mm)} calls, "
          f"{mm_ms:.3f} ms ({100 * mm_ms / (total_ms or 1):.0f}%)")


# -- main --------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*",
                    help=".onnx files, folders of models, or names of models in --models-dir "
                         "(default: the bundled mobilenet_v2 and every model of --models-dir)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default: 1 2)")
    ap.add_argument("--repeat", type=int, default=30,
                    help=f"timed runs per side, model and thread count (default 30, at least {MIN_REPEAT})")
    ap.add_argument("--blocks", type=int, default=5, help="interleaved blocks per side (default 5)")
    ap.add_argument("--models-dir", type=pathlib.Path, default=SHARED,
                    help="folder with models.json and the .onnx files (default: ../shared/models)")
    ap.add_argument("--no-kernels", action="store_true", help="skip the per-kernel tables")
    ap.add_argument("--json", type=pathlib.Path, help="write the raw numbers to this file")
    ap.add_argument("--tuning", type=pathlib.Path, action="append", default=None,
                    help="tuning records (tensorfuse tune -o FILE) to compile with; repeatable. The model "
                         "is also compiled without them and timed in the same blocks (tuned/untuned)")
    args = ap.parse_args()
    if args.repeat < MIN_REPEAT:
        ap.error(f"--repeat {args.repeat} is too few: medians of fewer than {MIN_REPEAT} runs are noise; "
                 f"give --repeat {MIN_REPEAT} or more")
    if args.blocks < 1 or args.blocks > args.repeat:
        ap.error(f"--blocks must be between 1 and --repeat ({args.repeat}), got {args.blocks}")
    if any(t < 1 for t in args.threads):
        ap.error(f"--threads must be positive integers, got {args.threads}")
    threads = list(dict.fromkeys(args.threads))

    info = machine_info()
    feats = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in info["features"].items())
    print(f"CPU: {info['cpu']} ({info.get('model_name', '?')}), {info['cores']} cores available; {feats}")
    print(f"onnxruntime {info['onnxruntime']}, numpy {info['numpy']}")
    if max(threads) > (info["cores"] or 1):
        print(f"note: {max(threads)} threads on {info['cores']} available cores: the numbers mean little")

    models = collect_models(args)
    labels = labels_for(models)
    refs = {}
    if not args.no_kernels:
        sgemm, how = measure_sgemm()
        copy_bw = measure_copy_bw()
        refs = {"sgemm_gflops": sgemm, "sgemm_how": how, "copy_gbps": copy_bw}
        print(f"sgemm (numpy a @ b, float32, 1 thread; {how}): "
              + ", ".join(f"n={n}: {g:.1f} GFLOP/s" for n, g in sgemm.items())
              + f"; reference = best, {max(sgemm.values()):.1f} GFLOP/s")
        print(f"copy bandwidth (np.copyto, 64 MiB float32, 1 thread, read + write): {copy_bw:.1f} GB/s")
    print(flush=True)

    rows: list[dict] = []
    kernels: dict[str, dict] = {}
    for (path, entry), label in zip(models, labels):
        try:
            if entry is not None:
                feeds, dynamic = model_inputs(entry, seed=0), {}
            else:
                feeds, dynamic = declared_inputs(path)
        except Exception as e:  # noqa: BLE001
            for th in threads:
                rows.append({"model": label, "path": str(path), "threads": th,
                             "error": f"inputs: {type(e).__name__}: {e}"})
                print(f"{label:30s} threads {th}: ERROR {rows[-1]['error']}", flush=True)
            continue
        one_thread = None
        for th in threads:
            r = bench_one(label, path, feeds, dynamic, th, args)
            rows.append(r)
            if r["error"]:
                print(f"{label:30s} threads {th}: ERROR {r['error']}", flush=True)
            else:
                t, o = r["tensorfuse"], r["onnxruntime"]
                print(f"{label:30s} threads {th}: compile {r['compile_s']:6.2f} s  tensorfuse {t['median_ms']:8.3f} ms  "
                      f"onnxruntime {o['median_ms']:8.3f} ms  ratio {r['ratio']:5.2f}x  max|err| {r['max_abs_err']:.2e}"
                      + (f"  tuned kernels {r['tuned_kernels']}, untuned {r['untuned']['median_ms']:.3f} ms, "
                         f"tuned/untuned {r['tuned_vs_untuned']:.3f}" if r.get("tuned_kernels") is not None else ""),
                      flush=True)
            module = r.pop("_module", None)
            if th == 1:
                one_thread = (module, r)
        if args.no_kernels:
            continue
        try:
            whole_ms = None
            if one_thread is not None and one_thread[0] is not None:
                (mod, mod_feeds), whole_ms = one_thread[0], one_thread[1]["tensorfuse"]["median_ms"]
            elif one_thread is not None:     # the 1-thread row failed: its error is in the table
                kernels[label] = {"error": "no profile: the 1-thread run failed (see the table above)"}
                continue
            else:           # 1 thread was not asked for: a 1-thread module for the profile only
                mod, mod_feeds, _run, _s = compile_model(path, 1, feeds, dynamic, args.tuning)
            krows, total = kernel_rows(mod, mod_feeds, args.repeat, max(refs["sgemm_gflops"].values()),
                                       refs["copy_gbps"])
            kernels[label] = {"rows": krows, "total_ms": total, "whole_run_ms": whole_ms}
        except Exception as e:  # noqa: BLE001
            kernels[label] = {"error": f"profile: {type(e).__name__}: {e}"}
        one_thread = mod = None

    print_summary(rows, args.repeat, args.blocks)
    if not args.no_kernels:
        print(f"\n## Kernels (1 thread, Module.profile, repeat {args.repeat}); % sgemm of "
              f"{max(refs['sgemm_gflops'].values()):.1f} GFLOP/s, % copy of {refs['copy_gbps']:.1f} GB/s; "
              f"GB/s = bytes of the kernel's distinct buffers / time, for memory-bound kernels of "
              f">= {MEM_MIN_MS} ms")
        for label, k in kernels.items():
            if "error" in k:
                print(f"\n### {label}: ERROR {k['error']}")
            else:
                print_kernels(label, k["rows"], k["total_ms"], k["whole_run_ms"])
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "references": refs, "repeat": args.repeat,
                                         "blocks": args.blocks, "threads": threads, "runs": rows,
                                         "kernels": kernels}, indent=1, default=str))
        print(f"\nraw numbers: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
