"""``tensorfuse.verify``: check a compiled model against onnxruntime and name the rewrite that
changed the numbers.

1. The model is compiled at O0 (every op its own kernel) and at the chosen level; both run on
   the same fixed-seed inputs as onnxruntime with its graph optimisations off (the reference of
   ONNX semantics, as in the test suite). Every graph output is compared: an element passes
   when ``|got - ref| <= atol + rtol * |ref|`` (``numpy.allclose``'s rule; NaN only where the
   reference has NaN).
2. When the chosen level fails and O0 passes, the rule applications (``Module.rewrite_log``) are
   bisected: the model is recompiled with only the first ``n`` applications
   (``compiler.rewrite.application_limit``; the driver is deterministic, so these are exactly
   the first ``n`` log entries), by halves down to a window of ``LINEAR_WINDOW`` and then one
   by one, to the first application after which the outputs leave the tolerance. The report
   names that rule, the ONNX nodes it matched (traced through earlier rewrites) and the max
   error before and after it.
3. Each kernel call (a fused group, or one op) of the compiled module is run on its own, in run
   order, and every value it writes that exists in the ONNX model (tracing renamed values back
   through the rewrites' ``values`` maps) is compared with onnxruntime's value of that name,
   added as an extra onnxruntime output. The first group beyond the tolerance is named.

Costs: each bisection step is a full compile (about log2(applications) + LINEAR_WINDOW of them).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from tensorfuse.ir.errors import TensorfuseError

__all__ = ["verify", "VerifyResult", "OutputCheck", "Culprit", "GroupCheck", "random_inputs", "compare",
           "reference_session"]

#: the bisection scans the last window of at most this many applications one by one
LINEAR_WINDOW = 4
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-4
#: a quantized model's float output passes when its relative L2 error against the unfused QDQ
#: semantics is at most twice onnxruntime's own fused int8 error, or this (docs/quantization.md)
QUANT_REL_L2 = 0.01


# ----------------------------------------------------------------------------- comparisons
@dataclass
class OutputCheck:
    """One compared tensor: its name, whether it is within tolerance, the max absolute error,
    and the normalised error ``max(|got - ref| / (atol + rtol * |ref|))`` (<= 1 passes)."""

    name: str
    ok: bool
    max_abs: float
    score: float
    note: str = ""

    def __str__(self) -> str:
        mark = "ok      " if self.ok else "MISMATCH"
        extra = f" ({self.note})" if self.note else ""
        return f"{mark} {self.name}: max abs error {self.max_abs:.3g}{extra}"


def quantization_steps(proto) -> dict[str, float]:
    """{ONNX value name: its quantization step} of a quantized model (docs/quantization.md, the
    numerical contract: each quantized tensor within one step of the unfused QDQ semantics):
    1 for the output of a QuantizeLinear (integer units), the scale for the output of a
    DequantizeLinear with one constant scale. Empty for a float model."""
    from onnx import numpy_helper
    consts = {t.name: t for t in proto.graph.initializer}
    consts.update({n.output[0]: a.t for n in proto.graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    steps: dict[str, float] = {}
    for n in proto.graph.node:
        if n.op_type == "QuantizeLinear" and n.output:
            steps[n.output[0]] = 1.0
        elif n.op_type == "DequantizeLinear" and len(n.input) > 1 and n.input[1] in consts:
            s = numpy_helper.to_array(consts[n.input[1]])
            if s.size == 1:
                steps[n.output[0]] = abs(float(s.reshape(())))
    return steps


def compare(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float,
            step: float | None = None, rel_limit: float = 0.0) -> OutputCheck:
    """Compare ``got`` with the reference ``ref`` (see the module docstring). ``step``: the
    value's quantization step (:func:`quantization_steps`): a difference of one step passes
    (integers: 1; floats: ``atol`` is at least the step); beyond it a float value passes when
    its relative L2 error is at most ``rel_limit`` (docs/quantization.md, the model-level rule)."""
    if step is not None:
        got_a = np.asarray(got)
        if got_a.dtype.kind not in "fc":
            diff = np.abs(got_a.astype(np.float64) - np.asarray(ref).astype(np.float64)) if got_a.shape == np.shape(ref) else None
            if diff is not None:
                ok = diff.size == 0 or float(diff.max()) <= step
                far = int(np.count_nonzero(diff > step)) if diff.size else 0
                return OutputCheck(name, ok, float(diff.max()) if diff.size else 0.0,
                                   float(diff.max()) / step if diff.size else 0.0,
                                   "within one quantization step" if ok else f"{far} elements beyond one step")
        chk = compare(name, got, ref, rtol, max(atol, step * (1 + 1e-6)))
        if chk.ok and chk.max_abs > atol + 0.0:
            chk.note = f"within one quantization step ({step:.3g})"
        elif not chk.ok and np.shape(got) == np.shape(ref):
            # a one-step difference upstream (a .5 tie rounded the other way) moves what follows
            # by more than a step; the model-level rule of docs/quantization.md: relative L2 <= 1%
            g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
            rel = float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
            if rel <= rel_limit:
                chk = OutputCheck(name, True, chk.max_abs, chk.score,
                                  f"relative L2 error {rel:.2e} <= {rel_limit:.2e}: steps upstream propagate")
            else:
                chk.note = f"relative L2 error {rel:.2e} > {rel_limit:.2e}"
        return chk
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return OutputCheck(name, False, float("inf"), float("inf"),
                           f"shape {list(got.shape)}, expected {list(ref.shape)}")
    if got.size == 0:
        return OutputCheck(name, True, 0.0, 0.0)
    if got.dtype.kind not in "fc":
        bad = int(np.count_nonzero(got != ref))
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        return OutputCheck(name, bad == 0, float(diff.max()), float(bad > 0) * float("inf"),
                           f"{bad} elements differ" if bad else "")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    if (nan_g != nan_r).any():
        n = int((nan_g != nan_r).sum())
        return OutputCheck(name, False, float("inf"), float("inf"), f"{n} elements NaN in one and not the other")
    mask = ~nan_r
    diff = np.where(mask, np.abs(g - r), 0.0)
    diff = np.where(np.isinf(r) & (g == r), 0.0, diff)
    score = float((diff / (atol + rtol * np.abs(np.where(mask, r, 0.0)))).max())
    return OutputCheck(name, score <= 1.0, float(diff.max()), score)


#: ops through which an integer graph input still indexes a Gather's table unchanged, besides
#: the reshapes (``OpDef.reshape_only``: Reshape, Flatten, Squeeze, Unsqueeze)
_INDEX_PASSTHROUGH = ("Cast", "Identity")


def _passes_indices(node) -> bool:
    from tensorfuse.ir.registry import find_op
    if node.op_type in _INDEX_PASSTHROUGH and node.domain in ("", "ai.onnx"):
        return True
    od = find_op(node.op_type, node.domain)
    return od is not None and od.reshape_only


def index_limits(model) -> dict[str, int]:
    """For an ONNX model (path, bytes or ModelProto): each graph input that is the ``indices``
    of a Gather whose ``data`` is an initializer (directly or through Cast/Reshape/Unsqueeze/
    Squeeze/Flatten/Identity), mapped to the number of rows along the Gather's axis: the ids a
    random input may take (token_type_ids of a BERT export index a table of 2)."""
    from tensorfuse.compiler.frontend.onnx import load_model
    proto = load_model(model)
    g = proto.graph
    inits = {t.name: list(t.dims) for t in g.initializer}
    inputs = {vi.name for vi in g.input} - set(inits)
    source = {n: n for n in inputs}           # value -> the graph input it passes through from
    for node in g.node:
        if _passes_indices(node) and node.input and node.input[0] in source:
            for o in node.output:
                source[o] = source[node.input[0]]
    limits: dict[str, int] = {}
    for node in g.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in inits \
                and node.input[1] in source:
            dims = inits[node.input[0]]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if dims and -len(dims) <= axis < len(dims):
                name = source[node.input[1]]
                limits[name] = min(limits.get(name, dims[axis]), dims[axis])
    return limits


def random_inputs(input_info, seed: int = 0, limits: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Fixed-seed inputs for a module's ``input_info``: floats standard normal, integers in
    [0, 10) (valid as ids and indices for most models) or [0, ``limits[name]``) where that is
    smaller (:func:`index_limits`), booleans uniform."""
    rng = np.random.default_rng(seed)
    limits = limits or {}
    out = {}
    for info in input_info:
        dt, shape = np.dtype(info.dtype), tuple(info.shape)
        if dt.kind == "f":
            out[info.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            out[info.name] = rng.integers(0, max(1, min(10, limits.get(info.name, 10))), shape).astype(dt)
        elif dt.kind == "b":
            out[info.name] = rng.random(shape) < 0.5
        else:
            raise TensorfuseError(f"input '{info.name}': cannot make random values of dtype {dt}; "
                                  f"give the inputs")
    return out


# ----------------------------------------------------------------------------- result
@dataclass
class Culprit:
    """The first rule application after which the outputs leave the tolerance: its position in
    the rewrite log (1-based), rule, matched IR nodes, the ONNX nodes behind them, the created
    nodes, and the worst output's max abs error with the applications before it and with it."""

    index: int
    rule: str
    nodes: list[str]
    onnx_nodes: list[str]
    created: list[str]
    error_before: float
    error_after: float
    output: str

    def __str__(self) -> str:
        return (f"first bad rewrite: application {self.index}, rule {self.rule}, on ONNX nodes "
                f"{', '.join(self.onnx_nodes)}\n"
                f"  max abs error of output '{self.output}': {self.error_before:.3g} before it, "
                f"{self.error_after:.3g} after it")


@dataclass
class GroupCheck:
    """One kernel call's output compared with onnxruntime's value of the same ONNX name."""

    call: int
    kernel: str
    nodes: list[str]
    ops: list[str]
    onnx_nodes: list[str]
    value: str
    check: OutputCheck

    def __str__(self) -> str:
        return (f"group {', '.join(self.nodes)} ({'+'.join(self.ops)}; kernel {self.kernel}; ONNX nodes "
                f"{', '.join(self.onnx_nodes)}): value '{self.value}' max abs error {self.check.max_abs:.3g}")


@dataclass
class VerifyResult:
    """What :func:`verify` found; ``str()`` is the report, ``ok`` whether every output of the
    chosen level (and of O0) is within tolerance."""

    model: str
    opt_level: int
    rtol: float
    atol: float
    seed: int
    o0: list[OutputCheck]
    level: list[OutputCheck]
    applications: int
    culprit: Culprit | None = None
    bisect_steps: list[tuple[int, float]] = field(default_factory=list)   # (n, worst output error)
    groups_compared: int = 0
    first_bad_group: GroupCheck | None = None
    group_level: int | None = None
    notes: list[str] = field(default_factory=list)
    #: the target compiled for, and whether the inputs were given (the seed then plays no part)
    target: str = "llvm"
    inputs_given: bool = False
    #: the rules under test (``rules=``) and how many times each was applied at ``opt_level``
    rule_counts: dict[str, int] = field(default_factory=dict)
    #: the inputs the models ran on ({name: array})
    inputs: dict = field(default_factory=dict, repr=False)

    @property
    def rules_not_fired(self) -> list[str]:
        """The rules under test that were never applied at ``opt_level``: a PASS says nothing
        about them."""
        return [r for r, n in self.rule_counts.items() if n == 0]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.o0) and all(c.ok for c in self.level)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        src = "the given inputs" if self.inputs_given else f"random inputs (seed {self.seed})"
        lines = [f"verify {self.model}: O0 and O{self.opt_level} for target {self.target!r} against onnxruntime "
                 f"(optimisations off), {src}, rtol {self.rtol:g}, atol {self.atol:g}"]
        for lvl, checks in ((0, self.o0), (self.opt_level, self.level)):
            lines.append(f"O{lvl}:")
            lines += [f"  {c}" for c in checks]
        lines.append(f"{self.applications} rule application{'' if self.applications == 1 else 's'} "
                     f"at O{self.opt_level}")
        for r, n in self.rule_counts.items():
            lines.append(f"rule under test {r}: applied {n} time{'' if n == 1 else 's'}")
        for r in self.rules_not_fired:
            lines.append(f"warning: rule under test {r} never fired at O{self.opt_level}, so this run did not "
                         f"check it (tensorfuse explain MODEL --rules ... --rule {r} says why at each node)")
        if self.culprit is not None:
            lines.append(str(self.culprit))
            lines.append(f"  bisection: {len(self.bisect_steps)} compiles, "
                         + ", ".join(f"n={n}: {e:.3g}" for n, e in self.bisect_steps))
        if self.group_level is not None:
            if self.first_bad_group is not None:
                lines.append(f"first group that diverges at O{self.group_level} "
                             f"({self.groups_compared} values compared): {self.first_bad_group}")
            else:
                lines.append(f"fused groups at O{self.group_level}: {self.groups_compared} intermediate values "
                             f"compared with onnxruntime, all within tolerance")
        lines += [f"note: {n}" for n in self.notes]
        lines.append("result: " + ("PASS" if self.ok else "MISMATCH"))
        return "\n".join(lines)

    __repr__ = __str__


