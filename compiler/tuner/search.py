"""The search over one workload's knob space: exhaustive when small, seeded random plus an
evolutionary step when large.

The space is discovered while searching (knobs are define-by-run, ``ir.knobs``): it starts as
the knobs the default lowering declared, and every candidate the worker resolves
(``compiler.tuner.worker``'s ``resolve``) adds the knobs its lowering declared (a
``"schedule"`` knob choosing another schedule reveals that schedule's knobs). Candidates are
told apart by their *effective* values (what the lowering used: a knob the schedule did not
declare is dropped, a value it does not offer becomes the default), so two requests that lower
to the same code are measured once.

- **exhaustive** while the product of the known candidate counts is at most ``trials`` (at
  most :data:`EXHAUSTIVE_MAX` without a trial count): the
  default first, then every combination in order;
- else **random** (seeded by the tuner's seed and the workload key) until a few candidates
  were measured, then mostly **evolutionary**: a parent drawn from the few fastest measured
  candidates with one knob changed (to a neighbouring value of an ordered numeric knob half
  the time, else to any other value), with random candidates mixed in.

:class:`Search` only proposes and takes results; the tuner resolves, measures and records.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
from typing import Any

from tensorfuse.ir.knobs import _norm

#: measured candidates (at least) before the evolutionary step starts
MIN_RANDOM = 4
#: the fastest candidates that mutations start from
TOP_K = 3
#: the share of proposals that are mutations once it has started
MUTATE_P = 0.75
#: without a trial count (a time budget only), spaces up to this size are searched exhaustively
EXHAUSTIVE_MAX = 64
#: proposals in a row that were all known: the space counts as exhausted
MAX_MISSES = 300


def canonical(knobs: dict) -> str:
    """The canonical text of a knob dict (names sorted, tuples as lists): equal dicts give
    equal text, whatever their order or sequence types."""
    def j(v):
        v = _norm(v)
        return [j(x) for x in v] if isinstance(v, tuple) else v
    return json.dumps({k: j(v) for k, v in sorted(knobs.items())}, sort_keys=True, separators=(",", ":"))


class Search:
    """Proposals for one workload (module docstring).

    ``space``: the default lowering's knobs as JSON (``Knob.to_json``: name, candidates,
    default); ``trials``: the measurements wanted (the default included; None: no limit);
    ``seed``: with ``key`` (the workload key) seeds the random choices."""

    def __init__(self, space: list[dict], trials: int | None, seed: int = 0, key: str = ""):
        self.trials = trials
        h = int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:12], 16)
        self.rng = random.Random(h)
        self.knobs: dict[str, dict] = {}        # name -> {"candidates": [...], "default": v}
        self.add_space(space)
        self.requested: set[str] = set()        # canonical request dicts proposed
        self.effective: dict[str, dict] = {}    # canonical effective values -> {"values", "median", "status"}
        self._enum = None
        self._enum_size = -1
        self.misses = 0
        self.exhausted = False

    # -- the space ---------------------------------------------------------------------
    def add_space(self, space: list[dict]) -> bool:
        """Merge knobs declared by a lowering; True when something new was learnt."""
        new = False
        for k in space or ():
            name = k["name"]
            cands = [_norm(c) for c in k["candidates"]]
            cur = self.knobs.get(name)
            if cur is None:
                self.knobs[name] = {"candidates": cands, "default": _norm(k.get("default"))}
                new = True
            else:
                for c in cands:
                    if c not in cur["candidates"]:
                        cur["candidates"].append(c)
                        new = True
        return new

    @property
    def size(self) -> int:
        """The product of the known knobs' candidate counts (1 for no knobs)."""
        n = 1
        for k in self.knobs.values():
            n *= max(1, len(k["candidates"]))
        return n

    @property
    def measured(self) -> int:
        return len(self.effective)

    def done(self) -> bool:
        return self.exhausted or (self.trials is not None and self.measured >= self.trials)

    # -- results -----------------------------------------------------------------------
    def seen_request(self, knobs: dict) -> bool:
        return canonical(knobs) in self.requested

    def note_request(self, knobs: dict) -> None:
        self.requested.add(canonical(knobs))

    def known(self, values: dict) -> bool:
        """Whether a candidate with these effective values was measured (or is being)."""
        return canonical(values) in self.effective

    def tell(self, values: dict, status: str, median_ms: float | None = None) -> None:
        """A measured candidate: its effective ``values``, ``status`` and median (ms, when ok)."""
        self.effective[canonical(values)] = {"values": {k: _norm(v) for k, v in values.items()},
                                             "status": status, "median": median_ms}
        self.requested.add(canonical(values))

    def best(self, k: int = 1) -> list[dict]:
        """The ``k`` fastest ok candidates' effective values, fastest first."""
        ok = [e for e in self.effective.values() if e["status"] == "ok" and e["median"] is not None]
        ok.sort(key=lambda e: e["median"])
        return [e["values"] for e in ok[:k]]

    # -- proposals ---------------------------------------------------------------------
    def propose(self, n: int = 1) -> list[dict]:
        """Up to ``n`` new knob dicts to resolve and measure (fewer when the space ran out;
        ``exhausted`` is then set). Each is remembered as requested."""
        out: list[dict] = []
        while len(out) < n and not self.exhausted:
            c = self._next()
            if c is None:
                self.exhausted = True
                break
            key = canonical(c)
            if key in self.requested or key in self.effective:
                self.misses += 1
                if self.misses > MAX_MISSES:
                    self.exhausted = True
                continue
            self.misses = 0
            self.requested.add(key)
            out.append(c)
        return out

    def _next(self) -> dict | None:
        if self.size <= (self.trials if self.trials is not None else EXHAUSTIVE_MAX):
            return self._next_exhaustive()
        if self.measured >= MIN_RANDOM and self.best(1) and self.rng.random() < MUTATE_P:
            return self._mutate()
        return self._random()

    def _next_exhaustive(self) -> dict | None:
        """The next combination in order (the order restarts, skipping what was proposed, when
        the space grew)."""
        if self._enum is None or self._enum_size != self.size:
            names = list(self.knobs)
            # each knob's default first, so the enumeration starts at the default
            lists = [[self.knobs[k]["default"]] + [c for c in self.knobs[k]["candidates"] if c != self.knobs[k]["default"]]
                     for k in names]
            self._enum = ({n: v for n, v in zip(names, combo)} for combo in itertools.product(*lists))
            self._enum_size = self.size
        for c in self._enum:
            if canonical(c) not in self.requested and canonical(c) not in self.effective:
                return c
        return None

    def _random(self) -> dict:
        return {name: self.rng.choice(k["candidates"]) for name, k in self.knobs.items()}

    def _mutate(self) -> dict:
        parents = self.best(TOP_K)
        parent = dict(parents[min(int(self.rng.expovariate(1.0)), len(parents) - 1)])
        names = [n for n in parent if n in self.knobs and len(self.knobs[n]["candidates"]) > 1]
        if not names:
            return self._random()
        name = self.rng.choice(names)
        cands = self.knobs[name]["candidates"]
        cur = parent[name]
        others = [c for c in cands if c != cur]
        value: Any = self.rng.choice(others)
        numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in cands)
        if numeric and cur in cands and self.rng.random() < 0.5:
            order = sorted(cands)
            i = order.index(cur)
            near = [order[j] for j in (i - 1, i + 1) if 0 <= j < len(order)]
            value = self.rng.choice(near)
        parent[name] = value
        return parent
