"""Quantization rules: QDQ and dynamically quantized products become integer kernels.

A QDQ model (onnxruntime's ``quantize_static``, QDQ format) writes each quantized product as
float ops between DequantizeLinear (DQ) and QuantizeLinear (Q) nodes:
``Q(Conv(DQ(x_q), DQ(w_q), DQ(b_q)))``. Its meaning is the float computation on the
dequantized values; onnxruntime's QDQ transformers turn such groups into QLinearConv and
friends (onnxruntime/core/optimizer/qdq_transformer). Here the rules make the product itself
integer and leave the rest to the epilogue:

- ``Conv(DQ(x), DQ(W const), b)`` ==> ``tensorfuse::ConvIntegerToFloat(x, W, ...)``: int32
  convolution of the quantized values, one float scale per output channel, the float bias;
- ``MatMul(DQ(a), DQ(B const))`` and ``Gemm(DQ(a), DQ(B const), C)`` ==>
  ``com.microsoft::MatMulIntegerToFloat``;
- ``MatMul(DQ(a), DQ(b))`` of two activations, each per tensor (attention's Q K^T and P V) ==>
  ``MatMulIntegerToFloat`` too: the llvm int8 GEMM packs such a B at run time;
- dynamic quantization's ``Mul(Cast(MatMulInteger(a, B, ...)), scale)`` ==>
  ``MatMulIntegerToFloat`` (``quantize_dynamic`` writes that chain), and its
  ``Mul(Cast(ConvInteger(x, W, ...)), scale)`` ==> ``ConvIntegerToFloat``; the bias Add after
  either product joins it (:class:`FoldBiasIntoConvIntegerToFloat`,
  :class:`FoldBiasIntoMatMulIntegerToFloat`);
- ``Q(Concat(v1, v2 ...))`` ==> ``Concat(Q(v1), Q(v2) ...)`` (exact; ``Q(DQ(x))`` with equal
  parameters is ``x``): each Q joins its producer's epilogue and the Concat moves int8; with
  other parameters ``Q(DQ(x, s1, z1), s2, z2)`` requantizes by one multiply
  (:class:`FoldRequantizeScale`);
- ``Q(Relu(x))`` / ``Q(Clip(x))`` whose bounds the Q's saturation already applies ==> ``Q(x)``;
- ``Q(f(DQ(x)))`` with f elementwise and x the one u8/i8 tensor it varies with (SiLU, Sigmoid,
  HardSwish, Tanh, GELU, with Q/DQ pairs inside) ==> ``tensorfuse::TableLookup(x)``, the 256
  results computed at compile time by the ops' references (onnxruntime tabulates QLinearSigmoid
  and QLinearLeakyRelu the same way): exact, one gather per vector in the producer's epilogue
  instead of an exp and a divide per element (efficientnet_b0 u8s8 at 1 thread 1.29x -> 0.96x
  onnxruntime);
- ``Q(Reshape / Transpose / Slice / Gather / MaxPool ...(DQ(x)))`` with one scale and zero point
  ==> the op on x itself (``OpDef.quant_passthrough``): exact, since those ops only move or
  select elements.

What follows the product (bias, BatchNormalization folded into the scale and bias by
:class:`FoldBatchNormIntoConvIntegerToFloat`, Relu, the residual Add with its own DQ, the Q of
the output) stays as written and joins the integer kernel's epilogue in fuse_ops, since both
new ops apply their epilogue at the store (``OpDef.epilogue_casts``): the kernel then stores
u8 directly. The numbers: the int32 sum is exact where the float conv of dequantized values
rounds, so outputs are within one quantization step of the unfused QDQ semantics (a value
within rounding of a .5 tie may land one step away), the contract of docs.

These rules run first at O2 (the ``quantize`` set, before constant folding, which would fold
DQ(W) into float weights and lose the integers). A DQ whose consumers all became integer
products is dead and removed; one that stays (the float path) is folded or runs elementwise.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, OneOf, Op, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail
from tensorfuse.ir.types import DType

INT8 = (DType.u8, DType.i8)


def _dq(x, name: str, scale=None, zp=None):
    """A DequantizeLinear of ``x`` with constant scale and (optional) zero point."""
    return P.DequantizeLinear(x, (scale or Const()).named(f"{name}_scale"),
                              Optional(zp or Const()).named(f"{name}_zp")).named(f"{name}_dq")


def _per_tensor(m, name: str) -> Fail | bool:
    """The DQ ``name`` has one scale and one zero point."""
    s, z = m[f"{name}_scale"], m[f"{name}_zp"]
    if s.data.size != 1 or (z is not None and z.data.size != 1):
        return Fail(f"{m[name + '_dq'].name}: the activation's scale/zero point is not per tensor "
                    f"(shape {list(s.shape)})")
    if int(m[f"{name}_dq"].attr("block_size", 0) or 0) > 0:
        return Fail(f"{m[name + '_dq'].name}: blocked quantization")
    return True


def _weight_params(m, name: str, axis: int, channels: int) -> tuple | Fail:
    """(scale f32 [channels] or scalar, zero point [channels] or scalar or None) of the weight DQ
    ``name``, quantized per tensor or along ``axis`` (the output-channel axis of the product)."""
    dq = m[f"{name}_dq"]
    s, z = m[f"{name}_scale"].data, m[f"{name}_zp"]
    z = None if z is None else z.data
    if int(dq.attr("block_size", 0) or 0) > 0:
        return Fail(f"{dq.name}: blocked weight quantization is not an integer product here")
    if s.size == 1:
        return s.astype(np.float32).reshape(()), None if z is None else z.reshape(())
    w = dq.inputs[0]
    if int(dq.attr("axis", 1)) % w.type.rank != axis:
        return Fail(f"{dq.name}: weights quantized along axis {dq.attr('axis', 1)}, the product's output "
                    f"channels are axis {axis}")
    if s.size != channels:
        return Fail(f"{dq.name}: {s.size} scales for {channels} output channels")
    if s.dtype != np.float32:
        return Fail(f"{dq.name}: scale dtype {s.dtype}, not float32")
    return s.astype(np.float32).reshape(-1), None if z is None else z.reshape(-1)


def _check_operands(x, w, where: str) -> Fail | bool:
    if x.dtype not in INT8 or w.dtype not in INT8:
        return Fail(f"{where}: quantized types {x.dtype} x {w.dtype}; the integer kernels take u8/i8")
    return True


def _bias_value(b, node_name: str, channels: int) -> np.ndarray | None | Fail:
    """The float bias [channels] of value ``b`` (a DQ of an int32 constant is dequantized here),
    or None for no bias."""
    if b is None:
        return None
    if b.data is not None:
        data = b.data
    elif b.producer is not None and b.producer.op == "DequantizeLinear" and \
            all(v is None or v.data is not None for v in b.producer.inputs):
        from tensorfuse.ir.registry import run_reference
        data = run_reference(b.producer, [None if v is None else v.data for v in b.producer.inputs])[0]
    else:
        return Fail(f"{node_name}: the bias '{b.name}' is computed at run time")
    if data.dtype != np.float32 or data.size != channels:
        return Fail(f"{node_name}: the bias '{b.name}' is {data.dtype}{list(data.shape)}, expected float32 [{channels}]")
    return data.astype(np.float32).reshape(channels)


class QuantizeConv(Rule):
    """Conv(DQ(x), DQ(W const), b) ==> tensorfuse::ConvIntegerToFloat(x, W, x_scale, w_scale, x_zp, w_zp, b): int32 conv, float scale per channel."""
    name_from = "conv"
    pattern = P.Conv(_dq(Any("xq"), "x"), _dq(Const(name="wq"), "w"), Optional(Any()).named("b"))

    def condition(self, m):
        ok = _check_operands(m.xq, m.wq, m.conv.name)
        if ok is not True:
            return ok
        ok = _per_tensor(m, "x")
        if ok is not True:
            return ok
        if m.conv.outputs[0].dtype != DType.f32:
            return Fail(f"{m.conv.name}: output {m.conv.outputs[0].dtype}, the integer conv gives f32")
        return True

    def rewrite(self, m, build):
        channels = m.wq.shape[0]
        wp = _weight_params(m, "w", 0, channels)
        if isinstance(wp, Fail):
            return wp
        ws, wz = wp
        b = _bias_value(m.b, m.conv.name, channels)
        if isinstance(b, Fail):
            return b
        xs = m.x_scale.data.astype(np.float32).reshape(())
        args = [m.xq, m.wq, build.const(xs, "x_scale"), build.const(ws, "w_scale"),
                m.x_zp, None if wz is None else build.const(wz, "w_zp"),
                None if b is None else build.const(b, "bias")]
        return build_or_fail(build, "ConvIntegerToFloat", *args, domain="tensorfuse", expect=m.conv.outputs[0],
                             **m.conv.attrs)


class QuantizeMatMul(Rule):
    """MatMul(DQ(a), DQ(B const [K, N])) ==> com.microsoft::MatMulIntegerToFloat(a, B, a_scale, b_scale, a_zp, b_zp): int32 product, float scale per column."""
    name_from = "matmul"
    pattern = P.MatMul(_dq(Any("aq"), "a"), _dq(Const(name="bq").rank(2), "b"))

    def condition(self, m):
        ok = _check_operands(m.aq, m.bq, m.matmul.name)
        if ok is not True:
            return ok
        if m.matmul.outputs[0].dtype != DType.f32:
            return Fail(f"{m.matmul.name}: output {m.matmul.outputs[0].dtype}, the integer product gives f32")
        return _per_tensor(m, "a")

    def rewrite(self, m, build):
        wp = _weight_params(m, "b", 1, m.bq.shape[1])
        if isinstance(wp, Fail):
            return wp
        bs, bz = wp
        as_ = m.a_scale.data.astype(np.float32).reshape(())
        return build_or_fail(build, "MatMulIntegerToFloat", m.aq, m.bq, build.const(as_, "a_scale"),
                             build.const(bs, "b_scale"), m.a_zp, None if bz is None else build.const(bz, "b_zp"),
                             domain="com.microsoft", expect=m.matmul.outputs[0])


class QuantizeMatMulActivations(Rule):
    """MatMul(DQ(a), DQ(b)) with b computed at run time, both per tensor ==> com.microsoft::MatMulIntegerToFloat(a, b, a_scale, b_scale, a_zp, b_zp): attention's Q K^T and P V in int32."""
    name_from = "matmul"
    pattern = P.MatMul(_dq(Any("aq"), "a"), _dq(Any("bq"), "b"))

    def condition(self, m):
        ok = _check_operands(m.aq, m.bq, m.matmul.name)
        if ok is not True:
            return ok
        if m.bq.data is not None:
            return Fail(f"{m.matmul.name}: B is a constant (QuantizeMatMul's case)")
        if m.aq.type.rank < 2 or m.bq.type.rank < 2:
            return Fail(f"{m.matmul.name}: a 1-D operand ({m.aq.type} x {m.bq.type})")
        if m.matmul.outputs[0].dtype != DType.f32:
            return Fail(f"{m.matmul.name}: output {m.matmul.outputs[0].dtype}, the integer product gives f32")
        ok = _per_tensor(m, "a")
        return ok if ok is not True else _per_tensor(m, "b")

    def rewrite(self, m, build):
        as_ = m.a_scale.data.astype(np.float32).reshape(())
        bs = m.b_scale.data.astype(np.float32).reshape(())
        bz = None if m.b_zp is None else build.const(m.b_zp.data.reshape(()), "b_zp")
        return build_or_fail(build, "MatMulIntegerToFloat", m.aq, m.bq, build.const(as_, "a_scale"),
                             build.const(bs, "b_scale"), m.a_zp, bz,
                             domain="com.microsoft", expect=m.matmul.outputs[0])


