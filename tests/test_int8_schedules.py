"""The llvm int8 schedules (``codegen/llvm/schedules/conv2d_int8.py``, ``matmul_int8.py``) in
each instruction form: ConvInteger, QLinearConv, MatMulInteger and QLinearMatMul with constant weights, against onnxruntime (or onnx.reference where
onnxruntime lacks the case or saturates: its u8 x s8 kernels on x86 use VPMADDUBSW, whose
pairwise int16 sums saturate, a documented MLAS limitation), bit-exact for int32 outputs and
within one quantization step for requantized ones.

Forms (:data:`FORMS`): VPDPBUSD at 16 lanes (x86-64-v4 + AVX-512 VNNI), at 8 lanes (x86-64-v3 +
AVX-VNNI), and the AVX2 form (x86-64-v3: VPMADDWD on int16-widened operands). A form the host cannot run is compiled and its kernel IR
and assembly inspected instead. The kernels are checked to be the int8 schedule's (their
``DotAcc`` nodes and the instruction in the assembly), not the generic nest."""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from oracle import node_model, ort_run
from tensorfuse.compiler.pipeline import optimized_llvm
from tensorfuse.ir.kernel import DotAcc, Store
from tensorfuse.ir.schedule import expr_nodes, walk_stmts
from tensorfuse.ir.target import Target

HOST = Target.parse("llvm")
#: name -> (target string, (packing, isa, lanes) its kernels must use, features the host needs to run it)
FORMS = {
    "vnni512": ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", ("u8s8", "vnni", 16), {"avx512vnni", "avx512bw"}),
    "vnni256": ("llvm -mcpu=x86-64-v3 -mattr=+avxvnni", ("u8s8", "vnni", 8), {"avxvnni"}),
    "avx2": ("llvm -mcpu=x86-64-v3", ("s16s16", "pmaddwd", 8), {"avx2"}),
}


#: Zen 4's cost model (512-bit operations split in two 256-bit halves) for code that any AVX-512
#: VNNI CPU runs: ``-sse4a`` leaves out the one AMD-only feature LLVM's znver4 would allow
ZEN4 = "llvm -mcpu=znver4 -mattr=-sse4a,+avx512vnni"


def _runs_here(form: str) -> bool:
    return FORMS[form][2] <= HOST.feature_set


def _stored_nodes(mod):
    """Every expression node of every stored value in the module's kernels."""
    for k in mod.kernels:
        for s in walk_stmts(k.body):
            if isinstance(s, Store):
                yield from expr_nodes(s.value)


def _dots(mod) -> set:
    """(packing, isa, lanes) of every DotAcc in the module's kernels."""
    return {(e.packing, e.isa, e.lanes) for e in _stored_nodes(mod) if isinstance(e, DotAcc)}


def _check_dots(mod, form: str) -> None:
    """The kernels use the form's instruction (at its width, or narrower where the schedule
    chose fewer lanes for short rows)."""
    dots = _dots(mod)
    packing, isa, lanes = FORMS[form][1]
    assert dots and {(p, i) for p, i, _ in dots} == {(packing, isa)} and max(n for *_, n in dots) <= lanes, dots


def _q(shape, dtype, rng, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, size=shape).astype(dtype)


def _compile_check(model, feeds, form: str, expected, schedule: str, atol=0):
    """Compile for ``form``; check the schedule and the DotAcc form; run and compare with
    ``expected`` where the host can, else check the assembly has the instruction."""
    target, dot, _ = FORMS[form]
    mod = tensorfuse.compile(model, target=target)
    assert {k.schedule for k in mod.kernels} == {f"llvm.{schedule}"}, [k.schedule for k in mod.kernels]
    _check_dots(mod, form)
    if not _runs_here(form):
        _, asm = optimized_llvm(mod.llvm_ir, mod.target)
        assert re.search(r"vpdpbusd\s" if dot[1] == "vnni" else r"vpmaddwd\s", asm)
        return
    (got,) = mod.run(**feeds)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if atol == 0:
        np.testing.assert_array_equal(got, expected)
    else:
        assert np.abs(got.astype(np.int64) - expected.astype(np.int64)).max() <= atol


def _oracle(model, feeds, u8s8: bool):
    """onnxruntime, or onnx.reference for u8 x s8 (onnxruntime's x86 kernels saturate there)."""
    if u8s8:
        return ReferenceEvaluator(model).run(None, feeds)[0]
    return ort_run(model, feeds)[0]


# ----------------------------------------------------------------------------- ConvInteger
CONV_CASES = [
    # x shape, w shape, attrs, x dtype, w dtype, x zero point, w zero point (None: absent)
    ((1, 5, 9, 11), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}, np.uint8, np.int8, 7, None),
    ((2, 6, 9, 20), (19, 6, 3, 3), {"pads": [1, 2, 0, 1], "strides": [2, 2]}, np.int8, np.int8, -5, 3),
    ((1, 3, 12, 13), (5, 3, 3, 2), {"dilations": [2, 2], "pads": [2, 1, 1, 2]}, np.uint8, np.uint8, 130,
     [1, 200, 3, 128, 77]),
    ((1, 33, 7, 7), (40, 33, 1, 1), {}, np.uint8, np.uint8, 0, 128),
    ((1, 16, 14, 14), (24, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}, np.uint8, np.int8, 0, 0),
    ((1, 8, 5, 40), (3, 8, 5, 5), {"pads": [2, 2, 2, 2], "auto_pad": "NOTSET"}, np.int8, np.int8, 0, [0, 4, -9]),
    # a stem: 7x7 stride 2 (two column phases, one kernel row per reduction step)
    ((1, 3, 30, 31), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, np.uint8, np.int8, 128, None),
    # stride 3 in width with dilation in height: three column phases
    ((1, 4, 17, 19), (6, 4, 3, 3), {"strides": [2, 3], "dilations": [2, 1], "pads": [0, 1, 1, 0]}, np.uint8,
     np.uint8, 9, 77),
    # kernels shorter than the vertical stride: the panel holds only the rows the taps read
    # (a 1x1 stride-2 downsample; 2 kernel rows at stride 3 with a pad)
    ((1, 12, 15, 16), (20, 12, 1, 1), {"strides": [2, 2]}, np.uint8, np.int8, 140, None),
    ((1, 5, 14, 13), (9, 5, 2, 2), {"strides": [3, 2], "pads": [1, 0, 0, 1]}, np.int8, np.int8, -3, 2),
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("xs,ws,attrs,xdt,wdt,xz,wz", CONV_CASES)
def test_conv_integer(form, xs, ws, attrs, xdt, wdt, xz, wz):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w = _q(xs, xdt, rng), _q(ws, wdt, rng)
    inits = {"w": w, "xz": np.array(xz, xdt)}
    names = ["x", "w", "xz"]
    if wz is not None:
        inits["wz"] = np.array(wz, wdt)
        names.append("wz")
    m = node_model("ConvInteger", {"x": x}, attrs, initializers=inits, input_names=names)
    per_channel = wz is not None and np.ndim(wz) == 1
    # onnxruntime takes a scalar w zero point only
    exp = _oracle(m, {"x": x}, xdt == np.uint8 and wdt == np.int8 or per_channel)
    _compile_check(m, {"x": x}, form, exp, "conv2d_int8")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("wdt", [np.int8, np.uint8])
def test_conv_integer_saturation_edge(form, wdt):
    """x = 255 everywhere and weights -128 / 127 (s8) or 255 / 0 (u8) in runs: VPMADDUBSW's
    pairwise int16 sum would saturate (2 * 255 * 127 > 32767); the int32 result must be exact."""
    x = np.full((1, 8, 6, 19), 255, np.uint8)
    w = np.empty((20, 8, 3, 3), wdt)
    hi, lo = (127, -128) if wdt == np.int8 else (255, 0)
    w[:10] = hi
    w[10:] = lo
    w[::3, ::2] = lo
    m = node_model("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1]},
                   initializers={"w": w, "xz": np.array(0, np.uint8)}, input_names=["x", "w", "xz"])
    exp = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert np.abs(exp).max() > 2 ** 15            # the edge is reached
    _compile_check(m, {"x": x}, form, exp, "conv2d_int8")


# ----------------------------------------------------------------------------- QLinearConv
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("xdt,wdt,per_channel", [(np.uint8, np.int8, True), (np.uint8, np.uint8, False),
                                                  (np.int8, np.int8, True)])
