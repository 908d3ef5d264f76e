"""Conv epilogue rules (compiler/rules/fuse_conv.py): FuseConvAdd and FuseConvActivation fire,
refuse where they must (explain's reason), and keep the outputs (onnxruntime, optimisations off)."""
import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, rand

RT, AT = 1e-4, 1e-5
FC = "tensorfuse::FusedConv"


def _act(name, src, dst):
    """(nodes, initializers) applying an activation (opset 20 ops)."""
    if name == "Clip6":
        return [helper.make_node("Clip", [src, "lo", "hi"], [dst])], {"lo": np.float32(0), "hi": np.float32(6)}
    if name == "ClipMinOnly":
        return [helper.make_node("Clip", [src, "lo"], [dst])], {"lo": np.float32(-0.3)}
    if name == "ClipMaxOnly":
        return [helper.make_node("Clip", [src, "", "hi"], [dst])], {"hi": np.float32(0.7)}
    if name == "SiLU":
        return [helper.make_node("Sigmoid", [src], ["sig"]), helper.make_node("Mul", ["sig", src], [dst])], {}
    if name == "LeakyRelu":
        return [helper.make_node("LeakyRelu", [src], [dst], alpha=0.2)], {}
    if name == "HardSigmoid":
        return [helper.make_node("HardSigmoid", [src], [dst], alpha=0.3, beta=0.6)], {}
    if name == "GeluTanh":
        return [helper.make_node("Gelu", [src], [dst], approximate="tanh")], {}
    return [helper.make_node(name, [src], [dst])], {}


ACTS = ["Relu", "Clip6", "ClipMinOnly", "ClipMaxOnly", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "SiLU",
        "Tanh", "Gelu", "GeluTanh"]


def _conv_model(act=None, residual=None, extra_out=(), bias=True):
    x = rand(1, 3, 6, 6)
    inits = {"w": rand(4, 3, 3, 3, seed=1, low=-0.5, high=0.5)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rand(4, seed=2)
        ins.append("b")
    feeds = {"x": x}
    nodes = [helper.make_node("Conv", ins, ["c"], pads=[1, 1, 1, 1])]
    src = "c"
    if residual is not None:
        kind, arr = residual
        (feeds if kind == "input" else inits)["z"] = arr
        nodes.append(helper.make_node("Add", ["z", "c"], ["cz"]))
        src = "cz"
    if act is not None:
        an, ai = _act(act, src, "y")
        nodes += an
        inits.update(ai)
    else:
        nodes.append(helper.make_node("Identity", [src], ["y"]))
    return graph_model(nodes, feeds, ["y", *extra_out], inits, opset=20), feeds


# ----------------------------------------------------------------------------- activation
@pytest.mark.parametrize("act", ACTS)
def test_conv_activation_fuses(act):
    m, feeds = _conv_model(act)
    g = optimized(m)
    assert count(g, FC) == 1 and len(g.nodes) == 1, g.op_histogram()
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_activation_not_fused_when_conv_output_is_read_elsewhere():
    m, feeds = _conv_model("Relu", extra_out=("c",))
    g = optimized(m)
    assert count(g, "Relu") == 1 and count(g, FC) == 0
    assert "output 'c' is a graph output" in why_not(m, "FuseConvActivation")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_silu_not_fused_when_sigmoid_is_read_elsewhere():
    m, feeds = _conv_model("SiLU", extra_out=("sig",))
    g = optimized(m)
    assert count(g, "Mul") == 1 and count(g, "Sigmoid") == 1
    reasons = why_not(m, "FuseConvActivation")
    assert "output 'sig' is a graph output" in reasons
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_clip_with_runtime_bounds_not_fused():
    x, lo = rand(1, 3, 6, 6), np.float32(-0.1)
    m = graph_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Clip", ["c", "lo"], ["y"])],
                    {"x": x, "lo": np.array(lo)}, ["y"], {"w": rand(2, 3, 1, 1, seed=1)}, opset=20)
    feeds = {"x": x, "lo": np.array(lo)}
    assert count(optimized(m), "Clip") == 1
    assert "input 1 is graph input 'lo', expected a constant" in why_not(m, "FuseConvActivation")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_unhandled_activation_is_no_candidate():
    m, feeds = _conv_model("Elu")
    g = optimized(m)
    assert count(g, "Elu") == 1 and count(g, "Conv") == 1
    from tensorfuse.compiler.explain import explain
    ex = explain(m, "FuseConvActivation", node=g.nodes[-1].name, quiet=True)
    assert "the pattern's root is" in ex[0].reason


