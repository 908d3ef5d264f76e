"""The cuda hand schedules (codegen/cuda/schedules/) under numba's CUDA simulator, against
onnxruntime (ORT_DISABLE_ALL): the implicit-GEMM ConvNHWC / FusedConvNHWC tile schedule, the
depthwise ConvNHWC schedule, and the block reductions (Reduce*, global pools).

Each test checks the values and that the hand schedule was taken (the kernel's launch shape and
shared buffers). Models go through the cuda pipeline (layout pass to NHWC at O1 and above,
BatchNorm folding and FusedConv at O2). Shapes are small but cover several blocks (the test
library caps grids at ``cuda_util.MAX_BLOCKS``, so block-stride loops run too), partial tiles,
padding, strides, dilations and groups.
"""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuda_util as cu
from oracle import node_model, ort_run, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def lower_nhwc(model, opt_level: int = 1):
    """The cuda LoweredGraph of ``model`` after the cuda pipeline (layout pass included: O1
    by default)."""
    return cu.lower_cuda(model, opt_level)


def kernels_named(lg, word: str):
    return [k for k in lg.kernels if word in k.name.lower()]


def shared_sizes(k) -> list[int]:
    return sorted(b.numel for b in k.locals if b.scope == "shared")


def register_tiled(k) -> bool:
    """Whether kernel ``k`` is the register-tiled GEMM (``codegen/cuda/schedules/gemm.py``):
    a launch shape, shared A, B and output tiles."""
    return k.launch is not None and "registers per thread" in k.comment and len(shared_sizes(k)) == 3


def run_check(model, feeds: dict, lg, rtol=1e-4, atol=1e-4):
    got = cu.run_lowered(lg, list(feeds.values()))
    exp = ort_run(model, feeds)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


def model(nodes, inputs: dict, outputs: dict, inits: dict, opset: int = 17):
    return cu.float_model(nodes, inputs, outputs, inits, opset)


# ----------------------------------------------------------------------------- tiled conv
@pytest.mark.parametrize("kw", [
    # P = 30 pixels, 18 channels, K = 36: partial tiles in rows, columns and K
    dict(x=(1, 4, 5, 6), w=(18, 4, 3, 3), attrs={"pads": [1, 1, 1, 1]}),
    # batch 2, stride 2, dilation 2, asymmetric pads: P = 32, K = 27
    dict(x=(2, 3, 9, 9), w=(16, 3, 3, 3), attrs={"strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 1, 2]}),
    # 2 groups of 16 output channels, K = 18 per group
    dict(x=(1, 4, 4, 4), w=(32, 2, 3, 3), attrs={"group": 2, "pads": [1, 1, 1, 1]}),
    # 1x1, no padding (no bounds test in the gather), no bias
    dict(x=(1, 17, 4, 5), w=(20, 17, 1, 1), attrs={}, bias=False),
], ids=["3x3_pad", "stride_dilation", "grouped", "1x1"])
def test_conv_tiled(kw):
    x = rand(*kw["x"])
    w = rand(*kw["w"], seed=1)
    inits = {"w": w}
    if kw.get("bias", True):
        inits["b"] = rand(kw["w"][0], seed=2)
    m = node_model("Conv", {"x": x}, kw["attrs"], initializers=inits)
    lg = lower_nhwc(m)
    (k,) = kernels_named(lg, "conv")
    assert register_tiled(k), k.launch
    run_check(m, {"x": x}, lg)


def test_conv_tiled_f16_accumulates_in_f32():
    x = rand(1, 4, 4, 5, dtype=np.float16)
    w = rand(16, 4, 3, 3, seed=1, dtype=np.float16)
    m = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": w})
    lg = lower_nhwc(m)
    (k,) = kernels_named(lg, "conv")
    assert register_tiled(k)
    assert {b.dtype.value for b in k.locals if b.scope == "shared"} == {"f32"}
    got = cu.run_lowered(lg, [x])[0]
    m32 = node_model("Conv", {"x": x.astype(np.float32)}, {"pads": [1, 1, 1, 1]},
                     initializers={"w": w.astype(np.float32)})
    exp = ort_run(m32, {"x": x.astype(np.float32)})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), exp, rtol=2e-3, atol=2e-3)


