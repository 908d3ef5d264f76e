"""The register-tiled cuda GEMM kinds (``codegen/cuda/schedules/gemm.py``) under numba's CUDA
simulator, against onnxruntime, at O0 and O2: the implicit-GEMM conv with edge tiles in every
dimension, the split-K path (two kernels: partial products into a scratch slot, then their sum
and the epilogue), the few-row GEMV (MatMul and Gemm's transB, batched), and batched MatMul.

Shapes are tiny (the simulator runs a Python thread per GPU thread) but each crosses a tile
edge: pixel/row and channel/column counts that are not multiples of the 32-wide tile, K not a
multiple of the 16-deep slice, a split whose last part is shorter.
"""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from onnx import helper  # noqa: E402

import cuda_util as cu  # noqa: E402
from oracle import node_model, ort_run, rand  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _check(model, feeds: dict, opt_level: int, rtol=1e-4, atol=1e-4):
    """Run ``model`` lowered for cuda at ``opt_level`` on the simulator; compare each output
    with onnxruntime's. Returns the LoweredGraph."""
    lg = cu.lower_cuda(model, opt_level)
    got = cu.run_lowered(lg, list(feeds.values()))
    exp = ort_run(model, feeds)
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return lg


def _schedules(lg) -> list[str]:
    return [k.schedule for k in lg.kernels]


@pytest.mark.parametrize("level", [0, 2])
def test_conv_implicit_gemm_edge_tiles(level):
    """A 3x3 padded, strided conv: 2 x 4 x 5 = 40 output pixels (a full and a partial 32-pixel
    tile), 20 output channels (a partial 32-channel tile), K = 3 * 3 * 5 = 45 (two full 16-deep
    slices and a partial one). At O2 it is NHWC and register-tiled; at O0 the NCHW conv
    keeps its generic form, so both levels meet onnxruntime."""
    x = rand(2, 5, 7, 9)
    m = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1], "strides": [2, 2]},
                   initializers={"w": rand(20, 5, 3, 3, seed=1), "b": rand(20, seed=2)})
    lg = _check(m, {"x": x}, level)
    if level == 2:
        assert "cuda.conv2d_nhwc_implicit_gemm" in _schedules(lg), _schedules(lg)
        (k,) = [k for k in lg.kernels if k.schedule == "cuda.conv2d_nhwc_implicit_gemm"]
        assert k.knobs["tile"] == 32 and k.knobs["split_k"] == 1 and "4x4 registers" in k.comment