def test_qlinear_conv(form, xdt, wdt, per_channel):
    rng = np.random.default_rng(5)
    m_ = 21
    x, w = _q((1, 10, 11, 17), xdt, rng), _q((m_, 10, 3, 3), wdt, rng)
    ws = np.linspace(0.002, 0.004, m_).astype(np.float32) if per_channel else np.array(0.003, np.float32)
    wz = np.zeros(m_, wdt) if per_channel else np.array(0 if wdt == np.int8 else 120, wdt)
    ydt = xdt
    inits = {"xs": np.array(0.05, np.float32), "xz": np.array(3 if xdt == np.int8 else 130, xdt), "w": w,
             "ws": ws, "wz": wz, "ys": np.array(0.7, np.float32), "yz": np.array(10 if ydt == np.int8 else 128, ydt),
             "b": rng.integers(-5000, 5000, m_).astype(np.int32)}
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    m = node_model("QLinearConv", {"x": x}, {"pads": [1, 1, 1, 1], "strides": [1, 2]}, initializers=inits,
                   input_names=names)
    exp = _oracle(m, {"x": x}, (xdt, wdt) == (np.uint8, np.int8))
    _compile_check(m, {"x": x}, form, exp, "conv2d_int8", atol=1)


@pytest.mark.parametrize("strides,pads,shape", [
    ([2, 2], [0, 0, 0, 0], (2, 20, 11, 13)),     # resnet's downsample: rows and columns 0, 2, 4 ...
    ([2, 3], [0, 1, 0, 1], (1, 9, 10, 14)),      # a different column stride, padded columns
    ([3, 1], [1, 0, 1, 0], (1, 13, 17, 9)),      # padded rows (the zero point's words)
])
@pytest.mark.parametrize("op", ["ConvInteger", "QLinearConv"])
def test_conv_int8_strided_1x1_flat(op, strides, pads, shape):
    """A 1x1 convolution at any stride reads a dense grid of input pixels, so the flat layout
    (pixel vectors running across the band's output rows) applies as at stride 1: forced with
    the knob, the results equal onnxruntime's (ConvInteger: its int32 output; QLinearConv: the
    requantizing epilogue on whole vectors of the contiguous band); resnet50's first 1x1
    stride-2 downsample (256 -> 512 channels, 56 -> 28) takes it by default on a Zen 4."""
    rng = np.random.default_rng(sum(shape))
    n, c, h, w_ = shape
    m_ = 19
    x, w = _q(shape, np.uint8, rng), _q((m_, c, 1, 1), np.int8, rng)
    attrs = {"strides": strides, "pads": pads}
    if op == "ConvInteger":
        m = node_model(op, {"x": x}, attrs, initializers={"w": w, "xz": np.array(7, np.uint8)},
                       input_names=["x", "w", "xz"])
        atol = 0
    else:
        inits = {"xs": np.array(0.05, np.float32), "xz": np.array(130, np.uint8), "w": w,
                 "ws": np.linspace(0.002, 0.004, m_).astype(np.float32), "wz": np.zeros(m_, np.int8),
                 "ys": np.array(0.3, np.float32), "yz": np.array(128, np.uint8),
                 "b": rng.integers(-5000, 5000, m_).astype(np.int32)}
        m = node_model(op, {"x": x}, attrs, initializers=inits,
                       input_names=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"])
        atol = 1
    want = ort_run(m, {"x": x})[0]
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(int8_layout="flat"))
    assert mod.kernels[-1].knobs["int8_layout"] == "flat", mod.kernels[-1].knobs
    if _runs_here("vnni512"):
        got = mod.run(x=x)[0]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.int64), want.astype(np.int64), atol=atol, rtol=0)
    if op != "ConvInteger" or strides != [2, 2]:
        return
    # the default on a Zen 4 for resnet's downsample shape
    x2, w2 = _q((1, 256, 56, 56), np.uint8, rng), _q((512, 256, 1, 1), np.int8, rng)
    m2 = node_model("ConvInteger", {"x": x2}, {"strides": [2, 2]}, initializers={"w": w2, "xz": np.array(7, np.uint8)},
                    input_names=["x", "w", "xz"])
    mod2 = tensorfuse.compile(m2, target="llvm -mcpu=znver4")
    assert mod2.kernels[-1].knobs["int8_layout"] == "flat", mod2.kernels[-1].knobs


def test_conv_int8_not_chosen_where_it_does_not_apply():
    """A ConvInteger whose weights are a graph input, and a 1-D one, keep the generic nest."""
    rng = np.random.default_rng(0)
    x = _q((1, 4, 6, 6), np.uint8, rng)
    m = node_model("ConvInteger", {"x": x, "w": _q((4, 4, 3, 3), np.uint8, rng)}, {}, input_names=["x", "w"])
    mod = tensorfuse.compile(m)
    assert [k.schedule for k in mod.kernels] == ["generic"] and not _dots(mod)
    x1, w1 = _q((1, 4, 9), np.uint8, rng), _q((3, 4, 3), np.uint8, rng)
    m = node_model("ConvInteger", {"x": x1}, {}, initializers={"w": w1}, input_names=["x", "w"])
    mod = tensorfuse.compile(m)
    assert [k.schedule for k in mod.kernels] == ["generic"]
    np.testing.assert_array_equal(mod.run(x=x1)[0], ort_run(m, {"x": x1})[0])


GROUP_CASES = [
    # x shape, w shape, attrs, x dtype, w dtype, x zero point, w zero point
    ((1, 8, 10, 10), (16, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}, np.uint8, np.int8, 5, None),
    # depthwise, strided, per-channel w zero points
    ((2, 12, 9, 13), (12, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 12, "strides": [2, 2]}, np.int8, np.int8, -3,
     [1, 0, 2, 0, 0, 5, 0, 0, -4, 0, 0, 7]),
    # depthwise as mobilenet's, u8 weights with a zero point
    ((1, 32, 14, 14), (32, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 32}, np.uint8, np.uint8, 128, 100),
    ((1, 20, 7, 7), (10, 4, 1, 1), {"group": 5}, np.uint8, np.uint8, 1, 2),
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("xs,ws,attrs,xdt,wdt,xz,wz", GROUP_CASES)
def test_conv_integer_grouped(form, xs, ws, attrs, xdt, wdt, xz, wz):
    """Grouped convolutions run group by group on the int8 schedule, depthwise ones on
    conv2d_int8_dw."""
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w = _q(xs, xdt, rng), _q(ws, wdt, rng)
    inits = {"w": w, "xz": np.array(xz, xdt)}
    names = ["x", "w", "xz"]
    if wz is not None:
        inits["wz"] = np.array(wz, wdt)
        names.append("wz")
    m = node_model("ConvInteger", {"x": x}, attrs, initializers=inits, input_names=names)
    per_channel = wz is not None and np.ndim(wz) == 1
    exp = _oracle(m, {"x": x}, (xdt, wdt) == (np.uint8, np.int8) or per_channel)
    depthwise = attrs["group"] == xs[1] == ws[0]
    _compile_check(m, {"x": x}, form, exp, "conv2d_int8_dw" if depthwise else "conv2d_int8")


# ----------------------------------------------------------------------------- MatMulInteger
MM_CASES = [
    # A shape, B shape, A dtype, B dtype, a zero point, b zero point (None: absent)
    ((13, 37), (37, 50), np.uint8, np.int8, 7, None),
    ((2, 3, 64), (64, 96), np.int8, np.int8, -3, 5),
    ((70, 30), (30, 33), np.uint8, np.uint8, 128, 131),
    ((64, 768), (768, 80), np.uint8, np.int8, 0, 0),
    ((1, 3), (3, 1), np.int8, np.uint8, 1, 200),
]


def _mm_integer_model(ash, bsh, adt, bdt, az, bz):
    """A MatMulInteger of a random A (the input) and a constant B with the zero points given
    (bz None: absent); returns (model, a)."""
    rng = np.random.default_rng(sum(ash) + sum(bsh))
    a, b = _q(ash, adt, rng), _q(bsh, bdt, rng)
    inits = {"b": b, "az": np.array(az, adt)}
    names = ["a", "b", "az"]
    if bz is not None:
        inits["bz"] = np.array(bz, bdt)
        names.append("bz")
    return node_model("MatMulInteger", {"a": a}, {}, initializers=inits, input_names=names), a


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("ash,bsh,adt,bdt,az,bz", MM_CASES)
def test_matmul_integer(form, ash, bsh, adt, bdt, az, bz):
    m, a = _mm_integer_model(ash, bsh, adt, bdt, az, bz)
    exp = _oracle(m, {"a": a}, (adt, bdt) == (np.uint8, np.int8))
    _compile_check(m, {"a": a}, form, exp, "matmul_int8")


@pytest.mark.parametrize("form", list(FORMS))
def test_matmul_integer_per_row_and_per_column_zero_points(form):
    """a_zero_point [M] and b_zero_point [N] (neither onnxruntime nor onnx.reference takes a
    per-row A zero point: the ONNX spec's formula in numpy is the oracle)."""
    rng = np.random.default_rng(3)
    a, b = _q((9, 21), np.int8, rng), _q((21, 35), np.uint8, rng)
    az, bz = _q((9,), np.int8, rng), _q((35,), np.uint8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b, "az": az, "bz": bz},
                   input_names=["a", "b", "az", "bz"])
    exp = ((a.astype(np.int64) - az[:, None]) @ (b.astype(np.int64) - bz)).astype(np.int32)
    _compile_check(m, {"a": a}, form, exp, "matmul_int8")


