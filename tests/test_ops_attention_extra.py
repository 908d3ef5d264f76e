"""RotaryEmbedding (opset 23), LinearAttention and CausalConvWithState (opset 27) against
onnxruntime (optimisations off), and their numpy references."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir import Builder, Graph
from tensorfuse.ir.registry import get_op, run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

ROPE_IN = ["X", "cos_cache", "sin_cache", "position_ids"]
LIN_IN = ["query", "key", "value", "past_state", "decay", "beta"]
CONV_IN = ["input", "weight", "bias", "past_state"]


def model(op, order, inputs, attrs, outputs, opset):
    names = [n if n in inputs else "" for n in order]
    while names[-1] == "":
        names.pop()
    return node_model(op, inputs, attrs, outputs=outputs, opset=opset, input_names=names)


def reference_outputs(op, inputs, attrs, num_outputs):
    g = Graph()
    vals = [g.add_input(k, TensorType.of(v)) for k, v in inputs.items()]
    outs = Builder(g).op(op, *vals, num_outputs=num_outputs, **attrs)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return run_reference(outs[0].producer, list(inputs.values()))


# ============================================================================= RotaryEmbedding
def rope_inputs(rank=4, b=2, h=3, s=4, d=8, rot=0, pos="full", max_pos=10, dtype=np.float32, seed=0):
    half = (rot or d) // 2
    x = rand(b, h, s, d, dtype=dtype, seed=seed) if rank == 4 else rand(b, s, h * d, dtype=dtype, seed=seed)
    ins = {"X": x}
    if pos is None:
        ins["cos_cache"] = rand(b, s, half, dtype=dtype, seed=seed + 1, low=-1, high=1)
        ins["sin_cache"] = rand(b, s, half, dtype=dtype, seed=seed + 2, low=-1, high=1)
    elif pos == "bcast_cache":
        ins["cos_cache"] = rand(1, s, half, dtype=dtype, seed=seed + 1, low=-1, high=1)
        ins["sin_cache"] = rand(1, s, half, dtype=dtype, seed=seed + 2, low=-1, high=1)
    else:
        theta = np.arange(max_pos)[:, None] * (1.0 / 10000 ** (np.arange(half) / half))[None, :]
        ins["cos_cache"] = np.cos(theta).astype(dtype)
        ins["sin_cache"] = np.sin(theta).astype(dtype)
        shape = (b, s) if pos == "full" else (1, s)
        ins["position_ids"] = np.random.default_rng(seed).integers(0, max_pos, size=shape).astype(np.int64)
    return ins


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot", [0, 4])
@pytest.mark.parametrize("pos", ["full", None])
def test_rotary_matches_ort(rank, interleaved, rot, pos):
    inputs = rope_inputs(rank=rank, rot=rot, pos=pos)
    attrs = {"interleaved": interleaved}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    if rank == 3:
        attrs["num_heads"] = 3
    assert_matches_ort(model("RotaryEmbedding", ROPE_IN, inputs, attrs, ("Y",), 23), inputs,
                       rtol=1e-5, atol=1e-6, opt_levels=(2,))


@pytest.mark.parametrize("pos", ["bcast_pos", "bcast_cache"])
def test_rotary_broadcast_positions_and_caches(pos):
    """position_ids [1, S] / caches [1, S, R/2] broadcast over the batch as in the spec's numpy
    definition; onnxruntime insists on the full batch, so onnx.reference is the oracle."""
    from onnx.reference import ReferenceEvaluator
    inputs = rope_inputs(rank=4, pos=pos, d=6)
    m = model("RotaryEmbedding", ROPE_IN, inputs, {}, ("Y",), 23)
    (expected,) = ReferenceEvaluator(m).run(None, inputs)
    for lvl in (0, 2):
        (got,) = tensorfuse.compile(m, target="llvm", opt_level=lvl).run(**inputs)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_rotary_float16():
    inputs = rope_inputs(rank=3, rot=6, pos="full", dtype=np.float16)
    attrs = {"num_heads": 3, "rotary_embedding_dim": 6, "interleaved": 1}
    assert_matches_ort(model("RotaryEmbedding", ROPE_IN, inputs, attrs, ("Y",), 23), inputs,
                       rtol=1e-3, atol=1e-3, opt_levels=(2,))


def test_rotary_reference_matches_ort():
    inputs = rope_inputs(rank=3, rot=4, pos="full")
    attrs = {"num_heads": 3, "rotary_embedding_dim": 4, "interleaved": 1}
    (expected,) = ort_run(model("RotaryEmbedding", ROPE_IN, inputs, attrs, ("Y",), 23), inputs)
    (got,) = reference_outputs("RotaryEmbedding", inputs, attrs, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_rotary_out_of_range_positions_clamp():
    inputs = rope_inputs(rank=4, pos="full", max_pos=5)
    inputs["position_ids"][0, 0], inputs["position_ids"][1, 2] = 17, -3
    (got,) = tensorfuse.compile(model("RotaryEmbedding", ROPE_IN, inputs, {}, ("Y",), 23), target="llvm").run(**inputs)
    (ref,) = reference_outputs("RotaryEmbedding", inputs, {}, 1)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    clamped = dict(inputs, position_ids=np.clip(inputs["position_ids"], 0, 4))
    (ref2,) = reference_outputs("RotaryEmbedding", clamped, {}, 1)
    np.testing.assert_array_equal(ref, ref2)


# ============================================================================= LinearAttention
def l2norm(x, heads):
    b, t, hd = x.shape
    x4 = x.reshape(b, t, heads, hd // heads)
    return (x4 / np.maximum(np.linalg.norm(x4, axis=-1, keepdims=True), 1e-6)).reshape(b, t, hd).astype(x.dtype)


def lin_inputs(rule="gated_delta", b=2, t=3, hq=4, hkv=2, dk=4, dv=5, decay="key", beta="head",
               past=False, dtype=np.float32, state_dtype=None, seed=0):
    ins = {"query": rand(b, t, hq * dk, dtype=dtype, seed=seed, low=-1, high=1),
           "key": l2norm(rand(b, t, hkv * dk, dtype=dtype, seed=seed + 1), hkv),
           "value": rand(b, t, hkv * dv, dtype=dtype, seed=seed + 2, low=-1, high=1)}
    if past:
        ins["past_state"] = rand(b, hkv, dk, dv, dtype=state_dtype or dtype, seed=seed + 3, low=-0.3, high=0.3)
    if rule in ("gated", "gated_delta"):
        last = hkv * dk if decay == "key" else hkv
        ins["decay"] = rand(b, t, last, dtype=dtype, seed=seed + 4, low=-0.3, high=0.0)
    if rule in ("delta", "gated_delta"):
        ins["beta"] = rand(b, t, hkv if beta == "head" else 1, dtype=dtype, seed=seed + 5, low=0.0, high=1.0)
    return ins


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("past", [False, True])
def test_linear_attention_rules_match_ort(rule, past):
    inputs = lin_inputs(rule, past=past)
    attrs = {"update_rule": rule, "q_num_heads": 4, "kv_num_heads": 2}
    m = model("LinearAttention", LIN_IN, inputs, attrs, ("output", "present_state"), 27)
    assert_matches_ort(m, inputs, rtol=1e-4, atol=1e-5, opt_levels=(0, 2))


@pytest.mark.parametrize("geo", [
    dict(hq=3, hkv=3, decay="head"),               # MHA, per-head scalar decay
    dict(hq=4, hkv=1, beta="shared"),              # MQA, beta [B, T, 1]
    dict(hq=2, hkv=2, beta="shared"),              # beta [B, T, 1] shared by two kv heads
    dict(t=1, past=True),                          # one decode step
    dict(b=1, t=6, hq=2, hkv=1, dk=3, dv=2),
])
def test_linear_attention_geometries(geo):
    inputs = lin_inputs(**geo)
    hq, hkv = geo.get("hq", 4), geo.get("hkv", 2)
    m = model("LinearAttention", LIN_IN, inputs, {"q_num_heads": hq, "kv_num_heads": hkv},
              ("output", "present_state"), 27)
    assert_matches_ort(m, inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


def test_linear_attention_explicit_scale_and_chunk_size():
    inputs = lin_inputs("gated", past=True)
    attrs = {"update_rule": "gated", "q_num_heads": 4, "kv_num_heads": 2, "scale": 0.7, "chunk_size": 2}
    m = model("LinearAttention", LIN_IN, inputs, attrs, ("output", "present_state"), 27)
    assert_matches_ort(m, inputs, rtol=1e-4, atol=1e-5, opt_levels=(2,))


def test_linear_attention_float16_with_float32_state():
    """T = f16 activations, S = f32 state: the output is f16, present_state f32."""
    inputs = lin_inputs(past=True, dtype=np.float16, state_dtype=np.float32)
    m = model("LinearAttention", LIN_IN, inputs, {"q_num_heads": 4, "kv_num_heads": 2},
              ("output", "present_state"), 27)
    out, state = assert_matches_ort(m, inputs, rtol=2e-3, atol=2e-3, opt_levels=(2,))
    assert out.dtype == np.float16 and state.dtype == np.float32


def test_linear_attention_float16_no_past():
    inputs = lin_inputs(dtype=np.float16)
    m = model("LinearAttention", LIN_IN, inputs, {"q_num_heads": 4, "kv_num_heads": 2},
              ("output", "present_state"), 27)
    out, state = assert_matches_ort(m, inputs, rtol=2e-3, atol=2e-3, opt_levels=(2,))
    assert state.dtype == np.float16


def test_linear_attention_reference_matches_ort():
    inputs = lin_inputs(past=True, hq=4, hkv=1)
    attrs = {"q_num_heads": 4, "kv_num_heads": 1}
    expected = ort_run(model("LinearAttention", LIN_IN, inputs, attrs, ("output", "present_state"), 27), inputs)
    got = reference_outputs("LinearAttention", inputs, attrs, 2)
    for a, e in zip(got, expected):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


# ============================================================================= CausalConvWithState
def conv_inputs(b=2, c=3, L=7, k=4, bias=False, past=False, dtype=np.float32, seed=0):
    ins = {"input": rand(b, c, L, dtype=dtype, seed=seed), "weight": rand(c, 1, k, dtype=dtype, seed=seed + 1)}
    if bias:
        ins["bias"] = rand(c, dtype=dtype, seed=seed + 2)
    if past:
        ins["past_state"] = rand(b, c, k - 1, dtype=dtype, seed=seed + 3)
    return ins


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("activation", ["none", "silu", "swish"])
def test_causal_conv_matches_ort(bias, past, activation):
    inputs = conv_inputs(bias=bias, past=past)
    m = model("CausalConvWithState", CONV_IN, inputs, {"activation": activation}, ("output", "present_state"), 27)
    assert_matches_ort(m, inputs, rtol=1e-5, atol=1e-6, opt_levels=(2,))


@pytest.mark.parametrize("geo", [
    dict(L=1, k=4, bias=True, past=True),      # decode step
    dict(L=2, k=5),                            # input shorter than the state: present keeps zeros
    dict(L=2, k=5, past=True),                 # ... or part of the past
    dict(b=1, c=1, L=6, k=3),
    dict(L=5, k=2, past=True),
])
def test_causal_conv_geometries(geo):
    inputs = conv_inputs(**geo)
    m = model("CausalConvWithState", CONV_IN, inputs, {}, ("output", "present_state"), 27)
    assert_matches_ort(m, inputs, rtol=1e-5, atol=1e-6, opt_levels=(0, 2))


def test_causal_conv_kernel_size_one_has_empty_state():
    inputs = conv_inputs(k=1, bias=True)
    m = model("CausalConvWithState", CONV_IN, inputs, {}, ("output", "present_state"), 27)
    y, st = tensorfuse.compile(m, target="llvm").run(**inputs)
    assert st.shape == (2, 3, 0)
    np.testing.assert_allclose(y, inputs["input"] * inputs["weight"][None, :, 0, :] + inputs["bias"][None, :, None],
                               rtol=1e-6, atol=1e-6)


def test_causal_conv_float16_silu():
    inputs = conv_inputs(dtype=np.float16, bias=True, past=True)
    m = model("CausalConvWithState", CONV_IN, inputs, {"activation": "silu"}, ("output", "present_state"), 27)
    assert_matches_ort(m, inputs, rtol=2e-3, atol=2e-3, opt_levels=(2,))


def test_causal_conv_reference_matches_ort():
    inputs = conv_inputs(bias=True, past=True)
    attrs = {"activation": "silu"}
    expected = ort_run(model("CausalConvWithState", CONV_IN, inputs, attrs, ("output", "present_state"), 27), inputs)
    got = reference_outputs("CausalConvWithState", inputs, attrs, 2)
    for a, e in zip(got, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


# ============================================================================= errors, flops
def _compile_error(op, order, inputs, attrs, outputs, opset, match):
    names = [n if n in inputs else "" for n in order]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, list(outputs), **attrs)
    g_in = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    dt = helper.np_dtype_to_tensor_dtype(inputs[order[0]].dtype)
    ranks = {"Y": inputs[order[0]].ndim, "output": 3, "present_state": 4 if op == "LinearAttention" else 3}
    g_out = [helper.make_tensor_value_info(o, dt, [None] * ranks[o]) for o in outputs]
    m = helper.make_model(helper.make_graph([node], "g", g_in, g_out), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    with pytest.raises(UnsupportedModelError, match=match):
        tensorfuse.compile(m, target="llvm")


@pytest.mark.parametrize("inputs,attrs,match", [
    (dict(X=rand(1, 2, 12), cos_cache=rand(1, 2, 3), sin_cache=rand(1, 2, 3)), {}, "num_heads"),
    (dict(X=rand(1, 2, 2, 8), cos_cache=rand(1, 2, 3), sin_cache=rand(1, 2, 3)), {}, "caches must be"),
    (dict(X=rand(1, 2, 2, 8), cos_cache=rand(1, 2, 4), sin_cache=rand(1, 2, 4)), {"rotary_embedding_dim": 5}, "even"),
])
def test_rotary_errors(inputs, attrs, match):
    _compile_error("RotaryEmbedding", ROPE_IN, inputs, attrs, ("Y",), 23, match)


@pytest.mark.parametrize("rule,drop,extra,match", [
    ("gated", "decay", {}, "requires the decay"),
    ("linear", None, {"beta": rand(2, 3, 2)}, "takes no beta"),
    ("bogus", None, {}, "update_rule"),
])
def test_linear_attention_errors(rule, drop, extra, match):
    inputs = lin_inputs("gated" if rule != "linear" else "linear")
    inputs.pop(drop, None)
    inputs.update(extra)
    _compile_error("LinearAttention", LIN_IN, inputs, {"update_rule": rule, "q_num_heads": 4, "kv_num_heads": 2},
                   ("output", "present_state"), 27, match)


def test_linear_attention_head_count_error():
    inputs = lin_inputs("linear", hq=3, hkv=2)
    _compile_error("LinearAttention", LIN_IN, inputs, {"update_rule": "linear", "q_num_heads": 3, "kv_num_heads": 2},
                   ("output", "present_state"), 27, "multiple of kv_num_heads")


@pytest.mark.parametrize("inputs,attrs,match", [
    (dict(input=rand(2, 3, 5), weight=rand(3, 2, 4)), {}, "weight must be"),
    (dict(input=rand(2, 3, 5), weight=rand(3, 1, 4), bias=rand(3), past_state=rand(2, 3, 2)), {}, "past_state must be"),
    (dict(input=rand(2, 3, 5), weight=rand(3, 1, 4)), {"activation": "relu"}, "activation"),
])
def test_causal_conv_errors(inputs, attrs, match):
    _compile_error("CausalConvWithState", CONV_IN, inputs, attrs, ("output", "present_state"), 27, match)


def test_flops():
    g = Graph()
    x = g.add_input("x", TensorType.of(rand(2, 3, 7)))
    w = g.add_input("w", TensorType.of(rand(3, 1, 4)))
    y, _ = Builder(g).op("CausalConvWithState", x, w, num_outputs=2)
    assert get_op("CausalConvWithState").flops(y.producer) == 2 * 3 * 7 * 8
