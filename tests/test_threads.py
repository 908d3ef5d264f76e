"""The thread team (runtime/threads.py ThreadTeam, codegen.llvm.emit.phase_helpers): jobs start
natively while a worker polls, a worker that went to sleep (natively on a futex, or on its
semaphore) is woken when a job comes, a run ends when its chunks are done whether or not a worker took part (a worker that is
absent or late holds nothing back and claims nothing of a job that is over), and every run's
result is checked against onnxruntime's. Each test makes sure the workers did run chunks
(``run_on_team``): in debug mode (the whole suite) a run checks the memory plan kernel by kernel,
on the team too."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tensorfuse
from tensorfuse.runtime import threads
from tests.codegen_util import module_team, run_on_team
from tests.oracle import ort_run
from tests.test_runtime_module import mlp_model, x_input


def _parallel(mod) -> bool:
    from tensorfuse.codegen.llvm.emit import kernel_is_parallel
    return any(kernel_is_parallel(k) for k in mod.kernels)


#: how workers sleep: natively (futex, where the platform has it) or on Python semaphores (the
#: fallback elsewhere, and for a module saved without the native helpers)
SLEEPS = ["native", "semaphore"]


def _compile(model, num_threads: int, sleep: str):
    """The model compiled for ``num_threads``; with ``sleep`` "semaphore" its team is made
    without the native sleep helpers. Skips "native" where the platform has none."""
    from tensorfuse.codegen.llvm.emit import TEAM_SLEEP_HELPERS, futex_syscall
    if sleep == "native" and futex_syscall() is None:
        pytest.skip("no futex on this platform: the workers sleep on semaphores")
    mod = tensorfuse.compile(model, num_threads=num_threads, cache=False)
    if sleep == "semaphore":
        mod._helpers = {k: v for k, v in mod._team_helpers().items() if k not in TEAM_SLEEP_HELPERS}
    return mod


def _team(mod, sleep: str):
    team = module_team(mod)
    assert team.native_sleep == (sleep == "native")
    team.adaptive = False                            # every run on the team (ThreadTeam.run)
    return team


@pytest.mark.parametrize("sleep", SLEEPS)
@pytest.mark.parametrize("num_threads", [2, 3])
def test_team_runs_every_job_while_polling_and_after_sleeping(num_threads, sleep):
    """With a spin budget of a few microseconds the workers sleep between most runs (their flag
    set), with the default one they poll; runs alternate between the two, and with 3 threads
    (on a 2-core machine: oversubscribed) too, whether the workers sleep natively or on
    semaphores. Every output matches onnxruntime."""
    model = mlp_model(n=64, d=256, seed=3)
    mod = _compile(model, num_threads, sleep)
    assert _parallel(mod)
    xs = [x_input(40 + i, n=64) for i in range(4)]
    want = [ort_run(model, {"x": x})[0] for x in xs]
    spin = threads.WORKER_SPIN_TICKS
    mod.run(xs[0])
    team = _team(mod, sleep)
    assert team.size == num_threads
    for i in range(30):
        fast = i % 3 != 0
        team.spin_ticks = spin if fast else 1000
        mod.check_memory = i % 2 == 0                 # the checked run (kernel by kernel) and the plain one
        got = mod.run(xs[i % 4])[0]
        np.testing.assert_allclose(got, want[i % 4], rtol=1e-4, atol=1e-5, err_msg=f"run {i}")
        if not fast:
            time.sleep(0.005)
    team.spin_ticks = spin
    run_on_team(mod, {"x": xs[0]}, lambda got, i: np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5))
    assert team.chunks_run()[1:].sum() > 0


def _wait_asleep(team, t: int = 1) -> None:
    deadline = time.time() + 10
    while team._ctl[8 * t + 1] != 1 and time.time() < deadline:
        time.sleep(0.01)
    assert team._ctl[8 * t + 1] == 1, f"the idle worker {t} did not go to sleep"


def _wait_finished(team, t: int = 1) -> None:
    deadline = time.time() + 10                      # run() does not wait for it: its word does
    while team._ctl[8 * t] != team._seq and time.time() < deadline:
        time.sleep(0.01)
    assert team._ctl[8 * t] == team._seq, f"worker {t} did not finish the last job"


@pytest.mark.parametrize("sleep", SLEEPS)
def test_idle_worker_sleeps_and_is_woken(sleep):
    """A worker idle past its spin budget sets its sleeping flag and blocks; the next run clears
    the flag and wakes it (futex, or its semaphore), and the worker finishes that job (its word
    shows the job's number) and runs chunks of later ones."""
    model = mlp_model(n=64, d=256, seed=5)
    mod = _compile(model, 2, sleep)
    assert _parallel(mod)
    x = x_input(7, n=64)
    want = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-5)
    team = _team(mod, sleep)
    try:
        team.spin_ticks = 1000
        mod.run(x)                                   # the worker's next poll uses the small budget
        _wait_asleep(team)
        for _ in range(3):
            np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-5)
        _wait_finished(team)
    finally:
        team.spin_ticks = threads.WORKER_SPIN_TICKS
    run_on_team(mod, {"x": x}, lambda got, i: np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5))


