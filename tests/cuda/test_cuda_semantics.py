"""The cuda emitter's expression semantics against the LLVM emitter's, op by op and dtype by
dtype, on edge values (zeros of both signs, NaN, infinities, INT_MIN, -1, shift widths ...):
the same kernel IR runs through ``codegen/llvm`` on the CPU and through ``codegen/cuda`` on the
CUDA simulator, and the results must be identical bit for bit (transcendental functions, where
the CPU's vector math and the GPU's libdevice differ in the last bits, within a tolerance)."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import ctypes
import itertools

import numpy as np
import pytest
from llvmlite import ir as lir

from tensorfuse.codegen.cuda.jit import build_library
from tensorfuse.codegen.llvm.emit import emit_entry, emit_kernel
from tensorfuse.codegen.llvm.jit import compile_ir
from tensorfuse.ir.kernel import Buffer, Cast, KernelBuilder, binop, unop
from tensorfuse.ir.types import DType

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

INT_OPS = ["add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor", "shl", "shr", "pow",
           "lt", "le", "eq", "ne"]
INT_UN = ["neg", "not", "abs"]
FLOAT_OPS = ["add", "sub", "mul", "div", "rem", "min", "max", "lt", "le", "gt", "ge", "eq", "ne", "pow", "atan2"]
FLOAT_UN = ["neg", "abs", "sqrt", "floor", "ceil", "round", "trunc", "isnan", "isinf", "exp", "log", "tanh",
            "erf", "sin"]
APPROX = {"exp", "log", "tanh", "erf", "sin", "pow", "atan2"}


def edge_values(dt: DType) -> np.ndarray:
    npd = dt.numpy
    if dt.is_float:
        big = 6e4 if dt == DType.f16 else 1e30
        v = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.7, -3.7, np.inf, -np.inf, np.nan, big, -big,
             1e-3, 300.0, -129.5, 65535.9]
        return np.array(v, np.float64).astype(npd)
    info = np.iinfo(npd)
    w = dt.itemsize * 8
    v = [0, 1, 2, 3, 7, w - 1, w, info.max, info.max - 1]
    if dt.is_signed:
        v += [-1, -2, -7, info.min, info.min + 1, -w]
    return np.array(v, dtype=object).astype(npd)


def _run_llvm(kernel, arrays):
    mod = lir.Module(name="sem")
    emit_kernel(mod, kernel)
    emit_entry(mod, "tf_run", [(kernel.name, list(range(len(arrays))))], {kernel.name: False})
    lib, _, _ = compile_ir(str(mod), "sem")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(lib.address("tf_run"))
    table = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    fn(ctypes.addressof(table), None)


def _run_cuda(kernel, arrays, tmp_path):
    from numba import cuda
    lib = build_library([kernel], cache_dir=str(tmp_path), block=32, max_blocks=1)
    dev = [cuda.to_device(a) for a in arrays]
    lib.launch(kernel.name, dev)
    cuda.synchronize()
    return [d.copy_to_host() for d in dev]


def _same(a, b, approx=False):
    if a.dtype.kind == "f":
        if approx:
            return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=2e-3 if a.dtype == np.float16
                               else 1e-5, atol=1e-6, equal_nan=True)
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        nan = np.isnan(a) & np.isnan(b)        # any NaN equals any NaN (payloads may differ)
        return bool(np.all(nan | (a.view(bits) == b.view(bits))))
    return np.array_equal(a, b)


def _differential(name, dt, exprs, tmp_path, out_dtypes, approx):
    """Kernel ``name`` storing ``exprs[k](a[i], b[i])`` into output k for every edge pair."""
    v = edge_values(dt)
    pa, pb = (np.array(t, dtype=dt.numpy) for t in zip(*itertools.product(v, v)))
    n = len(pa)
    a, b = Buffer("a", dt, (n,)), Buffer("b", dt, (n,))
    outs = [Buffer(f"y{k}", od, (n,)) for k, od in enumerate(out_dtypes)]
    kb = KernelBuilder(name, [a, b] + outs)
    with kb.loop(n, role="spatial") as i:
        for o, f in zip(outs, exprs):
            kb.store(o, i, f(a[i], b[i]))
    arrays = [pa, pb] + [np.zeros(n, o.dtype.numpy) for o in outs]
    cpu = [x.copy() for x in arrays]
    _run_llvm(kb.kernel, cpu)
    gpu = _run_cuda(kb.kernel, [x.copy() for x in arrays], tmp_path)
    bad = []
    for k, (c, g) in enumerate(zip(cpu[2:], gpu[2:])):
        if not _same(c, g, approx[k]):
            i = int(np.argmax(~((c == g) | (np.isnan(c.astype(np.float64)) & np.isnan(g.astype(np.float64))))))
            bad.append(f"{approx[k] if isinstance(approx[k], str) else k}: a={pa[i]!r} b={pb[i]!r} llvm={c[i]!r} cuda={g[i]!r}")
    return bad


INT_DTYPES = [DType.i8, DType.i16, DType.i32, DType.i64, DType.u8, DType.u32, DType.u64]


@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.value)
def test_integer_ops_match_llvm(dt, tmp_path):
    exprs, outs, labels = [], [], []
    for op in INT_OPS:
        exprs.append(lambda x, y, op=op: binop(op, x, y))
        outs.append(DType.bool if op in ("lt", "le", "eq", "ne") else dt)
        labels.append(op)
    for op in INT_UN:
        exprs.append(lambda x, y, op=op: unop(op, x))
        outs.append(dt)
        labels.append(op)
    bad = _differential(f"int_{dt.value}", dt, exprs, tmp_path, outs, [False] * len(outs))
    assert not bad, "\n".join(f"{labels[int(b.split(':')[0])]}{b[b.index(':'):]}" for b in bad)


@pytest.mark.parametrize("dt", [DType.f16, DType.f32, DType.f64], ids=lambda d: d.value)
def test_float_ops_match_llvm(dt, tmp_path):
    exprs, outs, labels = [], [], []
    for op in FLOAT_OPS:
        exprs.append(lambda x, y, op=op: binop(op, x, y))
        outs.append(DType.bool if op in ("lt", "le", "gt", "ge", "eq", "ne") else dt)
        labels.append(op)
    for op in FLOAT_UN:
        exprs.append(lambda x, y, op=op: unop(op, x))
        outs.append(DType.bool if op in ("isnan", "isinf") else dt)
        labels.append(op)
    bad = _differential(f"float_{dt.value}", dt, exprs, tmp_path, outs, [lb in APPROX for lb in labels])
    assert not bad, "\n".join(f"{labels[int(b.split(':')[0])]}{b[b.index(':'):]}" for b in bad)


CAST_DTYPES = [DType.bool, DType.i8, DType.i32, DType.i64, DType.u8, DType.u64, DType.f16, DType.f32, DType.f64]


@pytest.mark.parametrize("src", CAST_DTYPES, ids=lambda d: d.value)
def test_casts_match_llvm(src, tmp_path):
    dsts = [d for d in CAST_DTYPES if d != src]
    exprs = [lambda x, y, d=d: Cast(d, x) for d in dsts]
    if src == DType.bool:
        bad = _differential_bool(exprs, dsts, tmp_path)
    else:
        bad = _differential(f"cast_{src.value}", src, exprs, tmp_path, dsts, [False] * len(dsts))
    assert not bad, "\n".join(f"to {dsts[int(b.split(':')[0])].value}{b[b.index(':'):]}" for b in bad)


def _differential_bool(exprs, dsts, tmp_path):
    n = 2
    a = Buffer("a", DType.bool, (n,))
    outs = [Buffer(f"y{k}", d, (n,)) for k, d in enumerate(dsts)]
    kb = KernelBuilder("cast_bool", [a] + outs)
    with kb.loop(n, role="spatial") as i:
        for o, f in zip(outs, exprs):
            kb.store(o, i, f(a[i], None))
    arrays = [np.array([True, False])] + [np.zeros(n, o.dtype.numpy) for o in outs]
    cpu = [x.copy() for x in arrays]
    _run_llvm(kb.kernel, cpu)
    gpu = _run_cuda(kb.kernel, [x.copy() for x in arrays], tmp_path)
    return [f"{k}: llvm={c!r} cuda={g!r}" for k, (c, g) in enumerate(zip(cpu[1:], gpu[1:])) if not np.array_equal(c, g)]
