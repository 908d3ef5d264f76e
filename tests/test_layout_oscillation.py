"""The layout pass ends, and its pushes never add Transposes (issue 21, "The layout pass
oscillates").

A graph input that feeds a Conv (+BN+Relu) and also the Add after it (a residual straight from
the input, then Relu) made the Transpose push ping-pong: the Transpose after the Conv pushed
below the Add (the input's own NHWC Transpose reused for the residual), then the input's
Transpose pushed below the Add back, each a tie in bytes and number, until ``MAX_ROUNDS`` (10000):
a 10-node model took over a minute at O2 for cuda, inserted 20,004 Transposes and left 4 and an
unfused Add+Relu. Now a push is kept only when it strictly lowers the cost of
``compiler/passes/layout.py``'s ``_Layout.cost`` (bytes, number, then depth: ties only move
Transposes down), so no state repeats.

The checks, on that graph and on 20 seeded random graphs of Conv / BatchNormalization / Relu /
Add (residuals, many straight from the graph input) / Concat, optimised for target "cuda"
(``optimize(..., target="cuda")``: the graph passes, the layout pass included; no GPU needed):

- the pass ends after a bounded number of pushes (each round makes at least one): at most two
  per op of the graph it is given (the ping-pong made 10000);
- it leaves no more Transposes, and no more Transpose bytes, than the conversion alone put in
  (the same pipeline with the push step switched off);
- the optimised graph, evaluated with the registry's numpy references, matches onnxruntime
  (optimisations off; float32 with rtol 1e-4, atol 1e-4: sums over at most 12 x 9 products,
  BatchNormalization folded into the Conv weights at O2);
- the issue's graph and two random ones compiled on the llvm target with the pass forced
  (``optimize(..., layout="NHWC")``, the NHWC kernels on the CPU) match onnxruntime.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import tensorfuse
from oracle import ort_run
from test_layout import _model, _rand, _run_graph, _vi

RTOL, ATOL = 1e-4, 1e-4
C, HW = 4, 5


def _bn(rng, name, x, y, c, inits):
    p = [_rand(rng, c), _rand(rng, c), _rand(rng, c), rng.uniform(0.5, 2, c).astype(np.float32)]
    inits += [(f"{name}_{k}", a) for k, a in zip("sbmv", p)]
    return helper.make_node("BatchNormalization", [x] + [f"{name}_{k}" for k in "sbmv"], [y], name=name)


def _conv(rng, name, x, y, c, m, k, inits):
    inits += [(f"{name}_w", _rand(rng, m, c, k, k) * 0.5), (f"{name}_b", _rand(rng, m) * 0.1)]
    return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], pads=[k // 2] * 4, name=name)


def issue_graph(seed=0):
    """The issue's 10-node model: x -> Conv -> BN -> Relu -> Add(., x) -> Relu -> Conv -> BN ->
    Relu -> Add(., that Relu's input) -> Relu."""
    rng = np.random.default_rng(seed)
    inits: list = []
    nodes = [_conv(rng, "c1", "x", "a1", C, C, 3, inits), _bn(rng, "bn1", "a1", "b1", C, inits),
             helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
             helper.make_node("Add", ["r1", "x"], ["s1"], name="add1"),
             helper.make_node("Relu", ["s1"], ["r2"], name="relu2"),
             _conv(rng, "c2", "r2", "a2", C, C, 3, inits), _bn(rng, "bn2", "a2", "b2", C, inits),
             helper.make_node("Relu", ["b2"], ["r3"], name="relu3"),
             helper.make_node("Add", ["r3", "r2"], ["s2"], name="add2"),
             helper.make_node("Relu", ["s2"], ["y"], name="relu4")]
    model = _model(nodes, [_vi("x", [1, C, HW, HW])], [_vi("y", None)], inits)
    return model, {"x": _rand(rng, 1, C, HW, HW)}


def residual_graph(seed):
    """A random small residual CNN (seeded): 5 to 12 ops among Conv (1x1 or 3x3, C output
    channels), BatchNormalization, Relu, Add of two values of one shape (half the time the
    graph input x is one of them) and Concat on channels; the last value is the output, and
    now and then a middle value is a second one. Shapes [1, c, 5, 5], c <= 3C."""
    rng = np.random.default_rng(seed)
    inits: list = []
    nodes: list = []
    chans = {"x": C}                    # value -> channels
    last = "x"
    for i in range(int(rng.integers(5, 13))):
        kind = str(rng.choice(["conv", "conv", "bn", "relu", "add", "add", "concat"]))
        y = f"v{i}"
        same = [v for v in chans if chans[v] == chans[last] and v != last]
        if kind == "add" and same:
            other = "x" if "x" in same and rng.random() < 0.5 else str(rng.choice(same))
            ab = [last, other] if rng.random() < 0.5 else [other, last]
            nodes.append(helper.make_node("Add", ab, [y], name=f"add{i}"))
            chans[y] = chans[last]
        elif kind == "concat" and chans[last] <= 2 * C:
            other = str(rng.choice([v for v in chans if chans[v] <= C]))
            nodes.append(helper.make_node("Concat", [last, other], [y], axis=1, name=f"cat{i}"))
            chans[y] = chans[last] + chans[other]
        elif kind == "bn":
            nodes.append(_bn(rng, f"bn{i}", last, y, chans[last], inits))
            chans[y] = chans[last]
        elif kind == "relu":
            nodes.append(helper.make_node("Relu", [last], [y], name=f"relu{i}"))
            chans[y] = chans[last]
        else:
            src = last if rng.random() < 0.8 else str(rng.choice(list(chans)))
            nodes.append(_conv(rng, f"conv{i}", src, y, chans[src], C, int(rng.choice([1, 3])), inits))
            chans[y] = C
        last = y
    outs = [last]
    mids = [n.output[0] for n in nodes[:-1]]
    if mids and rng.random() < 0.3:
        outs.append(str(rng.choice(mids)))
    model = _model(nodes, [_vi("x", [1, C, HW, HW])], [_vi(o, None) for o in outs], inits)
    return model, {"x": _rand(rng, 1, C, HW, HW)}


def _optimize(model, level, pushes=True, monkeypatch=None):
    """(graph, LayoutReport, ops before the layout pass) of ``model`` optimised for cuda."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.passes import layout
    from tensorfuse.compiler.pipeline import optimize
    seen = []
    orig = layout.layout_transform

    def spy(graph, *a, **kw):
        seen.append(len(graph.nodes))
        return orig(graph, *a, **kw)
    monkeypatch.setattr(layout, "layout_transform", spy)
    if not pushes:
        monkeypatch.setattr(layout._Layout, "push_all", lambda self: False)
    g = import_onnx(model)
    r = optimize(g, level, target="cuda")
    monkeypatch.undo()
    (ops,) = seen
    return g, r.layout_report, ops


def _check_pass(model, feeds, level, monkeypatch):
    g, rep, ops = _optimize(model, level, monkeypatch=monkeypatch)
    _, rep0, _ = _optimize(model, level, pushes=False, monkeypatch=monkeypatch)
    pushed = rep.counts().get("pushed", 0)
    assert pushed <= 2 * ops, f"{pushed} pushes on a graph of {ops} ops\n{rep}"
    assert rep.count <= rep0.count and rep.bytes <= rep0.bytes, \
        f"pushes left more Transposes than the conversion alone:\n{rep}\nwithout pushes:\n{rep0}"
    got = _run_graph(g, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    return g, rep, rep0


@pytest.mark.parametrize("level", [1, 2])
def test_residual_from_the_graph_input_does_not_oscillate(level, monkeypatch):
    model, feeds = issue_graph()
    g, rep, rep0 = _check_pass(model, feeds, level, monkeypatch)
    # one Transpose into NHWC at the input, one out at the output: everything between is NHWC
    assert rep0.count == 4 and rep.count == 2, str(rep)
    assert [t.where.split(" %")[0] for t in rep.transposes] == ["graph input", "Relu relu4_t"], str(rep)
    if level == 2:     # and the Add+Relu tails join their convs' kernels
        assert [n.op for n in g.nodes] == ["Transpose", "FusedFunction", "FusedFunction", "Transpose"]


@pytest.mark.parametrize("seed", range(20))
def test_random_residual_graphs_end_without_adding_transposes(seed, monkeypatch):
    model, feeds = residual_graph(seed)
    for level in (1, 2):
        _check_pass(model, feeds, level, monkeypatch)


@pytest.mark.parametrize("case", ["issue", 3, 11])
def test_residual_graphs_nhwc_on_llvm_match_onnxruntime(case):
    """End to end: compiled on llvm with the layout pass forced, run on the CPU."""
    model, feeds = issue_graph() if case == "issue" else residual_graph(case)
    want = ort_run(model, feeds)
    from tensorfuse.compiler import pipeline
    orig = pipeline.optimize

    def optimize(graph, *a, **kw):
        kw.setdefault("layout", "NHWC")
        return orig(graph, *a, **kw)
    mp = pytest.MonkeyPatch()
    mp.setattr(pipeline, "optimize", optimize)
    try:
        mod = tensorfuse.compile(model, target="llvm", opt_level=2, cache=False)
    finally:
        mp.undo()
    rep = mod.layout_report
    assert rep.converted.get("FusedConvNHWC", 0) >= 1, str(rep)
    if case == "issue":
        assert rep.count == 2, str(rep)
    got = mod.run(**feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
