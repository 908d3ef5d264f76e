"""The NHWC layout pass (compiler/passes/layout.py) and the NHWC ops (ir/ops/layout_nhwc.py), on
the llvm target with the pass forced (``optimize(..., layout="NHWC")``): no CUDA needed.

- each NHWC op's lowering against onnxruntime (optimisations off): float32, rtol 1e-4, atol 1e-5
  (sums over at most a few hundred products in another order than onnxruntime's);
- the pass on small graphs where Transposes must cancel and where they must not, checked both
  on the graph (which Transposes are left) and numerically against onnxruntime;
- the shared models (slow, shared): at most 2 Transposes left, and the optimised graph,
  evaluated with the registry's numpy references, matches onnxruntime (rtol 1e-3, atol 1e-4:
  sums over thousands of products).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from fusion_util import typed_model
from oracle import ort_run

RTOL, ATOL = 1e-4, 1e-5
OPSET = 17


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def nhwc(monkeypatch):
    """compile(model) on llvm with the layout pass forced: returns (module, LayoutReport)."""
    from tensorfuse.compiler import pipeline
    orig = pipeline.optimize
    reports = []

    def optimize(graph, *a, **kw):
        kw.setdefault("layout", "NHWC")
        r = orig(graph, *a, **kw)
        reports.append(r.layout_report)
        return r

    monkeypatch.setattr(pipeline, "optimize", optimize)

    def comp(model, opt_level=2):
        m = tensorfuse.compile(model, target="llvm", opt_level=opt_level, cache=False)
        return m, reports[-1]
    return comp


def _vi(name, shape, dt=TensorProto.FLOAT):
    if shape is None:                    # an output: its type comes from ONNX shape inference
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, dt, shape)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [onnx.numpy_helper.from_array(a, n) for n, a in inits])
    return typed_model(g, OPSET, ir_version=8, strict=False)


def _rand(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def _check(nhwc, model, feeds, opt_level=2, rtol=RTOL, atol=ATOL):
    mod, rep = nhwc(model, opt_level)
    got = mod.run(**feeds)
    want = ort_run(model, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return rep


def _optimized(model, opt_level=2, layout="NHWC"):
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    g = import_onnx(model)
    r = optimize(g, opt_level, layout=layout)
    return g, r


def _conv_model(c, m, hw, k, group=1, bias=True, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    w = _rand(rng, m, c // group, k, k)
    inits = [("w", w)]
    ins = ["x", "w"]
    if bias:
        inits.append(("b", _rand(rng, m)))
        ins.append("b")
    node = helper.make_node("Conv", ins, ["y"], group=group, **attrs)
    return _model([node], [_vi("x", [1, c, hw, hw])], [_vi("y", None)], inits), {"x": _rand(rng, 1, c, hw, hw)}


# ----------------------------------------------------------------------------- NHWC op lowerings
@pytest.mark.parametrize("case", [
    dict(c=3, m=4, hw=6, k=3, pads=[1, 1, 1, 1]),
    dict(c=4, m=6, hw=7, k=3, strides=[2, 2], pads=[0, 1, 1, 0]),
    dict(c=2, m=3, hw=7, k=2, dilations=[2, 2], bias=False),
    dict(c=4, m=6, hw=5, k=3, group=2, pads=[1, 1, 1, 1]),
    dict(c=6, m=6, hw=7, k=3, group=6, strides=[2, 2], pads=[1, 1, 1, 1]),     # depthwise
    dict(c=3, m=3, hw=5, k=3, group=3, auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(c=5, m=2, hw=4, k=1),
], ids=["pads", "stride_asym_pads", "dilation_nobias", "group2", "depthwise_s2", "dw_same_upper", "1x1"])
def test_conv_nhwc_matches_onnxruntime(nhwc, case):
    model, feeds = _conv_model(**case)
    rep = _check(nhwc, model, feeds)
    assert rep.converted == {"ConvNHWC": 1}
    assert [t.origin for t in rep.transposes] == ["layout", "layout"]       # at the input and output


def test_fused_conv_nhwc_residual_and_activation(nhwc):
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "z"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 5, 5]), _vi("z", [1, 4, 5, 5])], [_vi("y", None)],
                   [("w", _rand(rng, 4, 3, 3, 3)), ("b", _rand(rng, 4)),
                    ("lo", np.array(-0.5, np.float32)), ("hi", np.array(0.6, np.float32))])
    rep = _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5), "z": _rand(rng, 1, 4, 5, 5)})
    assert rep.converted == {"FusedConvNHWC": 1}


@pytest.mark.parametrize("zshape", [(1, 4, 5, 5), (4, 1, 5)], ids=["full", "broadcast"])
def test_fused_conv_nhwc_constant_residual_is_permuted(nhwc, zshape):
    rng = np.random.default_rng(19)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "z"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 5, 5])], [_vi("y", None)],
                   [("w", _rand(rng, 4, 3, 3, 3)), ("z", _rand(rng, *zshape))])
    g, r = _optimized(model)
    (fc,) = [n for n in g.nodes if n.op == "FusedConvNHWC"]
    assert fc.input(3).is_const and _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)})


def test_fused_conv_nhwc_reference_is_fused_conv():
    from tensorfuse.ir.graph import Node, Value
    from tensorfuse.ir.registry import get_op, run_reference
    from tensorfuse.ir.types import DType, TensorType
    rng = np.random.default_rng(2)
    x, w, b, z = _rand(rng, 1, 4, 6, 6), _rand(rng, 6, 2, 3, 3), _rand(rng, 6), _rand(rng, 1, 6, 3, 3)
    attrs = dict(group=2, strides=[2, 2], pads=[1, 1, 1, 1], activation="LeakyRelu", activation_params=[0.2])

    def node(op, arrays, out_shape):
        ins = [Value(f"i{i}", TensorType(DType.f32, a.shape)) for i, a in enumerate(arrays)]
        return Node(op, ins, [Value("y", TensorType(DType.f32, out_shape))], attrs, op, "tensorfuse")
    ref = run_reference(node("FusedConv", [x, w, b, z], (1, 6, 3, 3)), [x, w, b, z])[0]
    t = lambda a, p: np.ascontiguousarray(a.transpose(p))  # noqa: E731
    args = [t(x, (0, 2, 3, 1)), t(w, (2, 3, 1, 0)), b, t(z, (0, 2, 3, 1))]
    n = node("FusedConvNHWC", args, (1, 3, 3, 6))
    assert get_op("FusedConvNHWC", "tensorfuse").infer(n)[0].shape == (1, 3, 3, 6)
    got = run_reference(n, args)[0]
    np.testing.assert_allclose(got, t(ref, (0, 2, 3, 1)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 0, 0], count_include_pad=1)),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
], ids=["max_pads", "max_ceil", "max_dil", "avg_pads", "avg_cip", "avg_ceil_cip", "gap", "gmp"])
def test_pool_nhwc_matches_onnxruntime(nhwc, op, attrs):
    rng = np.random.default_rng(3)
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_vi("x", [2, 3, 7, 7])], [_vi("y", None)])
    rep = _check(nhwc, model, {"x": _rand(rng, 2, 3, 7, 7)})
    assert rep.converted == {op + "NHWC": 1}


def test_batchnorm_nhwc_matches_onnxruntime(nhwc):
    rng = np.random.default_rng(4)
    p = [_rand(rng, 5), _rand(rng, 5), _rand(rng, 5), rng.uniform(0.5, 2, 5).astype(np.float32)]
    model = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
                   [_vi("x", [2, 5, 3, 4])], [_vi("y", None)], list(zip("sbmv", p)))
    rep = _check(nhwc, model, {"x": _rand(rng, 2, 5, 3, 4)})
    assert rep.converted == {"BatchNormalizationNHWC": 1}


def test_maxpool_with_indices_stays_nchw():
    model = _model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])],
                   [_vi("x", [1, 2, 4, 4])], [_vi("y", None), _vi("i", None, TensorProto.INT64)])
    g, r = _optimized(model)
    assert r.layout_report.converted == {} and r.layout_report.count == 0
    assert [n.op for n in g.nodes] == ["MaxPool"]


# ----------------------------------------------------------------------------- the pass: must cancel
def _w(rng, m, c, k=3):
    return _rand(rng, m, c, k, k)


def _conv_relu_conv(rng):
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return _model(nodes, [_vi("x", [1, 3, 5, 5])], [_vi("y", None)], [("w1", _w(rng, 4, 3)), ("w2", _w(rng, 2, 4))])


def _transposes(g):
    """(perm, the graph value it reads) of each Transpose of the graph, also those inside fuse_ops
    groups (a Transpose between elementwise ops or next to a Reshape joins their loop group)."""
    out = []
    for n in g.nodes:
        body = n.attrs.get("body") if n.op == "FusedFunction" else None
        outer = {id(b): v for b, v in zip(body.inputs, n.inputs)} if body is not None else {}
        for m in (body.nodes if body is not None else [n]):
            if m.op == "Transpose":
                out.append((m.attrs["perm"], outer.get(id(m.inputs[0]), m.inputs[0])))
    return out


def _perms(g):
    return [p for p, _ in _transposes(g)]


@pytest.mark.parametrize("level", [1, 2])
def test_conv_relu_conv_cancels(nhwc, level):
    rng = np.random.default_rng(5)
    model = _conv_relu_conv(rng)
    g, r = _optimized(model, level)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]          # the input's and the output's only
    rep = r.layout_report
    assert rep.count == 2 and rep.bytes == 4 * (3 * 25 + 2 * 25)
    assert "graph input %x" in rep.transposes[0].where and "graph output" in rep.transposes[1].where
    acts = rep.counts()
    assert acts["inserted"] >= 4 and acts["cancelled"] >= 1
    # one event per inverse pair, naming the Transpose that went (it counted both ends)
    gone = {e.node for e in rep.events if e.action == "cancelled"}
    assert len(gone) == acts["cancelled"] and not gone & {n.name for n in g.nodes}
    if level == 1:                 # Relu is its own node at O1: the Transpose is pushed below it
        assert acts["pushed"] == 1
        assert any(n.op == "Relu" and n.outputs[0].shape == (1, 5, 5, 4) for n in g.nodes)
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)}, opt_level=level)


@pytest.mark.parametrize("level", [1, 2])
def test_conv_add_residual_relu_cancels(nhwc, level):
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["x1"], ["h"]),
             helper.make_node("Conv", ["h", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "h"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("y", None)],
                   [("w0", _w(rng, 4, 3)), ("w1", _w(rng, 4, 4)), ("b1", _rand(rng, 4)), ("w2", _w(rng, 2, 4, 1))])
    g, r = _optimized(model, level)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    if level == 2:
        assert any(n.op == "FusedConvNHWC" and n.input(3) is not None for n in g.nodes)   # residual Z in NHWC
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 4, 4)}, opt_level=level)


@pytest.mark.parametrize("level", [1, 2])
def test_conv_bn_relu_maxpool_cancels(nhwc, level):
    rng = np.random.default_rng(7)
    bn = [_rand(rng, 4), _rand(rng, 4), _rand(rng, 4), rng.uniform(0.5, 2, 4).astype(np.float32)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = _model(nodes, [_vi("x", [1, 3, 6, 6])], [_vi("y", None)], [("w", _w(rng, 4, 3))] + list(zip("sbmv", bn)))
    g, r = _optimized(model, level)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    conv = r.layout_report.converted
    assert conv.get("MaxPoolNHWC") == 1
    assert conv.get("BatchNormalizationNHWC", 0) == (1 if level == 1 else 0)     # folded at O2
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 6, 6)}, opt_level=level)


def test_concat_of_two_convs_cancels(nhwc):
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"]),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["r"]),
             helper.make_node("Conv", ["r", "wc"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("y", None)],
                   [("wa", _w(rng, 2, 3, 1)), ("wb", _w(rng, 3, 3)), ("wc", _w(rng, 2, 5, 1))])
    g, r = _optimized(model, 1)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]      # one Transpose of x serves both convs (merged)
    (cat,) = [n for n in g.nodes if n.op == "Concat"]
    assert cat.attrs["axis"] == 3 and cat.outputs[0].shape == (1, 4, 4, 5)
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 4, 4)}, opt_level=1)
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 4, 4)}, opt_level=2)


def test_per_channel_constant_is_permuted(nhwc):
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Mul", ["c", "k"], ["m"]),            # [C, 1, 1]: per channel
             helper.make_node("Add", ["m", "k2"], ["a"]),           # [W]: a rank-lower operand along W
             helper.make_node("Conv", ["a", "w2"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 2, 3, 4])], [_vi("y", None)],
                   [("w", _w(rng, 3, 2, 1)), ("k", _rand(rng, 3, 1, 1)), ("k2", _rand(rng, 4)),
                    ("w2", _w(rng, 2, 3, 1))])
    g, r = _optimized(model, 1)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    (mul,) = [n for n in g.nodes if n.op == "Mul"]
    (add,) = [n for n in g.nodes if n.op == "Add"]
    assert mul.inputs[1].shape == (3,)                  # [C,1,1] -> [C], the last axis in NHWC
    assert add.inputs[1].shape == (4, 1)                # [W] -> [W, 1] (H, W, C in NHWC)
    _check(nhwc, model, {"x": _rand(rng, 1, 2, 3, 4)}, opt_level=1)
    # O2: fuse_ops puts the pushed Mul into the NHWC conv's epilogue
    g, r = _optimized(model, 2)
    groups = [n for n in g.nodes if n.op == "FusedFunction"]
    assert any(n.attrs["kind"] == "OUT_ELEMWISE_FUSABLE" and
               any(b.op in ("ConvNHWC", "FusedConvNHWC") for b in n.attrs["body"].nodes) for n in groups), str(g)
    _check(nhwc, model, {"x": _rand(rng, 1, 2, 3, 4)}, opt_level=2)


def test_global_pool_flatten_needs_no_transpose(nhwc):
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g"], ["y"], transB=1)]
    model = _model(nodes, [_vi("x", [1, 2, 3, 3])], [_vi("y", None)],
                   [("w", _w(rng, 4, 2)), ("g", _rand(rng, 5, 4))])
    g, r = _optimized(model)
    assert _perms(g) == [[0, 2, 3, 1]]                  # only the input's
    assert r.layout_report.counts()["reshaped"] == 1
    _check(nhwc, model, {"x": _rand(rng, 1, 2, 3, 3)})


# ----------------------------------------------------------------------------- the pass: must not cancel
def test_reshape_mixing_channels_and_space_keeps_transpose(nhwc):
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 2, 3, 3])], [_vi("y", None)],
                   [("w", _w(rng, 4, 2)), ("shape", np.array([1, 4, 9], np.int64))])
    g, r = _optimized(model)
    rep = r.layout_report
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    assert "Reshape" in rep.transposes[1].where                 # the NCHW value the Reshape reads
    _check(nhwc, model, {"x": _rand(rng, 1, 2, 3, 3)})


def test_flatten_of_spatial_size_not_one_keeps_transpose(nhwc):
    """A Transpose moves data unless only size-1 axes move: before a Flatten of [1, 3, 2, 1]
    (H = 2) it must stay a Transpose (a Reshape there would be a wrong answer)."""
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 1]),
             helper.make_node("Flatten", ["c"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 2, 3, 1])], [_vi("y", None)], [("w", _w(rng, 3, 2, 1))])
    g, r = _optimized(model)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]]
    assert "reshaped" not in r.layout_report.counts()
    _check(nhwc, model, {"x": _rand(rng, 1, 2, 3, 1)})


def test_value_with_an_nchw_consumer_keeps_one_transpose(nhwc):
    """Relu's value feeds a Conv (NHWC) and a Reshape that mixes channels and space (NCHW): the
    Transpose is pushed below the Relu, cancels for the Conv, and stays for the Reshape."""
    rng = np.random.default_rng(20)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"]),
             helper.make_node("Reshape", ["r", "shape"], ["z"])]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("y", None), _vi("z", None)],
                   [("w1", _w(rng, 4, 3)), ("w2", _w(rng, 2, 4, 1)), ("shape", np.array([1, 64], np.int64))])
    g, r = _optimized(model, 1)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2], [0, 3, 1, 2]]
    (relu,) = [n for n in g.nodes if n.op == "Relu"]
    assert relu.outputs[0].shape == (1, 4, 4, 4)
    assert "Reshape" in r.layout_report.transposes[1].where
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 4, 4)}, opt_level=1)


def test_op_that_must_stay_nchw_keeps_its_transposes(nhwc):
    rng = np.random.default_rng(21)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Softmax", ["a"], ["s"], axis=1),
             helper.make_node("Conv", ["s", "w2"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("y", None)],
                   [("w1", _w(rng, 4, 3, 1)), ("w2", _w(rng, 2, 4, 1))])
    g, r = _optimized(model)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2], [0, 2, 3, 1], [0, 3, 1, 2]]
    (sm,) = [n for n in g.nodes if n.op == "Softmax"]
    assert sm.outputs[0].shape == (1, 4, 4, 4) and sm.attrs["axis"] == 1       # still NCHW
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 4, 4)})


def test_graph_output_in_the_middle_keeps_its_transpose(nhwc):
    rng = np.random.default_rng(13)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["mid"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mid", "w2"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 4, 4])], [_vi("mid", None), _vi("y", None)],
                   [("w1", _w(rng, 4, 3)), ("w2", _w(rng, 2, 4, 1))])
    g, r = _optimized(model)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2], [0, 3, 1, 2]]
    assert [v.shape for v in g.outputs] == [(1, 4, 4, 4), (1, 2, 4, 4)]
    assert all(v.producer.op == "Transpose" for v in g.outputs)
    (c2,) = [n for n in g.nodes if n.op == "ConvNHWC" and n.outputs[0].shape[-1] == 2]
    assert c2.inputs[0].producer.op == "ConvNHWC"          # the second conv reads NHWC directly
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 4, 4)})


# Conv -> elementwise tail -> graph output: the conv's output Transpose is pushed to the output
def _tail_model(rng, tail, outputs=("y",), extra=()):
    """Conv [1,3,5,5] -> c [1,4,5,5], then the ``tail`` nodes (reading c), ``extra`` nodes
    after them; ``outputs``: the graph outputs."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])] + list(tail) + list(extra)
    inits = [("w", _w(rng, 4, 3)), ("b", _rand(rng, 4)), ("pc", _rand(rng, 4, 1, 1))]
    return _model(nodes, [_vi("x", [1, 3, 5, 5])], [_vi(o, None) for o in outputs], inits)


