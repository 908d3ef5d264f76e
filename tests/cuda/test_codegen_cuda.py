"""The cuda code generator under numba's CUDA simulator: single ops lowered for the cuda target
(generic schedule), run on flat views of one device arena, against onnxruntime.

Run as its own process (the simulator must be chosen before numba is imported):
``NUMBA_ENABLE_CUDASIM=1 pytest tests/cuda``. Shapes are tiny: simulated threads are slow.
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


def check(model, inputs, rtol=1e-5, atol=1e-5, opt_level=0):
    exp = ort_run(model, inputs)
    got = cu.run_cuda(model, inputs, opt_level)
    assert len(got) == len(exp)
    for i, (g, e) in enumerate(zip(got, exp)):
        assert g.dtype == e.dtype and g.shape == e.shape, (i, g.dtype, e.dtype, g.shape, e.shape)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return got


ON_GPU = os.environ.get("TENSORFUSE_GPU_TESTS") == "1" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "0"


@pytest.mark.skipif(ON_GPU, reason="running on a GPU (TENSORFUSE_GPU_TESTS=1): the simulator is off by request")
def test_simulator_is_on():
    from numba.core import config
    assert config.ENABLE_CUDASIM


def test_elementwise_broadcast_chain():
    a, b, c = rand(2, 3, 4), rand(3, 1, seed=1), rand(4, seed=2, low=0.5, high=2.0)
    nodes = [helper.make_node("Add", ["a", "b"], ["t1"]), helper.make_node("Mul", ["t1", "c"], ["t2"]),
             helper.make_node("Tanh", ["t2"], ["t3"]), helper.make_node("Div", ["t3", "c"], ["t4"]),
             helper.make_node("Sigmoid", ["t4"], ["t5"]), helper.make_node("Relu", ["t2"], ["t6"]),
             helper.make_node("Sub", ["t5", "t6"], ["y"])]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("a", f, [2, 3, 4]),
                                          helper.make_tensor_value_info("b", f, [3, 1]),
                                          helper.make_tensor_value_info("c", f, [4])],
                          [helper.make_tensor_value_info("y", f, [2, 3, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    check(m, {"a": a, "b": b, "c": c}, rtol=1e-5, atol=1e-6)
    check(m, {"a": a, "b": b, "c": c}, rtol=1e-5, atol=1e-6, opt_level=2)


def test_integer_semantics():
    """Div truncates, by zero gives 0 (our rule), Mod with fmod=0 follows the divisor's sign."""
    a = np.array([7, -7, 7, -7, 5, -2147483648, 3, 0], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1, 5, 3], np.int32)
    m = node_model("Div", {"a": a, "b": b})
    got = cu.run_cuda(m, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(got, np.array([3, -3, -3, 3, 0, -2147483648, 0, 0], np.int32))
    # Mod against onnxruntime: no INT_MIN % -1 (C's undefined case; onnxruntime 1.30 dies of SIGFPE on
    # it, seen on the H200 image), so the INT_MIN entry takes divisor 3
    b2 = np.where(b == 0, 1, b).astype(np.int32)
    b2[a == np.iinfo(np.int32).min] = 3
    check(node_model("Mod", {"a": a, "b": b2}), {"a": a, "b": b2})
    check(node_model("Mod", {"a": a, "b": b2}, {"fmod": 1}), {"a": a, "b": b2})


def test_float_semantics():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, np.nan, np.inf, -np.inf, 3.7, -3.7], np.float32)
    check(node_model("Round", {"x": x}), {"x": x})
    check(node_model("Floor", {"x": x}), {"x": x})
    check(node_model("Sqrt", {"x": x}), {"x": x})
    big = np.array([1e10, -1e10, np.nan, 3.9, -3.9, 2.1e9, 127.5, -200], np.float32)
    got = cu.run_cuda(node_model("Cast", {"x": big}, {"to": TensorProto.INT32}), {"x": big})[0]
    np.testing.assert_array_equal(got, np.array([2147483647, -2147483648, 0, 3, -3, 2100000000, 127, -200], np.int32))
    a = np.array([1.0, np.nan, -0.0, 2.0], np.float32)
    b = np.array([np.nan, 1.0, 0.0, -3.0], np.float32)
    got = cu.run_cuda(node_model("Min", {"a": a, "b": b}), {"a": a, "b": b})[0]
    assert np.isnan(got[0]) and np.isnan(got[1]) and got[3] == -3.0
    assert got[2] == 0 and np.signbit(got[2])
    h = rand(3, 4, dtype=np.float16)
    check(node_model("Mul", {"a": h, "b": h}), {"a": h, "b": h}, rtol=1e-3, atol=1e-3)
    d = rand(5, dtype=np.float64)
    check(node_model("Cast", {"x": d}, {"to": TensorProto.FLOAT16}), {"x": d}, rtol=0, atol=0)


