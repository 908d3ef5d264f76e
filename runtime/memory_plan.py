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

4. **Aliases**: a slot that only reinterprets another slot's bytes with a new shape (a standalone
   Reshape, Flatten, Squeeze or Unsqueeze of a contiguous value, which lowers to no kernel:
   ``aliases``, slot -> the slot it views; or the intermediate that such a node makes a graph
   output of, which then lives in the output's array) has no bytes of its own: each call that
   touches it touches the slot it views (its *root*, followed through chains of aliases), so
   the root lives until the alias's last use, and the runtime points the alias at the root's memory
   (an arena offset, a constant, or a graph input's or output's array). A graph output is
   never an alias (it comes out as its own array), so an alias never makes two outputs share.
   An alias may view a byte range of its root (``alias_offsets``: slot -> byte offset, summed
   along a chain): the inputs of a Concat that lowers to no kernel (``compiler.lower``
   ``_concat_views``) are views of its output at their offsets, so their producers write
   straight into it. Such a root lives from the first of its views' producers on.

``peak_live_bytes`` is the lower bound any placement of these buffers must pay: the largest sum
of the sizes of buffers alive at the same call. ``naive_bytes`` is the sum of all intermediates'
sizes (one allocation each, no reuse and no in-place sharing; aliases hold no bytes).
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
    #: slot -> the slot whose memory it views (resolved: the root is no alias itself)
    aliases: dict[int, int] = field(default_factory=dict)
    #: alias slot -> the byte offset of its bytes in its root (resolved; absent: 0)
    alias_offsets: dict[int, int] = field(default_factory=dict)

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
        d["aliases"] = {int(k): int(v) for k, v in (d.get("aliases") or {}).items()}   # JSON keys are strings
        d["alias_offsets"] = {int(k): int(v) for k, v in (d.get("alias_offsets") or {}).items()}
        return MemoryPlan(**d)

    def root(self, slot: int) -> int:
        """The slot whose memory ``slot`` uses: itself, or the slot an alias views."""
        return self.aliases.get(slot, slot)

    def summary(self) -> str:
        ratio = self.arena_bytes / self.peak_live_bytes if self.peak_live_bytes else 1.0
        return (f"arena {_mib(self.arena_bytes)} ({ratio:.3f} x peak live {_mib(self.peak_live_bytes)}), "
                f"naive {_mib(self.naive_bytes)}, {len(self.buffers)} buffers, {self.num_inplace} in place, "
                + (f"{len(self.aliases)} aliases, " if self.aliases else "") + self.strategy)

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


def resolve_aliases(aliases, slots=None, offsets=None) -> dict[int, int]:
    """``aliases`` (slot -> the slot it views, possibly another alias) with every chain followed
    to its root. Raises ValueError for a cycle, or (given ``slots``) for an alias that is not a
    temp, or whose bytes (from its offset in the root, ``offsets``: slot -> byte offset in the
    slot it views) do not lie within its root's, or that views a part of a root without an
    offset."""
    out: dict[int, int] = {}
    offsets = offsets or {}
    resolved = resolve_alias_offsets(aliases, offsets) if slots is not None else {}
    for a in aliases or {}:
        r, seen = a, {a}
        while r in aliases:
            r = aliases[r]
            if r in seen:
                raise ValueError(f"memory plan: slot {a} aliases itself through {sorted(seen)}")
            seen.add(r)
        if slots is not None:
            if slots[a].kind != "temp":
                raise ValueError(f"memory plan: slot {a} '{slots[a].name}' is a {slots[a].kind}, only a temp may be an alias")
            off = resolved.get(a, 0)
            part = any(x in offsets for x in seen)
            if (off < 0 or off + slots[a].nbytes > slots[r].nbytes
                    or (not part and slots[a].nbytes != slots[r].nbytes)):
                raise ValueError(f"memory plan: alias slot {a} '{slots[a].name}' has {slots[a].nbytes} bytes at "
                                 f"offset {off}, slot {r} '{slots[r].name}' it views has {slots[r].nbytes}")
        out[a] = r
    return out


