"""Unique, Col2Im and TensorScatter against onnxruntime (optimisations off), or
onnx.reference where onnxruntime lacks a dtype."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.compiler.specialize import SpecializingModule
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, run_reference
from tensorfuse.ir.types import DType, TensorType
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64
UNIQUE_OUTS = ("y", "indices", "inverse", "counts")


def ref_check(op, arrays, attrs=None, opset=17, outputs=("y",)):
    """The numpy reference (constant folding's meaning) against onnxruntime."""
    g = Graph()
    b = Builder(g)
    b.op(op, *[None if a is None else b.const(a) for a in arrays], num_outputs=len(outputs), **(attrs or {}))
    got = run_reference(g.nodes[-1], arrays)
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
    feeds = {n: a for n, a in zip(names, arrays) if n}
    exp = ort_run(node_model(op, feeds, attrs, input_names=names, opset=opset, outputs=outputs), feeds)
    assert len(exp) == len(outputs)
    for gv, ev in zip(got, exp):
        assert gv.dtype == ev.dtype and gv.shape == ev.shape
        np.testing.assert_array_equal(gv, ev)


def check_with_reference_evaluator(model, feeds, rtol=0.0, atol=0.0):
    """onnx.reference as the oracle (onnxruntime lacks the op's dtype)."""
    exp = ReferenceEvaluator(model).run(None, feeds)
    for lvl in (0, 2):
        got = tensorfuse.compile(model, target="llvm", opt_level=lvl).run(**feeds)
        for g, e in zip(got, exp):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- Unique
UNIQUE_X = {
    "1d": np.array([2, 1, 1, 3, 4, 3, -5, 0, 2], np.float32),
    "2d": np.array([[1, 3, 1], [2, 3, 0], [1, 3, 1], [1, 3, 1]], np.float32),
    "3d": np.array([[[1, 1], [0, 1], [2, 1], [0, 1]], [[1, 1], [0, 1], [2, 1], [0, 1]]], np.float32),
    "one": np.array([7.5], np.float32),
}


@pytest.mark.parametrize("name,axis", [("1d", None), ("1d", 0), ("2d", None), ("2d", 0), ("2d", 1),
                                       ("2d", -1), ("3d", None), ("3d", 1), ("3d", -3), ("3d", 2), ("one", None)])
@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_all_outputs(name, axis, sorted_):
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    x = UNIQUE_X[name]
    assert_matches_ort(node_model("Unique", {"x": x}, attrs, opset=11, outputs=UNIQUE_OUTS), {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("outputs", [("y",), ("y", "indices"), ("y", "indices", "inverse")])
def test_unique_fewer_outputs(outputs):
    x = rand(4, 5, dtype=np.int64, low=-3, high=3)
    assert_matches_ort(node_model("Unique", {"x": x}, {"sorted": 0}, opset=11, outputs=outputs), {"x": x},
                       rtol=0, atol=0)


def test_unique_skipped_middle_outputs():
    x = rand(6, dtype=np.int64, low=0, high=3)
    m = node_model("Unique", {"x": x}, {}, opset=11, outputs=("y", "", "", "counts"))
    del m.graph.output[1:3]
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("dt", [np.float64, np.int64, np.int8, np.float16])
def test_unique_dtypes(dt):
    x = rand(3, 4, dtype=dt, low=-2, high=2, seed=1)
    if np.issubdtype(dt, np.floating):
        x = np.round(x)          # repeats
    assert_matches_ort(node_model("Unique", {"x": x}, {"axis": 1}, opset=11, outputs=UNIQUE_OUTS), {"x": x},
                       rtol=0, atol=0)


@pytest.mark.parametrize("dt", [np.int32, np.uint8, np.bool_])
def test_unique_dtypes_reference_evaluator(dt):
    x = rand(5, 4, dtype=dt, low=0, high=2, seed=2)
    check_with_reference_evaluator(node_model("Unique", {"x": x}, {}, opset=11, outputs=UNIQUE_OUTS), {"x": x})


def test_unique_constant_input_and_specialisation():
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.float32)
    m = node_model("Unique", {}, {"axis": 0}, opset=11, initializers={"x": x}, outputs=UNIQUE_OUTS)
    assert_matches_ort(m, {}, rtol=0, atol=0)
    mod = tensorfuse.compile(node_model("Unique", {"x": x}, {}, opset=11, outputs=UNIQUE_OUTS), target="llvm")
    assert isinstance(mod, SpecializingModule)
    y, idx, inv, cnt = mod.run(x=x)
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(cnt, [4, 2, 1, 1, 1])
    y2 = mod.run(x=x + 1)[0]            # new values: a new specialisation
    np.testing.assert_array_equal(y2, [1, 2, 3, 4, 5])


def test_unique_reference_matches_ort():
    ref_check("Unique", [np.array([[1, 3, 1], [2, 3, 0], [1, 3, 1]], np.float32)], {"axis": 0, "sorted": 0},
              opset=11, outputs=UNIQUE_OUTS)
    ref_check("Unique", [rand(5, 4, dtype=np.int64, low=0, high=4)], {}, opset=11, outputs=UNIQUE_OUTS)


def test_unique_runtime_data_is_refused():
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorType(DType.f32, (4,)))
    r = b.op("Relu", x)
    with pytest.raises(ShapeError, match="output shape depends on data") as e:
        b.op("Unique", r)
    assert e.value.needs_value == r.name
    # computed at run time from a tensor too large to be known at compile time
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unique", ["r"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5000])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedModelError, match="output shape depends on data"):
        tensorfuse.compile(m, target="llvm").run(x=rand(5000))


def test_unique_bad_axis():
    g = Graph()
    b = Builder(g)
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        b.op("Unique", b.const(np.zeros((2, 2), np.float32)), axis=2)


# ----------------------------------------------------------------------------- Col2Im
def col2im_model(x, image, block, attrs=None, as_inputs=False):
    shapes = {"image_shape": np.asarray(image, I64), "block_shape": np.asarray(block, I64)}
    if as_inputs:
        return node_model("Col2Im", {"x": x, **shapes}, attrs, opset=18), {"x": x, **shapes}
    return node_model("Col2Im", {"x": x}, attrs, opset=18, initializers=shapes), {"x": x}


@pytest.mark.parametrize("n,c,image,block,attrs", [
    (1, 1, [5, 5], [1, 5], {}),
    (2, 3, [4, 5], [2, 2], {}),
    (1, 2, [5, 5], [2, 2], {"strides": [2, 2]}),
    (1, 1, [4, 4], [3, 3], {"pads": [1, 1, 1, 1]}),
    (1, 2, [6, 6], [2, 2], {"dilations": [2, 3]}),
    (2, 1, [5, 7], [2, 3], {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [1, 2]}),
    (1, 2, [3, 4, 5], [1, 1, 5], {}),
    (1, 1, [4, 3, 4], [2, 2, 2], {"strides": [1, 2, 1], "pads": [1, 0, 1, 0, 1, 0]}),
    (1, 2, [7], [3], {"strides": [2], "pads": [1, 1]}),
])
def test_col2im(n, c, image, block, attrs):
    nsp = len(image)
    st = attrs.get("strides", [1] * nsp)
    dl = attrs.get("dilations", [1] * nsp)
    pd = attrs.get("pads", [0] * 2 * nsp)
    nb = [(image[d] + pd[d] + pd[d + nsp] - dl[d] * (block[d] - 1) - 1) // st[d] + 1 for d in range(nsp)]
    x = rand(n, c * int(np.prod(block)), int(np.prod(nb)))
    m, feeds = col2im_model(x, image, block, attrs)
    assert_matches_ort(m, feeds, rtol=1e-6, atol=1e-6)


def test_col2im_shape_inputs_are_specialised():
    x = rand(1, 4, 16)
    m, feeds = col2im_model(x, [5, 5], [2, 2], as_inputs=True)
    assert isinstance(tensorfuse.compile(m, target="llvm"), SpecializingModule)
    assert_matches_ort(m, feeds, rtol=1e-6, atol=1e-6)


def test_col2im_float16():
    m, feeds = col2im_model(rand(1, 8, 9, dtype=np.float16), [4, 4], [2, 2])
    assert_matches_ort(m, feeds, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dt", [np.float64, np.int64, np.int32, np.uint8])
def test_col2im_dtypes_reference_evaluator(dt):
    m, feeds = col2im_model(rand(2, 4, 9, dtype=dt, low=0, high=9), [4, 5], [2, 2], {"strides": [1, 2], "pads": [0, 1, 0, 1]})
    check_with_reference_evaluator(m, feeds)


def test_col2im_reference_matches_ort():
    ref_check("Col2Im", [rand(1, 8, 9), np.array([4, 5], I64), np.array([2, 2], I64)],
              {"strides": [1, 2], "pads": [0, 1, 0, 1]}, opset=18)


@pytest.mark.parametrize("shape,image,block,match", [
    ((1, 5, 16), [5, 5], [2, 2], "not divisible"),
    ((1, 4, 15), [5, 5], [2, 2], "number of blocks"),
    ((1, 4, 16), [5, 5], [2], "equal length"),
    ((1, 4, 16), [1, 5], [2, 2], "does not fit"),
])
def test_col2im_errors(shape, image, block, match):
    g = Graph()
    b = Builder(g)
    with pytest.raises(ShapeError, match=match):
        b.op("Col2Im", b.const(np.zeros(shape, np.float32)), b.const(np.array(image, I64)),
             b.const(np.array(block, I64)))


# ----------------------------------------------------------------------------- TensorScatter
@pytest.mark.parametrize("past,upd,attrs,wi", [
    ((2, 6, 3), (2, 2, 3), {}, [0, 4]),
    ((2, 6, 3), (2, 6, 3), {}, [0, 0]),
    ((2, 1, 5, 4), (2, 1, 3, 4), {}, [2, 1]),
    ((2, 1, 4, 5), (2, 1, 2, 5), {"mode": "circular"}, [1, 3]),
    ((3, 4, 2), (3, 3, 2), {"mode": "circular"}, [3, 0, 5]),
    ((2, 3, 4, 5), (2, 3, 4, 2), {"axis": -1}, [3, 0]),
    ((2, 3, 4, 5), (2, 1, 4, 5), {"axis": 1, "mode": "circular"}, [2, 7]),
    ((2, 5), (2, 2), {"axis": 1}, [1, 3]),
    ((2, 6, 3), (2, 2, 3), {}, None),
    ((2, 6, 3), (2, 0, 3), {}, [1, 1]),
])
def test_tensorscatter(past, upd, attrs, wi):
    feeds = {"past": rand(*past), "update": rand(*upd, seed=1)}
    if wi is not None:
        feeds["wi"] = np.array(wi, I64)
    assert_matches_ort(node_model("TensorScatter", feeds, attrs, opset=24), feeds, rtol=0, atol=0)


@pytest.mark.parametrize("dt", [np.float16, np.float64, np.int64, np.int8, np.bool_])
def test_tensorscatter_dtypes(dt):
    feeds = {"past": rand(2, 4, 3, dtype=dt), "update": rand(2, 2, 3, dtype=dt, seed=1), "wi": np.array([1, 3], I64)}
    assert_matches_ort(node_model("TensorScatter", feeds, {"mode": "circular"}, opset=24), feeds, rtol=0, atol=0)


def test_tensorscatter_linear_out_of_range_rows_are_skipped():
    # ONNX makes this an error; the kernel stays in bounds and writes the rows that fit
    past, upd = rand(1, 4, 2), rand(1, 3, 2, seed=1)
    feeds = {"past": past, "update": upd, "wi": np.array([2], I64)}
    got = tensorfuse.compile(node_model("TensorScatter", feeds, {}, opset=24), target="llvm").run(**feeds)[0]
    exp = past.copy()
    exp[0, 2:] = upd[0, :2]
    np.testing.assert_array_equal(got, exp)


def test_tensorscatter_reference_matches_ort():
    ref_check("TensorScatter", [rand(2, 1, 4, 5), rand(2, 1, 2, 5, seed=1), np.array([1, 3], I64)],
              {"mode": "circular"}, opset=24)
    ref_check("TensorScatter", [rand(2, 5, 3), rand(2, 2, 3, seed=1), None], {}, opset=24)


@pytest.mark.parametrize("past,upd,attrs,match", [
    ((2, 4, 3), (2, 5, 3), {}, "may not be longer"),
    ((2, 4, 3), (2, 2, 4), {}, "must match"),
    ((2, 4, 3), (2, 4, 3), {"axis": 0}, "must not be 0"),
    ((2, 4, 3), (2, 2, 3), {"mode": "ring"}, "mode must be"),
])
def test_tensorscatter_errors(past, upd, attrs, match):
    g = Graph()
    b = Builder(g)
    with pytest.raises(ShapeError, match=match):
        b.op("TensorScatter", b.const(np.zeros(past, np.float32)), b.const(np.zeros(upd, np.float32)), **attrs)


# ----------------------------------------------------------------------------- ai.onnx.ml
def ml_model(op, inputs, attrs=None, initializers=None, out_type=TensorProto.FLOAT, out_shape=None):
    """A one-node ai.onnx.ml model (with a default-domain import too, as converters write)."""
    from oracle import np_to_onnx_type
    import onnx
    initializers = initializers or {}
    node = helper.make_node(op, list(inputs) + list(initializers), ["z"], domain="ai.onnx.ml", **(attrs or {}))
    g_in = [helper.make_tensor_value_info(k, np_to_onnx_type(v.dtype), v.shape) for k, v in inputs.items()]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()]
    g = helper.make_graph([node], "ml", g_in, [helper.make_tensor_value_info("z", out_type, out_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("dt,threshold", [(np.float32, 1.0), (np.float32, 0.0), (np.float64, -0.25),
                                          (np.int64, 0.5), (np.int32, -1.0)])
def test_binarizer(dt, threshold):
    x = rand(3, 4, 5, dtype=dt, low=-3, high=3)
    m = ml_model("Binarizer", {"x": x}, {"threshold": threshold}, out_type=helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                 out_shape=x.shape)
    if dt == np.float32:
        assert_matches_ort(m, {"x": x}, rtol=0, atol=0)
    else:                  # onnxruntime implements Binarizer for float only
        check_with_reference_evaluator(m, {"x": x})


def test_binarizer_default_threshold_and_reference():
    x = np.array([-1.0, 0.0, 1e-7, 2.0], np.float32)
    m = ml_model("Binarizer", {"x": x}, out_shape=x.shape)
    np.testing.assert_array_equal(assert_matches_ort(m, {"x": x}, rtol=0, atol=0)[0], [0, 0, 1, 1])
    g = Graph()
    b = Builder(g)
    b.op("Binarizer", b.const(x), domain="ai.onnx.ml", threshold=0.5)
    np.testing.assert_array_equal(run_reference(g.nodes[-1], [x])[0], [0, 0, 0, 1])


@pytest.mark.parametrize("shape,ind,dt", [
    ((3, 4), [0, 1], np.float32), ((3, 4), [[3, 0, 3]], np.float64), ((2, 3, 5), [4, 0, 2, 2], np.int64),
    ((6,), [5, 1], np.int32), ((2, 4), [2], np.float32),
])
@pytest.mark.parametrize("const_ind", [False, True])
def test_array_feature_extractor(shape, ind, dt, const_ind):
    x = rand(*shape, dtype=dt, low=-5, high=5)
    ind = np.asarray(ind, I64)
    out_type = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    out_shape = (*(shape[:-1] or (1,)), ind.size)
    if const_ind:
        m = ml_model("ArrayFeatureExtractor", {"x": x}, initializers={"i": ind}, out_type=out_type, out_shape=out_shape)
        assert_matches_ort(m, {"x": x}, rtol=0, atol=0)
    else:
        m = ml_model("ArrayFeatureExtractor", {"x": x, "i": ind}, out_type=out_type, out_shape=out_shape)
        assert_matches_ort(m, {"x": x, "i": ind}, rtol=0, atol=0)


def test_array_feature_extractor_reference_and_errors():
    x = rand(3, 4)
    g = Graph()
    b = Builder(g)
    b.op("ArrayFeatureExtractor", b.const(x), b.const(np.array([3, 1], I64)), domain="ai.onnx.ml")
    np.testing.assert_array_equal(run_reference(g.nodes[-1], [x, np.array([3, 1], I64)])[0], x[:, [3, 1]])
    with pytest.raises(IndexError, match="out of range"):
        run_reference(g.nodes[-1], [x, np.array([4], I64)])
    with pytest.raises(ShapeError, match="Y must be int64"):
        b.op("ArrayFeatureExtractor", b.const(x), b.const(np.array([1], np.int32)), domain="ai.onnx.ml")
    with pytest.raises(ShapeError, match="X must be float"):
        b.op("Binarizer", b.const(np.zeros(3, np.float16)), domain="ai.onnx.ml")


def test_other_ml_ops_are_reported_unsupported():
    x = rand(2, 3)
    m = ml_model("Normalizer", {"x": x}, {"norm": "L2"}, out_shape=x.shape)
    with pytest.raises(UnsupportedModelError, match="ai.onnx.ml::Normalizer"):
        tensorfuse.compile(m, target="llvm")
