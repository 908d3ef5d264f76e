"""Benchmark: tensorfuse beside onnxruntime on the shared real models, in the same process.

For each model: compile time (s), kernels per run, median run time (ms) of tensorfuse and of
onnxruntime (all graph optimisations on, and off), both with the same number of threads, and
the ratios. Usage::

    .venv/bin/python benchmarks/models.py [--threads 1] [--repeat 20] [--opt-level 2] [model.onnx ...]
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tensorfuse import compiler  # noqa: E402
from oracle import model_inputs  # noqa: E402
from tensorfuse.runtime.profile import time_calls  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"


def ort_session(path: str, threads: int, optimise: bool):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimise
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--opt-level", type=int, default=2)
    ap.add_argument("--models-dir", type=pathlib.Path, default=SHARED,
                    help="folder with models.json and the .onnx files (default: ../shared/models)")
    args = ap.parse_args()
    if not (args.models_dir / "models.json").exists():
        ap.error(f"{args.models_dir / 'models.json'} not found: give the shared models folder with --models-dir")
    entries = json.loads((args.models_dir / "models.json").read_text())["models"]
    if args.models:
        entries = [e for e in entries if any(m in e["file"] for m in args.models)]
    kw = {}
    if "cache" in inspect.signature(tensorfuse.compile).parameters:
        kw["cache"] = False
    rows = []
    for e in entries:
        path = str(args.models_dir / e["file"])
        feeds = model_inputs(e, seed=0)
        t0 = time.perf_counter()
        mod = tensorfuse.compile(path, target="llvm", opt_level=args.opt_level, **kw)
        compile_s = time.perf_counter() - t0
        ours = mod.benchmark(**feeds, repeat=args.repeat).median_ms
        ort_on = ort_session(path, args.threads, True)
        ort_off = ort_session(path, args.threads, False)
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(mod.run(**feeds), ort_off.run(None, feeds)))
        t_on = time_calls(lambda: ort_on.run(None, feeds), args.repeat).median_ms
        t_off = time_calls(lambda: ort_off.run(None, feeds), args.repeat).median_ms
        rows.append((e["file"], compile_s, mod.num_kernels, ours, t_on, t_off, err))
        print(f"{e['file']:28s} compile {compile_s:6.2f} s  kernels {mod.num_kernels:4d}  "
              f"tensorfuse {ours:8.2f} ms  ort(opt) {t_on:7.2f} ms  ort(no opt) {t_off:7.2f} ms  "
              f"ratio {ours / t_on:5.2f}x / {ours / t_off:5.2f}x  max|err| {err:.2e}", flush=True)
    print(f"\nthreads={args.threads} opt_level=O{args.opt_level} repeat={args.repeat}; ratio = tensorfuse / onnxruntime")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
