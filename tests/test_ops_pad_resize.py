"""Pad, CenterCropPad and Resize (+ Upsample) against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import tensorfuse
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import run_reference
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64


def check(op, inputs, attrs=None, initializers=None, opset=19, input_names=None, rtol=0.0, atol=0.0):
    m = node_model(op, inputs, attrs, opset=opset, initializers=initializers, input_names=input_names)
    return assert_matches_ort(m, inputs, rtol=rtol, atol=atol)


def typed_output(m, elem_type):
    o = m.graph.output[0]
    o.type.Clear()
    o.type.tensor_type.elem_type = elem_type
    o.type.tensor_type.shape.SetInParent()
    return m


def ref_check(op, arrays, attrs=None, opset=19, rtol=0.0, atol=0.0):
    """The numpy reference (constant folding's meaning) against onnxruntime."""
    g = Graph()
    b = Builder(g)
    b.op(op, *[None if a is None else b.const(a) for a in arrays], **(attrs or {}))
    got = run_reference(g.nodes[-1], arrays)
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
    feeds = {n: a for n, a in zip(names, arrays) if n}
    exp = ort_run(node_model(op, feeds, attrs, input_names=names, opset=opset), feeds)
    for gv, ev in zip(got, exp):
        assert gv.dtype == ev.dtype and gv.shape == ev.shape
        np.testing.assert_allclose(gv, ev, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- Pad
PADS_2D = [[0, 0, 0, 0], [1, 2, 0, 1], [0, 1, 2, 0], [2, 2, 2, 2], [-1, 0, 1, -2], [1, -1, -1, 2],
           [0, -2, 0, 0]]


@pytest.mark.parametrize("pads", PADS_2D)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_2d(pads, mode):
    x = rand(4, 5)
    check("Pad", {"x": x}, {"mode": mode}, {"p": np.array(pads, I64)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_4d_nchw(mode):
    x = rand(1, 2, 4, 5)
    check("Pad", {"x": x}, {"mode": mode}, {"p": np.array([0, 0, 1, 2, 0, 0, 3, 1], I64)})


def test_pad_constant_value_const_and_runtime():
    x = rand(3, 4)
    check("Pad", {"x": x}, None, {"p": np.array([1, 1, 1, 1], I64), "v": np.array(2.5, np.float32)})
    check("Pad", {"x": x, "v": np.array(-3.0, np.float32)}, None, {"p": np.array([1, 0, 2, 1], I64)},
          input_names=["x", "p", "v"])


@pytest.mark.parametrize("axes", [[1], [-1], [0], [2, 0]])
def test_pad_axes_input(axes):
    x = rand(3, 4, 5)
    n = len(axes)
    pads = np.array(list(range(1, n + 1)) + list(range(n, 0, -1)), I64)
    check("Pad", {"x": x}, {"mode": "reflect"}, {"p": pads, "v": np.array(0, np.float32),
                                                 "a": np.array(axes, I64)}, opset=18)
    check("Pad", {"x": x}, None, {"p": pads, "a": np.array(axes, I64)}, opset=18,
          input_names=["x", "p", "", "a"])


@pytest.mark.parametrize("dt", [np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_])
def test_pad_dtypes(dt):
    x = rand(3, 4, dtype=dt)
    check("Pad", {"x": x}, {"mode": "edge"}, {"p": np.array([1, 0, 0, 2], I64)})
    if dt != np.bool_:
        check("Pad", {"x": x}, None, {"p": np.array([1, 0, 0, 2], I64), "v": np.array(3).astype(dt)})


def test_pad_old_versions():
    x = rand(3, 4)
    check("Pad", {"x": x}, {"pads": [1, 0, 2, 1], "value": 1.5}, opset=7)
    check("Pad", {"x": x}, {"pads": [1, 2, 1, 2], "mode": "reflect"}, opset=10)
    check("Pad", {"x": rand(3, 4, dtype=np.float64)}, {"pads": [0, 1, 0, 1], "mode": "edge"}, opset=10)
    check("Pad", {"x": x}, {"mode": "edge"}, {"p": np.array([2, 0, 0, 1], I64)}, opset=11)
    check("Pad", {"x": x}, {"mode": "constant"}, {"p": np.array([2, 0, 0, 1], I64)}, opset=13)


def test_pad_1d_and_empty():
    check("Pad", {"x": rand(5)}, {"mode": "reflect"}, {"p": np.array([4, 4], I64)})
    check("Pad", {"x": rand(0, 3)}, None, {"p": np.array([1, 0, 1, 0], I64), "v": np.array(7, np.float32)})
    check("Pad", {"x": rand(3, 2)}, None, {"p": np.array([0, -1, 0, -1], I64)})


def test_pad_reference_and_errors():
    ref_check("Pad", [rand(3, 4), np.array([1, -1, 2, 1], I64), np.array(1.0, np.float32)])
    ref_check("Pad", [rand(3, 4), np.array([2, 0, 1, 3], I64)], {"mode": "reflect"})
    ref_check("Pad", [rand(3, 4), np.array([2, 3, 1, 3], I64)], {"mode": "wrap"})
    m = typed_output(node_model("Pad", {"x": rand(3, 4)}, initializers={"p": np.array([1, 1, 1], I64)}),
                     TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="pads has 3"):
        tensorfuse.compile(m)
    m = typed_output(node_model("Pad", {"x": rand(3, 4)}, initializers={"p": np.array([-2, 0, -2, 0], I64)}),
                     TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="crop more"):
        tensorfuse.compile(m)
    m = node_model("Pad", {"x": rand(3, 4), "p": np.array([1, 1, 1, 1], I64)})
    with pytest.raises(UnsupportedModelError, match="compile time"):
        import_onnx(m)  # compile() specialises on the input's value instead


# ----------------------------------------------------------------------------- CenterCropPad
@pytest.mark.parametrize("shape,target,axes", [((5, 6), [3, 8], None), ((5, 6), [4, 3], None),
                                               ((2, 5, 6), [7], [1]), ((2, 5, 6), [3, 1], [-1, 0]),
                                               ((4, 4), [4, 4], None)])
def test_center_crop_pad(shape, target, axes):
    from onnx.reference import ReferenceEvaluator
    x = rand(*shape)
    attrs = {} if axes is None else {"axes": axes}
    m = node_model("CenterCropPad", {"x": x}, attrs, initializers={"s": np.array(target, I64)}, opset=18)
    exp = ReferenceEvaluator(m).run(None, {"x": x})[0]
    for lvl in (0, 2):
        got = tensorfuse.compile(m, opt_level=lvl).run(x=x)[0]
        np.testing.assert_array_equal(got, exp)
    try:
        exp_ort = ort_run(m, {"x": x})[0]
        np.testing.assert_array_equal(got, exp_ort)
    except Exception as e:  # noqa: BLE001 (onnxruntime may lack the op)
        if "NOT_IMPLEMENTED" not in str(e) and "not implemented" not in str(e).lower():
            raise


# ----------------------------------------------------------------------------- Resize
def resize_model(x, attrs, scales=None, sizes=None, roi=None, opset=19, roi_dtype=np.float32):
    inits, names = {}, ["x"]
    names.append("roi" if roi is not None else "")
    if roi is not None:
        inits["roi"] = np.array(roi, roi_dtype)
    if scales is not None:
        inits["sc"] = np.array(scales, np.float32)
        names.append("sc")
    if sizes is not None:
        if scales is None:
            names.append("")
        inits["sz"] = np.array(sizes, I64)
        names.append("sz")
    while names[-1] == "":
        names.pop()
    return node_model("Resize", {"x": x}, attrs, initializers=inits, input_names=names, opset=opset)


def check_resize(x, attrs, scales=None, sizes=None, roi=None, opset=19, **kw):
    exact = attrs.get("mode", "nearest") == "nearest"
    m = resize_model(x, attrs, scales, sizes, roi, opset, **kw)
    return assert_matches_ort(m, {"x": x}, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)


def check_resize_onnx_reference(x, attrs, scales=None, sizes=None, roi=None, opset=19):
    """For configurations onnxruntime does not run (its linear/cubic kernels take only some ranks)."""
    from onnx.reference import ReferenceEvaluator
    m = resize_model(x, attrs, scales, sizes, roi, opset)
    exp = ReferenceEvaluator(m).run(None, {"x": x})[0]
    for lvl in (0, 2):
        got = tensorfuse.compile(m, opt_level=lvl).run(x=x)[0]
        assert got.shape == exp.shape and got.dtype == exp.dtype
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.7], [1, 1, 1.7, 0.8], [1, 2, 1, 1]])
def test_resize_nearest_scales(coord, nearest_mode, scales):
    x = rand(1, 2, 4, 6)
    check_resize(x, {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest_mode},
                 scales=scales)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("sizes", [[1, 2, 9, 13], [1, 2, 3, 5], [1, 2, 1, 1]])
def test_resize_nearest_sizes(coord, nearest_mode, sizes):
    x = rand(1, 2, 4, 6)
    check_resize(x, {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest_mode},
                 sizes=sizes)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("scales,sizes", [([1, 1, 2, 3], None), ([1, 1, 0.5, 0.6], None), ([1, 1, 1.7, 0.8], None),
                                          (None, [1, 2, 9, 13]), (None, [1, 2, 3, 4]), (None, [1, 2, 1, 1])])
def test_resize_linear_cubic_4d(mode, coord, scales, sizes):
    x = rand(1, 2, 5, 7)
    check_resize(x, {"mode": mode, "coordinate_transformation_mode": coord}, scales=scales, sizes=sizes)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("shape,sizes", [((5, 7), [8, 3]), ((4, 6), [4, 12])])
def test_resize_2d(mode, shape, sizes):
    check_resize(rand(*shape), {"mode": mode}, sizes=sizes)


@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
@pytest.mark.parametrize("shape,scales", [((3, 4, 5), [2, 0.5, 1.5]), ((1, 1, 3, 4, 5), [1, 1, 2, 0.5, 1.5])])
def test_resize_trilinear(coord, shape, scales):
    check_resize(rand(*shape), {"mode": "linear", "coordinate_transformation_mode": coord}, scales=scales)


@pytest.mark.parametrize("a", [-0.5, -0.75])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", [[1, 1, 2, 1.5], [1, 1, 0.6, 0.8]])
def test_resize_cubic_attrs(a, exclude_outside, scales):
    check_resize(rand(1, 1, 5, 6), {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude_outside},
                 scales=scales)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("roi", [[0, 0, 0.2, 0.1, 1, 1, 0.8, 0.7], [0, 0, -0.3, 0.4, 1, 1, 1.2, 1.5]])
@pytest.mark.parametrize("extrapolation", [0.0, -7.5])
def test_resize_tf_crop_and_resize(mode, roi, extrapolation):
    x = rand(1, 2, 5, 6)
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": extrapolation}
    check_resize(x, attrs, sizes=[1, 2, 7, 4], roi=roi)
    check_resize(x, attrs, scales=[1, 1, 1.4, 0.5], roi=roi)


def test_resize_tf_crop_and_resize_single_output_and_f64_roi():
    x = rand(1, 1, 5, 6)
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}
    check_resize(x, attrs, sizes=[1, 1, 1, 3], roi=[0, 0, 0.2, 0.1, 1, 1, 0.8, 0.7])
    check_resize(x, attrs, sizes=[1, 1, 3, 3], roi=[0, 0, 0.2, 0.1, 1, 1, 0.8, 0.7])


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("sizes", [[7, 9], [3, 10], [5, 2]])
def test_resize_keep_aspect_ratio(policy, mode, sizes):
    x = rand(1, 1, 4, 6)
    check_resize(x, {"mode": mode, "keep_aspect_ratio_policy": policy, "axes": [2, 3]}, sizes=sizes)