# ----------------------------------------------------------------------------- onnxruntime
def reference_session(model: Any):
    """An onnxruntime InferenceSession that computes ONNX semantics, the reference of
    :func:`verify` and of ``tensorfuse.testing``: the CPU provider with every graph optimisation
    off (``ORT_DISABLE_ALL``: onnxruntime's own rewrites are not what is checked), one thread,
    warnings off. ``model``: a ModelProto, serialized bytes or a path. Raises ImportError
    without onnxruntime, and onnxruntime's own errors for a model it cannot load."""
    import onnx
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(src if isinstance(src, bytes) else str(src), so, providers=["CPUExecutionProvider"])


def _ort_values(proto, inputs: dict[str, np.ndarray], extra: Sequence[str]) -> tuple[dict, list[str]]:
    """Run onnxruntime (:func:`reference_session`); returns ({name: value} for the graph
    outputs and the ``extra`` intermediate values it could give, notes)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise TensorfuseError("tensorfuse.verify needs onnxruntime as the reference: pip install onnxruntime") \
            from None
    import onnx
    outs = [o.name for o in proto.graph.output]
    notes: list[str] = []
    if extra:
        m = onnx.ModelProto()
        m.CopyFrom(proto)
        have = set(outs)
        for name in extra:
            if name not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=name))
                have.add(name)
        try:
            sess = reference_session(m)
            names = [o.name for o in sess.get_outputs()]
            return dict(zip(names, sess.run(None, inputs))), notes
        except Exception as e:      # noqa: BLE001 - fall back to the plain model
            notes.append(f"onnxruntime could not expose the intermediate values ({type(e).__name__}); "
                         f"groups were not compared")
    try:
        sess = reference_session(proto)
        return dict(zip(outs, sess.run(None, inputs))), notes
    except Exception as e:          # noqa: BLE001
        raise TensorfuseError(f"onnxruntime cannot run the model, so there is no reference: "
                              f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}") from None


# ----------------------------------------------------------------------------- the checks
def _checked_inputs(mod, inputs: dict) -> dict:
    """``inputs`` as ``mod.run`` would take them, checked before onnxruntime sees them (its
    message is cut off): ValueError naming an unknown or missing input, or one whose dtype or
    shape is not the model's (``input 'x': expected shape [1, 3, 224, 224], got [1, 3, 112, 112]``)."""
    infos = mod.input_info
    unknown = sorted(set(inputs) - {i.name for i in infos})
    if unknown:
        raise ValueError(f"verify() got unknown input(s) {unknown}; the model's inputs are {[i.name for i in infos]}")
    missing = [i.name for i in infos if i.name not in inputs]
    if missing:
        raise ValueError(f"verify() lacks the model's input(s) {missing}")
    return {i.name: mod._check_input(i, inputs[i.name]) for i in infos}


