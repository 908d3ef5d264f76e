"""Vectorisable float32 exp, log, erf, tanh and sigmoid, emitted inline as LLVM IR.

:func:`emit_unary` expands one of these functions on a ``float`` or ``<n x float>`` value into
straight-line IR: floating-point arithmetic, ``select``, integer bit operations on the
``bitcast`` to ``i32`` / ``<n x i32>``, and calls of the element-wise intrinsics
``llvm.fmuladd`` and ``llvm.fabs`` / ``llvm.copysign`` only (suffix ``.f32`` for a scalar,
``.v<n>f32`` for a vector). There are no branches and no library calls, so LLVM's loop
vectoriser widens a scalar use, and a vector use is lowered as it stands (a vector wider than
the target's registers is split by legalisation).

``llvm.fmuladd`` is used rather than ``llvm.fma``: it becomes one fused instruction where the
target has FMA and a multiply and an add elsewhere (``llvm.fma`` would become a call of
``fmaf`` there). Every step whose exactness matters (range reduction, exponent scaling) is exact
with or without fusion; the error bounds below hold for both (the tests check both ways).

Methods (textbook techniques; the polynomial coefficients are our own minimax fits, made with a
Remez exchange in float64 on the stated interval, weighted by the error each causes in the
final result, then rounded to float32 one coefficient at a time, re-fitting the remaining ones
after each rounding):

* exp: Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, with ln2 split in a 9-bit head (so
  k * head is exact) and a float32 tail; exp(r) = 1 + r + r^2 P(r), P of degree 4; the result
  is scaled by 2^k as two factors 2^(k//2) and 2^(k - k//2) built in the exponent bits, so the
  overflow and gradual-underflow ranges round once, correctly.
* log: x = m 2^k with m in [sqrt(1/2), sqrt(2)) taken from the exponent and mantissa bits
  (denormals scaled by 2^23 first); log(1 + f) = f - f^2/2 + f^3 P(f), f = m - 1 exact, P of
  degree 7; k ln2 added in two parts.
* tanh: a = |x| < 1: a + a^3 P(a^2), P of degree 6 (no cancellation near 0);
  a >= 1: 1 - 2 / (exp(2a) + 1); the sign of x copied onto the result.
* erf: a = |x| < 1: a + a Q(a^2), Q of degree 6 (Q(0) = 2/sqrt(pi) - 1: the leading
  coefficient is 1 + Q(0), not 2/sqrt(pi) rounded to float32);
  a >= 1: 1 - exp(G(a - 1)) with G a degree-6 fit of log(erfc) on [1, 4] (a is clamped to 4,
  where erf is 1 in float32); the sign of x copied onto the result.
* sigmoid: e = exp(-|x|); 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0, the rounding error
  of 1 + e (Fast2Sum) corrected to first order. No overflow: results for x in [-103.97, -87.34]
  are denormal (numpy's float32 1 / (1 + exp(-x)) gives 0 below -88.72).

Errors are in units in the last place (ulp) of the float32 result, against the float64
functions (numpy, math.erf); ulp(y) = 2^(e - 23) for 2^e <= |y| < 2^(e+1), and 2^-149 for
denormals. They are relative (ulp) everywhere, also where the result is near 0 (tanh, erf,
sigmoid). :data:`MAX_ULP` holds the bounds; the maxima quoted in each function's docstring were
measured on every float32 of the range named there, for an AVX2+FMA CPU (fused) and for
x86-64-v2 (unfused), outside it on samples; tests/test_vmath.py asserts :data:`MAX_ULP` on dense
grids, denormals, +-0, +-inf and NaN.
"""
from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)
_h = float.fromhex


def _coeffs(text: str) -> tuple[float, ...]:
    """Polynomial coefficients, lowest order first, from C99 hex float literals."""
    return tuple(float.fromhex(w) for w in text.split())


#: ops :func:`emit_unary` expands
OPS = ("exp", "log", "erf", "tanh", "sigmoid")

