"""The kernel IR's expression semantics (ir/semantics.py): unit tests of ``evaluate`` against
values derived by hand from the spec's table (IEEE 754, C), and the LLVM backend checked against
``evaluate`` on every dtype's edge values through the backend-agnostic harness
(tests/expr_cases.py)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir as lir

from expr_cases import GROUPS, build_group, check_backend, pairs
from tensorfuse.codegen.llvm import vmath
from tensorfuse.codegen.llvm.emit import emit_entry, emit_kernel, kernel_is_parallel
from tensorfuse.codegen.llvm.jit import compile_ir
from tensorfuse.ir import semantics as sem
from tensorfuse.ir.kernel import Buffer, Cast, Const, Ramp, Var, binop, broadcast, fma, maxnum, select, unop
from tensorfuse.ir.types import DType


# ----------------------------------------------------------------------------- the LLVM backend
def run_llvm(kernel, inputs, out_shape_dtypes):
    """run_kernel for the harness: the kernel compiled alone by codegen/llvm, called once."""
    mod = lir.Module(name="sem")
    emit_kernel(mod, kernel)
    emit_entry(mod, "tf_run", [(kernel.name, list(range(len(kernel.params))))],
               {kernel.name: kernel_is_parallel(kernel)})
    lib, _, _ = compile_ir(str(mod), "sem")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(lib.address("tf_run"))
    ins = [np.ascontiguousarray(a) for a in inputs]
    outs = [np.zeros(s, d) for s, d in out_shape_dtypes]
    table = (ctypes.c_void_p * (len(ins) + len(outs)))(*[a.ctypes.data for a in ins + outs])
    fn(ctypes.addressof(table), None)
    return outs


#: the LLVM backend's own, tighter bounds: the inline float32 exp/log/erf/tanh (vmath.MAX_ULP)
LLVM_ULP = {(op, DType.f32): b for op, b in vmath.MAX_ULP.items()}


@pytest.mark.parametrize("group", GROUPS, ids=["_".join(map(str, g)) for g in GROUPS])
def test_llvm_expressions_meet_the_spec(group):
    n = check_backend(run_llvm, groups=[group], ulp=LLVM_ULP)
    assert n >= 4 * len(build_group(*group[:2]).outs)


def test_harness_reports_a_wrong_backend_result():
    # a "backend" that is the spec itself except that integer division by zero gives -1
    def wrong(kernel, inputs, out_shape_dtypes):
        g = build_group(DType.i32, 1)
        env = {g.params_in[k]: inputs[k] for k in range(3)}
        env[g.loop_var] = np.arange(g.n)
        res = [sem.evaluate(e, env) for _, _, e in g.outs]
        names = [c.name for c, _, _ in g.outs]
        d = res[names.index("div")]
        d[inputs[1] == 0] = -1
        return res
    with pytest.raises(AssertionError, match=r"div sem_i32_x1_parallel: inputs \(a, b, c\) = \(0, 0, .*got -1, expected 0"):
        check_backend(wrong, groups=[(DType.i32, 1)])


# ----------------------------------------------------------------------------- evaluate by hand
def _bin(op, dt, x, y):
    a, b = Var("a", dt), Var("b", dt)
    return sem.evaluate(binop(op, a, b), {a: np.array(x, dt.numpy), b: np.array(y, dt.numpy)})


def _un(op, dt, x):
    a = Var("a", dt)
    return sem.evaluate(unop(op, a), {a: np.array(x, dt.numpy)})


def _cast(src, dst, x):
    a = Var("a", src)
    return sem.evaluate(Cast(dst, a), {a: np.array(x, src.numpy)})


I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


@pytest.mark.parametrize("op,dt,x,y,want", [
    # C truncating division and remainder (sign of the dividend); zero divisor gives 0
    ("div", DType.i32, [7, -7, 7, -7, 5, 0], [2, 2, -2, -2, 0, 0], [3, -3, -3, 3, 0, 0]),
    ("rem", DType.i32, [7, -7, 7, -7, 5], [2, 2, -2, -2, 0], [1, -1, 1, -1, 0]),
    # INT_MIN / -1 wraps to INT_MIN, INT_MIN % -1 is 0
    ("div", DType.i32, [I32_MIN], [-1], [I32_MIN]),
    ("rem", DType.i32, [I32_MIN], [-1], [0]),
    ("div", DType.u8, [200, 7], [0, 2], [0, 3]),
    # wraparound
    ("add", DType.i8, [127, -128], [1, -1], [-128, 127]),
    ("mul", DType.u8, [16], [16], [0]),
    ("sub", DType.u32, [0], [1], [2 ** 32 - 1]),
    # shifts: count >= width (or negative, read as unsigned) gives 0, also for shr of negatives
    ("shl", DType.i32, [1, 1, 1, 1], [31, 32, 33, -1], [I32_MIN, 0, 0, 0]),
    ("shr", DType.i32, [-8, -8, -8], [1, 32, -1], [-4, 0, 0]),
    ("shr", DType.u8, [0x80, 0x80], [7, 8], [1, 0]),
    # integer pow: via f64, saturating; negative exponent truncates toward zero
    ("pow", DType.i32, [2, 2, 3, -2, 10], [10, -1, 3, 3, 10], [1024, 0, 27, -8, I32_MAX]),
    ("pow", DType.u8, [2, 3], [8, 2], [255, 9]),
    # min/max by the dtype's order
    ("max", DType.u8, [255], [1], [255]),
    ("min", DType.i8, [-1], [1], [-1]),
    # bool is a 1-bit unsigned integer
    ("add", DType.bool, [True, True, False], [True, False, False], [False, True, False]),
    ("mul", DType.bool, [True, True], [True, False], [True, False]),
])
def test_integer_binops_by_hand(op, dt, x, y, want):
    np.testing.assert_array_equal(_bin(op, dt, x, y), np.array(want, dt.numpy))


NAN, INF = float("nan"), float("inf")


def _same_float(got, want):
    got, want = np.asarray(got), np.asarray(want, got.dtype)
    assert got.dtype == want.dtype
    nan = np.isnan(got) & np.isnan(want)
    bits = f"u{got.dtype.itemsize}"
    assert (nan | (got.view(bits) == want.view(bits))).all(), (got, want)


@pytest.mark.parametrize("op,x,y,want", [
    ("min", [NAN, 1.0, -0.0, 0.0], [1.0, NAN, 0.0, -0.0], [NAN, NAN, -0.0, -0.0]),
    ("max", [NAN, -0.0, 0.0], [1.0, 0.0, -0.0], [NAN, 0.0, 0.0]),
    ("div", [1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [INF, -INF, NAN]),
    ("rem", [5.5, -5.5, 1.0, INF, 3.0, -0.0], [2.0, 2.0, 0.0, 2.0, INF, 1.0], [1.5, -1.5, NAN, NAN, 3.0, -0.0]),
    ("pow", [NAN, 1.0, -8.0, 2.0], [0.0, NAN, 1 / 3, 10.0], [1.0, 1.0, NAN, 1024.0]),
    ("lt", [NAN, 1.0], [1.0, 2.0], [False, True]),
    ("ne", [NAN, 1.0], [NAN, 1.0], [True, False]),
    ("eq", [NAN, -0.0], [NAN, 0.0], [False, True]),
])
def test_float_binops_by_hand(op, x, y, want):
    got = _bin(op, DType.f32, x, y)
    if got.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
    else:
        _same_float(got, np.array(want, np.float32))


def test_f16_arithmetic_is_binary16_rounded_once():
    # 2049 is not a half; 2048 + 1 rounds to even (2048), 2048 + 3 to 2052
    got = _bin("add", DType.f16, [2048.0, 2048.0, 65504.0], [1.0, 3.0, 8.0])
    _same_float(got, np.array([2048.0, 2052.0, 65504.0], np.float16))
    # 65504 + 16 = 65520 is halfway to 2^16: the tie goes to the even significand, inf
    _same_float(_bin("add", DType.f16, [65504.0], [16.0]), np.array([INF], np.float16))


@pytest.mark.parametrize("op,x,want", [
    ("round", [0.5, 1.5, 2.5, -0.5, -2.5, 3.5], [0.0, 2.0, 2.0, -0.0, -2.0, 4.0]),
    ("floor", [-0.5, -0.0, 1.5], [-1.0, -0.0, 1.0]),
    ("ceil", [-0.5, 0.2], [-0.0, 1.0]),
    ("trunc", [-0.5, 2.7], [-0.0, 2.0]),
    ("neg", [0.0, NAN], [-0.0, NAN]),
    ("abs", [-0.0, -INF], [0.0, INF]),
    ("sqrt", [-0.0, -1.0, 4.0, INF], [-0.0, NAN, 2.0, INF]),
    ("exp", [-INF, 0.0, INF], [0.0, 1.0, INF]),
    ("log", [0.0, -1.0, 1.0], [-INF, NAN, 0.0]),
    ("tanh", [INF, -INF, -0.0], [1.0, -1.0, -0.0]),
    ("erf", [INF, -INF, 0.0], [1.0, -1.0, 0.0]),
])
def test_float_unops_by_hand(op, x, want):
    _same_float(_un(op, DType.f32, x), np.array(want, np.float32))


def test_isnan_isinf():
    np.testing.assert_array_equal(_un("isnan", DType.f16, [NAN, INF, 0.0]), [True, False, False])
    np.testing.assert_array_equal(_un("isinf", DType.f64, [NAN, -INF, 1e308]), [False, True, False])
    np.testing.assert_array_equal(_un("isnan", DType.i32, [0, -1]), [False, False])


@pytest.mark.parametrize("src,dst,x,want", [
    # float -> int: truncate toward zero, saturate, NaN -> 0
    (DType.f32, DType.i32, [2.7, -2.7, 3e9, -3e9, NAN, INF, -INF], [2, -2, I32_MAX, I32_MIN, 0, I32_MAX, I32_MIN]),
    (DType.f32, DType.u8, [-1.5, 300.0, 255.9, NAN], [0, 255, 255, 0]),
    (DType.f64, DType.i64, [9.3e18, -9.3e18, 2.0 ** 62], [2 ** 63 - 1, -2 ** 63, 2 ** 62]),
    (DType.f64, DType.u64, [1.9e19, 2.0 ** 63], [2 ** 64 - 1, 2 ** 63]),
    (DType.f16, DType.i8, [-200.0, 127.5], [-128, 127]),
    # int -> int: wraps; sign-extended from signed sources, zero-extended from unsigned ones
    (DType.i32, DType.i8, [300, -129], [44, 127]),
    (DType.i8, DType.u32, [-1], [2 ** 32 - 1]),
    (DType.u8, DType.i32, [255], [255]),
    (DType.bool, DType.i32, [True, False], [1, 0]),
    # to bool: != 0, NaN is true
    (DType.f32, DType.bool, [0.0, -0.0, NAN, 0.5], [False, False, True, True]),
    (DType.i32, DType.bool, [0, -5], [False, True]),
])
def test_casts_to_int_by_hand(src, dst, x, want):
    np.testing.assert_array_equal(_cast(src, dst, x), np.array(want, dst.numpy))


@pytest.mark.parametrize("src,dst,x,want", [
    # f64 -> f16 rounds once: via f32 the first case would be 1.0 (1 + 2^-11 is a tie in f16)
    (DType.f64, DType.f16, [1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -11, 65520.0, 65519.0, 2.0 ** -25],
     [1 + 2 ** -10, 1.0, INF, 65504.0, 0.0]),
    (DType.f64, DType.f16, [2.0 ** -25 + 2.0 ** -40], [2.0 ** -24]),
    # int -> float: rounded to nearest, ties to even; unsigned sources as unsigned
    (DType.i32, DType.f32, [2 ** 24 + 1, 2 ** 24 + 3, -(2 ** 24 + 1)], [2.0 ** 24, 2.0 ** 24 + 4, -(2.0 ** 24)]),
    (DType.u64, DType.f32, [2 ** 64 - 1], [2.0 ** 64]),
    (DType.i64, DType.f64, [2 ** 53 + 1], [2.0 ** 53]),
    (DType.u8, DType.f16, [255], [255.0]),
    (DType.u32, DType.f16, [65520, 65519], [INF, 65504.0]),
    (DType.bool, DType.f32, [True], [1.0]),
])
def test_casts_to_float_by_hand(src, dst, x, want):
    _same_float(_cast(src, dst, x), np.array(want, dst.numpy))


def test_fma_rounds_once_when_fused():
    # a = b = 1 + 2^-12: a*b = 1 + 2^-11 + 2^-24 exactly; rounded to f32 first, 2^-24 is lost
    a, b, c = (Var(n, DType.f32) for n in "abc")
    env = {a: np.float32(1 + 2 ** -12), b: np.float32(1 + 2 ** -12), c: np.float32(-(1 + 2 ** -11))}
    assert sem.evaluate(fma(a, b, c), env, fma="fused") == np.float32(2.0 ** -24)
    assert sem.evaluate(fma(a, b, c), env, fma="unfused") == 0.0
    # an exact product beyond the range plus -inf is -inf fused, NaN unfused
    env = {a: np.float32(3e38), b: np.float32(4.0), c: np.float32(-INF)}
    assert sem.evaluate(fma(a, b, c), env, fma="fused") == -INF
    assert np.isnan(sem.evaluate(fma(a, b, c), env, fma="unfused"))


def test_maxnum_skips_nan_and_select():
    a, b = Var("a", DType.f32), Var("b", DType.f32)
    env = {a: np.array([NAN, 1.0, NAN], np.float32), b: np.array([2.0, NAN, NAN], np.float32)}
    _same_float(sem.evaluate(maxnum(a, b), env), np.array([2.0, 1.0, NAN], np.float32))
    _same_float(sem.evaluate(select(binop("lt", a, b), a, b), env), np.array([2.0, NAN, NAN], np.float32))


def test_vectors_loads_ramps_and_broadcasts():
    buf = Buffer("x", DType.i32, (8,))
    i = Var("i")
    e = binop("add", buf.vload(i * 4, 4), broadcast(Const(10, DType.i32), 4))
    got = sem.evaluate(e, {buf: np.arange(8, dtype=np.int32), i: np.array([0, 1])})
    np.testing.assert_array_equal(got, [[10, 11, 12, 13], [14, 15, 16, 17]])
    np.testing.assert_array_equal(sem.evaluate(Ramp(Const(5), 3)), [5, 6, 7])
    g = buf[[Ramp(Const(0), 2)]]                     # contiguous, then a strided gather
    np.testing.assert_array_equal(sem.evaluate(g, {buf: np.arange(8, dtype=np.int32)}), [0, 1])
    m = Buffer("m", DType.i32, (2, 4))
    np.testing.assert_array_equal(sem.evaluate(m[[Ramp(Const(0), 2), Const(1)]],
                                               {m: np.arange(8, dtype=np.int32)}), [1, 5])


def test_consts_round_and_wrap_to_their_dtype():
    _same_float(sem.evaluate(Const(0.1, DType.f16)), np.float16(0.1))
    assert sem.evaluate(Const(-1, DType.u8)) == 255
    assert sem.evaluate(Const(True, DType.bool)) == np.True_


def test_undefined_ops_and_bad_environments_raise():
    a = Var("a", DType.i32)
    with pytest.raises(sem.UndefinedSemanticsError, match="sqrt is not defined on i32"):
        sem.evaluate(unop("sqrt", a), {a: 1})
    f = Var("f", DType.f32)
    with pytest.raises(sem.UndefinedSemanticsError, match="xor is not defined on f32"):
        sem.evaluate(binop("xor", f, f), {f: 1.0})
    with pytest.raises(KeyError, match="variable a"):
        sem.evaluate(binop("add", a, a), {})
    buf = Buffer("x", DType.f32, (4,))
    with pytest.raises(IndexError, match="outside its 4 elements"):
        sem.evaluate(buf.flat(Const(4)), {buf: np.zeros(4, np.float32)})


def test_ulp_error_and_bounds():
    assert sem.ulp_error(np.float32(1.0 + 2 ** -23), 1.0, DType.f32) == 1.0
    assert sem.ulp_error(np.float32(2.0 ** -149), 0.0, DType.f32) == 1.0
    assert sem.ulp_error(np.float32(INF), INF, DType.f32) == 0.0
    assert sem.ulp_error(np.float32(NAN), 1.0, DType.f32) == INF
    assert sem.ulp_bound("exp", DType.f16) == 1.0 and sem.ulp_bound("exp", DType.f32) == 2.0
    with pytest.raises(KeyError):
        sem.ulp_bound("add", DType.f32)


def test_harness_subset_for_slow_backends():
    # what a simulated backend runs: a capped, deterministic subset of the pairs
    g = build_group(DType.f32, 1, max_pairs=32)
    assert g.n == 32
    # the subset keeps the special pairs: INT_MIN / -1 and NaN against inf are in it
    a, b, _ = pairs(DType.i32, max_pairs=48)
    assert len(a) == 48 and ((a == -2 ** 31) & (b == -1)).any()
    a, b, _ = pairs(DType.f16, max_pairs=80)
    assert (np.isnan(a) & np.isinf(b)).any() and ((a == 0) & np.signbit(a) & (b == 1)).any()
    assert check_backend(run_llvm, groups=[(DType.f32, 1), (DType.i8, 4)], max_pairs=32, ulp=LLVM_ULP) \
        == 32 * len(g.outs) + 32 * len(build_group(DType.i8, 4).outs)


def test_llvm_strided_vector_loads_and_stores_meet_the_spec():
    # gathers and scatters (Load/Store with stride != 1): column i of an [8, 4] matrix as 8 lanes
    from tensorfuse.ir.kernel import KernelBuilder
    x = Buffer("x", DType.f32, (8, 4))
    y = Buffer("y", DType.f32, (8, 4))
    kb = KernelBuilder("strided", [x, y])
    with kb.loop(4, kind="parallel") as i:
        v = fma(x[[Ramp(Const(0), 8), i]], Const(2.0, DType.f32), Const(-1.0, DType.f32))
        kb.store(y, [Ramp(Const(0), 8), i], maxnum(v, Const(0.0, DType.f32)))
    data = np.arange(32, dtype=np.float32).reshape(8, 4) - 10.0
    data[3, 1] = np.nan
    got = run_llvm(kb.kernel, [data], [((8, 4), np.float32)])[0]
    store = kb.kernel.body[0].body[0]
    want = sem.evaluate(store.value, {x: data, i: np.arange(4)})      # [4 columns, 8 lanes]
    _same_float(got, want.T)
    assert got[3, 1] == 0.0                      # maxnum skips the NaN


@pytest.mark.parametrize("dt", [DType.u8, DType.i8])
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("stride,offsets,add,masked", [
    (1, (0, 1, 2, 3), 0, True),         # stride-1 taps (the depthwise panel)
    (2, (0, 1, 2, 3), 0, True),         # stride 2
    (2, (0, 2, 4, None), 128, True),    # dilation 2, a missing byte, i8 -> u8 offset (+128)
    (3, (1, 0, 3, 2), 5, True),         # offsets out of order, a byte add
    (1, (0, 1, None, None), 0, False),  # u8 zero-extended without a mask (two bytes)
    (1, (0, 40, 80, 120), 0, True),     # a span over 64 bytes: emitted as written
])
def test_llvm_byte_windows_meet_the_spec(dt, lanes, stride, offsets, add, masked):
    """i32 words made of nearby bytes of one buffer, ``OR_t ((i32(x[b + l*s + o_t]) + c) & 255)
    << 8t`` (what the int8 schedules pack): the LLVM emitter's byte-window form (one load, a
    byte shuffle, a byte add) equals the spec's value, lane by lane."""
    from tensorfuse.ir.kernel import KernelBuilder, Load, as_expr
    if dt == DType.i8 and not masked:
        pytest.skip("a sign-extended byte needs the mask")
    n = 5
    x = Buffer("x", dt, (n * 7 + (lanes - 1) * stride + 130,))
    y = Buffer("y", DType.i32, (n, lanes))
    kb = KernelBuilder("bytes", [x, y])
    with kb.loop(n, kind="parallel") as i:
        word = None
        for t, o in enumerate(offsets):
            if o is None:
                continue
            v = Load(x, i * 7 + 3 + o, lanes, stride).cast(DType.i32)
            if masked:
                v = ((v + add) if add else v) & 255
            term = v if t == 0 else binop("shl", v, as_expr(8 * t, DType.i32))
            word = term if word is None else word | term
        kb.store(y, [i, Ramp(Const(0), lanes)], word)
    rng = np.random.default_rng(lanes + stride)
    data = rng.integers(0, 256, x.shape).astype(np.uint8).view(np.int8 if dt == DType.i8 else np.uint8)
    got = run_llvm(kb.kernel, [data], [((n, lanes), np.int32)])[0]
    store = kb.kernel.body[0].body[0]
    want = sem.evaluate(store.value, {x: data, i: np.arange(n)})
    np.testing.assert_array_equal(got, want.reshape(n, lanes))


