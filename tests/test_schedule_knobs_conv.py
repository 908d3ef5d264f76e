"""Knobs of the llvm conv2d schedules (codegen/llvm/schedules/conv2d*.py; ONNX spec section
"Conv"): for a small workload of each schedule (pointwise, strided pointwise, flat, im2row,
Winograd, rows, depthwise, grouped), every candidate of every knob the schedule declares,
one knob at a time with the others at their defaults, lowers to a kernel whose result
matches onnxruntime (optimisations off); the registry picks the schedules the formulas picked
before the knobs existed; and a kernel prints its schedule and knob values.

All compile for the AVX2 layout (8 float32 lanes, 16 vector registers) on every host, as
tests/test_ops_conv.py's schedule tests do. Candidates that lower to the same kernel as one
already checked are not compiled again. Tolerances: float32 sums of at most 144 products of
values in [-1, 1] (Winograd's transforms add a few more terms): rtol 1e-4, atol 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest

from tensorfuse.compiler.driver import build_module
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.compiler.lower import lower_graph
from tensorfuse.compiler.target import Target
from tests.knob_util import Fixed
from tests.oracle import node_model, ort_run, rand

TARGET = "llvm -mattr=-avx512f"
RTOL, ATOL = 1e-4, 1e-4


def conv_model(xs, ws, attrs, bias=True):
    x = rand(*xs, low=-1, high=1)
    inits = {"w": rand(*ws, seed=1, low=-1, high=1)}
    names = ["x", "w"]
    if bias:
        inits["b"] = rand(ws[0], seed=2, low=-1, high=1)
        names.append("b")
    return node_model("Conv", {"x": x}, attrs, initializers=inits, input_names=names), {"x": x}


def lower(model, knobs=None):
    graph = import_onnx(model)
    lowered = lower_graph(graph, Target.parse(TARGET), tuning=Fixed(knobs) if knobs is not None else None)
    return graph, lowered


def conv_kernel(lowered):
    (k,) = lowered.kernels
    return k


def body(kernel) -> str:
    """The kernel's text without its '# schedule' line (two knob values may give one kernel)."""
    return "\n".join(ln for ln in str(kernel).splitlines() if "# schedule" not in ln)