class QuantizeGemm(Rule):
    """Gemm(DQ(a), DQ(B const), C) with transA=0 ==> MatMulIntegerToFloat(a, B', ..., bias=alpha/beta-scaled C): B' = B^T for transB=1."""
    name_from = "gemm"
    pattern = P.Gemm(_dq(Any("aq"), "a"), _dq(Const(name="bq").rank(2), "b"), Optional(Any()).named("b_bias"))

    def condition(self, m):
        g = m.gemm
        if int(g.attr("transA", 0)):
            return Fail(f"{g.name}: transA=1")
        ok = _check_operands(m.aq, m.bq, g.name)
        if ok is not True:
            return ok
        if g.outputs[0].dtype != DType.f32:
            return Fail(f"{g.name}: output {g.outputs[0].dtype}, the integer product gives f32")
        return _per_tensor(m, "a")

    def rewrite(self, m, build):
        g = m.gemm
        trans = bool(int(g.attr("transB", 0)))
        n = m.bq.shape[0] if trans else m.bq.shape[1]
        wp = _weight_params(m, "b", 0 if trans else 1, n)
        if isinstance(wp, Fail):
            return wp
        bs, bz = wp
        alpha, beta = float(g.attr("alpha", 1.0)), float(g.attr("beta", 1.0))
        bias = None
        if m.b_bias is not None:
            c = _bias_value(m.b_bias, g.name, n)
            if isinstance(c, Fail):
                return c
            bias = (np.float64(beta) * c.astype(np.float64)).astype(np.float32)
        w = np.ascontiguousarray(m.bq.data.T) if trans else m.bq.data
        scale = (np.float64(alpha) * bs.astype(np.float64)).astype(np.float32) if alpha != 1.0 else bs
        as_ = m.a_scale.data.astype(np.float32).reshape(())
        return build_or_fail(build, "MatMulIntegerToFloat", m.aq, build.const(w, "b_quantized"),
                             build.const(as_, "a_scale"), build.const(scale, "b_scale"), m.a_zp,
                             None if bz is None else build.const(bz, "b_zp"),
                             None if bias is None else build.const(bias, "bias"),
                             domain="com.microsoft", expect=g.outputs[0])


