"""The tuner's Ray executor (compiler/tuner/executors.py) on a local Ray instance started here:
candidates measured in Ray tasks that need the resource ``tensorfuse_measure`` (one per node),
records appended by the driver with the node that measured them, and the model compiled with
them matching onnxruntime. Needs the extra ``ray`` (``pip install "tensorfuse[ray]"``; the
Makefile installs it, so CI runs this)."""
from __future__ import annotations

import onnx
import pytest
from onnx import helper

import tensorfuse
from tensorfuse.compiler.tuning import read_records, record_stage
from test_tune import _vi, assert_tuned_matches_ort, plugin  # noqa: F401 - the fixture

ray = pytest.importorskip("ray", reason="the ray executor needs the extra: pip install 'tensorfuse[ray]'")


@pytest.mark.heavy
def test_tune_through_a_local_ray_instance(tmp_path, plugin, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    g = helper.make_graph([helper.make_node("MatMul", ["c", "d"], ["y"])], "mm",
                          [_vi("c", [4, 16]), _vi("d", [16, 6])], [_vi("y", [4, 6])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "mm.onnx")
    onnx.save(model, path)
    rec = str(tmp_path / "ray.jsonl")
    ray.init(num_cpus=2, include_dashboard=False, resources={"tensorfuse_measure": 1}, log_to_driver=False)
    try:
        res = tensorfuse.tune(path, rec, trials=3, num_threads=1, executor="ray", repeat=5, progress=False,
                             min_gain=-0.5)   # confirmations always pass: a tuned knob to check
    finally:
        ray.shutdown()
    assert res.executor == "ray" and (res.measured, res.failed) == (3, 0)
    records = read_records(rec)
    # the search's records, then the confirmation stage's (measured faster than the default by
    # at least min_gain, which on a busy machine may happen to any of the equal variants)
    search = [r for r in records if record_stage(r) == "search"]
    confirm = [r for r in records if record_stage(r) == "confirm"]
    assert sorted(r.knobs["variant"] for r in search) == [0, 1, 2]
    assert search[0].knobs == {"variant": 0}            # the default first
    for r in search:
        assert r.status == "ok" and r.median_ms > 0 and r.schedule == "llvm.test_variants"
        assert r.extra.get("node"), "a record names the node that measured it"
        assert r.default_ms == search[0].median_ms
    for r in confirm:       # measured on a node, or the unmeasured "default kept" record (runs 0)
        assert r.status == "ok" and r.knobs["variant"] in (0, 1, 2)
        assert r.runs == 0 or r.extra.get("node")
    assert_tuned_matches_ort(model, path, rec)
