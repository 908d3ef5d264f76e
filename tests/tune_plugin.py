"""A test-only tuning plugin: schedules with knobs whose values make a candidate fail, for the
tuner's tests (tests/test_tune.py, tests/test_tune_ray.py).

The tuner and its worker processes import it through ``$TENSORFUSE_TUNE_PLUGINS`` (a path to
this file; ``compiler.tuner.worker.PLUGINS_ENV``); the tests import it themselves and call
:func:`install` / :func:`uninstall` around their use. Importing installs it.

It wraps the MatMul lowering so that it first dispatches the schedule key
:data:`KEY` (``ir.strategy.dispatch``); two llvm schedules are registered there, each for one
unusual shape only, so no other model or test sees them:

- ``test_faulty`` for ``MatMul f32[3,37] x f32[37,5]``: knob ``fault`` in :data:`FAULTS`;
  "none" (the default) is MatMul's own lowering (its schedules' knobs at their defaults, not
  part of this space); "raise" raises while lowering (status "error"),
  "exit" ends the process with ``os._exit(3)`` while lowering ("crash"), "hang" sleeps an hour
  ("timeout"), "wrong" doubles every output element ("wrong");
- ``test_variants`` for ``MatMul f32[4,16] x f32[16,6]``: knob ``variant`` in (0, 1, 2), each
  MatMul's own lowering at its defaults (all "ok");
- ``test_slow`` for ``MatMul f32[5,16] x f32[16,7]``: knob ``slow`` in (0, 1); 1 adds to every
  output element ``x - x`` of a chain of :data:`SLOW_STEPS` dependent steps x <- exp(-x) from
  |v| (x stays in (0, 1], so x - x is 0): the same values, many times slower (the model check's
  test).
"""
from __future__ import annotations

import os
import time

from tensorfuse.ir import strategy
from tensorfuse.ir.knobs import knob, knob_config
from tensorfuse.ir.registry import get_op

KEY = "test.tune_matmul"
FAULTS = ("none", "raise", "exit", "wrong", "hang")
FAULTY_SHAPES = ((3, 37), (37, 5))
VARIANT_SHAPES = ((4, 16), (16, 6))
SLOW_SHAPES = ((5, 16), (16, 7))
SLOW_STEPS = 64

_ORIG = {}


def _shapes(ctx) -> tuple:
    return tuple(tuple(v.shape) if v is not None else None for v in ctx.node.inputs)


def _matmul(ctx):
    """MatMul's own lowering with every knob of its schedules at the default, kept out of the
    test schedules' spaces (so those are exactly the knobs below)."""
    with knob_config(None):
        return _ORIG["lower"](ctx)


def _faulty(ctx):
    """a MatMul whose knob 'fault' makes it fail (tests only)"""
    fault = knob("fault", FAULTS, "none", doc="test only: how this candidate fails")
    if fault == "raise":
        raise RuntimeError("injected failure (fault=raise)")
    if fault == "exit":
        os._exit(3)
    if fault == "hang":
        time.sleep(3600)
    if fault == "wrong":
        ctx.epilogue = lambda v, idx: v * 2.0
    return _matmul(ctx)


def _variants(ctx):
    """a MatMul with three equal variants (tests only)"""
    knob("variant", (0, 1, 2), 0, doc="test only: three variants computing the same")
    return _matmul(ctx)


def _slow(ctx):
    """a MatMul whose knob 'slow' makes it many times slower, computing the same (tests only)"""
    if knob("slow", (0, 1), 0, doc="test only: a chain of exps added as 0 to each output"):
        from tensorfuse.ir.kernel import unop

        def epilogue(v, idx):
            x = unop("abs", v)          # a linear chain (each step reads x once): y <- exp(-y) in (0, 1]
            for _ in range(SLOW_STEPS):
                x = unop("exp", unop("neg", x))
            return v + (x - x)
        ctx.epilogue = epilogue
    return _matmul(ctx)


def _lower(ctx):
    if ctx.target.kind == "llvm" and strategy.applicable(KEY, ctx):
        return strategy.dispatch(KEY, ctx)
    return _ORIG["lower"](ctx)


def install() -> None:
    """Register the schedules and wrap MatMul's lowering (idempotent)."""
    od = get_op("MatMul")
    if "lower" not in _ORIG:
        _ORIG["lower"] = od.lower
        od.lower = _lower
    strategy.register_schedule(KEY, "llvm", "test_faulty", plevel=1,
                               applies=lambda ctx, **kw: _shapes(ctx) == FAULTY_SHAPES)(_faulty)
    strategy.register_schedule(KEY, "llvm", "test_variants", plevel=1,
                               applies=lambda ctx, **kw: _shapes(ctx) == VARIANT_SHAPES)(_variants)
    strategy.register_schedule(KEY, "llvm", "test_slow", plevel=1,
                               applies=lambda ctx, **kw: _shapes(ctx) == SLOW_SHAPES)(_slow)


def uninstall() -> None:
    """Undo :func:`install`."""
    if "lower" in _ORIG:
        get_op("MatMul").lower = _ORIG.pop("lower")
    strategy._SCHEDULES.pop((KEY, "llvm"), None)


install()