def _scaled_product_ok(m):
    """Fail (or True) for dynamic quantization's ``Mul(Cast(product), s)`` (captures cast, mul,
    s): the Cast to f32 and s one f32 that does not broadcast the product."""
    if m.cast.outputs[0].dtype != DType.f32:
        return Fail(f"{m.cast.name}: casts to {m.cast.outputs[0].dtype}, not f32")
    if m.s.type.numel != 1 or m.s.dtype != DType.f32:
        return Fail(f"{m.mul.name}: the scale '{m.s.name}' is {m.s.type}, not one f32")
    if m.mul.outputs[0].shape != m.cast.outputs[0].shape:
        return Fail(f"{m.mul.name}: the scale broadcasts the product to another shape")
    return True


def _scalar(v, build):
    """A one-element value as a scalar (rank 0), reshaped where it has a rank."""
    return v if v.type.rank == 0 else build.op("Reshape", v, build.const(np.zeros(0, np.int64), "scalar"))


class DynamicMatMulToFloat(Rule):
    """Mul(Cast(MatMulInteger(a, B, a_zp, b_zp), to=float), s) with s one element ==> MatMulIntegerToFloat(a, B, s, 1, a_zp, b_zp): quantize_dynamic's chain in one kernel."""
    name_from = "matmulinteger"
    pattern = P.Mul(P.Cast(P.MatMulInteger(Any("aq"), Any("bq"), Optional(Any()).named("a_zp"),
                                           Optional(Any()).named("b_zp")).single_use()).single_use(),
                    Any("s"))

    def condition(self, m):
        ok = _scaled_product_ok(m)
        if ok is not True:
            return ok
        az = m.a_zp
        if az is not None and az.type.numel != 1:
            return Fail(f"{m.matmulinteger.name}: a_zero_point is per row")
        bz = m.b_zp
        if bz is not None and bz.type.rank > 1:
            return Fail(f"{m.matmulinteger.name}: b_zero_point of rank {bz.type.rank}")
        return True

    def rewrite(self, m, build):
        return build_or_fail(build, "MatMulIntegerToFloat", m.aq, m.bq, _scalar(m.s, build),
                             build.const(np.array(1.0, np.float32), "one"), m.a_zp, m.b_zp,
                             domain="com.microsoft", expect=m.mul.outputs[0])


class DynamicConvToFloat(Rule):
    """Mul(Cast(ConvInteger(x, W const, x_zp, w_zp), to=float), s) with s one f32 ==> tensorfuse::ConvIntegerToFloat(x, W, s, 1, x_zp, w_zp): quantize_dynamic's Conv chain in one kernel (its scale is computed at run time: DynamicQuantizeLinear's times the weights')."""
    name_from = "convinteger"
    pattern = P.Mul(P.Cast(P.ConvInteger(Any("xq"), Const(name="wq"), Optional(Any()).named("x_zp"),
                                         Optional(Const()).named("w_zp")).single_use()).single_use(),
                    Any("s"))

    def condition(self, m):
        ok = _scaled_product_ok(m)
        if ok is not True:
            return ok
        if m.x_zp is not None and m.x_zp.type.numel != 1:
            return Fail(f"{m.convinteger.name}: x_zero_point is not one value")
        wz, ch = m.w_zp, m.wq.shape[0]
        if wz is not None and not (wz.type.numel == 1 or tuple(wz.shape) == (ch,)):
            return Fail(f"{m.convinteger.name}: w_zero_point of shape {list(wz.shape)}, not a scalar or [{ch}]")
        return True

    def rewrite(self, m, build):
        wz = m.w_zp
        if wz is not None and wz.type.rank > 1:
            wz = build.const(wz.data.reshape(()), "w_zp")
        return build_or_fail(build, "ConvIntegerToFloat", m.xq, m.wq, _scalar(m.s, build), build.const(np.array(1.0, np.float32), "one"),
                             m.x_zp, wz, None, domain="tensorfuse", expect=m.mul.outputs[0], **m.convinteger.attrs)