#: max error in ulp of each function over all float32 inputs (see the function docstrings)
MAX_ULP = {"exp": 1.05, "log": 1.0, "erf": 1.35, "tanh": 1.1, "sigmoid": 2.0}

# exp: Cody-Waite constants and P(r) for exp(r) = 1 + r + r^2 P(r) on |r| <= 0.3468
# (approximation error 0.06 ulp).
_LOG2E = _h("0x1.715476p+0")
_LN2_HI = _h("0x1.63p-1")                  # 0.693359375: 9 significant bits, k * _LN2_HI is exact
_LN2_LO = _h("-0x1.bd0106p-13")            # float32(ln2 - _LN2_HI)
_ROUND_MAGIC = _h("0x1.8p23")              # (v + 1.5 * 2^23) - 1.5 * 2^23 rounds v to an integer
_EXP_LO, _EXP_HI = -104.0, 89.0        # exp is 0 below and inf above in float32
_EXP_P = _coeffs("0x1.fffffcp-2 0x1.555494p-3 0x1.555886p-5 0x1.12385ap-7 0x1.6a7afap-10")

# log: P(f) for log(1 + f) = f - f^2/2 + f^3 P(f) on f in [sqrt(1/2) - 1, sqrt(2) - 1]
# (approximation error 0.1 ulp).
_SQRT_HALF_BITS = 0x3F3504F3
_LOG_P = _coeffs("0x1.555554p-2 -0x1.000228p-2 0x1.99a036p-3 -0x1.547214p-3 0x1.22d5c2p-3 "
                  "-0x1.0d82eep-3 0x1.057aacp-3 -0x1.391222p-4")

# tanh: P(u) for tanh(x) = x + x^3 P(x^2) on |x| <= 1 (approximation error 0.08 ulp).
_TANH_P = _coeffs("-0x1.55553cp-2 0x1.110be4p-3 -0x1.b9623ap-5 0x1.6009a2p-6 -0x1.045fd0p-7 "
                   "0x1.2d9f4ep-9 -0x1.77ca4cp-12")

# erf: Q(u) for erf(x) = x + x Q(x^2) on |x| <= 1 (approximation error 0.03 ulp) and
# G(t) for erfc(x) = exp(G(x - 1)) on x in [1, 4] (error of 1 - exp(G): 0.14 ulp).
_ERF_Q = _coeffs("0x1.06eba8p-3 -0x1.81273ep-2 0x1.ce2ce6p-4 -0x1.b7f71ap-6 0x1.53f224p-8 "
                  "-0x1.a3515ep-11 0x1.4771fep-14")
_ERFC_G = _coeffs("-0x1.d97fc0p+0 -0x1.51c988p+1 -0x1.afb44ap-1 -0x1.520526p-5 0x1.35bf2cp-7 "
                   "-0x1.844294p-10 0x1.79f19ap-14")


