"""Accuracy of quantized models (issue 23, acceptance 1): tensorfuse's and onnxruntime's fused int8
outputs against the unfused QDQ semantics.

For each quantized model (``benchmarks/quantize_models.py`` writes them), on seeded random inputs
(``--samples`` of them; integer inputs in their ``models.json`` ranges for the shared models):

- reference: onnxruntime with every graph optimisation off (``ORT_DISABLE_ALL``): each
  QuantizeLinear / DequantizeLinear runs as written, the float ops between them in float;
- onnxruntime fused: ``ORT_ENABLE_ALL`` (its QDQ transformers: QLinearConv, MatMulIntegerToFloat ...);
- tensorfuse: ``tensorfuse.compile(path)`` at O2.

Reported per output: the relative L2 error ``||y - ref|| / ||ref||`` (over all samples) of both,
their ratio, and the verdict of the acceptance rule: tensorfuse at most twice onnxruntime's error,
or at most 1%. With ``--float-dir DIR`` the float original (``NAME.onnx`` in DIR, the file name
before ``.qdq_``/``.dynamic``) is run too, and the quantized models' error against it is shown
(what quantization itself costs).

Usage::

    .venv/bin/python benchmarks/quant_accuracy.py [--samples 4] [--float-dir ../shared/models] FILE.onnx|DIR ...

Exit status 1 when a model fails the rule (or fails to compile).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from quantize_models import random_feeds, shared_ranges  # noqa: E402


def rel_l2(got: list[np.ndarray], ref: list[np.ndarray]) -> float:
    num = sum(float(np.sum((g.astype(np.float64) - r.astype(np.float64)) ** 2)) for g, r in zip(got, ref))
    den = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in ref)
    return (num ** 0.5) / max(den ** 0.5, 1e-30)


def base_name(path: pathlib.Path) -> str:
    name = path.name
    for tag in (".qdq_", ".dynamic"):
        if tag in name:
            return name[:name.index(tag)] + ".onnx"
    return name


def check(path: pathlib.Path, samples: int, float_dir: pathlib.Path | None) -> tuple[bool, list[str]]:
    import onnx
    import onnxruntime as ort

    import tensorfuse

    model = onnx.load(str(path))
    ranges = shared_ranges().get(base_name(path), {})
    rng = np.random.default_rng(0)
    feeds = [random_feeds(model, rng, ranges) for _ in range(samples)]
    so_off = ort.SessionOptions()
    so_off.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so_off.intra_op_num_threads = 1
    so_all = ort.SessionOptions()
    so_all.intra_op_num_threads = 1
    ref_s = ort.InferenceSession(str(path), so_off)
    fused_s = ort.InferenceSession(str(path), so_all)
    try:
        mod = tensorfuse.compile(str(path))
    except Exception as e:        # a row for it, the others go on
        return False, [f"| {path.name} | - | compile failed: {type(e).__name__}: {str(e)[:200]} | | | |"]
    names = [o.name for o in ref_s.get_outputs()]
    rows, ok_all = [], True
    flt = None
    if float_dir is not None and (float_dir / base_name(path)).exists():
        flt = ort.InferenceSession(str(float_dir / base_name(path)), so_off)
    for k, name in enumerate(names):
        ref = [ref_s.run(None, f)[k] for f in feeds]
        fused = [fused_s.run(None, f)[k] for f in feeds]
        ours = [mod.run(**f)[k] for f in feeds]
        e_ort, e_tf = rel_l2(fused, ref), rel_l2(ours, ref)
        ok = e_tf <= max(2 * e_ort, 0.01)
        ok_all &= ok
        extra = ""
        if flt is not None:
            fl = [flt.run(None, f)[k] for f in feeds]
            extra = f" | {rel_l2(ours, fl):.2e} / {rel_l2(fused, fl):.2e}"
        ratio = f"{e_tf / e_ort:.2f}" if e_ort > 0 else ("1.00" if e_tf == 0 else "inf")
        rows.append(f"| {path.name} | {name} | {e_tf:.2e} | {e_ort:.2e} | {ratio} | {'ok' if ok else 'FAIL'}{extra} |")
    return ok_all, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="quantized .onnx files or folders of them")
    ap.add_argument("--samples", type=int, default=4, help="random inputs per model (default 4)")
    ap.add_argument("--float-dir", help="folder of the float originals (adds the error against them)")
    args = ap.parse_args(argv)
    paths: list[pathlib.Path] = []
    for m in args.models:
        p = pathlib.Path(m)
        paths += sorted(p.glob("*.onnx")) if p.is_dir() else [p]
    fd = pathlib.Path(args.float_dir) if args.float_dir else None
    head = "| model | output | tensorfuse rel L2 | onnxruntime fused rel L2 | ratio | verdict (<= 2x or 1%) |"
    if fd is not None:
        head += " vs float: tensorfuse / onnxruntime |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    ok = True
    for p in paths:
        good, rows = check(p, args.samples, fd)
        ok &= good
        for r in rows:
            print(r, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
