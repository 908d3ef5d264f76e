"""Quantization rules (compiler/rules/quantize.py): each fires on the QDQ form onnxruntime's
quantizer writes, refuses where it must (explain's reason), and keeps the outputs within one
quantization step of onnxruntime's unfused QDQ semantics (ORT_DISABLE_ALL)."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tensorfuse
from tensorfuse.ir.types import DType
from tensorfuse.compiler.pattern import Any, Optional, P
from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import ort_run, rand

CITF = "tensorfuse::ConvIntegerToFloat"
MITF = "com.microsoft::MatMulIntegerToFloat"
Y_SCALE = np.float32(0.05)


def _qdq(src, dst, scale, zp, nodes, axis=None):
    """Q then DQ of ``src`` into ``dst`` (the activations' quantization)."""
    kw = {} if axis is None else {"axis": axis}
    nodes += [helper.make_node("QuantizeLinear", [src, scale, zp], [dst + "_q"], **kw),
              helper.make_node("DequantizeLinear", [dst + "_q", scale, zp], [dst], **kw)]


def _conv_qdq_model(xt=np.uint8, act="Relu", weight_axis=0, per_channel=True, bn=False, runtime_weights=False,
                    x_axis=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 7, 7)).astype(np.float32)
    w = rng.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8)
    ws = (rng.random(6 if per_channel else 1) * 0.01 + 0.002).astype(np.float32)
    if not per_channel:
        ws = ws.reshape(())
    zt = np.uint8 if xt == np.uint8 else np.int8
    inits = {"xs": np.float32(0.02) if x_axis is None else np.full(4, 0.02, np.float32),
             "xz": np.array(128 if xt == np.uint8 else 0, zt) if x_axis is None else np.full(4, 128 if xt == np.uint8 else 0, zt),
             "ws": ws, "wz": np.zeros(ws.shape, np.int8),
             "bq": rng.integers(-500, 500, 6).astype(np.int32), "bs": (0.02 * ws).astype(np.float32),
             "bz": np.zeros(ws.shape, np.int32),
             "ys": Y_SCALE, "yz": np.array(0 if act == "Relu" and xt == np.uint8 else 10, zt)}
    feeds = {"x": x}
    if runtime_weights:
        feeds["w"] = w
    else:
        inits["w"] = w
    nodes = []
    _qdq("x", "xd", "xs", "xz", nodes, axis=x_axis)
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=weight_axis),
              helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], axis=0),
              helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1])]
    src = "c"
    if bn:
        inits.update(g=rng.random(6).astype(np.float32) + 0.5, be=rng.standard_normal(6).astype(np.float32),
                     mu=rng.standard_normal(6).astype(np.float32) * 0.1, var=rng.random(6).astype(np.float32) + 0.5)
        nodes.append(helper.make_node("BatchNormalization", [src, "g", "be", "mu", "var"], ["cbn"]))
        src = "cbn"
    if act:
        nodes.append(helper.make_node(act, [src], ["a"]))
        src = "a"
    _qdq(src, "y", "ys", "yz", nodes)
    return graph_model(nodes, feeds, ["y"], inits, opset=21), feeds


def _assert_within_one_step(model, feeds, scale=Y_SCALE, opt_levels=(2,)):
    exp = ort_run(model, feeds)
    for lvl in opt_levels:
        got = tensorfuse.compile(model, opt_level=lvl).run(**feeds)
        for g, e in zip(got, exp):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=0, atol=float(scale) * 1.001)
            # and it is not a constant: most elements agree exactly
            assert np.mean(g == e) > 0.95 and np.std(e) > 0


