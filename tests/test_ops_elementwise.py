"""Elementwise math ops against onnxruntime (or onnx.reference where onnxruntime lacks the op,
type or version); ONNX spec sections of each op. ``check`` also runs the op's numpy reference
(constant folding relies on it) against the same oracle."""
import math

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.ir.registry import run_reference
from tests.oracle import node_model, ort_run, rand

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
SINTS = [np.int8, np.int16, np.int32, np.int64]
FLOATS = [np.float16, np.float32, np.float64]
TOL = {np.dtype(np.float16): (2e-3, 2e-3), np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float64): (1e-12, 1e-13)}


def oracle(model, inputs):
    """onnxruntime's outputs, or onnx.reference's where onnxruntime has no kernel for them."""
    try:
        return ort_run(model, inputs), "ort"
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        msg = str(e)
        if not any(s in msg for s in ("NOT_IMPLEMENTED", "Could not find an implementation", "not supported",
                                       "Type Error", "INVALID_GRAPH")):
            raise
    return ReferenceEvaluator(model).run(None, inputs), "ref"


def reference_outputs(model, inputs):
    """Run the imported graph with the registry's numpy references, node by node."""
    g = import_onnx(model)
    env = {id(v): inputs[v.name] for v in g.inputs}
    env.update({id(v): v.data for v in g.constants.values()})
    for n in g.nodes:
        outs = run_reference(n, [None if v is None else env[id(v)] for v in n.inputs])
        env.update({id(v): a for v, a in zip(n.outputs, outs)})
    return [env[id(v)] for v in g.outputs]


def compare(got, expected, rtol, atol, what):
    """Dtype, shape and values of every output; tolerances default to the output's dtype's."""
    assert len(got) == len(expected), what
    for i, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        assert g.dtype == e.dtype, f"{what} output {i}: dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"{what} output {i}: shape {g.shape} != {e.shape}"
        r, a = TOL.get(e.dtype, (0, 0))
        np.testing.assert_allclose(g, e, rtol=r if rtol is None else rtol, atol=a if atol is None else atol,
                                   err_msg=f"{what} output {i}")


def check(op, inputs, attrs=None, *, opset=17, initializers=None, input_names=None, outputs=("y",),
          rtol=None, atol=None, opt_levels=(0, 2), expected=None):
    """Compile a one-node model at each opt level and compare it, and the numpy reference, with
    the oracle (``expected`` overrides it). Returns the oracle's name."""
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    m = node_model(op, inputs, attrs, outputs=outputs, opset=opset, initializers=initializers,
                   input_names=input_names)
    return check_model(m, inputs, rtol=rtol, atol=atol, opt_levels=opt_levels, expected=expected)


def check_model(m, inputs, *, rtol=None, atol=None, opt_levels=(0, 2), expected=None):
    """``check`` for a given model."""
    op = m.graph.node[0].op_type
    src = "given"
    if expected is None:
        expected, src = oracle(m, inputs)
    compare(reference_outputs(m, inputs), expected, rtol, atol, f"{op} reference vs {src}")
    for lvl in opt_levels:
        got = tensorfuse.compile(m, opt_level=lvl).run(**inputs)
        compare(got, expected, rtol, atol, f"{op} O{lvl} vs {src}")
    return src


def nonzero(*shape, dtype=np.float32, seed=0):
    x = rand(*shape, dtype=dtype, seed=seed, low=1, high=5)
    sign = np.where(rand(*shape, dtype=np.float32, seed=seed + 7) > 0, 1, -1)
    return (x * sign).astype(dtype) if np.dtype(dtype).kind != "u" else x


# ----------------------------------------------------------------------------- unary math
UNARY_RANGES = {
    "Neg": (-3, 3), "Abs": (-3, 3), "Reciprocal": (0.5, 3), "Floor": (-3, 3), "Ceil": (-3, 3),
    "Sqrt": (0, 4), "Exp": (-5, 5), "Log": (0.1, 5), "Tanh": (-4, 4), "Erf": (-3, 3),
    "Sin": (-4, 4), "Cos": (-4, 4), "Tan": (-1.4, 1.4), "Asin": (-1, 1), "Acos": (-1, 1),
    "Atan": (-5, 5), "Sinh": (-3, 3), "Cosh": (-3, 3), "Asinh": (-5, 5), "Acosh": (1, 5),
    "Atanh": (-0.99, 0.99), "Sign": (-3, 3), "Round": (-3, 3),
}


@pytest.mark.parametrize("op", sorted(UNARY_RANGES))
@pytest.mark.parametrize("shape", [(2, 3, 5), ()])
def test_unary_f32(op, shape):
    lo, hi = UNARY_RANGES[op]
    check(op, {"x": rand(*shape, low=lo, high=hi, seed=1)})


