"""The squeeze-excitation scale folded into its projection conv (compiler/rules/fuse_conv.py,
``FuseConvInputScale``): Conv(Mul(a, S), W, b) with S [1 or N, C, 1, 1] becomes
FusedConv(a, W, b, S=S), the conv kernel multiplying each input vector by its channel's factor.
It fires (Sigmoid and HardSigmoid excitations, either Mul operand order, a batch with a scale
per image, the residual Add and the activation still fused after it), refuses where it must
(with explain's reason), and keeps the model's outputs (onnxruntime, optimisations off); the
llvm schedule's three tile orders (packed panels, blocks over every pixel tile, blocks
innermost) each match onnxruntime at 1 and 2 threads."""
import numpy as np
import pytest
from onnx import helper

import tensorfuse
from tests.fusion_util import count, graph_model, optimized, why_not
from tests.oracle import assert_matches_ort, ort_run, rand

RT, AT = 1e-4, 1e-4
RULE = "FuseConvInputScale"
FUSED = "tensorfuse::FusedConv"


def _se_model(n=1, c=32, h=16, w=16, m=24, gate="Sigmoid", swap=False, residual=False, act=None,
              k=1, strides=(1, 1), group=1, pads=(0, 0, 0, 0), extra_use=False, scale_shape=None):
    """x -> GlobalAveragePool -> 1x1 Conv (c -> c) -> gate -> Mul(x, gate) -> Conv (c -> m)
    [-> Add(z)] [-> act]: an SE block and the conv after it. ``scale_shape``: multiply by a
    graph input of this shape instead of the gate; ``extra_use``: the Mul's output also feeds a
    Relu (a second graph output)."""
    x = rand(n, c, h, w)
    inits = {"w1": rand(c, c, 1, 1, seed=4) * 0.3, "b1": rand(c, seed=5),
             "w2": rand(m, c // group, k, k, seed=1) * 0.2, "b2": rand(m, seed=2)}
    feeds = {"x": x}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Conv", ["g", "w1", "b1"], ["e"], kernel_shape=[1, 1]),
             helper.make_node(gate, ["e"], ["s"])]
    if scale_shape is not None:
        nodes = []
        feeds["s"] = rand(*scale_shape, seed=6)
    ins = ["s", "x"] if swap else ["x", "s"]
    nodes.append(helper.make_node("Mul", ins, ["xs"]))
    nodes.append(helper.make_node("Conv", ["xs", "w2", "b2"], ["c"], kernel_shape=[k, k], strides=list(strides),
                                  group=group, pads=list(pads)))
    last = "c"
    if residual == "const":                          # a constant per output channel: into the bias
        inits["zc"] = rand(1, m, 1, 1, seed=9)
        nodes.append(helper.make_node("Add", ["c", "zc"], ["r"]))
        last = "r"
    elif residual:
        oh = (h + pads[0] + pads[2] - k) // strides[0] + 1
        ow = (w + pads[1] + pads[3] - k) // strides[1] + 1
        feeds["z"] = rand(n, m, oh, ow, seed=3)
        nodes.append(helper.make_node("Add", ["c", "z"], ["r"]))
        last = "r"
    if act:
        nodes.append(helper.make_node(act, [last], ["y"]))
        last = "y"
    if extra_use:
        nodes.append(helper.make_node("Relu", ["xs"], ["xr"]))
    outs = [last] + (["xr"] if extra_use else [])
    return graph_model(nodes, feeds, outs, inits), feeds


def _scaled_convs(g):
    return [n for n in g.nodes if n.qualified_op == FUSED and n.input(4) is not None]


@pytest.mark.parametrize("kw", [dict(), dict(gate="HardSigmoid"), dict(swap=True), dict(n=2),
                                dict(residual=True, act="Relu"), dict(act="Relu"), dict(residual=True),
                                dict(c=96, m=40, h=28, w=28, residual=True, act="Relu"),
                                dict(residual="const", act="Relu")])
def test_scale_folds_into_the_conv(kw):
    model, feeds = _se_model(**kw)
    g = optimized(model)
    (conv,) = _scaled_convs(g)
    assert count(g, "Mul") == 0
    assert conv.input(4).shape == (1 if kw.get("n", 1) == 1 else kw["n"], kw.get("c", 32), 1, 1)
    # the residual Add and the activation still join the conv's epilogue (a constant Add: the bias)
    assert (conv.input(3) is not None) == (kw.get("residual") is True)
    assert conv.attr("activation", "") == (kw.get("act") or "")
    assert count(g, "Add") == 0 and count(g, "Relu") == 0
    assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(0, 2, 3))


