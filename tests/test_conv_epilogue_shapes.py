"""Every conv schedule with every broadcastable epilogue operand, on degenerate shapes (issue 24,
item 0).

The pointwise schedule vectorises over the flattened pixels of a plane and used to index its
epilogue operands with an index whose last entry was the flat pixel: an operand whose width
was 1 (the conv's own input as a residual, X [1, 6, 3, 1]) read the first pixel for all of
them (max error 2.75 at O2), and an operand shaped [W] read far past its end (errors up to
1e38). Here each conv configuration is one model of several branches ``Conv_i(x) (+|*) a_i``
(distinct weights, so CSE keeps them apart and each Add/Mul fuses into its own conv), one
branch per operand shape that broadcasts to Y [N, M, OH, OW]: a scalar, [1], [M, 1, 1], [OW],
[OH, 1], [OH, OW], [M, 1, OW], [1, M, OH, OW], [N, M, OH, OW], [N, 1, 1, 1] and, where the
shapes allow, X itself. The configurations are degenerate on purpose: width or height 1, a
single channel, batch above 1, planes smaller than a vector. Outputs are compared with
onnxruntime (optimisations off) at O2 (rtol 1e-4, atol 1e-5 scaled by the output's magnitude),
and the kernels' comments must show that the sweep reached every CPU conv schedule.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from tests.oracle import ort_run

#: the AVX2 layout on every host (8 lanes), so the schedule a shape takes is the same on an
#: AVX-512 machine (tests/test_ops_conv.py does the same)
TARGET = "llvm -mattr=-avx512f"
RT, AT = 1e-4, 1e-5

SCHEDULES = {"[pointwise:": "pointwise", "[flat pixel tiles": "flat", "[im2row:": "im2row",
             "[winograd": "winograd", "[register tile": "rows", "[depthwise:": "depthwise"}


def _schedule(comment: str) -> str:
    for key, name in SCHEDULES.items():
        if key in comment:
            return name
    return "generic"


def _operand_shapes(y_shape, x_shape):
    n, m, oh, ow = y_shape
    shapes = [(), (1,), (m, 1, 1), (ow,), (oh, 1), (oh, ow), (m, 1, ow), (1, m, oh, ow), (n, m, oh, ow),
              (n, 1, 1, 1)]
    out = []
    for s in shapes:
        if s not in out:
            out.append(s)
    return out


def _model(x_shape, m, k, attrs, op_cycle=("Add", "Mul")):
    """(model, feeds, y_shape, branch names): one Conv_i(x) (op) a_i branch per operand shape."""
    rng = np.random.default_rng(sum(x_shape) * 7 + m)
    x = rng.uniform(-2, 2, x_shape).astype(np.float32)
    group = attrs.get("group", 1)
    w0 = rng.uniform(-1, 1, (m, x_shape[1] // group, k, k)).astype(np.float32)
    probe = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k, k], **attrs)], "p",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [None] * 4)],
                              [numpy_helper.from_array(w0, "w")])
    y_shape = ort_run(helper.make_model(probe, opset_imports=[helper.make_opsetid("", 17)]), {"x": x})[0].shape
    operands = [("const", s) for s in _operand_shapes(y_shape, x_shape)]
    if tuple(y_shape) == tuple(x_shape):
        operands.append(("x", tuple(x_shape)))        # the residual from the conv's own input
    operands.append(("input", tuple(y_shape)))        # a runtime operand of Y's shape
    nodes, inits, outs, names = [], [], [], []
    feeds = {"x": x}
    g_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    for i, (kind, s) in enumerate(operands):
        w = rng.uniform(-1, 1, w0.shape).astype(np.float32)
        b = rng.uniform(-1, 1, (m,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k, k], **attrs))
        if kind == "const":
            a = f"a{i}"
            inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, s).astype(np.float32), a))
        elif kind == "input":
            a = f"z{i}"
            feeds[a] = rng.uniform(-1, 1, s).astype(np.float32)
            g_in.append(helper.make_tensor_value_info(a, TensorProto.FLOAT, s))
        else:
            a = "x"
        op = op_cycle[i % len(op_cycle)]
        nodes.append(helper.make_node(op, [f"c{i}", a], [f"s{i}"]))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, list(y_shape)))
        names.append(f"{op} {kind} {list(s)}")
    g = helper.make_graph(nodes, "epilogue_shapes", g_in, outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, feeds, tuple(y_shape), names


#: (x shape, output channels, kernel size, attributes, the schedules its branches take: the
#: pointwise schedule refuses operands that broadcast along only some spatial dims ([OW],
#: [OH, 1], [M, 1, OW]), whose branches take the flat tiles or the row tiles)
CASES = [
    ((1, 6, 3, 1), 6, 1, {}, {"pointwise"}),                        # issue 24's first case: width 1
    ((1, 8, 4, 1), 8, 1, {}, {"pointwise"}),
    ((1, 32, 56, 1), 32, 1, {}, {"pointwise"}),                     # a column: 7 whole vectors
    ((1, 16, 1, 5), 16, 1, {}, {"flat"}),                           # height 1, fewer pixels than a vector
    ((1, 4, 6, 5), 4, 1, {"group": 2}, {"pointwise", "rows"}),      # issue 24's second case (grouped)
    ((3, 16, 5, 7), 24, 1, {}, {"pointwise", "flat"}),              # batch 3, rest vectors overlap
    ((2, 1, 9, 1), 8, 1, {}, {"pointwise"}),                        # a single input channel
    ((1, 64, 9, 1), 64, 1, {}, {"flat"}),
    ((1, 32, 12, 1), 16, 1, {"strides": [2, 1]}, {"flat"}),         # strided 1x1 on a column
    ((1, 16, 6, 1), 16, 3, {"pads": [1, 1, 1, 1]}, {"flat"}),       # 3x3 on a column
    ((2, 16, 1, 9), 24, 3, {"pads": [1, 1, 1, 1]}, {"rows"}),       # 3x3 on a row, batch 2
    ((1, 3, 10, 1), 16, 3, {"pads": [1, 1, 1, 1]}, {"flat"}),
    ((1, 3, 1, 12), 8, 3, {"pads": [1, 1, 1, 1]}, {"im2row"}),      # few input channels (RGB-like)
    ((1, 16, 30, 1), 16, 3, {"pads": [1, 1, 1, 1]}, {"flat"}),
    ((1, 16, 20, 20), 16, 3, {"pads": [1, 1, 1, 1]}, {"winograd"}),
    ((2, 16, 9, 11), 16, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, {"flat"}),
    ((1, 24, 7, 1), 24, 3, {"pads": [1, 1, 1, 1], "group": 24}, {"depthwise"}),
    ((2, 16, 1, 6), 16, 3, {"pads": [1, 1, 1, 1], "group": 16}, {"depthwise"}),
    ((1, 1, 5, 1), 1, 3, {"pads": [1, 1, 1, 1]}, {"depthwise"}),    # one channel in and out
    ((2, 8, 5, 1), 8, 3, {"pads": [1, 1, 1, 1], "group": 4}, {"generic"}),   # 2 channels per group
]

@pytest.mark.parametrize("x_shape,m,k,attrs,schedule", CASES, ids=[f"{c[0]}-{c[1]}-k{c[2]}-{c[3]}" for c in CASES])
def test_conv_epilogue_operand_shapes(x_shape, m, k, attrs, schedule):
    model, feeds, y_shape, names = _model(x_shape, m, k, attrs)
    mod = tensorfuse.compile(model, target=TARGET, opt_level=2, cache=False)
    kinds = {_schedule(kk.comment) for kk in mod.kernels if "Conv" in kk.comment}
    assert kinds == schedule, [kk.comment for kk in mod.kernels]
    # every Add/Mul was fused into its conv (else the test would not test the epilogues); a
    # strided 1x1 conv reads X through a subsampling Slice of its own (StridedPointwiseConvSubsample)
    convs = [c for c in mod.calls if not c.kernel.startswith("slice")]
    assert len(convs) == len(names), [c.kernel for c in mod.calls]
    got = mod.run(**feeds)
    want = ort_run(model, feeds)
    bad = []
    for name, g, w in zip(names, got, want):
        assert np.ptp(w) > 0.1, name                 # the output varies
        err = float(np.abs(g - w).max())
        if not np.allclose(g, w, rtol=RT, atol=AT * max(1.0, float(np.abs(w).max()))):
            bad.append(f"{name}: max abs error {err:.3g}")
    assert not bad, f"Y {list(y_shape)}, schedule {schedule}: " + "; ".join(bad)


def test_conv_epilogue_sweep_covers_every_schedule():
    """The sweep reaches every CPU conv schedule (each case asserts the one it takes)."""
    assert set().union(*(c[-1] for c in CASES)) == {"pointwise", "flat", "im2row", "winograd", "rows", "depthwise", "generic"}


@pytest.mark.slow
@pytest.mark.parametrize("width", [3, 1])
def test_mobilenet_v2_on_narrow_images(shared_models, width):
    """mobilenet_v2 (../shared/models) with its declared input width set to 3 or 1: its planes
    shrink to width 1 after the second stride, where the pointwise convs' residual Adds read
    the wrong pixels (before the fix: max error 0.15 at width 3, 0.17 at width 1, on outputs up
    to 0.58). Matches onnxruntime at O2 within 1e-4; two inputs give outputs that differ by far
    more than that, so the comparison can fail."""
    import onnx
    m = onnx.load(str(shared_models / "mobilenet_v2.onnx"))
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_value = width
    del m.graph.value_info[:]
    name = m.graph.input[0].name
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x1, x2 = (np.random.default_rng(s).standard_normal(shape).astype(np.float32) for s in (0, 5))
    want1, want2 = ort_run(m, {name: x1})[0], ort_run(m, {name: x2})[0]
    assert float(np.abs(want1 - want2).max()) > 1e-2
    mod = tensorfuse.compile(m, target=TARGET, opt_level=2, cache=False)
    np.testing.assert_allclose(mod.run(x1)[0], want1, rtol=0, atol=1e-4)
    np.testing.assert_allclose(mod.run(x2)[0], want2, rtol=0, atol=1e-4)
