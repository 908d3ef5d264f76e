"""If, Loop and Scan inlined at import time (compiler/frontend/control_flow.py) vs onnxruntime.

ONNX spec: If-1..25, Loop-1..25, Scan-8 (batch axis) and Scan-9..25 (axes and directions).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.compiler.frontend import control_flow
from tensorfuse.compiler.frontend.onnx import import_onnx, unsupported_ops
from tensorfuse.compiler.specialize import InputValuesNeeded, SpecializingModule
from tests.oracle import assert_matches_ort, ort_run, rand

F = T.FLOAT


def vi(name, elem=F, shape=None):
    return h.make_tensor_value_info(name, elem, shape)


def const(name, arr):
    arr = np.asarray(arr)
    return h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(arr, name + "_v"))


def model(nodes, inputs, outputs, opset=17, initializers=()):
    g = h.make_graph(nodes, "cf", inputs, outputs, initializer=list(initializers))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10 if opset >= 9 else 3)
    # graph outputs need a shape for the checker: take it from ONNX shape inference
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.output}
    for o in m.graph.output:
        if not o.type.tensor_type.HasField("shape") and inferred[o.name].type.tensor_type.HasField("shape"):
            o.CopyFrom(inferred[o.name])
    onnx.checker.check_model(m)
    return m


def ops_of(graph):
    return {n.op for n in graph.nodes}


# ----------------------------------------------------------------------------- If
def branches(k=2.0):
    """then: x * k + y (outer-scope x and y); else: x - y and a second output y."""
    then = h.make_graph([const("k", np.float32(k)), h.make_node("Mul", ["x", "k"], ["t0"]),
                         h.make_node("Add", ["t0", "y"], ["then_out"]), h.make_node("Neg", ["y"], ["then_out2"])],
                        "then", [], [vi("then_out"), vi("then_out2")])
    other = h.make_graph([h.make_node("Sub", ["x", "y"], ["else_out"]), h.make_node("Identity", ["y"], ["y2"])],
                         "else", [], [vi("else_out"), vi("y2")])
    return then, other


@pytest.mark.parametrize("cond", [True, False])
def test_if_constant_condition_imports_only_the_taken_branch(cond):
    then, other = branches()
    m = model([const("c", np.array(cond)), h.make_node("If", ["c"], ["r", "r2"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3]), vi("y", F, [3])], [vi("r", F, [2, 3]), vi("r2", F, [3])])
    g = import_onnx(m)
    assert "If" not in ops_of(g)
    assert ops_of(g) == ({"Mul", "Add", "Neg"} if cond else {"Sub", "Identity"})
    assert all("/then/" in n.name or "/else/" in n.name for n in g.nodes)
    assert_matches_ort(m, {"x": rand(2, 3), "y": rand(3, seed=1)})


def test_if_on_a_graph_input_specialises_on_its_value():
    then, other = branches(3.0)
    m = model([h.make_node("If", ["c"], ["r", "r2"], then_branch=then, else_branch=other)],
              [vi("c", T.BOOL, []), vi("x", F, [2, 3]), vi("y", F, [3])], [vi("r", F, [2, 3]), vi("r2", F, [3])])
    with pytest.raises(InputValuesNeeded, match="If with a condition computed at run time") as e:
        import_onnx(m)
    assert e.value.names == ["c"]
    mod = tensorfuse.compile(m)
    assert isinstance(mod, SpecializingModule) and mod.specialized_on == ["c"]
    for c in (True, False):
        ins = {"c": np.array(c), "x": rand(2, 3, seed=2), "y": rand(3, seed=3)}
        assert_matches_ort(m, ins)


def test_if_condition_from_static_shapes_is_known():
    # cond = Shape(x)[1] == 3: data propagation makes it a compile-time value
    then, other = branches()
    m = model([h.make_node("Shape", ["x"], ["s"]), const("one", np.int64(1)), const("three", np.int64(3)),
               h.make_node("Gather", ["s", "one"], ["d"]), h.make_node("Equal", ["d", "three"], ["c"]),
               h.make_node("If", ["c"], ["r", "r2"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3]), vi("y", F, [3])], [vi("r", F, [2, 3]), vi("r2", F, [3])])
    assert "Sub" not in ops_of(import_onnx(m))
    assert_matches_ort(m, {"x": rand(2, 3), "y": rand(3, seed=1)})


def test_if_condition_from_data_names_the_inputs_it_needs():
    then, other = branches()
    m = model([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), const("z", np.float32(0)),
               h.make_node("Greater", ["s", "z"], ["c"]),
               h.make_node("If", ["c"], ["r", "r2"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3]), vi("y", F, [3])], [vi("r", F, [2, 3]), vi("r2", F, [3])])
    with pytest.raises(InputValuesNeeded, match=r"unnamed If node \(first output 'r'\): If with a condition computed at run time") as e:
        import_onnx(m)
    assert e.value.names == ["x"]
    # compile() specialises on the data input: correct for every value it is run with
    for seed in (0, 5):
        assert_matches_ort(m, {"x": rand(2, 3, seed=seed, low=-1 - seed, high=1), "y": rand(3, seed=1)},
                           opt_levels=(2,))


def test_if_branch_with_its_own_initializer_and_nested_if():
    inner_t = h.make_graph([h.make_node("Relu", ["x"], ["it"])], "it", [], [vi("it")])
    inner_e = h.make_graph([h.make_node("Abs", ["x"], ["ie"])], "ie", [], [vi("ie")])
    then = h.make_graph([const("c2", np.array(False)),
                         h.make_node("If", ["c2"], ["nested"], then_branch=inner_t, else_branch=inner_e),
                         h.make_node("Add", ["nested", "w"], ["o"])], "then", [], [vi("o")],
                        initializer=[onnx.numpy_helper.from_array(rand(3, seed=9), "w")])
    other = h.make_graph([h.make_node("Identity", ["x"], ["o2"])], "else", [], [vi("o2")])
    m = model([const("c", np.array([True])), h.make_node("If", ["c"], ["r"], then_branch=then, else_branch=other)],
              [vi("x", F, [2, 3])], [vi("r", F, [2, 3])])
    g = import_onnx(m)
    assert ops_of(g) == {"Abs", "Add"}
    assert_matches_ort(m, {"x": rand(2, 3)})


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_if_older_opsets(opset):
    then = h.make_graph([const("a", np.float32([1, 2, 3]))], "t", [], [vi("a", F, [3])])
    other = h.make_graph([const("b", np.float32([4, 5, 6]))], "e", [], [vi("b", F, [3])])
    m = model([h.make_node("If", ["c"], ["r"], then_branch=then, else_branch=other)],
              [vi("c", T.BOOL, [])], [vi("r", F, [3])], opset=opset)
    for c in (True, False):
        assert_matches_ort(m, {"c": np.array(c)}, opt_levels=(0,))


# ----------------------------------------------------------------------------- Loop
def loop_body(stop_at=None):
    """Carried: acc (f32[2]) += x * i, n (i64) += 1; scan outputs: acc, i (scalar).
    The condition output is i + 1 < stop_at when given, else the incoming condition."""
    nodes = [h.make_node("Cast", ["i"], ["fi"], to=F), h.make_node("Mul", ["x", "fi"], ["xi"]),
             h.make_node("Add", ["acc_in", "xi"], ["acc_out"]), const("one", np.int64(1)),
             h.make_node("Add", ["n_in", "one"], ["n_out"]), h.make_node("Identity", ["acc_out"], ["s0"]),
             h.make_node("Identity", ["i"], ["s1"])]
    if stop_at is None:
        nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes += [const("stop", np.int64(stop_at)), h.make_node("Add", ["i", "one"], ["i1"]),
                  h.make_node("Less", ["i1", "stop"], ["c_out"])]
    return h.make_graph(nodes, "body", [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), vi("acc_in", F, [2]),
                                        vi("n_in", T.INT64, [])],
                        [vi("c_out", T.BOOL, []), vi("acc_out", F, [2]), vi("n_out", T.INT64, []),
                         vi("s0", F, [2]), vi("s1", T.INT64, [])])


def loop_model(m_val, c_val, body, opset=17, m_input=False):
    nodes, ins = [], ["", ""]
    inputs = [vi("x", F, [2]), vi("acc0", F, [2]), vi("n0", T.INT64, [])]
    if m_val is not None:
        if m_input:
            inputs.append(vi("M", T.INT64, []))
        else:
            nodes.append(const("M", np.int64(m_val)))
        ins[0] = "M"
    if c_val is not None:
        nodes.append(const("C", np.array(c_val)))
        ins[1] = "C"
    nodes.append(h.make_node("Loop", ins + ["acc0", "n0"], ["acc", "n", "accs", "iters"], body=body))
    return model(nodes, inputs, [vi("acc", F, [2]), vi("n", T.INT64, []), vi("accs", F, ["N", 2]), vi("iters", T.INT64, ["N"])], opset=opset)


LOOP_INPUTS = {"x": np.float32([1.5, -2.0]), "acc0": np.float32([0.25, 1.0]), "n0": np.array(10, np.int64)}


@pytest.mark.parametrize("m_val,c_val,stop_at", [
    (4, True, None),      # for loop with condition
    (4, None, None),      # for loop
    (6, True, 3),         # the body's condition stops it early (that iteration still counts)
    (None, True, 5),      # while loop
    (3, False, None),     # never entered: outputs are the initial values, scan outputs empty
    (0, None, None),      # zero trips
])
def test_loop_carried_values_and_scan_outputs(m_val, c_val, stop_at):
    m = loop_model(m_val, c_val, loop_body(stop_at))
    assert_matches_ort(m, LOOP_INPUTS)


def test_loop_body_condition_stops_it_also_without_a_cond_input():
    # as onnxruntime does (the spec table calls it ignored)
    m = loop_model(6, None, loop_body(2))
    got = assert_matches_ort(m, LOOP_INPUTS)
    assert got[3].tolist() == [0, 1]


def test_loop_trip_count_from_a_graph_input_specialises():
    m = loop_model(0, True, loop_body(), m_input=True)
    with pytest.raises(InputValuesNeeded) as e:
        import_onnx(m)
    assert e.value.names == ["M"]
    for trips in (1, 3):
        assert_matches_ort(m, {**LOOP_INPUTS, "M": np.array(trips, np.int64)}, opt_levels=(2,))


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_loop_older_opsets(opset):
    assert_matches_ort(loop_model(3, True, loop_body(), opset=opset), LOOP_INPUTS, opt_levels=(0,))


def test_loop_unrolled_node_names_are_unique_and_prefixed():
    g = import_onnx(loop_model(3, True, loop_body()))
    names = [n.name for n in g.nodes]
    assert len(names) == len(set(names))
    loop = names[0].split("/")[0]
    assert {f"{loop}/{i}/Mul" for i in range(3)} <= set(names)
    assert "Loop" not in ops_of(g)


def test_nested_loops_see_outer_scope_values():
    # out[i][j] = x * (i * 10 + j): the inner body reads the outer body's iteration number
    inner = h.make_graph([h.make_node("Mul", ["io", "ten"], ["a"]), h.make_node("Add", ["a", "j"], ["b"]),
                          h.make_node("Cast", ["b"], ["fb"], to=F), h.make_node("Mul", ["x", "fb"], ["s"]),
                          h.make_node("Identity", ["cj"], ["cj_out"])], "inner",
                         [vi("j", T.INT64, []), vi("cj", T.BOOL, [])], [vi("cj_out", T.BOOL, []), vi("s", F, [2])])
    outer = h.make_graph([const("ten", np.int64(10)), const("three", np.int64(3)),
                          h.make_node("Identity", ["i_raw"], ["io"]),
                          h.make_node("Loop", ["three", ""], ["rows"], body=inner),
                          h.make_node("Identity", ["ci"], ["ci_out"])], "outer",
                         [vi("i_raw", T.INT64, []), vi("ci", T.BOOL, [])], [vi("ci_out", T.BOOL, []), vi("rows", F)])
    m = model([const("two", np.int64(2)), h.make_node("Loop", ["two", ""], ["out"], body=outer)],
              [vi("x", F, [2])], [vi("out", F, [2, 3, 2])])
    got = assert_matches_ort(m, {"x": np.float32([1, -1])})
    assert got[0].shape == (2, 3, 2)


def test_loop_with_if_on_the_iteration_number():
    # an If inside the body decided by i (known per unrolled iteration): odd steps add, even subtract
    t = h.make_graph([h.make_node("Add", ["v_in", "x"], ["tv"])], "t", [], [vi("tv", F, [2])])
    e = h.make_graph([h.make_node("Sub", ["v_in", "x"], ["ev"])], "e", [], [vi("ev", F, [2])])
    body = h.make_graph([const("two", np.int64(2)), h.make_node("Mod", ["i", "two"], ["r"]),
                         const("one", np.int64(1)), h.make_node("Equal", ["r", "one"], ["odd"]),
                         h.make_node("If", ["odd"], ["v_out"], then_branch=t, else_branch=e),
                         h.make_node("Identity", ["c"], ["c_out"])], "b",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("v_in", F, [2])],
                        [vi("c_out", T.BOOL, []), vi("v_out", F, [2])])
    m = model([const("M", np.int64(5)), h.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
              [vi("x", F, [2]), vi("v0", F, [2])], [vi("v", F, [2])])
    assert_matches_ort(m, {"x": rand(2), "v0": rand(2, seed=1)})


def test_loop_condition_from_run_time_data_names_the_inputs():
    body = h.make_graph([h.make_node("Add", ["v_in", "v_in"], ["v_out"]),
                         h.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0), const("lim", np.float32(10)),
                         h.make_node("Less", ["s", "lim"], ["c_out"])], "b",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("v_in", F, [2])],
                        [vi("c_out", T.BOOL, []), vi("v_out", F, [2])])
    m = model([const("M", np.int64(20)), h.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
              [vi("v0", F, [2])], [vi("v", F, [2])])
    with pytest.raises(InputValuesNeeded, match="Loop with a condition computed at run time") as e:
        import_onnx(m)
    assert e.value.names == ["v0"]
    assert_matches_ort(m, {"v0": np.float32([0.5, 0.25])}, opt_levels=(2,))


def test_loop_errors():
    with pytest.raises(UnsupportedModelError, match="neither a trip count nor a condition"):
        import_onnx(loop_model(None, None, loop_body()))
    with pytest.raises(UnsupportedModelError, match=f"more than {control_flow.MAX_UNROLL} iterations"):
        import_onnx(loop_model(control_flow.MAX_UNROLL + 1, None, loop_body()))
    with pytest.raises(UnsupportedModelError, match=f"more than {control_flow.MAX_UNROLL} iterations"):
        import_onnx(loop_model(None, True, loop_body()))    # a while loop that never stops


def test_loop_scan_output_changing_shape_is_refused():
    # the scan output is the carried value, which grows by one element per iteration
    body = h.make_graph([h.make_node("Concat", ["v_in", "v_in"], ["v2"], axis=0),
                         h.make_node("Identity", ["v2"], ["v_out"]), h.make_node("Identity", ["v_in"], ["s"]),
                         h.make_node("Identity", ["c"], ["c_out"])], "b",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("v_in", F, None)],
                        [vi("c_out", T.BOOL, []), vi("v_out", F, None), vi("s", F, None)])
    m = model([const("M", np.int64(3)), h.make_node("Loop", ["M", "", "v0"], ["v", "s"], body=body)],
              [vi("v0", F, [1])], [vi("v", F, ["a"]), vi("s", F, ["b", "c"])])
    with pytest.raises(UnsupportedModelError, match=r"scan output 0 is f32\[1\] in iteration 0 but f32\[2\]"):
        import_onnx(m)
    # the carried value alone may change shape between iterations
    m2 = model([const("M", np.int64(3)), h.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
               [vi("v0", F, [1])], [vi("v", F, ["a"])])
    assert import_onnx(m2).outputs[0].shape == (8,)


def test_unsupported_ops_inside_subgraphs_are_listed():
    body = h.make_graph([h.make_node("SequenceEmpty", [], ["seq"]), h.make_node("Identity", ["c"], ["c_out"]),
                         h.make_node("Identity", ["x"], ["s"])], "b",
                        [vi("i", T.INT64, []), vi("c", T.BOOL, [])], [vi("c_out", T.BOOL, []), vi("s", F, [2])])
    m = model([const("M", np.int64(2)), h.make_node("Loop", ["M", ""], ["y"], body=body, name="L")],
              [vi("x", F, [2])], [vi("y", F, ["n", 2])])
    assert unsupported_ops(m) == {"SequenceEmpty": ["L/#0"]}     # If/Loop/Scan themselves are supported
    with pytest.raises(UnsupportedModelError, match="SequenceEmpty: L/#0"):
        import_onnx(m)


# ----------------------------------------------------------------------------- Scan
SCAN_OUTS = [vi("s", F, ["s0"]), vi("k", F, []), vi("o1", F, ["a", "b"]), vi("o2", F, ["c", "d"])]
SCAN8_OUTS = [vi("s", F, [2, 3]), vi("k", F, [2]), vi("o1", F, [2, 3, 3]), vi("o2", F, [2, 3, 3])]
def scan_body():
    """States: s (f32[3]) += x_t * y_t, k (f32[]) *= 2; scan outputs: s and x_t - y_t."""
    return h.make_graph([h.make_node("Mul", ["xt", "yt"], ["p"]), h.make_node("Add", ["s_in", "p"], ["s_out"]),
                         h.make_node("Add", ["k_in", "k_in"], ["k_out"]), h.make_node("Identity", ["s_out"], ["o1"]),
                         h.make_node("Sub", ["xt", "yt"], ["o2"])], "sb",
                        [vi("s_in", F, [3]), vi("k_in", F, []), vi("xt", F, [3]), vi("yt", F, [3])],
                        [vi("s_out", F, [3]), vi("k_out", F, []), vi("o1", F, [3]), vi("o2", F, [3])])


@pytest.mark.parametrize("attrs,xshape,yshape", [
    ({}, (4, 3), (4, 3)),
    ({"scan_input_directions": [1, 0]}, (4, 3), (4, 3)),
    ({"scan_input_axes": [1, -2], "scan_input_directions": [0, 1]}, (3, 5), (5, 3)),
    ({"scan_output_axes": [1, -1], "scan_output_directions": [1, 0]}, (4, 3), (4, 3)),
    ({"scan_output_axes": [-2, 0], "scan_output_directions": [0, 1], "scan_input_directions": [1, 1]}, (2, 3), (2, 3)),
])
def test_scan9_axes_and_directions(attrs, xshape, yshape):
    m = model([h.make_node("Scan", ["s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=scan_body(),
                           num_scan_inputs=2, **attrs)],
              [vi("s0", F, [3]), vi("k0", F, []), vi("x", F, list(xshape)), vi("y", F, list(yshape))],
              SCAN_OUTS)
    assert_matches_ort(m, {"s0": rand(3), "k0": np.array(0.5, np.float32), "x": rand(*xshape, seed=1), "y": rand(*yshape, seed=2)})


def test_scan9_zero_length_sequence():
    m = model([h.make_node("Scan", ["s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=scan_body(),
                           num_scan_inputs=2, scan_output_axes=[1, 0])],
              [vi("s0", F, [3]), vi("k0", F, []), vi("x", F, [0, 3]), vi("y", F, [0, 3])],
              SCAN_OUTS)
    g = import_onnx(m)
    assert [v.shape for v in g.outputs] == [(3,), (), (3, 0), (0, 3)]
    assert not g.nodes


@pytest.mark.parametrize("opset", [9, 11, 16])
def test_scan9_opsets_with_a_matmul_state(opset):
    # a tiny RNN: h_t = tanh(h_{t-1} @ W + x_t), W from the outer scope
    body = h.make_graph([h.make_node("MatMul", ["h_in", "W"], ["hw"]), h.make_node("Add", ["hw", "xt"], ["a0"]),
                         h.make_node("Add", ["a0", "bias"], ["a"]),
                         h.make_node("Tanh", ["a"], ["h_out"]), h.make_node("Identity", ["h_out"], ["ys"])], "rnn",
                        [vi("h_in", F, [1, 4]), vi("xt", F, [1, 4])], [vi("h_out", F, [1, 4]), vi("ys", F, [1, 4])],
                        initializer=[onnx.numpy_helper.from_array(rand(4, seed=8), "bias")])
    m = model([h.make_node("Scan", ["h0", "x"], ["h", "y"], body=body, num_scan_inputs=1)],
              [vi("h0", F, [1, 4]), vi("x", F, [5, 1, 4])], [vi("h", F, [1, 4]), vi("y", F, [5, 1, 4])], opset=opset,
              initializers=[onnx.numpy_helper.from_array(rand(4, 4, seed=7, low=-0.5, high=0.5), "W")])
    g = import_onnx(m)
    assert len(g.constants) == 1 + 1 + 5 + 1       # W, the body's bias once, 5 step indices, stacking axes
    assert_matches_ort(m, {"h0": rand(1, 4), "x": rand(5, 1, 4, seed=3)})


@pytest.mark.parametrize("directions,lens", [([0, 0], None), ([1, 0], None), ([0, 1], [3, 1]), ([1, 1], [2, 1])])
def test_scan8_batch_axis_directions_and_sequence_lens(directions, lens):
    body = scan_body()
    inputs = [vi("s0", F, [2, 3]), vi("k0", F, [2]), vi("x", F, [2, 3, 3]), vi("y", F, [2, 3, 3])]
    nodes, first = [], ""
    if lens is not None:
        nodes.append(const("lens", np.array(lens, np.int64)))
        first = "lens"
    nodes.append(h.make_node("Scan", [first, "s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=body,
                             num_scan_inputs=2, directions=directions))
    m = model(nodes, inputs, SCAN8_OUTS, opset=8)
    assert_matches_ort(m, {"s0": rand(2, 3), "k0": np.float32([0.5, 2]), "x": rand(2, 3, 3, seed=1),
                           "y": rand(2, 3, 3, seed=2)}, opt_levels=(0, 2))


def test_scan_errors():
    body = scan_body()
    m = model([h.make_node("Scan", ["s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=body, num_scan_inputs=2)],
              [vi("s0", F, [3]), vi("k0", F, []), vi("x", F, [4, 3]), vi("y", F, [3, 3])],
              SCAN_OUTS)
    with pytest.raises(UnsupportedModelError, match="different sequence lengths"):
        import_onnx(m)
    m = model([h.make_node("Scan", ["s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=body, num_scan_inputs=2,
                           scan_input_axes=[2, 0])],
              [vi("s0", F, [3]), vi("k0", F, []), vi("x", F, [4, 3]), vi("y", F, [4, 3])],
              SCAN_OUTS)
    with pytest.raises(UnsupportedModelError, match="scan_input_axes entry 2 is out of range for rank 2"):
        import_onnx(m)
    n = control_flow.MAX_UNROLL + 1
    m = model([h.make_node("Scan", ["s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=body, num_scan_inputs=2)],
              [vi("s0", F, [3]), vi("k0", F, []), vi("x", F, [n, 3]), vi("y", F, [n, 3])],
              SCAN_OUTS)
    with pytest.raises(UnsupportedModelError, match=f"stops at {control_flow.MAX_UNROLL}"):
        import_onnx(m)


def test_scan_references_match_ort_through_onnx_reference():
    # the unrolled graph folds to constants at O1 when every input is a constant
    m = model([h.make_node("Scan", ["s0", "k0", "x", "y"], ["s", "k", "o1", "o2"], body=scan_body(),
                           num_scan_inputs=2, scan_output_directions=[1, 0])],
              [], SCAN_OUTS,
              initializers=[onnx.numpy_helper.from_array(a, n) for n, a in
                            [("s0", rand(3)), ("k0", np.array(1, np.float32)), ("x", rand(4, 3, seed=1)), ("y", rand(4, 3, seed=2))]])
    mod = tensorfuse.compile(m, opt_level=1)
    for got, want in zip(mod.run(), ort_run(m, {})):
        np.testing.assert_allclose(got, want, rtol=1e-6)
