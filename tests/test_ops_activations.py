"""Activation ops against onnxruntime (or onnx.reference where onnxruntime lacks the op, type
or version); ONNX spec sections of each op. See tests/test_ops_elementwise.py for ``check``."""
import numpy as np
import onnx
import pytest

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tests.oracle import node_model, rand
from tests.test_ops_elementwise import FLOATS, check, check_model

ACTS = {
    "Sigmoid": [{}],
    "HardSigmoid": [{}, {"alpha": 0.3, "beta": 0.4}],
    "HardSwish": [{}],
    "LeakyRelu": [{}, {"alpha": 0.2}],
    "ThresholdedRelu": [{}, {"alpha": 0.5}],
    "Elu": [{}, {"alpha": 0.7}],
    "Selu": [{}, {"alpha": 1.5, "gamma": 2.0}],
    "Celu": [{}, {"alpha": 2.0}],
    "Softplus": [{}],
    "Softsign": [{}],
    "Mish": [{}],
    "Gelu": [{}, {"approximate": "tanh"}],
    "Shrink": [{}, {"lambd": 1.0, "bias": 0.3}],
    "Relu": [{}],
}
OPSET = {"Gelu": 20, "Mish": 18}


def _cases():
    for op, attrs in ACTS.items():
        for a in attrs:
            yield op, a


@pytest.mark.parametrize("op,attrs", list(_cases()))
@pytest.mark.parametrize("shape", [(2, 3, 5), ()])
def test_activation_f32(op, attrs, shape):
    x = rand(*shape, low=-6, high=6, seed=3)
    check(op, {"x": x}, attrs, opset=OPSET.get(op, 17))


@pytest.mark.parametrize("op,attrs", list(_cases()))
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_activation_f16_f64(op, attrs, dtype):
    x = rand(4, 9, low=-6, high=6, seed=4, dtype=dtype)
    # the oracles compute some float64 activations with float32 constants or erf (onnxruntime's
    # Gelu-tanh and Shrink, onnx.reference's HardSwish and Gelu): we keep double precision
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == np.float64 else {}
    check(op, {"x": x}, attrs, opset=OPSET.get(op, 17), opt_levels=(0,), **tol)


@pytest.mark.parametrize("op", sorted(ACTS))
def test_activation_extremes(op):
    x = np.array([-100, -20, -1e-3, -0.0, 0.0, 1e-3, 20, 100, np.inf, -np.inf, np.nan], np.float32)
    check(op, {"x": x}, opset=OPSET.get(op, 17), opt_levels=(0,))


def test_activation_older_opsets():
    x = rand(3, 4, low=-4, high=4)
    for op, opset in [("LeakyRelu", 7), ("Elu", 7), ("Selu", 7), ("Sigmoid", 7), ("HardSigmoid", 7),
                      ("Softplus", 7), ("Softsign", 7), ("ThresholdedRelu", 10), ("Celu", 12),
                      ("HardSwish", 14), ("Shrink", 9), ("Relu", 7)]:
        check(op, {"x": x}, {"alpha": 0.3} if op in ("LeakyRelu", "Elu") else None, opset=opset, opt_levels=(0,))