# ----------------------------------------------------------------------------- QuantizeConv
@pytest.mark.parametrize("xt", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("act", ["Relu", None])
def test_quantize_conv_fires_and_keeps_the_numbers(xt, per_channel, act):
    m, feeds = _conv_qdq_model(xt, act, per_channel=per_channel)
    g = optimized(m)
    assert count(g, CITF) == 1 and count(g, "Conv") == 0, g.op_histogram()
    assert count(g, "DequantizeLinear") == 1          # the output's; those of x, W and b went into the conv
    _assert_within_one_step(m, feeds, opt_levels=(0, 2))


def test_quantize_conv_epilogue_stores_the_quantized_output_in_one_kernel():
    m, feeds = _conv_qdq_model(np.uint8, "Relu")
    g = optimized(m, grouping=True)
    anchored = [n for n in g.nodes if n.op == "FusedFunction" and n.attr("anchor")]
    assert len(anchored) == 1
    body_ops = [n.op for n in anchored[0].attrs["body"].nodes]
    # (the Relu before a u8 Q with zero point 0 is dropped: DropActivationBeforeSaturatingQuantize)
    assert body_ops[0] == "ConvIntegerToFloat" and "QuantizeLinear" in body_ops and "Relu" not in body_ops
    m2, _ = _conv_qdq_model(np.int8, "Relu")           # zero point 10: the Relu stays, in the epilogue
    g2 = optimized(m2, grouping=True)
    (anchored,) = [n for n in g2.nodes if n.op == "FusedFunction" and n.attr("anchor")]
    body_ops = [n.op for n in anchored.attrs["body"].nodes]
    assert body_ops[0] == "ConvIntegerToFloat" and "QuantizeLinear" in body_ops and "Relu" in body_ops


def test_quantize_conv_folds_batchnorm_into_scale_and_bias():
    m, feeds = _conv_qdq_model(np.uint8, "Relu", bn=True)
    g = optimized(m)
    assert count(g, CITF) == 1 and count(g, "BatchNormalization") == 0, g.op_histogram()
    _assert_within_one_step(m, feeds)


def _q_scales(g, src=None) -> list[float]:
    """The scales of the QuantizeLinear nodes of ``g`` (that read ``src``, a Value, if given)."""
    return [float(n.inputs[1].data.reshape(-1)[0]) for n in g.nodes
            if n.op == "QuantizeLinear" and (src is None or n.inputs[0] is src)]


@pytest.mark.parametrize("kind", ["conv", "conv_bn", "matmul", "gemm"])
def test_quantize_scale_folds_into_the_integer_product(kind):
    """Q(ConvIntegerToFloat / MatMulIntegerToFloat) takes 1 / the Q's scale into the product's
    scale and bias (one multiply per output, as MLAS requantizes, instead of a division): the
    output Q's scale becomes 1, the result stays within one step of the unfused semantics."""
    if kind.startswith("conv"):
        m, feeds = _conv_qdq_model(np.uint8, "Relu", bn=kind == "conv_bn")
        rule, op = "FoldQuantizeScaleIntoConvIntegerToFloat", CITF
    else:
        m, feeds = _matmul_qdq_model("Gemm" if kind == "gemm" else "MatMul", 1 if kind == "gemm" else 0)
        rule, op = "FoldQuantizeScaleIntoMatMulIntegerToFloat", MITF
    g = optimized(m)
    (prod,) = [n for n in g.nodes if n.qualified_op == op]
    assert _q_scales(g, prod.outputs[0]) == [1.0], _q_scales(g)
    g0 = optimized(m, disabled_rules=[rule])
    (prod0,) = [n for n in g0.nodes if n.qualified_op == op]
    assert _q_scales(g0, prod0.outputs[0]) == [float(Y_SCALE)]
    np.testing.assert_allclose(prod.inputs[3].data, prod0.inputs[3].data / Y_SCALE, rtol=1e-6)
    if prod0.input(6) is not None:
        np.testing.assert_allclose(prod.inputs[6].data, prod0.inputs[6].data / Y_SCALE, rtol=1e-6, atol=1e-6)
    _assert_within_one_step(m, feeds)


def _residual_qdq_model(float_residual=False):
    """y = Q(Conv(DQ(x), DQ(W), b) + DQ(Q(r))) -> DQ: a quantized residual block's add (with
    ``float_residual`` the add reads r itself, a float tensor)."""
    m, feeds = _conv_qdq_model(np.uint8, None)
    g = m.graph
    (q,) = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == "c"]
    nodes = []
    if float_residual:
        src = "r"
    else:
        _qdq("r", "rd", "rs", "rz", nodes)
        src = "rd"
    nodes.append(helper.make_node("Add", ["c", src], ["s"]))
    q.input[0] = "s"
    at = list(g.node).index(q)
    for k, n in enumerate(nodes):
        g.node.insert(at + k, n)
    g.initializer.extend([numpy_helper.from_array(np.float32(0.03), "rs"), numpy_helper.from_array(np.uint8(120), "rz")])
    r = np.random.default_rng(5).standard_normal((1, 6, 7, 7)).astype(np.float32)
    g.input.append(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, r.shape))
    feeds["r"] = r
    return m, feeds


def test_quantize_scale_folds_into_a_residual_add():
    """Q(Add(integer conv, DQ(r)), s) ==> Q(Mul(Add(..), 1/s), 1): the residual's requantization
    multiplies; within one step. A float operand (not quantized) leaves the Q as it is."""
    m, feeds = _residual_qdq_model()
    g = optimized(m)
    (mul,) = [n for n in g.nodes if n.op == "Mul"]
    assert mul.inputs[0].producer.op == "Add"
    np.testing.assert_allclose(mul.inputs[1].data, 1 / Y_SCALE, rtol=1e-7)
    assert _q_scales(g, mul.outputs[0]) == [1.0]
    _assert_within_one_step(m, feeds)
    m2, feeds2 = _residual_qdq_model(float_residual=True)
    g2 = optimized(m2)
    assert not [n for n in g2.nodes if n.op == "Mul"] and float(Y_SCALE) in _q_scales(g2)
    assert "is not a DequantizeLinear or an integer product" in why_not(m2, "FoldQuantizeScaleIntoAdd")
    _assert_within_one_step(m2, feeds2)


