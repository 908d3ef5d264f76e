"""BatchNormalization folding rules (compiler/rules/fold_batchnorm.py): each fires, refuses where
it must (with explain's reason), and keeps the model's outputs (onnxruntime, optimisations off)."""
import numpy as np
import pytest
from onnx import helper

from tensorfuse.ir.registry import find_op
from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-5


def _bn_inits(c, seed=10, prefix="bn"):
    return {f"{prefix}_g": rand(c, seed=seed), f"{prefix}_b": rand(c, seed=seed + 1),
            f"{prefix}_m": rand(c, seed=seed + 2), f"{prefix}_v": rand(c, seed=seed + 3, low=0.1, high=2.0)}


def _bn_node(src, dst, prefix="bn", eps=1e-3):
    return helper.make_node("BatchNormalization", [src, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"],
                            [dst], epsilon=eps)


# ----------------------------------------------------------------------------- Conv
@pytest.mark.parametrize("group,bias", [(1, True), (1, False), (4, True), (2, False)])
def test_conv_bn_folds(group, bias):
    x = rand(1, 4, 6, 6)
    inits = {"w": rand(8, 4 // group, 3, 3, seed=1), **_bn_inits(8)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = rand(8, seed=2)
        conv_in.append("b")
    m = graph_model([helper.make_node("Conv", conv_in, ["c"], group=group, pads=[1, 1, 1, 1]),
                     _bn_node("c", "y")], {"x": x}, ["y"], inits)
    g = optimized(m)
    assert count(g, "BatchNormalization") == 0
    assert count(g, "Conv") == 1
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_bn_not_folded_with_runtime_statistics():
    x, mean = rand(1, 3, 5, 5), rand(4, seed=5)
    inits = {"w": rand(4, 3, 1, 1, seed=1), **_bn_inits(4)}
    del inits["bn_m"]
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"]), _bn_node("c", "y")],
                    {"x": x, "bn_m": mean}, ["y"], inits)
    g = optimized(m)
    assert count(g, "BatchNormalization") == 1
    assert "input 3 is graph input 'bn_m', expected a constant" in why_not(m, "FoldBatchNormIntoConv")
    assert_matches_ort(m, {"x": x, "bn_m": mean}, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_bn_not_folded_when_conv_output_is_read_elsewhere():
    x = rand(1, 3, 5, 5)
    inits = {"w": rand(4, 3, 1, 1, seed=1), **_bn_inits(4)}
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"]), _bn_node("c", "y"),
                     helper.make_node("Sigmoid", ["c"], ["s"])], {"x": x}, ["y", "s"], inits)
    g = optimized(m)
    assert count(g, "BatchNormalization") == 1
    assert "has another consumer" in why_not(m, "FoldBatchNormIntoConv")
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_bn_not_folded_when_conv_output_is_a_graph_output():
    x = rand(1, 3, 5, 5)
    inits = {"w": rand(4, 3, 1, 1, seed=1), **_bn_inits(4)}
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"]), _bn_node("c", "y")], {"x": x}, ["y", "c"], inits)
    g = optimized(m)
    assert count(g, "BatchNormalization") == 1
    assert "is a graph output" in why_not(m, "FoldBatchNormIntoConv")
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_bn_not_folded_with_runtime_weights():
    x, w = rand(1, 3, 5, 5), rand(4, 3, 1, 1, seed=1)
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"]), _bn_node("c", "y")], {"x": x, "w": w}, ["y"],
                    _bn_inits(4))
    assert "input 1 is graph input 'w', expected a constant" in why_not(m, "FoldBatchNormIntoConv")
    assert_matches_ort(m, {"x": x, "w": w}, rtol=RT, atol=AT, opt_levels=(2,))


# ----------------------------------------------------------------------------- ConvTranspose
needs_convtranspose = pytest.mark.skipif(find_op("ConvTranspose") is None,
                                         reason="ConvTranspose is not in the op registry yet")


