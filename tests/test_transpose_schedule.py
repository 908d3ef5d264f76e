"""The llvm schedule of a Transpose that swaps two axis groups (``codegen/llvm/schedules/
transpose.py``, ``transpose_blocks``, key ``"transpose"``): NCHW <-> NHWC and the other batched
2-D transposes, 4-byte elements, in the AVX2 form (x86-64-v3: 8 f32 lanes) and the AVX-512 form
(x86-64-v4: 16), against numpy's transpose and onnxruntime with optimisations off (exact: the
schedule moves values). A form the host cannot run is compiled and its kernel checked, not run."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from tensorfuse.codegen.llvm.schedules.transpose import transpose_groups, transpose_vectors
from tensorfuse.ir.target import Target
from tests.oracle import node_model, ort_run

HOST = Target.parse("llvm")
FORMS = {
    "avx2": ("llvm -mcpu=x86-64-v3", {"avx2"}),
    "avx512": ("llvm -mcpu=x86-64-v4", {"avx512f", "avx512bw"}),
}
SCHEDULE = "llvm.transpose_blocks"


def _fixed(**knobs):
    from tensorfuse.compiler.tuning import TuningRecords

    class Fixed(TuningRecords):
        def knobs_for(self, *args, **kw):
            return dict(knobs)

        def for_target(self, *args, **kw):
            return self
    return Fixed([])


def _x(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(dtype)


def test_groups():
    """(B, A, C) of the permutations that are one swap of two axis groups, size-1 axes dropped;
    None for the identity and for permutations that move blocks ([0, 2, 1, 3]: D stays last)."""
    assert transpose_groups((1, 56, 56, 96), [0, 3, 1, 2]) == (1, 3136, 96)
    assert transpose_groups((1, 96, 56, 56), [0, 2, 3, 1]) == (1, 96, 3136)
    assert transpose_groups((40, 24), [1, 0]) == (1, 40, 24)
    assert transpose_groups((2, 3, 16, 16), [0, 1, 3, 2]) == (6, 16, 16)
    assert transpose_groups((2, 30, 1, 40), [3, 2, 0, 1]) == (1, 60, 40)
    assert transpose_groups((4, 5, 6, 7), [0, 2, 1, 3]) is None
    assert transpose_groups((4, 5, 6), [0, 1, 2]) is None
    assert transpose_groups((4, 5, 6), [2, 0, 1]) == (1, 20, 6)
    assert transpose_groups((4, 5, 6), [2, 1, 0]) is None


@pytest.mark.parametrize("L", [4, 8, 16])
def test_transpose_vectors_is_a_transposition(L):
    """The shuffle network's masks, evaluated with numpy: vector j holds lane j of every row."""
    from tensorfuse.ir.kernel import Ramp, Shuffle, as_expr

    rows = [Ramp(as_expr(i * L), L) for i in range(L)]      # row i: lanes i*L .. i*L+L-1
    out = transpose_vectors(rows)
    m = np.arange(L * L).reshape(L, L)

    def value(e):
        if isinstance(e, Ramp):
            return m[e.base.value // L]
        assert isinstance(e, Shuffle)
        both = np.concatenate([value(e.a), value(e.b)])
        return both[list(e.mask)]
    np.testing.assert_array_equal(np.stack([value(v) for v in out]), m.T)


CASES = [
    ((1, 56, 56, 24), [0, 3, 1, 2]),     # NHWC -> NCHW (A = 3136, C = 24: a partial C block)
    ((1, 24, 28, 28), [0, 2, 3, 1]),     # NCHW -> NHWC
    ((2, 17, 33), [0, 2, 1]),            # batches, partial blocks both ways
    ((40, 24), [1, 0]),
    ((3, 2, 16, 16), [0, 1, 3, 2]),      # 6 batches of whole 16x16 blocks
    ((1, 7, 7, 200), [0, 3, 1, 2]),      # A = 49
    ((2, 30, 1, 40), [3, 2, 0, 1]),      # a size-1 axis, groups of two axes
    ((8, 9), [1, 0]),                    # one 8-lane block and a row and a column past it
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("shape,perm", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_transpose_blocks(form, shape, perm, dtype):
    target, feats = FORMS[form]
    x = _x(shape, dtype)
    m = node_model("Transpose", {"x": x}, {"perm": perm})
    mod = tensorfuse.compile(m, target=target, cache=False, num_threads=2)
    lanes = 8 if form == "avx2" else 16
    _, A, C = transpose_groups(shape, perm)
    fires = A >= lanes and C >= lanes
    assert [k.schedule for k in mod.kernels] == [SCHEDULE if fires else "generic"]
    if feats <= HOST.feature_set:
        got = mod.run(x)[0]
        np.testing.assert_array_equal(got, np.transpose(x, perm))
        np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("block", [4, 8, 16])
def test_transpose_block_knob(block):
    """Every block size the knob offers (16 lanes: 16, 8, 4) moves the same values."""
    x = _x((3, 37, 45), np.float32, seed=block)
    m = node_model("Transpose", {"x": x}, {"perm": [0, 2, 1]})
    mod = tensorfuse.compile(m, target=FORMS["avx512"][0], cache=False, tuning=_fixed(transpose_block=block))
    assert mod.kernels[0].knobs["transpose_block"] == block
    if FORMS["avx512"][1] <= HOST.feature_set:
        np.testing.assert_array_equal(mod.run(x)[0], np.transpose(x, [0, 2, 1]))


@pytest.mark.parametrize("shape,perm,dtype", [
    ((4, 5, 6, 7), [0, 2, 1, 3], np.float32),      # rows of D move as blocks: the generic nest
    ((1, 64, 64), [0, 2, 1], np.uint8),              # 1-byte elements
    ((1, 64, 64), [0, 2, 1], np.float64),            # 8-byte elements
    ((1, 64, 3), [0, 2, 1], np.float32),             # C under a block
])
def test_transpose_blocks_does_not_fire(shape, perm, dtype):
    x = _x(shape, dtype) if dtype in (np.float32, np.int32) else np.arange(np.prod(shape)).reshape(shape).astype(dtype)
    m = node_model("Transpose", {"x": x}, {"perm": perm})
    mod = tensorfuse.compile(m, cache=False)
    assert SCHEDULE not in {k.schedule for k in mod.kernels}
    np.testing.assert_array_equal(mod.run(x)[0], np.transpose(x, perm))
