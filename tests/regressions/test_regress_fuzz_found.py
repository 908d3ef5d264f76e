"""Regression tests for bugs the random-graph and model fuzzing of issue 9 found (shrunk by
``tests/fuzz``), that are not among the issue's listed defects. Each failed before its fix."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from oracle import assert_matches_ort, rand


def _resize_model(mode: str, sizes):
    g = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                          coordinate_transformation_mode="half_pixel")],
        "resize_identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, sizes)],
        initializer=[numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
def test_resize_to_its_own_size(mode):
    """Resize whose sizes equal the input shape (no axis resized): the linear and cubic
    lowering built the tap product from no taps (AttributeError 'NoneType' ... 'cast' in
    ir/ops/resize.py emit_resize, wrapped in a CompileError). Found by random_graphs.py
    --seed 1, graph 404 (seed 1000407), shrunk from 4 nodes."""
    assert_matches_ort(_resize_model(mode, [1, 2, 2, 6]), {"x": rand(1, 2, 2, 6)}, opt_levels=(0, 2))


def test_negative_input_dimension_is_a_dynamic_one():
    """A graph input declared with dim_value -1 (onnx.checker accepts it; onnxruntime reads it
    as unknown): TensorType's ValueError "negative dimension in shape" escaped from the frontend.
    Now UnsupportedModelError naming the input, and input_shapes= fixes it. Found by
    fuzz_models.py --seed 1, mutation 347 (input_shape)."""
    import tensorfuse
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "neg",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, -1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, -1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with pytest.raises(tensorfuse.UnsupportedModelError, match="input 'x' has a dynamic dimension 1"):
        tensorfuse.compile(m, cache=False)
    x = rand(3, 4)
    (y,) = tensorfuse.compile(m, cache=False, input_shapes={"x": [3, 4]}).run(x=x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_resize_with_non_finite_scales_is_refused(bad):
    # tests/fuzz/fuzz_models.py seed 3, mutation 195 (a flipped byte in Resize's scales): an
    # infinite scale raised OverflowError from the output-shape computation
    from onnx import TensorProto, helper, numpy_helper
    sc = numpy_helper.from_array(np.array([1, 1, bad, 2], np.float32), "sc")
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], initializer=[sc])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(tensorfuse.TensorfuseError, match="positive and finite"):
        tensorfuse.compile(m, cache=False)


@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_maxpool_same_upper_ignores_ceil_mode(ceil_mode):
    """MaxPool with auto_pad=SAME_UPPER, ceil_mode=1 and dilations: random_graphs.py --seed 6,
    graph 789 (seed 6000807), shrunk from 4 nodes to this one, "mismatched" at O0, O2 and O3.
    Not a tensorfuse bug: with SAME_* the spec fixes the output at ceil(in / stride) and the
    padding at (out - 1) * stride + (k - 1) * dilation + 1 - in, split with the extra at the
    end, so ceil_mode changes nothing; onnx.reference and tensorfuse give [11, 14] for both
    ceil_mode values, onnxruntime 1.32 gives [14, 11] for ceil_mode=1. The generator no longer
    draws SAME_* with ceil_mode=1 (tests/fuzz/graphgen.py g_pool). Expected values by hand:
    rows -1, 1, 3 (row -1 is padding) and rows 2, 4, 6 (row 6 is padding), each over all 3
    columns of arange(15).reshape(5, 3)."""
    node = helper.make_node("MaxPool", ["x"], ["y"], auto_pad="SAME_UPPER", ceil_mode=ceil_mode,
                            dilations=[2, 1], kernel_shape=[3, 3], strides=[3, 3])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(15, dtype=np.float32).reshape(1, 1, 5, 3)
    for level in (0, 2):
        (y,) = tensorfuse.compile(m, opt_level=level, cache=False).run(x)
        np.testing.assert_array_equal(y.ravel(), [11.0, 14.0])
