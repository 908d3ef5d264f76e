"""The tensorfuse-domain fused ops (ir/ops/fused.py): each against onnxruntime running the
composition of unfused ONNX ops it stands for, both its kernel and its numpy reference."""
import math

import numpy as np
import pytest
from onnx import helper

from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, run_reference
from tensorfuse.ir.types import DType, TensorType
from tests.fusion_util import compile_graph, graph_model, ir_inputs
from tests.oracle import ort_run, rand

F = "tensorfuse"


def _check(g, out_vals, feeds, expected, rtol, atol):
    g.outputs = list(out_vals)
    mod = compile_graph(g)
    got = mod.run(**feeds)
    for i, (a, e) in enumerate(zip(got, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, (i, a.dtype, a.shape, e.dtype, e.shape)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"kernel output {i}")
    # the numpy reference means the same
    for v, e in zip(out_vals, expected):
        n = v.producer
        ins = [None if x is None else (feeds[x.name] if x.name in feeds else x.data) for x in n.inputs]
        ref = run_reference(n, ins)[n.outputs.index(v)]
        assert ref.dtype == e.dtype and ref.shape == e.shape
        np.testing.assert_allclose(ref, e, rtol=rtol, atol=atol, err_msg="numpy reference")


# ----------------------------------------------------------------------------- Attention
def _attention_onnx(q, k, v, mask, scale):
    feeds = {"q": q, "k": k, "v": v}
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=list(range(k.ndim - 2)) + [k.ndim - 1, k.ndim - 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"])]
    inits = {"scale": np.array(scale, q.dtype)}
    last = "ss"
    if mask is not None:
        feeds["mask"] = mask
        nodes.append(helper.make_node("Add", ["ss", "mask"], ["sm"]))
        last = "sm"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    return graph_model(nodes, feeds, ["y"], inits), feeds


ATT_CASES = [
    # q, k, v, mask shapes
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), None),
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), (7,)),
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), (2, 1, 1, 7)),
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), (2, 3, 5, 7)),
    ((2, 3, 5, 8), (3, 7, 8), (1, 3, 7, 4), (5, 7)),        # batch dims broadcast
    ((5, 8), (7, 8), (7, 6), (2, 5, 1)),                      # mask adds a batch dim
    ((1, 1, 16), (1, 9, 16), (1, 9, 16), ()),                 # one query, scalar mask
    ((1, 3, 64), (1, 300, 64), (1, 300, 8), (300,)),          # K^T beyond the local buffer: dot products
    # value columns in whole vectors (8 and 16 lanes), keys not: the vector rows pad the keys
    # (ViT's 197 tokens), the padding lanes must not take part in the softmax
    ((1, 2, 37, 32), (1, 2, 37, 32), (1, 2, 37, 32), None),
    ((1, 2, 37, 32), (1, 2, 37, 32), (1, 2, 37, 32), (1, 2, 37, 37)),
    ((2, 3, 5, 16), (2, 3, 20, 16), (2, 3, 20, 32), (2, 1, 1, 20)),
    # K^T [d, keys] beyond the local buffer with value columns in whole vectors: K^T of every
    # batch entry goes to a scratch buffer first (Whisper's 1500 frames); keys padded, K's batch
    # broadcast against Q's, a per-batch mask and one of scores' shape
    ((2, 2, 6, 64), (2, 2, 300, 64), (2, 2, 300, 16), (2, 1, 1, 300)),
    ((2, 3, 5, 64), (3, 270, 64), (1, 3, 270, 32), (5, 270)),
]


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f"])
def test_attention_long_keys_use_the_scratch_k_transpose(target):
    """Keys x head size past ``ATTENTION_KT_LOCAL``: a ``_kt`` kernel writes K^T into a scratch
    buffer and the attention kernel runs the vector rows on it (not one scalar dot product per
    key); onnxruntime's numbers on 16- and 8-lane vectors."""
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.ir.ops.fused import ATTENTION_KT_LOCAL
    from tensorfuse.ir.target import Target
    sk = ATTENTION_KT_LOCAL // 64 + 7
    q, k, v = rand(1, 2, 9, 64), rand(1, 2, sk, 64, seed=1), rand(1, 2, sk, 32, seed=2)
    mask = rand(1, 1, 9, sk, seed=3, low=-3, high=0)
    model, feeds = _attention_onnx(q, k, v, mask, 0.125)
    exp = ort_run(model, feeds)[0]
    g = Graph()
    y = Builder(g).op("Attention", *ir_inputs(g, feeds), domain=F, scale=0.125)
    g.outputs = [y]
    low = lower_graph(g, Target.parse(target), tuning=None)
    names = [kn.name for kn in low.kernels]
    assert len(names) == 2 and names[0].endswith("_kt"), names
    assert "attention_rows" in next(iter(low.workloads.values())).knobs
    got = build_module(low, g, list(feeds), [y.name], target).run(**feeds)[0]
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sq,sk,sv,sm", ATT_CASES)
def test_attention_matches_composition(sq, sk, sv, sm):
    q, k, v = rand(*sq), rand(*sk, seed=1), rand(*sv, seed=2)
    mask = None if sm is None else rand(*sm, seed=3, low=-3, high=0)
    scale = 1 / math.sqrt(sq[-1])
    model, feeds = _attention_onnx(q, k, v, mask, scale)
    exp = ort_run(model, feeds)
    g = Graph()
    ins = ir_inputs(g, feeds)
    y = Builder(g).op("Attention", *ins, domain=F, scale=scale)
    _check(g, [y], feeds, exp, 1e-5, 1e-5)


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f"])
def test_attention_rows_knob_every_candidate_matches(target):
    """The vector attention rows at every ``attention_rows`` candidate (query rows computed
    together; 11 rows leave a remainder for each) on 16- and 8-lane vectors, keys padded (13
    keys), a mask per row: onnxruntime's numbers."""
    from tensorfuse.ir.ops.fused import ATTENTION_ROWS
    q, k, v = rand(1, 2, 11, 16), rand(1, 2, 13, 16, seed=1), rand(1, 2, 13, 32, seed=2)
    mask = rand(1, 2, 11, 13, seed=3, low=-3, high=0)
    model, feeds = _attention_onnx(q, k, v, mask, 0.25)
    exp = ort_run(model, feeds)[0]
    for rows in [r for r in ATTENTION_ROWS if r <= 11]:     # candidates: at most the 11 rows
        got = _attention_with_knob(feeds, 0.25, target, "attention_rows", rows)
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5, err_msg=f"attention_rows={rows}")


