"""Tuning records: what ``tensorfuse tune`` measured, one JSON line per trial, and their use at
compile time (``compile(..., tuning="RECORDS.jsonl")``, ``--tuning`` on the command line).

A record (:class:`Record`) is one line of a JSON-lines file::

    {"workload": "conv-1a2b3c4d5e6f7a8b", "summary": "Conv [1,64,56,56] ... -> [1,64,56,56]",
     "schedule": "llvm.conv2d_blocked", "knobs": {"tile_cols": 6}, "status": "ok", "error": null,
     "median_ms": 0.412, "spread_ms": 0.006, "runs": 30, "default_ms": 0.455, "threads": 2,
     "target": {"target": "llvm", "kind": "llvm", "cpu": "znver3", "features": [...]},
     "version": "0.1.0", "time": "2025-01-31T12:00:00Z"}

``workload`` is ``ir.knobs.workload_key`` of the node, ``knobs`` the values the trial fixed
(knob name -> JSON value; a tuple is written as a list), ``status`` one of :data:`STATUSES`
("ok": measured and its outputs matched the default schedule's; "failed" / "wrong" (outputs
differ) / "timeout" / "crash" / "error": not usable, ``error`` says why), ``median_ms`` and
``spread_ms`` (the interquartile range) in milliseconds over ``runs`` timed runs,
``default_ms`` the median of the default knobs measured in the same session, ``threads`` the
thread count measured at, ``target`` ``ir.knobs.target_identity`` of the target measured on,
``version`` the tensorfuse version and ``time`` when it was measured (ISO-8601 UTC). The tuner
adds ``vs_default`` (the median ratio of the candidate's samples to the default knobs' samples
taken alternately beside them), ``stage`` ("search": exploration, "confirm": a best candidate
measured again with about twice the samples; a record without it is a search record) and, in
confirm records, ``min_gain`` (the gain a confirmation had to show).

:func:`append_record` appends one line and syncs it to disk, so an interrupted tuner loses at
most the trial it was measuring; :func:`read_records` reads a file back (a corrupt line is a
ValueError naming the file and line). :class:`TuningRecords` picks, per workload, the best
usable record for one target: status "ok", the same target identity (for llvm: the CPU name
and its features) and the same tensorfuse version; the others are kept in ``ignored`` with the
reason, which ``tensorfuse explain --tuning`` prints. A workload with confirm records takes only
a confirmed setting, or keeps its default knobs (:func:`choose_confirmed`).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

#: the statuses of a record; only "ok" records are used when compiling
STATUSES = ("ok", "failed", "wrong", "timeout", "crash", "error")


def tensorfuse_version() -> str:
    from tensorfuse import __version__
    return __version__


def utc_now() -> str:
    """The current time as ISO-8601 UTC to the second, e.g. ``"2025-01-31T12:00:00Z"``."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _knob_value(v: Any) -> Any:
    from tensorfuse.ir.knobs import _norm
    return _norm(v)


def _json_value(v: Any) -> Any:
    return [_json_value(x) for x in v] if isinstance(v, tuple) else v


