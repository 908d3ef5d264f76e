"""matmul_int8 and conv2d_int8 on AMX tiles (knob ``int8_engine`` = "amx", the default on
targets with ``amx-tile`` + ``amx-int8`` from 16 rows of A and two 64-byte steps of the
reduction): the kernel IR's tile operations (``TileOp``),
their LLVM lowering (LDTILECFG, TILELOADD, TDPBUSD, TILESTORED), their bounds checks, and exact
results against onnxruntime / onnx.reference / the ONNX formula in numpy. The code runs where
the host has AMX (Intel Sapphire Rapids and later) and the OS grants the tile data; elsewhere
the assembly is checked for the instructions."""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from oracle import node_model, ort_run
from test_int8_schedules import _fixed, _mm_integer_model
from tensorfuse.codegen.llvm.schedules import int8 as _int8
from tensorfuse.compiler.pipeline import optimized_llvm
from tensorfuse.ir.bounds import BoundsError, check_kernel_bounds
from tensorfuse.ir.kernel import Buffer, DotAcc, For, If, KernelBuilder, Store, TileOp
from tensorfuse.ir.schedule import expr_nodes
from tensorfuse.ir.types import DType

#: an AMX CPU (LLVM's sapphirerapids: amx-tile, amx-int8, AVX-512 VNNI)
AMX = "llvm -mcpu=sapphirerapids"
#: the same without AMX
NO_AMX = "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"


def _walk(stmts, out):
    for s in stmts:
        if isinstance(s, For):
            _walk(s.body, out)
        elif isinstance(s, If):
            _walk(s.then, out), _walk(s.orelse, out)
        else:
            out.append(s)
    return out


def _tile_ops(mod) -> list[str]:
    return [s.op for k in mod.kernels for s in _walk(k.body, []) if isinstance(s, TileOp)]


def _has_dots(mod) -> bool:
    return any(isinstance(e, DotAcc) for k in mod.kernels for s in _walk(k.body, []) if isinstance(s, Store)
               for e in expr_nodes(s.value))


def _q(shape, dtype, rng):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _check(mod, feeds, expected, atol=0):
    """Run where the host can (exact, or within ``atol``), else check the assembly."""
    if not mod.runs_here:
        _, asm = optimized_llvm(mod.llvm_ir, mod.target)
        assert re.search(r"tdpbusd\s", asm) and re.search(r"ldtilecfg\s", asm) and re.search(r"tileloadd\s", asm)
        return
    (got,) = mod.run(**feeds)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.abs(got.astype(np.int64) - expected.astype(np.int64)).max() <= atol


MM_CASES = [
    # A shape, B shape, A dtype, B dtype, a zero point, b zero point (None: absent)
    ((16, 64), (64, 16), np.uint8, np.int8, 7, None),          # one tile, one K step
    ((70, 30), (30, 33), np.uint8, np.uint8, 128, 131),        # K < 64 and not a multiple of 4; row and column tails
    ((2, 24, 100), (100, 96), np.int8, np.int8, -3, 5),        # batch dims folded into the rows
    ((33, 130), (130, 17), np.int8, np.uint8, 1, 200),
    ((197, 768), (768, 80), np.uint8, np.int8, 0, 0),          # a ViT's rows
]


@pytest.mark.parametrize("ash,bsh,adt,bdt,az,bz", MM_CASES)
def test_matmul_integer_on_amx_tiles(ash, bsh, adt, bdt, az, bz):
    m, a = _mm_integer_model(ash, bsh, adt, bdt, az, bz)
    # the default from two 64-byte steps of K (test_amx_default_needs_two_reduction_steps)
    one_step = ash[-1] <= 64
    mod = tensorfuse.compile(m, target=AMX, tuning=_fixed(int8_engine="amx") if one_step else None, cache=False)
    (k,) = mod.kernels
    assert k.knobs["int8_engine"] == "amx" and "amx tdpbusd" in k.comment, k.knobs
    ops = _tile_ops(mod)
    assert {"config", "zero", "load", "dpbusd", "store", "release"} <= set(ops) and not _has_dots(mod)
    u8s8 = (adt, bdt) == (np.uint8, np.int8)          # onnxruntime's x86 kernels saturate there
    want = ReferenceEvaluator(m).run(None, {"a": a})[0] if u8s8 else ort_run(m, {"a": a})[0]
    _check(mod, {"a": a}, want)


