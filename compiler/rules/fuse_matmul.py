"""MatMul / Gemm epilogue fusion: MatMul + bias along the last axis (+ activation) ==>
``tensorfuse::FusedMatMul``; Gemm + activation ==> ``tensorfuse::FusedGemm``; an activation
after a Reshape of a product moved before the Reshape, onto the product, so those rules see it
(GPT-2's Conv1D layers: Reshape -> Gemm -> Reshape -> Gelu).

The bias must be a constant (a layer's parameter) whose shape is 1 everywhere but the last axis,
which is N: a runtime tensor added to a product is left alone (it is, for example, the mask of
an attention block, which fuse_attention takes whole).
"""
from __future__ import annotations

from tensorfuse.compiler.pattern import Any, Const, OneOf, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import activation, activation_of, build_or_fail, rebuild_activation

FUSED_MATMUL = "tensorfuse::FusedMatMul"


class FuseMatMulBias(Rule):
    """Add(MatMul(a, b), bias) with a constant bias along the last axis ==> FusedMatMul(a, b, bias)."""
    pattern = P.Add(P.MatMul(a=Any(), b=Any()).single_use(), bias=Const())

    def condition(self, m):
        y, out = m.matmul.outputs[0], m.add.outputs[0]
        bs = tuple(m.bias.shape)
        if not y.dtype.is_float:
            return Fail(f"{m.matmul.name}: the product is {y.dtype}, not a float type")
        if y.type.rank == 0 or len(bs) == 0 or len(bs) > y.type.rank or bs[-1] != y.shape[-1] \
                or any(d != 1 for d in bs[:-1]):
            return Fail(f"{m.add.name}: bias '{m.bias.name}' of shape {list(bs)} is not along the last axis "
                        f"of the product {list(y.shape)}")
        if out.type != y.type:
            return Fail(f"{m.add.name}: the Add changes the product's type {y.type} to {out.type}")
        return True

    def rewrite(self, m, build):
        n = m.bias.shape[-1]
        bias = m.bias if m.bias.type.rank == 1 else build.const(m.bias.data.reshape(n), "bias")
        return build_or_fail(build, "FusedMatMul", m.a, m.b, bias, domain="tensorfuse", expect=m.add.outputs[0],
                             activation="", activation_params=[])


def _float_product_and_activation(product, act):
    """The condition of the activation rules: the ``product`` value is a float type and ``act``
    (matched by :func:`activation`) is an activation the fused ops take."""
    if not product.dtype.is_float:
        return Fail(f"{product.producer.name}: the product is {product.dtype}, not a float type")
    a = activation_of(act)
    return a if isinstance(a, Fail) else True


_anchor = OneOf(P.MatMul(a=Any(), b=Any()),
                P.__getattr__(FUSED_MATMUL)(a=Any(), b=Any(), bias=Optional()).attrs(activation=""),
                name="y").single_use()


class FuseMatMulActivation(Rule):
    """Act(MatMul or FusedMatMul without activation) ==> FusedMatMul(..., activation=Act), Gelu included."""
    pattern = activation(_anchor)

    def condition(self, m):
        return _float_product_and_activation(m.y, m.act)

    def rewrite(self, m, build):
        name, params = activation_of(m.act)
        return build_or_fail(build, "FusedMatMul", m.a, m.b, m.bias, domain="tensorfuse", expect=m.act,
                             activation=name, activation_params=params)


class FuseGemmActivation(Rule):
    """Act(Gemm(A, B, C)) ==> FusedGemm(A, B, C, activation=Act)."""
    pattern = activation(P.Gemm(a=Any(), b=Any(), c=Optional()).single_use())

    def condition(self, m):
        return _float_product_and_activation(m.gemm.outputs[0], m.act)

    def rewrite(self, m, build):
        name, params = activation_of(m.act)
        return build_or_fail(build, "FusedGemm", m.a, m.b, m.c, domain="tensorfuse", expect=m.act,
                             attributes=dict(m.gemm.attrs, activation=name, activation_params=params))


class ActivationBeforeReshape(Rule):
    """Act(Reshape(Gemm, MatMul or MatMulIntegerToFloat, shape)) ==> Reshape(Act(product), shape):
    an elementwise activation commutes with a Reshape (the same elements, in the same order),
    and on the product itself FuseGemmActivation / FuseMatMulActivation take it into the
    product's epilogue (the integer product's epilogue takes it in fuse_ops: quantize_dynamic
    writes its MatMuls on 2-D reshapes of the tokens, and ViT-B/16's GELU was a kernel of its
    own after each). The product and the Reshape must have no other consumer."""
    pattern = activation(P.Reshape(OneOf(P.Gemm(Any(), Any(), Optional()), P.MatMul(Any(), Any()),
                                         P.__getattr__("com.microsoft::MatMulIntegerToFloat")(
                                             Any(), Any(), Any(), Any(), Optional(), Optional(), Optional()),
                                         name="prod").single_use(), Any()).single_use())

    def condition(self, m):
        return _float_product_and_activation(m.prod, m.act)

    def rewrite(self, m, build):
        y = rebuild_activation(build, m.act, m.prod)
        if isinstance(y, Fail):
            return y
        r = m.reshape
        return build_or_fail(build, "Reshape", y, *r.inputs[1:], expect=m.act, **r.attrs)


RULES = [ActivationBeforeReshape, FuseMatMulBias, FuseMatMulActivation, FuseGemmActivation]
