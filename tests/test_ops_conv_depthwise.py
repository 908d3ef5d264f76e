"""The depthwise convolution schedule (codegen/llvm/schedules/conv2d_depthwise.py: Conv with
group == C == M, 2-D, f32, constant W; ONNX spec section "Conv") against onnxruntime
(optimisations off): kernel shapes, strides, pads, dilations, widths around the target's
vector width, channel counts, batches, bias, the fused epilogues mobilenet uses (Relu,
Clip(0, 6)) and a residual Add, at 1 and 2 threads; each checks that the depthwise kernel
ran (its comment's marker)."""
import numpy as np
import pytest
from onnx import helper

import tensorfuse
from tensorfuse.compiler.target import Target
from tensorfuse.ir.types import DType
from tests.fusion_util import graph_model
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5
MARK = "[depthwise:"
L = Target.parse("llvm").lanes(DType.f32)


def _u(*shape, seed=0):
    return rand(*shape, seed=seed, low=-1, high=1)


def _depthwise_kernels(mod) -> list[str]:
    return [k.comment for k in mod.kernels if MARK in k.comment]


def _check(model, feeds, threads=1, opt_levels=(0, 2)):
    """Compare with onnxruntime at each opt level; assert the depthwise schedule was used."""
    for lvl in opt_levels:
        assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(lvl,), num_threads=threads)
        mod = tensorfuse.compile(model, opt_level=lvl, num_threads=threads)
        assert len(_depthwise_kernels(mod)) == 1, [k.comment for k in mod.kernels]
    return _depthwise_kernels(mod)[0]


def _conv_model(xs, k, attrs, bias=True, seed=0):
    n, c = xs[:2]
    x, w = _u(*xs, seed=seed), _u(c, 1, *k, seed=seed + 1)
    inits = {"w": w}
    if bias:
        inits["b"] = _u(c, seed=seed + 2)
    m = node_model("Conv", {"x": x}, {"group": c, **attrs}, initializers=inits)
    return m, {"x": x}


