"""The low-bit storage types: their encodings, their decode tables and the float -> code
conversion as kernel IR.

Each element is one byte (``DType.storage``, u8), as numpy's ``ml_dtypes`` arrays hold them:

- float8 ``f8e4m3fn``, ``f8e4m3fnuz``, ``f8e5m2``, ``f8e5m2fnuz`` and float4 ``f4e2m1``: sign,
  exponent and mantissa bits in the low bits of the byte (ONNX spec: "Float 8 types" and the
  Cast operator's tables; the OCP 8-bit and MX formats). ``fn`` types have no infinity and
  one NaN per sign (all exponent and mantissa bits set); ``fnuz`` types have no infinity, no
  negative zero and one NaN (the sign bit alone); ``f8e5m2`` is IEEE-like; ``f4e2m1`` has
  neither infinity nor NaN.
- integers ``i4``, ``u4``, ``i2``, ``u2``: the value's two's complement in the low 4 or 2 bits
  (the higher bits are ignored when read, zero when written).

Decoding is a 256-entry f32 table indexed by the byte (:func:`decode_table`; exact, as every
such value is an f32). Encoding (:func:`encode_float_expr`, :func:`encode_int_expr`) is
arithmetic in the kernel IR: the binade of ``|x|`` by comparisons against powers of two, the
quotient by the format's spacing there rounded half to even, and the code as base + quotient
(codes of one sign are ordered like the values, and consecutive within and across binades).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorfuse.ir.kernel import Expr, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.types import DType


@dataclass(frozen=True)
class FloatFormat:
    """A small float format: ``exp_bits`` exponent bits of bias ``bias``, ``man_bits`` mantissa
    bits, a sign bit above them. ``special``: "ieee" (the top exponent is infinity and NaN),
    "fn" (no infinity; all bits but the sign set is NaN), "fnuz" (no infinity, no -0; the sign
    bit alone is NaN) or "none" (every code is a finite number)."""

    exp_bits: int
    man_bits: int
    bias: int
    special: str

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp_bits + self.man_bits)

    @property
    def emin(self) -> int:
        """The exponent of the smallest normal number (subnormals share its spacing)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """The exponent of the largest finite binade."""
        top = (1 << self.exp_bits) - 1
        return (top - 1 if self.special == "ieee" else top) - self.bias

    @property
    def max_code(self) -> int:
        """The code of the largest finite value (without the sign)."""
        allset = self.sign_bit - 1
        if self.special == "ieee":
            return allset - (1 << self.man_bits)       # below the infinity's exponent
        if self.special == "fn":
            return allset - 1                          # below the NaN
        return allset

    @property
    def nan_code(self) -> int | None:
        """The code a positive NaN converts to (None: no NaN)."""
        return {"ieee": self.max_code + 1 + (1 << (self.man_bits - 1)),     # infinity's quiet NaN
                "fn": self.sign_bit - 1, "fnuz": self.sign_bit}.get(self.special)

    @property
    def overflow_code(self) -> int:
        """What an out-of-range value converts to without saturation: infinity for "ieee", NaN
        otherwise (the Cast operator's saturate=0 table)."""
        if self.special == "ieee":
            return self.max_code + 1
        return self.nan_code

    def value(self, code: int) -> float:
        """The value of ``code`` (the byte's low bits), as a Python float."""
        sign = -1.0 if code & self.sign_bit else 1.0
        mag = code & (self.sign_bit - 1)
        e, m = mag >> self.man_bits, mag & ((1 << self.man_bits) - 1)
        if self.special == "fnuz" and code & self.sign_bit and mag == 0:
            return float("nan")
        if self.special == "fn" and mag == self.sign_bit - 1:
            return sign * float("nan")
        if self.special == "ieee" and e == (1 << self.exp_bits) - 1:
            return sign * (float("inf") if m == 0 else float("nan"))
        if e == 0:
            return sign * m * 2.0 ** (self.emin - self.man_bits)
        return sign * (1 + m / (1 << self.man_bits)) * 2.0 ** (e - self.bias)