@pytest.mark.parametrize("mid", [DType.u8, DType.u16])
@pytest.mark.parametrize("ft", [DType.f32, DType.f64])
def test_llvm_float_unsigned_float_round_trip_meets_the_spec(mid, ft):
    """float(u8(x)) on float vectors (a QuantizeLinear's u8 read back by a DequantizeLinear
    in one epilogue), emitted as a clamp and a truncation in the float type, equals the
    spec's two casts on edge values: NaN, infinities, signed zeros, fractions, the type's
    maximum and beyond."""
    from tensorfuse.ir.kernel import KernelBuilder, Load
    hi = float((1 << (8 * mid.itemsize)) - 1)
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.3, -0.3, 0.999, 1.0, 1.5, 2.5, -1.5, hi - 0.5, hi, hi + 0.5,
            hi + 1, 1e10, -1e10, 127.7, 128.2]
    lanes = 8
    data = np.array(vals + [7.0] * (-len(vals) % lanes), ft.numpy)
    n = len(data) // lanes
    x = Buffer("x", ft, data.shape)
    y = Buffer("y", ft, data.shape)
    kb = KernelBuilder("round_trip", [x, y])
    with kb.loop(n) as i:
        kb.store(y, i * lanes, Cast(ft, Cast(mid, Load(x, i * lanes, lanes))))
    got = run_llvm(kb.kernel, [data], [(data.shape, ft.numpy)])[0]
    store = kb.kernel.body[0].body[0]
    want = sem.evaluate(store.value, {x: data, i: np.arange(n)}).reshape(-1)
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got).any()


