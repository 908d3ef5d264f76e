"""Quantize ONNX models with onnxruntime's own quantizer, as a user would, for the int8 benchmark
and checks (issue 23).

For every model given (default: ../shared/models, and the exported models of
``benchmarks/export_models.py`` in --exported DIR), writes next to each other in --out:

- (every model) ``NAME.qdq_u8s8.onnx``: ``quantize_static``, QDQ format, uint8 activations (asymmetric),
  int8 weights per channel (symmetric): onnxruntime's default static recipe;
- (every model) ``NAME.qdq_s8s8.onnx``: ``quantize_static``, QDQ format, int8 activations and weights, per
  tensor;
- ``NAME.dynamic.onnx``: ``quantize_dynamic`` (int8 weights, activations quantized at run time by
  DynamicQuantizeLinear), for models with MatMul nodes (the transformers' recipe).

Calibration: ``--calib N`` random inputs per model (seeded; ids in their declared ranges), with
onnxruntime's MinMax calibrator. The model is first run through
``onnxruntime.quantization.shape_inference.quant_pre_process`` (onnx shape inference and
onnxruntime's basic optimisations: BatchNorm folded into Conv), as its documentation advises.

Usage::

    python benchmarks/quantize_models.py --out /tmp/qmodels [--exported /work/exported] [MODEL.onnx ...]

Needs onnxruntime (a test dependency). Files written are never part of the repository.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

import numpy as np
import onnx

HERE = pathlib.Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "models"


def _inputs_of(model: onnx.ModelProto, ranges: dict[str, tuple[int, int]]):
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        out.append((vi.name, tt.elem_type, shape, ranges.get(vi.name)))
    return out


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator, ranges=None) -> dict[str, np.ndarray]:
    """One random input per graph input: floats N(0, 1), integers in ``ranges[name]`` (else [0, 2))."""
    feeds = {}
    for name, et, shape, rg in _inputs_of(model, ranges or {}):
        dt = onnx.helper.tensor_dtype_to_np_dtype(et)
        if np.issubdtype(dt, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dt)
        else:
            lo, hi = rg or (0, 2)
            feeds[name] = rng.integers(lo, hi, shape).astype(dt)
    return feeds


def shared_ranges() -> dict[str, dict[str, tuple[int, int]]]:
    """{model file: {input: (low, high)}} from ../shared/models/models.json."""
    path = SHARED / "models.json"
    if not path.exists():
        return {}
    out = {}
    for m in json.loads(path.read_text())["models"]:
        out[m["file"]] = {i["name"]: tuple(i["range"]) for i in m["inputs"] if "range" in i}
    return out


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)

    def rewind(self):
        pass


def has_matmul(model: onnx.ModelProto) -> bool:
    """MatMul nodes: a transformer's projections (a CNN's classifier is one Gemm)."""
    return any(n.op_type == "MatMul" for n in model.graph.node)


def is_cnn(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "Conv" for n in model.graph.node)


def quantize_one(path: pathlib.Path, out: pathlib.Path, calib: int, ranges, recipes) -> list[pathlib.Path]:
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    name = path.name[:-len(".onnx")]
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        pre = pathlib.Path(tmp) / "pre.onnx"
        quant_pre_process(str(path), str(pre), skip_symbolic_shape=True)
        model = onnx.load(str(pre))
        rng = np.random.default_rng(0)
        feeds = [random_feeds(model, rng, ranges) for _ in range(calib)]
        if "qdq_u8s8" in recipes:
            dst = out / f"{name}.qdq_u8s8.onnx"
            quantize_static(str(pre), str(dst), _Reader(feeds), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                            calibrate_method=CalibrationMethod.MinMax)
            written.append(dst)
        if "qdq_s8s8" in recipes:
            dst = out / f"{name}.qdq_s8s8.onnx"
            quantize_static(str(pre), str(dst), _Reader(feeds), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=False,
                            calibrate_method=CalibrationMethod.MinMax,
                            extra_options={"ActivationSymmetric": False})
            written.append(dst)
        if "dynamic" in recipes and has_matmul(model):
            dst = out / f"{name}.dynamic.onnx"
            quantize_dynamic(str(pre), str(dst), weight_type=QuantType.QInt8)
            written.append(dst)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="ONNX files (default: ../shared/models/*.onnx)")
    ap.add_argument("--out", required=True, help="directory for the quantized files")
    ap.add_argument("--exported", help="also quantize every .onnx in this directory")
    ap.add_argument("--calib", type=int, default=8, help="calibration inputs per model (default 8)")
    ap.add_argument("--recipes", default="qdq_u8s8,qdq_s8s8,dynamic",
                    help="comma list of qdq_u8s8, qdq_s8s8, dynamic (default all; each applies where it fits)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [pathlib.Path(p) for p in args.models] or sorted(SHARED.glob("*.onnx"))
    if args.exported:
        paths += sorted(pathlib.Path(args.exported).glob("*.onnx"))
    ranges = shared_ranges()
    recipes = set(args.recipes.split(","))
    for p in paths:
        for w in quantize_one(p, out, args.calib, ranges.get(p.name, {}), recipes):
            print(w, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