@pytest.mark.parametrize("form", list(FORMS))
def test_matmul_integer_saturation_edge(form):
    a = np.full((7, 40), 255, np.uint8)
    b = np.where(np.arange(40 * 24).reshape(40, 24) % 5 < 3, 127, -128).astype(np.int8)
    b[:, :4] = 127
    b[:, 4:8] = -128
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b}, input_names=["a", "b"])
    exp = ReferenceEvaluator(m).run(None, {"a": a})[0]
    assert exp[0, 0] == 255 * 127 * 40 and exp[0, 4] == -255 * 128 * 40
    _compile_check(m, {"a": a}, form, exp, "matmul_int8")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(form, per_column):
    """The requantizing finish runs on column vectors (per-column scales and zero points read
    as vectors)."""
    rng = np.random.default_rng(4)
    a, b = _q((6, 50), np.uint8, rng), _q((50, 37), np.uint8, rng)
    bs = np.linspace(0.01, 0.02, 37).astype(np.float32) if per_column else np.array(0.01, np.float32)
    bz = _q((37,), np.uint8, rng, 100, 150) if per_column else np.array(131, np.uint8)
    inits = {"as": np.array(0.02, np.float32), "az": np.array(120, np.uint8), "b": b, "bs": bs, "bz": bz,
             "ys": np.array(0.9, np.float32), "yz": np.array(100, np.uint8)}
    m = node_model("QLinearMatMul", {"a": a}, {}, initializers=inits,
                   input_names=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    _compile_check(m, {"a": a}, form, ort_run(m, {"a": a})[0], "matmul_int8", atol=1)


def test_int8_instructions_in_the_assembly():
    """The assembly of each form holds its instruction and not the other's (and never
    VPMADDUBSW, whose saturation the schedules avoid)."""
    rng = np.random.default_rng(0)
    a, b = _q((16, 64), np.uint8, rng), _q((64, 64), np.int8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b}, input_names=["a", "b"])
    for form, insn, other in (("vnni512", r"vpdpbusd\s[^\n]*%zmm", r"vpmaddwd\s"),
                              ("vnni256", r"vpdpbusd\s[^\n]*%ymm", r"vpmaddwd\s"),
                              ("avx2", r"vpmaddwd\s[^\n]*%ymm", r"vpdpbusd\s")):
        mod = tensorfuse.compile(m, target=FORMS[form][0])
        _, asm = optimized_llvm(mod.llvm_ir, mod.target)
        assert re.search(insn, asm) and not re.search(other, asm) and "vpmaddubsw" not in asm, form


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("hw", [7, 28])
def test_conv_int8_layouts(form, hw):
    """Short rows (7 columns) at 16 lanes take the flat layout (pixel vectors over a band's
    rows, lanes stored pixel by pixel), long rows and 8 lanes (7 of 8 used) the row layout:
    the knob value the kernel carries, and the results against onnxruntime."""
    layout = "flat" if (hw == 7 and FORMS[form][1][2] == 16) else "rows"
    rng = np.random.default_rng(hw)
    x, w = _q((1, 24, hw, hw), np.uint8, rng), _q((20, 24, 3, 3), np.uint8, rng)
    m = node_model("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1]},
                   initializers={"w": w, "xz": np.array(3, np.uint8), "wz": np.array(100, np.uint8)},
                   input_names=["x", "w", "xz", "wz"])
    mod = tensorfuse.compile(m, target=FORMS[form][0])
    assert {k.knobs.get("int8_layout") for k in mod.kernels} == {layout}      # (and its packing kernel)
    _compile_check(m, {"x": x}, form, ort_run(m, {"x": x})[0], "conv2d_int8")


@pytest.mark.parametrize("hw,k,expect", [
    (56, 3, {"x86-64-v4": ("rows", 16), "znver4": ("rows", 8)}),     # 4 x 16 lanes (8 idle) or 7 x 8
    (7, 3, {"x86-64-v4": ("flat", 16), "znver4": ("rows", 8)}),      # 4 x 16 flat (15 idle) or 7 x 8
    (7, 1, {"x86-64-v4": ("flat", 16), "znver4": ("flat", 8)}),      # 49 pixels: 4 x 16 or 7 x 8
    # rows: 2 x 16 lanes (4 idle); flat bands of 7 rows: 196 pixels in 13 x 16 (12 idle), worth a
    # wide vector's double cost only where the datapath is split (64->64 3x3 at 28x28 on Zen 4,
    # 1 thread: 0.140 ms flat, 0.149 rows)
    (28, 3, {"x86-64-v4": ("rows", 16), "znver4": ("flat", 16)}),
])
def test_conv_int8_lanes_follow_the_datapath(hw, k, expect):
    """Where the target runs 512-bit operations as two 256-bit halves (Zen 4), 8-lane vectors
    cost half a 16-lane one: the conv takes the layout and lanes that compute the most output
    pixels per issue slot (a flat band of 8-lane vectors covered by one tile); with full-width
    units (x86-64-v4) the choice stays per vector. Results against onnx.reference (u8 x s8)."""
    rng = np.random.default_rng(hw + k)
    x, w = _q((1, 12, hw, hw), np.uint8, rng), _q((40, 12, k, k), np.int8, rng)
    m = node_model("ConvInteger", {"x": x}, {"pads": [k // 2] * 4},
                   initializers={"w": w, "xz": np.array(3, np.uint8)}, input_names=["x", "w", "xz"])
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    for cpu, (layout, lanes) in expect.items():
        mod = tensorfuse.compile(m, target=ZEN4 if cpu == "znver4" else f"llvm -mcpu={cpu} -mattr=+avx512vnni")
        k_ = mod.kernels[-1]
        assert (k_.knobs["int8_layout"], k_.knobs["int8_lanes"]) == (layout, lanes), (cpu, k_.knobs)
        assert {n for *_, n in _dots(mod)} == {lanes}
        if cpu == "znver4" and layout == "flat" and lanes == 8:
            assert k_.knobs["int8_tile"][0] == 7            # the band's 7 vectors in one tile
        if {"avx512vnni", "avx512bw"} <= HOST.feature_set and mod.runs_here:
            np.testing.assert_array_equal(mod.run(x=x)[0], want)


def test_shared_zero_point_buffer():
    """x's and w's zero point one initializer (as CSE makes equal constants): the packed
    weights replace w, the zero point stays readable."""
    rng = np.random.default_rng(9)
    x, w = _q((1, 6, 8, 8), np.uint8, rng), _q((5, 6, 3, 3), np.uint8, rng)
    m = node_model("ConvInteger", {"x": x}, {}, initializers={"w": w, "z": np.array(128, np.uint8)},
                   input_names=["x", "w", "z", "z"])
    _compile_check(m, {"x": x}, "vnni512", ort_run(m, {"x": x})[0], "conv2d_int8")
    a, b = _q((5, 20), np.uint8, rng), _q((20, 9), np.uint8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b, "z": np.array(128, np.uint8)},
                   input_names=["a", "b", "z", "z"])
    _compile_check(m, {"a": a}, "vnni512", ort_run(m, {"a": a})[0], "matmul_int8")


def _fixed(**knobs):
    """Tuning records that give every workload the same knob values."""
    from tensorfuse.compiler.tuning import TuningRecords

    class Fixed(TuningRecords):
        def knobs_for(self, key, *args, **kw):
            return dict(knobs)

        def for_target(self, *args, **kw):
            return self
    return Fixed([])


@pytest.mark.parametrize("knobs", [
    {"int8_tile": (1, 1), "band_rows": 1, "oc_split": 2},
    {"int8_tile": (6, 2), "int8_lanes": 8, "int8_layout": "rows", "oc_split": 4},
    {"int8_tile": (3, 7), "int8_layout": "rows", "band_rows": 3},
    {"int8_tile": (2, 5), "int8_layout": "flat", "band_rows": 9},
    {"int8_tile": (4, 3), "int8_stage": "none", "band_rows": 9},
    {"int8_tile": (3, 2), "int8_layout": "flat", "band_rows": 9, "int8_stage": "none", "int8_epilogue": "unrolled"},
    {"int8_tile": (2, 5), "int8_layout": "flat", "int8_epilogue": "unrolled"},
    {"int8_tile": (4, 3), "int8_layout": "rows", "int8_epilogue": "loop", "oc_split": 2},
    {"int8_tile": (2, 3), "oc_split": 2, "int8_pack": "task"},
    {"int8_tile": (2, 3), "int8_layout": "flat", "band_rows": 9, "oc_split": 4, "int8_pack": "shared"},
    {"int8_tile": (3, 2), "int8_layout": "rows", "int8_lanes": 8, "band_rows": 3, "oc_split": 2,
     "int8_pack": "shared"},
])
def test_conv_int8_knobs(knobs):
    """Knob values the tuner may pick (away from the defaults) compute the same result; with the
    channel blocks split over tasks, the panels packed by each task or once by a first kernel
    (``int8_pack``: then two kernels, the packing one first)."""
    rng = np.random.default_rng(11)
    x, w = _q((2, 13, 9, 9), np.int8, rng), _q((22, 13, 3, 3), np.int8, rng)
    m = node_model("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1]},
                   initializers={"w": w, "xz": np.array(-7, np.int8), "wz": np.array(2, np.int8)},
                   input_names=["x", "w", "xz", "wz"])
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(**knobs))
    k = mod.kernels[-1]
    assert len(mod.kernels) == (2 if k.knobs.get("int8_pack") == "shared" else 1)
    assert {n: k.knobs[n] for n in knobs} == knobs, k.knobs
    if _runs_here("vnni512"):
        np.testing.assert_array_equal(mod.run(x=x)[0], ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("knobs", [{"int8_tile": (1, 1), "sweep_rows": 1, "col_split": 2},
                                   {"int8_tile": (7, 2), "int8_lanes": 8, "sweep_rows": 2, "col_split": 4}])
def test_matmul_int8_knobs(knobs):
    rng = np.random.default_rng(12)
    a, b = _q((40, 70), np.uint8, rng), _q((70, 90), np.uint8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b, "az": np.array(3, np.uint8),
                                                                "bz": np.array(200, np.uint8)},
                   input_names=["a", "b", "az", "bz"])
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(**knobs))
    (k,) = mod.kernels
    assert {n: k.knobs[n] for n in knobs} == knobs, k.knobs
    if _runs_here("vnni512"):
        np.testing.assert_array_equal(mod.run(a=a)[0], ort_run(m, {"a": a})[0])