def _requant_model(s1=0.03, s2=0.05, dq_axis=None, x_dtype=np.uint8, concat=False):
    """u8 x -> DQ(s1, 120) -> Q(s2, 7) -> DQ: a requantization; with ``concat`` two inputs of
    different scales (0.04 and s1) concatenated and quantized at s2 (squeezenet's fire modules)."""
    rng = np.random.default_rng(3)
    shape = (1, 4, 5, 6)
    info = np.iinfo(x_dtype)
    feeds = {"x": rng.integers(info.min, info.max + 1, shape).astype(x_dtype)}
    s1v = np.float32(s1) if dq_axis is None else np.linspace(s1, 2 * s1, 4).astype(np.float32)
    zt = np.int32 if x_dtype == np.int32 else x_dtype
    inits = {"s1": s1v, "z1": np.full(np.shape(s1v), 120 if x_dtype != np.int8 else -5, zt),
             "s2": np.float32(s2), "z2": np.uint8(7), "s0": np.float32(0.04), "z0": np.full((), 3, x_dtype)}
    kw = {} if dq_axis is None else {"axis": dq_axis}
    nodes = [helper.make_node("DequantizeLinear", ["x", "s1", "z1"], ["xd"], **kw)]
    src = "xd"
    if concat:
        feeds["x0"] = rng.integers(info.min, info.max + 1, shape).astype(x_dtype)
        nodes += [helper.make_node("DequantizeLinear", ["x0", "s0", "z0"], ["x0d"]),
                  helper.make_node("Concat", ["x0d", "xd"], ["cat"], axis=1)]
        src = "cat"
    nodes += [helper.make_node("QuantizeLinear", [src, "s2", "z2"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "s2", "z2"], ["y"])]
    return graph_model(nodes, feeds, ["y"], inits, opset=21), feeds


@pytest.mark.parametrize("concat", [False, True])
def test_requantization_multiplies_by_one_scale(concat):
    """Q(DQ(x, s1, z1), s2, z2) ==> Q(DQ(x, s1 / s2, z1), 1, z2): one multiply per element,
    within one step of onnxruntime's unfused semantics; also for a Concat's inputs of another
    scale (ConcatOnInt8 first moves the Q onto each input)."""
    m, feeds = _requant_model(concat=concat)
    g = optimized(m)
    scales = sorted(float(n.inputs[0].producer.inputs[1].data) for n in g.nodes if n.op == "QuantizeLinear"
                    and n.inputs[0].producer is not None and n.inputs[0].producer.op == "DequantizeLinear")
    want = sorted([0.03 / 0.05] + ([0.04 / 0.05] if concat else []))
    np.testing.assert_allclose(scales, want, rtol=1e-7)
    assert 0.05 not in _q_scales(g) and _q_scales(g)
    g0 = optimized(m, disabled_rules=["FoldRequantizeScale"])
    assert float(Y_SCALE) in _q_scales(g0)
    _assert_within_one_step(m, feeds, opt_levels=(0, 2))


@pytest.mark.parametrize("case,reason", [
    (dict(dq_axis=1), "the scale is not one positive finite f32"),
    (dict(s2=1.0), "the scale is already 1"),
    (dict(x_dtype=np.int32), "not 8 bits to f32"),
])
def test_requantization_not_folded(case, reason):
    """A per-channel DQ scale, a Q whose scale is already 1, a DQ of int32: the pair stays."""
    m, feeds = _requant_model(**case)
    g = optimized(m)
    assert any(n.op == "QuantizeLinear" and n.inputs[0].producer is not None
               and n.inputs[0].producer.op == "DequantizeLinear"
               and float(n.inputs[1].data) == float(np.float32(case.get("s2", 0.05)))
               for n in g.nodes), [(n.op, [i.name for i in n.inputs if i]) for n in g.nodes]
    assert reason in why_not(m, "FoldRequantizeScale")
    if case.get("x_dtype") != np.int32:
        _assert_within_one_step(m, feeds, scale=case.get("s2", Y_SCALE))


def test_quantize_scale_not_folded_through_an_activation():
    """An activation the Q does not absorb (Relu before an i8 Q with zero point 10) stays
    between the product and the Q: the scale stays with the Q."""
    m, feeds = _conv_qdq_model(np.int8, "Relu")
    g = optimized(m)
    (relu,) = [n for n in g.nodes if n.op == "Relu"]
    assert _q_scales(g, relu.outputs[0]) == [float(Y_SCALE)]
    _assert_within_one_step(m, feeds)


def test_quantize_conv_not_fired_for_weights_quantized_along_the_input_channels():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 7, 7)).astype(np.float32)
    inits = {"xs": np.float32(0.02), "xz": np.uint8(128), "w": rng.integers(-127, 128, (6, 4, 3, 3)).astype(np.int8),
             "ws": np.full(4, 0.01, np.float32), "wz": np.zeros(4, np.int8)}
    nodes = []
    _qdq("x", "xd", "xs", "xz", nodes)
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
              helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1])]
    m = graph_model(nodes, {"x": x}, ["y"], inits, opset=21)
    assert count(optimized(m), CITF) == 0
    assert "weights quantized along axis 1, the product's output channels are axis 0" in why_not(m, "QuantizeConv")
    exp = ort_run(m, {"x": x})[0]
    got = tensorfuse.compile(m).run(x=x)[0]
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)


def test_quantize_conv_not_fired_for_per_channel_activations():
    m, feeds = _conv_qdq_model(np.uint8, "Relu", x_axis=1)
    assert count(optimized(m), CITF) == 0
    assert "not per tensor" in why_not(m, "QuantizeConv")
    _assert_within_one_step(m, feeds)


