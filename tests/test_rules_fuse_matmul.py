"""MatMul / Gemm epilogue rules and GELU recognition (compiler/rules/fuse_matmul.py,
compiler/rules/fuse_gelu.py): each fires, refuses where it must (explain's reason), and keeps
the outputs (onnxruntime, optimisations off)."""
import math

import numpy as np
import pytest
from onnx import helper

from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, ort_run, rand

RT, AT = 1e-4, 1e-5
FM = "tensorfuse::FusedMatMul"
FG = "tensorfuse::FusedGemm"
SQRT2 = np.float32(math.sqrt(2.0))


def _gelu_erf_nodes(src, dst, variant):
    """The erf GELU as exporters write it."""
    c = {"sqrt2": np.array(SQRT2), "inv_sqrt2": np.float32(1 / math.sqrt(2)), "one": np.float32(1.0),
         "half": np.float32(0.5)}
    if variant == "hf":        # HF BERT: x * (1 + erf(x / sqrt2)) * 0.5   (scaled last)
        nodes = [helper.make_node("Div", [src, "sqrt2"], ["g_d"]), helper.make_node("Erf", ["g_d"], ["g_e"]),
                 helper.make_node("Add", ["g_e", "one"], ["g_a"]), helper.make_node("Mul", [src, "g_a"], ["g_m"]),
                 helper.make_node("Mul", ["g_m", "half"], [dst])]
    elif variant == "torch":   # 0.5 * x first, erf argument as a multiplication
        nodes = [helper.make_node("Mul", [src, "inv_sqrt2"], ["g_d"]), helper.make_node("Erf", ["g_d"], ["g_e"]),
                 helper.make_node("Add", ["one", "g_e"], ["g_a"]), helper.make_node("Mul", ["half", src], ["g_h"]),
                 helper.make_node("Mul", ["g_h", "g_a"], [dst])]
    else:                      # x * (0.5 * (1 + erf))
        nodes = [helper.make_node("Div", [src, "sqrt2"], ["g_d"]), helper.make_node("Erf", ["g_d"], ["g_e"]),
                 helper.make_node("Add", ["g_e", "one"], ["g_a"]), helper.make_node("Mul", ["half", "g_a"], ["g_h"]),
                 helper.make_node("Mul", [src, "g_h"], [dst])]
    return nodes, c


def _gelu_tanh_nodes(src, dst, cube="pow", coeff=0.044715):
    c = {"three": np.float32(3.0), "k": np.float32(coeff), "s": np.float32(math.sqrt(2 / math.pi)),
         "one": np.float32(1.0), "half": np.float32(0.5)}
    if cube == "pow":
        nodes = [helper.make_node("Pow", [src, "three"], ["t_c"])]
    else:
        nodes = [helper.make_node("Mul", [src, src], ["t_sq"]), helper.make_node("Mul", ["t_sq", src], ["t_c"])]
    nodes += [helper.make_node("Mul", ["k", "t_c"], ["t_kc"]), helper.make_node("Add", [src, "t_kc"], ["t_p"]),
              helper.make_node("Mul", ["t_p", "s"], ["t_ps"]), helper.make_node("Tanh", ["t_ps"], ["t_t"]),
              helper.make_node("Add", ["t_t", "one"], ["t_a"]), helper.make_node("Mul", [src, "half"], ["t_h"]),
              helper.make_node("Mul", ["t_h", "t_a"], [dst])]
    return nodes, c


# ----------------------------------------------------------------------------- GELU
@pytest.mark.parametrize("variant", ["hf", "torch", "nested"])
def test_gelu_erf_recognised(variant):
    x = rand(3, 7, low=-4, high=4)
    nodes, c = _gelu_erf_nodes("x", "y", variant)
    m = graph_model(nodes, {"x": x}, ["y"], c)
    g = optimized(m)
    assert g.op_histogram() == {"Gelu": 1}
    assert g.nodes[0].attr("approximate") == "none"        # never the tanh form below O3
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(1, 2))


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_gelu_tanh_recognised(cube):
    x = rand(3, 7, low=-4, high=4)
    nodes, c = _gelu_tanh_nodes("x", "y", cube)
    m = graph_model(nodes, {"x": x}, ["y"], c)
    g = optimized(m)
    assert g.op_histogram() == {"Gelu": 1} and g.nodes[0].attr("approximate") == "tanh"
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_gelu_erf_not_recognised_when_an_intermediate_is_an_output():
    x = rand(3, 7)
    nodes, c = _gelu_erf_nodes("x", "y", "hf")
    m = graph_model(nodes, {"x": x}, ["y", "g_e"], c)
    assert count(optimized(m), "Gelu") == 0
    assert "output 'g_e' is a graph output" in why_not(m, "GeluErf")
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_gelu_erf_not_recognised_with_another_constant():
    x = rand(3, 7)
    nodes, c = _gelu_erf_nodes("x", "y", "hf")
    c["sqrt2"] = np.array(np.float32(math.sqrt(3.0)))
    m = graph_model(nodes, {"x": x}, ["y"], c)
    assert count(optimized(m), "Gelu") == 0
    assert "expected the constant 1.414" in why_not(m, "GeluErf")
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_gelu_tanh_not_recognised_with_another_coefficient():
    x = rand(3, 7)
    nodes, c = _gelu_tanh_nodes("x", "y", coeff=0.05)
    m = graph_model(nodes, {"x": x}, ["y"], c)
    assert count(optimized(m), "Gelu") == 0
    assert "expected the constant 0.044715" in why_not(m, "GeluTanh")
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(2,))


