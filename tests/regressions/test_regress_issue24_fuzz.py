"""Regression tests for issue 24 items 6 (empty tensors), 7 (Resize nearest rounding ties) and
9 (internal errors from mutated models), and for the random-graph generator's coverage of
degenerate conv shapes (item 0). Each failed before its fix; the docstrings quote how."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tensorfuse
from oracle import ort_run

# ----------------------------------------------------------------------------- item 7
#: (coordinate_transformation_mode, nearest_mode, in rows, out rows): a source coordinate that is
#: exactly a tie (k + 0.5) in the spec's arithmetic, where onnxruntime and onnx.reference agree
#: and a float32 quotient by the rounded scale out/in fell on the other side of the tie
RESIZE_TIES = [
    ("asymmetric", "round_prefer_ceil", 7, 8),      # seed 18 graph 304: row 4, 4 / (8/7) = 3.5
    ("asymmetric", "round_prefer_ceil", 13, 14),
    ("asymmetric", "round_prefer_ceil", 15, 2),
    ("asymmetric", "round_prefer_floor", 11, 26),
    ("half_pixel", "round_prefer_ceil", 14, 1),
    ("half_pixel", "round_prefer_floor", 14, 19),
    ("pytorch_half_pixel", "round_prefer_floor", 14, 31),
    ("half_pixel_symmetric", "round_prefer_ceil", 14, 31),
    ("half_pixel_symmetric", "round_prefer_floor", 14, 19),
    # ties and exact integers that were already right, for every mode (must stay right)
    ("asymmetric", "floor", 6, 9),
    ("asymmetric", "ceil", 6, 9),
    ("half_pixel", "ceil", 4, 8),
    ("align_corners", "round_prefer_ceil", 5, 9),
    ("align_corners", "round_prefer_floor", 5, 9),
]


def _resize_ties_model():
    nodes, ins, outs, inits = [], [], [], []
    for k, (ctm, nm, h, oh) in enumerate(RESIZE_TIES):
        ins.append(helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, 1, h, 6]))
        outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [1, 1, oh, 9]))
        inits.append(numpy_helper.from_array(np.array([1, 1, oh, 9], np.int64), f"sz{k}"))
        nodes.append(helper.make_node("Resize", [f"x{k}", "", "", f"sz{k}"], [f"y{k}"], mode="nearest",
                                      coordinate_transformation_mode=ctm, nearest_mode=nm))
    m = helper.make_model(helper.make_graph(nodes, "resize_ties", ins, outs, initializer=inits),
                          opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    return m


def test_resize_nearest_ties_follow_the_spec():
    """Resize nearest where the source coordinate is exactly a tie: 7x6 -> 8x9 asymmetric
    round_prefer_ceil took row 3 for output row 4 (4 / float32(8/7) = 3.4999998 in float32;
    the spec's x = 4 / (8/7) = 3.5 rounds up, and onnxruntime and onnx.reference take row 4).
    The first 9 cases failed before the fix (at O0: y0 row 4 was 18.0 ... instead of 24.0 ...).
    Inputs are row-major aranges, so each output value names the input element it copied."""
    m = _resize_ties_model()
    feeds = {f"x{k}": np.arange(h * 6, dtype=np.float32).reshape(1, 1, h, 6)
             for k, (_c, _n, h, _o) in enumerate(RESIZE_TIES)}
    ort = ort_run(m, feeds)
    ref = ReferenceEvaluator(m).run(None, feeds)
    for k in range(len(RESIZE_TIES)):
        np.testing.assert_array_equal(ort[k], ref[k], err_msg=f"the oracles disagree on {RESIZE_TIES[k]}")
    for level in (0, 2):
        got = tensorfuse.compile(m, cache=False, opt_level=level).run(**feeds)
        for k, case in enumerate(RESIZE_TIES):
            np.testing.assert_array_equal(got[k], ort[k], err_msg=f"O{level} {case}")


def test_resize_nearest_ties_with_float_scales():
    """The same kind of ties reached through a float32 ``scales`` input (x = y / scale with the
    scale exact in float32): right before the fix too, kept right by the float64 coordinate."""
    cases = [("asymmetric", "round_prefer_ceil", 6, 0.5), ("half_pixel", "round_prefer_floor", 5, 1.5),
             ("asymmetric", "round_prefer_floor", 4, 2.5), ("half_pixel", "round_prefer_ceil", 3, 3.0)]
    for ctm, nm, h, s in cases:
        x = np.arange(h * 2, dtype=np.float32).reshape(1, 1, h, 2)
        node = helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest",
                                coordinate_transformation_mode=ctm, nearest_mode=nm)
        oh = int(np.floor(np.float32(s) * h))
        g = helper.make_graph([node], "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, h, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, oh, 2])],
                              initializer=[numpy_helper.from_array(np.array([1, 1, s, 1], np.float32), "sc")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
        m.ir_version = 9
        (e,) = ort_run(m, {"x": x})
        np.testing.assert_array_equal(ReferenceEvaluator(m).run(None, {"x": x})[0], e)
        (got,) = tensorfuse.compile(m, cache=False).run(x=x)
        np.testing.assert_array_equal(got, e, err_msg=f"{ctm} {nm} {h} x{s}")


# ----------------------------------------------------------------------------- item 9
@pytest.mark.parametrize("graph_name", ["new\nline", "nul\x00inside", 'q"uote\\back', "ünïcödé\t€"])
def test_any_graph_name_compiles(graph_name):
    """A graph's name reached LLVM unescaped (llvmlite prints it in the module's ``; ModuleID``
    comment): "new\\nline" ended in ``CompileError: LLVM code generation failed: LLVM rejected
    the IR of new\\nline ... error: expected top-level entity``, and a NUL ended the text LLVM
    parsed (``LLVMError: symbol tf_run not found in compiled module``). Node and value names
    with the same characters go through too."""
    odd = ["a\x00b", 'c\nd"e', "f\\g ü€", "h\u2028i"]
    nodes = [helper.make_node("Relu", [odd[0]], [odd[1]], name="relu\x00\n\"'"),
             helper.make_node("Add", [odd[1], odd[0]], [odd[2]], name="add ü\\"),
             helper.make_node("Transpose", [odd[2]], [odd[3]], perm=[1, 0], name="\u2028")]
    g = helper.make_graph(nodes, graph_name, [helper.make_tensor_value_info(odd[0], TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(odd[3], TensorProto.FLOAT, [3, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    for level in (0, 2):
        (y,) = tensorfuse.compile(m, cache=False, opt_level=level).run(**{odd[0]: x})
        np.testing.assert_array_equal(y, (np.maximum(x, 0) + x).T)


def test_shape_clip_start_with_a_nul_byte_in_its_graph_name():
    """The ONNX node test test_shape_clip_start (Shape, start=-10, of a [3, 4, 5] input) with
    one byte of its serialised file set to 0x00 inside the graph name (tests/fuzz/mutate.py
    b_boundary; 21 of the 452 single boundary-byte edits of this file did it): compile raised
    ``LLVMError: symbol tf_run not found in compiled module`` from codegen/llvm/jit.py (an
    internal error; onnxruntime loads and runs the file). Now it runs and matches onnxruntime."""
    g = helper.make_graph([helper.make_node("Shape", ["x"], ["y"], start=-10)], "test_shape_clip_start",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    data = m.SerializeToString()
    pos = data.index(b"test_shape_clip_start") + len("test_shape")
    data = data[:pos] + b"\x00" + data[pos + 1:]
    x = np.zeros((3, 4, 5), np.float32)
    (expected,) = ort_run(data, {"x": x})
    (got,) = tensorfuse.compile(data, cache=False).run(x=x)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, [3, 4, 5])


# ----------------------------------------------------------------------------- item 6
def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "empty", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _check_all_levels(m, feeds):
    expected = ort_run(m, feeds)
    for level in (0, 2, 3):
        got = tensorfuse.compile(m, cache=False, opt_level=level).run(**feeds)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype, (level, g.shape, e.shape)
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"O{level}")


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, np.int64), name)


def test_reshape_chain_with_allowzero_keeps_its_zero_sized_dims():
    """[2, 0, 3] -> Reshape(allowzero=1) [0, 6] -> Reshape(allowzero=1) [0, 3, 2]: CollapseReshapes
    made one Reshape to [0, 3, 2] without allowzero, whose 0 copies the input's 2: "RewriteError:
    rule CollapseReshapes failed at node Reshape_1: ShapeError: ... cannot reshape [2, 0, 3]
    (0 elements) to [0, 3, 2] (12 elements)" at O2 (issue 24 item 6)."""
    m = _model([helper.make_node("Reshape", ["x", "s1"], ["a"], allowzero=1),
                helper.make_node("Reshape", ["a", "s2"], ["y"], allowzero=1)],
               [("x", [2, 0, 3])], [("y", TensorProto.FLOAT, [0, 3, 2])], [_i64("s1", [0, 6]), _i64("s2", [0, 3, 2])])
    _check_all_levels(m, {"x": np.zeros((2, 0, 3), np.float32)})