_TAILS = {
    "tanh_mul": [helper.make_node("Tanh", ["c"], ["t"]), helper.make_node("Mul", ["t", "c"], ["y"])],
    "silu_add_const": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
                       helper.make_node("Add", ["m", "pc"], ["y"])],
    "relu_add_conv": [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Neg", ["c"], ["n"]),
                      helper.make_node("Add", ["r", "n"], ["y"])],
}


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("tail", list(_TAILS))
def test_elementwise_tail_at_graph_output_pushes_the_transpose(nhwc, tail, level):
    """An elementwise tail that reads the conv's output twice (Mul(tanh(c), c), SiLU, ...): a
    push below its first op alone adds a Transpose (one on each input of the op that joins
    them), the next push below the join takes both away: one Transpose is left, at the graph
    output, the tail computes in NHWC and (O2) fuses into the conv's group."""
    rng = np.random.default_rng(30)
    model = _tail_model(rng, _TAILS[tail])
    g, r = _optimized(model, level)
    rep = r.layout_report
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]], str(rep)
    assert rep.count == 2 and rep.bytes == 4 * (3 * 25 + 4 * 25)
    assert rep.transposes[1].where.endswith("-> graph output")
    out_t = g.outputs[0].producer
    assert out_t.op == "Transpose" and out_t.inputs[0].shape == (1, 5, 5, 4)
    assert rep.counts()["pushed"] >= (2 if level == 1 else 1)     # O2: SiLU is FusedConv's activation
    if level == 1:          # every tail op computes in NHWC
        tail_ops = [n for n in g.nodes if n.op not in ("Transpose", "ConvNHWC")]
        assert tail_ops and all(n.outputs[0].shape == (1, 5, 5, 4) for n in tail_ops)
    else:                   # one fused group, anchored at the conv: conv and tail in one kernel
        (grp,) = [n for n in g.nodes if n.op != "Transpose"]
        assert grp.op == "FusedFunction" and grp.attrs["anchor"] == grp.name
        body_ops = [n.op for n in grp.attrs["body"].nodes]
        assert body_ops[0] in ("ConvNHWC", "FusedConvNHWC") and len(body_ops) >= 2, body_ops
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)}, opt_level=level)


