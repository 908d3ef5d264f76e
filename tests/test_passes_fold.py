"""Constant folding (compiler/passes/fold.py)."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from tensorfuse.compiler.passes import PassError, fold_constants
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
  return %y""".replace("digest:0", "digest:" + __import__("tensorfuse.ir.text", fromlist=["x"]).array_digest(w)),
        "%x: f32[2,64]", {"w": w})
    assert fold_constants(g, max_bytes=16)            # output bytes == input bytes
    np.testing.assert_array_equal(g.constants["wt"].data, w.T)


def test_error_names_pass_and_node(monkeypatch):
    g = G("""
  const %a: f32[] = 1.0
  %s: f32[] = Exp(%a) @Exp_12
  return %s""")
    g.value("s").known = None      # else folding takes the value propagated at build time
    import tensorfuse.compiler.passes.fold as fold

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
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    assert [n.op for n in mod.graph.nodes] == ["Reshape"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    got, want = mod.run(x=x), ort_run(m, {"x": x})
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert_matches_ort(m, {"x": x}, opt_levels=(0, 1, 2, 3))


# ----------------------------------------------------------------------------- large weights
# Weights built at run time from constants (ConstantOfShape, Tile ... as in the light model zoo)
# fold whatever their size when only weight positions or other folding nodes read them; an
# activation-sized Expand read by an elementwise op with a runtime input does not.

from onnx import helper  # noqa: E402

import tensorfuse.compiler.passes.fold as fold  # noqa: E402
from tensorfuse.compiler.frontend.onnx import import_onnx  # noqa: E402
from tensorfuse.compiler.passes import eliminate_dead_nodes  # noqa: E402
from tensorfuse.compiler.pipeline import optimize  # noqa: E402
from oracle import rand  # noqa: E402
from tests.fusion_util import graph_model  # noqa: E402

MiB = 1 << 20


def _weight_chain_model(tile: bool = False, bn: bool = False):
    """x[1,256,5,5] -> Conv with W = ConstantOfShape([256,256,3,3], 0.01) * s[256,1,1,1] (2.25 MiB),
    or with ``tile`` W = Tile(ConstantOfShape([128,256,3,3]) (1.125 MiB), [2,1,1,1]) * s;
    ``bn``: a BatchNormalization after the Conv."""
    value = helper.make_tensor("v", 1, [1], [0.01])               # float32 [1]
    shape = [128 if tile else 256, 256, 3, 3]
    inits = {"shape": np.array(shape, np.int64), "s": rand(256, 1, 1, 1, seed=1), "b": rand(256, seed=2)}
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w0"], value=value)]
    if tile:
        inits["reps"] = np.array([2, 1, 1, 1], np.int64)
        nodes.append(helper.make_node("Tile", ["w0", "reps"], ["w1"]))
    nodes += [helper.make_node("Mul", ["w1" if tile else "w0", "s"], ["w"]),
              helper.make_node("Conv", ["x", "w", "b"], ["c" if bn else "y"], pads=[1, 1, 1, 1])]
    if bn:
        inits.update({"g": rand(256, seed=3), "beta": rand(256, seed=4), "m": rand(256, seed=5),
                      "var": rand(256, seed=6, low=0.5, high=2.0)})
        nodes.append(helper.make_node("BatchNormalization", ["c", "g", "beta", "m", "var"], ["y"]))
    x = rand(1, 256, 5, 5, seed=0)
    return graph_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def test_large_constant_weight_chain_folds_whole_and_matches_onnxruntime():
    m, feeds = _weight_chain_model()
    g = import_onnx(m)
    assert ops_of(g) == ["ConstantOfShape", "Mul", "Conv"]
    assert fold_constants(g)
    eliminate_dead_nodes(g)
    assert ops_of(g) == ["Conv"]
    w = g.nodes[0].inputs[1]
    assert w.is_const and w.data.shape == (256, 256, 3, 3) and w.data.nbytes > 2 * MiB
    assert sorted(g.constants) == ["b", "w"]             # ConstantOfShape's result and s are gone
    assert_matches_ort(m, feeds, rtol=1e-4, atol=1e-5, opt_levels=(0, 1, 2))


def test_large_folded_weight_lets_batchnorm_fold_into_the_conv():
    m, feeds = _weight_chain_model(bn=True)
    g = import_onnx(m)
    optimize(g, 2, disabled_rules=["fuse_ops"])
    assert ops_of(g) == ["Conv"]
    assert_matches_ort(m, feeds, rtol=1e-4, atol=1e-5, opt_levels=(2,))


def test_large_expand_read_with_a_runtime_input_is_not_folded():
    # 4 MiB, activation-shaped: Add broadcasts the scalar in its kernel for nothing
    g = G("""
  const %one: f32[] = 1.0
  const %shape: i64[2] = [1024, 1024]
  %big: f32[1024,1024] = Expand(%one, %shape) @expand
  %y: f32[1024,1024] = Add(%big, %x) @add
  return %y""", "%x: f32[1024,1024]")
    assert not fold_constants(g)
    assert ops_of(g) == ["Expand", "Add"]
    # nor through a node that folds only if its input does: Mul(Expand, 2) is as large
    g = G("""
  const %one: f32[] = 1.0
  const %two: f32[] = 2.0
  const %shape: i64[2] = [1024, 1024]
  %big: f32[1024,1024] = Expand(%one, %shape) @expand
  %big2: f32[1024,1024] = Mul(%big, %two) @mul
  %y: f32[1024,1024] = Add(%big2, %x) @add
  %z: f32[1024,1024] = MatMul(%x, %big) @mm
  return %y, %z""", "%x: f32[1024,1024]")
    assert not fold_constants(g)
    assert ops_of(g) == ["Expand", "Mul", "Add", "MatMul"]
    # nor when it is a graph output
    g = G("""
  const %one: f32[] = 1.0
  const %shape: i64[2] = [1024, 1024]
  %big: f32[1024,1024] = Expand(%one, %shape) @expand
  %y: f32[2,1024] = MatMul(%x, %big) @mm
  return %y, %big""", "%x: f32[2,1024]")
    assert not fold_constants(g)
    assert ops_of(g) == ["Expand", "MatMul"]


def test_large_expand_to_a_matmul_weight_folds():
    g = G("""
  const %one: f32[] = 1.0
  const %shape: i64[2] = [1024, 1024]
  %big: f32[1024,1024] = Expand(%one, %shape) @expand
  %y: f32[2,1024] = MatMul(%x, %big) @mm
  return %y""", "%x: f32[2,1024]")
    assert fold_constants(g)
    assert ops_of(g) == ["MatMul"] and g.constants["big"].data.shape == (1024, 1024)


def test_expand_onnx_model_keeps_broadcasting_and_matches_onnxruntime():
    x = rand(1, 16, 128, 128, seed=3)                               # 1 MiB; Expand's result 4 MiB
    inits = {"c": rand(1, 1, 1, 1, seed=4), "shape": np.array([4, 16, 128, 128], np.int64)}
    m = graph_model([helper.make_node("Expand", ["c", "shape"], ["e"]), helper.make_node("Add", ["e", "x"], ["y"])],
                    {"x": x}, ["y"], inits)
    g = import_onnx(m)
    optimize(g, 2, disabled_rules=["fuse_ops"])
    assert "Expand" in ops_of(g) and not any(v.data.nbytes > MiB for v in g.constants.values())
    assert_matches_ort(m, {"x": x}, opt_levels=(2,))


def test_growth_cap_counts_folded_bytes_minus_dead_inputs():
    m, _ = _weight_chain_model(tile=True)    # ConstantOfShape 1.125 MiB -> Tile 2.25 MiB -> Mul -> Conv
    g = import_onnx(m)
    assert ops_of(g) == ["ConstantOfShape", "Tile", "Mul", "Conv"]
    assert not fold_constants(g, max_growth=1 * MiB)                # not even ConstantOfShape's 1.125 MiB
    assert ops_of(g) == ["ConstantOfShape", "Tile", "Mul", "Conv"]
    assert fold_constants(g, max_growth=2 * MiB)                    # 1.125 + (2.25 - 1.125) > 2: Tile stays
    assert ops_of(g) == ["Tile", "Mul", "Conv"]
    g = import_onnx(m)
    assert fold_constants(g, max_growth=2.5 * MiB)                  # 2.25 MiB net: the 1.125 MiB died
    assert ops_of(g) == ["Conv"]


@pytest.mark.parametrize("cap_mib", [1, 2])
def test_small_growth_cap_still_compiles_to_the_right_values(monkeypatch, cap_mib):
    m, feeds = _weight_chain_model(tile=True)
    monkeypatch.setattr(fold, "MAX_FOLD_GROWTH_BYTES", cap_mib * MiB)   # what the pipeline's calls use
    g = import_onnx(m)
    optimize(g, 2, disabled_rules=["fuse_ops"])
    assert "Tile" in ops_of(g) and ("ConstantOfShape" in ops_of(g)) == (cap_mib == 1)
    assert_matches_ort(m, feeds, rtol=1e-4, atol=1e-5, opt_levels=(1, 2), cache=False)


def _light(name):
    import os

    import onnx
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not in this onnx wheel")
    return onnx.load(path)


@pytest.mark.parametrize("name", ["resnet50", "inception_v2"])
def test_light_models_weights_built_by_constantofshape_fold(name):
    # their weights are ConstantOfShape nodes, up to 9 MiB each (tests/test_models.py compares
    # the compiled models with onnxruntime)
    g = import_onnx(_light(name))
    optimize(g, 2)
    assert "ConstantOfShape" not in ops_of(g)
    users = g.users()
    for n in g.nodes:
        if n.op == "BatchNormalization":
            # the light models' weights are all equal, so CSE merges parallel Convs of one input:
            # a Conv read by several BatchNormalizations keeps them (inception_v2: 2 Convs, 6 BNs)
            assert all(v.is_const for v in n.inputs[1:]) and len(users[n.inputs[0]]) > 1
    if name == "resnet50":
        assert "BatchNormalization" not in ops_of(g)