def _quant_tolerances(proto, inputs: dict, ref: dict) -> dict[str, tuple[float, float]]:
    """{value: (quantization step, relative L2 limit)} of a quantized model: the step from
    :func:`quantization_steps`; the limit max(2 x onnxruntime's fused error, QUANT_REL_L2) for
    its graph outputs (onnxruntime with all optimisations, its int8 kernels), 0 elsewhere."""
    steps = quantization_steps(proto)
    if not steps:
        return {}
    out = {name: (st, 0.0) for name, st in steps.items()}
    import onnxruntime as ort
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for name, fused in zip(names, sess.run(None, inputs)):
        r = np.asarray(ref[name], np.float64)
        if r.dtype.kind != "f" and np.asarray(fused).dtype.kind not in "fc":
            continue
        rel = float(np.linalg.norm(np.asarray(fused, np.float64) - r) / max(np.linalg.norm(r), 1e-30))
        out[name] = (out.get(name, (0.0, 0.0))[0] or 0.0, max(2 * rel, QUANT_REL_L2))
    return out


def _check_outputs(mod, inputs, ref: dict, rtol: float, atol: float, steps: dict | None = None) -> list[OutputCheck]:
    got = mod.run(**inputs)
    steps = steps or {}
    return [compare(name, g, ref[name], rtol, atol, *steps.get(name, (None, 0.0)))
            for name, g in zip(mod.output_names, got)]


