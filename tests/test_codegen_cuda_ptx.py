"""The PTX gate: every kernel the cuda code generator emits for a small CNN, a small
transformer block and tiled matmuls compiles to PTX for sm_90 (the H200) with ``numba.cuda.compile_ptx``, no GPU
needed (NVVM 13.0.88 from pip). Code the simulator accepts and a GPU rejects fails here.

This runs in the default suite, where numba is imported without the simulator; under the
simulator (``pytest tests/cuda``) it is skipped.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

numba_config = pytest.importorskip("numba.core.config")
pytestmark = pytest.mark.skipif(bool(numba_config.ENABLE_CUDASIM), reason="PTX needs numba without the simulator")


def _nvvm_ok():
    try:
        from numba import cuda
        return cuda.cudadrv.nvvm.is_available()
    except Exception:
        return False


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "m", inputs, outputs,
                          initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def small_cnn():
    r = np.random.default_rng(0)
    f = TensorProto.FLOAT

    def t(*s):
        return r.standard_normal(s).astype(np.float32)
    inits = dict(w1=t(4, 3, 3, 3), b1=t(4), sc=t(4), bi=t(4), mu=t(4), var=np.abs(t(4)) + 0.5,
                 wd=t(4, 1, 3, 3), w2=t(4, 4, 1, 1), gw=t(10, 4), gb=t(10))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "sc", "bi", "mu", "var"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd"], ["d1"], pads=[1, 1, 1, 1], group=4),
             helper.make_node("Conv", ["d1", "w2"], ["p1"]),
             helper.make_node("Add", ["p1", "r1"], ["s1"]),
             helper.make_node("MaxPool", ["s1"], ["m1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["m1"], ["g1"]),
             helper.make_node("Flatten", ["g1"], ["f1"]),
             helper.make_node("Gemm", ["f1", "gw", "gb"], ["y"], transB=1),
             helper.make_node("Softmax", ["y"], ["z"])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("z", f, [1, 10])], inits)


def small_transformer():
    r = np.random.default_rng(1)
    f = TensorProto.FLOAT
    S, D = 4, 8

    def t(*s):
        return (0.3 * r.standard_normal(s)).astype(np.float32)
    inits = dict(g=t(D), b=t(D), wq=t(D, D), wk=t(D, D), wv=t(D, D), w1=t(D, 2 * D), b1=t(2 * D),
                 w2=t(2 * D, D), scale=np.array(0.35, np.float32), half=np.array(0.5, np.float32),
                 one=np.array(1.0, np.float32), rs2=np.array(0.70710677, np.float32))
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
             helper.make_node("MatMul", ["ln", "wq"], ["q"]), helper.make_node("MatMul", ["ln", "wk"], ["k"]),
             helper.make_node("MatMul", ["ln", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["qks"]),
             helper.make_node("Softmax", ["qks"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["a"]),
             helper.make_node("Add", ["a", "x"], ["h"]),
             helper.make_node("MatMul", ["h", "w1"], ["u"]), helper.make_node("Add", ["u", "b1"], ["ub"]),
             # Gelu (erf form)
             helper.make_node("Mul", ["ub", "rs2"], ["e0"]), helper.make_node("Erf", ["e0"], ["e1"]),
             helper.make_node("Add", ["e1", "one"], ["e2"]), helper.make_node("Mul", ["ub", "e2"], ["e3"]),
             helper.make_node("Mul", ["e3", "half"], ["gl"]),
             helper.make_node("MatMul", ["gl", "w2"], ["o"]), helper.make_node("Add", ["o", "h"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, [1, S, D])],
                  [helper.make_tensor_value_info("y", f, [1, S, D])], inits)


def tiled_matmuls():
    """MatMul + Add + Relu (fused at O2), Softmax and LayerNormalization over rows of 64 and a
    transposed Gemm: large enough for the cuda hand schedules (shared-memory tiles, a block
    per row)."""
    r = np.random.default_rng(2)
    f = TensorProto.FLOAT
    inits = dict(w=r.standard_normal((16, 64)).astype(np.float32), bias=r.standard_normal(64).astype(np.float32),
                 g=r.standard_normal(64).astype(np.float32), b=r.standard_normal(64).astype(np.float32),
                 gw=r.standard_normal((20, 64)).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Softmax", ["r"], ["p"], axis=-1),
             helper.make_node("LayerNormalization", ["p", "g", "b"], ["ln"], axis=-1),
             helper.make_node("Gemm", ["ln", "gw"], ["y"], transB=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", f, [16, 16])],
                  [helper.make_tensor_value_info("y", f, [16, 20])], inits)


def _kernels(model, opt_level):
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    tgt = Target.parse("cuda")      # as compile(target="cuda"): at O2 the layout pass (NHWC ops)
    g = import_onnx(model)
    optimize(g, opt_level, target=tgt)
    return lower_graph(g, tgt).kernels


@pytest.mark.skipif(not _nvvm_ok(), reason="libNVVM not found (pip install nvidia-nvvm==13.0.88)")
def test_every_kernel_compiles_to_sm90_ptx(tmp_path):
    from tensorfuse.codegen.cuda.jit import build_library
    kernels, seen = [], set()
    for model in (small_cnn(), small_transformer(), tiled_matmuls()):
        for lvl in (0, 2):
            for k in _kernels(model, lvl):
                key = str(k).replace(k.name, "K")     # the same kernel at both levels: compile once
                if key not in seen:
                    seen.add(key)
                    k.name = f"{k.name}_{len(kernels)}"
                    kernels.append(k)
    lib = build_library(kernels, cache_dir=str(tmp_path))
    ptx = lib.ptx(cc=(9, 0))
    assert set(ptx) == set(lib.kernel_names)
    for name, text in ptx.items():
        assert ".target sm_90" in text, name
        assert text.count(".entry") == len(lib.launch_config(name)), name
    src = " ".join(lib.sources.values())
    # the generic schedule and the hand schedules (block reductions, shared-memory tiles) are here
    for what in ("cuda.grid(1)", "cuda.shared.array", "cuda.syncthreads()", "cuda.blockIdx.x"):
        assert what in src, what
    assert any(n.startswith(("convnhwc", "fusedconvnhwc")) for n in lib.kernel_names), lib.kernel_names  # O2: NHWC


class _FixedKnobs:
    """Tuning records giving these knob values to every workload (``lower_graph(tuning=)``)."""

    def __init__(self, knobs):
        self.knobs = knobs

    def knobs_for(self, key):
        return dict(self.knobs)


#: knob values far from the defaults: the register-tiled GEMM's other tiles (4x4 and 8x8 per
#: thread, K slices of 8 and 4, split-K), the largest and smallest blocks
KNOB_SETTINGS = [
    {"tile": 32, "thread_tile": 4, "k_slice": 8, "channels_per_block": 64, "threads_per_block": 1024,
     "launch_threads": 1024},
    {"tile": 64, "thread_tile": 8, "k_slice": 4, "split_k": 2, "block_threads": 32, "channels_per_block": 8,
     "threads_per_block": 64, "launch_threads": 32},
]


@pytest.mark.skipif(not _nvvm_ok(), reason="libNVVM not found (pip install nvidia-nvvm==13.0.88)")
@pytest.mark.parametrize("knobs", KNOB_SETTINGS, ids=["large", "small"])
def test_tuned_knobs_compile_to_sm90_ptx(tmp_path, knobs):
    """Kernels of the cuda schedules with other knob values than the defaults (what a tuning
    record may choose) compile to PTX for sm_90 too."""
    from tensorfuse.codegen.cuda.jit import build_library
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    r = np.random.default_rng(3)
    f = TensorProto.FLOAT
    # a 1x1 conv (implicit GEMM 20 x 18 x 17), a depthwise conv, a channels-last global pool,
    # a Softmax row of 64 (block per row) and an Add (generic launches)
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"]),
                    helper.make_node("Conv", ["c", "wd"], ["d"], pads=[1, 1, 1, 1], group=18),
                    helper.make_node("GlobalAveragePool", ["d"], ["y"]),
                    helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("Add", ["p", "s"], ["z"])],
                   [helper.make_tensor_value_info("x", f, [1, 17, 4, 5]), helper.make_tensor_value_info("s", f, [2, 64])],
                   [helper.make_tensor_value_info("y", f, [1, 18, 1, 1]), helper.make_tensor_value_info("z", f, [2, 64])],
                   {"w": r.standard_normal((18, 17, 1, 1)).astype(np.float32),
                    "wd": r.standard_normal((18, 1, 3, 3)).astype(np.float32)})
    tgt = Target.parse("cuda")
    g = import_onnx(model)
    optimize(g, 1, target=tgt)
    kernels = lower_graph(g, tgt, tuning=_FixedKnobs(knobs)).kernels
    used = {n for k in kernels for n, v in k.knobs.items() if knobs.get(n) == v}
    assert set(knobs) <= used, set(knobs) - used
    lib = build_library(kernels, cache_dir=str(tmp_path))
    ptx = lib.ptx(cc=(9, 0))
    assert set(ptx) == set(lib.kernel_names)
    for name, text in ptx.items():
        assert ".target sm_90" in text, name


def _gemm_entry_stats(model, opt_level, schedule, tmp_path):
    """(kernel, EntryStats, ptxas resources or {}) of the first kernel of ``schedule`` in
    ``model`` lowered for cuda, compiled to sm_90 PTX."""
    from tensorfuse.codegen.cuda.jit import build_library
    from tensorfuse.codegen.cuda.ptx_stats import analyze_ptx, ptxas_resources
    ks = [k for k in _kernels(model, opt_level) if k.schedule == schedule]
    assert ks, schedule
    lib = build_library(ks[:1], cache_dir=str(tmp_path))
    ptx = lib.ptx(cc=(9, 0))[ks[0].name]
    (st,) = analyze_ptx(ptx)
    return ks[0], st, ptxas_resources(ptx, "sm_90").get(st.name, {})


def _gemm_model(M, K, N):
    r = np.random.default_rng(4)
    f = TensorProto.FLOAT
    return _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
                   helper.make_node("Relu", ["hb"], ["y"])],
                  [helper.make_tensor_value_info("x", f, [M, K])], [helper.make_tensor_value_info("y", f, [M, N])],
                  {"w": r.standard_normal((K, N)).astype(np.float32), "b": r.standard_normal(N).astype(np.float32)})


def _conv_model():
    r = np.random.default_rng(5)
    f = TensorProto.FLOAT
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
                  [helper.make_tensor_value_info("x", f, [1, 64, 14, 14])],
                  [helper.make_tensor_value_info("y", f, [1, 128, 14, 14])],
                  {"w": r.standard_normal((128, 64, 3, 3)).astype(np.float32)})


@pytest.mark.skipif(not _nvvm_ok(), reason="libNVVM not found (pip install nvidia-nvvm==13.0.88)")
@pytest.mark.parametrize("what", ["matmul", "conv"])
def test_gemm_inner_loop_feeds_the_fma_units(tmp_path, what):
    """Issue 21's acceptance for the FP32 GEMM and implicit-GEMM conv, read off the sm_90 PTX
    (``codegen/cuda/ptx_stats.py``): in the inner loop (the innermost loop holding FMAs) at least
    one FMA per 2 instructions, no 64-bit index arithmetic (only the address formation of the
    shared-memory loads: ``mul.wide`` / ``add.s64``), and no local memory in the whole kernel (no
    spills: the register tile stays in registers; with ptxas, its spill bytes are 0 too)."""
    if what == "matmul":
        k, st, res = _gemm_entry_stats(_gemm_model(256, 128, 192), 2, "cuda.matmul_tiled", tmp_path)
    else:
        k, st, res = _gemm_entry_stats(_conv_model(), 2, "cuda.conv2d_nhwc_implicit_gemm", tmp_path)
    assert "registers per thread" in k.comment, k.comment
    loop = st.loop
    assert loop is not None, "no loop with FMAs"
    assert loop.fma_ratio >= 0.5, (loop.fma, loop.instructions)
    assert loop.fma >= 32 and loop.ld_shared * 2 <= loop.fma, loop     # R/2 FMAs per shared load
    assert loop.i64_index == 0, loop
    assert st.local_ops == 0, st.local_ops
    if res:
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack_bytes"] == 0, res
