"""MaxPool, AveragePool, LpPool, the global pools and MaxUnpool against onnxruntime (ONNX spec,
one section per op): every attribute at small sizes, N-D, older opsets, references, errors."""
import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import compiler
from ir.registry import ShapeError, get_op
from tests.oracle import node_model, ort_run, rand
from tests.test_ops_conv import _check, _ref

RT, AT = 1e-4, 1e-5


def _x(*shape, dtype=np.float32, seed=0):
    return rand(*shape, dtype=dtype, seed=seed, low=-1, high=1)


# (x shape, attrs) shared by MaxPool, AveragePool and LpPool
WINDOW_CASES = [
    ((1, 2, 7, 8), {"kernel_shape": [2, 2]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 2, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 1, 5, 5), {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 1, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),  # last-window rule
    ((1, 2, 10, 9), {"kernel_shape": [2, 3], "dilations": [2, 2]}),
    ((1, 2, 11, 10), {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [2, 1, 1, 1]}),
    ((1, 2, 11, 10), {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 3, 3), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}),
    ((2, 3, 13), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 1300), {"kernel_shape": [4], "strides": [1], "pads": [2, 1]}),     # row longer than one tile
    ((1, 2, 2100), {"kernel_shape": [3], "strides": [2], "pads": [1, 0], "ceil_mode": 1}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    ((1, 2, 6, 5, 7), {"kernel_shape": [2, 2, 3], "dilations": [2, 1, 2], "ceil_mode": 1, "strides": [2, 2, 2]}),
]
AUTO_PAD_CASES = [
    ({"auto_pad": "SAME_UPPER", "kernel_shape": [3, 3]}),
    ({"auto_pad": "SAME_UPPER", "kernel_shape": [2, 3], "strides": [2, 2]}),
    ({"auto_pad": "SAME_LOWER", "kernel_shape": [2, 2], "strides": [2, 3]}),
    ({"auto_pad": "SAME_LOWER", "kernel_shape": [3, 4]}),
    ({"auto_pad": "VALID", "kernel_shape": [3, 2], "strides": [2, 2]}),
    ({"auto_pad": "NOTSET", "kernel_shape": [3, 2]}),
]
IDS = [str(i) for i in range(len(WINDOW_CASES))]


def _uses_dilation(attrs):
    return any(d != 1 for d in attrs.get("dilations", []))


# ----------------------------------------------------------------------------- MaxPool
@pytest.mark.parametrize("shape,attrs", WINDOW_CASES, ids=IDS)
def test_maxpool(shape, attrs):
    _check("MaxPool", [_x(*shape)], attrs)


@pytest.mark.parametrize("attrs", AUTO_PAD_CASES)
def test_maxpool_auto_pad(attrs):
    _check("MaxPool", [_x(1, 2, 9, 8)], attrs)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int8, np.uint8])
def test_maxpool_dtypes(dtype):
    x = rand(1, 2, 7, 6, dtype=dtype, low=-100 if dtype == np.int8 else 0, high=100)
    _check("MaxPool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 1]}, rtol=0, atol=0)


@pytest.mark.parametrize("opset", [7, 8, 10, 11, 12])
def test_maxpool_old_opsets(opset):
    attrs = {"kernel_shape": [3, 3], "pads": [1, 0, 1, 1], "strides": [2, 2]}
    if opset >= 10:
        attrs["ceil_mode"] = 1
    _check("MaxPool", [_x(1, 2, 8, 9)], attrs, opset=opset)


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 7, 8), {"kernel_shape": [2, 2]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "storage_order": 1}),
    ((1, 2, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "storage_order": 1}),
    ((1, 2, 10, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 1, 0, 0]}),
    ((2, 3, 13), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "storage_order": 1}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
])
def test_maxpool_indices(shape, attrs):
    _check("MaxPool", [_x(*shape)], attrs, outputs=("y", "i"))