class _FoldBiasIntoProduct(Rule):
    """Abstract (no pattern): Add(product(...) without bias, c) with c a constant per output
    channel ==> product(..., bias=c as [M]); the bias quantize_dynamic leaves after its scale
    Mul (then a Reshape or an activation after the Add meets the product itself)."""
    rule_set = "fold"
    #: the axis of the product's output that holds the output channels
    channel_axis: int = 1

    def condition(self, m):
        y, out = m.prod.outputs[0], m.add.outputs[0]
        if len(m.prod.inputs) > 6 and m.prod.inputs[6] is not None:
            return Fail(f"{m.prod.name}: already has a bias")
        if out.type != y.type:
            return Fail(f"{m.add.name}: the Add changes the product's type {y.type} to {out.type}")
        cs, r = tuple(m.c.shape), y.type.rank
        ax = self.channel_axis % r                                  # in y's dims
        k = len(cs) - (r - ax)                                      # in c's dims
        per_channel = len(cs) <= r and 0 <= k < len(cs) and cs[k] == y.shape[ax] and \
            all(d == 1 for i, d in enumerate(cs) if i != k)
        if not per_channel or m.c.dtype != DType.f32:
            return Fail(f"{m.add.name}: '{m.c.name}' {m.c.dtype}{list(cs)} is not an f32 constant per channel of {list(y.shape)}")
        return True

    def rewrite(self, m, build):
        y = m.prod.outputs[0]
        b = build.const(m.c.data.astype(np.float32).reshape(y.shape[self.channel_axis]), "bias")
        ins = list(m.prod.inputs[:6]) + [None] * (6 - len(m.prod.inputs[:6]))
        return build_or_fail(build, m.prod.op, *ins, b, domain=m.prod.domain, expect=m.add.outputs[0], **m.prod.attrs)


class FoldBiasIntoConvIntegerToFloat(_FoldBiasIntoProduct):
    """Add(ConvIntegerToFloat(x, W, xs, ws, xz, wz), c) with c a constant per output channel ([M, 1, 1], [1, M, 1, 1] ...) ==> ConvIntegerToFloat(x, W, xs, ws, xz, wz, c as [M])."""
    pattern = P.Add(P.__getattr__("tensorfuse::ConvIntegerToFloat")(
        Any(), Any(), Any(), Any(), Optional(), Optional()).named("prod").single_use(), Const(name="c"))
    channel_axis = 1


class FoldBiasIntoMatMulIntegerToFloat(_FoldBiasIntoProduct):
    """Add(MatMulIntegerToFloat(a, B, as, bs, az, bz), c) with c a constant along the last axis ([N], [1, N] ...) ==> MatMulIntegerToFloat(a, B, as, bs, az, bz, c as [N])."""
    pattern = P.Add(P.__getattr__("com.microsoft::MatMulIntegerToFloat")(
        Any(), Any(), Any(), Any(), Optional(), Optional()).named("prod").single_use(), Const(name="c"))
    channel_axis = -1


class FoldBatchNormIntoConvIntegerToFloat(Rule):
    """BatchNormalization(ConvIntegerToFloat(x, W, xs, ws, xz, wz, b)) ==> ConvIntegerToFloat(x, W, xs, ws * a, xz, wz, b * a + shift), a = gamma / sqrt(var + eps)."""
    rule_set = "fold"
    pattern = P.BatchNormalization(
        P.__getattr__("tensorfuse::ConvIntegerToFloat")(Any("xq"), Const(name="wq"), Const(name="xs"),
                                                         Const(name="ws"), Optional(Any()).named("xz"),
                                                         Optional(Any()).named("wz"),
                                                         Optional(Const()).named("b")).named("qconv").single_use(),
        gamma=Const(), beta=Const(), mean=Const(), var=Const())

    def condition(self, m):
        from tensorfuse.compiler.rules.fold_batchnorm import _bn_condition
        return _bn_condition(m, m.wq.shape[0])

    def rewrite(self, m, build):
        from tensorfuse.compiler.rules.fold_batchnorm import _scale_shift
        a, shift = _scale_shift(m)
        ch = m.wq.shape[0]
        ws = np.broadcast_to(m.ws.data.astype(np.float64).reshape(-1), (ch,)) * a
        b0 = np.zeros(ch) if m.b is None else m.b.data.astype(np.float64)
        b2 = b0 * a + shift
        return build_or_fail(build, "ConvIntegerToFloat", m.xq, m.wq, m.xs, build.const(ws.astype(np.float32), "w_scale_bn"),
                             m.xz, m.wz, build.const(b2.astype(np.float32), "b_bn"), domain="tensorfuse",
                             expect=m.batchnormalization.outputs[0], **m.qconv.attrs)


def _positive_scale(node, s) -> float | Fail:
    """The constant scale ``s`` of ``node`` (a QuantizeLinear or DequantizeLinear) as a float,
    where it is one positive finite f32 (a per-tensor scale)."""
    if s.size != 1 or s.dtype != np.float32:
        return Fail(f"{node.name}: the scale is not one f32 (shape {list(s.shape)}, {s.dtype})")
    v = float(s.reshape(()))
    if not (np.isfinite(v) and v > 0):
        return Fail(f"{node.name}: the scale {v} is not positive and finite")
    return v