def test_gelu_approximated_only_at_o3():
    x = rand(64, low=-5, high=5)
    nodes, c = _gelu_erf_nodes("x", "y", "hf")
    m = graph_model(nodes, {"x": x}, ["y"], c)
    assert optimized(m, 2).nodes[0].attr("approximate") == "none"
    g3 = optimized(m, 3)
    assert g3.nodes[0].attr("approximate") == "tanh"
    assert "ApproximateGelu" in {n for n in __import__("tensorfuse.compiler.pipeline", fromlist=["x"]).rule_sets()["o3"] for n in [n.__name__]}
    import tensorfuse
    got = tensorfuse.compile(m, opt_level=3).run(x=x)[0]
    exp = ort_run(m, {"x": x})[0]
    assert np.max(np.abs(got - exp)) <= 4.8e-4           # the bound ApproximateGelu states


# ----------------------------------------------------------------------------- MatMul + bias
@pytest.mark.parametrize("sa,sw,sbias", [((3, 4), (4, 5), (5,)), ((2, 3, 4), (4, 5), (1, 5)),
                                          ((2, 3, 4), (4, 5), (1, 1, 5)), ((4,), (4, 5), (5,))])
def test_matmul_bias_fuses(sa, sw, sbias):
    a = rand(*sa)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["bias", "p"], ["y"])],
                    {"a": a}, ["y"], {"w": rand(*sw, seed=1), "bias": rand(*sbias, seed=2)})
    g = optimized(m)
    assert g.op_histogram() == {FM: 1} and g.nodes[0].inputs[2].shape == (sw[-1],)
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


@pytest.mark.parametrize("sbias,reason", [((3, 1), "is not along the last axis"),
                                          ((2, 1, 5), "is not along the last axis")])
def test_matmul_bias_not_along_last_axis_not_fused(sbias, reason):
    a = rand(3, 4)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["y"])],
                    {"a": a}, ["y"], {"w": rand(4, 5, seed=1), "bias": rand(*sbias, seed=2)})
    assert count(optimized(m), "Add") == 1
    assert reason in why_not(m, "FuseMatMulBias")
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


def test_matmul_runtime_bias_not_fused():
    a, bias = rand(3, 4), rand(5, seed=2)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["y"])],
                    {"a": a, "bias": bias}, ["y"], {"w": rand(4, 5, seed=1)})
    assert count(optimized(m), "Add") == 1
    assert "graph input 'bias', expected a constant" in why_not(m, "FuseMatMulBias")
    assert_matches_ort(m, {"a": a, "bias": bias}, rtol=RT, atol=AT, opt_levels=(2,))


def test_matmul_bias_not_fused_when_product_is_read_elsewhere():
    a = rand(3, 4)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["y"]),
                     helper.make_node("Relu", ["p"], ["r"])], {"a": a}, ["y", "r"],
                    {"w": rand(4, 5, seed=1), "bias": rand(5, seed=2)})
    g = optimized(m)
    assert count(g, "Add") == 1
    assert "output 'p' has another consumer: Relu" in why_not(m, "FuseMatMulBias")
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


# ----------------------------------------------------------------------------- + activation
@pytest.mark.parametrize("variant", ["hf", "torch"])
def test_matmul_bias_gelu_is_one_kernel(variant):
    a = rand(2, 3, 8)
    nodes, c = _gelu_erf_nodes("h", "y", variant)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["bias", "p"], ["h"]),
                     *nodes], {"a": a}, ["y"], {"w": rand(8, 16, seed=1), "bias": rand(16, seed=2), **c})
    g = optimized(m)
    assert g.op_histogram() == {FM: 1}
    assert g.nodes[0].attr("activation") == "Gelu"
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh", "GeluTanh"])
def test_matmul_activation_fuses_without_bias(act):
    a = rand(3, 8)
    node = helper.make_node("Gelu", ["p"], ["y"], approximate="tanh") if act == "GeluTanh" else \
        helper.make_node(act, ["p"], ["y"])
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), node], {"a": a}, ["y"], {"w": rand(8, 4, seed=1)},
                    opset=20)
    g = optimized(m)
    assert g.op_histogram() == {FM: 1} and g.nodes[0].attr("activation") == act
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


