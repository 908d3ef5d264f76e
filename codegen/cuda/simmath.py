"""The ``math`` functions generated cuda kernels call, for numba's CUDA simulator.

On a GPU numba compiles ``math.exp(x)`` of a float32 to libdevice's ``expf`` (a float32, NaN or
inf for arguments out of the domain). The simulator runs the kernel as Python, where
``math.exp`` returns a Python float and raises on overflow, ``math.sqrt(-1)`` raises and
``math.floor`` returns an int; generated modules bind ``math`` to this module under the
simulator instead, whose functions keep numpy's scalar dtype and give IEEE results (NaN, inf)
as the GPU does.
"""
from __future__ import annotations

import math as _m

import numpy as np

inf = _m.inf
nan = _m.nan
pi = _m.pi

sqrt = np.sqrt
exp = np.exp
exp2 = np.exp2
expm1 = np.expm1
log = np.log
log2 = np.log2
log1p = np.log1p
sin = np.sin
cos = np.cos
tan = np.tan
asin = np.arcsin
acos = np.arccos
atan = np.arctan
sinh = np.sinh
cosh = np.cosh
tanh = np.tanh
asinh = np.arcsinh
acosh = np.arccosh
atanh = np.arctanh
atan2 = np.arctan2
floor = np.floor
ceil = np.ceil
trunc = np.trunc
fabs = np.abs
fmod = np.fmod
copysign = np.copysign
isnan = np.isnan
isinf = np.isinf


def erf(x):
    """erf in the argument's numpy dtype (numpy has no erf; math.erf never raises)."""
    return type(x)(_m.erf(float(x)))


def remainder(x, y):
    """IEEE remainder (quotient rounded half to even), in the arguments' dtype."""
    return x - np.rint(x / y) * y
