"""export_onnx (compiler/export.py): the optimised graph back to valid ONNX."""
from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

import tensorfuse
import tensorfuse
from tensorfuse import ir
from tensorfuse.compiler.export import to_onnx
from oracle import ort_run, rand
from passes_util import G, model
from test_pipeline import MIXED


def test_optimised_graph_exports_valid_onnx_with_same_results(tmp_path):
    m = model(MIXED)
    mod = tensorfuse.compile(m, opt_level=2, cache=False)
    path = tmp_path / "opt.onnx"
    out = tensorfuse.export_onnx(mod.graph, path)
    onnx.checker.check_model(str(path), full_check=True)
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert [i.name for i in out.graph.input] == ["x", "w"]
    assert len(out.graph.node) == len(mod.graph.nodes)        # z names the Reshape output directly
    feeds = {"x": rand(2, 3, 4), "w": rand(4, 6, seed=1)}
    for a, b in zip(ort_run(onnx.load(str(path)), feeds), ort_run(m, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_outputs_that_are_inputs_constants_or_repeated_get_identity_copies(tmp_path):
    g = G("""
  const %c: f32[] = 2.0
  %y: f32[2,3] = Relu(%x) @relu
  return %y, %x, %c, %y""")
    g.output_names = ["a", "b", "c_out", "d"]
    p = to_onnx(g)
    onnx.checker.check_model(p, full_check=True)
    assert [o.name for o in p.graph.output] == ["a", "b", "c_out", "d"]
    assert [n.op_type for n in p.graph.node] == ["Relu", "Identity", "Identity", "Identity"]
    x = rand(2, 3)
    got = ReferenceEvaluator(p).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], np.maximum(x, 0))
    np.testing.assert_array_equal(got[1], x)
    assert got[2] == np.float32(2.0) and np.array_equal(got[3], got[0])


def test_custom_domain_ops_keep_domain_and_attributes(tmp_path):
    g = ir.Graph("fused")
    b = ir.Builder(g)
    q = g.add_input("q", ir.TensorType(ir.DType.f32, (1, 2, 4, 8)))
    y = b.op("Attention", q, q, q, domain="tensorfuse", scale=0.25, name="attn")
    g.outputs = [y]
    g.output_names = ["out"]
    p = tensorfuse.export_onnx(g, tmp_path / "f.onnx")
    onnx.checker.check_model(p)
    node = p.graph.node[0]
    assert (node.domain, node.op_type, node.name) == ("tensorfuse", "Attention", "attn")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["scale"] == 0.25
    assert {(o.domain, o.version) for o in p.opset_import} >= {("tensorfuse", 1), ("", onnx.defs.onnx_opset_version())}
    # intermediate types are recorded for viewers
    assert p.graph.output[0].type.tensor_type.shape.dim[3].dim_value == 8


def test_attribute_kinds_round_trip():
    g = G("""
  %t: f32[3,2] = Transpose(%x) {perm=[1,0]} @tr
  %s: f32[3,2] = Softmax(%t) {axis=-1} @sm
  return %s""")
    g.node("tr").attrs["perm"] = [np.int64(1), np.int64(0)]
    p = to_onnx(g)
    onnx.checker.check_model(p, full_check=True)
    assert list(p.graph.node[0].attribute[0].ints) == [1, 0]
    assert [vi.name for vi in p.graph.value_info] == ["t"]


# ----------------------------------------------------------------------------- fused ops as local functions
import pytest  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from conftest import shared_model_entries, shared_models_dir  # noqa: E402
from oracle import assert_outputs_depend_on_inputs, model_inputs, other_inputs  # noqa: E402

# (activation node(s) after "y0" -> "out", the op's opset) for every activation the fused ops take
ACTS = {
    "Relu": ([helper.make_node("Relu", ["y0"], ["out"])], 17),
    "Clip": ([helper.make_node("Clip", ["y0", "lo", "hi"], ["out"])], 17),
    "LeakyRelu": ([helper.make_node("LeakyRelu", ["y0"], ["out"], alpha=0.2)], 17),
    "Sigmoid": ([helper.make_node("Sigmoid", ["y0"], ["out"])], 17),
    "HardSigmoid": ([helper.make_node("HardSigmoid", ["y0"], ["out"], alpha=0.3, beta=0.4)], 17),
    "HardSwish": ([helper.make_node("HardSwish", ["y0"], ["out"])], 17),
    "SiLU": ([helper.make_node("Sigmoid", ["y0"], ["sg"]), helper.make_node("Mul", ["y0", "sg"], ["out"])], 17),
    "Tanh": ([helper.make_node("Tanh", ["y0"], ["out"])], 17),
    "Gelu": ([helper.make_node("Gelu", ["y0"], ["out"])], 20),
    "GeluTanh": ([helper.make_node("Gelu", ["y0"], ["out"], approximate="tanh")], 20),
}


