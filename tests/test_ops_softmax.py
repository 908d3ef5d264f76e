"""Softmax, LogSoftmax, Hardmax against onnxruntime (ONNX spec sections of each op)."""
import numpy as np
import pytest

from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, get_op, run_reference
from tensorfuse.ir.types import DType, TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5


def _run_ref(op, arrays, **attrs):
    g = Graph()
    ins = [g.add_input(f"x{i}", TensorType.of(a)) for i, a in enumerate(arrays)]
    out = Builder(g).op(op, *ins, **attrs)
    return run_reference(out.producer, list(arrays))


SHAPES_AXES = [((7,), -1), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -3),
               ((2, 3, 4, 5), 2), ((1, 2, 1200), 1), ((2, 1100, 3), -2)]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_softmax_13(op, shape, axis):
    x = rand(*shape, low=-5, high=5)
    assert_matches_ort(node_model(op, {"x": x}, {"axis": axis}, opset=13), {"x": x}, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_default_axis_is_last(op):
    x = rand(2, 3, 4)
    assert_matches_ort(node_model(op, {"x": x}, opset=17), {"x": x}, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [7, 11])
@pytest.mark.parametrize("shape,axis", [((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 2),
                                        ((2, 3, 4), -2), ((3, 5), 1), ((2, 3, 4, 2), 1)])
def test_softmax_coerced_2d(op, opset, shape, axis):
    if opset == 7 and axis is not None and axis < 0:
        pytest.skip("negative axis arrived in opset 11")
    x = rand(*shape, low=-5, high=5)
    attrs = {} if axis is None else {"axis": axis}
    assert_matches_ort(node_model(op, {"x": x}, attrs, opset=opset), {"x": x}, rtol=RT, atol=AT)


def test_softmax_stable_large_values():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]], np.float32)
    for op in ("Softmax", "LogSoftmax"):
        assert_matches_ort(node_model(op, {"x": x}), {"x": x}, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-3)])
def test_softmax_dtypes(op, dtype, tol):
    x = rand(3, 6, dtype=dtype)
    assert_matches_ort(node_model(op, {"x": x}, {"axis": 1}), {"x": x}, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_reference_matches_ort(op):
    x = rand(2, 3, 4)
    exp = ort_run(node_model(op, {"x": x}, {"axis": 1}), {"x": x})[0]
    np.testing.assert_allclose(_run_ref(op, [x], axis=1)[0], exp, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_errors(op):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    with pytest.raises(ShapeError, match="out of range"):
        Builder(g).op(op, x, axis=2)
    xi = g.add_input("xi", TensorType(DType.i32, (2, 3)))
    with pytest.raises(ShapeError, match="not supported"):
        Builder(g).op(op, xi)


def test_softmax_flops():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    out = Builder(g).Softmax(x)
    assert get_op("Softmax").flops(out.producer) > 0


# ----------------------------------------------------------------------------- Hardmax
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_hardmax_13(shape, axis):
    x = np.round(rand(*shape, low=-3, high=3))     # ties: the first maximum wins
    assert_matches_ort(node_model("Hardmax", {"x": x}, {"axis": axis}, opset=13), {"x": x}, rtol=0, atol=0,
                       opt_levels=(0,))


@pytest.mark.parametrize("opset", [7, 11])
@pytest.mark.parametrize("shape,axis", [((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 2), ((3, 5), 1)])
def test_hardmax_coerced_2d(opset, shape, axis):
    x = np.round(rand(*shape, low=-3, high=3))
    attrs = {} if axis is None else {"axis": axis}
    assert_matches_ort(node_model("Hardmax", {"x": x}, attrs, opset=opset), {"x": x}, rtol=0, atol=0,
                       opt_levels=(0,))


def test_hardmax_f16():
    x = rand(3, 4, dtype=np.float16)
    assert_matches_ort(node_model("Hardmax", {"x": x}), {"x": x}, rtol=0, atol=0, opt_levels=(0,))


def test_hardmax_f64_against_onnx_reference():   # onnxruntime has no f64 Hardmax
    import tensorfuse
    from onnx.reference import ReferenceEvaluator
    x = rand(3, 4, dtype=np.float64)
    m = node_model("Hardmax", {"x": x}, {"axis": 0})
    exp = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = tensorfuse.compile(m, opt_level=0).run(x=x)[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, exp)


def test_hardmax_reference_matches_ort():
    x = np.round(rand(2, 3, 4, low=-2, high=2))
    exp = ort_run(node_model("Hardmax", {"x": x}, {"axis": 1}, opset=13), {"x": x})[0]
    np.testing.assert_array_equal(_run_ref("Hardmax", [x], axis=1)[0], exp)
