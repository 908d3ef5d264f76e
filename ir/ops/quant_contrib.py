"""onnxruntime's quantized contrib ops (domain com.microsoft), as its quantizer (QOperator
format) and optimizer write them into files: QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearConcat, QGemm, DynamicQuantizeMatMul.

Each means its QDQ decomposition (onnxruntime's contrib op documentation, docs/ContribOperators.md):
dequantize the inputs (DequantizeLinear), the float op, quantize the result (QuantizeLinear).
The frontend imports each *as* that decomposition (``importer``), so one meaning serves
everything after it: the quantization rules make integer kernels of the products (QGemm,
DynamicQuantizeMatMul) and fuse_ops puts the elementwise ones in one loop or an integer
kernel's epilogue. ``infer`` and ``reference`` here are the same decomposition, for a node built
directly in the IR. A scale / zero point is per tensor unless the op says otherwise; an absent
output zero point means uint8 with zero point 0.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.registry import AttrSpec, OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

MS = "com.microsoft"


def _dq(x, s, z):
    d = x.astype(np.float32)
    if z is not None:
        d = d - np.asarray(z).astype(np.float32)
    return d * np.asarray(s).astype(np.float32)


def _q(y, s, z):
    dt = np.uint8 if z is None else np.asarray(z).dtype
    info = np.iinfo(dt)
    q = np.rint(y / np.asarray(s).astype(np.float32)).astype(np.float64)
    if z is not None:
        q = q + float(np.asarray(z).reshape(-1)[0] if np.asarray(z).size == 1 else 0)
    return np.clip(q, info.min, info.max).astype(dt)


def _out_type(node, zp_index: int, shape) -> list[TensorType]:
    z = node.input(zp_index)
    dt = DType.u8 if z is None else z.dtype
    if dt not in (DType.u8, DType.i8):
        raise ShapeError(f"the output zero point is {dt}; expected u8 or i8")
    return [TensorType(dt, tuple(shape))]


def _ins(ctx, proto):
    return [ctx.value(n) for n in proto.input] + [None] * 12


def _name(proto, part: str) -> str:
    return f"{proto.name or proto.op_type}/{part}"


def _dq_v(ctx, proto, x, s, z, part):
    return ctx.builder.op("DequantizeLinear", x, s, z, name=_name(proto, part))


def _q_out(ctx, proto, y, s, z):
    """The node's output: QuantizeLinear of ``y``, under the ONNX output name."""
    return ctx.builder.op("QuantizeLinear", y, s, z, name=_name(proto, "QuantizeLinear"),
                          out_names=[proto.output[0]], exact_names=True)[0]


def _binary(name: str, float_op: str):
    def infer(node):
        from tensorfuse.ir.ops._common import broadcast_shapes
        a, b = node.input(0), node.input(3)
        return _out_type(node, 7, broadcast_shapes(a.shape, b.shape))

    def reference(node, ins):
        ins = list(ins) + [None] * (8 - len(ins))
        a, asc, az, b, bsc, bz, cs, cz = ins
        fa, fb = _dq(a, asc, az), _dq(b, bsc, bz)
        return [_q(fa + fb if float_op == "Add" else fa * fb, cs, cz)]

    def importer(ctx, proto, version):
        a, asc, az, b, bsc, bz, cs, cz = _ins(ctx, proto)[:8]
        fa = _dq_v(ctx, proto, a, asc, az, "DequantizeLinear_A")
        fb = _dq_v(ctx, proto, b, bsc, bz, "DequantizeLinear_B")
        y = ctx.builder.op(float_op, fa, fb, name=_name(proto, float_op))
        return [_q_out(ctx, proto, y, cs, cz)]

    doc = (f"C = QuantizeLinear({float_op}(DequantizeLinear(A), DequantizeLinear(B)), C_scale, C_zero_point). "
           f"onnxruntime contrib op com.microsoft.{name}. Inputs: A, A_scale, A_zero_point, B, B_scale, "
           f"B_zero_point, C_scale, C_zero_point (u8/i8 data, f32 scales, multidirectional broadcasting). "
           f"Imported as that decomposition.")
    op(name, OpPatternKind.BROADCAST, domain=MS, attrs={})(
        type(name, (), {"infer": staticmethod(infer), "reference": staticmethod(reference),
                        "importer": staticmethod(importer), "__doc__": doc}))


