"""Benchmark: tensorfuse's GEMM at transformer shapes beside numpy's sgemm and onnxruntime.

For each shape [M, K] x [K, N] (M tokens, a constant [K, N] weight, as a transformer's
projections and MLP are exported: MatMul with an initializer), in the same run:

* tensorfuse: a one-node MatMul model compiled with ``num_threads=T`` (the weight packed at
  compile time as the schedule wants it), wall time of ``Module.run``;
* onnxruntime: the same model, ``ORT_ENABLE_ALL``, ``intra_op_num_threads=T``;
* numpy: ``np.matmul(a, b, out=c)`` in a child process with ``OPENBLAS_NUM_THREADS=T`` and
  ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` unset (OpenBLAS then detects this CPU's kernel
  itself; the variables are unset for that child only).

Reported per shape: the median ms of each, GFLOP/s (2*M*K*N / time), tensorfuse as % of
sgemm's GFLOP/s and the ratio tensorfuse / onnxruntime (median over median). tensorfuse and
onnxruntime are timed in interleaved blocks (``--blocks``), so a slow stretch of the machine hits
both alike; numpy's child is timed right after.

Usage::

    .venv/bin/python benchmarks/bench_gemm.py [--threads 1] [--repeat 50] [--blocks 5]
        [--shape 197x768x3072 ...] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(ROOT))

#: [M, K, N]: BERT/ViT/GPT-2 base projections (768 -> 768, QKV 2304, MLP 3072 and back) at 64
#: (GPT-2's benchmark length), 128 (BERT) and 197 (ViT-B/16) tokens, a token at a time (M = 1),
#: and a small model's 256-wide layers
DEFAULT_SHAPES = [(m, k, n) for m in (64, 128, 197) for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768))] \
    + [(1, 768, 3072), (512, 768, 768), (128, 256, 1024)]

_NUMPY_CHILD = r"""
import json, sys, time, statistics
import numpy as np
shapes, repeat = json.loads(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
out = {}
for m, k, n in shapes:
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    for _ in range(3):
        np.matmul(a, b, out=c)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        ts.append((time.perf_counter() - t0) * 1e3)
    out[f"{m}x{k}x{n}"] = statistics.median(ts)
print(json.dumps(out))
"""


def numpy_ms(shapes, threads: int, repeat: int) -> dict:
    """Median ms of numpy's sgemm per shape, in a child with OpenBLAS pinned to ``threads``."""
    env = dict(os.environ)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-c", _NUMPY_CHILD, json.dumps(shapes), str(repeat)], env=env,
                       capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def matmul_model(m: int, k: int, n: int, seed: int = 0):
    """y[M, N] = x[M, K] @ W[K, N], W a float32 initializer (standard normal / sqrt(K))."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = (np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], f"gemm_{m}x{k}x{n}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def bench_shape(m, k, n, threads: int, repeat: int, blocks: int) -> dict:
    import onnx
    import onnxruntime as ort

    import tensorfuse
    from tensorfuse.runtime.profile import time_calls
    model = matmul_model(m, k, n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(model, path)
        t0 = time.perf_counter()
        mod = tensorfuse.compile(path, num_threads=threads, cache=False)
        compile_s = time.perf_counter() - t0
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
    got, want = mod.run(x)[0], sess.run(None, {"x": x})[0]
    err = float(np.max(np.abs(got - want)))
    tf_ts, ort_ts = [], []
    per = max(1, repeat // blocks)
    inputs = mod._check_inputs((x,), {})
    for _ in range(blocks):
        time.sleep(0.15)
        tf_ts.append(time_calls(lambda: mod.run(*inputs), per, 2))
        time.sleep(0.15)
        ort_ts.append(time_calls(lambda: sess.run(None, {"x": x}), per, 2))
    tf = statistics.median(b.median_ms for b in tf_ts)
    on = statistics.median(b.median_ms for b in ort_ts)
    kern = next((kk for kk in mod.kernels), None)
    return {"shape": f"{m}x{k}x{n}", "tensorfuse_ms": tf, "onnxruntime_ms": on, "max_abs_diff": err,
            "compile_s": compile_s, "schedule": getattr(kern, "schedule", None), "knobs": getattr(kern, "knobs", None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=50, help="runs per side in all (default 50)")
    ap.add_argument("--blocks", type=int, default=5, help="interleaved blocks per side (default 5)")
    ap.add_argument("--shape", action="append", metavar="MxKxN", help="shapes instead of the default set")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shape] if args.shape else DEFAULT_SHAPES
    rows = [bench_shape(m, k, n, args.threads, args.repeat, args.blocks) for m, k, n in shapes]
    np_ms = numpy_ms([list(s) for s in shapes], args.threads, args.repeat)
    print(f"GEMM [M,K] x [K,N] (constant weight), {args.threads} thread{'s' if args.threads > 1 else ''}; "
          f"numpy sgemm with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset")
    hdr = ("shape", "tensorfuse ms", "GFLOP/s", "% sgemm", "sgemm ms", "ort ms", "tf / ort", "schedule")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for (m, k, n), r in zip(shapes, rows):
        flop = 2.0 * m * k * n
        r["numpy_ms"] = np_ms[r["shape"]]
        r["gflops"] = flop / r["tensorfuse_ms"] / 1e6
        r["pct_sgemm"] = 100.0 * r["numpy_ms"] / r["tensorfuse_ms"]
        r["vs_ort"] = r["tensorfuse_ms"] / r["onnxruntime_ms"]
        print(f"| {r['shape']} | {r['tensorfuse_ms']:.3f} | {r['gflops']:.1f} | {r['pct_sgemm']:.0f} | "
              f"{r['numpy_ms']:.3f} | {r['onnxruntime_ms']:.3f} | {r['vs_ort']:.2f} | {r['schedule']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
