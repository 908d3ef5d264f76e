"""NonMaxSuppression and DeformConv against onnxruntime (optimisations off)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.compiler.specialize import SpecializingModule
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, run_reference
from tensorfuse.ir.types import DType, TensorType
from oracle import assert_matches_ort, node_model, ort_run, rand

F32 = np.float32
NMS_NAMES = ["boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold"]


def nms_feeds(boxes, scores, max_out=None, iou=None, score=None):
    vals = [np.asarray(boxes, F32), np.asarray(scores, F32),
            None if max_out is None else np.asarray(max_out, np.int64),
            None if iou is None else np.asarray(iou, F32), None if score is None else np.asarray(score, F32)]
    names = [n if v is not None else "" for n, v in zip(NMS_NAMES, vals)]
    while names and names[-1] == "":
        names.pop()
    return {n: v for n, v in zip(NMS_NAMES, vals) if v is not None}, names


def int64_output(m):
    """Opset 10's shape inference leaves the output untyped: type it [?, 3] int64."""
    tt = m.graph.output[0].type.tensor_type
    tt.elem_type = TensorProto.INT64
    if not tt.HasField("shape"):
        tt.shape.SetInParent()
    return m


def check_nms(boxes, scores, max_out=None, iou=None, score=None, attrs=None, opset=11, as_inputs=True):
    feeds, names = nms_feeds(boxes, scores, max_out, iou, score)
    if as_inputs:      # graph inputs: compile() specialises on their values
        m = node_model("NonMaxSuppression", feeds, attrs, opset=opset, input_names=names)
        return assert_matches_ort(int64_output(m), feeds, rtol=0, atol=0)
    m = node_model("NonMaxSuppression", {}, attrs, opset=opset, initializers=feeds, input_names=names)
    return assert_matches_ort(int64_output(m), {}, rtol=0, atol=0)


BOXES6 = [[[0.0, 0.0, 1.0, 1.0], [0.0, 0.1, 1.0, 1.1], [0.0, -0.1, 1.0, 0.9],
           [0.0, 10.0, 1.0, 11.0], [0.0, 10.1, 1.0, 11.1], [0.0, 100.0, 1.0, 101.0]]]
SCORES6 = [[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]]


@pytest.mark.parametrize("max_out,iou,score", [
    (3, 0.5, 0.0), (2, 0.5, 0.0), (10, 0.5, 0.4), (3, 0.0, None), (3, 1.0, 0.0),
    (0, 0.5, 0.0), (-1, 0.5, 0.0), (3, 0.5, 0.95),
])
def test_nms_thresholds(max_out, iou, score):
    check_nms(BOXES6, SCORES6, [max_out], [iou], None if score is None else [score])


def test_nms_center_point_and_flipped():
    centers = [[[0.5, 0.5, 1.0, 1.0], [0.5, 0.6, 1.0, 1.0], [0.5, 0.4, 1.0, 1.0],
                [0.5, 10.5, 1.0, 1.0], [0.5, 10.6, 1.0, 1.0], [0.5, 100.5, 1.0, 1.0]]]
    check_nms(centers, SCORES6, [3], [0.5], [0.0], {"center_point_box": 1})
    flipped = [[[1.0, 1.0, 0.0, 0.0], [0.0, 0.1, 1.0, 1.1], [0.0, 0.9, 1.0, -0.1],
                [0.0, 10.0, 1.0, 11.0], [1.0, 10.1, 0.0, 11.1], [1.0, 101.0, 0.0, 100.0]]]
    check_nms(flipped, SCORES6, [3], [0.5], [0.0])


