"""The pattern language (compiler/pattern.py): each construct matches what it should, fails where
it should, and says why in words."""
from __future__ import annotations

import doctest

import pytest

from tensorfuse import ir
from tensorfuse.compiler import pattern as pattern_module
from tensorfuse.compiler.pattern import Any, Const, OneOf, Op, Optional, P, match_at


def G(body: str, inputs: str = "%x: f32[2,3]") -> ir.Graph:
    return ir.parse(f"graph g({inputs}) {{\n{body}\n}}")


def at(pat, g: ir.Graph, node: str):
    return match_at(pat, g.node(node), g)


ADD_RELU = """
  const %c: f32[] = 1.0
  %a: f32[2,3] = Add(%x, %c) @add
  %y: f32[2,3] = Relu(%a) @relu
  return %y"""


def test_docstring_examples_run():
    res = doctest.testmod(pattern_module)
    assert res.attempted > 5 and res.failed == 0


def test_op_match_captures_values_and_nodes():
    g = G(ADD_RELU)
    m = at(P.Relu(P.Add(x=Any(), c=Const())), g, "relu")
    assert m
    assert m.x is g.inputs[0] and m.c is g.constants["c"]
    assert m.add is g.node("add") and m.relu is g.node("relu")
    assert [n.name for n in m.nodes] == ["add", "relu"]
    assert m.outputs == [g.value("y")] and m.root is g.node("relu")
    with pytest.raises(AttributeError, match="no capture named 'w'"):
        m.w


def test_wrong_producer_reason_names_node_and_ops():
    g = G("""
  %p: f32[2,3] = Tanh(%x) @pool1
  %y: f32[2,3] = Relu(%p) @Relu_3
  return %y""")
    m = at(P.Relu(P.Add(Any(), Any())), g, "Relu_3")
    assert not m
    assert m.reason == "Relu_3: input 0 is produced by Tanh (pool1), expected Add"
    m = at(P.Relu(P.Add(Any(), Any()), ), g, "pool1")
    assert m.reason == "pool1 is Tanh, expected Relu"


def test_graph_input_and_constant_are_not_op_outputs():
    g = G(ADD_RELU)
    m = at(P.Relu(P.Add(P.Exp(Any()), Any())), g, "relu")
    assert m.reason == "add: input 0 is graph input 'x', expected Exp"
    m = at(P.Relu(P.Add(Any(), Const()).commutative(False)), g, "relu")
    assert m
    m = at(P.Relu(P.Add(Const(), Any()).commutative(False)), g, "relu")
    assert m.reason == "add: input 0 is graph input 'x', expected a constant"


def test_set_of_ops_and_attribute_predicates():
    g = G("""
  %t: f32[3,2] = Transpose(%x) {perm=[1,0]} @tr
  %y: f32[3,2] = Relu(%t) @relu
  return %y""")
    assert at(P.Relu(Op(("Transpose", "Reshape"), Any()).attrs(perm=[1, 0])), g, "relu")
    m = at(P.Relu(P.Transpose(Any()).attrs(perm=[0, 1])), g, "relu")
    assert m.reason == "tr: attribute perm is [1, 0], expected [0, 1]"

    def is_identity(p):
        """the identity permutation"""
        return list(p) == sorted(p)

    m = at(P.Relu(P.Transpose(Any()).attrs(perm=is_identity)), g, "relu")
    assert m.reason == "tr: attribute perm is [1, 0], expected the identity permutation"
    m = at(P.Relu(Op({"Sigmoid", "Tanh"}, Any())), g, "relu")
    assert m.reason == "relu: input 0 is produced by Transpose (tr), expected one of Sigmoid, Tanh"


def test_attribute_predicate_sees_spec_defaults():
    g = G("""
  const %w: f32[4,3,1,1] = digest:0000000000000000
  %y: f32[1,4,2,2] = Conv(%x, %w) @conv
  return %y""", "%x: f32[1,3,2,2]")
    assert at(P.Conv(Any(), Const()).attrs(group=1, auto_pad="NOTSET"), g, "conv")
    assert at(P.Conv(Any(), Const()).attrs(group=2), g, "conv").reason == "conv: attribute group is 1, expected 2"


def test_const_value_with_tolerance():
    g = G("""
  const %c: f32[3] = [0.5, 0.5000001, 0.5]
  %y: f32[2,3] = Mul(%x, %c) @mul
  return %y""")
    assert at(P.Mul(Any(), Const(0.5, atol=1e-6)), g, "mul")
    m = at(P.Mul(Any(), Const(0.5)), g, "mul")
    assert not m and "expected the constant 0.5" in m.reason and "'c'" in m.reason
    m = at(P.Mul(Any(), Const(2.0, rtol=0.1)), g, "mul")
    assert not m