def test_quantize_conv_not_fired_for_runtime_weights():
    m, feeds = _conv_qdq_model(np.uint8, "Relu", runtime_weights=True)
    assert count(optimized(m), CITF) == 0
    assert "expected a constant" in why_not(m, "QuantizeConv")
    _assert_within_one_step(m, feeds)


# ----------------------------------------------------------------------------- MatMul / Gemm
def _matmul_qdq_model(kind="MatMul", trans_b=0, alpha=1.0, beta=1.0, per_column=True):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 5, 16) if kind == "MatMul" else (5, 16)).astype(np.float32)
    bshape = (8, 16) if trans_b else (16, 8)
    n_axis = 0 if trans_b else 1
    inits = {"as": np.float32(0.03), "az": np.uint8(120), "b": rng.integers(-127, 128, bshape).astype(np.int8),
             "bs": (rng.random(8) * 0.01 + 0.001).astype(np.float32) if per_column else np.float32(0.005),
             "ys": Y_SCALE, "yz": np.uint8(128)}
    nodes = []
    _qdq("a", "ad", "as", "az", nodes)
    nodes.append(helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], axis=n_axis))
    if kind == "MatMul":
        nodes.append(helper.make_node("MatMul", ["ad", "bd"], ["p"]))
    else:
        inits["c"] = rng.standard_normal(8).astype(np.float32)
        nodes.append(helper.make_node("Gemm", ["ad", "bd", "c"], ["p"], transB=trans_b, alpha=alpha, beta=beta))
    _qdq("p", "y", "ys", "yz", nodes)
    return graph_model(nodes, {"a": a}, ["y"], inits, opset=21), {"a": a}


@pytest.mark.parametrize("per_column", [True, False])
def test_quantize_matmul_fires_and_keeps_the_numbers(per_column):
    m, feeds = _matmul_qdq_model(per_column=per_column)
    g = optimized(m)
    assert count(g, MITF) == 1 and count(g, "MatMul") == 0, g.op_histogram()
    _assert_within_one_step(m, feeds, opt_levels=(0, 2))


@pytest.mark.parametrize("trans_b,alpha,beta", [(0, 1.0, 1.0), (1, 1.0, 1.0), (1, 0.5, 2.0)])
def test_quantize_gemm_fires_and_keeps_the_numbers(trans_b, alpha, beta):
    m, feeds = _matmul_qdq_model("Gemm", trans_b, alpha, beta)
    g = optimized(m)
    assert count(g, MITF) == 1 and count(g, "Gemm") == 0, g.op_histogram()
    _assert_within_one_step(m, feeds)