# (x shape, kernel, attributes, bias, threads)
CASES = [
    # 3x3 as mobilenet: stride 1 and 2, pad 1, widths 7 ... 112
    ((1, 8, 14, 14), (3, 3), {"pads": [1, 1, 1, 1]}, True, 1),
    ((2, 13, 17, 17), (3, 3), {"pads": [1, 1, 1, 1]}, True, 2),
    ((1, 32, 56, 56), (3, 3), {"pads": [1, 1, 1, 1]}, False, 1),
    ((1, 8, 112, 112), (3, 3), {"pads": [1, 1, 1, 1]}, True, 2),
    ((1, 13, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}, True, 1),
    ((1, 129, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}, True, 2),       # channels per task, 129 % 2
    ((2, 96, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}, False, 1),
    ((1, 8, 112, 112), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True, 1),
    ((1, 32, 56, 56), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True, 2),
    ((2, 8, 14, 14), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, False, 1),
    ((1, 13, 17, 17), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True, 2),   # odd width
    ((1, 8, 7, 7), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True, 1),
    # 5x5 and 3x5, pads 0 / 2, asymmetric
    ((1, 8, 17, 17), (5, 5), {"pads": [2, 2, 2, 2]}, True, 1),
    ((2, 8, 56, 56), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}, True, 2),
    ((1, 13, 14, 14), (3, 5), {"pads": [1, 2, 1, 2]}, False, 1),
    ((1, 8, 17, 17), (3, 5), {"pads": [0, 2, 1, 1], "strides": [2, 2]}, True, 2),
    ((1, 8, 14, 14), (3, 3), {}, True, 1),                                            # pads 0
    ((1, 8, 17, 17), (5, 5), {"strides": [2, 2]}, False, 2),
    ((1, 8, 56, 56), (3, 3), {"pads": [0, 1, 2, 0]}, True, 1),
    ((1, 8, 14, 14), (5, 5), {"pads": [2, 0, 0, 2], "strides": [2, 2]}, True, 1),
    # dilation 2
    ((1, 8, 17, 17), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, True, 2),
    ((1, 8, 56, 56), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2], "strides": [2, 2]}, True, 1),
    ((1, 13, 14, 14), (3, 5), {"pads": [2, 1, 0, 3], "dilations": [2, 1]}, False, 1),
    ((1, 8, 112, 112), (3, 3), {"pads": [1, 2, 1, 2], "dilations": [1, 2]}, True, 2),
    # one channel (group 1), few channels (bands of rows), batch 2
    ((1, 1, 56, 56), (3, 3), {"pads": [1, 1, 1, 1]}, True, 1),
    ((2, 1, 112, 112), (3, 3), {"pads": [1, 1, 1, 1]}, True, 2),
    ((1, 1, 112, 112), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, False, 2),
    ((2, 1, 14, 14), (5, 5), {"pads": [2, 2, 2, 2]}, True, 1),
    # mixed strides, stride 3, kernel wider than the input, SAME padding
    ((1, 8, 17, 17), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}, True, 1),
    ((1, 8, 17, 17), (3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}, True, 1),
    ((1, 8, 17, 17), (3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}, True, 1),
    ((1, 8, 3, 4), (5, 5), {"pads": [3, 3, 3, 3]}, True, 1),                          # rows of padding
    ((1, 8, 3, 4), (5, 5), {"pads": [2, 2, 3, 3], "strides": [2, 2]}, True, 1),
    ((1, 8, 14, 17), (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, True, 2),
    # 7x7 pad 3 as ConvNeXt (the kernel rows in a loop by default): contiguous rows, padded
    # rows, bands of rows (few channels), stride 2, rows of padding
    ((1, 4, 40, 40), (7, 7), {"pads": [3, 3, 3, 3]}, True, 2),
    ((1, 16, 7, 7), (7, 7), {"pads": [3, 3, 3, 3]}, False, 2),
    ((1, 2, 28, 28), (7, 7), {"pads": [3, 3, 3, 3]}, True, 2),
    ((1, 8, 29, 29), (7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, True, 1),
    ((1, 8, 3, 5), (7, 7), {"pads": [4, 3, 4, 3]}, True, 1),
]


@pytest.mark.parametrize("xs,k,attrs,bias,threads", CASES, ids=[str(i) for i in range(len(CASES))])
def test_depthwise_conv(xs, k, attrs, bias, threads):
    m, feeds = _conv_model(xs, k, attrs, bias)
    _check(m, feeds, threads)


def test_depthwise_schedules_by_width_and_stride():
    """The row schedule (fewer channels than L, the target's f32 lanes, so channels as lanes
    does not apply): stride 1 reads the input rows of a 3x3 kernel in place above 2*L columns
    and copies them into padded rows at or below, and those of kernels at least PADDED_MIN_KW
    wide (ConvNeXt's 7x7) into padded rows at any width; stride 2 de-interleaves the input.
    With C >= L, strided, wide-kernel and small-plane convs take channels as lanes; a 3x3 over
    a plane whose transposed copy exceeds the L1 cache keeps the rows."""
    from tensorfuse.codegen.llvm.schedules.conv2d_depthwise import PADDED_MIN_KW
    wide = 2 * L + 9
    c = L - 1
    lanes = "channels as lanes"
    big = 4 * L + 8                     # (big + 2)^2 * L * 4 bytes > 48 KiB for L = 8 and 16
    cases = [((1, c, 2 * L + 1, 2 * L + 1), 3, {}, "contiguous rows"),
             ((1, c, 2 * L, 2 * L), 3, {}, "zero-padded rows"),
             ((1, c, 2 * L, 2 * L), 3, {"strides": [2, 2]}, "de-interleaved input (stride 2)"),
             ((1, c, wide, wide), PADDED_MIN_KW, {}, "zero-padded rows"),
             ((1, c, wide, wide), 7, {}, "zero-padded rows"),
             ((1, c, wide, wide), 7, {"strides": [2, 2]}, "de-interleaved input (stride 2)"),
             ((1, L, 7, 7), 3, {}, lanes),
             ((1, L, 24, 24), 3, {"strides": [2, 2]}, lanes),               # a plane within 2 L1 caches
             ((1, 2 * L, 14, 14), PADDED_MIN_KW, {}, lanes),
             ((1, L, big, big), 3, {}, "contiguous rows")]
    for xs, k, attrs, what in cases:
        m, feeds = _conv_model(xs, (k, k), {"pads": [k // 2] * 4, **attrs})
        assert what in _check(m, feeds, opt_levels=(2,)), (xs, k, attrs)


def test_depthwise_kernel_is_vectorised_and_parallel():
    """What codegen produced: the kernel is split across the thread team and its FMAs are
    vectors of the target's lanes."""
    from tests.codegen_util import calls_fmuladd, function_ir, optimized_ir, parallel_kernels
    m, feeds = _conv_model((1, 32, 56, 56), (3, 3), {"pads": [1, 1, 1, 1]})
    mod = tensorfuse.compile(m, opt_level=2, num_threads=2)
    (k,) = [k for k in mod.kernels if MARK in k.comment]
    assert k.name in parallel_kernels(mod)
    assert calls_fmuladd(function_ir(optimized_ir(mod), k.name), L)


def test_depthwise_not_used_elsewhere():
    """Channel multiplier 2 (M = 2C), a weight that is a graph input, and f16 keep the
    generic row schedule."""
    x = _u(1, 4, 9, 9)
    cases = [node_model("Conv", {"x": x}, {"group": 4, "pads": [1, 1, 1, 1]},
                        initializers={"w": _u(8, 1, 3, 3, seed=1)}),
             node_model("Conv", {"x": x, "w": _u(4, 1, 3, 3, seed=1)}, {"group": 4, "pads": [1, 1, 1, 1]})]
    for m in cases:
        feeds = {i.name: (x if i.name == "x" else _u(4, 1, 3, 3, seed=1)) for i in m.graph.input}
        assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))
        assert not _depthwise_kernels(tensorfuse.compile(m, opt_level=2))
    xh = x.astype(np.float16)
    m = node_model("Conv", {"x": xh}, {"group": 4, "pads": [1, 1, 1, 1]},
                   initializers={"w": _u(4, 1, 3, 3, seed=1).astype(np.float16)})
    assert not _depthwise_kernels(tensorfuse.compile(m, opt_level=2))


# ----------------------------------------------------------------------------- fused epilogues
def _fused_model(xs, attrs, epilogue, residual_shape=None):
    """Conv(group=C) then the epilogue: "Relu", "Clip6" (Clip(0, 6), mobilenet's ReLU6) or
    "AddRelu" (Add of a residual graph input of ``residual_shape``, then Relu)."""
    n, c = xs[:2]
    x = _u(*xs)
    inits = {"w": _u(c, 1, 3, 3, seed=1), "b": _u(c, seed=2)}
    feeds = {"x": x}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, **attrs)]
    if epilogue == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif epilogue == "Clip6":
        inits.update(lo=np.float32(0), hi=np.float32(6))
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    else:
        feeds["z"] = _u(*residual_shape, seed=3)
        nodes += [helper.make_node("Add", ["c", "z"], ["cz"]), helper.make_node("Relu", ["cz"], ["y"])]
    return graph_model(nodes, feeds, ["y"], inits, opset=17), feeds


