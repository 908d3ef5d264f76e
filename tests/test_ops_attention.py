"""ONNX Attention (opsets 23-25) against onnxruntime, and its numpy reference."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir import Builder, Graph
from tensorfuse.ir.registry import run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, ort_run, rand

IN_NAMES = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
OUT_NAMES = ["Y", "present_key", "present_value", "qk_matmul_output"]


def attention_model(inputs: dict, attrs: dict, outputs=("Y",), opset=24) -> onnx.ModelProto:
    names = [n if n in inputs else "" for n in IN_NAMES]
    while names[-1] == "":
        names.pop()
    outs = [n if n in outputs else "" for n in OUT_NAMES]
    while outs[-1] == "":
        outs.pop()
    node = helper.make_node("Attention", names, outs, **attrs)
    g_in = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()]
    g_out = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(inputs["Q"].dtype), None)
             for o in outs if o]
    m = helper.make_model(helper.make_graph([node], "attn", g_in, g_out),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    m = onnx.shape_inference.infer_shapes(m)
    inferred = {vi.name: vi for vi in m.graph.value_info}
    for o in m.graph.output:
        if not o.type.tensor_type.HasField("shape") and o.name in inferred:
            o.CopyFrom(inferred[o.name])
    return m


def qkv(b=2, hq=4, hkv=2, sq=3, skv=5, d=8, dv=6, rank=4, dtype=np.float32, seed=0):
    if rank == 4:
        return dict(Q=rand(b, hq, sq, d, seed=seed, dtype=dtype), K=rand(b, hkv, skv, d, seed=seed + 1, dtype=dtype),
                    V=rand(b, hkv, skv, dv, seed=seed + 2, dtype=dtype))
    return dict(Q=rand(b, sq, hq * d, seed=seed, dtype=dtype), K=rand(b, skv, hkv * d, seed=seed + 1, dtype=dtype),
                V=rand(b, skv, hkv * dv, seed=seed + 2, dtype=dtype))


CASES = {
    "mha": ({}, {"hkv": 4}),
    "gqa": ({}, {}),
    "mqa_scaled": ({"scale": 0.3}, {"hkv": 1}),
    "causal": ({"is_causal": 1}, {}),
    "causal_long_q": ({"is_causal": 1}, {"sq": 7, "skv": 4}),
    "softcap": ({"softcap": 1.5}, {}),
    "rank3": ({"q_num_heads": 4, "kv_num_heads": 2}, {"rank": 3}),
    "rank3_causal": ({"q_num_heads": 4, "kv_num_heads": 1, "is_causal": 1}, {"rank": 3, "hkv": 1}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_ort(name):
    attrs, geo = CASES[name]
    inputs = qkv(**geo)
    assert_matches_ort(attention_model(inputs, attrs), inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


@pytest.mark.parametrize("mask_shape,dtype", [((3, 5), np.float32), ((2, 1, 3, 5), np.float32),
                                               ((4, 3, 5), np.float32), ((3, 5), np.bool_),
                                               ((2, 4, 3, 5), np.bool_)])
def test_attention_masks(mask_shape, dtype):
    inputs = qkv()
    mask = rand(*mask_shape, seed=7) if dtype == np.float32 else rand(*mask_shape, dtype=np.bool_, seed=7)
    if dtype == np.bool_:
        mask[..., 0] = True          # onnxruntime gives NaN for fully masked rows; the spec gives 0
    inputs["attn_mask"] = mask
    assert_matches_ort(attention_model(inputs, {}), inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_past_present_and_qk_output(rank, mode):
    inputs = qkv(rank=rank, skv=2)
    inputs["attn_mask"] = rand(3, 6, seed=3)
    inputs["past_key"] = rand(2, 2, 4, 8, seed=4)
    inputs["past_value"] = rand(2, 2, 4, 6, seed=5)
    # mode 2 with masked keys: onnxruntime writes -FLT_MAX where the spec (and tensorfuse) has -inf
    attrs = {"qk_matmul_output_mode": mode, "is_causal": int(mode != 2), "softcap": 2.0}
    if rank == 3:
        attrs.update(q_num_heads=4, kv_num_heads=2)
    m = attention_model(inputs, attrs, outputs=OUT_NAMES)
    assert_matches_ort(m, inputs, rtol=1e-4, atol=1e-5, opt_levels=(0, 2))


def test_attention_nonpad_kv_seqlen_external_cache():
    inputs = qkv(sq=2, skv=6)
    inputs["nonpad_kv_seqlen"] = np.array([3, 6], np.int64)
    assert_matches_ort(attention_model(inputs, {"is_causal": 1}), inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


@pytest.mark.parametrize("left,right,causal", [(2, -1, 1), (1, 2, 0), (0, 0, 0)])
def test_attention_sliding_window_opset25(left, right, causal):
    inputs = qkv(sq=5, skv=7)
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": causal}
    assert_matches_ort(attention_model(inputs, attrs, opset=25), inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


def test_fully_masked_row_is_zero_not_nan():
    inputs = qkv(b=1, hq=2, hkv=2, sq=2, skv=2)
    inputs["attn_mask"] = np.array([[True, False], [False, False]])
    m = attention_model(inputs, {"qk_matmul_output_mode": 3}, outputs=("Y", "qk_matmul_output"))
    y, p = tensorfuse.compile(m, target="llvm").run(**inputs)
    assert np.all(y[:, :, 1] == 0) and np.all(p[:, :, 1] == 0)
    assert np.all(p[:, :, 0, 0] == 1)
    np.testing.assert_allclose(y[:, :, 0], np.broadcast_to(inputs["V"][:, :, 0], y[:, :, 0].shape), rtol=1e-6)


def test_float16_and_float64():
    for dt, tol in ((np.float16, 2e-3), (np.float64, 1e-6)):
        inputs = qkv(dtype=dt)
        assert_matches_ort(attention_model(inputs, {"is_causal": 1}), inputs, rtol=tol, atol=tol, opt_levels=(2,))


def test_softmax_precision_double():
    inputs = qkv()
    inputs["attn_mask"] = rand(3, 5, seed=1)
    m = attention_model(inputs, {"softmax_precision": 11, "qk_matmul_output_mode": 3}, outputs=("Y", "qk_matmul_output"))
    assert_matches_ort(m, inputs, rtol=1e-5, atol=1e-6, opt_levels=(2,))


def test_reference_matches_ort():
    inputs = qkv(rank=3, skv=4)
    inputs["attn_mask"] = rand(3, 7, seed=2)
    inputs["past_key"] = rand(2, 2, 3, 8, seed=3)
    inputs["past_value"] = rand(2, 2, 3, 6, seed=4)
    attrs = dict(q_num_heads=4, kv_num_heads=2, is_causal=1, softcap=1.0, qk_matmul_output_mode=2)
    expected = ort_run(attention_model(inputs, attrs, outputs=OUT_NAMES), inputs)
    g = Graph()
    vals = [g.add_input(k, TensorType.of(v)) for k, v in inputs.items()]
    outs = Builder(g).op("Attention", *vals, num_outputs=4, **attrs)
    got = run_reference(outs[0].producer, list(inputs.values()))
    for a, e in zip(got, expected):
        e = np.where(e <= np.finfo(np.float32).min, -np.inf, e)   # onnxruntime: -FLT_MAX for -inf
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("inputs,attrs,match", [
    (dict(Q=rand(2, 3, 8), K=rand(2, 4, 8), V=rand(2, 4, 8)), {}, "q_num_heads"),
    (dict(Q=rand(1, 3, 2, 8), K=rand(1, 2, 4, 8), V=rand(1, 2, 4, 8)), {}, "not a multiple"),
    (dict(Q=rand(1, 2, 2, 8), K=rand(1, 2, 4, 6), V=rand(1, 2, 4, 8)), {}, "head size"),
    (dict(Q=rand(1, 2, 2, 8), K=rand(1, 2, 4, 8), V=rand(1, 2, 4, 8), attn_mask=rand(3, 4)), {}, "broadcast"),
])
def test_attention_errors(inputs, attrs, match):
    names = [n if n in inputs else "" for n in IN_NAMES]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    g_in = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()]
    m = helper.make_model(helper.make_graph([node], "g", g_in, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None] * len(inputs["Q"].shape))]),
                          opset_imports=[helper.make_opsetid("", 24)])
    with pytest.raises(UnsupportedModelError, match=match):
        tensorfuse.compile(m, target="llvm")


def test_rank1_mask_against_onnx_reference():
    """onnxruntime rejects rank-1 masks; onnx.reference is the oracle (opset 25 allows them)."""
    from onnx.reference import ReferenceEvaluator
    inputs = qkv(sq=4, skv=6)
    inputs["attn_mask"] = np.array([True, True, False, True, True, False])
    m = attention_model(inputs, {"is_causal": 1, "left_window_size": 2}, opset=25)
    (expected,) = ReferenceEvaluator(m).run(None, inputs)
    (got,) = tensorfuse.compile(m, target="llvm").run(**inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_short_mask_is_padded_with_minus_inf():
    """A mask shorter than the kv length masks the missing keys (onnxruntime rejects it)."""
    from onnx.reference import ReferenceEvaluator
    inputs = qkv()
    inputs["attn_mask"] = rand(2, 1, 3, 3, seed=9)
    m = attention_model(inputs, {}, opset=24)
    (expected,) = ReferenceEvaluator(m).run(None, inputs)
    (got,) = tensorfuse.compile(m, target="llvm").run(**inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
