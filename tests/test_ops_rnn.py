"""RNN, GRU, LSTM against onnxruntime (ONNX spec sections "RNN", "GRU", "LSTM").

onnxruntime runs these ops in float32 with layout=0 only; float64, float16 and layout=1 are
checked against onnx.reference (which implements the default activations without clip) and
against the layout-0 result.
"""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.errors import UnsupportedModelError
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
ALL_INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
RT, AT = 1e-4, 1e-5


def make(op, S=3, Bt=2, I=4, H=5, attrs=None, opts=("B", "initial_h"), lens=None, layout=0,
         seed=0, dtype=np.float32, outputs=None, opset=17, const=()):
    """A one-node model and its inputs. ``opts``: which optional inputs to give (random);
    ``lens``: sequence_lens values; ``const``: input names to make initializers."""
    attrs = dict(attrs or {})
    G = GATES[op]
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    if layout:
        attrs["layout"] = layout
    attrs.setdefault("hidden_size", H)
    st = (nd, Bt, H) if layout == 0 else (Bt, nd, H)
    vals = {"X": rand(*((S, Bt, I) if layout == 0 else (Bt, S, I)), seed=seed, dtype=dtype),
            "W": rand(nd, G * H, I, seed=seed + 1, low=-1, high=1, dtype=dtype),
            "R": rand(nd, G * H, H, seed=seed + 2, low=-1, high=1, dtype=dtype)}
    if "B" in opts:
        vals["B"] = rand(nd, 2 * G * H, seed=seed + 3, low=-1, high=1, dtype=dtype)
    if lens is not None:
        vals["sequence_lens"] = np.asarray(lens, np.int32)
    if "initial_h" in opts:
        vals["initial_h"] = rand(*st, seed=seed + 4, low=-1, high=1, dtype=dtype)
    if op == "LSTM" and "initial_c" in opts:
        vals["initial_c"] = rand(*st, seed=seed + 5, low=-1, high=1, dtype=dtype)
    if op == "LSTM" and "P" in opts:
        vals["P"] = rand(nd, 3 * H, seed=seed + 6, low=-1, high=1, dtype=dtype)
    names = [n if n in vals else "" for n in ALL_INPUTS[:8 if op == "LSTM" else 6]]
    while names[-1] == "":
        names.pop()
    outputs = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    inputs = {k: v for k, v in vals.items() if k not in const}
    inits = {k: v for k, v in vals.items() if k in const}
    m = node_model(op, inputs, attrs, outputs=[o for o in outputs], opset=opset,
                   initializers=inits, input_names=names)
    return m, inputs, vals, names, attrs


def ours(model, inputs, opt_level=0):
    return tensorfuse.compile(model, target="llvm", opt_level=opt_level).run(**inputs)


def reference(op, vals, names, attrs, n_out):
    """tensorfuse's numpy reference (ir.registry.run_reference) for one node."""
    g = Graph()
    b = Builder(g)
    vs = [g.add_input(n, TensorType.of(vals[n])) if n else None for n in names]
    outs = b.op(op, *vs, num_outputs=n_out, attributes=attrs)
    node = (outs[0] if isinstance(outs, list) else outs).producer
    return run_reference(node, [vals[n] if n else None for n in names])


# ----------------------------------------------------------------------------- vs onnxruntime
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions(op, direction):
    m, ins, *_ = make(op, attrs={"direction": direction},
                      opts=("B", "initial_h", "initial_c", "P") if op == "LSTM" else ("B", "initial_h"))
    assert_matches_ort(m, ins, rtol=RT, atol=AT)


@pytest.mark.parametrize("op,opts", [(op, o) for op in ("RNN", "GRU", "LSTM") for o in ((), ("B",), ("initial_h",))]
                         + [("LSTM", ("initial_c",)), ("LSTM", ("P",))])
def test_optional_inputs(op, opts):
    m, ins, *_ = make(op, opts=opts, seed=3)
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("S,Bt,I,H", [(1, 1, 1, 1), (5, 3, 20, 17), (2, 4, 33, 8)])
def test_shapes(op, S, Bt, I, H):
    """Sizes from a single step of width 1 up to dot products on the 8-lane path with tails."""
    m, ins, *_ = make(op, S=S, Bt=Bt, I=I, H=H, attrs={"direction": "bidirectional"}, seed=S + I)
    assert_matches_ort(m, ins, rtol=RT, atol=1e-5, opt_levels=(0,))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_long_sequence_wide_hidden(op):
    """20 steps, hidden 64. Weights scaled down so the recurrence is not chaotic: with
    uniform [-1, 1] weights at this width rounding differences grow to +-1 over the steps."""
    m, ins, *_ = make(op, S=20, Bt=2, I=40, H=64, attrs={"direction": "bidirectional"}, lens=[20, 13])
    ins = {k: (v * np.float32(0.1) if k in ("W", "R") else v) for k, v in ins.items()}
    assert_matches_ort(m, ins, rtol=1e-4, atol=1e-5, opt_levels=(0,))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("const", [(), ("sequence_lens",)])
