"""Knobs of the llvm MatMul/Gemm schedules (codegen/llvm/schedules/matmul.py; ONNX spec sections
"MatMul", "Gemm", "MatMulInteger") and of the row schedules moved beside them (row norms:
codegen/llvm/schedules/norm.py, "LayerNormalization"; global pools: codegen/llvm/schedules/
pool.py, "GlobalAveragePool" / "GlobalMaxPool"; reductions over trailing axes:
codegen/llvm/schedules/reduce.py, "ReduceMean", "ReduceLogSumExp"; the generic RNN's dot
products, "LSTM").

For small workloads (M not a multiple of the register tile, batched MatMul, Gemm with transB
and a bias, MatMulInteger) every candidate of every knob a schedule declares, one knob at a
time with the others at their defaults, lowers to a kernel whose result matches onnxruntime;
every schedule the ``schedule`` knob offers is tried the same way. Without knobs the registry
picks the schedule the formulas picked before it existed.

All compile for the AVX2 layout (8 float32 lanes, 16 vector registers) on every host.
Candidates that lower to the same kernel as one already checked are not compiled again.
Tolerances: float32 sums of at most 40 products of values in [-1, 1]: rtol 1e-4, atol 1e-4.
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


def r(*shape, seed=0):
    return rand(*shape, seed=seed, low=-1, high=1)


def matmul_const(a_shape, b_shape):
    a = r(*a_shape)
    return node_model("MatMul", {"a": a}, initializers={"b": r(*b_shape, seed=1)}), {"a": a}


def matmul_runtime(a_shape, b_shape):
    a, b = r(*a_shape), r(*b_shape, seed=1)
    return node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}


def gemm_transb(const_b: bool):
    a, b, c = r(13, 40), r(20, 40, seed=1), r(20, seed=2)
    attrs = {"transB": 1, "alpha": 0.5, "beta": 2.0}
    if const_b:
        return node_model("Gemm", {"a": a}, attrs, initializers={"b": b, "c": c}), {"a": a}
    return node_model("Gemm", {"a": a, "b": b}, attrs, initializers={"c": c}), {"a": a, "b": b}


def matmul_integer():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (7, 20), dtype=np.uint8)
    b = rng.integers(0, 255, (20, 12), dtype=np.uint8)
    zp = np.array(3, np.uint8)
    return node_model("MatMulInteger", {"a": a, "b": b}, initializers={"za": zp},
                      input_names=["a", "b", "za"]), {"a": a, "b": b}


def layernorm(n):
    x = r(3, 5, n) + 3.0
    return node_model("LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-5},
                      initializers={"s": r(n, seed=1), "bias": r(n, seed=2)}, opset=17), {"x": x}


def global_pool(op, shape):
    x = r(*shape)
    return node_model(op, {"x": x}), {"x": x}


def reduce_rows(op, shape, axes):
    x = r(*shape)
    return node_model(op, {"x": x}, {"keepdims": 1}, initializers={"axes": np.array(axes, np.int64)},
                      opset=18), {"x": x}


def lstm():
    x = r(3, 2, 40)
    inits = {"w": r(1, 80, 40, seed=1), "rr": r(1, 80, 20, seed=2)}
    return node_model("LSTM", {"x": x}, {"hidden_size": 20}, initializers=inits, outputs=("y",)), {"x": x}


# (id, model builder, the schedule chosen without knobs)
WORKLOADS = [
    # 13 rows: register tiles of 6 rows leave one; K 40 > 32 offers a k_block
    ("matmul_blocked", lambda: matmul_const((13, 40), (40, 20)), "llvm.matmul_blocked"),
    ("matmul_batched_const_b", lambda: matmul_const((2, 3, 7, 40), (40, 20)), "llvm.matmul_blocked"),
    # N = 12: one vector of 8 (AVX2) and 4 scalar columns
    ("matmul_batched", lambda: matmul_runtime((2, 7, 16), (2, 16, 12)), "llvm.matmul_register_tiles"),
    ("matmul_batched_wide", lambda: matmul_runtime((2, 9, 16), (2, 16, 40)), "llvm.matmul_register_tiles"),
    ("gemm_transb_bias", lambda: gemm_transb(True), "llvm.matmul_blocked"),
    ("gemm_transb_runtime_b", lambda: gemm_transb(False), "llvm.matmul_dot"),
    ("matmul_integer", matmul_integer, "llvm.matmul_int8"),     # B at run time: packed by the kernel
    ("layernorm", lambda: layernorm(40), "llvm.row_norm_partial_sums"),
    ("global_avg_pool", lambda: global_pool("GlobalAveragePool", (1, 3, 9, 9)), "llvm.global_pool_vector"),
    ("global_max_pool", lambda: global_pool("GlobalMaxPool", (2, 3, 7, 11)), "llvm.global_pool_vector"),
    # [H, W] of 5 x 9 = 45 = 5 vectors of 8 + a tail of 5
    ("reduce_mean_rows", lambda: reduce_rows("ReduceMean", (2, 3, 5, 9), [2, 3]), "llvm.reduction_rows_vector"),
    ("reduce_logsumexp_rows", lambda: reduce_rows("ReduceLogSumExp", (3, 70), [1]), "llvm.reduction_rows_vector"),
    ("lstm", lstm, "generic"),
]


def lower(model, knobs=None):
    graph = import_onnx(model)
    return graph, lower_graph(graph, Target.parse(TARGET), tuning=Fixed(knobs) if knobs is not None else None)


def body(lowered) -> str:
    """The kernels' text without '# schedule' lines (two knob values may give one kernel)."""
    return "\n".join(ln for k in lowered.kernels for ln in str(k).splitlines() if "# schedule" not in ln)


