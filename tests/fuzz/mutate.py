"""Byte-level and structural mutations of ONNX models, and the outcome of compiling one.

:func:`mutate` (seed, list of base models) -> (name of the mutation, the mutated file's bytes).
Structural mutations edit the ``ModelProto``: deleted inputs, initializers and nodes, renamed
values (dangling, empty, very long and colliding, not valid UTF-8, odd characters), extreme or
wrongly typed attributes (2^30 pads, -1, 2^62, NaN, a float where an int belongs, lists of the
wrong length), mismatched tensor sizes (raw data too short or long, dims changed, a Constant
without a value), wrong dtypes, cycles and nodes out of order, duplicate outputs, bad opsets and
IR versions, bad input shapes and types, declared output types that disagree, unknown ops and
domains, inputs added or removed. Byte-level ones flip, cut, insert and repeat bytes of the
serialised file.

:func:`tensorfuse_outcome` compiles the bytes (and runs the module on random inputs of the
declared types) and classifies the result; :func:`ort_outcome` does the same with onnxruntime.
Both run in a child process (``fuzz.isolate``): an abort or a hang is an outcome.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# ---------------------------------------------------------------------------------------------
# base models: small ones that cover what the frontend parses (Constant nodes, shape inputs,
# attributes of every type); the scripts add real models and random graphs


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "base", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _w(name, shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32), name)


def _i(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def base_models() -> dict[str, onnx.ModelProto]:
    """Small valid models, each a few ops (all compile and run on tensorfuse and onnxruntime)."""
    ms = {}
    ms["conv_bn_relu_pool"] = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], group=1),
         helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["n"], epsilon=1e-5),
         helper.make_node("Relu", ["n"], ["r"]),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=0),
         helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
         helper.make_node("Flatten", ["gp"], ["f"], axis=1),
         helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1, alpha=1.0, beta=1.0)],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 5])],
        [_w("w", [4, 3, 3, 3]), _w("b", [4], 1), _w("g", [4], 2), _w("be", [4], 3), _w("mu", [4], 4),
         numpy_helper.from_array(np.full(4, 0.9, np.float32), "var"), _w("fw", [5, 4], 5), _w("fb", [5], 6)])
    ms["matmul_gelu_ln"] = _model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Div", ["a", "sq2"], ["d"]),
         helper.make_node("Erf", ["d"], ["e"]),
         helper.make_node("Add", ["e", "one"], ["e1"]),
         helper.make_node("Mul", ["a", "e1"], ["ge"]),
         helper.make_node("Mul", ["ge", "half"], ["gelu"]),
         helper.make_node("LayerNormalization", ["gelu", "lg", "lb"], ["y"], axis=-1, epsilon=1e-5),
         helper.make_node("ReduceSum", ["gelu", "ax"], ["s"], keepdims=1)],
        [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 6]), _vi("s", [2, 3, 1])],
        [_w("w", [4, 6]), _w("b", [6], 1), numpy_helper.from_array(np.float32(math.sqrt(2)), "sq2"),
         numpy_helper.from_array(np.float32(1), "one"), numpy_helper.from_array(np.float32(0.5), "half"),
         _w("lg", [6], 2), _w("lb", [6], 3), _i("ax", [-1])])
    ms["shape_ops"] = _model(
        [helper.make_node("Constant", [], ["shp"], value=numpy_helper.from_array(np.asarray([2, 12], np.int64), "shp_t")),
         helper.make_node("Reshape", ["x", "shp"], ["r"], allowzero=0),
         helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
         helper.make_node("Gather", ["t", "idx"], ["g"], axis=0),
         helper.make_node("Slice", ["g", "st", "en", "axs", "sp"], ["sl"]),
         helper.make_node("Concat", ["sl", "sl"], ["cc"], axis=1),
         helper.make_node("Shape", ["cc"], ["sh"]),
         helper.make_node("ConstantOfShape", ["sh"], ["z"], value=numpy_helper.from_array(np.asarray([0.5], np.float32), "v")),
         helper.make_node("Add", ["cc", "z"], ["y"]),
         helper.make_node("Softmax", ["y"], ["sm"], axis=-1)],
        [_vi("x", [4, 6])], [_vi("sm", [3, 2])],
        [_i("idx", [0, 5, -1]), _i("st", [0]), _i("en", [1]), _i("axs", [1]), _i("sp", [1])])
    ms["attention"] = _model(
        [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
         helper.make_node("MatMul", ["x", "wv"], ["v"]),
         helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["q", "kt"], ["s"]),
         helper.make_node("Mul", ["s", "scale"], ["ss"]),
         helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "v"], ["o"]),
         helper.make_node("ReduceMean", ["o"], ["y"], axes=[1], keepdims=0)],
        [_vi("x", [1, 5, 4])], [_vi("y", [1, 4]), _vi("o", [1, 5, 4])],
        [_w("wq", [4, 4]), _w("wk", [4, 4], 1), _w("wv", [4, 4], 2),
         numpy_helper.from_array(np.float32(0.5), "scale")])
    ms["convtranspose_resize_pad"] = _model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["ct"], strides=[2, 2], pads=[1, 1, 0, 0], group=1),
         helper.make_node("Resize", ["ct", "", "sc"], ["rs"], mode="linear"),
         helper.make_node("Pad", ["rs", "pads"], ["pd"], mode="reflect"),
         helper.make_node("AveragePool", ["pd"], ["ap"], kernel_shape=[3, 3], count_include_pad=1, ceil_mode=1, strides=[2, 2]),
         helper.make_node("Where", ["cond", "ap", "alt"], ["y"])],
        [_vi("x", [1, 2, 3, 3])], [_vi("y", None)],
        [_w("w", [2, 3, 2, 2]), numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "sc"),
         _i("pads", [0, 0, 1, 1, 0, 0, 1, 1]), numpy_helper.from_array(np.asarray(True), "cond"),
         numpy_helper.from_array(np.float32(0.0), "alt")])
    for k, m in ms.items():
        ms[k] = onnx.shape_inference.infer_shapes(m)
        del ms[k].graph.value_info[:]
        fix = {o.name: o for o in onnx.shape_inference.infer_shapes(m).graph.output}
        for o in ms[k].graph.output:
            o.CopyFrom(fix[o.name])
    return ms


# ---------------------------------------------------------------------------------------------
# structural mutations: each takes (ModelProto copy, rng) and edits it in place, or raises
# NotApplicable


class NotApplicable(Exception):
    pass


def _values(m):
    """Every value name read or written in the graph."""
    names = [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer]
    for n in m.graph.node:
        names += [x for x in list(n.input) + list(n.output) if x]
    return list(dict.fromkeys(names))


def _rename_all(m, old, new):
    for n in m.graph.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new
        for i, x in enumerate(n.output):
            if x == old:
                n.output[i] = new
    for coll in (m.graph.input, m.graph.output, m.graph.value_info):
        for v in coll:
            if v.name == old:
                v.name = new
    for t in m.graph.initializer:
        if t.name == old:
            t.name = new


def _pick(r, seq):
    seq = list(seq)
    if not seq:
        raise NotApplicable
    return seq[int(r.integers(len(seq)))]


def m_delete_input(m, r):
    i = int(r.integers(len(m.graph.input))) if len(m.graph.input) else None
    if i is None:
        raise NotApplicable
    del m.graph.input[i]


def m_delete_initializer(m, r):
    if not m.graph.initializer:
        raise NotApplicable
    del m.graph.initializer[int(r.integers(len(m.graph.initializer)))]


def m_delete_node(m, r):
    if not m.graph.node:
        raise NotApplicable
    del m.graph.node[int(r.integers(len(m.graph.node)))]


def m_rename_dangling(m, r):
    """A node reads (or writes) a name nothing defines (reads)."""
    n = _pick(r, m.graph.node)
    if r.random() < 0.5 and len(n.input):
        n.input[int(r.integers(len(n.input)))] = str(r.choice(["nope", "", "x ", n.output[0]]))
    else:
        n.output[int(r.integers(len(n.output)))] = str(r.choice(["nope", "", _pick(r, _values(m))]))


ODD_NAMES = ["", " ", "x y", "%1", "a/b:c.d", "é字", "\n\t", "0", "-1", "@main", "a" * 5000,
             "tf_run", "llvm.memcpy", "__init__", "\"quoted\"", "a\\b", "\x00z", "kernel_0"]


def m_rename_odd(m, r):
    """Rename a value everywhere (still consistent) to an odd or very long name."""
    old = _pick(r, _values(m))
    new = str(r.choice(ODD_NAMES))
    if new in _values(m):
        raise NotApplicable
    _rename_all(m, old, new)


def m_rename_long_colliding(m, r):
    """Two values renamed to 1500-character names that differ only at the end."""
    vals = _values(m)
    if len(vals) < 2:
        raise NotApplicable
    a, b = r.choice(len(vals), size=2, replace=False)
    stem = "v" * int(r.choice([300, 1000, 1500, 4000]))
    _rename_all(m, vals[a], stem + "1")
    _rename_all(m, vals[b], stem + "2")
    if r.random() < 0.5:
        m.graph.name = stem
    for n in m.graph.node:
        if r.random() < 0.5:
            n.name = stem + n.name


EXTREME_INTS = [0, -1, -2, 2, 3, 100, 2 ** 30, 2 ** 31, 2 ** 62, -(2 ** 63), 2 ** 63 - 1]
EXTREME_FLOATS = [0.0, -1.0, 1e38, -1e38, float("nan"), float("inf"), float("-inf"), 1e-45]


def m_extreme_attribute(m, r):
    nodes = [n for n in m.graph.node if n.attribute]
    n = _pick(r, nodes)
    a = _pick(r, n.attribute)
    if a.type == onnx.AttributeProto.INT:
        a.i = int(r.choice(EXTREME_INTS))
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = float(r.choice(EXTREME_FLOATS))
    elif a.type == onnx.AttributeProto.INTS:
        if len(a.ints) and r.random() < 0.6:
            a.ints[int(r.integers(len(a.ints)))] = int(r.choice(EXTREME_INTS))
        else:   # wrong length
            vals = list(a.ints)
            del a.ints[:]
            a.ints.extend(vals[:-1] if vals and r.random() < 0.5 else vals + [1, 1, 1][: int(r.integers(1, 4))])
    elif a.type == onnx.AttributeProto.STRING:
        a.s = bytes(r.choice([b"", b"NOPE", b"same_upper", b"\xff\xfe", b"SAME_UPPER ", b"tanh"]))
    elif a.type == onnx.AttributeProto.TENSOR:
        t = a.t
        if t.dims and r.random() < 0.5:
            t.dims[0] = int(r.choice([0, 2 ** 40, 3]))
        else:
            t.raw_data = t.raw_data[: len(t.raw_data) // 2]
    else:
        raise NotApplicable


def m_retype_attribute(m, r):
    """An attribute of the wrong type (a float where an int belongs, ...)."""
    n = _pick(r, [n for n in m.graph.node if n.attribute])
    i = int(r.integers(len(n.attribute)))
    old = n.attribute[i]
    choices = [helper.make_attribute(old.name, 1.5), helper.make_attribute(old.name, 3),
               helper.make_attribute(old.name, "x"), helper.make_attribute(old.name, [1, 2]),
               helper.make_attribute(old.name, [1.0, 2.0]), helper.make_attribute(old.name, ["a"]),
               helper.make_attribute(old.name, numpy_helper.from_array(np.zeros((2,), np.float32)))]
    new = choices[int(r.integers(len(choices)))]
    if new.type == old.type:
        raise NotApplicable
    n.attribute[i].CopyFrom(new)


def m_add_attribute(m, r):
    """An unknown attribute, or a known one at a value outside the spec (keepdims=2 ...)."""
    n = _pick(r, m.graph.node)
    name, val = [("nonsense", 1), ("keepdims", int(r.choice([-1, 2, 100]))), ("axis", int(r.choice([-100, 7, 2 ** 40]))),
                 ("group", int(r.choice([0, -3, 7]))), ("auto_pad", "SAME_UPPER"), ("pads", [2 ** 30] * 4),
                 ("perm", [0, 0]), ("allowzero", 3), ("approximate", "fast"), ("to", 0),
                 ("ceil_mode", 5), ("count_include_pad", -1), ("select_last_index", 2)][int(r.integers(13))]
    for a in list(n.attribute):
        if a.name == name:
            n.attribute.remove(a)
    n.attribute.append(helper.make_attribute(name, val))


def m_remove_attribute(m, r):
    n = _pick(r, [n for n in m.graph.node if n.attribute])
    del n.attribute[int(r.integers(len(n.attribute)))]


def _tensors(m):
    ts = list(m.graph.initializer)
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                ts.append(a.t)
    return ts


def m_tensor_size(m, r):
    """An initializer's or Constant's data that does not match its dims."""
    t = _pick(r, _tensors(m))
    arr = numpy_helper.to_array(t)
    if not t.raw_data:
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
    u = r.random()
    if u < 0.3:
        t.raw_data = t.raw_data[: max(0, len(t.raw_data) - int(r.integers(1, 9)))]
    elif u < 0.5:
        t.raw_data = t.raw_data + bytes(int(r.integers(1, 9)))
    elif u < 0.8:
        if t.dims:
            t.dims[int(r.integers(len(t.dims)))] += int(r.choice([1, -1, 1000, 2 ** 33]))
        else:
            t.dims.append(int(r.choice([0, 2, 2 ** 35])))
    else:
        del t.dims[:]
        t.dims.extend([-1, 3])


def m_tensor_dtype(m, r):
    t = _pick(r, _tensors(m))
    t.data_type = int(r.choice([TensorProto.INT64, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.STRING,
                                TensorProto.BOOL, TensorProto.UINT8, TensorProto.COMPLEX64, 0, 99]))


def m_constant_without_value(m, r):
    consts = [n for n in m.graph.node if n.op_type == "Constant"]
    if consts and r.random() < 0.7:
        n = _pick(r, consts)
        del n.attribute[:]
        if r.random() < 0.5:
            n.attribute.append(helper.make_attribute("value_float", 1.5))
            n.attribute.append(helper.make_attribute("value_int", 1))
    else:
        i = int(r.integers(len(m.graph.node) + 1))
        m.graph.node.insert(i, helper.make_node("Constant", [], ["kc"]))
        n = _pick(r, m.graph.node)
        if n.input:
            n.input[0] = "kc"


def m_cycle(m, r):
    """A node reads a value made later (out of order), or its own output (a cycle)."""
    if len(m.graph.node) < 2:
        raise NotApplicable
    i = int(r.integers(len(m.graph.node) - 1))
    n = m.graph.node[i]
    later = m.graph.node[int(r.integers(i, len(m.graph.node)))]
    if not n.input:
        raise NotApplicable
    n.input[int(r.integers(len(n.input)))] = later.output[0]
    if r.random() < 0.3:
        # and swap two nodes, so the order is also wrong where there is no cycle
        j = int(r.integers(len(m.graph.node)))
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(m.graph.node[i])
        b.CopyFrom(m.graph.node[j])
        m.graph.node[i].CopyFrom(b)
        m.graph.node[j].CopyFrom(a)


def m_swap_nodes(m, r):
    if len(m.graph.node) < 2:
        raise NotApplicable
    i, j = r.choice(len(m.graph.node), size=2, replace=False)
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[int(i)])
    b.CopyFrom(m.graph.node[int(j)])
    m.graph.node[int(i)].CopyFrom(b)
    m.graph.node[int(j)].CopyFrom(a)


def m_duplicate_output(m, r):
    u = r.random()
    if u < 0.3:
        m.graph.output.append(m.graph.output[0])
    elif u < 0.6 and len(m.graph.node) >= 2:
        a, b = r.choice(len(m.graph.node), size=2, replace=False)
        m.graph.node[int(b)].output[0] = m.graph.node[int(a)].output[0]
    elif u < 0.8 and m.graph.input:
        n = _pick(r, m.graph.node)
        n.output[0] = m.graph.input[0].name
    else:
        o = onnx.ValueInfoProto()
        o.CopyFrom(m.graph.output[0])
        o.name = _pick(r, [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer])
        m.graph.output.append(o)


def m_bad_opset(m, r):
    u = r.random()
    if u < 0.5:
        m.opset_import[0].version = int(r.choice([0, 1, 6, 7, 9, 11, 13, 16, 99, 10000, -1]))
    elif u < 0.7:
        del m.opset_import[:]
    elif u < 0.85:
        m.opset_import.append(helper.make_opsetid("", int(r.choice([11, 18]))))
    else:
        m.opset_import.append(helper.make_opsetid(str(r.choice(["com.microsoft", "x.y", ""])), 1))
    if r.random() < 0.3:
        m.ir_version = int(r.choice([0, 1, 3, 100, -1]))


def m_input_shape(m, r):
    i = _pick(r, list(m.graph.input))
    tt = i.type.tensor_type
    u = r.random()
    if u < 0.5 and tt.shape.dim:
        d = tt.shape.dim[int(r.integers(len(tt.shape.dim)))]
        v = int(r.choice([0, -1, 1, 2 ** 31, 2 ** 40, 7]))
        if r.random() < 0.2:
            d.dim_param = "N"
        else:
            d.dim_value = v
    elif u < 0.7:
        tt.elem_type = int(r.choice([TensorProto.INT64, TensorProto.STRING, TensorProto.DOUBLE, TensorProto.FLOAT16,
                                     TensorProto.BOOL, 0, 99]))
    elif u < 0.85:
        tt.ClearField("shape")
    else:
        tt.shape.dim.add().dim_value = 2


def m_output_type(m, r):
    """A declared output (or value_info) type that disagrees with inference."""
    o = _pick(r, list(m.graph.output))
    tt = o.type.tensor_type
    u = r.random()
    if u < 0.4 and tt.HasField("shape") and tt.shape.dim:
        tt.shape.dim[int(r.integers(len(tt.shape.dim)))].dim_value = int(r.choice([0, 3, 1000]))
    elif u < 0.7:
        tt.elem_type = int(r.choice([TensorProto.INT64, TensorProto.DOUBLE, TensorProto.BOOL]))
    else:
        vi = m.graph.value_info.add()
        n = _pick(r, m.graph.node)
        vi.CopyFrom(helper.make_tensor_value_info(n.output[0], int(r.choice([TensorProto.INT32, TensorProto.FLOAT])),
                                                  [int(r.integers(1, 9)) for _ in range(int(r.integers(0, 4)))]))


def m_op_type(m, r):
    n = _pick(r, m.graph.node)
    u = r.random()
    if u < 0.6:
        n.op_type = str(r.choice(["Nope", "", "conv", "Relu", "Sigmoid", "MatMul", "Conv", "Add", "Reshape", "Loop",
                                  "If", "Scan", "Softmax", "ReduceMean", "Identity", "Attention", "FusedConv",
                                  "SkipLayerNormalization", "Transpose", "LayerNormalization", "Gather", "Split"]))
    else:
        n.domain = str(r.choice(["com.microsoft", "tensorfuse", "ai.onnx.ml", "x", "ai.onnx"]))


def m_arity(m, r):
    n = _pick(r, m.graph.node)
    u = r.random()
    if u < 0.4 and n.input:
        del n.input[-1]
    elif u < 0.8:
        n.input.append(_pick(r, _values(m) + [""]))
    else:
        n.output.append("extra_out")


def m_initializer_as_input(m, r):
    """An initializer also declared as a graph input, with another shape or type."""
    t = _pick(r, m.graph.initializer)
    shape = list(t.dims)
    shape = shape[:-1] if shape and r.random() < 0.5 else shape + [2]
    m.graph.input.append(helper.make_tensor_value_info(t.name, int(r.choice([t.data_type, TensorProto.INT64])), shape))


def m_graph_empty(m, r):
    u = r.random()
    if u < 0.4:
        del m.graph.node[:]
    elif u < 0.7:
        del m.graph.output[:]
    else:
        del m.graph.input[:]
        del m.graph.initializer[:]


def m_subgraph_attr(m, r):
    """A graph-typed attribute on an op that takes none, or an If whose branches are broken."""
    n = _pick(r, m.graph.node)
    sub = helper.make_graph([], "sub", [], [])
    n.attribute.append(helper.make_attribute("then_branch", sub))


STRUCTURAL: list[tuple[Callable, float]] = [
    (m_delete_input, 1), (m_delete_initializer, 1), (m_delete_node, 1), (m_rename_dangling, 1),
    (m_rename_odd, 1.5), (m_rename_long_colliding, 1), (m_extreme_attribute, 3), (m_retype_attribute, 1.5),
    (m_add_attribute, 2), (m_remove_attribute, 1), (m_tensor_size, 2), (m_tensor_dtype, 1),
    (m_constant_without_value, 1), (m_cycle, 1), (m_swap_nodes, 1), (m_duplicate_output, 1), (m_bad_opset, 1),
    (m_input_shape, 1.5), (m_output_type, 1.5), (m_op_type, 1.5), (m_arity, 1), (m_initializer_as_input, 1),
    (m_graph_empty, 0.3), (m_subgraph_attr, 0.3),
]


# ---------------------------------------------------------------------------------------------
# byte-level mutations of the serialised file
def b_flip(data: bytes, r) -> bytes:
    b = bytearray(data)
    for _ in range(int(r.integers(1, 9))):
        b[int(r.integers(len(b)))] ^= 1 << int(r.integers(8))
    return bytes(b)


def b_truncate(data, r):
    return data[: int(r.integers(0, len(data)))]


def b_insert(data, r):
    k = int(r.integers(len(data) + 1))
    return data[:k] + r.integers(0, 256, size=int(r.integers(1, 17)), dtype=np.uint8).tobytes() + data[k:]


def b_repeat(data, r):
    k = int(r.integers(len(data)))
    n = int(r.integers(1, 64))
    return data[:k] + data[k:k + n] * 2 + data[k + n:]


def b_invalid_utf8(data, r):
    """Replace a name's bytes with as many bytes that are not UTF-8 (every occurrence), so the
    protobuf parses and the strings hold invalid UTF-8."""
    m = onnx.load_from_string(data)
    names = [x for x in _values(m) + [m.graph.name] + [n.name for n in m.graph.node] if len(x) >= 1]
    if not names:
        return data
    name = str(r.choice(names)).encode()
    bad = bytes([0xFF]) + name[1:] if r.random() < 0.5 else bytes([0xC3]) * len(name)
    return data.replace(name, bad) if len(name) >= 2 else data


#: byte values at the edges of their ranges (signed and unsigned, protobuf varint continuation)
BOUNDARY_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF)


def b_boundary(data, r):
    """Set one to three bytes to boundary values (:data:`BOUNDARY_BYTES`): a NUL inside a
    name, a length or varint at its limit (issue 24 item 9: a NUL in the graph name of the ONNX
    node test test_shape_clip_start made the LLVM module come back empty)."""
    b = bytearray(data)
    for _ in range(int(r.integers(1, 4))):
        b[int(r.integers(len(b)))] = int(r.choice(BOUNDARY_BYTES))
    return bytes(b)


BYTES: list[tuple[Callable, float]] = [(b_flip, 2), (b_truncate, 1), (b_insert, 1), (b_repeat, 1), (b_invalid_utf8, 1.5)]


def mutate(seed: int, bases: dict[str, bytes], boundary: bool = False) -> tuple[str, bytes]:
    """A mutation of one of ``bases`` (name -> serialised model), deterministic in ``seed``:
    one to three structural mutations, or a byte-level one (a third of the time), or both.
    ``boundary``: the byte-level mutation is always :func:`b_boundary` (a separate switch, so
    that the mutations of earlier seeds stay what they were)."""
    r = np.random.default_rng(seed)
    base = sorted(bases)[int(r.integers(len(bases)))]
    data = bases[base]
    names = []
    u = r.random()
    if u < 0.7:
        m = onnx.load_from_string(data)
        fs, w = zip(*STRUCTURAL)
        w = np.asarray(w) / sum(w)
        for _ in range(int(r.choice([1, 1, 1, 2, 3]))):
            f = fs[int(r.choice(len(fs), p=w))]
            try:
                f(m, r)
                names.append(f.__name__[2:])
            except (NotApplicable, IndexError, ValueError, TypeError):
                pass
        data = m.SerializeToString()
    if u >= 0.6 or not names:
        fs, w = zip(*BYTES)
        w = np.asarray(w) / sum(w)
        f = fs[int(r.choice(len(fs), p=w))]
        if boundary:
            f = b_boundary
        try:
            data = f(data, r)
            names.append("bytes_" + f.__name__[2:])
        except Exception:  # noqa: BLE001 - the base did not parse after a structural change
            pass
    return f"{base}:{'+'.join(names) or 'none'}", data


# ---------------------------------------------------------------------------------------------
# outcomes (run in a child process)
#: exception types a user may see from compile() and run(), besides TensorfuseError subclasses:
#: ValueError from Module.run only (run-time index checks, README "Run-time checks")
DOCUMENTED_RUN_ERRORS = ("ValueError",)


def _random_inputs(infos) -> dict[str, np.ndarray]:
    r = np.random.default_rng(0)
    out = {}
    for name, dt, shape in infos:
        dt = np.dtype(dt)
        if np.issubdtype(dt, np.floating):
            out[name] = r.uniform(-1, 1, size=shape).astype(dt)
        elif dt == np.bool_:
            out[name] = r.random(shape) < 0.5
        else:
            out[name] = r.integers(0, 3, size=shape).astype(dt)
    return out


def tensorfuse_outcome(data: bytes, opt_level: int = 2) -> str:
    """'ok', or 'compile:<ErrorClass>' / 'run:<ErrorClass>' (the exception propagates to the
    worker as an outcome: the caller classifies by the type and where it came from)."""
    import tensorfuse
    mod = tensorfuse.compile(data, target="llvm", opt_level=opt_level, cache=False, num_threads=1)
    if hasattr(mod, "input_info"):
        infos = [(i.name, i.dtype, tuple(i.shape)) for i in mod.input_info]
    else:   # a SpecializingModule (shapes from input values): inputs as the model declares them
        from onnx import helper as _h
        m = onnx.load_from_string(data)
        inits = {t.name for t in m.graph.initializer}
        infos = [(i.name, _h.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type),
                  tuple(max(d.dim_value, 1) for d in i.type.tensor_type.shape.dim))
                 for i in m.graph.input if i.name not in inits]
    if any(int(np.prod(s)) > 1 << 24 for _, _, s in infos):
        return "ok (too large to run)"
    try:
        mod.run(**_random_inputs(infos))
    except Exception as e:
        raise RunError(type(e).__name__, str(e)[:300], isinstance(e, tensorfuse.TensorfuseError)) from None
    return "ok"


class RunError(Exception):
    """Wraps an exception of Module.run (its type name, message, is a TensorfuseError)."""


def ort_outcome(data: bytes) -> str:
    """'loads+runs', 'loads, run fails' or 'rejects' for onnxruntime (optimisations off)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    try:
        s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        return "rejects"
    types = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16,
             "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}
    infos = []
    for i in s.get_inputs():
        if i.type not in types:
            return "loads, run fails"
        shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in i.shape)
        if int(np.prod(shape)) > 1 << 24:
            return "loads, run fails"
        infos.append((i.name, types[i.type], shape))
    try:
        s.run(None, _random_inputs(infos))
    except Exception:  # noqa: BLE001
        return "loads, run fails"
    return "loads+runs"


