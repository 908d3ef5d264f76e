"""The kernel IR's expression semantics, as a numpy evaluator: THE spec every backend meets.

:func:`evaluate` computes any kernel-IR expression (``ir/kernel.py``: Const, Var, Load, Ramp,
Broadcast, FMA, Bin, Un, Cast, Select) elementwise over numpy arrays, per dtype. A backend's
code generator (``codegen/llvm``, ``codegen/cuda``) is correct when its result equals
:func:`evaluate`'s bit for bit for the exact ops, and lies within :func:`ulp_bound` ulp of the
float64 reference (:func:`reference64`) for the approximate ones; ``tests/expr_cases.py`` checks
a backend against it on edge values. NaN results compare as NaN whatever their sign and payload;
everything else compares bitwise (so the sign of a zero counts).

Notation: ``T`` is the operands' dtype, ``W`` its width in bits, ``MIN``/``MAX`` its range;
"rounded" is IEEE 754 round-to-nearest, ties to even, once, to ``T``; bool is a 1-bit unsigned
integer (true = 1). f16 arithmetic is IEEE binary16 (for + - * / sqrt the same as computing in
f32 and rounding once to f16). bf16 has no semantics here (no backend lowers it).

==================  ===================================================================
expression          semantics
==================  ===================================================================
Const(v, T)         v rounded to T (ints: v mod 2^W as T; bool: v != 0)
Var / Load          the environment's value; Load(buf, i, lanes, stride) is
                    buf[i + l*stride] for lane l; an index outside buf raises IndexError
Ramp(base, n)       base + l for lane l (i64)
Broadcast(a, n)     a in every lane
add sub mul         float: IEEE, rounded; int: wraps mod 2^W (bool: xor, xor, and)
div                 float: IEEE (x/0 = +-inf, 0/0 = NaN); int: C, truncating toward zero;
                    x / 0 = 0; signed MIN / -1 = MIN (wraps)
rem                 float: C fmod, exact, sign of the dividend (fmod(x, 0) = NaN,
                    fmod(+-inf, y) = NaN, fmod(x, +-inf) = x); int: C ``%`` (sign of the
                    dividend), x % 0 = 0, MIN % -1 = 0
min max             float: NaN if either operand is NaN (llvm.minimum/maximum, numpy
                    minimum/maximum), and -0 < +0; int: signed or unsigned by T
maxnum minnum       (helpers in ir/kernel.py, built of select/isnan) float: NaN only when
                    both are NaN, else the larger/smaller of the non-NaN ones; the -0/+0
                    choice follows the selects: ``select(b > a, b, select(isnan(a), b, a))``
pow                 float: C pow (pow(x, 0) = 1 and pow(1, y) = 1 even for NaN), approx;
                    int: pow of the operands as f64 (signed or unsigned), then the
                    saturating f64 -> T cast below (so 2 ** -1 = 0, overflow saturates)
atan2               float only: C atan2, approx
and or xor          int/bool only: bitwise
shl shr             int/bool only: the count is read as unsigned W-bit (a negative count is
                    huge); count >= W gives 0 (also for shr of a negative signed value);
                    else shl, and shr arithmetic for signed T, logical for unsigned T
lt le gt ge eq      bool result; float: ordered (false when either is NaN); int: signed or
                    unsigned by T
ne                  bool result; float: unordered (true when either is NaN)
neg                 float: sign bit flipped (-0 from 0); int: 0 - x, wraps (neg MIN = MIN)
not                 int/bool only: bitwise complement (bool: logical not)
abs                 float: sign bit cleared; signed int: x < 0 ? -x : x, wraps (abs MIN =
                    MIN); unsigned/bool: x
sqrt                float: IEEE, correctly rounded (sqrt(-0) = -0, sqrt(x<0) = NaN)
floor ceil trunc    float: exact, sign of zero kept (floor(-0.5) = -1, trunc(-0.5) = -0);
round               round half to even (round(2.5) = 2, round(-0.5) = -0); int: x
isnan isinf         bool result; int: false
exp log sin cos     float only: the function on float64, rounded; approx (ulp_bound).
tan asin acos atan  Special values as C99 Annex F: exp(-inf) = 0, log(0) = -inf,
sinh cosh tanh      log(x<0) = NaN, tanh(+-inf) = +-1, erf(+-inf) = +-1, ...;
asinh acosh atanh   f16 is computed in f32 and rounded to f16 (within 1 ulp of f16)
erf exp2 log2
log1p expm1
FMA(a, b, c)        float only: a*b + c, either rounded once (fused) or as mul then add
                    (unfused), as the target has FMA; a backend states which (the tests
                    accept either unless told); f16 in the LLVM backend: unfused
Select(c, a, b)     c ? a : b, per lane
Lookup(t, T, i)     t[i] per lane: the constant table's element (a T value) at the i32 index;
                    an index outside the table raises IndexError (generated code: undefined)
DotAcc(acc, a, b)   i32 only: per lane, acc + sum_t a_t * b_t where a_t, b_t are the narrow
                    integers packed little-endian in the i32 lanes of a and b ("u8s8": four
                    u8 times four i8; "s16s16": two i16 times two i16); the sum of products
                    is exact, the add to acc wraps (VPDPBUSD, VPMADDWD + VPADDD)
Shuffle(a, b, m)    any dtype: lane i is lane m[i] of the concatenation a ++ b (LLVM's
                    shufflevector with a constant mask); exact
Concat(p0, p1 ..)   any dtype: the lanes of p0, then of p1 ...; exact (its isa is a codegen
                    choice only)
Cast(T <- S)        S == T: x. to bool: x != 0 (float: NaN -> true).
                    float -> float: widening exact; narrowing rounded once (f64 -> f16 is
                    NOT via f32: 1 + 2^-11 + 2^-40 -> 1 + 2^-10).
                    float -> int: truncated toward zero, saturating at MIN/MAX, NaN -> 0
                    (-1.5 -> u8 is 0, 300.0 -> u8 is 255, inf -> i32 is 2^31 - 1).
                    int/bool -> float: rounded (signed by S; bool and unsigned as unsigned;
                    u64 max -> f32 is 2^64; 65520 -> f16 is inf).
                    int -> int: wraps mod 2^W(T) (sign-extended from signed S, zero-extended
                    from unsigned or bool S)
==================  ===================================================================

Operations not in this table for a dtype (sqrt of an int, ``not`` of a float, atan2 of ints)
have no semantics: :func:`evaluate` raises :class:`UndefinedSemanticsError`, and a backend
refuses them too (the LLVM one with ``CodegenError``).

Where a backend's source language differs (notes for code generators that emit Python-like
source, as numba.cuda does): Python's ``//`` floors and ``%`` takes the divisor's sign (the
spec truncates, C-like); ``int(x)`` of a float is an unsaturated conversion (the spec
saturates, NaN -> 0); Python's ``min``/``max`` are order-dependent with NaN (the spec
propagates it), and C's ``fminf``/``fmaxf`` skip it (that is maxnum/minnum, not max/min);
a shift by W or more is undefined in LLVM IR and C (the spec gives 0); ``round`` must be half
to even (C's ``roundf`` rounds half away from zero; ``rintf`` is the spec's); float literals
need the operand's dtype (a Python float literal is f64, which would promote f32 arithmetic).

Shapes: values are numpy arrays; a scalar expression over an environment whose arrays have
shape ``S`` gives shape ``S``, a vector of ``n`` lanes gives ``S + (n,)``. Python scalars and
0-d arrays broadcast.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from .kernel import (BINOPS_ARITH, BINOPS_CMP, DOT_PACKINGS, FMA, UNOPS, Bin, Broadcast, Buffer, Cast, Const, DotAcc, Expr,
                     Concat, Load, Lookup, Ramp, Select, Shuffle, Un, Var)
from .types import DType

__all__ = ["evaluate", "reference64", "ulp_bound", "ulp_error", "is_approx", "fma_exact", "defined",
           "UndefinedSemanticsError", "APPROX_UNOPS", "APPROX_BINOPS", "MAX_ULP", "DTYPES"]


class UndefinedSemanticsError(TypeError):
    """The expression applies an op to a dtype the kernel IR defines no semantics for."""


#: dtypes with semantics (bf16 has none yet)
DTYPES = (DType.bool, DType.i8, DType.i16, DType.i32, DType.i64, DType.u8, DType.u16, DType.u32,
          DType.u64, DType.f16, DType.f32, DType.f64)

#: unary ops computed as the float64 function rounded, within :func:`ulp_bound`
APPROX_UNOPS = ("exp", "log", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                "asinh", "acosh", "atanh", "erf", "exp2", "log2", "log1p", "expm1")
#: binary float ops that are approximate in the same way
APPROX_BINOPS = ("pow", "atan2")

#: the bound (ulp of the result dtype, against :func:`reference64`) a backend must meet for an
#: approximate op, unless it states a tighter one. f32: the largest of CUDA's documented maxima
#: (CUDA C Programming Guide, "Mathematical functions": single precision) and glibc's; f64:
#: CUDA's double-precision maxima plus 1, since the reference is itself float64 libm (numpy),
#: within about 1 ulp; f16: computed in f32 and rounded, so within 1 ulp of f16.
MAX_ULP = {
    DType.f32: {"exp": 2, "exp2": 2, "expm1": 1, "log": 1, "log2": 1, "log1p": 1, "sin": 2, "cos": 2,
                "tan": 4, "asin": 2, "acos": 2, "atan": 2, "sinh": 3, "cosh": 2, "tanh": 2, "asinh": 3,
                "acosh": 4, "atanh": 3, "erf": 2, "pow": 4, "atan2": 3},
    DType.f64: {"exp": 2, "exp2": 2, "expm1": 2, "log": 2, "log2": 2, "log1p": 2, "sin": 3, "cos": 3,
                "tan": 3, "asin": 3, "acos": 3, "atan": 3, "sinh": 3, "cosh": 3, "tanh": 3, "asinh": 4,
                "acosh": 4, "atanh": 3, "erf": 3, "pow": 3, "atan2": 3},
}


def is_approx(e: Expr) -> bool:
    """Whether ``e``'s top op is approximate (compared within :func:`ulp_bound`, not bitwise)."""
    if isinstance(e, Un):
        return e.op in APPROX_UNOPS
    if isinstance(e, Bin):
        return e.op in APPROX_BINOPS
    return False


