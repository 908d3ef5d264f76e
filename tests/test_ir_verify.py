"""The graph verifier: each kind of problem is found and names the node and op; graph_diff."""
import numpy as np
import pytest

from tensorfuse import ir
from tensorfuse.ir import registry
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.registry import OpDef, OpPatternKind, ShapeError
from tensorfuse.ir.text import parse_graph, print_graph
from tensorfuse.ir.types import TensorType
from tensorfuse.ir.verify import VerifyError, graph_diff, verify_graph


def T(text: str) -> TensorType:
    return TensorType.parse(text)


def problems(g: Graph) -> list[str]:
    with pytest.raises(VerifyError) as info:
        verify_graph(g)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(f"graph {g.name}: {len(info.value.problems)} problem")
    return info.value.problems


def relu_add() -> Graph:
    g = Graph("main")
    b = Builder(g)
    x = g.add_input("x", T("f32[2,3]"))
    c = b.const(np.ones(3, np.float32), "c")
    r = b.Relu(x, name="r")
    g.outputs = [b.Add(r, c, name="add")]
    return g


def test_valid_graph_passes():
    g = relu_add()
    verify_graph(g)
    ir.verify_graph(g)


def test_parsed_text_verifies():
    g = parse_graph("""\
graph main(%x: f32[2,3], %"onnx::b": f32[3]) {
  const %c: f32[] = 0.5
  %r: f32[2,3] = Relu(%x) @relu
  %s: f32[2,3] = Add(%r, %"onnx::b") @add_0
  %t: f32[2,3] = Add(%s, %c)
  return %t, %r
}
""")
    verify_graph(g)


def test_use_before_definition():
    g = relu_add()
    g.nodes.reverse()
    (p,) = problems(g)
    assert p == "node add (Add): input 0 %r is used before it is defined (by node r (Relu))"


def test_undefined_value():
    g = relu_add()
    stray = Value("stray", T("f32[3]"))
    g.nodes[1].inputs[1] = stray
    (p,) = problems(g)
    assert p == "node add (Add): input 1 %stray is not defined in the graph"


def test_value_defined_twice():
    g = relu_add()
    x = g.inputs[0]
    y = g.nodes[0].outputs[0]
    g.nodes.insert(1, Node("Relu", [x], [y], name="again"))   # y now claims two producers
    ps = problems(g)
    assert "node again (Relu): value %r is defined twice (also by node r (Relu))" in ps
    assert "node r (Relu): output %r has another producer (node again (Relu))" in ps


def test_name_used_twice():
    g = relu_add()
    g.nodes[1].outputs[0].name = "r"
    (p,) = problems(g)
    assert p == "node add (Add): name %r is used twice (also by node r (Relu))"


def test_output_not_defined():
    g = relu_add()
    g.outputs.append(Value("ghost", T("f32[1]")))
    assert problems(g) == ["graph output %ghost is not defined"]


def test_output_type_disagrees_with_inference():
    g = parse_graph("""\
graph main(%x: f32[2]) {
  %y: f32[3] = Relu(%x) @r
  %z: i64[2] = Relu(%x)
  return %y, %z
}
""")
    assert problems(g) == [
        "node r (Relu): output %y is f32[3] but inference gives f32[2]",
        "node (unnamed) (Relu): output %z is i64[2] but inference gives f32[2]",
    ]


def test_inference_failure_is_reported():
    g = parse_graph("graph main(%x: f32[2], %w: f32[3]) {\n  %y: f32[3] = Add(%x, %w) @a\n  return %y\n}\n")
    (p,) = problems(g)
    assert p.startswith("node a (Add): type inference failed:")


def test_unknown_op():
    g = parse_graph("graph main(%x: f32[2]) {\n  %y: f32[2] = nowhere::Frobnicate(%x) @f\n"
                    "  %z: f32[2] = NoSuchOp(%y)\n  return %z\n}\n")
    assert problems(g) == ["node f (nowhere::Frobnicate): op nowhere::Frobnicate is not in the registry",
                           "node (unnamed) (NoSuchOp): op NoSuchOp is not in the registry"]


def test_constant_problems():
    g = relu_add()
    c = g.constants["c"]
    c.data = np.ones(4, np.float32)
    assert problems(g) == ["constant %c: type f32[3] but its data is f32[4]"]
    c.data = None
    assert problems(g) == ["constant %c has no data"]
    c.data = np.ones(3, np.float32)
    g.constants = {"other": c}
    assert problems(g) == ["constant %c is keyed by another name, 'other'"]