def test_sequence_lens(op, const):
    """Per-batch lengths, at run time or as a constant: Y is zero past each length, Y_h (Y_c)
    is the state after the last valid step, the reverse direction starts at it."""
    m, ins, *_ = make(op, S=4, Bt=3, attrs={"direction": "bidirectional"}, lens=[4, 1, 2], const=const,
                      opts=("B", "initial_h", "initial_c", "P"))
    got = assert_matches_ort(m, ins, rtol=RT, atol=AT)
    assert np.all(got[0][1:, :, 1] == 0) and np.all(got[0][2:, :, 2] == 0)


def test_sequence_lens_zero_and_clamped():
    """Length 0 keeps the initial state (onnxruntime rejects it); run-time lengths beyond
    seq_length are clamped to it."""
    m, ins, vals, names, attrs = make("LSTM", S=3, Bt=3, lens=[0, 3, 9], opts=("initial_h", "initial_c"))
    got = ours(m, ins)
    np.testing.assert_array_equal(got[0][:, 0, 0], 0)
    np.testing.assert_array_equal(got[1][0, 0], ins["initial_h"][0, 0])
    np.testing.assert_array_equal(got[2][0, 0], ins["initial_c"][0, 0])
    full = ours(*make("LSTM", S=3, Bt=3, opts=("initial_h", "initial_c"))[:2])
    np.testing.assert_allclose(got[0][:, :, 1:], full[0][:, :, 1:], rtol=1e-6, atol=1e-7)
    ref = reference("LSTM", vals, names, attrs, 3)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_clip(op, direction):
    m, ins, *_ = make(op, attrs={"clip": 0.4, "direction": direction}, S=4,
                      opts=("B", "initial_h", "initial_c", "P"))
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_linear_before_reset(lbr, direction):
    m, ins, *_ = make("GRU", attrs={"linear_before_reset": lbr, "direction": direction}, I=18, H=16)
    assert_matches_ort(m, ins, rtol=RT, atol=AT)


@pytest.mark.parametrize("opts", [("B", "initial_h", "initial_c"), ("P",), ("B", "initial_h", "initial_c", "P")])
def test_lstm_input_forget(opts):
    m, ins, *_ = make("LSTM", attrs={"input_forget": 1, "direction": "bidirectional"}, opts=opts, S=4)
    assert_matches_ort(m, ins, rtol=RT, atol=AT)


ACTS = [("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None), ("Affine", [0.5], [0.2]),
        ("LeakyRelu", [0.3], None), ("LeakyRelu", None, None), ("ThresholdedRelu", [0.2], None),
        ("ScaledTanh", [1.5], [0.7]), ("HardSigmoid", [0.3], [0.4]), ("HardSigmoid", None, None),
        ("Elu", [0.6], None), ("Elu", None, None), ("Softsign", None, None), ("Softplus", None, None)]


@pytest.mark.parametrize("act,alpha,beta", ACTS)
def test_rnn_activations(act, alpha, beta):
    attrs = {"activations": [act]}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    m, ins, *_ = make("RNN", attrs=attrs, S=4)
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))


def test_activation_params_consumed_in_order():
    """alpha/beta go, in list order, to the functions that take them, across both directions."""
    attrs = {"direction": "bidirectional", "activations": ["HardSigmoid", "LeakyRelu", "Sigmoid", "ScaledTanh"],
             "activation_alpha": [0.3, 0.2, 0.9], "activation_beta": [0.45, 1.2]}
    m, ins, *_ = make("GRU", attrs=attrs)
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))
    attrs = {"direction": "bidirectional", "activations": ["HardSigmoid", "Elu", "Affine", "Sigmoid", "Softsign", "Relu"],
             "activation_alpha": [0.3, 0.2, 0.9], "activation_beta": [0.45, 1.2], "clip": 2.0}
    m, ins, *_ = make("LSTM", attrs=attrs, opts=("B", "initial_h", "initial_c", "P"))
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))


@pytest.mark.parametrize("act,alpha,beta", [("Affine", 1.0, 0.0), ("ThresholdedRelu", 1.0, None),
                                            ("ScaledTanh", 1.0, 1.0)])
