"""The fusion catalogue on the shared real models (../shared/models): what the optimised graphs
contain at O2, and that their outputs still match onnxruntime (optimisations off).

Skips visibly where ../shared/models is absent; fails there under TENSORFUSE_REQUIRE_SHARED=1.
"""
import json

import numpy as np
import pytest

from tests.fusion_util import count, optimized

BERT_LAYERS = 4          # bert_mini: 4 encoder layers (4 heads each, inside the fused attention)
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu")
SHAPE_OPS = ("Shape", "Size", "ConstantOfShape", "Unsqueeze", "Concat", "Equal", "GreaterOrEqual", "Expand", "Range")


def _entry(models_dir, file):
    for e in json.loads((models_dir / "models.json").read_text())["models"]:
        if e["file"] == file:
            return e
    raise KeyError(file)


def _feeds(entry):
    rng = np.random.default_rng(0)
    feeds = {}
    for i in entry["inputs"]:
        shape = i["shape"]
        if i["dtype"] == "int64":
            lo, hi = i.get("range", [0, 2])
            feeds[i["name"]] = rng.integers(lo, hi, size=shape).astype(np.int64)
        else:
            feeds[i["name"]] = rng.standard_normal(shape).astype(np.float32)
    if "attention_mask" in feeds:       # padding at the end, as a tokenizer gives it
        m = np.ones(feeds["attention_mask"].shape, np.int64)
        m[..., 100:] = 0
        feeds["attention_mask"] = m
    return feeds


def _assert_matches_ort(path, entry, opt_level=2):
    """Compile at ``opt_level`` and compare with onnxruntime on two inputs, after checking that
    onnxruntime's outputs for them differ by far more than the tolerance (rtol 1e-3, atol 1e-4)."""
    import tensorfuse
    from tests.oracle import assert_outputs_depend_on_inputs, other_inputs, ort_run
    import onnx
    feeds = _feeds(entry)
    feeds2 = other_inputs(feeds)
    proto = onnx.load(str(path))
    expected, expected2 = ort_run(proto, feeds), ort_run(proto, feeds2)
    assert_outputs_depend_on_inputs(expected, expected2, 1e-3, 1e-4, entry["file"])
    mod = tensorfuse.compile(str(path), opt_level=opt_level)
    for f, want in ((feeds, expected), (feeds2, expected2)):
        for o, g, e in zip(entry["outputs"], mod.run(**f), want):
            np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4, err_msg=f"{entry['file']} output {o['name']}")
    return mod


def _activations_after_conv(g):
    return [n.name for n in g.nodes if n.op in ACTIVATIONS and n.inputs[0].producer is not None
            and n.inputs[0].producer.op in ("Conv", "FusedConv")]


# ----------------------------------------------------------------------------- CNNs
@pytest.mark.parametrize("name", ["resnet18.unfolded", "mobilenet_v2.unfolded"])
def test_cnn_graph_is_fused(shared_models, name):
    g = optimized(shared_models / f"{name}.onnx")
    hist = g.op_histogram()
    assert count(g, "BatchNormalization") == 0, hist
    assert _activations_after_conv(g) == [], hist
    assert count(g, "Relu") + count(g, "Clip") == 0, hist
    # every residual Add joined a Conv epilogue
    assert count(g, "Add") == 0, hist
    entry = _entry(shared_models, f"{name}.onnx")
    convs = entry["op_histogram"]["Conv"]
    assert count(g, "Conv") + count(g, "tensorfuse::FusedConv") == convs


def test_resnet18_fused_counts(shared_models):
    g = optimized(shared_models / "resnet18.unfolded.onnx")
    # 17 Conv+BN+Relu (8 of them with the residual Add), 3 downsampling Conv+BN stay plain Convs,
    # each reading its input subsampled by a Slice (StridedPointwiseConvSubsample)
    assert g.op_histogram() == {"tensorfuse::FusedConv": 17, "Conv": 3, "Slice": 3, "MaxPool": 1,
                                "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}


def test_mobilenet_v2_fused_counts(shared_models):
    g = optimized(shared_models / "mobilenet_v2.unfolded.onnx")
    fc = [n for n in g.nodes if n.qualified_op == "tensorfuse::FusedConv"]
    assert sum(n.attr("activation") == "Clip" for n in fc) == 35
    assert all(n.attr("activation_params") == [0.0, 6.0] for n in fc if n.attr("activation") == "Clip")
    assert sum(n.input(3) is not None for n in fc) == 10          # the 10 residual Adds
    assert count(g, "Conv") == 7                                  # linear bottlenecks without a residual


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18.unfolded", "mobilenet_v2.unfolded"])
def test_cnn_outputs_match_onnxruntime(shared_models, name):
    _assert_matches_ort(shared_models / f"{name}.onnx", _entry(shared_models, f"{name}.onnx"))


# ----------------------------------------------------------------------------- BERT
def test_bert_mini_graph_is_fused(shared_models):
    g = optimized(shared_models / "bert_mini.unfolded.onnx")
    hist = g.op_histogram()
    for op in SHAPE_OPS:
        assert count(g, op) == 0, f"{op} left: {hist}"
    assert count(g, "tensorfuse::Attention") == BERT_LAYERS, hist
    assert count(g, "tensorfuse::SkipLayerNormalization") == 2 * BERT_LAYERS, hist
    assert count(g, "tensorfuse::EmbedLayerNormalization") == 1, hist
    for op in ("LayerNormalization", "Softmax", "MatMul", "Erf", "Div", "Mul", "Add", "Tanh", "Gemm"):
        assert count(g, op) == 0, f"{op} left: {hist}"
    fm = [n for n in g.nodes if n.qualified_op == "tensorfuse::FusedMatMul"]
    assert len(fm) == 6 * BERT_LAYERS                 # Q, K, V, attention output, intermediate, output
    assert sum(n.attr("activation") == "Gelu" for n in fm) == BERT_LAYERS
    assert count(g, "tensorfuse::FusedGemm") == 1     # the pooler's Gemm + Tanh
    att = [n for n in g.nodes if n.qualified_op == "tensorfuse::Attention"]
    assert all(abs(n.attr("scale") - 0.125) < 1e-7 and n.inputs[3] is not None for n in att)
    # one mask, shared by every layer
    assert len({id(n.inputs[3]) for n in att}) == 1


@pytest.mark.slow
def test_bert_mini_outputs_match_onnxruntime(shared_models):
    _assert_matches_ort(shared_models / "bert_mini.unfolded.onnx", _entry(shared_models, "bert_mini.unfolded.onnx"))
