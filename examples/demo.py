"""Compile the bundled MobileNetV2 with tensorfuse, run it, and compare with onnxruntime.

Prints the max abs error against onnxruntime with its graph optimisations off (the reference
semantics) and, beside it, how much onnxruntime's output changes between two random inputs (an
error figure says something only on a model whose output depends on its input: the script
exits 1 when the change is not 100 times the 1e-4 tolerance), the time per run of both
(median of 20 runs, ms, 1 thread each; onnxruntime with its default optimisations, as users
run it), the compile time (the compile cache is bypassed, so it is the real cost) and the
number of kernels.
Usage: python examples/demo.py [model.onnx]
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import tensorfuse  # noqa: E402
from tensorfuse.runtime.profile import time_calls  # noqa: E402


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "models", "mobilenet_v2.onnx")
    import onnxruntime as ort

    t0 = time.perf_counter()
    mod = tensorfuse.compile(path, target="llvm", cache=False, num_threads=1)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.uniform(-1, 1, size=i.shape).astype(i.dtype) for i in mod.input_info}
    feeds2 = {i.name: rng.uniform(-1, 1, size=i.shape).astype(i.dtype) for i in mod.input_info}

    def session(level):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.intra_op_num_threads = 1
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    reference = session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    expected = reference.run(None, feeds)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(expected, reference.run(None, feeds2)))
    sess = session(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    got = mod.run(**feeds)
    err = max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected))

    ours = mod.benchmark(**feeds, repeat=20).median_ms
    theirs = time_calls(lambda: sess.run(None, feeds), repeat=20).median_ms
    print(f"model:           {os.path.basename(path)}")
    print(f"compile time:    {compile_s:.2f} s")
    print(f"kernels:         {mod.num_kernels}")
    print(f"max abs error:   {err:.3g} (vs onnxruntime, optimisations off)")
    print(f"output change:   {moved:.3g} between two random inputs (onnxruntime): "
          + (f"{moved / err:.3g}x the error" if err > 0 else "the error is 0"))
    if moved <= 100 * 1e-4:
        print("warning:         the output hardly depends on the input, so the error figure cannot show a wrong layer")
    # the ratio as everywhere (tensorfuse bench, benchmarks/): tensorfuse's time over onnxruntime's
    print(f"time per run:    tensorfuse {ours:.2f} ms | onnxruntime {theirs:.2f} ms "
          f"(onnxruntime with its optimisations; 1 thread each; ratio tensorfuse / onnxruntime "
          f"{ours / theirs:.2f}x, lower is better)")
    return 0 if err <= 1e-4 and moved > 100 * 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