def _conv_bn_relu_residual(c_in: int, c_out: int, hw: int):
    """Conv 3x3 (pads 1) + BatchNormalization + Add(residual) + Relu: at O2 one FusedConvNHWC
    with the folded BN, residual and activation as its epilogue."""
    x, z = rand(1, c_in, hw, hw), rand(1, c_out, hw, hw, seed=9)
    inits = {"w": rand(c_out, c_in, 3, 3, seed=1), "sc": rand(c_out, seed=2), "bi": rand(c_out, seed=3),
             "mu": rand(c_out, seed=4), "var": np.abs(rand(c_out, seed=5)) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["n"]),
             helper.make_node("Add", ["n", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    m = cu.float_model(nodes, {"x": x, "z": z}, {"y": (1, c_out, hw, hw)}, inits)
    return m, {"x": x, "z": z}


@pytest.mark.parametrize("level", [0, 2])
def test_conv_split_k_with_epilogue(level):
    """A late-layer shape at batch 1 (few pixels, long K): 4 x 4 = 16 pixels, 20 channels, K = 9 *
    24 = 216 (14 slices of 16, the last partial): one 32 x 32 tile, so the default splits K in
    two (7 + 7 slices); the second kernel adds the partials, then bias (folded BN), the residual
    and Relu."""
    m, feeds = _conv_bn_relu_residual(24, 20, 4)
    lg = _check(m, feeds, level)
    if level == 2:
        names = [k.name for k in lg.kernels if k.schedule == "cuda.conv2d_nhwc_implicit_gemm"]
        assert len(names) == 2 and names[0].endswith("_partial") and names[1].endswith("_splitk_sum"), names
        part = [k for k in lg.kernels if k.name == names[0]][0]
        assert part.knobs["split_k"] == 2 and "split-K 2" in part.comment
        scratch = [s for s in lg.slots if s.kind == "temp" and "splitk" in s.name]
        assert len(scratch) == 1 and scratch[0].type.shape == (2, 1, 16, 20)


def test_split_k_uneven_through_compile():
    """Split-K of 4 asked (a tuning record's knob) over 5 slices (K = 72, not a multiple of 16):
    3 splits of 2 + 2 + 1 slices, lowered and run; and a split-K model (the default splits it in
    two) through ``tensorfuse.compile(target="cuda")``: the runtime module, whose memory plan
    places the scratch slot. Both against onnxruntime."""
    import tensorfuse
    from knob_util import Fixed
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    m, feeds = _conv_bn_relu_residual(8, 18, 4)          # 16 pixels, 18 channels, K = 72
    exp = ort_run(m, feeds)[0]
    tgt = Target.parse("cuda")
    g = import_onnx(m)
    optimize(g, 2, target=tgt)
    lg = lower_graph(g, tgt, tuning=Fixed({"split_k": 4}))
    part = [k for k in lg.kernels if k.name.endswith("_partial")]
    assert len(part) == 1 and part[0].knobs["split_k"] == 4 and "split-K 3" in part[0].comment
    np.testing.assert_allclose(cu.run_lowered(lg, list(feeds.values()))[0], exp, rtol=1e-4, atol=1e-4)
    m, feeds = _conv_bn_relu_residual(24, 20, 4)         # the default splits K in two
    mod = tensorfuse.compile(m, target="cuda", opt_level=2)
    np.testing.assert_allclose(mod.run(*feeds.values())[0], ort_run(m, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("level", [0, 2])
def test_matmul_split_k(level):
    """MatMul 20 x 130 x 18: one tile, K = 130 in 9 slices: split in two (5 + 4 slices, the last
    one partial), the sums in split order."""
    a, b = rand(20, 130), rand(130, 18, seed=1)
    lg = _check(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, level)
    assert [k.knobs.get("split_k") for k in lg.kernels if k.schedule == "cuda.matmul_tiled"] == [2, 2]


@pytest.mark.parametrize("level", [0, 2])
def test_batched_matmul(level):
    """Batched MatMul [2, 3, 17, 20] x [2, 3, 20, 33] (no constant): a block-stride over 6
    batches x 2 column tiles, partial row and column tiles, K = 20 (a partial second slice)."""
    q, k = rand(2, 3, 17, 20), rand(2, 3, 20, 33, seed=1)
    lg = _check(node_model("MatMul", {"q": q, "k": k}), {"q": q, "k": k}, level)
    assert _schedules(lg) == ["cuda.matmul_tiled"]


@pytest.mark.parametrize("level", [0, 2])
def test_gemv_matmul(level):
    """A batch-1 classifier's MatMul [1, 40] x [40, 50] + Add + Relu (fused at O2): the GEMV, a
    block per 32 columns (a partial second block), K = 40 over 8 thread groups, sums in shared
    memory, the epilogue on the sum."""
    x, w, bias = rand(1, 40), rand(40, 50, seed=1), rand(50, seed=2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    m = cu.float_model(nodes, {"x": x}, {"y": (1, 50)}, {"w": w, "bias": bias})
    lg = _check(m, {"x": x}, level)
    assert "cuda.matmul_gemv" in _schedules(lg), _schedules(lg)


@pytest.mark.parametrize("level", [0, 2])
def test_gemv_gemm_trans_b(level):
    """Gemm with transB (weights [N, K], contiguous along k), alpha, beta and C: M = 2 rows,
    N = 11 columns (8 per block: a partial second block), K = 70 over the 32 lanes of a warp."""
    a, w, c = rand(2, 70), rand(11, 70, seed=1), rand(11, seed=2)
    m = node_model("Gemm", {"a": a}, {"transB": 1, "alpha": 0.5, "beta": 2.0}, initializers={"w": w, "c": c})
    lg = _check(m, {"a": a}, level)
    assert "cuda.matmul_gemv" in _schedules(lg), _schedules(lg)


def test_gemv_batched():
    """Batched few-row MatMul [2, 3, 36] x [2, 36, 5] (B not constant): the GEMV over batch x rows."""
    a, b = rand(2, 3, 36), rand(2, 36, 5, seed=1)
    lg = _check(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, 0)
    assert _schedules(lg) == ["cuda.matmul_gemv"]