@dataclass
class Record:
    """One tuning trial (see the module docstring for each field). ``knobs`` values are in
    ``ir.knobs`` canonical form (tuples, not lists); ``extra`` keeps fields this version does
    not know, written back unchanged."""

    workload: str
    knobs: dict = field(default_factory=dict)
    status: str = "ok"
    summary: str = ""
    schedule: str = ""
    error: str | None = None
    median_ms: float | None = None
    spread_ms: float | None = None
    runs: int = 0
    default_ms: float | None = None
    threads: int = 1
    target: dict = field(default_factory=dict)
    version: str = ""
    time: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.workload, str) or not self.workload:
            raise ValueError(f"a record's workload must be a non-empty string, got {self.workload!r}")
        if not isinstance(self.knobs, dict):
            raise ValueError(f"a record's knobs must be an object {{name: value}}, got {self.knobs!r}")
        try:
            self.knobs = {str(k): _knob_value(v) for k, v in self.knobs.items()}
        except TypeError as e:
            raise ValueError(f"a record's knob values must be JSON scalars or lists of them: {e}") from None
        if self.status not in STATUSES:
            raise ValueError(f"a record's status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        for name in ("median_ms", "spread_ms", "default_ms"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"a record's {name} must be a number or null, got {v!r}")
                setattr(self, name, float(v))
        if self.status == "ok" and self.median_ms is None:
            raise ValueError("a record with status 'ok' needs median_ms")
        for name in ("runs", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"a record's {name} must be an integer, got {v!r}")
        if not isinstance(self.target, dict):
            raise ValueError(f"a record's target must be an object (ir.knobs.target_identity), got {self.target!r}")

    @classmethod
    def create(cls, workload: str, knobs: dict, status: str, *, target, summary: str = "", schedule: str = "",
               error: str | None = None, median_ms: float | None = None, spread_ms: float | None = None,
               runs: int = 0, default_ms: float | None = None, threads: int = 1) -> "Record":
        """A record of a trial measured now, on ``target`` (an ``ir.target.Target`` or
        target string; its ``ir.knobs.target_identity`` is stored) by this tensorfuse version."""
        from tensorfuse.ir.target import Target
        from tensorfuse.ir.knobs import target_identity
        return cls(workload, dict(knobs), status, summary, schedule, error, median_ms, spread_ms, runs,
                   default_ms, threads, target_identity(Target.parse(target)), tensorfuse_version(), utc_now())

    def to_json(self) -> dict:
        """The record as a JSON object (knob tuples as lists; ``extra`` fields merged in)."""
        d = {name: getattr(self, name) for name in _ORDER}
        d["knobs"] = {k: _json_value(v) for k, v in self.knobs.items()}
        return {**d, **{k: v for k, v in self.extra.items() if k not in d}}

    def to_line(self) -> str:
        """One line of a records file, without the newline."""
        return json.dumps(self.to_json(), sort_keys=False, separators=(", ", ": "))

    @classmethod
    def from_json(cls, obj: Any) -> "Record":
        """The record of a JSON object. Raises ValueError for a missing ``workload``, a field of
        the wrong type or an unknown status; unknown fields go to ``extra``."""
        if not isinstance(obj, dict):
            raise ValueError(f"a record must be a JSON object, got {type(obj).__name__}")
        if "workload" not in obj:
            raise ValueError("a record needs a 'workload' field")
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in obj.items() if k in names}
        extra = {k: v for k, v in obj.items() if k not in names}
        for k in ("runs", "threads"):      # 30.0 from another writer is 30
            if isinstance(known.get(k), float) and known[k].is_integer():
                known[k] = int(known[k])
        return cls(**known, extra=extra)

    @property
    def usable(self) -> bool:
        return self.status == "ok" and self.median_ms is not None

    def describe_knobs(self) -> str:
        """``name=value`` pairs, e.g. ``"tile_cols=6 tile_rows=2"`` (or ``"(default knobs)"``)."""
        return " ".join(f"{k}={_show(v)}" for k, v in self.knobs.items()) or "(default knobs)"


#: the fields of a record's line, in the order written
_ORDER = ("workload", "summary", "schedule", "knobs", "status", "error", "median_ms", "spread_ms", "runs",
          "default_ms", "threads", "target", "version", "time")


def _show(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join(_show(x) for x in v) + ")"
    return str(v)


# ----------------------------------------------------------------------------- files
def append_record(path: str | os.PathLike, record: Record) -> None:
    """Append ``record`` as one line to the JSON-lines file ``path`` (created when missing),
    then flush and fsync, so a record written is on disk before the next trial starts. When the
    file's last line lacks its newline (a writer killed mid-line), the record starts a new line.
    Raises OSError when the file cannot be written."""
    line = record.to_line() + "\n"
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def read_records(path: str | os.PathLike, errors: str = "raise") -> list[Record]:
    """The records of the JSON-lines file ``path``, in file order (blank lines skipped).

    A line that is not a record raises ValueError ``"RECORDS.jsonl line 3: ..."`` naming the
    file and line (``errors="raise"``), or is skipped (``errors="skip"``: a tuner resuming after
    a crash). Raises FileNotFoundError (``"tuning records file not found: ..."``) and OSError."""
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"tuning records file not found: {p}") from None
    out = []
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            out.append(Record.from_json(json.loads(raw.decode("utf-8"))))
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            if errors == "skip":
                continue
            what = "not valid JSON" if isinstance(e, json.JSONDecodeError) else "not a tuning record"
            hint = " (the last line, cut short: was the writer interrupted?)" if i == len(lines) else ""
            raise ValueError(f"{p} line {i}: {what}{hint}: {e}") from None
    return out


# ----------------------------------------------------------------------------- matching
def _features_diff(rec: list, cur: list, limit: int = 6) -> str:
    extra = sorted(set(rec) - set(cur))
    missing = sorted(set(cur) - set(rec))
    parts = [f"+{x}" for x in extra[:limit]] + (["..."] if len(extra) > limit else [])
    parts += [f"-{x}" for x in missing[:limit]] + (["..."] if len(missing) > limit else [])
    return " ".join(parts)


