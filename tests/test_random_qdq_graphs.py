"""Differential testing of random quantized models (issue 23): seeded random float CNNs and token
models (``tests/fuzz/qdqgen.py``: convolutions of random geometry with activations, residual
Adds, pools, Concat branches, Gemm/MatMul heads; MatMul + bias MLPs, residuals and an attention
core) quantized by onnxruntime's ``quantize_static`` as a user runs it (QDQ; uint8 activations
with int8 per-channel weights, or int8 per tensor), compiled at O2 and compared with
onnxruntime's unfused QDQ semantics under docs/quantization.md's contract (relative L2 error at
most max(2x onnxruntime's fused int8 error, 1%)). ``make test`` checks 4 models; the heavy
marker adds 28 more."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fuzz import qdqgen

pytestmark = pytest.mark.slow

LIGHT = [(0, "cnn", "u8s8"), (2, "cnn", "s8s8"), (1, "transformer", "u8s8"), (4, "transformer", "s8s8")]
HEAVY = [(s, k, r) for s in range(6, 13) for k in qdqgen.KINDS for r in qdqgen.RECIPES][:28]


@pytest.mark.parametrize("seed,kind,recipe",
                         [pytest.param(*c, id=f"{c[1]}-{c[0]}-{c[2]}") for c in LIGHT]
                         + [pytest.param(*c, id=f"{c[1]}-{c[0]}-{c[2]}", marks=pytest.mark.heavy) for c in HEAVY])
def test_random_quantized_model_meets_the_contract(seed, kind, recipe):
    m = qdqgen.float_model(seed, kind)
    q = qdqgen.quantize(m, recipe, seed)
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node), "onnxruntime's quantizer quantized nothing"
    for r in qdqgen.check(q, seed):
        assert r.ok, (f"seed {seed} {kind} {recipe} output {r.name}: relative L2 {r.ours:.3g} > {r.limit:.3g} "
                      f"(onnxruntime's fused int8 error {r.theirs:.3g})")


def test_generator_is_deterministic_and_draws_the_blocks():
    a, b = qdqgen.float_model(3, "cnn"), qdqgen.float_model(3, "cnn")
    assert a.SerializeToString() == b.SerializeToString()
    ops = set()
    for seed in range(12):
        for kind in qdqgen.KINDS:
            ops |= {n.op_type for n in qdqgen.float_model(seed, kind).graph.node}
    assert {"Conv", "Relu", "Clip", "Sigmoid", "Add", "MaxPool", "AveragePool", "Concat", "Gemm", "MatMul",
            "GlobalAveragePool", "Softmax", "Transpose"} <= ops, sorted(ops)
    groups = {a.i for seed in range(12) for n in qdqgen.float_model(seed, "cnn").graph.node
              if n.op_type == "Conv" for a in n.attribute if a.name == "group" and a.i > 1}
    assert groups, "no grouped or depthwise convolution drawn"


def test_check_catches_a_wrong_answer():
    # tensorfuse compiles a copy whose int8 weights are negated: the check must fail it
    q = qdqgen.quantize(qdqgen.float_model(0, "cnn"), "u8s8", 0)
    bad = onnx.ModelProto()
    bad.CopyFrom(q)
    flipped = 0
    for t in bad.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.int8 and a.ndim == 4:
            t.CopyFrom(numpy_helper.from_array((-a.astype(np.int16)).clip(-127, 127).astype(np.int8), t.name))
            flipped += 1
    assert flipped
    res = qdqgen.check(q, 0, ours_model=bad)
    assert not all(r.ok for r in res), [(r.ours, r.limit) for r in res]