_binary("QLinearAdd", "Add")
_binary("QLinearMul", "Mul")


def _unary(name: str, float_op: str, attrs: dict, float_attrs):
    def infer(node):
        return _out_type(node, 4, node.input(0).shape)

    def reference(node, ins):
        from tensorfuse.ir.registry import get_op
        ins = list(ins) + [None] * (5 - len(ins))
        x, xs, xz, ys, yz = ins
        fx = _dq(x, xs, xz)
        if float_op == "Sigmoid":
            fy = (1.0 / (1.0 + np.exp(-fx.astype(np.float64)))).astype(np.float32)
        else:
            alpha = np.float32(node.attr("alpha", 0.01))
            fy = np.where(fx < 0, fx * alpha, fx).astype(np.float32)
        return [_q(fy, ys, yz)]

    def importer(ctx, proto, version):
        x, xs, xz, ys, yz = _ins(ctx, proto)[:5]
        fx = _dq_v(ctx, proto, x, xs, xz, "DequantizeLinear")
        y = ctx.builder.op(float_op, fx, name=_name(proto, float_op), **float_attrs(ctx.attrs(proto)))
        return [_q_out(ctx, proto, y, ys, yz)]

    doc = (f"Y = QuantizeLinear({float_op}(DequantizeLinear(X, X_scale, X_zero_point)), Y_scale, Y_zero_point). "
           f"onnxruntime contrib op com.microsoft.{name}; imported as that decomposition.")
    op(name, OpPatternKind.ELEMWISE, domain=MS, attrs=attrs)(
        type(name, (), {"infer": staticmethod(infer), "reference": staticmethod(reference),
                        "importer": staticmethod(importer), "__doc__": doc}))


_unary("QLinearSigmoid", "Sigmoid", {}, lambda a: {})
_unary("QLinearLeakyRelu", "LeakyRelu", {"alpha": AttrSpec("float", 0.01)},
       lambda a: {"alpha": float(a.get("alpha", 0.01))})


@op("QLinearGlobalAveragePool", OpPatternKind.OPAQUE, domain=MS,
    attrs={"channels_last": AttrSpec("int", 0)})
class QLinearGlobalAveragePool:
    """Y = QuantizeLinear(GlobalAveragePool(DequantizeLinear(X, x_scale, x_zero_point)), y_scale,
    y_zero_point). onnxruntime contrib op com.microsoft.QLinearGlobalAveragePool; X [N, C, D1..Dn]
    (``channels_last=1``: [N, D1..Dn, C]); Y keeps X's rank with 1 for every spatial dim.
    Imported as that decomposition (channels last through Transposes around it)."""

    def infer(node):
        x = node.input(0)
        r = x.type.rank
        if r < 3:
            raise ShapeError(f"X must have rank >= 3, got {r}")
        if int(node.attr("channels_last", 0)):
            shape = (x.shape[0],) + (1,) * (r - 2) + (x.shape[-1],)
        else:
            shape = x.shape[:2] + (1,) * (r - 2)
        return _out_type(node, 4, shape)

    def reference(node, ins):
        ins = list(ins) + [None] * (5 - len(ins))
        x, xs, xz, ys, yz = ins
        fx = _dq(x, xs, xz)
        axes = tuple(range(1, x.ndim - 1)) if int(node.attr("channels_last", 0)) else tuple(range(2, x.ndim))
        return [_q(fx.mean(axis=axes, keepdims=True, dtype=np.float64).astype(np.float32), ys, yz)]

    def importer(ctx, proto, version):
        x, xs, xz, ys, yz = _ins(ctx, proto)[:5]
        last = int(ctx.attrs(proto).get("channels_last", 0))
        fx = _dq_v(ctx, proto, x, xs, xz, "DequantizeLinear")
        r = x.type.rank
        if last:
            fx = ctx.builder.op("Transpose", fx, name=_name(proto, "to_channels_first"),
                                perm=[0, r - 1] + list(range(1, r - 1)))
        y = ctx.builder.op("GlobalAveragePool", fx, name=_name(proto, "GlobalAveragePool"))
        if last:
            y = ctx.builder.op("Transpose", y, name=_name(proto, "to_channels_last"),
                               perm=[0] + list(range(2, r)) + [1])
        return [_q_out(ctx, proto, y, ys, yz)]


