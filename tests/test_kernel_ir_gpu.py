"""GPU additions to the kernel IR: loop kinds bound to block and thread indices, shared
buffers, barriers and launch shapes; how they print; the LLVM backend refusing them; the
generic cuda schedule's launches (codegen/cuda/launches.py). No numba needed."""
from __future__ import annotations

import pytest
from llvmlite import ir as lir

from tensorfuse.codegen.llvm.emit import CodegenError, emit_kernel
from tensorfuse.ir.target import Target
from tensorfuse.ir.kernel import Buffer, For, KernelBuilder, LaunchShape, MAX_SHARED_BYTES
from tensorfuse.ir.schedule import default_schedule
from tensorfuse.codegen.cuda.launches import cuda_launches, launch_shape
from tensorfuse.ir.types import DType

F32 = DType.f32


def _block_sum():
    x, y = Buffer("x", F32, (4, 32)), Buffer("y", F32, (4,))
    kb = KernelBuilder("block_sum", [x, y])
    sh = kb.shared(F32, (32,))
    with kb.loop(4, kind="blockIdx.x", hint="b") as b:
        with kb.loop(32, kind="threadIdx.x", hint="t") as t:
            kb.store(sh, t, x[b, t])
        kb.barrier()
        with kb.loop(32, kind="threadIdx.x", hint="t") as t:
            with kb.if_(t.eq(0)):
                with kb.reduce(32) as r:
                    kb.store(y, b, y[b] + sh[r])
    kb.kernel.launch = LaunchShape((4,), (32,))
    return kb.kernel


def test_gpu_kernel_prints_loops_shared_barrier_and_launch():
    text = str(_block_sum())
    assert "  launch grid=(4,) block=(32,)" in text
    assert "  shared sh1: f32[32]" in text
    assert "blockIdx.x for b2 in 0..4:" in text
    assert "threadIdx.x for t3 in 0..32:" in text
    assert "    barrier()" in text


def test_llvm_emitter_refuses_gpu_loop_kinds_and_shared_buffers():
    k = _block_sum()
    with pytest.raises(CodegenError, match="shared"):
        emit_kernel(lir.Module(), k)
    for kind in ("blockIdx.x", "threadIdx.x", "grid_stride"):
        x = Buffer("x", F32, (8,))
        kb = KernelBuilder(f"k_{kind.replace('.', '_')}", [x])
        with kb.loop(8, kind=kind) as i:
            kb.store(x, i, 1.0)
        with pytest.raises(CodegenError, match="GPU loop kind"):
            emit_kernel(lir.Module(), kb.kernel)
    x = Buffer("x", F32, (8,))
    kb = KernelBuilder("k_barrier", [x])
    kb.barrier()
    with pytest.raises(CodegenError, match="barrier"):
        emit_kernel(lir.Module(), kb.kernel)


def test_launch_shape_limits():
    assert LaunchShape((2,), (1024,)).threads == 2048
    with pytest.raises(ValueError, match="1024"):
        LaunchShape((1,), (32, 33))
    with pytest.raises(ValueError):
        LaunchShape((0,), (32,))
    kb = KernelBuilder("k", [])
    kb.shared(F32, (MAX_SHARED_BYTES // 4,))
    with pytest.raises(ValueError, match="shared"):
        kb.shared(F32, (1,))
    with pytest.raises(ValueError, match="static"):
        kb.shared(F32, (0,))
    assert launch_shape(10, 256, 65535) == LaunchShape((1,), (10,))
    assert launch_shape(10_000, 256, 8) == LaunchShape((8,), (256,))


def test_cuda_target_properties():
    t = Target.parse("cuda")
    assert t.lanes(F32) == 1 and t.has_fma and not t.has_avx512
    assert (t.max_threads_per_block, t.max_shared_bytes, t.warp_size) == (1024, 48 * 1024, 32)
    assert t.block_threads == 256 and t.max_blocks == 65535
    with pytest.raises(ValueError):
        Target.parse("llvm").warp_size


def test_generic_schedule_fuses_spatial_nest_into_grid_stride_loop():
    x, y = Buffer("x", F32, (3, 5, 7)), Buffer("y", F32, (3, 5))
    kb = KernelBuilder("rowsum", [x, y])
    with kb.grid(y.shape) as (i, j):
        acc = kb.local(F32)
        kb.store(acc, 0, 0.0)
        with kb.reduce(7) as r:
            kb.store(acc, 0, acc[0] + x[i, j, r])
        kb.store(y, [i, j], acc[0])
    k = default_schedule(kb.kernel)
    (lk,) = cuda_launches(k, 32, 4)
    assert lk.launch == LaunchShape((1,), (15,))
    (top,) = lk.body
    assert isinstance(top, For) and top.kind == "grid_stride" and top.extent.value == 15
    assert [f.role for f in top.body if isinstance(f, For)] == ["reduce"]
    assert lk.locals == k.locals
    assert "grid_stride for g0 in 0..15:" in str(lk)


def test_generic_schedule_statements_and_locals():
    """One launch per statement that writes global memory; a locals-only statement is copied in
    front of the launches that read its locals; a non-spatial statement runs on one thread."""
    x, y, z = Buffer("x", F32, (6,)), Buffer("y", F32, (6,)), Buffer("z", F32, (1,))
    kb = KernelBuilder("k", [x, y, z])
    table = kb.local(F32, (2,), hint="tab")
    kb.store(table, 0, 2.0)
    kb.store(table, 1, 3.0)
    with kb.loop(6, kind="parallel") as i:
        kb.store(y, i, x[i] * table[0])
    kb.store(z, 0, y[0] + table[1])
    l0, l1 = cuda_launches(kb.kernel, 256, 10)
    assert (l0.name, l1.name) == ("k_l0", "k_l1")
    assert l0.launch == LaunchShape((1,), (6,)) and l1.launch == LaunchShape((1,), (1,))
    assert [type(s).__name__ for s in l0.body] == ["Store", "Store", "For"]
    assert [type(s).__name__ for s in l1.body] == ["Store", "Store", "Store"]


def test_generic_schedule_thread0_fills_locals_runs_on_one_thread():
    x, y = Buffer("x", F32, (6,)), Buffer("y", F32, (6,))
    kb = KernelBuilder("k", [x, y])
    t = kb.local(F32, (1,))
    with kb.loop(1):                # fills the local and also writes global memory
        kb.store(t, 0, x[0])
        kb.store(y, 0, x[0])
    with kb.loop(6, kind="parallel") as i:
        kb.store(y, i, x[i] + t[0])
    k = kb.kernel
    (lk,) = cuda_launches(k, 256, 10)
    assert lk.launch == LaunchShape((1,), (1,)) and lk.body == k.body and lk.name == "k"