class _Emit:
    """Builder helpers for one float type (``float`` or ``<n x float>``)."""

    def __init__(self, b: ir.IRBuilder, t: ir.Type, avx512: bool = False):
        self.b = b
        self.t = t
        #: scale by 2^k with AVX-512's VSCALEFPS (16 lanes only)
        self.scalef = avx512 and isinstance(t, ir.VectorType) and t.count == 16
        if isinstance(t, ir.VectorType):
            self.n = t.count
            self.it = ir.VectorType(I32, t.count)
            self.suffix = f"v{t.count}f32"
        else:
            self.n = None
            self.it = I32
            self.suffix = "f32"

    # constants
    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.t, v if self.n is None else [v] * self.n)

    def ci(self, v: int) -> ir.Constant:
        return ir.Constant(self.it, v if self.n is None else [v] * self.n)

    # intrinsics
    def _intr(self, name: str, nargs: int) -> ir.Function:
        m = self.b.module
        full = f"llvm.{name}.{self.suffix}"
        f = m.globals.get(full)
        if f is None:
            f = ir.Function(m, ir.FunctionType(self.t, [self.t] * nargs), name=full)
        return f

    def mad(self, a, b, c):
        """a * b + c, fused where the target has FMA."""
        return self.b.call(self._intr("fmuladd", 3), [a, b, c])

    def fabs(self, x):
        return self.b.call(self._intr("fabs", 1), [x])

    def copysign(self, mag, sgn):
        return self.b.call(self._intr("copysign", 2), [mag, sgn])

    def poly(self, x, coeffs):
        """Horner: coeffs[0] + coeffs[1] x + ... """
        acc = self.c(coeffs[-1])
        for co in reversed(coeffs[:-1]):
            acc = self.mad(acc, x, self.c(co))
        return acc

    # arithmetic
    def add(self, a, b): return self.b.fadd(a, b)
    def sub(self, a, b): return self.b.fsub(a, b)
    def mul(self, a, b): return self.b.fmul(a, b)
    def div(self, a, b): return self.b.fdiv(a, b)
    def sel(self, c, a, b): return self.b.select(c, a, b)
    def lt(self, a, b): return self.b.fcmp_ordered("<", a, b)
    def gt(self, a, b): return self.b.fcmp_ordered(">", a, b)
    def eq(self, a, b): return self.b.fcmp_ordered("==", a, b)
    def scale2(self, y, k):
        """y * 2^k (k a float32 integer) rounded once, by VSCALEFPS (Intel SDM: "VSCALEFPS";
        current rounding mode, no mask): overflow to inf and gradual underflow included."""
        name = "llvm.x86.avx512.mask.scalef.ps.512"
        m = self.b.module
        f = m.globals.get(name)
        if f is None:
            f = ir.Function(m, ir.FunctionType(self.t, [self.t, self.t, self.t, ir.IntType(16), I32]), name=name)
        return self.b.call(f, [y, k, self.c(0.0), ir.Constant(ir.IntType(16), 0xFFFF), ir.Constant(I32, 4)])

    def bits(self, x): return self.b.bitcast(x, self.it)
    def from_bits(self, i): return self.b.bitcast(i, self.t)


def _exp(e: _Emit, x):
    """float32 exp(x), x any float32. Error < 1.05 ulp (measured max: 1.013 fused, 0.994
    unfused, over every float32 in [-104, 104] with |x| >= 2^-30). Cody-Waite reduction, degree-6
    polynomial, scaling in two exponent-bit factors (module docstring), or by VSCALEFPS where
    ``e`` has it (AVX-512, 16 lanes: the same value, one rounding, 8 fewer instructions). exp(-inf) = 0,
    exp(+inf) = inf, NaN -> NaN; overflows to inf above 88.7228, denormal results below -87.34,
    0 below -103.97 (as correctly rounded).

    Below -104 the result is the constant 0, selected after computing on 0 instead: an
    arithmetic result that underflows costs a microcode assist on x86 (about 15x the time
    of the whole function: a Softmax row's masked or padding keys, -inf or -10000, met it for
    every lane), so only true denormal results, x in [-104, -87.34], still take one."""
    b = e.b
    # ordered compares: NaN passes through and stays NaN in r and the result
    zero = e.lt(x, e.c(_EXP_LO))
    xc = e.sel(zero, e.c(0.0), x)
    xc = e.sel(e.gt(xc, e.c(_EXP_HI)), e.c(_EXP_HI), xc)
    s = e.mad(xc, e.c(_LOG2E), e.c(_ROUND_MAGIC))         # integer k in the low mantissa bits
    kf = e.sub(s, e.c(_ROUND_MAGIC))                       # k in [-150, 128], exact
    r = e.mad(kf, e.c(-_LN2_HI), xc)                       # exact (Sterbenz) with or without fusion
    r = e.mad(kf, e.c(-_LN2_LO), r)
    p = e.mad(e.mul(r, r), e.poly(r, _EXP_P), r)           # exp(r) - 1
    y = e.add(e.c(1.0), p)
    if e.scalef:                                           # one instruction, one rounding
        return e.sel(zero, e.c(0.0), e.scale2(y, kf))
    ki = b.sub(e.bits(s), e.bits(e.c(_ROUND_MAGIC)))
    k1 = b.ashr(ki, e.ci(1))
    k2 = b.sub(ki, k1)
    s1 = e.from_bits(b.shl(b.add(k1, e.ci(127)), e.ci(23)))   # 2^k1, k1 in [-75, 64]
    s2 = e.from_bits(b.shl(b.add(k2, e.ci(127)), e.ci(23)))
    return e.sel(zero, e.c(0.0), e.mul(e.mul(y, s1), s2))   # the second product rounds once