def test_elementwise_tail_that_feeds_an_nchw_op_keeps_the_transpose_at_the_conv(nhwc):
    """tanh(c) also feeds a Softmax over channels (NCHW only): pushed below Tanh and Mul, a
    Transpose would stay for the Softmax and another come at the output, so no push is made:
    one Transpose after the conv, and the tail reads NCHW."""
    rng = np.random.default_rng(31)
    model = _tail_model(rng, _TAILS["tanh_mul"], outputs=("y", "z"),
                        extra=[helper.make_node("Softmax", ["t"], ["z"], axis=1)])
    for level in (1, 2):
        g, r = _optimized(model, level)
        assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]], str(r.layout_report)
        (src,) = [v for p, v in _transposes(g) if p == [0, 3, 1, 2]]
        assert src.producer.op.startswith(("ConvNHWC", "FusedConvNHWC"))
        assert "pushed" not in r.layout_report.counts()
        _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)}, opt_level=level)


def test_elementwise_tail_with_a_graph_output_inside_keeps_the_transpose_at_the_conv(nhwc):
    """tanh(c) is a graph output too (NCHW): the push would leave a Transpose for it and add one
    at y, so none is made."""
    rng = np.random.default_rng(32)
    model = _tail_model(rng, _TAILS["tanh_mul"], outputs=("y", "t"))
    g, r = _optimized(model, 1)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]], str(r.layout_report)
    (tanh,) = [n for n in g.nodes if n.op == "Tanh"]
    assert tanh.outputs[0].shape == (1, 4, 5, 5) and tanh.inputs[0].producer.op == "Transpose"
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)}, opt_level=1)
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)}, opt_level=2)


