"""runtime.Module's input checking and output conventions."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from oracle import node_model, ort_run, rand


@pytest.fixture(scope="module")
def add_module():
    return tensorfuse.compile(node_model("Add", {"a": rand(2, 3), "b": rand(2, 3)}))


def test_info(add_module):
    assert [(i.name, i.dtype, i.shape) for i in add_module.input_info] == [
        ("a", np.float32, (2, 3)), ("b", np.float32, (2, 3))]
    assert [(o.name, o.shape) for o in add_module.output_info] == [("y", (2, 3))]


def test_positional_named_and_call(add_module):
    a, b = rand(2, 3), rand(2, 3, seed=1)
    for out in (add_module.run(a, b), add_module.run(a=a, b=b), add_module(a, b=b)):
        np.testing.assert_array_equal(out[0], a + b)


def test_wrong_dtype_names_the_input(add_module):
    with pytest.raises(ValueError, match=r"input 'b': expected dtype float32, got float64"):
        add_module.run(rand(2, 3), rand(2, 3).astype(np.float64))


def test_wrong_shape_names_the_input(add_module):
    with pytest.raises(ValueError, match=r"input 'a': expected shape \[2, 3\], got \[3, 2\]"):
        add_module.run(rand(3, 2), rand(2, 3))


def test_missing_and_unknown_inputs(add_module):
    with pytest.raises(ValueError, match="input 'b' is missing"):
        add_module.run(rand(2, 3))
    with pytest.raises(ValueError, match="unknown input 'c'"):
        add_module.run(rand(2, 3), c=rand(2, 3))


def test_non_contiguous_input_and_fresh_outputs(add_module):
    a = rand(3, 2).T      # a view with strides
    b = rand(2, 3, seed=1)
    out1 = add_module.run(a, b)[0]
    np.testing.assert_array_equal(out1, a + b)
    out2 = add_module.run(b, b)[0]
    assert out1 is not out2
    np.testing.assert_array_equal(out1, a + b)   # not overwritten by the second run


# -- issue 9 defect 4: inputs of the wrong kind name the input and what was expected ------------
@pytest.mark.parametrize("bad,err,what", [
    (b"abcdefgh", TypeError, "got bytes"),
    ("abc", TypeError, "got str"),
    ({"x": 1}, TypeError, "got dict"),
    ({1.0, 2.0}, TypeError, "got set"),
    ([[1.0, 2.0, 3.0], [4.0, 5.0]], ValueError, r"got a list that is not rectangular \(a ragged nested list\)"),
    ([["a", "b", "c"], ["d", "e", "f"]], TypeError, "got a list of strings"),
    ([[1, 2, None], [4, 5, 6]], TypeError, "got a list of object elements"),
])
def test_wrong_kind_of_input_names_the_input(add_module, bad, err, what):
    with pytest.raises(err, match=rf"input 'b': expected a numpy array \(or nested list of numbers\) of dtype "
                                  rf"float32 and shape \[2, 3\], {what}"):
        add_module.run(rand(2, 3), bad)


def test_nested_lists_and_scalars_are_converted(add_module):
    a = rand(2, 3)
    out = add_module.run(a, [[1, 2, 3], [4.5, 5, 6]])[0]          # ints and floats: float32
    np.testing.assert_array_equal(out, a + np.array([[1, 2, 3], [4.5, 5, 6]], np.float32))


def test_floats_for_an_integer_input_are_refused():
    mod = tensorfuse.compile(node_model("Add", {"a": np.zeros(2, np.int32), "b": np.zeros(2, np.int32)}))
    np.testing.assert_array_equal(mod.run([1, 2], (3, 4))[0], np.array([4, 6], np.int32))
    with pytest.raises(ValueError, match=r"input 'a': expected .* dtype int32 .*, got float64 values"):
        mod.run([1.5, 2.0], [1, 2])
    with pytest.raises(ValueError, match=r"input 'b': values out of the range of int32"):
        mod.run([1, 2], [2 ** 40, 1])


def test_constants_are_cache_line_aligned():
    """Every constant a module holds starts on a 64-byte boundary (packed weights are read with
    full-width vector loads); ``aligned_consts`` copies a misaligned array and keeps an aligned
    one as it is, values unchanged."""
    import onnx.helper as oh
    from onnx import TensorProto, numpy_helper

    import tensorfuse
    from tensorfuse.runtime.module import aligned_consts

    raw = np.zeros(4 * 1000 + 64, np.uint8)
    off = (-raw.ctypes.data) % 64 + 4
    bad = raw[off:off + 4000].view(np.float32)
    bad[:] = np.arange(1000, dtype=np.float32)
    good = np.zeros(16 + 64, np.uint8)
    good = good[(-good.ctypes.data) % 64:][:64].view(np.float32)
    out = aligned_consts({0: bad, 1: good})
    assert out[0].ctypes.data % 64 == 0 and out[1] is good
    np.testing.assert_array_equal(out[0], np.arange(1000, dtype=np.float32))

    w = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    g = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [oh.make_tensor_value_info("x", TensorProto.FLOAT, [5, 64])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [5, 300])],
                      [numpy_helper.from_array(w, "w")])
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    mod = tensorfuse.compile(model, cache=False)
    assert mod._consts and all(a.ctypes.data % 64 == 0 for a in mod._consts.values())
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x=x)[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
