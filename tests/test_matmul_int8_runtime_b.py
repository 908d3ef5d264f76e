"""The llvm int8 GEMM (``codegen/llvm/schedules/matmul_int8.py``) with a B computed at run time
(attention's products of two activations, ``QuantizeMatMulActivations``): B is packed per batch
by a first kernel, then the same micro-kernel runs. In each instruction form (VPDPBUSD at 16
and 8 lanes, VPMADDWD on AVX2), against onnx.reference (u8 x s8: onnxruntime's x86 kernels
saturate there) or onnxruntime, bit-exact for MatMulInteger's int32 output; a form the host
cannot run is compiled and its assembly inspected."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tensorfuse
from tensorfuse.compiler.pipeline import optimized_llvm
from tests.oracle import node_model
from tests.test_int8_schedules import FORMS, _check_dots, _fixed, _oracle, _q, _runs_here

CASES = [
    # a shape, b shape, a dtype, b dtype, a zero point, b zero point (None: absent)
    ((1, 4, 128, 64), (1, 4, 64, 128), np.uint8, np.uint8, 125, 129),   # bert's Q K^T
    ((1, 4, 128, 128), (1, 4, 128, 64), np.uint8, np.uint8, 0, 128),    # bert's P V
    ((2, 3, 37, 19), (2, 3, 19, 45), np.int8, np.uint8, -3, 7),         # tails in M, K and N
    ((3, 9, 6), (3, 6, 21), np.uint8, np.int8, 200, None),
    ((5, 33), (33, 7), np.int8, np.int8, None, -2),
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("ash,bsh,at,bt,az,bz", CASES)
def test_matmul_integer_runtime_b(form, ash, bsh, at, bt, az, bz):
    rng = np.random.default_rng(11)
    a, b = _q(ash, at, rng), _q(bsh, bt, rng)
    inits = {}
    names = ["a", "b"]
    if az is not None or bz is not None:
        names.append("az" if az is not None else "")
        if az is not None:
            inits["az"] = np.array(az, at)
    if bz is not None:
        names.append("bz")
        inits["bz"] = np.array(bz, bt)
    m = node_model("MatMulInteger", {"a": a, "b": b}, initializers=inits, input_names=names)
    target = FORMS[form][0]
    mod = tensorfuse.compile(m, target=target)
    assert {k.schedule for k in mod.kernels} == {"llvm.matmul_int8"}
    assert any(k.name.endswith("_packb") for k in mod.kernels)
    _check_dots(mod, form)
    if not _runs_here(form):
        _, asm = optimized_llvm(mod.llvm_ir, mod.target)
        assert re.search(r"vpdpbusd\s" if FORMS[form][1][1] == "vnni" else r"vpmaddwd\s", asm)
        return
    expected = _oracle(m, {"a": a, "b": b}, u8s8=True)
    np.testing.assert_array_equal(mod.run(a=a, b=b)[0], expected)


def test_runtime_b_with_a_fused_requantizing_epilogue():
    """MatMulIntegerToFloat of two activations anchoring its Q epilogue (one group, the packing
    kernel and the GEMM), within one quantization step of onnxruntime's unfused semantics."""
    from tests.test_rules_quantize import _attention_qdq_model
    from tests.oracle import ort_run
    m, feeds = _attention_qdq_model(a_shape=(1, 4, 32, 16), b_shape=(1, 4, 16, 32))
    mod = tensorfuse.compile(m)
    assert any(k.name.endswith("_packb") for k in mod.kernels)
    got, exp = mod.run(**feeds)[0], ort_run(m, feeds)[0]
    np.testing.assert_allclose(got, exp, rtol=0, atol=0.05 * 1.001)
    assert np.mean(got == exp) > 0.95


@pytest.mark.parametrize("epilogue", ["loop", "unrolled"])
def test_row_epilogue_loop_and_lane_tail(epilogue):
    """The requantizing epilogue of a register tile (knob ``int8_epilogue``): one copy in a loop
    over the tile's rows (default) or unrolled per row, and the row's last N % L columns
    through a loop over those lanes (N = 37 at 16 or 8 lanes; the last panel's vectors past N
    store nothing). Both within one quantization step of onnxruntime's unfused semantics,
    and the loop form's kernel is the smaller (ViT's QDQ Q K^T kernels: 34k -> 2.7k lines of
    LLVM IR)."""
    from tests.oracle import ort_run
    from tests.test_rules_quantize import _attention_qdq_model

    m, feeds = _attention_qdq_model(a_shape=(1, 2, 29, 16), b_shape=(1, 2, 16, 37))
    sizes = {}
    for e in ("loop", "unrolled"):
        mod = tensorfuse.compile(m, cache=False, tuning=_fixed(int8_epilogue=e, int8_engine="dot"))
        (gemm,) = [k for k in mod.kernels if k.schedule == "llvm.matmul_int8" and not k.name.endswith("_packb")]
        assert gemm.knobs["int8_epilogue"] == e and gemm.knobs["int8_tile"][0] > 1
        sizes[e] = len(str(gemm))
        if e == epilogue:
            got, exp = mod.run(**feeds)[0], ort_run(m, feeds)[0]
            np.testing.assert_allclose(got, exp, rtol=0, atol=0.05 * 1.001)
            assert np.mean(got == exp) > 0.95
    assert sizes["loop"] < sizes["unrolled"] / 2, sizes