# (id, x shape, w shape, attrs, default schedule)
WORKLOADS = [
    ("pointwise", (1, 8, 6, 7), (24, 8, 1, 1), {}, "llvm.conv2d_pointwise"),
    ("pointwise_strided", (1, 8, 11, 11), (16, 8, 1, 1), {"strides": [2, 2]}, "llvm.conv2d_pointwise"),
    ("pointwise_grouped", (1, 12, 5, 6), (12, 4, 1, 1), {"group": 3}, "llvm.conv2d_pointwise"),
    # unpacked (C x one pixel tile over PACK_MAX_BYTES) with 8+ channel blocks: pixel tiles inner
    ("pointwise_tiles_inner", (1, 1100, 9, 9), (64, 1100, 1, 1), {}, "llvm.conv2d_pointwise"),
    ("flat", (1, 16, 7, 7), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "llvm.conv2d_flat"),
    # several channel blocks: the weight prefetch aims at the next block (and blocks_per_task)
    ("flat_blocks", (1, 16, 7, 7), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "llvm.conv2d_flat"),
    ("im2row", (1, 3, 20, 20), (16, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "llvm.conv2d_im2row"),
    ("winograd", (1, 16, 10, 10), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "llvm.conv2d_winograd"),
    ("rows", (1, 8, 13, 13), (16, 8, 3, 3), {"pads": [1, 2, 0, 1]}, "llvm.conv2d_rows"),
    ("rows_blocks", (1, 8, 13, 13), (40, 8, 3, 3), {"pads": [1, 2, 0, 1]}, "llvm.conv2d_rows"),
    ("rows_grouped", (1, 16, 6, 6), (16, 8, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, "llvm.conv2d_rows"),
    # fewer channels than lanes: the row schedule (channels as lanes needs C >= 8)
    ("depthwise", (1, 7, 9, 9), (7, 1, 3, 3), {"group": 7, "pads": [1, 1, 1, 1]}, "llvm.conv2d_depthwise"),
    ("depthwise_wide", (1, 4, 5, 21), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "llvm.conv2d_depthwise"),
    ("depthwise_strided", (1, 7, 12, 12), (7, 1, 3, 3), {"group": 7, "strides": [2, 2], "pads": [1, 1, 1, 1]},
     "llvm.conv2d_depthwise"),
    # channels as lanes: 12 channels (the last block overlaps the first), 5x5 stride 2
    ("depthwise_lanes", (1, 12, 9, 9), (12, 1, 3, 3), {"group": 12, "pads": [1, 1, 1, 1]},
     "llvm.conv2d_depthwise_lanes"),
    ("depthwise_lanes_strided", (2, 8, 12, 11), (8, 1, 5, 5), {"group": 8, "strides": [2, 2], "pads": [2, 1, 2, 2]},
     "llvm.conv2d_depthwise_lanes"),
    ("depthwise_7x7", (1, 4, 9, 11), (4, 1, 7, 7), {"group": 4, "pads": [3, 3, 3, 3]}, "llvm.conv2d_depthwise"),
]


#: workloads of the sweep that repeat a schedule another workload covers: in the heavy run
HEAVY_WORKLOADS = {"flat_blocks", "rows_blocks", "pointwise_tiles_inner", "pointwise_strided", "depthwise_lanes_strided"}


@pytest.mark.parametrize("name,xs,ws,attrs,schedule",
                         [pytest.param(*w, marks=[pytest.mark.heavy] if w[0] in HEAVY_WORKLOADS else []) for w in WORKLOADS],
                         ids=[w[0] for w in WORKLOADS])
def test_every_knob_candidate_matches_onnxruntime(name, xs, ws, attrs, schedule):
    model, feeds = conv_model(xs, ws, attrs)
    expected = ort_run(model, feeds)[0]
    graph, lowered = lower(model)
    (wl,) = lowered.workloads.values()
    assert wl.schedule == schedule
    assert wl.space, "the schedule declares knobs"
    seen = set()
    tried = 0
    for k in wl.space:
        assert k.default in k.candidates and k.doc
        for cand in k.candidates:
            graph, low = lower(model, {k.name: cand})
            (w2,) = low.workloads.values()
            assert w2.knobs[k.name] == cand, f"{k.name}={cand!r} not taken: {w2.knobs}"
            text = body(conv_kernel(low))
            if text in seen:
                continue
            seen.add(text)
            tried += 1
            mod = build_module(low, graph, ["x"], ["y"], TARGET)
            got = mod.run(x=feeds["x"])[0]
            np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}: {k.name}={cand!r} ({w2.schedule})")
    assert tried > 1


# (x shape, w shape, attrs, schedule the formulas chose before the registry)
DEFAULTS = [
    ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "llvm.conv2d_winograd"),      # resnet stage 1
    ((1, 512, 7, 7), (512, 512, 3, 3), {"pads": [1, 1, 1, 1]}, "llvm.conv2d_flat"),         # resnet stage 4
    ((1, 64, 28, 28), (128, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "llvm.conv2d_rows"),
    ((1, 64, 56, 56), (128, 64, 1, 1), {"strides": [2, 2]}, "llvm.conv2d_pointwise"),       # downsample
    ((1, 32, 56, 56), (16, 32, 1, 1), {}, "llvm.conv2d_pointwise"),
    ((1, 3, 224, 224), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, "llvm.conv2d_rows"),
    ((1, 3, 224, 224), (32, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "llvm.conv2d_im2row"),
    ((1, 96, 56, 56), (96, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 96}, "llvm.conv2d_depthwise"),
    ((1, 64, 28, 28), (64, 16, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}, "llvm.conv2d_winograd"),
    ((1, 32, 28, 28), (32, 8, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}, "llvm.conv2d_rows"),  # 8 per group
    ((1, 16, 14, 14), (16, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}, "generic"),       # ResNeXt-like 4
]


@pytest.mark.parametrize("xs,ws,attrs,schedule", DEFAULTS, ids=[str(i) for i in range(len(DEFAULTS))])
def test_registry_picks_the_formulas_schedule(xs, ws, attrs, schedule):
    model, _ = conv_model(xs, ws, attrs)
    _, lowered = lower(model)
    (wl,) = lowered.workloads.values()
    assert wl.schedule == schedule


def test_pointwise_at_7x7_with_16_lanes_loses_to_flat():
    """POINTWISE_MIN_LANE_USE: 49 pixels in 4 vectors of 16 use 77% of the lanes, so the flat
    tiles win with AVX-512; with 8 lanes (88%) the pointwise schedule does."""
    model, _ = conv_model((1, 160, 7, 7), (320, 160, 1, 1), {})
    for target, schedule in (("llvm -mcpu=skylake-avx512", "llvm.conv2d_flat"), (TARGET, "llvm.conv2d_pointwise")):
        lowered = lower_graph(import_onnx(model), Target.parse(target))
        (wl,) = lowered.workloads.values()
        assert wl.schedule == schedule, target
        assert wl.knobs["schedule"] == schedule.split(".")[1]


def test_kernel_prints_schedule_and_knobs():
    model, _ = conv_model((1, 8, 13, 13), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]})
    _, lowered = lower(model, {"tile_cols": 3})
    text = str(conv_kernel(lowered))
    line = next(ln.strip() for ln in text.splitlines() if "# schedule" in ln)
    assert line.startswith("# schedule llvm.conv2d_rows {")
    assert "tile_oc_vectors=2" in line and "tile_cols=3" in line and "weights_kh_outer=True" in line
    assert "register tile 2x8 channels x 3 columns" in text


