"""Normalisation ops against onnxruntime (ONNX spec sections of each op)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, get_op, run_reference
from tensorfuse.ir.types import DType, TensorType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5


def _ref(op, arrays, num_outputs=1, **attrs):
    g = Graph()
    ins = [None if a is None else g.add_input(f"x{i}", TensorType.of(a)) for i, a in enumerate(arrays)]
    out = Builder(g).op(op, *ins, num_outputs=num_outputs, **attrs)
    node = (out[0] if isinstance(out, list) else out).producer
    return run_reference(node, list(arrays))


# ----------------------------------------------------------------------------- LayerNormalization
LN_CASES = [((3, 5), -1, (5,)), ((2, 3, 4), -1, (4,)), ((2, 3, 4), 1, (3, 4)), ((2, 3, 4), 0, (2, 3, 4)),
            ((2, 3, 4), -2, (1, 4)), ((2, 3, 4), 1, (3, 1)), ((2, 3, 4), 1, ()), ((6,), 0, (6,)),
            ((1, 8, 300), -1, (300,))]


@pytest.mark.parametrize("shape,axis,sshape", LN_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm(shape, axis, sshape, with_bias):
    x, s, b = rand(*shape), rand(*sshape, seed=1), rand(*sshape, seed=2)
    inputs = {"x": x, "s": s, **({"b": b} if with_bias else {})}
    m = node_model("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, outputs=("y", "mean", "inv"))
    assert_matches_ort(m, inputs, rtol=RT, atol=AT)


def test_layernorm_default_attrs_single_output():
    x, s, b = rand(2, 4, 8), rand(8, seed=1), rand(8, seed=2)
    m = node_model("LayerNormalization", {"x": x, "s": s, "b": b})
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=RT, atol=AT)


def test_layernorm_omitted_mean_output():
    x, s = rand(2, 3, 4), rand(4, seed=1)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"], axis=-1)
    g = helper.make_graph([node], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, s.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape),
                           helper.make_tensor_value_info("inv", TensorProto.FLOAT, (2, 3, 1))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    assert_matches_ort(m, {"x": x, "s": s}, rtol=RT, atol=AT)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float16, 3e-3)])
def test_layernorm_dtypes(dtype, tol):
    x, s, b = rand(2, 3, 6, dtype=dtype), rand(6, dtype=dtype, seed=1), rand(6, dtype=dtype, seed=2)
    m = node_model("LayerNormalization", {"x": x, "s": s, "b": b}, {"axis": -1}, outputs=("y", "mean", "inv"))
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=tol, atol=tol)


def test_layernorm_reference_matches_ort():
    x, s, b = rand(2, 3, 4), rand(3, 4, seed=1), rand(3, 4, seed=2)
    exp = ort_run(node_model("LayerNormalization", {"x": x, "s": s, "b": b}, {"axis": 1},
                             outputs=("y", "mean", "inv")), {"x": x, "s": s, "b": b})
    got = _ref("LayerNormalization", [x, s, b], num_outputs=3, axis=1)
    for g_, e in zip(got, exp):
        assert g_.dtype == e.dtype and g_.shape == e.shape
        np.testing.assert_allclose(g_, e, rtol=RT, atol=AT)


@pytest.mark.parametrize("sshape,attrs,msg", [((5,), {}, "does not broadcast"),
                                              ((4,), {"axis": 3}, "out of range"),
                                              ((4,), {"stash_type": 16}, "stash_type")])
def test_layernorm_errors(sshape, attrs, msg):
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 3, 4)))
    s = g.add_input("s", TensorType(DType.f32, sshape))
    with pytest.raises(ShapeError, match=msg):
        Builder(g).LayerNormalization(x, s, **attrs)


def test_layernorm_flops():
    g = Graph()
    out = Builder(g).LayerNormalization(g.add_input("x", TensorType(DType.f32, (2, 4))),
                                        g.add_input("s", TensorType(DType.f32, (4,))))
    assert get_op("LayerNormalization").flops(out.producer) > 0


def _typed_model(op, inputs, attrs, out_shape, out_dtype=np.float32, opset=17, initializers=None):
    """One-node model with the output type given (ONNX shape inference skips function ops)."""
    initializers = initializers or {}
    node = helper.make_node(op, list(inputs) + list(initializers), ["y"], **attrs)
    g = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), out_shape)],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _onnx_reference(model, inputs):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, inputs)


def _compile_run(model, inputs, opt_level=0):
    import tensorfuse
    return tensorfuse.compile(model, opt_level=opt_level).run(**inputs)


# ----------------------------------------------------------------------------- InstanceNormalization
@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 2, 2), (1, 4, 1100)])
@pytest.mark.parametrize("opset", [7, 17, 22])
def test_instancenorm(shape, opset):
    x, s, b = rand(*shape), rand(shape[1], seed=1), rand(shape[1], seed=2)
    m = node_model("InstanceNormalization", {"x": x, "s": s, "b": b}, {"epsilon": 1e-3}, opset=opset)
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=RT, atol=AT)


def test_instancenorm_f16():
    x, s, b = (rand(2, 3, 5, dtype=np.float16), rand(3, dtype=np.float16, seed=1),
               rand(3, dtype=np.float16, seed=2))
    m = node_model("InstanceNormalization", {"x": x, "s": s, "b": b})
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=3e-3, atol=3e-3, opt_levels=(0,))


def test_instancenorm_f64_against_onnx_reference():   # onnxruntime has no f64 kernel
    x, s, b = rand(2, 3, 5, dtype=np.float64), rand(3, dtype=np.float64, seed=1), rand(3, dtype=np.float64, seed=2)
    m = node_model("InstanceNormalization", {"x": x, "s": s, "b": b})
    got = _compile_run(m, {"x": x, "s": s, "b": b})[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _onnx_reference(m, {"x": x, "s": s, "b": b})[0], rtol=1e-10, atol=1e-10)


def test_instancenorm_reference_and_errors():
    x, s, b = rand(2, 3, 4), rand(3, seed=1), rand(3, seed=2)
    exp = ort_run(node_model("InstanceNormalization", {"x": x, "s": s, "b": b}), {"x": x, "s": s, "b": b})[0]
    np.testing.assert_allclose(_ref("InstanceNormalization", [x, s, b])[0], exp, rtol=RT, atol=AT)
    g = Graph()
    xi = g.add_input("x", TensorType(DType.f32, (2, 3, 4)))
    with pytest.raises(ShapeError, match="shape"):
        Builder(g).InstanceNormalization(xi, g.add_input("s", TensorType(DType.f32, (4,))),
                                         g.add_input("b", TensorType(DType.f32, (3,))))
    with pytest.raises(ShapeError, match="rank"):
        Builder(g).InstanceNormalization(g.add_input("x2", TensorType(DType.f32, (2, 3))),
                                         g.add_input("s2", TensorType(DType.f32, (3,))),
                                         g.add_input("b2", TensorType(DType.f32, (3,))))


# ----------------------------------------------------------------------------- GroupNormalization
@pytest.mark.parametrize("shape,groups", [((2, 6, 4, 5), 3), ((2, 6, 4, 5), 1), ((2, 6, 4, 5), 6),
                                          ((1, 4, 7), 2), ((3, 4), 2)])
def test_groupnorm_21(shape, groups):
    x, s, b = rand(*shape), rand(shape[1], seed=1), rand(shape[1], seed=2)
    m = _typed_model("GroupNormalization", {"x": x, "s": s, "b": b},
                     {"num_groups": groups, "epsilon": 1e-3}, x.shape, opset=21)
    assert_matches_ort(m, {"x": x, "s": s, "b": b}, rtol=RT, atol=AT)


@pytest.mark.parametrize("const_params", [True, False])
def test_groupnorm_18_per_group_params(const_params):
    """GroupNormalization-18 (scale/bias per group) is deprecated, so onnx.checker rejects it:
    import it unchecked and evaluate the imported graph with the registry's references."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.ir.registry import find_op
    x, s, b = rand(2, 6, 3, 2), rand(3, seed=1), rand(3, seed=2)
    if const_params:
        m = _typed_model("GroupNormalization", {"x": x}, {"num_groups": 3}, x.shape, opset=18,
                         initializers={"s": s, "b": b})
        inputs = {"x": x}
    else:
        if find_op("Gather") is None:
            pytest.skip("Gather is not registered yet")
        m = _typed_model("GroupNormalization", {"x": x, "s": s, "b": b}, {"num_groups": 3}, x.shape, opset=18)
        inputs = {"x": x, "s": s, "b": b}
    g = import_onnx(m, check=False)
    env = {id(v): inputs[v.name] for v in g.inputs}
    env.update({id(v): v.data for v in g.constants.values()})
    for n in g.nodes:
        outs = run_reference(n, [None if v is None else env[id(v)] for v in n.inputs])
        env.update({id(v): a for v, a in zip(n.outputs, outs)})
    assert [n.op for n in g.nodes][-1] == "GroupNormalization"
    exp = _onnx_reference(m, inputs)[0]
    np.testing.assert_allclose(env[id(g.outputs[0])], exp, rtol=RT, atol=AT)


