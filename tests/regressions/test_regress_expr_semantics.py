"""Regression tests for LLVM emitter bugs the expression-semantics harness (tests/expr_cases.py,
tests/test_semantics.py) found. Each failed before its fix (LLVM rejected the IR)."""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import Buffer, Cast, KernelBuilder, Ramp, unop
from tensorfuse.ir.types import DType
from test_semantics import run_llvm


def _vector_kernel(src: DType, dst: DType, make):
    x, y = Buffer("x", src, (8,)), Buffer("y", dst, (8,))
    kb = KernelBuilder("k", [x, y])
    with kb.loop(2, kind="parallel") as i:
        kb.store(y, [Ramp(i * 4, 4)], make(x.vload(i * 4, 4)))
    return kb.kernel


def test_vector_float_to_int_cast_saturates():
    """Cast of a 4-lane f32 vector to i32 declared llvm.fptosi.sat with a vector of vectors
    (``<4 x <4 x i32>>``: "invalid vector element type")."""
    k = _vector_kernel(DType.f32, DType.i32, lambda v: Cast(DType.i32, v))
    x = np.array([1.5, -2.5, 3e9, -3e9, np.nan, np.inf, -0.0, 7.99], np.float32)
    got = run_llvm(k, [x], [((8,), np.int32)])[0]
    np.testing.assert_array_equal(got, [1, -2, 2 ** 31 - 1, -2 ** 31, 0, 2 ** 31 - 1, 0, 7])


def test_isnan_of_an_integer_vector_is_false_in_every_lane():
    """isnan of a 4-lane integer vector gave a scalar i1 constant ("invalid cast opcode for
    cast from 'i1' to '<4 x i8>'" when stored)."""
    k = _vector_kernel(DType.i32, DType.bool, lambda v: unop("isnan", v))
    got = run_llvm(k, [np.arange(8, dtype=np.int32)], [((8,), np.bool_)])[0]
    np.testing.assert_array_equal(got, [False] * 8)
