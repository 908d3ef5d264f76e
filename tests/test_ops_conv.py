"""Conv, ConvTranspose and ConvInteger against onnxruntime (ONNX spec sections "Conv",
"ConvTranspose", "ConvInteger"): every attribute at small sizes, older opsets, the numpy
references, and the errors for invalid nodes."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, get_op, run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5

#: the tests that assert which blocked conv schedule a shape takes compile for the AVX2 layout
#: (8 float32 lanes, 16 vector registers) on every host, AVX-512 ones included, since the
#: choice depends on the lanes; tests/test_vector_widths.py runs the schedules at each width
SCHEDULE_TARGET = "llvm -mattr=-avx512f"


def _ref(op, arrays, **attrs):
    """Run the registry's numpy reference on a one-node graph."""
    g = Graph()
    b = Builder(g)
    ins = [None if a is None else g.add_input(f"x{i}", TensorType.of(a)) for i, a in enumerate(arrays)]
    out = b.op(op, *ins, **attrs)
    node = (out[0] if isinstance(out, list) else out).producer
    return run_reference(node, list(arrays)), node


def _check(op, xs, attrs, opset=17, rtol=RT, atol=AT, consts=None, opt_levels=(0, 2), oracle="ort",
           outputs=("y",)):
    """Compile and compare with onnxruntime (or onnx.reference where onnxruntime lacks the
    case: ``oracle="ref"``); ``xs`` are the node's inputs in order (None: omitted)."""
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(xs)]
    inputs = {n: a for n, a in zip(names, xs) if a is not None and not (consts and n in consts)}
    inits = {n: a for n, a in zip(names, xs) if a is not None and consts and n in consts}
    m = node_model(op, inputs, attrs, opset=opset, initializers=inits, input_names=names, outputs=outputs)
    if oracle == "ort":
        return assert_matches_ort(m, inputs, rtol=rtol, atol=atol, opt_levels=opt_levels)
    expected = ReferenceEvaluator(m).run(None, inputs)
    for lvl in opt_levels:
        got = tensorfuse.compile(m, opt_level=lvl).run(**inputs)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape, f"O{lvl}: {g.dtype}{g.shape} vs {e.dtype}{e.shape}"
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"O{lvl}")
    return got


def _u(*shape, seed=0, dtype=np.float32):
    return rand(*shape, seed=seed, dtype=dtype, low=-1, high=1)


# ----------------------------------------------------------------------------- Conv
CONV_CASES = [
    # (x shape, w shape, attrs, with bias)
    ((1, 3, 7, 8), (4, 3, 3, 3), {}, True),
    ((2, 3, 7, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    ((1, 2, 9, 7), (3, 2, 3, 2), {"pads": [0, 2, 1, 0]}, True),                 # asymmetric
    ((1, 2, 9, 9), (3, 2, 3, 3), {"strides": [2, 3], "pads": [1, 1, 1, 1]}, True),
    ((1, 2, 10, 11), (3, 2, 3, 3), {"dilations": [2, 3], "pads": [2, 1, 0, 3]}, True),
    ((1, 2, 12, 12), (3, 2, 3, 3), {"dilations": [2, 2], "strides": [2, 3], "pads": [1, 2, 2, 1]}, False),
    ((1, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, True),
    ((2, 6, 7, 7), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),  # depthwise
    ((1, 4, 5, 5), (8, 1, 3, 3), {"group": 4}, False),                          # depthwise multiplier 2
    ((1, 3, 5, 6), (4, 3, 1, 1), {}, True),                                     # 1x1
    ((1, 3, 5, 6), (4, 3, 1, 1), {"strides": [2, 2]}, True),
    ((1, 3, 4, 4), (2, 3, 5, 5), {"pads": [2, 2, 2, 2]}, True),                 # kernel wider than input
    ((1, 2, 3, 3), (2, 2, 3, 3), {"pads": [3, 3, 3, 3]}, True),                 # rows of pure padding
    ((1, 2, 8, 8), (3, 2, 3, 3), {"pads": [0, 0, 3, 4], "strides": [3, 3]}, True),  # end pads partly unused
    ((1, 3, 7, 8), (4, 3, 3, 3), {"kernel_shape": [3, 3], "pads": [1, 0, 1, 0]}, True),
    # 1-D and 3-D
    ((2, 3, 17), (4, 3, 3), {"pads": [1, 2]}, True),
    ((1, 4, 20), (6, 2, 4), {"group": 2, "strides": [3], "dilations": [2], "pads": [3, 0]}, True),
    ((1, 1, 1300), (2, 1, 5), {"pads": [2, 7], "strides": [1]}, True),           # row longer than one tile
    ((1, 1, 2100), (2, 1, 3), {"pads": [1, 1], "strides": [2], "dilations": [3]}, False),
    ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 0, 1, 1, 2, 0]}, True),
    ((1, 4, 5, 6, 7), (4, 2, 2, 3, 2), {"group": 2, "strides": [2, 1, 3], "dilations": [1, 2, 1]}, True),
    ((1, 2, 3, 4, 5, 6), (2, 2, 2, 2, 2, 2), {"pads": [1] * 8}, True),          # 4-D spatial (N-D)
]


