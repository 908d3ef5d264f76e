"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul.

The formulas (ONNX spec, QuantizeLinear-25 / DequantizeLinear-25 / DynamicQuantizeLinear-11 /
QLinearMatMul-21):

    QuantizeLinear:    y = saturate(round_half_even(x / y_scale) + y_zero_point)
    DequantizeLinear:  y = (x - x_zero_point) * x_scale
    DynamicQuantizeLinear (uint8):
        scale = (max(0, max x) - min(0, min x)) / 255   (1 if that range is 0)
        zero_point = round_half_even(clamp(0 - min(0, min x) / scale, 0, 255))
        y = saturate(round_half_even(x / scale) + zero_point)

Scale and zero point are per tensor (a scalar or a 1-element vector), per axis (a vector of
x.shape[axis] entries) or blocked (x's rank, ``ceil(x.shape[axis] / block_size)`` along
``axis``, x's dims elsewhere). Per tensor, Q and DQ are elementwise: their ``scalar`` lets fusion
compose them into anchor epilogues and elementwise groups (a QDQ graph's DQ -> Add -> Relu -> Q
is one loop). Per axis and blocked they lower to their own loop (``OpDef.scalar_applies``).

Quantized element types here are the IR's integer types u8, i8, u16, i16 (and i32 for
DequantizeLinear, as the spec allows for biases) and the low-bit storage types (``ir/lowbit.py``:
float8 f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz; float4 f4e2m1; i4, u4, i2, u2), one element
per byte. For a low-bit type the kernel reads the byte through a 256-entry f32 table and writes
the code computed by ``ir.lowbit``'s encoders; those nodes never fuse (no ``scalar``), so no
other op sees the bytes. Low-bit integers saturate to their range; float8 rounds half to even
from the quotient, with ``saturate`` (QuantizeLinear-19+) deciding what an out-of-range value
becomes (Cast's tables); float4 always saturates. The zero point of a float type is added as
the spec's formula says (a float8 zero point of 0 leaves the quotient as it is, -0 included, as
onnx.reference and onnxruntime do).
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir import lowbit
from tensorfuse.ir.kernel import I64, Expr, as_expr, fma, maximum, minimum, select, unop
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.ops.conv import _channel, _per_channel
from tensorfuse.ir.types import DType, TensorType

QUANT_DTYPES = (DType.u8, DType.i8, DType.u16, DType.i16)
SCALE_DTYPES = (DType.f32, DType.f16, DType.bf16)