def _attention_with_knob(feeds, scale: float, target: str, name: str, value):
    """The Attention op on ``feeds`` compiled for ``target`` with knob ``name`` fixed to
    ``value`` (checked on the workload), run once: its output."""
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.ir.target import Target
    from tests.knob_util import Fixed
    g = Graph()
    y = Builder(g).op("Attention", *ir_inputs(g, feeds), domain=F, scale=scale)
    g.outputs = [y]
    low = lower_graph(g, Target.parse(target), tuning=Fixed({name: value}))
    (wl,) = low.workloads.values()
    assert wl.knobs[name] == value
    return build_module(low, g, list(feeds), [y.name], target).run(**feeds)[0]


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f"])
@pytest.mark.parametrize("sq,sk,sv", [((2, 3, 9, 32), (3, 37, 32), (1, 3, 37, 16)),     # K's batch broadcast, 37 keys
                                      ((1, 2, 4, 16), (1, 2, 3, 16), (1, 2, 3, 16))])     # fewer keys than a vector
def test_attention_kt_knob_both_forms_match(target, sq, sk, sv):
    """K^T copied as register-transposed L x L tiles into key blocks (``attention_kt`` blocked,
    the default where the head size is a whole number of vectors) or element by element into
    [d, keys] (``columns``): both equal onnxruntime's numbers, with a last partial key block
    (37 = 2 x 16 + 5, or 3 keys) whose missing rows are zeros, on 16- and 8-lane vectors."""
    q, k, v = rand(*sq), rand(*sk, seed=1), rand(*sv, seed=2)
    mask = rand(sq[-2], sk[-2], seed=3, low=-3, high=0)
    model, feeds = _attention_onnx(q, k, v, mask, 0.2)
    exp = ort_run(model, feeds)[0]
    for form in ("blocked", "columns"):
        got = _attention_with_knob(feeds, 0.2, target, "attention_kt", form)
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5, err_msg=form)