@pytest.mark.parametrize("xs,ws,attrs,bias", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv(xs, ws, attrs, bias):
    x, w = _u(*xs), _u(*ws, seed=1)
    b = _u(ws[0], seed=2) if bias else None
    _check("Conv", [x, w, b], attrs)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
@pytest.mark.parametrize("strides,dilations,k", [([1, 1], [1, 1], 3), ([2, 2], [1, 1], 4),
                                                 ([2, 3], [1, 1], 3), ([1, 2], [2, 1], 2),
                                                 ([3, 1], [2, 2], 3)])
def test_conv_auto_pad(auto_pad, strides, dilations, k):
    x, w, b = _u(1, 2, 9, 10), _u(3, 2, k, k, seed=1), _u(3, seed=2)
    # onnxruntime refuses dilations with SAME_*: onnx.reference is the oracle there
    oracle = "ref" if auto_pad.startswith("SAME") and dilations != [1, 1] else "ort"
    _check("Conv", [x, w, b], {"auto_pad": auto_pad, "strides": strides, "dilations": dilations}, oracle=oracle)


def test_conv_auto_pad_1d_and_3d():
    x, w = _u(1, 2, 11), _u(3, 2, 4, seed=1)
    _check("Conv", [x, w], {"auto_pad": "SAME_LOWER", "strides": [2]})
    x, w = _u(1, 2, 5, 6, 7), _u(2, 2, 2, 3, 2, seed=1)
    _check("Conv", [x, w], {"auto_pad": "SAME_UPPER", "strides": [2, 1, 3]})


def test_conv_constant_weights():
    x, w, b = _u(1, 3, 8, 8), _u(5, 3, 3, 3, seed=1), _u(5, seed=2)
    _check("Conv", [x, w, b], {"pads": [1, 1, 1, 1]}, consts={"i1", "i2"})


@pytest.mark.parametrize("opset", [7, 11])
def test_conv_old_opsets(opset):
    x, w, b = _u(1, 4, 6, 7), _u(4, 2, 3, 3, seed=1), _u(4, seed=2)
    _check("Conv", [x, w, b], {"group": 2, "pads": [1, 1, 1, 1], "strides": [1, 2]}, opset=opset)


def test_conv_f64():
    x, w, b = _u(1, 3, 7, 6, dtype=np.float64), _u(2, 3, 3, 3, seed=1, dtype=np.float64), \
        _u(2, seed=2, dtype=np.float64)
    _check("Conv", [x, w, b], {"pads": [1, 1, 1, 1], "strides": [2, 1]}, rtol=1e-12, atol=1e-12,
           oracle="ref")  # onnxruntime has no f64 Conv


def test_conv_f16():
    x, w, b = _u(1, 3, 7, 6, dtype=np.float16), _u(2, 3, 3, 3, seed=1, dtype=np.float16), \
        _u(2, seed=2, dtype=np.float16)
    _check("Conv", [x, w, b], {"pads": [1, 1, 1, 1]}, rtol=2e-3, atol=2e-3)


def test_conv_reference_matches_ort():
    x, w, b = _u(2, 4, 7, 8), _u(6, 2, 3, 2, seed=1), _u(6, seed=2)
    attrs = {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}
    (got,), _ = _ref("Conv", [x, w, b], **attrs)
    exp = ort_run(node_model("Conv", {"x": x, "w": w, "b": b}, attrs), {"x": x, "w": w, "b": b})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exp, rtol=RT, atol=AT)
    (got,), _ = _ref("Conv", [x[:, :, :, 0], w[:, :, :, 0]], group=2, auto_pad="SAME_LOWER", strides=[2])
    m = node_model("Conv", {"x": x[:, :, :, 0], "w": w[:, :, :, 0]}, {"group": 2, "auto_pad": "SAME_LOWER",
                                                                      "strides": [2]})
    np.testing.assert_allclose(got, ort_run(m, {"x": x[:, :, :, 0], "w": w[:, :, :, 0]})[0], rtol=RT, atol=AT)


def test_conv_flops():
    _, node = _ref("Conv", [_u(1, 4, 6, 6), _u(8, 2, 3, 3), _u(8)], group=2, pads=[1, 1, 1, 1])
    assert get_op("Conv").flops(node) == 2 * (8 * 6 * 6) * 2 * 9 + 8 * 6 * 6


def test_conv_kernel_reads_rows():
    """The row schedule (W not a constant): a local row accumulator; what codegen produced:
    the kernel is split across the thread team (the entry hands it the team), and LLVM widened
    the innermost loop over contiguous output columns to vector multiplies and adds."""
    import re

    from tensorfuse.ir.kernel import Bin, For, Load, Store
    from tests.codegen_util import expr_nodes as nodes, function_ir, kernel_loops as loops, optimized_ir, parallel_kernels
    x, w = _u(1, 3, 32, 32), _u(8, 3, 3, 3, seed=1)      # enough work for the team to split
    m = node_model("Conv", {"x": x, "w": w}, {"pads": [1, 1, 1, 1]})
    mod = tensorfuse.compile(m, opt_level=0, num_threads=2)
    (k,) = mod.kernels
    (row,) = k.locals
    assert row.name.startswith("row") and row.shape == (32,)
    assert parallel_kernels(mod) == {k.name}


    def accumulates(s):      # row[v] = row[v] + w[...] * x[...]
        return (isinstance(s, Store) and s.buf is row and isinstance(s.value, Bin) and s.value.op == "add"
                and isinstance(s.value.a, Load) and s.value.a.buf is row)
    (acc,) = [f for f in loops(k.body) if not any(isinstance(s, For) for s in f.body)
              and any(accumulates(s) for s in f.body)]
    (st,) = acc.body
    x_loads = [e for e in nodes(st.value.b) if isinstance(e, Load) and e.buf.name == "x"]
    assert len(x_loads) == 1 and any(e is acc.var for e in nodes(x_loads[0].index))
    assert any(e is acc.var for e in nodes(st.index))      # the column loop is innermost
    body = function_ir(optimized_ir(mod), k.name)
    assert re.search(r"fmul <\d+ x float>", body) and re.search(r"fadd <\d+ x float>", body)
    np.testing.assert_allclose(mod.run(x=x, w=w)[0], ort_run(m, {"x": x, "w": w})[0], rtol=RT, atol=AT)