def test_nms_identical_and_degenerate_boxes():
    check_nms([[[0.0, 0.0, 1.0, 1.0]] * 10], [[[0.9] * 10]], [3], [0.5], [0.0])
    # zero-area boxes never suppress; equal scores keep the lower index first
    check_nms([[[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]], [[[0.5, 0.5, 0.5, 0.4]]], [4], [0.1])


def test_nms_iou_boundary_is_kept():
    # IoU exactly 0.5 is not "strictly greater": both boxes stay
    check_nms([[[0, 0, 1, 1], [0, 0, 1, 2]]], [[[0.9, 0.8]]], [2], [0.5], [0.0])
    check_nms([[[0, 0, 1, 1], [0, 0, 1, 2]]], [[[0.9, 0.8]]], [2], [0.49], [0.0])


@pytest.mark.parametrize("seed", [0, 1])
def test_nms_random_batches_classes(seed):
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 10, (2, 30, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(0.5, 4, (2, 30, 2))], axis=2).astype(F32)
    scores = rng.uniform(0, 1, (2, 3, 30)).astype(F32)
    check_nms(boxes, scores, [5], [0.3], [0.2])
    check_nms(boxes, scores, [100], [0.6])
    check_nms(boxes, scores, [7], [0.45], [0.5], opset=10)


def test_nms_optional_inputs_and_constants():
    # without max_output_boxes_per_class nothing is selected
    out = check_nms(BOXES6, SCORES6)
    assert out[0].shape == (0, 3)
    check_nms(BOXES6, SCORES6, [2])
    check_nms(BOXES6, SCORES6, 2, 0.5, 0.0)          # scalar inputs
    check_nms(BOXES6, SCORES6, [3], [0.5], [0.0], as_inputs=False)


def test_nms_specialises_on_graph_inputs():
    feeds, names = nms_feeds(BOXES6, SCORES6, [3], [0.5], [0.0])
    mod = tensorfuse.compile(node_model("NonMaxSuppression", feeds, opset=11, input_names=names), target="llvm")
    assert isinstance(mod, SpecializingModule)
    np.testing.assert_array_equal(mod.run(**feeds)[0], [[0, 0, 3], [0, 0, 0], [0, 0, 5]])
    feeds["max_output_boxes_per_class"] = np.array([1], np.int64)
    np.testing.assert_array_equal(mod.run(**feeds)[0], [[0, 0, 3]])


def test_nms_reference_matches_ort():
    rng = np.random.default_rng(3)
    corner = rng.uniform(0, 5, (1, 12, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(0.5, 3, (1, 12, 2))], axis=2).astype(F32)
    scores = rng.uniform(0, 1, (1, 2, 12)).astype(F32)
    arrays = [boxes, scores, np.array([4], np.int64), np.array([0.4], F32), np.array([0.1], F32)]
    g = Graph()
    b = Builder(g)
    b.op("NonMaxSuppression", *[b.const(a) for a in arrays])
    got = run_reference(g.nodes[-1], arrays)[0]
    feeds = dict(zip(NMS_NAMES, arrays))
    exp = ort_run(node_model("NonMaxSuppression", feeds, opset=11), feeds)[0]
    assert got.dtype == exp.dtype
    np.testing.assert_array_equal(got, exp)


def test_nms_runtime_data_is_refused():
    g = Graph()
    b = Builder(g)
    x = g.add_input("boxes", TensorType(DType.f32, (1, 6, 4)))
    s = b.const(np.asarray(SCORES6, F32))
    with pytest.raises(ShapeError, match="output shape depends on data") as e:
        b.op("NonMaxSuppression", x, s, b.const(np.array([3], np.int64)))
    assert e.value.needs_value == "boxes"
    # boxes computed at run time from a tensor too large to fold at compile time
    n = 1100
    big = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n, 4])
    sc = helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1, n])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [None, 3])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonMaxSuppression", ["r", "s", "k"], ["y"])]
    init = [onnx.numpy_helper.from_array(np.array([3], np.int64), "k")]
    m = helper.make_model(helper.make_graph(nodes, "g", [big, sc], [y], init),
                          opset_imports=[helper.make_opsetid("", 17)])
    mod = tensorfuse.compile(m, target="llvm")
    with pytest.raises(UnsupportedModelError, match="output shape depends on data"):
        mod.run(x=rand(1, n, 4), s=rand(1, 1, n))


