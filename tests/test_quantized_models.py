"""Quantized real models (issue 23): the shared models quantized by onnxruntime's own quantizer as a
user runs it (``benchmarks/quantize_models.py``: ``quantize_static`` in QDQ format, u8 activations
with s8 per-channel weights or s8 activations per tensor; ``quantize_dynamic`` for the
transformer), compiled at O2, must

- run their products as integer kernels (the quantization rules fired: no float Conv/MatMul
  left where the file quantized it);
- stay as close to the unfused QDQ semantics (onnxruntime, optimisations off) as onnxruntime's own
  fused int8 kernels: relative L2 error at most twice onnxruntime's, or 1% (docs/quantization.md).

The quantized files are made once per session in a temporary folder (onnxruntime's quantizer with
a seeded calibration set). resnet18 is heavy (``make test-heavy``)."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
import pytest

import tensorfuse
from conftest import shared_models_dir

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

pytestmark = pytest.mark.slow

CASES = [
    ("squeezenet1_1.onnx", "qdq_u8s8", []),
    ("squeezenet1_1.onnx", "qdq_s8s8", [pytest.mark.heavy]),
    ("bert_mini.unfolded.onnx", "dynamic", []),
    ("resnet18.unfolded.onnx", "qdq_u8s8", [pytest.mark.heavy]),
]


@pytest.fixture(scope="session")
def quantized_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("quantized")


def _quantized(qdir: pathlib.Path, model: str, recipe: str) -> pathlib.Path:
    from quantize_models import quantize_one, shared_ranges
    out = qdir / f"{model[:-5]}.{recipe}.onnx"
    if not out.exists():
        src = shared_models_dir() / model
        quantize_one(src, qdir, 4, shared_ranges().get(model, {}), {recipe})
    assert out.exists(), f"onnxruntime's quantizer wrote no {out.name}"
    return out


@pytest.mark.parametrize("model,recipe", [pytest.param(m, r, marks=mk, id=f"{m[:-5]}-{r}") for m, r, mk in CASES])
def test_quantized_model_runs_integer_kernels_within_onnxruntimes_error(quantized_dir, model, recipe):
    import onnxruntime as ort
    from quant_accuracy import rel_l2
    from quantize_models import random_feeds, shared_ranges

    path = _quantized(quantized_dir, model, recipe)
    proto = onnx.load(str(path))
    rng = np.random.default_rng(0)
    feeds = [random_feeds(proto, rng, shared_ranges().get(model, {})) for _ in range(2)]
    off = ort.SessionOptions()
    off.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(str(path), off)
    fused = ort.InferenceSession(str(path))
    mod = tensorfuse.compile(str(path))
    # the products became integer kernels
    ops = {n.qualified_op for n in mod.graph.nodes}
    ops |= {m.qualified_op for n in mod.graph.nodes if n.op == "FusedFunction" for m in n.attrs["body"].nodes}
    assert ops & {"tensorfuse::ConvIntegerToFloat", "com.microsoft::MatMulIntegerToFloat"}, sorted(ops)
    assert not ops & {"Conv", "tensorfuse::FusedConv"}, sorted(ops)
    names = [o.name for o in ref.get_outputs()]
    for k, name in enumerate(names):
        want = [ref.run(None, f)[k] for f in feeds]
        theirs = [fused.run(None, f)[k] for f in feeds]
        ours = [mod.run(**f)[k] for f in feeds]
        e_tf, e_ort = rel_l2(ours, want), rel_l2(theirs, want)
        limit = max(2 * e_ort, 0.01)
        # the outputs depend on the inputs by more than the bound (else the comparison could not fail)
        assert rel_l2([want[0]], [want[1]]) > 2 * limit, f"{name}: the output hardly moves with the input"
        assert e_tf <= limit, f"{name}: relative L2 {e_tf:.3g}, onnxruntime's fused {e_ort:.3g}"
