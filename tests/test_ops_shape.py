"""Shape and data-movement ops against onnxruntime: Reshape, Flatten, Squeeze, Unsqueeze,
Transpose, Expand, Tile, Shape, Size, Concat, Split, Slice."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse import compiler
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, run_reference
from tensorfuse.ir.types import TensorType
from oracle import assert_matches_ort, node_model, ort_run, rand

I64 = np.int64
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_]


def bad_model(op, inputs, attrs=None, initializers=None, opset=17, outputs=("y",), input_names=None):
    """A one-node model whose outputs get an untyped-shape tensor type (ONNX inference failed)."""
    m = node_model(op, inputs, attrs, opset=opset, initializers=initializers, outputs=outputs,
                   input_names=input_names)
    et = m.graph.input[0].type.tensor_type.elem_type
    for o in m.graph.output:
        if not o.type.HasField("tensor_type"):
            o.type.tensor_type.elem_type = et
            o.type.tensor_type.shape.SetInParent()
    return m


def check(op, inputs, attrs=None, initializers=None, opset=17, input_names=None, outputs=("y",), levels=(0, 2)):
    m = node_model(op, inputs, attrs, opset=opset, initializers=initializers, input_names=input_names,
                   outputs=outputs)
    return assert_matches_ort(m, inputs, rtol=0, atol=0, opt_levels=levels)


def ref_check(op, arrays, attrs=None, n_out=1, opset=17):
    """The numpy reference (constant folding's meaning) against onnxruntime, all inputs given."""
    g = Graph()
    b = Builder(g)
    vals = [None if a is None else b.const(a) for a in arrays]
    outs = b.op(op, *vals, num_outputs=n_out, **(attrs or {}))
    node = g.nodes[-1]
    got = run_reference(node, arrays)
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
    m = node_model(op, {n: a for n, a in zip(names, arrays) if n}, attrs, input_names=names,
                   outputs=[f"y{k}" for k in range(n_out)], opset=opset)
    exp = ort_run(m, {n: a for n, a in zip(names, arrays) if n})
    for gv, ev, v in zip(got, exp, node.outputs if n_out > 1 else [outs]):
        assert gv.dtype == ev.dtype and gv.shape == ev.shape == v.shape
        np.testing.assert_array_equal(gv, ev)


# ----------------------------------------------------------------------------- Reshape
@pytest.mark.parametrize("shape,target,allowzero", [
    ((2, 3, 4), [4, -1], 0),
    ((2, 3, 4), [0, -1], 0),
    ((2, 3, 4), [0, 0, 2, 2], 0),
    ((2, 3, 4), [-1], 0),
    ((2, 3, 4), [24], 0),
    ((1, 6), [3, 1, 2], 0),
    ((0, 3), [0, 3], 1),
    ((0, 3), [3, 0], 1),
    ((2, 3), [6, 1], 1),
    ((1,), [], 0),
])
def test_reshape(shape, target, allowzero):
    x = rand(*shape)
    check("Reshape", {"x": x}, {"allowzero": allowzero}, {"s": np.array(target, I64)}, opset=17)


def test_reshape_runtime_shape_input_is_an_error():
    m = node_model("Reshape", {"x": rand(2, 3), "s": np.array([3, 2], I64)})
    with pytest.raises(UnsupportedModelError, match="known at compile time"):
        import_onnx(m)  # compile() specialises on the input's value instead


def test_reshape_shape_as_graph_input_specialises():
    x = rand(2, 3)
    inputs = {"x": x, "s": np.array([3, -1], I64)}
    assert_matches_ort(node_model("Reshape", inputs), inputs, rtol=0, atol=0)


@pytest.mark.parametrize("target", [[5, -1], [-1, -1], [7], [2, -2]])
def test_reshape_errors(target):
    m = bad_model("Reshape", {"x": rand(2, 3)}, initializers={"s": np.array(target, I64)})
    with pytest.raises(UnsupportedModelError, match="Reshape"):
        tensorfuse.compile(m)


def test_reshape_opset5_and_reference():
    check("Reshape", {"x": rand(2, 3, 4)}, None, {"s": np.array([0, 12], I64)}, opset=7)
    ref_check("Reshape", [rand(2, 3, 4), np.array([4, 0, -1], I64)])


@pytest.mark.parametrize("dt", DTYPES)
def test_reshape_dtypes(dt):
    check("Reshape", {"x": rand(2, 6, dtype=dt)}, None, {"s": np.array([3, 4], I64)})


# ----------------------------------------------------------------------------- Flatten
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", {"x": rand(2, 3, 4)}, {"axis": axis}, opset=13 if axis >= 0 else 11)


def test_flatten_old_opset_default_axis_and_reference():
    check("Flatten", {"x": rand(2, 3, 4)}, opset=7)
    ref_check("Flatten", [rand(2, 3, 4)], {"axis": -2})


def test_flatten_bad_axis():
    m = bad_model("Flatten", {"x": rand(2, 3)}, {"axis": 3})
    with pytest.raises(UnsupportedModelError, match="axis 3"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Squeeze / Unsqueeze
@pytest.mark.parametrize("shape,axes", [((1, 3, 1, 2), None), ((1, 3, 1, 2), [0]), ((1, 3, 1, 2), [-2, 0]),
                                        ((1, 1), None), ((3,), None)])
@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze(shape, axes, opset):
    x = rand(*shape)
    if axes is None:
        check("Squeeze", {"x": x}, opset=opset)
    elif opset < 13:
        check("Squeeze", {"x": x}, {"axes": axes}, opset=opset)
    else:
        check("Squeeze", {"x": x}, None, {"a": np.array(axes, I64)}, opset=opset)


def test_squeeze_opset7_and_reference():
    check("Squeeze", {"x": rand(1, 3, 1)}, {"axes": [2]}, opset=7)
    ref_check("Squeeze", [rand(1, 3, 1), np.array([-1], I64)])


def test_squeeze_non_unit_axis_is_an_error():
    m = bad_model("Squeeze", {"x": rand(1, 3)}, initializers={"a": np.array([1], I64)})
    with pytest.raises(UnsupportedModelError, match="size is 3"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("shape,axes", [((3, 2), [0]), ((3, 2), [-1]), ((3, 2), [0, 3]), ((), [0]),
                                        ((3,), [3, 0, -3])])
@pytest.mark.parametrize("opset", [11, 13])
def test_unsqueeze(shape, axes, opset):
    x = rand(*shape)
    if opset < 13:
        check("Unsqueeze", {"x": x}, {"axes": axes}, opset=opset)
    else:
        check("Unsqueeze", {"x": x}, None, {"a": np.array(axes, I64)}, opset=opset)


def test_unsqueeze_errors_and_reference():
    ref_check("Unsqueeze", [rand(3, 2), np.array([1, -1], I64)])
    for axes in ([0, 0], [4]):
        m = bad_model("Unsqueeze", {"x": rand(3, 2)}, initializers={"a": np.array(axes, I64)})
        with pytest.raises(UnsupportedModelError, match="Unsqueeze"):
            tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Transpose
@pytest.mark.parametrize("shape,perm", [((2, 3), None), ((2, 3, 4), None), ((2, 3, 4), [1, 0, 2]),
                                        ((2, 3, 4, 5), [0, 2, 3, 1]), ((2, 3, 4, 5), [3, 1, 0, 2]),
                                        ((5,), [0]), ((), None)])
def test_transpose(shape, perm):
    check("Transpose", {"x": rand(*shape)}, None if perm is None else {"perm": perm})


@pytest.mark.parametrize("dt", DTYPES)
def test_transpose_dtypes(dt):
    check("Transpose", {"x": rand(2, 3, 4, dtype=dt)}, {"perm": [2, 0, 1]})


def test_transpose_bad_perm_and_reference():
    ref_check("Transpose", [rand(2, 3, 4)], {"perm": [1, 2, 0]})
    m = bad_model("Transpose", {"x": rand(2, 3)}, {"perm": [0, 0]})
    with pytest.raises(Exception, match="permutation"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Expand / Tile
@pytest.mark.parametrize("shape,target", [((3, 1), [2, 3, 4]), ((3, 1), [3, 1]), ((1,), [2, 2]),
                                          ((2, 3), [1, 1]), ((4, 1, 2), [2, 1, 3, 1]), ((), [2, 3]),
                                          ((3, 1), [3, 0])])
def test_expand(shape, target):
    check("Expand", {"x": rand(*shape)}, None, {"s": np.array(target, I64)})


def test_expand_errors_and_reference():
    ref_check("Expand", [rand(3, 1), np.array([2, 1, 5], I64)])
    ref_check("Expand", [rand(2, 1, dtype=np.int32), np.array([2, 4], I64)])
    m = bad_model("Expand", {"x": rand(3, 2)}, initializers={"s": np.array([4, 4], I64)})
    with pytest.raises(UnsupportedModelError, match="broadcast"):
        tensorfuse.compile(m)


@pytest.mark.parametrize("shape,reps", [((2, 3), [1, 1]), ((2, 3), [2, 3]), ((3,), [4]), ((2, 1, 3), [1, 3, 2]),
                                        ((2, 3), [0, 2])])
def test_tile(shape, reps):
    check("Tile", {"x": rand(*shape)}, None, {"r": np.array(reps, I64)})


def test_tile_errors_and_reference():
    check("Tile", {"x": rand(2, 3, dtype=np.int64)}, None, {"r": np.array([2, 2], I64)}, opset=7)
    ref_check("Tile", [rand(2, 3, dtype=np.int32), np.array([3, 1], I64)])
    m = bad_model("Tile", {"x": rand(3, 2)}, initializers={"r": np.array([2], I64)})
    with pytest.raises(UnsupportedModelError, match="repeats"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Shape / Size
@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 3}, {"start": 10},
                                   {"start": -10, "end": 10}, {"start": 3, "end": 1}])
def test_shape(attrs):
    check("Shape", {"x": rand(2, 3, 4, 5)}, attrs, opset=15 if attrs else 13)


def test_size_and_shape_are_known_at_import():
    check("Size", {"x": rand(2, 3, 4)})
    check("Size", {"x": rand()})
    ref_check("Shape", [rand(2, 3)], {"start": 1})
    ref_check("Size", [rand(2, 3)])
    g = compiler.frontend.onnx.import_onnx(node_model("Shape", {"x": rand(2, 5)}))
    np.testing.assert_array_equal(g.outputs[0].known, [2, 5])


def test_shape_subgraph_feeds_reshape():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the reshape target is known at import."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
        helper.make_node("Concat", ["d0u", "m1"], ["tgt"], axis=0),
        helper.make_node("Reshape", ["x", "tgt"], ["y"]),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(0, I64), "i0"),
             onnx.numpy_helper.from_array(np.array([0], I64), "ax"),
             onnx.numpy_helper.from_array(np.array([-1], I64), "m1")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rand(2, 3, 4)
    out = assert_matches_ort(m, {"x": x}, rtol=0, atol=0)
    assert out[0].shape == (2, 12)


# ----------------------------------------------------------------------------- Concat
@pytest.mark.parametrize("shapes,axis", [([(2, 3), (2, 5)], 1), ([(2, 3), (4, 3), (1, 3)], 0),
                                         ([(2, 3, 4), (2, 3, 1)], -1), ([(2, 3)], 0),
                                         ([(2, 0), (2, 3), (2, 0)], 1), ([(0, 3), (2, 3)], -2),
                                         ([(3,), (2,)], 0)])
def test_concat(shapes, axis):
    ins = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    check("Concat", ins, {"axis": axis})


@pytest.mark.parametrize("dt", DTYPES)
def test_concat_dtypes_and_same_input_twice(dt):
    x = rand(2, 3, dtype=dt)
    m = node_model("Concat", {"x": x}, {"axis": 0}, input_names=["x", "x"])
    assert_matches_ort(m, {"x": x}, rtol=0, atol=0)


def test_concat_errors_and_reference():
    ref_check("Concat", [rand(2, 3), rand(2, 1, seed=1)], {"axis": 1})
    m = bad_model("Concat", {"a": rand(2, 3), "b": rand(3, 3)}, {"axis": 1})
    with pytest.raises(Exception, match="differ outside axis"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Split
@pytest.mark.parametrize("opset", [7, 11, 13, 18])
@pytest.mark.parametrize("split", [None, [1, 3, 2]])
def test_split(opset, split):
    x = rand(6, 4)
    outs = ["y0", "y1", "y2"]
    if split is None and opset >= 18:
        pytest.skip("Split-18 requires split or num_outputs (tested below)")
    if split is None:
        check("Split", {"x": x}, {"axis": 0}, opset=opset, outputs=outs)
    elif opset < 13:
        check("Split", {"x": x}, {"axis": 0, "split": split}, opset=opset, outputs=outs)
    else:
        check("Split", {"x": x}, {"axis": 0}, {"s": np.array(split, I64)}, opset=opset, outputs=outs)


@pytest.mark.parametrize("dim,n", [(7, 3), (6, 3), (5, 2), (4, 4), (2, 1)])
def test_split_num_outputs_uneven(dim, n):
    outs = [f"y{i}" for i in range(n)]
    check("Split", {"x": rand(2, dim)}, {"axis": -1, "num_outputs": n}, opset=18, outputs=outs)


def test_split_zero_chunk_and_reference():
    check("Split", {"x": rand(2, 4, 3)}, {"axis": 1}, {"s": np.array([0, 4], I64)}, opset=13,
          outputs=["y0", "y1"])
    ref_check("Split", [rand(6, 2), np.array([2, 4], I64)], {"axis": 0}, n_out=2, opset=13)


def test_split_errors():
    m = bad_model("Split", {"x": rand(5, 2)}, {"axis": 0}, outputs=["a", "b"], opset=13)
    with pytest.raises(UnsupportedModelError, match="equal parts"):
        tensorfuse.compile(m)
    m = bad_model("Split", {"x": rand(5, 2)}, {"axis": 0}, {"s": np.array([2, 2], I64)},
                   outputs=["a", "b"], opset=13)
    with pytest.raises(UnsupportedModelError, match="does not sum"):
        tensorfuse.compile(m)


# ----------------------------------------------------------------------------- Concat/Split block copies
# emit_row_copies: every contiguous run at least one vector -> L-lane copies in blocks of
# COPY_BLOCK_VECTORS*L elements, scalar tails, one parallel loop over all inputs' blocks
ROW_COPY_CASES = [
    ([(1, 16, 9, 13), (1, 24, 9, 13)], 1),                    # channel concat: one run per input
    ([(2, 5, 7, 11), (2, 3, 7, 11), (2, 1, 7, 11)], 1),       # N = 2 rows, 3 inputs
    ([(3, 4, 20), (3, 4, 9)], 2),                             # last axis, runs of 20 and 9
    ([(2, 64, 33), (2, 64, 31)], -1),
    ([(1, 7, 300), (1, 7, 1029), (1, 7, 16)], 2),             # a run of one block + 5
    ([(1, 96, 56, 56), (1, 32, 56, 56)], 1),                  # large: 2 threads split the blocks
]


def _row_copy_kernel(mod):
    from tensorfuse.ir.kernel import For
    (k,) = mod.kernels
    loops = [s for s in k.body if isinstance(s, For)]
    return k, loops


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int64, np.int8])
@pytest.mark.parametrize("shapes,axis", ROW_COPY_CASES)
def test_concat_row_copies(shapes, axis, dt):
    from tensorfuse.codegen.llvm.emit import kernel_is_parallel
    ins = {f"x{i}": rand(*s, seed=i, dtype=dt, low=-100, high=100) for i, s in enumerate(shapes)}
    m = node_model("Concat", ins, {"axis": axis})
    for nt in (1, 2):
        got = assert_matches_ort(m, ins, rtol=0, atol=0, num_threads=nt)
    from tensorfuse.ir.target import Target
    L = Target.parse("llvm").lanes(dt)
    a = axis % len(shapes[0])
    vector = all(int(np.prod(sh[a:])) >= L for sh in shapes)       # else the per-element loops
    mod = tensorfuse.compile(m, opt_level=2)
    k, loops = _row_copy_kernel(mod)
    assert (len(loops) == 1 and "job" in loops[0].var.name) == vector
    if int(np.prod(got[0].shape)) >= 400_000 and dt == np.float32:
        assert kernel_is_parallel(k)


