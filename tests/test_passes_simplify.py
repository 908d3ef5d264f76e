"""Identity elimination and Transpose/Reshape chains (compiler/passes/simplify.py): each rule
fires, does not fire where it must not, and keeps the numbers (against onnxruntime)."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from tensorfuse.compiler.passes.simplify import SIMPLIFY_RULES, simplify
from tensorfuse.compiler.rewrite import apply_rules
from oracle import assert_matches_ort, rand
from passes_util import G, model, needs_ops, ops_of


def run(g, rules=SIMPLIFY_RULES):
    log = []
    apply_rules(g, rules, log=log)
    return [a.rule for a in log]


@needs_ops("Identity")
def test_identity_removed_graph_output_keeps_its_name():
    g = G("""
  %a: f32[2,3] = Identity(%x) @id1
  %y: f32[2,3] = Relu(%a) @relu
  %z: f32[2,3] = Identity(%y) @id2
  return %z""")
    g.output_names = ["z"]
    assert run(g) == ["RemoveIdentity", "RemoveIdentity"]
    assert ops_of(g) == ["Relu"] and g.outputs == [g.value("y")] and g.output_names == ["z"]


@needs_ops("Identity")
def test_identity_model_matches_onnxruntime():
    m = model("""agraph (float[2,3] x) => (float[2,3] z, float[2,3] w) {
        a = Identity(x)
        y = Relu(a)
        z = Identity(y)
        w = Identity(x)
    }""")
    assert_matches_ort(m, {"x": rand(2, 3)}, opt_levels=(0, 1))
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    assert [i.name for i in mod.output_info] == ["z", "w"]


@needs_ops("Dropout")
def test_dropout_in_inference_removed_and_training_kept():
    m = model("""agraph (float[2,3] x) => (float[2,3] y, bool[2,3] mask) {
        y, mask = Dropout(x)
    }""")
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    assert [a.rule for a in mod.rewrite_log] == ["RemoveInferenceDropout"] and mod.graph.nodes == []
    assert_matches_ort(m, {"x": rand(2, 3)}, opt_levels=(0, 1))
    g = G("""
  const %r: f32[] = 0.0
  const %t: bool[] = true
  %y: f32[2,3] = Dropout(%x, %r, %t) @drop
  return %y""")
    assert run(g) == []      # training mode: left to the op (which allows only ratio 0)
    [why] = tensorfuse.explain(g, "RemoveInferenceDropout", quiet=True)
    assert why.reason == "drop: input 2 ('t') is True, expected the constant False"


@needs_ops("Cast")
def test_cast_to_same_type_removed_other_casts_kept():
    g = G("""
  %a: f32[2,3] = Cast(%x) {to=1} @same
  %b: i64[2,3] = Cast(%a) {to=7} @other
  return %b""")
    assert run(g) == ["RemoveSameTypeCast"] and ops_of(g) == ["Cast"]


def test_noop_reshape_like_ops_removed():
    g = G("""
  const %s: i64[2] = [2, -1]
  const %t: i64[2] = [1, 3]
  %a: f32[2,3] = Reshape(%x, %s) @r
  %b: f32[2,3] = Flatten(%a) {axis=1} @f
  %c: f32[2,3] = Expand(%b, %t) @e
  %y: f32[2,3] = Relu(%c) @relu
  return %y""")
    assert run(g) == ["RemoveNoopReshape"] * 3 and ops_of(g) == ["Relu"]


def test_shape_changing_reshape_kept():
    g = G("""
  const %s: i64[1] = [6]
  %a: f32[6] = Reshape(%x, %s) @r
  return %a""")
    assert run(g) == []


@pytest.mark.parametrize("p1,p2", [([1, 0, 2], [1, 0, 2]), ([2, 0, 1], [1, 2, 0]), ([0, 2, 1], [2, 0, 1]),
                                   ([1, 2, 0], [1, 2, 0]), (None, [0, 2, 1])])
def test_transpose_pairs_compose(p1, p2):
    a1 = "" if p1 is None else f"<perm = {p1}>"
    q = [(list(range(3))[::-1] if p1 is None else p1)[j] for j in p2]
    out = ",".join(str((2, 3, 4)[i]) for i in q)
    m = model(f"""agraph (float[2,3,4] x) => (float[{out}] y) {{
        t = Transpose{a1}(x)
        y = Transpose<perm = {p2}>(t)
    }}""")
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    if q == [0, 1, 2]:
        assert mod.graph.nodes == []
    else:
        assert [(n.op, n.attrs["perm"]) for n in mod.graph.nodes] == [("Transpose", q)]
    assert [a.rule for a in mod.rewrite_log] == ["ComposeTransposes"]
    assert_matches_ort(m, {"x": rand(2, 3, 4)}, opt_levels=(0, 1))


def test_identity_transpose_removed_and_others_kept():
    g = G("""
  %a: f32[2,3] = Transpose(%x) {perm=[0,1]} @ident
  %b: f32[3,2] = Transpose(%a) {perm=[1,0]} @swap
  return %b""")
    assert run(g, [r for r in SIMPLIFY_RULES if r.__name__ == "RemoveIdentityTranspose"]) == \
        ["RemoveIdentityTranspose"]
    assert [n.name for n in g.nodes] == ["swap"]


def test_reshape_chains_collapse():
    m = model("""agraph (float[2,3,4] x) => (float[4,6] y) {
        s1 = Constant<value = int64[2] {6, 4}>()
        a = Reshape(x, s1)
        f = Flatten<axis = 1>(a)
        ax = Constant<value = int64[1] {0}>()
        u = Unsqueeze(f, ax)
        s2 = Constant<value = int64[2] {4, -1}>()
        y = Reshape(u, s2)
    }""")
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    assert ops_of(mod.graph) == ["Reshape"]
    assert mod.graph.nodes[0].inputs[0] is mod.graph.inputs[0]
    assert mod.graph.nodes[0].inputs[1].data.tolist() == [4, 6]
    assert_matches_ort(m, {"x": rand(2, 3, 4)}, opt_levels=(0, 1))


def test_reshape_with_another_consumer_stays_but_chain_still_collapses():
    g = G("""
  const %s1: i64[1] = [6]
  const %s2: i64[2] = [3, 2]
  %a: f32[6] = Reshape(%x, %s1) @r1
  %b: f32[3,2] = Reshape(%a, %s2) @r2
  %e: f32[6] = Exp(%a) @exp
  return %b, %e""")
    assert run(g) == ["CollapseReshapes"]
    assert ops_of(g) == ["Reshape", "Reshape", "Exp"]
    assert all(n.inputs[0] is g.inputs[0] for n in g.nodes if n.op == "Reshape")


def test_simplify_returns_whether_it_changed():
    g = G("""
  %a: f32[2,3] = Transpose(%x) {perm=[0,1]} @ident
  return %a""")
    assert simplify(g) and not simplify(g)
    assert g.outputs == g.inputs
    np.testing.assert_equal(len(g.nodes), 0)
