"""GELU recognised from its decomposed forms as the ONNX Gelu op (opset 20).

The erf form 0.5 * x * (1 + Erf(x / sqrt 2)) becomes Gelu(approximate="none") and the tanh form
0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) becomes Gelu(approximate="tanh"): each
keeps its own meaning. Only O3 (:class:`ApproximateGelu`, numerics-changing) trades the erf
form for the tanh one. The anchor rules then take Gelu into a FusedMatMul/FusedConv epilogue.

Variants handled: the 0.5 on x, on the bracket or on the product; x / sqrt 2 or x * (1/sqrt 2);
x^3 as Pow(x, 3), x * x * x in either association; operands of Add and Mul in either order.
"""
from __future__ import annotations

import math

from tensorfuse.compiler.pattern import Any, Const, OneOf, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.compiler.rules._activation import build_or_fail

_RT = 1e-5   # constants as float32 exports write them
_x = Any("x")


def _half_times(x, bracket):
    """0.5 * x * bracket in its three associations (operand order is free: Mul commutes)."""
    return OneOf(P.Mul(P.Mul(x, bracket).single_use(), Const(0.5, rtol=_RT)),
                 P.Mul(P.Mul(x, Const(0.5, rtol=_RT)).single_use(), bracket),
                 P.Mul(x, P.Mul(bracket, Const(0.5, rtol=_RT)).single_use()),
                 name="y")


_erf_arg = OneOf(P.Div(_x, Const(math.sqrt(2.0), rtol=_RT)),
                 P.Mul(_x, Const(1.0 / math.sqrt(2.0), rtol=_RT))).single_use()
_erf_bracket = P.Add(P.Erf(_erf_arg).single_use(), Const(1.0, rtol=_RT)).single_use()

_cube = OneOf(P.Pow(_x, Const(3.0)),
              P.Mul(_x, P.Mul(_x, _x).single_use()),
              P.Mul(P.Mul(_x, _x).single_use(), _x)).single_use()
_poly = P.Add(_x, P.Mul(_cube, Const(0.044715, rtol=1e-4)).single_use()).single_use()
_tanh_bracket = P.Add(P.Tanh(P.Mul(_poly, Const(math.sqrt(2.0 / math.pi), rtol=_RT)).single_use()).single_use(),
                      Const(1.0, rtol=_RT)).single_use()


def _float_x(m):
    return m.x.dtype.is_float or Fail(f"'{m.x.name}' is {m.x.dtype}, not a float type")


class GeluErf(Rule):
    """x * 0.5 * (1 + Erf(x / sqrt 2)) ==> Gelu(x) (approximate="none")."""
    pattern = _half_times(_x, _erf_bracket)

    def condition(self, m):
        return _float_x(m)

    def rewrite(self, m, build):
        return build_or_fail(build, "Gelu", m.x, expect=m.y, approximate="none")


class GeluTanh(Rule):
    """x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) ==> Gelu(x, approximate="tanh")."""
    pattern = _half_times(_x, _tanh_bracket)

    def condition(self, m):
        return _float_x(m)

    def rewrite(self, m, build):
        return build_or_fail(build, "Gelu", m.x, expect=m.y, approximate="tanh")


class ApproximateGelu(Rule):
    """Gelu(x) ==> Gelu(x, approximate="tanh") (O3 only: differs from the erf form by at most 4.8e-4 absolute, near |x| = 2.7)."""
    pattern = P.Gelu(x=Any()).attrs(approximate="none")
    numerics_changing = True

    def rewrite(self, m, build):
        return build_or_fail(build, "Gelu", m.x, expect=m.gelu.outputs[0], approximate="tanh")


RULES = [GeluErf, GeluTanh]
O3 = [ApproximateGelu]