@pytest.mark.parametrize("sleep", SLEEPS)
def test_run_ends_without_an_absent_worker_and_a_late_one_claims_nothing(sleep):
    """Issue 24 item 2: a run must not wait for a particular worker. Worker 1 is kept asleep
    (not woken: its semaphore token held back, or the native wake skipping it) while runs go
    on: each ends, right, with the calling thread (and worker 2) doing every chunk; under the
    barriers of before, the first run never ended. Woken late, the worker passes over the job
    it missed without claiming a chunk (all were claimed), and later runs are right with it
    taking part again."""
    import threading
    model = mlp_model(n=64, d=256, seed=6)
    mod = _compile(model, 3, sleep)
    mod.check_memory = False
    xs = [x_input(60 + i, n=64) for i in range(3)]
    want = [ort_run(model, {"x": x})[0] for x in xs]
    np.testing.assert_allclose(mod.run(xs[0])[0], want[0], rtol=1e-4, atol=1e-5)
    team = _team(mod, sleep)
    team.spin_ticks = 1000
    mod.run(xs[0])
    _wait_asleep(team)
    if sleep == "semaphore":
        token, held = team._go[1], threading.Semaphore(0)
        team._go[1] = held                           # run() wakes this one: worker 1 sleeps on
    else:
        wake = team._native_wake
        team._native_wake = lambda ctl, first, end: wake(ctl, max(first, 2), end)   # never worker 1
    before = int(team.chunks_run()[1])
    results, errors = [], []

    def runs():
        try:
            for i in range(6):
                results.append(mod.run(xs[i % 3])[0])
        except BaseException as e:                  # noqa: BLE001 - reported below
            errors.append(e)
    th = threading.Thread(target=runs, daemon=True)
    th.start()
    th.join(timeout=120)
    assert not th.is_alive(), "a run waited for the sleeping worker"
    assert not errors, errors
    for i, got in enumerate(results):
        np.testing.assert_allclose(got, want[i % 3], rtol=1e-4, atol=1e-5, err_msg=f"run {i}")
    assert int(team.chunks_run()[1]) == before       # it slept through them
    if sleep == "native":
        assert team._ctl[8 + 1] == 1                 # still asleep (its flag never cleared)
    if sleep == "semaphore":                         # wake it late: it finds the last job over
        team._go[1] = token
        team._xchg(team._sleeping[1], 0)
        token.release()
    else:
        team._native_wake = wake
        wake(team._ctl_addr, 1, 2)
    _wait_finished(team)
    assert int(team.chunks_run()[1]) == before, "a late worker claimed a chunk of a finished job"
    team.spin_ticks = threads.WORKER_SPIN_TICKS
    run_on_team(mod, {"x": xs[1]}, lambda got, i: np.testing.assert_allclose(got[0], want[1], rtol=1e-4, atol=1e-5))


def test_chunks_per_thread_knob(monkeypatch):
    """$TENSORFUSE_CHUNKS_PER_THREAD sets how finely a team cuts its loops (1 chunk per thread up
    to more chunks than iterations): the outputs are the same, bit for bit; bad values are
    ValueErrors naming the variable."""
    model = mlp_model(n=64, d=256, seed=8)
    x = x_input(3, n=64)
    want = ort_run(model, {"x": x})[0]
    outs = []
    for k in ("1", "3", "1000"):
        monkeypatch.setenv("TENSORFUSE_CHUNKS_PER_THREAD", k)
        mod = tensorfuse.compile(model, num_threads=2)
        got = run_on_team(mod, {"x": x}, lambda g, i: np.testing.assert_allclose(g[0], want, rtol=1e-4, atol=1e-5))
        assert module_team(mod).chunks_per_thread == int(k)
        outs.append(got[0])
    assert all(np.array_equal(o, outs[0]) for o in outs)
    for bad in ("0", "x"):
        monkeypatch.setenv("TENSORFUSE_CHUNKS_PER_THREAD", bad)
        with pytest.raises(ValueError, match="TENSORFUSE_CHUNKS_PER_THREAD must be a positive integer"):
            threads.resolve_chunks_per_thread()


