"""The tuner's measuring process: ``python -m tensorfuse.compiler.tuner.worker``.

The tuner (``compiler.tuner``) runs every candidate in a child process, so that a candidate
whose code crashes the process (a segmentation fault, ``os._exit``), hangs, or raises costs
only that candidate. This module is that child: it reads one JSON request per line on its
standard input and answers one JSON line per request on the descriptor its standard output
was at start (its own prints and native code's writes to fd 1 go to standard error instead).

Requests (``"op"``):

- ``"setup"``: ``graph`` (a file holding a pickled one-node ``ir.graph.Graph``: the workload
  extracted by ``compiler.tuner.workloads``), ``key`` (its workload key), ``target`` (target
  string), ``threads``, ``seed``, ``rtol``/``atol`` (the comparison with the default
  knobs' outputs), ``repeat``/``min_sample_s``/``max_measure_s``/``settle_s``/``flush_bytes``
  (timing, :func:`time_modules`). The
  worker makes the inputs (:func:`make_inputs`), compiles and runs the default knobs once for
  the reference outputs (not with ``"reference": false``: a worker that only resolves), and answers ``{"ok": true, "identity": target_identity}`` or
  ``{"ok": false, "status": "error", "error": ...}``.
- ``"resolve"``: ``knobs`` (a list of knob dicts): lowers the node with each (no code
  generation) and answers ``{"results": [{"values", "space", "schedule"} or {"error"}]}``,
  the effective knob values each request stands for (a knob the schedule did not declare is
  dropped, a value outside its candidates becomes the default) and the knobs declared.
- ``"measure"``: ``knobs`` (and optionally ``timing``: set-up timing entries overridden for
  this measurement, e.g. the doubled ``repeat`` of a confirmation): lowers, generates code, runs once and compares with the reference
  (``status`` "wrong" beyond the tolerance), then times it (:func:`time_modules`: a candidate
  other than the default takes turns with the default knobs' module, kept from the setup,
  sample by sample); answers ``{"status": "ok", "values", "space", "schedule", "median_ms",
  "spread_ms", "runs", "compile_s", "vs_default"}`` (the median ratio of the candidate's
  samples to the default's taken beside them, 1.0 for the default itself;
  ``"default_window_ms"``, the default's median then; ``"flush_bytes"``), or ``{"status":
  "wrong"|"error", "error": ...}``.
- ``"exit"``.

Test-only schedules (or any extra schedules) are loaded from ``$TENSORFUSE_TUNE_PLUGINS`` by
both the tuner and this worker (:func:`load_plugins`).
"""
from __future__ import annotations

import gc
import json
import math
import os
import pickle
import statistics
import sys
import time
import traceback

import numpy as np

from .plugins import PLUGINS_ENV, load_plugins  # noqa: E402,F401  (PLUGINS_ENV: re-exported)


# ----------------------------------------------------------------------------- building
class FixedKnobs:
    """A ``tuning=`` object for ``compiler.lower.lower_graph`` that fixes the same knob values
    for every workload (the extracted graph has one node)."""

    def __init__(self, knobs: dict | None):
        self.knobs = dict(knobs or {})

    def knobs_for(self, key: str) -> dict:
        return dict(self.knobs)


def json_value(v):
    """A knob value as JSON (tuples as lists)."""
    return [json_value(x) for x in v] if isinstance(v, tuple) else v


def json_knobs(d: dict) -> dict:
    return {k: json_value(v) for k, v in d.items()}


def lower_candidate(graph, target, knobs: dict):
    """Lower the one-node ``graph`` with ``knobs`` fixed: ``(lowered graph, workload)`` where
    the workload (``compiler.lower.Workload``) holds the effective values, space and schedule
    (None when the node emits no kernel)."""
    from tensorfuse.compiler.lower import lower_graph
    lg = lower_graph(graph, target, tuning=FixedKnobs(knobs))
    wl = next(iter(lg.workloads.values()), None)
    return lg, wl


def describe(wl) -> dict:
    """The effective values, space (``Knob.to_json``) and schedule of a lowered workload."""
    if wl is None:
        return {"values": {}, "space": [], "schedule": "generic"}
    return {"values": json_knobs(wl.knobs), "space": [k.to_json() for k in wl.space], "schedule": wl.schedule}


def build_candidate(graph, target, knobs: dict, threads: int):
    """Lower and generate code for the one-node ``graph`` with ``knobs``: ``(module, workload)``."""
    from tensorfuse.compiler.driver import build_module
    lg, wl = lower_candidate(graph, target, knobs)
    mod = build_module(lg, graph, [v.name for v in graph.inputs], [v.name for v in graph.outputs], target)
    mod.num_threads = threads
    return mod, wl


