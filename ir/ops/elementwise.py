"""Elementwise and broadcasting math ops (ONNX operator spec, "Operators" section per op).

Common contract of the ops here, unless an op's own doc says otherwise:

- Shapes: unary ops keep the input's shape; binary and variadic ops broadcast all inputs
  numpy-style (ONNX "multidirectional broadcasting").
- Dtypes: exactly the ONNX type constraints of the newest opset (read from ``onnx.defs``);
  inputs bound to the same type parameter must have the same dtype. Output dtype as ONNX says.
- Errors: ``ShapeError`` for a dtype ONNX does not allow, mismatched dtypes, missing required
  inputs and shapes that do not broadcast.
- Numerics: float16 operands of compound formulas are computed in float32 and rounded once
  (as onnxruntime does); integer arithmetic wraps; integer division and remainder by zero give 0.

Shared helpers (also used by ``logic`` and ``activations``): :func:`check_types`,
:func:`infer_ew`, :func:`in_f32`, :func:`np_in_f32`, :func:`unary`.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import onnx.defs

from tensorfuse.ir.kernel import as_expr, binop, maximum, minimum, select, unop
from tensorfuse.ir.ops._common import broadcast_shapes, erf_np, present
from tensorfuse.ir.registry import OpDef, OpPatternKind, ShapeError, op, register
from tensorfuse.ir.types import DType, TensorType

EW = OpPatternKind.ELEMWISE
BC = OpPatternKind.BROADCAST
F32 = DType.f32
F64 = DType.f64
LOWP = (DType.f16, DType.bf16)

# ----------------------------------------------------------------------------- type checking
_ONNX_TYPE = {
    "tensor(float16)": DType.f16, "tensor(bfloat16)": DType.bf16, "tensor(float)": DType.f32,
    "tensor(double)": DType.f64, "tensor(int8)": DType.i8, "tensor(int16)": DType.i16,
    "tensor(int32)": DType.i32, "tensor(int64)": DType.i64, "tensor(uint8)": DType.u8,
    "tensor(uint16)": DType.u16, "tensor(uint32)": DType.u32, "tensor(uint64)": DType.u64,
    "tensor(bool)": DType.bool,
}


@functools.lru_cache(maxsize=None)
def _signature(name: str):
    s = onnx.defs.get_schema(name, onnx.defs.onnx_opset_version(), "")
    allowed = {c.type_param_str: frozenset(_ONNX_TYPE[t] for t in c.allowed_type_strs if t in _ONNX_TYPE)
               for c in s.type_constraints}
    opt = onnx.defs.OpSchema.FormalParameterOption
    ins = [(p.name, p.type_str, p.option == opt.Optional) for p in s.inputs]
    variadic = bool(s.inputs) and s.inputs[-1].option == opt.Variadic
    outs = [p.type_str for p in s.outputs]
    return allowed, ins, variadic, outs, s.min_input, s.max_input


def _allowed(allowed, type_str: str) -> frozenset:
    if type_str in allowed:
        return allowed[type_str]
    return frozenset([_ONNX_TYPE[type_str]]) if type_str in _ONNX_TYPE else frozenset()


def check_types(node, schema_op: str | None = None) -> dict[str, DType]:
    """Check the node's input dtypes against the newest ONNX schema of ``schema_op`` (default:
    the node's op). Returns the type-parameter bindings ({"T": DType.f32, ...}).

    Raises ShapeError: too many inputs, a required input missing, a dtype ONNX does not allow,
    or two inputs bound to the same type parameter with different dtypes."""
    name = schema_op or node.op
    allowed, ins, variadic, _, lo, hi = _signature(name)
    n = len(node.inputs)
    while n and node.inputs[n - 1] is None:
        n -= 1
    if n > hi:
        raise ShapeError(f"{n} inputs given; ONNX {name} takes at most {hi}")
    if n < lo:
        raise ShapeError(f"{n} inputs given; ONNX {name} needs at least {lo}")
    bound: dict[str, DType] = {}
    first: dict[str, int] = {}
    for i, v in enumerate(node.inputs[:n]):
        pname, ts, optional = ins[min(i, len(ins) - 1)]
        if v is None:
            if not optional:
                raise ShapeError(f"required input {i} ('{pname}') is missing")
            continue
        ok = _allowed(allowed, ts)
        if v.dtype not in ok:
            names = ", ".join(sorted(d.value for d in ok))
            raise ShapeError(f"input {i} ('{pname}') has dtype {v.dtype}, which ONNX {name} does not "
                             f"allow (allowed: {names})")
        if ts in allowed:
            if ts in bound and bound[ts] != v.dtype:
                raise ShapeError(f"inputs {first[ts]} and {i} must have the same dtype (ONNX type {ts}), "
                                 f"got {bound[ts]} and {v.dtype}")
            bound.setdefault(ts, v.dtype)
            first.setdefault(ts, i)
    return bound


def out_dtype(node, bound: dict[str, DType], j: int = 0, schema_op: str | None = None) -> DType:
    """Dtype of output j from the schema and the bindings of :func:`check_types`."""
    allowed, _, _, outs, _, _ = _signature(schema_op or node.op)
    ts = outs[j]
    if ts in bound:
        return bound[ts]
    ok = _allowed(allowed, ts)
    if len(ok) == 1:
        return next(iter(ok))
    raise ShapeError(f"output {j} type {ts} is not bound by any input")


def infer_ew(node) -> list[TensorType]:
    """Elementwise/broadcast inference: schema-checked dtypes, broadcast shape of present inputs."""
    bound = check_types(node)
    shape = broadcast_shapes(*[v.shape for v in present(node)])
    return [TensorType(out_dtype(node, bound, j), shape) for j in range(len(_signature(node.op)[3]))]


# ----------------------------------------------------------------------------- numerics helpers
def in_f32(fn):
    """Wrap a scalar function (node, *Exprs) so f16/bf16 operands compute in f32, rounded once."""
    def scalar(node, *xs):
        dt = xs[0].dtype
        if dt in LOWP:
            y = fn(node, *[x.cast(F32) if x.dtype == dt else x for x in xs])
            return y.cast(dt) if y.dtype == F32 else y
        return fn(node, *xs)
    return scalar


def np_in_f32(fn):
    """Wrap a reference (node, ins) -> array: f16/bf16 inputs compute in f32, result cast back;
    numpy floating-point warnings are silenced (ONNX defines inf/NaN results)."""
    def reference(node, ins):
        x = ins[0]
        with np.errstate(all="ignore"):
            if x.dtype == np.float16 or x.dtype.name == "bfloat16":
                y = np.asarray(fn(node, [a if a is None or a.dtype != x.dtype else a.astype(np.float32)
                                         for a in ins]))
                return [y.astype(x.dtype) if y.dtype == np.float32 else y]
            y = np.asarray(fn(node, ins))
            return [y.astype(x.dtype) if y.dtype.kind == "f" and x.dtype.kind == "f" else y]
    return reference


def _spec(name: str) -> str:
    v = onnx.defs.get_schema(name, onnx.defs.onnx_opset_version(), "").since_version
    return f"ONNX spec: {name}-{v}."


def unary(name: str, doc: str, np_fn, scalar_fn, kind: OpPatternKind = EW, f32: bool = True,
          infer=None, **kw) -> OpDef:
    """Register an op whose reference is ``np_fn(node, x)`` and scalar ``scalar_fn(node, x)``;
    with ``f32`` both compute f16 in f32 (compound formulas: one rounding at the end)."""
    ref = np_in_f32(lambda node, ins: np_fn(node, ins[0]))
    if not f32:
        def ref(node, ins):
            with np.errstate(all="ignore"):
                y = np.asarray(np_fn(node, ins[0]))
                return [y.astype(ins[0].dtype) if y.dtype.kind == ins[0].dtype.kind else y]
    return register(OpDef(name=name, kind=kind, infer=infer or infer_ew, reference=ref,
                          scalar=in_f32(scalar_fn) if f32 else scalar_fn, doc=f"{doc} {_spec(name)}", **kw))


# ----------------------------------------------------------------------------- unary math
def _u(opname):
    return lambda node, x: unop(opname, x)


_UNARY_MATH = [
    # name, doc, numpy, scalar, compute f16 in f32
    ("Neg", "y = -x (integers wrap).", lambda n, x: np.negative(x), _u("neg"), False),
    ("Abs", "y = |x| (the most negative integer stays itself).", lambda n, x: np.abs(x), _u("abs"), False),
    ("Reciprocal", "y = 1 / x.", lambda n, x: np.reciprocal(x), lambda n, x: 1.0 / x, False),
    ("Floor", "y = floor(x).", lambda n, x: np.floor(x), _u("floor"), False),
    ("Ceil", "y = ceil(x).", lambda n, x: np.ceil(x), _u("ceil"), False),
    ("Round", "y = x rounded to the nearest integer, halves to even.", lambda n, x: np.round(x), _u("round"), False),
    ("Sqrt", "y = sqrt(x) (NaN for x < 0).", lambda n, x: np.sqrt(x), _u("sqrt"), True),
    ("Exp", "y = e**x.", lambda n, x: np.exp(x), _u("exp"), True),
    ("Log", "y = ln(x) (-inf at 0, NaN below).", lambda n, x: np.log(x), _u("log"), True),
    ("Tanh", "y = tanh(x).", lambda n, x: np.tanh(x), _u("tanh"), True),
    ("Erf", "y = erf(x), the Gauss error function.", lambda n, x: erf_np(x), _u("erf"), True),
    ("Sin", "y = sin(x).", lambda n, x: np.sin(x), _u("sin"), True),
    ("Cos", "y = cos(x).", lambda n, x: np.cos(x), _u("cos"), True),
    ("Tan", "y = tan(x).", lambda n, x: np.tan(x), _u("tan"), True),
    ("Asin", "y = arcsin(x) (NaN outside [-1, 1]).", lambda n, x: np.arcsin(x), _u("asin"), True),
    ("Acos", "y = arccos(x) (NaN outside [-1, 1]).", lambda n, x: np.arccos(x), _u("acos"), True),
    ("Atan", "y = arctan(x).", lambda n, x: np.arctan(x), _u("atan"), True),
    ("Sinh", "y = sinh(x).", lambda n, x: np.sinh(x), _u("sinh"), True),
    ("Cosh", "y = cosh(x).", lambda n, x: np.cosh(x), _u("cosh"), True),
    ("Asinh", "y = arcsinh(x).", lambda n, x: np.arcsinh(x), _u("asinh"), True),
    ("Acosh", "y = arccosh(x) (NaN below 1).", lambda n, x: np.arccosh(x), _u("acosh"), True),
    ("Atanh", "y = arctanh(x) (+-inf at +-1, NaN outside).", lambda n, x: np.arctanh(x), _u("atanh"), True),
]
for _name, _doc, _np, _sc, _f32 in _UNARY_MATH:
    unary(_name, _doc, _np, _sc, f32=_f32)


def _sign_scalar(node, x):
    one, zero = as_expr(1, x.dtype), as_expr(0, x.dtype)
    if not x.dtype.is_signed:
        return select(x > 0, one, zero)
    return select(x > 0, one, select(x < 0, as_expr(-1, x.dtype), x))


unary("Sign", "y = 1, 0 or -1 by the sign of x (NaN stays NaN; unsigned: 1 or 0).",
      lambda n, x: np.sign(x), _sign_scalar, f32=False)


@op("Relu", EW)
class Relu:
    """y = max(x, 0); NaN stays NaN. Shape and dtype of x (f16/f32/f64/bf16, signed ints).
    Raises ShapeError for other dtypes. ONNX spec: Relu-14."""
    infer = infer_ew

    def reference(node, ins):
        return [np.maximum(ins[0], 0).astype(ins[0].dtype)]

    def scalar(node, x):
        # x < 0 ? 0 : x: NaN stays NaN (an unordered compare is false) and -0 stays -0, as
        # numpy's maximum(x, 0) and onnxruntime's Relu give; one x86 maxps with 0 first, where
        # maximum() (IEEE maximum: -0 < +0, NaN from either side) takes six instructions in
        # every conv epilogue
        zero = as_expr(0, x.dtype)
        return select(x < zero, zero, x)


# ----------------------------------------------------------------------------- binary arithmetic
@op("Add", BC, commutative=True)
class Add:
    """c = a + b, numpy broadcasting; a, b same dtype (any numeric). ONNX spec: Add-14."""
    infer = infer_ew

    def reference(node, ins):
        with np.errstate(all="ignore"):
            return [np.add(ins[0], ins[1])]

    def scalar(node, a, b):
        return a + b


@op("Sub", BC)
class Sub:
    """c = a - b, numpy broadcasting; a, b same dtype (any numeric). ONNX spec: Sub-14."""
    infer = infer_ew

    def reference(node, ins):
        with np.errstate(all="ignore"):
            return [np.subtract(ins[0], ins[1])]

    def scalar(node, a, b):
        return a - b


@op("Mul", BC, commutative=True)
class Mul:
    """c = a * b, numpy broadcasting; a, b same dtype (any numeric). ONNX spec: Mul-14."""
    infer = infer_ew

    def reference(node, ins):
        with np.errstate(all="ignore"):
            return [np.multiply(ins[0], ins[1])]

    def scalar(node, a, b):
        return a * b


def _int_div(a, b):
    """C (truncating) integer division as onnxruntime; x / 0 = 0, INT_MIN / -1 wraps."""
    with np.errstate(all="ignore"):
        safe = np.where(b == 0, 1, b).astype(b.dtype)
        q = np.floor_divide(a, safe)
        if a.dtype.kind == "i":
            r = a - q * safe
            q = q + ((r != 0) & ((a < 0) != (safe < 0))).astype(q.dtype)
        return np.where(b == 0, 0, q).astype(np.result_type(a, b))


@op("Div", BC)
class Div:
    """c = a / b, numpy broadcasting; a, b same dtype. Integer division truncates toward zero
    (as onnxruntime); integer division by zero gives 0 (ONNX leaves it undefined).
    ONNX spec: Div-14."""
    infer = infer_ew

    def reference(node, ins):
        a, b = ins
        if a.dtype.kind in "iu":
            return [_int_div(a, b)]
        with np.errstate(all="ignore"):
            return [np.divide(a, b)]

    def scalar(node, a, b):
        return a / b


def _mod_scalar(node, a, b):
    r = a % b                                   # C remainder: the dividend's sign (fmod)
    if node.attr("fmod", 0) or (not a.dtype.is_signed):
        return r
    fix = r.ne(0) & ((r < 0) ^ (b < 0))
    r2 = select(fix, r + b, r)                  # floor modulo: the divisor's sign
    if a.dtype.is_float:
        return select(r.eq(0), select(b < 0, as_expr(-0.0, b.dtype), as_expr(0.0, b.dtype)), r2)
    return r2


@op("Mod", BC)
class Mod:
    """c = a mod b, numpy broadcasting; a, b same dtype. fmod=0: floor modulo, the result has
    the divisor's sign (Python %, numpy.mod); fmod=1: truncated, the dividend's sign (C fmod).
    Floats with fmod=0 follow Mod-28 (earlier versions required fmod=1). Integer x mod 0 = 0;
    float special cases (inf, NaN, zero divisor) as numpy. ONNX spec: Mod-28."""
    infer = infer_ew

    def reference(node, ins):
        a, b = ins
        with np.errstate(all="ignore"):
            return [np.fmod(a, b) if node.attr("fmod", 0) else np.mod(a, b)]

    scalar = in_f32(_mod_scalar)


def _pow_scalar(node, a, b):
    da, db = a.dtype, b.dtype
    if not da.is_float:  # as onnxruntime: std::pow in double, truncated to the base type
        return binop("pow", a.cast(F64), b.cast(F64)).cast(da)
    if db.is_float and db.itemsize > da.itemsize:
        return binop("pow", a.cast(db), b).cast(da)
    if da in LOWP:
        return binop("pow", a.cast(F32), b.cast(F32)).cast(da)
    return binop("pow", a, b.cast(da))


@op("Pow", BC)
class Pow:
    """z = x ** y, numpy broadcasting. x (T: f16/f32/f64/bf16/i32/i64) and y (T1: any numeric)
    may differ in dtype; z has x's dtype. Integer bases compute in f64 and truncate (as
    onnxruntime: 2 ** -1 = 0). ONNX spec: Pow-15."""
    infer = infer_ew

    def reference(node, ins):
        a, b = ins
        with np.errstate(all="ignore"):
            if a.dtype.kind not in "f" and a.dtype.name != "bfloat16":
                return [np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)]
            if b.dtype.kind == "f" and b.dtype.itemsize > a.dtype.itemsize:
                return [np.power(a.astype(b.dtype), b).astype(a.dtype)]
            if a.dtype.itemsize < 4:
                return [np.power(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)]
            return [np.power(a, b.astype(a.dtype))]

    scalar = _pow_scalar


# ----------------------------------------------------------------------------- variadic
def _variadic(name: str, doc: str, np_fn, expr_fn) -> None:
    def reference(node, ins):
        with np.errstate(all="ignore"):
            y = functools.reduce(np_fn, ins)
            return [np.asarray(y).astype(ins[0].dtype)]

    def scalar(node, *xs):
        return functools.reduce(expr_fn, xs)
    register(OpDef(name=name, kind=BC, infer=infer_ew, reference=reference, scalar=scalar, commutative=True,
                   doc=f"{doc} One or more inputs of one dtype, numpy broadcasting. {_spec(name)}"))


_variadic("Sum", "y = x0 + x1 + ... (left to right).", np.add, lambda a, b: a + b)
_variadic("Max", "y = elementwise maximum; NaN propagates (as onnxruntime).", np.maximum, maximum)
_variadic("Min", "y = elementwise minimum; NaN propagates (as onnxruntime).", np.minimum, minimum)


@op("Mean", BC, commutative=True)
class Mean:
    """y = (x0 + x1 + ...) / n; one or more float inputs of one dtype, numpy broadcasting;
    f16 sums in f32. ONNX spec: Mean-13."""
    infer = infer_ew

    def reference(node, ins):
        dt = ins[0].dtype
        acc = np.float32 if dt.itemsize < 4 else dt
        y = functools.reduce(np.add, [a.astype(acc) for a in ins]) / np.asarray(len(ins), acc)
        return [np.asarray(y).astype(dt)]

    def scalar(node, *xs):
        return functools.reduce(lambda a, b: a + b, xs) / float(len(xs))

    scalar = in_f32(scalar)