# ----------------------------------------------------------------------------- depthwise (conv2d_int8_dw)
DW_CASES = [
    # x shape, w shape, attrs, x dtype, w dtype, x zero point, w zero point (None: absent)
    ((1, 16, 14, 14), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}, np.uint8, np.int8, 3, None),
    # strided, per-channel zero points, two images, i8 activations
    ((2, 12, 9, 13), (12, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, np.int8, np.int8, -3,
     [1, 0, 2, 0, 0, 5, 0, 0, -4, 0, 0, 7]),
    # u8 weights with a zero point (row sums), a row of exactly 16 and of 17 columns
    ((1, 8, 6, 16), (8, 1, 3, 3), {"pads": [1, 1, 1, 1]}, np.uint8, np.uint8, 128, 100),
    ((1, 8, 5, 17), (8, 1, 3, 3), {"pads": [1, 1, 1, 1]}, np.uint8, np.uint8, 7, [0, 1, 2, 3, 250, 5, 6, 7]),
    # 5x5 stride 2 with asymmetric pads (two words per kernel row on VPMADDWD, one tap of
    # padding in the second VPDPBUSD word), 7-column rows (8 lanes)
    ((1, 8, 20, 37), (8, 1, 5, 5), {"pads": [2, 1, 0, 2], "strides": [2, 2]}, np.uint8, np.int8, 9, None),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"pads": [1, 1, 1, 1]}, np.int8, np.uint8, 0, 128),
    # dilation, no padding, a kernel row of 1 tap (3x1), stride in height only
    ((1, 8, 19, 21), (8, 1, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, np.uint8, np.uint8, 9, 7),
    ((1, 4, 11, 30), (4, 1, 3, 1), {"strides": [2, 1]}, np.uint8, np.int8, 200, None),
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("xs,ws,attrs,xdt,wdt,xz,wz", DW_CASES)
def test_conv_integer_depthwise(form, xs, ws, attrs, xdt, wdt, xz, wz):
    """Depthwise convolutions take the tap-packing schedule (conv2d_int8_dw), exact against
    onnxruntime / onnx.reference at every stride, pad, dilation and row width above."""
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w = _q(xs, xdt, rng), _q(ws, wdt, rng)
    inits = {"w": w, "xz": np.array(xz, xdt)}
    names = ["x", "w", "xz"]
    if wz is not None:
        inits["wz"] = np.array(wz, wdt)
        names.append("wz")
    m = node_model("ConvInteger", {"x": x}, dict(attrs, group=xs[1]), initializers=inits, input_names=names)
    per_channel = wz is not None and np.ndim(wz) == 1
    exp = _oracle(m, {"x": x}, (xdt, wdt) == (np.uint8, np.int8) or per_channel)
    _compile_check(m, {"x": x}, form, exp, "conv2d_int8_dw")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("stride", [1, 2])
def test_qlinear_conv_depthwise(form, stride):
    """QLinearConv depthwise with per-channel weight scales, a bias and the requantizing
    finish (mobilenet's form): within one quantization step of onnx.reference."""
    rng = np.random.default_rng(21 + stride)
    c = 24
    x, w = _q((1, c, 15, 23), np.uint8, rng), _q((c, 1, 3, 3), np.int8, rng)
    inits = {"xs": np.array(0.05, np.float32), "xz": np.array(131, np.uint8), "w": w,
             "ws": np.linspace(0.002, 0.02, c).astype(np.float32), "wz": np.zeros(c, np.int8),
             "ys": np.array(0.4, np.float32), "yz": np.array(120, np.uint8),
             "b": rng.integers(-3000, 3000, c).astype(np.int32)}
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    m = node_model("QLinearConv", {"x": x}, {"pads": [1, 1, 1, 1], "strides": [stride, stride], "group": c},
                   initializers=inits, input_names=names)
    _compile_check(m, {"x": x}, form, _oracle(m, {"x": x}, True), "conv2d_int8_dw", atol=1)


def test_depthwise_int8_falls_back():
    """Stride 3 (taps of a packed word not one panel column apart) and a channel multiplier of
    2 keep the group-by-group conv2d_int8 schedule."""
    rng = np.random.default_rng(2)
    x = _q((1, 6, 13, 13), np.uint8, rng)
    for ws, attrs in (((6, 1, 3, 3), {"strides": [3, 3], "group": 6}), ((12, 1, 3, 3), {"group": 6})):
        w = _q(ws, np.int8, rng)
        m = node_model("ConvInteger", {"x": x}, attrs, initializers={"w": w}, input_names=["x", "w"])
        _compile_check(m, {"x": x}, "vnni512", _oracle(m, {"x": x}, True), "conv2d_int8")


@pytest.mark.parametrize("knobs", [
    {"band_rows": 1, "dw_rows": 1, "dw_tail": "whole"},
    {"band_rows": 1, "dw_rows": 1, "dw_tail": "runs"},
    {"band_rows": 3, "dw_rows": 2, "int8_lanes": 8, "dw_tail": "runs"},
    {"band_rows": 9, "dw_rows": 4, "dw_tail": "whole"},
    {"band_rows": 9, "dw_rows": 7, "int8_lanes": 8, "dw_tail": "runs"},
])
def test_conv_int8_dw_knobs(knobs):
    """Knob values away from the defaults compute the same result (tiles that do not divide
    the band, partial last vectors both ways)."""
    rng = np.random.default_rng(13)
    x, w = _q((2, 5, 9, 19), np.int8, rng), _q((5, 1, 3, 3), np.int8, rng)
    m = node_model("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1], "group": 5},
                   initializers={"w": w, "xz": np.array(-7, np.int8), "wz": np.array(2, np.int8)},
                   input_names=["x", "w", "xz", "wz"])
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(**knobs))
    (k,) = mod.kernels
    assert k.schedule == "llvm.conv2d_int8_dw" and {n: k.knobs[n] for n in knobs} == knobs, k.knobs
    if _runs_here("vnni512"):
        np.testing.assert_array_equal(mod.run(x=x)[0], ort_run(m, {"x": x})[0])


