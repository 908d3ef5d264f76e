"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir import Builder, Graph
from tensorfuse.ir.registry import run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

SHAPES = [(3, 5), (2, 3, 2, 2, 2)]


def _case(shape, weight: bool, ii, seed=0, tdtype=np.int64):
    n, c = shape[:2]
    rng = np.random.default_rng(seed)
    inputs = {"x": rand(*shape, seed=seed), "t": rng.integers(0, c, size=(n,) + shape[2:]).astype(tdtype)}
    if ii is not None:
        inputs["t"].flat[::3] = ii
    if weight:
        inputs["w"] = rand(c, seed=seed + 1, low=0.1, high=1.0)
    return inputs


@pytest.mark.parametrize("op,outputs", [("NegativeLogLikelihoodLoss", ("loss",)),
                                        ("SoftmaxCrossEntropyLoss", ("loss",)),
                                        ("SoftmaxCrossEntropyLoss", ("loss", "log_prob"))])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight,ii", [(False, None), (True, -1), (False, 1)])
def test_losses(op, outputs, shape, reduction, weight, ii):
    inputs = _case(shape, weight, ii)
    attrs = {"reduction": reduction}
    if ii is not None:
        attrs["ignore_index"] = ii
    m = node_model(op, inputs, attrs, outputs=outputs, opset=13)
    assert_matches_ort(m, inputs, rtol=1e-5, atol=1e-6, opt_levels=(2,))


def test_int32_target_and_double():
    inputs = _case((4, 6, 3), True, 2, tdtype=np.int32)
    inputs["x"] = inputs["x"].astype(np.float64)
    inputs["w"] = inputs["w"].astype(np.float64)
    m = node_model("SoftmaxCrossEntropyLoss", inputs, {"ignore_index": 2}, outputs=("loss", "log_prob"), opset=13)
    assert_matches_ort(m, inputs, rtol=1e-10, atol=1e-12, opt_levels=(0, 2))


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_reference_matches_ort(op):
    inputs = _case((3, 4, 2), True, 1, seed=5)
    attrs = {"reduction": "mean", "ignore_index": 1}
    expected = ort_run(node_model(op, inputs, attrs, opset=13), inputs)
    g = Graph()
    vals = [g.add_input(k, TensorType.of(v)) for k, v in inputs.items()]
    y = Builder(g).op(op, *vals, **attrs)
    got = run_reference(y.producer, list(inputs.values()))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


@pytest.mark.parametrize("inputs,attrs,match", [
    ({"x": rand(3, 4), "t": np.zeros((4,), np.int64)}, {}, "target shape"),
    ({"x": rand(3, 4), "t": np.zeros((3,), np.int64), "w": rand(3)}, {}, "weight"),
    ({"x": rand(3, 4), "t": np.zeros((3,), np.int64)}, {"reduction": "max"}, "reduction"),
])
def test_loss_errors(inputs, attrs, match):
    with pytest.raises(UnsupportedModelError, match=match):
        tensorfuse.compile(_raw_model(inputs, attrs), target="llvm")


def _raw_model(inputs, attrs):
    from onnx import TensorProto, helper
    node = helper.make_node("NegativeLogLikelihoodLoss", list(inputs), ["loss"], **attrs)
    g_in = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    g = helper.make_graph([node], "g", g_in, [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])   # no shape inference: it would reject them