def _requant_scale(m) -> float | Fail:
    """The scale of the QuantizeLinear ``m.q`` after an integer product, when it can go into the
    product's float scale: one positive finite f32 other than 1, per tensor, no ``precision``."""
    q = m.q
    v = _positive_scale(q, m.s.data)
    if isinstance(v, Fail):
        return v
    if v == 1.0:
        return Fail(f"{q.name}: the scale is already 1")
    if int(q.attr("block_size", 0) or 0) or int(q.attr("precision", 0) or 0):
        return Fail(f"{q.name}: blocked quantization or a precision attribute")
    dt = q.outputs[0].dtype
    if not dt.is_int or dt.is_lowbit:
        return Fail(f"{q.name}: quantizes to {dt}, not an integer type of 8 bits or more")
    return v


def _divided(c, s: float, name: str, build):
    """The constant ``c`` (None: absent) divided by ``s``, in float64, rounded once to f32."""
    if c is None:
        return None
    return build.const((c.data.astype(np.float64) / s).astype(np.float32).reshape(c.data.shape), name)


def _one_like(v, build):
    return build.const(np.ones(v.data.shape, np.float32), "one")


class _FoldQuantizeScaleIntoProduct(Rule):
    """Abstract (no pattern): Q(product(..., w_scale, ..., bias), s, z) ==> Q(product(..., w_scale / s, ..., bias / s), 1, z)."""
    rule_set = "fold"
    #: the product op (qualified) and the capture names of its inputs, in order; the indices of
    #: the weights' scale and of the bias among them
    product_op: str = ""
    inputs: tuple[str, ...] = ()
    scale_input, bias_input = 3, 6

    def condition(self, m):
        v = _requant_scale(m)
        return v if isinstance(v, Fail) else True

    def rewrite(self, m, build):
        """The product again with its weights' scale and bias divided by the output Q's scale s,
        then Q with scale 1 and the same zero point; Fail where a node cannot be built."""
        s = _requant_scale(m)
        prod = m.prod
        ins = [m[name] for name in self.inputs]
        ins[self.scale_input] = _divided(ins[self.scale_input], s, "w_scale_q", build)
        ins[self.bias_input] = _divided(ins[self.bias_input], s, "bias_q", build)
        domain, _, op = self.product_op.rpartition("::")
        node = build_or_fail(build, op, *ins, domain=domain, expect=prod.outputs[0], name=prod.name, **prod.attrs)
        if isinstance(node, Fail):
            return node
        return build_or_fail(build, "QuantizeLinear", node, _one_like(m.s, build), m.z, expect=m.q.outputs[0],
                             name=m.q.name, **m.q.attrs)


class FoldQuantizeScaleIntoConvIntegerToFloat(_FoldQuantizeScaleIntoProduct):
    """Q(ConvIntegerToFloat(x, W, xs, ws, xz, wz, b), s, z) ==> Q(ConvIntegerToFloat(x, W, xs, ws / s, xz, wz, b / s), 1, z): the requantization multiplies by one scale per channel (MLAS's requantization) instead of dividing every output by s."""
    product_op = "tensorfuse::ConvIntegerToFloat"
    inputs = ("xq", "wq", "xs", "ws", "xz", "wz", "b")
    pattern = P.QuantizeLinear(
        P.__getattr__(product_op)(Any("xq"), Const(name="wq"), Const(name="xs"), Const(name="ws"),
                                  Optional(Any()).named("xz"), Optional(Any()).named("wz"),
                                  Optional(Const()).named("b")).named("prod").single_use(),
        Const(name="s"), Optional(Const()).named("z")).named("q")


class FoldQuantizeScaleIntoMatMulIntegerToFloat(_FoldQuantizeScaleIntoProduct):
    """Q(MatMulIntegerToFloat(a, B, as, bs, az, bz, bias), s, z) ==> Q(MatMulIntegerToFloat(a, B, as, bs / s, az, bz, bias / s), 1, z): as FoldQuantizeScaleIntoConvIntegerToFloat, per column."""
    product_op = "com.microsoft::MatMulIntegerToFloat"
    inputs = ("aq", "bq", "as_", "bs", "az", "bz", "bias")
    pattern = P.QuantizeLinear(
        P.__getattr__(product_op)(Any("aq"), Any("bq"), Any("as_"), Const(name="bs"),
                                  Optional(Any()).named("az"), Optional(Any()).named("bz"),
                                  Optional(Const()).named("bias")).named("prod").single_use(),
        Const(name="s"), Optional(Const()).named("z")).named("q")


#: the producers of the operands of a quantized residual add (:class:`FoldQuantizeScaleIntoAdd`)
_QUANTIZED_OPERANDS = ("DequantizeLinear", "tensorfuse::ConvIntegerToFloat", "com.microsoft::MatMulIntegerToFloat")


