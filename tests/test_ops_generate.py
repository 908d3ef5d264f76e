"""Generators against onnxruntime: ConstantOfShape, Range, EyeLike."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import run_reference
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64


def one_node(op, inits, attrs=None, inputs=None, opset=21, out_type=None):
    """A model whose node reads initializers (and optional graph inputs); the output type is
    taken from shape inference or given."""
    m = node_model(op, inputs or {}, attrs, initializers=inits, opset=opset)
    return m if out_type is None else typed_output(m, out_type)


def typed_output(m, elem_type):
    """Give output 0 a type (shape unknown) when ONNX shape inference could not."""
    o = m.graph.output[0]
    if not o.type.HasField("tensor_type"):
        o.type.tensor_type.elem_type = elem_type
        o.type.tensor_type.shape.SetInParent()
    return m


def run_both(m, inputs=None, rtol=0.0, atol=0.0):
    return assert_matches_ort(m, inputs or {}, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- ConstantOfShape
@pytest.mark.parametrize("shape", [[2, 3], [4], [], [2, 0, 3], [1, 1, 5]])
@pytest.mark.parametrize("value", [None, np.array([1.5], np.float32), np.array([7], np.int64),
                                   np.array([3], np.int32), np.array([True]), np.array([2.25], np.float64),
                                   np.array([-1], np.int8), np.array([0.5], np.float16)])
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    m = one_node("ConstantOfShape", {"s": np.array(shape, I64)}, attrs, opset=21)
    run_both(m)


def test_constant_of_shape_from_runtime_shape_of_input():
    """bert's pattern: ConstantOfShape(Shape(x)) (the shape is known from x's static type)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=onnx.numpy_helper.from_array(np.array([1], I64))),
             helper.make_node("Cast", ["c"], ["c32"], to=TensorProto.FLOAT) if False else
             helper.make_node("Expand", ["x", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("c", TensorProto.INT64, [2, 3]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    run_both(m, {"x": rand(2, 3)})


def test_constant_of_shape_reference_and_errors():
    g = Graph()
    b = Builder(g)
    s = b.const(np.array([2, 2], I64))
    b.ConstantOfShape(s, value=np.array([4], np.int32))
    out = run_reference(g.nodes[-1], [np.array([2, 2], I64)])[0]
    assert out.dtype == np.int32 and (out == 4).all() and out.shape == (2, 2)
    m = one_node("ConstantOfShape", {"s": np.array([2, -1], I64)}, {}, out_type=TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="negative"):
        tensorfuse.compile(m)
    m = node_model("ConstantOfShape", {"s": np.array([2, 3], I64)})
    with pytest.raises(UnsupportedModelError, match="compile time"):
        import_onnx(m)  # compile() specialises on the input's value instead


# ----------------------------------------------------------------------------- Range
RANGES = [(0, 10, 1), (3, 9, 3), (10, 4, -2), (5, 5, 1), (5, 1, 1), (-3, 4, 2), (0, 7, 3), (1, -10, -4)]


@pytest.mark.parametrize("start,limit,delta", RANGES)
@pytest.mark.parametrize("dt", [np.int64, np.int32, np.int16])
def test_range_int(start, limit, delta, dt):
    inits = {"a": np.array(start, dt), "b": np.array(limit, dt), "c": np.array(delta, dt)}
    run_both(one_node("Range", inits, opset=21))


@pytest.mark.parametrize("start,limit,delta", [(0.0, 1.0, 0.1), (2.5, -1.0, -0.7), (0.0, 3.0, 1.0),
                                               (1.0, 1.0, 0.5), (-1.25, 100.0, 3.3)])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_range_float(start, limit, delta, dt):
    inits = {"a": np.array(start, dt), "b": np.array(limit, dt), "c": np.array(delta, dt)}
    run_both(one_node("Range", inits, opset=21), rtol=1e-6, atol=1e-6)


def test_range_long_is_computed_in_the_kernel():
    inits = {"a": np.array(0, I64), "b": np.array(10000, I64), "c": np.array(3, I64)}
    out = run_both(one_node("Range", inits, opset=21))[0]
    assert out.shape == (3334,)


def test_range_f16_stash_type():
    """Range-27 on f16 computes in f32 (stash_type=1); checked with the onnx reference."""
    from onnx.reference import ReferenceEvaluator
    inits = {"a": np.array(0, np.float16), "b": np.array(2100, np.float16), "c": np.array(1, np.float16)}
    for st in (0, 1):
        m = node_model("Range", {}, {"stash_type": st}, initializers=inits, opset=27)
        typed_output(m, TensorProto.FLOAT16)
        got = tensorfuse.compile(m, opt_level=0).run()[0]
        exp = np.arange(2100, dtype=np.float32).astype(np.float16)
        assert got.dtype == np.float16 and got.shape == (2100,)
        if st == 1:
            np.testing.assert_array_equal(got, exp)


def test_range_reference_and_errors():
    g = Graph()
    b = Builder(g)
    vals = [np.array(10, I64), np.array(4, I64), np.array(-2, I64)]
    b.Range(*[b.const(v) for v in vals])
    np.testing.assert_array_equal(run_reference(g.nodes[-1], vals)[0], [10, 8, 6])
    m = one_node("Range", {"a": np.array(0, I64), "b": np.array(4, I64), "c": np.array(0, I64)},
                 out_type=TensorProto.INT64)
    with pytest.raises(UnsupportedModelError, match="delta is 0"):
        tensorfuse.compile(m)
    m = node_model("Range", {"a": np.array(0, I64)}, initializers={"b": np.array(4, I64), "c": np.array(1, I64)})
    with pytest.raises(UnsupportedModelError, match="compile time"):
        import_onnx(m)  # compile() specialises on the input's value instead


# ----------------------------------------------------------------------------- EyeLike
@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (5, 2)])
@pytest.mark.parametrize("k", [0, 1, -1, 3, -4])
def test_eyelike(shape, k):
    run_both(node_model("EyeLike", {"x": rand(*shape)}, {"k": k}, opset=17), {"x": rand(*shape)})


@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64, TensorProto.DOUBLE, TensorProto.FLOAT,
                                   TensorProto.UINT64])
def test_eyelike_dtype(dtype):
    x = rand(3, 4, dtype=np.int32)
    run_both(node_model("EyeLike", {"x": x}, {"dtype": dtype, "k": 1}, opset=17), {"x": x})


def test_eyelike_big_and_error():
    x = rand(80, 90)
    run_both(node_model("EyeLike", {"x": x}, {"k": -2}, opset=17), {"x": x})
    m = node_model("EyeLike", {"x": rand(2, 2, 2)}, opset=17)
    m.graph.output[0].type.Clear()
    typed_output(m, TensorProto.FLOAT)
    with pytest.raises(Exception, match="2-D"):
        tensorfuse.compile(m)