def test_attention_large_negative_mask_and_f64():
    q, k, v = rand(1, 2, 4, 8, dtype=np.float64), rand(1, 2, 6, 8, seed=1, dtype=np.float64), \
        rand(1, 2, 6, 8, seed=2, dtype=np.float64)
    mask = np.zeros((1, 1, 1, 6))
    mask[..., 3:] = np.finfo(np.float64).min       # padded keys, as BERT exports do
    model, feeds = _attention_onnx(q, k, v, mask, 0.125)
    exp = ort_run(model, feeds)
    g = Graph()
    y = Builder(g).op("Attention", *ir_inputs(g, feeds), domain=F, scale=0.125)
    _check(g, [y], feeds, exp, 1e-12, 1e-12)


def test_attention_f16():
    q, k, v = (rand(2, 4, 8, dtype=np.float16, seed=s) for s in range(3))
    model, feeds = _attention_onnx(q, k, v, None, 0.3)
    exp = ort_run(model, feeds)
    g = Graph()
    y = Builder(g).op("Attention", *ir_inputs(g, feeds), domain=F, scale=0.3)
    _check(g, [y], feeds, exp, 5e-3, 5e-3)


@pytest.mark.parametrize("sq,sk,sv,sm,msg", [
    ((2, 4, 8), (2, 5, 7), (2, 5, 3), None, "last dim"),
    ((2, 4, 8), (2, 5, 8), (2, 6, 3), None, "keys"),
    ((2, 4, 8), (2, 5, 8), (2, 5, 3), (3, 5), "mask"),
    ((8,), (5, 8), (5, 3), None, "rank"),
    ((3, 4, 8), (2, 5, 8), (2, 5, 3), None, "broadcast"),
])
def test_attention_shape_errors(sq, sk, sv, sm, msg):
    g = Graph()
    ins = [g.add_input(n, TensorType(DType.f32, s)) for n, s in zip("qkv", (sq, sk, sv))]
    if sm is not None:
        ins.append(g.add_input("m", TensorType(DType.f32, sm)))
    with pytest.raises(ShapeError, match=msg):
        Builder(g).op("Attention", *ins, domain=F, scale=1.0)


def test_attention_needs_scale_and_one_dtype():
    g = Graph()
    q = g.add_input("q", TensorType(DType.f32, (4, 8)))
    k = g.add_input("k", TensorType(DType.f16, (4, 8)))
    with pytest.raises(ShapeError, match="scale"):
        Builder(g).op("Attention", q, q, q, domain=F)
    with pytest.raises(ShapeError, match="dtype"):
        Builder(g).op("Attention", q, k, q, domain=F, scale=1.0)


# ----------------------------------------------------------------------------- SkipLayerNorm
def _skip_ln_onnx(x, skip, bias, scale, beta, axis, eps, with_sum):
    feeds = {"x": x, "skip": skip}
    nodes = [helper.make_node("Add", ["x", "skip"], ["s0"])]
    inits = {"scale": scale}
    s = "s0"
    if bias is not None:
        inits["bias"] = bias
        nodes.append(helper.make_node("Add", ["s0", "bias"], ["s1"]))
        s = "s1"
    ln_in = [s, "scale"]
    if beta is not None:
        inits["beta"] = beta
        ln_in.append("beta")
    nodes.append(helper.make_node("LayerNormalization", ln_in, ["y"], axis=axis, epsilon=eps))
    outs = ["y"]
    if with_sum:
        nodes.append(helper.make_node("Identity", [s], ["sum"]))
        outs.append("sum")
    return graph_model(nodes, feeds, outs, inits), feeds, inits