def test_amx_per_column_b_zero_points_and_saturation_edge():
    """b_zero_point [N], and the largest products (255 x -128 over K = 200: exact in int32)."""
    rng = np.random.default_rng(3)
    a, b = _q((40, 21), np.int8, rng), _q((21, 35), np.uint8, rng)
    bz = _q((35,), np.uint8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b, "az": np.array(-7, np.int8), "bz": bz},
                   input_names=["a", "b", "az", "bz"])
    exp = ((a.astype(np.int64) + 7) @ (b.astype(np.int64) - bz)).astype(np.int32)
    # K = 21 is one tile step: the default there is VPDPBUSD, so the engine is asked for (on a
    # host without AMX the check reads the assembly, which must then hold the tile products)
    mod = tensorfuse.compile(m, target=AMX, tuning=_fixed(int8_engine="amx"), cache=False)
    assert mod.kernels[0].knobs["int8_engine"] == "amx"
    _check(mod, {"a": a}, exp)
    a = np.full((20, 200), 255, np.uint8)
    b = np.where(np.arange(200 * 24).reshape(200, 24) % 3 == 0, 127, -128).astype(np.int8)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b}, input_names=["a", "b"])
    exp = a.astype(np.int64) @ b.astype(np.int64)
    assert exp.min() < -255 * 128 * 100
    mod = tensorfuse.compile(m, target=AMX, cache=False)
    assert "dpbusd" in _tile_ops(mod)
    _check(mod, {"a": a}, exp.astype(np.int32))