def test_matmul_by_a_constant_with_an_empty_reduction():
    """x[2, 0] @ W[0, 3] (a constant) + b: the register-blocked schedule divided by K = 0
    ("CompileError: ZeroDivisionError ... lowering MatMul node ... ir/ops/linalg.py:167");
    the result is b broadcast (random_graphs.py --seed 41 graph 40, shrunk)."""
    w = numpy_helper.from_array(np.ones((0, 3), np.float32), "w")
    b = numpy_helper.from_array(np.array([1.0, -2.0, 3.0], np.float32), "b")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
               [("x", [2, 0])], [("y", TensorProto.FLOAT, [2, 3])], [w, b])
    _check_all_levels(m, {"x": np.zeros((2, 0), np.float32)})


def test_kernel_reading_an_empty_tensor_passes_the_memory_plan_check():
    """ArgMin of a [0, 4, 2] value (no kernel: its output is empty) read by a Cast kernel: the
    debug-mode memory-plan check raised "MemoryPlanError: call 1 (cast_2: Cast_11) reads slot 7
    'argmin_8' before any kernel wrote it" (random_graphs.py --seed 41 graph 60, shrunk); an empty
    tensor has nothing to read."""
    m = _model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]),
                helper.make_node("ArgMin", ["s"], ["a"], axis=2, keepdims=0, select_last_index=1),
                helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT)],
               [("x", [3, 4, 2])], [("y", TensorProto.FLOAT, [0, 4])], [_i64("st", [1]), _i64("en", [1]), _i64("ax", [0])])
    _check_all_levels(m, {"x": np.ones((3, 4, 2), np.float32)})