def target_mismatch(recorded: dict, current: dict) -> str | None:
    """Why a record measured on the target ``recorded`` (``ir.knobs.target_identity``) does
    not apply to ``current``, or None when it does. For CPU targets the CPU name and the
    feature set decide ("llvm" on a znver3 host and "llvm -mcpu=znver3" are the same); for
    others the target string does."""
    if not recorded:
        return "the record names no target"
    rk, ck = recorded.get("kind"), current.get("kind")
    if rk != ck:
        return f"target {rk or recorded.get('target')} vs {ck}"
    if "cpu" in current or "cpu" in recorded:
        rc, cc = recorded.get("cpu"), current.get("cpu")
        rf, cf = sorted(recorded.get("features") or []), sorted(current.get("features") or [])
        if rc != cc or rf != cf:
            diff = _features_diff(rf, cf)
            feats = f" with features {diff} (+: only it has, -: only this one has)" if diff else " with the same features"
            return f"recorded for CPU {rc}{feats}, this target is {cc}"
        return None
    if recorded.get("target") != current.get("target"):
        return f"recorded for target {recorded.get('target')!r}, this target is {current.get('target')!r}"
    return None


def _as_records(src) -> list[Record]:
    if isinstance(src, TuningRecords):
        return list(src.records)
    if isinstance(src, Record):
        return [src]
    if isinstance(src, (str, os.PathLike)):
        return read_records(src)
    if isinstance(src, dict):
        return [Record.from_json(src)]
    try:
        items = list(src)
    except TypeError:
        raise TypeError(f"tuning must be a records file path, a list of paths or records, or TuningRecords; "
                        f"got {type(src).__name__}") from None
    out = []
    for it in items:
        out.extend(_as_records(it))
    return out


#: the least gain a candidate's confirmation must show, ``1 - vs_default``, when its confirm
#: record does not store the tuner's ``min_gain`` (``tensorfuse tune --min-gain``)
DEFAULT_MIN_GAIN = 0.03
#: why a workload with confirm records keeps its default knobs (``TuningRecords.defaulted``)
NOT_CONFIRMED = "no candidate confirmed faster than the default"


def record_stage(r: Record) -> str:
    """``"confirm"`` for a record of the tuner's confirmation stage (field ``"stage"``),
    ``"model"`` for a verdict of its model check (:data:`MODEL_REJECTED`), else ``"search"``
    (records written before that field existed are search records)."""
    stage = r.extra.get("stage")
    return stage if stage in ("confirm", "model") else "search"


#: the reason (prefix) of a workload whose chosen setting the tuner's model check found slower in
#: the whole model than the default knobs: its ``"model"`` record holds that setting
MODEL_REJECTED = "slower in the whole model than the default knobs (the tuner's model check)"


def knobs_text(knobs: dict) -> str:
    """The canonical text of a knob dict (names sorted, tuples as lists): equal settings give
    equal text."""
    return json.dumps({k: _json_value(v) for k, v in sorted(knobs.items())}, sort_keys=True, separators=(",", ":"))


def _vs_default(r: Record) -> float | None:
    vs = r.extra.get("vs_default")
    if isinstance(vs, (int, float)) and not isinstance(vs, bool) and vs > 0:
        return float(vs)
    return None


def _min_gain(r: Record) -> float:
    g = r.extra.get("min_gain")
    if isinstance(g, (int, float)) and not isinstance(g, bool) and -1 < g < 1:
        return float(g)
    return DEFAULT_MIN_GAIN