@pytest.mark.parametrize("ft", [DType.f32, DType.f64])
def test_llvm_round_trip_of_an_integral_value_skips_the_truncation(ft):
    """float(u8(round(x) + 3)) (a requantized value read back by the DequantizeLinear after
    it): the value is an integer (or NaN, an infinity), so the emitted clamp needs no
    truncation after it; the result still equals the spec's on ties, NaN, infinities, values
    past the range and negative ones. The same form on x itself keeps its truncation."""
    from tensorfuse.ir.kernel import KernelBuilder, Load
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -2.5, -3.5, -4.5, 251.5, 252.5, 253.0, 1e10, -1e10,
            127.7, 128.2, -0.3, 0.3]
    lanes = 8
    data = np.array(vals + [7.0] * (-len(vals) % lanes), ft.numpy)
    n = len(data) // lanes
    for integral in (True, False):
        x = Buffer("x", ft, data.shape)
        y = Buffer("y", ft, data.shape)
        kb = KernelBuilder("round_trip_int", [x, y])
        with kb.loop(n) as i:
            v = Load(x, i * lanes, lanes)
            if integral:
                v = unop("round", v) + broadcast(Const(3.0, ft), lanes)
            kb.store(y, i * lanes, Cast(ft, Cast(DType.u8, v)))
        got = run_llvm(kb.kernel, [data], [(data.shape, ft.numpy)])[0]
        store = kb.kernel.body[0].body[0]
        want = sem.evaluate(store.value, {x: data, i: np.arange(n)}).reshape(-1)
        np.testing.assert_array_equal(got, want)
        assert not np.signbit(got).any()
        mod = lir.Module(name="rt")
        emit_kernel(mod, kb.kernel)
        text = str(mod)
        assert ("llvm.trunc" in text) == (not integral), integral


