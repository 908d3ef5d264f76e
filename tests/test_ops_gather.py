"""Indexing ops against onnxruntime: Gather (+ phase-2 ops further down)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import run_reference
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
        tensorfuse.compile(m)
    m = typed_output(node_model("Gather", {"x": rand(4, 3), "i": np.array([1], I64)}, {"axis": 2}),
                     TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="axis 2"):
        tensorfuse.compile(m)


def test_gather_out_of_range_index_raises_not_a_crash():
    """ONNX calls an out-of-range index an error: run() raises ValueError (tests/test_index_checks.py)."""
    m = node_model("Gather", {"x": np.arange(4, dtype=np.float32), "i": np.array([7, -9], I64)})
    mod = tensorfuse.compile(m, opt_level=0)
    with pytest.raises(ValueError, match=r"out of range \[-4, 3\]: got 7"):
        mod.run(x=np.arange(4, dtype=np.float32), i=np.array([7, -9], I64))


# ----------------------------------------------------------------------------- GatherElements
@pytest.mark.parametrize("shape,ishape,axis", [((3, 4), (2, 4), 0), ((3, 4), (3, 6), 1), ((2, 3, 4), (2, 3, 2), -1),
                                               ((5,), (7,), 0)])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
def test_gather_elements(shape, ishape, axis, idx_dtype):
    a = axis % len(shape)
    ind = np.random.default_rng(1).integers(-shape[a], shape[a], size=ishape).astype(idx_dtype)
    check("GatherElements", {"x": rand(*shape), "i": ind}, {"axis": axis})


def test_gather_elements_dtypes_and_reference():
    ind = np.array([[1, -1], [0, 2]], I64)
    for dt in (np.int8, np.bool_, np.float16, np.float64):
        check("GatherElements", {"x": rand(2, 3, dtype=dt), "i": ind}, {"axis": 1})
    check("GatherElements", {"x": rand(3, 3), "i": ind}, {"axis": 0}, opset=11)
    ref_check("GatherElements", [rand(3, 4), np.array([[3, -4, 0]], I64)], {"axis": 1})


# ----------------------------------------------------------------------------- GatherND
@pytest.mark.parametrize("dshape,ind,b", [
    ((2, 2), [[0, 0], [1, 1]], 0),
    ((2, 2), [[1], [0]], 0),
    ((2, 2, 2), [[0, 1], [1, 0]], 0),
    ((2, 2, 2), [[[0, 1]], [[1, 0]]], 0),
    ((2, 2, 2), [[1], [0]], 1),
    ((2, 3, 4), [[[2, -1], [0, 0]], [[1, 3], [-3, 2]]], 1),
    ((3, 4), [[-1, -4]], 0),
])
def test_gather_nd(dshape, ind, b):
    check("GatherND", {"x": rand(*dshape), "i": np.array(ind, I64)}, {"batch_dims": b})


def test_gather_nd_old_version_and_reference():
    check("GatherND", {"x": rand(3, 4), "i": np.array([[2, 1], [0, 3]], I64)}, opset=11)
    ref_check("GatherND", [rand(2, 3, 4), np.array([[[2, -1]], [[1, 3]]], I64)], {"batch_dims": 1})


# ----------------------------------------------------------------------------- Scatter
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, axis):
    x = rand(3, 4)
    a = axis % 2
    rng = np.random.default_rng(3)
    ishape = (2, 4) if a == 0 else (3, 3)
    ind = rng.integers(-x.shape[a], x.shape[a], size=ishape).astype(I64)
    if reduction == "none":   # unique target per update: onnxruntime leaves duplicates unspecified
        ind = np.array([[0, 2, 1, -1], [1, 0, 2, 0]], I64) if a == 0 else np.array([[0, 3, 1], [2, 1, 0], [-1, 0, 2]], I64)
    upd = rand(*ind.shape, seed=5)
    check("ScatterElements", {"x": x, "i": ind, "u": upd}, {"axis": axis, "reduction": reduction}, opset=18)


def test_scatter_elements_int_old_versions_and_reference():
    x = rand(3, 4, dtype=np.int32, low=-5, high=5)
    ind = np.array([[1, 0, 2, 2]], I64)
    upd = rand(1, 4, dtype=np.int32, seed=2, low=-5, high=5)
    check("ScatterElements", {"x": x, "i": ind, "u": upd}, {"axis": 0}, opset=11)
    check("ScatterElements", {"x": x, "i": ind, "u": upd}, {"axis": 0, "reduction": "add"}, opset=16)
    check("Scatter", {"x": x, "i": ind, "u": upd}, {"axis": 0}, opset=9)
    ref_check("ScatterElements", [rand(3, 4), np.array([[1, -1], [0, 0]], I64), rand(2, 2, seed=1)],
              {"axis": 1, "reduction": "add"}, opset=18)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dshape,ind,ushape", [((4, 3), [[1], [3]], (2, 3)), ((2, 3, 4), [[0, 1], [1, 2]], (2, 4)),
                                               ((2, 3), [[1, 2], [0, 0], [-1, -3]], (3,)),
                                               ((2, 2, 3), [[[1]], [[0]]], (2, 1, 2, 3))])
def test_scatter_nd(reduction, dshape, ind, ushape):
    check("ScatterND", {"x": rand(*dshape), "i": np.array(ind, I64), "u": rand(*ushape, seed=4)},
          {"reduction": reduction}, opset=18)


def test_scatter_nd_old_and_reference():
    check("ScatterND", {"x": rand(4, 3), "i": np.array([[2], [0]], I64), "u": rand(2, 3, seed=1)}, opset=11)
    ref_check("ScatterND", [rand(4, 3), np.array([[2], [2]], I64), rand(2, 3, seed=1)], {"reduction": "mul"},
              opset=18)


# ----------------------------------------------------------------------------- OneHot
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("ind_dtype", [np.int64, np.float32])
def test_onehot(axis, ind_dtype):
    ind = np.array([[0, 2, -1], [5, -4, 3]]).astype(ind_dtype)
    check("OneHot", {"i": ind}, {"axis": axis},
          {"d": np.array(4, ind_dtype), "v": np.array([-1.0, 2.5], np.float32)}, opset=11)


def test_onehot_values_runtime_and_reference():
    ind = np.array([1, 0, 3], I64)
    check("OneHot", {"i": ind, "v": np.array([0, 7], np.int32)}, None, {"d": np.array([3.0], np.float32)},
          input_names=["i", "d", "v"], opset=11)
    ref_check("OneHot", [np.array([[1, -2]], I64), np.array(3, I64), np.array([2, 9], I64)], {"axis": 0}, opset=11)


# ----------------------------------------------------------------------------- Compress / NonZero
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_known_condition(axis):
    x = rand(3, 4)
    cond = np.array([True, False, True], bool) if axis == 0 else np.array([False, True, True, False], bool)
    if axis is None:
        cond = np.array([1, 0, 0, 1, 1, 0, 1], bool)
    check("Compress", {"x": x}, {} if axis is None else {"axis": axis}, {"c": cond}, opset=11)


def test_compress_runtime_condition_is_refused():
    from tensorfuse.compiler.frontend.onnx import import_onnx
    m = typed_output(node_model("Compress", {"x": rand(3, 4), "c": np.array([True, False, True])}, {"axis": 0},
                                opset=11), TensorProto.FLOAT)
    with pytest.raises(UnsupportedModelError, match="output shape depends on data"):
        import_onnx(m)


def test_nonzero_known_input_and_refusal():
    from tensorfuse.compiler.frontend.onnx import import_onnx
    c = np.array([[0, 1.5, 0], [2, 0, -1]], np.float32)
    g = Graph()
    b = Builder(g)
    b.NonZero(b.const(c))
    np.testing.assert_array_equal(run_reference(g.nodes[-1], [c])[0], np.array(np.nonzero(c)))
    m = node_model("NonZero", {}, initializers={"c": c}, opset=13)
    assert_matches_ort(m, {}, rtol=0, atol=0)
    m = typed_output(node_model("NonZero", {"x": c}, opset=13), TensorProto.INT64)
    with pytest.raises(UnsupportedModelError, match="output shape depends on data"):
        import_onnx(m)
