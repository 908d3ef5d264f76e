"""Where the time goes: per-kernel profiles and whole-run benchmarks of a :class:`Module`.

The profiler calls each kernel's exported function (``void name(ptr args)``) on its own, with
the argument array the entry function would build, in run order, so every kernel sees the data
it sees in a real run. A row names the ONNX nodes the kernel covers: fused kernels come from
nodes that rewrites created, and :func:`trace_sources` follows the rewrite log back to the
model's own node names.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class ProfileRow:
    """One kernel call: median time over the repeats (ms), share of the summed medians, GFLOP/s
    (when the op declares a FLOP count), the bytes of its distinct buffers (read and written),
    the ONNX nodes it covers (``nodes``), the IR nodes and their ops, its place in run order
    (``call``, from 0) and how many calls of one run use its kernel (``shared_by``: repeated
    layers share one kernel function)."""

    kernel: str
    nodes: list[str]
    median_ms: float
    share: float
    gflops: float | None
    bytes_moved: int
    ir_nodes: list[str]
    ops: list[str]
    call: int = 0
    shared_by: int = 1


#: the width the "ONNX nodes" column wraps at (names are never cut: long lists go on more lines)
NODES_WIDTH = 56


def _wrap_names(names: list[str], width: int = NODES_WIDTH) -> list[str]:
    lines, cur = [], ""
    for i, n in enumerate(names):
        piece = n + ("," if i < len(names) - 1 else "")
        if cur and len(cur) + 1 + len(piece) > width:
            lines.append(cur)
            cur = piece
        else:
            cur = f"{cur} {piece}" if cur else piece
    return lines + [cur] if cur or not lines else lines


@dataclass
class Profile:
    """Per-kernel-call rows (:class:`ProfileRow`) sorted by time, slowest first. Its ``str``
    and ``repr`` are the table (call number in run order, kernel, the ONNX nodes in full, median
    ms, share, GFLOP/s, MB moved; a kernel used by several calls is marked ``xN``); it iterates,
    indexes and has a length like the list of rows. ``total_ms`` is the sum of the medians."""

    rows: list[ProfileRow]
    repeat: int = 0
    warmup: int = 0
    #: how the calls were timed: "host" (wall clock on the host) or "cuda events" (device time)
    clock: str = "host"

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    @property
    def total_ms(self) -> float:
        return sum(r.median_ms for r in self.rows)

    def __str__(self) -> str:
        head = ("#", "kernel", "ONNX nodes", "median ms", "share", "GFLOP/s", "MB moved")
        table = []
        for r in self.rows:
            names = _wrap_names(r.nodes) if r.nodes else ["(" + ", ".join(r.ops) + ")"]
            kernel = r.kernel + (f" x{r.shared_by}" if r.shared_by > 1 else "")
            table.append((str(r.call), kernel, names[0], f"{r.median_ms:.4f}", f"{100 * r.share:.1f}%",
                          "" if r.gflops is None else f"{r.gflops:.2f}", f"{r.bytes_moved / 1e6:.3f}"))
            table += [("", "", more, "", "", "", "") for more in names[1:]]
        w = [max(len(row[i]) for row in [head] + table) for i in range(len(head))]
        left = (1, 2)

        def line(row):
            return "  ".join(c.ljust(w[i]) if i in left else c.rjust(w[i]) for i, c in enumerate(row)).rstrip()
        lines = [line(head), "-" * len(line(head))] + [line(r) for r in table]
        shared = sum(1 for r in self.rows if r.shared_by > 1)
        lines.append(f"total {self.total_ms:.3f} ms over {len(self.rows)} kernel calls"
                     + (f" ({shared} calls use a kernel shared with other layers: xN)" if shared else "")
                     + (f"; median of {self.repeat} runs" if self.repeat else "")
                     + (f"; timed with {self.clock}" if self.clock != "host" else ""))
        return "\n".join(lines)

    __repr__ = __str__


@dataclass
class Benchmark:
    """Whole-run wall times in milliseconds over ``repeat`` runs (after ``warmup`` runs)."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeat: int

    def __str__(self) -> str:
        return (f"median {self.median_ms:.3f} ms, min {self.min_ms:.3f} ms, max {self.max_ms:.3f} ms "
                f"over {self.repeat} run{'' if self.repeat == 1 else 's'}")