def resolve_alias_offsets(aliases, offsets) -> dict[int, int]:
    """alias slot -> the byte offset of its bytes in its root: ``offsets`` (slot -> offset in
    the slot it views directly) summed along the chain of ``aliases``; only the non-zero ones."""
    out: dict[int, int] = {}
    offsets = offsets or {}
    for a in aliases or {}:
        r, off, hops = a, 0, 0
        while r in aliases and hops <= len(aliases):       # (a cycle: resolve_aliases names it)
            off += offsets.get(r, 0)
            r, hops = aliases[r], hops + 1
        if off:
            out[a] = off
    return out


def plan_memory(slots, calls, alignment: int = ALIGNMENT, aliases=None, alias_offsets=None) -> MemoryPlan:
    """Plan the arena for the temp slots.

    slots: objects with ``index``, ``name``, ``kind`` ("temp" is planned) and ``nbytes``;
    calls: objects with ``slots`` (the slot of each kernel parameter) and optionally
    ``inplace_ok`` (pairs (input param, output param)); aliases: temp slot -> the slot whose
    bytes it views (module docstring, 4); alias_offsets: alias slot -> byte offset of its bytes
    in the slot it views (absent: 0). Returns a :class:`MemoryPlan`. Raises ValueError for an
    alias that is not a temp, whose bytes do not lie within its root's, or a cycle of aliases.
    """
    alias = resolve_aliases(aliases or {}, slots, alias_offsets)
    temps = {s.index: s for s in slots if s.kind == "temp" and s.index not in alias}
    calls = [_Viewed(c, alias) for c in calls] if alias else calls
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
                      peak_live_bytes=peak, alignment=alignment, strategy=strategy, buffers=buffers,
                      aliases=alias, alias_offsets=resolve_alias_offsets(aliases or {}, alias_offsets))


class _Viewed:
    """A call as the plan sees it: each alias parameter replaced by the slot it views."""

    def __init__(self, call, alias: dict[int, int]):
        self.kernel = getattr(call, "kernel", "")
        self.slots = [alias.get(s, s) for s in call.slots]
        self.inplace_ok = getattr(call, "inplace_ok", None)
        self.writes = getattr(call, "writes", None)
        self.nodes = getattr(call, "nodes", ())


def viewed_calls(calls, aliases) -> list:
    """``calls`` with every alias parameter replaced by the slot whose memory it views (the
    calls themselves when there are no aliases)."""
    return [_Viewed(c, aliases) for c in calls] if aliases else list(calls)


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


# ----------------------------------------------------------------------------- checking (debug mode)
class MemoryPlanError(RuntimeError):
    """Debug mode found a memory plan that lets a kernel read the wrong bytes: two values alive
    at the same call share arena memory (:func:`check_plan`), or, at run time, a kernel reads a
    value that was never written or whose region another value has overwritten since
    (``Module.run`` with ``check_memory``). The message names the slots, kernels and calls."""


def call_writes(calls) -> list[set[int]]:
    """Per call, the parameters it writes (``CallInfo.writes``; for calls without it, as in
    modules saved before it was recorded, the slots first touched by this call or by an earlier
    call of the same IR nodes)."""
    out: list[set[int]] = []
    owner: dict[int, tuple] = {}         # slot -> nodes of the call that first touched it
    for c in calls:
        w = getattr(c, "writes", None)
        key = tuple(getattr(c, "nodes", ()) or ()) or (id(c),)
        if w is None:
            w = {p for p, s in enumerate(c.slots) if owner.setdefault(s, key) == key}
        for s in c.slots:
            owner.setdefault(s, key)
        out.append(set(w))
    return out