def index_bounds(graph) -> dict[str, int]:
    """Graph inputs that index a constant's axis (a Gather's indices), mapped to that axis's
    length: random indices stay in range."""
    out: dict[str, int] = {}
    ins = {id(v): v for v in graph.inputs}
    for n in graph.nodes:
        if n.op in ("Gather", "GatherElements") and len(n.inputs) > 1 and n.inputs[1] is not None \
                and id(n.inputs[1]) in ins and n.inputs[0] is not None and n.inputs[0].shape:
            axis = int(n.attr("axis", 0))
            shape = n.inputs[0].shape
            if -len(shape) <= axis < len(shape):
                out[n.inputs[1].name] = max(1, int(shape[axis]))
    return out


def make_inputs(graph, seed: int = 0, zero_ints: bool = False) -> list[np.ndarray]:
    """Fixed-seed inputs for the graph's inputs: floats standard normal, integers in [0, 10)
    (fewer for a Gather's indices into a constant; zeros with ``zero_ints``), booleans uniform."""
    rng = np.random.default_rng(seed)
    bounds = index_bounds(graph)
    out = []
    for v in graph.inputs:
        dt, shape = np.dtype(v.dtype.numpy), tuple(v.shape)
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt.kind in "iu":
            hi = 1 if zero_ints else max(1, min(10, bounds.get(v.name, 10)))
            out.append(rng.integers(0, hi, shape).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(np.zeros(shape, dt))
    return out


def compare(got: list[np.ndarray], want: list[np.ndarray], rtol: float, atol: float) -> str | None:
    """Why ``got`` differs from ``want`` beyond ``atol + rtol * max|want|`` (per output; NaNs
    must sit where the reference has them; integers and booleans must be equal), or None."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, the default gives {w.dtype}{list(w.shape)}"
        if g.size == 0:
            continue
        if w.dtype.kind == "f":
            gn, wn = np.isnan(g), np.isnan(w)
            if not np.array_equal(gn, wn):
                return f"output {i}: NaN at {int(np.sum(gn != wn))} elements where the default has none (or the reverse)"
            ok = ~wn
            if not ok.any():
                continue
            gf, wf = g[ok].astype(np.float64), w[ok].astype(np.float64)
            if not np.array_equal(np.isinf(gf), np.isinf(wf)) or not np.array_equal(gf[np.isinf(wf)], wf[np.isinf(wf)]):
                return f"output {i}: infinities differ from the default's"
            fin = np.isfinite(wf)
            if not fin.any():
                continue
            err = float(np.max(np.abs(gf[fin] - wf[fin])))
            tol = atol + rtol * float(np.max(np.abs(wf[fin])))
            if not err <= tol:
                return f"output {i}: max abs difference {err:.3g} from the default knobs' output (tolerance {tol:.3g})"
        elif not np.array_equal(g, w):
            return f"output {i}: {int(np.sum(g != w))} elements differ from the default knobs' output"
    return None


#: seconds of sleep between the samples of two modules timed together when they run on a
#: thread team: the team of the one timed before stops spinning (``runtime.threads``:
#: ``WORKER_SPIN_TICKS``, a few milliseconds) before the other is timed
TEAM_GAP_S = 0.003


class CacheFlush:
    """Puts the caches in the state a kernel meets inside a model whose weights do not fit the
    last-level cache: :meth:`__call__` writes a scratch buffer of ``nbytes`` (evicting what the
    previous run left, the kernel's constants among it), then reads ``inputs`` (the activations,
    which the kernel before it in the model has just written, so they are warm there). The same
    idea as TVM's ``enable_cpu_cache_flush`` (its runner evicts the non-first arguments)."""

    def __init__(self, nbytes: int, inputs: list[np.ndarray]):
        self.scratch = np.zeros(max(1, int(nbytes) // 8), np.float64)
        self.inputs = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in inputs if a.size]

    def __call__(self) -> None:
        self.scratch += 1.0
        for a in self.inputs:
            a.sum()


def _runner(mod, inputs: list[np.ndarray]):
    """``(once, release)``: one run of ``mod`` on ``inputs``, and what frees its arena. For llvm
    modules the entry function is called directly on a bound arena (no per-run input checks or
    output allocation: a kernel of microseconds is not hidden under Python's overhead); other
    modules run through ``run``."""
    from tensorfuse.runtime.module import Module
    if not isinstance(mod, Module):
        return (lambda: mod.run(*inputs)), (lambda: None)
    arena = mod._acquire()
    outs = [np.empty(i.shape, i.dtype) for i in mod.output_info]
    mod._bind(arena, inputs, outs)          # the arena's table points into ``outs`` and ``inputs``:
    entry = mod._entry                      # both must live while it runs (the closures hold them)

    def once(arena=arena, entry=entry, outs=outs, inputs=inputs):
        arena.call(entry)

    def release(outs=outs):
        mod._release(arena)
    return once, release


def time_modules(mods: list, inputs: list[np.ndarray], repeat: int = 25, min_sample_s: float = 2e-3,
                 max_measure_s: float = 2.0, settle_s: float = 0.15, flush_bytes: int = 0) -> list[dict]:
    """Wall times of whole runs of each module in ``mods`` (one-node modules: the kernel's time
    plus the call), with the care of ``benchmarks/bench_models.py``: warm-up runs of each first,
    then ``settle_s`` of sleep (the previous candidate's thread team stops spinning), then about
    ``repeat`` samples per module, each the mean of ``number`` back-to-back runs (``number``
    chosen so that a sample lasts at least ``min_sample_s``); fewer samples (at least 5) when
    they would take over ``max_measure_s``. Several modules take turns sample by sample (the
    order alternating; ``TEAM_GAP_S`` of sleep between turns when they run on thread teams), so
    a slow stretch of the machine hits them alike. The garbage collector is off while timing.
    ``flush_bytes`` > 0: every sample is one run after a :class:`CacheFlush` of that many bytes
    (the flush not timed): the kernel's weights come from memory, as in a model whose weights
    exceed the last-level cache, instead of from the cache the previous run left them in.
    Returns per module ``{"median_ms", "spread_ms" (interquartile range), "runs", "samples"
    (the per-sample times in ms, in order)}``."""
    clock = time.perf_counter
    runners = [_runner(m, inputs) for m in mods]
    gap = TEAM_GAP_S if len(mods) > 1 and any(getattr(m, "num_threads", 1) > 1 for m in mods) else 0.0
    flush = CacheFlush(flush_bytes, inputs) if flush_bytes > 0 else None
    flush_s = 0.0
    if flush is not None:
        t0 = clock()
        flush()
        flush_s = clock() - t0
    try:
        per, number = [], []
        for once, _ in runners:
            warm, t_start = [], clock()
            while len(warm) < 3 or (clock() - t_start < 0.05 and len(warm) < 1000):
                t0 = clock()
                once()
                warm.append(clock() - t0)
            p = max(statistics.median(warm), 1e-9)
            per.append(p)
            number.append(1 if flush is not None else max(1, math.ceil(min_sample_s / p)))
        cost = sum(p * n + flush_s for p, n in zip(per, number)) + gap * len(mods)   # seconds of one turn of each
        total = max(5, min(repeat, int(max_measure_s / cost)))             # samples per module
        gc.collect()
        time.sleep(settle_s)
        samples: list[list[float]] = [[] for _ in mods]
        gc.disable()
        try:
            for r in range(total):
                for i in (range(len(mods)) if r % 2 == 0 else range(len(mods) - 1, -1, -1)):
                    once, n = runners[i][0], number[i]
                    if flush is not None:
                        flush()
                    t0 = clock()
                    for _ in range(n):
                        once()
                    samples[i].append((clock() - t0) / n)
                    if gap:
                        time.sleep(gap)
        finally:
            gc.enable()
    finally:
        for _, release in runners:
            release()
    out = []
    for s, n in zip(samples, number):
        q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0]] * 3
        out.append({"median_ms": statistics.median(s) * 1e3, "spread_ms": (q[2] - q[0]) * 1e3, "runs": len(s) * n,
                    "samples": [x * 1e3 for x in s]})
    return out