def _pointwise_residual_model(x_shape, m):
    """(model, x, z): Relu(Conv1x1(x, W, b) + z), x [N, C, H, W] -> [N, m, H, W]."""
    from onnx import TensorProto, helper, numpy_helper
    x = _u(*x_shape)
    w = _u(m, x_shape[1], 1, 1, seed=1) * 0.3
    bias, z = _u(m, seed=2), _u(x_shape[0], m, *x_shape[2:], seed=3)
    N = helper.make_node
    g = helper.make_graph(
        [N("Conv", ["x", "w", "b"], ["c"]), N("Add", ["c", "z"], ["s"]), N("Relu", ["s"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in (("x", x), ("z", z))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], m, *x_shape[2:]])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model, x, z


@pytest.mark.parametrize("x_shape,m,packed,chunk", [
    ((1, 24, 7, 7), 44, True, None),     # 3 pixel tiles + a 1-pixel rest; channel blocks in groups (8 = 3+3+2)
    ((2, 16, 13, 13), 50, True, None),   # two images, a 9-pixel rest of 2 vectors
    ((1, 12, 40, 40), 30, True, None),   # many pixel tiles: one group of channel blocks each
    ((1, 32, 4, 4), 60, True, None),     # one pixel tile, 10 blocks for 8 groups: 5 groups of 2 (wrote past Y)
    ((1, 20, 2, 2), 12, False, None),    # fewer pixels than a vector: the lane-at-a-time tiles (too few
                                         # channels for the flat tiles, which take such planes otherwise)
    ((1, 1100, 3, 7), 30, False, None),  # C x one pixel tile above PACK_MAX_BYTES: X read in place
    # panels in chunks of input channels (knob panel_channels), partial sums carried between
    ((1, 1100, 3, 7), 30, True, 367),    # 3 chunks (367, 367, 366): the loop over the middle ones
    ((2, 40, 13, 13), 50, True, 20),     # 2 chunks, two images, a 9-pixel rest
    ((2, 48, 13, 13), 50, True, 16),     # 3 chunks of 16
    ((1, 32, 10, 16), 600, True, 16),    # 100 blocks over 10 tiles: two groups for their partial sums
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_pointwise_packed_pixel_tiles(x_shape, m, packed, chunk, threads):
    """1x1 convs (the pixel-vector GEMM) with a residual Add and Relu fused: with enough
    channel blocks each pixel tile of X is copied into a per-thread panel read by every block
    of its group, in chunks of ``chunk`` input channels where given (each chunk packed and run
    through every block, the partial sums carried on the stack, the epilogue after the last);
    every tail, chunk and group split matches onnxruntime at 1 and 2 threads. (Where X fits
    half of L2 the default runs unpacked blocks over every pixel tile instead, tested below;
    here ``pack_pixels`` is fixed to the case's value.)"""
    from tests.knob_util import Fixed
    model, x, z = _pointwise_residual_model(x_shape, m)
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    tgt = Target.parse(SCHEDULE_TARGET)
    graph = import_onnx(model)
    optimize(graph, 2, target=tgt)
    knobs = {"pack_pixels": packed} if chunk is None else {"pack_pixels": packed, "panel_channels": chunk}
    low = lower_graph(graph, tgt, tuning=Fixed(knobs))
    mod = build_module(low, graph, ["x", "z"], ["y"], tgt)
    mod.num_threads = threads
    (k,) = [k for k in mod.kernels if "pointwise" in k.comment]
    assert ("pixel tiles packed" in k.comment) == packed, k.comment
    if chunk is not None:
        chunks = -(-x_shape[1] // chunk)
        assert k.knobs["panel_channels"] == chunk
        assert f"{chunks} chunks of the {x_shape[1]} input channels" in k.comment, k.comment
        assert any(b.name.startswith("partial") for b in k.locals)
    assert any(b.name.startswith("xpanel") for b in k.locals) == packed
    np.testing.assert_allclose(mod.run(x=x, z=z)[0], ort_run(model, {"x": x, "z": z})[0], rtol=RT, atol=AT)


@pytest.mark.parametrize("x_shape,m", [
    ((1, 64, 14, 14), 96),     # 4 pixel tiles + a 1-vector rest, 16 blocks of 6 (AVX2 tiles)
    ((2, 16, 13, 13), 50),     # two images, a rest of 2 vectors, a partial last block
    ((1, 24, 9, 9), 144),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_pointwise_pixel_tiles_inner(x_shape, m, threads):
    """1x1 convs whose X fits half of L2 and that have 8+ channel blocks run unpacked, each
    task one channel block over every pixel tile (``tiles_inner_ok``), with a residual Add
    and Relu fused: the default where it applies, matching onnxruntime at 1 and 2 threads."""
    from tensorfuse.codegen.llvm.schedules.conv2d import tiles_inner_ok
    from tensorfuse.ir.target import Target
    model, x, z = _pointwise_residual_model(x_shape, m)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, num_threads=threads, cache=False)
    (k,) = [k for k in mod.kernels if "pointwise" in k.comment]
    hw = x_shape[2] * x_shape[3]
    R, NB = k.knobs["tile_oc"], k.knobs["tile_pixel_vectors"]
    assert tiles_inner_ok(Target.parse(SCHEDULE_TARGET), m, x_shape[1], hw, R, hw // (NB * 8), x_shape[0])
    assert k.knobs["pack_pixels"] is False and k.knobs["pixel_tiles_inner"] is True, k.knobs
    np.testing.assert_allclose(mod.run(x=x, z=z)[0], ort_run(model, {"x": x, "z": z})[0], rtol=RT, atol=AT)


@pytest.mark.parametrize("x_shape,m,k,attrs,chunks,in_place", [
    ((1, 256, 7, 7), 48, 3, {"pads": [1, 1, 1, 1]}, True, False),           # resnet's 7x7 stage, chunked C
    ((2, 64, 14, 14), 20, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, False, False),  # 20 = 2.5 vectors
    ((1, 40, 9, 9), 36, 3, {"pads": [2, 0, 1, 2], "dilations": [2, 2]}, False, False),
    ((1, 96, 6, 5), 19, 5, {"pads": [2, 2, 2, 2]}, True, False),           # windows mostly padding
    ((1, 32, 13, 13), 18, 1, {"strides": [2, 2]}, False, True),             # strided 1x1, 3 blocks: no pointwise panels
    ((1, 512, 9, 9), 16, 3, {}, True, True),                                # no padding, chunked
    ((1, 1024, 3, 3), 600, 3, {"pads": [1, 1, 1, 1]}, True, False),         # many blocks per task
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_flat_pixel_tiles(x_shape, m, k, attrs, chunks, in_place, threads):
    """Convs with small output planes in narrow rows (at most NARROW_ROW columns) tile the
    flattened pixels (emit_conv_flat), tiles crossing rows; with a residual Add and Relu fused.
    Input channels in chunks where all of them would exceed the L1 budget, copied into a
    zero-padded local plane unless no window reaches the padding; every tile, chunk, group of
    channel blocks and channel tail matches onnxruntime at 1 and 2 threads, and codegen
    produced vector FMAs for the kernel. (StridedPointwiseConvSubsample is disabled: the strided
    1x1 case tests the flat tiles reading a strided X in place.)"""
    import re

    from tests.codegen_util import function_ir, optimized_ir
    model, feeds = _conv_model(x_shape, m, k, attrs, scale=0.1)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, num_threads=threads, cache=False,
                             disabled_rules=["StridedPointwiseConvSubsample"])
    (kern,) = [kk for kk in mod.kernels if "flat pixel tiles" in kk.comment]
    nc = int(re.search(r"input channels in (\d+) chunks", kern.comment).group(1))
    assert (nc > 1) == chunks, kern.comment
    assert ("read in place" in kern.comment) == in_place, kern.comment
    assert any(b.name.startswith("xpad") for b in kern.locals) == (not in_place)
    body = function_ir(optimized_ir(mod), kern.name)
    assert re.search(r"(llvm\.fma|llvm\.fmuladd)\.v\d+f32|fmul <\d+ x float>", body)
    np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(model, feeds)[0], rtol=RT, atol=AT)


def test_flat_tile_choice_follows_the_target():
    """The flat tile takes its lanes and register budget from the target: 8 lanes and at most
    16 registers with AVX2, 16 lanes and 32 registers with AVX-512."""
    from tensorfuse.compiler.target import Target
    from tensorfuse.codegen.llvm.schedules.conv2d import FLAT_CHUNK_L1_SHARE, choose_flat_tile, flat_chunk
    for spec, lanes, regs in (("llvm -mcpu=znver3", 8, 16), ("llvm -mcpu=znver4", 16, 32)):
        t = Target.parse(spec)
        L, ob, p = choose_flat_tile(t, 512, 49)
        assert L == lanes and ob * p + ob + 1 <= regs and ob * p >= 8
        kc = flat_chunk(t, 512, ob * L, 9)
        assert 512 % kc == 0 and kc * ob * L * 9 * 4 <= FLAT_CHUNK_L1_SHARE * t.l1d_bytes


@pytest.mark.parametrize("xs,ws,attrs,msg", [
    ((1, 3, 5, 5), (4, 2, 3, 3), {}, "channels"),
    ((1, 4, 5, 5), (3, 2, 3, 3), {"group": 2}, "divisible"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"kernel_shape": [2, 2]}, "kernel_shape"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "exceeds"),
    ((1, 3, 5, 5), (4, 3, 3), {}, "rank"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"strides": [1, 1, 1]}, "strides"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1]}, "pads"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"auto_pad": "SAME"}, "auto_pad"),
])
def test_conv_errors(xs, ws, attrs, msg):
    with pytest.raises(ShapeError, match=msg):
        _ref("Conv", [_u(*xs), _u(*ws)], **attrs)


def test_conv_bias_shape_error():
    with pytest.raises(ShapeError, match="B must have shape"):
        _ref("Conv", [_u(1, 3, 5, 5), _u(4, 3, 3, 3), _u(3)])


def test_conv_dtype_error():
    with pytest.raises(ShapeError, match="dtype"):
        _ref("Conv", [_u(1, 3, 5, 5).astype(np.int32), _u(4, 3, 3, 3).astype(np.int32)])


# ----------------------------------------------------------------------------- ConvTranspose
CONVT_CASES = [
    # (x shape, w shape, attrs, with bias)
    ((1, 2, 4, 5), (2, 3, 3, 3), {}, True),
    ((2, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2]}, False),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}, True),
    ((1, 2, 4, 5), (2, 3, 3, 2), {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 0, 1]}, True),
    ((1, 2, 5, 4), (2, 2, 2, 3), {"strides": [1, 2], "dilations": [3, 2], "output_padding": [0, 1]}, True),
    ((1, 4, 4, 5), (4, 3, 3, 3), {"strides": [2, 2], "group": 2}, True),
    ((1, 4, 4, 4), (4, 1, 3, 3), {"strides": [2, 2], "group": 4, "pads": [1, 1, 1, 1]}, True),  # depthwise
    ((1, 3, 5, 5), (3, 2, 1, 1), {"strides": [2, 2]}, True),                                     # 1x1 with holes
    ((1, 2, 3, 3), (2, 2, 3, 3), {"pads": [2, 2, 2, 2]}, True),                                  # pads crop all
    ((1, 2, 4, 5), (2, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, False),             # GAN upsampler
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 10]}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 10], "auto_pad": "SAME_UPPER"}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, True),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 1], "auto_pad": "VALID", "output_padding": [1, 0]}, True),
    ((2, 2, 7), (2, 3, 3), {"strides": [3], "pads": [1, 2]}, True),                                # 1-D
    ((1, 2, 7), (2, 3, 4), {"strides": [2], "dilations": [2], "output_padding": [1]}, False),
    ((1, 1, 700), (1, 2, 3), {"strides": [2], "pads": [1, 0]}, True),                            # tiled rows
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}, True),  # 3-D
    ((1, 4, 2, 3, 2), (4, 1, 2, 2, 3), {"strides": [2, 2, 1], "group": 2, "dilations": [1, 2, 1]}, True),
]


