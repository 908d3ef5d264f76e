"""Whole models against onnxruntime (optimisations off): the shared real models and the light
model-zoo graphs shipped inside the onnx wheel. Tolerances: rtol 1e-3, atol 1e-4 (float32 sums
over thousands of terms in another order than onnxruntime's). Each test first checks that
the model's outputs move with its inputs by far more than that tolerance
(``oracle.assert_outputs_depend_on_inputs``): a comparison on a model that gives the same
output for any input cannot fail."""
from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest

import tensorfuse
from conftest import shared_model_entries, shared_models_dir
from onnx import helper, numpy_helper
from oracle import assert_outputs_depend_on_inputs, model_inputs, other_inputs, ort_run

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
    feeds2 = other_inputs(feeds)
    want, want2 = ort_run(str(path), feeds), ort_run(str(path), feeds2)
    assert_outputs_depend_on_inputs(want, want2, RTOL, ATOL, entry["file"])
    mod = tensorfuse.compile(str(path), target="llvm")
    assert [i.name for i in mod.input_info] == [s["name"] for s in entry["inputs"]]
    assert [o.name for o in mod.output_info] == [s["name"] for s in entry["outputs"]]
    _compare(mod.run(**feeds), want)
    _compare(mod.run(**feeds2), want2)


def _light_models():
    return sorted(glob.glob(os.path.join(LIGHT_DIR, "*.onnx")))


#: the light models whose compile and run take a minute or more each on 2 cores, and the ones
#: with the most weights (vgg19 143M, zfnet512 62M, bvlc_alexnet 61M, resnet50 26M: 12-33
#: CPU-seconds each, 80 together, a third of it drawing and checking the random weights):
#: marked heavy, run by ``make test-heavy`` (in .ci/run) rather than the default suite, which
#: keeps squeezenet and shufflenet (and the shared resnet18, mobilenet_v2 and bert_mini)
HEAVY_LIGHT_MODELS = {"densenet121", "inception_v1", "inception_v2", "vgg19", "zfnet512", "bvlc_alexnet",
                      "resnet50"}


def _light_params():
    out = []
    for p in _light_models():
        name = os.path.basename(p)[6:-5]
        out.append(pytest.param(p, id=name, marks=[pytest.mark.heavy] if name in HEAVY_LIGHT_MODELS else []))
    return out


def light_model_with_random_weights(path: str, seed: int = 0) -> onnx.ModelProto:
    """The light model zoo's graph with weights drawn at random, and its logits as a second output.

    The light files make every weight with a ``ConstantOfShape`` that fills it with one value,
    so every channel computes the same thing and the final Softmax gets equal logits: the
    output is the same for any input, and a comparison with it cannot fail. Here each such
    weight becomes a fixed-seed initializer of its shape: Conv and Gemm weights normal with
    variance 2 / fan-in (He), BatchNormalization scale and variance (and the Mul of a
    BatchNorm spelt out) uniform in [0.5, 1.5], biases, shifts and means normal with std 0.1.
    Without calibrated statistics deep residual nets grow their activations until the Softmax
    saturates (a one-hot output that does not move either), so the Softmax's input (the
    logits) is a graph output too; those logits reach 1e5 with cancellations down to 1e1, so
    the test compares each output within ``ATOL + RTOL * max|output|`` (float32 sums of that
    size round at about 1e-2)."""
    m = onnx.load(path)
    g = m.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    users: dict[str, list] = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            users.setdefault(i, []).append((n, k))

    def role(name: str):
        for n, k in users.get(name, []):
            if n.op_type == "Unsqueeze":
                r = role(n.output[0])
                if r is not None:
                    return r
                continue
            return n, k
        return None

    rng = np.random.default_rng(seed)
    keep, added = [], []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in consts:
            keep.append(n)
            continue
        shape = tuple(int(d) for d in consts[n.input[0]])
        r = role(n.output[0])
        op, k = (r[0].op_type, r[1]) if r is not None else (None, None)
        if op == "Conv" and k == 1:
            a = rng.standard_normal(shape) * np.sqrt(2.0 / max(1, int(np.prod(shape[1:]))))
        elif op == "Gemm" and k == 1:
            trans_b = any(at.name == "transB" and at.i for at in r[0].attribute)
            a = rng.standard_normal(shape) * np.sqrt(2.0 / (shape[1] if trans_b else shape[0]))
        elif (op == "BatchNormalization" and k in (1, 4)) or op == "Mul":
            a = rng.uniform(0.5, 1.5, shape)
        elif op in ("BatchNormalization", "Add", "Conv", "Gemm"):
            a = rng.standard_normal(shape) * 0.1
        else:
            keep.append(n)
            continue
        added.append(numpy_helper.from_array(a.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(added)
    if m.ir_version < 4:        # before IR version 4 initializers are listed as graph inputs too
        g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in added)
    outs = {o.name for o in g.output}
    logits = [n.input[0] for n in keep if n.op_type == "Softmax" and n.output[0] in outs]
    if logits:
        typed = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        g.output.extend(typed[v] for v in logits)
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("path", _light_params())
def test_light_model_matches_onnxruntime(path):
    model = light_model_with_random_weights(path)
    mod = tensorfuse.compile(model, target="llvm")
    # as onnx's backend runner does: every graph input gets the dummy arange(n)/n tensor
    feeds = {i.name: (np.arange(int(np.prod(i.shape)), dtype=np.float64) / max(int(np.prod(i.shape)), 1))
             .astype(i.dtype).reshape(i.shape) for i in mod.input_info}
    feeds2 = other_inputs(feeds)
    want, want2 = ort_run(model, feeds), ort_run(model, feeds2)
    # the probabilities of a saturated Softmax may not move; the logits must
    assert_outputs_depend_on_inputs(want, want2, RTOL, ATOL, os.path.basename(path), every_output=False)
    for got, exp in ((mod.run(**feeds), want), (mod.run(**feeds2), want2)):
        assert len(got) == len(exp)
        for i, (g, e) in enumerate(zip(got, exp)):
            assert g.dtype == e.dtype and g.shape == e.shape, f"output {i}: {g.dtype}{g.shape} vs {e.dtype}{e.shape}"
            np.testing.assert_allclose(g, e, rtol=0, atol=ATOL + RTOL * float(np.max(np.abs(e))), err_msg=f"output {i}")


def test_light_models_present():
    assert len(_light_models()) >= 9, f"expected the light model zoo in {LIGHT_DIR}"