@pytest.mark.parametrize("kw,reason", [
    (dict(k=3, pads=(1, 1, 1, 1)), "a 3x3 kernel, not 1x1"),
    (dict(pads=(1, 1, 1, 1)), "strides [1, 1], pads [1, 1, 1, 1]"),
    (dict(group=2), "group 2"),
    (dict(h=8, w=8), "64 output pixels, fewer than"),
    (dict(scale_shape=(1, 1, 16, 16)), "expected shape satisfying [?, ?, 1, 1]"),
    (dict(scale_shape=(1, 32, 16, 1)), "expected shape satisfying [?, ?, 1, 1]"),
    (dict(scale_shape=(1, 1, 1, 1)), "is not a scale per input channel [1 or 1, 32, 1, 1]"),
    (dict(extra_use=True), "has another consumer"),
])
def test_not_folded(kw, reason):
    model, feeds = _se_model(**kw)
    g = optimized(model)
    assert not _scaled_convs(g) and count(g, "Mul") == 1
    assert reason in why_not(model, RULE), why_not(model, RULE)
    assert_matches_ort(model, feeds, rtol=RT, atol=AT, opt_levels=(2,))


def test_nhwc_pipeline_keeps_the_mul():
    """NCHW pipelines only (``Rule.layouts``): the cuda target's NHWC convolutions have no
    input scale, so with the NHWC layout the Mul stays."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    model, _ = _se_model()
    g = import_onnx(model)
    optimize(g, 2, layout="NHWC")
    assert count(g, "Mul") == 1 and not _scaled_convs(g)


@pytest.mark.parametrize("x_shape,m,knobs,order", [
    ((1, 64, 20, 20), 160, {"pack_pixels": True}, "packed"),          # 20 blocks read each panel
    ((2, 48, 18, 18), 72, {"pack_pixels": False, "pixel_tiles_inner": True}, "inner"),
    ((1, 40, 17, 15), 20, {"pack_pixels": False, "pixel_tiles_inner": False}, "blocks"),   # partial block, rest
])
@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_scaled_tile_orders(x_shape, m, knobs, order, threads):
    """Each tile order of ``conv2d_pointwise_scaled`` (the scale applied in the panel copy, or
    per channel block as X is read) with a per-image scale where N = 2, a residual and Relu."""
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    from tests.knob_util import Fixed
    n, c, h, w = x_shape
    model, feeds = _se_model(n=n, c=c, h=h, w=w, m=m, residual=True, act="Relu")
    tgt = Target.parse("llvm")
    graph = import_onnx(model)
    optimize(graph, 2, target=tgt)
    low = lower_graph(graph, tgt, tuning=Fixed(knobs))
    mod = build_module(low, graph, list(feeds), ["y"], tgt)
    mod.num_threads = threads
    (k,) = [k for k in mod.kernels if "scaled by S" in k.comment]
    assert k.schedule == "llvm.conv2d_pointwise_scaled"
    assert ("pixel tiles packed" in k.comment) == (order == "packed"), k.comment
    if order != "packed":
        assert k.knobs["pixel_tiles_inner"] == (order == "inner"), k.knobs
    np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(model, feeds)[0], rtol=RT, atol=AT)


def test_scaled_pointwise_packs_where_the_unscaled_runs_tiles_inner():
    """Default knobs: regnet's 320 -> 320 at 14x14 without a scale runs each channel block over
    the unpacked tiles (``tiles_inner_ok``); with S it packs the tiles, so S multiplies each
    element once in the panel copy instead of once per channel block. Both match onnxruntime."""
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    tgt = Target.parse("llvm")
    for scaled in (False, True):
        model, feeds = _se_model(c=320, h=14, w=14, m=320, act="Relu")
        graph = import_onnx(model)
        optimize(graph, 2, target=tgt, disabled_rules=() if scaled else ("FuseConvInputScale",))
        low = lower_graph(graph, tgt)
        mod = build_module(low, graph, list(feeds), ["y"], tgt)
        (k,) = [k for k in mod.kernels if "pointwise:" in k.comment]
        assert ("scaled by S" in k.comment) == scaled, k.comment
        assert k.knobs["pack_pixels"] == scaled, k.knobs
        if not scaled:
            assert k.knobs["pixel_tiles_inner"], k.knobs
        np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(model, feeds)[0], rtol=RT, atol=AT)


def test_fused_conv_scale_shape_is_checked():
    """FusedConv's input S must be [1 or N, C, 1, 1] of X's dtype: a ShapeError says so."""
    from tensorfuse.ir import Builder, DType, Graph, TensorType
    from tensorfuse.ir.registry import ShapeError
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorType(DType.f32, (1, 4, 8, 8)))
    s = g.add_input("s", TensorType(DType.f32, (1, 8, 1, 1)))
    wt = b.const(rand(6, 4, 1, 1))
    with pytest.raises(ShapeError, match=r"S \(the input-channel scale\) has shape \[1, 8, 1, 1\], expected "
                                         r"\[1 or 1, 4, 1, 1\]"):
        b.op("FusedConv", x, wt, None, None, s, domain="tensorfuse", activation="", activation_params=[])


def test_generic_conv_reads_the_scale():
    """A FusedConv with S that no schedule of ``conv2d_input_scale`` takes (a 3x3 kernel,
    built directly: the rule would not make it) runs the generic loop nest, which applies S
    too; compared with onnxruntime running Mul -> Conv -> Relu."""
    from tensorfuse.ir import Builder, DType, Graph, TensorType
    from tests.fusion_util import compile_graph
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorType(DType.f32, (2, 4, 9, 9)))
    s = g.add_input("s", TensorType(DType.f32, (2, 4, 1, 1)))
    w, bias = rand(6, 4, 3, 3, seed=1), rand(6, seed=2)
    y = b.op("FusedConv", x, b.const(w), b.const(bias), None, s, domain="tensorfuse", pads=[1, 1, 1, 1],
             kernel_shape=[3, 3], activation="Relu", activation_params=[])
    g.outputs.append(y)
    mod = compile_graph(g)
    (k,) = mod.kernels
    assert k.schedule == "generic"
    feeds = {"x": rand(2, 4, 9, 9, seed=7), "s": rand(2, 4, 1, 1, seed=8)}
    unfused = graph_model([helper.make_node("Mul", ["x", "s"], ["xs"]),
                           helper.make_node("Conv", ["xs", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], feeds, ["y"], {"w": w, "b": bias})
    np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(unfused, feeds)[0], rtol=RT, atol=AT)


def test_scaled_conv_exports_as_mul_then_conv(tmp_path):
    """``export_onnx`` writes a FusedConv with S as a function of standard ops (Mul, Conv, Add,
    Relu) that onnxruntime runs to the unfused model's result."""
    import onnx
    model, feeds = _se_model(c=16, m=24, h=12, w=12, residual=True, act="Relu")
    mod = tensorfuse.compile(model, opt_level=2, cache=False)
    assert _scaled_convs(mod.graph)
    p = tensorfuse.export_onnx(mod.graph, tmp_path / "f.onnx")
    onnx.checker.check_model(str(tmp_path / "f.onnx"), full_check=True)
    (call,) = [n for n in p.graph.node if n.op_type.startswith("FusedConv") and len(n.input) == 5]
    (fn,) = [f for f in p.functions if f.name == call.op_type]
    assert [n.op_type for n in fn.node][:2] == ["Mul", "Conv"]
    np.testing.assert_allclose(ort_run(p, feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