def _log(e: _Emit, x):
    """float32 natural log, x any float32. Error < 1 ulp (measured max: 0.862 fused, 0.904
    unfused, over every positive float32, denormals included). Exponent/mantissa split and a
    degree-10 polynomial for log(1 + f) (module docstring). log(+-0) = -inf, log(x < 0) = NaN,
    log(inf) = inf, NaN -> NaN."""
    b = e.b
    tiny = e.lt(x, e.c(2.0 ** -126))
    xs = e.sel(tiny, e.mul(x, e.c(2.0 ** 23)), x)              # denormals -> normal, exact
    ix = b.sub(e.bits(xs), e.ci(_SQRT_HALF_BITS))
    k = b.sub(b.ashr(ix, e.ci(23)), b.select(tiny, e.ci(23), e.ci(0)))
    m = e.from_bits(b.add(b.and_(ix, e.ci(0x007FFFFF)), e.ci(_SQRT_HALF_BITS)))  # [sqrt .5, sqrt 2)
    f = e.sub(m, e.c(1.0))                                   # exact
    f2 = e.mul(f, f)
    t = e.mad(e.mul(f2, f), e.poly(f, _LOG_P), e.mul(f2, e.c(-0.5)))   # log(1+f) - f
    kf = b.sitofp(k, e.t)
    v = e.add(e.mad(kf, e.c(_LN2_LO), t), f)
    y = e.mad(kf, e.c(_LN2_HI), v)                           # k * _LN2_HI exact
    y = e.sel(e.eq(x, e.c(float("inf"))), x, y)
    y = e.sel(e.eq(x, e.c(0.0)), e.c(float("-inf")), y)
    return e.sel(b.fcmp_unordered("<", x, e.c(0.0)), e.c(float("nan")), y)   # x < 0 or NaN


def _tanh(e: _Emit, x):
    """float32 tanh, x any float32. Error < 1.1 ulp, relative also near 0 (measured max: 0.949
    fused, 1.082 unfused, over every float32 in [2^-30, 10]; the negative half is exactly odd,
    below 2^-30 tanh(x) = x, above 9.01 tanh(x) = 1). Odd polynomial for |x| < 1,
    1 - 2 / (exp(2|x|) + 1) above, sign of x (module docstring). tanh(+-inf) = +-1, tanh(-0) = -0,
    NaN -> NaN."""
    a = e.fabs(x)
    a2 = e.mul(a, a)
    small = e.mad(a, e.mul(a2, e.poly(a2, _TANH_P)), a)
    ex = _exp(e, e.add(a, a))
    large = e.sub(e.c(1.0), e.div(e.c(2.0), e.add(ex, e.c(1.0))))
    y = e.sel(e.lt(a, e.c(1.0)), small, large)              # NaN takes the large path: NaN
    return e.copysign(y, x)                                  # odd, tanh(-0) = -0