#: the float formats of the low-bit float types (ONNX spec, "Float 8 types" and FLOAT4E2M1)
FLOAT_FORMATS = {
    DType.f8e4m3fn: FloatFormat(4, 3, 7, "fn"),
    DType.f8e4m3fnuz: FloatFormat(4, 3, 8, "fnuz"),
    DType.f8e5m2: FloatFormat(5, 2, 15, "ieee"),
    DType.f8e5m2fnuz: FloatFormat(5, 2, 16, "fnuz"),
    DType.f4e2m1: FloatFormat(2, 1, 1, "none"),
}

#: bits of the low-bit integer types
INT_BITS = {DType.i4: 4, DType.u4: 4, DType.i2: 2, DType.u2: 2}

#: the values a storage byte can take
BYTE_VALUES = 1 << 8


def is_lowbit_float(dt: DType) -> bool:
    return dt in FLOAT_FORMATS


def int_range(dt: DType) -> tuple[int, int]:
    """[min, max] of a low-bit integer type."""
    bits = INT_BITS[dt]
    if dt.is_signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def decode_table(dt: DType) -> np.ndarray:
    """f32[256]: the value of each storage byte of low-bit type ``dt`` (an integer type reads
    its low bits only; a float type's bytes above its sign bit are decoded from the low bits too)."""
    if dt in INT_BITS:
        bits = INT_BITS[dt]
        low = np.arange(BYTE_VALUES, dtype=np.int64) & ((1 << bits) - 1)
        if dt.is_signed:
            low = np.where(low >= 1 << (bits - 1), low - (1 << bits), low)
        return low.astype(np.float32)
    fmt = FLOAT_FORMATS[dt]
    mask = (fmt.sign_bit << 1) - 1
    return np.array([fmt.value(b & mask) for b in range(BYTE_VALUES)], np.float32)


def _signbit(x: Expr) -> Expr:
    """x < 0, or x is -0 (1 / -0 is -inf; no fast-math in the kernels)."""
    zero = as_expr(0.0, x.dtype)
    return (x < zero) | (x.eq(zero) & ((as_expr(1.0, x.dtype) / x) < zero))


def encode_float_expr(x: Expr, dt: DType, saturate: bool = True) -> Expr:
    """The u8 code of ``x`` (an f32 or f64 Expr) in low-bit float type ``dt``, rounded half to
    even from ``x``'s own precision (ONNX spec, Cast: float 8 conversion). ``saturate``: a value
    whose rounding exceeds the largest finite one (and +-inf) gives +-that value; otherwise
    infinity (f8e5m2) or NaN. NaN gives the type's NaN (positive: the kernels cannot read a
    NaN's sign); f4e2m1, which has no NaN, gives the byte 0x8 (-0) for a NaN as ``ml_dtypes``
    (onnx.reference) does, and always saturates. The fnuz types have no -0: a negative value
    rounding to zero gives 0."""
    fmt = FLOAT_FORMATS[dt]
    ft = x.dtype
    i32 = DType.i32
    a = unop("abs", x)
    m = fmt.man_bits
    # the binade of |x|: spacing 2^(k - m) and the code of 2^k minus 2^m, for the largest k
    # with |x| >= 2^k; below 2^(emin + 1) the spacing of the subnormals (code = |x| / spacing)
    inv_q = as_expr(2.0 ** (m - fmt.emin), ft)
    base = as_expr(0.0, ft)
    for k in range(fmt.emin + 1, fmt.emax + 1):
        ge = a >= as_expr(2.0 ** k, ft)
        inv_q = select(ge, as_expr(2.0 ** (m - k), ft), inv_q)
        base = select(ge, as_expr(float((k + fmt.bias - 1) << m), ft), base)
    code = base + unop("round", a * inv_q)        # exact: a power-of-two scaling, then RNE
    top = as_expr(float(fmt.max_code), ft)
    over = code > top                             # also +-inf
    if saturate or fmt.special == "none":
        code = select(over, top, code)
    else:
        code = select(over, as_expr(float(fmt.overflow_code), ft), code)
    nan = unop("isnan", x)
    c = select(nan, as_expr(0.0, ft), code).cast(i32)
    neg = _signbit(x)
    if fmt.special == "fnuz":
        neg = neg & c.ne(0)
        if not saturate:          # fnuz's overflow code is the NaN: no sign on it
            neg = neg & ~over
    c = c | select(neg, as_expr(fmt.sign_bit, i32), as_expr(0, i32))
    nan_code = fmt.nan_code if fmt.nan_code is not None else fmt.sign_bit
    c = select(nan, as_expr(nan_code, i32), c)
    return c.cast(DType.u8)