def test_nms_bad_inputs():
    for boxes, scores, match in ((np.zeros((1, 6, 3), F32), SCORES6, "boxes must be"),
                                 (BOXES6, np.zeros((1, 1, 5), F32), "scores must be")):
        feeds, names = nms_feeds(boxes, scores, [3])
        m = node_model("NonMaxSuppression", {}, initializers=feeds, input_names=names, opset=11)
        with pytest.raises(UnsupportedModelError, match=match):
            tensorfuse.compile(int64_output(m), target="llvm")
    g = Graph()
    b = Builder(g)
    with pytest.raises(ShapeError, match="center_point_box"):
        b.op("NonMaxSuppression", b.const(np.asarray(BOXES6, F32)), b.const(np.asarray(SCORES6, F32)),
             b.const(np.array([3], np.int64)), center_point_box=2)


# ----------------------------------------------------------------------------- DeformConv
def deform_inputs(n, c, in_sp, m, cg, ks, out_sp, og=1, seed=0, mask=False, bias=False, scale=1.5, dtype=F32):
    nsp = len(in_sp)
    taps = int(np.prod(ks))
    feeds = {"X": rand(n, c, *in_sp, seed=seed, dtype=dtype), "W": rand(m, cg, *ks, seed=seed + 1, dtype=dtype),
             "offset": rand(n, og * taps * nsp, *out_sp, seed=seed + 2, low=-scale, high=scale, dtype=dtype)}
    names = ["X", "W", "offset"]
    if bias:
        feeds["B"] = rand(m, seed=seed + 3, dtype=dtype)
    names.append("B" if bias else "")
    if mask:
        feeds["mask"] = rand(n, og * taps, *out_sp, seed=seed + 4, low=0, high=1, dtype=dtype)
        names.append("mask")
    while names[-1] == "":
        names.pop()
    return feeds, names


@pytest.mark.parametrize("attrs,in_sp,ks,out_sp", [
    ({}, (5, 5), (3, 3), (3, 3)),
    ({"pads": [1, 1, 1, 1]}, (4, 4), (3, 3), (4, 4)),
    ({"strides": [2, 1], "pads": [1, 0, 0, 1]}, (6, 5), (2, 2), (3, 5)),
    ({"dilations": [2, 2], "kernel_shape": [2, 2]}, (5, 6), (2, 2), (3, 4)),
    ({"pads": [0, 2, 1, 0], "strides": [1, 3]}, (3, 7), (2, 3), (3, 3)),
])
@pytest.mark.parametrize("mask,bias", [(False, False), (True, True)])
def test_deform_conv_2d(attrs, in_sp, ks, out_sp, mask, bias):
    feeds, names = deform_inputs(2, 2, in_sp, 3, 2, ks, out_sp, mask=mask, bias=bias)
    m = node_model("DeformConv", feeds, attrs, opset=19, input_names=names)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group,og", [(2, 1), (1, 2), (2, 2), (1, 4)])
def test_deform_conv_groups(group, og):
    feeds, names = deform_inputs(1, 4, (4, 5), 6, 4 // group, (2, 2), (3, 4), og=og, mask=True, bias=True)
    m = node_model("DeformConv", feeds, {"group": group, "offset_group": og}, opset=22, input_names=names)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


def test_deform_conv_far_offsets_and_mask_without_bias():
    # offsets far outside the image sample zeros; mask given, B omitted
    feeds, names = deform_inputs(1, 2, (4, 4), 2, 2, (2, 2), (3, 3), mask=True, scale=6.0)
    m = node_model("DeformConv", feeds, {}, opset=22, input_names=names)
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-2)])
def test_deform_conv_dtypes(dtype, tol):
    feeds, names = deform_inputs(1, 2, (4, 4), 2, 2, (2, 2), (3, 3), mask=True, bias=True, dtype=dtype)
    m = node_model("DeformConv", feeds, {}, opset=22, input_names=names)
    assert_matches_ort(m, feeds, rtol=tol, atol=tol)


