"""8-bit elementwise chains as 256-entry tables.

- The kernel IR's :class:`~tensorfuse.ir.kernel.Lookup` (a constant table read at an i32 index)
  compiled by the LLVM backend, scalar and as a gather of 4, 8 and 16 lanes, against the numpy
  evaluator (``ir.semantics``), every index of the table.
- The rule :class:`~tensorfuse.compiler.rules.quantize.QuantizedElementwiseToTable`: where it
  fires (SiLU, Sigmoid, HardSwish, Tanh, LeakyRelu written in QDQ, u8 and i8 sources, a
  quantized conv's epilogue), where it must not (per-channel Q, an intermediate read outside the
  chain, two quantized sources, a non-elementwise op, a constant of several elements, a chain that
  only requantizes), and every result against onnxruntime with its optimisations off (the
  unfused QDQ semantics) over all 256 input codes: within one quantization step (docs: the int8
  numerical contract), and in practice equal.
- A regression: two kernels that differ only in their table (efficientnet_b0's squeeze-excite
  convs) were one kernel to ``dedupe_kernels``, whose key, the kernel text, did not show the
  table: one layer silently used another's table (relative L2 error 1.03 against 0.23).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import tensorfuse
from test_semantics import run_llvm
from tensorfuse.ir import semantics as sem
from tensorfuse.ir.kernel import Buffer, KernelBuilder, lookup
from tensorfuse.ir.types import DType


# ----------------------------------------------------------------------------- the expression
@pytest.mark.parametrize("dtype,lanes", [(DType.u8, 1), (DType.u8, 16), (DType.i8, 8), (DType.f32, 4),
                                         (DType.i32, 16), (DType.f32, 16)])
def test_lookup_expression_llvm_against_the_spec(dtype, lanes):
    rng = np.random.default_rng(lanes)
    npdt = sem._np(dtype)
    if dtype.is_float:
        table = rng.standard_normal(256).astype(npdt)
    else:
        info = np.iinfo(npdt)
        table = rng.integers(info.min, info.max, 256, endpoint=True).astype(npdt)
    n = 256 // lanes
    idx = Buffer("idx", DType.u8, (256,))
    out = Buffer("out", dtype, (256,))
    kb = KernelBuilder(f"lookup_{dtype.value}_{lanes}", [idx, out])
    with kb.loop(n, hint="i") as i:
        ix = idx.vload(i * lanes, lanes) if lanes > 1 else idx.flat(i)
        kb.store(out, i * lanes, lookup(table.tolist(), dtype, ix.cast(DType.i32)))
    codes = rng.permutation(256).astype(np.uint8)
    (got,) = run_llvm(kb.kernel, [codes], [((256,), npdt)])
    np.testing.assert_array_equal(got, table[codes])
    # the evaluator itself: table[i] per lane, and an index outside the table raises
    c = Buffer("c", DType.i32, (4,))
    e = lookup(table.tolist(), dtype, c.vload(0, 4))
    np.testing.assert_array_equal(sem.evaluate(e, {c: np.array([0, 255, 7, 128], np.int32)}),
                                  table[[0, 255, 7, 128]])
    with pytest.raises(IndexError):
        sem.evaluate(e, {c: np.array([0, 256, 1, 2], np.int32)})


def test_lookup_kernels_that_differ_in_their_table_print_differently():
    """The kernel text (the key of the compiled-kernel cache and of ``dedupe_kernels``) shows a
    digest of the table."""
    x = Buffer("x", DType.u8, (16,))
    texts = []
    for t in (list(range(256)), list(range(255, -1, -1))):
        kb = KernelBuilder("k", [x, Buffer("y", DType.u8, (16,))])
        kb.store(kb.kernel.params[1], 0, lookup(t, DType.u8, x.vload(0, 16).cast(DType.i32)))
        texts.append(str(kb.kernel))
    assert texts[0] != texts[1] and "table<u8 x 256 #" in texts[0]


# ----------------------------------------------------------------------------- the rule
def _model(chain, src_dtype=TP.UINT8, n=256, extra_outputs=(), opset=19):
    """x (``src_dtype`` [1, n]) -> DQ(xs, xz) -> chain(...) -> Q(ys, yz) -> y; ``chain(nodes, inits,
    v)`` appends nodes reading value v and returns the value the final Q reads."""
    np_src = np.uint8 if src_dtype == TP.UINT8 else np.int8
    inits = [nh.from_array(np.array(0.05, np.float32), "xs"), nh.from_array(np.array(3 if np_src == np.uint8 else -2, np_src), "xz"),
             nh.from_array(np.array(0.04, np.float32), "ys"), nh.from_array(np.array(7 if np_src == np.uint8 else -5, np_src), "yz")]
    nodes = [h.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"])]
    v = chain(nodes, inits, "xd")
    nodes.append(h.make_node("QuantizeLinear", [v, "ys", "yz"], ["y"]))
    outs = [h.make_tensor_value_info("y", src_dtype, [1, n])]
    outs += [h.make_tensor_value_info(o, TP.FLOAT, [1, n]) for o in extra_outputs]
    g = h.make_graph(nodes, "chain", [h.make_tensor_value_info("x", src_dtype, [1, n])], outs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _qdq(nodes, inits, v, name, scale, zp, dt=np.uint8):
    inits += [nh.from_array(np.array(scale, np.float32), f"{name}_s"), nh.from_array(np.array(zp, dt), f"{name}_z")]
    nodes += [h.make_node("QuantizeLinear", [v, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_d"])]
    return f"{name}_d"


def silu(nodes, inits, v):
    nodes.append(h.make_node("Sigmoid", [v], ["sg"]))
    s = _qdq(nodes, inits, "sg", "sg", 1 / 255, 0)
    nodes.append(h.make_node("Mul", [v, s], ["m"]))
    return "m"


def sigmoid(nodes, inits, v):
    nodes.append(h.make_node("Sigmoid", [v], ["sg"]))
    return "sg"


def hardswish(nodes, inits, v):
    nodes.append(h.make_node("HardSwish", [v], ["hs"]))
    return "hs"


def tanh_scaled(nodes, inits, v):
    inits.append(nh.from_array(np.array([1.7], np.float32), "k"))
    nodes += [h.make_node("Mul", [v, "k"], ["vk"]), h.make_node("Tanh", ["vk"], ["t"])]
    return "t"


def leaky(nodes, inits, v):
    nodes.append(h.make_node("LeakyRelu", [v], ["lr"], alpha=0.1))
    return "lr"


def _unfused(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _ops(mod) -> set:
    out = set()
    for n in mod.graph.nodes:
        out.add(n.op)
        body = n.attrs.get("body")
        if body is not None:
            out |= {b.op for b in body.nodes}
    return out


def _all_codes(src_dtype):
    return np.arange(256, dtype=np.uint8).view(np.uint8 if src_dtype == TP.UINT8 else np.int8).reshape(1, 256)


@pytest.mark.parametrize("chain", [silu, sigmoid, hardswish, tanh_scaled, leaky])
@pytest.mark.parametrize("src", [TP.UINT8, TP.INT8])
def test_table_fires_and_equals_the_unfused_chain(chain, src):
    m = _model(chain, src)
    x = _all_codes(src)
    mod = tensorfuse.compile(m, cache=False)
    assert [a.rule for a in mod.rewrite_log].count("QuantizedElementwiseToTable") == 1
    assert "TableLookup" in _ops(mod) and not _ops(mod) & {"Sigmoid", "HardSwish", "Tanh", "LeakyRelu"}
    (want,) = _unfused(m, {"x": x})
    (got,) = mod.run(x)
    assert got.dtype == want.dtype
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1        # the int8 contract
    assert (got == want).mean() >= 0.99
    # at O0 no rule runs: the chain as written, the same values
    (o0,) = tensorfuse.compile(m, cache=False, opt_level=0).run(x)
    assert np.abs(o0.astype(int) - got.astype(int)).max() <= 1


def _fails(m, why: str):
    mod = tensorfuse.compile(m, cache=False)
    assert "QuantizedElementwiseToTable" not in [a.rule for a in mod.rewrite_log], why
    assert "TableLookup" not in _ops(mod), why
    return mod


def test_table_does_not_fire_where_it_must_not():
    # an intermediate value (the sigmoid) is also a graph output: the chain must stay
    m = _model(silu, extra_outputs=["sg"])
    mod = _fails(m, "intermediate read outside")
    x = _all_codes(TP.UINT8)
    for got, want in zip(mod.run(x), _unfused(m, {"x": x})):
        assert np.abs(got.astype(np.float64) - want.astype(np.float64)).max() <= 0.04 + 1e-6

    # a constant of several elements (a per-position multiplier)
    def mul_vec(nodes, inits, v):
        inits.append(nh.from_array(np.linspace(0.5, 2, 256, dtype=np.float32).reshape(1, 256), "kv"))
        nodes.append(h.make_node("Mul", [v, "kv"], ["mv"]))
        nodes.append(h.make_node("Sigmoid", ["mv"], ["smv"]))
        return "smv"
    _fails(_model(mul_vec), "a constant of 256 elements")

    # two quantized sources
    def two_sources(nodes, inits, v):
        inits += [nh.from_array(np.arange(256, dtype=np.uint8).reshape(1, 256)[:, ::-1].copy(), "c8")]
        nodes.append(h.make_node("Identity", ["x"], ["x2"]))
        nodes.append(h.make_node("Add", ["x2", "c8"], ["x3"]))              # uint8 add: a second tensor
        nodes.append(h.make_node("DequantizeLinear", ["x3", "xs", "xz"], ["x3d"]))
        nodes.append(h.make_node("Add", [v, "x3d"], ["s2"]))
        nodes.append(h.make_node("Sigmoid", ["s2"], ["ss2"]))
        return "ss2"
    _fails(_model(two_sources), "two sources")

    # a non-elementwise op inside
    def softmax(nodes, inits, v):
        nodes.append(h.make_node("Softmax", [v], ["sm"], axis=-1))
        return "sm"
    _fails(_model(softmax), "Softmax is not elementwise")

    # a chain that only requantizes (Q(DQ(x)) with other parameters): nothing to tabulate
    _fails(_model(lambda nodes, inits, v: v), "requantize only")

    # a per-channel Q at the end
    m = _model(sigmoid)
    g = m.graph
    for t in g.initializer:
        if t.name in ("ys", "yz"):
            arr = nh.to_array(t)
            t.CopyFrom(nh.from_array(np.full((256,), arr, arr.dtype), t.name))
    g.node[-1].attribute.append(h.make_attribute("axis", 1))
    _fails(m, "per-channel Q")


def _conv_silu_model(c, m_out, hw, params):
    """Two parallel branches of QDQ 1x1 conv + quantized SiLU that differ only in their
    SiLU's quantization parameters: two fused kernels identical but for their table."""
    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, (m_out, c, 1, 1)).astype(np.int8)
    ws = (rng.random(m_out) * 0.01 + 0.002).astype(np.float32)
    inits = [nh.from_array(w, "w"), nh.from_array(ws, "ws"), nh.from_array(np.zeros(m_out, np.int8), "wz"),
             nh.from_array(np.array(0.02, np.float32), "xs"), nh.from_array(np.array(128, np.uint8), "xz")]
    nodes = [h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0)]
    outs = []
    for i, (cs, cz, ms, mz) in enumerate(params):
        # each branch its own input: two kernels whose text differs only in the table
        nodes += [h.make_node("QuantizeLinear", [f"x{i}", "xs", "xz"], [f"xq{i}"]),
                  h.make_node("DequantizeLinear", [f"xq{i}", "xs", "xz"], [f"xd{i}"]),
                  h.make_node("Conv", [f"xd{i}", "wd"], [f"c{i}"])]
        d = _qdq(nodes, inits, f"c{i}", f"c{i}", cs, cz)
        nodes.append(h.make_node("Sigmoid", [d], [f"sg{i}"]))
        s = _qdq(nodes, inits, f"sg{i}", f"sg{i}", 1 / 255, 0)
        nodes.append(h.make_node("Mul", [d, s], [f"m{i}"]))
        inits += [nh.from_array(np.array(ms, np.float32), f"ms{i}"), nh.from_array(np.array(mz, np.uint8), f"mz{i}")]
        nodes.append(h.make_node("QuantizeLinear", [f"m{i}", f"ms{i}", f"mz{i}"], [f"y{i}"]))
        outs.append(h.make_tensor_value_info(f"y{i}", TP.UINT8, [1, m_out, hw, hw]))
    ins = [h.make_tensor_value_info(f"x{i}", TP.FLOAT, [1, c, hw, hw]) for i in range(len(params))]
    g = h.make_graph(nodes, "convsilu", ins, outs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("c,m_out,hw", [(16, 24, 9), (144, 6, 1)])
def test_conv_epilogue_tables_stay_apart(c, m_out, hw):
    """Each branch's kernel computes the conv, requantizes and reads its own table (a gather
    in the epilogue); with one table shared (the dedupe defect) the second branch is wrong."""
    m = _conv_silu_model(c, m_out, hw, [(0.05, 122, 0.03, 3), (0.11, 30, 0.07, 9)])
    x = np.random.default_rng(1).standard_normal((1, c, hw, hw)).astype(np.float32) * 2
    feeds = {"x0": x, "x1": x}
    mod = tensorfuse.compile(m, cache=False)
    assert [a.rule for a in mod.rewrite_log].count("QuantizedElementwiseToTable") == 2
    convs = [k for k in mod.kernels if "ConvIntegerToFloat" in k.comment and not k.name.endswith("_pack")]
    assert len(convs) == 2 and convs[0].name != convs[1].name       # not merged by dedupe_kernels
    for got, want in zip(mod.run(**feeds), _unfused(m, feeds)):
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
