"""Reduce*, ArgMax/ArgMin, CumSum, TopK against onnxruntime (ONNX spec sections of each op)."""
import numpy as np
import pytest

from compiler.errors import UnsupportedModelError
from ir.builder import Builder
from ir.graph import Graph
from ir.registry import ShapeError, get_op, run_reference
from ir.types import DType, TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5

REDUCES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
# (first opset where axes is an input)
AXES_INPUT_SINCE = {op: (13 if op == "ReduceSum" else 18) for op in REDUCES}

CASES = [((3, 5), [1], 1), ((3, 5), [0], 0), ((2, 3, 4), [0, 2], 1), ((2, 3, 4), [-1, 1], 0),
         ((2, 3, 4), [1], 0), ((2, 3, 4), None, 1), ((2, 3, 4), None, 0), ((7,), [0], 0),
         ((2, 3, 1100), [1], 1), ((2, 1100, 2), [0, 2], 0), ((2, 3, 4, 5), [1, 3], 1)]


def _model(op, x, axes, keepdims, opset, **attrs):
    if opset >= AXES_INPUT_SINCE[op]:
        inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
        return node_model(op, {"x": x}, dict(keepdims=keepdims, **attrs), opset=opset, initializers=inits)
    a = dict(keepdims=keepdims, **attrs)
    if axes is not None:
        a["axes"] = axes
    return node_model(op, {"x": x}, a, opset=opset)


def _x(op, shape, dtype=np.float32):
    low = 0.1 if op in ("ReduceLogSum",) else -2.0
    return rand(*shape, dtype=dtype, low=low, high=2.0)


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("shape,axes,keepdims", CASES)
def test_reduce_newest_form(op, shape, axes, keepdims):
    x = _x(op, shape)
    assert_matches_ort(_model(op, x, axes, keepdims, 18), {"x": x}, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape,axes,keepdims", [((2, 3, 4), [1], 1), ((2, 3, 4), [0, -1], 0),
                                                 ((2, 3, 4), None, 0)])
def test_reduce_axes_attribute(op, opset, shape, axes, keepdims):
    x = _x(op, shape)
    assert_matches_ort(_model(op, x, axes, keepdims, opset), {"x": x}, rtol=RT, atol=AT, opt_levels=(0,))


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_noop_with_empty_axes(op):
    x = _x(op, (2, 3))
    m = node_model(op, {"x": x}, dict(noop_with_empty_axes=1), opset=18,
                   initializers={"axes": np.array([], np.int64)})
    got = assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(0,))
    assert got[0].shape == x.shape    # no axis reduced; composite ops keep their elementwise step


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_empty_axes_input_means_all(op):
    x = _x(op, (2, 3))
    m = node_model(op, {"x": x}, dict(keepdims=0), opset=18, initializers={"axes": np.array([], np.int64)})
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(0,))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceL1", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_int(op, dtype):
    x = rand(3, 4, 5, dtype=dtype, low=-7, high=7)
    assert_matches_ort(_model(op, x, [1], 0, 18), {"x": x}, rtol=0, atol=0, opt_levels=(0,))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2",
                                "ReduceLogSumExp"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 3e-3)])
def test_reduce_float_types(op, dtype, tol):
    x = _x(op, (3, 4, 5), dtype)
    assert_matches_ort(_model(op, x, [0, 2], 1, 18), {"x": x}, rtol=tol, atol=tol, opt_levels=(0,))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_int8(op):
    x = rand(3, 4, dtype=np.int8, low=-100, high=100)
    assert_matches_ort(_model(op, x, [1], 1, 18), {"x": x}, rtol=0, atol=0, opt_levels=(0,))


def test_reduce_logsumexp_large_values_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1001.0]], np.float32)
    assert_matches_ort(_model("ReduceLogSumExp", x, [1], 0, 18), {"x": x}, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_reference_matches_ort(op):
    x = _x(op, (2, 3, 4))
    exp = ort_run(_model(op, x, [0, 2], 0, 18), {"x": x})[0]
    g = Graph()
    xi = g.add_input("x", TensorType.of(x))
    out = Builder(g).op(op, xi, g.add_const(np.array([0, 2], np.int64)), keepdims=0)
    got = run_reference(out.producer, [x, np.array([0, 2], np.int64)])[0]
    assert got.dtype == exp.dtype and got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=RT, atol=AT)


@pytest.mark.parametrize("axes,msg", [([2], "out of range"), ([0, -2], "twice")])
def test_reduce_axes_errors(axes, msg):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    with pytest.raises(ShapeError, match=msg):
        Builder(g).ReduceSum(x, g.add_const(np.array(axes, np.int64)))


def test_reduce_runtime_axes_rejected():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    a = g.add_input("a", TensorType(DType.i64, (1,)))
    with pytest.raises(ShapeError, match="compile time"):
        Builder(g).ReduceMean(x, a)


def test_reduce_int_logsumexp_rejected():
    g = Graph()
    x = g.add_input("x", TensorType(DType.i32, (2, 3)))
    with pytest.raises(ShapeError, match="not supported"):
        Builder(g).ReduceLogSumExp(x)


def test_reduce_flops():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    out = Builder(g).ReduceSum(x)
    assert get_op("ReduceSum").flops(out.producer) == 6
