"""Comparison, logical, bitwise, selection and type-conversion ops, and the identity-like ops
Identity and Dropout (ONNX operator spec, "Operators" section per op).

Contract (see ``ir.ops.elementwise``): shapes broadcast numpy-style over all inputs (unary
ops keep theirs); dtypes are the ONNX type constraints of the newest opset; comparisons,
logical ops, IsNaN and IsInf give bool. ShapeError for disallowed or mismatched dtypes,
unbroadcastable shapes and invalid attributes.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import as_expr, binop, select, unop
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.ops.elementwise import BC, EW, _spec, check_types, infer_ew, unary
from tensorfuse.ir.registry import OpDef, OpPatternKind, ShapeError, op, register
from tensorfuse.ir.types import DType, TensorType

I64 = DType.i64


def _binary(name: str, doc: str, np_fn, expr_fn, commutative: bool = False) -> None:
    def reference(node, ins):
        with np.errstate(all="ignore"):
            return [np.asarray(np_fn(node, ins[0], ins[1]))]
    register(OpDef(name=name, kind=BC, infer=infer_ew, reference=reference, commutative=commutative,
                   scalar=lambda node, a, b: expr_fn(node, a, b), doc=f"{doc} {_spec(name)}"))


# ----------------------------------------------------------------------------- comparisons
_binary("Equal", "c = (a == b) as bool; a, b same dtype (bool, ints, floats); NaN == NaN is false.",
        lambda n, a, b: np.equal(a, b), lambda n, a, b: a.eq(b), commutative=True)
_binary("Less", "c = a < b as bool; a, b same numeric dtype.", lambda n, a, b: np.less(a, b), lambda n, a, b: a < b)
_binary("LessOrEqual", "c = a <= b as bool; a, b same numeric dtype.",
        lambda n, a, b: np.less_equal(a, b), lambda n, a, b: a <= b)
_binary("Greater", "c = a > b as bool; a, b same numeric dtype.",
        lambda n, a, b: np.greater(a, b), lambda n, a, b: a > b)
_binary("GreaterOrEqual", "c = a >= b as bool; a, b same numeric dtype.",
        lambda n, a, b: np.greater_equal(a, b), lambda n, a, b: a >= b)

# ----------------------------------------------------------------------------- logical (bool)
_binary("And", "c = a and b; bool inputs.", lambda n, a, b: np.logical_and(a, b), lambda n, a, b: a & b,
        commutative=True)
_binary("Or", "c = a or b; bool inputs.", lambda n, a, b: np.logical_or(a, b), lambda n, a, b: a | b,
        commutative=True)
_binary("Xor", "c = a xor b; bool inputs.", lambda n, a, b: np.logical_xor(a, b), lambda n, a, b: a ^ b,
        commutative=True)
unary("Not", "y = not x; bool input.", lambda n, x: np.logical_not(x), lambda n, x: ~x, f32=False)

# ----------------------------------------------------------------------------- bitwise (ints)
_binary("BitwiseAnd", "c = a & b; a, b same integer dtype.", lambda n, a, b: np.bitwise_and(a, b),
        lambda n, a, b: a & b, commutative=True)
_binary("BitwiseOr", "c = a | b; a, b same integer dtype.", lambda n, a, b: np.bitwise_or(a, b),
        lambda n, a, b: a | b, commutative=True)
_binary("BitwiseXor", "c = a ^ b; a, b same integer dtype.", lambda n, a, b: np.bitwise_xor(a, b),
        lambda n, a, b: a ^ b, commutative=True)
unary("BitwiseNot", "y = ~x; integer input.", lambda n, x: np.invert(x), lambda n, x: ~x, f32=False)


def _direction(node) -> str:
    d = node.attr("direction")
    if d not in ("LEFT", "RIGHT"):
        raise ShapeError(f"attribute direction={d!r}: ONNX BitShift needs 'LEFT' or 'RIGHT'")
    return d


def _bitshift_infer(node):
    _direction(node)
    return infer_ew(node)


def _bitshift_np(node, x, y):
    bits = x.dtype.itemsize * 8
    big = (y < 0) | (y >= bits) if x.dtype.kind == "i" else (y >= bits)
    s = np.where(big, 0, y).astype(x.dtype)
    if _direction(node) == "LEFT":
        return np.where(big, 0, np.left_shift(x, s)).astype(x.dtype)
    fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
    return np.where(big, fill, np.right_shift(x, s)).astype(x.dtype)


def _bitshift_scalar(node, x, y):
    if _direction(node) == "LEFT":
        return binop("shl", x, y)        # shifts >= the width (or negative) give 0
    r = binop("shr", x, y)               # arithmetic for signed types
    if x.dtype.is_signed:                # a too-large shift leaves only the sign fill
        big = (y < 0) | (y >= x.dtype.itemsize * 8)
        r = select(big & (x < 0), as_expr(-1, x.dtype), r)
    return r


register(OpDef(name="BitShift", kind=BC, infer=_bitshift_infer,
               reference=lambda node, ins: [_bitshift_np(node, ins[0], ins[1])], scalar=_bitshift_scalar,
               doc="z = x << y (direction='LEFT') or x >> y ('RIGHT'); x, y same integer dtype; signed "
                   "right shifts are arithmetic; a shift by a negative amount or >= the width gives the "
                   "sign fill (-1 for a negative x shifted right, else 0). ShapeError for another "
                   f"direction. {_spec('BitShift')}"))

# ----------------------------------------------------------------------------- float classes
unary("IsNaN", "y = x is NaN, as bool; float input.", lambda n, x: np.isnan(x),
      lambda n, x: unop("isnan", x), f32=False)


def _isinf_scalar(node, x):
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    inf = unop("isinf", x)
    if pos and neg:
        return inf
    if pos:
        return inf & (x > 0)
    if neg:
        return inf & (x < 0)
    return as_expr(False, DType.bool)


def _isinf_np(node, x):
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    return (np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))


unary("IsInf", "y = x is infinite, as bool; detect_positive / detect_negative (default 1) choose "
      "which signs count; float input.", _isinf_np, _isinf_scalar, f32=False)


# ----------------------------------------------------------------------------- Where
@op("Where", BC)
class Where:
    """out = x where cond else y; cond bool, x and y of one dtype (any); numpy broadcasting of
    all three. ONNX spec: Where-16."""
    infer = infer_ew

    def reference(node, ins):
        return [np.where(ins[0], ins[1], ins[2])]

    def scalar(node, c, x, y):
        return select(c, x, y)


# ----------------------------------------------------------------------------- conversion
def cast_expr(x, to: DType):
    """Cast one kernel-IR value as onnxruntime/numpy do on x86: float to a narrow integer type
    converts through int64 and wraps (-1.0 -> 255 for uint8); NaN -> 0; bool(NaN) is true."""
    src = x.dtype
    if src.is_float and to.is_int and (to.itemsize < 4 or to == DType.u32):
        return x.cast(I64).cast(to)
    return x.cast(to)


def _cast_to(node) -> DType:
    to = node.attr("to")
    if to is None:
        raise ShapeError("attribute 'to' is required")
    try:
        return DType.from_onnx(int(to))
    except TypeError as e:
        raise ShapeError(f"attribute to={to}: {e}") from None


def _lowbit_cast(node) -> bool:
    return node.inputs[0].dtype.is_lowbit or _cast_to(node).is_lowbit


def _lower_lowbit_cast(ctx) -> None:
    """Cast from or to a low-bit type (ir/lowbit.py): a low-bit x is read through its decode
    table (an exact f32); a low-bit float y is encoded from f32 (f64 for f64 and integer x:
    one rounding) with ``saturate``; a low-bit integer y wraps integers and truncates floats
    (out of range: 0); any other y is ``cast_expr`` of the f32 value."""
    from tensorfuse.ir import lowbit
    x, y = ctx.inputs[0], ctx.outputs[0]
    src, dst = ctx.node.inputs[0].dtype, _cast_to(ctx.node)
    table = ctx.pack(lowbit.decode_table(src), "decode") if src.is_lowbit and src != dst else None
    kb = ctx.kernel(params=[x, y] + ([table] if table is not None else []))
    with kb.loop(y.numel, kind="vectorize", role="spatial") as i:
        v = x.flat(i)
        if table is not None and src != dst:
            v = table.flat(v.cast(I64))
        kind = DType.f32 if src.is_lowbit else src      # what v holds (a decoded int4 is an exact f32)
        if src == dst:          # the identity, as RemoveSameTypeCast makes it at opt level 1+
            out = v
        elif dst in lowbit.FLOAT_FORMATS:
            work = DType.f32 if v.dtype in (DType.f32, DType.f16, DType.bf16, DType.bool) else DType.f64
            out = lowbit.encode_float_expr(v.cast(work), dst, bool(ctx.attr("saturate", 1)))
        elif dst in lowbit.INT_BITS:
            out = lowbit.cast_to_int_expr(v, src if src in lowbit.INT_BITS else kind, dst)
        else:
            out = cast_expr(v, dst)
        kb.store(y, i, out)


@op("Cast", EW)
class Cast:
    """y = x converted to the dtype of attribute ``to``; shape of x. Every pair among
    bool, f16, bf16, f32, f64, the 8..64-bit signed and unsigned integers and the low-bit
    types (float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz, float4 e2m1, int4, uint4, int2, uint2;
    ir/lowbit.py); string and float8e8m0 are not supported (ShapeError). Out-of-range float ->
    int conversions are undefined in ONNX; in-range ones truncate toward zero (to a 4- or 2-bit
    integer, out of range gives 0, as onnx.reference). Integers wrap into a narrower integer.
    ``saturate`` (default 1) decides float8's out-of-range values (ONNX spec, Cast: the
    saturate tables); floats round half to even into float8/float4. ``round_mode`` concerns
    float8e8m0 only. A cast to x's own type is the identity (no saturation of a float8 inf).
    ONNX spec: Cast-25."""

    def infer(node):
        if not node.inputs[0].dtype.is_lowbit:      # (Cast-25's T1 has every low-bit type)
            check_types(node)
        return [TensorType(_cast_to(node), node.inputs[0].shape)]

    def reference(node, ins):
        to = _cast_to(node)
        if to.is_lowbit and np.asarray(ins[0]).dtype == to.numpy:
            return [np.array(ins[0], copy=True)]          # the identity (RemoveSameTypeCast)
        if to.is_lowbit:
            from tensorfuse.ir.lowbit import cast_numpy
            return [cast_numpy(ins[0], to, bool(node.attr("saturate", 1)))]
        with np.errstate(all="ignore"):
            return [np.asarray(ins[0]).astype(to.numpy)]

    def scalar_applies(node):
        return not _lowbit_cast(node)

    def scalar(node, x):
        return cast_expr(x, _cast_to(node))

    def lower(ctx):
        if _lowbit_cast(ctx.node):
            _lower_lowbit_cast(ctx)
            return
        from tensorfuse.ir.ops._common import lower_elementwise
        lower_elementwise(ctx, lambda x: cast_expr(x, _cast_to(ctx.node)))


@op("CastLike", EW)
class CastLike:
    """y = x converted to target_type's dtype (its values are unused); shape of x. Same dtypes
    and conversions as Cast. Imported as Cast. ONNX spec: CastLike-25."""

    def infer(node):
        check_types(node)
        return [TensorType(node.inputs[1].dtype, node.inputs[0].shape)]

    def reference(node, ins):
        with np.errstate(all="ignore"):
            return [np.asarray(ins[0]).astype(ins[1].dtype)]

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        kb = ctx.kernel(params=[x, y])
        with kb.loop(y.numel, kind="vectorize") as i:
            kb.store(y, i, cast_expr(x.flat(i), y.dtype))

    def importer(ctx, proto, version):
        x, like = ctx.value(proto.input[0]), ctx.value(proto.input[1])
        attrs = {"to": like.dtype.onnx}
        attrs.update({k: v for k, v in ctx.attrs(proto).items() if k == "saturate"})   # float8 targets
        return ctx.default_import(proto, op="Cast", inputs=[x], attrs=attrs)


# ----------------------------------------------------------------------------- identity-like
@op("Identity", EW, quant_passthrough="copy")
class Identity:
    """y = x (any tensor dtype, same shape). ONNX spec: Identity-25."""
    infer = infer_ew

    def reference(node, ins):
        return [np.array(ins[0], copy=True)]

    def scalar(node, x):
        return x


def _dropout_check(node) -> None:
    tm = const_input(node, 2, "training_mode")
    if tm is not None and bool(np.asarray(tm).reshape(-1)[0]):
        ratio = const_input(node, 1, "ratio")
        r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        if r != 0.0:
            raise ShapeError(f"training_mode=True with ratio={r} (random dropout) is not supported: "
                             f"tensorfuse compiles inference graphs")


@op("Dropout", OpPatternKind.INJECTIVE)
class Dropout:
    """Inference Dropout: output = data; mask (optional, bool, data's shape) is all true.
    data float (f16/f32/f64/bf16); ratio an optional float scalar; training_mode an optional
    bool scalar that must be known at compile time. Raises ShapeError for training_mode=True
    with a nonzero ratio (random dropout is unsupported) or a training_mode computed at run
    time. Dropout-7 and -10 (ratio attribute, no training) are imported as inference Dropout;
    Dropout-7's mask has data's dtype (a Cast of the bool mask). ONNX spec: Dropout-22."""

    def infer(node):
        check_types(node)
        for i, what in ((1, "ratio"), (2, "training_mode")):
            v = node.input(i)
            if v is not None and v.type.numel != 1:
                raise ShapeError(f"input {i} ('{what}') must be a scalar, got shape {list(v.shape)}")
        _dropout_check(node)
        x = node.inputs[0]
        return [x.type, TensorType(DType.bool, x.shape)]

    def reference(node, ins):
        _dropout_check(node)
        x = ins[0]
        return [np.array(x, copy=True), np.ones(x.shape, np.bool_)]

    def lower(ctx):
        _dropout_check(ctx.node)
        x, y = ctx.inputs[0], ctx.outputs[0]
        kb = ctx.kernel(params=[x] + [b for b in ctx.outputs if b is not None])
        with kb.loop(y.numel, kind="vectorize") as i:
            kb.store(y, i, x.flat(i))
            if len(ctx.outputs) > 1 and ctx.outputs[1] is not None:
                kb.store(ctx.outputs[1], i, as_expr(True, DType.bool))

    def importer(ctx, proto, version):
        if version >= 12:
            return ctx.default_import(proto)
        x = ctx.value(proto.input[0])
        want_mask = len(proto.output) > 1 and proto.output[1]
        if version >= 10 or not want_mask:
            return ctx.default_import(proto, inputs=[x], attrs={})
        # Dropout-7: the mask has the data's type
        tmp = ctx.graph.fresh_name(proto.output[1] + "_bool")
        y, m = ctx.builder.op("Dropout", x, name=ctx.node_name(proto), out_names=[proto.output[0], tmp],
                              exact_names=True)
        (mc,) = ctx.builder.op("Cast", m, out_names=[proto.output[1]], exact_names=True, to=x.dtype.onnx)
        return [y, mc]
