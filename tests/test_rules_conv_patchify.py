"""The patch-embedding rule (compiler/rules/conv_patchify.py): a Conv whose strides equal its
kernel (ViT's 16x16 stride 16) becomes a MatMul over the patches; it fires (with and without a
bias, batch > 1, an image that is not a multiple of the patch), refuses where it must (with
explain's reason), and keeps the model's outputs (onnxruntime, optimisations off)."""
import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import conv_params, count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-4
RULE = "ConvPatchifyToMatMul"


def _model(n=1, c=3, h=32, w=32, m=8, k=16, bias=True, **attrs):
    x = rand(n, c, h, w)
    ins, inits = conv_params(c, m, k, attrs.get("group", 1), bias)
    attrs.setdefault("strides", [k, k])
    model = graph_model([helper.make_node("Conv", ins, ["c"], kernel_shape=[k, k], **attrs),
                         helper.make_node("Relu", ["c"], ["y"])], {"x": x}, ["y"], inits)
    return model, x


@pytest.mark.parametrize("n,h,w,k,bias", [(1, 32, 32, 16, True), (2, 48, 32, 16, False),
                                          (1, 37, 45, 12, True), (1, 64, 64, 32, True)])
def test_patch_conv_becomes_a_matmul(n, h, w, k, bias):
    model, x = _model(n=n, h=h, w=w, k=k, bias=bias)
    g = optimized(model)
    assert count(g, "Conv") == 0 and count(g, "tensorfuse::FusedConv") == 0
    assert count(g, "MatMul") + count(g, "tensorfuse::FusedMatMul") == 1
    assert_matches_ort(model, {"x": x}, rtol=RT, atol=AT, opt_levels=(2, 3))


@pytest.mark.parametrize("attrs,reason", [
    (dict(strides=[8, 8]), "strides [8, 8] differ from the kernel [16, 16]"),
    (dict(pads=[1, 1, 1, 1]), "padded"),
    (dict(dilations=[2, 2], strides=[16, 16]), "dilations"),
    (dict(group=2, c=4), "group 2"),
    (dict(k=8), "a 8x8 patch, below MIN_KERNEL_AREA = 144 taps"),
])
def test_not_rewritten(attrs, reason):
    c = attrs.pop("c", 3)
    h = 80 if attrs.get("dilations") else 32
    model, x = _model(c=c, h=h, w=h, **attrs)
    g = optimized(model)
    assert count(g, "Conv") + count(g, "tensorfuse::FusedConv") == 1
    assert reason in why_not(model, RULE)
    assert_matches_ort(model, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_runtime_weights_not_rewritten():
    x, w = rand(1, 3, 32, 32), rand(8, 3, 16, 16, seed=1)
    model = graph_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[16, 16], strides=[16, 16])],
                        {"x": x, "w": w}, ["y"], {})
    assert "input 1 is graph input 'w', expected a constant" in why_not(model, RULE)
    assert_matches_ort(model, {"x": x, "w": w}, rtol=RT, atol=AT, opt_levels=(2,))