def test_groupnorm_reference_matches_ort_and_errors():
    x, s, b = rand(2, 4, 3), rand(4, seed=1), rand(4, seed=2)
    m = _typed_model("GroupNormalization", {"x": x, "s": s, "b": b}, {"num_groups": 2}, x.shape, opset=21)
    exp = ort_run(m, {"x": x, "s": s, "b": b})[0]
    np.testing.assert_allclose(_ref("GroupNormalization", [x, s, b], num_groups=2)[0], exp, rtol=RT, atol=AT)
    g = Graph()
    xi = g.add_input("x", TensorType(DType.f32, (2, 4, 3)))
    si = g.add_input("s", TensorType(DType.f32, (4,)))
    with pytest.raises(ShapeError, match="num_groups"):
        Builder(g).GroupNormalization(xi, si, si, num_groups=3)


# ----------------------------------------------------------------------------- LpNormalization
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", [((2, 3, 4), -1), ((2, 3, 4), 1), ((2, 3, 4), 0), ((5,), 0)])
def test_lpnorm(p, shape, axis):
    x = rand(*shape)
    assert_matches_ort(node_model("LpNormalization", {"x": x}, {"p": p, "axis": axis}), {"x": x},
                       rtol=RT, atol=AT)


def test_lpnorm_zero_vector_and_default_attrs():
    x = np.zeros((2, 3), np.float32)
    x[1] = [3.0, 4.0, 0.0]
    got = assert_matches_ort(node_model("LpNormalization", {"x": x}), {"x": x}, rtol=RT, atol=AT)
    np.testing.assert_allclose(got[0][1], [0.6, 0.8, 0.0], rtol=1e-6)


