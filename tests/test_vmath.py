"""codegen.llvm.vmath: float32 exp, log, erf, tanh, sigmoid against float64 numpy / math.erf.

Each function is emitted in a loop over a float array three ways (scalar, <8 x float>,
<16 x float>; LLVM splits the wide vectors on AVX2 or SSE targets), compiled with
codegen.llvm.jit and called through ctypes. The error is in ulp of the float32 result (2^-149
for denormal results). The bounds asserted are those the docstrings of vmath state. A second
build for a target without FMA (x86-64-v2) checks that the bounds hold when llvm.fmuladd is not
fused.
"""
from __future__ import annotations

import ctypes
import functools
import math
import platform

import numpy as np
import pytest
from llvmlite import ir

from tensorfuse.codegen.llvm import jit, vmath
from tensorfuse.ir.ops._common import erf_np

F32 = ir.FloatType()
I64 = ir.IntType(64)
PTR = ir.PointerType()
WIDTHS = (1, 8, 16)
OPS = vmath.OPS

#: max error in ulp asserted per op: the bounds vmath's docstrings state
ULP_BOUND = vmath.MAX_ULP


def build_module(widths=WIDTHS, ops=OPS, avx512: bool = False) -> ir.Module:
    """``void @<op>_w<W>(ptr in, ptr out, i64 n)``: out[i] = op(in[i]) for i < n, n a multiple
    of W, W floats per iteration (W = 1: scalar float). ``avx512``: vmath may use AVX-512
    instructions (``emit_unary``'s flag)."""
    m = ir.Module(name="vmath_test")
    for op in ops:
        for w in widths:
            t = F32 if w == 1 else ir.VectorType(F32, w)
            fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64]), name=f"{op}_w{w}")
            src, dst, n = fn.args
            entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
            b = ir.IRBuilder(entry)
            b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), loop, done)
            b.position_at_end(loop)
            i = b.phi(I64)
            i.add_incoming(ir.Constant(I64, 0), entry)
            p_in = b.gep(src, [i], source_etype=F32)
            p_out = b.gep(dst, [i], source_etype=F32)
            y = vmath.emit_unary(b, op, b.load(p_in, typ=t, align=4), avx512)
            b.store(y, p_out, align=4)
            nxt = b.add(i, ir.Constant(I64, w))
            i.add_incoming(nxt, loop)
            b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
            b.position_at_end(done)
            b.ret_void()
    return m


