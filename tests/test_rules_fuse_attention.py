"""Attention rule (compiler/rules/fuse_attention.py): fires on the exported forms of scaled
dot-product attention, refuses where it must (explain's reason), keeps the outputs
(onnxruntime, optimisations off)."""
import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-5
ATT = "tensorfuse::Attention"
B, H, S, D = 2, 3, 5, 8


def _attention(scale_on="scores", scale_op="Mul", mask_shape=(B, 1, 1, S), k_layout="bhsd", softmax_axis=-1,
               extra_out=(), scale=1 / np.sqrt(D), sk=S):
    """q [B,H,S,D]; k as [B,H,Sk,D] transposed (k_layout "bhsd") or as [B,Sk,H,D] transposed with
    perm [0,2,3,1] (the BERT export); v [B,H,Sk,D]."""
    q, v = rand(B, H, S, D), rand(B, H, sk, D, seed=2)
    k = rand(B, H, sk, D, seed=1) if k_layout == "bhsd" else rand(B, sk, H, D, seed=1)
    feeds = {"q": q, "k": k, "v": v}
    c = np.array(scale if scale_op == "Mul" else 1 / scale, np.float32)
    inits = {"c": c}
    perm = [0, 1, 3, 2] if k_layout == "bhsd" else [0, 2, 3, 1]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm)]
    qn, ktn = "q", "kt"
    if scale_on == "q":
        nodes.append(helper.make_node(scale_op, ["q", "c"], ["qs"]))
        qn = "qs"
    if scale_on == "k":
        nodes.append(helper.make_node(scale_op, ["kt", "c"], ["kts"]))
        ktn = "kts"
    nodes.append(helper.make_node("MatMul", [qn, ktn], ["s"]))
    sn = "s"
    if scale_on == "scores":
        nodes.append(helper.make_node(scale_op, ["s", "c"], ["ss"]))
        sn = "ss"
    if mask_shape is not None:
        feeds["mask"] = rand(*mask_shape, seed=3, low=-5, high=0)
        nodes.append(helper.make_node("Add", [sn, "mask"], ["sm"]))
        sn = "sm"
    nodes += [helper.make_node("Softmax", [sn], ["p"], axis=softmax_axis),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    return graph_model(nodes, feeds, ["y", *extra_out], inits), feeds


@pytest.mark.parametrize("kw", [
    {},
    {"scale_op": "Div"},
    {"scale_on": "q"},
    {"scale_on": "k", "scale_op": "Div"},
    {"scale_on": None},
    {"mask_shape": None},
    {"mask_shape": (S, S)},
    {"mask_shape": (B, H, S, S)},
    {"mask_shape": (1, S)},
    {"k_layout": "bshd"},
    {"sk": 7, "mask_shape": (B, 1, 1, 7)},
    {"softmax_axis": 3},
])
def test_attention_fuses(kw):
    m, feeds = _attention(**kw)
    g = optimized(m)
    # the Transpose of K cancels against the one the fused op needs (or composes with it)
    expected = {ATT: 1} if kw.get("k_layout", "bhsd") == "bhsd" else {ATT: 1, "Transpose": 1}
    assert g.op_histogram() == expected, g.op_histogram()
    att = [n for n in g.nodes if n.qualified_op == ATT][0]
    want = 1.0 if kw.get("scale_on", "scores") is None else 1 / np.sqrt(D)
    assert abs(att.attr("scale") - want) < 1e-6
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_attention_not_fused_with_softmax_on_another_axis():
    m, feeds = _attention(softmax_axis=2)
    g = optimized(m)
    assert count(g, ATT) == 0 and count(g, "Softmax") == 1
    assert "Softmax on axis 2, not the last axis" in why_not(m, "FuseAttention")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_attention_not_fused_when_probabilities_are_an_output():
    m, feeds = _attention(extra_out=("p",))
    g = optimized(m)
    assert count(g, ATT) == 0
    assert "output 'p' is a graph output" in why_not(m, "FuseAttention")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_attention_not_fused_when_scores_are_read_elsewhere():
    q, k, v = rand(S, D), rand(S, D, seed=1), rand(S, D, seed=2)
    m = graph_model([helper.make_node("Transpose", ["k"], ["kt"]), helper.make_node("MatMul", ["q", "kt"], ["s"]),
                     helper.make_node("Softmax", ["s"], ["p"]), helper.make_node("MatMul", ["p", "v"], ["y"]),
                     helper.make_node("ReduceMax", ["s"], ["r"])], {"q": q, "k": k, "v": v}, ["y", "r"])
    assert count(optimized(m), ATT) == 0
    assert "output 's' has another consumer: ReduceMax" in why_not(m, "FuseAttention")
    assert_matches_ort(m, {"q": q, "k": k, "v": v}, rtol=RT, atol=AT, opt_levels=(2,))


def test_attention_not_fused_with_a_per_key_scale():
    m, feeds = _attention()
    # replace the scalar scale by a per-key vector: that is no attention scale
    for init in m.graph.initializer:
        if init.name == "c":
            from onnx import numpy_helper
            init.CopyFrom(numpy_helper.from_array(rand(S, seed=9), "c"))
    g = optimized(m)
    assert count(g, ATT) == 0
    assert "input 1 ('c') fails a scale (one value repeated)" in why_not(m, "FuseAttention")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_attention_not_fused_on_vectors():
    q, k, v = rand(D), rand(S, D, seed=1), rand(S, 4, seed=2)
    m = graph_model([helper.make_node("Transpose", ["k"], ["kt"]), helper.make_node("MatMul", ["q", "kt"], ["s"]),
                     helper.make_node("Softmax", ["s"], ["p"]), helper.make_node("MatMul", ["p", "v"], ["y"])],
                    {"q": q, "k": k, "v": v}, ["y"])
    assert count(optimized(m), ATT) == 0
    assert "has rank 1" in why_not(m, "FuseAttention")
    assert_matches_ort(m, {"q": q, "k": k, "v": v}, rtol=RT, atol=AT, opt_levels=(2,))


def _where_attention(s=S, d=D, cond=None, fill=np.finfo(np.float32).min, cond_input=False, fill_shape=()):
    """GPT-2's eager causal form: MatMul(q, kT) -> Div(sqrt(d)) -> Where(cond, scores, fill) ->
    Softmax -> MatMul(., v); cond a constant lower-triangular [1, 1, s, s] bool (or a graph
    input when ``cond_input``)."""
    q, k, v = rand(B, H, s, d), rand(B, H, s, d, seed=1), rand(B, H, s, d, seed=2)
    feeds = {"q": q, "k": k, "v": v}
    if cond is None:
        cond = np.tril(np.ones((s, s), bool))[None, None]
    inits = {"c": np.array(np.sqrt(d), np.float32), "fill": np.full(fill_shape, fill, np.float32)}
    if cond_input:
        feeds["cond"] = cond
    else:
        inits["cond"] = cond
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "c"], ["ss"]),
             helper.make_node("Where", ["cond", "ss", "fill"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    return graph_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("kw", [
    {},                                           # scalar kernel (d = 8), finfo.min fill
    {"fill": -np.inf},
    {"fill": -10000.0},
    {"s": 21, "d": 32},                           # the vector rows (value columns in whole vectors), a partial key vector
    {"s": 21, "d": 32, "cond_input": True, "cond": rand(B, 1, 21, 21, dtype=np.bool_, seed=4)},
    {"cond_input": True, "cond": rand(B, H, S, S, dtype=np.bool_, seed=5)},
])
def test_attention_fuses_where_mask(kw):
    m, feeds = _where_attention(**kw)
    g = optimized(m)
    assert g.op_histogram() == {ATT: 1}, g.op_histogram()
    att = [n for n in g.nodes if n.qualified_op == ATT][0]
    assert att.attr("mask_fill") == pytest.approx(float(kw.get("fill", np.finfo(np.float32).min)))
    assert abs(att.attr("scale") - 1 / np.sqrt(kw.get("d", D))) < 1e-6
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(0, 2))


def test_attention_where_mask_fully_masked_row_is_uniform():
    # a row whose keys are all masked: Where gives fill everywhere, the softmax is uniform (an
    # additive mask would not give this); the fused op must keep Where's meaning
    cond = np.tril(np.ones((S, S), bool))[None, None].copy()
    cond[..., 2, :] = False
    m, feeds = _where_attention(cond=cond, fill=-1e4)
    assert count(optimized(m), ATT) == 1
    y = assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))[0]
    # every key weighs 1/S: row 2 is the mean of V's rows (numpy, independent of both engines)
    np.testing.assert_allclose(y[:, :, 2, :], feeds["v"].mean(axis=-2), rtol=1e-5, atol=1e-5)


def test_attention_not_fused_with_a_tensor_fill():
    m, feeds = _where_attention(fill_shape=(S,))
    assert count(optimized(m), ATT) == 0
    assert "fails a scalar fill value" in why_not(m, "FuseAttention")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))
