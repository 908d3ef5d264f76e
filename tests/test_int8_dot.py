"""The kernel IR's integer dot-product-accumulate (:class:`ir.kernel.DotAcc`): every instruction
form the LLVM backend emits (VPDPBUSD at 8 and 16 lanes, VPMADDWD, the plain-IR form at any
width) against the numpy evaluator (``ir.semantics``), on edge values: u8 255 times i8 -128 and
127 everywhere (where VPMADDUBSW's pairwise int16 sums would saturate), and int32 wrap-around
of the accumulator. The forms a host lacks are compiled and their assembly inspected."""
from __future__ import annotations

import re

import numpy as np
import pytest
from llvmlite import ir as lir

from test_semantics import run_llvm
from tensorfuse.codegen.llvm.emit import emit_entry, emit_kernel, kernel_is_parallel
from tensorfuse.codegen.llvm.jit import compile_ir
from tensorfuse.ir import semantics as sem
from tensorfuse.ir.kernel import Buffer, KernelBuilder, dot_acc
from tensorfuse.ir.target import Target
from tensorfuse.ir.types import DType

HOST = Target.parse("llvm")


def _kernel(lanes: int, n: int, packing: str, isa: str):
    """out[i*lanes : +lanes] = dot_acc(acc[..], a[..], b[..]) for i < n."""
    acc, a, b = (Buffer(nm, DType.i32, (n * lanes,)) for nm in ("acc", "a", "b"))
    out = Buffer("out", DType.i32, (n * lanes,))
    kb = KernelBuilder(f"dot_{packing}_{isa or 'ir'}_{lanes}", [acc, a, b, out])
    with kb.loop(n, hint="i") as i:
        e = dot_acc(acc.vload(i * lanes, lanes), a.vload(i * lanes, lanes), b.vload(i * lanes, lanes), packing, isa)
        kb.store(out, i * lanes, e) if lanes == 1 else kb.store(out, i * lanes, e)
    return kb.kernel, (acc, a, b, out)