def choose_confirmed(confirms: Iterable[Record]) -> tuple[Record | None, str]:
    """The knob setting chosen from one workload's confirm records (usable or not):
    ``(record, "")`` or ``(None, reason)``.

    A setting's ratio is the worst (largest) ``vs_default`` of its confirm records; it counts
    as confirmed when every one of them is usable, has a ``vs_default``, and that worst ratio is
    below ``1 - min_gain`` (the largest ``min_gain`` its records store, else
    :data:`DEFAULT_MIN_GAIN`). The confirmed setting with the lowest worst ratio is chosen (ties:
    the first in file order); the record returned is its worst confirm record. Without a
    confirmed setting the reason starts with :data:`NOT_CONFIRMED`."""
    by_setting: dict[str, list[Record]] = {}
    for r in confirms:
        by_setting.setdefault(knobs_text(r.knobs), []).append(r)
    best: tuple[float, Record] | None = None
    closest: tuple[float, float] | None = None      # (worst ratio, its threshold) of the best unconfirmed
    n_failed = 0
    for recs in by_setting.values():
        if any(not r.usable or _vs_default(r) is None for r in recs):
            n_failed += 1
            continue
        worst = max(recs, key=lambda r: _vs_default(r))
        ratio = _vs_default(worst)
        limit = 1.0 - max(_min_gain(r) for r in recs)
        if ratio < limit:
            if best is None or ratio < best[0]:
                best = (ratio, worst)
        elif closest is None or ratio < closest[0]:
            closest = (ratio, limit)
    if best is not None:
        return best[1], ""
    detail = []
    if closest is not None:
        detail.append(f"best worst-case ratio to the default {closest[0]:.3f}, needed < {closest[1]:.3f}")
    if n_failed:
        detail.append(f"{n_failed} confirmation{'s' if n_failed != 1 else ''} failed")
    return None, NOT_CONFIRMED + (f" ({'; '.join(detail)})" if detail else "")


def _rank(r: Record) -> tuple:
    """The order of one workload's usable records, best first: by the tuner's ``vs_default``
    (``extra``; see :class:`TuningRecords`) where a record has it, else by ``median_ms``."""
    vs = r.extra.get("vs_default")
    if isinstance(vs, (int, float)) and not isinstance(vs, bool) and vs > 0:
        return (0, float(vs), r.median_ms)
    return (1, r.median_ms, 0.0)


