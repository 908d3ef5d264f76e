"""Out-of-range indices read at run time raise a ValueError from Module.run (onnxruntime raises
too; ONNX calls them an error), instead of a silently clamped result."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
import tensorfuse
from conftest import shared_model_entries, shared_models_dir
from oracle import model_inputs, node_model, ort_run, rand


def _gather_module(op, attrs, data, ind, **extra):
    inputs = {"d": data, "i": ind, **extra}
    return tensorfuse.compile(node_model(op, inputs, attrs), cache=False), inputs


@pytest.mark.parametrize("op, attrs, data, ok, bad, match", [
    ("Gather", {"axis": 1}, rand(2, 4), np.array([[0, -4]], np.int64), np.array([[0, 4]], np.int64),
     r"Gather node '.*': index in input 'i' out of range \[-4, 3\]: got 4"),
    ("Gather", {"axis": 0}, rand(3), np.array([2], np.int32), np.array([-4], np.int32), r"got -4"),
    ("GatherElements", {"axis": 0}, rand(3, 2), np.array([[2, 0]], np.int64), np.array([[3, 0]], np.int64),
     r"GatherElements node .* out of range \[-3, 2\]: got 3"),
    ("GatherND", {}, rand(2, 3), np.array([[1, 2]], np.int64), np.array([[1, 3]], np.int64),
     r"GatherND node .* out of range \[-d, d-1\] for d in \[2, 3\]: got 3"),
])
def test_gather_family_raises_like_onnxruntime(op, attrs, data, ok, bad, match):
    mod, inputs = _gather_module(op, attrs, data, ok)
    np.testing.assert_array_equal(mod.run(**inputs)[0], ort_run(node_model(op, inputs, attrs), inputs)[0])
    inputs["i"] = bad
    with pytest.raises(Exception):                   # onnxruntime refuses the same input
        ort_run(node_model(op, inputs, attrs), inputs)
    with pytest.raises(ValueError, match=match):
        mod.run(**inputs)
    np.testing.assert_array_equal(mod.run(data, ok)[0], ort_run(node_model(op, inputs, attrs), {"d": data, "i": ok})[0])


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_raises_on_bad_index(op):
    data = rand(4, 2)
    ind = np.array([[1, 0]], np.int64) if op == "ScatterElements" else np.array([[3]], np.int64)
    upd = rand(1, 2, seed=3)
    m = node_model(op, {"d": data, "i": ind, "u": upd})
    mod = tensorfuse.compile(m, cache=False)
    np.testing.assert_allclose(mod.run(data, ind, upd)[0], ort_run(m, {"d": data, "i": ind, "u": upd})[0])
    bad = ind.copy()
    bad[0, 0] = 4
    with pytest.raises(ValueError, match="out of range"):
        mod.run(data, bad, upd)


def test_saved_module_keeps_its_checks(tmp_path):
    mod, inputs = _gather_module("Gather", {"axis": 0}, rand(5, 3), np.array([0, 4], np.int64))
    mod.save(tmp_path / "g.tfm")
    loaded = tensorfuse.load(tmp_path / "g.tfm")
    with pytest.raises(ValueError, match=r"out of range \[-5, 4\]: got 9"):
        loaded.run(rand(5, 3), np.array([9, 0], np.int64))
    np.testing.assert_array_equal(loaded.run(**inputs)[0], mod.run(**inputs)[0])


@pytest.mark.slow
def test_bert_token_id_out_of_vocabulary_raises():
    entry = next((e for e in shared_model_entries() if e["file"].startswith("bert_mini")), None)
    path = shared_models_dir() / "bert_mini.unfolded.onnx"
    feeds = model_inputs(entry, seed=0)
    mod = tensorfuse.compile(str(path))
    mod.run(**feeds)
    feeds["input_ids"][0, 5] = entry["inputs"][0]["range"][1]      # one past the vocabulary
    with pytest.raises(ValueError, match="out of range"):
        mod.run(**feeds)
