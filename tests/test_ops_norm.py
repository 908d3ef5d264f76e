"""Normalisation ops against onnxruntime (ONNX spec sections of each op)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ir.builder import Builder
from ir.graph import Graph
from ir.registry import ShapeError, get_op, run_reference
from ir.types import DType, TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5


def _ref(op, arrays, num_outputs=1, **attrs):
    g = Graph()
    ins = [None if a is None else g.add_input(f"x{i}", TensorType.of(a)) for i, a in enumerate(arrays)]
    out = Builder(g).op(op, *ins, num_outputs=num_outputs, **attrs)
    node = (out[0] if isinstance(out, list) else out).producer
    return run_reference(node, list(arrays))


# ----------------------------------------------------------------------------- LayerNormalization
LN_CASES = [((3, 5), -1, (5,)), ((2, 3, 4), -1, (4,)), ((2, 3, 4), 1, (3, 4)), ((2, 3, 4), 0, (2, 3, 4)),
            ((2, 3, 4), -2, (1, 4)), ((2, 3, 4), 1, (3, 1)), ((2, 3, 4), 1, ()), ((6,), 0, (6,)),
            ((1, 8, 300), -1, (300,))]


@pytest.mark.parametrize("shape,axis,sshape", LN_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm(shape, axis, sshape, with_bias):
    x, s, b = rand(*shape), rand(*sshape, seed=1), rand(*sshape, seed=2)
    inputs = {"x": x, "s": s, **({"b": b} if with_bias else {})}
    m = node_model("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, outputs=("y", "mean", "inv"))
    assert_matches_ort(m, inputs, rtol=RT, atol=AT)


def test_layernorm_default_attrs_single_output():
    x, s, b = rand(2, 4, 8), rand(8, seed=1), rand(8, seed=2)
    m = node_model("LayerNormalization", {"x": x, "s": s, "b": b})
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=RT, atol=AT)


def test_layernorm_omitted_mean_output():
    x, s = rand(2, 3, 4), rand(4, seed=1)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"], axis=-1)
    g = helper.make_graph([node], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, s.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape),
                           helper.make_tensor_value_info("inv", TensorProto.FLOAT, (2, 3, 1))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    assert_matches_ort(m, {"x": x, "s": s}, rtol=RT, atol=AT)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float16, 3e-3)])
def test_layernorm_dtypes(dtype, tol):
    x, s, b = rand(2, 3, 6, dtype=dtype), rand(6, dtype=dtype, seed=1), rand(6, dtype=dtype, seed=2)
    m = node_model("LayerNormalization", {"x": x, "s": s, "b": b}, {"axis": -1}, outputs=("y", "mean", "inv"))
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=tol, atol=tol)


def test_layernorm_reference_matches_ort():
    x, s, b = rand(2, 3, 4), rand(3, 4, seed=1), rand(3, 4, seed=2)
    exp = ort_run(node_model("LayerNormalization", {"x": x, "s": s, "b": b}, {"axis": 1},
                             outputs=("y", "mean", "inv")), {"x": x, "s": s, "b": b})
    got = _ref("LayerNormalization", [x, s, b], num_outputs=3, axis=1)
    for g_, e in zip(got, exp):
        assert g_.dtype == e.dtype and g_.shape == e.shape
        np.testing.assert_allclose(g_, e, rtol=RT, atol=AT)


@pytest.mark.parametrize("sshape,attrs,msg", [((5,), {}, "does not broadcast"),
                                              ((4,), {"axis": 3}, "out of range"),
                                              ((4,), {"stash_type": 16}, "stash_type")])
def test_layernorm_errors(sshape, attrs, msg):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3, 4)))
    s = g.add_input("s", TensorType(DType.f32, sshape))
    with pytest.raises(ShapeError, match=msg):
        Builder(g).LayerNormalization(x, s, **attrs)


def test_layernorm_flops():
    g = Graph()
    out = Builder(g).LayerNormalization(g.add_input("x", TensorType(DType.f32, (2, 4))),
                                        g.add_input("s", TensorType(DType.f32, (4,))))
    assert get_op("LayerNormalization").flops(out.producer) > 0