def test_fused_group_whose_anchor_output_is_empty():
    """Gemm(x[0, 3], W, c, beta=3) -> Abs, fused at O2: the Gemm's lowering emits no loop for
    its empty output, and the fused lowering raised "ShapeError: Gemm is marked
    OUT_ELEMWISE_FUSABLE but its lowering never calls ctx.apply_epilogue" (random_graphs.py with
    P_ZERO 0.6, --seed 42 graph 33, shrunk to these 2 nodes)."""
    w = numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(3, 3), "w")
    c = numpy_helper.from_array(np.float32(0.5), "c")
    m = _model([helper.make_node("Gemm", ["x", "w", "c"], ["g"], beta=3.0, transB=1),
                helper.make_node("Abs", ["g"], ["y"])],
               [("x", [0, 3])], [("y", TensorProto.FLOAT, [0, 3])], [w, c])
    _check_all_levels(m, {"x": np.zeros((0, 3), np.float32)})


def test_node_with_only_empty_outputs_needs_no_kernel():
    """A depthwise Conv over a batch of 0 images: its lowering divided by zero ("CompileError:
    lowering Conv node 'Conv_0' failed: ZeroDivisionError: integer division or modulo by zero")
    at O0 and O2. A node whose outputs are all empty now gets no kernel at all."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 36, dtype=np.float32).reshape(4, 1, 3, 3), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"], group=4, pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"])],
               [("x", [0, 4, 4, 4])], [("y", TensorProto.FLOAT, [0, 4, 4, 4])], [w])
    _check_all_levels(m, {"x": np.zeros((0, 4, 4, 4), np.float32)})


def test_attention_over_an_empty_key_cache():
    """softmax(Q K^T) V with no keys (K [1, 2, 4, 0], V [1, 2, 0, 4]: an empty past key/value
    cache): the result is an empty sum, zeros; FuseAttention's kernel at O2 gave NaN (its 0 / 0
    normalisation) in every element."""
    m = _model([helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
                helper.make_node("MatMul", ["p", "v"], ["y"])],
               [("q", [1, 2, 3, 4]), ("k", [1, 2, 4, 0]), ("v", [1, 2, 0, 4])], [("y", TensorProto.FLOAT, [1, 2, 3, 4])])
    feeds = {"q": np.ones((1, 2, 3, 4), np.float32), "k": np.ones((1, 2, 4, 0), np.float32),
             "v": np.ones((1, 2, 0, 4), np.float32)}
    _check_all_levels(m, feeds)