@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_on_amx_tiles(per_column):
    """The requantizing finish reads the tile products back from the accumulator block
    (per-column scales and zero points as vectors); against onnxruntime within 1."""
    rng = np.random.default_rng(4)
    a, b = _q((50, 90), np.uint8, rng), _q((90, 37), np.uint8, rng)
    bs = np.linspace(0.01, 0.02, 37).astype(np.float32) if per_column else np.array(0.01, np.float32)
    bz = rng.integers(100, 151, 37).astype(np.uint8) if per_column else np.array(131, np.uint8)
    inits = {"as": np.array(0.02, np.float32), "az": np.array(120, np.uint8), "b": b, "bs": bs, "bz": bz,
             "ys": np.array(0.9, np.float32), "yz": np.array(100, np.uint8)}
    m = node_model("QLinearMatMul", {"a": a}, {}, initializers=inits,
                   input_names=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    mod = tensorfuse.compile(m, target=AMX, cache=False)
    assert "dpbusd" in _tile_ops(mod)
    _check(mod, {"a": a}, ort_run(m, {"a": a})[0], atol=1)


@pytest.mark.parametrize("knobs", [{"int8_tile": (16, 1)}, {"int8_tile": (32, 1), "col_split": 2},
                                   {"int8_tile": (16, 2), "sweep_rows": 2}, {"int8_tile": (32, 2), "sweep_rows": 2}])
def test_amx_tile_knobs(knobs):
    m, a = _mm_integer_model((100, 140), (140, 90), np.uint8, np.uint8, 3, 200)
    mod = tensorfuse.compile(m, target=AMX, tuning=_fixed(int8_engine="amx", **knobs), cache=False)
    (k,) = mod.kernels
    assert {n: k.knobs[n] for n in knobs} == knobs, k.knobs
    # each tile of R rows x NB vectors: R / 16 x NB accumulator tiles, zeroed and multiplied
    ops, per = _tile_ops(mod), (knobs["int8_tile"][0] // 16) * knobs["int8_tile"][1]
    assert ops.count("zero") % per == 0 and ops.count("dpbusd") == ops.count("zero") == ops.count("store") > 0
    _check(mod, {"a": a}, ort_run(m, {"a": a})[0])


def test_amx_not_taken_where_it_must_not():
    """Without AMX in the target, with fewer than 16 rows (the default; the knob still offers
    it), and for a B computed at run time, the GEMM stays on the vector dot product."""
    rng = np.random.default_rng(5)
    a, b = _q((64, 128), np.uint8, rng), _q((128, 64), np.int8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b}, input_names=["a", "b"])
    mod = tensorfuse.compile(m, target=NO_AMX, cache=False)
    assert not _tile_ops(mod) and _has_dots(mod) and "int8_engine" not in mod.kernels[0].knobs
    a8 = a[:8]
    m8 = node_model("MatMulInteger", {"a": a8}, {}, initializers={"b": b}, input_names=["a", "b"])
    mod8 = tensorfuse.compile(m8, target=AMX, cache=False)
    assert mod8.kernels[0].knobs["int8_engine"] == "dot" and not _tile_ops(mod8) and _has_dots(mod8)
    forced = tensorfuse.compile(m8, target=AMX, tuning=_fixed(int8_engine="amx"), cache=False)
    assert "dpbusd" in _tile_ops(forced)
    _check(forced, {"a": a8}, ReferenceEvaluator(m8).run(None, {"a": a8})[0])
    mr = node_model("MatMulInteger", {"a": a, "b": b}, {}, input_names=["a", "b"])
    modr = tensorfuse.compile(mr, target=AMX, cache=False)
    assert not _tile_ops(modr) and _has_dots(modr)
    if modr.runs_here:
        np.testing.assert_array_equal(modr.run(a=a, b=b)[0], ReferenceEvaluator(mr).run(None, {"a": a, "b": b})[0])


def test_tile_ops_in_the_kernel_text():
    rng = np.random.default_rng(6)
    a, b = _q((32, 128), np.uint8, rng), _q((128, 32), np.int8, rng)
    m = node_model("MatMulInteger", {"a": a}, {}, initializers={"b": b}, input_names=["a", "b"])
    text = str(tensorfuse.compile(m, target=AMX, cache=False).kernels[0])
    assert "tile_config tmm0=16x64B" in text and "tmm0 += dpbusd(tmm4, tmm6)" in text
    assert re.search(r"tile_load tmm6 <- \w*bint8\w*\[.*\+ r\*32\] \(16 x 64B\)", text), text
    assert re.search(r"tile_store tmm\d -> acc\w*\[.*\] \(16 x 64B\)", text) and "tile_release" in text


def test_tile_load_and_store_bounds():
    """Debug mode's bounds check takes a tile load or store as the access of its first and
    last rows: a tile reaching past its buffer stops the compile."""
    def kernel(rows, stride):
        a = Buffer("a", DType.u8, (16 * 64,))
        y = Buffer("y", DType.i32, (16 * 16,))
        kb = KernelBuilder("k", [a, y])
        kb.tile_config([(16, 64)] * 8)
        kb.tile_load(0, a, 0, stride, rows, 64)
        kb.tile_store(0, y, 0, 16, 16, 64)
        return kb.kernel
    check_kernel_bounds(kernel(16, 64))
    with pytest.raises(BoundsError, match=r"load of a \[1024 elements.*at elements 1020\.\.1083"):
        check_kernel_bounds(kernel(16, 68))
    with pytest.raises(ValueError, match="AMX tile shapes"):
        KernelBuilder("k", []).tile_config([(17, 64)])


# ----------------------------------------------------------------------------- conv2d_int8 on AMX
def _qconv(**kw):
    from test_int8_schedules import _qconv_model, _unfused_ort
    m, feeds = _qconv_model(**kw)
    return m, feeds, _unfused_ort(m, feeds)


def _check_qconv(mod, feeds, want):
    """onnxruntime's unfused QDQ result within 1 where the host runs AMX, else TDPBSUD in the
    assembly."""
    if mod.runs_here:
        got = mod.run(**feeds)[0]
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    else:
        _, asm = optimized_llvm(mod.llvm_ir, mod.target)
        assert re.search(r"tdpbsud\s", asm)


def _conv_kernel(mod):
    return next(k for k in mod.kernels if "int8_layout" in k.knobs)


@pytest.mark.parametrize("case", [
    dict(c=64, m=40, hw=9, k=3),                       # rows of 9 (a partial pixel vector), 40 channels: a tile half used
    dict(c=64, m=64, hw=7, k=1),                       # a 7x7 plane: the flat layout
    dict(c=128, m=32, hw=15, k=3, stride=2),           # stride 2: the panel's phase copies
    dict(c=64, m=80, hw=6, k=1, residual=True),        # the residual Add read at the pixels' offsets
    dict(c=64, m=48, hw=12, k=3, pads=[0, 1, 2, 0], dil=2, bias=False),
])
@pytest.mark.parametrize("knobs", [{}, {"int8_tile": (1, 16)}, {"int8_tile": (2, 16), "oc_split": 2},
                                   {"int8_tile": (1, 32), "int8_stage": "none"}])
def test_conv_int8_on_amx_tiles(case, knobs):
    """QDQ convolutions (u8 activations, s8 per-channel weights) on TDPBSUD tiles: exact int32
    sums as VPDPBUSD's, so the result is onnxruntime's unfused QDQ one within 1 (its float
    rounding of the requantisation)."""
    m, feeds, want = _qconv(**case)
    if case["k"] == 1 and case["c"] == 64:      # one tile step: AMX only when asked for
        knobs = {**knobs, "int8_engine": "amx"}
    mod = tensorfuse.compile(m, target=AMX, tuning=_fixed(**knobs) if knobs else None, cache=False)
    k = _conv_kernel(mod)
    assert k.knobs["int8_engine"] == "amx" and k.knobs["int8_layout"] in ("rows", "flat"), k.knobs
    assert {n: k.knobs[n] for n in knobs} == knobs, k.knobs
    assert "dpbsud" in _tile_ops(mod) and "amx tdpbsud" in k.comment
    _check_qconv(mod, feeds, want)


@pytest.mark.parametrize("case", [
    dict(c=3, m=64, hw=30, k=7, stride=2),              # resnet's stem: 49 taps x 1 word, 4 tile steps
    dict(c=16, m=40, hw=11, k=3),                       # 36 words; 40 channels (a block half used), rows of 11
    dict(c=24, m=32, hw=10, k=3, pads=[0, 1, 2, 0], dil=2, bias=False),
    dict(c=8, m=32, hw=9, k=5, residual=True),          # 25 taps x 2 words; the residual Add
])
@pytest.mark.parametrize("knobs", [{}, {"int8_tile": (2, 16), "oc_split": 2}, {"int8_tile": (2, 32), "int8_stage": "none"},
                                   {"int8_layout": "flat"}])
def test_conv_int8_gathered_amx_tiles(case, knobs):
    """Channel words that do not fill whole tile rows (C not a multiple of 64) on AMX: each
    pixel vector's B tiles gathered from the (tap, channel word) rows of the panel, by default
    from two tile steps and nine taps. The result is onnxruntime's unfused QDQ one within 1."""
    m, feeds, want = _qconv(**case)
    if knobs.get("int8_layout") == "flat" and (case.get("stride", 1) != 1 or case.get("dil", 1) != 1):
        knobs = {}
    mod = tensorfuse.compile(m, target=AMX, tuning=_fixed(**knobs) if knobs else None, cache=False)
    k = _conv_kernel(mod)
    assert k.knobs["int8_engine"] == "amx" and "amx tdpbsud" in k.comment, k.knobs
    assert {n: k.knobs[n] for n in knobs} == knobs, k.knobs
    if not knobs and case["m"] > 16:
        assert k.knobs["int8_tile"] == (1, 32), k.knobs
    assert "dpbsud" in _tile_ops(mod)
    _check_qconv(mod, feeds, want)


@pytest.mark.parametrize("xdt,group,c,m,k,stride", [(np.uint8, 1, 3, 64, 7, 2), (np.int8, 4, 64, 64, 3, 1),
                                                    (np.uint8, 2, 24, 48, 3, 2)])
def test_convinteger_gathered_amx_exact(xdt, group, c, m, k, stride):
    """ConvInteger (int32 output, exact) through the gathered AMX tiles: u8 and s8 activations
    (s8 offset to u8 and corrected), grouped convolutions (one group's channels a panel)."""
    rng = np.random.default_rng(11)
    x, w = _q((1, c, 13, 13), xdt, rng), _q((m, c // group, k, k), np.int8, rng)
    xz = np.array(5 if xdt == np.uint8 else -7, xdt)
    m_ = node_model("ConvInteger", {"x": x}, {"pads": [k // 2] * 4, "strides": [stride] * 2, "group": group},
                    initializers={"w": w, "xz": xz}, input_names=["x", "w", "xz"])
    mod = tensorfuse.compile(m_, target=AMX, tuning=_fixed(int8_engine="amx"), cache=False)
    kern = _conv_kernel(mod)
    assert kern.knobs["int8_engine"] == "amx" and "dpbsud" in _tile_ops(mod)
    if mod.runs_here:
        np.testing.assert_array_equal(mod.run(x=x)[0], ReferenceEvaluator(m_).run(None, {"x": x})[0])


def test_conv_int8_amx_not_taken_where_it_must_not():
    """A 1x1 conv whose channels do not fill 64-byte tile rows (C = 48), a 3x3 stem whose 9
    words are one tile step, weights whose zero point needs the
    pixels' sums (u8 weights), and a target without AMX keep the vector dot product; the
    knob still chooses it where AMX applies."""
    for case, target in ((dict(c=48, m=32, hw=8, k=1), AMX), (dict(c=3, m=32, hw=16, k=3, stride=2), AMX),
                         (dict(c=64, m=32, hw=8, k=3), NO_AMX)):
        m, feeds, want = _qconv(**case)
        mod = tensorfuse.compile(m, target=target, cache=False)
        assert not _tile_ops(mod) and _conv_kernel(mod).knobs.get("int8_engine", "dot") == "dot"
        if mod.runs_here:
            assert np.abs(mod.run(**feeds)[0].astype(int) - want.astype(int)).max() <= 1
    rng = np.random.default_rng(8)
    x, w = _q((1, 64, 8, 8), np.uint8, rng), _q((32, 64, 3, 3), np.uint8, rng)
    m = node_model("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1]},
                   initializers={"w": w, "xz": np.array(3, np.uint8), "wz": np.array(100, np.uint8)},
                   input_names=["x", "w", "xz", "wz"])
    mod = tensorfuse.compile(m, target=AMX, cache=False)
    assert not _tile_ops(mod)
    if mod.runs_here:
        np.testing.assert_array_equal(mod.run(x=x)[0], ort_run(m, {"x": x})[0])
    m2, feeds2, want2 = _qconv(c=64, m=32, hw=8, k=3)
    dot = tensorfuse.compile(m2, target=AMX, tuning=_fixed(int8_engine="dot"), cache=False)
    assert not _tile_ops(dot) and _has_dots(dot)
    if dot.runs_here:
        assert np.abs(dot.run(**feeds2)[0].astype(int) - want2.astype(int)).max() <= 1


@pytest.mark.parametrize("kind,size,engine", [
    ("matmul", 64, "dot"), ("matmul", 65, "amx"), ("matmul", 256, "amx"),
    ("convinteger1x1", 64, "dot"), ("convinteger1x1", 128, "amx"),
    ("conv1x1", 64, "amx"), ("conv1x1", 128, "amx"), ("conv3x3", 64, "amx"),
])
def test_amx_default_needs_two_reduction_steps(kind, size, engine):
    """int8_engine defaults to AMX tiles from int8.AMX_MIN_STEPS (2) 64-byte steps of the
    reduction per accumulator tile (K of a GEMM, KH * KW * C of a conv): with one step the tile
    store and reload per 16 x 16 outputs cost more than the tile product saves where the output
    is int32 (MatMulInteger, ConvInteger). A QDQ conv's requantizing epilogue (u8 output) takes
    AMX from one step: its float work then has the vector ports to itself. Either way the
    result is exact (MatMulInteger, ConvInteger) or onnxruntime's unfused QDQ within 1 (the
    QDQ conv)."""
    rng = np.random.default_rng(9)
    if kind == "matmul":
        m, a = _mm_integer_model((48, size), (size, 40), np.uint8, np.int8, 5, None)
        mod = tensorfuse.compile(m, target=AMX, cache=False)
        k, feeds, want, atol = mod.kernels[0], {"a": a}, ReferenceEvaluator(m).run(None, {"a": a})[0], 0
    elif kind == "convinteger1x1":
        x, w = _q((1, size, 8, 8), np.uint8, rng), _q((32, size, 1, 1), np.int8, rng)
        m = node_model("ConvInteger", {"x": x}, {}, initializers={"w": w, "xz": np.array(7, np.uint8)},
                       input_names=["x", "w", "xz"])
        mod = tensorfuse.compile(m, target=AMX, cache=False)
        k, feeds, want, atol = _conv_kernel(mod), {"x": x}, ReferenceEvaluator(m).run(None, {"x": x})[0], 0
    else:
        m, feeds, want = _qconv(c=size, m=32, hw=8, k=1 if kind == "conv1x1" else 3)
        mod = tensorfuse.compile(m, target=AMX, cache=False)
        k, atol = _conv_kernel(mod), 1
    assert k.knobs["int8_engine"] == engine, k.knobs
    assert ("amx tdpb" in k.comment) == (engine == "amx") and bool(_tile_ops(mod)) == (engine == "amx")
    assert _int8.AMX_MIN_STEPS == 2
    if mod.runs_here:
        got = mod.run(**feeds)[0]
        assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= atol
