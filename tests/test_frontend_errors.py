"""Issue 9 defects 3 and 5: bad models get our own errors at compile time, naming the node or
value, never numpy's, protobuf's or LLVM's; tensors over the memory cap are refused when
compiling; attributes outside the spec's values and declarations contradicting inference are
refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from tensorfuse.ir.errors import ModelLoadError, UnsupportedModelError
from tensorfuse.compiler.limits import parse_size, resolve_max_memory
from oracle import assert_matches_ort, rand


def _model(nodes, inputs, outputs, inits=(), name="g"):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


X2 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
Y2 = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])


def _compile(m, **kw):
    return tensorfuse.compile(m, cache=False, **kw)


# -- defect 3: Constant nodes ---------------------------------------------------------------
def test_constant_without_value_attribute():
    m = _model([helper.make_node("Constant", [], ["c"], name="k"), helper.make_node("Add", ["x", "c"], ["y"])],
               [X2], [Y2])
    with pytest.raises(ModelLoadError, match=r"node 'k' \(Constant\): a Constant needs exactly one value attribute"):
        _compile(m)


@pytest.mark.parametrize("nbytes", [12, 16])
def test_constant_raw_data_larger_than_dims(nbytes):
    t = numpy_helper.from_array(np.ones(2, np.float32), "v")
    t.raw_data = b"\0" * nbytes
    m = _model([helper.make_node("Constant", [], ["c"], name="k", value=t), helper.make_node("Add", ["x", "c"], ["y"])],
               [X2], [Y2])
    with pytest.raises(ModelLoadError, match=rf"node 'k' \(Constant\): attribute 'value': the tensor's raw_data "
                                             rf"has {nbytes} bytes, its dims \[2\] and type FLOAT need 8"):
        _compile(m)


def test_attribute_tensor_with_bad_raw_data_names_the_node():
    t = numpy_helper.from_array(np.array([1.0], np.float32), "v")
    t.raw_data = b"\0" * 8
    s = numpy_helper.from_array(np.array([2], np.int64), "s")
    m = _model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos", value=t),
                helper.make_node("Add", ["x", "c"], ["y"])], [X2], [Y2], [s])
    with pytest.raises(ModelLoadError, match=r"node 'cos' \(ConstantOfShape\): attribute 'value': the tensor's raw_data"):
        _compile(m)


# -- defect 3: names ----------------------------------------------------------------------
def _named_model():
    return _model([helper.make_node("Relu", ["x"], ["QQQQ"], name="NNNN"), helper.make_node("Neg", ["QQQQ"], ["y"])],
                  [X2], [Y2], name="GGGG")


@pytest.mark.parametrize("placeholder,what", [(b"QQQQ", r"node #0 \(Relu\) output"), (b"GGGG", "graph name"),
                                              (b"NNNN", r"node #0 \(Relu\) node name")])
@pytest.mark.parametrize("opt_level", [0, 2])
def test_non_utf8_names(placeholder, what, opt_level):
    data = _named_model().SerializeToString().replace(placeholder, b"\xff\xfe" + placeholder[2:])
    with pytest.raises(ModelLoadError, match=rf"{what}: the name b'\\xff\\xfe.*' is not valid UTF-8"):
        _compile(data, opt_level=opt_level)


@pytest.mark.parametrize("opt_level", [0, 2])
def test_long_value_names_sharing_a_prefix(opt_level):
    a, b = "v" * 1200 + "a", "v" * 1200 + "b"
    m = _model([helper.make_node("Relu", ["x"], [a]), helper.make_node("Neg", ["x"], [b]),
                helper.make_node("Add", [a, b], ["y"])], [X2], [Y2])
    x = np.array([1.5, -2.0], np.float32)
    assert_matches_ort(m, {"x": x}, opt_levels=(opt_level,), cache=False)


# -- defect 3: the memory cap ---------------------------------------------------------------
def test_conv_pads_beyond_the_memory_cap():
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 3])
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2 ** 31 + 3, 2 ** 31 + 3])
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[2 ** 30] * 4)], [xi], [y], [w])
    with pytest.raises(UnsupportedModelError, match=r"node 'conv' \(Conv\) output: 'y' of shape "
                                                    r"\[1, 1, 2147483651, 2147483651\] \(f32\) needs .* more than the memory cap"):
        _compile(m)


def _cos_model(shape):
    s = numpy_helper.from_array(np.array(shape, np.int64), "s")
    x1 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    return _model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="big"),
                   helper.make_node("Add", ["x", "c"], ["y"])], [x1], [y], [s])


@pytest.mark.parametrize("opt_level", [0, 2])
def test_constant_of_shape_of_4_tib(opt_level):
    with pytest.raises(UnsupportedModelError, match=r"node 'big' \(ConstantOfShape\) output: 'c' of shape "
                                                    r"\[1048576, 1048576\] \(f32\) needs 4.0 TiB"):
        _compile(_cos_model([2 ** 20, 2 ** 20]), opt_level=opt_level)


def test_memory_cap_option_and_env(monkeypatch):
    m = _cos_model([1024, 1024])            # 4 MiB per tensor
    with pytest.raises(UnsupportedModelError, match=r"needs 4.0 MiB, more than the memory cap of 1.0 MiB"):
        _compile(m, max_memory="1M")
    monkeypatch.setenv("TENSORFUSE_MAX_MEMORY", "2MiB")
    with pytest.raises(UnsupportedModelError, match=r"more than the memory cap of 2.0 MiB"):
        _compile(m)
    out = _compile(m, max_memory=8 << 20).run(np.array([1.0], np.float32))[0]   # the option wins
    np.testing.assert_array_equal(out, np.ones((1024, 1024), np.float32))
    monkeypatch.setenv("TENSORFUSE_MAX_MEMORY", "lots")
    with pytest.raises(ValueError, match="TENSORFUSE_MAX_MEMORY must be a number of bytes"):
        _compile(m)


def test_parse_size():
    assert parse_size("64G") == 64 << 30 and parse_size("512MiB") == 512 << 20 and parse_size(4096) == 4096
    assert parse_size(" 3 kb ") == 3 << 10
    for bad in ("-1", "0", "1.5G", "x", True):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert resolve_max_memory(None) > 0


# -- defect 5: flag attributes outside {0, 1} -----------------------------------------------------
def _with_attr(m, name, value):
    for a in m.graph.node[0].attribute:
        if a.name == name:
            a.i = value
            return m
    m.graph.node[0].attribute.append(helper.make_attribute(name, value))
    return m


@pytest.mark.parametrize("value", [-1, 2, 100])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceSum", "ArgMax", "ArgMin"])
def test_keepdims_outside_0_1_is_refused(op, value):
    from oracle import node_model
    x = rand(2, 3)
    if op.startswith("Arg"):
        m = node_model(op, {"x": x}, dict(axis=1, keepdims=1))
    else:
        m = node_model(op, {"x": x}, dict(keepdims=1), initializers={"axes": np.array([1], np.int64)},
                       opset=18 if op == "ReduceMax" else 17)
    m.graph.node[0].name = "r"
    _with_attr(m, "keepdims", value)
    with pytest.raises(ModelLoadError, match=rf"node 'r' \({op}\): attribute 'keepdims' is {value}; "
                                             r"the ONNX spec allows only 0 or 1"):
        _compile(m)


@pytest.mark.parametrize("op,attrs,flag", [
    ("Gemm", {"transA": 0}, "transA"), ("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 0}, "ceil_mode"),
    ("MaxPool", {"kernel_shape": [2, 2], "storage_order": 0}, "storage_order")])
def test_other_flags_outside_0_1_are_refused(op, attrs, flag):
    from oracle import node_model
    if op == "Gemm":
        m = node_model(op, {"a": rand(2, 3), "b": rand(3, 4)}, attrs)
    else:
        m = node_model(op, {"x": rand(1, 1, 4, 4)}, attrs)
    _with_attr(m, flag, 3)
    with pytest.raises(ModelLoadError, match=rf"attribute '{flag}' is 3; the ONNX spec allows only 0 or 1"):
        _compile(m)


def test_attention_is_causal_2_is_refused():
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 2, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8])
    g = helper.make_graph([helper.make_node("Attention", ["q", "q", "q"], ["y"], name="att", is_causal=2)],
                          "g", [q], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    with pytest.raises(ModelLoadError, match=r"node 'att' \(Attention\): attribute 'is_causal' is 2"):
        _compile(m)


# -- defect 5: declarations contradicting inference -----------------------------------------------
def _relu(out_dims, elem=TensorProto.FLOAT):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", elem, out_dims)
    return _model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])], [x], [y])


def test_declared_output_shape_contradiction_warns():
    # a warning, not an error: onnx shape inference writes such declarations for valid models
    # (see DeclaredShapeWarning) and onnxruntime runs them with the computed shape
    from tensorfuse.ir.errors import DeclaredShapeWarning
    x = rand(2, 3)
    with pytest.warns(DeclaredShapeWarning, match=r"graph output 'y' is declared with shape \[2, 4\], but its shape is \[2, 3\]"):
        m = _relu([2, 4])
        got = _compile(m).run(x)[0]
    np.testing.assert_array_equal(got, -np.maximum(x, 0))
    with pytest.warns(DeclaredShapeWarning, match=r"graph output 'y' is declared with shape \[6\]"):
        _compile(_relu([6]))


def test_declared_output_dtype_contradiction():
    with pytest.raises(ModelLoadError, match=r"graph output 'y' is declared f64, but it is f32"):
        _compile(_relu([2, 3], TensorProto.DOUBLE))


def test_symbolic_and_unknown_declared_dims_are_fine():
    x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)
    for dims in (["N", 3], [None, None], ["a", "b"]):
        m = _relu(dims)
        np.testing.assert_array_equal(_compile(m).run(x)[0], -np.maximum(x, 0))


def test_value_info_contradiction():
    m = _relu([2, 3])
    m.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [3, 2]))
    from tensorfuse.ir.errors import DeclaredShapeWarning
    with pytest.warns(DeclaredShapeWarning, match=r"value_info 'h' is declared with shape \[3, 2\], but its shape is \[2, 3\]"):
        _compile(m)
    m = _relu([2, 3])
    m.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.INT64, ["a", "b"]))
    with pytest.raises(ModelLoadError, match=r"value_info 'h' is declared i64, but it is f32"):
        _compile(m)


def test_initializer_declared_as_input_with_another_shape():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    wdecl = helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x, wdecl], [y], [w])
    with pytest.raises(ModelLoadError, match=r"graph input \(an initializer\) 'w' is declared with shape \[3, 2\], "
                                             r"but its shape is \[2, 3\]"):
        _compile(m)
    m.graph.input[1].CopyFrom(helper.make_tensor_value_info("w", TensorProto.FLOAT, ["a", 3]))   # fine
    xv = rand(2, 3)
    np.testing.assert_array_equal(_compile(m).run(xv)[0], xv + 1)
