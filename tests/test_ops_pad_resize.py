"""Pad, CenterCropPad and Resize (+ Upsample) against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import compiler
from compiler.frontend.onnx import import_onnx
from compiler.errors import UnsupportedModelError
from ir.builder import Builder
from ir.graph import Graph
from ir.registry import run_reference
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
        compiler.compile(m)
    m = typed_output(node_model("Pad", {"x": rand(3, 4)}, initializers={"p": np.array([-2, 0, -2, 0], I64)}),
                     TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="crop more"):
        compiler.compile(m)
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
        got = compiler.compile(m, opt_level=lvl).run(x=x)[0]
        np.testing.assert_array_equal(got, exp)
    try:
        exp_ort = ort_run(m, {"x": x})[0]
        np.testing.assert_array_equal(got, exp_ort)
    except Exception as e:  # noqa: BLE001 (onnxruntime may lack the op)
        if "NOT_IMPLEMENTED" not in str(e) and "not implemented" not in str(e).lower():
            raise