def test_quantize_gemm_not_fired_with_trans_a():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 5)).astype(np.float32)
    inits = {"as": np.float32(0.03), "az": np.uint8(120), "b": rng.integers(-127, 128, (16, 8)).astype(np.int8),
             "bs": np.float32(0.004)}
    nodes = []
    _qdq("a", "ad", "as", "az", nodes)
    nodes += [helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"]),
              helper.make_node("Gemm", ["ad", "bd"], ["y"], transA=1)]
    m = graph_model(nodes, {"a": a}, ["y"], inits, opset=21)
    assert count(optimized(m), MITF) == 0
    assert "transA=1" in why_not(m, "QuantizeGemm")
    np.testing.assert_allclose(tensorfuse.compile(m).run(a=a)[0], ort_run(m, {"a": a})[0], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- activation x activation
def _attention_qdq_model(at=np.uint8, bt=np.uint8, b_axis=None, a_shape=(2, 3, 5, 16), b_shape=(2, 3, 16, 8)):
    """Q/DQ(a) x Q/DQ(b) -> MatMul -> Q/DQ, both operands graph inputs (attention's Q K^T)."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    zb = (np.uint8(131) if bt == np.uint8 else np.int8(-4))
    inits = {"as": np.float32(0.03), "az": np.array(120 if at == np.uint8 else 3, at),
             "bs": np.float32(0.025) if b_axis is None else np.full(b_shape[b_axis], 0.025, np.float32),
             "bz": np.array(zb, bt) if b_axis is None else np.full(b_shape[b_axis], zb, bt),
             "ys": Y_SCALE, "yz": np.uint8(128)}
    nodes = []
    _qdq("a", "ad", "as", "az", nodes)
    _qdq("b", "bd", "bs", "bz", nodes, axis=b_axis)
    nodes.append(helper.make_node("MatMul", ["ad", "bd"], ["p"]))
    _qdq("p", "y", "ys", "yz", nodes)
    feeds = {"a": a, "b": b}
    return graph_model(nodes, feeds, ["y"], inits, opset=21), feeds


@pytest.mark.parametrize("at,bt", [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8), (np.int8, np.uint8)])
def test_quantize_matmul_activations_fires_and_keeps_the_numbers(at, bt):
    m, feeds = _attention_qdq_model(at, bt)
    g = optimized(m)
    assert count(g, MITF) == 1 and count(g, "MatMul") == 0, g.op_histogram()
    _assert_within_one_step(m, feeds, opt_levels=(0, 2))


@pytest.mark.parametrize("a_shape,b_shape", [((5, 16), (16, 8)), ((4, 37, 19), (4, 19, 45))])
def test_quantize_matmul_activations_other_ranks(a_shape, b_shape):
    m, feeds = _attention_qdq_model(a_shape=a_shape, b_shape=b_shape)
    assert count(optimized(m), MITF) == 1
    _assert_within_one_step(m, feeds)


def test_quantize_matmul_activations_not_fired_for_a_per_axis_b():
    m, feeds = _attention_qdq_model(b_axis=3)
    assert count(optimized(m), MITF) == 0
    assert "not per tensor" in why_not(m, "QuantizeMatMulActivations")
    _assert_within_one_step(m, feeds)


def test_quantize_matmul_activations_leaves_constant_b_to_quantize_matmul():
    m, feeds = _matmul_qdq_model(per_column=False)
    assert "B is a constant" in why_not(m, "QuantizeMatMulActivations")
    assert count(optimized(m), MITF) == 1


# ----------------------------------------------------------------------------- dynamic quantization
def _dynamic_model(scale_shape=()):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    inits = {"w": rng.integers(-127, 128, (16, 8)).astype(np.int8), "wz": np.int8(0),
             "ws": np.full(scale_shape, 0.004, np.float32), "bias": rng.standard_normal(8).astype(np.float32)}
    return graph_model(_dynamic_chain("MatMulInteger"), {"x": x}, ["y"], inits, opset=21), {"x": x}


def _dynamic_chain(product: str, **attrs) -> list:
    """quantize_dynamic's nodes: DynamicQuantizeLinear(x) -> ``product``(xq, w, xz, wz) -> Cast
    -> Mul(xs * ws) -> Add(bias) -> y."""
    return [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
            helper.make_node("Mul", ["xs", "ws"], ["s"]),
            helper.make_node(product, ["xq", "w", "xz", "wz"], ["acc"], **attrs),
            helper.make_node("Cast", ["acc"], ["accf"], to=1),
            helper.make_node("Mul", ["accf", "s"], ["p"]),
            helper.make_node("Add", ["p", "bias"], ["y"])]


def test_dynamic_matmul_to_float_fires_and_is_exact():
    m, feeds = _dynamic_model()
    g = optimized(m)
    assert count(g, MITF) == 1 and count(g, "MatMulInteger") == 0 and count(g, "Cast") == 0, g.op_histogram()
    exp = ort_run(m, feeds)[0]
    for lvl in (0, 2):
        np.testing.assert_allclose(tensorfuse.compile(m, opt_level=lvl).run(**feeds)[0], exp, rtol=1e-6, atol=1e-6)


def test_dynamic_matmul_to_float_not_fired_for_a_per_column_scale():
    m, feeds = _dynamic_model(scale_shape=(8,))
    assert count(optimized(m), MITF) == 0
    assert "not one f32" in why_not(m, "DynamicMatMulToFloat")
    np.testing.assert_allclose(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-6, atol=1e-6)


def test_dynamic_matmul_bias_joins_the_integer_product():
    m, feeds = _dynamic_model()
    g = optimized(m)
    (n,) = [n for n in g.nodes if n.qualified_op == MITF]
    assert len(n.inputs) == 7 and n.inputs[6] is not None and count(g, "Add") == 0, g.op_histogram()


def test_fold_bias_into_matmul_integer_not_fired_for_a_bias_across_rows():
    m, feeds = _dynamic_model()
    # a [3, 1] addend varies along the rows, not the columns: it is no bias of the product
    rng = np.random.default_rng(5)
    m.graph.initializer.remove([t for t in m.graph.initializer if t.name == "bias"][0])
    m.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((3, 1)).astype(np.float32), "bias"))
    assert count(optimized(m), "Add") == 1
    assert "not an f32 constant per channel" in why_not(m, "FoldBiasIntoMatMulIntegerToFloat")
    np.testing.assert_allclose(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-6, atol=1e-6)


def _dynamic_gelu_model():
    """:func:`_dynamic_model` with a Reshape to [1, 3, 8] and a Gelu after the product."""
    m, feeds = _dynamic_model()
    m.graph.node.append(helper.make_node("Reshape", ["y", "shape"], ["r"]))
    m.graph.node.append(helper.make_node("Gelu", ["r"], ["z"]))
    m.graph.initializer.append(numpy_helper.from_array(np.array([1, 3, 8], np.int64), "shape"))
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 3, 8]))
    return m, feeds


def test_gelu_after_the_reshaped_integer_product_joins_its_epilogue():
    # quantize_dynamic's MatMuls run on 2-D reshapes of the tokens: Reshape -> Gelu after the
    # product; ActivationBeforeReshape moves the Gelu onto the product, whose kernel takes it
    m, feeds = _dynamic_gelu_model()
    g = optimized(m)
    (gelu,) = [n for n in g.nodes if n.op == "Gelu"]
    assert gelu.inputs[0].producer.qualified_op == MITF, g.op_histogram()
    mod = tensorfuse.compile(m)
    # DynamicQuantizeLinear, the scales' product, the integer product with its epilogue
    assert len(mod.kernels) == 3 and mod.kernels[-1].schedule == "llvm.matmul_int8", [k.name for k in mod.kernels]
    exp = ort_run(m, feeds)[0]
    for lvl in (0, 2):
        np.testing.assert_allclose(tensorfuse.compile(m, opt_level=lvl).run(**feeds)[0], exp, rtol=1e-5, atol=1e-6)


def test_gelu_stays_after_a_reshape_read_elsewhere():
    m, feeds = _dynamic_gelu_model()
    m.graph.output.append(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [1, 3, 8]))
    g = optimized(m)
    (gelu,) = [n for n in g.nodes if n.op == "Gelu"]
    assert gelu.inputs[0].producer.op == "Reshape"
    assert "is a graph output, so it must stay" in why_not(m, "ActivationBeforeReshape")
    exp = ort_run(m, feeds)
    for got, e in zip(tensorfuse.compile(m).run(**feeds), exp):
        np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-6)


def _dynamic_conv_model(scale_shape=(), kernel=(3, 3), strides=(1, 1), image=(4, 9, 11), m_out=5, bias_shape=None):
    """quantize_dynamic's Conv chain: DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul -> Add."""
    rng = np.random.default_rng(6)
    c = image[0]
    x = rng.standard_normal((1, *image)).astype(np.float32)
    inits = {"w": rng.integers(-127, 128, (m_out, c, *kernel)).astype(np.int8), "wz": np.int8(0),
             "ws": np.full(scale_shape, 0.004, np.float32),
             "bias": rng.standard_normal(bias_shape or (1, m_out, 1, 1)).astype(np.float32)}
    nodes = _dynamic_chain("ConvInteger", kernel_shape=list(kernel), strides=list(strides))
    return graph_model(nodes, {"x": x}, ["y"], inits, opset=21), {"x": x}


def test_dynamic_conv_to_float_fires_takes_the_bias_and_is_exact():
    m, feeds = _dynamic_conv_model()
    g = optimized(m)
    (n,) = [n for n in g.nodes if n.qualified_op == "tensorfuse::ConvIntegerToFloat"]
    assert n.inputs[6] is not None and count(g, "ConvInteger") == 0 and count(g, "Add") == 0, g.op_histogram()
    exp = ort_run(m, feeds)[0]
    for lvl in (0, 2):
        np.testing.assert_allclose(tensorfuse.compile(m, opt_level=lvl).run(**feeds)[0], exp, rtol=1e-5, atol=1e-5)


def test_dynamic_conv_to_float_not_fired_for_a_per_channel_scale():
    m, feeds = _dynamic_conv_model(scale_shape=(5, 1, 1))
    assert count(optimized(m), "tensorfuse::ConvIntegerToFloat") == 0
    assert "not one f32" in why_not(m, "DynamicConvToFloat")
    np.testing.assert_allclose(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-5, atol=1e-5)


def test_fold_bias_into_conv_integer_not_fired_for_a_bias_along_the_width():
    m, feeds = _dynamic_conv_model(bias_shape=(1, 1, 1, 9))
    assert count(optimized(m), "Add") == 1
    assert "not an f32 constant per channel" in why_not(m, "FoldBiasIntoConvIntegerToFloat")
    np.testing.assert_allclose(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("image", [(3, 48, 32), (3, 50, 37)])
def test_quantized_patch_conv_becomes_an_integer_matmul(image):
    # a 16x16 patch embedding (ViT's, smaller), the second image not a multiple of the patch
    m, feeds = _dynamic_conv_model(kernel=(16, 16), strides=(16, 16), image=image, m_out=24)
    g = optimized(m)
    assert count(g, MITF) == 1 and count(g, "tensorfuse::ConvIntegerToFloat") == 0, g.op_histogram()
    exp = ort_run(m, feeds)[0]
    for lvl in (0, 2):
        np.testing.assert_allclose(tensorfuse.compile(m, opt_level=lvl).run(**feeds)[0], exp, rtol=1e-5, atol=1e-5)


def test_quantized_patch_conv_not_fired_for_overlapping_patches():
    m, feeds = _dynamic_conv_model(kernel=(16, 16), strides=(8, 8), image=(3, 48, 32), m_out=24)
    assert count(optimized(m), MITF) == 0
    assert "differ from the kernel" in why_not(m, "QuantizedConvPatchifyToMatMul")
    np.testing.assert_allclose(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- explain's triage
def test_explain_lists_integer_kernels_and_every_qdq_left_with_its_reason():
    """A QDQ conv whose output feeds a float Softmax (no integer kernel) and a per-axis
    quantized activation blocking a second conv: the report names each."""
    from tensorfuse.compiler.explain import explain_report
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    inits = {"xs": np.float32(0.02), "xz": np.uint8(128), "w": rng.integers(-127, 128, (4, 4, 1, 1)).astype(np.int8),
             "ws": np.float32(0.01), "ys": np.full(4, 0.05, np.float32), "yz": np.full(4, 128, np.uint8)}
    nodes = []
    _qdq("x", "xd", "xs", "xz", nodes)
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
              helper.make_node("Conv", ["xd", "wd"], ["c1"], name="conv_int")]
    _qdq("c1", "c1d", "ys", "yz", nodes, axis=1)                       # per-axis: blocks the next conv
    nodes += [helper.make_node("Conv", ["c1d", "wd"], ["c2"], name="conv_float"),
              helper.make_node("Softmax", ["c2"], ["y"], axis=1, name="soft")]
    m = graph_model(nodes, {"x": x}, ["y"], inits, opset=21)
    rep = explain_report(m)
    q = rep.quant
    assert [g.node for g in q.groups] == ["conv_int"] and q.groups[0].op == CITF
    text = str(rep)
    assert "quantization: 1 integer kernel" in text
    dq_left = {e.node: e for e in q.left if e.op == "DequantizeLinear"}
    (per_axis,) = [e for e in dq_left.values() if any("conv_float" in r for r in e.reasons)]
    assert any("blocks QuantizeConv at Conv 'conv_float'" in r and "not per tensor" in r for r in per_axis.reasons)
    # the result stays right: within one step of the per-axis quantization (scale 0.05) before the Softmax
    exp = ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(tensorfuse.compile(m).run(x=x)[0], exp, rtol=1e-4, atol=1e-4)


def test_explain_has_no_quantization_section_for_a_float_model():
    from tensorfuse.compiler.explain import explain_report
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(2, 3)}, ["y"])
    rep = explain_report(m)
    assert rep.quant is None and "quantization:" not in str(rep)