def test_lpnorm_reference_and_errors():
    x = rand(2, 3)
    exp = ort_run(node_model("LpNormalization", {"x": x}, {"p": 1, "axis": 0}), {"x": x})[0]
    np.testing.assert_allclose(_ref("LpNormalization", [x], p=1, axis=0)[0], exp, rtol=RT, atol=AT)
    g = Graph()
    with pytest.raises(ShapeError, match="p must be"):
        Builder(g).LpNormalization(g.add_input("x", TensorType(DType.f32, (2, 3))), p=3)


# ----------------------------------------------------------------------------- MeanVarianceNormalization
@pytest.mark.parametrize("axes", [None, [1, 3], [0, 1, 2, 3], [-1], [2]])
def test_mvn(axes):
    x = rand(2, 3, 4, 5)
    attrs = {} if axes is None else {"axes": axes}
    m = _typed_model("MeanVarianceNormalization", {"x": x}, attrs, x.shape, opset=13)
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=1e-4)


def test_mvn_opset9_and_reference():
    x = rand(2, 3, 2, 2)
    m = _typed_model("MeanVarianceNormalization", {"x": x}, {}, x.shape, opset=9)
    exp = ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(_compile_run(m, {"x": x})[0], exp, rtol=RT, atol=1e-4)
    np.testing.assert_allclose(_ref("MeanVarianceNormalization", [x])[0], exp, rtol=RT, atol=1e-4)