def ulp_bound(op: str, dtype: DType) -> float:
    """The spec's ulp bound for approximate ``op`` on ``dtype`` (f16: 1; int pow: the f64 bound,
    applied before the cast). Raises KeyError for an exact op."""
    if dtype == DType.f16:
        if op in APPROX_UNOPS or op in APPROX_BINOPS:
            return 1.0
        raise KeyError(op)
    if not dtype.is_float:
        dtype = DType.f64
    return float(MAX_ULP[dtype][op])


# ----------------------------------------------------------------------------- helpers
_FLOAT_NP = {DType.f16: np.float16, DType.f32: np.float32, DType.f64: np.float64}


def _np(dt: DType):
    if dt == DType.bf16:
        raise UndefinedSemanticsError("bf16 has no kernel-IR semantics")
    return dt.numpy


def _width(dt: DType) -> int:
    return 1 if dt == DType.bool else dt.itemsize * 8


def _int_range(dt: DType) -> tuple[int, int]:
    w = _width(dt)
    if dt.is_signed and dt != DType.bool:
        return -(1 << (w - 1)), (1 << (w - 1)) - 1
    return 0, (1 << w) - 1


def _unsigned(dt: DType):
    return np.dtype(f"u{dt.itemsize}") if dt != DType.bool else np.dtype(np.uint8)