# ----------------------------------------------------------------------------- shared checks
def quant_mode(x_shape: tuple[int, ...], scale_shape: tuple[int, ...], axis: int, block_size: int,
               what: str = "scale") -> tuple[str, int]:
    """("tensor" | "axis" | "blocked", normalised axis) of a scale / zero point of shape
    ``scale_shape`` for an x of ``x_shape``. Raises ShapeError for a shape that fits none."""
    rank = len(x_shape)
    numel = math.prod(scale_shape)
    if len(scale_shape) == 0 or (len(scale_shape) == 1 and numel == 1 and block_size <= 0):
        return "tensor", axis
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for an input of rank {rank}")
    a = axis % rank
    if block_size > 0:
        want = tuple(-(-d // block_size) if i == a else d for i, d in enumerate(x_shape))
        if tuple(scale_shape) != want:
            raise ShapeError(f"blocked {what} (block_size {block_size}, axis {a}) must have shape "
                             f"{list(want)}, got {list(scale_shape)}")
        return "blocked", a
    if tuple(scale_shape) != (x_shape[a],):
        raise ShapeError(f"{what} of shape {list(scale_shape)} must be a scalar or a vector of "
                         f"x.shape[{a}] = {x_shape[a]} entries")
    return "axis", a


def expand_param(p: np.ndarray, x_shape: tuple[int, ...], mode: str, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point broadcastable to x (numpy), for the references."""
    p = np.asarray(p)
    if mode == "tensor":
        return p.reshape(())
    if mode == "axis":
        shape = [1] * len(x_shape)
        shape[axis] = p.size
        return p.reshape(shape)
    return np.repeat(p, block_size, axis=axis).take(range(x_shape[axis]), axis=axis)


def _expanded(node, ins) -> tuple:
    """(x, its scale, its zero point or None) of a Q/DQ node's inputs, the parameters broadcastable
    to x (numpy), for the references."""
    x, s = ins[0], ins[1]
    z = ins[2] if len(ins) > 2 else None
    mode, axis = _mode_of(node)
    bs = int(node.attr("block_size", 0))
    return x, expand_param(s, x.shape, mode, axis, bs), None if z is None else expand_param(z, x.shape, mode, axis, bs)


def _int_range(dt: DType) -> tuple[int, int]:
    info = np.iinfo(dt.numpy)
    return int(info.min), int(info.max)


def _mode_of(node, x_index: int = 0, scale_index: int = 1) -> tuple[str, int]:
    x, s = node.input(x_index), node.input(scale_index)
    return quant_mode(tuple(x.shape), tuple(s.shape), int(node.attr("axis", 1)), int(node.attr("block_size", 0)))


def _check_params(node, mode: str, axis: int, what: str) -> None:
    """The zero point (input 2) has the scale's shape."""
    s, z = node.input(1), node.input(2)
    if z is not None and tuple(z.shape) != tuple(s.shape) and not (z.type.numel == 1 and s.type.numel == 1):
        raise ShapeError(f"{what} of shape {list(z.shape)} differs from the scale's {list(s.shape)}")


def _per_tensor(node) -> bool:
    """The scalar function applies: scale (and zero point) are one element each."""
    return node.input(1).type.numel == 1 and int(node.attr("block_size", 0)) <= 0


def _lower_per_axis(ctx, fn, tables=(), lowbit_loop: bool = False) -> None:
    """One loop over x for a per-axis or blocked node: ``fn(x, scale, zp)`` per element, with
    the scale and zero point read at x's index along the axis (divided by the block size).
    ``tables``: constant buffers ``fn`` reads (a low-bit type's decode table), kernel parameters.
    ``lowbit_loop``: the per-tensor loop stays one element at a time (a table read is a gather)."""
    x, s = ctx.inputs[0], ctx.inputs[1]
    z = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    y = ctx.outputs[0]
    mode, axis = _mode_of(ctx.node)
    block = int(ctx.attr("block_size", 0))
    kb = ctx.kernel(params=ctx.default_params() + list(tables)) if tables else ctx.kernel()
    if mode == "tensor":
        from tensorfuse.ir.ops._common import flat_vector_loop

        def body(i, lanes):
            xv = x.flat(i) if lanes == 1 else x.vload(i, lanes)
            kb.store(y, i, fn(xv, s.flat(0), None if z is None else z.flat(0)))
        if lowbit_loop:
            with kb.loop(y.numel, kind="vectorize", role="spatial") as i:
                body(i, 1)
        else:
            flat_vector_loop(ctx, kb, y.numel, [x.dtype, y.dtype], body)
        return
    with kb.grid(y.shape) as idx:
        if mode == "axis":
            p = s.flat(idx[axis])
            zp = None if z is None else z.flat(idx[axis])
        else:
            pidx = list(idx)
            pidx[axis] = idx[axis] // block
            p = s[pidx]
            zp = None if z is None else z[pidx]
        kb.store(y, idx, fn(x[idx], p, zp))


# ----------------------------------------------------------------------------- QuantizeLinear
def _q_out_dtype(node) -> DType:
    z = node.input(2)
    out = int(node.attr("output_dtype", 0))
    if z is not None:
        if out and DType.from_onnx(out) != z.dtype:
            raise ShapeError(f"output_dtype {DType.from_onnx(out)} differs from y_zero_point's {z.dtype}")
        return z.dtype
    return DType.from_onnx(out) if out else DType.u8


def _precision(node, x_dtype: DType) -> DType:
    p = int(node.attr("precision", 0))
    if p:
        return DType.from_onnx(p)
    return x_dtype


def _quotient(x: Expr, scale: Expr, precision: DType) -> Expr:
    """x / scale as kernel IR, in f32 (f64 for i32/f64 inputs), rounded to ``precision`` first
    (f16/bf16), as the spec divides in that type."""
    work = DType.f64 if precision in (DType.f64, DType.i32) or x.dtype in (DType.f64, DType.i32) else DType.f32
    q = x.cast(work) / scale.cast(work)
    if precision in (DType.f16, DType.bf16):
        q = q.cast(precision).cast(work)
    return q


def quantize_expr(x: Expr, scale: Expr, zp: Expr | None, out: DType, precision: DType) -> Expr:
    """saturate(round_half_even(x / scale) + zp) as kernel IR, in f32 (f64 for i32/f64 inputs);
    the quotient is rounded to ``precision`` first, as the spec divides in that type."""
    q = _quotient(x, scale, precision)
    work = q.dtype
    q = unop("round", q)
    if zp is not None:
        q = q + zp.cast(work)
    # the float -> int cast saturates to out's range, NaN -> 0 (ir/semantics.py): the spec's
    # saturate, without a clamp of our own before it (which the cast would repeat)
    return q.cast(out)


def quantize_lowbit_expr(x: Expr, scale: Expr, zp_value: Expr | None, out: DType, precision: DType,
                         saturate: bool) -> Expr:
    """QuantizeLinear to low-bit type ``out`` as kernel IR: the u8 code of
    saturate(x / scale + zp) (``zp_value``: the zero point's value as f32, decoded; None: 0).
    Integers: round half to even, add, saturate to the range (ONNX spec, QuantizeLinear-25).
    Float8: a zero point of 0 leaves the quotient alone (-0 stays -0), another is added; then
    Cast's rounding and ``saturate`` (``ir.lowbit.encode_float_expr``). Float4: the zero point
    is added (as onnx.reference does), then the saturating cast."""
    q = _quotient(x, scale, precision)
    z = None if zp_value is None else zp_value.cast(q.dtype)
    if out in lowbit.INT_BITS:
        q = unop("round", q)
        if z is not None:
            q = q + z
        return lowbit.encode_int_expr(q, out)
    if z is not None:
        q = q + z if out == DType.f4e2m1 else select(z.eq(as_expr(0.0, q.dtype)), q, q + z)
    return lowbit.encode_float_expr(q, out, saturate)


def _decode(table, code: Expr) -> Expr:
    """The f32 value of low-bit storage byte ``code`` (a u8 Expr), read from its decode table."""
    return table.flat(code.cast(I64))


def _lowbit_out(node) -> bool:
    return node.outputs[0].dtype.is_lowbit


@op("QuantizeLinear", OpPatternKind.BROADCAST)
class QuantizeLinear:
    """y = saturate(round_half_even(x / y_scale) + y_zero_point). ONNX spec: QuantizeLinear-25.

    Inputs: x (f32/f16/bf16, or i32) of any shape; y_scale (f32/f16/bf16; per tensor, per axis
    [x.shape[axis]] or blocked, see the module docstring); y_zero_point (optional, the output's
    dtype, the scale's shape). Output: y of x's shape in y_zero_point's dtype, else
    ``output_dtype``, else u8 (u8, i8, u16, i16, or a low-bit type: f8e4m3fn, f8e4m3fnuz,
    f8e5m2, f8e5m2fnuz, f4e2m1, i4, u4, i2, u2; see the module docstring). ``saturate``
    (default 1) concerns float8 outputs only (ONNX spec, Cast: the saturate tables);
    ``precision`` names the type of the division (default x's). Raises ShapeError for other
    dtypes or mis-shaped scales.
    """

    def infer(node):
        x, s = node.input(0), node.input(1)
        if not (x.dtype.is_float or x.dtype == DType.i32):
            raise ShapeError(f"x has dtype {x.dtype}; QuantizeLinear takes a float or i32 input")
        if s.dtype not in SCALE_DTYPES + (DType.i32,):
            raise ShapeError(f"y_scale has dtype {s.dtype}; expected f32, f16, bf16 or i32")
        out = _q_out_dtype(node)
        if out not in QUANT_DTYPES and not out.is_lowbit:
            raise ShapeError(f"output type {out} is not supported (u8, i8, u16, i16 and the low-bit "
                             f"types: float8, float4, int4, uint4, int2, uint2)")
        mode, axis = _mode_of(node)
        _check_params(node, mode, axis, "y_zero_point")
        return [TensorType(out, x.shape)]

    def reference(node, ins):
        x, sc, zc = _expanded(node, ins)
        out = node.outputs[0].dtype
        p = int(node.attr("precision", 0))
        if p:
            q = x.astype(DType.from_onnx(p).numpy) / sc.astype(DType.from_onnx(p).numpy)
        else:
            q = x / sc
        if out.is_lowbit:
            return [_quantize_lowbit_np(q, zc, out, bool(node.attr("saturate", 1)))]
        q = np.rint(q).astype(np.float64)
        if zc is not None:
            q = q + zc.astype(np.float64)
        lo, hi = _int_range(out)
        return [np.clip(q, lo, hi).astype(out.numpy)]

    def scalar_applies(node):
        return _per_tensor(node) and not _lowbit_out(node)

    def scalar(node, x, s, z=None):
        return quantize_expr(x, s, z, node.outputs[0].dtype, _precision(node, node.input(0).dtype))

    def lower(ctx):
        node = ctx.node
        out = node.outputs[0].dtype
        prec = _precision(node, node.input(0).dtype)
        if out.is_lowbit:
            table = ctx.pack(lowbit.decode_table(out), "decode") if node.input(2) is not None else None
            sat = bool(node.attr("saturate", 1))
            _lower_per_axis(ctx, lambda x, s, z: quantize_lowbit_expr(
                x, s, None if z is None else _decode(table, z), out, prec, sat),
                tables=[table] if table is not None else [], lowbit_loop=True)
            return
        _lower_per_axis(ctx, lambda x, s, z: quantize_expr(x, s, z, out, prec))


# ----------------------------------------------------------------------------- DequantizeLinear
def _quantize_lowbit_np(q: np.ndarray, zc: np.ndarray | None, out: DType, saturate: bool) -> np.ndarray:
    """The reference of :func:`quantize_lowbit_expr` on the quotient ``q`` (numpy, with
    ``ml_dtypes``' conversions; ``zc`` the zero point broadcastable to q, or None)."""
    z = None if zc is None else zc.astype(np.float32).astype(q.dtype if q.dtype.kind == "f" else np.float64)
    if out in lowbit.INT_BITS:
        q = np.rint(q).astype(np.float64)
        return lowbit.encode_numpy(q if z is None else q + z, out)
    if z is not None:
        q = q + z if out == DType.f4e2m1 else np.where(z == 0, q, q + z)
    return lowbit.encode_numpy(q, out, saturate)


def dequantize_expr(x: Expr, scale: Expr, zp: Expr | None, out: DType) -> Expr:
    """(x - zp) * scale in f32 (the spec's float32 difference), rounded once to ``out``."""
    d = x.cast(DType.f32)
    if zp is not None:
        d = d - zp.cast(DType.f32)
    return (d * scale.cast(DType.f32)).cast(out)


def _dq_out_dtype(node) -> DType:
    out = int(node.attr("output_dtype", 0))
    return DType.from_onnx(out) if out else node.input(1).dtype


@op("DequantizeLinear", OpPatternKind.BROADCAST)
class DequantizeLinear:
    """y = (x - x_zero_point) * x_scale. ONNX spec: DequantizeLinear-25.

    Inputs: x (u8, i8, u16, i16, i32, or a low-bit type: f8e4m3fn, f8e4m3fnuz, f8e5m2,
    f8e5m2fnuz, f4e2m1, i4, u4, i2, u2) of any shape; x_scale (f32/f16/bf16; per tensor, per
    axis [x.shape[axis]] or blocked); x_zero_point (optional, x's dtype, the scale's shape).
    Output: y of x's shape in ``output_dtype`` if given, else the scale's dtype. The difference
    is taken in float32, as the spec's reference does (a low-bit x and zero point are read as
    their exact f32 values; float8's NaN and infinity propagate). Raises ShapeError for other dtypes or
    mis-shaped scales.
    """

    def infer(node):
        x, s, z = node.input(0), node.input(1), node.input(2)
        if x.dtype not in QUANT_DTYPES + (DType.i32,) and not x.dtype.is_lowbit:
            raise ShapeError(f"x has dtype {x.dtype}; DequantizeLinear takes u8, i8, u16, i16, i32 or "
                             f"a low-bit type (float8, float4, int4, uint4, int2, uint2)")
        if s.dtype not in SCALE_DTYPES:
            raise ShapeError(f"x_scale has dtype {s.dtype}; expected f32, f16 or bf16")
        if z is not None and z.dtype != x.dtype:
            raise ShapeError(f"x_zero_point has dtype {z.dtype}, x has {x.dtype}")
        mode, axis = _mode_of(node)
        _check_params(node, mode, axis, "x_zero_point")
        out = _dq_out_dtype(node)
        if not out.is_float:
            raise ShapeError(f"output_dtype {out} is not a float type")
        return [TensorType(out, x.shape)]

    def reference(node, ins):
        x, sc, zc = _expanded(node, ins)
        d = x.astype(np.float32)
        if zc is not None:
            d = d - zc.astype(np.float32)
        y = d * sc.astype(np.float32)
        return [y.astype(node.outputs[0].dtype.numpy)]

    def scalar_applies(node):
        return _per_tensor(node) and not node.input(0).dtype.is_lowbit

    def scalar(node, x, s, z=None):
        return dequantize_expr(x, s, z, node.outputs[0].dtype)

    def lower(ctx):
        out = ctx.outputs[0].dtype
        xt = ctx.node.input(0).dtype
        if xt.is_lowbit:
            table = ctx.pack(lowbit.decode_table(xt), "decode")
            _lower_per_axis(ctx, lambda x, s, z: dequantize_expr(
                _decode(table, x), s, None if z is None else _decode(table, z), out), tables=[table],
                lowbit_loop=True)
            return
        _lower_per_axis(ctx, lambda x, s, z: dequantize_expr(x, s, z, out))


# ----------------------------------------------------------------------------- DynamicQuantizeLinear
def dynamic_scale_np(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """(scale, zero point) of DynamicQuantizeLinear-11 for u8, computed in float32."""
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32(hi - lo) / np.float32(255)
    zp = np.float32(np.clip(np.float32(0) - lo / scale, 0, 255))
    return scale, np.uint8(np.rint(zp))


#: partial min/max vectors DynamicQuantizeLinear's range pass keeps (independent chains)
DQL_ACCUMULATORS = 4


@op("DynamicQuantizeLinear", OpPatternKind.OPAQUE)
class DynamicQuantizeLinear:
    """(y, y_scale, y_zero_point) = DynamicQuantizeLinear(x). ONNX spec: DynamicQuantizeLinear-11.

    x: f32, any shape. y: u8 of x's shape; y_scale: f32 []; y_zero_point: u8 []. The range
    always includes 0 (max(0, max x), min(0, min x)); scale = range / 255 (1 for an all-zero x);
    zero point = round_half_even(clamp(-min / scale, 0, 255)); y = saturate(round(x / scale) + zp).
    The kernel reads x twice: min and max in one pass (:data:`DQL_ACCUMULATORS` partial vectors
    of each), then the quantization. Raises ShapeError for a non-f32 x.
    """

    def infer(node):
        x = node.input(0)
        if x.dtype != DType.f32:
            raise ShapeError(f"x has dtype {x.dtype}; DynamicQuantizeLinear takes f32")
        return [TensorType(DType.u8, x.shape), TensorType(DType.f32, ()), TensorType(DType.u8, ())]

    def reference(node, ins):
        x = ins[0]
        scale, zp = dynamic_scale_np(x)
        y = np.clip(np.rint(x / scale) + np.float32(zp), 0, 255).astype(np.uint8)
        return [y, np.array(scale, np.float32), np.array(zp, np.uint8)]

    def lower(ctx):
        from tensorfuse.ir.kernel import broadcast, select
        from tensorfuse.ir.ops._common import flat_vector_loop
        x = ctx.inputs[0]
        y, ys, yz = ctx.outputs
        f32 = DType.f32
        kb = ctx.kernel()
        lanes = 1 if ctx.target.simt else max(1, ctx.target.lanes(f32))
        n = x.numel
        main = n - n % lanes
        # ACC independent partial vectors per bound: llvm.minimum / maximum (NaN-propagating)
        # is a chain of about five dependent operations, so one accumulator ran the pass at a
        # fifth of the load rate (197x3072: 0.24 against onnxruntime's 0.11 ms)
        acc = DQL_ACCUMULATORS if lanes > 1 else 1
        lo = kb.local(f32, (acc * lanes,), hint="lo")
        hi = kb.local(f32, (acc * lanes,), hint="hi")
        zero = as_expr(0.0, f32)

        def vec(buf, a):
            return buf.vload(a * lanes, lanes) if lanes > 1 else buf[a]
        # min/max with 0 as the start: the range includes 0 as the spec's max(0, .)/min(0, .)
        for a in range(acc):
            kb.store(lo, a * lanes, broadcast(zero, lanes) if lanes > 1 else zero)
            kb.store(hi, a * lanes, broadcast(zero, lanes) if lanes > 1 else zero)
        step = lanes * acc
        blocks = n // step
        if blocks:
            with kb.reduce(blocks, hint="b") as blk:
                for a in range(acc):
                    v = x.vload(blk * step + a * lanes, lanes) if lanes > 1 else x.flat(blk * step + a)
                    kb.store(lo, a * lanes, minimum(vec(lo, a), v))
                    kb.store(hi, a * lanes, maximum(vec(hi, a), v))
        if main > blocks * step:
            with kb.reduce(main // lanes, start=blocks * acc, hint="c") as c:
                v = x.vload(c * lanes, lanes) if lanes > 1 else x.flat(c)
                kb.store(lo, 0, minimum(vec(lo, 0), v))
                kb.store(hi, 0, maximum(vec(hi, 0), v))
        with kb.reduce(n, start=main, hint="t") as t:
            kb.store(lo, 0, minimum(lo[0], x.flat(t)))
            kb.store(hi, 0, maximum(hi[0], x.flat(t)))
        mn, mx = lo.flat(0), hi.flat(0)
        for ln in range(1, acc * lanes):
            mn, mx = minimum(mn, lo.flat(ln)), maximum(mx, hi.flat(ln))
        sc = kb.local(f32, (2,), hint="sc")
        kb.store(sc, 0, select(mx.eq(mn), as_expr(1.0, f32), (mx - mn) / as_expr(255.0, f32)))
        zpf = minimum(maximum(zero - mn / sc.flat(0), zero), as_expr(255.0, f32))
        kb.store(sc, 1, unop("round", zpf))
        kb.store(ys, 0, sc.flat(0))
        kb.store(yz, 0, sc.flat(1).cast(DType.u8))

        def body(i, w):
            s, z = sc.flat(0), sc.flat(1)
            xv = x.vload(i, w) if w > 1 else x.flat(i)
            q = unop("round", xv / s) + z
            kb.store(y, i, minimum(maximum(q, zero), as_expr(255.0, f32)).cast(DType.u8))
        flat_vector_loop(ctx, kb, n, [f32, DType.u8], body)

    def flops(node):
        return 4.0 * node.inputs[0].type.numel


# ----------------------------------------------------------------------------- QLinearMatMul
@op("QLinearMatMul", OpPatternKind.OUT_ELEMWISE_FUSABLE)
class QLinearMatMul:
    """Quantized MatMul. ONNX spec: QLinearMatMul-21.

    Inputs: a (u8/i8), a_scale, a_zero_point (a's dtype), b (u8/i8), b_scale, b_zero_point
    (b's dtype), y_scale, y_zero_point (its dtype is y's). Scales are f32/f16/bf16; a's
    parameters are per tensor or per row ([M]), b's per tensor or per column ([N]), y's per
    tensor; numpy.matmul shapes. y = saturate(round_half_even(acc * a_scale * b_scale / y_scale)
    + y_zero_point) with acc the int32 product of (a - a_zp) and (b - b_zp); the scale product is
    formed in float32. Raises ShapeError as MatMulInteger does and for other dtypes.
    """

    def infer(node):
        from tensorfuse.ir.ops.linalg import matmul_shape
        a, b, yz = node.input(0), node.input(3), node.input(7)
        for v, what in ((a, "a"), (b, "b"), (yz, "y_zero_point")):
            if v is None:
                raise ShapeError(f"input {what} is required")
            if v.dtype not in (DType.u8, DType.i8):
                raise ShapeError(f"{what} has dtype {v.dtype}; QLinearMatMul takes u8 or i8")
        for i, what in ((1, "a_scale"), (4, "b_scale"), (6, "y_scale")):
            v = node.input(i)
            if v is None or v.dtype not in SCALE_DTYPES:
                raise ShapeError(f"{what} must be f32, f16 or bf16")
        for i, like, what in ((2, a, "a_zero_point"), (5, b, "b_zero_point")):
            v = node.input(i)
            if v is not None and v.dtype != like.dtype:
                raise ShapeError(f"{what} has dtype {v.dtype}, expected {like.dtype}")
        for i, what in ((6, "y_scale"), (7, "y_zero_point")):
            if node.input(i).type.numel != 1:
                raise ShapeError(f"{what} must be a scalar")
        return [TensorType(yz.dtype, matmul_shape(a.shape, b.shape))]

    def reference(node, ins):
        a, asc, az, b, bsc, bz, ysc, yz = ins
        ai = a.astype(np.int64) - _row_param(az, a).astype(np.int64)
        bi = b.astype(np.int64) - np.asarray(bz).astype(np.int64)
        acc = np.matmul(ai, bi)
        scale = (_row_param(asc, a).astype(np.float32) * np.asarray(bsc, np.float32)
                 / np.float32(np.asarray(ysc).reshape(())))
        y = np.rint(acc.astype(np.float32) * scale) + np.float32(np.asarray(yz).reshape(()))
        lo, hi = _int_range(DType.from_numpy(yz.dtype))
        return [np.clip(y, lo, hi).astype(yz.dtype)]

    def lower(ctx):
        from tensorfuse.ir.ops.linalg import emit_integer_matmul
        a, asc, az, b, bsc, bz, ysc, yz = ctx.inputs
        y = ctx.outputs[0]
        lo, hi = _int_range(y.dtype)
        f32 = DType.f32

        def finish(acc, bidx, i, j):
            a_s = (asc.flat(i) if asc.numel > 1 else asc.flat(0)).cast(f32)
            b_s = (bsc.flat(j) if bsc.numel > 1 else bsc.flat(0)).cast(f32)
            q = unop("round", acc.cast(f32) * (a_s * b_s / ysc.flat(0).cast(f32))) + yz.flat(0).cast(f32)
            return minimum(maximum(q, as_expr(float(lo), f32)), as_expr(float(hi), f32)).cast(y.dtype)

        emit_integer_matmul(ctx, a, b, y, az, bz, finish=finish)

    def flops(node):
        a = node.inputs[0].shape
        return 2.0 * node.outputs[0].type.numel * a[-1]


def _row_param(p, a: np.ndarray) -> np.ndarray:
    """A per-tensor or per-row ([M]) parameter of a, broadcastable to a."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    return p.reshape(-1, 1)


# ----------------------------------------------------------------------------- integer products to float
def _check_scalar_or(node, i: int, m: int | None, what: str, dtypes) -> None:
    v = node.input(i)
    if v is None:
        return
    if v.dtype not in dtypes:
        raise ShapeError(f"{what} has dtype {v.dtype}; expected {' or '.join(str(d) for d in dtypes)}")
    if not (v.type.numel == 1 and v.type.rank <= 1) and not (m is not None and tuple(v.shape) == (m,)):
        per = f" or [{m}]" if m is not None else ""
        raise ShapeError(f"{what} must be a scalar{per}, got shape {list(v.shape)}")


def _conv_attrs_for(name: str):
    from tensorfuse.ir.registry import onnx_attr_specs
    return onnx_attr_specs(name)


@op("ConvIntegerToFloat", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain="tensorfuse", epilogue_casts=True,
    attrs=_conv_attrs_for("Conv"))
class ConvIntegerToFloat:
    """Y = ConvInteger(X, W, x_zero_point, w_zero_point) * (x_scale * w_scale[m]) + B[m], in f32.

    What the quantization rules (compiler/rules/quantize.py) make of
    Conv(DequantizeLinear(X), DequantizeLinear(W), B): the convolution of the quantized values
    in int32 (exact), then one float scale per output channel and the float bias. Inputs: X
    (u8/i8) [N, C, D1..Dn]; W (i8/u8) [M, C/group, k1..kn]; x_scale (f32 scalar); w_scale (f32,
    scalar or [M]); x_zero_point (optional, X's dtype, scalar); w_zero_point (optional, W's
    dtype, scalar or [M]); B (optional, f32 [M]). Attributes: Conv's (ONNX spec: Conv-22; the
    int32 convolution is ConvInteger-10's). Its epilogue may end in another dtype (a
    QuantizeLinear stores u8). Raises ShapeError for other dtypes or parameter shapes.
    """

    def infer(node):
        from tensorfuse.ir.ops.conv import QUANT_TYPES, _infer_conv_shape
        x, w = node.input(0), node.input(1)
        for v, what in ((x, "X"), (w, "W")):
            if v.dtype not in QUANT_TYPES:
                raise ShapeError(f"{what} has dtype {v.dtype}; ConvIntegerToFloat takes u8 or i8")
        m = w.shape[0] if w.type.rank else None
        _check_scalar_or(node, 2, None, "x_scale", (DType.f32,))
        _check_scalar_or(node, 3, m, "w_scale", (DType.f32,))
        _check_scalar_or(node, 4, None, "x_zero_point", (x.dtype,))
        _check_scalar_or(node, 5, m, "w_zero_point", (w.dtype,))
        b = node.input(6)
        if b is not None and (b.dtype != DType.f32 or tuple(b.shape) != (m,)):
            raise ShapeError(f"B must be f32 [{m}], got {b.dtype}{list(b.shape)}")
        if node.input(2) is None or node.input(3) is None:
            raise ShapeError("x_scale and w_scale are required")
        return [TensorType(DType.f32, _infer_conv_shape(node, x, w, None))]

    def reference(node, ins):
        from tensorfuse.ir.ops.conv import conv_geometry_of, conv_reference
        ins = list(ins) + [None] * (7 - len(ins))
        x, w, xs, ws, xz, wz, b = ins
        m = w.shape[0]
        xi = x.astype(np.int64) - (0 if xz is None else int(np.asarray(xz).reshape(())))
        wi = w.astype(np.int64) - (0 if wz is None else _per_channel(wz, m, np.int64).reshape(m)
                                   .reshape((m,) + (1,) * (w.ndim - 1)))
        acc = conv_reference(xi, wi, None, int(node.attr("group", 1)), conv_geometry_of(node), acc_dtype=np.int64)
        shape = (1, m) + (1,) * (x.ndim - 2)
        scale = (np.float32(np.asarray(xs).reshape(())) * _per_channel(ws, m, np.float32).reshape(m)).reshape(shape)
        y = acc.astype(np.float32) * scale
        if b is not None:
            y = y + b.astype(np.float32).reshape(shape)
        return [y.astype(np.float32)]

    def lower(ctx):
        from tensorfuse.ir.ops.conv import conv_geometry_of, emit_conv
        ins = list(ctx.inputs) + [None] * (7 - len(ctx.inputs))
        x, w, xs, ws, xz, wz, b = ins
        i32, f32 = DType.i32, DType.f32

        def finish(acc, oc):
            # one fused multiply-add where the target has FMA (the reference rounds the
            # product and the sum apart: at most one ulp of f32 between them)
            scale = xs.flat(0) * _channel(ws, oc, f32)
            return fma(acc.cast(f32), scale, b.flat(oc)) if b is not None else acc.cast(f32) * scale

        emit_conv(ctx, x, w, None, ctx.outputs[0], int(ctx.attr("group", 1)), conv_geometry_of(ctx.node),
                  acc_dtype=i32, x_zero=xz, w_zero=wz, finish=finish)

    def flops(node):
        from tensorfuse.ir.ops.conv import conv_flops
        return conv_flops(node)


@op("MatMulIntegerToFloat", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain="com.microsoft", epilogue_casts=True)
class MatMulIntegerToFloat:
    """Y = MatMulInteger(A, B, a_zero_point, b_zero_point) * (a_scale * b_scale) + bias, in the
    scales' float type. onnxruntime contrib op com.microsoft.MatMulIntegerToFloat (its
    quantizer and optimizer write it; the quantization rules make it of MatMul/Gemm between
    DequantizeLinear nodes and of dynamic quantization's MatMulInteger -> Cast -> Mul).

    Inputs: A (u8/i8) [..., M, K]; B (i8/u8) [..., K, N] (numpy.matmul shapes); a_scale (f32,
    scalar); b_scale (f32, scalar or [N]); a_zero_point (optional, A's dtype, scalar);
    b_zero_point (optional, B's dtype, scalar or [N]); bias (optional, f32 [N]). The product of
    the scales is formed first (as onnxruntime does), then acc * scale + bias. Raises
    ShapeError for other dtypes or parameter shapes.
    """

    def infer(node):
        from tensorfuse.ir.ops.linalg import matmul_shape
        a, b = node.input(0), node.input(1)
        for v, what in ((a, "A"), (b, "B")):
            if v.dtype not in (DType.u8, DType.i8):
                raise ShapeError(f"{what} has dtype {v.dtype}; MatMulIntegerToFloat takes u8 or i8")
        n = b.shape[-1] if b.type.rank >= 2 else None
        if node.input(2) is None or node.input(3) is None:
            raise ShapeError("a_scale and b_scale are required")
        _check_scalar_or(node, 2, None, "a_scale", (DType.f32,))
        _check_scalar_or(node, 3, n, "b_scale", (DType.f32,))
        _check_scalar_or(node, 4, None, "a_zero_point", (a.dtype,))
        _check_scalar_or(node, 5, n, "b_zero_point", (b.dtype,))
        bias = node.input(6)
        if bias is not None and (bias.dtype != DType.f32 or tuple(bias.shape) != (n,)):
            raise ShapeError(f"bias must be f32 [{n}], got {bias.dtype}{list(bias.shape)}")
        return [TensorType(DType.f32, matmul_shape(a.shape, b.shape))]

    def reference(node, ins):
        ins = list(ins) + [None] * (7 - len(ins))
        a, b, asc, bsc, az, bz, bias = ins
        n = b.shape[-1]
        ai = a.astype(np.int64) - (0 if az is None else int(np.asarray(az).reshape(())))
        bi = b.astype(np.int64) - (0 if bz is None else _per_channel(bz, n, np.int64).reshape(n))
        acc = np.matmul(ai, bi)
        scale = np.float32(np.asarray(asc).reshape(())) * _per_channel(bsc, n, np.float32).reshape(n)
        y = acc.astype(np.float32) * scale
        if bias is not None:
            y = y + bias.astype(np.float32)
        return [y.astype(np.float32)]

    def lower(ctx):
        from tensorfuse.ir.ops.linalg import emit_integer_matmul
        ins = list(ctx.inputs) + [None] * (7 - len(ctx.inputs))
        a, b, asc, bsc, az, bz, bias = ins
        f32 = DType.f32

        def finish(acc, bidx, i, j):
            # one fused multiply-add where the target has FMA (as ConvIntegerToFloat's)
            scale = asc.flat(0) * _channel(bsc, j, f32)
            return fma(acc.cast(f32), scale, bias.flat(j)) if bias is not None else acc.cast(f32) * scale

        emit_integer_matmul(ctx, a, b, ctx.outputs[0], az, bz, finish=finish)

    def flops(node):
        return 2.0 * node.outputs[0].type.numel * node.inputs[0].shape[-1]


# ----------------------------------------------------------------------------- TableLookup
def _table_index(x: Expr) -> Expr:
    """The table position of an 8-bit value: its byte, 0..255 (an i8 -1 is entry 255)."""
    if x.dtype == DType.i8:
        x = x.cast(DType.u8)
    return x.cast(DType.i32)


@op("TableLookup", OpPatternKind.ELEMWISE, domain="tensorfuse")
class TableLookup:
    """y = table[x]: x u8 or i8 (any shape), ``table`` a tensor attribute of 256 elements whose
    dtype is y's; entry b is the output for the input whose byte is b (an i8 input -1 reads
    entry 255). What an 8-bit elementwise chain of a QDQ model becomes
    (:class:`~tensorfuse.compiler.rules.quantize.QuantizedElementwiseToTable`:
    Q(Sigmoid(DQ(x))), Q(DQ(x) * Q(Sigmoid(DQ(x)))) ...), as onnxruntime's QLinearSigmoid and
    QLinearLeakyRelu tabulate their function over the 256 inputs
    (onnxruntime/contrib_ops/cpu/quantization/qlinear_lookup_table.cc). Fuses into producers'
    epilogues and elementwise loops; the llvm backend reads vectors of entries with one gather.
    Raises ShapeError for another input dtype or a table that is not 256 elements."""

    def infer(node):
        x = node.inputs[0]
        t = node.attr("table", None)
        if x.dtype not in (DType.u8, DType.i8):
            raise ShapeError(f"input must be u8 or i8, got {x.dtype}")
        if not isinstance(t, np.ndarray) or t.size != 256:
            raise ShapeError("attribute 'table' must be a tensor of 256 elements")
        return [TensorType(DType.from_numpy(t.dtype), x.shape)]

    def reference(node, ins):
        t = np.asarray(node.attr("table")).reshape(-1)
        return [t[ins[0].view(np.uint8).astype(np.int64)] if ins[0].dtype == np.int8 else t[ins[0].astype(np.int64)]]

    def scalar(node, x):
        from tensorfuse.ir.kernel import lookup
        t = np.asarray(node.attr("table")).reshape(-1)
        return lookup(t.tolist(), DType.from_numpy(t.dtype), _table_index(x))