@pytest.mark.parametrize("op", sorted(UNARY_RANGES))
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_unary_f16_f64(op, dtype):
    lo, hi = UNARY_RANGES[op]
    x = rand(4, 7, low=lo, high=hi, seed=2, dtype=dtype)
    expected = None
    if op == "Erf" and dtype == np.float64:  # onnx.reference computes it in float32
        expected = [np.vectorize(math.erf)(x)]
    check(op, {"x": x}, opt_levels=(0,), expected=expected)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", INTS)
def test_unary_int(op, dtype):
    if op == "Neg" and np.dtype(dtype).kind == "u":
        pytest.skip("Neg has no unsigned types")
    info = np.iinfo(dtype)
    x = np.array([0, 1, 5, info.max, info.min, info.min + 1] + ([-1, -7] if info.min else [3, 9]), dtype)
    check(op, {"x": x}, opt_levels=(0,))


def test_unary_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, 1.5, 2.5, -0.5, -2.5], np.float32)
    for op in ["Round", "Floor", "Ceil", "Abs", "Neg", "Sign", "Exp", "Tanh", "Erf", "Reciprocal"]:
        check(op, {"x": x}, opt_levels=(0,))
    check("Log", {"x": np.array([0.0, -1.0, np.inf, 1.0], np.float32)}, opt_levels=(0,))
    check("Sqrt", {"x": np.array([0.0, -1.0, np.inf, 4.0], np.float32)}, opt_levels=(0,))


