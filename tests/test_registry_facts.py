"""Facts about ops have one home, the op registry (``ir.registry.OpDef``; issue 20 item 2), and
the passes that used to keep their own lists read them from there: the pattern language's
commutative ops (``OpDef.commutative``), simplify's reshapes (``OpDef.reshape_only``) and the
anchors of explain's fusion report (``OpDef.fusion_anchor``). Each flag is checked against the
op's own meaning (its numpy reference) and the behaviour that reads it against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import tensorfuse
from tensorfuse import ir
from tensorfuse.compiler.pattern import Any, Const, Op, P, match_at
from tensorfuse.compiler.passes.simplify import RESHAPES
from tensorfuse.ir.registry import all_ops, get_op, op_names, run_reference
from oracle import assert_matches_ort, rand
from passes_util import G, model, ops_of

#: what the pattern language tried both orders of before the flag (compiler/pattern.py), plus
#: the other commutative ONNX ops (Mean, Bitwise*)
COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal",
               "Mean", "BitwiseAnd", "BitwiseOr", "BitwiseXor"}


def _node(op: str, types: list[ir.TensorType]) -> ir.Node:
    ins = [ir.Value(f"in{i}", t) for i, t in enumerate(types)]
    return ir.Node(op, ins, [ir.Value("y", types[0])], {}, op.lower())


def _operands(op: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    dtype = {"And": np.bool_, "Or": np.bool_, "Xor": np.bool_, "BitwiseAnd": np.int32,
             "BitwiseOr": np.int32, "BitwiseXor": np.int32}.get(op, np.float32)
    a = rand(3, 4, dtype=dtype, seed=seed, low=-50, high=50)
    b = rand(1, 4, dtype=dtype, seed=seed + 1, low=-50, high=50)
    if op == "Equal":
        b = a[:1].copy()
        b[0, ::2] += 1
    return a, b


def test_commutative_flags_are_the_pattern_languages_list_and_the_other_commutative_ops():
    assert set(op_names("commutative")) == COMMUTATIVE
    assert not any(o.commutative for o in all_ops() if o.domain)


@pytest.mark.parametrize("op", sorted(COMMUTATIVE))
def test_commutative_op_gives_the_same_result_in_both_orders(op):
    a, b = _operands(op, seed=3)
    ta, tb = (ir.TensorType(ir.DType.from_numpy(x.dtype), x.shape) for x in (a, b))
    y_ab = run_reference(_node(op, [ta, tb]), [a, b])[0]
    y_ba = run_reference(_node(op, [tb, ta]), [b, a])[0]
    assert y_ab.shape == (3, 4)
    np.testing.assert_array_equal(y_ab, y_ba)
    assert len(np.unique(y_ab)) > 1          # the operands were not degenerate


@pytest.mark.parametrize("op", ["Sub", "Div", "Pow", "Less", "Greater", "BitShift"])
def test_non_commutative_ops_are_not_flagged(op):
    assert not get_op(op).commutative


ADD_CONST_FIRST = """
  const %c: f32[] = 1.0
  %r: f32[2,3] = Relu(%x) @relu
  %y: f32[2,3] = Add(%c, %r) @add
  %z: f32[2,3] = Sub(%c, %r) @sub
  return %y, %z"""


def test_pattern_tries_both_orders_of_a_commutative_op_only():
    g = G(ADD_CONST_FIRST)
    m = match_at(P.Add(P.Relu(Any()), c=Const()), g.node("add"), g)
    assert m and m.c is g.constants["c"] and m.relu is g.node("relu")
    assert not match_at(P.Add(P.Relu(Any()), Const()).commutative(False), g.node("add"), g)
    m = match_at(P.Sub(P.Relu(Any()), Const()), g.node("sub"), g)
    assert not m and "expected Relu" in m.reason
    assert P.Add(Any(), Any()).is_commutative() and Op(("Add", "Mul"), Any(), Any()).is_commutative()
    assert not Op(("Add", "Sub"), Any(), Any()).is_commutative()
    assert not P.Add(Any()).is_commutative()


def test_reshape_only_ops_are_simplifys_list_and_keep_row_major_elements():
    assert op_names("reshape_only") == RESHAPES == ("Flatten", "Reshape", "Squeeze", "Unsqueeze")
    x = rand(2, 1, 3, seed=5)
    t = ir.TensorType(ir.DType.f32, x.shape)
    i64 = ir.TensorType(ir.DType.i64, (1,))
    for op, extra in (("Reshape", np.array([3, 2], np.int64)), ("Flatten", None),
                      ("Squeeze", np.array([1], np.int64)), ("Unsqueeze", np.array([0], np.int64))):
        n = _node(op, [t] + ([i64] if extra is not None else []))
        y = run_reference(n, [x] + ([extra] if extra is not None else []))[0]
        assert y.shape != x.shape and y.ravel().tolist() == x.ravel().tolist(), op
    assert not get_op("Transpose").reshape_only and not get_op("Expand").reshape_only


def test_simplify_still_collapses_a_reshape_chain_of_every_reshape_op():
    m = model("""agraph (float[2,3,4] x) => (float[4,6] y) {
        ax = Constant<value = int64[1] {0}>()
        u = Unsqueeze(x, ax)
        s = Squeeze(u, ax)
        f = Flatten<axis = 2>(s)
        s2 = Constant<value = int64[2] {4, -1}>()
        y = Reshape(f, s2)
    }""")
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    assert ops_of(mod.graph) == ["Reshape"]
    assert mod.graph.nodes[0].inputs[1].data.tolist() == [4, 6]
    assert_matches_ort(m, {"x": rand(2, 3, 4)}, opt_levels=(0, 1))


def test_fusion_anchors_are_explains_list():
    assert op_names("fusion_anchor") == ("Conv", "ConvTranspose", "Gemm", "MatMul")
    assert all(get_op(n).kind == ir.OpPatternKind.OUT_ELEMWISE_FUSABLE for n in op_names("fusion_anchor"))


def test_explain_report_lists_each_anchor_and_nothing_else():
    m = model("""agraph (float[1,2,5,5] x, float[3,8] a) => (float[1,2,5,5] y, float[3,4] z) {
        w = Constant<value = float[2,2,1,1] {1, 2, 3, 4}>()
        c = Conv(x, w)
        y = Relu(c)
        wt = Constant<value = float[2,2,1,1] {1, 0, 0, 1}>()
        ct = ConvTranspose(x, wt)
        b = Constant<value = float[8,4] {1,2,3,4,5,6,7,8,1,2,3,4,5,6,7,8,1,2,3,4,5,6,7,8,1,2,3,4,5,6,7,8}>()
        mm = MatMul(a, b)
        z = Tanh(mm)
        unused = Exp(ct)
    }""")
    rep = tensorfuse.explain_report(m)
    fates = {a.op: a for a in rep.anchors}
    assert sorted(fates) == ["Conv", "ConvTranspose", "MatMul"]
    assert fates["Conv"].final_op == "tensorfuse::FusedConv" and "FuseConvActivation" in fates["Conv"].rules
    assert fates["MatMul"].final_op == "tensorfuse::FusedMatMul"
    assert fates["ConvTranspose"].final is None          # dead: its only use is unused
    assert_matches_ort(m, {"x": rand(1, 2, 5, 5), "a": rand(3, 8, seed=1)})


def test_op_names_rejects_an_unknown_flag():
    with pytest.raises(AttributeError, match="no field 'anchor'"):
        op_names("anchor")


# ----------------------------------------------------------------------------- fused activations
def test_each_fused_activation_is_a_registered_op_with_the_onnx_defaults():
    """The table's ops exist with a scalar and a reference; a parameter that is an attribute is
    one of the op's, with the ONNX spec's default (as float32, the attribute type)."""
    from tensorfuse.ir.ops.activations import FUSED_ACTIVATIONS
    assert list(FUSED_ACTIVATIONS) == ["Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish",
                                       "SiLU", "Tanh", "Gelu", "GeluTanh"]
    for act in FUSED_ACTIVATIONS.values():
        od = get_op(act.op)
        assert od.scalar is not None and len(act.params) == len(act.defaults), act.name
        for k, v in act.attrs:
            assert k in od.attrs, act.name
        if act.params_are_inputs:
            assert act.defaults == (-np.inf, np.inf)
            continue
        for p, d in zip(act.params, act.defaults):
            assert np.float32(od.attrs[p].default) == np.float32(d), (act.name, p)


@pytest.mark.parametrize("name,params", [("Clip", [-0.5, 0.7]), ("Clip", [-np.inf, 0.7]), ("LeakyRelu", [0.2]),
                                         ("HardSigmoid", [0.3, 0.4]), ("SiLU", []), ("GeluTanh", [])])
def test_activation_np_is_the_unfused_ops_result(name, params):
    """activation_np through the table equals the unfused ONNX op(s) run by onnx.reference."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    from tensorfuse.ir.ops.activations import activation_np
    x = rand(4, 5, seed=7, low=-4, high=4)
    inits, ins, attrs = [], ["x"], {}
    if name == "Clip":
        for nm, v in zip(("lo", "hi"), params):
            ins.append(nm if np.isfinite(v) else "")
            inits += [numpy_helper.from_array(np.float32(v), nm)] if np.isfinite(v) else []
    elif name in ("LeakyRelu", "HardSigmoid"):
        attrs = dict(zip(("alpha", "beta"), params))
    op = {"SiLU": "Sigmoid", "GeluTanh": "Gelu"}.get(name, name)
    if name == "GeluTanh":
        attrs = {"approximate": "tanh"}
    nodes = [helper.make_node(op, ins, ["s" if name == "SiLU" else "y"], **attrs)]
    if name == "SiLU":
        nodes.append(helper.make_node("Mul", ["x", "s"], ["y"]))
    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4, 5]) for n in ("x", "y")]
    m = helper.make_model(helper.make_graph(nodes, "g", vi[:1], vi[1:], inits),
                          opset_imports=[helper.make_opsetid("", 20)])
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(activation_np(name, params, x), want, rtol=1e-6, atol=1e-6)


def test_activation_pattern_has_one_alternative_per_op_form_and_reads_gelu_modes_apart():
    from tensorfuse.compiler.rules._activation import activation, activation_of
    assert len(activation(Any())._alts) == 9           # Gelu and GeluTanh share the Gelu pattern
    g = G("""
  %a: f32[2,3] = Gelu(%x) {approximate="tanh"} @gt
  %b: f32[2,3] = Gelu(%x) @ge
  %s: f32[2,3] = Sigmoid(%x) @sg
  %c: f32[2,3] = Mul(%s, %x) @silu
  %d: f32[2,3] = LeakyRelu(%x) {alpha=0.25} @lr
  return %a, %b, %c, %d""")
    assert activation_of(g.value("a")) == ("GeluTanh", [])
    assert activation_of(g.value("b")) == ("Gelu", [])
    assert activation_of(g.value("c")) == ("SiLU", [])
    assert activation_of(g.value("d")) == ("LeakyRelu", [0.25])
    assert "Exp is not an activation" in str(activation_of(G("""
  %e: f32[2,3] = Exp(%x) @ex
  return %e""").value("e")))