def test_run_choice_prefers_the_faster_mode_and_retries_the_other():
    """ThreadTeam.run(adaptive=True) asks a RunChoice whether to run on the team or alone: both
    are timed first (twice: the first, cold run of each is not counted), then the faster is
    taken and the slower tried after 4, 8, 16 ... runs (up to 64) while it stays slower, every
    4 runs again once it wins."""
    c = threads.RunChoice()
    seq = []

    def step(team_s, alone_s):
        mode = c.choose()
        assert c.team_next() == c._next()[0]
        seq.append(mode)
        c.record(mode, team_s if mode else alone_s)
    c.record(True, 5.0)                          # a cold first run: ignored
    for _ in range(3 + 4 + 8 + 16 + 3):
        step(0.010, 0.002)                       # the team is 5x slower (a loaded machine)
    assert seq[:3] == [True, False, False]
    tries = [i for i, m in enumerate(seq) if m and i >= 1]
    assert tries == [6, 14, 30], seq             # gaps 4, 8, 16
    assert c.gap == 32
    seq.clear()
    for _ in range(40):
        step(0.001, 0.002)                       # the load went away: the team wins its next try
    first = seq.index(True)
    assert first < 32 and c.best() is True       # (alone is then tried at gaps 4, 8, ...)
    assert seq[first:].count(False) <= (40 - first) // 4 + 1      # alone only when tried
    assert threads.MAX_GAP == 64


def test_loaded_team_runs_alone_and_still_matches(monkeypatch):
    """A whole run whose team mode was timed slower goes to the calling thread alone, with the
    same outputs bit for bit; debug mode's kernel-by-kernel runs always use the team. The
    choice is opt-in ($TENSORFUSE_ADAPTIVE_TEAM=1); by default every run goes to the team."""
    model = mlp_model(n=64, d=256, seed=10)
    monkeypatch.delenv("TENSORFUSE_ADAPTIVE_TEAM", raising=False)
    plain = tensorfuse.compile(model, num_threads=2, cache=False)
    plain.check_memory = False
    plain.run(x_input(11, n=64))
    assert module_team(plain).adaptive is False and not module_team(plain)._choices
    monkeypatch.setenv("TENSORFUSE_ADAPTIVE_TEAM", "1")
    mod = tensorfuse.compile(model, num_threads=2, cache=False)
    mod.check_memory = False
    x = x_input(11, n=64)
    want = ort_run(model, {"x": x})[0]
    first = mod.run(x)[0]
    team = module_team(mod)
    (choice,) = team._choices.values()
    choice.times = {True: 1.0, False: 1e-9}      # as if the team had been 1e9 times slower
    seq0 = team._seq
    for _ in range(3):
        np.testing.assert_array_equal(mod.run(x)[0], first)
    assert team._seq == seq0                     # no job published: alone
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-5)


def test_team_helpers_come_with_the_module():
    """A compiled module's code holds the team's helpers beside its entry (linked in as their
    own object, generated once per target: a saved module thus needs no code generation to run
    threaded), and its teams use them; a library without them (a module saved by an older
    tensorfuse, whose kernels follow another thread protocol) runs on the calling thread alone."""
    from tensorfuse.codegen.llvm import jit
    mod = tensorfuse.compile(mlp_model(n=64, d=256, seed=5), num_threads=2, cache=False)
    assert jit.team_runtime_object() in jit.unpack_objects(mod._object_code)
    assert all(mod._lib.address(n) for n in ("tf_spin", "tf_xchg", "tf_load", "tf_worker", "tf_lead", "tf_publish"))
    x = x_input(1, n=64)
    want = mod.run(x)[0]
    team = module_team(mod)
    assert team._helpers["lib"] is mod._lib

    class NoHelpers:
        def address(self, name):
            raise KeyError(name)
    assert threads.team_helpers(NoHelpers()) is None
    assert threads.team_helpers(None)["lib"] is not mod._lib    # compiled on its own, once
    mod._helpers, mod._pool = {}, []                # as loaded from an older file
    np.testing.assert_array_equal(mod.run(x)[0], want)
    assert module_team(mod) is None


