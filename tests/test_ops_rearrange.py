"""DepthToSpace, SpaceToDepth, Trilu, ReverseSequence against onnxruntime (onnx.reference where
onnxruntime lacks a version)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import run_reference
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64


def check(op, inputs, attrs=None, initializers=None, opset=17, input_names=None):
    m = node_model(op, inputs, attrs, opset=opset, initializers=initializers, input_names=input_names)
    return assert_matches_ort(m, inputs, rtol=0, atol=0)


def check_onnx_reference(op, inputs, attrs=None, opset=28):
    from onnx.reference import ReferenceEvaluator
    m = node_model(op, inputs, attrs, opset=opset)
    exp = ReferenceEvaluator(m).run(None, inputs)[0]
    for lvl in (0, 2):
        got = tensorfuse.compile(m, opt_level=lvl).run(**inputs)[0]
        np.testing.assert_array_equal(got, exp)


def ref_matches(op, arrays, attrs=None, opset=17):
    g = Graph()
    b = Builder(g)
    b.op(op, *[b.const(a) for a in arrays], **(attrs or {}))
    got = run_reference(g.nodes[-1], arrays)[0]
    names = [f"i{k}" for k in range(len(arrays))]
    exp = ort_run(node_model(op, dict(zip(names, arrays)), attrs, opset=opset), dict(zip(names, arrays)))[0]
    assert got.dtype == exp.dtype
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape,bs", [((1, 8, 2, 3), 2), ((2, 9, 2, 1), 3), ((1, 4, 3, 3), 1)])
def test_depth_to_space(mode, shape, bs):
    check("DepthToSpace", {"x": rand(*shape)}, {"blocksize": bs, "mode": mode}, opset=13)


@pytest.mark.parametrize("shape,bs", [((1, 2, 4, 6), 2), ((2, 1, 3, 6), 3)])
def test_space_to_depth(shape, bs):
    check("SpaceToDepth", {"x": rand(*shape)}, {"blocksize": bs}, opset=13)
    check_onnx_reference("SpaceToDepth", {"x": rand(*shape)}, {"blocksize": bs, "mode": "CRD"})
    check_onnx_reference("SpaceToDepth", {"x": rand(*shape)}, {"blocksize": bs, "mode": "DCR"})


def test_depth_space_dtypes_reference_and_errors():
    check("DepthToSpace", {"x": rand(1, 4, 2, 2, dtype=np.float64)}, {"blocksize": 2}, opset=11)
    check("DepthToSpace", {"x": rand(1, 4, 2, 2, dtype=np.uint8)}, {"blocksize": 2, "mode": "CRD"}, opset=13)
    ref_matches("DepthToSpace", [rand(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, opset=13)
    ref_matches("SpaceToDepth", [rand(1, 2, 4, 6)], {"blocksize": 2}, opset=13)
    m = node_model("DepthToSpace", {"x": rand(1, 6, 2, 2)}, {"blocksize": 2}, opset=13)
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    m.graph.output[0].type.tensor_type.shape.SetInParent()
    with pytest.raises(UnsupportedModelError, match="divisible"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 4, -5])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 3), (5, 2)])
def test_trilu(upper, k, shape):
    x = rand(*shape)
    if k is None:
        check("Trilu", {"x": x}, {"upper": upper}, opset=14)
    else:
        check("Trilu", {"x": x}, {"upper": upper}, {"k": np.array(k, I64)}, opset=14)


def test_trilu_runtime_k_dtypes_and_reference():
    x = rand(3, 4, dtype=np.int64)
    check("Trilu", {"x": x, "k": np.array(1, I64)}, {"upper": 0}, opset=14)
    check("Trilu", {"x": rand(3, 3, dtype=np.float64)}, {"upper": 1}, {"k": np.array(-1, I64)}, opset=14)
    ref_matches("Trilu", [rand(3, 4), np.array(1, I64)], {"upper": 0}, opset=14)


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
@pytest.mark.parametrize("lens", [[4, 3, 2, 1], [1, 2, 3, 4], [4, 4, 4, 4], [1, 1, 1, 1]])
def test_reverse_sequence(time_axis, batch_axis, lens):
    x = rand(4, 4, 2)
    check("ReverseSequence", {"x": x, "s": np.array(lens, I64)}, {"time_axis": time_axis, "batch_axis": batch_axis},
          opset=10)


def test_reverse_sequence_const_lens_and_reference():
    x = rand(3, 2, dtype=np.int32)
    check("ReverseSequence", {"x": x}, {"time_axis": 0, "batch_axis": 1}, {"s": np.array([3, 2], I64)}, opset=10)
    ref_matches("ReverseSequence", [rand(3, 4), np.array([2, 0, 1], I64)], {"time_axis": 1, "batch_axis": 0},
                opset=10)
