"""tensorfuse.explain: for each candidate node, whether a rule applies and if not why."""
from __future__ import annotations

import pytest

import tensorfuse
from tensorfuse.compiler.explain import Explanation
from tensorfuse.compiler.passes.simplify import ComposeTransposes, RemoveSameTypeCast
from tensorfuse.compiler.pattern import Any, Const, P
from tensorfuse.compiler.rewrite import Fail, Rule
from passes_util import G, model


class ScaleRelu(Rule):
    """Relu(Mul(x, c)) with a positive constant c ==> Mul(Relu(x), c)."""
    pattern = P.Relu(P.Mul(x=Any(), c=Const()).single_use())

    def condition(self, m):
        return bool((m.c.data > 0).all()) or Fail(f"{m.mul.name}: the scale '{m.c.name}' is not positive")

    def rewrite(self, m, build):
        return build.Mul(build.Relu(m.x), m.c)


GRAPH = """
  const %pos: f32[] = 2.0
  const %neg: f32[] = -2.0
  %a: f32[2,3] = Mul(%x, %pos) @mul_ok
  %r1: f32[2,3] = Relu(%a) @relu_ok
  %b: f32[2,3] = Mul(%x, %neg) @mul_neg
  %r2: f32[2,3] = Relu(%b) @relu_neg
  %c: f32[2,3] = Mul(%x, %x) @mul_var
  %r3: f32[2,3] = Relu(%c) @relu_var
  %d: f32[2,3] = Mul(%x, %pos) @mul_shared
  %r4: f32[2,3] = Relu(%d) @relu_shared
  %e: f32[2,3] = Exp(%d) @exp
  %t: f32[2,3] = Tanh(%x) @tanh
  %r5: f32[2,3] = Relu(%t) @relu_tanh
  return %r1, %r2, %r3, %r4, %e, %r5"""


def test_reasons_for_each_candidate(capsys):
    g = G(GRAPH)
    before = str(g)
    ex = tensorfuse.explain(g, ScaleRelu)
    assert isinstance(ex, Explanation) and [r.node for r in ex] == \
        ["relu_ok", "relu_neg", "relu_var", "relu_shared", "relu_tanh"]
    assert ex.reasons == {
        "relu_ok": None,
        "relu_neg": "mul_neg: the scale 'neg' is not positive",
        "relu_var": "mul_var: input 1 is graph input 'x', expected a constant",
        "relu_shared": "mul_shared: output 'd' has another consumer: exp (Exp)",
        "relu_tanh": "relu_tanh: input 0 is produced by Tanh (tanh), expected Mul",
    }
    assert ex[0].matched and ex[0].nodes == ["mul_ok", "relu_ok"]
    assert str(g) == before                                  # explain changes nothing
    assert capsys.readouterr().out == ""                     # it prints nothing; str/repr is the report
    out = str(ex)
    assert repr(ex) == out
    assert "relu_neg (Relu): ScaleRelu does not apply: mul_neg: the scale 'neg' is not positive" in out
    assert "relu_ok (Relu): ScaleRelu applies to mul_ok, relu_ok" in out


def test_single_node_and_graph_output_reason():
    g = G(GRAPH.replace("return %r1,", "return %a, %r1,"))
    ex = tensorfuse.explain(g, ScaleRelu(), "relu_ok", quiet=True)
    assert len(ex) == 1 and ex[0].reason == "mul_ok: output 'a' is a graph output, so it must stay"
    ex = tensorfuse.explain(g, ScaleRelu, g.node("exp"), quiet=True)
    assert ex[0].reason == "exp is Exp; the pattern's root is Relu"
    with pytest.raises(ValueError, match="no node named 'nope'"):
        tensorfuse.explain(g, ScaleRelu, "nope")


def test_rule_by_name_on_a_model(capsys):
    m = model("""agraph (float[2,3] x) => (float[2,3] y) {
        t = Transpose<perm = [1, 0]>(x)
        y = Transpose<perm = [1, 0]>(t)
    }""")
    ex = tensorfuse.explain(m, "ComposeTransposes", quiet=True)
    assert [r.matched for r in ex] == [False, True]
    assert ex[0].reason.endswith("input 0 is graph input 'x', expected Transpose")
    with pytest.raises(ValueError, match="unknown rule 'Nope'"):
        tensorfuse.explain(m, "Nope")
    assert ComposeTransposes and RemoveSameTypeCast


def test_rewrite_refusal_is_reported():
    class Refuses(Rule):
        """Relu(x) ==> refused in rewrite."""
        pattern = P.Relu(x=Any())

        def rewrite(self, m, build):
            return Fail(f"{m.relu.name}: nothing to gain")

    g = G("%y: f32[2,3] = Relu(%x) @r\n  return %y")
    assert tensorfuse.explain(g, Refuses, quiet=True).reasons == {"r": "r: nothing to gain"}