def encode_int_expr(x: Expr, dt: DType) -> Expr:
    """The u8 code of ``x`` (an integral-valued f32/f64 Expr) in low-bit integer type ``dt``:
    saturated to the type's range (ONNX spec, QuantizeLinear), NaN -> 0 (as the i8/u8 path),
    two's complement in the low bits."""
    lo, hi = int_range(dt)
    ft = x.dtype
    v = minimum(maximum(x, as_expr(float(lo), ft)), as_expr(float(hi), ft))
    v = select(unop("isnan", x), as_expr(0.0, ft), v).cast(DType.i32)
    return (v & as_expr((1 << INT_BITS[dt]) - 1, DType.i32)).cast(DType.u8)


def encode_numpy(x: np.ndarray, dt: DType, saturate: bool = True) -> np.ndarray:
    """Reference conversion of float ``x`` (already rounded to integers for an integer ``dt``)
    to low-bit type ``dt`` with ``ml_dtypes`` (onnx.reference's way): integers saturate to the
    range, float8 saturate (when ``saturate``) finite and infinite values to +-max; float4 is
    ``ml_dtypes``' cast (which saturates)."""
    x = np.asarray(x)
    if dt in INT_BITS:
        lo, hi = int_range(dt)
        v = np.where(np.isnan(x), 0, np.clip(x, lo, hi))
        return v.astype(np.int64).astype(dt.numpy)
    if saturate and dt != DType.f4e2m1:
        big = float(FLOAT_FORMATS[dt].value(FLOAT_FORMATS[dt].max_code))
        with np.errstate(invalid="ignore"):
            x = np.where(np.isnan(x), x, np.clip(x, -big, big))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x).astype(dt.numpy)


def cast_to_int_expr(x: Expr, src: DType, dt: DType) -> Expr:
    """Cast (ONNX spec, Cast-25) of ``x`` to low-bit integer type ``dt``, as a u8 code.
    ``src`` is what ``x`` holds: an integer or bool (wraps: the low bits, two's complement;
    a decoded low-bit integer counts as one) or a float (truncated toward zero; a value outside
    the range, which ONNX leaves undefined, and NaN give 0, as ``ml_dtypes``, onnx.reference's
    conversion, does)."""
    mask = as_expr((1 << INT_BITS[dt]) - 1, DType.i64)
    if not src.is_float or src in INT_BITS:
        return (x.cast(DType.i64) & mask).cast(DType.u8)
    lo, hi = int_range(dt)
    ft = x.dtype
    t = unop("trunc", x)
    ok = (t >= as_expr(float(lo), ft)) & (t <= as_expr(float(hi), ft))     # false for NaN
    v = select(ok, t, as_expr(0.0, ft)).cast(DType.i64)
    return (v & mask).cast(DType.u8)


def cast_numpy(x: np.ndarray, dt: DType, saturate: bool = True) -> np.ndarray:
    """Reference Cast of ``x`` (any numpy or ``ml_dtypes`` array) to low-bit type ``dt``, as
    onnx.reference: ``ml_dtypes``' conversion, with float8 targets saturated first when
    ``saturate`` (finite and infinite values clipped to +-max, NaN kept)."""
    x = np.asarray(x)
    if dt in FLOAT_FORMATS and dt != DType.f4e2m1 and saturate:
        fmt = FLOAT_FORMATS[dt]
        big = fmt.value(fmt.max_code)
        xf = x.astype(np.float64) if x.dtype.kind != "f" else x
        with np.errstate(invalid="ignore"):
            x = np.where(np.isnan(xf), xf, np.clip(xf, -big, big))
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dt.numpy)


#: the ops that read or write low-bit tensors (``Node.qualified_op``; CastLike is imported as
#: Cast); the frontend refuses any other op given one, listing every such node
LOWBIT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "CastLike"})
