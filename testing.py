"""Checking models and rewrite rules against onnxruntime: ``tensorfuse.testing``.

For people who write rules or ops outside the repository's test suite (the suite's own helpers in
``tests/oracle.py`` work only there). onnxruntime is the oracle, run with every graph
optimisation off (``ORT_DISABLE_ALL``, one thread), so it computes ONNX semantics and not its
own rewrites. Needs the ``onnxruntime`` package.

- :func:`ort_run`: a model's outputs from onnxruntime;
- :func:`random_inputs` / :func:`rand`: fixed-seed inputs;
- :func:`assert_matches_ort`: compile at several optimisation levels and compare every output;
- :func:`check_rule`: the three checks every rule needs in one call: the rule fires (or, with
  ``fires=False``, does not) on the model, and the outputs with the rule, without it and from
  onnxruntime agree. A rule under test is given as its class, as to ``tensorfuse.compile(model,
  rules=[...])``. Returns a :class:`RuleCheck`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

__all__ = ["RuleCheck", "assert_matches_ort", "check_rule", "ort_run", "ort_session", "rand", "random_inputs"]


def ort_session(model: Any):
    """An onnxruntime InferenceSession (CPU, optimisations off, one thread) for a ModelProto,
    serialized bytes or a path: the reference ``tensorfuse.verify`` uses
    (``compiler.verify.reference_session``)."""
    from tensorfuse.compiler.verify import reference_session
    return reference_session(model)


def ort_run(model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs (graph output order) for ``inputs`` ({name: array})."""
    return ort_session(model).run(None, inputs)


