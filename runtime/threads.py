"""Thread counts for the native parallel loops (docs/architecture.md "CPU codegen", Parallelism)."""
from __future__ import annotations

import os


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
#: ... and the calling thread polls for the workers' end of a run in slices of this many ticks
#: (returning to Python between slices)
DONE_SPIN_TICKS = 50_000_000
_NATIVE = None


def team_helpers(library=None) -> dict:
    """The ctypes functions of the team's native helpers (``codegen.llvm.emit.emit_team_helpers``
    documents them): from ``library`` (a compiled or loaded module's NativeLibrary, which holds
    them beside its entry), else (a module saved before they existed) compiled once per process."""
    import ctypes
    i64, p = ctypes.c_int64, ctypes.c_void_p
    types = {"tf_spin": ctypes.CFUNCTYPE(i64, p, i64, i64, i64), "tf_xchg": ctypes.CFUNCTYPE(i64, p, i64),
             "tf_load": ctypes.CFUNCTYPE(i64, p), "tf_worker": ctypes.CFUNCTYPE(i64, p, p, i64, i64, i64)}
    if library is not None:
        try:
            return {"lib": library, **{n: t(library.address(n)) for n, t in types.items()}}
        except Exception:           # noqa: BLE001 - an older module without them: compile below
            pass
    global _NATIVE
    if _NATIVE is None:
        from llvmlite import ir

        from tensorfuse.codegen.llvm.emit import emit_team_helpers
        from tensorfuse.codegen.llvm.jit import compile_ir
        mod = ir.Module(name="tf_team")
        emit_team_helpers(mod)
        lib, _, _ = compile_ir(str(mod), "tf_team")
        _NATIVE = {"lib": lib, **{n: t(lib.address(n)) for n, t in types.items()}}
    return _NATIVE


class ThreadTeam:
    """``size`` threads that run one native entry together (docs/architecture.md "CPU codegen").

    The calling thread is thread 0; ``size - 1`` daemon workers wait for jobs. ``run`` hands
    every worker the entry and the slot table, calls the entry as thread 0 and waits for the
    workers: Python runs once per run, never per kernel; inside the entry the threads meet at
    native barriers. Each thread gets a team record of four int64 (thread index, team size,
    barrier address, barrier sense; ``codegen.llvm.emit.TEAM_FIELDS``). One team serves one run
    at a time: each arena owns its own, so concurrent runs never share a barrier.

    Hand-off, in a control block of int64 words: ``run`` stores the entry and the slot table,
    then bumps the job sequence (word 0). A worker runs jobs in a native loop (``tf_worker``,
    :func:`team_helpers`) that polls the sequence, so a job starts and ends without the worker
    taking the GIL (which on a virtual machine meant sleeping on it, and a halted vCPU took
    milliseconds to wake); it publishes each finished sequence number in its own word
    (``8 t``), which ``run`` polls natively. After :data:`WORKER_SPIN_TICKS` without a job the
    worker sets its sleeping flag (word ``8 t + 1``), checks the sequence once more and blocks
    on its semaphore; ``run`` releases the semaphore only for a worker whose flag it clears
    (both sides exchange the flag and read the sequence sequentially consistently, so a job is
    never missed and no token is left over).
    """

    def __init__(self, size: int, helpers: dict | None = None):
        """``helpers``: :func:`team_helpers` of the module the team runs (default: compiled)."""
        import ctypes
        import threading

        import numpy as np
        self.size = size
        nat = helpers or team_helpers()
        self._helpers = nat                              # keeps their code alive
        self._spin, self._xchg, self._load, self._worker = nat["tf_spin"], nat["tf_xchg"], nat["tf_load"], nat["tf_worker"]
        self._ctypes = ctypes
        self._barrier = np.zeros(2, np.int64)           # arrived count, published sense
        self._records = np.zeros((size, 4), np.int64)
        for t in range(size):
            self._records[t] = (t, size, self._barrier.ctypes.data, 0)
        self._addr = [self._records.ctypes.data + 32 * t for t in range(size)]
        # word 0: the job sequence; 1, 2: the job's entry and slot table; 8 t: worker t's last
        # finished job, 8 t + 1: its sleeping flag (a cache line per worker)
        self._ctl = np.zeros(8 * max(size, 1), np.int64)
        self._ctl_addr = self._ctl.ctypes.data
        self._fin = [self._ctl_addr + 64 * t for t in range(size)]            # word 8 t
        self._sleeping = [self._ctl_addr + 64 * t + 8 for t in range(size)]   # word 8 t + 1
        self._seq = 0
        self._go = [threading.Semaphore(0) for _ in range(size)]
        self._closed = False
        self._threads = [threading.Thread(target=self._work, args=(t,), daemon=True,
                                          name=f"tensorfuse-worker-{t}") for t in range(1, size)]
        for th in self._threads:
            th.start()

    def _work(self, t: int) -> None:
        go, addr, ctl, sleeping = self._go[t], self._addr[t], self._ctl_addr, self._sleeping[t]
        last = 0
        while True:
            last = self._worker(ctl, addr, t, last, WORKER_SPIN_TICKS)  # runs jobs until idle
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

    def run(self, fn, slots: int) -> None:
        """Call ``fn(slots, team_record)`` (a ctypes function of the entry's type) on every
        thread of the team; returns when all did."""
        self._barrier[0] = 0
        self._records[:, 3] = self._barrier[1]           # every thread starts on the published sense
        self._ctl[1] = self._ctypes.cast(fn, self._ctypes.c_void_p).value
        self._ctl[2] = slots
        self._seq += 1
        seq = self._seq
        self._xchg(self._ctl_addr, seq)
        for t in range(1, self.size):
            if self._xchg(self._sleeping[t], 0) == 1:
                self._go[t].release()
        try:
            fn(slots, self._addr[0])
        finally:
            for fin in self._fin[1:]:
                while self._load(fin) != seq:
                    self._spin(fin, seq, 1, DONE_SPIN_TICKS)

    def close(self) -> None:
        """Let the workers exit (the team is unusable afterwards)."""
        self._closed = True
        for t in range(1, self.size):
            self._go[t].release()