def test_saved_module_runs_on_its_own_team(tmp_path):
    """A module saved and loaded back runs threaded with the helpers of its own object code
    (no code generation), its workers running chunks, and gives the compiled module's output."""
    model = mlp_model(n=64, d=256, seed=9)
    mod = tensorfuse.compile(model, num_threads=2, cache=False)
    x = x_input(5, n=64)
    want = ort_run(model, {"x": x})[0]
    path = tmp_path / "m.tfm"
    mod.save(str(path))
    back = tensorfuse.load(str(path))
    back.num_threads = 2
    for checked in (True, False):
        back.check_memory = checked
        got = run_on_team(back, {"x": x}, lambda g, i: np.testing.assert_allclose(g[0], want, rtol=1e-4, atol=1e-5))
        np.testing.assert_array_equal(got[0], mod.run(x)[0])
    team = module_team(back)
    assert team._helpers["lib"] is back._lib and team.chunks_run()[1:].sum() > 0


def _phase_protocol(size: int):
    """tf_claim and tf_phase_end of ``codegen.llvm.emit.phase_helpers`` behind external
    wrappers, with ``size`` hand-made team records over one shared counter block (what
    ThreadTeam allocates), for driving the protocol step by step from one Python thread."""
    import ctypes

    from llvmlite import ir as lir

    from tensorfuse.codegen.llvm.emit import phase_helpers
    from tensorfuse.codegen.llvm.jit import compile_ir
    mod = lir.Module(name="proto")
    claim, _wait, end = phase_helpers(mod)
    i64, ptr = lir.IntType(64), lir.PointerType()
    for name, inner, args in (("t_claim", claim, [ptr, i64, i64]), ("t_end", end, [ptr, i64, i64])):
        f = lir.Function(mod, lir.FunctionType(inner.function_type.return_type, args), name=name)
        b = lir.IRBuilder(f.append_basic_block("entry"))
        r = b.call(inner, list(f.args))
        b.ret_void() if isinstance(inner.function_type.return_type, lir.VoidType) else b.ret(r)
    lib, _, _ = compile_ir(str(mod), "proto")
    I, P = ctypes.c_int64, ctypes.c_void_p
    fns = (ctypes.CFUNCTYPE(I, P, I, I)(lib.address("t_claim")), ctypes.CFUNCTYPE(None, P, I, I)(lib.address("t_end")))
    sync = np.zeros(threads.sync_words(size), np.int64)
    words = threads.TEAM_RECORD_BYTES // 8
    rec = np.zeros((size, words), np.int64)
    f = threads.TEAM_FIELDS.index
    for t in range(size):
        rec[t, f("tid")], rec[t, f("nthreads")], rec[t, f("sync")], rec[t, f("claims")] = t, size, sync.ctypes.data, 1
    addr = [rec.ctypes.data + threads.TEAM_RECORD_BYTES * t for t in range(size)]
    return fns, sync, rec, addr, lib


