"""Thread counts for the native parallel loops (docs/architecture.md "CPU codegen", Parallelism)."""
from __future__ import annotations

import os
import time


def available_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where the
    platform lacks it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_num_threads(n: int | None) -> int:
    """``n`` if given, else ``$TENSORFUSE_NUM_THREADS``, else :func:`available_cores`.
    Raises ValueError for a count below 1 or a variable that is not an integer."""
    env = ""
    if n is None:
        env = os.environ.get("TENSORFUSE_NUM_THREADS", "").strip()
        if env:
            try:
                n = int(env)
            except ValueError:
                raise ValueError(f"TENSORFUSE_NUM_THREADS must be a positive integer, got {env!r}") from None
        else:
            n = available_cores()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        what = "TENSORFUSE_NUM_THREADS" if env else "num_threads"     # name where the value came from
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return n


#: a worker that finished a job keeps polling for the next one (natively, with ``pause``) for
#: about this many time-stamp-counter ticks (about 1-3 ms at the TSC rates of current x86
#: parts) before it blocks on its semaphore: on a virtual machine a blocked vCPU halts, and
#: waking it took 1-10 ms in measurement (a 1-kernel model at 2 threads, runs 1 ms apart:
#: 1.6-11 ms for 1.0 ms of work), which back-to-back runs then paid every time
WORKER_SPIN_TICKS = 6_000_000
#: a team waiting for its workers to finish their last job (at close) polls in slices of this
#: many ticks (returning to Python between slices)
DONE_SPIN_TICKS = 50_000_000
#: the default chunks per thread of a parallel loop (``$TENSORFUSE_CHUNKS_PER_THREAD``
#: overrides it): a loop of ``n`` iterations is cut into chunks of ``ceil(n / (threads *
#: chunks))`` iterations that the threads claim one at a time. More chunks: a thread that is
#: descheduled holds back a smaller share of a loop, and uneven threads even out, for one
#: atomic claim per chunk and less contiguous work per thread
CHUNKS_PER_THREAD = 4
_NATIVE = None

#: the team record's i64 fields (one 64-byte record per thread, written only by its thread
#: after the team starts): thread index, team size, the address of the team's shared counters
#: (``codegen.llvm.emit.phase_helpers``), the count of chunks before this thread's next phase, chunks per
#: thread of a parallel loop (the team's grain knob), chunks this thread ran (a statistic),
#: whether it claims chunks (1; 0 makes it only wait: ThreadTeam.set_claims, for tests), the
#: empty slots it claimed in the current phase (added to the done count at the phase's end)
TEAM_FIELDS = ("tid", "nthreads", "sync", "base", "chunks_per_thread", "chunks_run", "claims", "empty")
#: bytes between two threads' records
TEAM_RECORD_BYTES = 64
#: int64 word offsets in the shared counter block (each on its own cache line): thread 0's
#: range of chunks claimed, chunks done; thread ``r >= 1``'s range claimed is at
#: :func:`sync_claimed_word` (``codegen.llvm.emit.phase_helpers``)
SYNC_CLAIMED, SYNC_DONE = 0, 8
#: int64 words of the team's control block after the job's four (sequence, entry, slot table,
#: base): "closed" (set by ThreadTeam.close) and the ticks a worker polls before it sleeps
CTL_CLOSED, CTL_TICKS = 4, 5


def sync_claimed_word(r: int) -> int:
    """The int64 word of the shared counter block that counts the claimed chunks of thread
    ``r``'s range: word 0 for thread 0, ``8 (r + 1)`` for the others (after the done count)."""
    return SYNC_CLAIMED if r == 0 else 8 * (r + 1)


def sync_words(size: int) -> int:
    """The int64 words of a team of ``size`` threads' shared counter block."""
    return 8 * (size + 1)


def resolve_chunks_per_thread(n: int | None = None) -> int:
    """``n`` if given, else ``$TENSORFUSE_CHUNKS_PER_THREAD``, else :data:`CHUNKS_PER_THREAD`.
    Raises ValueError for a value that is not a positive integer."""
    what = "chunks_per_thread"
    if n is None:
        env = os.environ.get("TENSORFUSE_CHUNKS_PER_THREAD", "").strip()
        if not env:
            return CHUNKS_PER_THREAD
        what = "TENSORFUSE_CHUNKS_PER_THREAD"
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"{what} must be a positive integer, got {env!r}") from None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return n


