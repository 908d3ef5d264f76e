"""A rule under test (issue 24 item 4): one way to add it, ``rules=[...]``, the same in
``compile``, ``explain``, ``explain_report``, ``verify``, ``testing.check_rule`` and the command
line's ``--rules``; it is tried before the built-in rules of its set; the compile cache keys it;
``verify`` counts its applications and warns, and ``check_rule`` fails, when it never fired."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from tensorfuse.compiler import rules as builtin_rules
from tensorfuse.compiler.pattern import Any, P
from tensorfuse.compiler.rewrite import Fail, Rule
from tensorfuse.testing import check_rule, ort_run
from cli_util import ROOT, cli

X = Any().named("x")


class FuseHardSwish(Rule):
    """Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5)) ==> HardSwish(x)."""
    pattern = P.Mul(X, P.HardSigmoid(X).single_use())

    def condition(self, m):
        h = m.hardsigmoid
        ok = abs(h.attr("alpha", 0.2) - 1 / 6) < 1e-6 and abs(h.attr("beta", 0.5) - 0.5) < 1e-6
        return ok or Fail(f"{h.name}: alpha and beta are not 1/6 and 1/2")

    def rewrite(self, m, build):
        return build.HardSwish(m.x)


class ConvReluFirst(Rule):
    """Relu(Conv(x, w, b)) ==> FusedConv(activation=Relu): FuseConvActivation's match, under another name."""
    pattern = P.Relu(P.Conv(x=Any(), w=Any(), b=Any()).single_use())

    def rewrite(self, m, build):
        attrs = dict(m.conv.attrs, activation="Relu", activation_params=[])
        return build.op("FusedConv", m.x, m.w, m.b, None, domain="tensorfuse", attributes=attrs)


def hardswish_model(relu: bool = False) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv(3x3, bias) -> c; y = c * HardSigmoid(c) (a HardSwish spelt out), or
    y = Relu(c) with ``relu``."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    else:
        nodes += [helper.make_node("HardSigmoid", ["c"], ["h"], name="hsig", alpha=1 / 6, beta=0.5),
                  helper.make_node("Mul", ["c", "h"], ["y"], name="mul")]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", f, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", f, [1, 4, 8, 8])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _log(mod):
    return [(a.rule, list(a.nodes)) for a in mod.rewrite_log]