def test_pushed_transpose_stops_at_a_graph_output_consumed_further(nhwc):
    """y = tanh(c) * c is a graph output that a Relu reads for a second output z: the Transpose
    is pushed to y (the tail in NHWC) and no further (below the Relu it would need one for y
    and one for z): the Relu reads y in NCHW."""
    rng = np.random.default_rng(33)
    model = _tail_model(rng, _TAILS["tanh_mul"], outputs=("y", "z"),
                        extra=[helper.make_node("Relu", ["y"], ["z"])])
    g, r = _optimized(model, 1)
    assert _perms(g) == [[0, 2, 3, 1], [0, 3, 1, 2]], str(r.layout_report)
    y = g.outputs[0]
    assert y.producer.op == "Transpose" and y.producer.inputs[0].producer.op == "Mul"
    (relu,) = [n for n in g.nodes if n.op == "Relu"]
    assert relu.inputs[0] is y and relu.outputs[0].shape == (1, 4, 5, 5)
    for level in (1, 2):
        _check(nhwc, model, {"x": _rand(rng, 1, 3, 5, 5)}, opt_level=level)


def test_model_transpose_with_another_perm_is_composed_not_cancelled(nhwc):
    rng = np.random.default_rng(14)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 1, 3, 2]),      # swap H and W
             helper.make_node("Conv", ["t", "w2"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 3, 3, 5])], [_vi("y", None)],
                   [("w1", _w(rng, 4, 3)), ("w2", _w(rng, 2, 4, 1))])
    g, r = _optimized(model)
    assert _perms(g) == [[0, 2, 3, 1], [0, 2, 1, 3], [0, 3, 1, 2]]   # H<->W in NHWC stays
    assert r.layout_report.counts()["composed"] >= 1
    _check(nhwc, model, {"x": _rand(rng, 1, 3, 3, 5)})


