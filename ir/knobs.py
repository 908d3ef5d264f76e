"""Knobs: the tunable parameters a schedule declares while it runs, and the workload key that
names what a tuning result applies to (docs/architecture.md, "Schedules, knobs and tuning").

A schedule asks for each tunable choice through :func:`knob`, giving the candidates and the
default (what its formula picks for this shape and target)::

    P = knob("tile_cols", range(1, 15), default=p, doc="output columns per register tile")

This is AutoTVM's define-by-run style (``cfg.define_knob`` inside a template): the space is what
a lowering declares, so a knob that only one branch of a schedule reads exists only where that
branch runs. Outside a :func:`knob_config` block (and for a knob the active config does not
fix) the default is returned, so without tuning records the generated code is the formula's.
While ``compiler.lower.lower_graph`` lowers a node it opens a :class:`KnobConfig` holding the
values of the node's tuning record (if any); afterwards the config lists every knob the node
declared (its space) and the value each took, which the kernels carry (``Kernel.schedule``,
``Kernel.knobs``) and ``print(kernel)`` shows.

Knob values are JSON scalars (int, float, str, bool) or tuples of them: records are JSON lines
and a list read back from one compares equal to the tuple declared.

The :func:`workload_key` of a node is the hash of its :func:`workload_signature`: the op (and,
for a fused function, every body node's op, attributes and types), the input and output
dtypes and shapes, which inputs are compile-time constants (and the values of small integer
constants, which select schedules: a Pad's pads, a Reshape's shape), and the attributes. Node
and value names are not part of it, so the repeated layers of a model share one workload. The
target is kept apart (:func:`target_identity`): a record names its target, and a record whose
target differs from the one compiled for is ignored with its reason (``compiler.tuning``).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

#: integer constants of at most this many elements are part of a workload's signature by value
SMALL_CONST = 64


def _norm(v: Any) -> Any:
    """A knob value in canonical form: lists (read back from JSON) become tuples, numpy scalars
    Python ones. Raises TypeError for a value JSON cannot hold."""
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"a knob value must be a JSON scalar or a tuple of them, got {type(v).__name__}: {v!r}")


@dataclass(frozen=True)
class Knob:
    """One tunable parameter as a schedule declared it: ``name``, the ``candidates`` (a tuple of
    JSON values, the default among them), the ``default`` (the formula's choice) and a line of
    ``doc``."""

    name: str
    candidates: tuple
    default: Any
    doc: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "candidates": list(self.candidates), "default": self.default, "doc": self.doc}


@dataclass
class KnobConfig:
    """The knob values in force while one node lowers.

    ``fixed``: name -> value from a tuning record or the tuner; a fixed value is used where it is
    one of the declared candidates, else the default is (a record made for another shape of
    the same schedule cannot pick a value the schedule does not offer here). After lowering,
    ``declared`` holds each knob declared (first declaration of a name), ``values`` the value
    each took, ``schedules`` the names of the schedules used (:func:`use_schedule`)."""

    fixed: dict = field(default_factory=dict)
    declared: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    schedules: list = field(default_factory=list)

    def __post_init__(self):
        self.fixed = {k: _norm(v) for k, v in dict(self.fixed).items()}

    def resolve(self, k: Knob) -> Any:
        if k.name in self.values:
            prev = self.values[k.name]
            if prev in k.candidates:
                return prev                    # one name, one value within a node
        v = self.fixed.get(k.name, k.default)
        if v not in k.candidates:
            v = k.default
        self.declared.setdefault(k.name, k)
        self.values.setdefault(k.name, v)
        return v

    @property
    def space(self) -> list[Knob]:
        """The knobs declared, in declaration order."""
        return list(self.declared.values())

    @property
    def schedule(self) -> str:
        """The schedule names used while lowering the node, joined by '+', or "generic"."""
        return "+".join(dict.fromkeys(self.schedules)) or "generic"


_CONFIG: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_knob_config", default=None)


@contextlib.contextmanager
def knob_config(cfg: KnobConfig | None):
    """Within the block :func:`knob` resolves through ``cfg`` (None: every knob its default)."""
    tok = _CONFIG.set(cfg)
    try:
        yield cfg
    finally:
        _CONFIG.reset(tok)


def knob(name: str, candidates: Iterable, default: Any, doc: str = "") -> Any:
    """Declare a tunable parameter of the schedule being lowered and return its value: the
    active config's fixed value when it is among ``candidates``, else ``default``. ``default``
    is added to the candidates when missing (the formula's choice is always legal). Raises
    TypeError for values that are not JSON scalars or tuples of them."""
    default = _norm(default)
    cands = tuple(dict.fromkeys(_norm(c) for c in candidates))
    if default not in cands:
        cands = cands + (default,)
    cfg = _CONFIG.get()
    if cfg is None:
        return default
    return cfg.resolve(Knob(name, cands, default, doc))


def schedules_in_use() -> list[str]:
    """The schedule names recorded so far (:func:`use_schedule`) for the node being lowered;
    empty for a node on the generic lowering, or outside a lowering."""
    cfg = _CONFIG.get()
    return list(cfg.schedules) if cfg is not None else []


def use_schedule(name: str) -> None:
    """Record that the node being lowered uses the schedule ``name`` (e.g.
    ``"llvm.conv2d_rows"``); the kernels then carry it."""
    cfg = _CONFIG.get()
    if cfg is not None:
        cfg.schedules.append(name)


# ----------------------------------------------------------------------------- workloads
def _attr_json(v: Any) -> Any:
    from .graph import Graph
    if isinstance(v, Graph):
        return {"graph": [_node_signature(n) for n in v.nodes],
                "inputs": [_type_json(x) for x in v.inputs], "outputs": [_type_json(x) for x in v.outputs]}
    if isinstance(v, np.ndarray):
        return {"array": list(v.shape), "dtype": str(v.dtype),
                "data": v.tolist() if v.size <= SMALL_CONST and v.dtype.kind in "iub" else None}
    if isinstance(v, (list, tuple)):
        return [_attr_json(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _attr_json(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, bytes):
        return v.hex()
    return repr(v)


def _type_json(v) -> Any:
    if v is None:
        return None
    d = {"dtype": v.dtype.value, "shape": list(v.shape)}
    data = v.const_value()
    if data is not None:
        d["const"] = True
        if data.size <= SMALL_CONST and data.dtype.kind in "iub":
            d["value"] = np.asarray(data).tolist()
    return d


def _node_signature(node) -> dict:
    return {"op": node.qualified_op,
            "attrs": {k: _attr_json(v) for k, v in sorted(node.attrs.items())},
            "inputs": [_type_json(v) for v in node.inputs],
            "outputs": [_type_json(v) for v in node.outputs]}


def workload_signature(node) -> dict:
    """What a tuning result of ``node`` applies to, as JSON: its op, attributes (a fused
    function's body node by node), input and output dtypes and shapes, constant-ness, and small
    integer constants by value. Names are left out."""
    return _node_signature(node)


def workload_key(node) -> str:
    """A short stable name of :func:`workload_signature`: ``"<op>-<16 hex digits>"`` (the op
    lower-cased; the digits from SHA-256 of the canonical JSON)."""
    sig = json.dumps(workload_signature(node), sort_keys=True, separators=(",", ":"))
    return f"{node.op.lower()}-{hashlib.sha256(sig.encode()).hexdigest()[:16]}"


def workload_summary(node) -> str:
    """One line for people: the op and its input and output shapes (and a fused function's
    body ops), e.g. ``Conv [1,64,56,56] [64,64,3,3] -> [1,64,56,56] (Conv, Relu)``."""
    from .graph import Graph
    ins = " ".join("-" if v is None else "[" + ",".join(map(str, v.shape)) + "]" for v in node.inputs)
    outs = " ".join("[" + ",".join(map(str, v.shape)) + "]" for v in node.outputs)
    body = node.attrs.get("body")
    extra = f" ({', '.join(n.op for n in body.nodes)})" if isinstance(body, Graph) else ""
    return f"{node.op} {ins} -> {outs}{extra}"


def target_identity(target) -> dict:
    """What a tuning record must match of the target it was measured on: ``str(target)`` and,
    for a target with CPU properties (llvm), the CPU name and the sorted enabled features."""
    ident = {"target": str(target), "kind": target.kind}
    try:
        ident["cpu"] = target.cpu
        ident["features"] = sorted(target.feature_set)
    except ValueError:          # a target without CPU properties (cuda)
        pass
    return ident
