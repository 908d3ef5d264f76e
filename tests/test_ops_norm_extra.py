"""RMSNormalization (vs onnxruntime), Swish and SwiGLU (vs onnx.reference: onnxruntime lacks them)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir import Builder, Graph
from tensorfuse.ir.registry import run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand


@pytest.mark.parametrize("shape,axis,scale_shape", [
    ((2, 3, 4, 5), -1, (5,)), ((2, 3, 4, 5), 1, (3, 4, 5)), ((2, 3, 4, 5), 0, (1, 4, 1)),
    ((6, 7), -2, (6, 7)), ((3, 16), 1, (16,)), ((8,), 0, (8,)),
])
def test_rms_normalization(shape, axis, scale_shape):
    inputs = {"x": rand(*shape, seed=1), "scale": rand(*scale_shape, seed=2)}
    m = node_model("RMSNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, opset=23)
    assert_matches_ort(m, inputs, rtol=1e-5, atol=1e-6)


def test_rms_normalization_float16_and_double():
    for dt, tol in ((np.float16, 2e-3), (np.float64, 1e-12)):
        inputs = {"x": rand(2, 3, 8, seed=1, dtype=dt), "scale": rand(8, seed=2, dtype=dt)}
        m = node_model("RMSNormalization", inputs, {}, opset=23)
        assert_matches_ort(m, inputs, rtol=tol, atol=tol, opt_levels=(2,))


def test_rms_reference_matches_ort():
    x, s = rand(3, 4, 5, seed=3), rand(4, 5, seed=4)
    expected = ort_run(node_model("RMSNormalization", {"x": x, "s": s}, {"axis": 1}, opset=23), {"x": x, "s": s})
    g = Graph()
    y = Builder(g).op("RMSNormalization", g.add_input("x", TensorType.of(x)), g.add_input("s", TensorType.of(s)), axis=1)
    np.testing.assert_allclose(run_reference(y.producer, [x, s])[0], expected[0], rtol=1e-6, atol=1e-6)


def test_rms_errors():
    inputs = {"x": rand(2, 3), "scale": rand(2)}
    with pytest.raises(UnsupportedModelError, match="broadcast"):
        tensorfuse.compile(node_model("RMSNormalization", inputs, {}, opset=23), target="llvm")


def _vs_onnx_reference(model, inputs, rtol=1e-6, atol=1e-6):
    expected = ReferenceEvaluator(model).run(None, inputs)
    for lvl in (0, 2):
        got = tensorfuse.compile(model, target="llvm", opt_level=lvl).run(**inputs)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_swish(alpha, dtype):
    inputs = {"x": rand(3, 4, 5, seed=5, dtype=dtype, low=-30, high=30)}
    tol = 1e-3 if dtype == np.float16 else 1e-6
    _vs_onnx_reference(node_model("Swish", inputs, {"alpha": alpha}, opset=24), inputs, rtol=tol, atol=tol)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu(alpha, dtype):
    inputs = {"a": rand(2, 8, seed=6, dtype=dtype, low=-8, high=8), "b": rand(2, 8, seed=7, dtype=dtype)}
    tol = 1e-3 if dtype == np.float16 else 1e-6
    _vs_onnx_reference(node_model("SwiGLU", inputs, {"alpha": alpha}, opset=28), inputs, rtol=tol, atol=tol)


def test_swiglu_rejects_broadcasting():
    g = Graph()
    a = g.add_input("a", TensorType.parse("f32[2,8]"))
    b = g.add_input("b", TensorType.parse("f32[1,8]"))
    with pytest.raises(ValueError, match="identical shapes"):
        Builder(g).op("SwiGLU", a, b)