def test_model_transposes_alone_are_untouched():
    rng = np.random.default_rng(15)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 1, 3, 2])]
    model = _model(nodes, [_vi("x", [1, 2, 1, 3])], [_vi("y", None)])
    g, r = _optimized(model, 2)
    rep = r.layout_report
    assert rep.events == [] and rep.count == 2 and {t.origin for t in rep.transposes} == {"model"}
    del rng


def test_non_const_weights_get_a_transpose(nhwc):
    rng = np.random.default_rng(16)
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"])],
                   [_vi("x", [1, 2, 3, 3]), _vi("w", [3, 2, 1, 1])], [_vi("y", None)])
    g, r = _optimized(model)
    assert [2, 3, 1, 0] in _perms(g)
    _check(nhwc, model, {"x": _rand(rng, 1, 2, 3, 3), "w": _rand(rng, 3, 2, 1, 1)})


# ----------------------------------------------------------------------------- pipeline hook
def test_pipeline_runs_layout_for_cuda_only():
    from tensorfuse.compiler.pipeline import build_passes, resolve_layout
    from tensorfuse.ir.target import Target
    rng = np.random.default_rng(17)
    model = _conv_relu_conv(rng)
    g, r = _optimized(model, 2, layout=None)
    assert r.layout_report is None and not any(n.op == "Transpose" for n in g.nodes)
    assert resolve_layout("llvm") == "NCHW" and resolve_layout(Target.parse("cuda")) == "NHWC"
    assert resolve_layout("cuda") == "NHWC" and resolve_layout("cuda", "NCHW") == "NCHW"
    with pytest.raises(ValueError, match="layout"):
        resolve_layout(None, "NCWH")
    names = [n for n, _ in build_passes(2, layout="NHWC")]
    assert names.index("fuse") < names.index("layout") < names.index("fuse_ops")
    assert "layout" not in [n for n, _ in build_passes(2)]
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    g = import_onnx(model)
    r = optimize(g, 2, target=Target.parse("cuda"))
    assert r.layout_report.count == 2 and "layout" in [p.name for p in r.passes]
    assert "Transposes left" in r.summary()
    s = str(r.layout_report)
    assert "2 Transposes left" in s and "graph input %x" in s