# ----------------------------------------------------------------------------- DQ -> data movement -> Q
def _movement_model(op, out_scale=Y_SCALE, **attrs):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((1, 3, 6, 6)) * 2).astype(np.float32)
    inits = {"s": Y_SCALE, "z": np.uint8(100), "s2": np.float32(out_scale), "shape": np.array([1, 3, 36], np.int64)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])]
    ins = ["d", "shape"] if op == "Reshape" else ["d"]
    nodes += [helper.make_node(op, ins, ["m"], **attrs),
              helper.make_node("QuantizeLinear", ["m", "s2", "z"], ["mq"]),
              helper.make_node("DequantizeLinear", ["mq", "s2", "z"], ["y"])]
    return graph_model(nodes, {"x": x}, ["y"], inits, opset=21), {"x": x}


@pytest.mark.parametrize("op,attrs", [("Reshape", {}), ("Transpose", {"perm": [0, 2, 3, 1]}),
                                      ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]})])
def test_drop_qdq_around_data_movement_fires_and_is_exact(op, attrs):
    m, feeds = _movement_model(op, **attrs)
    g = optimized(m)
    mover = [n for n in g.nodes if n.op == op]
    assert len(mover) == 1 and mover[0].inputs[0].dtype == DType.u8, g.op_histogram()
    exp = ort_run(m, feeds)[0]
    np.testing.assert_array_equal(tensorfuse.compile(m).run(**feeds)[0], exp)