def test_maxpool_indices_ties_take_first():
    x = np.zeros((1, 1, 4, 4), np.float32)
    _check("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [1, 1]}, outputs=("y", "i"))


def test_maxpool_reference_matches_ort():
    x = _x(2, 3, 9, 8)
    attrs = {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 2], "ceil_mode": 1, "storage_order": 1}
    (y, i), node = _ref("MaxPool", [x], num_outputs=2, **attrs)
    ey, ei = ort_run(node_model("MaxPool", {"x": x}, attrs, outputs=("y", "i")), {"x": x})
    np.testing.assert_array_equal(y, ey)
    np.testing.assert_array_equal(i, ei)
    assert get_op("MaxPool").flops(node) == y.size * 6


# ----------------------------------------------------------------------------- AveragePool
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", WINDOW_CASES, ids=IDS)
def test_averagepool(shape, attrs, count_include_pad):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    # dilations in AveragePool arrived in opset 19
    _check("AveragePool", [_x(*shape)], attrs, opset=19 if _uses_dilation(attrs) else 17)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", AUTO_PAD_CASES)
def test_averagepool_auto_pad(attrs, count_include_pad):
    _check("AveragePool", [_x(1, 2, 9, 8)], dict(attrs, count_include_pad=count_include_pad))


@pytest.mark.parametrize("opset", [7, 10, 11, 19])
def test_averagepool_old_opsets(opset):
    attrs = {"kernel_shape": [3, 3], "pads": [1, 0, 1, 1], "strides": [2, 2], "count_include_pad": 1}
    if opset >= 10:
        attrs["ceil_mode"] = 1
    _check("AveragePool", [_x(1, 2, 8, 9)], attrs, opset=opset)


def test_averagepool_f64_f16():
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    # onnxruntime has no f64 AveragePool: onnx.reference is the oracle
    _check("AveragePool", [_x(1, 2, 7, 8, dtype=np.float64)], attrs, rtol=1e-12, atol=1e-12, oracle="ref")
    _check("AveragePool", [_x(1, 2, 7, 8, dtype=np.float16)], attrs, rtol=2e-3, atol=2e-3)


def test_averagepool_reference_matches_ort():
    x = _x(2, 3, 9, 8)
    for cip in (0, 1):
        attrs = {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 2], "ceil_mode": 1,
                 "count_include_pad": cip}
        (y,), _ = _ref("AveragePool", [x], **attrs)
        np.testing.assert_allclose(y, ort_run(node_model("AveragePool", {"x": x}, attrs), {"x": x})[0],
                                   rtol=RT, atol=AT)


# ----------------------------------------------------------------------------- LpPool
@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape,attrs", [WINDOW_CASES[i] for i in (0, 3, 12, 15)])
def test_lppool(shape, attrs, p):
    _check("LpPool", [_x(*shape)], dict(attrs, p=p), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,attrs", [WINDOW_CASES[i] for i in (5, 9, 16)])
def test_lppool_ceil_mode_and_dilations(shape, attrs):
    # LpPool-18 added ceil_mode and dilations
    _check("LpPool", [_x(*shape)], dict(attrs, p=2), opset=18)


@pytest.mark.parametrize("opset", [11, 18])
def test_lppool_opsets(opset):
    _check("LpPool", [_x(1, 2, 7, 8)], {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 1, 0, 0]},
           opset=opset)


def test_lppool_reference_matches_ort():
    x = _x(1, 2, 7, 8)
    attrs = {"kernel_shape": [2, 3], "pads": [1, 1, 1, 0], "p": 3}
    (y,), _ = _ref("LpPool", [x], **attrs)
    np.testing.assert_allclose(y, ort_run(node_model("LpPool", {"x": x}, attrs), {"x": x})[0], rtol=RT, atol=AT)


# ----------------------------------------------------------------------------- global pools
GLOBAL_SHAPES = [(1, 3, 7, 7), (2, 4, 5), (1, 2, 3, 4, 5), (2, 3, 1, 1), (1, 5, 40, 30)]


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", GLOBAL_SHAPES)
def test_global_pool(op, shape):
    _check(op, [_x(*shape)], {}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape", GLOBAL_SHAPES[:3])
def test_global_lp_pool(shape, p):
    _check("GlobalLpPool", [_x(*shape)], {"p": p})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_f64_f16(op):
    _check(op, [_x(2, 3, 5, 4, dtype=np.float64)], {}, rtol=1e-12, atol=1e-12, oracle="ref")  # not in onnxruntime
    _check(op, [_x(2, 3, 5, 4, dtype=np.float16)], {}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("GlobalMaxPool", {}), ("GlobalLpPool", {"p": 3})])