def test_gelu_rejects_unknown_approximation():
    m = node_model("Gelu", {"x": rand(3)}, {"approximate": "tanh"}, opset=20)
    m.graph.node[0].attribute[0].s = b"fast"
    with pytest.raises(UnsupportedModelError, match="approximate='fast'"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_shrink_int(dtype):
    x = np.arange(-6, 7).astype(dtype) if np.dtype(dtype).kind == "i" else np.arange(13).astype(dtype)
    check("Shrink", {"x": x}, {"lambd": 1.5, "bias": 2.0}, opt_levels=(0,))


def test_activation_rejects_int():
    m = node_model("Sigmoid", {"x": np.ones(3, np.float32)})
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    with pytest.raises(UnsupportedModelError, match="dtype i64, which ONNX Sigmoid does not allow"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- PRelu
@pytest.mark.parametrize("sx,ss", [((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (5,)), ((2, 3), (2, 3)),
                                   ((2, 3), ()), ((4,), (1,)), ((1, 3, 2, 2), (1, 3, 1, 1))])
def test_prelu_broadcast(sx, ss):
    check("PRelu", {"x": rand(*sx, seed=1)}, initializers={"slope": rand(*ss, seed=2, low=0, high=1)})
    check("PRelu", {"x": rand(*sx, seed=1), "slope": rand(*ss, seed=3)}, opt_levels=(0,))


@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64, np.uint32])
def test_prelu_dtypes(dtype):
    x = rand(3, 4, seed=1, dtype=dtype, low=-5, high=5) if np.dtype(dtype).kind != "u" else rand(3, 4, dtype=dtype, low=0, high=9)
    check("PRelu", {"x": x, "slope": rand(4, seed=2, dtype=dtype, low=-3, high=3) if np.dtype(dtype).kind != "u"
                    else rand(4, dtype=dtype, low=0, high=3)}, opt_levels=(0,))


@pytest.mark.parametrize("opset", [7, 9])
def test_prelu_old_opsets(opset):
    check("PRelu", {"x": rand(2, 3, 4, 5)}, initializers={"slope": rand(3, 1, 1, seed=5)}, opset=opset, opt_levels=(0,))


def test_prelu_rejects_slope_that_grows_x():
    m = node_model("PRelu", {"x": rand(2, 3), "slope": rand(2, 3)})
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 4
    m.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 1
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    del m.graph.output[0].type.tensor_type.shape.dim[:]
    with pytest.raises(UnsupportedModelError, match="does not broadcast to X"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Clip
CLIP_BOUNDS = [(-0.5, 0.7), (None, 0.7), (-0.5, None), (None, None), (0.8, -0.3)]


@pytest.mark.parametrize("lo,hi", CLIP_BOUNDS)
def test_clip_constant_bounds(lo, hi):
    x = rand(2, 3, 4, seed=1)
    inits, names = {}, ["x"]
    for name, v in (("lo", lo), ("hi", hi)):
        if v is not None:
            inits[name] = np.array(v, np.float32)
        names.append(name if v is not None else "")
    while names[-1] == "":
        names.pop()
    check("Clip", {"x": x}, initializers=inits, input_names=names)


@pytest.mark.parametrize("lo,hi", CLIP_BOUNDS[:3])
def test_clip_runtime_bounds(lo, hi):
    ins = {"x": rand(5, 6, seed=2)}
    names = ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    if lo is not None:
        ins["lo"] = np.array(lo, np.float32)
    if hi is not None:
        ins["hi"] = np.array(hi, np.float32)
    while names[-1] == "":
        names.pop()
    check("Clip", ins, input_names=names)


@pytest.mark.parametrize("dtype", FLOATS + [np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_clip_dtypes(dtype):
    x = rand(3, 7, seed=3, dtype=dtype, low=0 if np.dtype(dtype).kind == "u" else -9, high=9)
    lo, hi = (2, 6) if np.dtype(dtype).kind == "u" else (-3, 4)
    check("Clip", {"x": x}, initializers={"lo": np.array(lo, dtype), "hi": np.array(hi, dtype)}, opt_levels=(0,))
    check("Clip", {"x": x}, opt_levels=(0,))


def test_clip_nan_inf_and_rank0():
    x = np.array([np.nan, np.inf, -np.inf, 0.3, -7], np.float32)
    check("Clip", {"x": x}, initializers={"lo": np.array(-1, np.float32), "hi": np.array(1, np.float32)})
    check("Clip", {"x": np.array(3.5, np.float32)}, initializers={"lo": np.array(-1, np.float32),
                                                                   "hi": np.array(1, np.float32)})


@pytest.mark.parametrize("attrs", [{"min": -0.5, "max": 0.5}, {"min": 0.0}, {"max": 0.25}, {}])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip6_attributes(attrs, dtype):
    with np.errstate(over="ignore"):  # 1e39 is inf in float32
        x = np.concatenate([rand(10, seed=4), [np.inf, -np.inf, 1e39, -1e39]]).astype(dtype)
    check("Clip", {"x": x}, attrs, opset=10)


@pytest.mark.parametrize("opset", [11, 12])
def test_clip11_inputs(opset):
    check("Clip", {"x": rand(4, 5)}, initializers={"lo": np.array(-0.3, np.float32)}, input_names=["x", "lo"],
          opset=opset)


def test_clip_rejects_non_scalar_bound():
    m = node_model("Clip", {"x": rand(4, 5)}, initializers={"lo": np.array([-0.3, 0.2], np.float32)})
    with pytest.raises(UnsupportedModelError, match="'min'\\) must be a scalar"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("xshape", [(2, 3, 4), (2, 3, 4, 5), (2, 3)])
def test_prelu_opset6_per_channel_slope(xshape):
    # PRelu-6: a 1-D slope of length C applies along axis 1 (PyTorch's PReLU(num_parameters=C))
    x, slope = rand(*xshape, seed=1), np.array([0.1, 0.2, 0.3], np.float32)
    m = node_model("PRelu", {"x": x}, initializers={"slope": slope}, opset=9)
    m.opset_import[0].version = 6
    s = slope.reshape((3,) + (1,) * (len(xshape) - 2))
    check_model(m, {"x": x}, expected=[np.where(x < 0, x * s, x)])