def _conv_bn_relu(x, cout, groups=1, residual=False, relu6=False):
    c = x.shape[1]
    w = rand(cout, c // groups, 3, 3, seed=1)
    inits = {"w": w, "b": rand(cout, seed=2), "s": rand(cout, seed=3, low=0.5, high=1.5),
             "bb": rand(cout, seed=4), "mu": rand(cout, seed=5), "var": rand(cout, seed=6, low=0.5, high=2.0)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=groups),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], epsilon=1e-5)]
    last = "n"
    ins = {"x": x}
    if residual:
        ins["r"] = rand(x.shape[0], cout, x.shape[2], x.shape[3], seed=7)
        nodes.append(helper.make_node("Add", ["n", "r"], ["a"]))
        last = "a"
    if relu6:
        inits["lo"], inits["hi"] = np.array(0, np.float32), np.array(6, np.float32)
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    return model(nodes, ins, {"y": (x.shape[0], cout, x.shape[2], x.shape[3])}, inits), ins


@pytest.mark.parametrize("residual", [False, True], ids=["bn_relu", "bn_add_relu"])
def test_fused_conv_tiled_epilogue(residual):
    """Conv + BatchNormalization (folded) + (residual Add) + ReLU at O2: one FusedConvNHWC
    kernel on the tile schedule, the epilogue applied before its store."""
    x = rand(1, 5, 4, 5)
    m, ins = _conv_bn_relu(x, 17, residual=residual)
    lg = lower_nhwc(m, 2)
    convs = kernels_named(lg, "conv")
    assert len(convs) == 1 and register_tiled(convs[0]), \
        [k.name for k in lg.kernels]
    run_check(m, ins, lg)


def test_conv_tiled_silu_epilogue():
    """Conv then x * Sigmoid(x) at O2: one FusedConvNHWC (activation SiLU) on the tile
    schedule, the activation reading the accumulator twice before the store."""
    x = rand(1, 3, 5, 6)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    m = model(nodes, {"x": x}, {"y": (1, 16, 5, 6)}, {"w": rand(16, 3, 3, 3, seed=1), "b": rand(16, seed=2)})
    lg = lower_nhwc(m, 2)
    tiled = [k for k in lg.kernels if register_tiled(k)]
    assert len(tiled) == 1 and tiled[0].name.startswith("fusedconvnhwc") and len(lg.kernels) == 3, \
        [(k.name, k.launch) for k in lg.kernels]
    run_check(m, {"x": x}, lg, rtol=1e-4, atol=1e-5)


def test_conv_small_keeps_generic_schedule():
    """A conv with fewer than 16 output channels keeps one thread per output (no launch shape
    from the lowering, no shared memory)."""
    x = rand(1, 3, 5, 5)
    m = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": rand(4, 3, 3, 3, seed=1)})
    lg = lower_nhwc(m)
    (k,) = kernels_named(lg, "conv")
    assert k.launch is None and shared_sizes(k) == []
    run_check(m, {"x": x}, lg)