@pytest.mark.parametrize("axes,scales", [([2, 3], [2.0, 0.5]), ([3, 2], [1.5, 2.0]), ([-1], [2.5]), ([-2, -1], [0.5, 3])])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes(axes, scales, mode):
    check_resize(rand(1, 2, 4, 6), {"mode": mode, "axes": axes}, scales=scales)


def test_resize_axes_sizes_and_roi():
    x = rand(1, 2, 4, 6)
    check_resize(x, {"mode": "linear", "axes": [3, 2]}, sizes=[9, 3])
    check_resize(x, {"mode": "nearest", "axes": [2, 3], "coordinate_transformation_mode": "tf_crop_and_resize"},
                 sizes=[5, 5], roi=[0.1, 0.2, 0.9, 1.1])


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int32])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_int_dtypes(dt, mode):
    x = rand(1, 1, 4, 5, dtype=dt, low=-100 if dt != np.uint8 else 0, high=100)
    check_resize(x, {"mode": mode}, scales=[1, 1, 2, 1.5])


def test_resize_other_dtypes_against_reference():
    """f64 / f16 / bool data: onnxruntime lacks these kernels, the numpy reference is the oracle
    (itself checked against onnxruntime on float32 below)."""
    g = Graph()
    b = Builder(g)
    for dt in (np.float64, np.float16, np.int64):
        x = rand(1, 1, 3, 4, dtype=dt)
        m = resize_model(x, {"mode": "nearest"}, scales=[1, 1, 2, 2])
        exp = np.repeat(np.repeat(x, 2, axis=2), 2, axis=3)
        for lvl in (0, 2):
            np.testing.assert_array_equal(tensorfuse.compile(m, opt_level=lvl).run(x=x)[0], exp)
    x = rand(2, 5, dtype=np.float64)
    m = resize_model(x, {"mode": "linear"}, sizes=[4, 3])
    exp = ort_run(resize_model(x.astype(np.float32), {"mode": "linear"}, sizes=[4, 3]), {"x": x.astype(np.float32)})[0]
    got = tensorfuse.compile(m).run(x=x)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)