def team_helpers(library=None) -> dict | None:
    """The ctypes functions of the team's native helpers (``codegen.llvm.emit.emit_team_helpers``
    documents them): from ``library`` (a compiled or loaded module's NativeLibrary, which holds
    them beside its entry), or None when it lacks them (a module saved by an older tensorfuse,
    whose kernels follow another thread protocol: it runs on the calling thread alone); without
    a library, compiled once per process (for kernels compiled on their own, as tests do)."""
    import ctypes
    i64, p = ctypes.c_int64, ctypes.c_void_p
    types = {"tf_spin": ctypes.CFUNCTYPE(i64, p, i64, i64, i64), "tf_xchg": ctypes.CFUNCTYPE(i64, p, i64),
             "tf_load": ctypes.CFUNCTYPE(i64, p), "tf_worker": ctypes.CFUNCTYPE(i64, p, p, i64, i64, i64),
             "tf_lead": ctypes.CFUNCTYPE(None, i64, p, p, i64),
             "tf_publish": ctypes.CFUNCTYPE(None, p, i64, i64, i64, i64)}
    # the native sleep and wake, where the platform has them (Linux) and the module carries them
    optional = {"tf_serve": ctypes.CFUNCTYPE(i64, p, p, i64), "tf_wake": ctypes.CFUNCTYPE(None, p, i64, i64)}

    def load(lib) -> dict:
        out = {"lib": lib, **{n: t(lib.address(n)) for n, t in types.items()}}
        for n, t in optional.items():
            try:
                addr = lib.address(n)
            except Exception:       # noqa: BLE001 - not on this platform, or an older module
                addr = 0
            if addr:
                out[n] = t(addr)
        return out
    if library is not None:
        try:
            return load(library)
        except Exception:           # noqa: BLE001 - an older module without them
            return None
    global _NATIVE
    if _NATIVE is None:
        from llvmlite import ir

        from tensorfuse.codegen.llvm.emit import emit_team_helpers
        from tensorfuse.codegen.llvm.jit import compile_ir
        mod = ir.Module(name="tf_team")
        emit_team_helpers(mod)
        lib, _, _ = compile_ir(str(mod), "tf_team")
        _NATIVE = load(lib)
    return _NATIVE


def env_flag(name: str, default: bool) -> bool:
    """The on/off variable ``name``: "0" is off, any other value on, unset or empty ``default``."""
    v = os.environ.get(name, "").strip()
    return default if not v else v != "0"


def resolve_pin(pin: bool | None = None) -> bool:
    """``pin`` if given, else ``$TENSORFUSE_PIN_THREADS`` (default on)."""
    return bool(pin) if pin is not None else env_flag("TENSORFUSE_PIN_THREADS", True)


