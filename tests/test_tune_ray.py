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
from tensorfuse.compiler.tuning import read_records
from test_tune import _vi, assert_tuned_matches_ort, plugin  # noqa: F401 - the fixture

ray = pytest.importorskip("ray", reason="the ray executor needs the extra: pip install 'tensorfuse[ray]'")


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
        res = tensorfuse.tune(path, rec, trials=3, num_threads=1, executor="ray", repeat=5, progress=False)
    finally:
        ray.shutdown()
    assert res.executor == "ray" and (res.measured, res.failed) == (3, 0)
    records = read_records(rec)
    assert sorted(r.knobs["variant"] for r in records) == [0, 1, 2]
    assert records[0].knobs == {"variant": 0}           # the default first
    for r in records:
        assert r.status == "ok" and r.median_ms > 0 and r.schedule == "llvm.test_variants"
        assert r.extra.get("node"), "a record names the node that measured it"
        assert r.default_ms == records[0].median_ms
    assert_tuned_matches_ort(model, path, rec)
