"""RoiAlign against onnxruntime (optimisations off) and onnx.reference."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import run_reference
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64


def make_rois(n, H, W, seed=0, spread=1.5):
    """Random boxes (x1, y1, x2, y2), some partly outside the image, some tiny."""
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-2, W * spread * 0.6, n)
    y1 = rng.uniform(-2, H * spread * 0.6, n)
    x2 = x1 + rng.uniform(0.2, W * 0.8, n)
    y2 = y1 + rng.uniform(0.2, H * 0.8, n)
    return np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)


def roi_model(x, rois, bi, attrs, opset=16, feed_rois=True):
    if feed_rois:
        return node_model("RoiAlign", {"x": x, "rois": rois, "bi": bi}, attrs, opset=opset)
    return node_model("RoiAlign", {"x": x}, attrs, initializers={"rois": rois, "bi": bi}, opset=opset)


def check(x, rois, bi, attrs, opset=16, feed_rois=True, rtol=1e-5, atol=1e-5, onnx_reference=True):
    m = roi_model(x, rois, bi, attrs, opset, feed_rois)
    feeds = {"x": x, "rois": rois, "bi": bi} if feed_rois else {"x": x}
    got = assert_matches_ort(m, feeds, rtol=rtol, atol=atol)
    if not onnx_reference:
        return
    exp = ReferenceEvaluator(m).run(None, feeds)[0]
    np.testing.assert_allclose(got[0], exp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coord", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 1, 2, 3])
def test_roialign_modes(mode, coord, sampling_ratio):
    x = rand(2, 3, 10, 12)
    rois = make_rois(5, 10, 12)
    bi = np.array([0, 1, 1, 0, 1], I64)
    check(x, rois, bi, {"mode": mode, "coordinate_transformation_mode": coord, "sampling_ratio": sampling_ratio,
                        "output_height": 3, "output_width": 4})


@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("out_hw", [(1, 1), (2, 5), (7, 3)])
def test_roialign_scale_and_output_size(spatial_scale, out_hw):
    x = rand(1, 2, 9, 11, seed=1)
    rois = make_rois(4, 9 / spatial_scale, 11 / spatial_scale, seed=2)
    bi = np.zeros(4, I64)
    check(x, rois, bi, {"spatial_scale": spatial_scale, "output_height": out_hw[0], "output_width": out_hw[1]})


def test_roialign_edge_boxes():
    """Boxes beyond the image (samples outside [-1, H] contribute 0), degenerate and reversed boxes."""
    x = rand(1, 2, 6, 7, seed=3)
    rois = np.array([[-5, -5, -2, -2], [5, 4, 20, 15], [3, 3, 3, 3], [4, 4, 2, 1], [0, 0, 6.9, 5.9],
                     [-0.9, -0.8, 0.4, 0.3]], np.float32)
    bi = np.zeros(len(rois), I64)
    for mode in ("avg", "max"):
        for coord in ("half_pixel", "output_half_pixel"):
            check(x, rois, bi, {"mode": mode, "coordinate_transformation_mode": coord, "output_height": 2,
                                "output_width": 3})


def test_roialign_opset10_and_constant_rois():
    """RoiAlign-10 has no coordinate_transformation_mode: it behaves as output_half_pixel (as
    onnxruntime runs it; onnx.reference applies RoiAlign-16's half_pixel default, so it is not
    the oracle here)."""
    x = rand(2, 3, 8, 8, seed=4)
    rois = make_rois(3, 8, 8, seed=5)
    bi = np.array([1, 0, 1], I64)
    for mode in ("avg", "max"):
        check(x, rois, bi, {"mode": mode, "output_height": 2, "output_width": 2, "sampling_ratio": 2}, opset=10,
              onnx_reference=False)
    check(x, rois, bi, {"output_height": 3, "output_width": 2}, feed_rois=False)


def test_roialign_f64_and_f16():
    x = rand(1, 2, 7, 8, dtype=np.float64, seed=6)
    rois = make_rois(3, 7, 8, seed=7).astype(np.float64)
    bi = np.zeros(3, I64)
    check(x, rois, bi, {"output_height": 2, "output_width": 3, "mode": "max"}, rtol=1e-10, atol=1e-10)
    # f16: onnxruntime has no kernel; compare with the f32 result
    m = roi_model(x.astype(np.float16), rois.astype(np.float16), bi, {"output_height": 2, "output_width": 3})
    got = tensorfuse.compile(m).run(x=x.astype(np.float16), rois=rois.astype(np.float16), bi=bi)[0]
    assert got.dtype == np.float16
    m32 = roi_model(x.astype(np.float32), rois.astype(np.float16).astype(np.float32), bi,
                    {"output_height": 2, "output_width": 3})
    exp = ort_run(m32, {"x": x.astype(np.float16).astype(np.float32),
                        "rois": rois.astype(np.float16).astype(np.float32), "bi": bi})[0]
    np.testing.assert_allclose(got.astype(np.float32), exp, rtol=1e-2, atol=1e-2)


def test_roialign_reference_and_errors():
    x = rand(2, 3, 6, 7, seed=8)
    rois = make_rois(4, 6, 7, seed=9)
    bi = np.array([0, 1, 0, 1], I64)
    for attrs in ({"mode": "avg", "output_height": 2, "output_width": 3},
                  {"mode": "max", "coordinate_transformation_mode": "output_half_pixel", "sampling_ratio": 2}):
        g = Graph()
        b = Builder(g)
        b.op("RoiAlign", b.const(x), b.const(rois), b.const(bi), **attrs)
        got = run_reference(g.nodes[-1], [x, rois, bi])[0]
        exp = ort_run(roi_model(x, rois, bi, attrs), {"x": x, "rois": rois, "bi": bi})[0]
        assert got.dtype == exp.dtype and got.shape == exp.shape
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)
    g = Graph()
    b = Builder(g)
    b.op("RoiAlign", b.const(x), b.const(rois), b.const(np.array([0, 2, 0, 1], I64)))
    with pytest.raises(ValueError, match="batch_indices"):
        run_reference(g.nodes[-1], [x, rois, np.array([0, 2, 0, 1], I64)])
    bad = [({"mode": "sum"}, x, rois, bi, "mode"),
           ({"coordinate_transformation_mode": "asymmetric"}, x, rois, bi, "coordinate_transformation_mode"),
           ({"output_height": 0}, x, rois, bi, "output_height"),
           ({"sampling_ratio": -1}, x, rois, bi, "sampling_ratio"),
           ({}, x[0], rois, bi, "4-D"),
           ({}, x, rois[:, :3].copy(), bi, r"\[num_rois, 4\]"),
           ({}, x, rois, bi[:3].copy(), "batch_indices")]
    for attrs, xx, rr, bb, msg in bad:
        m = roi_model(xx, rr, bb, attrs)
        o = m.graph.output[0]
        o.type.Clear()
        o.type.tensor_type.elem_type = TensorProto.FLOAT
        o.type.tensor_type.shape.SetInParent()
        with pytest.raises(UnsupportedModelError, match=msg):
            tensorfuse.compile(m)