def _qdq_conv_residual_model(c, m, h, w_, group, k, stride, rng):
    """QDQ u8s8: y = Q(Conv(DQ(Q(x)), DQ(w), b) + r) -> DQ, with r a second float input
    of y's shape (the residual add that tensorfuse fuses into the conv's epilogue, which then
    reads r: the stored-in-runs tail path)."""
    from onnx import TensorProto, helper, numpy_helper
    oh, ow = (h + 2 * (k // 2) - k) // stride + 1, (w_ + 2 * (k // 2) - k) // stride + 1
    wq = rng.integers(-127, 128, (m, c // group, k, k)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"), numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(np.linspace(0.002, 0.01, m).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(m, np.int8), "wz"),
             numpy_helper.from_array(rng.normal(0, 0.2, m).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0.05, np.float32), "ys"), numpy_helper.from_array(np.array(120, np.uint8), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["cv"], pads=[k // 2] * 4, strides=[stride] * 2, group=group),
             helper.make_node("Add", ["cv", "r"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w_]),
                                       helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, m, oh, ow])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, oh, ow])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": rng.uniform(-2.5, 2.5, (1, c, h, w_)).astype(np.float32),
             "r": rng.uniform(-1, 1, (1, m, oh, ow)).astype(np.float32)}
    return model, feeds