def test_drop_qdq_not_fired_when_the_scales_differ():
    m, feeds = _movement_model("Transpose", out_scale=0.07, perm=[0, 2, 3, 1])
    g = optimized(m)
    assert [n for n in g.nodes if n.op == "Transpose"][0].inputs[0].dtype.is_float
    assert "scale / zero point differ" in why_not(m, "DropQDQAroundDataMovement")
    _assert_within_one_step(m, feeds, scale=0.07)



# ----------------------------------------------------------------------------- verify's quantization contract
def test_verify_passes_a_qdq_model_within_one_step_and_reports_the_contract():
    from tensorfuse.compiler.verify import quantization_steps, verify
    m, feeds = _conv_qdq_model(np.uint8, "Relu")
    steps = quantization_steps(m)
    assert steps["y"] == pytest.approx(float(Y_SCALE)) and steps["y_q"] == 1.0 and steps["xd"] == pytest.approx(0.02)
    res = verify(m, inputs=feeds)
    assert res.ok, str(res)
    assert "one quantization step" in str(res)


def test_verify_still_fails_a_wrong_integer_kernel():
    """A rule that drops the conv's bias is caught: beyond one step and beyond the relative L2 limit."""
    from tensorfuse.compiler.rewrite import Rule
    from tensorfuse.compiler.verify import verify

    class _DropBias(Rule):
        """ConvIntegerToFloat with a bias ==> without it (wrong on purpose)."""
        rule_set = "fold"
        pattern = P.__getattr__(CITF)(Any("x"), Any("w"), Any("xs"), Any("ws"), Optional(Any()).named("xz"),
                                      Optional(Any()).named("wz"), Any("b")).named("c")

        def rewrite(self, m, build):
            return build.op("ConvIntegerToFloat", m.x, m.w, m.xs, m.ws, m.xz, m.wz, domain="tensorfuse",
                            **m.c.attrs)

    m, feeds = _conv_qdq_model(np.uint8, None)
    res = verify(m, inputs=feeds, rules=[_DropBias])
    assert not res.ok and res.rule_counts["_DropBias"] == 1