def test_unary_rejects_int_for_float_op():
    m = node_model("Exp", {"x": np.ones(3, np.float32)})
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT32
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT32
    with pytest.raises(UnsupportedModelError, match=r"dtype i32, which ONNX Exp does not allow"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- binary arithmetic
BCAST = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((2, 1, 4), (3, 1)),
         ((), (2, 3)), ((5,), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa,sb", BCAST)
def test_arith_broadcast_f32(op, sa, sb):
    check(op, {"a": rand(*sa, seed=1), "b": nonzero(*sb, seed=2)})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_arith_dtypes(op, dtype):
    a = nonzero(3, 4, dtype=dtype, seed=3) * (3 if np.dtype(dtype).kind != "u" else 1)
    b = nonzero(4, dtype=dtype, seed=4)
    check(op, {"a": a.astype(dtype), "b": b}, opt_levels=(0,))


@pytest.mark.parametrize("dtype", SINTS + [np.uint8, np.uint32])
def test_int_div_truncates_and_wraps(dtype):
    info = np.iinfo(dtype)
    if info.min < 0:
        a = np.array([7, -7, 7, -7, 0, 1, -1, info.max, info.min, info.min + 1], dtype)
        b = np.array([2, 2, -2, -2, 3, -3, 3, 2, 3, -1], dtype)
        # INT_MIN / -1 overflows (onnxruntime traps): we wrap, as two's complement does
        check("Div", {"a": np.array([info.min], dtype), "b": np.array([-1], dtype)},
              expected=[np.array([info.min], dtype)], opt_levels=(0,))
    else:
        a = np.array([7, 0, 1, info.max, 200], dtype)
        b = np.array([2, 3, 3, 2, 9], dtype)
    m = node_model("Div", {"a": a, "b": b})
    expected = ort_run(m, {"a": a, "b": b})
    check("Div", {"a": a, "b": b}, expected=expected, opt_levels=(0,))
    if info.min < 0:
        np.testing.assert_array_equal(expected[0][:4], [3, -3, -3, 3])
    # Add wraps on overflow
    check("Add", {"a": np.array([info.max, info.min], dtype), "b": np.array([1, info.max], dtype)}, opt_levels=(0,))


def test_int_div_by_zero_is_zero():
    a = np.array([5, -5, 0], np.int32)
    b = np.zeros(3, np.int32)
    check("Div", {"a": a, "b": b}, expected=[np.zeros(3, np.int32)], opt_levels=(0,))


def test_arith_rejects_mixed_dtypes():
    m = node_model("Add", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    m.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    with pytest.raises(UnsupportedModelError, match="same dtype"):
        tensorfuse.compile(m, input_shapes=None)


def test_arith_rejects_non_broadcastable():
    m = node_model("Mul", {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)})
    m.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 4
    del m.graph.output[0].type.tensor_type.shape.dim[:]
    with pytest.raises(UnsupportedModelError, match="do not broadcast"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("opset", [7, 13])
def test_arith_old_opsets(opset):
    a, b = rand(2, 3, seed=1), nonzero(3, seed=2)
    for op in ["Add", "Sub", "Mul", "Div"]:
        check(op, {"a": a, "b": b}, opset=opset, opt_levels=(0,))


def test_arith_constant_operand():
    check("Mul", {"a": rand(2, 3, 4)}, initializers={"b": np.float32(0.5) * np.ones((3, 1), np.float32)})


# ----------------------------------------------------------------------------- Mod
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", INTS)
def test_mod_int(fmod, dtype):
    info = np.iinfo(dtype)
    if info.min < 0:
        a = np.array([7, -7, 7, -7, 0, 6, -6, info.min, info.max, 5], dtype)
        b = np.array([3, 3, -3, -3, 3, 3, -3, 7, -7, 1], dtype)
    else:
        a = np.array([7, 0, 6, info.max, 5], dtype)
        b = np.array([3, 3, 3, 7, 1], dtype)
    check("Mod", {"a": a, "b": b}, {"fmod": fmod}, opt_levels=(0,))


def test_mod_int_broadcast():
    check("Mod", {"a": rand(2, 3, 4, dtype=np.int32, low=-20, high=20), "b": nonzero(4, dtype=np.int32)})


@pytest.mark.parametrize("dtype", FLOATS)
def test_mod_float_fmod1(dtype):
    a = rand(3, 5, dtype=dtype, low=-10, high=10)
    check("Mod", {"a": a, "b": nonzero(5, dtype=dtype)}, {"fmod": 1}, opt_levels=(0,))


def test_mod_float_floor_opset28():
    a = np.array([7, -7, 7, -7, 0, -0.0, 5, np.inf, 3, 4.5, np.nan, 2], np.float32)
    b = np.array([2, 2, -2, -2, 3, -3, np.inf, 2, -np.inf, 0, 1, np.nan], np.float32)
    check("Mod", {"a": a, "b": b}, opset=28, opt_levels=(0,))
    a = rand(4, 6, seed=3, low=-9, high=9).astype(np.float64)
    check("Mod", {"a": a, "b": nonzero(6, dtype=np.float64)}, opset=28, opt_levels=(0,))


# ----------------------------------------------------------------------------- Pow
@pytest.mark.parametrize("tb,te", [(np.float32, np.float32), (np.float32, np.int64), (np.float32, np.int32),
                                   (np.float64, np.float64), (np.float32, np.float64), (np.float64, np.float32),
                                   (np.float16, np.float16), (np.int32, np.int32), (np.int64, np.int64),
                                   (np.int32, np.float32), (np.int64, np.float64), (np.float32, np.uint8)])
def test_pow_dtypes(tb, te):
    base = np.array([2, 3, -2, 3, 0.5, 1.5, -1, 0], tb)
    if np.dtype(te).kind == "f":
        exp = np.array([0.5, 2.5, 3, 0, 2, -1.5, 2, 3], te)
        base = np.abs(base) if np.dtype(tb).kind == "f" else base
        if np.dtype(tb).kind == "f":
            exp = np.abs(exp) if np.dtype(tb) == np.float16 else exp
    else:
        exp = np.array([-1, 3, 3, 0, 2, 5, 7, 1], te) if np.dtype(te).kind == "i" else np.arange(8).astype(te)
        if np.dtype(tb).kind != "f":
            exp = np.abs(exp)
    check("Pow", {"a": base, "b": exp}, opt_levels=(0,))


def test_pow_broadcast_and_int_negative_exponent():
    check("Pow", {"a": rand(2, 3, 4, low=0.1, high=3), "b": rand(4, seed=3)})
    b, e = np.array([2, 3, -2, 1], np.int64), np.array([-1, 39, 3, -3], np.int64)
    check("Pow", {"a": b, "b": e}, opt_levels=(0,))   # 2**-1 truncates to 0; 3**39 via f64, as ORT


def test_pow_opset7_same_types():
    check("Pow", {"a": rand(3, 4, low=0.1, high=3), "b": rand(1, 4, seed=2)}, opset=7, opt_levels=(0,))


# ----------------------------------------------------------------------------- variadic
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("shapes", [[(3, 4)], [(3, 4), (3, 4)], [(2, 3, 4), (4,), (3, 1)], [(), (2, 2), (1, 2), (2, 1)]])
def test_variadic_broadcast(op, shapes):
    ins = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    check(op, ins)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_variadic_dtypes(op, dtype):
    if op in ("Sum", "Mean") and np.dtype(dtype).kind != "f":
        pytest.skip("Sum and Mean are float-only in ONNX")
    ins = {f"x{i}": rand(3, 4, seed=i, dtype=dtype, low=0, high=9) for i in range(3)}
    check(op, ins, opt_levels=(0,))


def test_max_min_nan_propagate():
    a = np.array([1, np.nan, 3, np.nan], np.float32)
    b = np.array([np.nan, 2, 1, np.nan], np.float32)
    for op in ["Max", "Min", "Sum", "Mean"]:
        check(op, {"a": a, "b": b}, opt_levels=(0,))


@pytest.mark.parametrize("opset", [7, 8, 12])
def test_variadic_old_opsets(opset):
    ins = {"a": rand(2, 3, seed=1), "b": rand(2, 3, seed=2)}
    for op in ["Sum", "Max", "Min", "Mean"]:
        check(op, ins, opset=opset, opt_levels=(0,))


def test_variadic_rejects_mixed_dtypes():
    m = node_model("Max", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    m.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.INT64
    with pytest.raises(UnsupportedModelError, match="same dtype"):
        tensorfuse.compile(m)
