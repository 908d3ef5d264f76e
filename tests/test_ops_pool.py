"""MaxPool, AveragePool, LpPool, the global pools and MaxUnpool against onnxruntime (ONNX spec,
one section per op): every attribute at small sizes, N-D, older opsets, references, errors."""
import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.registry import ShapeError, get_op
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


# planes of exactly one vector, one vector and a tail, fewer vectors than accumulators,
# accumulators and left-over vectors, 13x13 (squeezenet), 1-D, and one large enough for 2 threads
GLOBAL_VEC_SHAPES = [(2, 3, 2, 4), (1, 4, 11), (1, 3, 3, 7), (2, 2, 5, 9), (1, 6, 13, 13), (1, 3, 257),
                     (1, 256, 40, 40)]


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("GlobalMaxPool", {}),
                                      ("GlobalLpPool", {"p": 1}), ("GlobalLpPool", {"p": 2})])
@pytest.mark.parametrize("shape", GLOBAL_VEC_SHAPES)
def test_global_pool_vectorised(op, attrs, shape):
    """float32 planes: partial vector accumulators, lanes and tail combined at the end; 1 and 2
    threads against onnxruntime. A plane of at least one vector of the host's lanes (8 with
    AVX2, 16 with AVX-512: the two smallest shapes are below 16) is read with vector loads."""
    from tensorfuse.ir.target import Target
    x = _x(*shape, seed=9)
    m = node_model(op, {"x": x}, attrs)
    expected = ort_run(m, {"x": x})[0]
    for nt in (1, 2):
        mod = tensorfuse.compile(m, num_threads=nt)
        np.testing.assert_allclose(mod.run(x)[0], expected, rtol=1e-5, atol=1e-6, err_msg=f"{nt} threads")
    (k,) = mod.kernels
    lanes = Target.parse("llvm").lanes(np.float32)
    assert bool(_vector_widths(k)) == (int(np.prod(shape[2:])) >= lanes), _vector_widths(k)
    if x.size > 400_000:
        from tensorfuse.codegen.llvm.emit import kernel_is_parallel
        assert kernel_is_parallel(k)