@pytest.mark.parametrize("xs,ws,attrs,bias", CONVT_CASES, ids=[str(i) for i in range(len(CONVT_CASES))])
def test_conv_transpose(xs, ws, attrs, bias):
    x, w = _u(*xs), _u(*ws, seed=1)
    b = _u(ws[1] * attrs.get("group", 1), seed=2) if bias else None
    _check("ConvTranspose", [x, w, b], attrs)


@pytest.mark.parametrize("opset", [7, 11])
def test_conv_transpose_old_opsets(opset):
    x, w, b = _u(1, 4, 3, 4), _u(4, 2, 3, 3, seed=1), _u(4, seed=2)
    _check("ConvTranspose", [x, w, b], {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1]}, opset=opset)


def test_conv_transpose_constant_weights_and_f16():
    x, w, b = _u(1, 3, 4, 4), _u(3, 2, 3, 3, seed=1), _u(2, seed=2)
    _check("ConvTranspose", [x, w, b], {"strides": [2, 2]}, consts={"i1", "i2"})
    x, w = _u(1, 3, 4, 4, dtype=np.float16), _u(3, 2, 3, 3, seed=1, dtype=np.float16)
    _check("ConvTranspose", [x, w], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, rtol=2e-3, atol=2e-3)


def test_conv_transpose_reference_matches_ort():
    x, w, b = _u(2, 4, 3, 4), _u(4, 3, 3, 2, seed=1), _u(6, seed=2)
    attrs = {"group": 2, "strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 0], "dilations": [1, 2]}
    (got,), node = _ref("ConvTranspose", [x, w, b], **attrs)
    feeds = {"x": x, "w": w, "b": b}
    np.testing.assert_allclose(got, ort_run(node_model("ConvTranspose", feeds, attrs), feeds)[0], rtol=RT, atol=AT)
    assert get_op("ConvTranspose").flops(node) == 2 * x.size * 3 * 6 + got.size


@pytest.mark.parametrize("xs,ws,attrs,msg", [
    ((1, 3, 4, 4), (2, 2, 3, 3), {}, "first dim"),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"group": 2}, "divisible"),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"output_shape": [12, 12]}, "exceeds"),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"output_shape": [5]}, "output_shape"),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"output_shape": [1, 2, 5, 5]}, "output_shape"),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"output_padding": [1]}, "output_padding"),
    ((1, 2, 2, 2), (2, 2, 3, 3), {"pads": [2, 2, 2, 2]}, "empty"),
])
def test_conv_transpose_errors(xs, ws, attrs, msg):
    with pytest.raises(ShapeError, match=msg):
        _ref("ConvTranspose", [_u(*xs), _u(*ws)], **attrs)