SKIP_CASES = [
    # x, skip, bias, scale, beta, axis
    ((2, 3, 8), (2, 3, 8), None, (8,), (8,), -1),
    ((2, 3, 8), (2, 3, 8), (8,), (8,), (8,), -1),
    ((2, 3, 8), (3, 8), (8,), (8,), None, -1),          # skip broadcasts, no LayerNorm bias
    ((2, 3, 8), (2, 3, 8), None, (3, 8), (1, 8), 1),    # normalise over two axes
    ((4, 6), (1, 6), None, (4, 1), None, -1),           # scale broadcasts to X (unidirectional)
    ((2, 3, 8), (2, 3, 8), None, (8,), (8,), 0),        # whole tensor
    # rows of at least two vectors (llvm's layernorm_rows_partial_sums), with a row tail
    ((2, 5, 100), (5, 100), (100,), (100,), (100,), -1),
    ((3, 4, 20), (3, 4, 20), None, (4, 20), (1, 20), 1),  # two normalised axes, 80 elements
    ((1, 7, 768), (1, 7, 768), (768,), (768,), (768,), -1),
]


@pytest.mark.parametrize("with_sum", [False, True])
@pytest.mark.parametrize("sx,ss,sb,sg,sbeta,axis", SKIP_CASES)
def test_skip_layernorm_matches_composition(sx, ss, sb, sg, sbeta, axis, with_sum):
    x, skip = rand(*sx), rand(*ss, seed=1)
    bias = None if sb is None else rand(*sb, seed=2)
    scale, beta = rand(*sg, seed=3), None if sbeta is None else rand(*sbeta, seed=4)
    model, feeds, inits = _skip_ln_onnx(x, skip, bias, scale, beta, axis, 1e-5, with_sum)
    exp = ort_run(model, feeds)
    g = Graph()
    b = Builder(g)
    xi, si = ir_inputs(g, feeds)
    outs = b.op("SkipLayerNormalization", xi, si, b.const(scale), None if beta is None else b.const(beta),
                None if bias is None else b.const(bias), domain=F, axis=axis, epsilon=1e-5,
                num_outputs=2 if with_sum else 1)
    _check(g, outs if with_sum else [outs], feeds, exp, 1e-4, 1e-5)


def test_skip_layernorm_wide_rows_take_the_partial_sums_schedule():
    # the llvm schedule for rows of at least two vectors; the generic nest's one running sum
    # per statistic was latency-bound (ViT-B/16's [197, 768]: 0.26 ms against onnxruntime's 0.125)
    x, skip = rand(2, 9, 200), rand(2, 9, 200, seed=1)
    scale, beta = rand(200, seed=3), rand(200, seed=4)
    model, feeds, _ = _skip_ln_onnx(x, skip, None, scale, beta, -1, 1e-5, True)
    exp = ort_run(model, feeds)
    g = Graph()
    b = Builder(g)
    outs = b.op("SkipLayerNormalization", *ir_inputs(g, feeds), b.const(scale), b.const(beta), domain=F,
                epsilon=1e-5, num_outputs=2)
    g.outputs = list(outs)
    mod = compile_graph(g)
    assert [k.schedule for k in mod.kernels] == ["llvm.layernorm_rows_partial_sums"], [k.schedule for k in mod.kernels]
    for got, e in zip(mod.run(**feeds), exp):
        np.testing.assert_allclose(got, e, rtol=1e-4, atol=1e-5)


def test_skip_layernorm_f16_and_tiny_eps():
    x, skip = rand(2, 16, dtype=np.float16), rand(2, 16, dtype=np.float16, seed=1)
    scale, beta = rand(16, dtype=np.float16, seed=2), rand(16, dtype=np.float16, seed=3)
    model, feeds, _ = _skip_ln_onnx(x, skip, None, scale, beta, -1, 1e-12, False)
    exp = ort_run(model, feeds)
    g = Graph()
    b = Builder(g)
    y = b.op("SkipLayerNormalization", *ir_inputs(g, feeds), b.const(scale), b.const(beta), domain=F,
             epsilon=1e-12)
    _check(g, [y], feeds, exp, 5e-3, 5e-3)


