"""Quantization ops (ir/ops/quant.py) against onnxruntime (optimisations off) and onnx.reference:
QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked; u8, i8, u16, i16), DynamicQuantizeLinear,
QLinearMatMul, and the integer-to-float products ConvIntegerToFloat / MatMulIntegerToFloat the
quantization rules make. Integer outputs must be equal (QuantizeLinear rounds half to even, as the
spec), float outputs within float32 rounding."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tests.fusion_util import compile_graph, ir_inputs
from tests.oracle import node_model, ort_run

QTYPES = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16}


def _run(model, feeds, opt_levels=(0, 2)):
    outs = []
    for lvl in opt_levels:
        outs.append(tensorfuse.compile(model, opt_level=lvl).run(**feeds))
    return outs


def _assert_equal_everywhere(model, feeds, atol=0.0, reference=True):
    exp_ort = ort_run(model, feeds)
    exp_ref = ReferenceEvaluator(model).run(None, feeds) if reference else exp_ort
    for outs in _run(model, feeds):
        for g, e, r in zip(outs, exp_ort, exp_ref):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=0, atol=atol)
            np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=0, atol=atol)


@pytest.mark.parametrize("qt", list(QTYPES))
def test_quantize_linear_per_tensor_with_ties_and_saturation(qt):
    info = np.iinfo(QTYPES[qt])
    scale = np.float32(0.5)
    zp = np.array(info.min // 2 + info.max // 2, QTYPES[qt])
    # exact .5 ties (x / scale = k + 0.5), values far beyond both ends of the range, and zero
    x = np.array([0.25, 0.75, -0.25, -0.75, 1.25, 0.0, 1e9, -1e9, 3.3, -7.7, 100.1, -100.1], np.float32)
    m = node_model("QuantizeLinear", {"x": x}, initializers={"s": scale, "z": zp}, opset=21)
    _assert_equal_everywhere(m, {"x": x})


def _rounding_edges(qt: str, scale: float, zp: int, n: int = 96) -> np.ndarray:
    """x for QuantizeLinear at one scale and zero point: .5 ties on both sides of zero, ties
    and near-ties at both ends of the output range, values whose quotient overflows int32,
    +-inf, then random values over twice the range (``n`` in all, whole vectors and a tail)."""
    info = np.iinfo(QTYPES[qt])
    q = [k + 0.5 for k in range(-6, 6)]
    for end in (info.min - zp, info.max - zp):
        q += [end - 0.5, end + 0.5, end - 0.4999, end + 0.4999, end - 1.5, end + 1.5]
    x = [v * scale for v in q] + [1e9, -1e9, 3e9 * scale, -3e9 * scale, np.inf, -np.inf]
    rng = np.random.default_rng(7)
    x += list(rng.uniform(2 * (info.min - zp), 2 * (info.max - zp), n - len(x)) * scale)
    return np.array(x, np.float32)


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=haswell"])
@pytest.mark.parametrize("qt", list(QTYPES))
def test_quantize_linear_vector_rounding_at_the_edges(qt, target):
    """The vector requantization (codegen/llvm/emit.py ``_round_narrow``: the quotient clamped
    to [lo - zp, hi - zp], converted rounding half to even, the zero point added as an
    integer; vector expressions only): equal to onnxruntime (and onnx.reference within int32) at ties, at both ends of the
    range and past int32, with the zero point a runtime input (O0) and an immediate in a fused Mul ->
    QuantizeLinear kernel (O2); NaN gives 0 (ir/semantics.py: the saturating cast)."""
    info = np.iinfo(QTYPES[qt])
    zp = int(info.min // 3 + info.max // 3) | 1            # odd, nonzero
    scale = np.float32(0.25)
    x = _rounding_edges(qt, float(scale), zp)
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "one"], ["m"]), helper.make_node("QuantizeLinear", ["m", "s", "z"], ["y"])], "q",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(QTYPES[qt])), x.shape)],
        [numpy_helper.from_array(np.float32(1.0), "one"), numpy_helper.from_array(scale, "s"),
         numpy_helper.from_array(np.array(zp, QTYPES[qt]), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    exp_ort = ort_run(m, {"x": x})[0]
    # onnx.reference converts the rounded quotient to int32 before it saturates, so a quotient
    # past int32 wraps there (1e9 / 0.25 -> 0, not 255): it is the oracle within int32 only
    inside = np.abs(x / scale) < 2.0 ** 31
    np.testing.assert_array_equal(ReferenceEvaluator(m).run(None, {"x": x})[0][inside], exp_ort[inside])
    for lvl in (0, 2):
        mod = tensorfuse.compile(m, target=target, opt_level=lvl, cache=False)
        if lvl == 2 and qt in ("u8", "i8"):   # the fused kernel's 8-bit vectors take the vector form
            assert "llvm.lrint.v" in mod.report.llvm_ir
        np.testing.assert_array_equal(mod.run(x=x)[0], exp_ort)
        xn = x.copy()
        xn[::5] = np.nan
        got = mod.run(x=xn)[0]
        assert (got[::5] == 0).all()
        keep = np.ones(x.size, bool)
        keep[::5] = False
        np.testing.assert_array_equal(got[keep], exp_ort[keep])


@pytest.mark.parametrize("qt", ["u8", "i8"])
def test_quantize_dequantize_per_axis(qt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 4, 5)) * 4).astype(np.float32)
    s = np.array([0.05, 0.1, 0.02], np.float32)
    z = np.array([0, 3, 7] if qt == "u8" else [0, -3, 5], QTYPES[qt])
    m = node_model("QuantizeLinear", {"x": x}, {"axis": 1}, initializers={"s": s, "z": z}, opset=21)
    _assert_equal_everywhere(m, {"x": x})
    q = ort_run(m, {"x": x})[0]
    d = node_model("DequantizeLinear", {"q": q}, {"axis": -3}, initializers={"s": s, "z": z}, opset=21)
    _assert_equal_everywhere(d, {"q": q})


def test_quantize_dequantize_blocked_with_a_partial_block():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 7)) * 3).astype(np.float32)
    s = np.abs(rng.standard_normal((3, 3))).astype(np.float32) + 0.01     # blocks of 3 over 7 columns
    z = rng.integers(-5, 5, (3, 3)).astype(np.int8)
    m = node_model("QuantizeLinear", {"x": x}, {"axis": 1, "block_size": 3}, initializers={"s": s, "z": z}, opset=21)
    _assert_equal_everywhere(m, {"x": x})
    q = ort_run(m, {"x": x})[0]
    d = node_model("DequantizeLinear", {"q": q}, {"axis": 1, "block_size": 3}, initializers={"s": s, "z": z},
                   opset=21)
    _assert_equal_everywhere(d, {"q": q})


def test_dequantize_int32_bias_and_float16_scale():
    b = np.array([-70000, 0, 5, 123456], np.int32)
    m = node_model("DequantizeLinear", {"b": b}, initializers={"s": np.float32(0.001)}, opset=21)
    _assert_equal_everywhere(m, {"b": b})
    q = np.arange(-128, 128, 17, dtype=np.int8)
    m16 = node_model("DequantizeLinear", {"q": q}, initializers={"s": np.float16(0.1), "z": np.int8(-3)}, opset=21)
    _assert_equal_everywhere(m16, {"q": q})


@pytest.mark.parametrize("case", ["mixed", "positive", "negative", "zeros", "odd_length", "extremes"])
def test_dynamic_quantize_linear(case):
    rng = np.random.default_rng(2)
    x = {"mixed": rng.standard_normal((3, 50)) * 5, "positive": np.abs(rng.standard_normal((4, 17))),
         "negative": -np.abs(rng.standard_normal((33,))), "zeros": np.zeros((2, 8)),
         "odd_length": rng.standard_normal((7, 3, 5)), "extremes": rng.standard_normal((5, 41))}[case].astype(np.float32)
    if case == "extremes":
        # the range in one partial vector of the blocked pass and in the scalar tail
        x.flat[131], x.flat[203] = -9.5, 7.25
    m = node_model("DynamicQuantizeLinear", {"x": x}, outputs=("y", "s", "z"), opset=11)
    # an all-zero x: onnxruntime's scale is 1 (its "max == min ? 1" rule, which we follow),
    # onnx.reference's 1/255; the spec leaves the degenerate range open
    _assert_equal_everywhere(m, {"x": x}, reference=case != "zeros")


@pytest.mark.parametrize("ta,tb,ty", [("u8", "u8", "u8"), ("i8", "i8", "i8"), ("u8", "i8", "u8")])
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 4, 9), (9, 6))])
def test_qlinear_matmul_per_tensor(ta, tb, ty, shapes):
    rng = np.random.default_rng(3)
    ia, ib = np.iinfo(QTYPES[ta]), np.iinfo(QTYPES[tb])
    a = rng.integers(ia.min, ia.max + 1, shapes[0]).astype(QTYPES[ta])
    b = rng.integers(ib.min, ib.max + 1, shapes[1]).astype(QTYPES[tb])
    inits = {"as": np.float32(0.02), "az": np.array(3, QTYPES[ta]), "b": b, "bs": np.float32(0.01),
             "bz": np.array(-2 if tb == "i8" else 9, QTYPES[tb]), "ys": np.float32(0.3),
             "yz": np.array(5, QTYPES[ty])}
    m = node_model("QLinearMatMul", {"a": a}, initializers=inits, opset=21,
                   input_names=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    _assert_equal_everywhere(m, {"a": a}, atol=1)     # onnxruntime's kernel may round a tie the other way


def test_qlinear_matmul_per_column_b():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (4, 6)).astype(np.uint8)
    b = rng.integers(-128, 128, (6, 5)).astype(np.int8)
    inits = {"as": np.float32(0.02), "az": np.uint8(128), "b": b, "bs": np.linspace(0.005, 0.02, 5, dtype=np.float32),
             "bz": np.zeros(5, np.int8), "ys": np.float32(0.5), "yz": np.uint8(100)}
    m = node_model("QLinearMatMul", {"a": a}, initializers=inits, opset=21,
                   input_names=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    _assert_equal_everywhere(m, {"a": a}, atol=1)


def test_quantize_linear_rejects_a_mis_shaped_scale():
    x = np.zeros((2, 3), np.float32)
    m = node_model("QuantizeLinear", {"x": x}, {"axis": 1}, initializers={"s": np.ones(2, np.float32)}, opset=21)
    with pytest.raises(Exception, match=r"x.shape\[1\] = 3"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- the rules' products
def _conv_int_float_graph(x, w, xs, ws, xz, wz, b, **attrs):
    from tensorfuse.ir.builder import Builder
    from tensorfuse.ir.graph import Graph
    g = Graph()
    (xv,) = ir_inputs(g, {"x": x})
    consts = [g.add_const(a, n) if a is not None else None
              for a, n in ((w, "w"), (xs, "xs"), (ws, "ws"), (xz, "xz"), (wz, "wz"), (b, "b"))]
    y = Builder(g).op("ConvIntegerToFloat", xv, *consts, domain="tensorfuse", **attrs)
    g.outputs = [y]
    return g


def _float_conv_of_dequantized(x, w, xs, ws, xz, wz, b, **attrs):
    """onnxruntime's float Conv of the dequantized operands: what the op means."""
    m = w.shape[0]
    xd = (x.astype(np.float32) - np.float32(xz)) * xs
    wd = (w.astype(np.float32) - np.broadcast_to(wz, (m,)).reshape(m, 1, 1, 1)) * \
        np.broadcast_to(ws, (m,)).reshape(m, 1, 1, 1)
    mod = node_model("Conv", {"x": xd}, attrs, initializers={"w": wd.astype(np.float32), "b": b})
    return ort_run(mod, {"x": xd})[0]