def test_resize_n_d_against_onnx_reference():
    check_resize_onnx_reference(rand(7), {"mode": "linear"}, scales=[1.6])
    check_resize_onnx_reference(rand(3, 4, 5), {"mode": "cubic"}, scales=[2, 0.5, 1.5])
    check_resize_onnx_reference(rand(2, 3, 4, 5), {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
                                sizes=[3, 5, 2, 7])


def test_resize_old_versions():
    x = rand(1, 1, 3, 4)
    # Resize-10: (X, scales), asymmetric
    for mode in ("nearest", "linear"):
        m = node_model("Resize", {"x": x}, {"mode": mode}, initializers={"s": np.array([1, 1, 2, 1.5], np.float32)},
                       opset=10)
        assert_matches_ort(m, {"x": x}, rtol=1e-5, atol=1e-6)
    m = node_model("Resize", {"x": x}, {"mode": "nearest"}, initializers={"s": np.array([1, 1, 0.5, 0.5], np.float32)},
                   opset=10)
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0)
    # Resize-11: roi and scales required (empty when sizes are given), tf_half_pixel_for_nn
    for coord in ("tf_half_pixel_for_nn", "half_pixel", "align_corners"):
        m = node_model("Resize", {"x": x}, {"mode": "nearest", "coordinate_transformation_mode": coord},
                       initializers={"r": np.zeros(0, np.float32), "s": np.zeros(0, np.float32),
                                     "z": np.array([1, 1, 5, 7], I64)}, opset=11)
        assert_matches_ort(m, {"x": x}, rtol=0, atol=0)
    check_resize(x, {"mode": "cubic"}, scales=[1, 1, 2, 2], opset=13)
    check_resize(x, {"mode": "linear"}, sizes=[1, 1, 5, 3], opset=13)


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(opset, mode):
    x = rand(1, 2, 3, 4)
    if opset == 7:
        m = node_model("Upsample", {"x": x}, {"mode": mode, "scales": [1.0, 1.0, 2.0, 3.0]}, opset=7)
    else:
        m = node_model("Upsample", {"x": x}, {"mode": mode}, initializers={"s": np.array([1, 1, 2, 1.5], np.float32)},
                       opset=9)
    assert_matches_ort(m, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales,sizes", [([1, 1, 0.6, 0.6], None), ([1, 1, 0.3, 0.45], None), ([1, 1, 0.5, 2.0], None),
                                          (None, [1, 2, 3, 3]), (None, [1, 2, 4, 2]), (None, [1, 2, 1, 1])])