# ----------------------------------------------------------------------------- ConvInteger / QLinearConv
def _q(*shape, dtype=np.uint8, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, size=shape).astype(dtype)


def _ort_supports(op, xs, attrs, opset=17):
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(xs)]
    inputs = {n: a for n, a in zip(names, xs) if a is not None}
    try:
        ort_run(node_model(op, inputs, attrs, opset=opset, input_names=names), inputs)
        return True
    except Exception:
        return False


CONVINT_CASES = [
    ((1, 3, 6, 7), (4, 3, 3, 3), {}),
    ((2, 4, 7, 7), (4, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ((1, 2, 9, 8), (3, 2, 2, 3), {"dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 11), (2, 3, 3), {"pads": [1, 2], "strides": [2]}),
    ((1, 2, 4, 5, 4), (2, 2, 2, 2, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVINT_CASES)
@pytest.mark.parametrize("xdt,wdt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_conv_integer(xs, ws, attrs, xdt, wdt):
    x, w = _q(*xs, dtype=xdt), _q(*ws, dtype=wdt, seed=1)
    xz, wz = np.array(7, xdt), np.array(-3 if wdt == np.int8 else 5, wdt)
    ins = [x, w, xz, wz]
    oracle = "ort" if _ort_supports("ConvInteger", ins, attrs) else "ref"
    _check("ConvInteger", ins, attrs, rtol=0, atol=0, oracle=oracle)


def test_conv_integer_optional_and_per_channel_zero_points():
    x, w = _q(1, 3, 6, 6), _q(4, 3, 3, 3, seed=1)
    _check("ConvInteger", [x, w], {"pads": [1, 1, 1, 1]}, rtol=0, atol=0)
    _check("ConvInteger", [x, w, np.array(9, np.uint8)], {}, rtol=0, atol=0)
    wz = np.array([1, 200, 3, 128], np.uint8)
    _check("ConvInteger", [x, w, np.array(9, np.uint8), wz], {}, rtol=0, atol=0, oracle="ref")


def test_conv_integer_reference_and_errors():
    x, w, xz, wz = _q(1, 3, 6, 6), _q(4, 3, 3, 3, seed=1), np.array(3, np.uint8), np.array(5, np.uint8)
    (got,), node = _ref("ConvInteger", [x, w, xz, wz], pads=[1, 1, 1, 1])
    feeds = {"x": x, "w": w, "xz": xz, "wz": wz}
    exp = ort_run(node_model("ConvInteger", feeds, {"pads": [1, 1, 1, 1]}), feeds)[0]
    np.testing.assert_array_equal(got, exp)
    assert got.dtype == np.int32
    with pytest.raises(ShapeError, match="u8 or i8"):
        _ref("ConvInteger", [_u(1, 3, 6, 6), w])
    with pytest.raises(ShapeError, match="x_zero_point"):
        _ref("ConvInteger", [x, w, np.array([1, 2], np.uint8)])


def _qlinear_inputs(xs, ws, xdt, wdt, ydt, per_channel=False, bias=True):
    m = ws[0]
    x, w = _q(*xs, dtype=xdt), _q(*ws, dtype=wdt, seed=1)
    ws_ = (np.linspace(0.01, 0.03, m).astype(np.float32) if per_channel else np.array(0.02, np.float32))
    wz = np.zeros(m, wdt) if per_channel else np.array(0 if wdt == np.int8 else 120, wdt)
    yz = np.array(10 if ydt == np.int8 else 128, ydt)
    b = np.random.default_rng(2).integers(-500, 500, m).astype(np.int32) if bias else None
    return [x, np.array(0.05, np.float32), np.array(3 if xdt == np.int8 else 130, xdt), w, ws_, wz,
            np.array(0.7, np.float32), yz, b]


@pytest.mark.parametrize("xdt,wdt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("xs,ws,attrs", [((1, 3, 6, 7), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
                                         ((1, 4, 7, 7), (4, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
                                         ((1, 3, 11), (2, 3, 3), {"pads": [1, 2]})])
def test_qlinear_conv(xs, ws, attrs, xdt, wdt):
    ins = _qlinear_inputs(xs, ws, xdt, wdt, xdt)
    # onnxruntime's u8 x s8 kernel on x86 saturates pairwise int16 sums (a documented MLAS
    # limitation), so onnx.reference is the oracle there. Rounding of the requantisation
    # multiplier may differ by one step.
    oracle = "ref" if (xdt, wdt) == (np.uint8, np.int8) else "ort"
    _check("QLinearConv", ins, attrs, rtol=0, atol=1, consts={"i1", "i2", "i3", "i4", "i5", "i6", "i7", "i8"},
           oracle=oracle)


def test_qlinear_conv_per_channel_no_bias():
    ins = _qlinear_inputs((1, 3, 6, 6), (4, 3, 3, 3), np.int8, np.int8, np.int8, per_channel=True, bias=False)
    _check("QLinearConv", ins, {"pads": [1, 1, 1, 1]}, rtol=0, atol=1)
    ins = _qlinear_inputs((1, 3, 6, 6), (4, 3, 3, 3), np.uint8, np.int8, np.uint8, per_channel=True, bias=False)
    _check("QLinearConv", ins, {"pads": [1, 1, 1, 1]}, rtol=0, atol=1, oracle="ref")


def test_qlinear_conv_reference_matches_ort():
    ins = _qlinear_inputs((1, 3, 6, 7), (4, 3, 3, 3), np.uint8, np.uint8, np.uint8)
    (got,), _ = _ref("QLinearConv", ins, pads=[1, 1, 1, 1])
    names = [f"i{k}" for k in range(9)]
    feeds = dict(zip(names, ins))
    exp = ort_run(node_model("QLinearConv", feeds, {"pads": [1, 1, 1, 1]}), feeds)[0]
    assert got.dtype == np.uint8
    assert np.abs(got.astype(int) - exp.astype(int)).max() <= 1


# ----------------------------------------------------------------------------- Winograd F(2x2, 3x3)
def _conv_model(x_shape, m, k, attrs, residual=True, bias=True, scale=0.2, seed=0):
    """Conv k x k (+ Add z) + Relu as an ONNX model, the output shape from onnxruntime;
    returns (model, feeds). ``attrs`` may hold ``group``."""
    from onnx import TensorProto, helper, numpy_helper
    x = _u(*x_shape, seed=seed)
    w = _u(m, x_shape[1] // attrs.get("group", 1), k, k, seed=seed + 1) * scale
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(_u(m, seed=seed + 2), "b"))
        ins.append("b")
    N = helper.make_node
    conv = N("Conv", ins, ["c"], kernel_shape=[k, k], **attrs)
    probe = helper.make_graph([conv], "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [None] * 4)], inits)
    out_shape = ort_run(helper.make_model(probe, opset_imports=[helper.make_opsetid("", 17)]), {"x": x})[0].shape
    feeds = {"x": x}
    nodes = [conv]
    if residual:
        feeds["z"] = _u(*out_shape, seed=seed + 3)
        nodes += [N("Add", ["c", "z"], ["s"]), N("Relu", ["s"], ["y"])]
    else:
        nodes += [N("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in feeds.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), feeds


@pytest.mark.parametrize("x_shape,m,attrs,residual,bias", [
    ((1, 64, 56, 56), 64, {"pads": [1, 1, 1, 1]}, True, True),      # resnet's first stage
    ((2, 16, 9, 13), 24, {"pads": [1, 1, 1, 1]}, False, True),       # odd H and W, N = 2, 3 vectors
    ((1, 17, 10, 12), 40, {"pads": [2, 2, 2, 2]}, True, False),      # 5 vectors, odd C, wide pads
    ((1, 32, 11, 11), 19, {}, False, True),                          # no padding, 19 = 2 vectors + 3
    ((1, 20, 12, 9), 16, {"pads": [0, 1, 2, 0]}, True, True),        # asymmetric pads
    ((1, 48, 13, 13), 192, {"auto_pad": "SAME_UPPER"}, False, True),  # squeezenet's 13x13 expand
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_winograd(x_shape, m, attrs, residual, bias, threads):
    """3x3 convolutions of stride 1 take Winograd F(2x2, 3x3) (emit_conv_winograd): odd output
    sizes (the last tile row and column half stored), every pad form, channel tails, the fused
    residual Add and Relu, at 1 and 2 threads; they match onnxruntime within the direct
    convolution's tolerances, and codegen produced vector FMAs."""
    import re

    from tests.codegen_util import function_ir, optimized_ir
    model, feeds = _conv_model(x_shape, m, 3, attrs, residual, bias)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, num_threads=threads, cache=False)
    (kern,) = [k for k in mod.kernels if "winograd" in k.comment]
    (u,) = [p for p in kern.params if "_wino" in p.name]
    assert u.shape[0] == 16 and u.shape[2] == x_shape[1] and u.shape[1] * u.shape[3] >= m
    body = function_ir(optimized_ir(mod), kern.name)
    assert re.search(r"(llvm\.fma|llvm\.fmuladd)\.v\d+f32", body)
    ref = ort_run(model, feeds)[0]
    np.testing.assert_allclose(mod.run(**feeds)[0], ref, rtol=RT, atol=AT * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("x_shape,m,attrs", [
    ((1, 32, 14, 14), 32, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),      # stride 2
    ((1, 32, 14, 14), 32, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),    # dilation 2
    ((1, 8, 14, 14), 32, {"pads": [1, 1, 1, 1]}),                          # too few input channels
    ((1, 64, 7, 7), 64, {"pads": [1, 1, 1, 1]}),                           # small plane: flat tiles
])
def test_conv_winograd_does_not_fire(x_shape, m, attrs):
    """Strided, dilated and few-channel 3x3 convolutions and small planes keep the direct
    schedules, and still match onnxruntime."""
    model, feeds = _conv_model(x_shape, m, 3, attrs, residual=False)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, cache=False)
    assert not [k for k in mod.kernels if "winograd" in k.comment]
    np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(model, feeds)[0], rtol=RT, atol=AT)


def test_winograd_transforms_compute_a_correlation():
    """The F(2x2, 3x3) matrices themselves, in float64 on random data: A^T [(G g G^T) .
    (B^T d B)] A equals the 2x2 valid correlation of the 4x4 patch d with the 3x3 filter g
    (Lavin & Gray 2016, eq. 8), and transform_weights lays U out as [16, MB, C, blk]."""
    from tensorfuse.codegen.llvm.schedules.conv2d_winograd import G, transform_weights
    rng = np.random.default_rng(0)
    BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)
    AT_ = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)
    d, g = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    y = AT_ @ ((G @ g @ G.T) * (BT @ d @ BT.T)) @ AT_.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    u = transform_weights(w, 4)
    assert u.shape == (16, 2, 3, 4) and u.dtype == np.float32
    for m_, c in ((0, 0), (4, 2)):
        full = G @ w[m_, c].astype(np.float64) @ G.T
        np.testing.assert_allclose(u[:, m_ // 4, c, m_ % 4], full.reshape(16), rtol=1e-6)
    assert not u[:, 1, :, 1:].any()          # output channels 5..7: zero padding


@pytest.mark.parametrize("x_shape,m,strides,pointwise", [
    ((1, 64, 56, 56), 128, [2, 2], True),     # resnet's first downsample: 49 whole pixel tiles
    ((2, 24, 15, 13), 44, [2, 2], True),      # odd sizes (8x7 out), two images, a rest of whole vectors
    ((1, 32, 12, 20), 40, [3, 2], True),      # unequal strides
    ((1, 16, 6, 6), 40, [2, 2], False),       # 9 output pixels: the rest would be the scalar tail
    ((1, 24, 14, 14), 8, [2, 2], False),      # too few channel blocks to pack the panels
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_pointwise_strided(x_shape, m, strides, pointwise, threads):
    """Strided 1x1 convs run as pointwise GEMMs whose packed panels gather the strided pixels
    (residual Add and Relu fused); where the panels are not packed they keep the blocked
    schedules. Every case matches onnxruntime at 1 and 2 threads. (At O2 the rule
    StridedPointwiseConvSubsample subsamples X first, tests/test_rules_conv_subsample.py;
    it is disabled here so the strided schedules are what runs.)"""
    from onnx import TensorProto, helper, numpy_helper
    x = _u(*x_shape)
    w = _u(m, x_shape[1], 1, 1, seed=1) * 0.3
    oh, ow = [(d - 1) // s + 1 for d, s in zip(x_shape[2:], strides)]
    bias, z = _u(m, seed=2), _u(x_shape[0], m, oh, ow, seed=3)
    N = helper.make_node
    g = helper.make_graph(
        [N("Conv", ["x", "w", "b"], ["c"], strides=strides), N("Add", ["c", "z"], ["s"]), N("Relu", ["s"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in (("x", x), ("z", z))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], m, oh, ow])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, num_threads=threads, cache=False,
                             disabled_rules=["StridedPointwiseConvSubsample"])
    gathered = [k for k in mod.kernels if "gather the strided pixels" in k.comment]
    assert bool(gathered) == pointwise, [k.comment for k in mod.kernels]
    if pointwise:
        assert "pixel tiles packed" in gathered[0].comment
    np.testing.assert_allclose(mod.run(x=x, z=z)[0], ort_run(model, {"x": x, "z": z})[0], rtol=RT, atol=AT)


@pytest.mark.parametrize("x_shape,m,k,attrs", [
    ((1, 3, 45, 45), 64, 3, {"strides": [2, 2]}),                              # squeezenet's first conv
    ((2, 3, 30, 33), 32, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),          # mobilenet's, odd sizes
    ((1, 5, 19, 23), 13, 3, {"pads": [0, 2, 1, 0]}),                            # asymmetric pads, 13 channels
    ((1, 2, 20, 40), 20, 5, {"pads": [2, 2, 2, 2], "dilations": [1, 2]}),       # 5x5, dilated columns
    ((1, 7, 12, 30), 9, 3, {"strides": [1, 3], "pads": [1, 1, 1, 1]}),          # unequal strides
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_im2row(x_shape, m, k, attrs, threads):
    """Convs over few input channels (C*KH*KW <= IM2ROW_MAX_K) run as a GEMM per output row
    over a panel of the row's windows (zeros in the padding), with a residual Add and Relu
    fused; every pad, stride, dilation and channel tail matches onnxruntime at 1 and 2 threads,
    and codegen produced vector FMAs."""
    import re

    from tests.codegen_util import function_ir, optimized_ir
    model, feeds = _conv_model(x_shape, m, k, attrs, scale=0.3)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, num_threads=threads, cache=False)
    (kern,) = [kk for kk in mod.kernels if "im2row" in kk.comment]
    assert any(b.name.startswith("panel") for b in kern.locals)
    body = function_ir(optimized_ir(mod), kern.name)
    assert re.search(r"(llvm\.fma|llvm\.fmuladd)\.v\d+f32", body)
    np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(model, feeds)[0], rtol=RT, atol=AT)


def _blocked_schedule(comment: str) -> str:
    """Which register-blocked conv schedule a kernel comment names ("" for none)."""
    for key, name in (("[pointwise:", "pointwise"), ("[flat pixel tiles", "flat"), ("[im2row:", "im2row"),
                      ("[winograd", "winograd"), ("[register tile", "rows")):
        if key in comment:
            return name
    return ""


@pytest.mark.parametrize("x_shape,m,k,attrs,schedule", [
    ((1, 96, 27, 27), 256, 5, {"pads": [2, 2, 2, 2], "group": 2}, "rows"),          # AlexNet's conv2
    ((1, 48, 20, 20), 96, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 3}, "rows"),
    ((1, 240, 14, 14), 60, 1, {"group": 3}, "pointwise"),                           # ShuffleNet's 1x1
    ((2, 24, 7, 9), 48, 1, {"group": 3}, "pointwise"),                              # two images, odd plane
    ((1, 64, 16, 16), 64, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}, "flat"),
    ((1, 12, 20, 20), 48, 3, {"pads": [1, 1, 1, 1], "group": 3}, "im2row"),
    ((1, 64, 24, 24), 96, 3, {"pads": [1, 1, 1, 1], "group": 2}, "winograd"),
])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_grouped_blocked(x_shape, m, k, attrs, schedule, residual, threads):
    """Grouped convolutions (1 < group < channels) run the blocked schedules once per group
    (ConvGroups: image n's group g as image n*G + g of the grouped view, weights packed per group
    and stacked): every schedule, with the residual Add and Relu fused (their operands indexed
    with Y's real channel), at 1 and 2 threads, matches onnxruntime; codegen produced vector FMAs."""
    import re

    from tests.codegen_util import function_ir, optimized_ir
    model, feeds = _conv_model(x_shape, m, k, attrs, residual=residual, scale=0.3)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, num_threads=threads, cache=False)
    (kern,) = [kk for kk in mod.kernels if f"{attrs['group']} groups of" in kk.comment]
    assert _blocked_schedule(kern.comment) == schedule, kern.comment
    (wp,) = [p for p in kern.params if "_wpack" in p.name or "_wino" in p.name]
    assert wp.shape[0] == attrs["group"]                     # one packed set per group
    body = function_ir(optimized_ir(mod), kern.name)
    assert re.search(r"(llvm\.fma|llvm\.fmuladd)\.v\d+f32", body)
    ref = ort_run(model, feeds)[0]
    np.testing.assert_allclose(mod.run(**feeds)[0], ref, rtol=RT, atol=AT * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("x_shape,m,attrs", [
    ((1, 64, 14, 14), 64, {"pads": [1, 1, 1, 1], "group": 32}),     # ResNeXt-like: 2 channels per group
    ((1, 32, 12, 12), 32, {"pads": [1, 1, 1, 1], "group": 32}),     # depthwise: its own schedule
])
def test_conv_grouped_blocked_does_not_fire(x_shape, m, attrs):
    """Groups of fewer output channels than a vector (a 3x3 kernel) keep the generic schedule,
    and depthwise convolutions theirs; both still match onnxruntime."""
    model, feeds = _conv_model(x_shape, m, 3, attrs)
    mod = tensorfuse.compile(model, target=SCHEDULE_TARGET, cache=False)
    assert not [k for k in mod.kernels if "groups of" in k.comment or _blocked_schedule(k.comment)]
    ref = ort_run(model, feeds)[0]
    np.testing.assert_allclose(mod.run(**feeds)[0], ref, rtol=RT, atol=AT * max(1.0, float(np.abs(ref).max())))


# ----------------------------------------------------------------------------- 1-D convolutions
def _conv1d_model(cin, cout, length, k, stride, pad, dil, group, epilogue):
    from onnx import helper
    from tests.fusion_util import graph_model
    w = rand(cout, cin // group, k, seed=1, low=-0.3, high=0.3)
    b = rand(cout, seed=2)
    feeds = {"x": rand(2, cin, length)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k], strides=[stride],
                              pads=[pad, pad], dilations=[dil], group=group)]
    out = "c"
    if epilogue:        # Whisper's front end: Conv then the erf GELU, plus a residual
        ol = (length + 2 * pad - dil * (k - 1) - 1) // stride + 1
        feeds["r"] = rand(2, cout, ol, seed=3)
        nodes += [helper.make_node("Div", ["c", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["c", "e1"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["g"]), helper.make_node("Add", ["g", "r"], ["y"])]
        out = "y"
    inits = {"w": w, "b": b, "s2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    return graph_model(nodes, feeds, [out], inits), feeds


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f"])
@pytest.mark.parametrize("cin,cout,length,k,stride,pad,dil,group,epilogue", [
    (48, 64, 61, 3, 2, 1, 1, 1, True),       # Whisper's conv2 form (stride 2) with its GELU
    # conv1 form: few input channels (its GELU epilogue on 16-lane tiles takes LLVM seconds: heavy)
    pytest.param(20, 64, 50, 3, 1, 1, 1, 1, True, marks=pytest.mark.heavy),
    (16, 32, 37, 5, 1, 4, 2, 1, False),      # dilated, wide pads
    (32, 32, 45, 3, 1, 1, 1, 32, False),     # depthwise (wav2vec-style positional conv groups)
    (24, 48, 40, 3, 2, 1, 1, 4, False),      # grouped, strided (no 2-D schedule has it: generic)
    (8, 24, 33, 1, 1, 0, 1, 1, False),       # pointwise
])
def test_conv1d_runs_the_2d_schedules(target, cin, cout, length, k, stride, pad, dil, group, epilogue):
    """A float 1-D Conv ([N, C, L]) lowers through the 2-D schedules as a height-1 convolution
    (views of X, W and Y in their own slots; the fused epilogue indexed by Y's 3-D index), not the
    generic row loop: onnxruntime's numbers at O0 and O2, on 16- and 8-lane vectors."""
    model, feeds = _conv1d_model(cin, cout, length, k, stride, pad, dil, group, epilogue)
    exp = ort_run(model, feeds)
    for lvl in (0, 2):
        mod = tensorfuse.compile(model, target=target, opt_level=lvl)
        got = mod.run(**feeds)
        np.testing.assert_allclose(got[0], exp[0], rtol=1e-4, atol=1e-4, err_msg=f"O{lvl}")
        if group == 1 or group == cin:      # the conv's kernel: a 2-D schedule
            assert [kn.schedule for kn in mod.kernels if kn.schedule != "generic"], \
                [(kn.name, kn.schedule) for kn in mod.kernels]
