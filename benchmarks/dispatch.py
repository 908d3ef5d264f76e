"""Benchmark: the thread team's cost per parallel kernel (dispatch + phase), in microseconds.

What it measures. A model that is a chain of N elementwise Adds, ``h[i+1] = h[i] + x``, compiled
at opt_level 0 (fuse_ops, at O2, would merge the chain into one kernel) with ``cache=False``:
one kernel per Add, each a parallel kernel (checked: ``codegen.llvm.emit.kernel_is_parallel``
and the entry passing it the team), so at 2 threads every kernel is a phase whose chunks the
threads claim once the previous kernel's chunks are done (``codegen.llvm.emit.phase_helpers``;
``$TENSORFUSE_CHUNKS_PER_THREAD`` sets the chunks). Two shapes:

* ``tiny`` [1, 16]: a chunk is a few additions, so the time per kernel is the dispatch
  cost itself. The default schedule leaves a kernel this small serial
  (``ir.schedule.MIN_PARALLEL_WORK``); the script sets that constant to 0 while compiling these
  modules (and only them) to force parallel kernels.
* ``default`` [1, 64, 512]: 32768 elements (``MIN_PARALLEL_WORK``), the smallest kernel the
  default schedule makes parallel; here the work per kernel is not negligible, so the script also reports the cost
  beyond a perfect halving of the 1-thread time.

How. Each shape is compiled as a short chain (``--base`` kernels) and a long one
(``--kernels``); the cost per kernel is the slope (t_long - t_short) / (N_long - N_short) of the
median ``Module.run`` wall time (``runtime.profile.time_calls``), which cancels what every run
pays once (Python, the input checks, waking the team's workers). Thread counts come from
``--threads``; runs are interleaved in ``--blocks`` blocks (every module and thread count per
block), and the reported number is the median over blocks. The chain's output is checked once
per thread count against float32 numpy (exactly). Timings on a shared machine are noisy: read
the spread (the min and max of the block medians are printed too), and there is no threshold
in any test. The issue's target: under 10 us per parallel kernel at 2 threads.

Usage::

    .venv/bin/python benchmarks/dispatch.py [--kernels 200] [--base 20] [--threads 1 2]
        [--repeat 200] [--blocks 5] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tensorfuse import compiler  # noqa: E402
import tensorfuse.ir.schedule  # noqa: E402
from tensorfuse import ir  # noqa: E402
from tensorfuse.codegen.llvm.emit import kernel_is_parallel  # noqa: E402
from codegen_util import parallel_kernels  # noqa: E402
from tensorfuse.runtime.profile import time_calls  # noqa: E402

SHAPES = {"tiny": (1, 16), "default": (1, 64, ir.schedule.MIN_PARALLEL_WORK // 64)}


def chain_model(n: int, shape) -> onnx.ModelProto:
    """h0 = x, h[i+1] = h[i] + x for i < n; output h[n]."""
    nodes = []
    for i in range(n):
        src = "x" if i == 0 else f"h{i}"
        dst = "y" if i == n - 1 else f"h{i + 1}"
        nodes.append(helper.make_node("Add", [src, "x"], [dst], name=f"add{i}"))
    g = helper.make_graph(nodes, f"chain{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def build(n: int, shape, force_parallel: bool):
    saved = ir.schedule.MIN_PARALLEL_WORK
    if force_parallel:
        ir.schedule.MIN_PARALLEL_WORK = 0
    try:
        # cache=False: the compile cache's key does not include MIN_PARALLEL_WORK
        mod = tensorfuse.compile(chain_model(n, shape), opt_level=0, cache=False, num_threads=1)
    finally:
        ir.schedule.MIN_PARALLEL_WORK = saved
    if mod.num_kernels != n:
        raise SystemExit(f"chain of {n}: {mod.num_kernels} kernels, expected {n}")
    serial = [k.name for k in mod.kernels if not kernel_is_parallel(k)]
    missing = {k.name for k in mod.kernels} - parallel_kernels(mod)
    if serial or missing:
        raise SystemExit(f"chain of {n} {list(shape)}: kernels not parallel: {sorted(set(serial) | missing)[:5]}")
    return mod


def reference(x: np.ndarray, n: int) -> np.ndarray:
    h = x.copy()
    for _ in range(n):
        h = h + x
    return h


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=200, help="kernels of the long chain")
    ap.add_argument("--base", type=int, default=20, help="kernels of the short chain")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=200, help="runs per measurement")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--json", help="write the raw numbers here")
    a = ap.parse_args(argv)
    if not 1 <= a.base < a.kernels:
        ap.error("need 1 <= --base < --kernels")

    rng = np.random.default_rng(0)
    mods, inputs = {}, {}
    for name, shape in SHAPES.items():
        x = rng.standard_normal(shape).astype(np.float32)
        inputs[name] = x
        for n in (a.base, a.kernels):
            mod = build(n, shape, force_parallel=name == "tiny")
            want = reference(x, n)
            for t in a.threads:
                mod.num_threads = t
                got = mod.run(x=x)[0]
                if not np.array_equal(got, want):
                    raise SystemExit(f"{name} chain of {n} at {t} threads: wrong result "
                                     f"(max abs error {np.abs(got - want).max()})")
            mods[name, n] = mod
    print(f"chains of {a.base} and {a.kernels} parallel Add kernels (opt_level 0); "
          f"{a.blocks} blocks x {a.repeat} runs per point; median of block medians")

    samples: dict = {}
    for _ in range(a.blocks):
        for t in a.threads:
            for (name, n), mod in mods.items():
                mod.num_threads = t
                x = inputs[name]
                b = time_calls(lambda: mod.run(x=x), repeat=a.repeat, warmup=10)
                samples.setdefault((name, n, t), []).append(b.median_ms)

    def run_ms(name, n, t):
        return statistics.median(samples[name, n, t])

    rows, raw = [], {}
    for name, shape in SHAPES.items():
        per1 = None
        for t in a.threads:
            slope = [(hi - lo) / (a.kernels - a.base) * 1e3
                     for lo, hi in zip(samples[name, a.base, t], samples[name, a.kernels, t])]
            per = (run_ms(name, a.kernels, t) - run_ms(name, a.base, t)) / (a.kernels - a.base) * 1e3
            if t == 1:
                per1 = per
            extra = per - per1 / t if per1 is not None and t > 1 else None
            rows.append((name, list(shape), t, run_ms(name, a.kernels, t), per, min(slope), max(slope), extra))
            raw[f"{name}/{t}"] = {"shape": list(shape), "threads": t, "us_per_kernel": per,
                                  "us_per_kernel_blocks": slope, "extra_us_vs_1_thread": extra,
                                  "run_ms": {str(n): samples[name, n, t] for n in (a.base, a.kernels)}}
    print(f"{'shape':8s} {'elements':>8s} {'threads':>7s} {'run ms':>8s} {'us/kernel':>10s} "
          f"{'(blocks min..max)':>18s} {'us beyond t1/T':>15s}")
    for name, shape, t, ms, per, lo, hi, extra in rows:
        ex = f"{extra:15.2f}" if extra is not None else f"{'':15s}"
        print(f"{name:8s} {int(np.prod(shape)):8d} {t:7d} {ms:8.3f} {per:10.2f} {lo:8.2f}..{hi:<8.2f} {ex}")
    print("us/kernel: cost of one more parallel kernel in the chain (the slope); for 'tiny' this is the\n"
          "dispatch + phase cost itself. 'us beyond t1/T': us/kernel at T threads minus the 1-thread\n"
          "us/kernel divided by T (what splitting failed to save). Target: < 10 us per kernel at 2 threads.")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