def time_module(mod, inputs: list[np.ndarray], **kw) -> dict:
    """:func:`time_modules` of one module."""
    return time_modules([mod], inputs, **kw)[0]


# ----------------------------------------------------------------------------- the worker
class Worker:
    """The state of one worker process: the workload set up, its inputs and reference."""

    def __init__(self):
        self.graph = None
        self.setup_msg: dict = {}
        self.inputs: list[np.ndarray] = []
        self.ref: list[np.ndarray] | None = None
        self.target = None
        #: the default knobs' module (timed beside each candidate) and their effective values
        self.default_mod = None
        self.default_values: dict | None = None

    def setup(self, msg: dict) -> dict:
        from tensorfuse.ir.target import Target
        from tensorfuse.ir.knobs import target_identity
        from tensorfuse.runtime.module import RunCheckError
        with open(msg["graph"], "rb") as f:
            self.graph = pickle.load(f)
        self.setup_msg = msg
        self.target = Target.parse(msg.get("target") or "llvm")
        self.inputs = make_inputs(self.graph, int(msg.get("seed", 0)))
        if not msg.get("reference", True):     # resolving only (lowering): no code, no reference
            return {"ok": True, "identity": target_identity(self.target)}
        self.default_mod = None
        gc.collect()
        mod, wl = build_candidate(self.graph, self.target, {}, int(msg.get("threads", 1)))
        try:
            self.ref = mod.run(*self.inputs)
        except RunCheckError:       # random integers out of range for an index: zeros are in range
            self.inputs = make_inputs(self.graph, int(msg.get("seed", 0)), zero_ints=True)
            self.ref = mod.run(*self.inputs)
        self.default_mod, self.default_values = mod, describe(wl)["values"]
        return {"ok": True, "identity": target_identity(self.target)}

    def resolve(self, msg: dict) -> dict:
        out = []
        for knobs in msg["knobs"]:
            try:
                _lg, wl = lower_candidate(self.graph, self.target, knobs)
                out.append(describe(wl))
            except Exception as e:      # noqa: BLE001 - the candidate's failure, reported
                out.append({"error": _error_text(e)})
        return {"results": out}

    def measure(self, msg: dict) -> dict:
        m = {**self.setup_msg, **(msg.get("timing") or {})}     # a confirmation: more samples
        t0 = time.perf_counter()
        try:
            mod, wl = build_candidate(self.graph, self.target, msg.get("knobs") or {}, int(m.get("threads", 1)))
        except Exception as e:          # noqa: BLE001 - the candidate's failure, reported
            return {"status": "error", "error": "compiling: " + _error_text(e)}
        res = describe(wl)
        res["compile_s"] = time.perf_counter() - t0
        try:
            got = mod.run(*self.inputs)
        except Exception as e:          # noqa: BLE001
            return {**res, "status": "error", "error": "running: " + _error_text(e)}
        if self.ref is None:
            return {**res, "status": "error", "error": "the worker was set up without the default's outputs"}
        why = compare(got, self.ref, float(m.get("rtol", 2e-3)), float(m.get("atol", 1e-5)))
        if why is not None:
            return {**res, "status": "wrong", "error": why}
        # a candidate other than the default takes turns with the default's module, sample by
        # sample: its time relative to the default ("vs_default", the median of the ratios of
        # neighbouring samples) holds when the machine's speed drifts
        beside = self.default_mod is not None and res["values"] != self.default_values
        try:
            times = time_modules([mod, self.default_mod] if beside else [mod], self.inputs,
                                 int(m.get("repeat", 25)), float(m.get("min_sample_s", 2e-3)),
                                 float(m.get("max_measure_s", 2.0)), float(m.get("settle_s", 0.15)),
                                 int(m.get("flush_bytes", 0)))
        except Exception as e:          # noqa: BLE001
            return {**res, "status": "error", "error": "timing: " + _error_text(e)}
        finally:
            del mod
            gc.collect()
        out = {**res, "status": "ok", **{k: v for k, v in times[0].items() if k != "samples"}, "vs_default": 1.0,
               "flush_bytes": int(m.get("flush_bytes", 0))}
        if beside:      # the median of the ratios of samples taken one after the other
            out["default_window_ms"] = times[1]["median_ms"]
            out["vs_default"] = statistics.median(a / b for a, b in zip(times[0]["samples"], times[1]["samples"]))
        return out


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 2000 else text[:2000] + " ..."


def main() -> int:
    """Serve requests (module docstring) until standard input closes or ``exit``."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                       # everything else written to fd 1 goes to stderr
    sys.stdout = sys.stderr
    w = Worker()
    try:
        load_plugins()
        proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    except Exception as e:              # noqa: BLE001
        proto.write(json.dumps({"ready": False, "error": _error_text(e)}) + "\n")
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        op = msg.get("op")
        try:
            if op == "exit":
                break
            elif op == "setup":
                reply = w.setup(msg)
            elif op == "resolve":
                reply = w.resolve(msg)
            elif op == "measure":
                reply = w.measure(msg)
            else:
                reply = {"ok": False, "status": "error", "error": f"unknown request {op!r}"}
        except Exception as e:          # noqa: BLE001 - reported to the tuner
            traceback.print_exc()
            reply = {"ok": False, "status": "error", "error": _error_text(e)}
        proto.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