def test_shuffle_and_interleave_by_hand():
    """``Shuffle`` picks lanes of ``a ++ b`` (LLVM's shufflevector); ``interleave`` of k vectors
    puts lane c of vector p at c*k + p (a [k, n] tile transposed), for k = 1, 2, 4, 8."""
    from tensorfuse.ir.kernel import interleave, shuffle
    x = Buffer("x", DType.i32, (64,))
    data = np.arange(64, dtype=np.int32) * 3 - 50
    e = shuffle(x.vload(0, 4), x.vload(4, 4), [7, 0, 5, 5, 2])
    np.testing.assert_array_equal(sem.evaluate(e, {x: data}), data[[7, 0, 5, 5, 2]])
    for k in (1, 2, 4, 8):
        t = interleave([x.vload(8 * p, 8) for p in range(k)])
        want = data[:8 * k].reshape(k, 8).T.reshape(-1)
        assert t.lanes == 8 * k
        np.testing.assert_array_equal(sem.evaluate(t, {x: data}), want)
    with pytest.raises(ValueError):
        interleave([x.vload(0, 8)] * 3)
    with pytest.raises(TypeError):
        shuffle(x.vload(0, 4), x.vload(0, 8), [0])
    with pytest.raises(TypeError):
        shuffle(x.vload(0, 4), x.vload(4, 4), [8])