@op("QLinearConcat", OpPatternKind.INJECTIVE, domain=MS, attrs={"axis": AttrSpec("int", None, required=True)})
class QLinearConcat:
    """Y = QuantizeLinear(Concat(DequantizeLinear(X_i, X_i_scale, X_i_zero_point) ...), Y_scale,
    Y_zero_point). onnxruntime contrib op com.microsoft.QLinearConcat: inputs Y_scale,
    Y_zero_point, then (X, scale, zero point) per tensor; ``axis`` as Concat's. Imported as that
    decomposition (where every scale equals Y's, the drop rule makes it an int8 Concat... when
    the float Concat's Q/DQ pairs match)."""

    def infer(node):
        xs = node.inputs[2::3]
        if not xs:
            raise ShapeError("no tensors to concatenate")
        axis = int(node.attr("axis")) % xs[0].type.rank
        shape = list(xs[0].shape)
        shape[axis] = sum(v.shape[axis] for v in xs)
        return _out_type(node, 1, shape)

    def reference(node, ins):
        ys, yz = ins[0], ins[1]
        parts = [_dq(ins[i], ins[i + 1], ins[i + 2]) for i in range(2, len(ins), 3)]
        return [_q(np.concatenate(parts, axis=int(node.attr("axis"))), ys, yz)]

    def importer(ctx, proto, version):
        vals = [ctx.value(n) for n in proto.input]
        ys, yz = vals[0], vals[1]
        parts = [_dq_v(ctx, proto, vals[i], vals[i + 1], vals[i + 2], f"DequantizeLinear_{i // 3}")
                 for i in range(2, len(vals), 3)]
        y = ctx.builder.op("Concat", *parts, name=_name(proto, "Concat"), axis=int(ctx.attrs(proto)["axis"]))
        return [_q_out(ctx, proto, y, ys, yz)]


@op("QGemm", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain=MS,
    attrs={"alpha": AttrSpec("float", 1.0), "transA": AttrSpec("int", 0), "transB": AttrSpec("int", 0)})
