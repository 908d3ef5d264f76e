"""The tuner (compiler/tuner, ``tensorfuse.tune``, ``tensorfuse tune``): records written as
candidates are measured, failed candidates (an exception, a crash, a hang, wrong values) recorded
with their status while tuning goes on, a second run measuring nothing new, the tuned model
compiled with the records matching onnxruntime, an interrupted run resuming; the search (exhaustive, random and evolutionary,
define-by-run spaces, no repeats) and the workload extraction keeping workload keys.

Candidates fail on purpose through the test-only schedules of tests/tune_plugin.py, which the
tuner and its worker processes load from ``$TENSORFUSE_TUNE_PLUGINS``. Small workloads, a few
trials each, no timed assertions."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from oracle import assert_outputs_depend_on_inputs, ort_run
from tensorfuse.compiler.tuner import PLUGINS_ENV
from tensorfuse.compiler.tuner.plugins import load_plugins
from tensorfuse.compiler.tuner.search import Search, canonical
from tensorfuse.compiler.tuning import read_records

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tune_plugin.py")
#: seconds per candidate: the "hang" candidate costs this much; the others take well under a second
TIMEOUT = 6.0


@pytest.fixture
def plugin(monkeypatch):
    """tests/tune_plugin.py installed in this process and named for the tuner's workers."""
    mod = load_plugins([PLUGIN])[0]
    mod.install()
    monkeypatch.setenv(PLUGINS_ENV, PLUGIN)
    yield mod
    mod.uninstall()


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def two_matmuls() -> onnx.ModelProto:
    """y1 = a[3,37] @ b[37,5] (the plugin's faulty schedule), y2 = c[4,16] @ d[16,6] (its three
    equal variants): two workloads."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y1"]), helper.make_node("MatMul", ["c", "d"], ["y2"])]
    g = helper.make_graph(nodes, "two_matmuls", [_vi("a", [3, 37]), _vi("b", [37, 5]), _vi("c", [4, 16]),
                                                 _vi("d", [16, 6])], [_vi("y1", [3, 5]), _vi("y2", [4, 6])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model, seed):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def assert_tuned_matches_ort(model, path, records):
    """The model compiled with the records matches onnxruntime on two inputs whose outputs
    differ (and used the records)."""
    m = tensorfuse.compile(path, tuning=records, cache=False, num_threads=1)     # the count tuned at
    assert m.report.tuned, "no workload took its knobs from the records"
    a, b = _feeds(model, 1), _feeds(model, 2)
    want_a, want_b = ort_run(model, a), ort_run(model, b)
    assert_outputs_depend_on_inputs(want_a, want_b, 1e-5, 1e-5)
    for feeds, want in ((a, want_a), (b, want_b)):
        for got, w in zip(m.run(**feeds), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    return m


def test_tune_records_failures_resume_and_tuned_compile(tmp_path, plugin, capsys):
    model = two_matmuls()
    path = str(tmp_path / "two_matmuls.onnx")
    onnx.save(model, path)
    rec = str(tmp_path / "records.jsonl")
    # min_gain 0.99: no candidate qualifies for confirmation (the tuner writes one unmeasured
    # confirm record of the default knobs per workload saying so); the search is what is tested here
    res = tensorfuse.tune(path, rec, trials=5, num_threads=1, timeout=TIMEOUT, repeat=5, progress=False, check_model=False,
                          min_gain=0.99)
    everything = read_records(rec)
    markers = [r for r in everything if r.extra.get("stage") == "confirm"]
    assert len(markers) == 2 and all(r.runs == 0 and r.extra["vs_default"] == 1.0 and r.extra["min_gain"] == 0.99
                                     for r in markers)
    records = [r for r in everything if r.extra.get("stage") != "confirm"]
    assert all(r.extra["stage"] == "search" for r in records)
    by_wl: dict[str, list] = {}
    for r in records:
        by_wl.setdefault(r.summary, []).append(r)
    faulty = by_wl.pop("MatMul [3,37] [37,5] -> [3,5]")
    variants = by_wl.pop("MatMul [4,16] [16,6] -> [4,6]")
    assert not by_wl
    # every fault value tried once (a space of 5 <= 5 trials: exhaustive), each failure recorded
    # with its status and the tuner going on past it (the crash and the hang killed the worker)
    assert {r.knobs["fault"]: r.status for r in faulty} == {
        "none": "ok", "raise": "error", "exit": "crash", "wrong": "wrong", "hang": "timeout"}
    assert len(faulty) == 5
    why = {r.knobs["fault"]: r.error for r in faulty}
    assert "injected failure" in why["raise"]
    assert "exited with code 3" in why["exit"]
    assert f"no answer after {TIMEOUT:.0f} s" in why["hang"]
    assert "max abs difference" in why["wrong"]
    assert [r.knobs["fault"] for r in faulty][0] == "none", "the default knobs are measured first"
    assert sorted(r.knobs["variant"] for r in variants) == [0, 1, 2]
    assert all(r.status == "ok" and r.median_ms > 0 and r.spread_ms >= 0 and r.runs >= 5 for r in variants)
    # the default timed alone; the others taking turns with it: their ratio to it
    assert variants[0].extra["vs_default"] == 1.0 and "default_window_ms" not in variants[0].extra
    for r in variants[1:]:
        assert r.extra["vs_default"] > 0 and r.extra["default_window_ms"] > 0
    from tensorfuse.ir.target import Target
    from tensorfuse.ir.knobs import target_identity
    ident = target_identity(Target.parse("llvm"))
    for r in records:
        assert r.threads == 1 and r.target == ident and r.version == tensorfuse.__version__
        assert r.default_ms == faulty[0].median_ms if r in faulty else r.default_ms == variants[0].median_ms
    assert (res.measured, res.failed, res.confirmed) == (8, 4, 0)
    best = min(variants, key=lambda r: r.extra["vs_default"])
    wl = next(w for w in res.workloads if w.summary.startswith("MatMul [4,16]"))
    # nothing confirmed: the default knobs are kept
    assert wl.best_knobs == {"variant": 0} and wl.status.startswith("default kept: no candidate confirmed")
    assert wl.known == 3 and wl.default_ms == variants[0].median_ms

    # a second run (the command line) measures nothing: every candidate is in the file
    before = open(rec).read()
    from tensorfuse.compiler.cli import main
    assert main(["tune", path, "-o", rec, "--trials", "5", "--threads", "1", "--timeout", str(TIMEOUT),
                 "--min-gain", "0.99", "-q"]) == 0
    out = capsys.readouterr().out
    assert "0 candidates measured" in out and f"--tuning {rec}" in out
    assert open(rec).read() == before

    # an interrupted run (its last search record never written) resumes: only that candidate is
    # measured again, the default's time comes from the file
    lines = before.splitlines(keepends=True)
    i_lost = max(i for i, ln in enumerate(lines) if json.loads(ln)["stage"] == "search"
                 and json.loads(ln)["knobs"].get("variant", 0) != 0)
    lost = json.loads(lines[i_lost])
    with open(rec, "w") as f:
        f.writelines(lines[:i_lost] + lines[i_lost + 1:])
    again = tensorfuse.tune(path, rec, trials=5, num_threads=1, timeout=TIMEOUT, repeat=5, progress=False, check_model=False,
                            min_gain=0.99)
    assert (again.measured, again.failed, again.confirmed) == (1, 0, 0)
    last = read_records(rec)[-1]
    assert last.knobs == lost["knobs"] and last.status == "ok" and last.default_ms == variants[0].median_ms
    records = [r for r in read_records(rec) if r.extra["stage"] == "search"]
    assert len(records) == 8 and len({(r.workload, canonical(r.knobs)) for r in records}) == 8
    variants = [r for r in records if r.summary == "MatMul [4,16] [16,6] -> [4,6]"]
    best = min(variants, key=lambda r: r.extra["vs_default"])    # what TuningRecords picks

    # the file's confirm records keep both workloads at their default knobs
    from tensorfuse.compiler.tuning import NOT_CONFIRMED, TuningRecords
    tr = TuningRecords(rec)
    assert all(tr.knobs_for(r.workload) is None for r in records) and len(tr.defaulted) == 2
    assert all(why.startswith(NOT_CONFIRMED) for why in tr.defaulted.values())
    # the search records alone (provisional, as before confirmations existed) compile into the
    # model: the fastest variant's knobs, the same numbers
    m = assert_tuned_matches_ort(model, path, records)
    tuned = {t["summary"]: t["knobs"] for t in m.report.tuned}
    assert tuned["MatMul [4,16] [16,6] -> [4,6]"] == best.knobs
    assert tuned["MatMul [3,37] [37,5] -> [3,5]"] == {"fault": "none"}


def test_tune_bad_arguments(tmp_path):
    from tensorfuse.compiler.cli import main
    model = str(tmp_path / "none.onnx")
    with pytest.raises(ValueError, match="trials must be an integer >= 1"):
        tensorfuse.tune(model, str(tmp_path / "r.jsonl"), trials=0)
    with pytest.raises(ValueError, match="executor must be 'local' or 'ray'"):
        tensorfuse.tune(model, str(tmp_path / "r.jsonl"), executor="slurm")
    with pytest.raises(ValueError, match="time_budget must be"):
        tensorfuse.tune(model, str(tmp_path / "r.jsonl"), time_budget=-1)
    with pytest.raises(ValueError, match=r"min_gain must be a number in \(-1, 1\)"):
        tensorfuse.tune(model, str(tmp_path / "r.jsonl"), min_gain=1.0)
    onnx.save(two_matmuls(), model)
    assert main(["tune", model, "-o", str(tmp_path / "r.jsonl"), "--ray-address", "h:1", "-q"]) == 2
    assert main(["tune", model, "-o", str(tmp_path / "no" / "r.jsonl"), "-q"]) == 2


# ----------------------------------------------------------------------------- the search
def _space(**knobs):
    return [{"name": k, "candidates": list(v), "default": v[0]} for k, v in knobs.items()]


def test_search_exhaustive_small_space_default_first():
    s = Search(_space(a=[2, 1, 3], b=["x", "y"]), trials=6, seed=0, key="w")
    got = []
    while not s.done():
        props = s.propose(1)
        if not props:
            break
        got += props
        s.tell(props[0], "ok", 1.0 + len(got))
    assert got[0] == {"a": 2, "b": "x"}
    assert len(got) == 6 and len({canonical(g) for g in got}) == 6
    assert s.propose(1) == [] and s.exhausted


def test_search_large_space_random_then_mutations_seeded_no_repeats():
    space = _space(p=list(range(1, 13)), q=list(range(1, 9)), r=[True, False])     # 192 points

    def run(seed):
        s = Search(space, trials=40, seed=seed, key="w")
        s.tell({"p": 1, "q": 1, "r": True}, "ok", 10.0)
        out = []
        while not s.done():
            (c,) = s.propose(1)
            out.append(c)
            # a cost with its optimum at p=7, q=3: mutations should find their way there
            s.tell(c, "ok", 1.0 + abs(c["p"] - 7) + abs(c["q"] - 3) + (0.5 if c["r"] else 0.0))
        return s, out

    s1, a = run(0)
    _s2, b = run(0)
    _s3, c = run(1)
    assert a == b and a != c                                # seeded
    assert len({canonical(x) for x in a}) == len(a) == 39   # never proposed twice
    best = s1.best(1)[0]
    assert abs(best["p"] - 7) + abs(best["q"] - 3) <= 2     # the evolutionary step got close


def test_search_learns_knobs_revealed_by_another_schedule():
    s = Search(_space(schedule=["rows", "flat"], tile=[4, 8]), trials=10, seed=0, key="w")
    assert s.size == 4
    assert s.add_space(_space(chunk=[1, 2, 3]))             # the "flat" schedule's own knob
    assert not s.add_space(_space(tile=[4, 8]))
    assert s.size == 12
    s.tell({"schedule": "flat", "chunk": 1}, "ok", 1.0)
    assert s.known({"chunk": 1, "schedule": "flat"})
    props = s.propose(12)
    assert all(canonical(p) != canonical({"schedule": "flat", "chunk": 1}) for p in props)


# ----------------------------------------------------------------------------- workloads
def test_workloads_keep_keys_weights_and_run_alone(tmp_path):
    """A Conv+Relu residual model: each workload's extracted one-node graph has the workload's
    key (model_tasks asserts it), the weights sum to the shares, and a workload compiled alone
    computes what onnxruntime computes for that node."""
    from tensorfuse.compiler.tuner.worker import build_candidate, make_inputs
    from tensorfuse.compiler.tuner.workloads import model_tasks
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "res", [_vi("x", [1, 8, 10, 10])], [_vi("y", [1, 8, 10, 10])], [w1, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    tasks, info = model_tasks(model, "llvm")
    assert info["weights_from"] == "profile" and len(tasks) >= 2
    assert abs(sum(t.share for t in tasks) - 1.0) < 1e-9
    assert [t.weight_ms for t in tasks] == sorted((t.weight_ms for t in tasks), reverse=True)
    first = next(t for t in tasks if t.graph.nodes[0].inputs[0].name.startswith("x"))
    assert first.graph.constants, "the weights stay constants"
    mod, wl = build_candidate(first.graph, "llvm", {}, 1)
    assert wl.key == first.key
    xs = make_inputs(first.graph, 0)
    got = mod.run(*xs)
    # the first Conv (+ Relu fused) alone, by onnxruntime
    sub = helper.make_graph(nodes[:2], "first", [_vi("x", [1, 8, 10, 10])], [_vi("r1", [1, 8, 10, 10])], [w1])
    want = ort_run(helper.make_model(sub, opset_imports=[helper.make_opsetid("", 17)]), {"x": xs[0]})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    json.dumps(first.space)     # the space is JSON


def one_matmul() -> onnx.ModelProto:
    """y = c[4,16] @ d[16,6]: the plugin's three equal variants, one workload."""
    g = helper.make_graph([helper.make_node("MatMul", ["c", "d"], ["y"])], "one_matmul",
                          [_vi("c", [4, 16]), _vi("d", [16, 6])], [_vi("y", [4, 6])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_tune_confirms_best_candidates_and_resume_confirms_only(tmp_path, plugin):
    """A search without confirmations (min_gain 0.99: nothing qualifies) rerun with min_gain -0.9
    (every ok candidate qualifies: deterministic on a loaded machine) measures only the missing
    confirmations, written with stage "confirm" and the min_gain; a third run measures nothing;
    the records choose a confirmed setting."""
    from tensorfuse.compiler.tuning import TuningRecords
    model = one_matmul()
    path = str(tmp_path / "one_matmul.onnx")
    onnx.save(model, path)
    rec = str(tmp_path / "records.jsonl")
    kw = dict(trials=3, num_threads=1, timeout=TIMEOUT, repeat=5, progress=False, check_model=False)
    first = tensorfuse.tune(path, rec, min_gain=0.99, **kw)
    assert (first.measured, first.confirmed) == (3, 0)
    searched = read_records(rec)
    assert [r.extra["stage"] for r in searched] == ["search"] * 3 + ["confirm"]     # the last: nothing to confirm
    assert searched[-1].knobs == {"variant": 0} and searched[-1].runs == 0

    # the candidates that qualify at min_gain -0.9: measured under 1.9x the default (on a busy
    # machine a search sample can be slower than that, so the count is read off the records)
    qual = [r for r in searched[:3] if r.knobs != {"variant": 0} and r.extra["vs_default"] < 1.9]
    assert qual, "both variants measured 1.9x slower than the equal default"
    again = tensorfuse.tune(path, rec, min_gain=-0.9, **kw)
    assert (again.measured, again.failed, again.confirmed) == (0, 0, len(qual))
    new = read_records(rec)[len(searched):]
    assert len(new) == len(qual) and all(r.extra["stage"] == "confirm" and r.extra["min_gain"] == -0.9 for r in new)
    assert sorted(r.knobs["variant"] for r in new) == sorted(r.knobs["variant"] for r in qual)
    assert all(r.status == "ok" and r.runs > 0 and r.extra["vs_default"] > 0 for r in new)
    key = new[0].workload
    chosen = TuningRecords(rec).knobs_for(key)
    want = min(new, key=lambda r: r.extra["vs_default"]).knobs
    assert chosen == want
    wl = again.workloads[0]
    assert wl.status == "tuned" and wl.best_knobs == want and wl.confirmed == len(qual)

    before = open(rec).read()
    third = tensorfuse.tune(path, rec, min_gain=-0.9, **kw)
    assert (third.measured, third.confirmed) == (0, 0) and open(rec).read() == before


def _rec(knobs, vs, stage=None, status="ok", min_gain=None, threads=1):
    from tensorfuse.compiler.tuning import Record
    r = Record.create("matmul-0123456789abcdef", knobs, status, target="llvm", median_ms=1.0 if status == "ok" else None,
                      default_ms=1.0, threads=threads)
    if status == "ok":
        r.extra["vs_default"] = vs
    if stage is not None:
        r.extra["stage"] = stage
    if min_gain is not None:
        r.extra["min_gain"] = min_gain
    return r


def test_tuning_records_take_only_confirmed_settings():
    """A search-only winner is used (provisional) until the workload has confirm records; then
    a setting's ratio is the worst of its confirmations and must be below 1 - min_gain."""
    from tensorfuse.compiler.tuning import NOT_CONFIRMED, TuningRecords
    key = "matmul-0123456789abcdef"
    search = [_rec({"t": 0}, 1.0), _rec({"t": 4}, 0.5), _rec({"t": 8}, 0.8, stage="search")]
    tr = TuningRecords(search)
    assert tr.knobs_for(key) == {"t": 4} and key in tr.provisional      # old records: as before
    tr = TuningRecords(search + [_rec({"t": 4}, 1.01, "confirm", min_gain=0.03)])
    assert tr.knobs_for(key) is None and tr.defaulted[key].startswith(NOT_CONFIRMED)
    assert len(tr) == 0 and key not in tr.best
    tr = TuningRecords(search + [_rec({"t": 4}, 0.9, "confirm", min_gain=0.03)])
    assert tr.knobs_for(key) == {"t": 4} and not tr.defaulted and key not in tr.provisional
    tr = TuningRecords(search + [_rec({"t": 4}, 0.9, "confirm", min_gain=0.03),
                                 _rec({"t": 4}, 0.99, "confirm", min_gain=0.03)])
    assert tr.knobs_for(key) is None                                     # worst 0.99 > 0.97
    # the confirmed setting with the lowest worst ratio; a failed confirmation disqualifies
    tr = TuningRecords(search + [_rec({"t": 4}, 0.9, "confirm"), _rec({"t": 8}, 0.85, "confirm"),
                                 _rec({"t": 8}, None, "confirm", status="crash")])
    assert tr.knobs_for(key) == {"t": 4}
    # the min_gain stored by the tuner decides: 0.9 is not enough for 0.2
    tr = TuningRecords(search + [_rec({"t": 4}, 0.9, "confirm", min_gain=0.2)])
    assert tr.knobs_for(key) is None and "needed < 0.800" in tr.defaulted[key]


# ----------------------------------------------------------------------------- cold caches
def test_weight_bytes_counts_each_constant_once_and_skips_gather_tables():
    """weight_bytes: the Conv's weight and bias, the MatMul's weight; a weight used twice once;
    not the table a Gather indexes (it reads rows)."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.tuner.workloads import weight_bytes
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (8, 4, 3, 3)), ("b", (8,)), ("m", (6, 6)), ("table", (100, 6)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("MatMul", ["c", "m"], ["y1"]),
             helper.make_node("MatMul", ["y1", "m"], ["y2"]),
             helper.make_node("Gather", ["table", "i"], ["e"])]
    g = helper.make_graph(nodes, "wb", [_vi("x", [1, 4, 8, 8]),
                                        helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                          [_vi("y2", [1, 8, 6, 6]), _vi("e", [3, 6])], inits)
    graph = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert weight_bytes(graph) == 4 * (8 * 4 * 3 * 3 + 8 + 6 * 6)
    # EmbedLayerNormalization's tables (its (table, ids) pairs) are indexed too: only the scale counts
    from tensorfuse.ir.builder import Builder
    from tensorfuse.ir.graph import Graph
    from tensorfuse.ir.types import TensorType
    eg = Graph()
    ids = eg.add_input("ids", TensorType.of(np.zeros((2, 3), np.int64)))
    b = Builder(eg)
    y = b.op("EmbedLayerNormalization", b.const(rng.standard_normal((100, 8)).astype(np.float32), "table"), ids,
             b.const(np.ones(8, np.float32), "scale"), domain="tensorfuse", num_gathers=1)
    eg.outputs = [y]
    assert weight_bytes(eg) == 4 * 8


def test_cache_flush_times_single_runs_and_evicts():
    """With flush_bytes every sample is one run (each after a flush); the flush writes its whole
    scratch buffer and reads every input; last_level_cache_bytes is the size the system gives."""
    from tensorfuse.compiler.tuner.worker import CacheFlush, build_candidate, make_inputs, time_module
    from tensorfuse.ir.target import last_level_cache_bytes
    from tensorfuse.compiler.tuner.workloads import extract_node
    from tensorfuse.compiler.frontend.onnx import import_onnx
    llc = last_level_cache_bytes()
    assert isinstance(llc, int) and llc >= 64 << 10
    graph = import_onnx(one_matmul())
    one = extract_node(graph.nodes[0], graph.opset)
    mod, _ = build_candidate(one, "llvm", {}, 1)
    xs = make_inputs(one, 0)
    warm, cold = time_module(mod, xs, repeat=7, max_measure_s=5.0), \
        time_module(mod, xs, repeat=7, max_measure_s=5.0, flush_bytes=1 << 20)
    assert cold["runs"] == len(cold["samples"]) == 7
    assert warm["runs"] > len(warm["samples"])       # a 4x16x6 MatMul: many runs per 2 ms sample
    f = CacheFlush(1 << 16, xs)
    before = f.scratch.copy()
    f()
    assert f.scratch.nbytes == 1 << 16 and np.array_equal(f.scratch, before + 1.0)
    assert sum(a.nbytes for a in f.inputs) == sum(x.nbytes for x in xs)


def test_tune_cache_flush_recorded_and_resume_keeps_modes_apart(tmp_path, plugin):
    """cache_flush=True: every ok record says the flush's bytes (twice the last-level cache) and
    the table says so; a run with cache_flush=False does not count those as measured; "auto" on a
    model of a few hundred bytes of weights does not flush; a bad value is a ValueError."""
    from tensorfuse.ir.target import last_level_cache_bytes
    model = one_matmul()
    path = str(tmp_path / "one_matmul.onnx")
    onnx.save(model, path)
    rec = str(tmp_path / "records.jsonl")
    kw = dict(trials=3, num_threads=1, timeout=TIMEOUT, repeat=5, progress=False, min_gain=0.99, check_model=False)
    cold = tensorfuse.tune(path, rec, cache_flush=True, **kw)
    assert cold.measured == 3 and cold.flush_bytes == 2 * last_level_cache_bytes()
    assert "timed with cold caches" in str(cold)
    ok = [r for r in read_records(rec) if r.status == "ok" and r.runs > 0]
    assert ok and all(r.extra["flush_bytes"] == cold.flush_bytes for r in ok)
    n = len(read_records(rec))
    warm = tensorfuse.tune(path, rec, cache_flush="auto", **kw)
    assert warm.measured == 3 and warm.flush_bytes == 0 and "timed with warm caches" in str(warm)
    assert all("flush_bytes" not in r.extra for r in read_records(rec)[n:])
    with pytest.raises(ValueError, match="cache_flush must be True, False or 'auto'"):
        tensorfuse.tune(path, rec, cache_flush="yes", **kw)


# ----------------------------------------------------------------------------- the model check
def test_model_check_rejects_a_setting_slower_in_the_model(tmp_path, plugin):
    """Records that claim the plugin's slow setting (slow=1: a chain of exps in the epilogue) is 2x faster, complete so the tuner measures nothing: the model check times the
    model with them against without, finds it slower, writes a "model" record rejecting the
    setting, and TuningRecords then keeps the default (reason MODEL_REJECTED); the same model
    and records with an honest claim for slow=0 ... are never slower. The check's verdict is a
    record too."""
    from tensorfuse.compiler.tuner.workloads import model_tasks
    from tensorfuse.compiler.tuning import MODEL_REJECTED, Record, TuningRecords, append_record
    g = helper.make_graph([helper.make_node("MatMul", ["c", "d"], ["y"])], "slow_matmul",
                          [_vi("c", [5, 16]), _vi("d", [16, 7])], [_vi("y", [5, 7])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "slow.onnx")
    onnx.save(model, path)
    (task,) = model_tasks(path, "llvm")[0]
    assert task.schedule == "llvm.test_slow" and task.size == 2
    rec = str(tmp_path / "records.jsonl")

    def claim(knobs, vs, stage):
        r = Record.create(task.key, knobs, "ok", target="llvm", summary=task.summary, schedule=task.schedule,
                          median_ms=0.01 * vs, runs=5, default_ms=0.01, threads=1)
        r.extra.update(vs_default=vs, stage=stage)
        if stage == "confirm":
            r.extra["min_gain"] = 0.03
        append_record(rec, r)
    claim({"slow": 0}, 1.0, "search")
    claim({"slow": 1}, 0.5, "search")       # a false claim: it is many times slower
    claim({"slow": 1}, 0.5, "confirm")
    assert TuningRecords(rec, threads=1).knobs_for(task.key) == {"slow": 1}
    res = tensorfuse.tune(path, rec, trials=2, num_threads=1, timeout=TIMEOUT, repeat=5, progress=False)
    assert res.measured == 0 and res.confirmed == 0
    mc = res.model_check
    assert mc.first_ratio > 2.0 and mc.rejected == [task.key] and mc.tuned == []
    assert "went back to their defaults" in str(mc) and str(mc) in str(res)
    recs = read_records(rec)
    veto = [r for r in recs if r.extra.get("stage") == "model" and r.workload == task.key]
    assert len(veto) == 1 and veto[0].knobs == {"slow": 1} and "as long with these knobs" in veto[0].extra["note"]
    verdict = recs[-1]
    assert verdict.workload == "model-check" and verdict.extra["rejected"] == [task.key]
    tr = TuningRecords(rec, threads=1)
    assert tr.knobs_for(task.key) is None and tr.defaulted[task.key].startswith(MODEL_REJECTED)
    m = tensorfuse.compile(path, tuning=rec, num_threads=1, cache=False)
    assert m.report.tuned == []
    # at another thread count the veto (and the claims) do not apply
    assert TuningRecords(rec, threads=2).knobs_for(task.key) is None and task.key not in TuningRecords(
        rec, threads=2).defaulted