def test_activation_spec_defaults(act, alpha, beta):
    """Without activation_alpha/beta the ONNX operators' defaults apply (the spec's rule;
    onnxruntime uses 0 for these three): equal to onnxruntime given those values explicitly."""
    m, ins, *_ = make("RNN", attrs={"activations": [act]})
    explicit = {"activations": [act], "activation_alpha": [alpha]}
    if beta is not None:
        explicit["activation_beta"] = [beta]
    m2, *_ = make("RNN", attrs=explicit)
    for g, e in zip(ours(m, ins), ort_run(m2, ins)):
        np.testing.assert_allclose(g, e, rtol=RT, atol=AT)


def test_rnn_forward_two_default_activations():
    """["Tanh", "Tanh"] (RNN's schema default) on a forward RNN means Tanh."""
    m, ins, *_ = make("RNN", attrs={"activations": ["Tanh", "Tanh"]})
    m2, *_ = make("RNN")
    for g, e in zip(ours(m, ins), ort_run(m2, ins)):
        np.testing.assert_allclose(g, e, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("opset", [7, 14, 22])
def test_opset_versions(op, opset):
    m, ins, *_ = make(op, opset=opset, attrs={"direction": "bidirectional"}, lens=[3, 2])
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_constant_weights_fused_pipeline(op):
    """W, R, B as initializers (as in real models) at O2."""
    m, ins, *_ = make(op, const=("W", "R", "B"), S=5, I=9, H=6)
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(2,))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_output_subsets(op):
    """Y omitted (only Y_h), or only Y: the outputs present match onnxruntime."""
    m, ins, *_ = make(op)
    m.graph.node[0].output[0] = ""
    del m.graph.output[0]
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))
    m, ins, *_ = make(op, outputs=["Y"])
    assert_matches_ort(m, ins, rtol=RT, atol=AT, opt_levels=(0,))


# ----------------------------------------------------------------------------- layout, dtypes
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_matches_onnx_reference(op):
    m, ins, *_ = make(op, layout=1, attrs={"direction": "bidirectional"}, opset=22,
                      opts=("B", "initial_h", "initial_c", "P"))
    exp = ReferenceEvaluator(m).run(None, ins)
    for g, e in zip(ours(m, ins), exp):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=RT, atol=AT)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_is_layout_0_transposed(op):
    """Every feature (lengths, clip, reverse, peepholes) with batch-first tensors."""
    attrs = {"direction": "bidirectional", "clip": 0.8}
    m0, ins0, *_ = make(op, attrs=attrs, lens=[1, 3], opts=("B", "initial_h", "initial_c", "P"), opset=22)
    ins1 = {k: (np.swapaxes(v, 0, 1) if k in ("X", "initial_h", "initial_c") else v) for k, v in ins0.items()}
    m1, *_ = make(op, attrs=attrs, lens=[1, 3], opts=("B", "initial_h", "initial_c", "P"), layout=1, opset=22)
    y0, y1 = ours(m0, ins0), ours(m1, ins1)
    np.testing.assert_allclose(y1[0], y0[0].transpose(2, 0, 1, 3), rtol=1e-6, atol=1e-7)
    for a, b in zip(y1[1:], y0[1:]):
        np.testing.assert_allclose(a, np.swapaxes(b, 0, 1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 3e-3)])
def test_dtypes_vs_onnx_reference(op, dtype, tol):
    m, ins, *_ = make(op, dtype=dtype, attrs={"direction": "bidirectional"},
                      opts=("B", "initial_h", "initial_c", "P"))
    exp = ReferenceEvaluator(m).run(None, ins)
    for g, e in zip(ours(m, ins), exp):
        assert g.dtype == dtype
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)


def test_float64_all_features_vs_own_reference():
    attrs = {"direction": "bidirectional", "clip": 0.75, "input_forget": 1,
             "activations": ["HardSigmoid", "Softsign", "Elu", "Sigmoid", "Tanh", "Softplus"]}
    m, ins, vals, names, attrs = make("LSTM", dtype=np.float64, attrs=attrs, lens=[2, 3],
                                      opts=("B", "initial_h", "initial_c", "P"))
    for g, r in zip(ours(m, ins), reference("LSTM", vals, names, attrs, 3)):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-13)