def test_const_from_propagated_shape_value():
    g = ir.Graph()
    b = ir.Builder(g)
    x = g.add_input("x", ir.TensorType(ir.DType.f32, (2, 3)))
    s = b.Shape(x, name="shape")
    y = b.Reshape(x, s, name="reshape")
    assert not P.Reshape(Any(), Const()).match(y, g)
    m = P.Reshape(Any(), Const(known=True).named("s")).match(y, g)
    assert m and m.s is s


def test_alternatives_first_match_wins_and_backtracks():
    g = G("""
  %t: f32[2,3] = Tanh(%x) @tanh
  %y: f32[2,3] = Relu(%t) @relu
  return %y""")
    pat = P.Relu(OneOf(P.Exp(Any("v")), P.Tanh(Any("v")), name="act"))
    m = at(pat, g, "relu")
    assert m and m.act is g.value("t") and m.v is g.inputs[0] and m.tanh is g.node("tanh") and m.exp is None


def test_optional_input_absent_and_present():
    body = """
  const %w: f32[4,3,1,1] = digest:0000000000000000
  const %b: f32[4] = [0.0, 1.0, 2.0, 3.0]
  %y: f32[1,4,2,2] = Conv(%x, %w{}) @conv
  return %y"""
    pat = P.Conv(x=Any(), w=Const(), b=Optional(Const()))
    g1 = G(body.replace("{}", ""), "%x: f32[1,3,2,2]")
    g2 = G(body.replace("{}", ", %b"), "%x: f32[1,3,2,2]")
    m1, m2 = at(pat, g1, "conv"), at(pat, g2, "conv")
    assert m1 and m1.b is None and "b" not in m1
    assert m2 and m2.b is g2.constants["b"] and "b" in m2
    # a pattern listing fewer inputs does not drop the bias silently
    m = at(P.Conv(Any(), Const()), g2, "conv")
    assert m.reason == "conv: has input 2 ('b'), the pattern expects at most 2 inputs"


def test_optional_node_between_two_ops():
    with_bias = G("""
  const %w: f32[3,3] = digest:0000000000000000
  const %bias: f32[3] = [1.0, 2.0, 3.0]
  %m: f32[2,3] = MatMul(%x, %w) @mm
  %s: f32[2,3] = Add(%bias, %m) @add
  %y: f32[2,3] = Relu(%s) @relu
  return %y""")
    without = G("""
  const %w: f32[3,3] = digest:0000000000000000
  %m: f32[2,3] = MatMul(%x, %w) @mm
  %y: f32[2,3] = Relu(%m) @relu
  return %y""")
    pat = P.Relu(P.Add(P.MatMul(Any("a"), Const(name="w")), Const(name="bias")).optional())
    m = at(pat, with_bias, "relu")
    assert m and m.add is with_bias.node("add") and m.bias.name == "bias" and m.matmul.name == "mm"
    m = at(pat, without, "relu")
    assert m and m.add is None and m.bias is None and m.matmul.name == "mm"
    assert [n.name for n in m.nodes] == ["mm", "relu"]


def test_commutative_operands_without_enumeration():
    g = G("""
  const %c: f32[] = 1.0
  %a: f32[2,3] = Add(%c, %x) @add
  %m: f32[2,3] = Mul(%a, %x) @mul
  %s: f32[2,3] = Sub(%c, %x) @sub
  return %m, %s""")
    m = at(P.Add(x=Any(), c=Const()), g, "add")
    assert m and m.x is g.inputs[0] and m.c.name == "c"
    assert at(P.Mul(Any("x"), P.Add(Any(), Const())), g, "mul")    # both Mul and Add swapped
    m = at(P.Sub(x=Any(), c=Const()), g, "sub")                    # Sub does not commute
    assert m.reason == "sub: input 1 is graph input 'x', expected a constant"
    assert not at(P.Add(x=Any(), c=Const()).commutative(False), g, "add")


def test_dtype_shape_rank_predicates():
    g = G(ADD_RELU)
    assert at(P.Relu(Any().dtype("f32").shape((None, 3)).rank(2)), g, "relu")
    m = at(P.Relu(Any().dtype(ir.DType.f16)), g, "relu")
    assert m.reason == "relu: input 0 ('a') has f32, expected dtype f16"
    m = at(P.Relu(Any().shape((2, 4))), g, "relu")
    assert m.reason == "relu: input 0 ('a') has [2, 3], expected shape [2,4]"
    m = at(P.Relu(P.Add(Any(), Any()).rank(4)), g, "relu")
    assert m.reason == "add: output 'a' has 2, expected rank 4"
    m = at(P.Relu(Any().shape(lambda s: s[-1] % 2 == 0)), g, "relu")
    assert not m and "shape satisfying" in m.reason


