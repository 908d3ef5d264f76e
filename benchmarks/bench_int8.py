"""Benchmark: tensorfuse's int8 convolution and GEMM kernels beside its float32 kernels of the
same shapes, in the same run, one thread (issue 23, acceptance 3).

For each shape, two one-node models compiled by tensorfuse for the same target string:

* int8: ``ConvInteger`` (x u8 [1, C, H, W] with a nonzero scalar zero point, w s8 constant) or
  ``MatMulInteger`` (A u8 [M, K] with a nonzero zero point, B s8 [K, N] constant): int32
  output, the schedules ``conv2d_int8`` / ``matmul_int8``;
* for each conv shape also its QDQ form, rows ``qconv``: DequantizeLinear (u8, per tensor) ->
  Conv (s8 weights per output channel, int32 bias) -> Relu -> QuantizeLinear (u8, zero point 0:
  the range onnxruntime's quantizer gives a Relu's output), as it writes a quantized model's
  convolutions; tensorfuse fuses it into one
  ``conv2d_int8`` kernel with the requantizing epilogue (u8 output: a quarter of the bytes an
  int32 or float32 output writes), beside the fp32 ``Conv`` + bias + ``Relu`` (one fused kernel);
* fp32: ``Conv`` / ``MatMul`` with the same shapes and a constant float32 weight. Where its
  default schedule is Winograd (fewer multiplies than the GOP/s count), the fastest direct fp32
  schedule (:data:`DIRECT_CONV`, chosen by the ``schedule`` knob) is timed too: the "direct"
  column and ratio.

The two are timed in interleaved blocks (``--blocks``) of ``--repeat`` runs each, so a slow
stretch of the shared machine hits both alike; reported: the median ms of whole ``run()`` calls,
GOP/s (2 * MACs / time; int8 multiply-adds count as float ones do) and the ratio int8 / fp32;
then the same from the kernel times alone (``Module.profile`` in each block: the kernels called
with the same output buffers, without the 10-20 us a ``run()`` adds for its input checks, a
fresh output array and the buffer binding, which weigh more on the faster int8 kernel). ``--target`` picks the
instruction form: this machine (``llvm``: VPDPBUSD where it has AVX-512 VNNI) or, e.g.,
``"llvm -mattr=-avx512f,-avxvnni"`` (the AVX2 form, VPMADDWD, on an AVX-512 host). The kernel
comments name the schedule and form actually used (printed with ``--verbose``).

Usage::

    .venv/bin/python benchmarks/bench_int8.py [--target llvm] [--repeat 20] [--blocks 5]
        [--only conv|qconv|gemm] [--json FILE] [--verbose]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(ROOT))

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

#: ResNet-18-like convolutions: (C, M, H, kernel, stride, pad) with input [1, C, H, H] (the stem,
#: the 3x3 stages, a strided 3x3, 1x1 projections)
CONV_SHAPES = [(3, 64, 224, 7, 2, 3), (64, 64, 56, 3, 1, 1), (128, 128, 28, 3, 1, 1), (256, 256, 14, 3, 1, 1), (512, 512, 7, 3, 1, 1),
               (64, 128, 56, 3, 2, 1), (64, 256, 56, 1, 1, 0), (256, 64, 56, 1, 1, 0), (128, 512, 28, 1, 1, 0),
               (512, 128, 28, 1, 1, 0)]
#: GEMMs [M, K] x [K, N]
GEMM_SHAPES = [(m, 768, n) for m in (64, 128, 197) for n in (768, 3072)]


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "m", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def conv_models(c, m, h, k, s, p, rng):
    x8 = rng.integers(0, 256, (1, c, h, h)).astype(np.uint8)
    w8 = rng.integers(-128, 128, (m, c, k, k)).astype(np.int8)
    attrs = dict(pads=[p] * 4, strides=[s, s])
    oh = (h + 2 * p - k) // s + 1
    q = _model([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], **attrs)],
               [helper.make_tensor_value_info("x", TensorProto.UINT8, x8.shape)],
               [helper.make_tensor_value_info("y", TensorProto.INT32, (1, m, oh, oh))],
               [numpy_helper.from_array(w8, "w"), numpy_helper.from_array(np.array(128, np.uint8), "xz")])
    xf = rng.standard_normal((1, c, h, h)).astype(np.float32)
    wf = (rng.standard_normal((m, c, k, k)) * 0.05).astype(np.float32)
    f = _model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, xf.shape)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, m, oh, oh))],
               [numpy_helper.from_array(wf, "w")])
    return (q, {"x": x8}), (f, {"x": xf}), 2.0 * m * oh * oh * c * k * k


def qdq_conv_models(c, m, h, k, s, p, rng):
    """The QDQ convolution (u8 activations per tensor, s8 symmetric per-channel weights, int32
    bias, Relu, u8 output) and its fp32 Conv + bias + Relu, as ``conv_models``."""
    oh = (h + 2 * p - k) // s + 1
    attrs = dict(pads=[p] * 4, strides=[s, s])
    w8 = rng.integers(-127, 128, (m, c, k, k)).astype(np.int8)
    ws = (rng.random(m) * 0.004 + 0.001).astype(np.float32)
    inits = [numpy_helper.from_array(w8, "w"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.zeros(m, np.int8), "wz"), numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(131, np.uint8), "xz"), numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
             numpy_helper.from_array(np.array(0, np.uint8), "yz"),
             numpy_helper.from_array(rng.integers(-3000, 3000, m).astype(np.int32), "b"),
             numpy_helper.from_array(ws * np.float32(0.02), "bs"), numpy_helper.from_array(np.zeros(m, np.int32), "bz")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], **attrs),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"])]
    q = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, (1, c, h, h))],
               [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, m, oh, oh))], inits)
    x8 = rng.integers(0, 256, (1, c, h, h)).astype(np.uint8)
    xf = rng.standard_normal((1, c, h, h)).astype(np.float32)
    wf = (rng.standard_normal((m, c, k, k)) * 0.05).astype(np.float32)
    bf = rng.standard_normal(m).astype(np.float32)
    f = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, xf.shape)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, m, oh, oh))],
               [numpy_helper.from_array(wf, "w"), numpy_helper.from_array(bf, "b")])
    return (q, {"x": x8}), (f, {"x": xf}), 2.0 * m * oh * oh * c * k * k


def gemm_models(mm, k, n, rng):
    a8 = rng.integers(0, 256, (mm, k)).astype(np.uint8)
    b8 = rng.integers(-128, 128, (k, n)).astype(np.int8)
    q = _model([helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])],
               [helper.make_tensor_value_info("a", TensorProto.UINT8, a8.shape)],
               [helper.make_tensor_value_info("y", TensorProto.INT32, (mm, n))],
               [numpy_helper.from_array(b8, "b"), numpy_helper.from_array(np.array(128, np.uint8), "az")])
    af = rng.standard_normal((mm, k)).astype(np.float32)
    bf = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    f = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
               [helper.make_tensor_value_info("a", TensorProto.FLOAT, af.shape)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, (mm, n))],
               [numpy_helper.from_array(bf, "b")])
    return (q, {"a": a8}), (f, {"a": af}), 2.0 * mm * k * n


def _time(mod, feeds, repeat: int) -> list[float]:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        mod.run(**feeds)
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def _kernel_time(mod, feeds, repeat: int) -> float:
    """The module's kernel time in ms: the sum of its kernel calls' medians over ``repeat``
    timed calls each (``Module.profile``: every kernel called on its own with the same output
    buffers), without what a ``run()`` adds around the kernels (the input checks, a fresh
    output array, binding the buffers: 10-20 us at these sizes)."""
    return sum(r.median_ms for r in mod.profile(repeat=repeat, warmup=1, **feeds).rows)


#: fp32 convolution schedules that compute the direct sum (every multiply-add the GOP/s count);
#: where the default is a fast algorithm (Winograd: fewer multiplies than the count), the fastest
#: of these that applies is timed as well, as the "direct" column
DIRECT_CONV = ("conv2d_rows", "conv2d_flat", "conv2d_pointwise")


def _fixed_schedule(name: str):
    """Tuning records that give every workload the knob ``schedule=name`` (the knob
    ``ir.strategy.dispatch`` reads where several schedules apply)."""
    from tensorfuse.compiler.tuning import TuningRecords

    class Fixed(TuningRecords):
        def knobs_for(self, *args, **kw):
            return {"schedule": name}

        def for_target(self, *args, **kw):
            return self
    return Fixed([])


def _direct(f, ff, target: str, repeat: int):
    """The fastest fp32 module of ``f`` on a :data:`DIRECT_CONV` schedule (None: none applies)."""
    import tensorfuse
    best = None
    for name in DIRECT_CONV:
        mod = tensorfuse.compile(f, target=target, num_threads=1, cache=False, tuning=_fixed_schedule(name))
        if {k.schedule for k in mod.kernels} != {f"llvm.{name}"}:
            continue
        _time(mod, ff, 3)
        t = statistics.median(_time(mod, ff, repeat))
        if best is None or t < best[0]:
            best = (t, mod)
    return best[1] if best else None


def bench(pairs, target: str, repeat: int, blocks: int, verbose: bool) -> list[dict]:
    import tensorfuse
    rows = []
    for name, (q, qf), (f, ff), ops in pairs:
        mq = tensorfuse.compile(q, target=target, num_threads=1, cache=False)
        mf = tensorfuse.compile(f, target=target, num_threads=1, cache=False)
        fast = any("winograd" in k.schedule for k in mf.kernels)
        md = _direct(f, ff, target, repeat) if fast else None
        if verbose:
            for k in mq.kernels + mf.kernels + (md.kernels if md else []):
                print(f"  {name}: {k.schedule}  {k.comment.strip()[:160]}")
        for mod, feeds in ((mq, qf), (mf, ff)) + (((md, ff),) if md else ()):
            _time(mod, feeds, 3)
        tq, tf, td = [], [], []
        kq, kf, kd = [], [], []
        for _ in range(blocks):
            tq += _time(mq, qf, repeat)
            tf += _time(mf, ff, repeat)
            if md:
                td += _time(md, ff, repeat)
            kq.append(_kernel_time(mq, qf, repeat))
            kf.append(_kernel_time(mf, ff, repeat))
            if md:
                kd.append(_kernel_time(md, ff, repeat))
        a, b = statistics.median(tq), statistics.median(tf)
        ka, kb_ = statistics.median(kq), statistics.median(kf)
        rows.append({"shape": name, "int8_ms": a, "fp32_ms": b, "int8_gops": ops / a / 1e6,
                     "fp32_gflops": ops / b / 1e6, "ratio": b / a,
                     "int8_kernel_ms": ka, "fp32_kernel_ms": kb_, "kernel_ratio": kb_ / ka,
                     "int8_schedule": "+".join(sorted({k.schedule for k in mq.kernels})),
                     "fp32_schedule": "+".join(sorted({k.schedule for k in mf.kernels}))})
        r = rows[-1]
        extra = ""
        if md:
            d, kd_ = statistics.median(td), statistics.median(kd)
            r.update({"fp32_direct_ms": d, "fp32_direct_gflops": ops / d / 1e6, "ratio_direct": d / a,
                      "fp32_direct_kernel_ms": kd_, "kernel_ratio_direct": kd_ / ka,
                      "fp32_direct_schedule": "+".join(sorted({k.schedule for k in md.kernels}))})
            extra = (f"   direct fp32 {d:.3f} ms {r['fp32_direct_gflops']:.1f} GFLOP/s: "
                     f"{r['ratio_direct']:.2f}x, kernels {r['kernel_ratio_direct']:.2f}x ({r['fp32_direct_schedule']})")
        print(f"{name:34s} {a:8.3f} {b:8.3f} {r['int8_gops']:8.1f} {r['fp32_gflops']:8.1f} {r['ratio']:6.2f}x "
              f"{ka:8.3f} {kb_:8.3f} {r['kernel_ratio']:6.2f}x  "
              f"{r['int8_schedule']} / {r['fp32_schedule']}{extra}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--only", choices=("conv", "qconv", "gemm"))
    ap.add_argument("--json")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    pairs = []
    if args.only in (None, "conv"):
        for c, m, h, k, s, p in CONV_SHAPES:
            pairs.append((f"conv {c}->{m} {h}x{h} k{k} s{s}", *conv_models(c, m, h, k, s, p, rng)))
    if args.only in (None, "qconv"):
        for c, m, h, k, s, p in CONV_SHAPES:
            pairs.append((f"qconv {c}->{m} {h}x{h} k{k} s{s}", *qdq_conv_models(c, m, h, k, s, p, rng)))
    if args.only in (None, "gemm"):
        for mm, k, n in GEMM_SHAPES:
            pairs.append((f"gemm {mm}x{k}x{n}", *gemm_models(mm, k, n, rng)))
    print(f"target {args.target!r}, 1 thread; median ms over {args.blocks} blocks of {args.repeat} runs")
    print(f"{'shape':34s} {'int8 ms':>8s} {'fp32 ms':>8s} {'int8 GOP/s':>8s} {'fp32 GFLOP/s':>8s} {'ratio':>7s} "
          f"{'int8 kern':>8s} {'fp32 kern':>8s} {'ratio':>7s}  schedules")
    rows = bench(pairs, args.target, args.repeat, args.blocks, args.verbose)
    rs = [r["ratio"] for r in rows]
    print(f"geometric mean int8/fp32: {float(np.exp(np.mean(np.log(rs)))):.2f}x  (min {min(rs):.2f}x, max {max(rs):.2f}x)")
    rd = [r.get("ratio_direct", r["ratio"]) for r in rows]
    if any("ratio_direct" in r for r in rows):
        print(f"against the direct fp32 kernel where the default is Winograd: geometric mean "
              f"{float(np.exp(np.mean(np.log(rd)))):.2f}x  (min {min(rd):.2f}x, max {max(rd):.2f}x)")
    rk = [r["kernel_ratio"] for r in rows]
    print(f"kernel times (Module.profile): geometric mean {float(np.exp(np.mean(np.log(rk)))):.2f}x  "
          f"(min {min(rk):.2f}x, max {max(rk):.2f}x)")
    rkd = [r.get("kernel_ratio_direct", r["kernel_ratio"]) for r in rows]
    if any("kernel_ratio_direct" in r for r in rows):
        print(f"kernel times against the direct fp32 kernel where the default is Winograd: geometric mean "
              f"{float(np.exp(np.mean(np.log(rkd)))):.2f}x  (min {min(rkd):.2f}x, max {max(rkd):.2f}x)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"target": args.target, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
