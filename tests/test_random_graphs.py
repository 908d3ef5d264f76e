"""Differential testing of random graphs in the default suite (issue 9).

A fixed-seed sample of ``tests/fuzz/random_graphs.py``: random valid ONNX graphs
(``fuzz.graphgen``, at most three op generators each, about 4 nodes) merged forty at a time into
one model (the graphs stay disjoint, so one compile checks forty; a compile's fixed cost is most
of a small graph's), compiled at O0, O2 and O3 in a child process, run twice (a decoy input
first) and compared with onnxruntime (``ORT_DISABLE_ALL``) within ``graphgen``'s bounds. No
mismatch, crash, hang, internal error or refusal may occur. ``make test`` checks the first 60
graphs (about 40 CPU-s, in the child processes); the other 60 of the 120 are marked heavy, so
``make test-heavy`` (.ci/run) checks them.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from fuzz import graphgen

SEED0 = 90_000
GRAPHS = 120
#: the first DEFAULT_GRAPHS seeds run in make test, the rest of the GRAPHS under the heavy marker
DEFAULT_GRAPHS = 60
BATCH = 40
MAX_NODES = 3
#: (first seed, last seed + 1) of the two halves of the sample: make test's, make test-heavy's
HALVES = {"light": (SEED0, SEED0 + DEFAULT_GRAPHS), "heavy": (SEED0 + DEFAULT_GRAPHS, SEED0 + GRAPHS)}


@functools.lru_cache(maxsize=None)
def _batches(half: str = "light"):
    return graphgen.batches(range(*HALVES[half]), BATCH, max_nodes=MAX_NODES)


@pytest.mark.parametrize("half,k", [pytest.param(h, k, marks=[pytest.mark.heavy] if h == "heavy" else [])
                                    for h in HALVES
                                    for k in range((HALVES[h][1] - HALVES[h][0]) // BATCH + len(graphgen.OPSETS))])
def test_random_graphs_match_onnxruntime(half, k):
    bs = _batches(half)
    if k >= len(bs):
        pytest.skip(f"batch {k}: the {half} half's graphs make {len(bs)} batches (grouped by opset)")
    part, case = bs[k]
    res = graphgen.check_case(case)
    bad = [o for o in res if o.kind != "ok"]
    assert not bad, (f"graphs {[c.seed for c in part]} (python tests/fuzz/random_graphs.py finds and shrinks "
                     f"each): " + "; ".join(f"O{o.level} {o.kind}: {o.detail}" for o in bad))


def test_generator_is_deterministic_and_covers_the_op_set():
    a, b = graphgen.generate(SEED0 + 3), graphgen.generate(SEED0 + 3)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert all(np.array_equal(a.feeds[k], b.feeds[k]) for k in a.feeds)
    ops = {n.op_type for h in HALVES for _p, c in _batches(h) for n in c.model.graph.node}
    for op in ("Conv", "ConvTranspose", "MatMul", "Gemm", "ReduceMean", "Transpose", "Reshape", "Concat",
               "Slice", "Gather", "Softmax", "BatchNormalization", "LayerNormalization", "Erf", "Pad",
               "MaxPool", "AveragePool", "Resize", "Where", "Expand"):
        assert op in ops, f"{op} not drawn in the sample"


def test_comparison_catches_a_wrong_value():
    """The check is not vacuous: one element off by 1e-2 is a mismatch, rounding noise is not."""
    e = np.linspace(-3, 3, 50, dtype=np.float32)
    assert graphgen.close(e + np.float32(1e-6), e)[0]
    g = e.copy()
    g[7] += 1e-2
    assert not graphgen.close(g, e)[0]
    assert not graphgen.close(e.reshape(5, 10), e.reshape(10, 5))[0]
    assert not graphgen.close(np.where(e > 0, np.nan, e), e)[0]


def test_shrinker_keeps_the_failure_and_drops_the_rest():
    """Shrinking against "has a Softmax" ends with a small graph that still has one."""
    for s in range(SEED0, SEED0 + 200):
        c = graphgen.generate(s)
        ops = [n.op_type for n in c.model.graph.node]
        if "Softmax" in ops and len(ops) >= 6:
            break
    else:
        pytest.fail("no graph with a Softmax among 200")
    m, _ = graphgen.shrink(c.model, c.feeds, lambda m, f: any(n.op_type == "Softmax" for n in m.graph.node))
    kept = [n.op_type for n in m.graph.node if n.op_type != "Constant"]
    assert kept == ["Softmax"], kept


def test_random_graphs_compile_for_avx512_without_aborting():
    """LLVM's instruction selection for AVX-512 has aborted the process (issue 9 defect 2,
    SIGABRT in a ConvTranspose kernel) on machines that have it; compiling for one (znver4) works
    on any machine, so this catches such aborts everywhere (compile only, O2, in a child process)."""
    cases = [graphgen.generate(s, max_nodes=1, ops=("conv", "convtranspose", "matmul", "gemm", "pool"))
             for s in range(SEED0, SEED0 + 30)]
    part = [c for c in cases if c.model.opset_import[0].version == 17]
    case = graphgen.merge_cases(part)
    (res,) = graphgen.check_case(case, levels=(2,), target="llvm -mcpu=znver4")
    assert res.kind == "ok", f"graphs {[c.seed for c in part]}: {res.kind}: {res.detail}"


def _shapes(model):
    import onnx
    m = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
           for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output)}
    out.update({t.name: tuple(t.dims) for t in m.graph.initializer})
    for n in m.graph.node:
        if n.op_type == "Constant":
            out[n.output[0]] = tuple(n.attribute[0].t.dims)
    return out


def test_generator_draws_empty_tensors():
    """Issue 24 item 6: zero-sized dims in graph inputs, an empty Concat input, a Slice to
    nothing, and Reshapes of empty tensors with and without allowzero are among the draws."""
    from onnx import numpy_helper
    seen = set()
    for s in range(200):
        c = graphgen.generate(600_000_000 + s, max_nodes=4)
        sh = _shapes(c.model)
        consts = {t.name: numpy_helper.to_array(t) for t in c.model.graph.initializer}
        if any(0 in sh[i.name] for i in c.model.graph.input):
            seen.add("empty input")
        for n in c.model.graph.node:
            if n.op_type == "Concat" and any(0 in sh[i] for i in n.input) and 0 not in sh[n.output[0]]:
                seen.add("concat of an empty part")
            if n.op_type == "Slice" and 0 in sh[n.output[0]] and 0 not in sh[n.input[0]]:
                seen.add("slice to nothing")
            if n.op_type == "Reshape" and 0 in sh[n.input[0]] and n.input[1] in consts:
                az = {a.name: a.i for a in n.attribute}.get("allowzero", 0)
                if 0 in consts[n.input[1]]:
                    seen.add(f"reshape of an empty tensor, allowzero={az}")
    assert seen == {"empty input", "concat of an empty part", "slice to nothing",
                    "reshape of an empty tensor, allowzero=0", "reshape of an empty tensor, allowzero=1"}, seen


def test_generator_draws_degenerate_convs():
    """Issue 24 item 0: convolutions on planes of width or height 1, smaller than a vector, one
    channel, batch above 1, in every schedule's shape (1x1, strided, 3x3, grouped, depthwise),
    with epilogue operands of every broadcastable shape and the conv's own input as residual."""
    seen, kinds = set(), set()
    for s in range(150):
        c = graphgen.generate(601_000_000 + s, max_nodes=1, ops=("conv_degenerate",))
        sh = _shapes(c.model)
        conv = next(n for n in c.model.graph.node if n.op_type == "Conv")
        (n, ch, h, w), y = sh[conv.input[0]], sh[conv.output[0]]
        k = sh[conv.input[1]][2:]
        a = {x.name: x for x in conv.attribute}
        group = a["group"].i if "group" in a else 1
        seen |= {f for f, ok in [("width 1", w == 1), ("height 1", h == 1), ("plane under 8", y[2] * y[3] < 8),
                                 ("one channel", ch == 1), ("batch > 1", n > 1), ("1x1", k == (1, 1)),
                                 ("3x3", k == (3, 3)), ("strided", "strides" in a and max(a["strides"].ints) > 1),
                                 ("grouped", 1 < group < ch), ("depthwise", group == ch > 1)] if ok}
        for e in c.model.graph.node:
            if e.op_type in ("Add", "Mul", "Sub") and conv.output[0] in e.input:
                other = [i for i in e.input if i != conv.output[0]][0]
                if other == conv.input[0]:
                    kinds.add("residual")
                else:
                    kinds |= {kd for kd in graphgen.EPILOGUE_SHAPES if graphgen._epilogue_shape(kd, y) == sh[other]}
    assert seen == {"width 1", "height 1", "plane under 8", "one channel", "batch > 1", "1x1", "3x3", "strided",
                    "grouped", "depthwise"}, seen
    assert kinds == set(graphgen.EPILOGUE_SHAPES) | {"residual"}, kinds


def test_classic_generator_draws_neither():
    """``zeros=False, degenerate=False`` (random_graphs.py --classic) keeps the earlier random
    stream: no zero-sized dim and no degenerate conv generator."""
    for s in range(40):
        c = graphgen.generate(602_000_000 + s, zeros=False, degenerate=False)
        assert "conv_degenerate" not in c.ops
        assert all(0 not in v for v in _shapes(c.model).values())
