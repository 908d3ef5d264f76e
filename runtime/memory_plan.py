"""Static memory plan: every intermediate ("temp" slot) gets an offset in one arena.

1. **Liveness** over the kernel call sequence: a temp lives from the first call that touches it
   (its producer) to the last call that reads it, both inclusive.
2. **In place**: a call may say that an output parameter can share an input parameter's memory
   (``KernelCall.inplace_ok``: elementwise kernels, same shape and dtype, out[i] reads in[i] only).
   Where that input is a temp that dies at this call and the output is a temp, the two become one
   buffer whose lifetime is the union of theirs.
3. **Placement**: buffers sorted by size (largest first, then by birth) are placed one by one
   against the already-placed buffers whose lifetimes overlap theirs; two strategies are tried
   (best fit: the smallest gap that holds the buffer, and first fit: the lowest offset) and the
   smaller arena wins. Offsets are multiples of ``alignment`` (64 bytes: a cache line, and enough
   for any vector load).

``peak_live_bytes`` is the lower bound any placement of these buffers must pay: the largest sum
of the sizes of buffers alive at the same call. ``naive_bytes`` is the sum of all intermediates'
sizes (one allocation each, no reuse and no in-place sharing).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

ALIGNMENT = 64


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass
class PlannedBuffer:
    """One intermediate's place: arena ``offset`` (bytes), ``size`` (bytes), lifetime
    [``first``, ``last``] in call indices, and ``shares`` (the slot whose memory it reuses in
    place, or None)."""

    slot: int
    name: str
    offset: int
    size: int
    first: int
    last: int
    shares: int | None = None


@dataclass
class MemoryPlan:
    """The arena layout of a module's intermediates. ``print(plan)`` shows it as a table."""

    arena_bytes: int
    naive_bytes: int
    peak_live_bytes: int
    alignment: int = ALIGNMENT
    strategy: str = ""
    buffers: list[PlannedBuffer] = field(default_factory=list)

    @property
    def offsets(self) -> dict[int, int]:
        """slot -> arena offset in bytes."""
        return {b.slot: b.offset for b in self.buffers}

    @property
    def num_inplace(self) -> int:
        return sum(b.shares is not None for b in self.buffers)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "MemoryPlan":
        d = dict(d)
        d["buffers"] = [PlannedBuffer(**b) for b in d.get("buffers", [])]
        return MemoryPlan(**d)

    def summary(self) -> str:
        ratio = self.arena_bytes / self.peak_live_bytes if self.peak_live_bytes else 1.0
        return (f"arena {_mib(self.arena_bytes)} ({ratio:.3f} x peak live {_mib(self.peak_live_bytes)}), "
                f"naive {_mib(self.naive_bytes)}, {len(self.buffers)} buffers, {self.num_inplace} in place, "
                f"{self.strategy}")

    def __str__(self) -> str:
        rows = [("slot", "buffer", "offset", "bytes", "live", "in place of")]
        for b in sorted(self.buffers, key=lambda b: (b.first, b.slot)):
            rows.append((str(b.slot), b.name, str(b.offset), str(b.size), f"{b.first}..{b.last}",
                         "" if b.shares is None else str(b.shares)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.rjust(w) if i in (0, 2, 3) else c.ljust(w)
                           for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join([self.summary()] + lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n} B"


def plan_memory(slots, calls, alignment: int = ALIGNMENT) -> MemoryPlan:
    """Plan the arena for the temp slots.

    slots: objects with ``index``, ``name``, ``kind`` ("temp" is planned) and ``nbytes``;
    calls: objects with ``slots`` (the slot of each kernel parameter) and optionally
    ``inplace_ok`` (pairs (input param, output param)). Returns a :class:`MemoryPlan`.
    """
    temps = {s.index: s for s in slots if s.kind == "temp"}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, c in enumerate(calls):
        for s in c.slots:
            if s in temps:
                first.setdefault(s, t)
                last[s] = t
    for s in temps:                       # a temp no call touches still needs a valid address
        first.setdefault(s, 0)
        last.setdefault(s, 0)

    # in-place sharing: union of slots into groups, the group's root owns the memory
    root = {s: s for s in temps}
    shares: dict[int, int] = {}
    shared_by: dict[int, int] = {}

    def find(s: int) -> int:
        while root[s] != s:
            s = root[s]
        return s

    for t, c in enumerate(calls):
        for ip, op in getattr(c, "inplace_ok", None) or ():
            a, b = c.slots[ip], c.slots[op]
            if a == b or a not in temps or b not in temps or b in shares:
                continue
            if last[a] != t or first[b] != t or temps[a].nbytes != temps[b].nbytes:
                continue
            if c.slots.count(a) != 1 or c.slots.count(b) != 1:
                continue
            if a in shared_by:      # one sharer per buffer keeps every group a chain in time
                continue
            root[b] = find(a)
            shares[b] = a
            shared_by[a] = b
    groups: dict[int, list[int]] = {}
    for s in temps:
        groups.setdefault(find(s), []).append(s)
    gsize = {r: max(temps[s].nbytes for s in m) for r, m in groups.items()}
    gfirst = {r: min(first[s] for s in m) for r, m in groups.items()}
    glast = {r: max(last[s] for s in m) for r, m in groups.items()}

    # lower bound: the most bytes alive at one call
    ncalls = max(len(calls), 1)
    delta = [0] * (ncalls + 1)
    for r in groups:
        delta[gfirst[r]] += gsize[r]
        delta[glast[r] + 1] -= gsize[r]
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)

    best = None
    for strategy in ("best-fit", "first-fit"):
        offs, arena = _place(list(groups), gsize, gfirst, glast, alignment, strategy)
        if best is None or arena < best[1]:
            best = (offs, arena, strategy)
    offs, arena, strategy = best
    buffers = [PlannedBuffer(s, temps[s].name, offs[find(s)], temps[s].nbytes, first[s], last[s], shares.get(s))
               for s in sorted(temps)]
    return MemoryPlan(arena_bytes=arena, naive_bytes=sum(s.nbytes for s in temps.values()),
                      peak_live_bytes=peak, alignment=alignment, strategy=strategy, buffers=buffers)


def _place(bufs, size, first, last, alignment, strategy):
    """Greedy by size: each buffer, largest first, goes into a gap between the placed buffers
    that are alive at the same time (the smallest gap that fits, or the lowest one)."""
    order = sorted(bufs, key=lambda b: (-size[b], first[b], b))
    placed: list[tuple[int, int, int]] = []   # (offset, end, buffer)
    offs: dict[int, int] = {}
    arena = 0
    for b in order:
        need = _align(max(size[b], 1), alignment)
        busy = sorted((o, e) for o, e, p in placed if first[p] <= last[b] and first[b] <= last[p])
        choice, choice_gap, cursor = None, None, 0
        for o, e in busy:
            if o >= cursor + need:
                gap = o - cursor
                if strategy == "first-fit":
                    choice = cursor
                    break
                if choice_gap is None or gap < choice_gap:
                    choice, choice_gap = cursor, gap
            cursor = max(cursor, _align(e, alignment))
        if choice is None:
            choice = cursor
        offs[b] = choice
        placed.append((choice, choice + size[b], b))
        arena = max(arena, choice + size[b])
    return offs, _align(arena, alignment) if arena else 0