def team_cpus(size: int) -> list[int] | None:
    """A distinct CPU for each of ``size`` team threads, from those this process may run on
    (thread 0, the caller, first), or None where there are fewer than ``size`` of them or the
    platform has no affinity calls."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return cpus[:size] if size > 1 and len(cpus) >= size else None


#: :class:`RunChoice`: weight of a new run in the moving average, and the runs between tries
#: of the slower mode (from MIN_GAP, doubling to MAX_GAP)
EWMA_WEIGHT = 0.25
MIN_GAP, MAX_GAP = 4, 64


class RunChoice:
    """Whether the next run of one entry goes to the team or to the calling thread alone: the
    mode whose recent runs were faster (an exponential moving average of wall times, weight
    :data:`EWMA_WEIGHT` per run; the first run of each mode, with cold caches, not counted),
    the other mode tried once after :attr:`gap` runs (its time then replaces its average), the
    gap doubling (up to :data:`MAX_GAP`) while the try confirms it slower and reset to
    :data:`MIN_GAP` when it wins. On a machine where other processes keep the workers off
    their cores, a run waits for every chunk a descheduled worker holds; alone, it waits for
    nobody. Both modes compute the same outputs bit for bit."""

    def __init__(self):
        self.times = {True: None, False: None}   # team / alone: the moving average (s)
        self.gap = MIN_GAP
        self._runs = {True: 0, False: 0}
        self._since = 0
        self._probe = False

    def best(self) -> bool:
        """The faster mode so far (the team until both were timed)."""
        t, a = self.times[True], self.times[False]
        return t is None or a is None or t <= a

    def _next(self) -> tuple[bool, bool]:
        """(the next run's mode, whether it is a try of the slower one)."""
        for mode in (True, False):
            if self.times[mode] is None:
                return mode, False
        if self._since + 1 >= self.gap:
            return not self.best(), True
        return self.best(), False

    def choose(self) -> bool:
        """True: run on the team; False: alone."""
        mode, self._probe = self._next()
        self._since = 0 if self._probe else self._since + (self.times[True] is not None
                                                           and self.times[False] is not None)
        return mode

    def team_next(self) -> bool:
        """Whether the next run will go to the team (``ThreadTeam.run`` then wakes sleeping
        workers at the end of a run alone, so a try does not time their wake-up)."""
        return self._next()[0]

    def record(self, team: bool, seconds: float) -> None:
        """The wall time of a run in mode ``team``."""
        self._runs[team] += 1
        if self._runs[team] == 1:
            return                               # cold: first touch of the arena, workers starting
        e = self.times[team]
        # a try replaces the other mode's old average (the load may have changed since)
        self.times[team] = seconds if e is None or self._probe else e + EWMA_WEIGHT * (seconds - e)
        if self._probe:
            self.gap = MIN_GAP if self.best() == team else min(2 * self.gap, MAX_GAP)


class ThreadTeam:
    """``size`` threads that run one native entry together (docs/architecture.md "CPU codegen").

    The calling thread is thread 0; ``size - 1`` daemon workers wait for jobs. ``run`` publishes
    the entry and the slot table, calls the entry as thread 0 and returns when every chunk of
    work in it is done: Python runs once per run, never per kernel. Inside the entry the threads
    share each phase's chunks through counters (``codegen.llvm.emit.phase_helpers``: each
    thread claims its own range of a phase's chunks first, then the others'), and
    nobody waits for a particular thread: a worker that is descheduled, or wakes late, holds
    back at most the chunk it claimed, and joins (or skips, finding nothing to claim) whatever
    is left. Each thread has a team record of int64 fields (:data:`TEAM_FIELDS`:
    index, team size, the shared counters' address, its base, chunks per thread, chunks run).
    One team serves one run at a time: each arena owns its own.

    Hand-off, in a control block of int64 words (``codegen.llvm.emit.emit_team_helpers``):
    ``run`` publishes a job (entry, slot table, base) under a sequence lock in words 0-3. A
    worker runs jobs in a native loop (``tf_worker``) that polls the sequence, so a job starts
    without the worker taking the GIL (which on a virtual machine meant sleeping on it, and a
    halted vCPU took milliseconds to wake); it publishes each finished sequence number in its
    own word (``8 t``). After :attr:`spin_ticks` (default :data:`WORKER_SPIN_TICKS`) without a
    job the worker sets its sleeping flag (word ``8 t + 1``), checks the sequence once more and
    sleeps. On Linux it never leaves native code: it sleeps on the flag with ``futex`` and
    ``run`` wakes it natively (``tf_serve`` / ``tf_wake``, ``codegen.llvm.emit``), so a waking
    worker does not wait for the GIL, which the calling thread holds between runs (squeezenet1_1
    at 2 threads, the first two runs after a 0.15 s pause: 6.62 and 4.67 ms with the semaphore,
    5.97 and 4.07 with the futex, 2.75 steady; docs/architecture.md). Elsewhere (or for a
    module saved without those helpers) it blocks on a Python semaphore that ``run`` releases
    only for a worker whose flag it clears. Both sides exchange the flag and read the sequence
    sequentially consistently, so a job is never missed and no token is left over. ``run``
    does not wait for the workers; :meth:`close` does (a late worker may still be passing over
    the last job's phases).
    """

    def __init__(self, size: int, helpers: dict | None = None, chunks_per_thread: int | None = None,
                 pin: bool | None = None):
        """``helpers``: :func:`team_helpers` of the module the team runs (default: compiled);
        ``chunks_per_thread``: see :func:`resolve_chunks_per_thread` (fixed for the team's
        life: every thread must cut each loop the same way); ``pin`` (default
        ``$TENSORFUSE_PIN_THREADS``, on): each thread on a CPU of its own (:attr:`cpus`)."""
        import ctypes
        import threading

        import numpy as np

        self.size = size
        self.chunks_per_thread = resolve_chunks_per_thread(chunks_per_thread)
        nat = helpers or team_helpers()
        self._helpers = nat                              # keeps their code alive
        self._spin, self._xchg, self._load, self._worker = nat["tf_spin"], nat["tf_xchg"], nat["tf_load"], nat["tf_worker"]
        self._lead, self._publish = nat["tf_lead"], nat["tf_publish"]
        self._serve, self._native_wake = nat.get("tf_serve"), nat.get("tf_wake")
        self._ctypes = ctypes
        words = TEAM_RECORD_BYTES // 8

        def aligned(n):                                  # n int64 words on a 64-byte boundary
            raw = np.zeros(n + 8, np.int64)
            off = (-raw.ctypes.data) % 64 // 8
            return raw[off:off + n]
        self._sync = aligned(sync_words(size))           # claimed per range, done (word 8)
        self._done_addr = self._sync.ctypes.data + 8 * SYNC_DONE
        self._records = aligned(size * words).reshape(size, words)
        f = TEAM_FIELDS.index
        for t in range(size):
            self._records[t, f("tid")] = t
            self._records[t, f("nthreads")] = size
            self._records[t, f("sync")] = self._sync.ctypes.data
            self._records[t, f("chunks_per_thread")] = self.chunks_per_thread
            self._records[t, f("claims")] = 1
        self._claims_field = f("claims")
        self._chunks_field = f("chunks_run")
        self._addr = [self._records.ctypes.data + TEAM_RECORD_BYTES * t for t in range(size)]
        # words 0-3: the job (sequence, entry, slot table, base); 8 t: worker t's last finished
        # job, 8 t + 1: its sleeping flag (a cache line per worker)
        self._ctl = aligned(8 * max(size, 1))
        self._ctl_addr = self._ctl.ctypes.data
        self._fin = [self._ctl_addr + 64 * t for t in range(size)]            # word 8 t
        self._sleeping = [self._ctl_addr + 64 * t + 8 for t in range(size)]   # word 8 t + 1
        self._ctl[CTL_TICKS] = WORKER_SPIN_TICKS
        self._seq = 0
        self._go = [threading.Semaphore(0) for _ in range(size)]
        self._closed = False
        #: whether ``run(..., adaptive=True)`` may run a job on the calling thread alone
        #: (off by default: on a quiet 2-core machine it kept runs alone that the team ran in
        #: 0.52-0.64x the time, and under load the phases alone kept 2 threads within 1.06x
        #: of 1; benchmarks/threads_under_load.py, issue 24)
        self.adaptive = env_flag("TENSORFUSE_ADAPTIVE_TEAM", False)
        self._choices: dict = {}                         # id(fn) -> RunChoice
        #: the CPU of each thread (the caller's first) while a job runs, or None (not pinned).
        #: Unpinned, Linux placed a woken worker on the caller's CPU (wake-affine) and the
        #: two shared it for milliseconds after idle stretches: bench_attention's bert:128 at
        #: 2 threads ran at its 1-thread time, 0.58 ms against onnxruntime's 0.32, in 4 of 7
        #: processes; with worker and caller each on its own CPU 0.31-0.34 in 10 of 10 (Zen 4
        #: VM, 2 vCPUs). The caller's own affinity is set for the job and restored after it
        #: (:meth:`_pin_caller`).
        self.cpus = team_cpus(size) if resolve_pin(pin) else None
        self._threads = [threading.Thread(target=self._work, args=(t,), daemon=True,
                                          name=f"tensorfuse-worker-{t}") for t in range(1, size)]
        for th in self._threads:
            th.start()

    @property
    def spin_ticks(self) -> int:
        """Time-stamp-counter ticks a worker polls for a job before it sleeps (read by the
        workers each time they start polling; default :data:`WORKER_SPIN_TICKS`)."""
        return int(self._ctl[CTL_TICKS])

    @spin_ticks.setter
    def spin_ticks(self, ticks: int) -> None:
        self._ctl[CTL_TICKS] = int(ticks)

    @property
    def native_sleep(self) -> bool:
        """Whether the workers sleep and wake natively (futex; Linux), not on semaphores."""
        return self._serve is not None and self._native_wake is not None

    def _work(self, t: int) -> None:
        if self.cpus is not None:
            try:
                os.sched_setaffinity(0, {self.cpus[t]})       # this worker thread
            except OSError:
                pass
        if self.native_sleep:
            self._serve(self._ctl_addr, self._addr[t], t)              # returns once closed
            return
        go, addr, ctl, sleeping = self._go[t], self._addr[t], self._ctl_addr, self._sleeping[t]
        last = 0
        while True:
            last = self._worker(ctl, addr, t, last, self.spin_ticks)  # runs jobs until idle
            if self._closed:
                return
            self._xchg(sleeping, 1)
            if self._load(ctl) != last:                   # a job came meanwhile
                if self._xchg(sleeping, 0) == 0:          # ... and run took the flag: its token
                    go.acquire()
                continue
            go.acquire()
            if self._closed:
                return

    def run(self, fn, slots: int, adaptive: bool = False) -> None:
        """Call ``fn(slots, team_record)`` (a ctypes function of the entry's type) on every
        thread of the team; returns when every chunk of its work is done (workers that have
        not finished passing over its phases may still be in it; they claim nothing more).

        ``adaptive`` (and :attr:`adaptive`, default ``$TENSORFUSE_ADAPTIVE_TEAM``, off): when
        runs of ``fn`` on the team have been slower than runs on the calling thread alone
        (``fn(slots, None)``; the machine's other load keeps the workers from running), run it
        alone, trying the team again now and then (:class:`RunChoice`)."""
        choice = None
        if adaptive and self.adaptive:
            choice = self._choices.get(id(fn))      # (the module keeps its entry alive)
            if choice is None:
                choice = self._choices[id(fn)] = RunChoice()
        team, t0 = True, 0.0
        if choice is not None:
            team = choice.choose()
            t0 = time.perf_counter()
        if team:
            saved = self._pin_caller()
            try:
                base = self._load(self._done_addr)           # every earlier job's chunks are done
                self._seq += 2
                fn_addr = self._ctypes.cast(fn, self._ctypes.c_void_p).value
                self._publish(self._ctl_addr, fn_addr, slots, base, self._seq)
                self._wake()
                self._lead(fn_addr, slots, self._addr[0], base)
            finally:
                if saved is not None:
                    os.sched_setaffinity(0, saved)
        else:
            fn(slots, None)
        if choice is not None:
            choice.record(team, time.perf_counter() - t0)
            if not team and choice.team_next():
                self._wake()

    def _pin_caller(self):
        """Put the calling thread on the team's first CPU (:attr:`cpus`) for a job; returns its
        own affinity for ``run`` to restore, or None where nothing changed (the team is not
        pinned, or the caller is already there)."""
        if self.cpus is None:
            return None
        try:
            cur = os.sched_getaffinity(0)
            if cur != {self.cpus[0]}:
                os.sched_setaffinity(0, {self.cpus[0]})
                return cur
        except OSError:
            pass
        return None

    def _wake(self) -> None:
        """Wake every sleeping worker (they then poll for a job): natively (``tf_wake``) or by
        releasing its semaphore."""
        if self.native_sleep:
            self._native_wake(self._ctl_addr, 1, self.size)
            return
        for t in range(1, self.size):
            if self._xchg(self._sleeping[t], 0) == 1:
                self._go[t].release()

    def set_claims(self, thread: int, claims: bool) -> None:
        """Whether thread ``thread`` claims chunks (the default) or, for tests, only waits for
        the others to run them (``set_claims(0, False)``: every chunk goes to the workers, so a
        test knows they ran). Set it between runs."""
        self._records[thread, self._claims_field] = int(bool(claims))

    def chunks_run(self):
        """Chunks each thread has run since the team started (an int64 array, thread 0 first;
        the workers' counts are read while they may be running)."""
        return self._records[:, self._chunks_field].copy()

    def close(self) -> None:
        """Wait until every worker has finished its last job, then let the workers exit (the
        team is unusable afterwards). A sleeping worker that missed the last job is woken first,
        so that it passes over the job and the wait ends."""
        self._wake()
        for fin in self._fin[1:]:
            while self._load(fin) != self._seq:
                self._spin(fin, self._seq, 1, DONE_SPIN_TICKS)
        self._closed = True
        if self.native_sleep:
            self._xchg(self._ctl_addr + 8 * CTL_CLOSED, 1)
            self._native_wake(self._ctl_addr, 1, self.size)
            return
        for t in range(1, self.size):
            self._go[t].release()
