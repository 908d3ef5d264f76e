"""Whole models against onnxruntime (optimisations off): the shared real models and the light
model-zoo graphs shipped inside the onnx wheel. Tolerances: rtol 1e-3, atol 1e-4 (float32 sums
over thousands of terms in another order than onnxruntime's)."""
from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest

import tensorfuse
from conftest import shared_model_entries, shared_models_dir
from oracle import model_inputs, ort_run

pytestmark = pytest.mark.slow

RTOL, ATOL = 1e-3, 1e-4
LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _compare(got, expected):
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype and g.shape == e.shape, f"output {i}: {g.dtype}{g.shape} vs {e.dtype}{e.shape}"
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"output {i}")


_ENTRIES = shared_model_entries() or [{"file": "<absent>"}]


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["file"] for e in _ENTRIES])
def test_shared_model_matches_onnxruntime(entry):
    path = shared_models_dir() / entry["file"]
    feeds = model_inputs(entry, seed=0)
    mod = tensorfuse.compile(str(path), target="llvm")
    assert [i.name for i in mod.input_info] == [s["name"] for s in entry["inputs"]]
    assert [o.name for o in mod.output_info] == [s["name"] for s in entry["outputs"]]
    _compare(mod.run(**feeds), ort_run(str(path), feeds))


def _light_models():
    return sorted(glob.glob(os.path.join(LIGHT_DIR, "*.onnx")))


#: the light models whose compile and run take a minute or more each on 2 cores: marked heavy,
#: run by ``make test-heavy`` (in .ci/run) rather than the default suite
HEAVY_LIGHT_MODELS = {"densenet121", "inception_v1", "inception_v2"}


def _light_params():
    out = []
    for p in _light_models():
        name = os.path.basename(p)[6:-5]
        out.append(pytest.param(p, id=name, marks=[pytest.mark.heavy] if name in HEAVY_LIGHT_MODELS else []))
    return out


@pytest.mark.parametrize("path", _light_params())
def test_light_model_matches_onnxruntime(path):
    # as onnx's backend runner does: every graph input gets the dummy arange(n)/n tensor
    mod = tensorfuse.compile(path, target="llvm")
    feeds = {i.name: (np.arange(int(np.prod(i.shape)), dtype=np.float64) / max(int(np.prod(i.shape)), 1))
             .astype(i.dtype).reshape(i.shape) for i in mod.input_info}
    _compare(mod.run(**feeds), ort_run(path, feeds))


def test_light_models_present():
    assert len(_light_models()) >= 9, f"expected the light model zoo in {LIGHT_DIR}"