class QGemm:
    """Y = alpha * DQ(A') @ DQ(B') + DQ(C) (then QuantizeLinear with y_scale / y_zero_point when
    they are given, else float). onnxruntime contrib op com.microsoft.QGemm: inputs A, a_scale,
    a_zero_point, B, b_scale (scalar or per column N), b_zero_point, C (optional int32 [N] or
    [M, N], scale a_scale * b_scale, zero point 0), y_scale, y_zero_point. Imported as that
    decomposition (a Gemm between DequantizeLinear nodes: QuantizeGemm makes it an integer kernel)."""

    def infer(node):
        a, b = node.input(0), node.input(3)
        m = a.shape[1] if int(node.attr("transA", 0)) else a.shape[0]
        n = b.shape[0] if int(node.attr("transB", 0)) else b.shape[1]
        if node.input(7) is None:
            return [TensorType(DType.f32, (m, n))]
        return _out_type(node, 8, (m, n))

    def reference(node, ins):
        ins = list(ins) + [None] * (9 - len(ins))
        a, asc, az, b, bsc, bz, c, ys, yz = ins
        fa = _dq(a, asc, az)
        fb = _dq(b, np.asarray(bsc).reshape(-1) if not int(node.attr("transB", 0)) else
                 np.asarray(bsc).reshape(-1, 1), None if bz is None else
                 (np.asarray(bz).reshape(-1) if not int(node.attr("transB", 0)) else np.asarray(bz).reshape(-1, 1)))
        fa = fa.T if int(node.attr("transA", 0)) else fa
        fb = fb.T if int(node.attr("transB", 0)) else fb
        y = np.float32(node.attr("alpha", 1.0)) * (fa @ fb)
        if c is not None:
            y = y + c.astype(np.float32) * (np.float32(np.asarray(asc).reshape(())) *
                                            np.asarray(bsc, np.float32).reshape(-1))
        y = y.astype(np.float32)
        return [y if ys is None else _q(y, ys, yz)]

    def importer(ctx, proto, version):
        a, asc, az, b, bsc, bz, c, ys, yz = _ins(ctx, proto)[:9]
        at = ctx.attrs(proto)
        tb = int(at.get("transB", 0))
        fa = _dq_v(ctx, proto, a, asc, az, "DequantizeLinear_A")
        fb = ctx.builder.op("DequantizeLinear", b, bsc, bz, name=_name(proto, "DequantizeLinear_B"),
                            axis=0 if tb else 1)
        fc = None
        if c is not None:
            bias_scale = ctx.builder.op("Mul", asc, bsc, name=_name(proto, "bias_scale"))
            fc = ctx.builder.op("DequantizeLinear", c, bias_scale, name=_name(proto, "DequantizeLinear_C"),
                                axis=c.type.rank - 1 if bsc.type.numel > 1 else 1)
        attrs = {"alpha": float(at.get("alpha", 1.0)), "transA": int(at.get("transA", 0)), "transB": tb}
        if ys is None:
            return ctx.builder.op("Gemm", fa, fb, fc, name=ctx.node_name(proto), out_names=[proto.output[0]],
                                  exact_names=True, **attrs)
        y = ctx.builder.op("Gemm", fa, fb, fc, name=_name(proto, "Gemm"), **attrs)
        return [_q_out(ctx, proto, y, ys, yz)]


@op("DynamicQuantizeMatMul", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain=MS)
class DynamicQuantizeMatMul:
    """Y = MatMulIntegerToFloat(DynamicQuantizeLinear(A), B, ...) + bias: A (f32) quantized to
    u8 at run time, B (i8/u8) with b_scale (scalar or [N]) and b_zero_point. onnxruntime contrib
    op com.microsoft.DynamicQuantizeMatMul (inputs A, B, b_scale, b_zero_point, bias). Imported
    as DynamicQuantizeLinear + com.microsoft.MatMulIntegerToFloat."""

    def infer(node):
        from tensorfuse.ir.ops.linalg import matmul_shape
        return [TensorType(DType.f32, matmul_shape(node.input(0).shape, node.input(1).shape))]

    def reference(node, ins):
        from tensorfuse.ir.ops.quant import dynamic_scale_np
        ins = list(ins) + [None] * (5 - len(ins))
        a, b, bsc, bz, bias = ins
        s, z = dynamic_scale_np(a)
        aq = np.clip(np.rint(a / s) + np.float32(z), 0, 255).astype(np.int64)
        bi = b.astype(np.int64) - (0 if bz is None else np.asarray(bz).astype(np.int64))
        y = (np.matmul(aq - int(z), bi).astype(np.float32) * (np.float32(s) * np.asarray(bsc, np.float32)))
        return [(y + bias if bias is not None else y).astype(np.float32)]

    def importer(ctx, proto, version):
        a, b, bsc, bz, bias = _ins(ctx, proto)[:5]
        aq, asc, az = ctx.builder.op("DynamicQuantizeLinear", a, num_outputs=3,
                                     name=_name(proto, "DynamicQuantizeLinear"))
        return ctx.builder.op("MatMulIntegerToFloat", aq, b, asc, bsc, az, bz, bias, domain=MS,
                              name=ctx.node_name(proto), out_names=[proto.output[0]], exact_names=True)
