"""GridSample and AffineGrid against onnxruntime, and their numpy references."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir import Builder, Graph
from tensorfuse.ir.registry import run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand


@pytest.mark.parametrize("mode,padding_mode,align_corners", [
    ("linear", "zeros", 0), ("linear", "border", 1), ("linear", "reflection", 0), ("linear", "reflection", 1),
    ("nearest", "zeros", 1), ("nearest", "border", 0), ("nearest", "reflection", 0),
    ("cubic", "zeros", 0), ("cubic", "border", 1), ("cubic", "reflection", 0)])
def test_gridsample_2d(mode, padding_mode, align_corners):
    inputs = {"x": rand(2, 3, 4, 5, seed=1), "grid": rand(2, 3, 6, 2, seed=2, low=-1.4, high=1.4)}
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    m = node_model("GridSample", inputs, attrs, opset=22)
    if mode == "cubic" and padding_mode != "zeros":
        # onnxruntime (like PyTorch) does not clamp/reflect the coordinate itself before taking
        # cubic taps; the ONNX spec's reference does, and tensorfuse follows the spec
        from onnx.reference import ReferenceEvaluator
        (expected,) = ReferenceEvaluator(m).run(None, inputs)
        (got,) = tensorfuse.compile(m, target="llvm").run(**inputs)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        return
    assert_matches_ort(m, inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


@pytest.mark.parametrize("mode,padding_mode", [("linear", "zeros"), ("linear", "reflection"), ("nearest", "border")])
def test_gridsample_3d(mode, padding_mode):
    inputs = {"x": rand(1, 2, 3, 4, 5, seed=3), "grid": rand(1, 2, 3, 4, 3, seed=4, low=-1.3, high=1.3)}
    attrs = {"mode": mode, "padding_mode": padding_mode}
    assert_matches_ort(node_model("GridSample", inputs, attrs, opset=22), inputs, rtol=1e-4, atol=1e-5,
                       opt_levels=(2,))


def test_gridsample_opset16_bilinear_name():
    inputs = {"x": rand(1, 2, 4, 4, seed=5), "grid": rand(1, 3, 3, 2, seed=6, low=-1, high=1)}
    for mode in ("bilinear", "bicubic", "nearest"):
        assert_matches_ort(node_model("GridSample", inputs, {"mode": mode}, opset=16), inputs, rtol=1e-4,
                           atol=1e-5, opt_levels=(0,))


def test_gridsample_reference_matches_ort():
    x, grid = rand(1, 2, 5, 4, seed=7), rand(1, 3, 2, 2, seed=8, low=-1.5, high=1.5)
    attrs = {"mode": "cubic", "padding_mode": "zeros"}
    expected = ort_run(node_model("GridSample", {"x": x, "g": grid}, attrs, opset=22), {"x": x, "g": grid})
    g = Graph()
    y = Builder(g).op("GridSample", g.add_input("x", TensorType.of(x)), g.add_input("g", TensorType.of(grid)), **attrs)
    np.testing.assert_allclose(run_reference(y.producer, [x, grid])[0], expected[0], rtol=1e-4, atol=1e-5)


def test_gridsample_errors():
    inputs = {"x": rand(1, 2, 4, 4), "grid": rand(1, 3, 3, 3)}
    from onnx import TensorProto, helper
    node = helper.make_node("GridSample", ["x", "grid"], ["y"])
    g_in = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()]
    m = helper.make_model(helper.make_graph([node], "g", g_in, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)]),
                          opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(UnsupportedModelError, match="grid"):
        tensorfuse.compile(m, target="llvm")


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 1, 3, 4, 5], [1, 1, 1, 3]])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(size, align_corners):
    if align_corners and 1 in size[2:]:
        pytest.skip("a size-1 dimension with align_corners is ill-defined in ONNX (the reference divides "
                    "by zero); tensorfuse gives 0 as PyTorch, onnxruntime gives 1")
    r = len(size) - 2
    theta = rand(size[0], r, r + 1, seed=9)
    inputs = {"theta": theta}
    m = node_model("AffineGrid", inputs, {"align_corners": align_corners}, opset=20,
                   initializers={"size": np.array(size, np.int64)})
    got = assert_matches_ort(m, inputs, rtol=1e-5, atol=1e-6)
    g = Graph()
    b = Builder(g)
    y = b.op("AffineGrid", g.add_input("t", TensorType.of(theta)), b.const(np.array(size, np.int64)),
             align_corners=align_corners)
    np.testing.assert_allclose(run_reference(y.producer, [theta, np.array(size)])[0], got[0], rtol=1e-5, atol=1e-6)
