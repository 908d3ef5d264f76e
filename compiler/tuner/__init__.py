"""``tensorfuse.tune``: measure candidate knob settings per workload and append the results to a
tuning-records file (``compiler.tuning``), which ``compile(..., tuning=RECORDS)`` then uses.

What it does, for a model:

1. **Workloads** (``compiler.tuner.workloads``): the model is compiled with the default knobs
   (same opt level and input shapes as the compile that will use the records) and profiled
   once; each distinct workload (``ir.knobs.workload_key``) is weighted by the summed time of
   its kernel calls (time per call times the layers that share it) and tuned heaviest first.
   A workload whose knobs offer no choice is skipped.
2. **Candidates** (``compiler.tuner.search``): exhaustive when the space has at most
   ``trials`` points, else seeded random candidates and then mutations of the fastest few. The
   space is discovered as candidates are lowered (a ``"schedule"`` choice reveals the other
   schedule's knobs); candidates are told apart by the knob values their lowering really
   used, so nothing is measured twice, in one run or across runs.
3. **Measurement** (``compiler.tuner.worker``, ``compiler.tuner.local``): each workload is
   extracted into a graph of its own node and each candidate is lowered, compiled and run in a
   child process with a timeout (``timeout`` seconds). A candidate that crashes the process or
   hangs (``"crash"``, ``"timeout"``; the child is restarted), raises (``"error"``) or whose
   outputs differ from the default knobs' beyond the tolerance (``"wrong"``) is recorded as
   failed and the tuner goes on. Times are the median (and interquartile range) of repeated
   runs after warm-up, with a pause before each candidate so the machine settles, at
   ``num_threads`` threads (the count the module will run with); a candidate takes turns
   with the default knobs' module sample by sample, and the median ratio of its samples to
   the default's beside them (``vs_default`` in its record) is what candidates are compared by.
4. **Confirmation**: after a workload's search, its best (up to :data:`CONFIRM_N`) distinct
   settings with ``vs_default < 1 - min_gain`` are measured again beside the default with
   :data:`CONFIRM_SAMPLES` times the samples, each appended as a record with ``"stage":
   "confirm"`` and the ``min_gain`` (search records have ``"stage": "search"``). Under a time
   budget the search stops at ``1 - CONFIRM_SHARE`` of the workload's time and confirmations
   use the rest (the first is measured even when that is spent). When no candidate qualifies, a
   confirm record of the default knobs (``vs_default`` 1, ``runs`` 0, not measured) says so.
   ``compiler.tuning.TuningRecords`` then takes only a confirmed setting for a workload with
   confirm records (the worst of its confirm ratios below ``1 - min_gain``), else the defaults.
5. **Records**: one JSON line per candidate, appended as it is measured
   (``compiler.tuning.append_record``). An interrupted run resumes: records in the file for
   this target (CPU and features), tensorfuse version and thread count count as measured, and
   ``trials`` is the total per workload, those included; a workload whose search is complete
   but whose confirmations are missing gets only those.
6. **Executors** (``compiler.tuner.executors``): ``"local"`` (a child process of this one) or
   ``"ray"`` (Ray tasks, one measurement per node at a time; ``pip install "tensorfuse[ray]"``;
   see that module for declaring the nodes' resource).

Extra schedules (and the tests' faulty one) are loaded from ``$TENSORFUSE_TUNE_PLUGINS``
(``compiler.tuner.worker.PLUGINS_ENV``): module names or ``.py`` paths, separated by commas,
imported by the tuner and by every worker (``compiler.tuner.plugins``).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from .search import MAX_MISSES, Search, canonical
from .local import WorkerLost
from .plugins import PLUGINS_ENV, load_plugins

__all__ = ["tune", "TuneResult", "WorkloadResult", "PLUGINS_ENV", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S"]

#: candidates per workload when neither ``trials`` nor ``time_budget`` is given
DEFAULT_TRIALS = 32
#: seconds a candidate may take to lower, compile, check and time before it counts as hung
DEFAULT_TIMEOUT_S = 60.0
#: the least time a workload gets under a time budget (its share of the budget by weight may be less)
MIN_WORKLOAD_S = 5.0
#: distinct settings per workload measured again after its search (the confirmation stage)
CONFIRM_N = 3
#: a confirmation takes this many times the search's samples (``repeat`` and the time cap)
CONFIRM_SAMPLES = 2
#: the share of a workload's time (under a time budget) kept for its confirmations
CONFIRM_SHARE = 0.2
#: the comparison with the default knobs' outputs: |got - want| <= ATOL + RTOL * max|want|
RTOL, ATOL = 2e-3, 1e-5


@dataclass
class WorkloadResult:
    """What tuning did for one workload: ``key``, ``summary``, ``count`` (layers sharing it),
    ``weight_ms`` and ``share`` (of the profiled model time), ``space_size`` (points of the
    default lowering's space), ``status`` ("tuned"; "no knobs": nothing to choose; "not
    reached": the time budget ran out before it; "default failed: ..."), ``measured`` and
    ``failed`` (candidates this run), ``known`` (candidates in the records, this run's
    included), ``default_ms`` (the default knobs' median, ms) and ``best_ms`` (the fastest
    ok candidate's time: ``default_ms`` times its ratio to the default timed beside it,
    ``vs_default`` in its record; after confirmation the chosen setting's worst confirm ratio
    times ``default_ms``), ``best_knobs`` and ``best_schedule`` (that candidate's),
    ``confirmed`` (confirmations measured this run), ``seconds`` spent. ``status`` is "default
    kept: ..." when the workload has confirm records and none confirmed a gain."""

    key: str
    summary: str
    count: int = 1
    weight_ms: float = 0.0
    share: float = 0.0
    space_size: int = 1
    status: str = "tuned"
    measured: int = 0
    failed: int = 0
    known: int = 0
    default_ms: float | None = None
    best_ms: float | None = None
    best_knobs: dict = field(default_factory=dict)
    best_schedule: str = ""
    confirmed: int = 0
    seconds: float = 0.0

    @property
    def speedup(self) -> float | None:
        """default_ms / best_ms, or None before both are known."""
        if self.default_ms and self.best_ms:
            return self.default_ms / self.best_ms
        return None


@dataclass
class TuneResult:
    """The outcome of :func:`tune`: ``records`` (the file), ``target``, ``threads``,
    ``executor``, ``workloads`` (:class:`WorkloadResult`, heaviest first), ``measured`` and
    ``failed`` (search candidates this run), ``confirmed`` (confirmations this run), ``seconds``, ``weights_from`` ("profile", "flops" or
    "count": how workloads were weighed), ``weight_bytes`` (the model's, bytes) and
    ``flush_bytes`` (the cache flush before each timed run, bytes; 0: none), ``model_check``
    (``model_check.ModelCheck``, None when not run). ``str()`` is a table."""

    records: str
    target: str
    threads: int
    executor: str
    workloads: list = field(default_factory=list)
    measured: int = 0
    failed: int = 0
    confirmed: int = 0
    seconds: float = 0.0
    weights_from: str = "profile"
    flush_bytes: int = 0
    weight_bytes: int = 0
    model_check: object = None

    @property
    def estimated_speedup(self) -> float | None:
        """The model's speed-up if only the tuned workloads' times change: sum of weights over
        the sum of weight / speed-up (workloads without knobs count at 1x)."""
        num = den = 0.0
        for w in self.workloads:
            if w.weight_ms <= 0:
                continue
            num += w.weight_ms
            den += w.weight_ms / (w.speedup or 1.0)
        return num / den if den > 0 else None

    def __str__(self) -> str:
        from tensorfuse.compiler.tuning import _show
        lines = [f"tuned {sum(1 for w in self.workloads if w.status == 'tuned')} of {len(self.workloads)} workloads "
                 f"({sum(1 for w in self.workloads if w.status == 'no knobs')} without knobs) for {self.target} at "
                 f"{self.threads} thread{'s' if self.threads != 1 else ''} ({self.executor}): "
                 f"{self.measured} candidates measured, {self.failed} failed, {self.confirmed} confirmations, "
                 f"{self.seconds:.1f} s; "
                 f"records in {self.records}"]
        if self.model_check is not None:
            lines.append(str(self.model_check))
        mb = self.weight_bytes / 2 ** 20
        lines.append(f"weights {mb:.1f} MiB: " + (f"timed with cold caches (each run after a {self.flush_bytes >> 20} MiB "
                                                  f"flush)" if self.flush_bytes else "timed with warm caches"))
        est = self.estimated_speedup
        if est is not None:
            lines.append(f"estimated model speed-up from the per-workload times: {est:.3f}x "
                         f"(weights from the {self.weights_from})")
        head = ("workload", "share", "space", "tried", "default ms", "best ms", "speed-up", "best knobs / status")
        rows = []
        for w in self.workloads:
            if w.status == "no knobs":
                continue
            knobs = " ".join(f"{k}={_show(v)}" for k, v in w.best_knobs.items()) if w.status == "tuned" else w.status
            rows.append((w.summary if len(w.summary) <= 60 else w.summary[:57] + "...", f"{100 * w.share:.1f}%",
                         str(w.space_size), str(w.known), "" if w.default_ms is None else f"{w.default_ms:.4f}",
                         "" if w.best_ms is None else f"{w.best_ms:.4f}",
                         "" if w.speedup is None else f"{w.speedup:.3f}x", knobs))
        if rows:
            wid = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
            fmt = lambda r: "  ".join(c.ljust(wid[i]) if i in (0, 7) else c.rjust(wid[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
            lines += [fmt(head)] + [fmt(r) for r in rows]
        return "\n".join(lines)


class _Bar:
    """The progress bar (tqdm on stderr, only on a terminal): trials, workloads done, best
    per-workload speed-up so far."""

    def __init__(self, show: bool, total: int | None, n_workloads: int):
        self.bar = None
        self.n = n_workloads
        self.done = 0
        self.best = 1.0
        if show and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc="tuning", unit="trial", file=sys.stderr, leave=False,
                                dynamic_ncols=True)
            except ImportError:
                self.bar = None
        self._post()

    def _post(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"workloads {self.done}/{self.n}, best speed-up {self.best:.2f}x")

    def trial(self, speedup: float | None = None) -> None:
        if speedup is not None:
            self.best = max(self.best, speedup)
        if self.bar is not None:
            self.bar.update(1)
            self._post()

    def workload_done(self) -> None:
        self.done += 1
        self._post()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _check_args(trials, time_budget, timeout, executor, min_gain=0.0) -> None:
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not -1 < min_gain < 1:
        raise ValueError(f"min_gain must be a number in (-1, 1), got {min_gain!r}")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise ValueError(f"trials must be an integer >= 1 or None, got {trials!r}")
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(time_budget, (int, float))
                                    or not time_budget > 0):
        raise ValueError(f"time_budget must be a number of seconds > 0 or None, got {time_budget!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")


def _prior_records(path: str, identity: dict, version: str, threads: int, flush: bool = False) -> dict[str, list]:
    """The file's records (if it exists) measured on this target identity, by this version, at
    this thread count, with (``flush``) or without a cache flush (failed ones count with either),
    by workload key."""
    from tensorfuse.compiler.tuning import read_records, target_mismatch
    if not os.path.exists(path):
        return {}
    out: dict[str, list] = {}
    for r in read_records(path, errors="skip"):
        if target_mismatch(r.target, identity) is None and r.version == version and r.threads == threads \
                and (r.status != "ok" or bool(r.extra.get("flush_bytes")) == flush
                     or r.extra.get("note") is not None):
            out.setdefault(r.workload, []).append(r)
    return out


def tune(model: Any, records: str | os.PathLike = "RECORDS.jsonl", *, target: str = "llvm",
         time_budget: float | None = None, trials: int | None = None, num_threads: int | None = None,
         executor: str = "local", ray_address: str | None = None, seed: int = 0, progress: bool = True,
         opt_level: int = 2, input_shapes: dict | None = None, timeout: float = DEFAULT_TIMEOUT_S,
         repeat: int = 25, min_gain: float | None = None, cache_flush: str | bool = "auto",
         check_model: bool = True) -> TuneResult:
    """Tune ``model``'s workloads and append the measurements to ``records`` (module docstring).

    model: an ONNX model (path, bytes or ``onnx.ModelProto``). records: the JSON-lines file
    (created when missing; records already there for this target, version and thread count
    are not measured again). target: as for ``compile``. time_budget: seconds for the whole
    run (None: no limit), shared among workloads by weight, heaviest first (a workload gets at
    least ``MIN_WORKLOAD_S``; time it leaves over goes to the next). trials: candidates per
    workload, the default knobs and earlier records included (None: ``DEFAULT_TRIALS`` without a
    time budget, no limit with one). num_threads: the threads the candidates run with (default:
    ``$TENSORFUSE_NUM_THREADS``, else the cores this process may use). executor: "local" or
    "ray" (``ray_address``: the cluster; ``compiler.tuner.executors``). seed: random inputs and
    the search's choices. progress: a bar on stderr when it is a terminal. opt_level and
    input_shapes: as for the ``compile`` that will use the records (workload keys depend on
    them). timeout: seconds per candidate. repeat: timed samples per candidate (a confirmation
    takes ``CONFIRM_SAMPLES`` times as many). min_gain: the least gain, ``1 - vs_default``, a
    candidate must show in the search to be confirmed and again in its confirmation to be used
    (None: ``compiler.tuning.DEFAULT_MIN_GAIN``, 0.03; a negative value accepts candidates up to
    that much slower: the tests use it to force confirmations). cache_flush: True to time every
    candidate run after evicting the caches (``worker.CacheFlush``: the weights come from memory,
    the activations stay warm), False not to, "auto" (default) to do it when the model's weights
    (``workloads.weight_bytes``) exceed this machine's last-level cache
    (``ir.target.last_level_cache_bytes``), as they do in the model: a blocking that wins with warm
    weights can lose with cold ones. The flush writes twice the cache's size.
    check_model: after the workloads, time the whole model with the file's records (this
    thread count) against the model without them, and reject the settings of workloads that make
    it slower (``compiler.tuner.model_check``; ``TuneResult.model_check`` says what it found).
    The check's time comes out of ``time_budget`` (about 3 compiles of the model and a few
    seconds of runs are set aside before the workloads share the rest).

    Returns a :class:`TuneResult`. Raises ValueError (bad arguments), what ``compile``
    raises for a model it cannot compile, OSError when ``records`` cannot be written,
    ImportError (executor "ray" without Ray, or a plugin that fails to import)."""
    from tensorfuse.ir.target import Target
    from tensorfuse.compiler.tuning import tensorfuse_version
    from tensorfuse.ir.knobs import target_identity
    from tensorfuse.runtime.threads import resolve_num_threads

    from .executors import graph_bytes, make_executor
    from .workloads import model_tasks

    from tensorfuse.compiler.tuning import DEFAULT_MIN_GAIN
    if min_gain is None:
        min_gain = DEFAULT_MIN_GAIN
    _check_args(trials, time_budget, timeout, executor, min_gain)
    if cache_flush not in (True, False, "auto"):
        raise ValueError(f"cache_flush must be True, False or 'auto', got {cache_flush!r}")
    t_start = time.monotonic()
    tgt = Target.parse(target)
    threads = resolve_num_threads(num_threads)
    records = os.fspath(records)
    with open(records, "a"):            # fail now, not after the first measurement
        pass
    load_plugins()
    if trials is None and time_budget is None:
        trials = DEFAULT_TRIALS
    deadline = t_start + float(time_budget) if time_budget is not None else None
    from tensorfuse import progress as pg
    show = bool(progress) and sys.stderr.isatty()
    t_model = time.monotonic()
    with pg.enabled(show), pg.task("tuning: compiling and profiling the model (default knobs)"):
        tasks, info = model_tasks(model, tgt, opt_level, input_shapes, seed)
    t_model = time.monotonic() - t_model
    check_deadline = deadline
    if deadline is not None and check_model:       # set aside the model check's time
        deadline -= min(0.2 * float(time_budget), 3 * t_model + 10.0)
    identity = target_identity(tgt)
    from tensorfuse.ir.target import last_level_cache_bytes
    llc = last_level_cache_bytes()
    flush = cache_flush if isinstance(cache_flush, bool) else info["weight_bytes"] > llc
    flush_bytes = 2 * llc if flush else 0
    prior = _prior_records(records, identity, tensorfuse_version(), threads, flush)
    result = TuneResult(records, str(tgt), threads, executor, weights_from=info["weights_from"],
                        flush_bytes=flush_bytes, weight_bytes=info["weight_bytes"])
    tunable = [t for t in tasks if t.size > 1]
    planned = sum(min(trials, t.size) - len(prior.get(t.key, [])) for t in tunable) if trials else None
    bar = _Bar(progress, max(0, planned) if planned is not None else None, len(tunable))
    setup = {"target": str(tgt), "threads": threads, "seed": seed, "rtol": RTOL, "atol": ATOL, "repeat": repeat,
             "flush_bytes": flush_bytes}
    ex = make_executor(executor, ray_address)
    by_key: dict[str, WorkloadResult] = {}
    for t in tasks:
        w = WorkloadResult(t.key, t.summary, t.count, t.weight_ms, t.share, t.size,
                           "tuned" if t.size > 1 else "no knobs", best_knobs=dict(t.knobs), best_schedule=t.schedule)
        by_key[t.key] = w
        result.workloads.append(w)
    left_weight = sum(t.weight_ms for t in tunable)
    try:
        with tempfile.TemporaryDirectory(prefix="tensorfuse-tune-") as tmp:
            for i, t in enumerate(tunable):
                w = by_key[t.key]
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    w.status = "not reached"
                    continue
                wl_deadline = None
                if deadline is not None:
                    left = deadline - now
                    share = left * (t.weight_ms / left_weight if left_weight > 0 else 1.0 / (len(tunable) - i))
                    wl_deadline = now + min(left, max(share, MIN_WORKLOAD_S))
                left_weight -= t.weight_ms
                blob = graph_bytes(t.graph)
                path = os.path.join(tmp, f"{t.key}.pkl")
                with open(path, "wb") as f:
                    f.write(blob)
                session = ex.session(path, blob, dict(setup, key=t.key), float(timeout))
                try:
                    _tune_workload(t, w, session, Search(t.space, trials, seed, t.key), prior.get(t.key, []),
                                   records, tgt, threads, wl_deadline, bar, result, float(min_gain), repeat)
                finally:
                    session.close()
                    w.seconds = time.monotonic() - now
                    bar.workload_done()
    finally:
        bar.close()
        ex.close()
    if check_model and any(w.status == "tuned" for w in result.workloads):
        from .model_check import model_check
        with pg.enabled(show), pg.task("tuning: the whole model with the records against without them"):
            result.model_check = model_check(model, records, tgt, threads, opt_level, input_shapes, seed,
                                             check_deadline)
    result.seconds = time.monotonic() - t_start
    return result


def _tune_workload(t, w: WorkloadResult, session, search: Search, prior: list, records: str, tgt, threads: int,
                   deadline: float | None, bar: _Bar, result: TuneResult, min_gain: float = 0.03,
                   repeat: int = 25) -> None:
    """Search one workload, then confirm its best candidates (see :func:`tune`), appending a
    record per candidate and per confirmation."""
    from tensorfuse.compiler.tuning import record_stage
    confirms = [r for r in prior if record_stage(r) == "confirm"]
    prior = [r for r in prior if record_stage(r) == "search"]
    search_deadline = deadline
    if deadline is not None:
        search_deadline = time.monotonic() + (1.0 - CONFIRM_SHARE) * max(0.0, deadline - time.monotonic())
    _search_workload(t, w, session, search, prior, records, tgt, threads, search_deadline, bar, result)
    if w.default_ms is None or w.status != "tuned":
        return
    _confirm_workload(t, w, session, search, confirms, records, tgt, threads, deadline, result, min_gain, repeat)


def _new_record(t, w: WorkloadResult, session, values: dict, res: dict, schedule: str, tgt, threads: int,
                stage: str):
    """The record of one measurement (``res``: the worker's answer) of ``values``."""
    from tensorfuse.compiler.tuning import Record
    status = res.get("status", "error")
    if status not in ("ok", "wrong", "error", "crash", "timeout"):
        status = "error"
    median = res.get("median_ms") if status == "ok" else None
    rec = Record.create(t.key, values, status, target=tgt, summary=t.summary,
                        schedule=res.get("schedule") or schedule, error=res.get("error"), median_ms=median,
                        spread_ms=res.get("spread_ms") if status == "ok" else None,
                        runs=int(res.get("runs", 0)) if status == "ok" else 0,
                        default_ms=w.default_ms if w.default_ms is not None else median, threads=threads)
    ident = res.get("identity") or session.identity
    if ident:
        rec.target = dict(ident)
    if res.get("node"):
        rec.extra["node"] = res["node"]
    if res.get("compile_s") is not None:
        rec.extra["compile_s"] = round(float(res["compile_s"]), 4)
    if status == "ok" and res.get("flush_bytes"):
        rec.extra["flush_bytes"] = int(res["flush_bytes"])
    if status == "ok" and res.get("vs_default") is not None:
        rec.extra["vs_default"] = float(res["vs_default"])
        if res.get("default_window_ms") is not None:
            rec.extra["default_window_ms"] = float(res["default_window_ms"])
    rec.extra["stage"] = stage
    return rec


def _confirm_workload(t, w: WorkloadResult, session, search: Search, confirms: list, records: str, tgt,
                      threads: int, deadline: float | None, result: TuneResult, min_gain: float,
                      repeat: int) -> None:
    """The confirmation stage of one searched workload (module docstring, item 4): measure again
    the best settings not confirmed yet (``confirms``: the file's confirm records), then set
    ``w``'s best to what ``compiler.tuning.TuningRecords`` will choose."""
    from tensorfuse.compiler.tuning import Record, append_record, choose_confirmed
    default_key = canonical(t.knobs)
    done = {canonical(r.knobs) for r in confirms}
    # the search's ok candidates by their ratio to the default (``Search`` ranks by default_ms x ratio)
    ranked = sorted((e["median"] / w.default_ms, k, e["values"]) for k, e in search.effective.items()
                    if e["status"] == "ok" and e["median"] and k != default_key)
    top = [(k, v) for ratio, k, v in ranked if ratio < 1.0 - min_gain][:CONFIRM_N]
    todo = [(k, v) for k, v in top if k not in done]
    if not top and not confirms:
        # nothing to confirm: a confirm record of the default knobs (not measured) says so, and
        # keeps TuningRecords from taking a search candidate that showed no gain
        rec = Record.create(t.key, dict(t.knobs), "ok", target=tgt, summary=t.summary, schedule=t.schedule,
                            median_ms=w.default_ms, runs=0, default_ms=w.default_ms, threads=threads)
        if session.identity:
            rec.target = dict(session.identity)
        rec.extra.update(vs_default=1.0, stage="confirm", min_gain=min_gain,
                         note="no search candidate below 1 - min_gain: nothing to confirm")
        append_record(records, rec)
        confirms = confirms + [rec]
    if todo:
        try:
            session.start()
        except WorkerLost:
            todo = []
    timing = {"repeat": CONFIRM_SAMPLES * int(repeat), "max_measure_s": CONFIRM_SAMPLES * 2.0}
    first = True
    while todo:
        # the first confirmation always; the others while the workload's time lasts
        if deadline is not None and not first and time.monotonic() >= deadline:
            break
        first = False
        batch = todo[:max(1, session.slots)]
        todo = todo[len(batch):]
        for (k, vals), res in zip(batch, session.measure([v for _, v in batch], timing)):
            rec = _new_record(t, w, session, res.get("values", vals) if res.get("status") == "ok" else vals,
                              res, "", tgt, threads, "confirm")
            rec.extra["min_gain"] = min_gain
            append_record(records, rec)
            confirms = confirms + [rec]
            result.confirmed += 1
            w.confirmed += 1
    if confirms:
        chosen, why = choose_confirmed(confirms)
        if chosen is None:
            w.status = "default kept: " + why
            w.best_knobs, w.best_ms, w.best_schedule = dict(t.knobs), w.default_ms, t.schedule
        else:
            w.best_knobs, w.best_schedule = dict(chosen.knobs), chosen.schedule or w.best_schedule
            w.best_ms = w.default_ms * float(chosen.extra["vs_default"])


def _search_workload(t, w: WorkloadResult, session, search: Search, prior: list, records: str, tgt,
                     threads: int, deadline: float | None, bar: _Bar, result: TuneResult) -> None:
    """Search one workload (see :func:`tune`), appending a record per candidate."""
    from tensorfuse.compiler.tuning import append_record
    default_key = canonical(t.knobs)
    default_failed = None
    for r in prior:
        if canonical(r.knobs) == default_key:
            if r.usable:
                w.default_ms = r.median_ms if w.default_ms is None else min(w.default_ms, r.median_ms)
            else:
                default_failed = r.error or r.status

    def rank_ms(median: float | None, vs: Any) -> float | None:
        """The time candidates are compared by: the default's median times the candidate's
        ratio to the default timed beside it (robust to the machine's drift), else its median."""
        if median is not None and isinstance(vs, (int, float)) and vs > 0 and w.default_ms:
            return float(vs) * w.default_ms
        return median

    for r in prior:
        search.tell(r.knobs, r.status, rank_ms(r.median_ms, r.extra.get("vs_default")))
    search.note_request({})             # the empty request is the default

    def best_from_search() -> None:
        ok = [(e["median"], e["values"]) for e in search.effective.values() if e["status"] == "ok" and e["median"]]
        if ok:
            m, v = min(ok, key=lambda x: x[0])
            w.best_ms, w.best_knobs = m, dict(v)
        w.known = search.measured

    def record(values: dict, res: dict, schedule: str) -> None:
        rec = _new_record(t, w, session, values, res, schedule, tgt, threads, "search")
        status, median = rec.status, rec.median_ms
        append_record(records, rec)
        search.tell(values, status, rank_ms(median, res.get("vs_default")))
        result.measured += 1
        w.measured += 1
        if status != "ok":
            result.failed += 1
            w.failed += 1
        best_from_search()
        bar.trial(w.speedup)

    best_from_search()
    if default_failed is not None and w.default_ms is None:
        w.status = f"default failed: {default_failed}"
        return
    # the default knobs are measured first (in the first batch: a Ray task measures it with the
    # first candidates), then batches of proposals until the trials or the time run out
    need_default = w.default_ms is None and not search.known(t.knobs)
    if not need_default and search.done():
        return
    try:                                # the worker set up with the workload (its default compiled and run)
        session.start()
    except WorkerLost as e:
        if need_default:
            record(dict(t.knobs), {"status": e.status if e.status in ("crash", "timeout") else "error",
                                   "error": str(e)}, t.schedule)
        w.status = f"default failed: {e}"
        return
    stale = 0
    while need_default or not search.done() and (deadline is None or time.monotonic() < deadline):
        n = session.slots - int(need_default)
        if search.trials is not None:
            n = min(n, search.trials - search.measured - int(need_default))
        props = search.propose(n) if n > 0 else []
        if not props and not need_default:
            break
        resolved = session.resolve(props)
        todo: list[tuple[dict, str]] = [(dict(t.knobs), t.schedule)] if need_default else []
        batch: set[str] = {canonical(t.knobs)} if need_default else set()
        for req, rs in zip(props, resolved):
            if "error" in rs:           # lowering raised, crashed or hung
                st = rs.get("status") if rs.get("status") in ("crash", "timeout") else "error"
                record(req, {"status": st, "error": "lowering: " + str(rs["error"])}, "")
                continue
            search.add_space(rs.get("space", []))
            vals = rs["values"]
            if search.known(vals) or canonical(vals) in batch:
                continue
            batch.add(canonical(vals))
            todo.append((vals, rs.get("schedule", "")))
        if not todo:
            stale += len(props)
            if stale > MAX_MISSES:      # requests keep lowering to candidates already measured
                break
            continue
        stale = 0
        results = session.measure([v for v, _ in todo])
        if need_default:
            need_default = False
            res = results[0]
            if res.get("status") == "ok":
                w.default_ms = res["median_ms"]
            else:
                w.status = f"default failed: {res.get('status')}: {res.get('error')}"
        for (vals, sched), res in zip(todo, results):
            record(res.get("values", vals) if res.get("status") == "ok" else vals, res, sched)
        if w.default_ms is None:
            return
    w.known = search.measured
    if w.speedup is None and w.default_ms is not None:
        w.best_ms = w.best_ms or w.default_ms
