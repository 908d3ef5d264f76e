"""Graph outputs larger than L2 that no kernel reads are written with non-temporal stores
(``Kernel.stream``, ``compiler.lower.STREAM_MIN_L2_SHARE``; the llvm backend emits
``!nontemporal`` stores, VMOVNTPS / VMOVNTDQ, where a whole vector's offset is provably a
multiple of its size, and SFENCE after each parallel chunk). The results are the plain stores'
bit for bit; intermediates, outputs another node reads, small outputs and AMX kernels keep plain
stores."""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tensorfuse
import tensorfuse.compiler.lower as lower
from oracle import ort_run
from tensorfuse.codegen.llvm.emit import pow2_multiple
from tensorfuse.compiler.pipeline import optimized_llvm
from tensorfuse.ir.kernel import Bin, Cast, Const, Var
from tensorfuse.ir.schedule import loaded_buffers
from tensorfuse.ir.types import DType

#: AVX-512 with VNNI and without AMX, whatever the host: its L2 is the default 512 KiB
V4 = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"
#: AVX2 (32-byte vectors)
AVX2 = "llvm -mcpu=haswell"


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _convinteger(m=256, hw=56, extra_reader=False):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 64, hw, hw)).astype(np.uint8)
    w = rng.integers(-128, 128, (m, 64, 1, 1)).astype(np.int8)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.INT32, (1, m, hw, hw))]
    if extra_reader:        # y is also read by another node
        nodes.append(helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0))
        outs.append(helper.make_tensor_value_info("s", TensorProto.INT32, ()))
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)], outs,
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(7, np.uint8), "xz")])
    return model, {"x": x}


def _asm(mod) -> str:
    return optimized_llvm(mod.llvm_ir, mod.target)[1]


def _compile(model, target, share=None):
    old = lower.STREAM_MIN_L2_SHARE
    if share is not None:
        lower.STREAM_MIN_L2_SHARE = share
    try:
        return tensorfuse.compile(model, target=target, num_threads=2, cache=False)
    finally:
        lower.STREAM_MIN_L2_SHARE = old


def test_pow2_multiple():
    i, j = Var("i"), Var("j")
    assert pow2_multiple(Const(48)) == 16 and pow2_multiple(Const(0)) == 1 << 12
    assert pow2_multiple(Bin("add", Bin("mul", i, Const(3136)), Bin("mul", j, Const(16)))) == 16
    assert pow2_multiple(Bin("add", Bin("mul", i, Const(56)), Const(4))) == 4
    assert pow2_multiple(Bin("shl", Cast(DType.i64, i), Const(5))) == 32
    assert pow2_multiple(Bin("add", i, Const(64))) == 1          # i alone: anything
    assert pow2_multiple(Bin("div", Bin("mul", i, Const(64)), Const(2))) == 1


@pytest.mark.parametrize("target", [V4, AVX2])
def test_large_output_streams_and_matches(target):
    """ConvInteger with a 3.2 MB int32 output (over any L2 of these targets): its kernel streams
    ``y`` (non-temporal vector stores and SFENCE in the assembly) and the result equals
    onnxruntime's exactly, and the plain stores' (run where the host has the target's ISA)."""
    model, feeds = _convinteger()
    mod = _compile(model, target)
    conv = [k for k in mod.kernels if k.stream]
    assert conv and all(k.stream == {"y"} for k in conv), [k.stream for k in mod.kernels]
    asm = _asm(mod)
    assert re.search(r"\bvmovnt(dq|ps)\b", asm) and re.search(r"\bsfence\b", asm)
    plain = _compile(model, target, share=1e9)
    assert not any(k.stream for k in plain.kernels) and not re.search(r"\bvmovnt", _asm(plain))
    if mod.runs_here:
        got = mod.run(**feeds)[0]
        np.testing.assert_array_equal(got, ort_run(model, feeds)[0])
        np.testing.assert_array_equal(got, plain.run(**feeds)[0])


def test_fp32_elementwise_output_streams():
    """A float elementwise chain with an 8 MiB output: the fused loop's output streams; the
    values are onnx.reference's."""
    x = np.random.default_rng(1).standard_normal((1, 32, 256, 256)).astype(np.float32)
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
    mod = _compile(model, V4)
    assert any(k.stream for k in mod.kernels)
    assert re.search(r"\bvmovntps\b", _asm(mod))
    if mod.runs_here:
        np.testing.assert_array_equal(mod.run(x=x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_no_stream_where_it_must_not():
    """Plain stores for: an output another node reads (ConvInteger's y summed by ReduceSum), an
    output under the L2 share (64 channels at 14x14: 50 KB), an intermediate, and a kernel on
    AMX tiles."""
    model, feeds = _convinteger(extra_reader=True)
    mod = _compile(model, V4)
    assert not any(k.stream for k in mod.kernels), [k.stream for k in mod.kernels]
    if mod.runs_here:
        y, s = mod.run(**feeds)
        np.testing.assert_array_equal(y, ort_run(model, feeds)[0])
        assert int(s) == int(y.sum(dtype=np.int32))          # int32 wraps (numpy's and onnx.reference's sum)
    small, _ = _convinteger(m=64, hw=14)
    assert not any(k.stream for k in _compile(small, V4).kernels)
    x = np.zeros((1, 32, 256, 256), np.float32)
    chain = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceMax", ["r"], ["y"], keepdims=0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ())])
    assert not any(k.stream for k in _compile(chain, V4).kernels)
    amx, _ = _convinteger(m=256)
    amx_mod = tensorfuse.compile(amx, target="llvm -mcpu=sapphirerapids", cache=False,
                                 tuning=_amx_tuning())
    assert any("amx" in k.comment for k in amx_mod.kernels)
    assert not any(k.stream for k in amx_mod.kernels)


def test_kernel_reading_its_output_keeps_plain_stores():
    """Softmax over rows of an 8 MiB output: its kernel writes the exponentials to y and reads
    them back to scale them, so y is not streamed; the values are onnx.reference's."""
    x = np.random.default_rng(2).standard_normal((2048, 1024)).astype(np.float32)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
    mod = _compile(model, V4)
    readers = [k for k in mod.kernels if "y" in loaded_buffers(k.body)]
    assert readers and not any(k.stream for k in readers), [(k.name, k.stream) for k in mod.kernels]
    if mod.runs_here:
        np.testing.assert_allclose(mod.run(x=x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-7)


def _amx_tuning():
    from test_int8_schedules import _fixed
    return _fixed(int8_engine="amx")