def test_resize_antialias(mode, scales, sizes):
    """antialias=1: downsampled axes use the filter stretched by 1/scale (upsampled axes are plain)."""
    check_resize(rand(1, 2, 8, 9), {"mode": mode, "antialias": 1}, scales=scales, sizes=sizes, opset=18)


@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_coords(coord, mode):
    check_resize(rand(1, 1, 9, 7), {"mode": mode, "antialias": 1, "coordinate_transformation_mode": coord},
                 scales=[1, 1, 0.4, 0.7])


@pytest.mark.parametrize("a", [-0.5, -0.75])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_antialias_cubic_attrs(a, exclude_outside):
    check_resize(rand(1, 1, 10, 6), {"mode": "cubic", "antialias": 1, "cubic_coeff_a": a,
                                     "exclude_outside": exclude_outside}, scales=[1, 1, 0.35, 0.5])


@pytest.mark.parametrize("dt", [np.uint8, np.int32])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_int_dtypes(dt, mode):
    """Antialiased integers are rounded (onnx.reference); onnxruntime's fixed-point path rounds after
    each axis, so it may differ by 1."""
    x = rand(1, 1, 9, 10, dtype=dt, low=0, high=200)
    check_resize_onnx_reference(x, {"mode": mode, "antialias": 1}, scales=[1, 1, 0.5, 0.4])
    m = resize_model(x, {"mode": mode, "antialias": 1}, [1, 1, 0.5, 0.4], None, None, 19)
    got = tensorfuse.compile(m).run(x=x)[0]
    exp = ort_run(m, {"x": x})[0]
    assert got.dtype == exp.dtype and got.shape == exp.shape
    assert np.abs(got.astype(np.int64) - exp.astype(np.int64)).max() <= 1