def test_per_layer_quantization_error_against_the_float_model():
    from tensorfuse.compiler.quant_error import quant_error_report
    qm, feeds = _conv_qdq_model(np.uint8, "Relu", per_channel=True)
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    w = inits["w"].astype(np.float32) * inits["ws"].reshape(-1, 1, 1, 1)
    b = inits["bq"].astype(np.float32) * inits["bs"]
    fm = graph_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", ["c"], ["a"]), helper.make_node("Identity", ["a"], ["y"])],
                     feeds, ["y"], {"w": w, "b": b}, opset=21)
    rep = quant_error_report(qm, fm, feeds)
    (layer,) = rep.layers
    assert layer.name == "a" and layer.op == "Relu" and layer.scale == pytest.approx(float(Y_SCALE))
    # the error of 8-bit activations and weights: clearly nonzero, far below 10%
    assert 1e-4 < layer.rel_l2 < 0.1
    assert rep.outputs[0].rel_l2 == pytest.approx(layer.rel_l2, rel=1e-6)
    assert "Relu" in str(rep)


# ----------------------------------------------------------------------------- activations the Q's saturation does
def _act_q_model(act, zp, scale=0.05, lo=0.0, hi=6.0, dt=np.uint8):
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((2, 3, 8)) * 4).astype(np.float32)
    inits = {"s": np.float32(scale), "z": np.array(zp, dt), "lo": np.float32(lo), "hi": np.float32(hi)}
    ins = ["x"] if act == "Relu" else ["x", "lo", "hi"]
    nodes = [helper.make_node(act, ins, ["a"]), helper.make_node("QuantizeLinear", ["a", "s", "z"], ["y"])]
    return graph_model(nodes, {"x": x}, ["y"], inits, opset=21), {"x": x}


@pytest.mark.parametrize("act,zp,kw", [("Relu", 0, {}), ("Relu", -128, {"dt": np.int8}),
                                        ("Clip", 0, {"scale": 6 / 255, "lo": 0.0, "hi": 6.0}),
                                        ("Clip", 0, {"scale": 0.01, "lo": -1.0, "hi": 100.0})])
def test_activation_before_saturating_quantize_is_dropped(act, zp, kw):
    m, feeds = _act_q_model(act, zp, **kw)
    g = optimized(m)
    assert count(g, act) == 0 and count(g, "QuantizeLinear") == 1, g.op_histogram()
    exp = ort_run(m, feeds)[0]
    np.testing.assert_array_equal(tensorfuse.compile(m).run(**feeds)[0], exp)


@pytest.mark.parametrize("act,zp,kw,why", [("Relu", 10, {}, "lower bound 0 is inside"),
                                            ("Clip", 0, {"scale": 0.05, "lo": 0.0, "hi": 6.0}, "upper bound 6 is inside")])
def test_activation_inside_the_quantized_range_stays(act, zp, kw, why):
    m, feeds = _act_q_model(act, zp, **kw)
    assert count(optimized(m), act) == 1
    assert why in why_not(m, "DropActivationBeforeSaturatingQuantize")
    np.testing.assert_array_equal(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0])


# ----------------------------------------------------------------------------- Concat on int8
def _concat_model(scale_b=Y_SCALE):
    rng = np.random.default_rng(13)
    a = (rng.standard_normal((1, 2, 3, 3)) * 2).astype(np.float32)
    b = (rng.standard_normal((1, 4, 3, 3)) * 2).astype(np.float32)
    inits = {"s": Y_SCALE, "sb": np.float32(scale_b), "z": np.uint8(128)}
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["ad"]),
             helper.make_node("QuantizeLinear", ["b", "sb", "z"], ["bq"]),
             helper.make_node("DequantizeLinear", ["bq", "sb", "z"], ["bd"]),
             helper.make_node("Concat", ["ad", "bd"], ["c"], axis=1),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["y"])]
    return graph_model(nodes, {"a": a, "b": b}, ["y"], inits, opset=21), {"a": a, "b": b}


def test_concat_on_int8_fires_and_is_exact():
    m, feeds = _concat_model()
    g = optimized(m)
    (cat,) = [n for n in g.nodes if n.op == "Concat"]
    assert cat.inputs[0].dtype == DType.u8 and count(g, "DequantizeLinear") == 0, g.op_histogram()
    np.testing.assert_array_equal(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0])


def test_concat_on_int8_requantizes_an_input_of_another_scale():
    m, feeds = _concat_model(scale_b=0.07)
    g = optimized(m)
    (cat,) = [n for n in g.nodes if n.op == "Concat"]
    assert cat.inputs[0].dtype == DType.u8 and cat.inputs[1].dtype == DType.u8
    assert cat.inputs[1].producer.op == "QuantizeLinear"           # DQ(b, 0.07) requantized to 0.05
    np.testing.assert_array_equal(tensorfuse.compile(m).run(**feeds)[0], ort_run(m, feeds)[0])


def test_concat_on_int8_not_fired_when_the_concat_is_read_elsewhere():
    m, feeds = _concat_model()
    m.graph.output.append(helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, (1, 6, 3, 3)))
    assert count(optimized(m), "Concat") == 1
    assert "graph output" in why_not(m, "ConcatOnInt8")
    exp = ort_run(m, feeds)
    for g_, e in zip(tensorfuse.compile(m).run(**feeds), exp):
        np.testing.assert_allclose(g_.astype(np.float64), e.astype(np.float64), atol=1e-6)