@pytest.mark.parametrize("name", ["pointwise_tiles_inner", "flat_blocks", "rows_blocks"])
def test_conv_prefetch_knob_emits_llvm_prefetch(name):
    """The blocked conv schedules' ``prefetch`` 1 (the default) puts a Prefetch (locality 2:
    L2) of the packed weights the task reads next in the reduction step, reaching LLVM as
    llvm.prefetch; 0 has none. (Every candidate's numbers are checked against onnxruntime in
    test_every_knob_candidate_matches_onnxruntime.)"""
    from llvmlite import ir

    from tensorfuse.codegen.llvm.emit import emit_kernel
    (_, xs, ws, attrs, _s), = [w for w in WORKLOADS if w[0] == name]
    model, _ = conv_model(xs, ws, attrs)
    _, low = lower(model, {"prefetch": 1})
    text = str(conv_kernel(low))
    assert "prefetch " in text and "wpack" in text and "(locality 2)" in text, text
    m = ir.Module()
    emit_kernel(m, conv_kernel(low))
    assert "llvm.prefetch" in str(m)
    _, low0 = lower(model, {"prefetch": 0})
    assert "prefetch " not in str(conv_kernel(low0))


def test_unpacked_pointwise_runs_pixel_tiles_inner_by_default():
    """With 8+ channel blocks and no packed panels, a task runs one channel block over every
    pixel tile (W read once per image): the parallel loop has one task per block."""
    model, _ = conv_model((1, 1100, 9, 9), (64, 1100, 1, 1), {})
    _, low = lower(model)
    (wl,) = low.workloads.values()
    assert wl.knobs["pack_pixels"] is False and wl.knobs["pixel_tiles_inner"] is True
    _, low2 = lower(model, {"pixel_tiles_inner": False})
    assert body(conv_kernel(low)) != body(conv_kernel(low2))