# ----------------------------------------------------------------------------- depthwise conv
@pytest.mark.parametrize("kw", [
    # 40 channels: a full and a partial 32-channel tile; stride 2: 9 pixels, 8 per block
    dict(x=(1, 40, 5, 5), attrs={"pads": [1, 1, 1, 1], "strides": [2, 2]}, k=3, pixels=9),
    # batch 2, dilation 2, asymmetric pads, no bias: 72 pixels, 32 per block
    dict(x=(2, 8, 7, 7), attrs={"pads": [2, 1, 1, 2], "dilations": [2, 2]}, k=3, bias=False, pixels=72),
], ids=["partial_channel_tile", "dilated"])
def test_conv_depthwise(kw):
    x = rand(*kw["x"])
    c, k = kw["x"][1], kw["k"]
    inits = {"w": rand(c, 1, k, k, seed=1)}
    if kw.get("bias", True):
        inits["b"] = rand(c, seed=2)
    m = node_model("Conv", {"x": x}, {**kw["attrs"], "group": c}, initializers=inits)
    lg = lower_nhwc(m)
    (kern,) = kernels_named(lg, "conv")
    ct = min(32, c)
    assert kern.launch is not None and kern.launch.block[0] == ct * min(256 // ct, kw["pixels"])
    assert shared_sizes(kern) == [k * k * ct]
    run_check(m, {"x": x}, lg)


def test_fused_depthwise_bn_relu6():
    """Depthwise Conv + BatchNormalization + Clip(0, 6) (MobileNet's block) at O2: one fused
    depthwise kernel with the shared-memory weight tile."""
    x = rand(1, 24, 4, 4)
    m, ins = _conv_bn_relu(x, 24, groups=24, relu6=True)
    lg = lower_nhwc(m, 2)
    convs = kernels_named(lg, "conv")
    assert len(convs) == 1 and convs[0].launch.block == (24 * 10,) and shared_sizes(convs[0]) == [9 * 24], \
        [(k.name, k.launch) for k in lg.kernels]
    run_check(m, ins, lg)


# ----------------------------------------------------------------------------- reductions
def _reduce_model(op, x, axes, keepdims=1, **attrs):
    return node_model(op, {"x": x}, {"keepdims": keepdims, **attrs}, opset=18,
                      initializers={"axes": np.array(axes, np.int64)})


@pytest.mark.parametrize("op,shape,axes,keepdims,block", [
    ("ReduceMean", (3, 70), [-1], 1, 128),            # contiguous rows, partial last stride
    ("ReduceSum", (4, 3, 20), [0, 2], 0, 128),        # non-consecutive axes: unravelled
    ("ReduceSum", (2, 65, 3), [1], 1, 128),           # strided elements (inner 3), few outputs
    ("ReduceLogSumExp", (2, 64), [1], 0, 64),         # two passes: max then shifted sum
    ("ReduceL2", (2, 4, 16), [1, 2], 1, 64),
    ("ReduceMin", (3, 80), [1], 1, 128),
], ids=["mean_rows", "sum_axes_0_2", "sum_strided", "logsumexp", "l2", "min"])
def test_reduce_block_schedule(op, shape, axes, keepdims, block):
    x = rand(*shape)
    m = _reduce_model(op, x, axes, keepdims)
    lg = cu.lower_cuda(m)
    (k,) = lg.kernels
    assert k.launch is not None and k.launch.block == (block,) and shared_sizes(k) == [block]
    got = cu.run_lowered(lg, [x])[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_reduce_block_integer_and_f16():
    xi = rand(3, 100, dtype=np.int32, low=-50, high=50)
    m = _reduce_model("ReduceSum", xi, [1])
    assert cu.lower_cuda(m).kernels[0].launch is not None
    np.testing.assert_array_equal(cu.run_cuda(m, {"x": xi})[0], ort_run(m, {"x": xi})[0])
    m = _reduce_model("ReduceMean", xi, [1], 0)      # C division of the int32 sum
    np.testing.assert_array_equal(cu.run_cuda(m, {"x": xi})[0], ort_run(m, {"x": xi})[0])
    xu = rand(2, 64, dtype=np.uint8, low=0, high=255)
    m = _reduce_model("ReduceMax", xu, [1])          # a u8 shared buffer, integer max
    assert cu.lower_cuda(m).kernels[0].launch is not None
    np.testing.assert_array_equal(cu.run_cuda(m, {"x": xu})[0], ort_run(m, {"x": xu})[0])
    xh = rand(2, 96, dtype=np.float16)
    m = _reduce_model("ReduceMean", xh, [1])          # accumulated in f32
    got = cu.run_cuda(m, {"x": xh})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), xh.astype(np.float32).mean(1, keepdims=True), rtol=2e-3, atol=1e-3)


def test_reduce_max_nan_block_schedule():
    """ReduceMax on cuda's block schedule skips NaN (maxNum) as the CPU kernel does: NaN only
    for a row of NaN, whichever threads held the NaNs."""
    x = rand(4, 70)
    x[0, ::3] = np.nan
    x[1, :] = np.nan
    x[2, 69] = np.nan
    m = _reduce_model("ReduceMax", x, [1], 0)
    lg = cu.lower_cuda(m)
    assert lg.kernels[0].launch is not None
    got = cu.run_lowered(lg, [x])[0]
    exp = np.fmax.reduce(x, axis=1)
    assert np.isnan(got[1]) and not np.isnan(got[[0, 2, 3]]).any()
    np.testing.assert_array_equal(got, exp)