def _pack(x: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(x.astype(dtype)).view(np.int32)


def _operands(lanes: int, n: int, packing: str, rng):
    g = 4 if packing == "u8s8" else 2
    if packing == "u8s8":
        a = rng.integers(0, 256, (n * lanes * g,))
        b = rng.integers(-128, 128, (n * lanes * g,))
        a[: lanes * g] = 255                       # the saturation edge of VPMADDUBSW
        b[: lanes * g: 2], b[1: lanes * g: 2] = -128, 127
        if n > 1:
            a[lanes * g: 2 * lanes * g], b[lanes * g: 2 * lanes * g] = 255, -128
        pa, pb = _pack(a, np.uint8), _pack(b, np.int8)
    else:
        a = rng.integers(-32768, 32768, (n * lanes * g,))
        b = rng.integers(-32768, 32768, (n * lanes * g,))
        a[: lanes * g] = b[: lanes * g] = -32768  # VPMADDWD's one overflowing pair: wraps
        pa, pb = _pack(a, np.int16), _pack(b, np.int16)
    acc = rng.integers(-2**31, 2**31, (n * lanes,)).astype(np.int32)
    acc[:2] = [2**31 - 1, -2**31]                   # the add wraps
    return acc, pa, pb


def _host_has(isa: str) -> bool:
    return {"vnni": "avx512vnni", "pmaddwd": "avx2", "": "sse2"}[isa] in HOST.feature_set


FORMS = [(16, "u8s8", "vnni"), (8, "u8s8", "vnni"), (8, "s16s16", "pmaddwd"), (16, "s16s16", "pmaddwd"),
         (1, "u8s8", ""), (16, "u8s8", ""), (8, "s16s16", ""), (4, "s16s16", "")]


@pytest.mark.parametrize("lanes,packing,isa", FORMS)
def test_dot_acc_forms_match_the_evaluator(lanes, packing, isa):
    if isa == "vnni" and not _host_has("vnni"):
        pytest.skip("host lacks avx512vnni (test_dot_acc_forms_compile_to covers the code)")
    if isa == "pmaddwd" and lanes == 16 and "avx512bw" not in HOST.feature_set:
        pytest.skip("host lacks avx512bw")
    n = 3
    kernel, (accb, ab, bb, _) = _kernel(lanes, n, packing, isa)
    acc, a, b = _operands(lanes, n, packing, np.random.default_rng(lanes))
    (got,) = run_llvm(kernel, [acc, a, b], [((n * lanes,), np.int32)])
    want = sem.dot_acc_ref(acc, a, b, packing)
    np.testing.assert_array_equal(got, want)
    # and the evaluator is the formula: exact products, the add wrapping modulo 2**32
    g = 4 if packing == "u8s8" else 2
    ta, tb = (np.uint8, np.int8) if packing == "u8s8" else (np.int16, np.int16)
    exact = acc.astype(np.int64) + (a.view(ta).astype(np.int64) * b.view(tb).astype(np.int64)).reshape(-1, g).sum(1)
    np.testing.assert_array_equal(want, exact.astype(np.uint32).view(np.int32))


def test_dot_acc_edge_is_exact_not_saturated():
    # 255 * 127 * 2 = 64770 does not fit int16: a VPMADDUBSW pair would saturate to 32767
    a = _pack(np.full(64, 255), np.uint8)
    b = _pack(np.tile([127, 127, -128, -128], 16), np.int8)
    b2 = _pack(np.full(64, 127), np.int8)
    assert (sem.dot_acc_ref(np.zeros(16, np.int32), a, b2, "u8s8") == 4 * 255 * 127).all()
    assert (sem.dot_acc_ref(np.zeros(16, np.int32), a, b, "u8s8") == 255 * (254 - 256)).all()


def _asm(kernel, target: Target) -> str:
    mod = lir.Module(name="asm")
    emit_kernel(mod, kernel)
    emit_entry(mod, "tf_run", [(kernel.name, list(range(len(kernel.params))))], {kernel.name: kernel_is_parallel(kernel)})
    from tensorfuse.codegen.llvm.jit import target_machine
    import llvmlite.binding as llvm
    _, _, opt = compile_ir(str(mod), "asm", target=target)
    return target_machine(target).emit_assembly(llvm.parse_assembly(opt))


@pytest.mark.parametrize("lanes,packing,isa,mattr,insn", [
    (16, "u8s8", "vnni", "+avx512f,+avx512bw,+avx512vl,+avx512vnni", r"vpdpbusd\s[^\n]*%zmm"),
    (8, "u8s8", "vnni", "+avx512f,+avx512bw,+avx512vl,+avx512vnni", r"vpdpbusd\s[^\n]*%ymm"),
    (8, "s16s16", "pmaddwd", "-avx512f,+avx2", r"vpmaddwd\s"),
    (16, "s16s16", "pmaddwd", "+avx512f,+avx512bw", r"vpmaddwd\s"),
])
def test_dot_acc_forms_compile_to(lanes, packing, isa, mattr, insn):
    """Each instruction form on a target that has it, whatever this host has: the assembly
    holds the instruction."""
    kernel, _ = _kernel(lanes, 2, packing, isa)
    asm = _asm(kernel, Target.parse(f"llvm -mcpu=x86-64-v3 -mattr={mattr}"))
    assert re.search(insn, asm), asm[:2000]


@pytest.mark.parametrize("packing", ["u8s8", "s16s16"])
def test_dot_acc_cuda_renderer_scalarises(packing, tmp_path, monkeypatch):
    """The cuda backend renders DotAcc lane by lane (under the CUDA simulator): the same
    results as the evaluator, edge values included."""
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    from numba import config
    if not config.ENABLE_CUDASIM:
        pytest.skip("numba was imported without the CUDA simulator (run with NUMBA_ENABLE_CUDASIM=1)")
    from numba import cuda
    from tensorfuse.codegen.cuda.jit import build_library
    lanes, n = 4, 3
    acc, a, b = _operands(lanes, n, packing, np.random.default_rng(7))
    accb, ab, bb = (Buffer(nm, DType.i32, (n * lanes,)) for nm in ("acc", "a", "b"))
    out = Buffer("out", DType.i32, (n * lanes,))
    kb = KernelBuilder(f"cuda_dot_{packing}", [accb, ab, bb, out])
    with kb.loop(n, role="spatial") as i:
        kb.store(out, i * lanes, dot_acc(accb.vload(i * lanes, lanes), ab.vload(i * lanes, lanes),
                                         bb.vload(i * lanes, lanes), packing))
    lib = build_library([kb.kernel], cache_dir=str(tmp_path), block=32, max_blocks=1)
    dev = [cuda.to_device(x) for x in (acc, a, b, np.zeros(n * lanes, np.int32))]
    lib.launch(kb.kernel.name, dev)
    cuda.synchronize()
    np.testing.assert_array_equal(dev[3].copy_to_host(), sem.dot_acc_ref(acc, a, b, packing))


@pytest.mark.parametrize("dst", [DType.u8, DType.i8, DType.u16, DType.i16])
@pytest.mark.parametrize("src", [DType.f32, DType.f64])
def test_vector_float_to_narrow_int_saturates(src, dst):
    """The vector form of a saturating float -> 8/16-bit cast (the QuantizeLinear epilogue's
    last step; the LLVM backend clamps and converts through i32 rather than let LLVM scalarise
    llvm.fpto[su]i.sat) against the evaluator: NaN -> 0, out of range -> the bounds,
    truncation toward zero."""
    vals = np.array([np.nan, -np.inf, np.inf, -0.0, 0.5, -0.5, -1.5, 126.9, 127.5, 128.0, -128.7, -129.0,
                     254.6, 255.4, 256.0, 300.0, 32767.5, 32768.0, -32768.9, 65535.2, 65536.0, 1e10,
                     -1e10, 3.0, 7.99, -7.99, 100.0, 200.0, 1000.0, -1000.0, 40000.0, 0.0], src.numpy)
    n = vals.size
    xb, yb = Buffer("x", src, (n,)), Buffer("y", dst, (n,))
    kb = KernelBuilder(f"cast_{src.value}_{dst.value}", [xb, yb])
    with kb.loop(n // 16, hint="i") as i:
        kb.store(yb, i * 16, xb.vload(i * 16, 16).cast(dst))
    (got,) = run_llvm(kb.kernel, [vals], [((n,), dst.numpy)])
    want = sem.evaluate(xb.vload(0, n).cast(dst), {xb: vals})
    np.testing.assert_array_equal(got, want.reshape(-1))