def test_deform_conv_fused_relu():
    feeds, names = deform_inputs(1, 2, (5, 5), 3, 2, (3, 3), (3, 3), bias=True)
    m = node_model("DeformConv", feeds, {}, opset=22, input_names=names, outputs=("d",))
    m.graph.node.append(helper.make_node("Relu", ["d"], ["y"]))
    m.graph.output[0].name = "y"
    assert_matches_ort(m, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_sp,ks,pads", [((6,), (3,), [1, 1]), ((4, 5, 4), (2, 3, 2), [1, 1, 1, 0, 1, 1])])
def test_deform_conv_nd_integer_offsets_equal_shifted_conv(in_sp, ks, pads):
    """onnxruntime's DeformConv is 2-D only: in 1-D and 3-D, offsets of 0 are a Conv, and
    offsets of +1 in every dim are a Conv with the begin pads one smaller, end pads one larger."""
    nsp = len(in_sp)
    x, w = rand(1, 2, *in_sp), rand(3, 2, *ks, seed=1)
    out_sp = [in_sp[d] + pads[d] + pads[d + nsp] - ks[d] + 1 for d in range(nsp)]
    conv_in = {"X": x, "W": w}
    for shift in (0, 1):
        off = np.full((1, int(np.prod(ks)) * nsp, *out_sp), shift, F32)
        feeds = {"X": x, "W": w, "offset": off}
        got = tensorfuse.compile(node_model("DeformConv", feeds, {"pads": pads}, opset=22),
                               target="llvm").run(**feeds)[0]
        cpads = [p - shift for p in pads[:nsp]] + [p + shift for p in pads[nsp:]]
        exp = ort_run(node_model("Conv", conv_in, {"pads": cpads}, opset=17), conv_in)[0]
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


def test_deform_conv_3d_kernel_matches_reference():
    feeds, names = deform_inputs(1, 2, (3, 4, 4), 2, 1, (2, 2, 2), (2, 3, 3), og=2, mask=True, bias=True)
    m = node_model("DeformConv", feeds, {"group": 2, "offset_group": 2}, opset=22, input_names=names)
    g = Graph()
    b = Builder(g)
    arrays = [feeds.get(k) for k in ("X", "W", "offset", "B", "mask")]
    b.op("DeformConv", *[b.const(a) for a in arrays], group=2, offset_group=2)
    exp = run_reference(g.nodes[-1], arrays)[0]
    for lvl in (0, 2):
        got = tensorfuse.compile(m, target="llvm", opt_level=lvl).run(**feeds)[0]
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


def test_deform_conv_reference_matches_ort():
    feeds, names = deform_inputs(1, 4, (4, 5), 4, 2, (2, 2), (3, 4), og=2, mask=True, bias=True)
    arrays = [feeds[k] for k in ("X", "W", "offset", "B", "mask")]
    g = Graph()
    b = Builder(g)
    b.op("DeformConv", *[b.const(a) for a in arrays], group=2, offset_group=2)
    got = run_reference(g.nodes[-1], arrays)[0]
    exp = ort_run(node_model("DeformConv", feeds, {"group": 2, "offset_group": 2}, opset=22), feeds)[0]
    assert got.dtype == exp.dtype and got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,off_shape,match", [
    ({}, (1, 6, 3, 3), "offset must have shape"),
    ({"offset_group": 3}, (1, 24, 3, 3), "not divisible by offset_group"),
    ({"group": 3}, (1, 8, 3, 3), "channels"),
])
def test_deform_conv_errors(attrs, off_shape, match):
    x, w = rand(1, 2, 4, 4), rand(2, 2, 2, 2)
    g = Graph()
    b = Builder(g)
    with pytest.raises(ShapeError, match=match):
        b.op("DeformConv", b.const(x), b.const(w), b.const(np.zeros(off_shape, F32)), **attrs)