def test_reduce_short_empty_and_noop_keep_generic():
    """Short, empty and noop_with_empty_axes reductions keep the generic schedule and its
    values (the spec's lowest value for an empty ReduceMax; noop: the input itself)."""
    x = rand(3, 10)
    m = _reduce_model("ReduceSum", x, [1])
    assert cu.lower_cuda(m).kernels[0].launch is None
    np.testing.assert_allclose(cu.run_cuda(m, {"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    e = np.zeros((3, 0), np.float32)
    m = _reduce_model("ReduceMax", e, [1])
    lg = cu.lower_cuda(m)
    assert all(k.launch is None for k in lg.kernels)
    got = cu.run_lowered(lg, [e])[0]
    assert got.shape == (3, 1) and np.isneginf(got).all(), got
    x = rand(2, 100)
    m = node_model("ReduceSum", {"x": x}, {"noop_with_empty_axes": 1}, opset=18)
    lg = cu.lower_cuda(m)
    assert all(k.launch is None for k in lg.kernels)
    np.testing.assert_allclose(cu.run_lowered(lg, [x])[0], x)


# ----------------------------------------------------------------------------- global pools
def test_global_pools_nchw_block_schedule():
    x = rand(2, 3, 9, 9)
    x[0, 1, :4] = np.nan
    x[1, 2] = np.nan
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        m = node_model(op, {"x": x})
        lg = cu.lower_cuda(m)
        (k,) = lg.kernels
        assert k.launch is not None and k.launch.block == (128,) and shared_sizes(k) == [128]
        got = cu.run_lowered(lg, [x])[0]
        if op == "GlobalMaxPool":   # maxNum: NaN only for the plane of NaN
            exp = np.fmax.reduce(x.reshape(2, 3, -1), axis=2).reshape(2, 3, 1, 1)
            assert np.isnan(got[1, 2]).all() and not np.isnan(got[0, 1]).any()
            np.testing.assert_array_equal(got, exp)
        else:
            xr = np.where(np.isnan(x), 0, x)
            mr = node_model(op, {"x": xr})
            got = cu.run_cuda(mr, {"x": xr})[0]
            np.testing.assert_allclose(got, ort_run(mr, {"x": xr})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [2, 3])
def test_global_lp_pool_nchw_block_schedule(p):
    x = rand(1, 2, 8, 9)
    m = node_model("GlobalLpPool", {"x": x}, {"p": p})
    lg = cu.lower_cuda(m)
    (k,) = lg.kernels
    assert k.launch is not None and k.launch.block == (128,)
    np.testing.assert_allclose(cu.run_lowered(lg, [x])[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool,c,hw,ct,rt", [("GlobalAveragePool", 40, (8, 9), 32, 8), ("GlobalMaxPool", 6, (8, 9), 8, 32),
                                             ("GlobalAveragePool", 6, (5, 5), 8, 16)])
def test_global_pools_nhwc_block_schedule(pool, c, hw, ct, rt):
    """A 1x1 Conv then a global pool through the layout pass: the pool runs channels-last, a
    block per (image, channel tile) with threads over channels and position rows; 40 channels
    take a full and a partial 32-channel tile, 6 channels an 8-channel tile of 32 rows (16 for
    a plane of 25)."""
    x = rand(2, 3, *hw)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node(pool, ["c"], ["y"])],
              {"x": x}, {"y": (2, c, 1, 1)}, {"w": rand(c, 3, 1, 1, seed=1)})
    lg = lower_nhwc(m)
    (k,) = kernels_named(lg, pool.lower() + "nhwc")
    assert k.launch is not None and k.launch.block == (ct * rt,) and shared_sizes(k) == [ct * rt], k.launch
    assert f"blocks of {ct} channels x {rt} position rows" in k.comment
    run_check(m, {"x": x}, lg, rtol=1e-4, atol=1e-5)
    if pool == "GlobalMaxPool":       # a NaN pixel: NaN in every channel there, skipped (maxNum)
        x[1, :, 2, 3] = np.nan
        x[0, :, :, :] = np.nan        # image 0: all NaN
        conv = model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": x}, {"y": (2, c) + hw},
                     {"w": rand(c, 3, 1, 1, seed=1)})
        exp = np.fmax.reduce(ort_run(conv, {"x": x})[0].reshape(2, c, -1), axis=2).reshape(2, c, 1, 1)
        got = cu.run_lowered(lg, [x])[0]
        assert np.isnan(got[0]).all() and not np.isnan(got[1]).any()
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)