@needs_convtranspose
@pytest.mark.parametrize("group,bias", [(1, True), (2, False), (2, True)])
def test_convtranspose_bn_folds_with_its_weight_layout(group, bias):
    x = rand(1, 4, 5, 5)
    c_out = 6
    inits = {"w": rand(4, c_out // group, 3, 3, seed=1), **_bn_inits(c_out)}   # [C_in, C_out/group, k, k]
    ins = ["x", "w"]
    if bias:
        inits["b"] = rand(c_out, seed=2)
        ins.append("b")
    m = graph_model([helper.make_node("ConvTranspose", ins, ["c"], group=group, strides=[2, 2]),
                     _bn_node("c", "y")], {"x": x}, ["y"], inits)
    g = optimized(m)
    assert count(g, "BatchNormalization") == 0 and count(g, "ConvTranspose") == 1
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


@needs_convtranspose
def test_convtranspose_bn_not_folded_with_runtime_statistics():
    x, var = rand(1, 2, 4, 4), rand(3, seed=9, low=0.5, high=1.0)
    inits = {"w": rand(2, 3, 2, 2, seed=1), **_bn_inits(3)}
    del inits["bn_v"]
    m = graph_model([helper.make_node("ConvTranspose", ["x", "w"], ["c"]), _bn_node("c", "y")],
                    {"x": x, "bn_v": var}, ["y"], inits)
    assert "input 4 is graph input 'bn_v', expected a constant" in why_not(m, "FoldBatchNormIntoConvTranspose")
    assert count(optimized(m), "BatchNormalization") == 1
    assert_matches_ort(m, {"x": x, "bn_v": var}, rtol=RT, atol=AT, opt_levels=(2,))


# ----------------------------------------------------------------------------- Gemm / MatMul
@pytest.mark.parametrize("attrs,c_shape", [({}, (5,)), ({"transB": 1}, (1, 5)), ({"transA": 1, "alpha": 0.5, "beta": 2.0}, (3, 5)),
                                           ({"transB": 1}, None)])
def test_gemm_bn_folds(attrs, c_shape):
    a = rand(4, 3) if attrs.get("transA") else rand(3, 4)
    inits = {"w": rand(5, 4, seed=1) if attrs.get("transB") else rand(4, 5, seed=1), **_bn_inits(5)}
    ins = ["a", "w"]
    if c_shape is not None:
        inits["c"] = rand(*c_shape, seed=2)
        ins.append("c")
    m = graph_model([helper.make_node("Gemm", ins, ["g"], **attrs), _bn_node("g", "y")], {"a": a}, ["y"], inits)
    g = optimized(m)
    assert count(g, "BatchNormalization") == 0 and count(g, "Gemm") == 1
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


def test_gemm_bn_not_folded_with_runtime_weights():
    a, w = rand(3, 4), rand(4, 5, seed=1)
    m = graph_model([helper.make_node("Gemm", ["a", "w"], ["g"]), _bn_node("g", "y")], {"a": a, "w": w}, ["y"],
                    _bn_inits(5))
    assert "input 1 is graph input 'w', expected a constant" in why_not(m, "FoldBatchNormIntoGemm")
    assert count(optimized(m), "BatchNormalization") == 1
    assert_matches_ort(m, {"a": a, "w": w}, rtol=RT, atol=AT, opt_levels=(2,))


def test_matmul_bn_folds():
    a = rand(3, 4)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), _bn_node("p", "y")], {"a": a}, ["y"],
                    {"w": rand(4, 6, seed=1), **_bn_inits(6)})
    g = optimized(m)
    assert count(g, "BatchNormalization") == 0
    assert count(g, "tensorfuse::FusedMatMul") == 1      # the shift became a bias, fused next
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


def test_matmul_bn_not_folded_on_a_3d_product():
    a = rand(2, 6, 4)          # BatchNormalization's channel axis is 1 (the 6 rows), not W's columns
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), _bn_node("p", "y")], {"a": a}, ["y"],
                    {"w": rand(4, 5, seed=1), **_bn_inits(6)})
    assert "the product has rank 3" in why_not(m, "FoldBatchNormIntoMatMul")
    assert count(optimized(m), "BatchNormalization") == 1
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))