FUSED = [
    ((1, 16, 14, 14), {"pads": [1, 1, 1, 1]}, "Clip6", None),
    ((1, 16, 56, 56), {"pads": [1, 1, 1, 1]}, "Clip6", None),
    ((1, 16, 56, 56), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "Clip6", None),
    ((2, 8, 17, 17), {"pads": [1, 1, 1, 1]}, "Relu", None),
    ((1, 8, 28, 28), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "Relu", None),
    ((1, 16, 56, 56), {"pads": [1, 1, 1, 1]}, "AddRelu", (1, 16, 56, 56)),
    ((2, 8, 14, 14), {"pads": [1, 1, 1, 1]}, "AddRelu", (2, 8, 14, 14)),
    ((1, 8, 28, 28), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "AddRelu", (1, 8, 14, 14)),
    ((1, 8, 17, 17), {"pads": [1, 1, 1, 1]}, "AddRelu", (8, 1, 1)),                 # per channel
    ((1, 8, 17, 17), {"pads": [1, 1, 1, 1]}, "AddRelu", (1, 1, 17)),                # along columns
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,attrs,epilogue,zs", FUSED, ids=[str(i) for i in range(len(FUSED))])
def test_depthwise_fused_epilogue(xs, attrs, epilogue, zs, threads):
    """At opt level 2 the epilogue fuses into the conv kernel (one kernel, the depthwise one)."""
    m, feeds = _fused_model(xs, attrs, epilogue, zs)
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,), num_threads=threads)
    mod = tensorfuse.compile(m, opt_level=2, num_threads=threads)
    assert len(mod.kernels) == 1 and MARK in mod.kernels[0].comment, [k.comment for k in mod.kernels]


