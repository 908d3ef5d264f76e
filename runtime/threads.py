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


class ThreadTeam:
    """``size`` threads that run one native entry together (docs/architecture.md "CPU codegen").

    The calling thread is thread 0; ``size - 1`` daemon workers wait on semaphores. ``run``
    hands every worker the entry and the slot table, calls the entry as thread 0 and waits for
    the workers: Python runs once per run, never per kernel; inside the entry the threads meet
    at native barriers. Each thread gets a team record of four int64 (thread index, team size,
    barrier address, barrier sense; ``codegen.llvm.emit.TEAM_FIELDS``). One team serves one run
    at a time: each arena owns its own, so concurrent runs never share a barrier.
    """

    def __init__(self, size: int):
        import threading

        import numpy as np
        self.size = size
        self._barrier = np.zeros(2, np.int64)           # arrived count, published sense
        self._records = np.zeros((size, 4), np.int64)
        for t in range(size):
            self._records[t] = (t, size, self._barrier.ctypes.data, 0)
        self._addr = [self._records.ctypes.data + 32 * t for t in range(size)]
        self._job = None
        self._go = [threading.Semaphore(0) for _ in range(size)]
        self._done = threading.Semaphore(0)
        self._closed = False
        self._threads = [threading.Thread(target=self._work, args=(t,), daemon=True,
                                          name=f"tensorfuse-worker-{t}") for t in range(1, size)]
        for th in self._threads:
            th.start()

    def _work(self, t: int) -> None:
        go, addr = self._go[t], self._addr[t]
        while True:
            go.acquire()
            if self._closed:
                return
            fn, slots = self._job
            fn(slots, addr)
            self._done.release()

    def run(self, fn, slots: int) -> None:
        """Call ``fn(slots, team_record)`` on every thread of the team; returns when all did."""
        self._barrier[0] = 0
        self._records[:, 3] = self._barrier[1]           # every thread starts on the published sense
        self._job = (fn, slots)
        for t in range(1, self.size):
            self._go[t].release()
        try:
            fn(slots, self._addr[0])
        finally:
            for _ in range(1, self.size):
                self._done.acquire()

    def close(self) -> None:
        """Let the workers exit (the team is unusable afterwards)."""
        self._closed = True
        for t in range(1, self.size):
            self._go[t].release()