# ----------------------------------------------------------------------------- residual Add
@pytest.mark.parametrize("act", [None, "Relu", "Clip6", "SiLU"])
@pytest.mark.parametrize("zshape", [(1, 4, 6, 6), (4, 1, 6), (6,)])
def test_conv_residual_add_fuses(act, zshape):
    m, feeds = _conv_model(act, residual=("input", rand(*zshape, seed=3)))
    g = optimized(m)
    assert count(g, FC) == 1 and len(g.nodes) == 1, g.op_histogram()
    fc = g.nodes[0]
    assert fc.inputs[3] is not None and fc.attr("activation") == {"Clip6": "Clip"}.get(act, act or "")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


@pytest.mark.parametrize("bias", [True, False])
def test_conv_per_channel_constant_add_goes_into_the_bias(bias):
    m, feeds = _conv_model("Relu", residual=("const", rand(1, 4, 1, 1, seed=3)), bias=bias)
    g = optimized(m)
    assert len(g.nodes) == 1 and count(g, FC) == 1
    assert g.nodes[0].input(3) is None and g.nodes[0].input(2) is not None
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_full_constant_add_is_a_residual_input():
    m, feeds = _conv_model(None, residual=("const", rand(1, 4, 6, 6, seed=3)))
    g = optimized(m)
    assert count(g, FC) == 1 and g.nodes[0].input(3).is_const
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_add_not_fused_when_it_broadcasts_the_conv_output():
    m, feeds = _conv_model(None, residual=("input", rand(2, 4, 6, 6, seed=3)))
    g = optimized(m)
    assert count(g, "Add") == 1 and count(g, FC) == 0
    assert "broadcasts the Conv output [1, 4, 6, 6] to [2, 4, 6, 6]" in why_not(m, "FuseConvAdd")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_conv_add_not_fused_when_conv_output_is_read_elsewhere():
    m, feeds = _conv_model("Relu", residual=("input", rand(1, 4, 6, 6, seed=3)), extra_out=("c",))
    g = optimized(m)
    assert count(g, "Add") == 1
    assert "output 'c' is a graph output" in why_not(m, "FuseConvAdd")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_two_conv_residual_fuses_one_branch():
    """Add(Conv(x), Conv(x)) as in a ResNet downsampling block: one Conv takes the other as Z."""
    x = rand(1, 3, 6, 6)
    m = graph_model([helper.make_node("Conv", ["x", "w1"], ["c1"]), helper.make_node("Conv", ["x", "w2"], ["c2"]),
                     helper.make_node("Add", ["c1", "c2"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                    {"x": x}, ["y"], {"w1": rand(4, 3, 1, 1, seed=1), "w2": rand(4, 3, 1, 1, seed=2)})
    g = optimized(m)
    assert g.op_histogram() == {FC: 1, "Conv": 1}
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_disabled_rules_switch_fusion_off():
    m, feeds = _conv_model("Relu", residual=("input", rand(1, 4, 6, 6, seed=3)))
    g = optimized(m, disabled_rules=["FuseConvAdd", "FuseConvActivation"])
    assert count(g, FC) == 0 and count(g, "Relu") == 1


def test_fused_node_keeps_the_onnx_names():
    """The FusedConv is named after its anchor Conv and its output after the value it
    replaced, so the model's names show in the graph, the memory plan and the kernel IR; the
    kernel call still traces back to every node it computes."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["/stem/conv_out"], name="/stem/conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["/stem/conv_out", "x"], ["/stem/add_out"], name="/stem/add"),
             helper.make_node("Relu", ["/stem/add_out"], ["/stem/relu_out"], name="/stem/relu"),
             helper.make_node("MaxPool", ["/stem/relu_out"], ["y"], name="/pool", kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
                          [numpy_helper.from_array(w, "w")])
    import tensorfuse
    mod = tensorfuse.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), cache=False)
    (fused,) = [n for n in mod.graph.nodes if n.op == "FusedConv"]
    assert fused.name == "/stem/conv" and fused.attrs["activation"] == "Relu"
    assert [o.name for o in fused.outputs] == ["/stem/relu_out"]
    assert "/stem/relu_out" in {b.name for b in mod.memory_plan.buffers}
    assert any("/stem/conv" in k.comment for k in mod.kernels)
    call = next(c for c in mod.calls if c.nodes == ["/stem/conv"])
    assert mod.source_nodes(call) == ["/stem/conv", "/stem/add", "/stem/relu"]
