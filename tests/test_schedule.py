"""Schedules and threads (ir/schedule.py, codegen/llvm/emit.py, runtime/threads.py).

* default_schedule / parallel_violations / verify_schedule on hand-built and lowered kernels.
* collapse_loops (serial nests walking contiguous ranges become one loop) on hand-built kernels
  run natively, and on generic lowered kernels, whose loops holding loops LLVM must not unroll.
* What codegen produced (module.llvm_ir and the optimised IR, never the printed kernel):
  vector types of the target's width and llvm.fmuladd in the register-blocked kernels, the team
  handed to parallel kernels, phases, unrolled loops, errors for loop kinds codegen lacks.
* Modules compiled once and run at 1..4 threads against onnxruntime, and equal bit for bit
  across thread counts (each output element is computed by one thread, in one order).
* Several Python threads running one module at once.
No timings are asserted anywhere.
"""
from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
import onnx
import pytest
from llvmlite import ir as lir
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from tensorfuse.codegen.llvm.emit import CodegenError, emit_entry, emit_kernel, kernel_is_parallel
from tensorfuse.codegen.llvm.jit import compile_ir
from codegen_util import (calls_fmuladd, entry_calls, float_vectors, function_ir, optimized_ir,
                          parallel_kernels, run_on_team)
from tensorfuse.ir.target import Target
from tensorfuse.ir.kernel import Const, For, KernelBuilder, Buffer, Store, Var, select
from tensorfuse.ir.schedule import (MIN_PARALLEL_EXTENT, ScheduleError, carried_locals, collapse_loops, default_schedule,
                                    parallel_violations, verify_schedule)
from tensorfuse.ir.types import DType
from oracle import ort_run
from tensorfuse.runtime.threads import ThreadTeam

F32 = DType.f32
RTOL, ATOL = 1e-4, 1e-5
THREADS = (1, 2, 3, 4)


def loops(stmts):
    for s in stmts:
        if isinstance(s, For):
            yield s
            yield from loops(s.body)


def parallel_loops(kernel) -> list[For]:
    return [f for f in loops(kernel.body) if f.kind == "parallel"]


def lanes() -> int:
    return Target.parse("llvm").lanes(F32)


# ----------------------------------------------------------------------------- default_schedule
def _grid_kernel(shape, name="ew"):
    x, y = Buffer("x", F32, tuple(shape)), Buffer("y", F32, tuple(shape))
    kb = KernelBuilder(name, [x, y])
    with kb.grid(shape) as idx:
        kb.store(y, idx, kb.max(x[idx], 0.0))
    return kb.kernel


def _check_one_spatial_parallel_loop(kernel):
    (par,) = parallel_loops(kernel)
    assert par.role == "spatial"
    assert par.extent.value - par.start.value >= MIN_PARALLEL_EXTENT
    assert kernel_is_parallel(kernel)
    verify_schedule(kernel)


def test_elementwise_grid_kernel_gets_one_spatial_parallel_loop():
    k = default_schedule(_grid_kernel((1, 64, 56, 56)))
    _check_one_spatial_parallel_loop(k)
    assert parallel_loops(k)[0] is k.body[0].body[0]      # the first loop of >= 16: channels