@pytest.mark.parametrize("k,lanes,dt", [(8, 16, DType.i32), (4, 8, DType.f32), (2, 16, DType.u8)])
def test_llvm_shuffles_meet_the_spec(k, lanes, dt):
    """The LLVM emitter's shufflevector for ``Shuffle`` (a k x lanes tile transposed by
    ``interleave``, stored as k vectors) equals the spec's value."""
    from tensorfuse.ir.kernel import KernelBuilder, interleave, shuffle
    n = 3
    x = Buffer("x", dt, (n, k * lanes))
    y = Buffer("y", dt, (n, k * lanes))
    kb = KernelBuilder("transpose", [x, y])
    with kb.loop(n, kind="parallel") as i:
        t = interleave([x.vload(i * (k * lanes) + p * lanes, lanes) for p in range(k)])
        for q in range(k):
            kb.store(y, i * (k * lanes) + q * lanes, shuffle(t, t, range(q * lanes, (q + 1) * lanes)))
    rng = np.random.default_rng(k)
    data = rng.integers(0, 100, x.shape).astype(dt.numpy)
    got = run_llvm(kb.kernel, [data], [(y.shape, dt.numpy)])[0]
    want = data.reshape(n, k, lanes).transpose(0, 2, 1).reshape(n, k * lanes)
    np.testing.assert_array_equal(got, want)