# ------------------------------------------------------------- channels as lanes (small planes)
LANES = [
    # (x shape, kernel, attributes, bias: "const" | "input" | None, threads)
    ((1, L, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}, "const", 1),
    ((1, L + 3, 7, 7), (5, 5), {"pads": [2, 2, 2, 2]}, "const", 2),                # last block overlaps
    ((2, 2 * L, 9, 11), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, None, 2),
    ((1, 3 * L, 14, 14), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}, "const", 1),
    ((1, L, 13, 10), (3, 5), {"pads": [0, 2, 1, 1], "strides": [2, 1]}, "input", 1),  # asymmetric
    ((1, L, 12, 12), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, "const", 2),
    ((1, L, 3, 4), (5, 5), {"pads": [3, 3, 3, 3]}, "const", 1),                     # rows of padding
    ((1, L + 1, 17, 17), (3, 3), {"strides": [3, 3]}, "const", 1),                  # no padding, stride 3
    ((1, L, 7, 7), (7, 7), {"pads": [3, 3, 3, 3]}, None, 1),
    ((1, L, 20, 23), (3, 3), {"pads": [1, 1, 1, 1]}, "const", 2),                   # tiles overlap at the row end
    # pads past every window: stride 4 over 1 row after 2 rows of padding reads no input row
    ((1, L, 1, 5), (1, 1), {"pads": [2, 2, 0, 0], "strides": [4, 4]}, "const", 1),
    ((1, L, 5, 1), (1, 3), {"pads": [0, 3, 0, 0], "strides": [2, 4]}, "const", 1),
]


def _lanes_module(model, feeds, threads, knobs=None):
    """``model`` lowered for the host with the channels-as-lanes schedule (and ``knobs``)."""
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tests.knob_util import Fixed
    graph = import_onnx(model)
    low = lower_graph(graph, Target.parse("llvm"), tuning=Fixed({"schedule": "conv2d_depthwise_lanes", **(knobs or {})}))
    assert [w.schedule for w in low.workloads.values()] == ["llvm.conv2d_depthwise_lanes"]
    mod = build_module(low, graph, list(feeds), [o.name for o in model.graph.output], "llvm")
    mod.num_threads = threads
    return mod


