"""Explicit vector code for loop groups whose inputs broadcast (``ir/ops/fused_function.py``
``_broadcast_rows``), for a standalone per-tensor QuantizeLinear / DequantizeLinear
(``ir/ops/quant.py``) and for Softmax / LogSoftmax over a contiguous last axis
(``codegen/llvm/schedules/softmax.py``), each against onnxruntime with optimisations off, on
the host target and on AVX2 (x86-64-v3, which an AVX-512 host also runs).

QDQ results must be bit-exact: the vector and scalar forms compute the same f32 operations
(round half to even, saturate) element by element."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

import tensorfuse
from tensorfuse.ir.kernel import For, If, Load, Store
from tensorfuse.ir.schedule import expr_nodes
from tensorfuse.ir.target import Target
from tensorfuse.ir.types import DType
from tests.oracle import ort_run

TARGETS = ["llvm", "llvm -mcpu=x86-64-v3"]


def _model(nodes, inputs, outputs, inits):
    g = h.make_graph(nodes, "t", inputs, outputs, [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def _vector_loads(mod) -> int:
    """The widest Load in any kernel of the module."""
    best = 1

    def walk(stmts):
        nonlocal best
        for s in stmts:
            if isinstance(s, For):
                walk(s.body)
            elif isinstance(s, If):
                walk(s.then)
                walk(s.orelse)
            elif isinstance(s, Store):
                for e in expr_nodes(s.value):
                    if isinstance(e, Load):
                        best = max(best, e.lanes)
    for k in mod.kernels:
        walk(k.body)
    return best


def _qdq_chain(shape, mask_shape):
    """Q -> DQ -> Mul -> Q -> DQ -> Add(DQ(mask)) -> Q -> DQ: bert's attention scores."""
    inits = {"s1": np.float32(0.035), "z1": np.uint8(135), "mul": np.float32(0.125), "s2": np.float32(0.0045),
             "s3": np.float32(0.05), "z3": np.uint8(200), "ms": np.float32(0.5), "mz": np.uint8(255)}
    nodes = [h.make_node("QuantizeLinear", ["x", "s1", "z1"], ["q1"]),
             h.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             h.make_node("Mul", ["d1", "mul"], ["m"]),
             h.make_node("QuantizeLinear", ["m", "s2", "z1"], ["q2"]),
             h.make_node("DequantizeLinear", ["q2", "s2", "z1"], ["d2"]),
             h.make_node("DequantizeLinear", ["mask", "ms", "mz"], ["dm"]),
             h.make_node("Add", ["d2", "dm"], ["a"]),
             h.make_node("QuantizeLinear", ["a", "s3", "z3"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, shape), h.make_tensor_value_info("mask", T.UINT8, mask_shape)],
               [h.make_tensor_value_info("y", T.UINT8, shape)], inits)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(0, 3, shape).astype(np.float32),
             "mask": rng.choice([250, 255], mask_shape).astype(np.uint8)}
    return m, feeds


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,mask_shape", [
    ([1, 4, 32, 128], [1, 1, 1, 128]),     # rows of one axis, whole vectors
    ([2, 3, 5, 37], [2, 1, 1, 37]),         # a scalar tail, an outer broadcast axis
    ([1, 6, 9, 11], [6, 1, 1]),             # rows of two axes (99), the mask 1 along them
    ([3, 40], [40]),
])
def test_broadcast_qdq_group_is_vector_and_exact(target, shape, mask_shape):
    m, feeds = _qdq_chain(shape, mask_shape)
    expected = ort_run(m, feeds)[0]
    mod = tensorfuse.compile(m, target=target)
    assert len(mod.kernels) == 1
    assert _vector_loads(mod) >= 8
    np.testing.assert_array_equal(mod.run(**feeds)[0], expected)


def test_short_rows_keep_the_grid():
    """Rows shorter than a vector ([4, 3] against [4, 1]) keep the per-element grid, correctly."""
    m, feeds = _qdq_chain([5, 4, 3], [4, 1])
    mod = tensorfuse.compile(m)
    assert _vector_loads(mod) == 1
    np.testing.assert_array_equal(mod.run(**feeds)[0], ort_run(m, feeds)[0])


