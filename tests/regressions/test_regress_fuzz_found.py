"""Regression tests for bugs the random-graph and model fuzzing of issue 9 found (shrunk by
``tests/fuzz``), that are not among the issue's listed defects. Each failed before its fix."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from oracle import assert_matches_ort, rand


def _resize_model(mode: str, sizes):
    g = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                          coordinate_transformation_mode="half_pixel")],
        "resize_identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, sizes)],
        initializer=[numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
def test_resize_to_its_own_size(mode):
    """Resize whose sizes equal the input shape (no axis resized): the linear and cubic
    lowering built the tap product from no taps (AttributeError 'NoneType' ... 'cast' in
    ir/ops/resize.py emit_resize, wrapped in a CompileError). Found by random_graphs.py
    --seed 1, graph 404 (seed 1000407), shrunk from 4 nodes."""
    assert_matches_ort(_resize_model(mode, [1, 2, 2, 6]), {"x": rand(1, 2, 2, 6)}, opt_levels=(0, 2))


def test_negative_input_dimension_is_a_dynamic_one():
    """A graph input declared with dim_value -1 (onnx.checker accepts it; onnxruntime reads it
    as unknown): TensorType's ValueError "negative dimension in shape" escaped from the frontend.
    Now UnsupportedModelError naming the input, and input_shapes= fixes it. Found by
    fuzz_models.py --seed 1, mutation 347 (input_shape)."""
    import tensorfuse
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "neg",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, -1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, -1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with pytest.raises(tensorfuse.UnsupportedModelError, match="input 'x' has a dynamic dimension 1"):
        tensorfuse.compile(m, cache=False)
    x = rand(3, 4)
    (y,) = tensorfuse.compile(m, cache=False, input_shapes={"x": [3, 4]}).run(x=x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_resize_with_non_finite_scales_is_refused(bad):
    # tests/fuzz/fuzz_models.py seed 3, mutation 195 (a flipped byte in Resize's scales): an
    # infinite scale raised OverflowError from the output-shape computation
    from onnx import TensorProto, helper, numpy_helper
    sc = numpy_helper.from_array(np.array([1, 1, bad, 2], np.float32), "sc")
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], initializer=[sc])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(tensorfuse.TensorfuseError, match="positive and finite"):
        tensorfuse.compile(m, cache=False)


@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_maxpool_same_upper_ignores_ceil_mode(ceil_mode):
    """MaxPool with auto_pad=SAME_UPPER, ceil_mode=1 and dilations: random_graphs.py --seed 6,
    graph 789 (seed 6000807), shrunk from 4 nodes to this one, "mismatched" at O0, O2 and O3.
    Not a tensorfuse bug: with SAME_* the spec fixes the output at ceil(in / stride) and the
    padding at (out - 1) * stride + (k - 1) * dilation + 1 - in, split with the extra at the
    end, so ceil_mode changes nothing; onnx.reference and tensorfuse give [11, 14] for both
    ceil_mode values, onnxruntime 1.32 gives [14, 11] for ceil_mode=1. The generator no longer
    draws SAME_* with ceil_mode=1 (tests/fuzz/graphgen.py g_pool). Expected values by hand:
    rows -1, 1, 3 (row -1 is padding) and rows 2, 4, 6 (row 6 is padding), each over all 3
    columns of arange(15).reshape(5, 3)."""
    node = helper.make_node("MaxPool", ["x"], ["y"], auto_pad="SAME_UPPER", ceil_mode=ceil_mode,
                            dilations=[2, 1], kernel_shape=[3, 3], strides=[3, 3])
    _check_pool(node, (1, 1, 5, 3), (1, 1, 2, 1), [[[[11.0], [14.0]]]], opset=17)


def _check_pool(node, in_shape, out_shape, expected, opset=18):
    """``node`` on arange(in_shape) at O0 and O2 equals ``expected`` (computed by hand)."""
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    x = np.arange(int(np.prod(in_shape)), dtype=np.float32).reshape(in_shape)
    for level in (0, 2):
        (y,) = tensorfuse.compile(m, opt_level=level, cache=False).run(x)
        np.testing.assert_array_equal(y, expected)


# --- generator rules: cases where implementations legitimately disagree are not drawn --------

def _graphs(ops, n=150, base=9_100_000):
    import sys, pathlib
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from fuzz import graphgen
    return [graphgen.generate(base + i, ops=ops).model for i in range(n)]


def _upstream(model, value):
    maker = {o: n for n in model.graph.node for o in n.output}
    ops, todo, seen = set(), [value], set()
    while todo:
        n = maker.get(todo.pop())
        if n is not None and n.name not in seen:
            seen.add(n.name)
            ops.add(n.op_type)
            todo.extend(i for i in n.input if i)
    return ops


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_maxpool_ceil_mode_drops_a_window_that_starts_outside():
    """The first MaxPool of random_graphs.py --seed 7, graph 4417 (seed 7004438), which tensorfuse
    refused: kernel 2, stride 3, ceil_mode=1 over 3 rows. ceil((3 - 2) / 3) + 1 = 2 windows, but
    the second would start at row 3, past the input, and the spec drops it ("sliding windows that
    would start in the right padded region are ignored"), so the output has 1 row. onnxruntime's
    kernel and onnx.reference give 1 row too, but onnx shape inference (and onnxruntime's own
    declared shape) say 2, so the graph's next MaxPool (a 2-row window) met 1 row, where the
    spec's output is empty and tensorfuse refuses with UnsupportedModelError (onnxruntime pools it
    by truncating division). Expected by hand: rows 0-1 of arange(6).reshape(3, 2)."""
    node = helper.make_node("MaxPool", ["x"], ["y"], ceil_mode=1, kernel_shape=[2, 1], strides=[3, 1])
    _check_pool(node, (1, 1, 3, 2), (1, 1, 1, 2), [[[[2.0, 3.0]]]])
    second = helper.make_node("MaxPool", ["y"], ["z"], kernel_shape=[2, 2], strides=[2, 3], name="MaxPool_9")
    g2 = helper.make_graph([node, second], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 6])],
                           [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None] * 4)])
    m2 = helper.make_model(g2, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(tensorfuse.UnsupportedModelError, match="MaxPool_9.*kernel extent 2 exceeds the padded input size 1"):
        tensorfuse.compile(m2, cache=False)


def test_generator_draws_no_ceil_mode_window_in_the_padding():
    """g_pool leaves ceil_mode out where the spec would drop the last window (see above)."""
    seen = 0
    for m in _graphs(("pool",)):
        shapes = {}
        import onnx
        mi = onnx.shape_inference.infer_shapes(m)
        for vi in list(mi.graph.input) + list(mi.graph.value_info) + list(mi.graph.output):
            shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        for n in m.graph.node:
            a = _attrs(n)
            if n.op_type not in ("MaxPool", "AveragePool") or not a.get("ceil_mode") or a.get("auto_pad", b"NOTSET") != b"NOTSET":
                continue
            seen += 1
            k, s = a["kernel_shape"], a.get("strides", [1, 1])
            p, d = a.get("pads", [0, 0, 0, 0]), a.get("dilations", [1, 1])
            for i, size in enumerate(shapes[n.input[0]][2:]):
                span = size + p[i] + p[i + 2] - ((k[i] - 1) * d[i] + 1)
                assert -(-span // s[i]) * s[i] < size + p[i], (n.name, a, size)
    assert seen > 10


def test_generator_draws_no_arg_reduction_over_near_ties():
    """ArgMax/ArgMin over candidates that are equal in exact arithmetic: rounding picks the
    winner, so implementations legitimately disagree. random_graphs.py --seed 7, graph 3717
    (seed 7003738), shrunk to Softmax, Transpose, Resize (linear, align_corners), ArgMin, Cast:
    onnx.reference, onnxruntime and tensorfuse each picked another index (1 and 2 apart).
    --seed 8, graph 2438 (seed 8002462), shrunk to LayerNormalization over 2 elements
    (epsilon 1e-12), ArgMax over the 3 rows, Cast: every row normalises to +-gamma exactly,
    and the index differed by 1. Not lowering bugs, so g_reduce draws no ArgMax/ArgMin over a
    value computed from the ops in graphgen.ARG_NEAR_TIES."""
    from fuzz.graphgen import ARG_NEAR_TIES
    args = 0
    for m in _graphs(("resize", "reduce", "layernorm"), n=240):
        for n in m.graph.node:
            if n.op_type in ("ArgMax", "ArgMin"):
                args += 1
                assert not _upstream(m, n.input[0]) & ARG_NEAR_TIES, n.name
    assert args > 10


def test_generator_draws_no_tiny_layernorm_epsilon_over_constant_rows():
    """random_graphs.py --seed 7, graph 3760 (seed 7003781), shrunk to Pad, BatchNormalization,
    LayerNormalization(epsilon=1e-12): the padded rows are constant, so their variance is rounding
    noise and the result is that noise over sqrt(noise + 1e-12) (onnxruntime was 0.039 from
    onnx.reference, tensorfuse 0.0097). g_layernorm uses epsilon 1e-5 over values computed from
    ops that repeat values (graphgen.CONSTANT_RUNS)."""
    from fuzz.graphgen import CONSTANT_RUNS
    tiny = 0
    for m in _graphs(("pad", "batchnorm", "layernorm", "pool"), n=200):
        inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        for n in m.graph.node:
            if n.op_type == "LayerNormalization":
                eps, x = _attrs(n).get("epsilon", 1e-5), n.input[0]
            elif n.op_type == "Add" and n.input[1] in inits and n.input[1].startswith("eps"):
                eps, x = float(inits[n.input[1]]), n.input[0]     # the decomposition's var + eps
            else:
                continue
            if eps < 1e-6:
                tiny += 1
                assert not _upstream(m, x) & CONSTANT_RUNS, n.name
    assert tiny > 5


@pytest.mark.parametrize("as_node", [True, False])
def test_constant_of_a_dtype_tensorfuse_lacks(as_node):
    """fuzz_models.py --seed 6, mutation 9931 (tensor_dtype: a Constant's tensor retyped to
    complex64): the Constant node's value reached ``TensorType.of`` and raised its TypeError
    ("numpy dtype complex64 has no tensorfuse DType"), an internal exception; an initializer of
    that dtype already got UnsupportedModelError. Both now name the node or initializer."""
    c = numpy_helper.from_array(np.array([1 + 2j, 3 - 1j], np.complex64), "c")
    nodes = [helper.make_node("Constant", [], ["c"], value=c)] if as_node else []
    nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    g = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.COMPLEX64, [2])],
                          initializer=[] if as_node else [c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    where = "unnamed Constant node" if as_node else "initializer 'c'"
    with pytest.raises(tensorfuse.UnsupportedModelError, match=f"{where}.*complex64"):
        tensorfuse.compile(m, cache=False)