def test_global_max_pool_nan_inf():
    """NaN is skipped (maxNum, README "NaN in max/min-like ops"), in the vector part or the
    tail; a plane of NaN only gives NaN; +-inf planes against onnxruntime."""
    x = _with_specials((2, 8, 5, 7), seed=10, nan=False)
    x[0, 1, 0, 3] = np.nan          # first vector
    x[1, 2, 4, 6] = -np.nan         # tail (35 = 4 vectors + 3 on 8 lanes; 2 vectors + 3 on 16)
    x[1, 5, 2, 1] = np.nan
    x[1, 7] = np.nan                # a whole plane
    m = node_model("GlobalMaxPool", {"x": x}, {})
    ref = np.fmax.reduce(x.reshape(2, 8, -1), axis=2)[..., None, None]
    got = tensorfuse.compile(m).run(x)[0]
    np.testing.assert_array_equal(got, ref)
    assert np.isnan(got).sum() == 1 and np.isnan(got[1, 7]).all()
    ok = ~np.isnan(ref)
    xi = np.where(np.isnan(x), -np.inf, x)          # onnxruntime without NaN: the same maxima
    np.testing.assert_array_equal(got[ok], ort_run(m, {"x": xi})[0][ok])


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_at_each_vector_width(width, op):
    target, lanes = width
    x = _x(2, 5, 7, 9, seed=11)
    m = node_model(op, {"x": x}, {})
    mod = tensorfuse.compile(m, target=target, cache=False, num_threads=2)
    (k,) = mod.kernels
    assert _vector_widths(k) == {lanes}
    np.testing.assert_allclose(mod.run(x)[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


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


# ----------------------------------------------------------------------------- 2-D float32 rows schedule
# emit_pool2d_rows (vertical then horizontal pass over one output row, L-lane vectors, L from
# the target): widths that are no multiple of 8 or 16 (vector tails), rows narrower than one
# vector, strides 1/2/3, pads, ceil_mode, dilations, 2x2 to 7x7 and non-square kernels, N > 1
ROWS_CASES = [
    ((1, 3, 12, 37), {"kernel_shape": [3, 3]}),
    ((2, 3, 13, 40), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 4, 11, 33), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((1, 2, 15, 50), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 16, 55), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 17, 52), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 2, 1, 0]}),
    ((1, 2, 13, 49), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [2, 1, 2, 2], "ceil_mode": 1}),
    ((1, 2, 14, 47), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 9, 19), {"kernel_shape": [2, 2]}),
    ((1, 2, 9, 34), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 1], "ceil_mode": 1}),
    ((1, 3, 16, 45), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    ((1, 2, 18, 41), {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2], "ceil_mode": 1}),
    ((1, 2, 10, 39), {"kernel_shape": [3, 5], "strides": [1, 2], "pads": [1, 2, 0, 2]}),
    ((1, 2, 12, 29), {"kernel_shape": [5, 2], "strides": [2, 1], "pads": [2, 0, 2, 1]}),
    ((1, 2, 13, 35), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 2, 11, 64), {"kernel_shape": [2, 3], "dilations": [1, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),                 # row < one vector
    ((1, 2, 7, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 1, 9, 21), {"kernel_shape": [7, 7], "pads": [3, 3, 3, 3]}),
    ((1, 2, 20, 26), {"kernel_shape": [7, 7], "strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 2, 6, 16), {"kernel_shape": [4, 4], "strides": [4, 4]}),
    ((1, 2, 6, 24), {"kernel_shape": [1, 1], "strides": [2, 3]}),                   # 1x1: a strided copy
    ((3, 5, 9, 26), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # large enough for default_schedule's parallel loop: 2 threads split the output rows
    ((2, 8, 30, 61), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 16, 33, 70), {"kernel_shape": [3, 3]}),
    ((1, 12, 31, 53), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    ((2, 7, 41, 87), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
]
ROWS_IDS = [f"{s[2]}x{s[3]}-k{a['kernel_shape'][0]}x{a['kernel_shape'][1]}-{i}" for i, (s, a) in enumerate(ROWS_CASES)]


def _rows_kernels(mod):
    return [k for k in mod.kernels if "[rows:" in k.comment]


def _check_threads(model, inputs, rtol=RT, atol=AT, expect_rows=True, opt_levels=(0, 2), expected=None):
    """Compare with onnxruntime (or ``expected``) at each opt level and at 1 and 2 threads; the
    two thread counts give the same bits."""
    if expected is None:
        expected = ort_run(model, inputs)
    for lvl in opt_levels:
        mod = tensorfuse.compile(model, opt_level=lvl)
        assert bool(_rows_kernels(mod)) == expect_rows, [k.comment for k in mod.kernels]
        runs = []
        for nt in (1, 2):
            mod.num_threads = nt
            got = mod.run(**inputs)
            for g, e in zip(got, expected):
                assert g.dtype == e.dtype and g.shape == e.shape, f"O{lvl} {nt} threads: {g.dtype}{g.shape}"
                np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"O{lvl}, {nt} threads")
            runs.append(got)
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,attrs", ROWS_CASES, ids=ROWS_IDS)
def test_maxpool_rows(shape, attrs):
    x = _x(*shape, seed=1)
    _check_threads(node_model("MaxPool", {"x": x}, attrs), {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", ROWS_CASES, ids=ROWS_IDS)
def test_averagepool_rows(shape, attrs, count_include_pad):
    x = _x(*shape, seed=2)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    m = node_model("AveragePool", {"x": x}, attrs, opset=19 if _uses_dilation(attrs) else 17)
    _check_threads(m, {"x": x})


def _with_specials(shape, seed, nan=True):
    """Random values with +-inf (and NaN, both signs) sprinkled in."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    u = rng.random(shape)
    x[u < 0.03] = np.inf
    x[(u >= 0.03) & (u < 0.06)] = -np.inf
    if nan:
        x[(u >= 0.06) & (u < 0.09)] = np.nan
        x[(u >= 0.09) & (u < 0.10)] = -np.nan
    return x


@pytest.mark.parametrize("shape,attrs", [ROWS_CASES[i] for i in (0, 3, 5, 8, 10, 12, 16, 22)])
def test_maxpool_rows_nan(shape, attrs):
    """NaN is skipped (maxNum, README "NaN in max/min-like ops"): a window gives the maximum of
    its numbers, NaN only when all of them are NaN. onnxruntime keeps or drops a NaN depending on
    where it sits in the window, so the oracle is onnxruntime on x with NaN as -inf, and on the
    not-NaN mask to find the windows of NaN only; +-inf everywhere."""
    x = _with_specials(shape, seed=3)
    x.reshape(-1)[: x.shape[-1] * 3] = np.nan                 # some windows of NaN only
    m = node_model("MaxPool", {"x": x}, attrs)
    numbers = ort_run(m, {"x": (~np.isnan(x)).astype(np.float32)})[0]
    ref = np.where(numbers > 0, ort_run(m, {"x": np.where(np.isnan(x), -np.inf, x)})[0], np.nan).astype(np.float32)
    has_nan = np.isnan(ref)
    assert has_nan.any() and not has_nan.all()
    for lvl in (0, 2):
        mod = tensorfuse.compile(m, opt_level=lvl)
        assert _rows_kernels(mod)
        for nt in (1, 2):
            mod.num_threads = nt
            got = mod.run(x)[0]
            np.testing.assert_array_equal(got, ref, err_msg=f"O{lvl}, {nt} threads")
    xi = _with_specials(shape, seed=4, nan=False)            # +-inf only: onnxruntime throughout
    _check_threads(node_model("MaxPool", {"x": xi}, attrs), {"x": xi}, rtol=0, atol=0)


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool_rows_nan_inf(count_include_pad):
    x = _with_specials((1, 3, 14, 37), seed=5)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": count_include_pad}
    _check_threads(node_model("AveragePool", {"x": x}, attrs), {"x": x})


def _pool_chain_model(op, attrs, x, tail):
    """op(x) followed by ``tail`` nodes (fused into the pool's epilogue at O2)."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node(op, ["x"], ["p"], **attrs)] + tail
    y = _ref(op, [x], **attrs)[0][0]
    res = helper.make_tensor_value_info("res", TensorProto.FLOAT, list(y.shape))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)), res],
                          [helper.make_empty_tensor_value_info("y")],
                          initializer=[onnx.numpy_helper.from_array(
                              np.linspace(0.5, 1.5, x.shape[1], dtype=np.float32).reshape(1, -1, 1, 1), "scale")])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    m.ir_version = min(m.ir_version, 10)
    m = onnx.shape_inference.infer_shapes(m)
    m.graph.output[0].CopyFrom(next(v for v in list(m.graph.value_info) + list(m.graph.output) if v.name == "y"))
    return m, y.shape


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (1, 4, 14, 30), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 3, 15, 29), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", (1, 4, 14, 30), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 3, 16, 35), {"kernel_shape": [2, 2], "strides": [2, 2], "count_include_pad": 1}),
])
def test_pool_rows_fused_epilogue(op, shape, attrs):
    """Pool -> Mul (per channel) -> Add (a residual of the output's shape) -> Relu: at O2 one
    kernel, the epilogue on vectors and on the tail lanes."""
    from onnx import helper
    tail = [helper.make_node("Mul", ["p", "scale"], ["m"]), helper.make_node("Add", ["m", "res"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"])]
    x = _x(*shape, seed=6)
    m, yshape = _pool_chain_model(op, attrs, x, tail)
    res = rand(*yshape, seed=7, low=-1, high=1)
    _check_threads(m, {"x": x, "res": res})
    mod = tensorfuse.compile(m, opt_level=2)
    assert len(mod.kernels) == 1 and _rows_kernels(mod), [k.name for k in mod.kernels]


def _vector_widths(kernel) -> set[int]:
    """Widths of the vector loads and stores in a kernel's IR."""
    from tensorfuse.ir.kernel import Expr, For, If, Load, Store
    out: set[int] = set()

    def expr(e):
        if isinstance(e, Load) and e.lanes > 1:
            out.add(e.lanes)
        for v in vars(e).values():
            if isinstance(v, Expr):
                expr(v)

    def stmts(body):
        for s in body:
            if isinstance(s, Store):
                expr(s.value)
                if s.value.lanes > 1:
                    out.add(s.value.lanes)
            elif isinstance(s, For):
                stmts(s.body)
            elif isinstance(s, If):
                stmts(s.then), stmts(s.orelse)
    stmts(kernel.body)
    return out


def test_pool_rows_schedule():
    """The rows kernel is parallel over (n, c, block of output rows) and uses the target's vector width;
    the generic kernel stays for what the rows schedule does not cover (f16, 1-D, 3-D, the
    Indices output, kernels wider than ROWS_MAX_KW, LpPool), which still match onnxruntime."""
    from tensorfuse.codegen.llvm.emit import kernel_is_parallel
    from tensorfuse.ir.target import Target
    from tensorfuse.ir.kernel import For
    from tests.codegen_util import float_vectors, function_ir, optimized_ir, parallel_kernels
    L = Target.parse("llvm").lanes(np.float32)
    x = _x(2, 16, 40, 45)
    for op in ("MaxPool", "AveragePool"):
        mod = tensorfuse.compile(node_model(op, {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
                               num_threads=2)
        (k,) = _rows_kernels(mod)
        assert kernel_is_parallel(k) and k.name in parallel_kernels(mod)
        (top,) = [s for s in k.body if isinstance(s, For)]
        rows = k.knobs.get("rows_per_task", 1)            # llvm.pool2d_rows_vector: blocks of rows
        assert top.kind == "parallel" and top.extent.value == 2 * 16 * -(-40 // rows)   # (n, c, row block)
        assert _vector_widths(k) == {L}
        assert L in float_vectors(function_ir(optimized_ir(mod), k.name))
    for shape, attrs in ROWS_CASES[-4:]:            # the cases the tests run on 2 threads split
        mod = tensorfuse.compile(node_model("MaxPool", {"x": _x(*shape)}, attrs))
        assert all(kernel_is_parallel(k) for k in _rows_kernels(mod)), (shape, attrs)
    for op, xs, attrs, outs in [
        ("MaxPool", _x(1, 2, 9, 20).astype(np.float16), {"kernel_shape": [3, 3]}, ("y",)),
        ("MaxPool", _x(1, 2, 30), {"kernel_shape": [3]}, ("y",)),
        ("MaxPool", _x(1, 2, 5, 6, 20), {"kernel_shape": [2, 2, 2]}, ("y",)),
        ("MaxPool", _x(1, 2, 9, 20), {"kernel_shape": [3, 3]}, ("y", "i")),
        ("MaxPool", _x(1, 2, 20, 40), {"kernel_shape": [3, 17]}, ("y",)),
        ("AveragePool", _x(1, 2, 9, 20).astype(np.float16), {"kernel_shape": [3, 3]}, ("y",)),
        ("LpPool", _x(1, 2, 9, 20), {"kernel_shape": [3, 3]}, ("y",)),
    ]:
        m = node_model(op, {"x": xs}, attrs, outputs=outs)
        _check_threads(m, {"x": xs}, rtol=2e-3 if xs.dtype == np.float16 else RT,
                       atol=2e-3 if xs.dtype == np.float16 else AT, expect_rows=False, opt_levels=(2,))


@pytest.fixture
def width(vector_width):
    """(target, lanes) at each vector width (tests/conftest.py VECTOR_WIDTHS)."""
    return vector_width


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (1, 3, 13, 37), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (1, 3, 15, 69), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 2, 7, 11), {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 3, 13, 37), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 3, 15, 69), {"kernel_shape": [5, 3], "strides": [2, 2], "pads": [2, 1, 2, 1],
                                     "count_include_pad": 1}),
])
def test_pool_rows_at_each_vector_width(width, op, shape, attrs):
    """The rows kernel's vectors are the target's width (4, 8, 16 lanes) and its tails and
    padded rows give onnxruntime's values at each."""
    target, lanes = width
    x = _x(*shape, seed=8)
    m = node_model(op, {"x": x}, attrs)
    for nt in (1, 2):
        mod = tensorfuse.compile(m, target=target, cache=False, num_threads=nt)
        (k,) = _rows_kernels(mod)
        ow = mod.output_info[0].shape[-1]
        want = lanes if ow >= lanes else max(w for w in (4, 8, 16) if w <= max(ow, 4))   # rows narrower than a vector
        assert f"{want} lanes]" in k.comment and _vector_widths(k) == {want}
        np.testing.assert_allclose(mod.run(x)[0], ort_run(m, {"x": x})[0], rtol=RT, atol=AT)


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
    got = tensorfuse.compile(m).run(p=y, i=i)[0]
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
