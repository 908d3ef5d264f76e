"""The debug-mode static bounds check of the kernel IR (ir/bounds.py; issue 24 item 0): an
access whose index range provably leaves its buffer stops the compile, naming the kernel, the
buffer and the range; guarded, data-dependent and correlated indices are left alone."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from tensorfuse.compiler.errors import CompileError
from tensorfuse.ir.bounds import BoundsError, check_kernel_bounds
from tensorfuse.ir.kernel import Buffer, KernelBuilder
from tensorfuse.ir.types import DType

F32, I64 = DType.f32, DType.i64


def _kernel(body):
    a = Buffer("a", F32, (5,))
    y = Buffer("y", F32, (8,))
    idx = Buffer("idx", I64, (8,))
    kb = KernelBuilder("k", [a, idx, y])
    body(kb, a, idx, y)
    return kb.kernel


def test_load_past_the_end_is_reported():
    def body(kb, a, idx, y):
        with kb.loop(6) as i:                       # a has 5 elements: a[5] is read
            kb.store(y, i, a.flat(i))
    with pytest.raises(BoundsError, match=r"kernel k .*load of a \[5 elements, shape \[5\]\] at elements 0\.\.5"):
        check_kernel_bounds(_kernel(body))


@pytest.mark.parametrize("case", ["vector", "negative", "store", "constant"])
def test_other_out_of_bounds_accesses_are_reported(case):
    def body(kb, a, idx, y):
        if case == "vector":                        # y[1 : 1+8] of 8 elements
            kb.store(y, 1, kb.broadcast(a.flat(0), 8))
        elif case == "negative":
            with kb.loop(3) as i:
                kb.store(y, i, a.flat(i - 1))
        elif case == "store":
            with kb.loop(2) as i, kb.loop(5) as j:
                kb.store(y, i * 4 + j, a.flat(j))   # y[8] when i = 1, j = 4
        else:
            kb.store(y, 0, a.flat(7))
    with pytest.raises(BoundsError, match="out of bounds"):
        check_kernel_bounds(_kernel(body))


@pytest.mark.parametrize("case", ["in_bounds", "guarded", "guard_not_understood", "gather", "correlated",
                                  "empty_loop", "else_branch"])
def test_accesses_that_must_not_be_reported(case):
    def body(kb, a, idx, y):
        if case == "in_bounds":
            with kb.loop(5) as i:
                kb.store(y, i + 3, a.flat(4 - i))
        elif case == "guarded":                     # the tail guard keeps a[i] in bounds
            with kb.loop(2) as t:
                for r in range(4):
                    with kb.if_(t * 4 + r < 5):
                        kb.store(y, t * 4 + r, a.flat(t * 4 + r))
        elif case == "guard_not_understood":
            with kb.loop(8) as i:
                with kb.if_((i * i) < 5):
                    kb.store(y, i, a.flat(i))
        elif case == "gather":                      # data-dependent: the run-time checks' business
            with kb.loop(8) as i:
                kb.store(y, i, a.flat(idx.flat(i)))
        elif case == "correlated":                  # i / 2 and i % 2 of one i never reach 3 + 1
            with kb.loop(4) as i:
                kb.store(y, i, a.flat(i / 2 + i % 2))
        elif case == "empty_loop":
            with kb.loop(3, start=3) as i:
                kb.store(y, i, a.flat(i + 10))
        else:
            with kb.loop(8) as i:
                with kb.if_(i < 5) as small:
                    kb.store(y, i, a.flat(i))
                with kb.else_(small):
                    kb.store(y, i, a.flat(i - 5))
    check_kernel_bounds(_kernel(body))


def test_the_pointwise_epilogue_bug_fails_loudly_in_debug_mode(monkeypatch):
    """Put back the indexing issue 24 found (the flat pixel offset as a plain index, operands
    shaped [W] accepted): a compile in debug mode now stops with the out-of-bounds read of the
    5-element operand instead of running on garbage."""
    from tensorfuse.codegen.llvm.schedules import conv2d as conv_blocked
    monkeypatch.setenv("TENSORFUSE_DEBUG", "1")
    monkeypatch.setattr(conv_blocked, "PixelIndex", lambda idx, spatial: list(idx))
    monkeypatch.setattr(conv_blocked, "epilogue_operands", lambda ctx: [])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 2, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "a")]
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], group=2),
                           helper.make_node("Add", ["c", "a"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 5])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match=r"load of a \[5 elements, shape \[5\]\] .*out of bounds"):
        tensorfuse.compile(model, target="llvm -mattr=-avx512f", cache=False)
