"""BatchNormalization (inference mode) against onnxruntime (ONNX spec "BatchNormalization"):
ranks 2..5, epsilon, dtypes, versions 7 (spatial), 9, 14, 15, and the training-mode errors."""
import numpy as np
import onnx
import pytest
from onnx import helper

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.registry import ShapeError, get_op
from tests.oracle import node_model, ort_run, rand
from tests.test_ops_conv import _check, _ref

RT, AT = 1e-4, 1e-5


def _params(c, seed=1, dtype=np.float32, mean_dtype=None):
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 1.5, c).astype(dtype)
    b = rng.uniform(-1, 1, c).astype(dtype)
    mean = rng.uniform(-1, 1, c).astype(mean_dtype or dtype)
    var = rng.uniform(0.1, 2, c).astype(mean_dtype or dtype)
    return [scale, b, mean, var]


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 7), (1, 4, 5, 6), (2, 3, 4, 5, 3), (1, 1, 9, 9)])
def test_batchnorm_shapes(shape):
    x = rand(*shape)
    _check("BatchNormalization", [x] + _params(shape[1]), {})


@pytest.mark.parametrize("epsilon", [1e-5, 1e-3, 0.5])
def test_batchnorm_epsilon(epsilon):
    x = rand(2, 3, 4, 4)
    _check("BatchNormalization", [x] + _params(3), {"epsilon": epsilon, "momentum": 0.7})


def test_batchnorm_constant_params():
    x = rand(1, 5, 6, 6)
    _check("BatchNormalization", [x] + _params(5), {}, consts={"i1", "i2", "i3", "i4"})


@pytest.mark.parametrize("opset", [7, 9, 14, 15, 17])
def test_batchnorm_versions(opset):
    x = rand(2, 4, 3, 5)
    _check("BatchNormalization", [x] + _params(4), {"epsilon": 1e-4}, opset=opset)


def test_batchnorm_v7_spatial_attribute():
    x = rand(2, 4, 3, 5)
    _check("BatchNormalization", [x] + _params(4), {"spatial": 1}, opset=7)


def test_batchnorm_v7_per_activation():
    """spatial=0: statistics per activation, of shape [C, D1, ..., Dn]."""
    x = rand(2, 3, 4, 5)
    rng = np.random.default_rng(3)
    ps = [rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32) for _ in range(4)]
    model = node_model("BatchNormalization", {"x": x}, {"spatial": 0, "epsilon": 1e-3}, opset=7,
                       initializers=dict(zip(["s", "b", "m", "v"], ps)))
    got = tensorfuse.compile(model, opt_level=0).run(x=x)[0]
    s, b, m, v = (p[None] for p in ps)
    np.testing.assert_allclose(got, (x - m) / np.sqrt(v + 1e-3) * s + b, rtol=RT, atol=AT)


def test_batchnorm_f64():
    x = rand(2, 3, 4, 5, dtype=np.float64)
    _check("BatchNormalization", [x] + _params(3, dtype=np.float64), {}, rtol=1e-12, atol=1e-12)


def test_batchnorm_f16():
    x = rand(2, 3, 4, 5, dtype=np.float16)
    _check("BatchNormalization", [x] + _params(3, dtype=np.float16), {}, rtol=2e-3, atol=2e-3)


def test_batchnorm_mixed_dtypes():
    """BatchNormalization-15: X, scale/B and mean/var may have different float types."""
    x = rand(2, 3, 4, 5, dtype=np.float16)
    ps = _params(3, dtype=np.float32, mean_dtype=np.float32)
    _check("BatchNormalization", [x] + ps, {}, rtol=2e-3, atol=2e-3, oracle="ref")


def test_batchnorm_reference_matches_ort():
    x = rand(2, 3, 4, 5)
    ps = _params(3)
    (got,), node = _ref("BatchNormalization", [x] + ps, epsilon=1e-3)
    feeds = dict(zip(["x", "s", "b", "m", "v"], [x] + ps))
    exp = ort_run(node_model("BatchNormalization", feeds, {"epsilon": 1e-3}), feeds)[0]
    np.testing.assert_allclose(got, exp, rtol=RT, atol=AT)
    assert get_op("BatchNormalization").flops(node) == 2 * x.size


def _bn_model(x, outputs, opset, **attrs):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outputs, **attrs)
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in zip(["s", "b", "m", "v"], _params(x.shape[1]))]
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", 1, x.shape)],
                          [helper.make_tensor_value_info("y", 1, x.shape)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_batchnorm_training_mode_is_refused():
    x = rand(2, 3, 4, 5)
    with pytest.raises(UnsupportedModelError, match="training_mode=1 is not supported"):
        tensorfuse.compile(_bn_model(x, ["y"], 15, training_mode=1))
    with pytest.raises(ShapeError, match="training_mode=1"):
        _ref("BatchNormalization", [x] + _params(3), training_mode=1)


@pytest.mark.parametrize("opset", [9, 15])
def test_batchnorm_training_outputs_are_refused(opset):
    attrs = {"training_mode": 1} if opset >= 14 else {}
    outs = ["y", "rm", "rv"] if opset >= 14 else ["y", "om", "ov", "sm", "sv"]
    m = _bn_model(rand(2, 3, 4, 5), outs, opset, **attrs)
    with pytest.raises(UnsupportedModelError, match="training"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("bad,msg", [
    ({"x": rand(4)}, "rank >= 2"),
    ({"s": rand(4)}, "must have shape \\[3\\]"),
    ({"x": rand(2, 3, 4).astype(np.int32)}, "float"),
])
def test_batchnorm_errors(bad, msg):
    arrs = dict(zip(["x", "s", "b", "m", "v"], [rand(2, 3, 4)] + _params(3)))
    arrs.update(bad)
    with pytest.raises(ShapeError, match=msg):
        _ref("BatchNormalization", list(arrs.values()))
