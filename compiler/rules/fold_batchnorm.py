"""BatchNormalization (inference) folded into the preceding Conv, ConvTranspose, Gemm or MatMul
whose weights are constants.

BatchNormalization(y) = y * a + (beta - mean * a) per channel (dim 1), a = gamma / sqrt(var + eps)
(ONNX spec: BatchNormalization-15). With y = W * x + b linear in W and b, the scaling goes into
the output-channel rows of W and the shift into the bias. The folded constants are computed in
float64 and rounded once to the weights' dtype.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail


def _bn_pattern(anchor):
    return P.BatchNormalization(anchor, gamma=Const(), beta=Const(), mean=Const(), var=Const())


def _bn_condition(m, channels: int):
    """The BatchNormalization is in inference mode, has one output and ``channels`` statistics."""
    bn = m.batchnormalization
    if int(bn.attr("training_mode", 0) or 0) != 0:
        return Fail(f"{bn.name}: BatchNormalization in training mode")
    if len([o for o in bn.outputs if o is not None]) != 1:
        return Fail(f"{bn.name}: BatchNormalization has running-statistics outputs (training)")
    for name in ("gamma", "beta", "mean", "var"):
        v = m[name]
        if v.data.size != channels or v.type.rank != 1:
            return Fail(f"{bn.name}: {name} '{v.name}' has shape {list(v.shape)}, expected [{channels}]")
    if not bn.inputs[0].dtype.is_float:
        return Fail(f"{bn.name}: input is {bn.inputs[0].dtype}, not a float type")
    return True


def _scale_shift(m):
    """(a, shift) in float64: BN(y) = y * a + shift."""
    eps = float(m.batchnormalization.attr("epsilon", 1e-5))
    a = m.gamma.data.astype(np.float64) / np.sqrt(m.var.data.astype(np.float64) + eps)
    return a, m.beta.data.astype(np.float64) - m.mean.data.astype(np.float64) * a


def _folded_bias(m, b, a, shift, channels):
    b0 = np.zeros(channels) if b is None else b.data.astype(np.float64).reshape(channels)
    return b0 * a + shift


class FoldBatchNormIntoConv(Rule):
    """BatchNormalization(Conv(x, W, b)) ==> Conv(x, W * a[oc], (b - mean) * a + beta), a = gamma / sqrt(var + eps)."""
    pattern = _bn_pattern(P.Conv(x=Any(), w=Const(), b=Optional(Const())).single_use())

    def condition(self, m):
        return _bn_condition(m, m.w.shape[0])

    def rewrite(self, m, build):
        a, shift = _scale_shift(m)
        w = m.w.data
        w2 = (w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b2 = _folded_bias(m, m.b, a, shift, w.shape[0]).astype(w.dtype)
        return build_or_fail(build, "Conv", m.x, build.const(w2, "w_bn"), build.const(b2, "b_bn"),
                             expect=m.batchnormalization.outputs[0], **m.conv.attrs)


class FoldBatchNormIntoConvTranspose(Rule):
    """BatchNormalization(ConvTranspose(x, W, b)) ==> ConvTranspose(x, W * a[oc], (b - mean) * a + beta), W: [C_in, C_out/group, k...]."""
    pattern = _bn_pattern(P.ConvTranspose(x=Any(), w=Const(), b=Optional(Const())).single_use())

    def condition(self, m):
        out = m.convtranspose.outputs[0]
        return _bn_condition(m, out.shape[1])

    def rewrite(self, m, build):
        a, shift = _scale_shift(m)
        w = m.w.data
        group = int(m.convtranspose.attr("group", 1))
        c_in, cog = w.shape[0], w.shape[1]
        # output channel of W[c, j] is (c // (c_in / group)) * cog + j
        wg = w.astype(np.float64).reshape((group, c_in // group, cog) + w.shape[2:])
        ag = a.reshape((group, 1, cog) + (1,) * (w.ndim - 2))
        w2 = (wg * ag).reshape(w.shape).astype(w.dtype)
        b2 = _folded_bias(m, m.b, a, shift, group * cog).astype(w.dtype)
        return build_or_fail(build, "ConvTranspose", m.x, build.const(w2, "w_bn"), build.const(b2, "b_bn"),
                             expect=m.batchnormalization.outputs[0], **m.convtranspose.attrs)


class FoldBatchNormIntoGemm(Rule):
    """BatchNormalization(Gemm(A, B, C)) ==> Gemm(A, B * a[n], (beta_g * C - mean) * a + beta) with constant B."""
    pattern = _bn_pattern(P.Gemm(a=Any(), w=Const(), c=Optional(Const())).single_use())

    def condition(self, m):
        return _bn_condition(m, m.gemm.outputs[0].shape[1])

    def rewrite(self, m, build):
        a, shift = _scale_shift(m)
        g = m.gemm
        w = m.w.data
        a_w = a.reshape(-1, 1) if g.attr("transB", 0) else a.reshape(1, -1)
        w2 = (w.astype(np.float64) * a_w).astype(w.dtype)
        n = a.shape[0]
        c = np.zeros(n) if m.c is None else float(g.attr("beta", 1.0)) * m.c.data.astype(np.float64)
        c2 = (c * a + shift).astype(w.dtype)
        if c2.ndim == 2 and c2.shape[0] == 1:
            c2 = c2.reshape(-1)
        attrs = dict(g.attrs)
        attrs["beta"] = 1.0
        return build_or_fail(build, "Gemm", m.a, build.const(w2, "w_bn"), build.const(c2, "c_bn"),
                             expect=m.batchnormalization.outputs[0], **attrs)


class FoldBatchNormIntoMatMul(Rule):
    """BatchNormalization(MatMul(x, W)) on a 2-D product ==> Add(MatMul(x, W * a), beta - mean * a) with constant W."""
    pattern = _bn_pattern(P.MatMul(x=Any(), w=Const().rank(2)).single_use())

    def condition(self, m):
        out = m.matmul.outputs[0]
        if out.type.rank != 2:
            return Fail(f"{m.matmul.name}: the product has rank {out.type.rank}; BatchNormalization's "
                        f"channel axis 1 is then not W's output axis")
        return _bn_condition(m, m.w.shape[1])

    def rewrite(self, m, build):
        a, shift = _scale_shift(m)
        w = m.w.data
        w2 = (w.astype(np.float64) * a.reshape(1, -1)).astype(w.dtype)
        y = build_or_fail(build, "MatMul", m.x, build.const(w2, "w_bn"))
        if isinstance(y, Fail):
            return y
        return build_or_fail(build, "Add", y, build.const(shift.astype(w.dtype), "b_bn"),
                             expect=m.batchnormalization.outputs[0])


RULES = [FoldBatchNormIntoConv, FoldBatchNormIntoConvTranspose, FoldBatchNormIntoGemm, FoldBatchNormIntoMatMul]