def test_single_use_fails_with_other_consumer_or_graph_output():
    pat = P.Relu(P.Add(Any(), Const()).single_use())
    g = G(ADD_RELU)
    assert at(pat, g, "relu")
    g = G("""
  const %c: f32[] = 1.0
  %a: f32[2,3] = Add(%x, %c) @add
  %y: f32[2,3] = Relu(%a) @relu
  %z: f32[2,3] = Exp(%a) @exp
  return %y, %z""")
    assert at(pat, g, "relu").reason == "add: output 'a' has another consumer: exp (Exp)"
    g = G(ADD_RELU.replace("return %y", "return %y, %a"))
    assert at(pat, g, "relu").reason == "add: output 'a' is a graph output, so it must stay"


def test_single_use_allows_consumers_inside_the_match():
    # t feeds both Exp and Mul, both in the pattern: a DAG, not a chain
    g = G("""
  const %c: f32[] = 1.0
  %t: f32[2,3] = Add(%x, %c) @add
  %e: f32[2,3] = Exp(%t) @exp
  %y: f32[2,3] = Mul(%t, %e) @mul
  return %y""")
    t = P.Add(Any("x"), Const()).single_use()
    m = at(P.Mul(t, P.Exp(t)), g, "mul")
    assert m and [n.name for n in m.nodes] == ["add", "exp", "mul"]


def test_dag_binding_conflicts():
    g = G("""
  %t: f32[2,3] = Tanh(%x) @tanh
  %u: f32[2,3] = Tanh(%w) @tanh2
  %y: f32[2,3] = Mul(%x, %t) @same
  %z: f32[2,3] = Mul(%x, %u) @different
  return %y, %z""", "%x: f32[2,3], %w: f32[2,3]")
    X = Any()
    pat = P.Mul(X, P.Tanh(X))                 # one pattern object twice: one value
    assert at(pat, g, "same")
    m = at(pat, g, "different")
    assert not m and "already bound to 'x'" in m.reason and "'w'" in m.reason
    named = P.Mul(Any("v"), P.Tanh(Any("v")))  # one name twice: one value
    assert at(named, g, "same") and not at(named, g, "different")
    m = at(P.Add(Any("v"), Any("v")), G("%y: f32[2,3] = Add(%x, %w) @add\n return %y",
                                        "%x: f32[2,3], %w: f32[2,3]"), "add")
    assert "'v' is already bound" in m.reason


def test_pattern_with_two_outputs():
    g = G("""
  %t: f32[2,3] = Tanh(%x) @tanh
  %a: f32[2,3] = Relu(%t) @relu
  %b: f32[2,3] = Neg(%t) @neg
  %c: f32[2,3] = Neg(%x) @neg_x
  return %a, %b, %c""")
    T = P.Tanh(Any("x"))
    m = at((P.Relu(T), P.Neg(T)), g, "relu")
    assert m and m.outputs == [g.value("a"), g.value("b")] and m.neg.name == "neg"
    m = at((P.Relu(T), P.Exp(T)), g, "relu")
    assert not m


def test_default_node_names_only_when_unique():
    g = G("""
  %t: f32[2,3] = Tanh(%x) @t1
  %u: f32[2,3] = Tanh(%t) @t2
  return %u""")
    m = at(P.Tanh(P.Tanh(Any())), g, "t2")
    assert m and "tanh" not in m.captures        # "tanh" would be ambiguous
    m = at(P.Tanh(P.Tanh(Any()).named("inner")), g, "t2")
    assert m.inner.name == "t1"


def test_op_input_must_be_pattern():
    with pytest.raises(TypeError, match="not a Pattern"):
        P.Relu("x")
    with pytest.raises(ValueError, match="two-input"):
        P.Relu(Any()).commutative()


def test_a_sub_pattern_shared_by_two_rules_keeps_each_rules_default_names():
    # issue 9, defect 8: default capture names used to be written onto the shared object, so
    # the rule that named it last decided what the other rule's match was called
    g = G("""
  %a: f32[2,3] = Exp(%x) @e1
  %b: f32[2,3] = Exp(%a) @e2
  %y: f32[2,3] = Relu(%b) @relu
  return %y""")
    shared = P.Exp(Any("x"))
    one = P.Relu(shared)                   # Exp is unique here: captured as m.exp
    two = P.Relu(P.Exp(shared))            # two Exps: neither gets a default name
    assert one.names() == ["relu", "exp", "x"]
    assert two.names() == ["relu", "x"]
    assert one.names() == ["relu", "exp", "x"]        # unchanged after the other rule named it
    m1 = at(one, g, "relu")
    assert m1.exp is g.node("e2") and m1.x is g.value("a")
    m2 = at(two, g, "relu")
    assert m2.x is g.inputs[0] and "exp" not in m2.captures
    m1 = at(one, g, "relu")                # matching the other rule in between changes nothing
    assert m1.exp is g.node("e2")
    assert not hasattr(shared, "_default_name") and "_declared" not in vars(one)
