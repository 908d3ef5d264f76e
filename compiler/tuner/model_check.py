"""The tuner's last stage: the whole model with the records against the model without them.

Each workload was measured alone (``compiler.tuner.worker``); inside the model its kernel meets
other caches, other neighbours and the thread team's hand-offs, so a setting that won alone can
lose there. :func:`model_check` compiles the model twice, with the records chosen for this thread
count and without any, and times both whole runs taking turns sample by sample
(``worker.time_modules``). When the tuned model is slower than :data:`SLOWER` times the untuned
one, it looks for the culprits: for each tuned workload, least claimed gain first, the model
without that workload's records is timed beside the current best; a workload whose removal makes
the model at least :data:`GAIN` faster is rejected. Each rejection is a record (``"stage":
"model"``, the rejected knobs, a note with the measurement) that ``compiler.tuning.TuningRecords``
honours: the workload keeps its default knobs (reason ``MODEL_REJECTED``). Passing checks are
recorded too (on the pseudo-workload ``MODEL_KEY``), so the file says what the model check saw.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

#: the tuned model may be at most this much slower than the untuned one (the noise of the check)
SLOWER = 1.02
#: removing a workload's records must make the model at least this much faster to reject them
GAIN = 0.02
#: timed samples per module and the most seconds one comparison may spend timing
REPEAT = 25
MAX_MEASURE_S = 4.0


@dataclass
class ModelCheck:
    """What :func:`model_check` found: ``ratio`` (tuned / untuned median of paired samples, after
    any rejections; None when not run), ``first_ratio`` (before them), ``rejected`` (workload
    keys), ``tuned`` (workloads with records used), ``seconds``, ``note`` (why it stopped early,
    if it did)."""

    ratio: float | None = None
    first_ratio: float | None = None
    tuned: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    def __str__(self) -> str:
        if self.ratio is None:
            return f"model check: not run ({self.note})" if self.note else "model check: not run"
        text = (f"model check: the whole model with the records {self.ratio:.3f}x the time without them "
                f"({len(self.tuned)} tuned workload{'s' if len(self.tuned) != 1 else ''})")
        if self.rejected:
            text += (f"; {self.first_ratio:.3f}x before {len(self.rejected)} workload"
                     f"{'s' if len(self.rejected) != 1 else ''} slower in the model went back to their defaults")
        return text + (f"; {self.note}" if self.note else "")


def _ratio(a, b, inputs, threads: int) -> tuple[float, float, float]:
    """(median of a's / b's paired sample times, a's median ms, b's median ms)."""
    from .worker import time_modules
    ta, tb = time_modules([a, b], inputs, REPEAT, 2e-3, MAX_MEASURE_S, 0.15)
    r = statistics.median(x / y for x, y in zip(ta["samples"], tb["samples"]))
    return r, ta["median_ms"], tb["median_ms"]


def model_check(model, records_path: str, target, threads: int, opt_level: int, input_shapes, seed: int,
                deadline: float | None) -> ModelCheck:
    """Check the model with ``records_path``'s records (for ``target`` at ``threads``) against
    the model without them (module docstring); append a ``"model"`` record per rejected workload
    and one for the verdict. Returns a :class:`ModelCheck`."""
    import tensorfuse
    from tensorfuse.compiler.tuning import Record, TuningRecords, append_record, read_records
    from tensorfuse.compiler.verify import random_inputs

    t0 = time.monotonic()
    out = ModelCheck()
    recs = TuningRecords(records_path, target, threads=threads)
    kw = dict(target=str(target), opt_level=opt_level, input_shapes=input_shapes, cache=False, num_threads=threads)

    def build(records):
        mod = tensorfuse.compile(model, tuning=records, **kw)
        return mod, [t["workload"] for t in mod.report.tuned]

    base, _ = build(None)
    tuned, used = build(list(recs.records))
    out.tuned = list(used)
    if not used:
        out.note = "no workload of the model has tuned knobs"
        out.seconds = time.monotonic() - t0
        return out
    feeds = random_inputs(base.input_info, seed)
    inputs = [feeds[i.name] for i in base.input_info]
    ratio, tuned_ms, base_ms = _ratio(tuned, base, inputs, threads)
    out.first_ratio = out.ratio = ratio
    if ratio > SLOWER:
        # least claimed gain first: a small claimed gain is the likeliest to be lost in the model
        gain = {k: float(r.extra.get("vs_default", 1.0)) for k, r in recs.best.items()}
        order = sorted(used, key=lambda k: -gain.get(k, 1.0))
        kept = list(used)
        best = tuned
        for key in order:
            if deadline is not None and time.monotonic() >= deadline:
                out.note = "the time budget ended before every tuned workload was checked"
                break
            without = [r for r in recs.records if r.workload in kept and r.workload != key]
            trial, _ = build(without)
            r, _, _ = _ratio(trial, best, inputs, threads)
            if r < 1.0 - GAIN:      # the model is faster without this workload's knobs
                chosen = recs.best[key]
                veto = Record.create(key, dict(chosen.knobs), "ok", target=target, summary=chosen.summary,
                                     schedule=chosen.schedule, median_ms=tuned_ms, runs=0,
                                     default_ms=base_ms, threads=threads)
                veto.target = dict(chosen.target)
                veto.extra.update(stage="model", vs_default=1.0,
                                  note=f"the model ran {1 / r:.3f}x as long with these knobs as without them")
                append_record(records_path, veto)
                kept.remove(key)
                out.rejected.append(key)
                best = trial
        if out.rejected:
            final = TuningRecords(read_records(records_path), target, threads=threads)
            tuned, used = build(list(final.records))
            out.tuned = list(used)
            out.ratio = _ratio(tuned, base, inputs, threads)[0] if used else 1.0
    verdict = Record.create("model-check", {}, "ok", target=target, summary="the whole model, tuned / untuned",
                            median_ms=base_ms * out.ratio, runs=REPEAT, default_ms=base_ms, threads=threads)
    verdict.extra.update(stage="model", vs_default=out.ratio, first_ratio=out.first_ratio,
                         rejected=list(out.rejected), tuned=len(out.tuned))
    append_record(records_path, verdict)
    out.seconds = time.monotonic() - t0
    return out