def _qdq_conv_scalar_epilogue_model(c, m, h, group, k, stride, side, rng):
    """QDQ u8s8: yq = Q(Conv(DQ(Q(x)), DQ(w), b)), y = DQ(yq), the output zero point another
    buffer than x's: the conv's epilogue reads only scalars (whole-vector epilogue); with
    ``side`` yq is a graph output too, which the epilogue stores (runs only)."""
    from onnx import TensorProto, helper
    model, feeds = _qdq_conv_residual_model(c, m, h, h, group, k, stride, rng)
    g = model.graph
    (add,) = [n for n in g.node if n.op_type == "Add"]
    (q,) = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == "s"]
    q.input[0] = "cv"
    g.node.remove(add)
    r = [i for i in g.input if i.name == "r"][0]
    g.input.remove(r)
    feeds.pop("r")
    if side:
        oh = (h + 2 * (k // 2) - k) // stride + 1
        g.output.append(helper.make_tensor_value_info("yq", TensorProto.UINT8, [1, m, oh, oh]))
    return model, feeds


@pytest.mark.parametrize("side", [False, True])
@pytest.mark.parametrize("c,m,hw,group,k,stride", [(24, 20, 14, 1, 1, 1), (16, 16, 13, 16, 3, 1), (8, 12, 11, 1, 3, 2),
                                                   (16, 20, 7, 1, 1, 1)])
def test_int8_conv_with_a_scalar_epilogue(c, m, hw, group, k, stride, side):
    """An epilogue that reads only scalars (the output Q's zero point, a buffer of its own) runs
    on whole vectors, lanes past a row's end included (depthwise: ``dw_tail`` whole); one that
    also stores a side output (the u8 tensor as a graph output) stores in runs. Both within one
    output quantization step of onnxruntime's unfused QDQ graph."""
    rng = np.random.default_rng(c + m + hw)
    model, feeds = _qdq_conv_scalar_epilogue_model(c, m, hw, group, k, stride, side, rng)
    mod = tensorfuse.compile(model)
    ks = [k_ for k_ in mod.kernels if k_.schedule in ("llvm.conv2d_int8", "llvm.conv2d_int8_dw")]
    assert ks, [k_.schedule for k_ in mod.kernels]
    if group > 1:
        assert ks[0].knobs["dw_tail"] == ("runs" if side else "whole"), ks[0].knobs
    got = mod.run(**feeds)
    exp = ort_run(model, feeds)
    assert np.abs(got[0] - exp[0]).max() <= 0.05 * 1.001
    if side:
        assert np.abs(got[1].astype(np.int32) - exp[1].astype(np.int32)).max() <= 1


@pytest.mark.parametrize("c,m,hw,group,k,stride", [(24, 20, 28, 1, 1, 1), (16, 16, 13, 16, 3, 1), (8, 12, 11, 1, 3, 2),
                                                   (16, 12, 14, 1, 1, 1), (8, 12, 5, 1, 1, 1), (24, 20, 7, 1, 3, 1)])
def test_int8_conv_with_a_fused_residual(c, m, hw, group, k, stride):
    """A quantized conv whose epilogue reads another tensor (a residual add) in the int8
    schedules (partial row vectors stored in runs, the staged and looped epilogue; a 1x1
    conv's flat band, contiguous in Y, as whole pixel vectors with the band's last in runs,
    that vector crossing rows at 5x5): within one output quantization step of onnxruntime's
    unfused QDQ graph."""
    rng = np.random.default_rng(c + m + hw)
    model, feeds = _qdq_conv_residual_model(c, m, hw, hw, group, k, stride, rng)
    mod = tensorfuse.compile(model)
    assert {k_.schedule for k_ in mod.kernels} & {"llvm.conv2d_int8", "llvm.conv2d_int8_dw"}, [k_.schedule for k_ in mod.kernels]
    if k == 1 and hw in (5, 14):
        assert {k_.knobs.get("int8_layout") for k_ in mod.kernels if k_.schedule == "llvm.conv2d_int8"} == {"flat"}
    got = mod.run(**feeds)[0]
    exp = ort_run(model, feeds)[0]
    assert np.abs(got - exp).max() <= 0.05 * 1.001


@pytest.mark.parametrize("xdt", [np.uint8, np.int8])
@pytest.mark.parametrize("shape,k,attrs", [
    ((1, 8, 14, 14), 1, {}),                               # 14 of 16 words, the last row past x's end
    ((1, 12, 14, 14), 3, {"pads": [1, 1, 1, 1]}),          # pads both sides: the first row before x's start
    ((1, 12, 16, 16), 3, {"pads": [1, 1, 1, 1]}),          # 18 words a row: two overlapping vectors
    ((1, 8, 28, 28), 1, {}),                                # 28 words: two overlapping vectors
    ((2, 9, 7, 9), 3, {"pads": [0, 2, 1, 0]}),              # C % 4 != 0: the last quad word by word
    ((1, 16, 20, 20), 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),   # stride 2: word by word
    ((1, 8, 36, 36), 1, {"strides": [2, 2]}),               # a 1x1 stride-2 downsample: panel rows 0, 2, 4 ...
])
@pytest.mark.parametrize("pack", ["shared", "task"])
def test_conv_int8_vector_pack(xdt, shape, k, attrs, pack):
    """The input panel packed in whole vectors (``int8_vector_pack``) equals the word-by-word
    packing and onnxruntime: rows shorter than the vector, pads on either side, the first and
    last rows of x (packed word by word: a vector would read outside x), a channel tail."""
    rng = np.random.default_rng(12)
    x, w = _q(shape, xdt, rng), _q((32, shape[1], k, k), np.int8, rng)
    xz = np.array(-7 if xdt == np.int8 else 131, xdt)
    m = node_model("ConvInteger", {"x": x}, attrs,
                   initializers={"w": w, "xz": xz, "wz": np.array(2, np.int8)},
                   input_names=["x", "w", "xz", "wz"])
    outs = []
    for vector in (True, False):
        knobs = {"int8_vector_pack": vector, "int8_layout": "rows", "oc_split": 2, "int8_pack": pack}
        mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(**knobs), cache=False)
        assert mod.kernels[-1].knobs["int8_vector_pack"] is vector
        if _runs_here("vnni512"):
            outs.append(mod.run(x=x)[0])
    if outs:
        want = ort_run(m, {"x": x})[0]
        for got in outs:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("form", ["vnni512", "avx2"])
@pytest.mark.parametrize("pack", ["shared", "task"])
@pytest.mark.parametrize("layout,shape,k,band", [
    ("flat", (2, 10, 12, 12), 3, 3),        # 4 bands of a flat panel (its tail), a channel tail
    ("rows", (2, 22, 9, 11), 3, 3),         # 3 bands of 3 rows, 6 groups (the last a tail)
    ("flat", (2, 10, 4, 14), 1, 4),         # 1x1: a run of 56 words (16-word vectors, the last
                                            # overlapping; 7 of 8), the tail group row by row
    ("flat", (1, 8, 10, 5), 1, 2),          # 1x1: runs of 10 words in 8-word vectors
])
def test_conv_int8_shared_pack_runs(layout, shape, k, band, pack, form):
    """The packing's tasks (shared: each a run of channel groups of one image, every band and
    row of each group; per task: a thread's first task of a band packs it into the thread's
    panel, its later tasks of the band reuse it) fill every panel: several bands, images, runs
    of uneven length and a channel tail in the last run; a 1x1 kernel's band (consecutive rows
    of x) packed as one run of words; at 2 threads and 1, against onnxruntime (exact), with
    VNNI (4 channels a word, 16-word vectors) and AVX2 (2 channels a word, 8 words). The
    channel layout's runs:
    :func:`test_conv_int8_shared_pack_runs_channels`."""
    rng = np.random.default_rng(5)
    x, w = _q(shape, np.uint8, rng), _q((48, shape[1], k, k), np.int8, rng)
    m = node_model("ConvInteger", {"x": x}, {"pads": [k // 2] * 4},
                   initializers={"w": w, "xz": np.array(131, np.uint8), "wz": np.array(0, np.int8)},
                   input_names=["x", "w", "xz", "wz"])
    knobs = {"int8_layout": layout, "band_rows": band, "oc_split": 2, "int8_pack": pack}
    mod = tensorfuse.compile(m, target=FORMS[form][0], tuning=_fixed(**knobs), cache=False, num_threads=2)
    _check_dots(mod, form)
    assert [kk.name.endswith("_pack") for kk in mod.kernels] == [True, False][pack == "task":]
    assert {n: mod.kernels[-1].knobs[n] for n in knobs} == knobs
    # per task: each thread packs a band's panel for its first task of the band, and keeps it
    assert ("held" in str(mod.kernels[-1])) == (pack == "task")
    if _runs_here(form):
        want = ort_run(m, {"x": x})[0]
        for threads in (2, 1):
            mod.num_threads = threads
            np.testing.assert_array_equal(mod.run(x=x)[0], want)


@pytest.mark.parametrize("c,hw,band", [(37, 6, 1), (64, 7, 7)])   # 10 groups in 6 runs; 16 in 7
def test_conv_int8_shared_pack_runs_channels(c, hw, band):
    """:func:`test_conv_int8_shared_pack_runs` for the channel layout's panels (rows padded to
    whole vectors, the words past a row's end blended with the padding), against onnxruntime's
    unfused QDQ result (within one step)."""
    m, feeds = _qconv_model(c=c, m=48, hw=hw, k=1)
    knobs = {"int8_layout": "channels", "int8_ctile": (8, 1), "band_rows": band, "oc_split": 2,
             "int8_pack": "shared"}
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(**knobs), cache=False)
    conv = [kk for kk in mod.kernels if "ConvIntegerToFloat" in kk.comment]
    assert [kk.name.endswith("_pack") for kk in conv] == [True, False]
    assert {n: conv[-1].knobs[n] for n in knobs} == knobs
    if _runs_here("vnni512"):
        got = mod.run(**feeds)[0]
        assert np.abs(got.astype(int) - _unfused_ort(m, feeds).astype(int)).max() <= 1


def _qconv_model(c, m, hw, k, stride=1, pads=None, dil=1, residual=False, seed=0, bias=True):
    """QDQ conv as onnxruntime's quantizer writes it (u8 activations, s8 per-channel symmetric
    weights, int32 bias), + Relu, Q; with ``residual`` a quantized Add of a second u8 input."""
    from onnx import TensorProto as TP, helper as oh, numpy_helper as nh
    rng = np.random.default_rng(seed)
    p = [k // 2 * dil] * 4 if pads is None else pads
    oh_ = (hw + p[0] + p[2] - dil * (k - 1) - 1) // stride + 1
    ow_ = (hw + p[1] + p[3] - dil * (k - 1) - 1) // stride + 1
    w = rng.integers(-127, 128, (m, c, k, k)).astype(np.int8)
    ws = (rng.random(m) * 0.004 + 0.001).astype(np.float32)
    inits = [nh.from_array(w, "w"), nh.from_array(ws, "ws"), nh.from_array(np.zeros(m, np.int8), "wz"),
             nh.from_array(np.array(0.02, np.float32), "xs"), nh.from_array(np.array(131, np.uint8), "xz"),
             nh.from_array(np.array(0.05, np.float32), "ys"), nh.from_array(np.array(3, np.uint8), "yz")]
    nodes = [oh.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             oh.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0)]
    conv_in = ["xd", "wd"]
    if bias:
        inits += [nh.from_array(rng.integers(-3000, 3000, m).astype(np.int32), "b"),
                  nh.from_array(ws * 0.02, "bs"), nh.from_array(np.zeros(m, np.int32), "bz")]
        nodes.append(oh.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0))
        conv_in.append("bd")
    nodes.append(oh.make_node("Conv", conv_in, ["c"], pads=p, strides=[stride] * 2, dilations=[dil] * 2))
    inputs = [oh.make_tensor_value_info("x", TP.UINT8, [1, c, hw, hw])]
    out = "c"
    if residual:
        inits += [nh.from_array(np.array(0.04, np.float32), "rs"), nh.from_array(np.array(120, np.uint8), "rz")]
        nodes += [oh.make_node("DequantizeLinear", ["r", "rs", "rz"], ["rd"]), oh.make_node("Add", ["c", "rd"], ["a"])]
        inputs.append(oh.make_tensor_value_info("r", TP.UINT8, [1, m, oh_, ow_]))
        out = "a"
    nodes += [oh.make_node("Relu", [out], ["re"]), oh.make_node("QuantizeLinear", ["re", "ys", "yz"], ["y"])]
    g = oh.make_graph(nodes, "qconv", inputs, [oh.make_tensor_value_info("y", TP.UINT8, [1, m, oh_, ow_])], inits)
    feeds = {"x": rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8)}
    if residual:
        feeds["r"] = rng.integers(0, 256, (1, m, oh_, ow_)).astype(np.uint8)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]), feeds


