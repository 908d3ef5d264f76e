"""Specialisation on input values (compiler/specialize.py): shape-deciding graph inputs."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.compiler.specialize import SpecializingModule


def _reshape_model(dynamic_shape_via_add: bool = False) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
    nodes = []
    shape_name = "s"
    if dynamic_shape_via_add:      # the shape is computed from the input, not the input itself
        one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("v", TensorProto.INT64, [], [0]))
        nodes += [one, helper.make_node("Add", ["s", "one"], ["s2"])]
        shape_name = "s2"
    nodes.append(helper.make_node("Reshape", ["x", shape_name], ["r"]))
    nodes.append(helper.make_node("Relu", ["r"], ["y"]))
    g = helper.make_graph(nodes, "g", [x, s], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("via_add", [False, True])
def test_reshape_shape_as_input_compiles_per_value(via_add):
    mod = tensorfuse.compile(_reshape_model(via_add), target="llvm")
    assert isinstance(mod, SpecializingModule)
    assert mod.specialized_on == ["s"]
    x = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4)
    (y,) = mod.run(x, np.array([6, 4], np.int64))
    np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(6, 4))
    (y,) = mod.run(x=x, s=np.array([4, -1], np.int64))
    np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(4, 6))
    (y,) = mod.run(x * 2, np.array([6, 4], np.int64))          # reuses the first specialisation
    np.testing.assert_array_equal(y, np.maximum(2 * x, 0).reshape(6, 4))
    assert len(mod.specializations) == 2


def test_specializing_module_checks_inputs():
    mod = tensorfuse.compile(_reshape_model(), target="llvm")
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="'s' is missing"):
        mod.run(x)
    with pytest.raises(ValueError, match="expected dtype int64"):
        mod.run(x, np.array([6, 4], np.int32))
    with pytest.raises(ValueError, match="expected shape"):
        mod.run(x, np.array([24], np.int64))
    with pytest.raises(ValueError, match="unknown input 'z'"):
        mod.run(x, z=np.array([6, 4], np.int64))
    with pytest.raises(ValueError):      # a bad value: the specialised compile says why
        mod.run(x, np.array([5, 5], np.int64))


def test_without_cache_also_specializes():
    mod = tensorfuse.compile(_reshape_model(), target="llvm", cache=False)
    assert isinstance(mod, SpecializingModule)
    (y,) = mod.run(np.ones((2, 3, 4), np.float32), np.array([24, 1], np.int64))
    assert y.shape == (24, 1)


def test_values_that_do_not_fit_name_the_input_and_the_onnx_node():
    """A value-dependent Reshape given a shape of another size at run time: ValueError
    (UnsupportedModelError) naming the input and its values and the ONNX node, once (the
    registry's own 'Reshape node 'Reshape_1'' prefix used to follow the frontend's name)."""
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    mod = tensorfuse.compile(m, cache=False)
    x = np.ones((2, 6), np.float32)
    assert mod.run(x, np.array([3, 4]))[0].shape == (3, 4)
    with pytest.raises(ValueError) as ei:
        mod.run(x, np.array([5, 5]))
    msg = str(ei.value)
    assert "input 's' = [5, 5]" in msg and "unnamed Reshape node (first output 'y')" in msg, msg
    assert "cannot reshape [2, 6] (12 elements) to [5, 5] (25 elements)" in msg
    assert "Reshape_" not in msg, msg