def test_each_thread_claims_its_own_range_first_then_steals():
    """A phase of n chunks over T threads gives thread t the range [ceil(t n / T), ceil((t + 1)
    n / T)) (each of S = ceil(n / T) slots; a shorter range's last slot is empty): each thread
    claims its own range front to back (so a team whose kernels split their loops the same way
    keeps each part of an activation on the core that wrote it), then the next threads' ranges.
    An empty slot is never handed out; every chunk goes out exactly once. A thread reports its
    chunks and empty slots done when it ends the phase (one atomic add), and the done count
    reaches the phase's slots, phase after phase."""
    (claim, end), sync, rec, addr, _lib = _phase_protocol(2)
    base, ran = threads.TEAM_FIELDS.index("base"), threads.TEAM_FIELDS.index("chunks_run")
    got = {0: [], 1: []}
    # phase 1: 8 chunks; thread 0 takes 0, 1; thread 1 takes 4; thread 0 then 2, 3 and steals 5, 6
    for t, k in ((0, 2), (1, 1), (0, 4), (1, 1)):
        for _ in range(k):
            got[t].append(claim(addr[t], 8, 0))
    assert got == {0: [0, 1, 2, 3, 5, 6], 1: [4, 7]}
    assert claim(addr[0], 8, 0) == -1 and claim(addr[1], 8, 0) == -1
    assert sync[threads.SYNC_DONE] == 0                          # nothing reported before the end
    end(addr[0], 8, 6)
    assert sync[threads.SYNC_DONE] == 6
    end(addr[1], 8, 2)
    assert sync[threads.SYNC_DONE] == 8 and list(rec[:, base]) == [8, 8]
    # phase 2: 5 chunks over 2 threads: ranges {0, 1, 2} and {3, 4} (and an empty slot)
    seen = []
    for t in (1, 1, 1, 0, 0, 0):
        i = claim(addr[t], 5, 0)
        if i >= 0:
            seen.append((t, i))
    assert seen == [(1, 3), (1, 4), (1, 0), (0, 1), (0, 2)]
    end(addr[0], 5, 2)
    end(addr[1], 5, 3)
    assert sync[threads.SYNC_DONE] == 8 + 6                      # 5 chunks and the empty slot
    assert list(rec[:, ran]) == [6 + 2, 2 + 3]
    assert list(rec[:, threads.TEAM_FIELDS.index("empty")]) == [0, 0]
    # phase 3 (one chunk, as a run of serial kernels): thread 0's range is [0, 1), thread 1's
    # empty; the first to ask takes it
    assert claim(addr[1], 1, 0) == 0
    assert claim(addr[0], 1, 0) == -1
    end(addr[1], 1, 1)
    end(addr[0], 1, 0)
    assert sync[threads.SYNC_DONE] == 8 + 6 + 2 == rec[0, base] == rec[1, base]


def test_a_late_thread_claims_nothing_of_a_finished_phase():
    """A thread that missed a phase (its base still that phase's) finds every range of it
    claimed and gets -1; once it has ended the phase it takes part in the next one, from its
    own range."""
    (claim, end), sync, rec, addr, _lib = _phase_protocol(3)
    for _ in range(7):
        assert claim(addr[0], 7, 0) >= 0
    assert claim(addr[0], 7, 0) == -1                  # passing the last range's empty slot
    end(addr[0], 7, 7)
    assert sync[threads.SYNC_DONE] == 9                          # 7 chunks, 2 empty slots
    assert claim(addr[0], 5, 0) == 0                   # thread 0 is in the next phase
    assert claim(addr[2], 7, 0) == -1                  # thread 2, late, finds the old one taken
    end(addr[2], 7, 0)
    assert claim(addr[2], 5, 0) == 4                   # its own range of the new phase: [4, 5)


def test_team_threads_each_on_a_cpu_of_their_own(monkeypatch):
    """With ``$TENSORFUSE_PIN_THREADS`` on (the default) each worker runs on a CPU of its own
    and the calling thread, during a job, on the first (``ThreadTeam.cpus``), its own affinity
    restored after the run, whatever it was; off, nothing is pinned; with more threads than
    CPUs, nothing is pinned either. The results match onnxruntime either way."""
    import os
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs and the affinity calls")
    cpus = sorted(os.sched_getaffinity(0))
    model = mlp_model(n=64, d=256, seed=5)
    x = x_input(7, n=64)
    want = ort_run(model, {"x": x})[0]
    monkeypatch.delenv("TENSORFUSE_PIN_THREADS", raising=False)
    mod = tensorfuse.compile(model, num_threads=2, cache=False)
    before = os.sched_getaffinity(0)
    try:
        np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-5)
        team = module_team(mod)
        assert team.cpus == cpus[:2]
        assert os.sched_getaffinity(0) == before                     # the caller's, restored
        (worker,) = team._threads
        deadline = time.time() + 5
        while os.sched_getaffinity(worker.native_id) != {cpus[1]} and time.time() < deadline:
            time.sleep(0.01)
        assert os.sched_getaffinity(worker.native_id) == {cpus[1]}
        os.sched_setaffinity(0, {cpus[1]})                           # a caller with its own setting
        np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-5)
        assert os.sched_getaffinity(0) == {cpus[1]}
    finally:
        os.sched_setaffinity(0, before)
    monkeypatch.setenv("TENSORFUSE_PIN_THREADS", "0")
    mod2 = tensorfuse.compile(model, num_threads=2, cache=False)
    np.testing.assert_allclose(mod2.run(x)[0], want, rtol=1e-4, atol=1e-5)
    team2 = module_team(mod2)
    assert team2.cpus is None and os.sched_getaffinity(team2._threads[0].native_id) == before
    assert threads.team_cpus(len(cpus) + 1) is None and threads.team_cpus(1) is None
