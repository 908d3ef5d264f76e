"""Indexing ops against onnxruntime: Gather (+ phase-2 ops further down)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler.errors import UnsupportedModelError
from ir.builder import Builder
from ir.graph import Graph
from ir.registry import run_reference
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_]


def check(op, inputs, attrs=None, initializers=None, opset=17, input_names=None, outputs=("y",)):
    m = node_model(op, inputs, attrs, opset=opset, initializers=initializers, input_names=input_names,
                   outputs=outputs)
    return assert_matches_ort(m, inputs, rtol=0, atol=0)


def typed_output(m, elem_type):
    o = m.graph.output[0]
    o.type.Clear()
    o.type.tensor_type.elem_type = elem_type
    o.type.tensor_type.shape.SetInParent()
    return m


def ref_check(op, arrays, attrs=None, opset=17):
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
        np.testing.assert_array_equal(gv, ev)


# ----------------------------------------------------------------------------- Gather
@pytest.mark.parametrize("shape,ind,axis", [
    ((5, 4), [0, 2, 4], 0),
    ((5, 4), [[0, -1], [3, -4]], 1),
    ((5, 4), 2, 0),
    ((5, 4), -1, -1),
    ((3, 4, 5), [[[1, 0]], [[2, -3]]], 1),
    ((3, 4, 5), [4, -5, 0], 2),
    ((6,), [5, 0, 5, -6], 0),
    ((3, 4), np.zeros((0,), I64), 0),
])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("const_idx", [False, True])
def test_gather(shape, ind, axis, idx_dtype, const_idx):
    x = rand(*shape)
    ind = np.asarray(ind, idx_dtype)
    if const_idx:
        check("Gather", {"x": x}, {"axis": axis}, {"i": ind})
    else:
        check("Gather", {"x": x, "i": ind}, {"axis": axis})


@pytest.mark.parametrize("dt", DTYPES)
def test_gather_dtypes(dt):
    check("Gather", {"x": rand(4, 3, dtype=dt), "i": np.array([[3, 1], [0, -2]], I64)}, {"axis": 0})


def test_gather_opset11_and_reference():
    check("Gather", {"x": rand(4, 3), "i": np.array([1, -1], I64)}, {"axis": 1}, opset=11)
    check("Gather", {"x": rand(4, 3), "i": np.array([1, 2], I64)}, {"axis": 0}, opset=7)
    ref_check("Gather", [rand(4, 3, 2), np.array([[1, -1]], I64)], {"axis": 1})
    ref_check("Gather", [rand(4, 3), np.array(-2, np.int32)], {"axis": 0})


def test_gather_errors():
    m = typed_output(node_model("Gather", {"x": rand(4, 3), "i": np.array([1.0], np.float32)}), TensorProto.FLOAT)
    with pytest.raises(Exception):
        compiler.compile(m)
    m = typed_output(node_model("Gather", {"x": rand(4, 3), "i": np.array([1], I64)}, {"axis": 2}),
                     TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="axis 2"):
        compiler.compile(m)


def test_gather_out_of_range_index_is_clamped_not_a_crash():
    """ONNX calls an out-of-range index an error; the kernel clamps it to stay in bounds."""
    m = node_model("Gather", {"x": np.arange(4, dtype=np.float32), "i": np.array([7, -9], I64)})
    out = compiler.compile(m, opt_level=0).run(x=np.arange(4, dtype=np.float32), i=np.array([7, -9], I64))[0]
    np.testing.assert_array_equal(out, [3, 0])