def test_layout_dump(tmp_path):
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    g = import_onnx(_conv_relu_conv(np.random.default_rng(18)))
    optimize(g, 2, layout="NHWC", dump_ir=tmp_path)
    text = (tmp_path / "layout.txt").read_text()
    assert "layout: inserted" in text and "layout: cancelled" in text


# ----------------------------------------------------------------------------- shared models
def _run_graph(g, feeds):
    from tensorfuse.ir.registry import run_reference
    env = {id(v): feeds[v.name] for v in g.inputs}
    env.update({id(v): v.data for v in g.constants.values()})
    for n in g.nodes:
        outs = run_reference(n, [None if v is None else env[id(v)] for v in n.inputs])
        env.update({id(o): a for o, a in zip(n.outputs, outs)})
    return [env[id(v)] for v in g.outputs]


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("name", ["resnet18.unfolded.onnx", "mobilenet_v2.onnx", "squeezenet1_1.onnx"])
def test_shared_model_layout(name):
    from conftest import shared_model_entries, shared_models_dir
    from oracle import assert_outputs_depend_on_inputs, model_inputs, other_inputs
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    path = shared_models_dir() / name
    entry = next(e for e in shared_model_entries() if e["file"] == name)
    g = import_onnx(str(path))
    names = [v.name for v in g.inputs]
    r = optimize(g, 2, target=Target.parse("cuda"))
    rep = r.layout_report
    assert rep.count <= 2, str(rep)
    assert rep.transposes[0].where.startswith("graph input")
    assert rep.converted.get("FusedConvNHWC", 0) + rep.converted.get("ConvNHWC", 0) >= 20
    assert not any(n.op in ("Conv", "MaxPool", "GlobalAveragePool") or
                   (n.op == "FusedConv" and n.domain == "tensorfuse") for n in g.nodes)
    feeds = model_inputs(entry, seed=0)
    want = ort_run(str(path), feeds)
    assert_outputs_depend_on_inputs(want, ort_run(str(path), other_inputs(feeds)), 1e-3, 1e-4, name)
    got = _run_graph(g, {g.inputs[i].name: feeds[nm] for i, nm in enumerate(names)})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.shared