def test_shifts_and_bool():
    x = np.array([1, 255, 16, 7], np.uint8)
    s = np.array([1, 2, 8, 3], np.uint8)
    got = cu.run_cuda(node_model("BitShift", {"x": x, "s": s}, {"direction": "LEFT"}), {"x": x, "s": s})[0]
    np.testing.assert_array_equal(got, np.array([2, 252, 0, 56], np.uint8))
    a, b = rand(6, dtype=np.bool_), rand(6, dtype=np.bool_, seed=3)
    check(node_model("Xor", {"a": a, "b": b}), {"a": a, "b": b})
    f = rand(6)
    check(node_model("Greater", {"a": f, "b": f[::-1].copy()}), {"a": f, "b": f[::-1].copy()})


@pytest.mark.parametrize("kw", [
    dict(shape=(1, 2, 5, 5), w=(3, 2, 3, 3), attrs={}),
    dict(shape=(1, 3, 4, 4), w=(2, 3, 1, 1), attrs={}),
    dict(shape=(1, 2, 6, 6), w=(2, 2, 3, 3), attrs={"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    dict(shape=(1, 4, 4, 4), w=(4, 2, 3, 3), attrs={"group": 2, "pads": [1, 1, 1, 1]}),
    dict(shape=(1, 3, 5, 5), w=(3, 1, 3, 3), attrs={"group": 3, "pads": [1, 1, 1, 1]}),
], ids=["3x3", "1x1", "strided_padded", "grouped", "depthwise"])
@pytest.mark.parametrize("opt_level", [0, 1], ids=["O0", "O1_nhwc"])
def test_conv(kw, opt_level):
    """At O0 the NCHW Conv; at O1 the layout pass's ConvNHWC between two Transposes."""
    x = rand(*kw["shape"])
    w = rand(*kw["w"], seed=1)
    b = rand(kw["w"][0], seed=2)
    m = node_model("Conv", {"x": x}, kw["attrs"], initializers={"w": w, "b": b})
    check(m, {"x": x}, rtol=1e-4, atol=1e-4, opt_level=opt_level)
    rep = cu.lower_cuda.result.layout_report
    assert (rep is None) if opt_level == 0 else (rep.converted == {"ConvNHWC": 1} and rep.count == 2), rep


def test_matmul_gemm():
    a, b = rand(3, 4), rand(4, 5, seed=1)
    check(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, rtol=1e-4, atol=1e-5)
    check(node_model("MatMul", {"a": a}, initializers={"b": b}), {"a": a}, rtol=1e-4, atol=1e-5)
    at, bt, c = rand(4, 3, seed=3), rand(5, 4, seed=4), rand(5, seed=5)
    m = node_model("Gemm", {"a": at, "b": bt, "c": c}, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0})
    check(m, {"a": at, "b": bt, "c": c}, rtol=1e-4, atol=1e-5)
    q, k = rand(2, 3, 4, seed=6), rand(2, 4, 3, seed=7)
    check(node_model("MatMul", {"q": q, "k": k}), {"q": q, "k": k}, rtol=1e-4, atol=1e-5)


def test_softmax_layernorm():
    x = rand(3, 7)
    check(node_model("Softmax", {"x": x}, {"axis": -1}), {"x": x}, rtol=1e-5, atol=1e-6)
    g, b = rand(7, seed=1), rand(7, seed=2)
    m = node_model("LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-5}, initializers={"g": g, "b": b})
    check(m, {"x": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reduce(op):
    x = rand(2, 3, 4)
    axes = np.array([1], np.int64)
    m = node_model(op, {"x": x}, {"keepdims": 1}, opset=18, initializers={"axes": axes})
    check(m, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt_level", [0, 1], ids=["O0", "O1_nhwc"])
def test_pools(opt_level):
    """At O1 the NHWC pools of the layout pass (GlobalAveragePool's output Transpose is a Reshape)."""
    x = rand(1, 2, 5, 5)
    check(node_model("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "strides": [2, 2]}), {"x": x}, opt_level=opt_level)
    check(node_model("AveragePool", {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}), {"x": x},
          rtol=1e-5, atol=1e-6, opt_level=opt_level)
    check(node_model("GlobalAveragePool", {"x": x}), {"x": x}, rtol=1e-5, atol=1e-6, opt_level=opt_level)
    rep = cu.lower_cuda.result.layout_report
    assert (rep is None) if opt_level == 0 else rep.converted == {"GlobalAveragePoolNHWC": 1}, rep


def test_data_movement():
    a, b = rand(2, 3), rand(2, 2, seed=1)
    check(node_model("Concat", {"a": a, "b": b}, {"axis": 1}), {"a": a, "b": b})
    x = rand(2, 3, 4)
    check(node_model("Transpose", {"x": x}, {"perm": [2, 0, 1]}), {"x": x})
    data = rand(5, 3)
    idx = np.array([[0, 4], [-1, 2]], np.int64)
    check(node_model("Gather", {"data": data, "idx": idx}, {"axis": 0}), {"data": data, "idx": idx})
    m = node_model("Slice", {"x": x}, initializers={"s": np.array([0, 1], np.int64), "e": np.array([2, 4], np.int64),
                                                    "ax": np.array([0, 2], np.int64), "st": np.array([1, 2], np.int64)})
    check(m, {"x": x})


def test_index_check_sets_status():
    data = rand(5, 3)
    idx = np.array([1, 7], np.int64)
    m = node_model("Gather", {"data": data, "idx": idx}, {"axis": 0})
    lg = cu.lower_cuda(m)
    assert lg.status_slot is not None
    cu.run_lowered(lg, [data, idx])
    code, value = cu.run_lowered.status
    assert code == 1 and value == 7


def test_fused_conv_bn_relu():
    x = rand(1, 2, 4, 4)
    w, b = rand(3, 2, 3, 3, seed=1), rand(3, seed=2)
    sc, bi, mu = rand(3, seed=3), rand(3, seed=4), rand(3, seed=5)
    var = rand(3, seed=6, low=0.5, high=1.5)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in
             dict(w=w, b=b, sc=sc, bi=bi, mu=mu, var=var).items()]
    g = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", f, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", f, [1, 3, 4, 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    lg = cu.lower_cuda(m, opt_level=2)
    # BatchNormalization folded, Relu fused: one FusedConvNHWC kernel between the layout pass's
    # two boundary Transposes (the graph's input and output stay NCHW)
    assert [c.ops for c in lg.calls] == [["Transpose"], ["FusedConvNHWC"], ["Transpose"]], \
        [c.ops for c in lg.calls]
    assert cu.lower_cuda.result.layout_report.count == 2
    got = cu.run_lowered(lg, [x])[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_conv_elementwise_tail_fuses_into_the_nhwc_conv():
    """Conv -> Tanh -> Mul(tanh, conv) as the last layer, at O2 for cuda: the layout pass pushes
    the conv's output Transpose below the tail (to the graph output), so the tail is the conv
    kernel's epilogue: three kernels (input Transpose, conv + tail, output Transpose)."""
    x = rand(1, 2, 4, 4)
    w, b = rand(3, 2, 3, 3, seed=1), rand(3, seed=2)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c"], ["t"]), helper.make_node("Mul", ["t", "c"], ["y"])]
    g = helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("x", f, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", f, [1, 3, 4, 4])],
                          initializer=[onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    lg = cu.lower_cuda(m, opt_level=2)
    ops = [c.ops for c in lg.calls]
    assert len(ops) == 3 and ops[0] == ops[2] == ["Transpose"], ops
    assert ops[1][0] == "ConvNHWC" and set(ops[1][1:]) == {"Tanh", "Mul"}, ops
    rep = cu.lower_cuda.result.layout_report
    assert rep.count == 2 and rep.transposes[1].where.endswith("-> graph output"), str(rep)
    got = cu.run_lowered(lg, [x])[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_library_blob_roundtrip_and_launch_config(tmp_path):
    x = rand(2, 3)
    lg = cu.lower_cuda(node_model("Relu", {"x": x}))
    from tensorfuse.codegen.cuda.jit import CudaLibrary, build_library
    lib = build_library(lg.kernels, cache_dir=str(tmp_path), block=4, max_blocks=1)
    name = lib.kernel_names[0]
    assert lib.launch_config(name) == [((1,), (4,))]
    assert "def k_" in lib.sources[name] and "float32(" in lib.sources[name]
    files = list(tmp_path.glob("tf_*.py"))
    assert len(files) == 1 and files[0].read_text() == lib.sources[name]
    lib2 = CudaLibrary.from_blob(lib.to_blob(), cache_dir=str(tmp_path))
    assert lib2.kernel_names == lib.kernel_names and lib2.launch_config(name) == lib.launch_config(name)
    got = cu.run_lowered(lg, [x], library=lib2)[0]
    np.testing.assert_array_equal(got, np.maximum(x, 0))
    if ON_GPU:          # a GPU: PTX is made, and the launch defaults are a GPU's
        assert ".entry" in lib.ptx()[name]
        return
    with pytest.raises(RuntimeError, match="simulator"):
        lib.ptx()
    big = cu.lower_cuda(node_model("Relu", {"x": rand(40, 50)}))
    lib3 = build_library(big.kernels, cache_dir=str(tmp_path))      # simulator defaults: few threads
    assert lib3.launch_config(lib3.kernel_names[0]) == [((4,), (32,))]


@pytest.mark.parametrize("case", ["conv_blocked", "conv_depthwise", "matmul_blocked", "pools", "concat_rows"])
def test_cpu_vector_schedules_run_on_the_generic_path(case):
    """Kernels lowered for an AVX2 CPU (8-lane vectors, packed weights, register tiles) are
    still kernel IR the cuda emitter runs: vectors scalarised lane by lane."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.ir.target import Target
    x = rand(1, 8, 6, 9)
    if case == "conv_blocked":
        # small: the register tile is straight-line code that the PTX gate compiles (numba's
        # lowering time grows with the square of a block's length: 16x8 channels made 1296 lines)
        x = rand(1, 2, 5, 6)
        m = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]},
                       initializers={"w": rand(8, 2, 3, 3, seed=1), "b": rand(8, seed=2)})
    elif case == "conv_depthwise":
        m = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1], "group": 8},
                       initializers={"w": rand(8, 1, 3, 3, seed=1)})
    elif case == "matmul_blocked":
        x = rand(5, 16)
        m = node_model("MatMul", {"x": x}, initializers={"w": rand(16, 24, seed=1)})
    elif case == "pools":
        x = rand(1, 2, 9, 18)
        m = node_model("MaxPool", {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    else:
        x = rand(3, 24)
        m = node_model("Concat", {"x": x}, {"axis": 1}, initializers={"c": rand(3, 16, seed=1)})
    lg = lower_graph(import_onnx(m), Target.parse("llvm -mcpu=znver3"))
    assert any(getattr(e, "lanes", 1) > 1 for k in lg.kernels for e in _all_exprs(k.body)), "no vector code"
    got = cu.run_lowered(lg, [x])[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _all_exprs(stmts):
    from tensorfuse.ir.kernel import For, If, Store
    from tensorfuse.ir.schedule import expr_nodes
    for s in stmts:
        if isinstance(s, Store):
            yield from expr_nodes(s.value)
        elif isinstance(s, For):
            yield from _all_exprs(s.body)
        elif isinstance(s, If):
            yield from _all_exprs(s.then + s.orelse)


@pytest.mark.parametrize("which", ["cnn", "transformer"])
def test_small_models_end_to_end(which):
    """A small CNN (Conv+BN+ReLU, depthwise, residual Add, pools, Gemm, Softmax) and a small
    transformer block (LayerNorm, attention, MatMul+Gelu), at O0 and O2 (fused groups, the
    fused attention op)."""
    from test_codegen_cuda_ptx import small_cnn, small_transformer
    m = small_cnn() if which == "cnn" else small_transformer()
    x = rand(1, 3, 8, 8) if which == "cnn" else rand(1, 4, 8)
    exp = ort_run(m, {"x": x})[0]
    for lvl in (0, 2):
        lg = cu.lower_cuda(m, lvl)
        got = cu.run_lowered(lg, [x])[0]
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5, err_msg=f"O{lvl}")
    if which == "transformer":
        assert any("attention" in c.kernel for c in lg.calls), [c.kernel for c in lg.calls]


def test_gpu_loop_kinds_shared_memory_and_barrier_run():
    """A hand-scheduled kernel: one block per row, a strided per-thread partial sum, a tree
    reduction in shared memory with barriers (blockIdx.x / threadIdx.x loops)."""
    from tensorfuse.codegen.cuda.jit import build_library
    from tensorfuse.ir.kernel import Buffer, KernelBuilder, LaunchShape
    from tensorfuse.ir.types import DType
    R, C, T = 3, 50, 16
    x, y = Buffer("x", DType.f32, (R, C)), Buffer("y", DType.f32, (R,))
    kb = KernelBuilder("rowsum", [x, y])
    sh = kb.shared(DType.f32, (T,))
    acc = kb.local(DType.f32)
    with kb.loop(R, kind="blockIdx.x", hint="r") as r:
        with kb.loop(T, kind="threadIdx.x", hint="t") as t:
            kb.store(acc, 0, 0.0)
            with kb.reduce(-(-C // T)) as it:
                c = it * T + t
                with kb.if_(c < C):
                    kb.store(acc, 0, acc[0] + x[r, c])
            kb.store(sh, t, acc[0])
        kb.barrier()
        s = T // 2
        while s:
            with kb.loop(T, kind="threadIdx.x", hint="t") as t:
                with kb.if_(t < s):
                    kb.store(sh, t, sh[t] + sh[t + s])
            kb.barrier()
            s //= 2
        with kb.loop(T, kind="threadIdx.x", hint="t") as t:
            with kb.if_(t.eq(0)):
                kb.store(y, r, sh[0])
        kb.barrier()
    kb.kernel.launch = LaunchShape((2,), (T,))       # fewer blocks than rows: block-stride
    lib = build_library([kb.kernel])
    assert lib.launch_config("rowsum") == [((2,), (T,))]
    src = lib.sources["rowsum"]
    assert "cuda.shared.array(16, float32)" in src and "cuda.syncthreads()" in src and "cuda.blockIdx.x" in src
    from numba import cuda
    xv = rand(R, C)
    dy = cuda.device_array(R, np.float32)
    lib.launch("rowsum", [cuda.to_device(xv.ravel()), dy])
    np.testing.assert_allclose(dy.copy_to_host(), xv.sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,shape", [("Softmax", (3, 7)), ("Softmax", (2, 3, 64)), ("LogSoftmax", (3, 70))])
def test_softmax_block_schedule(op, shape):
    """Softmax over a last axis of at least 64 has a cuda hand schedule: a block per row with
    shared-memory reductions (its launch shape comes from the lowering); shorter rows keep a
    thread per row."""
    x = rand(*shape)
    x[0, 0] = 30.0
    m = node_model(op, {"x": x}, {"axis": -1})
    lg = cu.lower_cuda(m)
    (k,) = lg.kernels
    if shape[-1] < 64:
        assert k.launch is None
    else:
        assert k.launch is not None and k.launch.block == (64 if shape[-1] <= 64 else 128,)
    got = cu.run_lowered(lg, [x])[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_row_norm_block_schedules():
    """LayerNormalization (with its Mean and InvStdDev outputs), InstanceNormalization and
    GroupNormalization: a block per row with shared-memory sums on cuda."""
    x = rand(2, 3, 70)
    g, b = rand(70, seed=1), rand(70, seed=2)
    m = node_model("LayerNormalization", {"x": x}, {"axis": -1}, outputs=("y", "mean", "inv"),
                   initializers={"g": g, "b": b})
    lg = cu.lower_cuda(m)
    assert lg.kernels[0].launch is not None
    check(m, {"x": x}, rtol=1e-4, atol=1e-5)
    x4 = rand(1, 4, 8, 8)
    s4, b4 = rand(4, seed=3), rand(4, seed=4)
    check(node_model("InstanceNormalization", {"x": x4}, initializers={"s": s4, "b": b4}), {"x": x4},
          rtol=1e-4, atol=1e-5)
    sg, bg = rand(4, seed=5), rand(4, seed=6)
    m = node_model("GroupNormalization", {"x": x4}, {"num_groups": 2}, opset=21, initializers={"s": sg, "b": bg})
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, x4.shape))
    check(m, {"x": x4}, rtol=1e-4, atol=1e-5)


def test_skip_layernorm_block_schedule():
    """Add + LayerNormalization fuses (O2) into SkipLayerNormalization, whose cuda kernel is a
    block per row."""
    f = TensorProto.FLOAT
    x, r = rand(2, 3, 64), rand(2, 3, 64, seed=1)
    g, b = rand(64, seed=2), rand(64, seed=3)
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    gr = helper.make_graph(nodes, "sln", [helper.make_tensor_value_info("x", f, x.shape),
                                          helper.make_tensor_value_info("r", f, r.shape)],
                           [helper.make_tensor_value_info("y", f, x.shape)],
                           initializer=[onnx.numpy_helper.from_array(g, "g"), onnx.numpy_helper.from_array(b, "b")])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    lg = cu.lower_cuda(m, opt_level=2)
    assert any("skiplayernormalization" in k.name and k.launch is not None for k in lg.kernels), \
        [k.name for k in lg.kernels]
    got = cu.run_lowered(lg, [x, r])[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x, "r": r})[0], rtol=1e-4, atol=1e-5)


def test_embed_layernorm_block_schedule():
    """Gather + Gather + Add + LayerNormalization (a BERT embedding) at O2 on cuda."""
    f = TensorProto.FLOAT
    we, pe = rand(10, 64), rand(6, 64, seed=1)
    g, b = rand(64, seed=2), rand(64, seed=3)
    ids = np.array([[1, 9, 0, 4]], np.int64)
    pos = np.array([[0, 1, 2, 3]], np.int64)
    nodes = [helper.make_node("Gather", ["we", "ids"], ["e1"]), helper.make_node("Gather", ["pe", "pos"], ["e2"]),
             helper.make_node("Add", ["e1", "e2"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in dict(we=we, pe=pe, g=g, b=b, pos=pos).items()]
    gr = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ids.shape)],
                           [helper.make_tensor_value_info("y", f, (1, 4, 64))], initializer=inits)
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    lg = cu.lower_cuda(m, opt_level=2)
    emb = [k for k in lg.kernels if k.name.startswith("embedlayernormalization") and "check" not in k.name]
    assert len(emb) == 1 and emb[0].launch is not None, [k.name for k in lg.kernels]
    got = cu.run_lowered(lg, [ids])[0]
    np.testing.assert_allclose(got, ort_run(m, {"ids": ids})[0], rtol=1e-4, atol=1e-5)


def test_matmul_tiled_schedule():
    """MatMul, batched MatMul and Gemm (transposed, with C and an epilogue at O2) big enough for
    the cuda register-tiled schedule (32x32 tiles of 4x4 per thread, partial edge tiles)."""
    a, b = rand(20, 19), rand(19, 18, seed=1)
    m = node_model("MatMul", {"a": a, "b": b})
    (k,) = cu.lower_cuda(m).kernels
    assert k.launch is not None and k.launch.block == (64,) and k.schedule == "cuda.matmul_tiled"
    check(m, {"a": a, "b": b}, rtol=1e-4, atol=1e-5)
    q, kk = rand(2, 17, 16, seed=2), rand(2, 16, 17, seed=3)
    check(node_model("MatMul", {"q": q, "k": kk}), {"q": q, "k": kk}, rtol=1e-4, atol=1e-5)
    at, bt, c = rand(16, 17, seed=4), rand(18, 16, seed=5), rand(18, seed=6)
    m = node_model("Gemm", {"a": at, "b": bt, "c": c}, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0})
    check(m, {"a": at, "b": bt, "c": c}, rtol=1e-4, atol=1e-5)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    x, w, bias = rand(1, 17, 16), rand(16, 20, seed=7), rand(20, seed=8)
    gr = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", f, x.shape)],
                           [helper.make_tensor_value_info("y", f, (1, 17, 20))],
                           initializer=[onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(bias, "bias")])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    lg = cu.lower_cuda(m, opt_level=2)
    assert len(lg.kernels) == 1 and lg.kernels[0].launch is not None
    np.testing.assert_allclose(cu.run_lowered(lg, [x])[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_conv_transpose():
    x = rand(1, 2, 4, 5)
    w = rand(2, 3, 3, 3, seed=1)
    m = node_model("ConvTranspose", {"x": x}, {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]},
                   initializers={"w": w, "b": rand(3, seed=2)})
    check(m, {"x": x}, rtol=1e-4, atol=1e-4)