def test_skip_layernorm_shape_errors():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 8)))
    bad = g.add_input("s", TensorType(DType.f32, (3, 8)))
    sc = g.add_input("g", TensorType(DType.f32, (8,)))
    with pytest.raises(ShapeError, match="broadcast"):
        Builder(g).op("SkipLayerNormalization", x, bad, sc, domain=F)
    wide = g.add_input("w", TensorType(DType.f32, (4,)))
    with pytest.raises(ShapeError, match="scale"):
        Builder(g).op("SkipLayerNormalization", x, x, wide, domain=F)
    with pytest.raises(ShapeError, match="axis"):
        Builder(g).op("SkipLayerNormalization", x, x, sc, domain=F, axis=2)


# ----------------------------------------------------------------------------- EmbedLayerNorm
def _embed_onnx(tables, ids, addends, scale, beta, eps, with_sum):
    feeds, inits, nodes = {}, {"scale": scale}, []
    terms = []
    for i, (t, d) in enumerate(zip(tables, ids)):
        inits[f"table{i}"] = t
        feeds[f"ids{i}"] = d
        nodes.append(helper.make_node("Gather", [f"table{i}", f"ids{i}"], [f"g{i}"], axis=0))
        terms.append(f"g{i}")
    for i, a in enumerate(addends):
        inits[f"add{i}"] = a
        terms.append(f"add{i}")
    s = terms[0]
    for i, t in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [s, t], [f"s{i}"]))
        s = f"s{i}"
    ln_in = [s, "scale"]
    if beta is not None:
        inits["beta"] = beta
        ln_in.append("beta")
    nodes.append(helper.make_node("LayerNormalization", ln_in, ["y"], axis=-1, epsilon=eps))
    outs = ["y"]
    if with_sum:
        nodes.append(helper.make_node("Identity", [s], ["sum"]))
        outs.append("sum")
    return graph_model(nodes, feeds, outs, inits), feeds, inits