def test_compile_takes_rules_and_leaves_the_catalogue_alone():
    before = list(builtin_rules.FUSE_RULES)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    mod = tensorfuse.compile(hardswish_model(), rules=[FuseHardSwish], cache=False)
    assert _log(mod) == [("FuseHardSwish", ["hsig", "mul"]), ("FuseConvActivation", ["conv", "hsig"])]
    assert [n.op for n in mod.graph.nodes] == ["FusedConv"]
    np.testing.assert_allclose(mod.run(x=x)[0], ort_run(hardswish_model(), {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert builtin_rules.FUSE_RULES == before                 # nothing global was changed
    assert "FuseHardSwish" not in _log(tensorfuse.compile(hardswish_model(), cache=False))
    # disabled_rules may name it, as any rule
    mod = tensorfuse.compile(hardswish_model(), rules=[FuseHardSwish], disabled_rules="FuseHardSwish", cache=False)
    assert "FuseHardSwish" not in [r for r, _ in _log(mod)]


def test_a_rule_under_test_goes_before_the_built_in_rules_of_its_set():
    mod = tensorfuse.compile(hardswish_model(relu=True), rules=[ConvReluFirst], cache=False)
    assert _log(mod) == [("ConvReluFirst", ["conv", "relu"])]        # FuseConvActivation matched too
    rep = tensorfuse.explain_report(hardswish_model(relu=True), rules=[ConvReluFirst])
    [fuse] = [p for p in rep.passes if p.name == "fuse"]
    assert fuse.rules[0] == "ConvReluFirst"
    assert fuse.applied[0].also_matched == ["FuseConvActivation"]


def test_bad_rules_are_refused_with_their_names():
    with pytest.raises(ValueError, match="has the name of a built-in rule"):
        class FuseConvActivation(ConvReluFirst):
            """A clash (test)."""
        tensorfuse.compile(hardswish_model(), rules=[FuseConvActivation], cache=False)
    with pytest.raises(ValueError, match="is a built-in rule and runs already"):
        tensorfuse.compile(hardswish_model(), rules=[builtin_rules.FUSE_RULES[0]], cache=False)

    class Bad(FuseHardSwish):
        """A wrong set (test)."""
        rule_set = "nope"
    with pytest.raises(ValueError, match="rule_set must be one of"):
        tensorfuse.compile(hardswish_model(), rules=[Bad], cache=False)
    with pytest.raises(ValueError, match="takes Rule classes or instances"):
        tensorfuse.compile(hardswish_model(), rules=["FuseHardSwish"], cache=False)
    with pytest.raises(ValueError, match="given twice"):
        tensorfuse.compile(hardswish_model(), rules=[FuseHardSwish, FuseHardSwish], cache=False)


def test_explain_sees_what_compile_does():
    """The Python explain() said FuseConvActivation applied nowhere while the compile log had
    it on the HardSwish node the rule under test made (it looked at the graph before the fuse
    pass only)."""
    compiled = _log(tensorfuse.compile(hardswish_model(), rules=[FuseHardSwish], cache=False))
    ex = tensorfuse.explain(hardswish_model(), "FuseConvActivation", rules=[FuseHardSwish])
    applied = [("FuseConvActivation", r.nodes) for r in ex if r.matched]
    assert applied == [a for a in compiled if a[0] == "FuseConvActivation"]
    [rec] = [r for r in ex if r.matched]
    assert (rec.node, rec.op) == ("hsig", "HardSwish")
    # the rule under test itself, given as a class: it joins the pipeline
    ex = tensorfuse.explain(hardswish_model(), FuseHardSwish)
    assert [(r.node, r.op, r.matched, r.nodes) for r in ex] == [("mul", "Mul", True, ["hsig", "mul"])]
    # a node another rule rewrote first says which
    ex = tensorfuse.explain(hardswish_model(relu=True), "FuseConvActivation", rules=[ConvReluFirst])
    assert [r.node for r in ex] == ["relu"] and not ex[0].matched
    assert "ConvReluFirst rewrote it first (ConvReluFirst: conv, relu" in ex[0].reason
    # without the rule under test: the shared Conv output stops it, as compile's log says
    ex = tensorfuse.explain(hardswish_model(), "FuseConvActivation")
    assert not any(r.matched for r in ex)
    assert ex.reasons["hsig"] == "hsig: input 0: output 'c' has another consumer: mul (Mul)"
    # a rule that does not run at this level says so
    ex = tensorfuse.explain(hardswish_model(relu=True), "FuseConvActivation", disabled_rules="FuseConvActivation")
    assert ex.reasons["relu"] == ("FuseConvActivation does not run at O2 (disabled_rules switches it off); "
                                  "here it would apply to conv, relu")


def test_verify_counts_the_applications_of_each_rule_under_test():
    res = tensorfuse.verify(hardswish_model(), rules=[FuseHardSwish], groups=False)
    assert res.ok and res.rule_counts == {"FuseHardSwish": 1} and res.rules_not_fired == []
    assert "rule under test FuseHardSwish: applied 1 time\n" in str(res)
    res = tensorfuse.verify(hardswish_model(relu=True), rules=[FuseHardSwish], groups=False)
    assert res.rule_counts == {"FuseHardSwish": 0} and res.rules_not_fired == ["FuseHardSwish"]
    assert res.ok                                   # the outputs agree; the report warns
    assert "warning: rule under test FuseHardSwish never fired at O2" in str(res)


def test_cli_verify_warns_when_the_rule_under_test_never_fired(tmp_path):
    m = tmp_path / "relu.onnx"
    onnx.save(hardswish_model(relu=True), m)
    spec = f"{ROOT}/tests/test_rules_under_test.py:FuseHardSwish"
    r = cli("verify", m, "--rules", spec, "--no-groups")
    assert r.returncode == 0, r.stderr
    assert "rule under test FuseHardSwish: applied 0 times" in r.stdout
    assert "warning: rule under test FuseHardSwish never fired at O2" in r.stdout
    onnx.save(hardswish_model(), m)
    r = cli("explain", m, "--rules", spec, "--rule", "FuseConvActivation")
    assert r.returncode == 0, r.stderr
    assert "+ FuseConvActivation: conv, hsig -> conv" in r.stdout


def test_check_rule_takes_a_rule_under_test_and_fails_when_it_never_fired():
    check = check_rule(hardswish_model(), FuseHardSwish)
    assert [a.nodes for a in check.applications] == [["hsig", "mul"]]
    with pytest.raises(AssertionError, match="FuseHardSwish did not fire at O2, so nothing about it was checked"):
        check_rule(hardswish_model(relu=True), FuseHardSwish)
    check_rule(hardswish_model(relu=True), FuseHardSwish, fires=False)
    with pytest.raises(ValueError, match="unknown rule 'Nope'"):
        check_rule(hardswish_model(), "Nope")


def test_the_cache_keys_the_rules_under_test(tmp_path, monkeypatch):
    """A module compiled without the rule under test must not be served for a compile with it."""
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path))
    plain = tensorfuse.compile(hardswish_model())
    assert plain.cache_hit is False and "FuseHardSwish" not in [r for r, _ in _log(plain)]
    with_rule = tensorfuse.compile(hardswish_model(), rules=[FuseHardSwish])
    assert with_rule.cache_hit is False and _log(with_rule)[0][0] == "FuseHardSwish"
    again = tensorfuse.compile(hardswish_model(), rules=[FuseHardSwish])
    assert again.cache_hit is True and _log(again) == _log(with_rule)
    info = tensorfuse.cache_info(hardswish_model(), rules=[ConvReluFirst])
    assert not info.hit


def test_a_module_that_compiles_per_input_value_keeps_the_rules_under_test():
    """A model whose shapes depend on an input's values compiles at its first run: with the
    rules under test of the compile call."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("HardSigmoid", ["r"], ["h"], name="hsig", alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["r", "h"], ["y"], name="mul")]
    g = helper.make_graph(nodes, "spec", [helper.make_tensor_value_info("x", f, [2, 6]),
                                          helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", f, ["a", "b"])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    smod = tensorfuse.compile(model, rules=[FuseHardSwish], cache=False)
    x = np.linspace(-4, 4, 12, dtype=np.float32).reshape(2, 6)
    shape = np.array([3, 4], np.int64)
    mod, _ = smod.module_for(x=x, shape=shape)
    assert [a.rule for a in mod.rewrite_log] == ["FuseHardSwish"]
    np.testing.assert_allclose(smod.run(x=x, shape=shape)[0], ort_run(model, {"x": x, "shape": shape})[0],
                               rtol=1e-6, atol=1e-6)