class FoldQuantizeScaleIntoAdd(Rule):
    """Q(Add(u, v), s, z) with u and v each a DequantizeLinear or an integer product (ConvIntegerToFloat, MatMulIntegerToFloat) ==> Q(Mul(Add(u, v), 1/s), 1, z): a quantized residual add requantized by a multiply (as onnxruntime's QLinearAdd scales by sa/sc and sb/sc) instead of a division per output."""
    rule_set = "fold"
    pattern = P.QuantizeLinear(P.Add(Any("u"), Any("v")).single_use(), Const(name="s"),
                               Optional(Const()).named("z")).named("q")

    def condition(self, m):
        sc = _requant_scale(m)
        if isinstance(sc, Fail):
            return sc
        if m.add.outputs[0].dtype != DType.f32:
            return Fail(f"{m.add.name}: computes in {m.add.outputs[0].dtype}, not f32")
        for v in (m.u, m.v):
            n = v.producer
            if n is None or n.qualified_op not in _QUANTIZED_OPERANDS:
                return Fail(f"{m.add.name}: operand '{v.name}' is not a DequantizeLinear or an integer product")
        return True

    def rewrite(self, m, build):
        # (the operands stay as they are, so the fusion of the add into one of their kernels'
        # epilogues does not change; rescaling them instead moved resnet's residual adds into
        # the downsample convs' kernels, which then read the other conv's output in f32)
        s = _requant_scale(m)
        add = build_or_fail(build, "Add", m.u, m.v, expect=m.add.outputs[0], name=m.add.name)
        if isinstance(add, Fail):
            return add
        inv = build.const(np.array(1.0 / s, np.float32).reshape(m.s.data.shape), "inv_scale")
        scaled = build_or_fail(build, "Mul", add, inv, expect=m.add.outputs[0])
        if isinstance(scaled, Fail):
            return scaled
        return build_or_fail(build, "QuantizeLinear", scaled, _one_like(m.s, build), m.z, expect=m.q.outputs[0],
                             name=m.q.name, **m.q.attrs)


class FoldRequantizeScale(Rule):
    """Q(DQ(x, s1, z1), s2, z2) with scalar constant scales ==> Q(DQ(x, s1 / s2, z1), 1, z2): a requantization (an input of a Concat whose scale differs from its producer's, ConcatOnInt8) multiplies by one constant instead of multiplying and then dividing every element."""
    rule_set = "fold"
    pattern = P.QuantizeLinear(P.DequantizeLinear(Any("x"), Const(name="s1"), Optional(Const()).named("z1"))
                               .named("dq").single_use(),
                               Const(name="s"), Optional(Const()).named("z")).named("q")

    def condition(self, m):
        s2 = _requant_scale(m)
        if isinstance(s2, Fail):
            return s2
        if isinstance(_positive_scale(m.dq, m.s1.data), Fail):
            return Fail(f"{m.dq.name}: the scale is not one positive finite f32")
        if int(m.dq.attr("block_size", 0) or 0):
            return Fail(f"{m.dq.name}: blocked quantization")
        dt = m.x.dtype
        if dt not in (DType.u8, DType.i8) or m.dq.outputs[0].dtype != DType.f32:
            return Fail(f"{m.dq.name}: dequantizes {dt} to {m.dq.outputs[0].dtype}, not 8 bits to f32")
        return True

    def rewrite(self, m, build):
        """DQ with the scale s1 / s2 (in float64, rounded once to f32), then Q with scale 1:
        (x - z1) * s1 / s2 in one rounding instead of two, so a result may differ by one step
        where (x - z1) * s1 / s2 lies within an ulp or two of a half-integer."""
        s2 = _requant_scale(m)
        scale = _divided(m.s1, s2, "requant_scale", build)
        dq = build_or_fail(build, "DequantizeLinear", m.x, scale, m.z1, expect=m.dq.outputs[0], name=m.dq.name,
                           **m.dq.attrs)
        if isinstance(dq, Fail):
            return dq
        return build_or_fail(build, "QuantizeLinear", dq, _one_like(m.s, build), m.z, expect=m.q.outputs[0],
                             name=m.q.name, **m.q.attrs)


def _passthrough_ops() -> tuple[str, ...]:
    from tensorfuse.ir.registry import op_names
    return op_names("quant_passthrough")


def _same_scalar(a, b) -> bool:
    """Two constant scale / zero point values (None: absent, a zero point of 0) are one scalar."""
    da = np.zeros(()) if a is None else a.data
    db = np.zeros(()) if b is None else b.data
    return da.size == 1 and db.size == 1 and float(da.reshape(())) == float(db.reshape(()))


class DropQDQAroundDataMovement(Rule):
    """Q(op(DQ(x, s, z), ...), s, z) with op moving data (OpDef.quant_passthrough: Reshape, Transpose, Slice, Gather, MaxPool ...) ==> op(x, ...): the data moves as int8."""
    name_from = "mover"
    pattern = P.QuantizeLinear(
        Op(_passthrough_ops(), P.DequantizeLinear(Any("x"), Const(name="s1"), Optional(Const()).named("z1"))
             .named("dq"), Optional(Any()), Optional(Any()), Optional(Any()), Optional(Any()))
        .named("mover").single_use(),
        Const(name="s2"), Optional(Const()).named("z2")).named("q")

    def condition(self, m):
        from tensorfuse.ir.registry import get_op
        mv = m.mover
        if m.x.dtype.is_lowbit:
            return Fail(f"{m.q.name}: {m.x.dtype} is a low-bit type, which only QuantizeLinear and "
                        f"DequantizeLinear take")
        if not (_same_scalar(m.s1, m.s2) and _same_scalar(m.z1, m.z2)):
            return Fail(f"{m.q.name}: its scale / zero point differ from {m.dq.name}'s (or are not per tensor)")
        if m.q.outputs[0].dtype != m.x.dtype:
            return Fail(f"{m.q.name}: quantizes to {m.q.outputs[0].dtype}, {m.dq.name} reads {m.x.dtype}")
        if int(m.dq.attr("block_size", 0) or 0) or int(m.q.attr("block_size", 0) or 0):
            return Fail(f"{m.q.name}: blocked quantization")
        if len([o for o in mv.outputs if o is not None]) != 1:
            return Fail(f"{mv.name}: {mv.op} has more than one output")
        kind = get_op(mv.op, mv.domain).quant_passthrough
        if kind == "monotone" and not float(m.s1.data.reshape(())) > 0:
            return Fail(f"{mv.name}: {mv.op} selects by order, and the scale {m.s1.data.reshape(())} is not positive")
        return True

    def rewrite(self, m, build):
        mv = m.mover
        dom = {"domain": mv.domain} if mv.domain else {}
        return build_or_fail(build, mv.op, m.x, *mv.inputs[1:], expect=m.q.outputs[0], **dom, **mv.attrs)