def classify(res) -> tuple[str, str]:
    """(category, detail) of an isolated tensorfuse_outcome: category is ok | documented |
    internal | crash | hang; detail names the error class (and where, for internal ones)."""
    status, val = res
    if status == "ok":
        return "ok", "ok"
    if status in ("crash", "hang"):
        return status, val
    name, mod, msg, ours, where = val
    if name == "RunError":
        # msg is "('TypeName', 'message', ours)"
        import ast
        try:
            tname, tmsg, tours = ast.literal_eval(msg)
        except Exception:  # noqa: BLE001
            return "internal", f"run: {msg[:120]}"
        if tours or tname in DOCUMENTED_RUN_ERRORS:
            return "documented", f"run: {tname}"
        return "internal", f"run: {tname}: {tmsg[:160]}"
    if ours:
        return "documented", name
    return "internal", f"{mod}.{name}: {msg[:160]} [{where}]"


#: failures of the issue's listed defects (issue 9), by defect number: a regular expression on
#: the classified detail and one on the mutation's name (both must match). The fuzz tests keep
#: these apart from new failures (tests/test_fuzz.py); once the defects are fixed this is empty.
KNOWN_DEFECTS: list[tuple[int, str, str]] = [
    # a Constant node without a value attribute
    (3, r"IndexError: list index out of range \[.*frontend/onnx\.py", r"constant_without_value|remove_attribute"),
    # a Constant's raw data that does not match its dims or dtype: numpy's error from onnx.numpy_helper
    (3, r"ValueError: (cannot reshape array|buffer size must be).*numpy_helper\.py", r"."),
    # names that are not valid UTF-8
    (3, r"(cannot use a string pattern on a bytes-like object|'bytes' object has no attribute 'encode'"
        r"|between instances of 'str' and 'bytes')",
     r"invalid_utf8|bytes_"),
    # long names that collide once LLVM truncates them ("multiple definition of local value")
    (3, r"LLVMError inside CompileError: LLVM code generation failed: LLVM rejected the IR",
     r"rename_odd|rename_long_colliding"),
    # sizes too big to allocate, found at run time
    (3, r"(MemoryError|array is too big|Maximum allowed size exceeded)", r"."),
]


def known_defect(mutation: str, detail: str) -> int | None:
    """The issue 9 defect number of a failure, or None if it is a new one."""
    import re
    for n, d, m in KNOWN_DEFECTS:
        if re.search(d, detail) and re.search(m, mutation):
            return n
    return None
