"""Reduce*, ArgMax/ArgMin, CumSum, TopK against onnxruntime (ONNX spec sections of each op)."""
import numpy as np
import pytest

from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, get_op, run_reference
from tensorfuse.ir.types import DType, TensorType
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
    # one case per op also at O2 (a single-node graph compiles to the same kernel)
    levels = (0, 2) if (shape, axes) == ((2, 3, 4), [0, 2]) else (0,)
    assert_matches_ort(_model(op, x, axes, keepdims, 18), {"x": x}, rtol=RT, atol=AT, opt_levels=levels)


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


# ----------------------------------------------------------------------------- ArgMax / ArgMin
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis", [((3, 5), 1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -1),
                                        ((7,), 0), ((2, 3, 1100), 1)])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin(op, shape, axis, keepdims, last):
    x = rand(*shape, dtype=np.int32, low=-3, high=3)   # many ties
    m = node_model(op, {"x": x}, dict(axis=axis, keepdims=keepdims, select_last_index=last), opset=13)
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0, opt_levels=(0,))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_argmax_dtypes_default_axis(op, dtype):
    x = rand(4, 3, dtype=dtype, low=-50, high=50)
    assert_matches_ort(node_model(op, {"x": x}, opset=11), {"x": x}, rtol=0, atol=0, opt_levels=(0,))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_reference_matches_ort(op):
    x = rand(2, 3, 4, dtype=np.int32, low=-2, high=2)
    attrs = dict(axis=1, keepdims=0, select_last_index=1)
    exp = ort_run(node_model(op, {"x": x}, attrs, opset=13), {"x": x})[0]
    g = Graph()
    out = Builder(g).op(op, g.add_input("x", TensorType.of(x)), **attrs)
    np.testing.assert_array_equal(run_reference(out.producer, [x])[0], exp)


def test_argmax_errors():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 0)))
    with pytest.raises(ShapeError, match="size 0"):
        Builder(g).ArgMax(x, axis=1)
    with pytest.raises(ShapeError, match="out of range"):
        Builder(g).ArgMin(x, axis=2)


# ----------------------------------------------------------------------------- CumSum
@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), 1),
                                        ((2, 3, 4), -1), ((2, 1100, 2), 2)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(shape, axis, exclusive, reverse):
    x = rand(*shape)
    m = node_model("CumSum", {"x": x}, dict(exclusive=exclusive, reverse=reverse), opset=14,
                   initializers={"axis": np.array(axis, np.int64)})
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=1e-4, opt_levels=(0,))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
@pytest.mark.parametrize("axis_dtype", [np.int32, np.int64])
def test_cumsum_dtypes(dtype, axis_dtype):
    x = rand(3, 4, dtype=dtype, low=-9, high=9)
    m = node_model("CumSum", {"x": x}, dict(exclusive=1), opset=11,
                   initializers={"axis": np.array([1], axis_dtype)})
    assert_matches_ort(m, {"x": x}, rtol=1e-12, atol=0, opt_levels=(0,))


def test_cumsum_reference_matches_ort():
    x = rand(2, 3, 4)
    for ex in (0, 1):
        for rev in (0, 1):
            exp = ort_run(node_model("CumSum", {"x": x}, dict(exclusive=ex, reverse=rev), opset=14,
                                     initializers={"axis": np.array(1, np.int64)}), {"x": x})[0]
            g = Graph()
            a = g.add_const(np.array(1, np.int64))
            out = Builder(g).CumSum(g.add_input("x", TensorType.of(x)), a, exclusive=ex, reverse=rev)
            np.testing.assert_allclose(run_reference(out.producer, [x, a.data])[0], exp, rtol=RT, atol=AT)


def test_cumsum_runtime_axis_rejected():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    with pytest.raises(ShapeError, match="compile time"):
        Builder(g).CumSum(x, g.add_input("a", TensorType(DType.i64, ())))


# ----------------------------------------------------------------------------- TopK
TOPK = [((3, 5), 1, 2), ((2, 3, 4), 0, 2), ((2, 3, 4), 1, 3), ((2, 6, 4), -1, 4), ((2, 6, 4), -1, 0),
        ((9,), 0, 9)]


@pytest.mark.parametrize("shape,axis,k", TOPK)
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_topk(shape, axis, k, largest, dtype):
    x = rand(*shape, dtype=dtype, low=-3, high=3)   # ints: many ties, lower index first
    m = node_model("TopK", {"x": x}, dict(axis=axis, largest=largest, sorted=1), opset=11,
                   initializers={"k": np.array([k], np.int64)}, outputs=("v", "i"))
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0, opt_levels=(0,))


def test_topk_unsorted_is_a_permutation_of_sorted():
    x = rand(3, 8)
    m = node_model("TopK", {"x": x}, dict(sorted=0), opset=11,
                   initializers={"k": np.array([3], np.int64)}, outputs=("v", "i"))
    import tensorfuse
    from tests.oracle import ort_run as run
    got = tensorfuse.compile(m, opt_level=0).run(x=x)
    exp = run(m, {"x": x})
    np.testing.assert_array_equal(np.sort(got[0], axis=-1), np.sort(exp[0], axis=-1))
    np.testing.assert_array_equal(np.take_along_axis(x, got[1], -1), got[0])


@pytest.mark.parametrize("opset", [7, 10])
def test_topk_old_versions(opset):
    x = rand(3, 6)
    if opset < 10:
        m = node_model("TopK", {"x": x}, dict(k=2, axis=1), opset=opset, outputs=("v", "i"))
    else:
        m = node_model("TopK", {"x": x}, dict(axis=1), opset=opset,
                       initializers={"k": np.array([2], np.int64)}, outputs=("v", "i"))
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0, opt_levels=(0,))


def test_topk_reference_matches_ort():
    x = rand(2, 5, 3, dtype=np.int64, low=-2, high=2)
    for largest in (0, 1):
        m = node_model("TopK", {"x": x}, dict(axis=1, largest=largest), opset=11,
                       initializers={"k": np.array([3], np.int64)}, outputs=("v", "i"))
        exp = ort_run(m, {"x": x})
        g = Graph()
        k = g.add_const(np.array([3], np.int64))
        out = Builder(g).op("TopK", g.add_input("x", TensorType.of(x)), k, num_outputs=2, axis=1, largest=largest)
        got = run_reference(out[0].producer, [x, k.data])
        for a, b in zip(got, exp):
            np.testing.assert_array_equal(a, b)


def test_topk_k_too_large():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    with pytest.raises(ShapeError, match="outside"):
        Builder(g).op("TopK", x, g.add_const(np.array([4], np.int64)), num_outputs=2)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool_opset20(op):
    x = rand(3, 4, dtype=np.bool_)
    m = node_model(op, {"x": x}, {"keepdims": 0}, opset=20, initializers={"axes": np.array([1], np.int64)})
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0, opt_levels=(0,))