def _q_range(m) -> tuple[float, float] | Fail:
    """The float interval QuantizeLinear ``m.q`` maps onto its integer range without clipping:
    [(qmin - z) * s, (qmax - z) * s] (s > 0)."""
    s = float(m.s.data.reshape(-1)[0])
    if m.s.data.size != 1 or not s > 0:
        return Fail(f"{m.q.name}: the scale is not one positive number")
    if m.z is not None and m.z.data.size != 1:
        return Fail(f"{m.q.name}: the zero point is not per tensor")
    dt = m.q.outputs[0].dtype
    if not dt.is_int:
        return Fail(f"{m.q.name}: quantizes to {dt}, not an integer type of 8 bits or more")
    info = np.iinfo(dt.numpy)
    z = 0.0 if m.z is None else float(m.z.data.reshape(-1)[0])
    return (info.min - z) * s, (info.max - z) * s


class DropActivationBeforeSaturatingQuantize(Rule):
    """Q(Relu(x)) or Q(Clip(x, lo, hi)) whose clipping the Q's saturation already does (Relu: zero point = the type's minimum; Clip: lo <= the Q range's low end + half a step, hi >= its high end) ==> Q(x)."""
    name_from = "q"
    pattern = P.QuantizeLinear(
        OneOf(P.Relu(Any("x")), P.Clip(Any("x"), Optional(Const()).named("lo"), Optional(Const()).named("hi")),
              name="act").single_use(),
        Const(name="s"), Optional(Const()).named("z")).named("q")

    def condition(self, m):
        rng = _q_range(m)
        if isinstance(rng, Fail):
            return rng
        qlo, qhi = rng
        half = float(m.s.data.reshape(-1)[0]) / 2
        n = m.act.producer
        if n.op == "Relu":
            lo, hi = 0.0, None
        else:
            lo = None if m.lo is None else float(m.lo.data.reshape(-1)[0])
            hi = None if m.hi is None else float(m.hi.data.reshape(-1)[0])
        # Q's saturation gives qlo for everything below qlo; a lower bound lo of the activation
        # changes nothing when every value it clips to lo quantizes to qmin as well: lo <= qlo + s/2
        # (round half to even: lo = qlo + s/2 exactly may round up; require strictly below then)
        if lo is not None and not lo < qlo + half:
            return Fail(f"{n.name}: its lower bound {lo:g} is inside the quantized range [{qlo:g}, {qhi:g}]")
        if hi is not None and not hi > qhi - half:
            return Fail(f"{n.name}: its upper bound {hi:g} is inside the quantized range [{qlo:g}, {qhi:g}]")
        return True

    def rewrite(self, m, build):
        return build_or_fail(build, "QuantizeLinear", m.x, m.s, m.z, expect=m.q.outputs[0], **m.q.attrs)


class ConcatOnInt8(Rule):
    """Q(Concat(v1, v2 ...), s, z) ==> Concat(Q(v1, s, z), Q(v2, s, z) ...), with Q(DQ(x, s, z), s, z) = x: exact (Q is elementwise); each input's Q then joins its producer's epilogue and the Concat moves int8 (onnxruntime's QLinearConcat)."""
    name_from = "q"
    pattern = P.QuantizeLinear(Any("cat").single_use(), Const(name="s2"), Optional(Const()).named("z2")).named("q")

    def condition(self, m):
        n = m.cat.producer
        if n is None or n.op != "Concat" or n.domain:
            return Fail(f"{m.q.name}: input 0 is not a Concat")
        if int(m.q.attr("block_size", 0) or 0) or m.s2.data.size != 1:
            return Fail(f"{m.q.name}: not quantized per tensor")
        if m.q.outputs[0].dtype.is_lowbit:
            return Fail(f"{m.q.name}: quantizes to the low-bit type {m.q.outputs[0].dtype}, which "
                        f"Concat does not take")
        return True

    def rewrite(self, m, build):
        n = m.cat.producer
        parts = []
        for v in n.inputs:
            dq = v.producer
            if (dq is not None and dq.op == "DequantizeLinear" and dq.inputs[1].data is not None
                    and (dq.input(2) is None or dq.input(2).data is not None)
                    and not int(dq.attr("block_size", 0) or 0)
                    and _same_scalar(dq.inputs[1], m.s2) and _same_scalar(dq.input(2), m.z2)
                    and dq.inputs[0].dtype == m.q.outputs[0].dtype):
                parts.append(dq.inputs[0])               # Q(DQ(x)) with the same parameters is x
            else:
                parts.append(build.op("QuantizeLinear", v, m.s2, m.z2, **m.q.attrs))
        return build_or_fail(build, "Concat", *parts, expect=m.q.outputs[0], **n.attrs)


#: most nodes an 8-bit elementwise chain may have to become one table
MAX_TABLE_NODES = 32


def _elementwise_node(n) -> bool:
    from tensorfuse.ir.registry import is_deterministic, is_elementwise
    return is_elementwise(n) and is_deterministic(n)