def _worst(checks: list[OutputCheck]) -> OutputCheck:
    return max(checks, key=lambda c: (c.score, c.max_abs))


def _onnx_name_of(log) -> "callable":
    """IR value name -> the ONNX value name it replaced (followed back through the rewrites)."""
    back: dict[str, str] = {}
    for app in log or ():
        for old, new in (getattr(app, "values", None) or {}).items():
            back.setdefault(new, old)

    def resolve(name: str, known: set) -> str | None:
        seen = set()
        while name not in known:
            if name in seen or name not in back:
                return None
            seen.add(name)
            name = back[name]
        return name
    return resolve


@contextlib.contextmanager
def _one_call_at_a_time(mod, arrays):
    """Run a module's kernel calls one by one on this thread: yields an iterator of
    ``(index, call, read)`` after each call, where ``read(slot)`` copies that slot's value to a
    host array. The CPU module calls each kernel through its slot table; a cuda module
    (``runtime.cuda_module``) launches each call alone and synchronizes."""
    arena = mod._acquire()
    gen = None
    try:
        if getattr(mod, "backend", "llvm") == "cuda":
            from tensorfuse.runtime import cuda_module as cm
            args = mod._bind(arena, arrays, False)

            def calls():
                with cm._SIM_LAUNCH_LOCK if mod._simulated else contextlib.nullcontext():
                    for k, c in enumerate(mod._program.calls):
                        mod._lib.launch(c.kernel, [args[s] for s in c.slots])
                        mod._cuda.synchronize()
                        yield k, c, lambda s: args[s].copy_to_host()
        else:
            outs = [np.empty(i.shape, i.dtype) for i in mod.output_info]   # a local: alive while the kernels write them
            mod._bind(arena, arrays, outs)

            def read(s):
                n = mod._program.slots[s].nbytes
                return np.frombuffer((ctypes.c_char * n).from_address(arena.table[s]),
                                     dtype=mod._program.slots[s].dtype).copy()

            def calls():
                for k, c in enumerate(mod._program.calls):
                    args = (ctypes.c_void_p * max(len(c.slots), 1))(*[arena.table[s] for s in c.slots])
                    mod._kernel_fn(c.kernel)(ctypes.addressof(args), None)
                    yield k, c, read
        gen = calls()
        yield gen
    finally:
        if gen is not None:
            gen.close()             # a check that stopped early leaves the simulator's launch lock
        mod._release(arena)