def _unfused_ort(model, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("case", [
    dict(c=64, m=64, hw=7, k=3),                              # a 7x7 plane: one band, tiles across rows
    dict(c=32, m=48, hw=9, k=3, stride=2),                    # stride 2, 3 vectors of 16 channels
    dict(c=20, m=32, hw=10, k=3, pads=[0, 1, 2, 0], dil=2),   # asymmetric pads, dilation, C % 4 != 0
    dict(c=64, m=80, hw=6, k=1, residual=True),               # a residual read at the pixels' offsets
    dict(c=40, m=16, hw=5, k=5, bias=False),                  # 25 taps, no bias
    dict(c=24, m=40, hw=13, k=1),                             # 40 channels: the last vector half used
    dict(c=16, m=1000 // 40, hw=9, k=3, stride=2),            # 25 channels, stride 2
    dict(c=32, m=32, hw=14, k=1, stride=2, pads=[0, 0, 0, 0]),   # a 1x1 downsample (sparse panel rows)
    dict(c=16, m=32, hw=10, k=3, residual=True),               # 100 pixels: a last tile of 4, shuffled
])
@pytest.mark.parametrize("knobs", [{}, {"int8_ctile": (4, 4)}, {"int8_ctile": (12, 2), "band_rows": 1},
                                   {"int8_ctile": (16, 1), "oc_split": 2}, {"int8_transpose": "scatter"}])
def test_conv_int8_channels_layout(case, knobs):
    """The channel layout (output channels as the lanes, the tile transposed before the
    epilogue: register shuffles for a power-of-two pixel tile, else or by the knob a scatter)
    against onnxruntime's unfused QDQ result: pixel tiles across rows and a last partial one,
    channel blocks with a last partial block (48 = 3 vectors in blocks of 4), output channels
    not a multiple of 16 (the last vector's lanes past them not stored), strides, pads,
    dilation, bias, the residual epilogue; several tiles, bands and splits."""
    if knobs.get("oc_split", 1) > -(-case["m"] // 16 // knobs.get("int8_ctile", (8, 3))[1]):
        pytest.skip("fewer channel blocks than the split")
    m, feeds = _qconv_model(**case)
    kn = {"int8_layout": "channels", **knobs}
    if "band_rows" in kn:
        kn["band_rows"] = 1
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(**kn), cache=False)
    conv = [k for k in mod.kernels if "ConvIntegerToFloat" in k.comment and not k.name.endswith("_pack")]
    assert conv and all(k.knobs["int8_layout"] == "channels" for k in conv), [k.knobs for k in conv]
    if _runs_here("vnni512"):
        got = mod.run(**feeds)[0]
        want = _unfused_ort(m, feeds)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_conv_int8_channels_default():
    """The channel layout is the default where rows leave lanes idle and each output sums a
    long reduction (256 channels 3x3 at 14x14: rows use 14 of 16 lanes; also with 40 output
    channels), or a reduction of CHAN_SHORT_REDUCTION words where the pixel layouts use under
    CHAN_SHORT_MAX_LANE_USE of their lanes (512 channels 1x1 at 13x13: 13 of 16, not at 14x14);
    rows elsewhere (64 channels: a short reduction), and never where it does not apply (8
    output channels, under one vector; AVX2 has no 16-lane VNNI)."""
    def layout(target, **case):
        m, _ = _qconv_model(**case)
        mod = tensorfuse.compile(m, target=target, cache=False)
        return {k.knobs.get("int8_layout") for k in mod.kernels if "ConvIntegerToFloat" in k.comment}
    v4 = FORMS["vnni512"][0]
    assert layout(v4, c=256, m=256, hw=14, k=3) == {"channels"}
    assert layout(v4, c=256, m=40, hw=14, k=3) == {"channels"}
    assert layout(v4, c=512, m=48, hw=13, k=1) == {"channels"}
    assert layout(v4, c=512, m=48, hw=14, k=1) != {"channels"}
    assert layout(v4, c=64, m=64, hw=14, k=3) != {"channels"}
    assert layout(v4, c=256, m=8, hw=14, k=3) != {"channels"}
    assert layout(FORMS["avx2"][0], c=256, m=256, hw=14, k=3) != {"channels"}


@pytest.mark.parametrize("hw,k,integer,layout", [
    (56, 1, False, "flat"),   # rows of 56 in 4 vectors of 16 (87.5%), the flat band 100%: a QDQ 1x1 conv takes it
    (14, 1, False, "flat"),   # 196 pixels in 13 vectors (94%) against 87.5%
    (56, 3, False, "rows"),   # a 3x3 conv needs the flat band's use over the rows' by a margin (padded planes)
    (56, 1, True, "flat"),    # ConvInteger's int32 output too
    (56, 3, True, "rows"),
])
def test_conv_int8_1x1_takes_the_flat_band_at_equal_use(hw, k, integer, layout):
    """On a target that does not split its vectors (an AVX-512 Sapphire Rapids), a 1x1 conv
    (QDQ, requantized output, or ConvInteger, int32) takes the flat layout wherever its band's
    lanes hold as many output pixels as the rows' (no padding columns, vectors on whole cache
    lines: Emerald Rapids, QDQ u8s8 128->512 at 28x28 0.357 -> 0.212 ms); a 3x3 one keeps the
    rows unless the flat band wins by 15%. The result matches onnxruntime's
    unfused QDQ within one step, ConvInteger exactly (run where the host has AVX-512 VNNI)."""
    rng = np.random.default_rng(3)
    if integer:
        x, w = _q((1, 16, hw, hw), np.uint8, rng), _q((20, 16, k, k), np.int8, rng)
        m = node_model("ConvInteger", {"x": x}, {}, initializers={"w": w, "xz": np.array(7, np.uint8)},
                       input_names=["x", "w", "xz"])
        feeds, tol = {"x": x}, 0
    else:
        m, feeds = _qconv_model(c=16, m=20, hw=hw, k=k)
        tol = 1
    mod = tensorfuse.compile(m, target="llvm -mcpu=sapphirerapids", cache=False)
    conv = [kk for kk in mod.kernels if "int8_layout" in kk.knobs]
    assert [kk.knobs["int8_layout"] for kk in conv] == [layout], [kk.knobs for kk in conv]
    if {"avx512vnni", "avx512bw"} <= HOST.feature_set and mod.runs_here:
        got = mod.run(**feeds)[0]
        want = ort_run(m, feeds)[0] if integer else _unfused_ort(m, feeds)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= tol


@pytest.mark.parametrize("hw,k,band,vectors", [
    (14, 1, 14, 13),    # 196 pixels in 13 vectors of 16 (94% used), not 7 rows in 7 (87.5%)
    (9, 3, 3, 2),       # rows of 11 columns: 3 rows, 31 positions in 2 vectors, not 9 rows in 7
    (28, 3, 7, 13),     # 7 rows of 30 columns: 196 pixels in 13 vectors; 28 rows would be 53
])
def test_conv_int8_flat_band_fills_the_lanes(hw, k, band, vectors):
    """The flat layout's default band is the one whose pixel vectors hold the most output pixels
    (up to MAX_FLAT_VECTORS vectors), not the largest under a vector bound: on a target that
    splits 512-bit operations (Zen 4) the conv takes it at 16 lanes with the (4, 4) tile where
    the reduction is short. Results against onnxruntime's unfused QDQ (one step)."""
    from tensorfuse.codegen.llvm.schedules import conv2d_int8 as c8
    m, feeds = _qconv_model(c=24, m=20, hw=hw, k=k)
    mod = tensorfuse.compile(m, target=ZEN4, cache=False)
    conv = [kk for kk in mod.kernels if "int8_layout" in kk.knobs]
    assert [(kk.knobs["int8_layout"], kk.knobs["int8_lanes"], kk.knobs["band_rows"]) for kk in conv] == \
        [("flat", 16, band)], [kk.knobs for kk in conv]
    geo = type("G", (), {"kernel": (k, k), "strides": (1, 1), "dilations": (1, 1), "out_shape": (hw, hw)})
    assert c8._flat_vectors(geo, 16, band) == vectors
    assert conv[0].knobs["int8_tile"] == ((4, 4) if vectors >= 4 else (vectors, 16 // vectors))
    if {"avx512vnni", "avx512bw"} <= HOST.feature_set and mod.runs_here:
        got, want = mod.run(**feeds)[0], _unfused_ort(m, feeds)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_conv_int8_short_reduction_takes_a_square_tile():
    """Where each output sums fewer than SHORT_REDUCTION packed words (1x1 convs of up to 1020
    channels, 3x3 ones of up to 112), the default pixel tile is 4 pixel vectors x 4 channels (its
    epilogue weighs as much as its dot products; 24 accumulators spilled there); longer
    reductions keep the cost model's tile. Results against onnxruntime's unfused QDQ."""
    from tensorfuse.codegen.llvm.schedules import conv2d_int8 as c8
    assert c8._default_tile(32, False, 256, 7, words=16) == (4, 4)
    assert c8._default_tile(32, False, 256, 2, words=16) == (2, 8)
    assert c8._default_tile(32, False, 256, 7, words=c8.SHORT_REDUCTION) == c8._default_tile(32, False, 256, 7)
    m, feeds = _qconv_model(c=64, m=96, hw=14, k=1)
    mod = tensorfuse.compile(m, target=FORMS["vnni512"][0], tuning=_fixed(int8_layout="rows"), cache=False)
    conv = [k for k in mod.kernels if "ConvIntegerToFloat" in k.comment and not k.name.endswith("_pack")]
    assert [k.knobs["int8_tile"] for k in conv] == [(4, 4)], [k.knobs for k in conv]
    if _runs_here("vnni512"):
        got, want = mod.run(**feeds)[0], _unfused_ort(m, feeds)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def _qdq_conv_int8_output_model(c, m, h, k, stride, ydt, relu, residual, rng):
    """QDQ conv as onnxruntime's quantizer writes one (u8 x per tensor, s8 per-channel weights,
    int32 bias), optionally Relu and a residual Add of a float input, then QuantizeLinear to
    ``ydt`` as the graph output: the conv's fused kernel stores u8 / i8."""
    from onnx import TensorProto, helper, numpy_helper
    p = k // 2
    oh = (h + 2 * p - k) // stride + 1
    w8 = rng.integers(-127, 128, (m, c, k, k)).astype(np.int8)
    ws = (rng.random(m) * 0.004 + 0.001).astype(np.float32)
    yz = np.array(3 if ydt == np.uint8 else -9, ydt)
    inits = [numpy_helper.from_array(w8, "w"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.zeros(m, np.int8), "wz"), numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(131, np.uint8), "xz"), numpy_helper.from_array(np.array(0.04, np.float32), "ys"),
             numpy_helper.from_array(yz, "yz"),
             numpy_helper.from_array(rng.integers(-3000, 3000, m).astype(np.int32), "b"),
             numpy_helper.from_array(ws * np.float32(0.02), "bs"), numpy_helper.from_array(np.zeros(m, np.int32), "bz")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["cv"], pads=[p] * 4, strides=[stride] * 2)]
    last = "cv"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["rl"]))
        last = "rl"
    ins = [helper.make_tensor_value_info("x", TensorProto.UINT8, (1, c, h, h))]
    feeds = {"x": rng.integers(0, 256, (1, c, h, h)).astype(np.uint8)}
    if residual:
        nodes.append(helper.make_node("Add", [last, "r"], ["ad"]))
        last = "ad"
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, (1, m, oh, oh)))
        feeds["r"] = rng.uniform(-2, 2, (1, m, oh, oh)).astype(np.float32)
    nodes.append(helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["y"]))
    yt = TensorProto.UINT8 if ydt == np.uint8 else TensorProto.INT8
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", yt, (1, m, oh, oh))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, feeds