class QuantizedElementwiseToTable(Rule):
    """Q(f(DQ(x))) with f elementwise, x u8/i8 its only varying input (every other input a one-element constant) and every intermediate value read only inside the chain ==> tensorfuse::TableLookup(x): the chain's 256 results, computed at compile time (onnxruntime's QLinearSigmoid / QLinearLeakyRelu tables, for any such chain: SiLU, HardSwish, Tanh, GELU, Q/DQ inside)."""
    name_from = "q"
    pattern = P.QuantizeLinear(Any("v"), Const(name="s"), Optional(Const()).named("z")).named("q")

    def condition(self, m):
        q = m.q
        out = q.outputs[0]
        if out.dtype not in INT8 or m.s.data.size != 1 or (m.z is not None and m.z.data.size != 1):
            return Fail(f"{q.name}: not a per-tensor quantization to u8/i8")
        if int(q.attr("block_size", 0) or 0):
            return Fail(f"{q.name}: blocked quantization")
        cone = self._cone(m.v, m.graph, out.shape, q.name)
        if isinstance(cone, Fail):
            return cone
        nodes, src = cone
        if not any(n.op not in ("QuantizeLinear", "DequantizeLinear") or n.domain for n in nodes):
            return Fail(f"{q.name}: the chain only requantizes (no function to tabulate)")
        m.table_plan = (nodes, src)
        return True

    @staticmethod
    def _cone(v, graph, shape, where: str):
        """(the chain's nodes in evaluation order, its 8-bit source value) or Fail: the nodes
        v depends on back to DequantizeLinears of u8/i8 values, through elementwise nodes
        whose other inputs are one-element constants."""
        order: list = []            # post-order: inputs before their readers
        seen: set = set()
        srcs: list = []

        def visit(u):
            if u.data is not None:
                if u.data.size != 1:
                    return Fail(f"{where}: constant %{u.name} of the chain has {u.data.size} elements")
                return None
            n = u.producer
            if n is None:
                return Fail(f"{where}: the chain reads graph input %{u.name} as a float")
            if id(n) in seen:
                return None
            seen.add(id(n))
            if u.shape != shape:
                return Fail(f"{where}: %{u.name} of the chain has shape {list(u.shape)}, not {list(shape)}")
            if n.op == "DequantizeLinear" and not n.domain and n.inputs[0].dtype in INT8:
                for p in n.inputs[1:]:
                    if p is not None and (p.data is None or p.data.size != 1):
                        return Fail(f"{where}: {n.name} is not a per-tensor dequantization")
                if int(n.attr("block_size", 0) or 0):
                    return Fail(f"{where}: {n.name} is blocked")
                # the chain goes on through the 8-bit value's producer where that is elementwise
                # too (a Q inside the chain: SiLU's Q(Sigmoid)); where it is not, the value is
                # the chain's source
                x8 = n.inputs[0]
                state = (len(order), set(seen), len(srcs))
                r = visit(x8) if x8.producer is not None and x8.data is None else Fail("a source")
                if r is not None:
                    del order[state[0]:]
                    seen.clear()
                    seen.update(state[1])
                    del srcs[state[2]:]
                    srcs.append(x8)
            elif not _elementwise_node(n):
                return Fail(f"{where}: {n.name} ({n.qualified_op}) is not elementwise")
            else:
                for w in n.inputs:
                    if w is not None:
                        r = visit(w)
                        if r is not None:
                            return r
            order.append(n)
            if len(order) > MAX_TABLE_NODES:
                return Fail(f"{where}: the chain has more than {MAX_TABLE_NODES} nodes")
            return None

        r = visit(v)
        if r is not None:
            return r
        if len({id(x) for x in srcs}) != 1:
            return Fail(f"{where}: the chain reads {len({id(x) for x in srcs})} quantized tensors, not one")
        users = graph.users()
        outs = {id(o) for o in graph.outputs}
        for n in order:
            o = n.outputs[0]
            if o is v:
                continue
            if id(o) in outs or any(id(c) not in seen for c in users.get(o, [])):
                return Fail(f"{where}: %{o.name} of the chain is also read outside it")
        return order, srcs[0]

    def rewrite(self, m, build):
        nodes, src = m.table_plan
        # the 256 codes along the last axis, at the source's rank (a per-axis attribute of a
        # node then names an axis that exists; its parameters have one element)
        codes = np.arange(256, dtype=np.uint8).reshape((1,) * (max(len(src.shape), 1) - 1) + (256,))
        env = {id(src): codes.view(src.dtype.numpy) if src.dtype == DType.i8 else codes}
        try:
            table = self._tabulate(m, nodes, env)
        except Exception as e:          # a reference that rejects the codes' shape: no table
            return Fail(f"{m.q.name}: the chain could not be evaluated on the 256 codes ({e})")
        return build_or_fail(build, "TableLookup", src, domain="tensorfuse", table=table,
                             expect=m.q.outputs[0])

    @staticmethod
    def _tabulate(m, nodes, env) -> np.ndarray:
        from tensorfuse.ir.registry import get_op
        for n in nodes:
            ins = []
            for u in n.inputs:
                if u is None:
                    ins.append(None)
                elif id(u) in env:
                    ins.append(env[id(u)])
                else:
                    ins.append(np.asarray(u.data).reshape(()) if u.data.ndim else u.data)
            outs = get_op(n.op, n.domain).reference(n, ins)
            env[id(n.outputs[0])] = np.asarray(outs[0])
        ins = [env[id(m.v)], m.s.data, None if m.z is None else m.z.data]
        table = np.asarray(get_op("QuantizeLinear").reference(m.q, ins)[0]).reshape(256)
        return table.astype(m.q.outputs[0].dtype.numpy)


RULES = [DropActivationBeforeSaturatingQuantize, DropQDQAroundDataMovement, ConcatOnInt8, QuantizedElementwiseToTable, QuantizeConv, QuantizeMatMul, QuantizeMatMulActivations, QuantizeGemm,
         DynamicMatMulToFloat, DynamicConvToFloat]
FOLD = [FoldBatchNormIntoConvIntegerToFloat, FoldBiasIntoConvIntegerToFloat, FoldBiasIntoMatMulIntegerToFloat, FoldQuantizeScaleIntoConvIntegerToFloat,
        FoldQuantizeScaleIntoMatMulIntegerToFloat, FoldQuantizeScaleIntoAdd, FoldRequantizeScale]
