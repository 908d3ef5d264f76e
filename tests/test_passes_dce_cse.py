"""Dead-node elimination (compiler/passes/dce.py) and CSE (compiler/passes/cse.py)."""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.passes import eliminate_common_subexpressions as cse
from tensorfuse.compiler.passes import eliminate_dead_nodes as dce
from passes_util import G, ops_of


def test_dce_removes_dead_chains_and_unused_constants():
    g = G("""
  const %c: f32[] = 2.0
  const %unused: f32[] = 3.0
  %a: f32[2,3] = Mul(%x, %c) @dead1
  %b: f32[2,3] = Exp(%a) @dead2
  %y: f32[2,3] = Relu(%x) @live
  return %y""")
    assert dce(g)
    assert ops_of(g) == ["Relu"] and g.constants == {}
    assert not dce(g)


def test_dce_never_removes_graph_outputs_even_intermediate_ones():
    g = G("""
  %a: f32[2,3] = Exp(%x) @e
  %y: f32[2,3] = Relu(%a) @r
  %d: f32[2,3] = Neg(%a) @dead
  return %y, %a""")
    assert dce(g)
    assert ops_of(g) == ["Exp", "Relu"] and g.outputs[1] is g.value("a")


def test_cse_merges_equal_constants_only():
    g = G("""
  const %a: f32[2] = [1.0, 2.0]
  const %b: f32[2] = [1.0, 2.0]
  const %i: i32[2] = [1, 2]
  const %j: i32[2] = [1, 2]
  const %k: f32[2] = [1.0, 2.5]
  const %pz: f32[] = 0.0
  const %nz: f32[] = -0.0
  %y1: f32[2,2] = Add(%x, %a) @add_a
  %y2: f32[2,2] = Add(%x, %b) @add_b
  %y3: f32[2,2] = Add(%x, %k) @add_k
  %z1: f32[2,2] = Mul(%x, %pz) @mz
  %z2: f32[2,2] = Mul(%x, %nz) @mnz
  %s: i32[2] = Add(%i, %j) @ij
  return %y1, %y2, %y3, %z1, %z2, %s""", "%x: f32[2,2]")
    assert cse(g)
    # a==b merged (and then add_b is add_a); i==j merged; k, 0.0 and -0.0 stay apart
    assert sorted(g.constants) == ["a", "i", "k", "nz", "pz"]
    assert g.node("ij").inputs == [g.constants["i"], g.constants["i"]]
    assert ops_of(g) == ["Add", "Add", "Mul", "Mul", "Add"]
    assert g.outputs[0] is g.outputs[1] and g.outputs[3] is not g.outputs[4]


def test_cse_constants_of_different_dtype_or_shape_stay_apart():
    g = G("""
  const %a: f32[2] = [1.0, 1.0]
  const %b: f32[1,2] = [[1.0, 1.0]]
  const %c: f64[2] = [1.0, 1.0]
  return %a, %b, %c""")
    assert not cse(g) and len(g.constants) == 3


def test_cse_merges_nodes_with_equal_op_attrs_inputs_and_collapses_chains():
    g = G("""
  %t1: f32[3,2] = Transpose(%x) {perm=[1,0]} @t1
  %t2: f32[3,2] = Transpose(%x) {perm=[1,0]} @t2
  %e1: f32[3,2] = Exp(%t1) @e1
  %e2: f32[3,2] = Exp(%t2) @e2
  %y: f32[3,2] = Add(%e1, %e2) @add
  %s1: f32[2,3] = Softmax(%x) {axis=1} @s1
  %s2: f32[2,3] = Softmax(%x) {axis=0} @s2
  return %y, %s1, %s2, %e2""")
    g.output_names = ["y", "s1", "s2", "e2"]
    assert cse(g)
    assert [n.name for n in g.nodes] == ["t1", "e1", "add", "s1", "s2"]
    assert g.node("add").inputs == [g.value("e1"), g.value("e1")]
    assert g.outputs[3] is g.value("e1") and g.output_names[3] == "e2"
    assert not cse(g)


def test_cse_treats_numpy_and_python_attribute_scalars_alike():
    g = G("""
  %a: f32[2,3] = LeakyRelu(%x) {alpha=1.0} @a
  %b: f32[2,3] = LeakyRelu(%x) {alpha=1.0} @b
  return %a, %b""")
    g.node("b").attrs["alpha"] = np.float32(1.0)   # the same value as another type: still equal
    assert cse(g)


# ----------------------------------------------------------------------------- OpDef.deterministic
import pytest  # noqa: E402

from tensorfuse.compiler.passes import fold_constants  # noqa: E402
from tensorfuse.ir import registry  # noqa: E402
from tensorfuse.ir.registry import OpDef, OpPatternKind  # noqa: E402


def _draw_ref(node, inputs):          # a random op: each evaluation another value
    return [inputs[0] + np.random.default_rng().standard_normal(inputs[0].shape).astype(inputs[0].dtype)]


@pytest.fixture(params=[False, True], ids=["random", "deterministic"])
def draw_op(request, monkeypatch):
    """A test op cse_test::Draw (x + noise), registered as (not) deterministic."""
    od = OpDef("Draw", OpPatternKind.INJECTIVE, lambda n: [n.inputs[0].type], _draw_ref, domain="cse_test",
               deterministic=request.param)
    monkeypatch.setitem(registry._REGISTRY, ("cse_test", "Draw"), od)
    return request.param


def test_cse_and_fold_read_opdef_deterministic(draw_op):
    # issue 9, defect 8: the fact lives on the OpDef, and CSE reads it as constant folding does
    body = """
  %a: f32[2,3] = cse_test::Draw(%x) @a
  %b: f32[2,3] = cse_test::Draw(%x) @b
  %y: f32[2,3] = Add(%a, %b) @add
  return %y"""
    g = G(body)
    assert cse(g) is draw_op
    assert [n.name for n in g.nodes] == (["a", "add"] if draw_op else ["a", "b", "add"])
    g = G("""
  const %c: f32[2,3] = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
  %d: f32[2,3] = cse_test::Draw(%c) @d
  %y: f32[2,3] = Add(%d, %x) @add
  return %y""")
    fold_constants(g)
    assert ("d" in [n.name for n in g.nodes]) is not draw_op      # a random op never folds
