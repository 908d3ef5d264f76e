"""The strided 1x1 conv rule (compiler/rules/conv_subsample.py): a 1x1 Conv of stride > 1
becomes a subsampling Slice and a stride-1 Conv; it fires (with and without a bias, batch > 1,
odd sizes, strides that differ per axis, a group, the residual Add and Relu still fused after
it), refuses where it must (with explain's reason), and keeps the model's outputs
(onnxruntime, optimisations off)."""
import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import conv_params, count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-4
RULE = "StridedPointwiseConvSubsample"


def _model(n=1, c=8, h=14, w=14, m=16, k=1, strides=(2, 2), bias=True, residual=False, **attrs):
    x = rand(n, c, h, w)
    ins, inits = conv_params(c, m, k, attrs.get("group", 1), bias)
    nodes = [helper.make_node("Conv", ins, ["c"], kernel_shape=[k, k], strides=list(strides), **attrs)]
    feeds = {"x": x}
    last = "c"
    if residual:
        oh = (h + sum(attrs.get("pads", [0, 0, 0, 0])[::2]) - k) // strides[0] + 1
        ow = (w + sum(attrs.get("pads", [0, 0, 0, 0])[1::2]) - k) // strides[1] + 1
        feeds["z"] = rand(n, m, oh, ow, seed=3)
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    return graph_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("kw", [dict(), dict(bias=False, n=2), dict(h=15, w=13), dict(strides=(2, 3)),
                                dict(group=2, c=8, m=12), dict(residual=True, c=24, m=40, h=28, w=28)])
def test_strided_pointwise_conv_is_subsampled(kw):
    model, feeds = _model(**kw)
    g = optimized(model)
    assert count(g, "Slice") == 1
    convs = [n for n in g.nodes if n.op in ("Conv", "FusedConv")]
    assert len(convs) == 1 and list(convs[0].attrs.get("strides", [1, 1])) == [1, 1]
    if kw.get("residual"):      # the Add and Relu still join the conv's epilogue
        assert convs[0].op == "FusedConv" and count(g, "Add") == 0 and count(g, "Relu") == 0
    assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(2, 3))


@pytest.mark.parametrize("kw,reason", [
    (dict(strides=(1, 1)), "stride 1"),
    (dict(k=3, pads=[1, 1, 1, 1]), "a 3x3 kernel, not 1x1"),
    (dict(pads=[1, 1, 1, 1]), "padded"),
])
def test_not_rewritten(kw, reason):
    model, feeds = _model(**kw)
    g = optimized(model)
    assert count(g, "Slice") == 0
    assert reason in why_not(model, RULE)
    assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_runtime_weights_not_rewritten():
    x, w = rand(1, 4, 8, 8), rand(6, 4, 1, 1, seed=1)
    model = graph_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], strides=[2, 2])],
                        {"x": x, "w": w}, ["y"], {})
    assert "input 1 is graph input 'w', expected a constant" in why_not(model, RULE)


def test_nhwc_pipeline_keeps_the_strided_conv():
    """The rule runs in NCHW pipelines only (``Rule.layouts``): with the NHWC layout (the cuda
    target's) the strided conv stays one conv, with no Slice for Transposes to gather around."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    model, _ = _model()
    g = import_onnx(model)
    optimize(g, 2, layout="NHWC")
    assert count(g, "Slice") == 0
    assert sum(1 for n in g.nodes if "Conv" in n.op) == 1
