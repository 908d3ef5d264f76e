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
#: ``sched_yield`` every this many polls, so that an oversubscribed machine makes progress
SPIN_YIELD_EVERY = 2048

_NATIVE = None


def _native() -> dict:
    """The team's native helpers, compiled once per process (all called through ctypes, so the
    GIL is released while they run):

    - ``tf_spin(ptr word, i64 value, i64 equal, i64 ticks) -> i64``: poll the int64 at ``word``
      (acquire loads, ``pause`` between polls on x86, a ``sched_yield`` every
      :data:`SPIN_YIELD_EVERY`) until ``(*word == value) == equal`` (1) or ``ticks`` of
      ``llvm.readcyclecounter`` have passed (0);
    - ``tf_xchg(ptr word, i64 value) -> i64`` (sequentially consistent exchange) and
      ``tf_load(ptr word) -> i64`` (sequentially consistent load);
    - ``tf_worker(ptr ctl, ptr team, i64 t, i64 last, i64 ticks) -> i64``: worker ``t``'s job
      loop: whenever the job sequence (``ctl[0]``) differs from ``last`` it calls the job's
      entry (address ``ctl[1]``) with the slot table ``ctl[2]`` and its team record, then
      publishes the sequence number in ``ctl[8 t]`` (release); it returns the last sequence
      run once ``ticks`` have passed without a new job. Jobs thus start and end with no
      Python (and no GIL) on the worker's side."""
    global _NATIVE
    if _NATIVE is None:
        import ctypes

        from tensorfuse.codegen.llvm.jit import compile_ir, host_info
        x86 = host_info()["triple"].startswith(("x86_64", "i686", "i386"))
        pause = "call void @llvm.x86.sse2.pause()" if x86 else ""
        poll = f"""
  {pause}
  %k1 = add i64 %k, 1
  %r = and i64 %k1, {SPIN_YIELD_EVERY - 1}
  %y = icmp eq i64 %r, 0
  br i1 %y, label %yield, label %next
yield:
  %u = call i32 @sched_yield()
  br label %next
next:
  %now = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %now, %t0
  %more = icmp ult i64 %dt, %ticks"""
        text = f"""
{"declare void @llvm.x86.sse2.pause()" if x86 else ""}
declare i64 @llvm.readcyclecounter()
declare i32 @sched_yield()

define i64 @tf_spin(ptr %word, i64 %value, i64 %equal, i64 %ticks) {{
entry:
  %t0 = call i64 @llvm.readcyclecounter()
  br label %loop
loop:
  %k = phi i64 [0, %entry], [%k1, %next]
  %v = load atomic i64, ptr %word acquire, align 8
  %eq = icmp eq i64 %v, %value
  %eqz = zext i1 %eq to i64
  %hit = icmp eq i64 %eqz, %equal
  br i1 %hit, label %yes, label %wait
wait:{poll}
  br i1 %more, label %loop, label %no
yes:
  ret i64 1
no:
  ret i64 0
}}

define i64 @tf_xchg(ptr %word, i64 %value) {{
  %old = atomicrmw xchg ptr %word, i64 %value seq_cst
  ret i64 %old
}}

define i64 @tf_load(ptr %word) {{
  %v = load atomic i64, ptr %word seq_cst, align 8
  ret i64 %v
}}

define i64 @tf_worker(ptr %ctl, ptr %team, i64 %t, i64 %last0, i64 %ticks) {{
entry:
  %start = call i64 @llvm.readcyclecounter()
  br label %job
job:
  %last = phi i64 [%last0, %entry], [%s, %ran]
  %t0 = phi i64 [%start, %entry], [%end, %ran]
  br label %loop
loop:
  %k = phi i64 [0, %job], [%k1, %next]
  %s = load atomic i64, ptr %ctl acquire, align 8
  %new = icmp ne i64 %s, %last
  br i1 %new, label %run, label %wait
run:
  %fp = getelementptr i64, ptr %ctl, i64 1
  %fi = load i64, ptr %fp, align 8
  %f = inttoptr i64 %fi to ptr
  %sp = getelementptr i64, ptr %ctl, i64 2
  %si = load i64, ptr %sp, align 8
  %slots = inttoptr i64 %si to ptr
  call void %f(ptr %slots, ptr %team)
  br label %ran
ran:
  %off = mul i64 %t, 8
  %fw = getelementptr i64, ptr %ctl, i64 %off
  store atomic i64 %s, ptr %fw release, align 8
  %end = call i64 @llvm.readcyclecounter()
  br label %job
wait:{poll}
  br i1 %more, label %loop, label %out
out:
  ret i64 %last
}}
"""
        lib, _, _ = compile_ir(text, "tf_team")
        i64, p = ctypes.c_int64, ctypes.c_void_p
        _NATIVE = {
            "lib": lib,
            "spin": ctypes.CFUNCTYPE(i64, p, i64, i64, i64)(lib.address("tf_spin")),
            "xchg": ctypes.CFUNCTYPE(i64, p, i64)(lib.address("tf_xchg")),
            "load": ctypes.CFUNCTYPE(i64, p)(lib.address("tf_load")),
            "worker": ctypes.CFUNCTYPE(i64, p, p, i64, i64, i64)(lib.address("tf_worker")),
        }
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
    :func:`_native`) that polls the sequence, so a job starts and ends without the worker
    taking the GIL (which on a virtual machine meant sleeping on it, and a halted vCPU took
    milliseconds to wake); it publishes each finished sequence number in its own word
    (``8 t``), which ``run`` polls natively. After :data:`WORKER_SPIN_TICKS` without a job the
    worker sets its sleeping flag (word ``8 t + 1``), checks the sequence once more and blocks
    on its semaphore; ``run`` releases the semaphore only for a worker whose flag it clears
    (both sides exchange the flag and read the sequence sequentially consistently, so a job is
    never missed and no token is left over).
    """

    def __init__(self, size: int):
        import ctypes
        import threading

        import numpy as np
        self.size = size
        nat = _native()
        self._spin, self._xchg, self._load, self._worker = nat["spin"], nat["xchg"], nat["load"], nat["worker"]
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
        self._seq = 0
        self._go = [threading.Semaphore(0) for _ in range(size)]
        self._closed = False
        self._threads = [threading.Thread(target=self._work, args=(t,), daemon=True,
                                          name=f"tensorfuse-worker-{t}") for t in range(1, size)]
        for th in self._threads:
            th.start()

    def _work(self, t: int) -> None:
        go, addr, ctl = self._go[t], self._addr[t], self._ctl_addr
        sleeping = ctl + 8 * (8 * t + 1)
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
            if self._xchg(self._ctl_addr + 8 * (8 * t + 1), 0) == 1:
                self._go[t].release()
        try:
            fn(slots, self._addr[0])
        finally:
            for t in range(1, self.size):
                fin = self._ctl_addr + 64 * t
                while self._load(fin) != seq:
                    self._spin(fin, seq, 1, DONE_SPIN_TICKS)

    def close(self) -> None:
        """Let the workers exit (the team is unusable afterwards)."""
        self._closed = True
        for t in range(1, self.size):
            self._go[t].release()