class Kernels:
    def __init__(self, lib, opt_ir: str = "", asm: str = ""):
        self.lib = lib
        self.opt_ir = opt_ir
        self.asm = asm
        self._fns = {}

    def __call__(self, op: str, x: np.ndarray, width: int = 1) -> np.ndarray:
        key = (op, width)
        if key not in self._fns:
            proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
            self._fns[key] = proto(self.lib.address(f"{op}_w{width}"))
        x = np.ascontiguousarray(x, np.float32)
        n = -(-x.size // width) * width
        src = np.zeros(n, np.float32)
        src[:x.size] = x.ravel()
        dst = np.empty(n, np.float32)
        self._fns[key](src.ctypes.data, dst.ctypes.data, n)
        return dst[:x.size].reshape(x.shape)


@functools.lru_cache(maxsize=None)
def kernels() -> Kernels:
    lib, _, opt_ir = jit.compile_ir(str(build_module()), name="vmath_test")
    return Kernels(lib, opt_ir)


@functools.lru_cache(maxsize=None)
def kernels_nofma() -> Kernels:
    """The same module for an x86-64-v2 CPU (SSE4.2, no FMA): llvm.fmuladd is a mul and an add."""
    import llvmlite.binding as llvm
    jit._init()
    mod = jit.parse_and_verify(str(build_module()), "vmath_test_nofma")
    tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(
        cpu="x86-64-v2", features="", opt=3, reloc="pic", codemodel="jitdefault")
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return Kernels(jit.load_object(tm.emit_object(mod)), str(mod), tm.emit_assembly(mod))


# ----------------------------------------------------------------------------- references
def _sigmoid64(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


REF = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": _sigmoid64, "erf": erf_np}


def reference(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REF[op](x.astype(np.float64))


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in ulp of float32 at ref (finite ref within float32 range only)."""
    _, e = np.frexp(np.abs(ref))
    ulp = np.ldexp(1.0, np.maximum(e - 24, -149))
    return np.abs(y.astype(np.float64) - ref) / ulp


F32_MAX = float(np.finfo(np.float32).max)
OVER = F32_MAX * (1 + 2.0 ** -25)      # float64 values at or above round to inf in float32


def check(op: str, x: np.ndarray, y: np.ndarray, bound: float, ref: np.ndarray | None = None) -> float:
    """Special values exactly, the rest within ``bound`` ulp; returns the max ulp error."""
    ref = reference(op, x) if ref is None else ref
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(y), nan), (op, x[np.isnan(y) != nan][:5])
    big = np.abs(ref) >= OVER
    assert np.array_equal(y[big], np.where(ref[big] > 0, np.inf, -np.inf).astype(np.float32)), op
    ok = ~nan & ~big
    assert np.all(np.isfinite(y[ok])), (op, x[ok][~np.isfinite(y[ok])][:5])
    err = ulp_error(y[ok], ref[ok])
    worst = float(err.max()) if err.size else 0.0
    if worst > bound:
        i = int(np.argmax(err))
        raise AssertionError(f"{op}: {worst:.3f} ulp at x={x[ok][i]!r} (y={y[ok][i]!r}, "
                             f"ref={ref[ok][i]!r}), bound {bound}")
    return worst


# ----------------------------------------------------------------------------- inputs
def _bits_sample(lo_exp: int, hi_exp: int, per_exp: int, seed: int) -> np.ndarray:
    """Positive float32 with biased exponent lo_exp..hi_exp, per_exp random mantissas each
    (and the mantissa extremes)."""
    rng = np.random.default_rng(seed)
    e = np.repeat(np.arange(lo_exp, hi_exp + 1, dtype=np.uint32), per_exp)
    mant = rng.integers(0, 1 << 23, e.size, dtype=np.uint32)
    mant[::per_exp] = 0
    mant[1::per_exp] = (1 << 23) - 1
    return ((e << 23) | mant).view(np.float32)


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 2.0 ** -149,
                     -(2.0 ** -149), 2.0 ** -126, F32_MAX, -F32_MAX, 1e-30, -1e-30],
                    np.float32)


@functools.lru_cache(maxsize=None)
def inputs(op: str) -> np.ndarray:
    tiny = _bits_sample(0, 126, 512, 1)                      # denormals and |x| < 1, both signs
    allexp = _bits_sample(0, 254, 1024, 2)
    common = [SPECIALS, tiny, -tiny, allexp, -allexp]
    if op == "exp":
        dense = [np.linspace(-110, 100, 2_000_001, dtype=np.float32),
                 np.linspace(-104.5, -86, 200_001, dtype=np.float32),   # underflow edge
                 np.linspace(88, 89, 100_001, dtype=np.float32)]        # overflow edge
    elif op == "log":
        dense = [np.linspace(0.5, 2.0, 1_000_001, dtype=np.float32),    # around 1
                 _bits_sample(0, 254, 4096, 3)]                         # all exponents
    elif op == "sigmoid":
        dense = [np.linspace(-110, 40, 1_000_001, dtype=np.float32),
                 np.linspace(-104.5, -86, 100_001, dtype=np.float32)]
    elif op == "tanh":
        dense = [np.linspace(-12, 12, 1_000_001, dtype=np.float32),
                 np.linspace(0.9, 1.1, 100_001, dtype=np.float32)]      # branch point
    else:
        dense = [np.linspace(-4.5, 4.5, 400_001, dtype=np.float32),
                 np.linspace(0.9, 1.1, 50_001, dtype=np.float32)]
    return np.concatenate(common + dense)


@functools.lru_cache(maxsize=None)
def inputs_and_reference(op: str):
    x = inputs(op)
    return x, reference(op, x)


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("op", OPS)
def test_accuracy(op, width):
    x, ref = inputs_and_reference(op)
    check(op, x, kernels()(op, x, width), ULP_BOUND[op], ref)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
@pytest.mark.parametrize("op", OPS)
def test_accuracy_without_fma(op):
    k = kernels_nofma()
    assert "fmuladd" in k.opt_ir and "fma" not in k.asm.replace("fmuladd", "")
    x, ref = inputs_and_reference(op)
    for w in (1, 8):
        check(op, x, k(op, x, w), ULP_BOUND[op], ref)


def test_widths_agree():
    """Scalar and vector code compute the same function (bit for bit)."""
    k = kernels()
    for op in OPS:
        x = np.linspace(-20, 20, 4001, dtype=np.float32)
        y1 = k(op, x, 1)
        for w in (8, 16):
            np.testing.assert_array_equal(k(op, x, w), y1, err_msg=f"{op} w={w}")


def test_special_values():
    k = kernels()
    inf, nan = np.inf, np.nan
    cases = {
        "exp": ([-inf, inf, nan, 0.0, -0.0, 88.72, 88.73, -103.0, -104.0, -200.0, 1000.0],
                [0.0, inf, nan, 1.0, 1.0, None, inf, None, 0.0, 0.0, inf]),
        "log": ([0.0, -0.0, -1.0, -inf, inf, nan, 1.0, 2.0 ** -149, F32_MAX],
                [-inf, -inf, nan, nan, inf, nan, 0.0, None, None]),
        "erf": ([inf, -inf, nan, 0.0, -0.0, 4.0, 10.0, -10.0], [1.0, -1.0, nan, 0.0, -0.0, 1.0, 1.0, -1.0]),
        "tanh": ([inf, -inf, nan, 0.0, -0.0, 1e-30, -1e-30, 2.0 ** -149, 50.0, -50.0, 1e30],
                 [1.0, -1.0, nan, 0.0, -0.0, 1e-30, -1e-30, 2.0 ** -149, 1.0, -1.0, 1.0]),
        "sigmoid": ([-inf, inf, nan, 0.0, 200.0, -200.0, 1e30, -1e30, -100.0],
                    [0.0, 1.0, nan, 0.5, 1.0, 0.0, 1.0, 0.0, None]),
    }
    for op, (xs, want) in cases.items():
        x = np.array(xs, np.float32)
        for w in WIDTHS:
            y = k(op, x, w)
            for xi, yi, wi in zip(x, y, want):
                if wi is None:
                    continue
                wi = np.float32(wi)
                assert (np.isnan(wi) and np.isnan(yi)) or (yi == wi and np.signbit(yi) == np.signbit(wi)), \
                    (op, w, xi, yi, wi)
    # a denormal result below exp's normal range, and sigmoid's tail (numpy's float32 gives 0)
    assert k("exp", np.array([-100.0], np.float32))[0] == np.float32(math.exp(-100.0))
    assert k("sigmoid", np.array([-100.0], np.float32))[0] == np.float32(math.exp(-100.0))


def test_odd_functions():
    k = kernels()
    x = np.concatenate([np.linspace(0, 10, 20001, dtype=np.float32), _bits_sample(0, 140, 16, 5)])
    for op in ("erf", "tanh"):
        for w in WIDTHS:
            np.testing.assert_array_equal(k(op, -x, w), -k(op, x, w))


def _host_has_avx512() -> bool:
    from tensorfuse.ir.target import Target
    return platform.machine().lower() in ("x86_64", "amd64") and Target.parse("llvm").has_avx512


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
def test_avx512_scalef_exp_matches_the_generic_code_bit_for_bit():
    """With ``avx512`` the 16-lane exp (and tanh, erf, sigmoid, which call it) scales by 2^k
    with VSCALEFPS, rounding once as the two exponent-bit factors do: the same float32 result
    for every input, the overflow, denormal and zero ranges, +-inf and NaN included. On a host
    without AVX-512 the module is compiled for skylake-avx512 and only its assembly checked."""
    import llvmlite.binding as llvm
    jit._init()
    mod = jit.parse_and_verify(str(build_module(widths=(16,), avx512=True)), "vmath_scalef")
    tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(
        cpu="skylake-avx512", features="", opt=3, reloc="pic", codemodel="jitdefault")
    asm = tm.emit_assembly(mod)
    assert "vscalefps" in asm
    if not _host_has_avx512():
        return
    fast = Kernels(jit.load_object(tm.emit_object(mod)))
    special = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 88.72, 88.7228, 88.73, 89.0, -87.33, -100.0,
                        -103.9, -103.98, -104.0, -200.0, 1e30, -1e30], np.float32)
    bits = _bits_sample(0, 255, 32, 7)
    x = np.concatenate([special, np.linspace(-110, 95, 400_001, dtype=np.float32), bits, -bits])
    for op in OPS:
        a, b = fast(op, x, 16), kernels()(op, x, 16)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        assert same.all() and (np.signbit(a) == np.signbit(b)).all(), (op, x[~same][:5], a[~same][:5], b[~same][:5])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
@pytest.mark.parametrize("avx512", [False, True])
def test_exp_of_a_zero_result_does_not_underflow(avx512):
    """exp(x) for x below -104 (masked or padding scores: -inf, -10000) is the constant 0,
    not the result of arithmetic that underflows: an underflowing result costs x86 a
    microcode assist (measured 15x the time of exp itself). Read as the MXCSR underflow flag
    (UE, bit 4) after a native loop over such inputs, which stays clear; a true denormal
    result (x = -95) still raises it, so the check can fail."""
    import llvmlite.binding as llvm
    if avx512 and not _host_has_avx512():
        pytest.skip("the host has no AVX-512")
    i32 = ir.IntType(32)
    m = build_module(widths=(16,), ops=("exp",), avx512=avx512)
    fn = ir.Function(m, ir.FunctionType(i32, [PTR, PTR, I64]), name="exp_flags")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    st = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR]), name="llvm.x86.sse.stmxcsr")
    ld = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR]), name="llvm.x86.sse.ldmxcsr")
    slot = b.alloca(i32)
    b.call(st, [slot])
    b.store(b.and_(b.load(slot), ir.Constant(i32, ~0x3F)), slot)      # clear the exception flags
    b.call(ld, [slot])
    b.call(m.globals["exp_w16"], list(fn.args))
    b.call(st, [slot])
    b.ret(b.load(slot))
    jit._init()
    mod = jit.parse_and_verify(str(m), "vmath_flags")
    tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(
        cpu=llvm.get_host_cpu_name() if avx512 else "x86-64-v3", features="", opt=3, reloc="pic",
        codemodel="jitdefault")
    lib = jit.load_object(tm.emit_object(mod))
    call = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(lib.address("exp_flags"))

    def flags(values):
        x = np.array(values * 16, np.float32)
        y = np.empty_like(x)
        return call(x.ctypes.data, y.ctypes.data, x.size), y
    got, y = flags([-np.inf, -10000.0, -104.5, -200.0, -1e30, 0.0, -1.0, 50.0])
    assert not got & 0x10, hex(got)
    np.testing.assert_array_equal(y[:5], 0.0)
    got, y = flags([-95.0])
    assert got & 0x10 and y[0] == np.float32(math.exp(-95.0)), (hex(got), y[0])


def test_other_ops_and_types_return_none():
    m = ir.Module()
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), []), name="f")
    b = ir.IRBuilder(fn.append_basic_block())
    assert vmath.emit_unary(b, "sin", ir.Constant(F32, 1.0)) is None
    assert vmath.emit_unary(b, "exp", ir.Constant(ir.DoubleType(), 1.0)) is None
    assert vmath.emit_unary(b, "exp", ir.Constant(ir.VectorType(ir.DoubleType(), 4), [1.0] * 4)) is None
    assert vmath.emit_unary(b, "exp", ir.Constant(ir.IntType(32), 1)) is None


def test_straight_line_and_vectorised():
    """The emitted code has no branches or calls but intrinsics, and the scalar loop vectorises."""
    m = build_module(widths=(1, 8))
    for fn in m.functions:
        if fn.is_declaration:
            assert fn.name.startswith("llvm."), fn.name
            assert fn.name.endswith((".f32", ".v8f32")), fn.name
        else:
            assert len(fn.blocks) == 3        # the test loop's own blocks only
    opt = kernels().opt_ir
    for op in OPS:
        body = opt.split(f'@"{op}_w1"(' if f'@"{op}_w1"(' in opt else f"@{op}_w1(", 1)[1].split("\n}", 1)[0]
        assert "x float>" in body, op
        for name in ("expf", "logf", "erff", "tanhf", "@exp(", "@log("):
            assert name not in body, (op, name)