class TuningRecords:
    """Tuning records for one target: per workload the best usable record.

    ``paths_or_records``: a records file path, a :class:`Record`, a TuningRecords, or a list of
    any of these (read in order). ``target``: the ``ir.target.Target`` (or string)
    compiled for (default: the host, "llvm"). ``version``: the tensorfuse version records must
    have (default: this one). ``threads``: the thread count the module will run with; only
    records measured at that count are used, the others are in ``ignored`` with the reason
    (knob values such as ``min_parallel_tasks`` or a split that wins at one count can lose at
    another). None: records of any count (the best of all).

    A record is usable when its status is "ok", its target identity matches
    (:func:`target_mismatch`) and its version is ``version``. The best of a workload has the
    lowest ``vs_default`` where its records have one (written by ``tensorfuse tune``: the
    median ratio of the candidate's times to the default knobs' times taken beside them, so a
    drift of the machine's speed between candidates does not pick a lucky one), else the
    lowest ``median_ms`` (ties: the first in file order). Records that are not usable for
    another reason than their status are in ``ignored`` as ``(record, reason)``; records of
    failed trials are counted in ``n_failed``.

    **Confirmations.** ``tensorfuse tune`` measures its best few candidates of a workload again
    (records with ``"stage": "confirm"``, :func:`record_stage`). For a workload that has confirm
    records (among those at ``threads``), only confirmed settings can be chosen (:func:`choose_confirmed`: the worst of
    a setting's confirm ratios must be below ``1 - min_gain``); when none is, the workload keeps
    its default knobs and ``defaulted`` maps its key to the reason (starting with
    :data:`NOT_CONFIRMED`). A setting that a ``"model"`` record of the workload names (the
    tuner's model check found the model slower with it) is not used either: the reason starts
    with :data:`MODEL_REJECTED`. A workload with search records only is chosen from them as before:
    such a choice is provisional (``provisional`` holds those keys).

    ``knobs_for(key)`` gives the best record's knobs (what ``compiler.lower.lower_graph`` asks
    per workload; None for a workload without records or one in ``defaulted``); ``used`` maps
    each key asked and found to its record. Raises
    FileNotFoundError / ValueError (a corrupt file, see :func:`read_records`) / TypeError.
    """

    def __init__(self, paths_or_records, target=None, version: str | None = None, threads: int | None = None):
        from tensorfuse.ir.target import Target
        from tensorfuse.ir.knobs import target_identity
        self.records: list[Record] = _as_records(paths_or_records if paths_or_records is not None else [])
        self.target = Target.parse(target if target is not None else "llvm")
        self.identity = target_identity(self.target)
        self.version = version if version is not None else tensorfuse_version()
        self.threads = threads
        self.ignored: list[tuple[Record, str]] = []
        self.n_failed = 0
        self.used: dict[str, Record] = {}
        by_key: dict[str, list[Record]] = {}
        failed_confirms: dict[str, list[Record]] = {}
        vetoes: dict[str, list[Record]] = {}
        for r in self.records:
            if not r.usable:
                self.n_failed += 1
                if record_stage(r) == "confirm" and target_mismatch(r.target, self.identity) is None \
                        and r.version == self.version and (threads is None or r.threads == threads):
                    failed_confirms.setdefault(r.workload, []).append(r)     # that setting is not confirmed
                continue
            why = target_mismatch(r.target, self.identity)
            if why is None and r.version != self.version:
                why = f"recorded by tensorfuse {r.version or '(unknown)'}, this is {self.version}"
            if why is None and threads is not None and r.threads != threads:
                why = (f"measured with {r.threads} thread{'s' if r.threads != 1 else ''}; this module runs "
                       f"{threads} (a parallel schedule's best split depends on the count)")
            if why is not None:
                self.ignored.append((r, why))
                continue
            if record_stage(r) == "model":
                vetoes.setdefault(r.workload, []).append(r)
                continue
            by_key.setdefault(r.workload, []).append(r)
        #: workload key -> the best usable record
        self.best: dict[str, Record] = {}
        #: workload key -> why its default knobs are kept although it has usable records
        self.defaulted: dict[str, str] = {}
        #: keys whose best record was chosen from search records only (no confirmation)
        self.provisional: set[str] = set()
        for key, recs in by_key.items():
            confirms = [r for r in recs if record_stage(r) == "confirm"] + failed_confirms.get(key, [])
            if confirms:
                rec, why = choose_confirmed(confirms)
                if rec is None:
                    self.defaulted[key] = why
                else:
                    self.best[key] = rec
            else:
                self.best[key] = min(recs, key=_rank)
                self.provisional.add(key)
            chosen = self.best.get(key)
            veto = next((v for v in vetoes.get(key, []) if chosen is not None
                         and knobs_text(v.knobs) == knobs_text(chosen.knobs)), None)
            if veto is not None:        # the model check measured this setting slower in the model
                del self.best[key]
                self.provisional.discard(key)
                self.defaulted[key] = MODEL_REJECTED + (f": {veto.extra['note']}" if veto.extra.get("note") else "")

    def for_target(self, target, threads: int | None = None) -> "TuningRecords":
        """These records chosen again for another target (and thread count)."""
        return TuningRecords(self.records, target, self.version, threads)

    def knobs_for(self, workload_key: str) -> dict | None:
        """The knob values of the best usable record of ``workload_key``, or None (no usable
        record, or no candidate confirmed faster than the default: ``defaulted``)."""
        r = self.best.get(workload_key)
        if r is None:
            return None
        self.used[workload_key] = r
        return dict(r.knobs)

    def digest(self) -> str:
        """SHA-256 (hex) of the usable best records' workload keys and knobs: what compiled code
        can depend on (the compile cache key's tuning part). Equal for two record sets that
        choose the same knobs, whatever else they hold."""
        chosen = {k: {n: _json_value(v) for n, v in sorted(r.knobs.items())} for k, r in sorted(self.best.items())}
        return hashlib.sha256(json.dumps(chosen, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.best)

    def __repr__(self) -> str:
        return (f"TuningRecords({len(self.records)} records, {len(self.best)} workloads usable, "
                f"{len(self.ignored)} ignored, {self.n_failed} failed trials, target {self.target})")

    def audit(self, workloads: dict) -> list[tuple[Record, str]]:
        """Why usable best records did not (fully) apply to a lowered graph's ``workloads``
        (``LoweredGraph.workloads``): ``(record, reason)`` for a workload not in this model, a
        knob its schedule no longer declares, or a value no longer among the candidates (the
        default was used)."""
        out = []
        for key, r in self.best.items():
            wl = workloads.get(key)
            if wl is None:
                out.append((r, "a workload not in this model"))
                continue
            space = {k.name: k for k in wl.space}
            for name, v in r.knobs.items():
                k = space.get(name)
                if k is None:
                    out.append((r, f"knob {name} is not declared by this workload's schedule ({wl.schedule})"))
                elif v not in k.candidates:
                    out.append((r, f"knob {name}={_show(v)} is no longer among the candidates "
                                   f"({', '.join(_show(c) for c in k.candidates)}); the default "
                                   f"{_show(k.default)} was used"))
        return out


def as_tuning(tuning, target, threads: int | None = None) -> TuningRecords | None:
    """``compile``'s ``tuning=`` argument as :class:`TuningRecords` for ``target``: None stays
    None; a path, list or TuningRecords is (re)chosen for ``target`` and ``threads``."""
    if tuning is None:
        return None
    if isinstance(tuning, TuningRecords):
        return tuning.for_target(target, threads)
    return TuningRecords(tuning, target, threads=threads)
