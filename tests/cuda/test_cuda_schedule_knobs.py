"""Every knob of every cuda schedule (codegen/cuda/schedules/, codegen/cuda/launches.py), every
candidate, under numba's CUDA simulator against onnxruntime: each workload is lowered once
with the default knobs to find the knobs its schedule declares (define-by-run, as the tuner
sees them), then once per other candidate of each knob with that one knob fixed (a tuning
record of one knob); each lowering must declare the knob with that value, and its outputs must
match onnxruntime's. Workloads are small (the simulator runs a Python thread per GPU thread)
but cover partial tiles and partial rows.
"""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuda_util as cu
from knob_util import Fixed as FixedKnobs
from oracle import node_model, ort_run, rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def lower(model, opt_level: int, knobs: dict | None = None):
    """The cuda LoweredGraph of ``model`` after the cuda pipeline at ``opt_level``, with
    ``knobs`` fixed for every workload."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    tgt = Target.parse("cuda")
    g = import_onnx(model)
    optimize(g, opt_level, target=tgt)
    return lower_graph(g, tgt, tuning=FixedKnobs(knobs) if knobs else None)


def graph_model(nodes, inputs: dict, outputs: dict, inits: dict, opset: int = 17):
    return cu.float_model(nodes, inputs, outputs, inits, opset)


def _conv():
    x = rand(1, 17, 4, 5)             # a GEMM of 20 pixels x 18 channels x K = 17: partial tiles
    return node_model("Conv", {"x": x}, {},
                      initializers={"w": rand(18, 17, 1, 1, seed=1), "b": rand(18, seed=2)}), {"x": x}


def _depthwise():
    x = rand(1, 20, 5, 5)
    return node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1], "group": 20},
                      initializers={"w": rand(20, 1, 3, 3, seed=1), "b": rand(20, seed=2)}), {"x": x}


def _global_pool_nhwc():
    x = rand(1, 3, 5, 5)              # a 1x1 conv of K = 3 (generic) puts the pool in NHWC
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"]),
                     helper.make_node("GlobalAveragePool", ["c"], ["y"])],
                    {"x": x}, {"y": (1, 40, 1, 1)}, {"w": rand(40, 3, 1, 1, seed=1)})
    return m, {"x": x}


def _global_pool_nchw():
    x = rand(2, 3, 9, 9)
    return node_model("GlobalMaxPool", {"x": x}), {"x": x}


def _layernorm():
    x = rand(3, 70)
    return node_model("LayerNormalization", {"x": x}, {"axis": -1},
                      initializers={"s": rand(70, seed=1), "b": rand(70, seed=2)}), {"x": x}


def _skip_layernorm():
    x, skip = rand(3, 70), rand(3, 70, seed=3)
    m = graph_model([helper.make_node("Add", ["x", "skip"], ["a"]),
                     helper.make_node("LayerNormalization", ["a", "s", "b"], ["y"], axis=-1)],
                    {"x": x, "skip": skip}, {"y": (3, 70)}, {"s": rand(70, seed=1), "b": rand(70, seed=2)})
    return m, {"x": x, "skip": skip}


def _softmax():
    x = rand(3, 100)
    return node_model("Softmax", {"x": x}, {"axis": -1}), {"x": x}


def _reduce():
    x = rand(3, 80)
    return node_model("ReduceSum", {"x": x}, {"keepdims": 1}, opset=18,
                      initializers={"axes": np.array([1], np.int64)}), {"x": x}


def _generic():
    x, y = rand(3, 50), rand(3, 50, seed=1)
    return node_model("Add", {"x": x, "z": y}), {"x": x, "z": y}


# (make the model, optimisation level, the schedule its first kernel takes, the knobs it declares)
WORKLOADS = {
    "conv_implicit_gemm": (_conv, 1, "cuda.conv2d_nhwc_implicit_gemm", {"tile", "thread_tile", "k_slice", "split_k"}),
    "conv_depthwise": (_depthwise, 1, "cuda.conv2d_nhwc_depthwise", {"channels_per_block", "threads_per_block"}),
    "global_pool_nhwc": (_global_pool_nhwc, 1, "cuda.global_pool_nhwc_channel_tiles",
                         {"channels_per_block", "threads_per_block"}),
    "global_pool_nchw": (_global_pool_nchw, 0, "cuda.global_pool_block_per_plane", {"block_threads"}),
    "layernorm": (_layernorm, 0, "cuda.row_norm_block_per_row", {"block_threads"}),
    "skip_layernorm": (_skip_layernorm, 2, "cuda.layernorm_block_per_row", {"block_threads"}),
    "softmax": (_softmax, 0, "cuda.softmax_block_per_row", {"block_threads"}),
    "reduce": (_reduce, 0, "cuda.reduction_block_per_output", {"block_threads"}),
    "generic": (_generic, 0, "generic", {"launch_threads"}),
}


def _scheduled(lg, schedule: str):
    """The kernel of ``schedule`` (the first: a split-K GEMM's partial products, before their sum)."""
    ks = [k for k in lg.kernels if k.schedule == schedule]
    assert len(ks) == 1 or (len(ks) == 2 and ks[1].name.endswith("_splitk_sum")), \
        [(k.name, k.schedule) for k in lg.kernels]
    return ks[0]


def _check(model, feeds, lg):
    got = cu.run_lowered(lg, list(feeds.values()))
    for g, e in zip(got, ort_run(model, feeds)):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_candidate_of_every_knob(name):
    make, level, schedule, knobs = WORKLOADS[name]
    model, feeds = make()
    lg = lower(model, level)
    k = _scheduled(lg, schedule)
    wl = lg.workloads[k.workload]
    space = {kn.name: kn for kn in wl.space}
    assert set(space) == knobs, space
    assert k.knobs == {n: kn.default for n, kn in space.items()}
    _check(model, feeds, lg)
    for kn in space.values():
        assert len(kn.candidates) > 1, kn
        for c in kn.candidates:
            if c == kn.default:
                continue
            lg = lower(model, level, {kn.name: c})
            k = _scheduled(lg, schedule)
            assert k.knobs[kn.name] == c, (kn.name, c, k.knobs)
            _check(model, feeds, lg)


def test_knobs_shape_the_launch():
    """The knob values reach the kernels: the GEMM's block is (tile / thread_tile)^2 threads
    with double-buffered k_slice x tile slices of B and of A (rows padded by 4) and a tile x tile
    output tile in shared memory, and split_k makes a second kernel summing the partials; a row
    schedule's block is block_threads; a generic kernel's launches are built with
    launch_threads threads per block."""
    from tensorfuse.codegen.cuda.jit import build_library
    model, _ = _conv()
    k = _scheduled(lower(model, 1, {"tile": 32, "thread_tile": 4, "k_slice": 8}), "cuda.conv2d_nhwc_implicit_gemm")
    assert k.launch.block == (64,)
    assert sorted(b.numel for b in k.locals if b.scope == "shared") == [2 * 8 * 32, 2 * 8 * 36, 32 * 32]
    lg = lower(model, 1, {"k_slice": 4, "split_k": 4})
    names = [k.name for k in lg.kernels if k.schedule == "cuda.conv2d_nhwc_implicit_gemm"]
    assert len(names) == 2 and names[1].endswith("_splitk_sum"), names
    model, _ = _softmax()
    k = _scheduled(lower(model, 0, {"block_threads": 64}), "cuda.softmax_block_per_row")
    assert k.launch.block == (64,)
    model, _ = _generic()
    lg = lower(model, 0, {"launch_threads": 64})
    lib = build_library(lg.kernels, block=cu.BLOCK, max_blocks=cu.MAX_BLOCKS)
    assert [lib.launch_config(n) for n in lib.kernel_names] == [[((2,), (64,))]]
    lib = build_library(lower(model, 0).kernels, block=cu.BLOCK, max_blocks=cu.MAX_BLOCKS)
    assert [lib.launch_config(n) for n in lib.kernel_names] == [[((2,), (cu.BLOCK,))]]