def _group_checks(mod, inputs, ref: dict, rtol: float, atol: float,
                  steps: dict | None = None) -> tuple[int, GroupCheck | None]:
    """Run the module's kernel calls one at a time (single-threaded), compare each value a call
    writes first that has an onnxruntime value of the same ONNX name. Returns (number of values
    compared, the first beyond tolerance or None). Works for llvm and cuda modules."""
    prog = mod._program
    resolve = _onnx_name_of(getattr(mod, "rewrite_log", None))
    known = set(ref)
    arrays = mod._check_inputs((), inputs)
    written: set[int] = set(prog.inputs) | set(prog.consts)
    compared = 0
    with _one_call_at_a_time(mod, arrays) as calls:
        for k, c, read in calls:
            for s in c.slots:
                if s in written:
                    continue
                written.add(s)
                info = prog.slots[s]
                if info.kind not in ("temp", "output"):
                    continue
                name = resolve(info.name, known)
                if name is None:
                    continue
                got = read(s).reshape(info.shape) if info.nbytes else np.empty(info.shape, info.dtype)
                chk = compare(name, got, ref[name], rtol, atol, *(steps or {}).get(name, (None, 0.0)))
                compared += 1
                if not chk.ok:
                    return compared, GroupCheck(k, c.kernel, list(c.nodes), list(c.ops), mod.source_nodes(c),
                                                name, chk)
    return compared, None