#: workloads of the sweep that repeat a schedule another workload covers: in the heavy run
HEAVY_WORKLOADS = {"matmul_batched_const_b", "matmul_batched_wide", "gemm_transb_bias"}


@pytest.mark.parametrize("name,make,schedule",
                         [pytest.param(*w, marks=[pytest.mark.heavy] if w[0] in HEAVY_WORKLOADS else []) for w in WORKLOADS],
                         ids=[w[0] for w in WORKLOADS])
def test_every_knob_candidate_matches_onnxruntime(name, make, schedule):
    model, feeds = make()
    expected = ort_run(model, feeds)
    graph, lowered = lower(model)
    (wl,) = lowered.workloads.values()
    assert wl.schedule == schedule
    assert wl.space, "the lowering declares knobs"
    outputs = [o.name for o in model.graph.output]
    # each schedule the registry offers, then each knob of it with the others at their defaults
    bases = [{}]
    sched = next((k for k in wl.space if k.name == "schedule"), None)
    if sched is not None:
        bases += [{"schedule": c} for c in sched.candidates if c != sched.default]
    seen, tried = set(), 0
    for base in bases:
        _, low = lower(model, base)
        (wb,) = low.workloads.values()
        for k in wb.space:
            assert k.default in k.candidates and k.doc, k
            for cand in k.candidates:
                knobs = dict(base, **{k.name: cand})
                graph, low = lower(model, knobs)
                (w2,) = low.workloads.values()
                assert w2.knobs[k.name] == cand, f"{k.name}={cand!r} not taken: {w2.knobs}"
                text = body(low)
                if text in seen:
                    continue
                seen.add(text)
                tried += 1
                mod = build_module(low, graph, list(feeds), outputs, TARGET)
                got = mod.run(**feeds)
                for g, e in zip(got, expected):
                    np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL,
                                               err_msg=f"{name}: {knobs} ({w2.schedule})")
    assert tried > 1


def test_blocked_sweep_with_k_slices_matches_onnxruntime():
    """Two knobs away from their defaults at once: tasks of 2 row blocks over their panel, K in
    slices of 32 (40 = 32 + a slice of 8), accumulators kept in the local buffer between slices."""
    model, feeds = matmul_const((25, 40), (40, 20))
    _, default = lower(model)
    (wl,) = default.workloads.values()
    assert wl.knobs["register_tile"] == (6, 2) and wl.knobs["sweep_rows"] == 1 and wl.knobs["k_block"] == 40
    graph, low = lower(model, {"sweep_rows": 2, "k_block": 32})
    (w2,) = low.workloads.values()
    assert (w2.knobs["sweep_rows"], w2.knobs["k_block"]) == (2, 32)
    got = build_module(low, graph, ["a"], ["y"], TARGET).run(**feeds)[0]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("knobs", [{"sweep_rows": 2, "k_block": 32, "panels_per_task": 3},
                                   {"sweep_rows": 4, "k_block": 32, "panels_per_task": 3}])
def test_blocked_sweep_over_several_panels_matches_onnxruntime(knobs):
    """A task sweeping 3 panels, each slice of K over all of them in turn (the accumulators of
    every panel in the local buffer between slices); with sweep_rows 4 the one task also takes
    the last row (25 = 4 x 6 + 1) inside its slices."""
    model, feeds = matmul_const((25, 40), (40, 40))
    graph, low = lower(model, knobs)
    (w2,) = low.workloads.values()
    assert all(w2.knobs[k] == v for k, v in knobs.items()), w2.knobs
    got = build_module(low, graph, ["a"], ["y"], TARGET).run(**feeds)[0]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_panels_per_task_default():
    """Several panels per task only where the swept rows of A do not fit half of L2 (ViT's
    197 x 3072 fc2 input: 2.4 MB), as many as leave PANEL_MIN_TASKS tasks; GPT-2's 64 rows
    (786 KB) keep one panel per task."""
    from types import SimpleNamespace

    from tensorfuse.codegen.llvm.schedules.matmul import PANEL_MIN_TASKS, panels_default
    t = SimpleNamespace(l2_bytes=2 << 20)
    vit = panels_default(1, 16, (24 * 8 + 5) * 48, 197 * 3072 * 4, t)
    assert vit == 4 and 16 // vit >= PANEL_MIN_TASKS
    assert panels_default(1, 16, 8 * 8 * 48, 64 * 3072 * 4, t) == 1
    assert panels_default(1, 3, 197 * 48, 197 * 3072 * 4, t) == 1       # 3 panels: 4 tasks impossible


