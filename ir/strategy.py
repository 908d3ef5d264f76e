"""The schedule (strategy) registry: which backend schedules can compute an op, and which one
a lowering uses (docs/architecture.md, "Adding a schedule").

``ir`` says what an op means and holds the generic loop nest every backend can run; a backend's
schedules (``codegen/llvm/schedules/``, ``codegen/cuda/schedules/``) register themselves here
for a *schedule key* (an op name such as ``"Conv"``, or a name an op's lowering dispatches on,
such as ``"conv2d"``) and a backend (a target kind: ``"llvm"``, ``"cuda"``)::

    @register_schedule("conv2d", "llvm", "conv2d_rows", plevel=5, applies=rows_ok)
    def emit_conv_rows(ctx, **workload): ...

An op's lowering calls :func:`dispatch`: among the schedules registered for the key and the
lowering target's kind whose ``applies(ctx, **kw)`` holds, the one of highest ``plevel`` (an int
or a function of ``(ctx, **kw)``: TVM's OpStrategy plevel) is the default; when more than one
applies, the choice is itself a knob, ``"schedule"``, so the tuner can pick another. ``dispatch``
returns what the schedule's ``emit`` returns, or :data:`NO_SCHEDULE` when none applies: the
caller then emits the generic loop nest.

Backends register when their package ``schedules`` module is imported; ``compiler.lower``
imports the backend of the target it lowers for (``codegen.base.get_backend``), so ``ir``
never imports a backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .knobs import knob, use_schedule


@dataclass(frozen=True)
class Schedule:
    """One registered schedule: ``key`` (what it computes), ``backend`` (target kind), ``name``
    (unique per backend, shown in kernel IR as ``<backend>.<name>``), ``emit(ctx, **kw)``,
    ``applies(ctx, **kw) -> bool``, ``plevel`` (int or ``(ctx, **kw) -> int``; higher is
    preferred), ``doc``."""

    key: str
    backend: str
    name: str
    emit: Callable[..., Any]
    applies: Callable[..., bool]
    plevel: Any = 0
    doc: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.backend}.{self.name}"

    def level(self, ctx, **kw) -> int:
        return int(self.plevel(ctx, **kw) if callable(self.plevel) else self.plevel)


_SCHEDULES: dict[tuple[str, str], list[Schedule]] = {}

#: what :func:`dispatch` returns when no registered schedule applies
NO_SCHEDULE = object()


def register_schedule(key: str, backend: str, name: str, *, plevel: Any = 0,
                      applies: Callable[..., bool] | None = None) -> Callable:
    """Decorator registering ``emit`` as schedule ``name`` of ``key`` for ``backend``.
    Registering a name twice for one backend replaces the earlier entry (a module reloaded).
    ``applies`` defaults to always."""
    def deco(emit: Callable) -> Callable:
        doc = (emit.__doc__ or "").strip().split("\n")[0]
        s = Schedule(key, backend, name, emit, applies or (lambda ctx, **kw: True), plevel, doc)
        lst = _SCHEDULES.setdefault((key, backend), [])
        lst[:] = [x for x in lst if x.name != name] + [s]
        return emit
    return deco


def schedules_for(key: str, backend: str) -> list[Schedule]:
    """The schedules registered for ``key`` on ``backend`` (a target kind), in registration order."""
    return list(_SCHEDULES.get((key, backend), ()))


def all_schedules() -> list[Schedule]:
    """Every registered schedule, by backend, key and name."""
    return sorted((s for lst in _SCHEDULES.values() for s in lst), key=lambda s: (s.backend, s.key, s.name))


def applicable(key: str, ctx, **kw) -> list[Schedule]:
    """The schedules for ``key`` on ``ctx.target``'s kind whose predicate holds, highest plevel
    first (registration order among equals)."""
    cands = [s for s in schedules_for(key, ctx.target.kind) if s.applies(ctx, **kw)]
    return sorted(cands, key=lambda s: -s.level(ctx, **kw))      # stable: registration order among equals


def dispatch(key: str, ctx, **kw) -> Any:
    """Emit ``key`` with the chosen schedule (module docstring): the highest-plevel applicable
    one, or the value of knob ``"schedule"`` when several apply. Returns its ``emit``'s
    result, or :data:`NO_SCHEDULE` when none applies."""
    cands = applicable(key, ctx, **kw)
    if not cands:
        return NO_SCHEDULE
    chosen = cands[0]
    if len(cands) > 1:
        name = knob("schedule", [s.name for s in cands], chosen.name,
                    doc=f"which {ctx.target.kind} schedule computes {key}")
        chosen = next(s for s in cands if s.name == name)
    use_schedule(chosen.qualified_name)
    return chosen.emit(ctx, **kw)