@pytest.mark.parametrize("dt", [np.float32, np.int8])
@pytest.mark.parametrize("shape,axis,split", [((2, 40, 9, 13), 1, [16, 24]), ((3, 5, 70), -1, [8, 41, 21]),
                                              ((1, 128, 56, 56), 1, [64, 0, 64])])
def test_split_row_copies(shape, axis, split, dt):
    x = rand(*shape, dtype=dt, low=-100, high=100)
    outs = [f"y{i}" for i in range(len(split))]
    m = node_model("Split", {"x": x}, {"axis": axis}, initializers={"s": np.array(split, I64)}, outputs=outs)
    for nt in (1, 2):
        assert_matches_ort(m, {"x": x}, rtol=0, atol=0, num_threads=nt)
    from tensorfuse.ir.target import Target
    L, a = Target.parse("llvm").lanes(dt), axis % len(shape)
    vector = all(c * int(np.prod(shape[a + 1:])) >= L for c in split if c)
    _, loops = _row_copy_kernel(tensorfuse.compile(m, opt_level=2))
    assert (len(loops) == 1 and "job" in loops[0].var.name) == vector


def test_concat_row_copies_vector_width():
    """The copies use the target's vector width for the dtype; runs shorter than a vector and
    bool keep the per-element loops."""
    from tensorfuse.ir.target import Target
    from tensorfuse.ir.kernel import For, If, Store
    t = Target.parse("llvm")

    def store_lanes(body, out):
        for st in body:
            if isinstance(st, Store):
                out.add(st.value.lanes)
            elif isinstance(st, For):
                store_lanes(st.body, out)
            elif isinstance(st, If):
                store_lanes(st.then, out), store_lanes(st.orelse, out)
        return out
    for dt in (np.float32, np.float16, np.float64, np.int8):
        ins = {"a": rand(2, 3, 40, dtype=dt), "b": rand(2, 5, 40, dtype=dt)}
        (k,) = tensorfuse.compile(node_model("Concat", ins, {"axis": 1})).kernels
        assert max(store_lanes(k.body, set())) == t.lanes(dt) and store_lanes(k.body, set()) <= {1, t.lanes(dt)}
    for ins in ({"a": rand(4, 3), "b": rand(4, 2)},
                {"a": rand(2, 40) > 0, "b": rand(2, 40) > 0}):
        (k,) = tensorfuse.compile(node_model("Concat", ins, {"axis": 1})).kernels
        assert store_lanes(k.body, set()) == {1}
        check("Concat", ins, {"axis": 1})


