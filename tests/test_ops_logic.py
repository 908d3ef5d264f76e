"""Comparison, logical, bitwise, Where, Cast/CastLike, Identity and Dropout against onnxruntime
(or onnx.reference where onnxruntime lacks the op, type or version); ONNX spec sections of each
op. See tests/test_ops_elementwise.py for ``check``."""
import numpy as np
import onnx
import pytest
from onnx import helper

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tests.oracle import node_model, rand
from tests.test_ops_elementwise import FLOATS, INTS, check, check_model

ALL = INTS + FLOATS + [np.bool_]
CMP = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
BCAST = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3))]


def _vals(shape, dtype, seed):
    if np.dtype(dtype) == np.bool_:
        return rand(*shape, dtype=np.bool_, seed=seed)
    return np.asarray(rand(*shape, dtype=dtype, seed=seed, low=0 if np.dtype(dtype).kind == "u" else -3, high=3)
                      ).round().astype(dtype)   # small integers: many ties for Equal


# ----------------------------------------------------------------------------- comparisons
@pytest.mark.parametrize("op", CMP)
@pytest.mark.parametrize("sa,sb", BCAST)
def test_compare_broadcast(op, sa, sb):
    check(op, {"a": _vals(sa, np.float32, 1), "b": _vals(sb, np.float32, 2)})


@pytest.mark.parametrize("op", CMP)
@pytest.mark.parametrize("dtype", ALL)
def test_compare_dtypes(op, dtype):
    if dtype == np.bool_ and op != "Equal":
        pytest.skip("only Equal takes bool")
    check(op, {"a": _vals((4, 5), dtype, 3), "b": _vals((5,), dtype, 4)}, opset=19, opt_levels=(0,))


def test_compare_nan_and_unsigned_extremes():
    a = np.array([np.nan, 1, np.nan, -np.inf, 0.0], np.float32)
    b = np.array([np.nan, np.nan, 1, -np.inf, -0.0], np.float32)
    for op in CMP:
        check(op, {"a": a, "b": b}, opt_levels=(0,))
    a = np.array([0, 2**64 - 1, 2**63], np.uint64)
    b = np.array([2**63, 1, 2**63 - 1], np.uint64)
    for op in CMP:
        check(op, {"a": a, "b": b}, opt_levels=(0,))


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_compare_old_opsets(opset):
    a, b = _vals((3, 4), np.float32, 5), _vals((4,), np.float32, 6)
    for op in ["Less", "Greater"] + (["Equal"] if opset >= 11 else []):
        check(op, {"a": a, "b": b}, opset=opset, opt_levels=(0,))
    check("Equal", {"a": _vals((3, 4), np.int32, 1), "b": _vals((4,), np.int32, 2)}, opset=opset, opt_levels=(0,))
    if opset >= 9:
        check("LessOrEqual", {"a": a, "b": b}, opset=12, opt_levels=(0,))


# ----------------------------------------------------------------------------- logical, bitwise
@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("sa,sb", BCAST)
def test_logical(op, sa, sb):
    check(op, {"a": _vals(sa, np.bool_, 1), "b": _vals(sb, np.bool_, 2)})


def test_not():
    check("Not", {"x": _vals((3, 4), np.bool_, 1)})
    check("Not", {"x": np.array(True)})