def test_lowered_elementwise_kernels_get_one_spatial_parallel_loop():
    """The lowering's own kernels (a flat loop for same-shape operands, a grid when one
    broadcasts) as compile() schedules them."""
    shape = (1, 64, 56, 56)
    rng = np.random.default_rng(4)
    for ins, ishapes in ((("a", "b"), (shape, shape)), (("a", "b"), (shape, (64, 1, 1))), (("a",), (shape,))):
        op = "Add" if len(ins) == 2 else "Relu"
        g = helper.make_graph([helper.make_node(op, list(ins), ["y"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(ins, ishapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 10
        mod = tensorfuse.compile(m, opt_level=0, num_threads=2)
        (k,) = mod.kernels
        _check_one_spatial_parallel_loop(k)
        assert parallel_kernels(mod) == {k.name}
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(ins, ishapes)}
        np.testing.assert_array_equal(mod.run(**feeds)[0], ort_run(m, feeds)[0])


@pytest.mark.parametrize("shape", [(10,), (2, 5), (1, 1, 10)])
def test_tiny_kernel_stays_serial(shape):
    k = default_schedule(_grid_kernel(shape))
    assert parallel_loops(k) == [] and not kernel_is_parallel(k)


def test_reduction_written_with_grid_is_not_parallel():
    """out[0] += x[i, j] over a grid: every iteration writes out[0], so no loop of the nest
    may be split, whatever its role says."""
    x, out = Buffer("x", F32, (64, 128)), Buffer("out", F32, (1,))
    kb = KernelBuilder("sum_by_mistake", [x, out])
    with kb.grid([64, 128]) as (i, j):
        kb.store(out, 0, out[0] + x[[i, j]])
    k = kb.kernel
    top = k.body[0]
    assert top.role == "spatial" and top.body[0].role == "spatial"
    for f in (top, top.body[0]):
        why = parallel_violations(k, f)
        assert why == [f"store to out does not depend on {f.var.name}"]
    default_schedule(k)
    assert parallel_loops(k) == [] and not kernel_is_parallel(k)
    verify_schedule(k)


def test_reduction_into_a_local_is_not_parallel():
    """acc[0] += x[i] in a local, stored to out after the loop (the generic ReduceSum of an
    int tensor to a scalar): the loop carries acc from one iteration to the next, so the
    scheduler must not split it, whatever its role says (split at 2 threads, each thread summed
    its half and the store took one of them). A loop marked parallel by hand is its author's
    word (a per-thread cache of a packed panel reads and writes a local the same way)."""
    def kernel(kind="serial"):
        x, out = Buffer("x", DType.i32, (70000,)), Buffer("out", DType.i32, (1,))
        kb = KernelBuilder("sum_in_local", [x, out])
        acc = kb.local(DType.i32, (1,), hint="acc")
        kb.store(acc, 0, Const(0, DType.i32))
        with kb.loop(70000, kind=kind, hint="i", role="spatial") as i:
            kb.store(acc, 0, acc[0] + x[i])
        kb.store(out, 0, acc[0])
        return kb.kernel
    k = kernel()
    loop = k.body[1]
    assert parallel_violations(k, loop) == []
    assert carried_locals(k, loop) == [f"{k.locals[0].name} is carried from one iteration of {loop.var.name} to the next"]
    default_schedule(k)
    assert parallel_loops(k) == [] and not kernel_is_parallel(k)
    marked = default_schedule(kernel("parallel"))
    assert [f.var.name for f in parallel_loops(marked)] == [marked.body[1].var.name]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceSumSquare",
                                "ReduceL1"])
@pytest.mark.parametrize("np_dt,onnx_dt", [(np.int32, TensorProto.INT32), (np.int64, TensorProto.INT64)])
@pytest.mark.parametrize("shape,axes", [((70000,), None), ((1, 64, 56, 56), None), ((3, 50000), [1])])
def test_integer_reductions_at_two_threads(op, np_dt, onnx_dt, shape, axes):
    """Integer reductions (the generic loop nest) to a scalar or along the last axis, at 1 and
    2 threads, equal to onnx.reference: the reduction loops are never split across threads
    (regression: ReduceSum of 70000 int32 at 2 threads gave about half the sum)."""
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(5)
    x = (rng.integers(1, 3, shape) * (rng.random(shape) < 0.0004) + (rng.random(shape) >= 0.0004)
         if op == "ReduceProd" else rng.integers(-50, 50, shape)).astype(np_dt)
    inputs = ["x"] + (["axes"] if axes else [])
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if axes else []
    oshape = [] if axes is None else [d for i, d in enumerate(shape) if i not in axes]
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op, inputs, ["y"], keepdims=0)], "g", [helper.make_tensor_value_info("x", onnx_dt, shape)],
        [helper.make_tensor_value_info("y", onnx_dt, oshape)], inits), opset_imports=[helper.make_opsetid("", 18)])
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for threads in (1, 2):
        got = tensorfuse.compile(model, num_threads=threads, cache=False).run(x=x)[0]
        np.testing.assert_array_equal(got, want)


def test_hand_marked_parallel_outside_the_perfect_nest_is_made_serial():
    x, y = Buffer("x", F32, (64, 1024)), Buffer("y", F32, (64, 1024))
    kb = KernelBuilder("k", [x, y])
    with kb.loop(64, hint="i", role="spatial") as i:
        kb.store(y, [i, 0], x[[i, 0]])
        with kb.loop(1023, start=1, kind="parallel", hint="j") as j:
            kb.store(y, [i, j], x[[i, j]] * 2.0)
    k = kb.kernel
    with pytest.raises(ScheduleError, match="not the first parallel loop"):
        verify_schedule(k)
    default_schedule(k)
    assert [f.var.name for f in parallel_loops(k)] == [k.body[0].var.name]
    verify_schedule(k)


def _store_loop(var, extent, body, kind="serial"):
    return For(var, Const(extent), body, kind, role="spatial")


def test_verify_schedule_rejects_nested_parallel_loops():
    x, y = Buffer("x", F32, (64, 64)), Buffer("y", F32, (64, 64))
    i, j = Var("i"), Var("j")
    inner = _store_loop(j, 64, [Store(y, i * 64 + j, x.flat(i * 64 + j))], "parallel")
    k = KernelBuilder("nested", [x, y]).kernel
    k.body = [_store_loop(i, 64, [inner], "parallel")]
    with pytest.raises(ScheduleError, match=r"kernel nested: parallel loop j is not the first"):
        verify_schedule(k)


def test_verify_schedule_rejects_parallel_loop_in_imperfect_nest():
    x, y = Buffer("x", F32, (64, 64)), Buffer("y", F32, (64, 64))
    i, j = Var("i"), Var("j")
    inner = _store_loop(j, 63, [Store(y, i * 64 + j + 1, x.flat(i * 64 + j))], "parallel")
    k = KernelBuilder("imperfect", [x, y]).kernel
    k.body = [_store_loop(i, 64, [Store(y, i * 64, x.flat(i * 64)), inner])]
    with pytest.raises(ScheduleError, match=r"kernel imperfect: parallel loop j is not the first"):
        verify_schedule(k)


def test_verify_schedule_rejects_parallel_loop_whose_stores_ignore_its_variable():
    x, y, out = Buffer("x", F32, (64,)), Buffer("y", F32, (64,)), Buffer("out", F32, (1,))
    i = Var("i")
    k = KernelBuilder("racy", [x, y, out]).kernel
    k.body = [_store_loop(i, 64, [Store(y, i, x.flat(i)), Store(out, Const(0), x.flat(i))], "parallel")]
    with pytest.raises(ScheduleError, match=r"kernel racy: loop i cannot be parallel: store to out does not depend on i"):
        verify_schedule(k)
    k.body[0].body.pop()
    verify_schedule(k)                          # y[i] alone is fine