def test_shared_squeezenet_nhwc_on_llvm(nhwc):
    """End to end through the NHWC kernels on the CPU: compile with the pass forced and run."""
    import json
    from conftest import shared_models_dir
    from oracle import assert_outputs_depend_on_inputs, model_inputs, other_inputs
    path = shared_models_dir() / "squeezenet1_1.onnx"
    entry = next(e for e in json.loads((shared_models_dir() / "models.json").read_text())["models"]
                 if e["file"] == "squeezenet1_1.onnx")
    feeds = model_inputs(entry, seed=0)
    feeds2 = other_inputs(feeds)
    want, want2 = ort_run(str(path), feeds), ort_run(str(path), feeds2)
    assert_outputs_depend_on_inputs(want, want2, 1e-3, 1e-4, "squeezenet1_1.onnx")
    mod, rep = nhwc(str(path))
    assert rep.count == 1
    for a, b in zip(mod.run(**feeds) + mod.run(**feeds2), want + want2):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_layout_report_round_trips_through_json():
    """The compile cache keeps the layout report as JSON with its entry (compiler.report)."""
    import json

    from tensorfuse.compiler.passes.layout import LayoutReport
    _, r = _optimized(_conv_relu_conv(np.random.default_rng(5)), 2)
    rep = r.layout_report
    back = LayoutReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert back == rep and str(back) == str(rep)
    assert back.count == 2 and back.transposes[0].shape == (1, 5, 5, 3)


def test_layout_conversions_are_in_the_rewrite_log_and_trace_to_the_model_nodes():
    """Profiles name the model's nodes: each conversion is a rule "layout" application."""
    from tensorfuse.runtime.profile import trace_sources
    g, r = _optimized(_conv_relu_conv(np.random.default_rng(5)), 1)
    apps = [a for a in r.log if a.rule == "layout"]
    convs = [n.name for n in g.nodes if n.op == "ConvNHWC"]
    assert len(convs) == 2 and sorted(c for a in apps for c in a.created if c in convs) == sorted(convs)
    # the model's nodes are unnamed: the frontend names them <op>_<index>
    assert set(trace_sources(convs, r.log)) == {"Conv_0", "Conv_2"}