def test_register_tiles_fit_the_vector_registers():
    """Every register_tile candidate keeps R*NB accumulators + NB panel vectors + 2 within the
    16 (AVX2) or 32 (AVX-512) vector registers, and the default is the formula's."""
    from tensorfuse.codegen.llvm.schedules.matmul import choose_gemm_tile, register_tiles
    for target, regs in (("llvm -mattr=-avx512f", 16), ("llvm -mcpu=skylake-avx512", 32)):
        t = Target.parse(target)
        for rows, n in ((1, 8), (13, 20), (128, 256), (3, 1000)):
            tiles = register_tiles(t, rows, n)
            assert all(R * NB + NB + 2 <= regs and R <= rows for R, NB in tiles)
            _, R, NB = choose_gemm_tile(t, rows, n)
            assert (R, NB) in tiles
    assert choose_gemm_tile(Target.parse("llvm -mattr=-avx512f"), 128, 256) == (8, 6, 2)
    assert choose_gemm_tile(Target.parse("llvm -mcpu=skylake-avx512"), 128, 256) == (16, 8, 3)


def test_kernel_prints_schedule_and_knobs():
    model, _ = matmul_const((13, 40), (40, 20))
    _, lowered = lower(model, {"register_tile": [4, 1]})
    text = str(lowered.kernels[0])
    line = next(ln.strip() for ln in text.splitlines() if "# schedule" in ln)
    assert line.startswith("# schedule llvm.matmul_blocked {")
    assert "register_tile=4x1" in line and "schedule=matmul_blocked" in line
    assert "register tile 4 rows x 1x8 columns" in text


def test_row_group_default_follows_the_l2_cache():
    """``row_group`` (row units per group; the panel loop inside a group) is 1 while the packed B
    fits half of L2 and otherwise the most row units whose rows of A fit a quarter of it: a
    transformer MLP's [768, 3072] weight (9.4 MB) against a 1 MB L2 groups 8 units of 8 rows
    (8 x 8 x 768 x 4 bytes = 192 KB <= 256 KB)."""
    from types import SimpleNamespace

    from tensorfuse.codegen.llvm.schedules.matmul import row_group
    l2 = SimpleNamespace(l2_bytes=1 << 20)
    assert row_group(l2, 16, 8, 40, 20) == 1
    assert row_group(l2, 16, 8, 768, 3072) == 8
    assert row_group(l2, 24, 8, 768, 3072) == 8
    assert row_group(l2, 7, 8, 3072, 768) == 1          # 96 KB a unit: 2 fit, 7 has no divisor 2
    assert row_group(SimpleNamespace(l2_bytes=8 << 20), 16, 8, 768, 768) == 1   # B 2.4 MB fits


@pytest.mark.parametrize("extra", [{"sweep_rows": 1, "k_block": 40}, {"sweep_rows": 2, "k_block": 32}])
def test_blocked_row_groups_match_onnxruntime(extra):
    """Every ``row_group`` candidate (tasks walk groups of row units, then panels, then the
    group's units) over 5 row units x 3 panels plus left-over rows, alone and with two-block
    sweeps over K slices: onnxruntime's numbers."""
    model, feeds = matmul_const((63, 40), (40, 40))
    expected = ort_run(model, feeds)[0]
    _, default = lower(model, {"register_tile": (6, 2), **extra})
    (wl,) = default.workloads.values()
    cands = next(k.candidates for k in wl.space if k.name == "row_group")
    assert len(cands) > 1, wl.space
    for rg in cands:
        graph, low = lower(model, {"register_tile": (6, 2), "row_group": rg, **extra})
        (w2,) = low.workloads.values()
        assert w2.knobs["row_group"] == rg
        got = build_module(low, graph, ["a"], ["y"], TARGET).run(**feeds)[0]
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=f"row_group={rg} {extra}")


