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
