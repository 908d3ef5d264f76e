"""Benchmark: tensorfuse beside onnxruntime on the shared real models, in the same process.

For each model: compile time (s), kernels per run, median run time (ms) of tensorfuse and of
onnxruntime (all graph optimisations on, and off), both with the same number of threads, and
the ratios. Models: .onnx files, folders (with a models.json, or every .onnx in them) or names
of models in ``--models-dir`` (the shared models by default), as for bench_models.py; a file
without a models.json entry gets fixed-seed inputs of its declared shapes. Usage::

    .venv/bin/python benchmarks/models.py [--threads 1] [--repeat 20] [--opt-level 2] [MODEL ...]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tensorfuse  # noqa: E402
from bench_models import collect_models, declared_inputs, labels_for  # noqa: E402
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
    ap.add_argument("models", nargs="*", help=".onnx files, folders or model names (default: --models-dir)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--opt-level", type=int, default=2)
    ap.add_argument("--models-dir", type=pathlib.Path, default=SHARED,
                    help="folder with models.json and the .onnx files (default: ../shared/models)")
    args = ap.parse_args()
    models = collect_models(args)
    rows = []
    for (p, e), label in zip(models, labels_for(models)):
        path = str(p)
        feeds, dynamic = (model_inputs(e, seed=0), {}) if e else declared_inputs(p, seed=0)
        t0 = time.perf_counter()
        mod = tensorfuse.compile(path, target="llvm", opt_level=args.opt_level, cache=False,
                                 input_shapes=dynamic or None, num_threads=args.threads)
        compile_s = time.perf_counter() - t0
        ours = mod.benchmark(**feeds, repeat=args.repeat).median_ms
        ort_on = ort_session(path, args.threads, True)
        ort_off = ort_session(path, args.threads, False)
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(mod.run(**feeds), ort_off.run(None, feeds)))
        t_on = time_calls(lambda: ort_on.run(None, feeds), args.repeat).median_ms
        t_off = time_calls(lambda: ort_off.run(None, feeds), args.repeat).median_ms
        rows.append((label, compile_s, mod.num_kernels, ours, t_on, t_off, err))
        print(f"{label:28s} compile {compile_s:6.2f} s  kernels {mod.num_kernels:4d}  "
              f"tensorfuse {ours:8.2f} ms  ort(opt) {t_on:7.2f} ms  ort(no opt) {t_off:7.2f} ms  "
              f"ratio {ours / t_on:5.2f}x / {ours / t_off:5.2f}x  max|err| {err:.2e}", flush=True)
    print(f"\nthreads={args.threads} opt_level=O{args.opt_level} repeat={args.repeat}; ratio = tensorfuse / onnxruntime")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