@pytest.mark.parametrize("id_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("with_sum", [False, True])
def test_embed_layernorm_bert_form(id_dtype, with_sum):
    word, tt, pos = rand(50, 16), rand(2, 16, seed=1), rand(10, 16, seed=2)
    ids = rand(2, 10, dtype=id_dtype, low=-50, high=49, seed=3)      # negative ids count from the end
    tts = rand(2, 10, dtype=id_dtype, low=0, high=1, seed=4)
    scale, beta = rand(16, seed=5), rand(16, seed=6)
    model, feeds, inits = _embed_onnx([word, tt], [ids, tts], [pos], scale, beta, 1e-12, with_sum)
    exp = ort_run(model, feeds)
    g = Graph()
    b = Builder(g)
    i0, i1 = ir_inputs(g, feeds)
    outs = b.op("EmbedLayerNormalization", b.const(word), i0, b.const(tt), i1, b.const(scale), b.const(beta),
                b.const(pos), domain=F, num_gathers=2, epsilon=1e-12, num_outputs=2 if with_sum else 1)
    _check(g, outs if with_sum else [outs], feeds, exp, 1e-4, 1e-5)


def test_embed_layernorm_one_gather_nd_table_no_beta():
    table = rand(7, 3, 4)                          # each id selects a [3,4] block
    ids = rand(5, dtype=np.int64, low=0, high=6)
    scale = rand(3, 4, seed=1)
    g = Graph()
    b = Builder(g)
    (iv,) = ir_inputs(g, {"ids0": ids})
    y = b.op("EmbedLayerNormalization", b.const(table), iv, b.const(scale), domain=F, num_gathers=1, axis=1)
    g.outputs = [y]
    got = compile_graph(g).run(ids0=ids)[0]
    s = table[ids].astype(np.float64)
    m = s.mean(axis=(1, 2), keepdims=True)
    exp = (s - m) / np.sqrt(((s - m) ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden", [16, 64])       # 64: llvm's layernorm_rows_partial_sums
@pytest.mark.parametrize("bad", [50, -51])
def test_embed_layernorm_out_of_range_ids_raise_as_gather_does(bad, hidden):
    # issue 9, defect 8: the reference clipped such ids silently while Gather raises
    import tensorfuse
    word, pos, scale = rand(50, hidden), rand(10, hidden, seed=2), rand(hidden, seed=5)
    ids = rand(2, 10, dtype=np.int64, low=0, high=49, seed=3)
    ids[1, 3] = bad
    model, feeds, inits = _embed_onnx([word], [ids], [pos], scale, None, 1e-5, False)
    with pytest.raises(Exception, match="out of (data )?bounds|out of range|invalid"):
        ort_run(model, feeds)                   # onnxruntime refuses the unfused graph
    g = Graph()
    b = Builder(g)
    (iv,) = ir_inputs(g, feeds)
    y = b.op("EmbedLayerNormalization", b.const(word), iv, b.const(scale), None, b.const(pos), domain=F,
             num_gathers=1)
    gather = Builder(g).op("Gather", b.const(word), iv, axis=0)
    with pytest.raises(IndexError, match=f"id {bad} is out of range for a dimension of size 50"):
        run_reference(y.producer, [word, ids, scale, None, pos])
    with pytest.raises(IndexError, match=f"index {bad} is out of range"):
        run_reference(gather.producer, [word, ids])
    mod = tensorfuse.compile(model, opt_level=2, cache=False)
    assert any(n.op == "EmbedLayerNormalization" for n in mod.graph.nodes), mod.graph.op_histogram()
    with pytest.raises(ValueError, match="out of range"):
        mod.run(**feeds)


def test_embed_layernorm_errors():
    g = Graph()
    t = g.add_input("t", TensorType(DType.f32, (5, 4)))
    fid = g.add_input("f", TensorType(DType.f32, (3,)))
    sc = g.add_input("g", TensorType(DType.f32, (4,)))
    with pytest.raises(ShapeError, match="int32 or int64"):
        Builder(g).op("EmbedLayerNormalization", t, fid, sc, domain=F, num_gathers=1)
    iid = g.add_input("i", TensorType(DType.i64, (3,)))
    with pytest.raises(ShapeError, match="num_gathers"):
        Builder(g).op("EmbedLayerNormalization", t, iid, sc, domain=F, num_gathers=2)


# ----------------------------------------------------------------------------- activations
ACTS = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("Clip", [-0.5, 0.25]), ("Clip", [-1.0]),
        ("LeakyRelu", [0.1]), ("LeakyRelu", []), ("Sigmoid", []), ("HardSigmoid", [0.3, 0.4]),
        ("HardSigmoid", []), ("HardSwish", []), ("SiLU", []), ("Tanh", []), ("Gelu", []), ("GeluTanh", [])]


def _act_nodes(name, params, src, dst):
    """ONNX nodes computing the activation from ``src`` into ``dst`` (opset 20), + initializers."""
    if name == "":
        return [helper.make_node("Identity", [src], [dst])], {}
    if name == "Clip":
        lo, hi = (list(params) + [-math.inf, math.inf][len(params):])[:2]
        return [helper.make_node("Clip", [src, "clip_lo", "clip_hi"], [dst])], \
            {"clip_lo": np.array(lo, np.float32), "clip_hi": np.array(hi, np.float32)}
    if name == "SiLU":
        return [helper.make_node("Sigmoid", [src], ["sig"]), helper.make_node("Mul", [src, "sig"], [dst])], {}
    if name in ("Gelu", "GeluTanh"):
        return [helper.make_node("Gelu", [src], [dst], approximate="tanh" if name == "GeluTanh" else "none")], {}
    keys = {"LeakyRelu": ["alpha"], "HardSigmoid": ["alpha", "beta"]}.get(name, [])
    return [helper.make_node(name, [src], [dst], **dict(zip(keys, params)))], {}


CONV_CASES = [
    # x, w, attrs, bias, residual shape
    ((1, 4, 7, 7), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}, True, (1, 6, 7, 7)),
    ((2, 4, 8, 8), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, True, None),
    ((1, 3, 9), (5, 3, 2), {"dilations": [2]}, False, (5, 1)),
    ((1, 4, 5, 5), (8, 4, 1, 1), {}, False, (1, 8, 5, 5)),
]


# every activation with the first geometry, a few with the others
CONV_PARAMS = [(0, a, p) for a, p in ACTS] + [(c, a, p) for c in range(1, len(CONV_CASES))
                                              for a, p in ACTS if a in ("Relu", "Clip", "HardSwish")]


@pytest.mark.parametrize("case,act,params", CONV_PARAMS)
def test_fused_conv_matches_composition(case, act, params):
    sx, sw, attrs, with_b, sz = CONV_CASES[case]
    x, w = rand(*sx), rand(*sw, seed=1, low=-0.5, high=0.5)
    inits = {"w": w}
    conv_in = ["x", "w"]
    if with_b:
        inits["b"] = rand(sw[0], seed=2)
        conv_in.append("b")
    feeds = {"x": x}
    nodes = [helper.make_node("Conv", conv_in, ["c"], **attrs)]
    src = "c"
    if sz is not None:
        feeds["z"] = rand(*sz, seed=3)
        nodes.append(helper.make_node("Add", ["c", "z"], ["cz"]))
        src = "cz"
    an, ai = _act_nodes(act, params, src, "y")
    model = graph_model(nodes + an, feeds, ["y"], {**inits, **ai}, opset=20)
    exp = ort_run(model, feeds)
    g = Graph()
    b = Builder(g)
    ins = ir_inputs(g, feeds)
    y = b.op("FusedConv", ins[0], b.const(w), b.const(inits["b"]) if with_b else None,
             ins[1] if sz is not None else None, domain=F, activation=act, activation_params=params, **attrs)
    _check(g, [y], feeds, exp, 1e-4, 1e-5)


MATMUL_CASES = [((3, 5), (5, 7), (7,)), ((2, 3, 5), (5, 7), (1, 7)), ((2, 4, 6), (2, 6, 3), None),
                ((4,), (4, 3), (3,)), ((2, 3, 5), (5, 7), (3, 7))]


MATMUL_PARAMS = [(0, a, p) for a, p in ACTS] + [(c, a, p) for c in range(1, len(MATMUL_CASES))
                                                for a, p in ACTS if a in ("Relu", "Gelu", "GeluTanh")]


@pytest.mark.parametrize("case,act,params", MATMUL_PARAMS)
def test_fused_matmul_matches_composition(case, act, params):
    sa, sb, sbias = MATMUL_CASES[case]
    a, bm = rand(*sa), rand(*sb, seed=1)
    feeds = {"a": a}
    inits = {"bm": bm}
    nodes = [helper.make_node("MatMul", ["a", "bm"], ["m"])]
    src = "m"
    if sbias is not None:
        inits["bias"] = rand(*sbias, seed=2)
        nodes.append(helper.make_node("Add", ["m", "bias"], ["mb"]))
        src = "mb"
    an, ai = _act_nodes(act, params, src, "y")
    model = graph_model(nodes + an, feeds, ["y"], {**inits, **ai}, opset=20)
    exp = ort_run(model, feeds)
    g = Graph()
    b = Builder(g)
    (ai_,) = ir_inputs(g, feeds)
    y = b.op("FusedMatMul", ai_, b.const(bm), b.const(inits["bias"]) if sbias is not None else None,
             domain=F, activation=act, activation_params=params)
    _check(g, [y], feeds, exp, 1e-4, 1e-5)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1, "alpha": 0.5}, {"transB": 1, "beta": 2.0}])