def _anchored_model(anchor: str, act: str) -> onnx.ModelProto:
    """x -> Conv(+bias) -> Add(residual r) -> act, or x -> MatMul -> Add(bias) -> act."""
    rng = np.random.default_rng(3)
    acts, opset = ACTS[act]
    inits = [numpy_helper.from_array(np.float32(-0.5), "lo"), numpy_helper.from_array(np.float32(0.7), "hi")]
    if anchor == "Conv":
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                 helper.make_node("Add", ["c", "r"], ["y0"])]
        inits += [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
                  numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
               helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 4, 4])]
        out = [1, 4, 4, 4]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["y0"])]
        inits += [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
                  numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 16])]
        out = [2, 5, 8]
    g = helper.make_graph(nodes + acts, "anchored", ins, [helper.make_tensor_value_info("out", TensorProto.FLOAT, out)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("anchor,act", [("Conv", a) for a in ACTS] + [("MatMul", "Gelu"), ("MatMul", "Relu")])
def test_fused_op_exports_as_a_function_onnxruntime_runs(anchor, act, tmp_path):
    """Each activation of the anchored fused ops, decomposed into standard ops, gives
    onnxruntime's result for the unfused model (rtol 1e-5, atol 1e-5)."""
    m = _anchored_model(anchor, act)
    mod = tensorfuse.compile(m, opt_level=2, cache=False)
    fused = [n for n in mod.graph.nodes if n.domain == "tensorfuse"]
    assert [n.op for n in fused] == [f"Fused{anchor}"] and fused[0].attrs["activation"] == act
    p = tensorfuse.export_onnx(mod.graph, tmp_path / "f.onnx")
    onnx.checker.check_model(str(tmp_path / "f.onnx"), full_check=True)
    (call,) = [n for n in p.graph.node if n.domain == "tensorfuse"]
    (fn,) = [f for f in p.functions if f.name == call.op_type]
    assert all(n.domain == "" for n in fn.node)                 # standard ops only
    feeds = {"x": rand(*[d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim], seed=1)}
    if anchor == "Conv":
        feeds["r"] = rand(1, 4, 4, 4, seed=2)
    want = ort_run(m, feeds)[0]
    np.testing.assert_allclose(ort_run(p, feeds)[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mod.run(**feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_reexport_of_an_export_is_reimported_by_tensorfuse(tmp_path):
    """tensorfuse compiles its own export (the frontend inlines the local functions) to the
    same numbers and the same fused graph."""
    m = _anchored_model("Conv", "HardSigmoid")
    mod = tensorfuse.compile(m, opt_level=2, cache=False)
    tensorfuse.export_onnx(mod.graph, tmp_path / "f.onnx")
    again = tensorfuse.compile(str(tmp_path / "f.onnx"), opt_level=2, cache=False)
    feeds = {"x": rand(1, 3, 8, 8, seed=4), "r": rand(1, 4, 4, 4, seed=5)}
    np.testing.assert_allclose(again.run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-5, atol=1e-5)
    assert [n.qualified_op for n in again.graph.nodes] == [n.qualified_op for n in mod.graph.nodes]


def test_same_bodies_share_one_function():
    g = G("""
  %a: f32[2,8] = tensorfuse::FusedMatMul(%x, %w) {activation="Relu", activation_params=[]} @mm_a
  %b: f32[2,8] = tensorfuse::FusedMatMul(%a, %v) {activation="Relu", activation_params=[]} @mm_b
  %c: f32[2,8] = tensorfuse::FusedMatMul(%b, %v) {activation="Tanh", activation_params=[]} @mm_c
  return %c""", inputs="%x: f32[2,8], %w: f32[8,8], %v: f32[8,8]")
    p = to_onnx(g)
    onnx.checker.check_model(p, full_check=True)
    assert [(n.name, n.op_type) for n in p.graph.node] == [("mm_a", "FusedMatMul"), ("mm_b", "FusedMatMul"),
                                                           ("mm_c", "FusedMatMul_1")]
    assert [f.name for f in p.functions] == ["FusedMatMul", "FusedMatMul_1"]
    x, w, v = rand(2, 8), rand(8, 8, seed=1), rand(8, 8, seed=2)
    want = np.tanh(np.maximum(np.maximum(x @ w, 0) @ v, 0) @ v)
    np.testing.assert_allclose(ort_run(p, {"x": x, "w": w, "v": v})[0], want, rtol=1e-5, atol=1e-5)


_MODELS = shared_model_entries() or [{"file": "<absent>"}]


@pytest.mark.slow
@pytest.mark.parametrize("entry", _MODELS, ids=[e["file"] for e in _MODELS])
def test_every_shared_model_exports_at_o2_and_onnxruntime_matches(entry, tmp_path):
    """Acceptance (issue 11): the O2 graph of each shared model, exported, loads in
    onnxruntime (optimisations off) and gives tensorfuse's outputs (rtol 1e-4, atol 1e-5).
    The compile is a session-cache hit when test_models ran first: then the exported graph is
    the one stored with the cache entry."""
    path = shared_models_dir() / entry["file"]
    if not path.exists():
        pytest.skip("shared models absent")
    mod = tensorfuse.compile(str(path), opt_level=2)
    out = tmp_path / "o2.onnx"
    p = tensorfuse.export_onnx(mod.graph, out)
    assert any(n.domain == "tensorfuse" for n in p.graph.node)         # fused ops are in the file
    feeds = model_inputs(entry, seed=0)
    feeds2 = other_inputs(feeds)
    got, ours = ort_run(str(out), feeds), mod.run(**feeds)
    got2 = ort_run(str(out), feeds2)
    assert_outputs_depend_on_inputs(got, got2, 1e-4, 1e-5, entry["file"])     # else the comparison cannot fail
    assert [o.name for o in p.graph.output] == [o["name"] for o in entry["outputs"]]
    for g, t in zip(got + got2, ours + mod.run(**feeds2)):
        np.testing.assert_allclose(g, t, rtol=1e-4, atol=1e-5)