def test_matmul_activation_not_fused_when_product_is_an_output():
    a = rand(3, 8)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["h"]),
                     helper.make_node("Relu", ["h"], ["y"])], {"a": a}, ["y", "h"],
                    {"w": rand(8, 4, seed=1), "bias": rand(4, seed=2)})
    g = optimized(m)
    assert g.op_histogram() == {FM: 1, "Relu": 1}
    # explain on a model replays the passes before the fuse pass, where the bias is not fused yet;
    # on the graph fused by every other rule, the activation rule sees FusedMatMul -> Relu
    before = optimized(m, disabled_rules=["FuseMatMulActivation"])
    assert "is a graph output, so it must stay" in why_not(before, "FuseMatMulActivation")
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


def test_integer_matmul_not_fused():
    a = rand(3, 4, dtype=np.int32, low=-3, high=3)
    m = graph_model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                    {"a": a}, ["y"], {"w": rand(4, 2, dtype=np.int32, seed=1, low=-3, high=3)})
    assert count(optimized(m), "Relu") == 1
    assert "not a float type" in why_not(m, "FuseMatMulActivation")
    assert_matches_ort(m, {"a": a}, rtol=0, atol=0, opt_levels=(2,))


# ----------------------------------------------------------------------------- Gemm
@pytest.mark.parametrize("attrs", [{}, {"transB": 1, "alpha": 0.5, "beta": 2.0}])
@pytest.mark.parametrize("act", ["Tanh", "Relu", "LeakyRelu"])
def test_gemm_activation_fuses(attrs, act):
    a = rand(2, 6)
    w = rand(3, 6, seed=1) if attrs.get("transB") else rand(6, 3, seed=1)
    m = graph_model([helper.make_node("Gemm", ["a", "w", "c"], ["p"], **attrs), helper.make_node(act, ["p"], ["y"])],
                    {"a": a}, ["y"], {"w": w, "c": rand(3, seed=2)})
    g = optimized(m)
    assert g.op_histogram() == {FG: 1} and g.nodes[0].attr("activation") == act
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


def test_gemm_activation_not_fused_when_product_is_read_elsewhere():
    a = rand(2, 6)
    m = graph_model([helper.make_node("Gemm", ["a", "w"], ["p"]), helper.make_node("Tanh", ["p"], ["y"]),
                     helper.make_node("Neg", ["p"], ["n"])], {"a": a}, ["y", "n"], {"w": rand(6, 3, seed=1)})
    assert count(optimized(m), "Tanh") == 1
    assert "output 'p' has another consumer: Neg" in why_not(m, "FuseGemmActivation")
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=AT, opt_levels=(2,))


# ----------------------------------------------------------------------------- ActivationBeforeReshape
def _reshape_act_model(anchor="Gemm", act="Gelu", extra_consumer=None):
    """x[6, 8] -> Gemm/MatMul (+ bias via Gemm's C) -> Reshape [2, 3, 5] -> activation."""
    x = rand(6, 8)
    inits = {"w": rand(8, 5, seed=1), "c": rand(5, seed=2), "shape": np.array([2, 3, 5], np.int64),
             "three": np.float32(3.0)}
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["p"]) if anchor == "Gemm"
             else helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["r"])]
    if act == "Gelu":
        nodes.append(helper.make_node("Gelu", ["r"], ["y"], approximate="tanh"))
    elif act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["r"], ["sg"]), helper.make_node("Mul", ["r", "sg"], ["y"])]
    elif act == "Clip":
        inits.update(lo=np.float32(-0.5), hi=np.float32(0.75))
        nodes.append(helper.make_node("Clip", ["r", "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node(act, ["r"], ["y"]))
    outs = ["y"]
    if extra_consumer is not None:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["z"]))
        outs.append("z")
    return graph_model(nodes, {"x": x}, outs, inits, 20), {"x": x}


@pytest.mark.parametrize("anchor,act,fused", [("Gemm", "Gelu", FG), ("Gemm", "SiLU", FG), ("Gemm", "Clip", FG),
                                              ("MatMul", "Relu", FM), ("MatMul", "Gelu", FM)])
def test_activation_moves_before_reshape_into_the_epilogue(anchor, act, fused):
    m, feeds = _reshape_act_model(anchor, act)
    g = optimized(m)
    assert count(g, fused) == 1 and count(g, anchor) == 0 and count(g, "Reshape") == 1
    assert count(g, "Gelu") + count(g, "Relu") + count(g, "Clip") + count(g, "Sigmoid") == 0
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


@pytest.mark.parametrize("extra,reason", [("r", "has another consumer"), ("p", "has another consumer")])
def test_activation_not_moved_when_the_reshape_or_product_is_read_elsewhere(extra, reason):
    m, feeds = _reshape_act_model("Gemm", "Gelu", extra_consumer=extra)
    g = optimized(m)
    assert count(g, "Gelu") == 1
    assert reason in why_not(m, "ActivationBeforeReshape")
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_activation_not_moved_when_not_a_fused_activation():
    m, feeds = _reshape_act_model("Gemm", "Neg")
    g = optimized(m)
    assert count(g, "Neg") == 1 and count(g, "Gemm") == 1
    assert_matches_ort(m, feeds, rtol=RT, atol=AT, opt_levels=(2,))