def test_every_problem_is_listed_at_once():
    g = relu_add()
    g.nodes.reverse()
    g.outputs.append(Value("ghost", T("f32[1]")))
    g.nodes.append(Node("Unknown", [g.inputs[0]], [Value("u", T("f32[2,3]"))], name="u"))
    ps = problems(g)
    assert len(ps) == 3
    assert any("used before" in p for p in ps) and any("ghost" in p for p in ps)
    assert any("node u (Unknown)" in p for p in ps)


def test_check_types_false_skips_inference():
    g = parse_graph("graph main(%x: f32[2]) {\n  %y: f32[3] = Relu(%x)\n  return %y\n}\n")
    verify_graph(g, check_types=False)


# -- ops whose inference reads compile-time values, registered only for these tests ----------
def _twice_infer(node):
    return [node.inputs[0].type]


def _twice_ref(node, inputs):
    return [inputs[0] * 2]


def _reshape_to_infer(node):
    shape = node.inputs[1].const_value()
    if shape is None:
        raise ShapeError("target shape is not known at compile time")
    return [TensorType(node.inputs[0].dtype, tuple(int(d) for d in shape))]


def _reshape_to_ref(node, inputs):
    return [inputs[0].reshape(inputs[1])]


@pytest.fixture
def shape_ops(monkeypatch):
    for name, infer, ref in (("Twice", _twice_infer, _twice_ref),
                             ("ReshapeTo", _reshape_to_infer, _reshape_to_ref)):
        od = OpDef(name, OpPatternKind.INJECTIVE, infer, ref, domain="verify_test")
        monkeypatch.setitem(registry._REGISTRY, ("verify_test", name), od)


SHAPE_TEXT = """\
graph main(%x: f32[24]) {
  const %s: i64[2] = [2, 3]
  %s2: i64[2] = verify_test::Twice(%s) @twice
  %y: f32[4,6] = verify_test::ReshapeTo(%x, %s2) @reshape
  return %y
}
"""


def test_inference_sees_values_computed_at_compile_time(shape_ops):
    g = parse_graph(SHAPE_TEXT)
    verify_graph(g)
    assert g.value("s2").known is None          # the verifier leaves the graph as it was
    assert print_graph(g) == SHAPE_TEXT
    bad = parse_graph(SHAPE_TEXT.replace("f32[4,6]", "f32[6,4]"))
    assert problems(bad) == ["node reshape (verify_test::ReshapeTo): output %y is f32[6,4] "
                             "but inference gives f32[4,6]"]


def test_known_values_already_present_are_kept(shape_ops):
    g = parse_graph(SHAPE_TEXT)
    s2 = g.value("s2")
    s2.known = np.array([4, 6])
    verify_graph(g)
    assert s2.known.tolist() == [4, 6]


def test_stand_in_constants_give_no_known_values(shape_ops):
    text = SHAPE_TEXT.replace("const %s: i64[2] = [2, 3]", "const %s: i64[2] = digest:0123456789abcdef")
    g = parse_graph(text)
    (p,) = problems(g)      # zeros standing in for unknown data must not become a shape
    assert "node reshape" in p and "not known at compile time" in p


# -- graph_diff -------------------------------------------------------------------------------
def test_graph_diff_equal_copies():
    g = relu_add()
    assert graph_diff(g, g.copy()) == []
    consts = {k: v.data for k, v in g.constants.items()}
    assert graph_diff(g, parse_graph(print_graph(g), consts)) == []


@pytest.mark.parametrize("change, expect", [
    (lambda g: setattr(g, "name", "other"), "graph name"),
    (lambda g: g.nodes[0].attrs.update(alpha=1), "attrs"),
    (lambda g: setattr(g.constants["c"], "data", np.full(3, 2, np.float32)), "constant %c: data differs"),
    (lambda g: setattr(g.nodes[0], "domain", "x"), "op"),
    (lambda g: g.nodes[1].inputs.reverse(), "inputs"),
    (lambda g: setattr(g.nodes[1].outputs[0], "type", T("f32[3]")), "outputs"),
    (lambda g: g.outputs.append(g.inputs[0]), "outputs"),
])
def test_graph_diff_finds_changes(change, expect):
    g = relu_add()
    g2 = g.copy()
    change(g2)
    diff = graph_diff(g, g2)
    assert len(diff) == 1 and expect in diff[0]


def test_graph_diff_is_strict_about_attribute_kinds():
    def one(value):
        g = Graph("g")
        x = Value("x", T("f32[1]"))
        g.inputs, g.outputs = [x], [x]
        g.nodes = [Node("Op", [x], [Value("y", T("f32[1]"))], {"a": value})]
        return g
    assert graph_diff(one(1), one(1.0)) and graph_diff(one(1), one(True))
    assert graph_diff(one([1]), one(np.array([1])))
    assert graph_diff(one(float("nan")), one(float("nan"))) == []
    assert graph_diff(one((1, 2)), one([1, 2])) == []