def test_global_pool_reference_matches_ort(op, attrs):
    x = _x(2, 3, 4, 5)
    (y,), node = _ref(op, [x], **attrs)
    np.testing.assert_allclose(y, ort_run(node_model(op, {"x": x}, attrs), {"x": x})[0], rtol=RT, atol=AT)
    assert y.shape == (2, 3, 1, 1)
    assert get_op(op).flops(node) == x.size


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("op,shape,attrs,msg", [
    ("MaxPool", (1, 2, 5, 5), {}, "kernel_shape attribute is required"),
    ("MaxPool", (1, 2, 5, 5), {"kernel_shape": [2]}, "spatial dims"),
    ("MaxPool", (1, 2, 5, 5), {"kernel_shape": [6, 6]}, "exceeds"),
    ("MaxPool", (1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [1]}, "strides"),
    ("MaxPool", (1, 2, 5, 5), {"kernel_shape": [2, 2], "storage_order": 2}, "storage_order"),
    ("MaxPool", (5, 5), {"kernel_shape": [2]}, "spatial dim"),
    ("AveragePool", (1, 2, 5, 5), {"kernel_shape": [2, 2], "pads": [1, 1, 1]}, "pads"),
    ("LpPool", (1, 2, 5, 5), {"kernel_shape": [2, 2], "p": 0}, "p must be"),
    ("GlobalAveragePool", (5,), {}, "rank >= 2"),
])
def test_pool_errors(op, shape, attrs, msg):
    with pytest.raises(ShapeError, match=msg):
        _ref(op, [_x(*shape)], **attrs)


def test_pool_dtype_errors():
    with pytest.raises(ShapeError, match="dtype"):
        _ref("AveragePool", [_x(1, 2, 5, 5).astype(np.int8)], kernel_shape=[2, 2])
    with pytest.raises(ShapeError, match="dtype"):
        _ref("MaxPool", [_x(1, 2, 5, 5).astype(np.int32)], kernel_shape=[2, 2])


# ----------------------------------------------------------------------------- MaxUnpool
def _pooled(shape, attrs, seed=0):
    x = _x(*shape, seed=seed)
    y, i = ort_run(node_model("MaxPool", {"x": x}, attrs, outputs=("y", "i")), {"x": x})
    return y, i


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 3, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 0]}),
    ((1, 2, 9), {"kernel_shape": [3], "strides": [3]}),
    ((1, 2, 4, 6, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
])
def test_maxunpool(shape, attrs):
    y, i = _pooled(shape, attrs)
    _check("MaxUnpool", [y, i], attrs)


@pytest.mark.parametrize("natural", [False, True])
def test_maxunpool_output_shape(natural):
    """output_shape larger than the unpooled shape pads it with zeros at the end (onnx.reference
    and the ONNX node test; onnxruntime differs, so onnx.reference is the oracle)."""
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    y, i = _pooled((2, 2, 4, 4), attrs)
    out = [2, 2, 4, 4] if natural else [2, 2, 5, 6]
    m = node_model("MaxUnpool", {"p": y, "i": i}, attrs, initializers={"s": np.array(out, np.int64)})
    m.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out))
    expected = ReferenceEvaluator(m).run(None, {"p": y, "i": i})[0]
    got = compiler.compile(m).run(p=y, i=i)[0]
    np.testing.assert_array_equal(got, expected)
    if natural:
        np.testing.assert_array_equal(got, ort_run(m, {"p": y, "i": i})[0])


def test_maxunpool_reference_and_errors():
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    y, i = _pooled((1, 2, 4, 4), attrs)
    (got,), _ = _ref("MaxUnpool", [y, i], **attrs)
    exp = ort_run(node_model("MaxUnpool", {"p": y, "i": i}, attrs), {"p": y, "i": i})[0]
    np.testing.assert_array_equal(got, exp)
    with pytest.raises(ShapeError, match="I must be i64"):
        _ref("MaxUnpool", [y, i.astype(np.int32)], **attrs)
    with pytest.raises(ShapeError, match="kernel_shape"):
        _ref("MaxUnpool", [y, i])
