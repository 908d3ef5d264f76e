"""runtime.Module's input checking and output conventions."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from oracle import node_model, rand


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