# ----------------------------------------------------------------------------- models
def _c(rng, name, *shape, scale=0.2):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes, name, inputs, outputs, inits):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def conv_model(chain: int = 2) -> onnx.ModelProto:
    """``chain`` 3x3 Convs [1, 16, 14, 14] -> 32 -> 32 ... channels, weights constant."""
    rng = np.random.default_rng(0)
    nodes, inits, src, c = [], [], "x", 16
    for i in range(chain):
        dst = "y" if i == chain - 1 else f"h{i}"
        nodes.append(helper.make_node("Conv", [src, f"w{i}"], [dst], pads=[1, 1, 1, 1]))
        inits.append(_c(rng, f"w{i}", 32, c, 3, 3))
        src, c = dst, 32
    return _model(nodes, "convs", [("x", [1, 16, 14, 14])], [("y", [1, 32, 14, 14])], inits)


def cnn_model() -> onnx.ModelProto:
    """Conv+Relu, MaxPool, Conv + residual Add, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(1)
    N = helper.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"]),
             N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             N("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), N("Add", ["c2", "p1"], ["s"]),
             N("GlobalAveragePool", ["s"], ["g"]), N("Flatten", ["g"], ["f"]),
             N("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = [_c(rng, "w1", 16, 3, 3, 3), _c(rng, "b1", 16), _c(rng, "w2", 16, 16, 3, 3), _c(rng, "b2", 16),
             _c(rng, "wf", 10, 16), _c(rng, "bf", 10)]
    return _model(nodes, "cnn", [("x", [2, 3, 32, 32])], [("y", [2, 10])], inits)


def mlp_model(rows=(2, 35), k=128, n=256) -> onnx.ModelProto:
    """MatMul by a constant [k, n], Softmax over the last axis, LayerNormalization."""
    rng = np.random.default_rng(2)
    N = helper.make_node
    nodes = [N("MatMul", ["x", "w"], ["h"]), N("Softmax", ["h"], ["s"], axis=-1),
             N("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    inits = [_c(rng, "w", k, n), _c(rng, "g", n, scale=1.0), _c(rng, "b", n)]
    return _model(nodes, "mlp", [("x", [*rows, k])], [("y", [*rows, n])], inits)


@pytest.fixture(scope="module")
def cnn():
    m = cnn_model()
    return m, tensorfuse.compile(m, num_threads=1)


@pytest.fixture(scope="module")
def mlp():
    m = mlp_model()
    return m, tensorfuse.compile(m, num_threads=1)


# ----------------------------------------------------------------------------- codegen inspection
def test_blocked_conv_codegen_vectors_fmuladd_phases():
    L = lanes()
    assert L in (4, 8, 16)
    mod = tensorfuse.compile(conv_model(), num_threads=2)
    assert [c.ops for c in mod.calls] == [["Conv"], ["Conv"]]
    names = [c.kernel for c in mod.calls]
    assert parallel_kernels(mod) == set(names)
    ir_text = mod.llvm_ir
    opt = optimized_ir(mod)
    for name in names:
        body = function_ir(ir_text, name)
        assert float_vectors(body) == {L}, f"{name}: vectors {float_vectors(body)} for {L} lanes"
        assert calls_fmuladd(body, L)
        obody = function_ir(opt, name)
        assert L in float_vectors(obody) and calls_fmuladd(obody, L)
    # the entry: both convs get the team; each waits for the earlier phases, then claims chunks
    # of its parallel loop (no barrier: codegen.llvm.emit.phase_helpers)
    assert entry_calls(ir_text) == [(names[0], True), (names[1], True)]
    for name in names:
        assert _phases(function_ir(ir_text, name)) == 1
        obody = function_ir(opt, name)      # optimised, the claim may be inlined: its compare-and-swap
        assert re.search(r'call i64 @"?tf_claim"?\(', obody) or "cmpxchg" in obody


def test_blocked_matmul_codegen_vectors_fmuladd_phases():
    """MatMul by a constant [256, 512] (rows 16: one parallel loop over whole row tiles and
    one over the rows left over, a phase each), then a Softmax kernel."""
    L = lanes()
    rng = np.random.default_rng(3)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)],
               "mm", [("x", [16, 256])], [("y", [16, 512])], [_c(rng, "w", 256, 512)])
    mod = tensorfuse.compile(m, num_threads=2)
    assert [c.ops for c in mod.calls] == [["MatMul"], ["Softmax"]]
    mm, sm = (c.kernel for c in mod.calls)
    assert parallel_kernels(mod) == {mm, sm}
    body = function_ir(mod.llvm_ir, mm)
    assert L in float_vectors(body) and max(float_vectors(body)) == L
    assert calls_fmuladd(body, L)
    k = next(k for k in mod.kernels if k.name == mm)
    assert _phases(body) == len(k.body)      # leftover rows: a second phase
    obody = function_ir(optimized_ir(mod), mm)
    assert L in float_vectors(obody) and calls_fmuladd(obody, L)
    assert entry_calls(mod.llvm_ir) == [(mm, True), (sm, True)]
    x = rng.standard_normal((16, 256)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x=x)[0], ort_run(m, {"x": x})[0], rtol=RTOL, atol=ATOL)


def _phases(body: str) -> int:
    """Phases in a kernel's unoptimised IR: each waits for the earlier phases (tf_wait) and
    claims chunks (tf_claim)."""
    claims = len(re.findall(r'call i64 @"tf_claim"\(ptr %"team"', body))
    assert len(re.findall(r'call void @"tf_wait"\(ptr %"team", i64', body)) == claims
    return claims


def test_serial_kernel_gets_null_team_and_runs_on_thread_zero():
    """Tiny kernels stay serial: the entry runs the two as one phase of one chunk, whose
    claimer passes each a null team."""
    m = _model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])], "tiny",
               [("x", [2, 5])], [("y", [2, 5])], [])
    mod = tensorfuse.compile(m, opt_level=0, num_threads=2)
    assert not parallel_kernels(mod)
    assert entry_calls(mod.llvm_ir) == [(c.kernel, False) for c in mod.calls]
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(mod.run(x=x)[0], ort_run(m, {"x": x})[0])


def _native(kernel, nslots: int):
    """Compile one kernel with an entry over slots 0..nslots-1; returns (unoptimised IR, entry)."""
    mod = lir.Module(name="t")
    emit_kernel(mod, kernel)
    emit_entry(mod, "tf_run", [(kernel.name, list(range(nslots)))], {kernel.name: kernel_is_parallel(kernel)})
    lib, _, _ = compile_ir(str(mod), "t")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(lib.address("tf_run"))
    return str(mod), fn, lib


def _call(fn, arrays, threads: int = 1, chunks_per_thread: int | None = None):
    table = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    if threads == 1:
        fn(ctypes.addressof(table), None)
    else:
        team = ThreadTeam(threads, chunks_per_thread=chunks_per_thread)
        try:
            team.run(fn, ctypes.addressof(table))
        finally:
            team.close()


def test_unroll_loop_has_no_loop_in_llvm_ir():
    x, y = Buffer("x", F32, (4, 64)), Buffer("y", F32, (4, 64))
    kb = KernelBuilder("unrolled", [x, y])
    with kb.loop(4, kind="unroll", hint="u") as u:
        with kb.loop(64, hint="j") as j:
            kb.store(y, [u, j], x[[u, j]] * 2.0 + u.cast(F32))
    k = kb.kernel
    text, fn, _lib = _native(k, 2)
    body = function_ir(text, "unrolled")
    uname, jname = u.name, j.name
    assert not re.search(r'%%"%s" = phi' % uname, body) and f'"{uname}.head"' not in body
    # the serial loop inside is a loop (one phi), emitted once per unrolled iteration
    assert len(re.findall(r'%%"%s(?:\.\d+)?" = phi' % jname, body)) == 4
    xa = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    ya = np.zeros_like(xa)
    _call(fn, [xa, ya])
    np.testing.assert_array_equal(ya, xa * np.float32(2) + np.arange(4, dtype=np.float32)[:, None])


def test_unroll_loop_with_straight_line_body_uses_each_iterations_index():
    """Regression (found by the matmul knobs' sweep_rows): the body of an unroll loop without a
    loop inside stays in one basic block, and the expression memo reused the first pass's
    index values (every pass stored to u = 0 from the u = 0 inputs)."""
    x, y = Buffer("x", F32, (4, 8)), Buffer("y", F32, (4, 8))
    kb = KernelBuilder("unrolled_flat", [x, y])
    with kb.loop(4, kind="unroll", hint="u") as u:
        row = u * 8
        for c in range(8):
            kb.store(y, row + c, x.flat(row + c) * 3.0 + u.cast(F32))
    _text, fn, _lib = _native(kb.kernel, 2)
    xa = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    ya = np.zeros_like(xa)
    _call(fn, [xa, ya])
    np.testing.assert_array_equal(ya, xa * np.float32(3) + np.arange(4, dtype=np.float32)[:, None])


def test_unroll_errors():
    y = Buffer("y", F32, (100,))
    kb = KernelBuilder("too_long", [y])
    with kb.loop(100, kind="unroll") as u:
        kb.store(y, u, 1.0)
    with pytest.raises(CodegenError, match="too_long.*100 iterations"):
        emit_kernel(lir.Module(), kb.kernel)
    n = Buffer("n", DType.i64, (1,))
    kb = KernelBuilder("dynamic", [n, y])
    with kb.loop(n[0], kind="unroll") as u:
        kb.store(y, u, 1.0)
    with pytest.raises(CodegenError, match="dynamic.*constant bounds"):
        emit_kernel(lir.Module(), kb.kernel)


def test_unknown_loop_kind():
    y = Buffer("y", F32, (8,))
    kb = KernelBuilder("k", [y])
    with pytest.raises(ValueError, match="loop kind must be one of"):
        with kb.loop(8, kind="tiled"):
            pass
    i = Var("i")
    k = KernelBuilder("odd_kind", [y]).kernel
    k.body = [For(i, Const(8), [Store(y, i, Const(1.0, F32))], kind="tiled")]
    with pytest.raises(CodegenError, match=r"kernel odd_kind: loop kind 'tiled' has no LLVM lowering"):
        emit_kernel(lir.Module(), k)


def test_parallel_kernel_split_covers_every_iteration():
    """A parallel loop whose extent is not a multiple of the team size: every element is
    written once, by the chunks of 1..5 threads (the output starts as NaN)."""
    x, y = Buffer("x", F32, (1001, 37)), Buffer("y", F32, (1001, 37))
    kb = KernelBuilder("split", [x, y])
    with kb.grid([1001, 37]) as idx:
        kb.store(y, idx, x[idx] + 1.0)
    k = default_schedule(kb.kernel)
    assert kernel_is_parallel(k)
    text, fn, _lib = _native(k, 2)
    assert entry_calls(text) == [("split", True)]
    xa = np.random.default_rng(0).standard_normal((1001, 37)).astype(np.float32)
    for n in (1, 2, 3, 4, 5):
        ya = np.full_like(xa, np.nan)
        _call(fn, [xa, ya], threads=n)
        np.testing.assert_array_equal(ya, xa + np.float32(1))


def test_parallel_loop_under_serial_loops_keeps_their_order_per_chunk():
    """A parallel loop inside a serial one: each chunk of j runs every i in order (as each
    thread ran the outer loop over its own range before), so a column's running sum over i,
    which reads what the previous i wrote at the same j, is right at 1..4 threads and for
    several chunk sizes."""
    x, y = Buffer("x", F32, (8, 1000)), Buffer("y", F32, (8, 1000))
    kb = KernelBuilder("colsum", [x, y])
    with kb.loop(8, hint="i") as i:
        with kb.loop(1000, kind="parallel", hint="j") as j:
            above = y[[select(i > 0, i - 1, 0), j]]         # y[i - 1, j], read where i > 0
            kb.store(y, [i, j], x[[i, j]] + select(i > 0, above, 0.0))
    k = kb.kernel
    verify_schedule(k)
    text, fn, _lib = _native(k, 2)
    assert _phases(function_ir(text, "colsum")) == 1
    xa = np.random.default_rng(5).standard_normal((8, 1000)).astype(np.float32)
    want = np.cumsum(xa, axis=0, dtype=np.float32)
    for n in (1, 2, 3, 4):
        for cpt in (1, 4, 100):
            ya = np.full_like(xa, np.nan)
            _call(fn, [xa, ya], threads=n, chunks_per_thread=cpt)
            np.testing.assert_allclose(ya, want, rtol=1e-5, atol=1e-5, err_msg=f"{n} threads, {cpt} chunks")


def test_parallel_loop_with_bounds_from_an_outer_loop_runs_once():
    """A parallel loop whose extent reads the loop above it (a triangle) cannot be cut the same
    way by every thread before the nest: the statement is one phase of one chunk, still right."""
    x, y = Buffer("x", F32, (64, 64)), Buffer("y", F32, (64, 64))
    kb = KernelBuilder("tri", [x, y])
    with kb.loop(64, hint="i") as i:
        with kb.loop(i + 1, kind="parallel", hint="j") as j:
            kb.store(y, [i, j], x[[i, j]] * 2.0)
    k = kb.kernel
    text, fn, _lib = _native(k, 2)
    body = function_ir(text, "tri")
    assert _phases(body) == 1 and 'call i64 @"tf_claim"(ptr %"team", i64 1,' in body
    xa = np.random.default_rng(6).standard_normal((64, 64)).astype(np.float32)
    ya = np.zeros_like(xa)
    _call(fn, [xa, ya], threads=3)
    np.testing.assert_array_equal(ya, np.tril(xa * np.float32(2)))


def test_statement_run_once_filling_locals_read_later_makes_the_kernel_one_phase():
    """A statement that runs once (it stores to global memory) fills a local that a statement
    after a parallel one reads: on a team that local would be set on one thread only, so the
    whole body becomes one phase of one chunk (one thread runs it all), and the outputs are
    right at 2 threads."""
    x, y, s, z = (Buffer("x", F32, (64, 256)), Buffer("y", F32, (64, 256)), Buffer("s", F32, (256,)),
                  Buffer("z", F32, (256,)))
    kb = KernelBuilder("once_locals", [x, y, s, z])
    t = kb.local(F32, (256,), hint="t")
    with kb.loop(256, hint="a") as a:
        kb.store(t, a, x[[0, a]] * 3.0)
        kb.store(s, a, x[[0, a]])
    with kb.loop(64, kind="parallel", hint="i") as i:
        with kb.loop(256, hint="j") as j:
            kb.store(y, [i, j], x[[i, j]] + 1.0)
    with kb.loop(256, hint="b") as c:
        kb.store(z, c, t[c] + s[c])
    k = kb.kernel
    text, fn, _lib = _native(k, 4)
    assert _phases(function_ir(text, "once_locals")) == 1
    xa = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
    ya, sa, za = np.zeros_like(xa), np.zeros(256, np.float32), np.zeros(256, np.float32)
    _call(fn, [xa, ya, sa, za], threads=2)
    np.testing.assert_array_equal(ya, xa + np.float32(1))
    np.testing.assert_array_equal(za, xa[0] * np.float32(3) + xa[0])


def test_local_filled_serially_then_read_by_parallel_loop():
    # a serial statement that stores only to a local runs on every thread (each fills its copy)
    x, y = Buffer("x", F32, (64, 1024)), Buffer("y", F32, (64, 1024))
    kb = KernelBuilder("table", [x, y])
    t = kb.local(F32, (1024,), hint="t")
    with kb.loop(1024, role="spatial") as j:
        kb.store(t, j, x[[0, j]])
    with kb.grid([64, 1024]) as (i, j):
        kb.store(y, [i, j], x[[i, j]] + t[j])
    k = default_schedule(kb.kernel)
    verify_schedule(k)
    _, fn, _lib = _native(k, 2)
    xa = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    ya = np.zeros_like(xa)
    _call(fn, [xa, ya], threads=2)
    np.testing.assert_array_equal(ya, xa + xa[0])


def test_thread0_statement_filling_locals_keeps_the_kernel_serial():
    # a serial statement that also stores to global memory runs on thread 0 alone: a local it
    # fills would be unset in the other threads, so no statement of the kernel is parallel
    x, y, s = Buffer("x", F32, (64, 1024)), Buffer("y", F32, (64, 1024)), Buffer("s", F32, (1024,))
    kb = KernelBuilder("table", [x, y, s])
    t = kb.local(F32, (1024,), hint="t")
    with kb.loop(1024, role="spatial") as j:
        kb.store(t, j, x[[0, j]])
        kb.store(s, j, x[[0, j]])
    with kb.grid([64, 1024]) as (i, j):
        kb.store(y, [i, j], x[[i, j]] + t[j])
    k = default_schedule(kb.kernel)
    assert not kernel_is_parallel(k)
    verify_schedule(k)
    k.body[1].kind = "parallel"
    with pytest.raises(ScheduleError, match="fills locals"):
        verify_schedule(k)
    k.body[1].kind = "serial"
    _, fn, _lib = _native(k, 3)
    xa = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    ya, sa = np.zeros_like(xa), np.zeros(1024, np.float32)
    _call(fn, [xa, ya, sa], threads=2)
    np.testing.assert_array_equal(ya, xa + xa[0])
    np.testing.assert_array_equal(sa, xa[0])


# ----------------------------------------------------------------------------- threads vs onnxruntime
def _check_threads(model, mod, feeds):
    expected = ort_run(model, feeds)
    assert parallel_kernels(mod), "no kernel splits work: the thread counts would test nothing"
    for k in mod.kernels:
        verify_schedule(k)
    outs = {}
    debug = mod.check_memory
    try:
        for n in THREADS:
            mod.num_threads = n
            assert mod.num_threads == n
            # debug mode's checked run (kernel by kernel) and the plain run (one entry call):
            # both hand chunks to the workers (run_on_team fails if they never ran one)
            for checked in (True, False):
                mod.check_memory = checked

                def check(got, run, n=n, checked=checked):
                    for i, (g, e) in enumerate(zip(got, expected)):
                        assert g.dtype == e.dtype and g.shape == e.shape
                        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL,
                                                   err_msg=f"{n} threads, checked {checked}, run {run}, output {i}")
                outs[n, checked] = run_on_team(mod, feeds, check)
    finally:
        mod.check_memory = debug
    for key, got in outs.items():
        for i, (g, g1) in enumerate(zip(got, outs[1, True])):
            assert np.array_equal(g, g1), f"output {i}: {key[0]} threads (checked {key[1]}) differ from 1 thread"


def test_cnn_threads_match_onnxruntime_and_each_other(cnn):
    model, mod = cnn
    kinds = {c.kernel: c.ops for c in mod.calls}
    par = parallel_kernels(mod)
    assert any("Conv" in op for k in par for op in kinds[k]) and any("MaxPool" in kinds[k] for k in par)
    x = np.random.default_rng(10).standard_normal((2, 3, 32, 32)).astype(np.float32)
    _check_threads(model, mod, {"x": x})


def test_matmul_softmax_layernorm_threads_match_onnxruntime_and_each_other(mlp):
    model, mod = mlp
    kinds = {c.kernel: c.ops[0] for c in mod.calls}
    assert {kinds[k] for k in parallel_kernels(mod)} >= {"MatMul", "Softmax", "LayerNormalization"}
    x = np.random.default_rng(11).standard_normal((2, 35, 128)).astype(np.float32)
    _check_threads(model, mod, {"x": x})


def test_concurrent_runs_with_thread_teams(cnn):
    """4 Python threads x 20 runs each, different inputs, num_threads=2: every result equals
    the single-threaded run of the same input (which matches onnxruntime)."""
    model, mod = cnn
    rng = np.random.default_rng(12)
    inputs = [[rng.standard_normal((2, 3, 32, 32)).astype(np.float32) for _ in range(20)] for _ in range(4)]
    mod.num_threads = 1
    refs = [[mod.run(x=x)[0] for x in xs] for xs in inputs]
    for xs, rs in ((inputs[0][:2], refs[0][:2]), (inputs[3][-1:], refs[3][-1:])):
        for x, r in zip(xs, rs):
            np.testing.assert_allclose(r, ort_run(model, {"x": x})[0], rtol=RTOL, atol=ATOL)
    mod.num_threads = 2
    got = [[None] * 20 for _ in range(4)]
    errors = []
    start = threading.Barrier(4)

    def work(t):
        try:
            start.wait()
            for i, x in enumerate(inputs[t]):
                got[t][i] = mod.run(x=x)[0]
        except BaseException as e:           # reported below, not lost in the thread
            errors.append(e)

    ths = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in ths), "a run did not finish"
    assert not errors, errors
    for t in range(4):
        for i in range(20):
            assert np.array_equal(got[t][i], refs[t][i]), f"thread {t}, run {i}"
    assert len(mod._pool) <= 4                 # one arena (and team) per simultaneous run, kept


def test_structurally_identical_kernels_share_code():
    """Two Conv+Relu layers of the same shapes with different weights: one native kernel serves
    both calls (the packed weights are separate constants), and the results match onnxruntime."""
    rng = np.random.default_rng(21)
    N = helper.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"]),
             N("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), N("Relu", ["c2"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2, n)
             for n in ("w1", "w2")]
    inits += [numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n) for n in ("b1", "b2")]
    m = _model(nodes, "twice", [("x", [1, 16, 20, 20])], [("y", [1, 16, 20, 20])], inits)
    mod = tensorfuse.compile(m, num_threads=2)
    convs = [c.kernel for c in mod.calls if any("Conv" in op for op in c.ops)]
    assert len(convs) == 2 and convs[0] == convs[1]
    assert len(re.findall(r"define [^@]*@\"?%s\"?\(" % re.escape(convs[0]), mod.llvm_ir)) == 1
    assert len(mod.kernels) == 1
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x=x)[0], ort_run(m, {"x": x})[0], rtol=RTOL, atol=ATOL)


def test_if_refuses_a_python_bool():
    """``v == 0`` on an Expr is Python's identity test, not a comparison: ``kb.if_`` refuses the
    resulting bool instead of emitting a branch that is never taken (emit_conv_flat's first
    draft zeroed its partial sums under ``if_(cc == 0)`` and read garbage)."""
    x = Buffer("x", F32, (4,))
    kb = KernelBuilder("k", [x])
    with kb.loop(4) as i:
        with pytest.raises(TypeError, match="Expr.eq"):
            with kb.if_(i == 0):
                pass
        with kb.if_(i.eq(0)):
            kb.store(x, i, 1.0)


def test_emitter_reuses_load_free_subexpressions_within_a_block_but_not_loads():
    """An index expression object used by several loads in one basic block is emitted once (the
    unoptimised IR has one multiply for it, not one per load); a Load object used on both sides
    of a store to its buffer is read again after the store (b[1] sees the new a[0])."""
    from tensorfuse.ir.kernel import Buffer, KernelBuilder, as_expr
    from tensorfuse.ir.types import DType
    a = Buffer("a", DType.i64, (8,))
    b = Buffer("b", DType.i64, (8,))
    kb = KernelBuilder("memo", [a, b])
    with kb.loop(1, hint="i") as i:
        base = i * 7 + 1                               # one object, shared by four loads
        total = a.flat(base) + a.flat(base) + a.flat(base) + a.flat(base)
        kb.store(b, 2, total)
        first = a.flat(as_expr(0))
        kb.store(b, 0, first)
        kb.store(a, 0, as_expr(5, DType.i64))
        kb.store(b, 1, first)                          # the same Load object, after the store
    text, fn, _lib = _native(kb.kernel, 2)
    body = [ln for ln in text.split("define")[1].splitlines()]
    assert sum(" mul " in ln for ln in body) == 1, "\n".join(body)
    av = np.arange(8, dtype=np.int64) + 10
    bv = np.zeros(8, np.int64)
    _call(fn, [av, bv])
    assert bv[0] == 10 and bv[1] == 5 and bv[2] == 4 * 11


# ----------------------------------------------------------------------------- collapse_loops
def _copy_kernel(src_shape, dst_shape, index, name="copy"):
    """``y[idx] = x[index(idx)]`` over ``dst_shape``: a serial nest, as kb.grid makes it."""
    x, y = Buffer("x", F32, tuple(src_shape)), Buffer("y", F32, tuple(dst_shape))
    kb = KernelBuilder(name, [x, y])
    with kb.grid(dst_shape) as idx:
        kb.store(y, idx, x[index(idx)])
    return kb.kernel


def _extents(kernel) -> list[int]:
    return [f.extent.value for f in loops(kernel.body)]


def _run_native(kernel, arrays, threads: int = 1) -> None:
    _text, fn, _lib = _native(kernel, len(arrays))
    _call(fn, arrays, threads=threads)


def _rand(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def test_collapse_loops_makes_a_contiguous_copy_one_loop():
    # rows 2..4 of [1, 6, 5, 8]: each loop goes on where the one inside it stops, in x and y
    k = _copy_kernel((1, 6, 5, 8), (1, 3, 5, 8), lambda i: [i[0], i[1] + 2, i[2], i[3]])
    assert collapse_loops(k) == 3
    assert _extents(k) == [120]
    xa, ya = _rand(1, 6, 5, 8), np.full((1, 3, 5, 8), np.nan, np.float32)
    _run_native(k, [xa, ya])
    np.testing.assert_array_equal(ya, xa[:, 2:5])


def test_collapse_loops_keeps_loops_whose_strides_do_not_line_up():
    # every other column: x's column stride is twice the channel loop's extent, so the
    # channel loop stays; rows and columns do walk on (x: 48 = 3 * 16, y: 24 = 3 * 8)
    k = _copy_kernel((1, 4, 6, 8), (1, 4, 3, 8), lambda i: [i[0], i[1], i[2] * 2 + 1, i[3]])
    assert collapse_loops(k) == 2
    assert _extents(k) == [12, 8]
    xa, ya = _rand(1, 4, 6, 8), np.full((1, 4, 3, 8), np.nan, np.float32)
    _run_native(k, [xa, ya])
    np.testing.assert_array_equal(ya, xa[:, :, 1::2])


def test_collapse_loops_with_a_broadcast_operand():
    # y[n, c, i, j] = a[c, i, j] + b[n, i, j]: (i, j) collapse in all three; c does not join
    # them (b does not read it), nor n with c (a does not read n)
    a, b, y = Buffer("a", F32, (3, 4, 5)), Buffer("b", F32, (2, 4, 5)), Buffer("y", F32, (2, 3, 4, 5))
    kb = KernelBuilder("bcast", [a, b, y])
    with kb.grid((2, 3, 4, 5)) as (n, c, i, j):
        kb.store(y, [n, c, i, j], a[[c, i, j]] + b[[n, i, j]])
    k = kb.kernel
    assert collapse_loops(k) == 1
    assert _extents(k) == [2, 3, 20]
    aa, ba, ya = _rand(3, 4, 5), _rand(2, 4, 5), np.full((2, 3, 4, 5), np.nan, np.float32)
    _run_native(k, [aa, ba, ya])
    np.testing.assert_array_equal(ya, aa[None] + ba[:, None])


def test_collapse_loops_keeps_a_variable_read_outside_index_arithmetic():
    x, y = Buffer("x", F32, (4, 8)), Buffer("y", F32, (4, 8))
    kb = KernelBuilder("cast_var", [x, y])
    with kb.grid((4, 8)) as (i, j):
        kb.store(y, [i, j], x[[i, j]] + i.cast(F32))          # i as a value, not an index
    assert collapse_loops(kb.kernel) == 0
    kb = KernelBuilder("if_var", [x, y])
    with kb.grid((4, 8)) as (i, j):
        with kb.if_(j < 5):                                   # j compared
            kb.store(y, [i, j], x[[i, j]])
    assert collapse_loops(kb.kernel) == 0
    kb = KernelBuilder("div_var", [x, y])
    with kb.grid((4, 8)) as (i, j):
        kb.store(y, [i, j], x.flat((i * 8 + j) / 2 * 2))      # a division of a collapsible index
    k = kb.kernel
    assert collapse_loops(k) == 1 and _extents(k) == [32]
    xa, ya = _rand(4, 8), np.full((4, 8), np.nan, np.float32)
    _run_native(k, [xa, ya])
    np.testing.assert_array_equal(ya.ravel(), xa.ravel()[np.arange(32) // 2 * 2])


def test_collapse_loops_sees_a_shared_term_used_alone():
    # t = i * 8 is both a whole index (y's first column) and a term of i * 8 + j: no collapse
    x, y, z = Buffer("x", F32, (4, 8)), Buffer("y", F32, (4, 8)), Buffer("z", F32, (4, 8))
    kb = KernelBuilder("shared", [x, y, z])
    with kb.grid((4, 8)) as (i, j):
        t = i * 8
        kb.store(y, t + j, x.flat(t + j))
        kb.store(z, t + j, x.flat(t))
    assert collapse_loops(kb.kernel) == 0


def test_collapse_loops_leaves_parallel_loops_and_their_chunks():
    k = default_schedule(_copy_kernel((1, 56, 56, 96), (1, 53, 56, 96), lambda i: [i[0], i[1] + 3, i[2], i[3]]))
    (par,) = parallel_loops(k)
    assert collapse_loops(k) == 1
    assert parallel_loops(k) == [par] and _extents(k) == [1, 53, 56 * 96]
    verify_schedule(k)
    xa = _rand(1, 56, 56, 96)
    for n in (1, 2, 3):
        ya = np.full((1, 53, 56, 96), np.nan, np.float32)
        _run_native(k, [xa, ya], threads=n)
        np.testing.assert_array_equal(ya, xa[:, 3:])


def _slices_model() -> onnx.ModelProto:
    """x [1, 6, 10, 32] -> rows 2..4 (contiguous), every other column (strided), and x @ w."""
    i64 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)     # noqa: E731
    w = numpy_helper.from_array(_rand(32, 48), "w")
    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "a0"], ["rows"]),
             helper.make_node("Slice", ["x", "s1", "e1", "a1", "st1"], ["cols"]),
             helper.make_node("MatMul", ["x", "w"], ["mm"])]
    inits = [w, i64("s0", [2]), i64("e0", [5]), i64("a0", [1]),
             i64("s1", [1]), i64("e1", [10]), i64("a1", [2]), i64("st1", [2])]
    return _model(nodes, "slices", [("x", [1, 6, 10, 32])],
                  [("rows", [1, 3, 10, 32]), ("cols", [1, 6, 5, 32]), ("mm", [1, 6, 10, 48])], inits)


def test_generic_kernels_are_collapsed_and_their_outer_loops_not_unrolled():
    """Compiled for llvm: the contiguous Slice is one loop; the strided one keeps two loops,
    and a loop that holds a loop carries ``llvm.loop.unroll.disable`` (LLVM unrolled such short
    outer loops around vectorised copies: many times the compile time, no faster code); the
    hand-scheduled MatMul's loops carry no loop metadata. Results against onnxruntime."""
    m = _slices_model()
    mod = tensorfuse.compile(m, cache=False)
    by_op = {c.ops[0]: next(k for k in mod.kernels if k.name == c.kernel) for c in mod.calls
             if c.ops and c.ops[0] in ("Slice", "MatMul")}
    rows, cols = [next(k for k in mod.kernels if k.name == c.kernel) for c in mod.calls if c.ops == ["Slice"]]
    assert rows.schedule == cols.schedule == "generic"
    assert _extents(rows) == [3 * 10 * 32]
    assert _extents(cols) == [6 * 5, 32]          # rows and every other column walk on; channels not
    text = mod.llvm_ir
    assert "!llvm.loop" not in function_ir(text, rows.name)
    assert function_ir(text, cols.name).count("!llvm.loop") == 1     # the loop around the innermost
    assert '!"llvm.loop.unroll.disable"' in text
    mm = by_op["MatMul"]
    assert mm.schedule != "generic" and "!llvm.loop" not in function_ir(text, mm.name)
    x = _rand(1, 6, 10, 32)
    for u, r in zip(mod.run(x=x), ort_run(m, {"x": x})):
        np.testing.assert_allclose(u, r, rtol=RTOL, atol=ATOL)