def _as(x, dt: DType) -> np.ndarray:
    return np.asarray(x).astype(_np(dt), copy=False)


def defined(op: str, dtype: DType) -> bool:
    """Whether the spec defines Bin/Un ``op`` on operands of ``dtype``."""
    if dtype not in DTYPES:
        return False
    if dtype.is_float:
        return op not in ("and", "or", "xor", "shl", "shr", "not")
    return op not in ("atan2", "sqrt") and op not in APPROX_UNOPS


# ----------------------------------------------------------------------------- casts
def _cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    if src == dst:
        return x
    if dst == DType.bool:
        return x != 0          # NaN != 0 is true
    if src.is_float and dst.is_float:
        return x.astype(_np(dst))          # numpy rounds f64 -> f16 once (not via f32)
    if src.is_float:
        lo, hi = _int_range(dst)
        t = np.trunc(x.astype(np.float64))
        nan = np.isnan(t)
        big = t >= float(hi) + 1.0           # 2^(W-1) or 2^W: exactly representable
        small = t < float(lo)
        mid = np.where(nan | big | small, 0.0, t)
        out = mid.astype(_np(dst))
        out = np.where(big, np.array(hi).astype(_np(dst)), out)
        out = np.where(small, np.array(lo).astype(_np(dst)), out)
        return out.astype(_np(dst))
    if dst.is_float:
        if src == DType.bool:
            x = x.astype(np.uint8)
        return _int_to_float(x, dst)
    # int -> int: numpy's astype wraps, sign-extending from signed and zero-extending from
    # unsigned sources, as C does
    if src == DType.bool:
        x = x.astype(np.uint8)
    return x.astype(_np(dst))


