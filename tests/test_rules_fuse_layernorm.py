"""LayerNorm-family rules (compiler/rules/fuse_layernorm.py): LayerNormFromParts, EmbedLayerNorm
and SkipLayerNorm fire, refuse where they must (explain's reason), and keep the outputs
(onnxruntime, optimisations off)."""
import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-5
SKIP = "tensorfuse::SkipLayerNormalization"
EMBED = "tensorfuse::EmbedLayerNormalization"


# ----------------------------------------------------------------------------- decomposed
def _decomposed(axes=(-1,), axes2=None, opset=18, square="pow", divide="div", gamma=(8,), beta=(8,), eps=1e-5,
                two_subs=False, x_shape=(2, 3, 8), extra_out=()):
    """x -> ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta (as torch exports it)."""
    axes2 = axes if axes2 is None else axes2
    inits = {"two": np.float32(2.0), "eps": np.float32(eps)}

    def rmean(src, dst, ax, key):
        if opset >= 18:
            inits[key] = np.array(ax, np.int64)
            return helper.make_node("ReduceMean", [src, key], [dst])
        return helper.make_node("ReduceMean", [src], [dst], axes=list(ax))

    nodes = [rmean("x", "mean", axes, "ax1"), helper.make_node("Sub", ["x", "mean"], ["d"])]
    d2 = "d"
    if two_subs:
        nodes.append(helper.make_node("Sub", ["x", "mean"], ["d_b"]))
        d2 = "d_b"
    nodes.append(helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else
                 helper.make_node("Mul", ["d", "d"], ["sq"]))
    nodes += [rmean("sq", "var", axes2, "ax2"), helper.make_node("Add", ["var", "eps"], ["ve"]),
              helper.make_node("Sqrt", ["ve"], ["std"])]
    if divide == "div":
        nodes.append(helper.make_node("Div", [d2, "std"], ["n"]))
    else:
        nodes += [helper.make_node("Reciprocal", ["std"], ["rstd"]), helper.make_node("Mul", [d2, "rstd"], ["n"])]
    out = "n"
    if gamma is not None:
        inits["gamma"] = rand(*gamma, seed=1)
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["ng"]))
        out = "ng"
    if beta is not None:
        inits["beta"] = rand(*beta, seed=2)
        nodes.append(helper.make_node("Add", [out, "beta"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [out], ["y"]))
    x = rand(*x_shape)
    return graph_model(nodes, {"x": x}, ["y", *extra_out], inits, opset=opset), {"x": x}


@pytest.mark.parametrize("kw", [{}, {"opset": 17}, {"square": "mul"}, {"divide": "reciprocal"}, {"two_subs": True},
                                {"beta": None}, {"axes": (-2, -1), "gamma": (3, 8), "beta": (1, 8)},
                                {"axes": (1, 2), "gamma": (3, 1), "beta": None}, {"eps": 1e-12}])
def test_layernorm_recognised(kw):
    m, feeds = _decomposed(**kw)
    g = optimized(m)
    assert g.op_histogram() == {"LayerNormalization": 1}, g.op_histogram()
    ln = g.nodes[0]
    rank, axes = 3, kw.get("axes", (-1,))
    assert ln.attr("axis") % rank == min(a % rank for a in axes)
    assert abs(ln.attr("epsilon") - np.float32(kw.get("eps", 1e-5))) <= 1e-6 * kw.get("eps", 1e-5)
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


@pytest.mark.parametrize("kw,reason", [
    ({"axes": (-1,), "axes2": (-2,)}, "reduces axes [2] but"),
    ({"axes": (1,), "gamma": (1, 3, 1), "beta": None}, "are not the trailing axes of rank 3"),
    ({"gamma": (4, 1, 1, 8)}, "differs from x's type"),
    ({"extra_out": ("d",)}, "output 'd' is a graph output"),
])
def test_layernorm_not_recognised(kw, reason):
    m, feeds = _decomposed(**kw)
    g = optimized(m)
    assert count(g, "LayerNormalization") == 0 and count(g, "ReduceMean") == 2
    assert reason in why_not(m, "LayerNormFromParts")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_layernorm_not_recognised_for_f16():
    m, feeds = _decomposed(x_shape=(2, 8))
    m.graph.input[0].type.tensor_type.elem_type = 10       # float16 input, then Cast to float32 is absent
    for init in m.graph.initializer:
        if init.data_type == 1:
            from onnx import numpy_helper
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    del m.graph.value_info[:]
    m.graph.output[0].type.tensor_type.elem_type = 10
    feeds = {"x": feeds["x"].astype(np.float16)}
    assert "only float32 is rewritten" in why_not(m, "LayerNormFromParts")


# ----------------------------------------------------------------------------- skip
def _skip(extra_out=(), with_mean=False, stash=None, b=True):
    x, r = rand(2, 4, 8), rand(2, 4, 8, seed=1)
    inits = {"g": rand(8, seed=2)}
    ln_in = ["s", "g"]
    if b:
        inits["b"] = rand(8, seed=3)
        ln_in.append("b")
    attrs = {"epsilon": 1e-6}
    if stash is not None:
        attrs["stash_type"] = stash
    outs = ["y", "mean"] if with_mean else ["y"]
    m = graph_model([helper.make_node("Add", ["x", "r"], ["s"]), helper.make_node("LayerNormalization", ln_in, outs, **attrs)],
                    {"x": x, "r": r}, outs + list(extra_out), inits)
    return m, {"x": x, "r": r}


@pytest.mark.parametrize("b", [True, False])
def test_skip_layernorm_fuses(b):
    m, feeds = _skip(b=b)
    g = optimized(m)
    assert g.op_histogram() == {SKIP: 1} and len(g.nodes[0].outputs) == 1
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_skip_layernorm_also_returns_a_sum_that_is_read_elsewhere():
    m, feeds = _skip(extra_out=("s",))
    g = optimized(m)
    assert g.op_histogram() == {SKIP: 1} and len(g.nodes[0].outputs) == 2
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_skip_layernorm_not_fused_when_layernorm_returns_its_mean():
    m, feeds = _skip(with_mean=True)
    g = optimized(m)
    assert count(g, "LayerNormalization") == 1 and count(g, SKIP) == 0
    assert "also returns Mean/InvStdDev" in why_not(m, "SkipLayerNorm")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_skip_layernorm_needs_an_add():
    x = rand(2, 8)
    m = graph_model([helper.make_node("Mul", ["x", "x"], ["s"]), helper.make_node("LayerNormalization", ["s", "g"], ["y"])],
                    {"x": x}, ["y"], {"g": rand(8, seed=1)})
    assert "input 0 is produced by Mul" in why_not(m, "SkipLayerNorm")
    assert count(optimized(m), "LayerNormalization") == 1


def _sum_read_before_layernorm(decomposed: bool):
    """s = Add(x, c) read first by a ReduceSum that is a second graph output, then by a
    LayerNormalization (the op, or its decomposition): issue 9, defect 1."""
    x = rand(4, 8)
    inits = {"c": rand(4, 8, seed=1), "g": rand(8, seed=2), "b": rand(8, seed=3)}
    nodes = [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("ReduceSum", ["s"], ["r"], keepdims=1)]
    if decomposed:
        inits.update(ax=np.array([-1], np.int64), two=np.float32(2.0), eps=np.float32(1e-5))
        nodes += [helper.make_node("ReduceMean", ["s", "ax"], ["mean"]), helper.make_node("Sub", ["s", "mean"], ["d"]),
                  helper.make_node("Pow", ["d", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq", "ax"], ["var"]),
                  helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"]),
                  helper.make_node("Div", ["d", "std"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
                  helper.make_node("Add", ["ng", "b"], ["y"])]
    else:
        nodes.append(helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], epsilon=1e-5))
    return graph_model(nodes, {"x": x}, ["y", "r"], inits, opset=18), {"x": x}


@pytest.mark.parametrize("decomposed", [False, True], ids=["op", "decomposed"])
def test_skip_layernorm_placed_before_an_earlier_reader_of_its_sum(decomposed):
    m, feeds = _sum_read_before_layernorm(decomposed)
    g = optimized(m, verify=True)      # the verifier checks that the order stays topological
    skip = [n for n in g.nodes if n.qualified_op == SKIP]
    assert len(skip) == 1 and len(skip[0].outputs) == 2, g.op_histogram()
    order = [n.qualified_op for n in g.nodes]
    assert order.index(SKIP) < order.index("ReduceSum"), order
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(0, 2, 3))


# ----------------------------------------------------------------------------- embedding
def _embed(n_gather=2, pos="const", gather_axis=0, extra_out=(), with_mean=False):
    ids = rand(2, 10, dtype=np.int64, low=0, high=49)
    tts = rand(2, 10, dtype=np.int64, low=0, high=1, seed=1)
    inits = {"word": rand(50, 16, seed=2), "tt": rand(2, 16, seed=3), "g": rand(16, seed=4), "b": rand(16, seed=5)}
    feeds = {"ids": ids}
    nodes = [helper.make_node("Gather", ["word", "ids"], ["e0"], axis=gather_axis)]
    terms = ["e0"]
    if n_gather > 1:
        feeds["tts"] = tts
        nodes.append(helper.make_node("Gather", ["tt", "tts"], ["e1"]))
        terms.append("e1")
    if pos == "const":
        inits["pos"] = rand(1, 10, 16, seed=6)
        terms.append("pos")
    elif pos == "gather":            # position ids as a constant Gather (folded to a constant at O1)
        inits["ptab"] = rand(12, 16, seed=6)
        inits["pids"] = np.arange(10, dtype=np.int64).reshape(1, 10)
        nodes.append(helper.make_node("Gather", ["ptab", "pids"], ["e2"]))
        terms.append("e2")
    s = terms[0]
    for i, t in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [s, t], [f"s{i}"]))
        s = f"s{i}"
    outs = ["y", "mean"] if with_mean else ["y"]
    nodes.append(helper.make_node("LayerNormalization", [s, "g", "b"], outs, epsilon=1e-12))
    return graph_model(nodes, feeds, outs + list(extra_out), inits), feeds