@pytest.mark.parametrize("extra", [{}, {"sweep_rows": 2}])
def test_int8_panel_major_matches_onnxruntime(extra):
    """``panel_major`` (tasks walk the row blocks inside a part of B's panels) against the
    row-block-major order, on a constant u8 x s8 B in 4 parts over 9 row blocks plus left-over
    rows: onnxruntime's int32 results exactly."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 255, (37, 40), dtype=np.uint8)
    b = rng.integers(-128, 127, (40, 70), dtype=np.int8)
    model = node_model("MatMulInteger", {"a": a}, initializers={"b": b, "za": np.array(7, np.uint8)},
                       input_names=["a", "b", "za"])
    expected = ort_run(model, {"a": a})[0]
    for pm in (False, True):
        knobs = {"int8_tile": (2, 1), "col_split": 4, "panel_major": pm, **extra}
        graph, low = lower(model, knobs)
        (wl,) = low.workloads.values()
        assert wl.knobs["panel_major"] == pm and wl.knobs["col_split"] == 4, wl.knobs
        got = build_module(low, graph, ["a"], ["y"], TARGET).run(a=a)[0]
        np.testing.assert_array_equal(got, expected, err_msg=f"{knobs}")


@pytest.mark.parametrize("sweep", [10, 5])
def test_blocked_looped_sweep_matches_onnxruntime(sweep):
    """Sweeps of more than ``UNROLL_SWEEP`` row blocks run as a loop that moves each block's
    accumulators into a register buffer per K slice: 63 rows = 10 blocks of 6 + 3. With all 10
    blocks in one task (one row unit) the 3 left-over rows join the task's slices; with 5, two
    units and the left-over rows run as their own loop. K 40 = 32 + 8 (a last, shorter slice)."""
    from tensorfuse.codegen.llvm.schedules.matmul import UNROLL_SWEEP
    assert sweep > UNROLL_SWEEP
    model, feeds = matmul_const((63, 40), (40, 40))
    graph, low = lower(model, {"register_tile": (6, 2), "sweep_rows": sweep, "k_block": 32})
    (wl,) = low.workloads.values()
    assert (wl.knobs["sweep_rows"], wl.knobs["k_block"]) == (sweep, 32)
    text = str(low.kernels[0])
    assert "regs" in text and "for g" in text, text
    got = build_module(low, graph, ["a"], ["y"], TARGET).run(**feeds)[0]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_sweep_default_follows_the_caches():
    """One task sweeps the most row blocks whose accumulators fit an eighth of L2, over slices
    of K whose panel slice fits half of L1; K is not sliced when a whole panel fits there
    (48 KiB L1, 2 MiB L2; 8 x 48 tiles of AVX-512, 8 x 24 of AVX2)."""
    from types import SimpleNamespace

    from tensorfuse.codegen.llvm.schedules.matmul import sweep_default
    t = SimpleNamespace(l1d_bytes=48 << 10, l2_bytes=2 << 20)
    assert sweep_default(t, 16, 8, 48, 768) == (16, 128)         # 128 x 48 x 4 = 24 KiB slices
    assert sweep_default(t, 16, 8, 48, 3072) == (16, 128)
    assert sweep_default(t, 16, 8, 24, 3072) == (16, 256)
    assert sweep_default(t, 24, 8, 48, 100) == (24, 100)         # 100 x 48 x 4: one slice
    assert sweep_default(t, 187, 8, 48, 1536) == (17, 128)       # 187 = 11 x 17; 64 blocks at most
    assert sweep_default(SimpleNamespace(l1d_bytes=48 << 10, l2_bytes=64 << 10), 16, 8, 48, 768) == (4, 128)
    assert sweep_default(t, 0, 8, 48, 3072) == (1, 3072)
    # a narrow B: 2 panels, so 4 row units of 4 blocks keep 8 tasks; 1 panel of 3 blocks can
    # give 3 tasks at most: one block per task
    assert sweep_default(t, 16, 8, 48, 768, nblk=2) == (4, 128)
    assert sweep_default(t, 3, 8, 48, 768, nblk=1) == (1, 128)


def test_prefetch_knob_emits_llvm_prefetch():
    """``prefetch`` 1 (the default) puts a Prefetch of the next panel's lines (locality 2: L2)
    in the reduction step; it reaches LLVM as llvm.prefetch; 0 has none. (Every knob
    candidate's numbers are checked against onnxruntime above.)"""
    from llvmlite import ir

    from tensorfuse.codegen.llvm.emit import emit_kernel
    model, _ = matmul_const((13, 40), (40, 20))
    _, low = lower(model, {"prefetch": 1})
    text = str(low.kernels[0])
    assert "prefetch matmul_0_bpanel" in text and "(locality 2)" in text, text
    m = ir.Module()
    emit_kernel(m, low.kernels[0])
    assert "call void @\"llvm.prefetch.p0\"" in str(m) or "@llvm.prefetch.p0(" in str(m), str(m)
    _, low0 = lower(model, {"prefetch": 0})
    assert "prefetch matmul" not in str(low0.kernels[0])