def _concats(mod) -> set:
    """(isa, parts, lanes) of every Concat the module's kernels store."""
    from tensorfuse.ir.kernel import Concat
    return {(e.isa, len(e.parts), e.lanes) for e in _stored_nodes(mod) if isinstance(e, Concat)}


@pytest.mark.parametrize("form", ["vnni512", "avx2"])
@pytest.mark.parametrize("ydt", [np.uint8, np.int8])
@pytest.mark.parametrize("c,m,hw,k,stride,relu,residual", [
    (24, 20, 20, 1, 1, True, False),     # flat 1x1 band, contiguous: 25 vectors, the last partial;
                                         # 20 channels: a channel block past M
    (16, 12, 32, 3, 1, False, False),    # rows of 32 pixels: whole vectors that cross rows
    (12, 8, 32, 3, 2, True, True),       # stride 2, 16-pixel rows; a residual read per vector
    (8, 16, 12, 1, 1, False, True),      # flat band with a residual (PixelIndex reads)
])
def test_int8_conv_packed_narrowing(form, ydt, c, m, hw, k, stride, relu, residual):
    """u8 / i8 outputs of consecutive whole pixel vectors narrowed together (``int8_narrow``
    ``pack``: ir.kernel.Concat "x86pack", VPACKSSDW / VPACKUSWB or VPACKSSWB / VPERMD, 4 or 2
    vectors a store) equal the vector-by-vector form exactly and onnxruntime's unfused QDQ graph
    within one output step, at 16 lanes (AVX-512BW) and 8 (AVX2), flat and row layouts, a
    channel block past M, a residual read in the epilogue."""
    rng = np.random.default_rng(c * m + hw)
    model, feeds = _qdq_conv_int8_output_model(c, m, hw, k, stride, ydt, relu, residual, rng)
    _check_packed_narrowing(model, feeds, form, "llvm.conv2d_int8")


def _check_packed_narrowing(model, feeds, form: str, schedule: str, **knobs) -> None:
    """Compile ``model`` for ``form`` with ``int8_narrow`` pack and vector (and ``knobs``): one
    ``schedule`` kernel (a run-time B's packing kernel aside) with the knob; Concat "x86pack"
    nodes of the form's lanes in the pack form's kernel IR only; where the host runs the form,
    both outputs equal, and within one output step of onnxruntime."""
    outs = {}
    for narrow in ("pack", "vector"):
        mod = tensorfuse.compile(model, target=FORMS[form][0], tuning=_fixed(int8_narrow=narrow, **knobs), cache=False)
        ks = [k_ for k_ in mod.kernels if k_.schedule == schedule and not k_.name.endswith("_packb")]
        assert len(ks) == 1 and ks[0].knobs.get("int8_narrow") == narrow, [(k_.schedule, k_.knobs) for k_ in mod.kernels]
        cc = _concats(mod)
        if narrow == "pack":
            lanes = 16 if form == "vnni512" else 8
            assert cc and {(isa, w // p) for isa, p, w in cc} == {("x86pack", lanes)}, cc
            assert "packssdw" in mod.report.llvm_ir
        else:
            assert not cc
        if _runs_here(form):
            outs[narrow] = mod.run(**feeds)[0]
    if outs:
        np.testing.assert_array_equal(outs["pack"], outs["vector"])
        exp = ort_run(model, feeds)[0]
        assert outs["pack"].dtype == exp.dtype
        assert np.abs(outs["pack"].astype(np.int32) - exp.astype(np.int32)).max() <= 1


def _qdq_matmul_int8_output_model(ash, n, ydt, runtime_b, rng):
    """QDQ MatMul: DQ(a u8 per tensor) x DQ(b: s8 per-column constant [K, n], or with
    ``runtime_b`` a second u8 input [..., K, n] per tensor, attention's Q K^T) -> Q to ``ydt``
    as the graph output."""
    from onnx import TensorProto, helper, numpy_helper
    k = ash[-1]
    yz = np.array(5 if ydt == np.uint8 else -7, ydt)
    yshape = list(ash[:-1]) + [n]
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "as"), numpy_helper.from_array(np.array(121, np.uint8), "az"),
             numpy_helper.from_array(np.array(0.05 * np.sqrt(k), np.float32), "ys"), numpy_helper.from_array(yz, "yz")]
    ins = [helper.make_tensor_value_info("a", TensorProto.UINT8, ash)]
    feeds = {"a": rng.integers(0, 256, ash).astype(np.uint8)}
    if runtime_b:
        bsh = list(ash[:-2]) + [k, n]
        ins.append(helper.make_tensor_value_info("b", TensorProto.UINT8, bsh))
        feeds["b"] = rng.integers(0, 256, bsh).astype(np.uint8)
        inits += [numpy_helper.from_array(np.array(0.02, np.float32), "bs"), numpy_helper.from_array(np.array(128, np.uint8), "bz")]
        bdq = helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"])
    else:
        inits += [numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "b"),
                  numpy_helper.from_array((rng.random(n) * 0.004 + 0.001).astype(np.float32), "bs"),
                  numpy_helper.from_array(np.zeros(n, np.int8), "bz")]
        bdq = helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=1)
    nodes = [helper.make_node("DequantizeLinear", ["a", "as", "az"], ["ad"]), bdq,
             helper.make_node("MatMul", ["ad", "bd"], ["mm"]),
             helper.make_node("QuantizeLinear", ["mm", "ys", "yz"], ["y"])]
    yt = TensorProto.UINT8 if ydt == np.uint8 else TensorProto.INT8
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", yt, yshape)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, feeds


@pytest.mark.parametrize("form", ["vnni512", "avx2"])
@pytest.mark.parametrize("ydt", [np.uint8, np.int8])
@pytest.mark.parametrize("ash,n,runtime_b,tile", [
    ((2, 9, 96), 128, False, None),          # the default tile's column vectors, batched rows
    ((7, 40), 96, False, (3, 3)),            # 3 column vectors a row: a pair and a single
    ((2, 6, 32), 64, True, None),            # B computed at run time (attention's Q K^T)
])
def test_int8_matmul_packed_narrowing(form, ydt, ash, n, runtime_b, tile):
    """matmul_int8's u8 / i8 outputs of a row's column vectors narrowed together (``int8_narrow``
    ``pack``: ir.kernel.Concat "x86pack") equal the vector-by-vector form exactly and
    onnxruntime's unfused QDQ graph within one output step, at 16 lanes and 8, for a constant and
    a run-time B, with a tile of 3 column vectors (a pair, then one vector alone)."""
    rng = np.random.default_rng(n + len(ash))
    model, feeds = _qdq_matmul_int8_output_model(ash, n, ydt, runtime_b, rng)
    _check_packed_narrowing(model, feeds, form, "llvm.matmul_int8", **({"int8_tile": tile} if tile else {}))