# ----------------------------------------------------------------------------- numpy reference
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_numpy_reference_vs_ort(op):
    attrs = {"direction": "bidirectional", "clip": 0.9}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    m, ins, vals, names, attrs = make(op, attrs=attrs, lens=[3, 2], opts=("B", "initial_h", "initial_c", "P"))
    exp = ort_run(m, ins)
    for r, e in zip(reference(op, vals, names, attrs, len(exp)), exp):
        assert r.dtype == e.dtype and r.shape == e.shape
        np.testing.assert_allclose(r, e, rtol=RT, atol=AT)


def test_constant_folding_uses_reference():
    """All inputs constant: O2 folds the node; the result still matches onnxruntime."""
    m, ins, vals, names, attrs = make("GRU", const=("X", "W", "R", "B", "initial_h"))
    exp = ort_run(m, {})
    mod = tensorfuse.compile(m, target="llvm", opt_level=2)
    for g, e in zip(mod.run(), exp):
        np.testing.assert_allclose(g, e, rtol=RT, atol=AT)


def test_one_kernel_per_node():
    from tensorfuse.ir.lowering import LowerCtx
    from tensorfuse.ir.kernel import Buffer
    from tensorfuse.ir.registry import get_op
    _, _, vals, names, attrs = make("LSTM", attrs={"direction": "bidirectional"}, lens=[1, 2],
                                    opts=("B", "initial_h", "initial_c", "P"))
    g = Graph()
    outs = Builder(g).op("LSTM", *[g.add_input(n, TensorType.of(vals[n])) if n else None for n in names],
                         num_outputs=3, attributes=attrs)
    node = outs[0].producer
    ctx = LowerCtx(node, [None if v is None else Buffer(v.name, v.dtype, v.shape, "global") for v in node.inputs],
                   [Buffer(v.name, v.dtype, v.shape, "global") for v in node.outputs], "lstm")
    get_op("LSTM").lower(ctx)
    assert len(ctx.kernels) == 1
    assert "gates" in str(ctx.kernels[0])


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("attrs,match", [
    ({"direction": "sideways"}, "direction"),
    ({"activations": ["Gelu"] * 3}, "not supported"),
    ({"activations": ["Tanh"] * 5}, "activations has 5 entries"),
    ({"hidden_size": 7}, "hidden_size=7"),
    ({"clip": -1.0}, "clip"),
])
def test_bad_attributes(op, attrs, match):
    _, _, vals, names, _ = make(op)
    if attrs.get("activations") == ["Gelu"] * 3:
        attrs = {"activations": ["Gelu"] * {"RNN": 1, "GRU": 2, "LSTM": 3}[op]}
    g = Graph()
    ins = [g.add_input(n, TensorType.of(vals[n])) if n else None for n in names]
    with pytest.raises(ShapeError, match=match):
        Builder(g).op(op, *ins, num_outputs=2, attributes=attrs)


def _build(op, vals, names, attrs=None):
    g = Graph()
    ins = [g.add_input(n, TensorType.of(vals[n])) if n else None for n in names]
    return Builder(g).op(op, *ins, num_outputs=2, attributes=attrs or {})


@pytest.mark.parametrize("change,match", [
    (lambda v: v.update(W=v["W"][:, :, :-1]), "W has shape"),
    (lambda v: v.update(R=v["R"][:, :-1]), "R has shape"),
    (lambda v: v.update(B=v["B"][:, :-1]), "B has shape"),
    (lambda v: v.update(initial_h=v["initial_h"][:, :1]), "initial_h has shape"),
    (lambda v: v.update(X=v["X"][0]), "X must be 3-D"),
    (lambda v: v.update(B=v["B"].astype(np.float64)), "dtype"),
    (lambda v: v.update(sequence_lens=np.array([1, 2], np.int64)), "int32"),
])
def test_bad_inputs(change, match):
    _, _, vals, names, _ = make("GRU", lens=[1, 2])
    change(vals)
    with pytest.raises(ShapeError, match=match):
        _build("GRU", vals, names)


def test_known_sequence_lens_out_of_range():
    m, ins, *_ = make("LSTM", lens=[2, 4], const=("sequence_lens",))
    with pytest.raises(UnsupportedModelError, match="sequence_lens"):
        tensorfuse.compile(m, target="llvm")


def test_integer_dtype_refused():
    x = np.ones((2, 1, 3), np.int32)
    g = Graph()
    ins = [g.add_input("x", TensorType.of(x)), g.add_input("w", TensorType.of(np.ones((1, 2, 3), np.int32))),
           g.add_input("r", TensorType.of(np.ones((1, 2, 2), np.int32)))]
    with pytest.raises(ShapeError, match="not supported"):
        Builder(g).op("RNN", *ins, num_outputs=2)

