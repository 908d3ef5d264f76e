"""The thread team's hand-off (runtime/threads.py ThreadTeam): jobs start and end natively
while a worker polls, and a worker that went to sleep on its semaphore is woken exactly when a
job comes; every run's result is checked against onnxruntime's (the parallel kernels split their
work across the team, so a missed or doubled job shows as a wrong or partial output)."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tensorfuse
from tensorfuse.runtime import threads
from tests.oracle import ort_run
from tests.test_runtime_module import mlp_model, x_input


def _parallel(mod) -> bool:
    from tensorfuse.codegen.llvm.emit import kernel_is_parallel
    return any(kernel_is_parallel(k) for k in mod.kernels)


def _arena_team(mod):
    arena = mod._acquire()
    mod._release(arena)
    return arena.team


@pytest.mark.parametrize("num_threads", [2, 3])
def test_team_runs_every_job_while_polling_and_after_sleeping(monkeypatch, num_threads):
    """With a spin budget of a few microseconds the workers sleep between most runs (their flag
    set), with the default one they poll; runs alternate between the two, and with 3 threads
    (on a 2-core machine: oversubscribed) too. Every output matches onnxruntime."""
    model = mlp_model(n=64, d=256, seed=3)
    mod = tensorfuse.compile(model, num_threads=num_threads, cache=False)
    assert _parallel(mod)
    xs = [x_input(40 + i, n=64) for i in range(4)]
    want = [ort_run(model, {"x": x})[0] for x in xs]
    for i in range(30):
        fast = i % 3 != 0
        monkeypatch.setattr(threads, "WORKER_SPIN_TICKS", threads.WORKER_SPIN_TICKS if fast else 1000)
        got = mod.run(xs[i % 4])[0]
        np.testing.assert_allclose(got, want[i % 4], rtol=1e-4, atol=1e-5, err_msg=f"run {i}")
        if not fast:
            time.sleep(0.005)
    team = _arena_team(mod)
    assert team is not None and team.size == num_threads


def test_idle_worker_sleeps_and_is_woken():
    """A worker idle past its spin budget sets its sleeping flag and blocks; the next run clears
    the flag, releases its semaphore, and both threads run their shares (the output is right
    only if the worker ran its chunk of each parallel kernel)."""
    model = mlp_model(n=64, d=256, seed=4)
    mod = tensorfuse.compile(model, num_threads=2, cache=False)
    assert _parallel(mod)
    x = x_input(7, n=64)
    want = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-5)
    team = _arena_team(mod)
    old = threads.WORKER_SPIN_TICKS
    try:
        threads.WORKER_SPIN_TICKS = 1000
        mod.run(x)                                   # the worker's next poll uses the small budget
        deadline = time.time() + 10
        while team._ctl[8 + 1] != 1 and time.time() < deadline:
            time.sleep(0.01)
        assert team._ctl[8 + 1] == 1, "the idle worker did not go to sleep"
        for _ in range(3):
            np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-5)
        assert team._ctl[8] == team._seq             # the worker finished the last job
    finally:
        threads.WORKER_SPIN_TICKS = old


def test_team_helpers_come_with_the_module():
    """A compiled module's code holds the team's helpers beside its entry (a saved module thus
    needs no code generation to run threaded), and its teams use them; a library without them
    (a module saved before) gets them compiled once per process."""
    mod = tensorfuse.compile(mlp_model(n=64, d=256, seed=5), num_threads=2, cache=False)
    assert all(f'define i64 @"{n}"' in mod.llvm_ir or f"define i64 @{n}(" in mod.llvm_ir
               for n in ("tf_spin", "tf_xchg", "tf_load", "tf_worker"))
    mod.run(x_input(1, n=64))
    team = _arena_team(mod)
    assert team._helpers["lib"] is mod._lib

    class NoHelpers:
        def address(self, name):
            raise KeyError(name)
    fallback = threads.team_helpers(NoHelpers())
    assert fallback["lib"] is not mod._lib and fallback is threads.team_helpers(None)