def _int_to_float(x: np.ndarray, dst: DType) -> np.ndarray:
    """Integers to a float dtype, rounded once (exact rational rounding, so no dependence on
    numpy's or the C library's conversions)."""
    flat = x.reshape(-1)
    out = np.array([_round_fraction(Fraction(int(v)), dst) for v in flat], dtype=_np(dst))
    return out.reshape(x.shape)


def _round_fraction(q: Fraction, dt: DType):
    """The exact rational ``q`` rounded once to float dtype ``dt`` (ties to even; overflow to inf)."""
    t = _FLOAT_NP[dt]
    info = np.finfo(t)
    if q == 0:
        return t(0.0)
    try:
        c = t(float(q))               # within one ulp of the correct result
    except OverflowError:
        c = t(np.inf) if q > 0 else t(-np.inf)
    maxv = Fraction(float(info.max))
    top_ulp = maxv - Fraction(float(np.nextafter(info.max, t(0))))
    if abs(q) >= maxv + top_ulp / 2:
        # beyond the largest finite value by half an ulp or more: inf (ties to even give inf)
        return t(np.inf) if q > 0 else t(-np.inf)
    if not np.isfinite(c):
        c = t(info.max) if q > 0 else t(-info.max)
    best = None
    for cand in (np.nextafter(c, t(-np.inf)), c, np.nextafter(c, t(np.inf))):
        if not np.isfinite(cand):
            continue
        d = abs(Fraction(float(cand)) - q)
        if best is None or d < best[0] or (d == best[0] and _even(cand)):
            best = (d, cand)
    return best[1]


def _even(v) -> bool:
    bits = np.asarray(v).view(f"u{np.asarray(v).itemsize}")
    return int(bits) % 2 == 0


def fma_exact(a, b, c, dtype: DType) -> np.ndarray:
    """``a*b + c`` rounded once to ``dtype`` (the fused result), elementwise over arrays."""
    t = _FLOAT_NP[dtype]
    a, b, c = np.broadcast_arrays(_as(a, dtype), _as(b, dtype), _as(c, dtype))
    out = np.empty(a.shape, t)
    with np.errstate(all="ignore"):
        for i in np.ndindex(a.shape):
            x, y, z = a[i], b[i], c[i]
            if not (np.isfinite(x) and np.isfinite(y)):
                out[i] = t(np.float64(x) * np.float64(y) + np.float64(z))   # inf/NaN rules
                continue
            if not np.isfinite(z):       # the exact product is finite: the sum is z
                out[i] = z
                continue
            q = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
            if q == 0:
                # exact zero: +0, except (-0) for a product and addend both -0 / negative zero sum
                p0 = np.float64(x) * np.float64(y)
                out[i] = t(p0 + np.float64(z))
            else:
                out[i] = _round_fraction(q, dtype)
    return out


