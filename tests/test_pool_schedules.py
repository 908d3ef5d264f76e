"""The llvm schedule of windowed 2-D pools (``codegen/llvm/schedules/pool.py``,
``pool2d_rows_vector``, key ``"pool2d"``): MaxPool over f32, u8 and i8 and AveragePool over
f32 in NCHW (ONNX MaxPool-22 / AveragePool-22), against onnxruntime with optimisations off (or
onnx.reference where onnxruntime refuses a case), in the AVX2 form (x86-64-v3: 8 f32 / 32 u8
lanes) and the AVX-512 form (x86-64-v4: 16 / 64 lanes). A form the host cannot run is compiled
and its kernel checked to be the schedule's, not run.

Attribute sweep: kernel shapes 1..5 (non-square), strides 1..3, pads (asymmetric), dilations,
ceil_mode, count_include_pad, rows narrower and wider than one vector. Tolerances: MaxPool is
exact (a max picks one input); AveragePool rtol 1e-5, atol 1e-6 (sums of at most 25 values
in [-2, 2], another order of additions than onnxruntime's)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.compiler.driver import build_module
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.compiler.lower import lower_graph
from tensorfuse.ir.target import Target
from tests.knob_util import Fixed
from tests.oracle import node_model, ort_run, rand

HOST = Target.parse("llvm")
#: name -> (target string, features the host needs to run it)
FORMS = {
    "avx2": ("llvm -mcpu=x86-64-v3", {"avx2"}),
    "avx512": ("llvm -mcpu=x86-64-v4", {"avx512f", "avx512bw"}),
}
SCHEDULE = "llvm.pool2d_rows_vector"

# x shape, attributes
CASES = [
    ((1, 3, 12, 12), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((2, 3, 17, 19), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((1, 4, 55, 55), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),           # squeezenet
    ((1, 2, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),    # resnet18
    ((1, 2, 9, 70), dict(kernel_shape=[2, 5], strides=[1, 1], pads=[0, 2, 1, 1])),
    ((1, 2, 13, 40), dict(kernel_shape=[3, 2], strides=[3, 3], pads=[2, 1, 0, 2], ceil_mode=1)),
    ((1, 2, 16, 37), dict(kernel_shape=[3, 3], strides=[1, 2], dilations=[2, 3], pads=[2, 2, 1, 3])),
    ((1, 1, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 6, 5), dict(kernel_shape=[1, 1], strides=[1, 1])),
    ((1, 2, 7, 33), dict(kernel_shape=[4, 4], strides=[1, 1], pads=[3, 3, 3, 3])),     # windows all padding at the border rows
]


def _x(shape, dtype, seed=0):
    if dtype == np.float32:
        return rand(*shape, seed=seed)
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, size=shape).astype(dtype)


def _expected(model, feeds):
    try:
        return ort_run(model, feeds)[0]
    except Exception:                      # a case onnxruntime does not implement
        return ReferenceEvaluator(model).run(None, feeds)[0]


def _check(op, shape, attrs, dtype, form, knobs=None):
    x = _x(shape, dtype)
    model = node_model(op, {"x": x}, attrs, opset=19)
    target, needs = FORMS[form]
    graph = import_onnx(model)
    low = lower_graph(graph, Target.parse(target), tuning=Fixed(knobs) if knobs else None)
    (wl,) = low.workloads.values()
    assert wl.schedule == SCHEDULE, wl.schedule
    for k, v in (knobs or {}).items():
        assert wl.knobs.get(k) == v, (k, v, wl.knobs)
    if not needs <= HOST.feature_set:
        return
    (got,) = build_module(low, graph, ["x"], ["y"], target).run(x=x)
    expected = _expected(model, {"x": x})
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if op == "MaxPool":
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8], ids=["f32", "u8", "i8"])
@pytest.mark.parametrize("shape,attrs", CASES)
def test_maxpool(shape, attrs, dtype, form):
    _check("MaxPool", shape, attrs, dtype, form)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("shape,attrs", CASES)
def test_averagepool(shape, attrs, cip, form):
    _check("AveragePool", shape, dict(attrs, count_include_pad=cip), np.float32, form)


@pytest.mark.parametrize("op,dtype", [("MaxPool", np.uint8), ("MaxPool", np.float32), ("AveragePool", np.float32)],
                         ids=["max-u8", "max-f32", "avg-f32"])
@pytest.mark.parametrize("case", [1, 4, 6, 9])
def test_every_knob_candidate(op, dtype, case):
    """Every candidate of every knob the schedule declares (lanes, strided, rows_per_task), one
    knob at a time with the others at their defaults, on the host's widest form: stride 1 and
    2, padding, dilation, ceil_mode, a plane whose rows do not divide into tasks evenly."""
    shape, attrs = CASES[case]
    attrs = dict(attrs, count_include_pad=1) if op == "AveragePool" else attrs
    form = "avx512" if FORMS["avx512"][1] <= HOST.feature_set else "avx2"
    graph = import_onnx(node_model(op, {"x": _x(shape, dtype)}, attrs, opset=19))
    (wl,) = lower_graph(graph, Target.parse(FORMS[form][0])).workloads.values()
    names = {k.name for k in wl.space}
    assert {"lanes", "rows_per_task"} <= names and ("strided" in names) == (attrs["strides"][1] > 1)
    for k in wl.space:
        assert k.default in k.candidates and k.doc
        for cand in k.candidates:
            if cand != k.default:
                _check(op, shape, attrs, dtype, form, {k.name: cand})


def test_not_chosen_where_it_does_not_apply():
    """Indices output, 1-D and 3-D pools, and rows narrower than 4 outputs keep the other nests."""
    x = _x((1, 2, 8, 8), np.float32)
    for model in (node_model("MaxPool", {"x": x}, dict(kernel_shape=[2, 2]), outputs=("y", "i")),
                  node_model("MaxPool", {"x": x[:, :, 0]}, dict(kernel_shape=[2])),
                  node_model("MaxPool", {"x": x[:, :, :, :3]}, dict(kernel_shape=[2, 2]))):
        low = lower_graph(import_onnx(model), Target.parse(FORMS["avx2"][0]))
        assert all(w.schedule != SCHEDULE for w in low.workloads.values())


def test_fused_epilogue():
    """MaxPool followed by Relu (its epilogue when fused) and AveragePool followed by Add."""
    x = _x((1, 3, 20, 21), np.float32)
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["p"], ["y"]),
             helper.make_node("AveragePool", ["x"], ["q"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["q"], ["z"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    model = onnx.shape_inference.infer_shapes(model)
    for form, (target, needs) in FORMS.items():
        mod = tensorfuse.compile(model, target=target)
        assert sum(k.schedule == SCHEDULE for k in mod.kernels) == 2, [k.schedule for k in mod.kernels]
        assert len(mod.calls) == 2          # the activations ride in the pools' epilogues
        if needs <= HOST.feature_set:
            got = mod.run(x=x)
            for g_, e in zip(got, ort_run(model, {"x": x})):
                np.testing.assert_allclose(g_, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form,reg,lanes", [("avx2", "ymm", 32), ("avx512", "zmm", 64)])
def test_u8_maxpool_runs_in_the_forms_vectors(form, reg, lanes):
    """A u8 MaxPool with rows of 128 outputs takes the form's widest u8 vectors: VPMAXUB on
    ymm (AVX2, 32 lanes) or zmm (AVX-512BW, 64 lanes) registers, no zmm in the AVX2 form."""
    import re

    from tensorfuse.compiler.pipeline import optimized_llvm
    model = node_model("MaxPool", {"x": _x((1, 2, 8, 130), np.uint8)}, dict(kernel_shape=[3, 3]), opset=19)
    mod = tensorfuse.compile(model, target=FORMS[form][0], cache=False)
    (k,) = mod.kernels
    assert k.schedule == SCHEDULE and k.knobs["lanes"] == lanes
    _, asm = optimized_llvm(mod.llvm_ir, mod.target)
    assert re.search(rf"vpmaxub\s+%{reg}", asm), form
    assert form == "avx512" or "zmm" not in asm