def _erf(e: _Emit, x):
    """float32 erf, x any float32. Error < 1.35 ulp, relative also near 0 (measured max: 1.031
    fused, 1.314 unfused, over every float32 in [2^-30, 4.5]; the negative half is exactly odd,
    erf(x) = 1 above 3.92, and below 2^-30 the same formula rounds 2/sqrt(pi) x). Odd polynomial for
    |x| < 1, 1 - exp(G(|x| - 1)) above, sign of x (module docstring). erf(+-inf) = +-1, erf(-0) = -0,
    NaN -> NaN."""
    a = e.fabs(x)
    small = e.mad(a, e.poly(e.mul(a, a), _ERF_Q), a)
    ac = e.sel(e.gt(a, e.c(4.0)), e.c(4.0), a)
    g = e.poly(e.sub(ac, e.c(1.0)), _ERFC_G)                 # ac - 1 exact on [1, 4]
    large = e.sub(e.c(1.0), _exp(e, g))
    y = e.sel(e.lt(a, e.c(1.0)), small, large)              # NaN takes the large path: NaN
    return e.copysign(y, x)                                  # odd, erf(-0) = -0


def _sigmoid(e: _Emit, x):
    """float32 logistic sigmoid 1 / (1 + exp(-x)), x any float32. Error < 2 ulp, relative also
    near 0 (measured max: 1.967 fused and unfused, over every float32 in [-104, 18] with
    |x| >= 2^-30). e = exp(-|x|), then 1 / (1 + e) or e / (1 + e), with the rounding error of
    1 + e corrected (module docstring). sigmoid(-inf) = 0, sigmoid(inf) = 1, NaN -> NaN, no
    NaN for large |x|; denormal results for x in [-103.97, -87.34]."""
    ex = _exp(e, e.b.fneg(e.fabs(x)))                        # (0, 1]
    neg = e.lt(x, e.c(0.0))
    num = e.sel(neg, ex, e.c(1.0))
    d = e.add(e.c(1.0), ex)
    dlo = e.sub(ex, e.sub(d, e.c(1.0)))                      # 1 + ex = d + dlo exactly (Fast2Sum)
    q = e.div(num, d)
    inv = e.sel(neg, e.sub(e.c(1.0), q), q)                  # ~ 1 / d
    return e.mad(e.mul(q, inv), e.b.fneg(dlo), q)            # num / (d + dlo) to first order


_IMPL = {"exp": _exp, "log": _log, "erf": _erf, "tanh": _tanh, "sigmoid": _sigmoid}


def emit_unary(builder: ir.IRBuilder, op: str, x: ir.Value, avx512: bool = False) -> ir.Value | None:
    """Emit ``op(x)`` for a float32 ``x`` (``float`` or ``<n x float>``, any n) as straight-line
    IR at the builder's position; None when ``op`` is not one of :data:`OPS` or ``x`` is not
    float32 (the caller then uses its own lowering).

    ``x`` may be any float32 value; the result is the float32 function value with the error
    bounds of :data:`MAX_ULP` (ulp of the float32 result, relative everywhere; measured
    exhaustively, see the module docstring and each function's):

    * ``exp``: < 1.05 ulp; 0 below -103.97, inf above 88.72, denormal results in between.
    * ``log``: < 1 ulp for x > 0 (denormals included); -inf at +-0, NaN below 0, inf at inf.
    * ``tanh``: < 1.1 ulp; exactly odd; tanh(x) = x for tiny x; +-1 at +-inf.
    * ``erf``: < 1.35 ulp; exactly odd; +-1 at +-inf.
    * ``sigmoid``: < 2 ulp; 0 at -inf, 1 at inf, no NaN for large |x|.

    NaN gives NaN for every op. The code is straight-line (selects, no branches) and calls
    only the element-wise intrinsics llvm.fmuladd, llvm.fabs and llvm.copysign of ``x``'s type.
    """
    impl = _IMPL.get(op)
    if impl is None:
        return None
    t = x.type
    if isinstance(t, ir.VectorType):
        if not isinstance(t.element, ir.FloatType):
            return None
    elif not isinstance(t, ir.FloatType):
        return None
    return impl(_Emit(builder, t, avx512), x)