@pytest.mark.parametrize("act,params", [("Relu", []), ("Sigmoid", []), ("Gelu", [])])
def test_fused_gemm_matches_composition(attrs, act, params):
    a = rand(5, 3) if attrs.get("transA") else rand(3, 5)
    bm = rand(4, 5, seed=1) if attrs.get("transB") else rand(5, 4, seed=1)
    c = rand(4, seed=2)
    an, ai = _act_nodes(act, params, "m", "y")
    model = graph_model([helper.make_node("Gemm", ["a", "bm", "c"], ["m"], **attrs)] + an, {"a": a}, ["y"],
                        {"bm": bm, "c": c, **ai}, opset=20)
    exp = ort_run(model, {"a": a})
    g = Graph()
    b = Builder(g)
    (av,) = ir_inputs(g, {"a": a})
    y = b.op("FusedGemm", av, b.const(bm), b.const(c), domain=F, activation=act, activation_params=params, **attrs)
    _check(g, [y], {"a": a}, exp, 1e-4, 1e-5)


def test_fused_anchor_errors():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (1, 2, 5, 5)))
    w = g.add_input("w", TensorType(DType.f32, (3, 2, 3, 3)))
    with pytest.raises(ShapeError, match="unknown activation 'Swish'"):
        Builder(g).op("FusedConv", x, w, domain=F, activation="Swish")
    with pytest.raises(ShapeError, match="LeakyRelu takes 1 parameters"):
        Builder(g).op("FusedConv", x, w, domain=F, activation="LeakyRelu", activation_params=[0.1, 0.2])
    z = g.add_input("z", TensorType(DType.f32, (1, 2, 3, 3)))
    with pytest.raises(ShapeError, match="Z of shape"):
        Builder(g).op("FusedConv", x, w, None, z, domain=F, activation="Relu")
    a = g.add_input("a", TensorType(DType.f32, (3, 4)))
    bias = g.add_input("bias", TensorType(DType.f32, (5,)))
    with pytest.raises(ShapeError, match="bias of shape"):
        Builder(g).op("FusedMatMul", a, g.add_input("b4", TensorType(DType.f32, (4, 3))), bias, domain=F)