def test_broadcast_float_bias_and_erf():
    """A float broadcast group (bias [C,1,1] on NCHW, then Erf): vector, within f32 rounding."""
    shape = [1, 8, 9, 20]
    nodes = [h.make_node("Add", ["x", "b"], ["a"]), h.make_node("Erf", ["a"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, shape), h.make_tensor_value_info("b", T.FLOAT, [8, 1, 1])],
               [h.make_tensor_value_info("y", T.FLOAT, shape)], {})
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=shape).astype(np.float32), "b": rng.normal(size=[8, 1, 1]).astype(np.float32)}
    mod = tensorfuse.compile(m)
    assert _vector_loads(mod) >= 8
    np.testing.assert_allclose(mod.run(**feeds)[0], ort_run(m, feeds)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op,in_dt", [("QuantizeLinear", T.FLOAT), ("DequantizeLinear", T.UINT8)])
def test_standalone_per_tensor_qdq_is_vector(target, op, in_dt):
    shape = [1, 3, 20, 23]                  # 1380 elements: a scalar tail
    rng = np.random.default_rng(2)
    x = rng.normal(0, 2, shape).astype(np.float32) if in_dt == T.FLOAT else rng.integers(0, 256, shape).astype(np.uint8)
    out_dt = T.UINT8 if op == "QuantizeLinear" else T.FLOAT
    m = _model([h.make_node(op, ["x", "s", "z"], ["y"])], [h.make_tensor_value_info("x", in_dt, shape)],
               [h.make_tensor_value_info("y", out_dt, shape)], {"s": np.float32(0.02), "z": np.uint8(128)})
    mod = tensorfuse.compile(m, target=target, opt_level=0)
    assert _vector_loads(mod) >= 8
    np.testing.assert_array_equal(mod.run(x=x)[0], ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [[2, 4, 128], [3, 37], [2, 1000], [5, 16], [4, 208], [3, 197]])
def test_softmax_rows_vector(target, op, shape):
    x = np.random.default_rng(3).normal(0, 4, shape).astype(np.float32)
    x.flat[5] = 80.0                        # a large maximum
    m = _model([h.make_node(op, ["x"], ["y"], axis=-1)], [h.make_tensor_value_info("x", T.FLOAT, shape)],
               [h.make_tensor_value_info("y", T.FLOAT, shape)], {})
    mod = tensorfuse.compile(m, target=target)
    lanes = Target.parse(target).lanes(DType.f32)
    if shape[-1] >= 2 * lanes:
        assert {k.schedule for k in mod.kernels} == {"llvm.softmax_rows_vector"}
        assert _vector_loads(mod) == lanes
    # LogSoftmax: x - (max + log(sum)) cancels; the sum's other order moves log(sum) by an ulp
    atol = 4 * np.spacing(np.float32(np.abs(x).max() + 10)) if op == "LogSoftmax" else 1e-7
    np.testing.assert_allclose(mod.run(x=x)[0], ort_run(m, {"x": x})[0], rtol=2e-6, atol=atol)


def test_softmax_rows_vector_nan_in_tail():
    """A NaN among a row's last n % L elements (the overlapping last vector) still makes the
    whole row NaN, and only that row."""
    x = np.random.default_rng(7).normal(size=[3, 197]).astype(np.float32)
    x[1, 196] = np.nan
    m = _model([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [h.make_tensor_value_info("x", T.FLOAT, [3, 197])],
               [h.make_tensor_value_info("y", T.FLOAT, [3, 197])], {})
    got = tensorfuse.compile(m).run(x=x)[0]
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()
    np.testing.assert_allclose(got[[0, 2]], ort_run(m, {"x": x})[0][[0, 2]], rtol=2e-6, atol=1e-7)


def test_softmax_rows_vector_nan_row():
    """A NaN in a row makes the whole row NaN (as onnxruntime), other rows are unaffected."""
    x = np.random.default_rng(4).normal(size=[3, 64]).astype(np.float32)
    x[1, 40] = np.nan
    m = _model([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [h.make_tensor_value_info("x", T.FLOAT, [3, 64])],
               [h.make_tensor_value_info("y", T.FLOAT, [3, 64])], {})
    got = tensorfuse.compile(m).run(x=x)[0]
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()
    np.testing.assert_allclose(got[[0, 2]], ort_run(m, {"x": x})[0][[0, 2]], rtol=2e-6, atol=1e-7)


# ----------------------------------------------------------------------------- lookup tables
def _gelu_qdq(shape, in_type=T.UINT8, zp_in=125):
    """bert's quantized GELU: DQ -> Div(sqrt 2) -> Erf -> Q/DQ -> Add 1 -> Q/DQ -> Mul x -> Q/DQ -> Mul 0.5 -> Q."""
    zdt = np.uint8 if in_type == T.UINT8 else np.int8
    inits = {"s0": np.float32(0.0124), "z0": zdt(zp_in), "sq2": np.float32(1.4142135), "se": np.float32(0.00695),
             "ze": np.uint8(128), "one": np.float32(1.0), "sa": np.float32(0.0074), "za": np.uint8(0),
             "sm": np.float32(0.0134), "zm": np.uint8(25), "half": np.float32(0.5), "s1": np.float32(0.00668)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s0", "z0"], ["d"]), h.make_node("Div", ["d", "sq2"], ["dv"]),
             h.make_node("Erf", ["dv"], ["e"]), h.make_node("QuantizeLinear", ["e", "se", "ze"], ["eq"]),
             h.make_node("DequantizeLinear", ["eq", "se", "ze"], ["ed"]), h.make_node("Add", ["ed", "one"], ["a"]),
             h.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]), h.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"]),
             h.make_node("Mul", ["d", "ad"], ["m"]), h.make_node("QuantizeLinear", ["m", "sm", "zm"], ["mq"]),
             h.make_node("DequantizeLinear", ["mq", "sm", "zm"], ["md"]), h.make_node("Mul", ["md", "half"], ["m1"]),
             h.make_node("QuantizeLinear", ["m1", "s1", "zm"], ["y"]), h.make_node("Sigmoid", ["d"], ["y2"])]
    m = _model(nodes, [h.make_tensor_value_info("x", in_type, shape)],
               [h.make_tensor_value_info("y", T.UINT8, shape), h.make_tensor_value_info("y2", T.FLOAT, shape)], inits)
    info = np.iinfo(zdt)
    x = np.random.default_rng(5).integers(info.min, info.max + 1, shape).astype(zdt)
    x.flat[:256] = np.arange(info.min, info.max + 1).astype(zdt)       # every value at least once
    return m, {"x": x}


@pytest.mark.parametrize("in_type", [T.UINT8, T.INT8])
def test_one_8bit_input_group_is_a_table(in_type):
    """A group of one 8-bit input and two outputs runs as two 256-entry tables (one load per
    element and output), within one quantization step of onnxruntime's unfused QDQ (whose erf
    may round a value near a .5 tie the other way) and within float rounding for Sigmoid."""
    m, feeds = _gelu_qdq([3, 17, 40], in_type, 125 if in_type == T.UINT8 else -3)
    y, y2 = ort_run(m, feeds)
    mod = tensorfuse.compile(m)
    tables = [p for k in mod.kernels for p in k.params if "table" in p.name]
    assert [t.shape for t in tables] == [(256,), (256,)], [k.params for k in mod.kernels]
    got, got2 = mod.run(**feeds)
    assert got.dtype == np.uint8 and np.abs(got.astype(int) - y.astype(int)).max() <= 1
    assert (got == y).mean() > 0.99
    np.testing.assert_allclose(got2, y2, rtol=1e-6, atol=1e-7)


def test_table_needs_one_element_constants():
    """A per-position constant (a bias [40] after the DQ) makes the group depend on the
    position: no table, the vector loop."""
    shape = [3, 40]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["d"]), h.make_node("Add", ["d", "b"], ["a"]),
             h.make_node("Erf", ["a"], ["e"]), h.make_node("QuantizeLinear", ["e", "s", "z"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.UINT8, shape)], [h.make_tensor_value_info("y", T.UINT8, shape)],
               {"s": np.float32(0.01), "z": np.uint8(128), "b": np.linspace(-1, 1, 40).astype(np.float32)})
    x = np.random.default_rng(6).integers(0, 256, shape).astype(np.uint8)
    mod = tensorfuse.compile(m)
    assert not [p for k in mod.kernels for p in k.params if "table" in p.name]
    assert _vector_loads(mod) >= 8
    assert np.abs(mod.run(x=x)[0].astype(int) - ort_run(m, {"x": x})[0].astype(int)).max() <= 1