@pytest.mark.parametrize("n_gather,pos", [(2, "const"), (2, "gather"), (1, "const"), (2, None)])
def test_embed_layernorm_fuses(n_gather, pos):
    m, feeds = _embed(n_gather, pos)
    g = optimized(m)
    assert g.op_histogram() == {EMBED: 1}
    assert g.nodes[0].attr("num_gathers") == n_gather
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_embed_layernorm_returns_the_sum_when_it_is_an_output():
    m, feeds = _embed(2, "const", extra_out=("s1",))
    g = optimized(m)
    assert g.op_histogram() == {EMBED: 1} and len(g.nodes[0].outputs) == 2
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_embed_layernorm_not_fused_without_an_axis0_gather():
    ids = rand(2, 10, dtype=np.int64, low=0, high=15)
    x = rand(16, 2, 10, seed=1)
    m = graph_model([helper.make_node("Gather", ["t", "ids"], ["e"], axis=1), helper.make_node("Add", ["e", "x"], ["s"]),
                     helper.make_node("LayerNormalization", ["s", "g"], ["y"])], {"ids": ids, "x": x}, ["y"],
                    {"t": rand(16, 20, seed=2), "g": rand(10, seed=3)})
    g = optimized(m)
    assert count(g, EMBED) == 0 and count(g, SKIP) == 1          # a plain skip LayerNorm instead
    assert "no term of the sum is a Gather on axis 0" in why_not(m, "EmbedLayerNorm")
    assert_matches_ort(m, {"ids": ids, "x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_embed_layernorm_not_fused_when_a_gather_is_read_elsewhere():
    m, feeds = _embed(2, "const", extra_out=("e1",))
    g = optimized(m)
    # the shared Gather stays; its output joins the fused op as a dense addend
    assert g.op_histogram() == {"Gather": 1, EMBED: 1}
    assert g.nodes[-1].attr("num_gathers") == 1
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_embed_layernorm_not_fused_when_layernorm_returns_its_mean():
    m, feeds = _embed(2, "const", with_mean=True)
    g = optimized(m)
    assert count(g, EMBED) == 0 and count(g, "LayerNormalization") == 1
    assert "also returns Mean/InvStdDev" in why_not(m, "EmbedLayerNorm")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))