@pytest.mark.parametrize("xs,k,attrs,bias,threads", LANES, ids=[str(i) for i in range(len(LANES))])
def test_depthwise_channels_as_lanes(xs, k, attrs, bias, threads):
    """The channels-as-lanes schedule, chosen by its knob, against onnxruntime: channel counts
    L does not divide, strides 1-3, asymmetric pads, dilation, rows of pure padding, a bias that
    is a graph input, batch 2, 2 threads; two tile widths each."""
    m, feeds = _conv_model(xs, k, attrs, bias is not None)
    if bias == "input":
        b = _u(xs[1], seed=2)
        m = node_model("Conv", {"x": feeds["x"], "b": b}, {"group": xs[1], **attrs},
                       initializers={"w": _u(xs[1], 1, *k, seed=1)}, input_names=["x", "w", "b"])
        feeds = {"x": feeds["x"], "b": b}
    want = ort_run(m, feeds)[0]
    for knobs in ({}, {"tile_pixels": 3}):
        got = _lanes_module(m, feeds, threads, knobs).run(**feeds)[0]
        np.testing.assert_allclose(got, want, rtol=RT, atol=AT, err_msg=str(knobs))


@pytest.mark.parametrize("epilogue,zs", [("Clip6", None), ("AddRelu", (1, 2 * L, 7, 7)), ("AddRelu", (2 * L, 1, 1)),
                                         ("AddRelu", (1, 1, 7))])
def test_depthwise_channels_as_lanes_epilogue(epilogue, zs):
    """The fused epilogue over channel vectors: ReLU6, a residual of the output's shape, per
    channel and along columns (the operand loads strided by the channel dim, or broadcast)."""
    m, feeds = _fused_model((1, 2 * L, 7, 7), {"pads": [1, 1, 1, 1]}, epilogue, zs)
    want = ort_run(m, feeds)[0]
    mod = tensorfuse.compile(m, opt_level=2)
    assert len(mod.kernels) == 1 and "channels as lanes" in mod.kernels[0].comment, [k.comment for k in mod.kernels]
    np.testing.assert_allclose(mod.run(**feeds)[0], want, rtol=RT, atol=AT)


def test_depthwise_silu_evaluates_the_conv_once():
    """x * sigmoid(x) after a depthwise conv reads the conv's value twice; the schedule passes
    the epilogue a load of a local, so the kernel IR holds one FMA chain per output vector
    (9 taps x 7 pixels of one row tile), not one per use of the value (LLVM merged the copies,
    but the kernel that had them ran 1.6x slower: 0.114 against 0.071 ms, 1152x7x7 5x5 + SiLU)."""
    c = 2 * L
    x = _u(1, c, 7, 7)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    m = graph_model(nodes, {"x": x}, ["y"], {"w": _u(c, 1, 3, 3, seed=1), "b": _u(c, seed=2)}, opset=17)
    want = ort_run(m, {"x": x})[0]
    mod = tensorfuse.compile(m, opt_level=2)
    (k,) = mod.kernels
    assert "channels as lanes" in k.comment and "7 pixels per tile" in k.comment, k.comment
    np.testing.assert_allclose(mod.run(x=x)[0], want, rtol=RT, atol=AT)
    assert str(k).count("fma(") == 9 * 7, str(k)


@pytest.mark.parametrize("act,what", [("SiLU", "zero-padded rows"), ("Tanh", "zero-padded rows"),
                                      ("Relu", "contiguous rows")])
def test_depthwise_costly_activation_pads_rows(act, what):
    """Rows wider than 2*L read in place compute their border columns one lane at a time; with
    an activation that evaluates an exp or tanh per element (SiLU, Tanh) the stride-1 row
    schedule copies the rows into zero-padded local rows instead, so every column, and its
    activation, is a vector (COSTLY_ACTIVATIONS); a Relu keeps the rows in place. Fewer
    channels than L keep the row schedule; values against onnxruntime."""
    c, wd = L - 1, 2 * L + 9
    x = _u(1, c, 9, wd)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=[1, 1, 1, 1])]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    m = graph_model(nodes, {"x": x}, ["y"], {"w": _u(c, 1, 3, 3, seed=1), "b": _u(c, seed=2)}, opset=17)
    mod = tensorfuse.compile(m, opt_level=2)
    (k,) = mod.kernels
    assert MARK in k.comment and what in k.comment, k.comment
    np.testing.assert_allclose(mod.run(x=x)[0], ort_run(m, {"x": x})[0], rtol=RT, atol=AT)