def test_logical_rejects_float():
    m = node_model("And", {"a": np.ones(3, np.bool_), "b": np.ones(3, np.bool_)})
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    with pytest.raises(UnsupportedModelError, match="dtype f32, which ONNX And does not allow"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
@pytest.mark.parametrize("dtype", INTS)
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    a = np.array([0, 1, info.max, info.min, 0x55 % (int(info.max) + 1), 7], dtype)
    b = np.array([info.max, 3, info.min, info.max, 0x0F, 7], dtype)
    ins = {"a": a} if op == "BitwiseNot" else {"a": a, "b": b}
    check(op, ins, opset=18, opt_levels=(0,))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_unsigned(direction, dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([1, 2, 3, 255, 16, np.iinfo(dtype).max], dtype)
    y = np.array([0, 1, 2, 3, bits - 1, 1], dtype)
    check("BitShift", {"x": x, "s": y}, {"direction": direction}, opset=11)
    check("BitShift", {"x": x.reshape(2, 3), "s": np.array([2], dtype)}, {"direction": direction}, opt_levels=(0,))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_bitshift_signed_opset28(dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([-8, -8, 8, 8, -1, 1, -8, 5, -5, 64], dtype)
    y = np.array([1, bits, bits, -1, 3, bits - 1, 100, -3, bits - 1, 2], dtype)
    right = np.array([-4, -1, 0, 0, -1, 0, -1, 0, -1, 16], dtype)
    left = np.array([-16, 0, 0, 0, -8, np.iinfo(dtype).min, 0, 0, np.iinfo(dtype).min, 256 if bits > 8 else 0], dtype)
    check("BitShift", {"x": x, "s": y}, {"direction": "RIGHT"}, opset=28, expected=[right], opt_levels=(0,))
    check("BitShift", {"x": x, "s": y}, {"direction": "LEFT"}, opset=28, expected=[left], opt_levels=(0,))


def test_bitshift_rejects_bad_direction():
    m = node_model("BitShift", {"x": np.ones(3, np.uint8), "s": np.ones(3, np.uint8)}, {"direction": "LEFT"}, opset=11)
    m.graph.node[0].attribute[0].s = b"UP"
    with pytest.raises(UnsupportedModelError, match="direction='UP'"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- IsNaN, IsInf
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -1.5, 3e38], np.float32)


@pytest.mark.parametrize("dtype", FLOATS)
def test_isnan_isinf(dtype):
    with np.errstate(over="ignore"):  # 3e38 is inf in float16
        x = SPECIAL.astype(dtype)
    check("IsNaN", {"x": x}, opset=20, opt_levels=(0,))
    for pos in (0, 1):
        for neg in (0, 1):
            check("IsInf", {"x": x}, {"detect_positive": pos, "detect_negative": neg}, opset=20, opt_levels=(0,))


def test_isnan_isinf_old_opsets():
    check("IsNaN", {"x": SPECIAL.reshape(2, 3)}, opset=9)
    check("IsInf", {"x": SPECIAL.reshape(2, 3)}, {"detect_negative": 0}, opset=10)


# ----------------------------------------------------------------------------- Where
@pytest.mark.parametrize("sc,sx,sy", [((2, 3), (2, 3), (2, 3)), ((3,), (2, 3), ()), ((2, 1), (1, 3), (2, 3)),
                                      ((), (4,), (4,)), ((1, 2, 1), (3, 1, 1), (4,))])
def test_where_broadcast(sc, sx, sy):
    check("Where", {"c": _vals(sc, np.bool_, 1), "a": rand(*sx, seed=2), "b": rand(*sy, seed=3)})


@pytest.mark.parametrize("dtype", ALL)
def test_where_dtypes(dtype):
    check("Where", {"c": _vals((3, 4), np.bool_, 1), "a": _vals((3, 4), dtype, 2), "b": _vals((4,), dtype, 3)},
          opt_levels=(0,))


def test_where_opset9_and_errors():
    check("Where", {"c": _vals((3, 4), np.bool_, 1), "a": rand(3, 4), "b": rand(3, 4, seed=5)}, opset=9)
    m = node_model("Where", {"c": _vals((3,), np.bool_, 1), "a": rand(3), "b": rand(3)})
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT32
    with pytest.raises(UnsupportedModelError, match="dtype i32, which ONNX Where does not allow"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Cast
CAST_VALUES = np.array([0, 1, -1, 2.5, -2.5, 100.75, -100.75, 127, 0.4, -0.0], np.float64)


def _cast_input(src):
    if np.dtype(src) == np.bool_:
        return np.array([True, False, True, True, False, False, True, False, True, False])
    if np.dtype(src).kind == "u":
        return np.abs(CAST_VALUES).astype(src)
    if np.dtype(src).kind == "i":
        return CAST_VALUES.astype(src)
    return CAST_VALUES.astype(src)


@pytest.mark.parametrize("src", ALL)
def test_cast_every_pair(src):
    """One model per source dtype with a Cast to every destination dtype."""
    x = _cast_input(src).reshape(2, 5)
    ins = {"x": x, "ax": np.abs(x)}   # negative float -> unsigned is undefined in ONNX
    nodes, outs = [], []
    for dst in ALL:
        to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
        src_name = "ax" if np.dtype(dst).kind == "u" and np.dtype(src).kind == "f" else "x"
        nodes.append(helper.make_node("Cast", [src_name], [f"y_{np.dtype(dst).name}"], to=to))
        outs.append(helper.make_tensor_value_info(f"y_{np.dtype(dst).name}", to, x.shape))
    tin = helper.np_dtype_to_tensor_dtype(x.dtype)
    g = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info(k, tin, x.shape) for k in ins], outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    check_model(m, ins, opt_levels=(0,))


def test_cast_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 1e-8, -1e-8, 65504.0, 70000.0, 1e-5], np.float32)
    for dst in (np.bool_, np.float16, np.float64):
        check("Cast", {"x": x}, {"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))})
    # float -> narrow integers wrap like a C conversion through a wide integer (as onnxruntime)
    x = np.array([-1.5, 300.7, -129.0, 70000.0], np.float32)
    check("Cast", {"x": x}, {"to": onnx.TensorProto.UINT8}, opt_levels=(0,))
    check("Cast", {"x": x}, {"to": onnx.TensorProto.INT8}, opt_levels=(0,))
    check("Cast", {"x": x}, {"to": onnx.TensorProto.INT16}, opt_levels=(0,))


def test_cast_int64_extremes():
    x = np.array([2**62 + 1, -(2**63), 2**63 - 1, 123456789012345], np.int64)
    for dst in (np.int32, np.uint32, np.float64, np.float32, np.uint64, np.int8):
        check("Cast", {"x": x}, {"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))}, opt_levels=(0,))


@pytest.mark.parametrize("opset", [7, 9, 13, 19, 21])
def test_cast_opsets(opset):
    check("Cast", {"x": rand(3, 4, low=-50, high=50)}, {"to": onnx.TensorProto.INT32}, opset=opset, opt_levels=(0,))


def test_cast_rejects_string():
    m = node_model("Cast", {"x": rand(3)}, {"to": onnx.TensorProto.INT32})
    m.graph.node[0].attribute[0].i = onnx.TensorProto.STRING
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.STRING
    with pytest.raises(UnsupportedModelError, match="to=8"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("src,dst", [(np.float32, np.int64), (np.int32, np.float16), (np.float64, np.bool_),
                                     (np.uint8, np.float32)])
def test_castlike(src, dst):
    x = _cast_input(src).reshape(2, 5)
    check("CastLike", {"x": x, "like": np.zeros((3,), dst)}, opset=15)
    check("CastLike", {"x": x}, initializers={"like": np.zeros((1, 1, 4), dst)}, opset=21, opt_levels=(0,))


# ----------------------------------------------------------------------------- Identity, Dropout
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, np.uint8])
def test_identity(dtype):
    check("Identity", {"x": _vals((2, 3, 4), dtype, 1)})
    check("Identity", {"x": _vals((), dtype, 2)}, opset=13, opt_levels=(0,))


@pytest.mark.parametrize("opset", [12, 13, 22])
@pytest.mark.parametrize("mask", [False, True])
def test_dropout_inference(opset, mask):
    outs = ("y", "mask") if mask else ("y",)
    x = rand(2, 3, 4)
    check("Dropout", {"x": x}, outputs=outs, opset=opset)
    check("Dropout", {"x": x}, outputs=outs, opset=opset, input_names=["x", "r"],
          initializers={"r": np.array(0.3, np.float32)}, opt_levels=(0,))
    check("Dropout", {"x": x}, outputs=outs, opset=opset, input_names=["x", "r", "t"],
          initializers={"r": np.array(0.3, np.float32), "t": np.array(False)}, opt_levels=(0,))
    # training with ratio 0 keeps everything
    check("Dropout", {"x": x}, outputs=outs, opset=opset, input_names=["x", "r", "t"],
          initializers={"r": np.array(0.0, np.float32), "t": np.array(True)}, opt_levels=(0,))


@pytest.mark.parametrize("opset", [7, 10])
def test_dropout_old_versions(opset):
    x = rand(2, 3, 4)
    check("Dropout", {"x": x}, {"ratio": 0.3}, opset=opset)
    # onnxruntime gives an all-zero mask for these versions; ONNX means "kept": ones (as Dropout-12+)
    mask = np.ones(x.shape, np.float32 if opset == 7 else np.bool_)
    m = node_model("Dropout", {"x": x}, {"ratio": 0.3}, outputs=("y", "mask"), opset=opset)
    if opset == 7:   # onnx shape inference leaves Dropout-7's mask untyped
        m.graph.output[1].CopyFrom(helper.make_tensor_value_info("mask", onnx.TensorProto.FLOAT, x.shape))
    check_model(m, {"x": x}, expected=[x, mask])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_dropout_dtypes(dtype):
    check("Dropout", {"x": rand(3, 4, dtype=dtype)}, outputs=("y", "mask"), opset=13, opt_levels=(0,))


def test_dropout_training_is_unsupported():
    m = node_model("Dropout", {"x": rand(3)}, outputs=("y", "mask"), opset=13, input_names=["x", "r", "t"],
                   initializers={"r": np.array(0.5, np.float32), "t": np.array(True)})
    with pytest.raises(UnsupportedModelError, match="training_mode=True with ratio=0.5"):
        tensorfuse.compile(m)
    # a training_mode graph input: the module specialises on its value at the first run
    x = rand(3)
    m = node_model("Dropout", {"x": x, "t": np.array(True)}, opset=13, input_names=["x", "", "t"])
    np.testing.assert_array_equal(tensorfuse.compile(m).run(x=x, t=np.array(False))[0], x)
    with pytest.raises(UnsupportedModelError, match="training_mode=True with ratio=0.5"):
        tensorfuse.compile(m).run(x=x, t=np.array(True))


def test_cast_f64_to_f16_rounds_once():
    # doubles just beside float16 midpoints: rounding through float32 would land on the midpoint
    h = np.arange(1, 0x7BFF, 37, dtype=np.uint16).view(np.float16)
    lo, hi = h.astype(np.float64), np.nextafter(h, np.float16(np.inf)).astype(np.float64)
    mid = (lo + hi) / 2
    x = np.concatenate([mid, mid * (1 + 1e-12), mid * (1 - 1e-12), -mid * (1 + 1e-12),
                        [np.nan, np.inf, -np.inf, -0.0, 65519.99, 65520.0, 1e300, 2.98e-8, 1e-300]])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
    check("Cast", {"x": x}, {"to": onnx.TensorProto.FLOAT16}, expected=[expected], opt_levels=(0,))


def test_cast_f64_to_f16_needs_no_runtime_library():
    # LLVM lowers fptrunc double->half to a __truncdfhf2 call that the JIT cannot always resolve
    # (it crashed unless onnxruntime, which exports it, was loaded): run without onnxruntime
    import subprocess
    import sys
    code = ("import sys, numpy as np, onnx; from onnx import helper; import tensorfuse\n"
            "g = helper.make_graph([helper.make_node('Cast', ['x'], ['y'], to=10)], 'g',\n"
            "    [helper.make_tensor_value_info('x', 11, [3])], [helper.make_tensor_value_info('y', 10, [3])])\n"
            "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]); m.ir_version = 8\n"
            "y = tensorfuse.compile(m).run(x=np.array([1.5, -2.25, 7e4]))[0]\n"
            "assert 'onnxruntime' not in sys.modules\n"
            "print(y.tolist())\n")
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[1.5, -2.25, inf]"