@pytest.mark.parametrize("xt", ["u8", "i8"])
@pytest.mark.parametrize("geometry", [dict(pads=[1, 1, 1, 1]), dict(strides=[2, 2]),
                                      dict(group=4, pads=[1, 1, 1, 1]), dict(kernel_1x1=True)])
def test_conv_integer_to_float_matches_the_float_conv_of_dequantized_values(xt, geometry):
    rng = np.random.default_rng(5)
    geometry = dict(geometry)
    k = 1 if geometry.pop("kernel_1x1", False) else 3
    group = geometry.get("group", 1)
    info = np.iinfo(QTYPES[xt])
    x = rng.integers(info.min, info.max + 1, (1, 8, 9, 11)).astype(QTYPES[xt])
    w = rng.integers(-127, 128, (12, 8 // group, k, k)).astype(np.int8)
    xs, xz = np.float32(0.03), np.array(7, QTYPES[xt])
    ws = (rng.random(12) * 0.01 + 0.001).astype(np.float32)
    wz = np.zeros(12, np.int8)
    b = rng.standard_normal(12).astype(np.float32)
    g = _conv_int_float_graph(x, w, xs, ws, xz, wz, b, **geometry)
    got = compile_graph(g).run(x=x)[0]
    exp = _float_conv_of_dequantized(x, w, xs, ws, xz, wz, b, **geometry)
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-4 * np.abs(exp).max())


def test_matmul_integer_to_float_against_onnxruntime_contrib_op():
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, (2, 5, 16)).astype(np.uint8)
    b = rng.integers(-128, 128, (16, 7)).astype(np.int8)
    inits = {"b": b, "as": np.float32(0.04), "bs": (rng.random(7) * 0.02).astype(np.float32),
             "az": np.uint8(131), "bz": np.zeros(7, np.int8), "bias": rng.standard_normal(7).astype(np.float32)}
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz", "bias"], ["y"],
                            domain="com.microsoft")
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, a.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (2, 5, 7))],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    exp = ort_run(m, {"a": a})[0]
    for outs in _run(m, {"a": a}):
        np.testing.assert_allclose(outs[0], exp, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- onnxruntime's contrib ops
def _ms_model(op_type, inputs: dict, inits: dict, names, out_type, out_shape, **attrs):
    node = helper.make_node(op_type, names, ["y"], domain="com.microsoft", **attrs)
    g_in = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    graph = helper.make_graph([node], "t", g_in, [helper.make_tensor_value_info("y", out_type, out_shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _assert_contrib(m, feeds, atol):
    """Compiled (imported as the QDQ decomposition) and the op's own numpy reference (an IR node
    of the contrib op, as ``OpDef.reference`` evaluates it) both match onnxruntime's kernel."""
    from tensorfuse.ir.builder import Builder
    from tensorfuse.ir.graph import Graph
    from tensorfuse.ir.registry import run_reference
    exp = ort_run(m, feeds)[0]
    for outs in _run(m, feeds):
        assert outs[0].dtype == exp.dtype and outs[0].shape == exp.shape
        np.testing.assert_allclose(outs[0].astype(np.float64), exp.astype(np.float64), rtol=0, atol=atol)
    node = m.graph.node[0]
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    g = Graph()
    vals = [g.add_const(feeds[n] if n in feeds else consts[n], n) if n else None for n in node.input]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    y = Builder(g).op(node.op_type, *vals, domain="com.microsoft", **attrs)
    (ref,) = run_reference(y.producer, [v if v is None else v.data for v in vals])
    assert ref.dtype == exp.dtype and ref.shape == exp.shape
    np.testing.assert_allclose(ref.astype(np.float64), exp.astype(np.float64), rtol=0, atol=atol)


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_binary_contrib_ops(op_type, dt):
    rng = np.random.default_rng(7)
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max + 1, (2, 3, 4)).astype(dt)
    b = rng.integers(info.min, info.max + 1, (3, 1)).astype(dt)
    inits = {"as": np.float32(0.05), "az": np.array(3, dt), "b": b, "bs": np.float32(0.04), "bz": np.array(-2 if dt == np.int8 else 7, dt),
             "cs": np.float32(0.08 if op_type == "QLinearAdd" else 0.3), "cz": np.array(10, dt)}
    m = _ms_model(op_type, {"a": a}, inits, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"],
                  helper.np_dtype_to_tensor_dtype(np.dtype(dt)), (2, 3, 4))
    _assert_contrib(m, {"a": a}, atol=1)


@pytest.mark.parametrize("op_type,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
def test_qlinear_unary_contrib_ops(op_type, attrs):
    x = np.arange(0, 256, dtype=np.uint8).reshape(4, 64)
    inits = {"xs": np.float32(0.05), "xz": np.uint8(128), "ys": np.float32(1 / 256 if op_type == "QLinearSigmoid" else 0.04),
             "yz": np.uint8(0 if op_type == "QLinearSigmoid" else 100)}
    m = _ms_model(op_type, {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"], onnx.TensorProto.UINT8, (4, 64), **attrs)
    _assert_contrib(m, {"x": x}, atol=1)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool_contrib_op(channels_last):
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, (1, 5, 6, 3) if channels_last else (1, 3, 5, 6)).astype(np.uint8)
    inits = {"xs": np.float32(0.05), "xz": np.uint8(120), "ys": np.float32(0.02), "yz": np.uint8(128)}
    shape = (1, 1, 1, 3) if channels_last else (1, 3, 1, 1)
    m = _ms_model("QLinearGlobalAveragePool", {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"], onnx.TensorProto.UINT8,
                  shape, channels_last=channels_last)
    _assert_contrib(m, {"x": x}, atol=1)


def test_qlinear_concat_contrib_op():
    rng = np.random.default_rng(9)
    a = rng.integers(0, 256, (1, 2, 3)).astype(np.uint8)
    b = rng.integers(0, 256, (1, 4, 3)).astype(np.uint8)
    inits = {"ys": np.float32(0.1), "yz": np.uint8(128), "as": np.float32(0.05), "az": np.uint8(100),
             "bs": np.float32(0.2), "bz": np.uint8(130)}
    m = _ms_model("QLinearConcat", {"a": a, "b": b}, inits, ["ys", "yz", "a", "as", "az", "b", "bs", "bz"],
                  onnx.TensorProto.UINT8, (1, 6, 3), axis=1)
    _assert_contrib(m, {"a": a, "b": b}, atol=1)


@pytest.mark.parametrize("quantized_output", [True, False])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_qgemm_contrib_op(quantized_output, trans_b):
    rng = np.random.default_rng(10)
    a = rng.integers(0, 256, (5, 16)).astype(np.uint8)
    b = rng.integers(-127, 128, (8, 16) if trans_b else (16, 8)).astype(np.int8)
    inits = {"as": np.float32(0.03), "az": np.uint8(128), "b": b, "bs": np.float32(0.01), "bz": np.int8(0),
             "c": rng.integers(-1000, 1000, 8).astype(np.int32)}
    names = ["a", "as", "az", "b", "bs", "bz", "c"]
    if quantized_output:
        inits.update(ys=np.float32(0.2), yz=np.uint8(128))
        names += ["ys", "yz"]
    m = _ms_model("QGemm", {"a": a}, inits, names, onnx.TensorProto.UINT8 if quantized_output else onnx.TensorProto.FLOAT,
                  (5, 8), transB=trans_b, alpha=1.0)
    _assert_contrib(m, {"a": a}, atol=1 if quantized_output else 1e-4)


def test_dynamic_quantize_matmul_contrib_op():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((3, 7, 16)).astype(np.float32)
    inits = {"b": rng.integers(-127, 128, (16, 8)).astype(np.int8), "bs": (rng.random(8) * 0.01).astype(np.float32),
             "bz": np.zeros(8, np.int8), "bias": rng.standard_normal(8).astype(np.float32)}
    m = _ms_model("DynamicQuantizeMatMul", {"a": a}, inits, ["a", "b", "bs", "bz", "bias"], onnx.TensorProto.FLOAT,
                  (3, 7, 8))
    _assert_contrib(m, {"a": a}, atol=1e-4)
