"""The ONNX frontend: accepted sources, validation and the errors users see."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.compiler.frontend.onnx import import_onnx
from oracle import node_model, rand


def _relu_model(shape=(2, 3), dims=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims or list(shape))
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_path_bytes_and_proto_give_the_same_graph(tmp_path):
    m = _relu_model()
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    texts = {str(import_onnx(src)) for src in (m, m.SerializeToString(), str(p), p)}
    assert len(texts) == 1


def test_unsupported_ops_are_all_listed_with_node_names():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("Sinh", ["a"], ["b"], name="s1"),   # replaced below by unknown ops
             helper.make_node("Relu", ["b"], ["y"], name="ok2")]
    nodes[1] = helper.make_node("MyFancyOp", ["a"], ["b"], name="fancy_1", domain="com.example")
    nodes.insert(2, helper.make_node("MyFancyOp", ["b"], ["c"], name="fancy_2", domain="com.example"))
    nodes[3] = helper.make_node("Relu", ["c"], ["y"], name="ok2")
    g = helper.make_graph(nodes, "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(tensorfuse.UnsupportedModelError) as ei:
        tensorfuse.compile(m)
    assert ei.value.unsupported == {"com.example::MyFancyOp": ["fancy_1", "fancy_2"]}
    assert "fancy_1" in str(ei.value) and "fancy_2" in str(ei.value)


def test_corrupt_file_says_so(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x00\x01this is not a protobuf\xff" * 10)
    with pytest.raises(tensorfuse.ModelLoadError, match="not a valid ONNX model"):
        tensorfuse.compile(str(p))
    with pytest.raises(tensorfuse.ModelLoadError, match="not found"):
        tensorfuse.compile(str(tmp_path / "missing.onnx"))
    with pytest.raises(tensorfuse.ModelLoadError, match="not a valid ONNX model"):
        tensorfuse.compile(b"garbage bytes")


def test_truncated_model_file_says_so(tmp_path):
    data = _relu_model().SerializeToString()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(tensorfuse.ModelLoadError):
        tensorfuse.compile(str(p))


def test_checker_failure_is_a_load_error():
    m = _relu_model()
    m.graph.node[0].input[0] = "undefined_value"
    with pytest.raises(tensorfuse.ModelLoadError, match="onnx.checker"):
        tensorfuse.compile(m)


def test_dynamic_dimension_needs_input_shapes():
    m = _relu_model(dims=["batch", 3])
    with pytest.raises(tensorfuse.UnsupportedModelError, match=r"input 'x' has a dynamic dimension 0 \('batch'\)"):
        tensorfuse.compile(m)
    mod = tensorfuse.compile(m, input_shapes={"x": [5, 3]})
    x = rand(5, 3)
    np.testing.assert_array_equal(mod.run(x)[0], np.maximum(x, 0))
    with pytest.raises(tensorfuse.UnsupportedModelError, match="fixes it to 3"):
        tensorfuse.compile(m, input_shapes={"x": [5, 4]})
    # a misspelt name is the error, not the dynamic dimension of the input it meant
    with pytest.raises(tensorfuse.UnsupportedModelError, match=r"lacks: \['y'\]; its inputs are \['x'\]"):
        tensorfuse.compile(m, input_shapes={"y": [5, 3]})


def test_initializer_that_is_also_an_input_is_a_constant():
    m = node_model("Add", {"a": rand(3)}, initializers={"b": rand(3, seed=1)})
    m.graph.input.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [3]))
    mod = tensorfuse.compile(m)
    assert [i.name for i in mod.input_info] == ["a"]
    np.testing.assert_allclose(mod.run(rand(3))[0], rand(3) + rand(3, seed=1), rtol=1e-6)


def test_opset_out_of_range():
    m = _relu_model()
    m.opset_import[0].version = 99
    with pytest.raises((tensorfuse.UnsupportedModelError, tensorfuse.ModelLoadError)):
        tensorfuse.compile(m)


def test_opset_6_is_upgraded_by_the_version_converter():
    m = _relu_model()
    m.opset_import[0].version = 6
    x = rand(2, 3)
    np.testing.assert_array_equal(tensorfuse.compile(m).run(x)[0], np.maximum(x, 0))


def test_constant_node_becomes_a_constant():
    c = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.5, -2.0]))
    add = helper.make_node("Add", ["x", "c"], ["y"])
    g = helper.make_graph([c, add], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(m)
    assert [n.op for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(tensorfuse.compile(m).run(np.zeros(2, np.float32))[0], [1.5, -2.0])


def test_bfloat16_is_refused_clearly():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tensorfuse.UnsupportedModelError, match=r"bf16: 'x', Relu node 'r'"):
        tensorfuse.compile(m, cache=False)
