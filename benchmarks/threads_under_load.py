"""Benchmark: 2 threads against 1 with and without a competing busy process (issue 24 item 2).

For each model, tensorfuse and onnxruntime each at 1 and at ``--threads`` threads (default 2),
in one process, in two conditions:

* quiet: nothing else started by this script (measured first);
* loaded: a busy process (a Python ``while True: pass``) pinned to one core with
  ``os.sched_setaffinity`` (``--load-core``, default the last core this process may use),
  while this process keeps every core it may use, as when another program shares the machine.

Per condition and side the four configurations are timed in interleaved blocks (``--blocks``
blocks of ``--repeat`` runs each, ~0.1 s settle sleep before each block, so that spinning
worker threads of one configuration do not slow the next); each cell is the median over all
its runs, in ms. Ratios, side by side: ``tf NT/1T`` (tensorfuse at N threads over its own 1
thread: the target is at most 1.1 loaded), ``ort NT/1T`` (the same for onnxruntime) and
``tf/ort NT`` (tensorfuse over onnxruntime, both at N threads: the target is at most 1.0).

tensorfuse: ``tensorfuse.compile(model, num_threads=N)`` (through the compile cache), one module
per thread count. onnxruntime: ``ORT_ENABLE_ALL``, ``intra_op_num_threads=N``,
``inter_op_num_threads=1``. Outputs are checked against onnxruntime once before timing.

Models (default): ../shared/models/squeezenet1_1.onnx and mobilenet_v2.onnx, onnx's
``light_shufflenet.onnx`` (from the onnx package's backend test data, offline), and a tiny
model of three kernels (MatMul, LayerNormalization, MatMul on [64, 256]); or .onnx paths given as
arguments. Numbers depend on what else runs on the machine: say so with them.

Usage::

    .venv/bin/python benchmarks/threads_under_load.py [--quick] [--threads 2] [--repeat 40]
        [--blocks 5] [--load-core K] [--no-quiet] [model.onnx ...]
    .venv/bin/python benchmarks/threads_under_load.py --quick      # ~1-2 min: fewer runs
    TENSORFUSE_ADAPTIVE_TEAM=1 .venv/bin/python benchmarks/threads_under_load.py   # runs alone when faster

By default every run of a tensorfuse module goes to its team (the phase protocol itself); with
``TENSORFUSE_ADAPTIVE_TEAM=1`` the team times whole runs on the team and on the calling thread
alone and takes the faster (``runtime.threads.RunChoice``). ``TENSORFUSE_CHUNKS_PER_THREAD``
sets the chunks per thread of a parallel loop (default 4).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tensorfuse  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"
BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def default_models() -> list:
    """(label, path or ModelProto) of the default models that exist here."""
    import onnx
    out = []
    for name in ("squeezenet1_1.onnx", "mobilenet_v2.onnx"):
        if (SHARED / name).exists():
            out.append((name, str(SHARED / name)))
    light = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_shufflenet.onnx"
    if light.exists():
        out.append(("light_shufflenet.onnx", str(light)))
    out.append(("tiny (3 kernels)", tiny_model()))
    return out


def tiny_model():
    """MatMul [64,256]x[256,256] -> LayerNormalization -> MatMul [256,256]: three kernels of
    a few tens of microseconds each."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def const(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w2"], ["y"])]
    g = helper.make_graph(nodes, "tiny3", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])],
                          [const("w1", 256, 256), const("g", 256), const("b", 256), const("w2", 256, 256)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds_for(model) -> dict:
    """Fixed-seed inputs of the model's declared shapes (dynamic dims -> 1), standard normal."""
    import onnx
    m = model if isinstance(model, onnx.ModelProto) else onnx.load(model, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(0)
    out = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def ort_session(model, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def timed(fn, n: int) -> list[float]:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def measure(fns: dict, repeat: int, blocks: int) -> dict:
    """Median ms of each configuration, timed in interleaved blocks after 6 warm-up runs each
    (a tensorfuse team times its first runs on the team and alone: ``RunChoice``)."""
    for fn in fns.values():
        for _ in range(6):
            fn()
    per = max(1, repeat // blocks)
    ts = {k: [] for k in fns}
    for b in range(blocks):
        order = list(fns) if b % 2 == 0 else list(fns)[::-1]
        for k in order:
            time.sleep(0.1)
            ts[k] += timed(fns[k], per)
    return {k: statistics.median(v) for k, v in ts.items()}


class BusyCore:
    """A busy process pinned to core ``core`` while the ``with`` block runs."""

    def __init__(self, core: int):
        self.core = core
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY, str(self.core)])
        time.sleep(0.3)                       # let it start spinning
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help=".onnx files (default: see the module docstring)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=40, help="runs per configuration and condition")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="12 runs in 3 blocks (a check, not a measurement)")
    ap.add_argument("--load-core", type=int, default=None, help="the core the busy process spins on")
    ap.add_argument("--no-quiet", action="store_true", help="only the loaded condition")
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.blocks = 12, 3
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1] if args.load_core is None else args.load_core
    models = [(pathlib.Path(p).name, p) for p in args.models] or default_models()
    n = args.threads
    conditions = ([] if args.no_quiet else ["quiet"]) + ["loaded"]
    rows = []
    for label, model in models:
        feeds = feeds_for(model)
        tf = {t: tensorfuse.compile(model, num_threads=t) for t in (1, n)}
        ort = {t: ort_session(model, t) for t in (1, n)}
        ref = ort[1].run(None, feeds)
        err = max(float(np.max(np.abs(a - b))) for t in (1, n) for a, b in zip(tf[t].run(**feeds), ref))
        fns = {("tf", t): (lambda m=tf[t]: m.run(**feeds)) for t in (1, n)}
        fns.update({("ort", t): (lambda s=ort[t]: s.run(None, feeds)) for t in (1, n)})
        for cond in conditions:
            if cond == "loaded":
                with BusyCore(core):
                    med = measure(fns, args.repeat, args.blocks)
            else:
                med = measure(fns, args.repeat, args.blocks)
            rows.append((label, cond, tf[1].num_kernels, med, err))
            r = rows[-1]
            print(_row(r, n), flush=True)
    print()
    print(_header(n))
    for r in rows:
        print(_row(r, n))
    print(f"\n{len(cores)} cores; loaded: a busy process pinned to core {core}; "
          f"{args.repeat} runs per cell in {args.blocks} blocks; medians in ms")
    bad = [r for r in rows if r[1] == "loaded" and (r[3]["tf", n] > 1.1 * r[3]["tf", 1] or r[3]["tf", n] > r[3]["ort", n])]
    for r in bad:
        print(f"target missed (loaded): {r[0]}: tf {n}T/1T {r[3]['tf', n] / r[3]['tf', 1]:.2f} (<= 1.1), "
              f"tf/ort {n}T {r[3]['tf', n] / r[3]['ort', n]:.2f} (<= 1.0)")
    return 0


def _header(n: int) -> str:
    return (f"| {'model':24s} | {'condition':9s} | kernels | {'tf 1T':>7s} | {'tf ' + str(n) + 'T':>7s} | "
            f"{'ort 1T':>7s} | {'ort ' + str(n) + 'T':>7s} | tf {n}T/1T | ort {n}T/1T | tf/ort {n}T | max err  |\n"
            f"|{'-' * 26}|{'-' * 11}|---------|---------|---------|---------|---------|----------|-----------|"
            f"-----------|----------|")


def _row(r, n: int) -> str:
    label, cond, kernels, m, err = r
    return (f"| {label:24s} | {cond:9s} | {kernels:7d} | {m['tf', 1]:7.3f} | {m['tf', n]:7.3f} | "
            f"{m['ort', 1]:7.3f} | {m['ort', n]:7.3f} | {m['tf', n] / m['tf', 1]:8.2f} | "
            f"{m['ort', n] / m['ort', 1]:9.2f} | {m['tf', n] / m['ort', n]:9.2f} | {err:.2e} |")


if __name__ == "__main__":
    raise SystemExit(main())