def rand(*shape, dtype=np.float32, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """A fixed-seed array: uniform in [low, high) for floats, integers in [low, high] for ints,
    fair booleans for bool."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def random_inputs(model: Any, seed: int = 0, input_shapes: dict[str, Sequence[int]] | None = None,
                  int_range: tuple[int, int] = (0, 10)) -> dict[str, np.ndarray]:
    """Fixed-seed inputs for every graph input of ``model`` (not initializers) with its declared
    dtype and shape (``input_shapes`` gives dynamic dimensions): floats in [-2, 2), integers in
    ``int_range``. Raises ValueError naming an input whose shape is not static."""
    import onnx
    from onnx import helper

    from tensorfuse.compiler.frontend.onnx import load_model
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    inits = {t.name for t in proto.graph.initializer}
    out = {}
    for k, vi in enumerate(v for v in proto.graph.input if v.name not in inits):
        tt = vi.type.tensor_type
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if input_shapes and vi.name in input_shapes:
            shape = tuple(int(d) for d in input_shapes[vi.name])
        else:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if any(d is None for d in dims):
                raise ValueError(f"input '{vi.name}' has a dynamic shape {dims}: give it with input_shapes=")
            shape = tuple(dims)
        lo, hi = int_range if np.issubdtype(dt, np.integer) else (-2.0, 2.0)
        out[vi.name] = rand(*shape, dtype=dt, seed=seed + k, low=lo, high=hi)
    return out


def _compare(got, want, rtol: float, atol: float, what: str) -> float:
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} outputs, onnxruntime gives {len(want)}")
    worst = 0.0
    for i, (g, e) in enumerate(zip(got, want)):
        if g.dtype != e.dtype or g.shape != e.shape:
            raise AssertionError(f"{what} output {i}: {g.dtype}{list(g.shape)}, onnxruntime gives "
                                 f"{e.dtype}{list(e.shape)}")
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{what} output {i}")
        if g.size and np.issubdtype(g.dtype, np.number):
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64)))))
    return worst


def assert_matches_ort(model: Any, inputs: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6,
                       opt_levels: Sequence[int] = (0, 2), **compile_kw) -> list[np.ndarray]:
    """Compile at each optimisation level, run, and compare every output with onnxruntime
    (dtype, shape, and values within ``rtol`` / ``atol`` as ``numpy.testing.assert_allclose``).
    Returns tensorfuse's outputs at the last level; raises AssertionError naming the level and
    output that differ."""
    import tensorfuse
    expected = ort_run(model, inputs)
    got = None
    for lvl in opt_levels:
        got = tensorfuse.compile(model, opt_level=lvl, **compile_kw).run(**inputs)
        _compare(got, expected, rtol, atol, f"O{lvl}")
    return got


@dataclass
class RuleCheck:
    """What :func:`check_rule` found: the rule's applications (``compiler.rewrite.Application``:
    matched and created node names), the largest absolute difference from onnxruntime with the
    rule and without it, and the optimised graph with the rule."""

    rule: str
    applications: list = field(default_factory=list)
    max_abs_err: float = 0.0
    max_abs_err_without: float = 0.0
    graph: Any = None

    def __str__(self) -> str:
        where = "; ".join(", ".join(a.nodes) for a in self.applications) or "nowhere"
        return (f"{self.rule}: {len(self.applications)} application(s) at {where}; max |err| against "
                f"onnxruntime {self.max_abs_err:.3g} with the rule, {self.max_abs_err_without:.3g} without")


def check_rule(model: Any, rule, inputs: dict[str, np.ndarray] | None = None, *, fires: bool = True,
               opt_level: int = 2, rtol: float = 1e-5, atol: float = 1e-6, seed: int = 0, rules=(),
               **compile_kw) -> RuleCheck:
    """Check one rewrite rule on one model against onnxruntime.

    ``rule``: a rule class or instance (a rule under test, or a built-in one), or the name of
    a built-in rule or of one in ``rules``. A rule that is not built in joins the pipeline as
    ``tensorfuse.compile(model, rules=[rule, *rules])`` adds it: tried before the built-in
    rules of its set (docs/writing-a-fusion-rule.md). Compiles ``model`` at ``opt_level``
    (default 2; numerics-changing rules need 3) with the rule, and again with it disabled;
    checks that the rule was applied at least once (``fires=True``) or never
    (``fires=False``), and that both compiled models give onnxruntime's outputs (rtol / atol
    as ``numpy.testing.assert_allclose``). ``inputs``: {name: array}; default
    :func:`random_inputs` (``seed``). ``rules``: other rules under test; ``compile_kw``: more
    options of ``tensorfuse.compile``. Returns a :class:`RuleCheck`. Raises AssertionError
    saying which check failed (a rule that never fired: with the rule log), ValueError for an
    unknown rule name or a bad rule.
    """
    import tensorfuse
    from tensorfuse.compiler.options import rule_names
    from tensorfuse.compiler.pipeline import all_rules, rules_under_test
    rules = list(rules_under_test(rules))
    if isinstance(rule, str):
        name = rule
        if name not in all_rules(rules):
            raise ValueError(f"unknown rule {name!r}: give the rule class (a rule under test), or a name of "
                             f"compiler.pipeline.all_rules()")
    else:
        name = rule.__name__ if isinstance(rule, type) else rule.name
        known = all_rules(rules).get(name)
        if known is not rule and known is not type(rule):
            rules = list(rules_under_test(rules + [rule]))     # a rule under test
    compile_kw.setdefault("cache", False)
    if inputs is None:
        inputs = random_inputs(model, seed=seed, input_shapes=compile_kw.get("input_shapes"))
    expected = ort_run(model, inputs)
    disabled = list(rule_names(compile_kw.pop("disabled_rules", ())))
    with_rule = tensorfuse.compile(model, opt_level=opt_level, rules=rules, disabled_rules=disabled, **compile_kw)
    apps = [a for a in with_rule.rewrite_log if a.rule == name]
    if fires and not apps:
        log = "\n  ".join(str(a) for a in with_rule.rewrite_log) or "(no rule applied)"
        raise AssertionError(f"{name} did not fire at O{opt_level}, so nothing about it was checked; the rule "
                             f"log:\n  {log}\n(tensorfuse.explain(model, {name}, rules=...) says why at each "
                             f"candidate node)")
    if not fires and apps:
        raise AssertionError(f"{name} fired where it must not: " + "; ".join(str(a) for a in apps))
    err = _compare(with_rule.run(**inputs), expected, rtol, atol, f"with {name} at O{opt_level}")
    without = tensorfuse.compile(model, opt_level=opt_level, rules=rules, disabled_rules=disabled + [name],
                                 **compile_kw)
    err0 = _compare(without.run(**inputs), expected, rtol, atol, f"without {name} at O{opt_level}")
    return RuleCheck(name, apps, err, err0, with_rule.graph)