def lifetimes(slots, calls, aliases=None) -> dict[int, tuple[int, int]]:
    """temp slot -> (first, last) call index touching it, from the calls alone (not the plan);
    a call touching an alias (``aliases``: slot -> root) touches its root, and aliases have no
    lifetime of their own."""
    calls = viewed_calls(calls, aliases)
    temps = {s.index for s in slots if s.kind == "temp" and s.index not in (aliases or {})}
    life: dict[int, list[int]] = {}
    for t, c in enumerate(calls):
        for s in c.slots:
            if s in temps:
                life.setdefault(s, [t, t])[1] = t
    return {s: (a, b) for s, (a, b) in life.items()}


def _describe(slots, s: int, plan_buf=None, life=None) -> str:
    d = f"slot {s} '{slots[s].name}'"
    if plan_buf is not None:
        d += f" (arena bytes {plan_buf.offset}..{plan_buf.offset + plan_buf.size}"
        d += f", alive at calls {life[0]}..{life[1]})" if life else ")"
    return d


def check_plan(plan: MemoryPlan, slots, calls) -> None:
    """Check ``plan`` against the calls (the slot table), not against its own lifetimes: every
    temp a call touches has a region inside the arena, and two temps whose regions overlap are
    never alive at the same call, except the one pair a call may run in place
    (``inplace_ok``: the input dies at that call, the output is born there, same region).
    Raises :class:`MemoryPlanError` naming both values and the call. Calls see aliases as the
    slots they view (``plan.aliases``)."""
    aliases = getattr(plan, "aliases", None) or {}
    calls = viewed_calls(calls, aliases)
    life = lifetimes(slots, calls)
    bufs = {b.slot: b for b in plan.buffers}
    for s in sorted(life):
        b = bufs.get(s)
        if b is None:
            raise MemoryPlanError(f"memory plan: {_describe(slots, s)} is read or written by call {life[s][0]} "
                                  f"({calls[life[s][0]].kernel}) but has no place in the arena")
        if b.size < slots[s].nbytes or b.offset < 0 or b.offset + slots[s].nbytes > plan.arena_bytes:
            raise MemoryPlanError(f"memory plan: {_describe(slots, s, b)} does not fit: it needs {slots[s].nbytes} "
                                  f"bytes in an arena of {plan.arena_bytes}")
    order = sorted(life, key=lambda s: bufs[s].offset)
    for i, a in enumerate(order):
        ba = bufs[a]
        end_a = ba.offset + slots[a].nbytes
        for b in order[i + 1:]:
            bb = bufs[b]
            if bb.offset >= end_a:
                break
            if slots[b].nbytes == 0 or slots[a].nbytes == 0:
                continue
            (fa, la), (fb, lb) = life[a], life[b]
            if la < fb or lb < fa:
                continue                      # alive at different times: reuse is fine
            if _in_place(a, b, ba, bb, life, calls, slots) or _in_place(b, a, bb, ba, life, calls, slots):
                continue
            t = max(fa, fb)
            raise MemoryPlanError(
                f"memory plan: {_describe(slots, a, ba, life[a])} and {_describe(slots, b, bb, life[b])} share "
                f"arena memory while both are alive: call {t} ({calls[t].kernel}) would read or write one over "
                f"the other")


def _in_place(a: int, b: int, ba, bb, life, calls, slots) -> bool:
    """b takes over a's memory at the call where a dies and b is born, as that call allows."""
    (fa, la), (fb, lb) = life[a], life[b]
    if la != fb or ba.offset != bb.offset or slots[a].nbytes != slots[b].nbytes:
        return False
    c = calls[la]
    return any(c.slots[i] == a and c.slots[o] == b for i, o in getattr(c, "inplace_ok", None) or ())


def poison(region, dtype) -> None:
    """Fill a region (a uint8 view) with a value no kernel computes by chance: NaN for floating
    dtypes, the byte 0xA5 repeated for integers and booleans."""
    import numpy as np
    dt = np.dtype(dtype)
    if dt.kind in "fc" and region.size % dt.itemsize == 0:
        region.view(dt)[...] = np.nan
    else:
        region[...] = 0xA5
