"""Rules and the rewrite driver (compiler/rewrite.py): application, removal of replaced nodes,
topological order, logs, Fail reasons, determinism, the step limit, graph output names."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from tensorfuse import ir
from tensorfuse.compiler import rewrite as rewrite_module
from tensorfuse.compiler.pattern import Any, Const, P
from tensorfuse.compiler.rewrite import Application, Fail, RewriteError, Rule, apply_rules, try_rule
from tensorfuse.ir.verify import verify_graph


def G(body: str, inputs: str = "%x: f32[2,3]") -> ir.Graph:
    g = ir.parse(f"graph g({inputs}) {{\n{body}\n}}")
    verify_graph(g)
    return g


class RemoveDoubleNeg(Rule):
    """Neg(Neg(x)) ==> x."""
    pattern = P.Neg(P.Neg(x=Any()).named("inner"))

    def rewrite(self, m, build):
        return m.x


class AddSelfToMul(Rule):
    """Add(x, x) ==> Mul(x, 2)."""
    pattern = P.Add(Any("x"), Any("x"))

    def rewrite(self, m, build):
        return build.Mul(m.x, build.const(np.asarray(2, m.x.dtype.numpy), "two"))


class ScaleThenExp(Rule):
    """Exp(Mul(x, c)) with a single-use Mul ==> Pow(Exp(x), c)."""
    pattern = P.Exp(P.Mul(x=Any(), c=Const()).single_use())

    def condition(self, m):
        return float(m.c.data.reshape(-1)[0]) != 0.0 or Fail(f"{m.mul.name}: the scale is zero")

    def rewrite(self, m, build):
        return build.Pow(build.Exp(m.x), m.c)


class RefuseInRewrite(Rule):
    """Tanh(x) ==> never (the rewrite refuses after building a node)."""
    pattern = P.Tanh(x=Any())

    def rewrite(self, m, build):
        build.Neg(m.x)
        build.const(np.float32(3), "junk")
        return Fail("the rewrite refuses")


class TanhToSinh(Rule):
    """Tanh(x) ==> Sinh(x) (wrong on purpose: with SinhToTanh it never ends)."""
    pattern = P.Tanh(x=Any())

    def rewrite(self, m, build):
        return build.Sinh(m.x)


class SinhToTanh(Rule):
    """Sinh(x) ==> Tanh(x)."""
    pattern = P.Sinh(x=Any())

    def rewrite(self, m, build):
        return build.Tanh(m.x)


class WrongType(Rule):
    """Relu(x) ==> a constant of another shape (a bug the driver must catch)."""
    pattern = P.Relu(x=Any())

    def rewrite(self, m, build):
        return build.const(np.zeros(7, np.float32))


class Raises(Rule):
    """Relu(x) ==> raises (a bug the driver must name)."""
    pattern = P.Relu(x=Any())

    def rewrite(self, m, build):
        raise KeyError("oops")


class SwapTanhNeg(Rule):
    """(Tanh(t), Neg(t)) ==> (Sinh(t), Cosh(t)) - a two-output pattern, rewritten together."""
    pattern = (P.Tanh(Any("t")), P.Neg(Any("t")))

    def rewrite(self, m, build):
        return [build.Sinh(m.t), build.Cosh(m.t)]


def test_docstring_examples_run():
    assert doctest.testmod(rewrite_module).failed == 0


def test_rule_replaces_and_removes_dead_nodes_and_logs():
    g = G("""
  %a: f32[2,3] = Neg(%x) @n1
  %b: f32[2,3] = Neg(%a) @n2
  %y: f32[2,3] = Relu(%b) @relu
  return %y""")
    log = []
    assert apply_rules(g, [RemoveDoubleNeg], log=log) == 1
    verify_graph(g)
    assert [n.name for n in g.nodes] == ["relu"] and g.node("relu").inputs[0] is g.inputs[0]
    assert [str(a) for a in log] == ["RemoveDoubleNeg: n1, n2"]


def test_interior_node_with_another_consumer_stays():
    g = G("""
  %a: f32[2,3] = Neg(%x) @n1
  %b: f32[2,3] = Neg(%a) @n2
  %z: f32[2,3] = Exp(%a) @other
  return %b, %z""")
    apply_rules(g, [RemoveDoubleNeg])
    verify_graph(g)
    assert [n.name for n in g.nodes] == ["n1", "other"]
    assert g.outputs[0] is g.inputs[0]


def test_new_nodes_are_placed_in_topological_order():
    g = G("""
  const %c: f32[] = 3.0
  %m: f32[2,3] = Mul(%x, %c) @mul
  %e: f32[2,3] = Exp(%m) @exp
  %y: f32[2,3] = Relu(%e) @relu
  %z: f32[2,3] = Add(%y, %y) @twice
  return %z""")
    log = []
    apply_rules(g, [ScaleThenExp, AddSelfToMul], log=log)
    verify_graph(g)
    assert [n.op for n in g.nodes] == ["Exp", "Pow", "Relu", "Mul"]
    assert g.nodes[0].inputs[0] is g.inputs[0]
    assert [a.rule for a in log] == ["ScaleThenExp", "AddSelfToMul"]
    assert log[0].nodes == ["mul", "exp"] and len(log[0].created) == 2


def test_condition_fail_leaves_graph_and_gives_reason():
    g = G("""
  const %c: f32[] = 0.0
  %m: f32[2,3] = Mul(%x, %c) @mul
  %e: f32[2,3] = Exp(%m) @exp
  return %e""")
    before = ir.print_graph(g)
    assert apply_rules(g, [ScaleThenExp]) == 0
    assert ir.print_graph(g) == before
    res = try_rule(g, ScaleThenExp(), g.node("exp"))
    assert isinstance(res, Fail) and res.reason == "mul: the scale is zero"


def test_rewrite_fail_undoes_partial_work():
    g = G("%t: f32[2,3] = Tanh(%x) @tanh\n  return %t")
    before = ir.print_graph(g)
    res = try_rule(g, RefuseInRewrite(), g.node("tanh"))
    assert isinstance(res, Fail) and res.reason == "the rewrite refuses"
    assert ir.print_graph(g) == before and "junk" not in g.constants


def test_driver_is_deterministic():
    text = """
  %a: f32[2,3] = Neg(%x) @n1
  %b: f32[2,3] = Neg(%a) @n2
  %c: f32[2,3] = Add(%b, %b) @add1
  %d: f32[2,3] = Neg(%c) @n3
  %e: f32[2,3] = Neg(%d) @n4
  %f: f32[2,3] = Add(%e, %e) @add2
  return %f"""
    runs = []
    for _ in range(3):
        g, log = G(text), []
        apply_rules(g, [AddSelfToMul, RemoveDoubleNeg], log=log)
        runs.append((ir.print_graph(g), [str(a) for a in log]))
    assert runs[0] == runs[1] == runs[2]
    assert [a.split(":")[0] for a in runs[0][1]] == ["RemoveDoubleNeg", "AddSelfToMul", "RemoveDoubleNeg",
                                                     "AddSelfToMul"]


def test_step_limit_names_the_rules():
    g = G("%t: f32[2,3] = Tanh(%x) @tanh\n  return %t")
    with pytest.raises(RewriteError, match="step limit 10 reached.*(TanhToSinh|SinhToTanh)"):
        apply_rules(g, [TanhToSinh, SinhToTanh], max_steps=10)


def test_graph_output_keeps_its_user_facing_name():
    g = G("""
  %a: f32[2,3] = Neg(%x) @n1
  %y: f32[2,3] = Neg(%a) @n2
  return %y""")
    g.output_names = ["y"]
    apply_rules(g, [RemoveDoubleNeg])
    assert g.nodes == [] and g.outputs == [g.inputs[0]] and g.output_names == ["y"]


def test_replacement_of_wrong_type_or_exception_names_rule_and_node():
    g = G("%y: f32[2,3] = Relu(%x) @relu_7\n  return %y")
    with pytest.raises(RewriteError, match=r"rule WrongType at node relu_7: .* f32\[7\].*f32\[2,3\]"):
        apply_rules(g, [WrongType])
    assert len(g.nodes) == 1 and len(g.constants) == 0
    with pytest.raises(RewriteError, match="rule Raises failed at node relu_7: KeyError"):
        apply_rules(g, [Raises])


def test_two_output_pattern_rewrites_both():
    g = G("""
  %t: f32[2,3] = Exp(%x) @exp
  %a: f32[2,3] = Tanh(%t) @tanh
  %b: f32[2,3] = Neg(%t) @neg
  %y: f32[2,3] = Add(%a, %b) @add
  return %y""")
    log = []
    assert apply_rules(g, [SwapTanhNeg], log=log) == 1
    verify_graph(g)
    assert log[0].nodes == ["tanh", "neg"]
    assert [n.op for n in g.nodes] == ["Exp", "Sinh", "Cosh", "Add"]
    assert [v.producer.op for v in g.node("add").inputs] == ["Sinh", "Cosh"]


def test_rule_needs_docstring_and_has_name_and_doc():
    with pytest.raises(TypeError, match="docstring"):
        class NoDoc(Rule):
            pattern = P.Relu(Any())
    r = RemoveDoubleNeg()
    assert r.name == "RemoveDoubleNeg" and r.doc == "Neg(Neg(x)) ==> x."
    assert r.root_ops() == {"Neg"} and RemoveDoubleNeg.captures == ["neg", "inner", "x"]
    assert str(Application("R", ["a", "b"], ["c"])) == "R: a, b -> c"
    assert not Fail("no") and str(Fail("no")) == "no"


class NegExpToSinh(Rule):
    """Exp(Neg(x)) ==> Sinh(x), also replacing Neg(x) by Neg(Sinh(x)) (a dict replacing an interior value)."""
    pattern = P.Exp(P.Neg(x=Any()))

    def rewrite(self, m, build):
        s = build.Sinh(m.x)
        return {m.exp.outputs[0]: s, m.neg.outputs[0]: build.Neg(s)}


def test_replacement_of_an_interior_value_goes_before_its_earlier_readers():
    # issue 9, defect 1 in general: %a is read by @early before the match's last node
    g = G("""
  %a: f32[2,3] = Neg(%x) @neg
  %r: f32[2,3] = Relu(%a) @early
  %e: f32[2,3] = Exp(%a) @exp
  return %e, %r""")
    assert apply_rules(g, [NegExpToSinh]) == 1
    verify_graph(g)
    assert [n.op for n in g.nodes] == ["Sinh", "Neg", "Relu"]
    assert g.node("early").inputs[0].producer.op == "Neg"


class NeedsTheReader(Rule):
    """Exp(Neg(x)) ==> Sinh(Relu-of-Neg), also replacing Neg(x): needs a node after the first reader."""
    pattern = P.Exp(P.Neg(x=Any()))

    def rewrite(self, m, build):
        late = m.graph.node("late").outputs[0]
        s = build.Sinh(build.Add(m.x, late))
        return {m.exp.outputs[0]: s, m.neg.outputs[0]: build.Neg(s)}


def test_readers_move_later_when_the_replacement_needs_a_later_value():
    g = G("""
  %a: f32[2,3] = Neg(%x) @neg
  %r: f32[2,3] = Relu(%a) @early
  %l: f32[2,3] = Tanh(%x) @late
  %e: f32[2,3] = Exp(%a) @exp
  return %e, %r, %l""")
    assert apply_rules(g, [NeedsTheReader]) == 1
    verify_graph(g)
    order = [n.name or n.op for n in g.nodes]
    assert order.index("late") < order.index("early")


class DependsOnItsOwnReader(Rule):
    """Exp(Neg(x)) ==> Sinh(Relu(Neg x)) replacing Neg(x) too: a cycle through the reader."""
    pattern = P.Exp(P.Neg(x=Any()))

    def rewrite(self, m, build):
        r = m.graph.node("early").outputs[0]
        s = build.Sinh(r)
        return {m.exp.outputs[0]: s, m.neg.outputs[0]: build.Neg(s)}


def test_a_replacement_that_needs_a_reader_of_what_it_replaces_is_refused_and_undone():
    g = G("""
  %a: f32[2,3] = Neg(%x) @neg
  %r: f32[2,3] = Relu(%a) @early
  %e: f32[2,3] = Exp(%a) @exp
  return %e, %r""")
    before = ir.print_graph(g)
    with pytest.raises(RewriteError, match="DependsOnItsOwnReader.*reader of the value it replaces"):
        apply_rules(g, [DependsOnItsOwnReader])
    assert ir.print_graph(g) == before
    verify_graph(g)