def _narrow_edges(dst: DType, zp: int) -> np.ndarray:
    """f32 values at every rounding tie and its neighbours across ``dst``'s range less the zero
    point, and far outside it (past int32, +-inf; NaN)."""
    lo, hi = (0, 255) if dst == DType.u8 else (-128, 127)
    ks = np.arange(lo - zp - 3, hi - zp + 4, dtype=np.float64)
    vals = np.concatenate([ks, ks + 0.5, np.nextafter((ks + 0.5).astype(np.float32), np.float32(np.inf)),
                           np.nextafter((ks + 0.5).astype(np.float32), np.float32(-np.inf)),
                           [1e9, -1e9, 3e9, -3e9, 2.0 ** 31, -2.0 ** 31, -2.0 ** 31 - 512, np.inf, -np.inf, np.nan,
                            -0.5, 0.5, -0.0]])
    return vals.astype(np.float32)


@pytest.mark.parametrize("dst", [DType.u8, DType.i8])
@pytest.mark.parametrize("lanes,parts", [(16, 4), (16, 2), (8, 4), (8, 2)])
@pytest.mark.parametrize("zp_kind", ["input", "const", "negative_const", "none", "plain_cast"])
def test_llvm_packed_narrowing_meets_the_spec(dst, lanes, parts, zp_kind):
    """``Concat`` of saturating f32 -> u8 / i8 casts with isa "x86pack" (codegen/llvm/emit.py
    ``_pack_narrow``: VPACKSSDW, VPACKUSWB / VPACKSSWB, VPERMD; for u8 with a non-negative zero
    point only the upper clamp before CVTPS2DQ) equals the spec's value (ir/semantics.py: the
    casts one by one, concatenated) and numpy's saturate(round_half_even(x) + zp) at every tie,
    past int32, at +-inf and NaN (-> 0), at 16 lanes (AVX-512BW) and 8 (AVX2), for a zero point
    read at run time (u8: unsigned, the one-clamp form), a constant, a negative constant (both
    clamps: the form for a possibly negative offset), none, and a plain cast (truncation)."""
    from tensorfuse.codegen.llvm.jit import emit_assembly
    from tensorfuse.ir.target import Target
    from tensorfuse.ir.kernel import KernelBuilder, concat
    zp = {"input": 3 if dst == DType.u8 else -3, "const": 7, "negative_const": -5, "none": 0, "plain_cast": 0}[zp_kind]
    data = _narrow_edges(dst, zp)
    w = lanes * parts
    rows = -(-data.size // w)
    data = np.resize(data, rows * w)
    x = Buffer("x", DType.f32, (rows * w,))
    z = Buffer("z", dst, (1,))
    y = Buffer("y", dst, (rows * w,))
    kb = KernelBuilder("packnarrow", [x, z, y])
    exprs = []
    for r in range(rows):
        ps = []
        for p in range(parts):
            a = x.vload(r * w + p * lanes, lanes)
            if zp_kind == "plain_cast":
                v = a
            elif zp_kind == "input":
                v = unop("round", a) + broadcast(z.flat(0).cast(DType.f32), lanes)
            elif zp_kind == "none":
                v = unop("round", a)
            else:
                v = unop("round", a) + broadcast(Const(float(zp), DType.f32), lanes)
            ps.append(v.cast(dst))
        e = concat(ps, "x86pack")
        exprs.append(e)
        kb.store(y, r * w, e)
    zdata = np.array([zp if zp_kind == "input" else 0], dst.numpy)
    if zp_kind == "plain_cast":
        want = np.where(np.isnan(data), 0, np.clip(np.trunc(np.nan_to_num(data, nan=0.0)), *_int_range(dst)))
    else:
        want = np.where(np.isnan(data), 0, np.clip(np.round(np.nan_to_num(data, nan=0.0).astype(np.float64)) + zp,
                                                   *_int_range(dst)))
    want = want.astype(dst.numpy)
    spec = np.concatenate([sem.evaluate(e, {x: data, z: zdata}) for e in exprs])
    np.testing.assert_array_equal(spec, want)
    mod = lir.Module(name="pk")
    emit_kernel(mod, kb.kernel)
    text = str(mod)
    assert f"llvm.x86.{'avx512' if lanes == 16 else 'avx2'}.packssdw" in text
    assert ("packuswb" in text) == (dst == DType.u8)
    feature = "avx512bw" if lanes == 16 else "avx2"
    if feature not in Target.parse("llvm").feature_set:
        asm = emit_assembly(text, "pk", target="llvm -mcpu=skylake-avx512")
        assert "vpackssdw" in asm
        pytest.skip(f"host lacks {feature}: compiled for skylake-avx512 only")
    got = run_llvm(kb.kernel, [data, zdata], [((rows * w,), dst.numpy)])[0]
    np.testing.assert_array_equal(got, want)


def _int_range(dst: DType):
    return (0, 255) if dst == DType.u8 else (-128, 127)


@pytest.mark.parametrize("mid", [DType.u8, DType.i8, DType.u16, DType.i16])
@pytest.mark.parametrize("zp_kind", ["input", "const"])
def test_llvm_quantize_dequantize_grid_meets_the_spec(mid, zp_kind):
    """``float(T(round(a) + c)) - c`` (a QuantizeLinear's value read back by the
    DequantizeLinear after it, before its scale; codegen/llvm/emit.py
    ``_round_trip_less_offset``: a clamp of round(a) to [lo - c, hi - c], NaN -> -c, without
    the add and the subtraction) equals the spec's value at every tie across the range, past
    it, past 2^24 and int32, at +-inf and NaN, for a zero point read at run time and a constant;
    and the conversions are gone from the IR."""
    lo, hi = {DType.u8: (0, 255), DType.i8: (-128, 127), DType.u16: (0, 65535), DType.i16: (-32768, 32767)}[mid]
    zp = {DType.u8: 7, DType.i8: -9, DType.u16: 300, DType.i16: -1000}[mid]
    ks = np.concatenate([np.arange(lo - zp - 3, lo - zp + 4), np.arange(hi - zp - 3, hi - zp + 4), np.arange(-5, 6)])
    data = np.concatenate([ks, ks + 0.5, ks - 0.5, [1e9, -1e9, 2.0 ** 24 + 1, -2.0 ** 24 - 3, 3e9, np.inf, -np.inf,
                                                     np.nan, -0.0]]).astype(np.float32)
    data = np.resize(data, -(-data.size // 16) * 16)
    x = Buffer("x", DType.f32, (data.size,))
    z = Buffer("z", mid, (1,))
    y = Buffer("y", DType.f32, (data.size,))
    from tensorfuse.ir.kernel import KernelBuilder
    kb = KernelBuilder("qdqgrid", [x, z, y])
    exprs = []
    for r in range(data.size // 16):
        a = x.vload(r * 16, 16)
        c = broadcast(z.flat(0).cast(DType.f32) if zp_kind == "input" else Const(float(zp), DType.f32), 16)
        e = (unop("round", a) + c).cast(mid).cast(DType.f32) - c
        exprs.append(e)
        kb.store(y, r * 16, e)
    zdata = np.array([zp], mid.numpy)
    spec = np.concatenate([sem.evaluate(e, {x: data, z: zdata}) for e in exprs])
    want = np.where(np.isnan(data), 0.0, np.clip(np.round(np.nan_to_num(data.astype(np.float64), nan=0.0)) + zp, lo, hi)) - zp
    np.testing.assert_array_equal(spec, want.astype(np.float32))
    mod = lir.Module(name="qg")
    emit_kernel(mod, kb.kernel)
    text = str(mod)
    # no add of c (nor its subtraction after a conversion): only the two bounds less c
    assert "llvm.roundeven" in text and "fadd" not in text and "fptosi" not in text and "fptoui" not in text
    got = run_llvm(kb.kernel, [data, zdata], [((data.size,), np.float32)])[0]
    np.testing.assert_array_equal(got, want.astype(np.float32))