def verify(model: Any, opt_level: int = 2, *, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
           inputs: dict[str, np.ndarray] | None = None, seed: int = 0, input_shapes: dict | None = None,
           disabled_rules: Iterable[str] = (), rules: Iterable = (), target: str = "llvm",
           bisect: bool = True, groups: bool = True, tuning=None,
           num_threads: int | None = None) -> VerifyResult:
    """Compile ``model`` at O0 and at ``opt_level``, run both and onnxruntime on the same
    inputs, compare every graph output, and on a mismatch find the first rule application that
    moved the outputs beyond tolerance and the first fused group that diverges (see the module
    docstring for the method).

    model: a path, bytes or ``onnx.ModelProto``. opt_level: 1..3. rtol, atol: the tolerance
    (``|got - ref| <= atol + rtol * |ref|`` elementwise; defaults 1e-3 and 1e-4, float32 sums
    in a different order). inputs: {name: array}; default :func:`random_inputs` with ``seed``.
    input_shapes, disabled_rules, target, tuning, num_threads: as for ``tensorfuse.compile`` (both compiles
    use the tuning records). rules: rules under
    test, as for ``tensorfuse.compile`` (each tried before the built-in rules of its set); the
    result counts each one's applications (``rule_counts``) and its report warns about one
    that never fired (``rules_not_fired``: the outputs then say nothing about it; ``ok`` is not
    changed by it). bisect, groups: switch the bisection and the group comparison off.

    Returns a :class:`VerifyResult` (``str()`` is the report, ``.ok``, ``.culprit``,
    ``.first_bad_group``); prints nothing. Raises ModelLoadError / UnsupportedModelError /
    CompileError as ``compile`` does, TensorfuseError when onnxruntime cannot run the model,
    ValueError for a bad opt_level or tolerance, or for ``inputs`` with an unknown or missing
    name or a dtype or shape that is not the model's (naming the input, expected and got).
    """
    from tensorfuse import progress
    from tensorfuse.compiler.driver import compile as tf_compile
    from tensorfuse.compiler.frontend.onnx import load_model
    from tensorfuse.compiler.pipeline import rules_under_test
    from tensorfuse.compiler.rewrite import application_limit
    from tensorfuse.runtime.profile import trace_sources

    if opt_level not in (1, 2, 3):
        raise ValueError(f"verify compares O0 with opt_level 1, 2 or 3, got {opt_level!r}")
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol!r}, atol={atol!r}")
    proto = load_model(model)
    label = os.fspath(model) if isinstance(model, (str, os.PathLike)) else (proto.graph.name or "model")
    rules = rules_under_test(rules)
    if tuning is not None:
        from tensorfuse.compiler.tuning import as_tuning
        tuning = as_tuning(tuning, target)      # read once, not at every compile
    kw = dict(target=target, input_shapes=input_shapes, disabled_rules=list(disabled_rules), rules=rules,
              tuning=tuning, num_threads=num_threads)

    def build(level: int, limit: int | None = None, cache: bool = True):
        # a rule under test is compiled afresh: its file may import helpers the cache key cannot see
        with application_limit(limit):
            return tf_compile(proto, opt_level=level, cache=cache and not rules and limit is None, **kw)

    given = inputs is not None
    progress.status("verify: compiling at O0")
    mod0 = build(0)
    from tensorfuse.compiler.specialize import SpecializingModule
    if isinstance(mod0, SpecializingModule):    # shapes depend on input values: compare for these
        need = mod0.specialized_on
        if inputs is None or any(n not in inputs for n in need):
            from tensorfuse.ir.errors import UnsupportedModelError
            raise UnsupportedModelError(f"the shapes of this model depend on the values of input(s) {need}: "
                                        f"verify needs inputs= with every input")
        proto = mod0.specialized_model(**{n: inputs[n] for n in need})
        inputs = {k: v for k, v in inputs.items() if k not in need}
        mod0 = build(0)
    if inputs is None:
        inputs = random_inputs(mod0.input_info, seed, index_limits(proto))
    else:
        inputs = _checked_inputs(mod0, inputs)
    progress.status(f"verify: compiling at O{opt_level}")
    mod = build(opt_level)
    log = list(getattr(mod, "rewrite_log", None) or [])
    onnx_values = [o for n in proto.graph.node for o in n.output if o]
    progress.status("verify: running onnxruntime")
    ref, notes = _ort_values(proto, inputs, onnx_values if groups else [])
    steps = _quant_tolerances(proto, inputs, ref)
    res = VerifyResult(label, opt_level, rtol, atol, seed, _check_outputs(mod0, inputs, ref, rtol, atol, steps),
                       _check_outputs(mod, inputs, ref, rtol, atol, steps), len(log), notes=notes,
                       target=str(target), inputs_given=given,
                       rule_counts={(r.__name__ if isinstance(r, type) else r.name): 0 for r in rules})
    res.inputs = dict(inputs)
    for a in log:
        if a.rule in res.rule_counts:
            res.rule_counts[a.rule] += 1
    if steps:
        res.notes.append("a quantized model: a tensor within one quantization step of onnxruntime's unfused "
                         "QDQ semantics passes (docs/quantization.md)")
    o0_ok = all(c.ok for c in res.o0)
    lvl_ok = all(c.ok for c in res.level)
    if not o0_ok:
        res.notes.append("O0 (no rewrites) already differs from onnxruntime: an op's lowering is wrong, "
                         "not a rule; the group comparison at O0 names the op")
    elif not lvl_ok and bisect:
        if not log:
            res.notes.append(f"O{opt_level} made no rule applications: the difference comes from grouping "
                             f"(fuse_ops) or code generation; see the group comparison")
        else:
            cache_errs: dict[int, list[OutputCheck]] = {len(log): res.level}

            def checks(n: int) -> list[OutputCheck]:
                if n not in cache_errs:
                    progress.status(f"verify: bisecting {len(log)} rule applications: compiling with the first {n}")
                    cache_errs[n] = _check_outputs(build(opt_level, n, cache=False), inputs, ref, rtol, atol, steps)
                    res.bisect_steps.append((n, _worst(cache_errs[n]).max_abs))
                return cache_errs[n]

            if not all(c.ok for c in checks(0)):
                res.notes.append(f"O{opt_level} with no rule applied already differs: the difference comes "
                                 f"from grouping (fuse_ops) or code generation; see the group comparison")
            else:
                lo, hi = 0, len(log)            # lo passes, hi fails
                while hi - lo > LINEAR_WINDOW:
                    mid = (lo + hi) // 2
                    if all(c.ok for c in checks(mid)):
                        lo = mid
                    else:
                        hi = mid
                for n in range(lo + 1, hi + 1):
                    if not all(c.ok for c in checks(n)):
                        hi = n
                        break
                    lo = n
                app = log[hi - 1]
                worst = _worst(checks(hi))
                before = next(c for c in checks(hi - 1) if c.name == worst.name)
                res.culprit = Culprit(hi, app.rule, list(app.nodes), trace_sources(list(app.nodes), log[:hi - 1]),
                                      list(app.created), before.max_abs, worst.max_abs, worst.name)
    if groups and not notes:
        target_mod, lvl = (mod0, 0) if not o0_ok else (mod, opt_level)
        progress.status(f"verify: comparing the groups of O{lvl} with onnxruntime")
        res.group_level = lvl
        res.groups_compared, res.first_bad_group = _group_checks(target_mod, inputs, ref, rtol, atol, steps)
    progress.status(None)
    return res
