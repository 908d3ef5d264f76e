"""Runtime acceptance on real models (../shared/models): the memory plan's arena against the
peak live bytes, no allocation in the steady state, saved modules loaded bit-exact in a fresh
process without code generation, and the compile cache's warm compile against the cold one.
The numbers are printed (run with ``-s`` to see them)."""
from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

import tensorfuse
from conftest import shared_model_entries, shared_models_dir
from oracle import assert_outputs_depend_on_inputs, model_inputs, other_inputs
from test_runtime_artifact import load_in_fresh_process

pytestmark = [pytest.mark.slow, pytest.mark.shared]

MODELS = ["resnet18.unfolded", "bert_mini.unfolded"]


def _entry(name: str) -> dict:
    for e in shared_model_entries():
        if e["file"] == name + ".onnx":
            return e
    shared_models_dir()                 # skips (or fails under TENSORFUSE_REQUIRE_SHARED=1)
    pytest.fail(f"{name}.onnx is not listed in models.json")


@pytest.fixture(scope="module", params=MODELS)
def compiled(request, tmp_path_factory):
    """(name, module, feeds, cold seconds, warm seconds): compiled through an empty cache,
    then again from the cache."""
    name = request.param
    entry = _entry(name)
    path = str(shared_models_dir() / entry["file"])
    mp = pytest.MonkeyPatch()
    mp.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        t0 = time.perf_counter()
        mod = tensorfuse.compile(path)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm_mod = tensorfuse.compile(path)
        warm = time.perf_counter() - t0
    finally:
        mp.undo()
    assert mod.cache_hit is False and warm_mod.cache_hit is True
    feeds = model_inputs(entry, seed=0)
    # the bit-exact comparisons below say something only if the outputs move with the inputs
    assert_outputs_depend_on_inputs(mod.run(**feeds), mod.run(**other_inputs(feeds)), 1e-3, 1e-4, name)
    np.testing.assert_array_equal(warm_mod.run(**feeds)[0], mod.run(**feeds)[0])
    return name, mod, feeds, cold, warm


def test_arena_close_to_peak_live(compiled):
    name, mod, _, _, _ = compiled
    plan = mod.memory_plan
    print(f"\n{name}: {plan.summary()}; arena {plan.arena_bytes} B, peak live {plan.peak_live_bytes} B, "
          f"naive {plan.naive_bytes} B")
    assert plan.peak_live_bytes <= plan.arena_bytes <= 1.25 * plan.peak_live_bytes
    assert plan.arena_bytes < plan.naive_bytes


def test_second_run_allocates_only_outputs(compiled, monkeypatch):
    _, mod, feeds, _, _ = compiled
    monkeypatch.setattr(mod, "check_memory", False)     # the production path (checked runs allocate)
    mod.run(**feeds)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        outs = mod.run(**feeds)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    extra = peak - base - sum(o.nbytes for o in outs)
    assert extra < 0.01 * mod.memory_plan.arena_bytes, extra


def test_saved_module_runs_bit_exact_in_a_fresh_process(compiled, tmp_path):
    name, mod, feeds, cold, warm = compiled
    path = tmp_path / f"{name}.tfm"
    t0 = time.perf_counter()
    mod.save(path)
    save_s = time.perf_counter() - t0
    outs, load_s = load_in_fresh_process(path, feeds, tmp_path)
    want = mod.run(**feeds)
    assert len(outs) == len(want)
    for got, exp in zip(outs, want):
        assert got.dtype == exp.dtype and got.shape == exp.shape
        np.testing.assert_array_equal(got, exp)
    print(f"\n{name}: cold compile {cold:.2f} s, warm (cached) {warm:.3f} s, save {save_s:.3f} s, "
          f"load in a fresh process {load_s:.3f} s, file {path.stat().st_size / 2**20:.1f} MiB")


def test_warm_compile_under_a_tenth_of_cold(compiled):
    name, _, _, cold, warm = compiled
    assert warm < 0.1 * cold, f"{name}: warm {warm:.3f} s vs cold {cold:.3f} s"
