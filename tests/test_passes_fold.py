"""Constant folding (compiler/passes/fold.py)."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler.passes import PassError, fold_constants
from oracle import assert_matches_ort, ort_run
from passes_util import G, model, ops_of


def test_folds_constant_nodes_keeping_value_names_and_int_dtypes():
    g = G("""
  const %a: i64[3] = [1, 2, 3]
  const %b: i64[] = 10
  %s: i64[3] = Add(%a, %b) @add
  %y: i64[3] = Mul(%s, %x) @mul
  return %y""", "%x: i64[3]")
    assert fold_constants(g)
    assert ops_of(g) == ["Mul"]
    s = g.constants["s"]
    assert s.producer is None and s.data.dtype == np.int64 and s.data.tolist() == [11, 12, 13]
    assert g.nodes[0].inputs[0] is s
    assert not fold_constants(g)


def test_folds_bool_results_exactly():
    g = G("""
  const %a: f32[3] = [1.0, 5.0, 3.0]
  const %b: f32[3] = [2.0, 2.0, 3.0]
  %m: f32[3] = Max(%a, %b) @max
  %s: i64[1] = Shape(%m) {start=0} @shape
  return %m, %s""")
    assert fold_constants(g) and g.nodes == []
    assert g.constants["m"].data.tolist() == [2.0, 5.0, 3.0] and g.constants["m"].data.dtype == np.float32
    assert g.constants["s"].data.dtype == np.int64 and g.constants["s"].data.tolist() == [3]


def test_shape_of_runtime_input_folds_from_static_type():
    g = G("""
  %s: i64[2] = Shape(%x) @shape
  const %i: i64[] = 1
  %d: i64[] = Gather(%s, %i) {axis=0} @gather
  const %ax: i64[1] = [0]
  %u: i64[1] = Unsqueeze(%d, %ax) @unsq
  const %m1: i64[1] = [-1]
  %c: i64[2] = Concat(%m1, %u) {axis=0} @concat
  %y: f32[2,3] = Reshape(%x, %c) @reshape
  return %y""")
    assert fold_constants(g)
    assert ops_of(g) == ["Reshape"] and g.nodes[0].inputs[1].data.tolist() == [-1, 3]


def test_byte_cap_keeps_expanding_nodes():
    g = G("""
  const %one: f32[] = 1.0
  const %shape: i64[2] = [512, 512]
  %big: f32[512,512] = Expand(%one, %shape) @expand
  %y: f32[512,512] = Add(%big, %x) @add
  return %y""", "%x: f32[512,512]")
    assert not fold_constants(g, max_bytes=1 << 16)
    assert ops_of(g) == ["Expand", "Add"]
    assert fold_constants(g, max_bytes=1 << 21)
    assert ops_of(g) == ["Add"] and g.constants["big"].data.shape == (512, 512)


def test_same_size_transform_of_large_weight_folds_under_the_cap():
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    g = G("""
  const %w: f32[64,64] = digest:0
  %wt: f32[64,64] = Transpose(%w) {perm=[1,0]} @tw
  %y: f32[2,64] = MatMul(%x, %wt) @mm
  return %y""".replace("digest:0", "digest:" + __import__("ir.text", fromlist=["x"]).array_digest(w)),
        "%x: f32[2,64]", {"w": w})
    assert fold_constants(g, max_bytes=16)            # output bytes == input bytes
    np.testing.assert_array_equal(g.constants["wt"].data, w.T)


def test_error_names_pass_and_node(monkeypatch):
    g = G("""
  const %a: f32[] = 1.0
  %s: f32[] = Exp(%a) @Exp_12
  return %s""")
    g.value("s").known = None      # else folding takes the value propagated at build time
    import compiler.passes.fold as fold

    def broken(node, ins):
        raise ZeroDivisionError("boom")
    monkeypatch.setattr(fold, "run_reference", broken)
    with pytest.raises(PassError, match=r"pass fold_constants failed at node Exp_12 \(Exp\): ZeroDivisionError: boom"):
        fold_constants(g)


SHAPE_MODEL = """
agraph (float[2,3,4] x) => (float[6,4] y, int64[2] s) {
  shp = Shape(x)
  i0 = Constant<value = int64 {0}>()
  i1 = Constant<value = int64 {1}>()
  d0 = Gather<axis = 0>(shp, i0)
  d1 = Gather<axis = 0>(shp, i1)
  ax = Constant<value = int64[1] {0}>()
  u0 = Unsqueeze(d0, ax)
  u1 = Unsqueeze(d1, ax)
  p = Mul(u0, u1)
  st = Constant<value = int64[1] {2}>()
  en = Constant<value = int64[1] {3}>()
  last = Slice(shp, st, en)
  s = Concat<axis = 0>(p, last)
  y = Reshape(x, s)
}
"""


def test_shape_subgraph_folds_and_matches_onnxruntime():
    m = model(SHAPE_MODEL)
    mod = compiler.compile(m, opt_level=1, cache=False)
    assert [n.op for n in mod.graph.nodes] == ["Reshape"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    got, want = mod.run(x=x), ort_run(m, {"x": x})
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert_matches_ort(m, {"x": x}, opt_levels=(0, 1, 2, 3))