# ----------------------------------------------------------------------------- LRN
def _lrn_spec(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """The spec's formula, element by element (onnx.reference's LRN loops over N, not C)."""
    y = np.empty_like(x)
    C = x.shape[1]
    for c in range(C):
        lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + -(-(size - 1) // 2))
        sq = np.sum(x[:, lo:hi + 1].astype(np.float64) ** 2, axis=1)
        y[:, c] = x[:, c] / (bias + alpha / size * sq) ** beta
    return y


@pytest.mark.parametrize("size", [1, 3, 5])
@pytest.mark.parametrize("shape", [(2, 6, 3, 4), (1, 7, 1, 1100)])
def test_lrn(size, shape):
    x = rand(*shape)
    m = node_model("LRN", {"x": x}, {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5})
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT)


@pytest.mark.parametrize("beta,bias,pow_call", [
    (0.75, 1.0, False),     # AlexNet's (the default): sqrt(d) * sqrt(sqrt(d))
    (0.5, 2.0, False),      # sqrt(d)
    (1.0, 1.0, False),      # d
    (0.6, 1.5, False),      # exp(beta * log(d)), d > 0
    (1.7, -0.5, True),      # bias < 0, d may be negative: the scalar pow (NaN where pow gives NaN)
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lrn_powers(beta, bias, pow_call, dtype):
    """d ** beta of LRN by its cheaper forms where they are exact enough (lrn_power), on values
    up to 40 (sums of squares up to 8000) and tiny ones, against the spec's formula in float64
    (with the float32 attribute values); the kernel is parallel over (n, c) and float32 calls
    pow only for the last case (there |x| >= 5 keeps d >= 0.25 away from the cancellation at 0)."""
    import tensorfuse
    from tests.codegen_util import function_ir, kernel_is_parallel, optimized_ir
    rng = np.random.default_rng(3)
    shape = (2, 9, 7, 33)
    if bias < 0:
        x = (rng.uniform(5.0, 40.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)
    else:
        x = (rng.standard_normal(shape) * np.array([40.0, 1e-3, 1.0])[rng.integers(0, 3, shape)]).astype(dtype)
    attrs = {"size": 5, "alpha": 0.05, "beta": beta, "bias": bias}
    m = node_model("LRN", {"x": x}, attrs)
    mod = tensorfuse.compile(m, num_threads=2, cache=False)
    f32 = {k: float(np.float32(v)) for k, v in attrs.items() if k != "size"}
    want = _lrn_spec(x.astype(np.float64), 5, **f32)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(mod.run(x=x)[0], want, rtol=tol, atol=tol * 1e-3)
    (k,) = mod.kernels
    assert kernel_is_parallel(k)
    if dtype == np.float32:
        assert ("llvm.pow" in function_ir(optimized_ir(mod), k.name)) == pow_call


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("shape", [(1, 5, 3, 2), (2, 4, 5), (1, 6)])
def test_lrn_even_size_and_other_ranks(size, shape):   # onnxruntime: odd sizes, 4-D only
    x = rand(*shape)
    m = node_model("LRN", {"x": x}, {"size": size, "alpha": 0.05})
    np.testing.assert_allclose(_compile_run(m, {"x": x})[0], _lrn_spec(x, size, alpha=0.05), rtol=RT, atol=AT)


def test_lrn_defaults_reference_and_errors():
    x = rand(1, 5, 3, 2)
    m = node_model("LRN", {"x": x}, {"size": 3})
    exp = ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(_ref("LRN", [x], size=3)[0], exp, rtol=RT, atol=AT)
    assert_matches_ort(m, {"x": x}, rtol=RT, atol=AT, opt_levels=(0,))
    g = Graph()
    with pytest.raises(ShapeError, match="size"):
        Builder(g).LRN(g.add_input("x", TensorType(DType.f32, (1, 3, 2))), size=0)


@pytest.mark.parametrize("n", [7, 31, 32, 33, 100])
def test_layernorm_row_sums_at_each_vector_width(vector_width, n):
    """f32 rows of at least two vectors sum their statistics in L partial sums over whole
    vectors (the llvm row_norm schedule, codegen/llvm/schedules/norm.py row_sum_lanes), then
    the lanes and the scalar tail; shorter rows keep one running sum. At 4, the host's and 16
    lanes, rows with and without a tail match onnxruntime (LayerNormalization, opset 17), with
    inputs offset by 3 so a wrong mean shows."""
    import tensorfuse
    from tensorfuse.codegen.llvm.schedules.norm import row_sum_lanes
    from tensorfuse.ir.kernel import Buffer
    from tensorfuse.ir.types import DType
    target, lanes = vector_width
    x = rand(3, 5, n, seed=n) + 3.0
    inputs = {"x": x}
    consts = {"s": rand(n, seed=1), "b": rand(n, seed=2)}
    model = node_model("LayerNormalization", inputs, {"axis": -1, "epsilon": 1e-5}, initializers=consts)
    mod = tensorfuse.compile(model, target=target, cache=False)
    (k,) = [k for k in mod.kernels if "LayerNormalization" in k.comment]
    want_lanes = lanes if n >= 2 * lanes else 1
    assert row_sum_lanes(Buffer("x", DType.f32, x.shape), n, DType.f32, target) == want_lanes
    assert any(b.name.startswith("part") and b.shape == (lanes,) for b in k.locals) == (want_lanes > 1)
    np.testing.assert_allclose(mod.run(**inputs)[0], ort_run(model, inputs)[0], rtol=1e-5, atol=1e-5)