F16_ACTS = [("Sigmoid", []), ("HardSigmoid", [0.3, 0.4]), ("HardSwish", []), ("SiLU", []), ("Tanh", []),
            ("Gelu", []), ("GeluTanh", []), ("LeakyRelu", [0.1]), ("Clip", [0.0, 6.0])]


@pytest.mark.parametrize("anchor,act,params", [("MatMul", a, p) for a, p in F16_ACTS] +
                         [(an, a, p) for an in ("Gemm", "Conv") for a, p in F16_ACTS if a in ("SiLU", "GeluTanh")],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_float16_fused_activation_is_the_unfused_ops(anchor, act, params):
    # issue 9, defect 8: the fused ops' epilogue computed float16 in float16, the registry's
    # ops (and fuse_ops epilogues) in float32 rounded once; now bit-identical to O0 (one kernel
    # per op) and to the composition of the registry's references
    import tensorfuse
    if anchor == "Conv":
        x, w = rand(1, 4, 6, 6, dtype=np.float16, low=-3, high=3), rand(6, 4, 3, 3, dtype=np.float16, seed=1)
        node = helper.make_node("Conv", ["x", "w"], ["m"], pads=[1, 1, 1, 1])
    else:
        x, w = rand(8, 16, dtype=np.float16, low=-3, high=3), rand(16, 12, dtype=np.float16, seed=1)
        node = helper.make_node(anchor, ["x", "w"], ["m"])
    an, ai = _act_nodes(act, params, "m", "y")
    ai = {k: v.astype(np.float16) for k, v in ai.items()}
    model = graph_model([node] + an, {"x": x}, ["y"], {"w": w, **ai}, opset=20)
    o0 = tensorfuse.compile(model, opt_level=0, cache=False).run(x=x)[0]
    g = Graph()
    b = Builder(g)
    (xv,) = ir_inputs(g, {"x": x})
    extra = {"pads": [1, 1, 1, 1]} if anchor == "Conv" else {}
    y = b.op(f"Fused{anchor}", xv, b.const(w), domain=F, activation=act, activation_params=params, **extra)
    g.outputs = [y]
    np.testing.assert_array_equal(compile_graph(g).run(x=x)[0], o0)
    # the reference: the anchor's reference, then the activation ops' own references
    from tensorfuse.compiler.frontend.onnx import import_onnx
    ug = import_onnx(model)
    vals = {ug.inputs[0].name: x, **{k: c.data for k, c in ug.constants.items()}}
    for n in ug.nodes:
        outs = run_reference(n, [None if v is None else vals[v.name] for v in n.inputs])
        vals.update({o.name: a for o, a in zip(n.outputs, outs)})
    want = vals[ug.outputs[0].name]
    np.testing.assert_array_equal(run_reference(y.producer, [x, w])[0], want)