def fma_unfused(a, b, c, dtype: DType) -> np.ndarray:
    """``a*b + c`` as a multiply rounded to ``dtype`` and then an add rounded to ``dtype``."""
    with np.errstate(all="ignore"):
        return _as(_as(a, dtype) * _as(b, dtype), dtype) + _as(c, dtype)


# ----------------------------------------------------------------------------- float ops
def _math64(op: str):
    import math
    if op == "erf":
        return np.vectorize(lambda v: math.erf(v) if not np.isnan(v) else v, otypes=[np.float64])
    return {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
            "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
            "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "exp2": np.exp2,
            "log2": np.log2, "log1p": np.log1p, "expm1": np.expm1,
            "pow": np.power, "atan2": np.arctan2}[op]


def _minmax_float(op: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    nan = np.isnan(x) | np.isnan(y)
    if op == "min":
        r = np.where(x < y, x, y)
        r = np.where((x == y) & np.signbit(x), x, r)        # min(-0, +0) = -0
    else:
        r = np.where(x > y, x, y)
        r = np.where((x == y) & ~np.signbit(x), x, r)       # max(-0, +0) = +0
    return np.where(nan, np.array(np.nan, x.dtype), r).astype(x.dtype)


def _float_bin(op: str, dt: DType, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    t = _np(dt)
    if op in APPROX_BINOPS:
        return _math64(op)(x.astype(np.float64), y.astype(np.float64)).astype(t)
    if op in ("add", "sub", "mul", "div", "rem") and dt == DType.f16:
        # computed in f32 and rounded once: the same as IEEE binary16 for these ops
        return _float_bin(op, DType.f32, x.astype(np.float32), y.astype(np.float32)).astype(t)
    if op == "add": return (x + y).astype(t)
    if op == "sub": return (x - y).astype(t)
    if op == "mul": return (x * y).astype(t)
    if op == "div": return (x / y).astype(t)
    if op == "rem": return np.fmod(x, y).astype(t)
    if op in ("min", "max"): return _minmax_float(op, x, y)
    if op == "lt": return x < y
    if op == "le": return x <= y
    if op == "gt": return x > y
    if op == "ge": return x >= y
    if op == "eq": return x == y
    if op == "ne": return x != y
    raise UndefinedSemanticsError(f"{op} is not defined on {dt}")


def _float_un(op: str, dt: DType, x: np.ndarray) -> np.ndarray:
    t = _np(dt)
    if op == "neg": return np.negative(x)
    if op == "abs": return np.abs(x)
    if op == "isnan": return np.isnan(x)
    if op == "isinf": return np.isinf(x)
    if op == "sqrt": return np.sqrt(x.astype(np.float64)).astype(t)    # f64 sqrt then round: exact
    if op == "floor": return np.floor(x)
    if op == "ceil": return np.ceil(x)
    if op == "trunc": return np.trunc(x)
    if op == "round": return np.rint(x)                                 # half to even
    if op in APPROX_UNOPS:
        return _math64(op)(x.astype(np.float64)).astype(t)
    raise UndefinedSemanticsError(f"{op} is not defined on {dt}")


# ----------------------------------------------------------------------------- integer ops
def _int_bin(op: str, dt: DType, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if dt == DType.bool:
        r = _int_bin_w(op, DType.u8, x.astype(np.uint8), y.astype(np.uint8), width=1)
        return r if r.dtype == np.bool_ else (r & 1).astype(np.bool_)
    return _int_bin_w(op, dt, x, y, _width(dt))


def _int_bin_w(op: str, dt: DType, x, y, width: int) -> np.ndarray:
    t = _np(dt)
    signed = dt.is_signed
    if op == "add": return (x + y).astype(t)
    if op == "sub": return (x - y).astype(t)
    if op == "mul": return (x * y).astype(t)
    if op in ("div", "rem"):
        lo, _ = _int_range(dt)
        zero = y == 0
        ovf = (x == lo) & (y == -1) if signed else np.zeros_like(zero)
        ys = np.where(zero | ovf, np.array(1, t), y).astype(t)
        r = np.fmod(x, ys).astype(t)                   # C remainder: sign of the dividend
        if op == "rem":
            return np.where(zero | ovf, np.array(0, t), r).astype(t)
        q = ((x - r) // ys).astype(t)                  # exact division: floor = trunc
        q = np.where(ovf, x, q)                        # MIN / -1 = MIN
        return np.where(zero, np.array(0, t), q).astype(t)
    if op == "min": return np.minimum(x, y).astype(t)
    if op == "max": return np.maximum(x, y).astype(t)
    if op == "and": return (x & y).astype(t)
    if op == "or": return (x | y).astype(t)
    if op == "xor": return (x ^ y).astype(t)
    if op in ("shl", "shr"):
        count = y.astype(_unsigned(dt)) if dt != DType.u8 or width != 1 else y
        big = count >= width
        c = np.where(big, 0, count).astype(t)
        r = np.left_shift(x, c) if op == "shl" else np.right_shift(x, c)   # arithmetic for signed
        return np.where(big, np.array(0, t), r).astype(t)
    if op == "pow":
        f = _math64("pow")(_cast(x, dt, DType.f64), _cast(y, dt, DType.f64))
        return _cast(f, DType.f64, dt if width != 1 else DType.bool)
    if op == "lt": return x < y
    if op == "le": return x <= y
    if op == "gt": return x > y
    if op == "ge": return x >= y
    if op == "eq": return x == y
    if op == "ne": return x != y
    raise UndefinedSemanticsError(f"{op} is not defined on {dt}")


def _int_un(op: str, dt: DType, x: np.ndarray) -> np.ndarray:
    t = _np(dt)
    if op == "neg":
        return x if dt == DType.bool else (np.zeros((), t) - x).astype(t)
    if op == "not":
        return ~x
    if op == "abs":
        if not dt.is_signed or dt == DType.bool:
            return x
        return np.where(x < 0, (np.zeros((), t) - x).astype(t), x).astype(t)
    if op in ("isnan", "isinf"):
        return np.zeros(x.shape, np.bool_)
    if op in ("floor", "ceil", "round", "trunc"):
        return x
    raise UndefinedSemanticsError(f"{op} is not defined on {dt}")


def dot_acc_ref(acc, a, b, packing: str) -> np.ndarray:
    """:class:`~ir.kernel.DotAcc` on arrays of i32 lanes (the table above)."""
    ta, tb, g = DOT_PACKINGS[packing]
    acc, a, b = np.broadcast_arrays(np.asarray(acc, np.int32), np.asarray(a, np.int32), np.asarray(b, np.int32))
    ea = np.ascontiguousarray(a).view(_np(ta)).reshape(a.shape + (g,)).astype(np.int64)
    eb = np.ascontiguousarray(b).view(_np(tb)).reshape(b.shape + (g,)).astype(np.int64)
    s = acc.astype(np.int64) + (ea * eb).sum(-1)
    return ((s + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


# ----------------------------------------------------------------------------- evaluator
def _lanes(v: np.ndarray, n: int) -> np.ndarray:
    """A value as shape ``S + (n,)``."""
    return v if n > 1 else v[..., None]


class _Eval:
    def __init__(self, env: dict, fma: str):
        self.env = env
        self.fma = fma
        self.memo: dict[int, np.ndarray] = {}

    def __call__(self, e: Expr) -> np.ndarray:
        """``e`` as an array of shape ``S + (lanes,)`` (a lane axis always, removed at the end)."""
        k = id(e)
        if k not in self.memo:
            self.memo[k] = self._ev(e)
        return self.memo[k]

    def _ev(self, e: Expr) -> np.ndarray:
        if isinstance(e, Const):
            if e.dtype.is_float:
                return np.asarray(e.value, np.float64).astype(_np(e.dtype))[..., None]
            if e.dtype == DType.bool:
                return np.asarray(bool(e.value))[..., None]
            w = _width(e.dtype)
            v = int(e.value) % (1 << w)
            lo, _ = _int_range(e.dtype)
            if lo < 0 and v >= (1 << (w - 1)):
                v -= 1 << w
            return np.asarray(v, _np(e.dtype))[..., None]
        if isinstance(e, Var):
            if e not in self.env:
                raise KeyError(f"variable {e.name} has no value in the environment")
            return _as(self.env[e], e.dtype)[..., None]
        if isinstance(e, Ramp):
            base = self(e.base)              # S + (1,)
            return (base + np.arange(e.lanes, dtype=np.int64)).astype(np.int64)
        if isinstance(e, Broadcast):
            a = self(e.a)
            return np.broadcast_to(a, a.shape[:-1] + (e.lanes,))
        if isinstance(e, Shuffle):
            a, b = np.broadcast_arrays(self(e.a), self(e.b))
            return np.concatenate([a, b], axis=-1)[..., list(e.mask)]
        if isinstance(e, Concat):
            return np.concatenate(np.broadcast_arrays(*(self(p) for p in e.parts)), axis=-1)
        if isinstance(e, Load):
            if e.buf not in self.env:
                raise KeyError(f"buffer {e.buf.name} has no array in the environment")
            data = _as(self.env[e.buf], e.buf.dtype).reshape(-1)
            idx = self(e.index).astype(np.int64)[..., :1] + np.arange(e.lanes, dtype=np.int64) * e.stride
            if idx.size and (idx.min() < 0 or idx.max() >= data.size):
                raise IndexError(f"load of {e.buf.name} at {int(idx.min())}..{int(idx.max())}, "
                                 f"outside its {data.size} elements")
            return data[idx]
        if isinstance(e, Bin):
            if not defined(e.op, e.a.dtype):
                raise UndefinedSemanticsError(f"{e.op} is not defined on {e.a.dtype}")
            x, y = np.broadcast_arrays(self(e.a), self(e.b))
            with np.errstate(all="ignore"):
                if e.a.dtype.is_float:
                    return _float_bin(e.op, e.a.dtype, x, y)
                return _int_bin(e.op, e.a.dtype, x, y)
        if isinstance(e, Un):
            if not defined(e.op, e.a.dtype):
                raise UndefinedSemanticsError(f"{e.op} is not defined on {e.a.dtype}")
            x = self(e.a)
            with np.errstate(all="ignore"):
                if e.a.dtype.is_float:
                    if e.a.dtype == DType.f16 and e.op in APPROX_UNOPS:
                        return _float_un(e.op, DType.f32, x.astype(np.float32)).astype(np.float16)
                    return _float_un(e.op, e.a.dtype, x)
                return _int_un(e.op, e.a.dtype, x)
        if isinstance(e, Cast):
            if e.dtype not in DTYPES or e.a.dtype not in DTYPES:
                raise UndefinedSemanticsError(f"cast {e.a.dtype} -> {e.dtype} has no semantics")
            with np.errstate(all="ignore"):
                return _cast(self(e.a), e.a.dtype, e.dtype)
        if isinstance(e, FMA):
            if not e.dtype.is_float:
                raise UndefinedSemanticsError(f"fma is not defined on {e.dtype}")
            a, b, c = np.broadcast_arrays(self(e.a), self(e.b), self(e.c))
            if self.fma == "unfused" or (self.fma == "target" and e.dtype == DType.f16):
                return fma_unfused(a, b, c, e.dtype)
            return fma_exact(a, b, c, e.dtype)
        if isinstance(e, Select):
            c, a, b = np.broadcast_arrays(self(e.cond), self(e.a), self(e.b))
            return np.where(c, a, b).astype(_np(e.dtype))
        if isinstance(e, DotAcc):
            return dot_acc_ref(self(e.acc), self(e.a), self(e.b), e.packing)
        if isinstance(e, Lookup):
            idx = np.asarray(self(e.index)).astype(np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= len(e.table)):
                raise IndexError(f"table read at {int(idx.min())}..{int(idx.max())}, outside its "
                                 f"{len(e.table)} entries")
            return np.asarray(e.table, dtype=_np(e.dtype))[idx]
        raise UndefinedSemanticsError(f"unknown expression {e!r}")


def evaluate(expr: Expr, env: dict | None = None, fma: str = "fused") -> np.ndarray:
    """The value of kernel-IR expression ``expr`` by the spec (this module's table).

    ``env`` maps each :class:`~tensorfuse.ir.kernel.Var` in ``expr`` to a numpy array or scalar
    (broadcast together, shape ``S``) and each :class:`~tensorfuse.ir.kernel.Buffer` it loads
    from to an array (read flat, row-major). ``fma``: "fused" (one rounding), "unfused" (a
    multiply and an add) or "target" (fused except f16, as the LLVM backend does).

    Returns an array of ``expr.dtype``'s numpy dtype (``np.bool_`` for bool) of shape ``S``, or
    ``S + (expr.lanes,)`` for a vector. Raises :class:`UndefinedSemanticsError` for an op the
    spec does not define on its dtype, ``KeyError`` for a Var or Buffer missing from ``env``,
    ``IndexError`` for a load outside its buffer.
    """
    if fma not in ("fused", "unfused", "target"):
        raise ValueError(f"fma must be 'fused', 'unfused' or 'target', got {fma!r}")
    ev = _Eval(env or {}, fma)
    v = ev(expr)
    v = v if expr.lanes > 1 else v[..., 0]
    return np.asarray(v).astype(_np(expr.dtype), copy=False)


def reference64(expr: Expr, env: dict | None = None) -> np.ndarray:
    """For an approximate top op (:func:`is_approx`): the float64 value of the op applied to its
    operands as the spec evaluates them (for int pow, the float64 pow before the cast). Same
    shape rule as :func:`evaluate`; the operands must be exact expressions or leaves."""
    if not is_approx(expr):
        raise ValueError(f"{expr!r} is not an approximate op")
    ev = _Eval(env or {}, "fused")
    src = expr.a.dtype
    if isinstance(expr, Un):
        x = ev(expr.a)
        with np.errstate(all="ignore"):
            if src == DType.f16:   # computed in f32 and rounded: the f32 result is the reference
                r = _math64(expr.op)(x.astype(np.float64)).astype(np.float32).astype(np.float64)
            else:
                r = _math64(expr.op)(x.astype(np.float64))
    else:
        x, y = np.broadcast_arrays(ev(expr.a), ev(expr.b))
        with np.errstate(all="ignore"):
            r = _math64(expr.op)(_cast(x, src, DType.f64), _cast(y, src, DType.f64))
            if src == DType.f16:
                r = r.astype(np.float32).astype(np.float64)
    return r if expr.lanes > 1 else r[..., 0]


def ulp_error(got: np.ndarray, ref64: np.ndarray, dtype: DType) -> np.ndarray:
    """|got - ref64| in ulp of float ``dtype`` at ``ref64`` (ulp(y) = 2^(e - p + 1) for
    2^e <= |y| < 2^(e+1), the smallest denormal below the normal range). 0 where both are the
    same NaN-ness/infinity, inf where one is NaN or infinite and the other is not."""
    t = _FLOAT_NP[dtype]
    info = np.finfo(t)
    g = np.asarray(got, np.float64)
    r = np.asarray(ref64, np.float64)
    with np.errstate(all="ignore"):
        a = np.abs(r)
        e = np.where(a > 0, np.floor(np.log2(np.where(a > 0, a, 1.0))), float(info.minexp))
        e = np.maximum(e, float(info.minexp))
        ulp = np.exp2(e - (info.nmant))
        err = np.abs(g - r) / ulp
        special = ~np.isfinite(g) | ~np.isfinite(r)
        same = (np.isnan(g) & np.isnan(r)) | (g == r)
        # a reference beyond the dtype's range: the rounded result is inf
        rr = r.astype(t).astype(np.float64)
        same |= ~np.isfinite(rr) & (g == rr)
        err = np.where(special, np.where(same, 0.0, np.inf), err)
    return err
