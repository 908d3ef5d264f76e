"""The Pad folding rule (compiler/rules/fold_pad.py): a constant zero Pad of the spatial dims
before a Conv becomes the Conv's own (possibly asymmetric) pads. It fires on TF-"SAME" style
pads (end > begin), with pads the Conv already has, with an ``axes`` input, on the opset-10
attribute form and on 1-D convolutions; it refuses where it must (explain's reason); and the
outputs stay onnxruntime's (optimisations off), rtol/atol 1e-4 for sums of at most 72 products."""
import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-4
RULE = "FoldPadIntoConv"


def _model(pads=(0, 0, 0, 0, 0, 0, 1, 1), conv_pads=None, mode=None, value=None, axes=None, group=1,
           rank=4, extra_use=False, auto_pad=None, opset=17):
    c, m = 4, 8
    shape = (1, c, 9, 11) if rank == 4 else (1, c, 13)
    k = [3] * (rank - 2)
    x = rand(*shape)
    inits = {"w": rand(m, c // group, *k, seed=1, low=-0.5, high=0.5), "b": rand(m, seed=2)}
    if opset >= 11:
        inits["pads"] = np.array(pads, np.int64)
        pad_ins = ["x", "pads"]
        if value is not None or axes is not None:
            inits["v"] = np.array(0.0 if value is None else value, np.float32)
            pad_ins.append("v")
        if axes is not None:
            inits["axes"] = np.array(axes, np.int64)
            pad_ins.append("axes")
        pad = helper.make_node("Pad", pad_ins, ["p"], **({"mode": mode} if mode else {}))
    else:
        pad = helper.make_node("Pad", ["x"], ["p"], pads=list(pads), value=float(value or 0.0),
                               **({"mode": mode} if mode else {}))
    cattrs = {"kernel_shape": k, "group": group}
    if conv_pads is not None:
        cattrs["pads"] = list(conv_pads)
    if auto_pad is not None:
        cattrs["auto_pad"] = auto_pad
    nodes = [pad, helper.make_node("Conv", ["p", "w", "b"], ["y"], **cattrs)]
    outs = ["y"]
    if extra_use:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outs.append("r")
    return graph_model(nodes, {"x": x}, outs, inits, opset=opset), {"x": x}


@pytest.mark.parametrize("kw", [
    {},                                                     # TF "SAME": one more at the end
    {"pads": (0, 0, 1, 2, 0, 0, 2, 1), "conv_pads": (1, 0, 0, 1)},  # added to the Conv's own
    {"pads": (2, 1, 1, 3), "axes": (2, 3), "opset": 18},    # an axes input (Pad-18)
    {"pads": (0, 0, 1, 1, 0, 0, 1, 1), "group": 4},         # depthwise
    {"pads": (0, 0, 2, 0, 0, 1), "rank": 3},                # 1-D
    {"pads": (0, 0, 1, 0, 0, 0, 1, 1), "opset": 10},        # Pad-2: pads and value attributes
    {"pads": (0, 0, 1, 1, 0, 0, 1, 1), "value": 0.0, "mode": "constant"},
])
def test_zero_pad_folds_into_the_conv(kw):
    model, feeds = _model(**kw)
    g = optimized(model)
    assert count(g, "Pad") == 0, g.op_histogram()
    assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(1, 2))


@pytest.mark.parametrize("kw,reason", [
    ({"mode": "reflect"}, "mode 'reflect', not constant"),
    ({"value": 0.5}, "pads with 0.5, not 0"),
    ({"pads": (1, 0, 1, 1, 0, 0, 1, 1)}, "pads axis 0 (N)"),
    ({"pads": (0, 0, -1, 0, 0, 0, 1, 1)}, "crops axis 2"),
    ({"extra_use": True}, "other consumer"),
    ({"auto_pad": "SAME_UPPER"}, "auto_pad SAME_UPPER"),
])
def test_pad_not_folded(kw, reason):
    model, feeds = _model(**kw)
    g = optimized(model)
    assert count(g, "Pad") == 1
    assert reason in why_not(model, RULE)
    assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(2,))