def trace_sources(nodes: list[str], log) -> list[str]:
    """The model's node names behind IR nodes: a node a rewrite created stands for the nodes
    that rewrite matched (resolved through earlier rewrites); other nodes are the model's own.
    ``log``: rule applications in order, with ``nodes`` (matched) and ``created`` name lists,
    or None. The log is replayed in order, so a created node that took the name of a node it
    replaced (rewrites name a fused node after its anchor) resolves to what that name stood
    for at the time."""
    made_from: dict[str, list[str]] = {}
    for app in log or ():
        srcs: list[str] = []
        for n in getattr(app, "nodes", None) or ():
            for s in made_from.get(n, [n]):
                if s not in srcs:
                    srcs.append(s)
        for c in getattr(app, "created", None) or ():
            made_from[c] = srcs
    out: list[str] = []
    for n in nodes:
        for s in made_from.get(n, [n]):
            if s not in out:
                out.append(s)
    return out


def _check_repeat(repeat: int) -> None:
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an integer >= 1, got {repeat!r}")


def profile_module(mod, arrays, named, repeat: int = 10, warmup: int = 1, show: bool = False) -> Profile:
    """See ``Module.profile``."""
    _check_repeat(repeat)
    inputs = mod._check_inputs(arrays, named)
    from .module import _aligned_output
    outs = [_aligned_output(i.shape, i.dtype) for i in mod.output_info]
    prog = mod._program
    arena = mod._acquire()
    try:
        mod._bind(arena, inputs, outs)
        calls = []
        for c in prog.calls:
            args = (ctypes.c_void_p * max(len(c.slots), 1))(*[arena.table[s] for s in c.slots])
            calls.append((mod._kernel_fn(c.kernel), ctypes.addressof(args), args))
        # one untimed pass that stops at a failed run-time check (an index out of range) as run()
        # does: the kernels after it would read out of bounds
        arena.status[0] = 0
        for fn, addr, _a in calls:
            fn(addr, None)
            if prog.status_slot is not None and arena.status[0]:
                from .module import RunCheckError
                raise RunCheckError(f"{prog.messages[int(arena.status[0]) - 1]}: got {int(arena.status[1])}")
        for _ in range(warmup):
            for fn, addr, _a in calls:
                fn(addr, None)
        times = [[0.0] * repeat for _ in calls]
        clock = time.perf_counter
        for r in range(repeat):
            for k, (fn, addr, _a) in enumerate(calls):
                t0 = clock()
                fn(addr, None)
                times[k][r] = clock() - t0
    finally:
        mod._release(arena)
    med = [statistics.median(t) * 1e3 for t in times]
    return make_profile(mod, med, repeat, warmup, show)


def make_profile(mod, med: list[float], repeat: int, warmup: int, show: bool = False, clock: str = "host") -> Profile:
    """The :class:`Profile` of ``mod``'s kernel calls from their median times in ms (one per
    call, in run order); prints it when ``show``."""
    prog = mod._program
    total = sum(med) or 1.0
    uses: dict[str, int] = {}
    for c in prog.calls:
        uses[c.kernel] = uses.get(c.kernel, 0) + 1
    rows = []
    for i, (c, m) in enumerate(zip(prog.calls, med)):
        moved = sum(prog.slots[s].nbytes for s in set(c.slots))
        gf = c.flops / (m * 1e-3) / 1e9 if c.flops and m > 0 else None
        rows.append(ProfileRow(c.kernel, mod.source_nodes(c), m, m / total, gf, moved, list(c.nodes), list(c.ops),
                               i, uses[c.kernel]))
    rows.sort(key=lambda r: -r.median_ms)
    prof = Profile(rows, repeat, warmup, clock)
    if show:
        print(prof)
    return prof


def time_calls(fn, repeat: int = 20, warmup: int = 2) -> Benchmark:
    """Wall times of ``fn()`` in ms over ``repeat`` calls after ``warmup`` calls: the one timing
    method for tensorfuse and for what it is compared with (onnxruntime in benchmarks/)."""
    _check_repeat(repeat)
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return Benchmark(statistics.median(ts), min(ts), max(ts), repeat)


def benchmark_module(mod, arrays, named, repeat: int = 20, warmup: int = 2) -> Benchmark:
    """See ``Module.benchmark``."""
    inputs = mod._check_inputs(arrays, named)
    return time_calls(lambda: mod.run(*inputs), repeat, warmup)
