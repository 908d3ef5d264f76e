"""Benchmark: tensorfuse's fused attention beside onnxruntime on the same ONNX subgraph (issue 22,
acceptance 2: "attention at S = 128 and S = 197 takes no longer than onnxruntime's time for the
same subgraph").

The subgraph is the one the torch exporters write for scaled dot-product attention once the
projections and the head split are done (inputs are the per-head Q, K, V, float32):

* ``bert``: Q, K, V [B, H, S, D]; MatMul(Q, Transpose(K, perm=[0, 1, 3, 2])) -> Div(sqrt(D))
  -> Add(mask [B, 1, 1, S], 0 or -10000 per key as BERT's extended attention mask)
  -> Softmax(axis=-1) -> MatMul(., V)  (BERT-base: H = 12, D = 64, S = 128);
* ``vit``: the same without the mask (ViT-B/16: H = 12, D = 64, S = 197);
* ``causal``: GPT-2's form, Where(causal bool [1, 1, S, S], scores, -inf-like) instead of the
  Add (GPT-2 small: H = 12, D = 64, S = 64).

tensorfuse compiles the subgraph at O2 (where ``FuseAttention`` turns it into one
``tensorfuse::Attention`` kernel; the schedule column says which kernel ran), onnxruntime runs it
with ``ORT_ENABLE_ALL``; both with ``T`` threads, timed in interleaved blocks in this process
(``bench_models.interleaved``; median ms, ratio tensorfuse / onnxruntime). The outputs are
compared (max abs difference).

Usage::

    .venv/bin/python benchmarks/bench_attention.py [--threads 1 2] [--repeat 50] [--blocks 5]
        [--case bert:128 vit:197 causal:64 ...] [--heads 12] [--head-size 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(ROOT))

DEFAULT_CASES = ["bert:128", "vit:197", "causal:64", "bert:384"]


def attention_model(kind: str, s: int, heads: int, d: int, batch: int = 1):
    """The attention subgraph of ``kind`` (bert, vit or causal) as an ONNX model (opset 17).

    Inputs: q, k, v float32 [batch, heads, s, d]; bert also ``mask`` float32 [batch, 1, 1, s].
    Output: y float32 [batch, heads, s, d]. Raises ValueError for an unknown kind."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    if kind not in ("bert", "vit", "causal"):
        raise ValueError(f"unknown attention case {kind!r}: give bert, vit or causal")
    shp = [batch, heads, s, d]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shp) for n in ("q", "k", "v")]
    inits = [numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "scale")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Div", ["qk", "scale"], ["scores"])]
    last = "scores"
    if kind == "bert":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, 1, 1, s]))
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
        last = "masked"
    elif kind == "causal":
        causal = np.tril(np.ones((s, s), bool))[None, None]
        inits += [numpy_helper.from_array(causal, "causal"),
                  numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "neg")]
        nodes.append(helper.make_node("Where", ["causal", "scores", "neg"], ["masked"]))
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"])]
    g = helper.make_graph(nodes, f"attention_{kind}_{s}", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shp)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _inputs(kind: str, s: int, heads: int, d: int, batch: int = 1) -> dict:
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((batch, heads, s, d), dtype=np.float32) for n in ("q", "k", "v")}
    if kind == "bert":     # the last eighth of the keys padded out, as a batch of shorter texts
        mask = np.zeros((batch, 1, 1, s), np.float32)
        mask[..., s - s // 8:] = -10000.0
        feed["mask"] = mask
    return feed


def bench_case(kind: str, s: int, heads: int, d: int, threads: int, repeat: int, blocks: int) -> dict:
    import onnx
    import onnxruntime as ort

    import tensorfuse
    from bench_models import interleaved       # the benchmarks' one timing method
    model = attention_model(kind, s, heads, d)
    feed = _inputs(kind, s, heads, d)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "a.onnx")
        onnx.save(model, path)
        t0 = time.perf_counter()
        mod = tensorfuse.compile(path, num_threads=threads, cache=False)
        compile_s = time.perf_counter() - t0
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    got, want = mod.run(**feed)[0], sess.run(None, feed)[0]
    err = float(np.max(np.abs(got - want)))
    inputs = mod._check_inputs((), feed)
    tf_ts, ort_ts = interleaved(lambda: mod.run(*inputs), lambda: sess.run(None, feed), repeat, blocks)
    tf, on = statistics.median(tf_ts), statistics.median(ort_ts)
    kernels = [f"{k.name}:{getattr(k, 'schedule', None) or '-'}" for k in mod.kernels]
    return {"case": f"{kind}:{s}", "threads": threads, "tensorfuse_ms": tf, "onnxruntime_ms": on,
            "ratio": tf / on, "max_abs_diff": err, "compile_s": compile_s, "kernels": kernels}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default: 1 2)")
    ap.add_argument("--repeat", type=int, default=50, help="runs per side in all (default 50)")
    ap.add_argument("--blocks", type=int, default=5, help="interleaved blocks per side (default 5)")
    ap.add_argument("--case", nargs="+", default=DEFAULT_CASES, metavar="KIND:S",
                    help=f"cases (kind bert, vit or causal; S tokens); default {' '.join(DEFAULT_CASES)}")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-size", type=int, default=64)
    args = ap.parse_args(argv)
    if args.repeat < 20:
        ap.error(f"--repeat {args.repeat} is too few: medians of fewer than 20 runs are noise")
    rows = []
    for case in args.case:
        kind, _, s = case.partition(":")
        for t in args.threads:
            rows.append(bench_case(kind, int(s), args.heads, args.head_size, t, args.repeat, args.blocks))
    print(f"attention subgraph, {args.heads} heads x {args.head_size}, float32, batch 1 "
          f"(onnxruntime {__import__('onnxruntime').__version__}, ORT_ENABLE_ALL)")
    print("| case | threads | tensorfuse ms | onnxruntime ms | tf / ort | max abs diff | kernels |")
    print("|---|--:|--:|--:|--:|--:|---|")
    for r in rows:
        print(f"| {r['case']} | {r['threads']} | {r['tensorfuse_ms']:.3f} | {r['onnxruntime_ms']:.3f} | "
              f"{r['ratio']:.2f}x | {r['max_abs_diff']:.1e} | {', '.join(r['kernels'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