@pytest.mark.parametrize("width", ["sse-4-lanes", "avx512-16-lanes"])
def test_row_copies_at_other_vector_widths(width, monkeypatch):
    """4 lanes (SSE target) and the 16-lane layout (vector_bits 512; LLVM splits the vectors
    for this CPU): blocks, remainders and tails against onnxruntime."""
    from conftest import width_target
    t, lanes = width_target(width, monkeypatch)
    assert t.lanes(np.float32) == lanes
    ins = {"a": rand(2, 3, 7, 50), "b": rand(2, 30, 7, 50, seed=1), "c": rand(2, 1, 7, 50, seed=2)}
    x = rand(2, 34, 7, 50)
    for m, feeds in [(node_model("Concat", ins, {"axis": 1}), ins),
                     (node_model("Split", {"x": x}, {"axis": 1}, initializers={"s": np.array([3, 30, 1], I64)},
                                 outputs=["y0", "y1", "y2"]), {"x": x})]:
        expected = ort_run(m, feeds)
        for nt in (1, 2):
            mod = tensorfuse.compile(m, target=t, cache=False, num_threads=nt)
            for g, e in zip(mod.run(**feeds), expected):
                np.testing.assert_array_equal(g, e)


# ----------------------------------------------------------------------------- Slice
BIG = np.iinfo(np.int64).max
SLICES = [
    ([0], [2], [0], [1]),
    ([1, 0], [3, -1], [0, 1], [1, 1]),
    ([-1], [-BIG], [1], [-1]),
    ([BIG], [-BIG], [1], [-2]),
    ([0], [BIG], [-1], [2]),
    ([-3], [-1], [0], None),
    ([10], [20], [1], [1]),
    ([3], [1], [1], [1]),
    ([4], [0], [2], [-3]),
    ([0, 0, 0], [1, 9, 9], [0, 2, 1], [1, -1, 3]),
    ([-100], [100], [2], [1]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
def test_slice(starts, ends, axes, steps, idx_dtype):
    x = rand(3, 5, 6)
    lo, hi = _lim(idx_dtype)
    inits = {"s": np.array(starts).clip(lo, hi).astype(idx_dtype), "e": np.array(ends).clip(lo, hi).astype(idx_dtype),
             "a": np.array(axes, idx_dtype)}
    if steps is not None:
        inits["t"] = np.array(steps, idx_dtype)
    check("Slice", {"x": x}, None, inits, opset=13)


def _lim(dt):
    i = np.iinfo(dt)
    return i.min, i.max


def test_slice_defaults_no_axes_no_steps():
    check("Slice", {"x": rand(4, 5)}, None, {"s": np.array([1, -2], I64), "e": np.array([3, 5], I64)})
    check("Slice", {"x": rand(4, 5)}, None, {"s": np.array([1], I64), "e": np.array([3], I64),
                                             "t": np.array([2], I64)},
          input_names=["x", "s", "e", "", "t"])


def test_slice_opset1_attributes():
    check("Slice", {"x": rand(4, 5, 3)}, {"starts": [1, -4], "ends": [1000, -1], "axes": [0, 1]}, opset=9)
    check("Slice", {"x": rand(4, 5)}, {"starts": [1, 0], "ends": [3, 2]}, opset=7)


@pytest.mark.parametrize("dt", DTYPES)
def test_slice_dtypes(dt):
    check("Slice", {"x": rand(4, 5, dtype=dt)}, None, {"s": np.array([3, 1], I64), "e": np.array([0, 5], I64),
                                                       "a": np.array([0, 1], I64), "t": np.array([-1, 2], I64)})


def test_slice_errors_and_reference():
    ref_check("Slice", [rand(4, 5), np.array([3], I64), np.array([-BIG], I64), np.array([0], I64),
                        np.array([-2], I64)])
    m = bad_model("Slice", {"x": rand(4, 5)}, None, {"s": np.array([0], I64), "e": np.array([2], I64),
                                                      "a": np.array([0], I64), "t": np.array([0], I64)})
    with pytest.raises(Exception, match="step"):
        tensorfuse.compile(m)