def test_resize_antialias_crop_and_symmetric():
    x = rand(1, 1, 9, 10)
    for fn in (check_resize, check_resize_onnx_reference):
        fn(x, {"mode": "linear", "antialias": 1, "coordinate_transformation_mode": "tf_crop_and_resize",
               "extrapolation_value": 3.0}, sizes=[1, 1, 3, 4], roi=[0, 0, 0.1, -0.2, 1, 1, 0.9, 1.1])
        fn(x, {"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "half_pixel_symmetric"},
           sizes=[1, 1, 4, 3])


def test_resize_antialias_axes_and_reference():
    check_resize(rand(2, 3, 12), {"mode": "linear", "antialias": 1, "axes": [2]}, sizes=[5])
    check_resize(rand(1, 2, 12, 5), {"mode": "cubic", "antialias": 1, "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"},
                 sizes=[3, 4])
    check_resize_onnx_reference(rand(3, 11, 7), {"mode": "linear", "antialias": 1}, scales=[1, 0.3, 0.6])
    check_resize_onnx_reference(rand(11), {"mode": "cubic", "antialias": 1}, sizes=[4])
    # a strong downscale: many taps per output (serial tap loops, not unrolled)
    check_resize(rand(1, 1, 40, 33), {"mode": "cubic", "antialias": 1}, sizes=[1, 1, 3, 2])
    ref_check("Resize", [rand(1, 1, 7, 9), None, np.array([1, 1, 0.4, 0.6], np.float32)],
              {"mode": "linear", "antialias": 1}, rtol=1e-5, atol=1e-6)
    ref_check("Resize", [rand(1, 1, 7, 9), None, None, np.array([1, 1, 3, 4], I64)],
              {"mode": "cubic", "antialias": 1, "exclude_outside": 1}, rtol=1e-5, atol=1e-6)


def test_resize_reference_and_errors():
    ref_check("Resize", [rand(1, 1, 4, 5), None, np.array([1, 1, 1.5, 0.6], np.float32)], {"mode": "linear"},
              rtol=1e-5, atol=1e-6)
    ref_check("Resize", [rand(1, 1, 4, 5), None, None, np.array([1, 1, 7, 3], I64)],
              {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, rtol=1e-5, atol=1e-6)
    ref_check("Resize", [rand(1, 1, 4, 5), np.array([0, 0, 0.1, 0.2, 1, 1, 0.7, 1.3], np.float32), None,
                         np.array([1, 1, 3, 6], I64)],
              {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 2.0})
    x = rand(1, 1, 4, 5)
    bad = [({"mode": "nearest", "antialias": 1}, [1, 1, 0.5, 0.5], None, "antialias"),
           ({"mode": "area"}, [1, 1, 2, 2], None, "mode"),
           ({"mode": "nearest"}, [1, 1, 2], None, "scales has 3"),
           ({"mode": "nearest"}, [1, 1, 2, 2], [1, 1, 8, 10], "exactly one"),
           ({"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 2, 2], None, "roi")]
    for attrs, scales, sizes, msg in bad:
        m = typed_output(resize_model(x, attrs, scales=scales, sizes=sizes), TensorProto.FLOAT)
        with pytest.raises(UnsupportedModelError, match=msg):
            tensorfuse.compile(m)
