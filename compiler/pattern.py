"""The pattern language of rewrite rules: DAG patterns over the graph IR (docs/architecture.md, "Rewrites as
DAG patterns").

A pattern describes the values that flow into a node, recursively. Vocabulary:

- :class:`Any` - any value (a graph input, a constant or a node output);
- :class:`Op` (or ``P.Conv(...)``, ``P.Add(...)``) - a value produced by an op, or by one of a
  set of ops, with attribute predicates (``.attrs(group=1, pads=callable)``); its inputs are
  patterns, given positionally or as keywords (the keyword is the capture name);
- :class:`Const` - a constant (initializer or ONNX Constant), optionally equal to a value within
  a tolerance;
- :class:`OneOf` - alternatives, tried in order;
- :class:`Optional` - an optional input (absent, or matching its pattern);
  ``Op(...).optional()`` - an optional node: the value is either that node's output, or
  (without the node) whatever its pass-through input matches;
- commutative operands: binary ``Add``, ``Mul`` (and ``Max``, ``Min``, ``And``, ``Or``, ``Xor``,
  ``Equal``, ``Sum``) match their two inputs in either order without spelling both out;
- ``.dtype(...)``, ``.shape(...)``, ``.rank(n)``, ``.where(fn, why)`` - predicates;
- ``.single_use()`` - the value has no consumer outside the match and is no graph output;
- ``.named("x")`` - a capture; DAG semantics: a name (or one pattern object used twice) must
  bind one value everywhere it appears;
- a tuple of patterns - a pattern with several outputs (all share their captures).

Matching a value gives a :class:`Match` (captures by name: ``m.x`` is a Value, ``m.conv`` a
Node) or a :class:`MatchFailure` whose ``reason`` names the node and the first predicate that
failed, e.g. ``"Relu_3: input 0 is produced by MaxPool (pool1), expected Conv"``.

Example (every example in this module runs as a test)::

    >>> import numpy as np
    >>> from tensorfuse.ir import Builder, DType, Graph, TensorType
    >>> from tensorfuse.compiler.pattern import P, Any, Const
    >>> g = Graph(); b = Builder(g)
    >>> x = g.add_input("x", TensorType(DType.f32, (2, 3)))
    >>> y = b.Relu(b.Add(b.const(np.float32(1)), x, name="add"), name="relu")
    >>> pat = P.Relu(P.Add(x=Any(), one=Const(1.0)).single_use())
    >>> m = pat.match(y, g)
    >>> m.x.name, m.one.data.item(), m.add.name, [n.name for n in m.nodes]
    ('x', 1.0, 'add', ['add', 'relu'])
    >>> print(P.Relu(P.Sigmoid(Any())).match(y).reason)
    relu: input 0 is produced by Add (add), expected Sigmoid
"""
from __future__ import annotations

import copy
import weakref
from typing import Callable, Iterable, Iterator

import numpy as np

from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.types import DType

__all__ = ["Pattern", "Any", "Op", "Const", "OneOf", "Optional", "P", "Match", "MatchFailure"]


def _commutes(qualified_op: str) -> bool:
    """Is the op (``"Add"``, ``"domain::Op"``) registered commutative (``OpDef.commutative``)?"""
    from tensorfuse.ir.registry import find_op
    domain, _, name = qualified_op.rpartition("::")
    od = find_op(name, domain)
    return od is not None and od.commutative


# --------------------------------------------------------------------------- match state
class _State:
    """Bindings so far (copy-on-write, so alternatives backtrack for free)."""

    __slots__ = ("binds", "nodes", "node_ids", "single", "score")

    def __init__(self):
        self.binds: dict = {}
        self.nodes: list[Node] = []
        self.node_ids: frozenset = frozenset()
        self.single: tuple = ()          # (value, pattern description) checked at the end
        self.score = 0

    def fork(self) -> "_State":
        s = _State.__new__(_State)
        s.binds = dict(self.binds)
        s.nodes = list(self.nodes)
        s.node_ids, s.single, s.score = self.node_ids, self.single, self.score
        return s


class _Ctx:
    """One matching attempt: the graph (for consumers) and the furthest failure seen."""

    def __init__(self, graph: Graph | None):
        self.graph = graph
        self._users = None
        self.best: tuple[int, str] | None = None
        #: the default capture names of the rule being matched: id(Op pattern) -> name (they
        #: belong to the rule, not to the pattern objects, which several rules may share)
        self.defaults: dict[int, str] = {}

    def users(self) -> dict:
        if self._users is None:
            self._users = self.graph.users() if self.graph is not None else {}
        return self._users

    def fail(self, st: _State, reason: str) -> None:
        if self.best is None or st.score > self.best[0]:
            self.best = (st.score, reason)


def _vdesc(v: Value) -> str:
    if v.producer is not None:
        return f"the output of {v.producer.op} ({v.producer.name})"
    return f"constant '{v.name}'" if v.is_const else f"graph input '{v.name}'"


def _ops_text(ops) -> str:
    ops = sorted(ops)
    return ops[0] if len(ops) == 1 else "one of " + ", ".join(ops)


def _fmt(x) -> str:
    if isinstance(x, np.ndarray):
        return np.array2string(x, threshold=8) if x.size > 1 else repr(x.item())
    return repr(x)


def _at(site: str, v: Value) -> str:
    return site if f"'{v.name}'" in site else f"{site} ('{v.name}')"


def _data_text(data: np.ndarray, v: Value) -> str:
    flat = data.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return repr(flat[0].item()) if flat.size == 1 else f"{flat[0].item()!r} (all {flat.size} elements)"
    return np.array2string(data, threshold=8) if data.size <= 8 else f"a {v.type} tensor"


def _pred_name(fn) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    if doc and getattr(fn, "__name__", "") != "<lambda>":
        return doc[0]
    return getattr(fn, "__name__", "the predicate")


# --------------------------------------------------------------------------- patterns
class Pattern:
    """Base of all patterns. Methods return modified copies, so patterns compose freely."""

    _name: str | None = None
    _preds: tuple = ()          # (fn(value) -> bool, description)
    _single = False

    # -- builders ------------------------------------------------------------------------
    def named(self, name: str) -> "Pattern":
        """Capture the matched value (or node, for Op patterns) as ``name``."""
        p = copy.copy(self)
        p._name = name
        return p

    def where(self, fn: Callable, why: str | None = None) -> "Pattern":
        """Require ``fn(value)`` (``fn(node)`` for Op patterns) to be true; ``why`` names it."""
        p = copy.copy(self)
        p._preds = self._preds + ((fn, why or _pred_name(fn)),)
        return p

    def dtype(self, *dtypes) -> "Pattern":
        """Require the value's dtype to be one of ``dtypes`` (DType or names such as "f32")."""
        want = frozenset(d if isinstance(d, DType) else DType(d) for d in dtypes)
        text = "/".join(sorted(d.value for d in want))
        return self._vwhere(lambda v: v.dtype in want, f"dtype {text}", lambda v: v.dtype.value)

    def shape(self, spec) -> "Pattern":
        """Require a shape: a tuple (``None`` matches any dim) or a callable on the shape tuple."""
        if callable(spec):
            return self._vwhere(lambda v: bool(spec(v.shape)), f"shape satisfying {_pred_name(spec)}",
                                lambda v: list(v.shape))
        spec = tuple(spec)
        ok = (lambda v: len(v.shape) == len(spec)
              and all(s is None or s == d for s, d in zip(spec, v.shape)))
        text = "[" + ",".join("?" if s is None else str(s) for s in spec) + "]"
        return self._vwhere(ok, f"shape {text}", lambda v: list(v.shape))

    def rank(self, *ranks: int) -> "Pattern":
        """Require the value's rank to be one of ``ranks``."""
        return self._vwhere(lambda v: len(v.shape) in ranks, f"rank {'/'.join(map(str, ranks))}",
                            lambda v: len(v.shape))

    def single_use(self) -> "Pattern":
        """Require that no node outside the match reads this value and that it is no graph
        output (so the match may remove its producer)."""
        p = copy.copy(self)
        p._single = True
        return p

    def _vwhere(self, fn, what: str, got) -> "Pattern":
        p = copy.copy(self)
        p._preds = self._preds + ((fn, what, got),)
        return p

    # -- matching ------------------------------------------------------------------------
    def match(self, value: Value, graph: Graph | None = None) -> "Match | MatchFailure":
        """Match this pattern at ``value`` (``graph`` is needed by ``single_use``). Returns a
        Match (truthy) or a MatchFailure (falsy) whose ``.reason`` says why not."""
        site = value.producer.name if value is not None and value.producer is not None else \
            f"'{getattr(value, 'name', None)}'"
        return match_values([self], [value], graph, site)

    def _match(self, v: Value | None, st: _State, ctx: _Ctx, site: str) -> Iterator[_State]:
        raise NotImplementedError

    def _key(self, defaults: dict):
        return self._name if self._name is not None else ("#", id(self))

    def _bind(self, obj, st: _State, ctx: _Ctx, site: str) -> _State | None:
        """Bind this pattern's key to ``obj``; None (after recording why) on a DAG conflict."""
        key = self._key(ctx.defaults)
        if key in st.binds:
            old = st.binds[key]
            if old is not obj:
                what = f"'{self._name}'" if self._name else "the same sub-pattern"
                ctx.fail(st, f"{site}: {what} is already bound to {_odesc(old)}, here it would be "
                             f"{_odesc(obj)} (a name bound twice must bind one value)")
                return None
            return st
        st = st.fork()
        st.binds[key] = obj
        return st

    def _check_value(self, v: Value, st: _State, ctx: _Ctx, site: str) -> _State | None:
        for pred in self._preds:
            if len(pred) == 3:
                fn, what, got = pred
                if not fn(v):
                    ctx.fail(st, f"{site} ('{v.name}') has {got(v)}, expected {what}")
                    return None
            else:
                fn, what = pred
                if not fn(v):
                    ctx.fail(st, f"{site} ('{v.name}') fails {what}")
                    return None
            st = st.fork()
            st.score += 1
        if self._single:
            st = st.fork()
            st.single = st.single + ((v, site),)
        return st

    def names(self) -> list[str]:
        """Every capture name in this pattern (in first-appearance order)."""
        return _assign_default_names([self])

    def _raw_names(self, defaults: dict) -> list[str]:
        out: list[str] = []
        for p in self._walk(set()):
            n = p._name if not isinstance(p, Op) else p._capture_name(defaults)
            if n is not None and n not in out:
                out.append(n)
        return out

    def _children(self) -> Iterable["Pattern"]:
        return ()

    def _walk(self, seen: set) -> Iterator["Pattern"]:
        if id(self) in seen:
            return
        seen.add(id(self))
        yield self
        for c in self._children():
            yield from c._walk(seen)

    def root_ops(self) -> frozenset | None:
        """The ops a node must have to be the root of a match (None: any value)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name or ''})"


def _odesc(o) -> str:
    if o is None:
        return "nothing"
    if isinstance(o, Node):
        return f"node {o.name} ({o.op})"
    return f"'{o.name}'"


class Any(Pattern):
    """Any value: a graph input, a constant or a node output.

    >>> Any("x").names()
    ['x']
    """

    def __init__(self, name: str | None = None):
        self._name = name

    def _match(self, v, st, ctx, site):
        if v is None:
            ctx.fail(st, f"{site} is absent, expected a value")
            return
        st = self._bind(v, st, ctx, site)
        if st is None:
            return
        st = self._check_value(v, st, ctx, site)
        if st is not None:
            yield st


class Const(Pattern):
    """A constant: an initializer or an ONNX Constant (``Value.data`` is set). With ``value``,
    every element must equal it within ``atol + rtol*|value|`` (value broadcasts, so a scalar
    matches a constant tensor of that value). ``known=True`` also accepts values computed at
    compile time from static shapes (``Value.known``).

    >>> import numpy as np
    >>> from tensorfuse.ir import Graph
    >>> g = Graph(); c = g.add_const(np.full(3, 0.5, np.float32), "half")
    >>> bool(Const(0.5).match(c)), Const(1.0).match(c).reason
    (True, "'half' is 0.5 (all 3 elements), expected the constant 1.0")
    """

    def __init__(self, value=None, *, atol: float = 0.0, rtol: float = 0.0, name: str | None = None,
                 known: bool = False):
        self._value = None if value is None else np.asarray(value)
        self._atol, self._rtol = atol, rtol
        self._name = name
        self._known = known

    def _match(self, v, st, ctx, site):
        if v is None:
            ctx.fail(st, f"{site} is absent, expected a constant")
            return
        data = v.data if v.data is not None else (v.known if self._known else None)
        if data is None:
            ctx.fail(st, f"{site} is {_vdesc(v)}, expected a constant")
            return
        st = st.fork()
        st.score += 1
        if self._value is not None:
            ok = False
            try:
                if data.dtype != np.bool_ and data.size > 0:
                    ok = bool(np.all(np.abs(data.astype(np.float64) - self._value.astype(np.float64))
                                     <= self._atol + self._rtol * np.abs(self._value.astype(np.float64))))
                else:
                    ok = bool(np.array_equal(np.broadcast_to(self._value, data.shape), data))
            except (ValueError, TypeError):
                ok = False
            if not ok:
                ctx.fail(st, f"{_at(site, v)} is {_data_text(data, v)}, "
                             f"expected the constant {_fmt(self._value)}"
                             + (f" (atol {self._atol}, rtol {self._rtol})" if self._atol or self._rtol else ""))
                return
            st.score += 1
        st = self._bind(v, st, ctx, site)
        if st is None:
            return
        st = self._check_value(v, st, ctx, site)
        if st is not None:
            yield st


class OneOf(Pattern):
    """Alternatives, tried in order; the first that matches wins (later ones on backtracking).

    >>> OneOf(P.Relu(Any()), P.Clip(Any(), Const(0.0), Const(6.0)), name="act").names()
    ['act', 'relu', 'clip']
    """

    def __init__(self, *alternatives: Pattern, name: str | None = None):
        if not alternatives:
            raise ValueError("OneOf needs at least one alternative")
        self._alts = tuple(alternatives)
        self._name = name

    def _children(self):
        return self._alts

    def root_ops(self):
        ops = set()
        for a in self._alts:
            r = a.root_ops()
            if r is None:
                return None
            ops |= r
        return frozenset(ops)

    def _match(self, v, st, ctx, site):
        for alt in self._alts:
            for s in alt._match(v, st, ctx, site):
                s = self._bind(v, s, ctx, site)
                if s is None:
                    continue
                s = self._check_value(v, s, ctx, site) if v is not None else s
                if s is not None:
                    yield s


class Optional(Pattern):
    """An optional input: absent (the capture is None) or matching ``pattern``.

    >>> Optional(Const(), name="bias").names()
    ['bias']
    """

    def __init__(self, pattern: Pattern | None = None, *, name: str | None = None):
        self._inner = pattern if pattern is not None else Any()
        self._name = name

    def _children(self):
        return (self._inner,)

    def _match(self, v, st, ctx, site):
        if v is None:
            s = self._bind(None, st, ctx, site)
            if s is not None:
                yield s
            return
        for s in self._inner._match(v, st, ctx, site):
            s = self._bind(v, s, ctx, site)
            if s is not None:
                yield s


class Op(Pattern):
    """A value produced by an op (``"Conv"``, ``"domain::Op"``) or a set of ops.

    Inputs are patterns, positional first, then keywords in order (``Op("Conv", x=Any())`` is
    ``Op("Conv", Any("x"))``). A node with more inputs than the pattern lists fails to match
    (so no input is silently dropped); list trailing ones as ``Optional(...)``. The node is
    captured as ``.named(...)``, or by default as the op name in lower case when the op is
    unique in the rule (``m.conv``).

    >>> P.Conv(x=Any(), w=Const()).attrs(group=1).names()
    ['conv', 'x', 'w']
    """

    def __init__(self, op: "str | Iterable[str]", *inputs: Pattern, **named_inputs: Pattern):
        ops = (op,) if isinstance(op, str) else tuple(op)
        self._ops = frozenset(ops)
        ins = list(inputs) + [p.named(k) for k, p in named_inputs.items()]
        for i, p in enumerate(ins):
            if not isinstance(p, Pattern):
                raise TypeError(f"input {i} of the {_ops_text(self._ops)} pattern is {p!r}, not a Pattern")
        self._inputs = tuple(ins)
        self._attr_preds: tuple = ()
        self._output = 0
        self._commutative: bool | None = None      # None: as the registry says (is_commutative)
        self._through: int | None = None

    # -- builders ------------------------------------------------------------------------
    def attrs(self, **preds) -> "Op":
        """Attribute predicates: a value (compared with ``node.attr(name)``, spec defaults
        included) or a callable on the attribute value."""
        p = copy.copy(self)
        p._attr_preds = self._attr_preds + tuple(preds.items())
        return p

    def output(self, index: int) -> "Op":
        """Match output ``index`` of the node (default 0)."""
        p = copy.copy(self)
        p._output = index
        return p

    def commutative(self, flag: bool = True) -> "Op":
        """Try both operand orders (on by default for two-input patterns of ops registered
        ``commutative``: Add, Mul, Max, ...; see :meth:`is_commutative`)."""
        if flag and len(self._inputs) != 2:
            raise ValueError("only two-input patterns can be commutative")
        p = copy.copy(self)
        p._commutative = flag
        return p

    def is_commutative(self) -> bool:
        """Whether matching tries both operand orders: as set by :meth:`commutative`, else
        whether the pattern has two inputs and every op it names is registered
        ``commutative`` (``ir.registry.OpDef.commutative``)."""
        if self._commutative is None:
            self._commutative = (len(self._inputs) == 2 and bool(self._ops)
                                 and all(_commutes(o) for o in self._ops))
        return self._commutative

    def optional(self, through: int = 0) -> "Op":
        """Make the node optional: the value is this node's output, or - without the node -
        whatever input ``through`` matches (the node capture is then None)."""
        p = copy.copy(self)
        p._through = through
        return p

    # -- introspection -------------------------------------------------------------------
    def root_ops(self):
        return None if self._through is not None else self._ops

    def _children(self):
        return self._inputs

    def _capture_name(self, defaults: dict) -> str | None:
        return self._name or defaults.get(id(self))

    def _key(self, defaults: dict):
        n = self._capture_name(defaults)
        return n if n is not None else ("#", id(self))

    def __repr__(self):
        return f"Op({_ops_text(self._ops)}{', ' + self._name if self._name else ''})"

    # -- matching ------------------------------------------------------------------------
    def _match(self, v, st, ctx, site):
        if self._through is not None:
            yield from self._match_node(v, st, ctx, site)
            s = self._bind(None, st, ctx, site)
            if s is None:
                return
            yield from self._inputs[self._through]._match(v, s, ctx, site)
            return
        yield from self._match_node(v, st, ctx, site)

    def _match_node(self, v, st, ctx, site):
        want = _ops_text(self._ops)
        if v is None:
            ctx.fail(st, f"{site} is absent, expected {want}")
            return
        n = v.producer
        if n is None:
            ctx.fail(st, f"{site} is {_vdesc(v)}, expected {want}")
            return
        if n.qualified_op not in self._ops:
            where = f"{site} is produced by {n.qualified_op} ({n.name})" if site != n.name else \
                f"{n.name} is {n.qualified_op}"
            ctx.fail(st, f"{where}, expected {want}")
            return
        if n.outputs.index(v) != self._output:
            ctx.fail(st, f"{site} is output {n.outputs.index(v)} of {n.name}, expected output {self._output}")
            return
        st = self._bind(n, st, ctx, site)
        if st is None:
            return
        st = st.fork()
        st.score += 1
        for name, want_v in self._attr_preds:
            got = n.attr(name)
            if callable(want_v):
                ok = got is not None and bool(want_v(got))
                exp = _pred_name(want_v)
            else:
                ok = _attr_eq(got, want_v)
                exp = _fmt(want_v)
            if not ok:
                shown = "not set" if got is None else f"{_fmt(got)}"
                ctx.fail(st, f"{n.name}: attribute {name} is {shown}, expected {exp}")
                return
            st.score += 1
        for pred in self._preds:
            if len(pred) == 3:      # dtype/shape/rank: about the value
                fn, what, got = pred
                if not fn(v):
                    ctx.fail(st, f"{n.name}: output '{v.name}' has {got(v)}, expected {what}")
                    return
            elif not pred[0](n):
                ctx.fail(st, f"{n.name}: fails {pred[1]}")
                return
            st.score += 1
        k = len(self._inputs)
        extra = [i for i in range(k, len(n.inputs)) if n.inputs[i] is not None]
        if extra:
            ctx.fail(st, f"{n.name}: has input {extra[0]} ('{n.inputs[extra[0]].name}'), the pattern "
                         f"expects at most {k} input{'s' if k != 1 else ''}")
            return
        if self._single:
            st.single = st.single + ((v, n.name),)
        if id(n) not in st.node_ids:
            st.nodes.append(n)
            st.node_ids = st.node_ids | {id(n)}
        orders = [tuple(range(k))]
        if self.is_commutative():
            orders.append((1, 0))
        for order in orders:
            yield from self._match_inputs(n, order, 0, st, ctx)

    def _match_inputs(self, n: Node, order, j, st, ctx):
        if j == len(order):
            yield st
            return
        i = order[j]
        for s in self._inputs[j]._match(n.input(i), st, ctx, f"{n.name}: input {i}"):
            s = s.fork()
            s.score += 1
            yield from self._match_inputs(n, order, j + 1, s, ctx)


def _attr_eq(got, want) -> bool:
    if got is None:
        return want is None
    if isinstance(want, (list, tuple, np.ndarray)) or isinstance(got, (list, tuple, np.ndarray)):
        try:
            return bool(np.array_equal(np.asarray(got), np.asarray(want)))
        except (ValueError, TypeError):
            return False
    return got == want


class _OpFactory:
    """``P.Conv(...)`` is ``Op("Conv", ...)``: patterns read like the graph."""

    def __getattr__(self, op: str) -> Callable[..., Op]:
        if op.startswith("_"):
            raise AttributeError(op)
        return lambda *inputs, **named: Op(op, *inputs, **named)


P = _OpFactory()


# --------------------------------------------------------------------------- results
class MatchFailure:
    """A failed match: falsy, with ``reason`` (names the node and the failed predicate)."""

    def __init__(self, reason: str):
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"MatchFailure({self.reason!r})"

    __str__ = lambda self: self.reason  # noqa: E731


class Match:
    """A successful match. ``m.name`` (or ``m["name"]``) is a capture: a Value, or a Node for
    Op patterns; a declared capture that did not take part (optional input or node) is None.
    ``nodes`` are the matched nodes in graph order; ``outputs`` the values the pattern's
    outputs matched; ``root`` the node that produced ``outputs[0]``."""

    def __init__(self, binds: dict, nodes: list[Node], outputs: list[Value], graph: Graph | None,
                 declared: Iterable[str] = ()):
        self._binds = {k: v for k, v in binds.items() if isinstance(k, str)}
        self._declared = set(declared)
        self.nodes = nodes
        self.outputs = outputs
        self.graph = graph
        self.root = outputs[0].producer if outputs and outputs[0] is not None else None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        binds = self.__dict__.get("_binds", {})
        if name in binds:
            return binds[name]
        if name in self.__dict__.get("_declared", ()):
            return None
        raise AttributeError(f"the pattern has no capture named {name!r}; captures: {sorted(binds)}")

    def __getitem__(self, name: str):
        return getattr(self, name)

    def __contains__(self, name: str) -> bool:
        return self._binds.get(name) is not None

    def __bool__(self) -> bool:
        return True

    @property
    def captures(self) -> dict:
        return dict(self._binds)

    def __repr__(self) -> str:
        cap = ", ".join(f"{k}={_odesc(v)}" for k, v in self._binds.items())
        return f"Match({cap})"


class _Naming:
    """A rule's capture names: ``defaults`` (id(Op pattern) -> its default name) and ``names``
    (every capture name, in first-appearance order)."""

    __slots__ = ("key", "defaults", "names")

    def __init__(self, key: tuple, defaults: dict[int, str], names: list[str]):
        self.key, self.defaults, self.names = key, defaults, names


#: root pattern -> its rule's _Naming (patterns do not change once built; kept beside them, not
#: on them, so a sub-pattern shared by two rules takes each rule's names in that rule)
_NAMINGS: "weakref.WeakKeyDictionary[Pattern, _Naming]" = weakref.WeakKeyDictionary()


def _naming(patterns: list[Pattern]) -> _Naming:
    key = tuple(id(p) for p in patterns)
    cached = _NAMINGS.get(patterns[0])
    if cached is not None and cached.key == key:
        return cached
    nm = _naming_uncached(patterns, key)
    _NAMINGS[patterns[0]] = nm
    return nm


def _assign_default_names(patterns: list[Pattern]) -> list[str]:
    """Every capture name of a rule's patterns (unnamed Op patterns take their op name in
    lower case where it is unique in the rule)."""
    return _naming(patterns).names


def _naming_uncached(patterns: list[Pattern], key: tuple) -> _Naming:
    seen: set = set()
    ops: list[Op] = []
    for p in patterns:
        for q in p._walk(seen):
            if isinstance(q, Op):
                ops.append(q)
    explicit = {q._name for p in patterns for q in p._walk(set()) if q._name}
    counts: dict[str, int] = {}
    for q in ops:
        if q._name is None and len(q._ops) == 1:
            base = next(iter(q._ops)).split("::")[-1].lower()
            counts[base] = counts.get(base, 0) + 1
    defaults: dict[int, str] = {}
    for q in ops:
        if q._name is None and len(q._ops) == 1:
            base = next(iter(q._ops)).split("::")[-1].lower()
            if counts[base] == 1 and base not in explicit:
                defaults[id(q)] = base
    names: list[str] = []
    for p in patterns:
        for n in p._raw_names(defaults):
            if n not in names:
                names.append(n)
    return _Naming(key, defaults, names)


def match_values(patterns: list[Pattern], values: list[Value | None], graph: Graph | None,
                 site: str | None = None, ctx: _Ctx | None = None) -> "Match | MatchFailure":
    """Match patterns against given values jointly (one binding space), then check
    ``single_use``. Used by :meth:`Pattern.match`; rules go through :func:`match_at`."""
    naming = _naming(patterns)
    declared = naming.names
    ctx = ctx or _Ctx(graph)
    ctx.defaults = naming.defaults
    st0 = _State()
    sites = [site or "value"] + [f"output {k} of the pattern" for k in range(1, len(patterns))]

    def go(k, st):
        if k == len(patterns):
            yield st
            return
        v = values[k]
        s_site = sites[k] if v is None or v.producer is None else v.producer.name
        for s in patterns[k]._match(v, st, ctx, s_site if k else (site or s_site)):
            yield from go(k + 1, s)

    for st in go(0, st0):
        if _single_use_ok(st, ctx):
            return _finish(st, list(values), graph, declared)
    return MatchFailure(ctx.best[1] if ctx.best else "no match")


def _single_use_ok(st: _State, ctx: _Ctx) -> bool:
    if not st.single:
        return True
    if ctx.graph is None:
        raise ValueError("single_use() needs the graph: call pattern.match(value, graph)")
    users = ctx.users()
    outs = {id(v) for v in ctx.graph.outputs}
    for v, where in st.single:
        if id(v) in outs:
            ctx.fail(_scored(st, 10_000), f"{where}: output '{v.name}' is a graph output, so it must stay")
            return False
        other = [n for n in users.get(v, []) if id(n) not in st.node_ids]
        if other:
            names = ", ".join(f"{n.name} ({n.op})" for n in other[:3])
            ctx.fail(_scored(st, 10_000), f"{where}: output '{v.name}' has another consumer: {names}")
            return False
    return True


def _scored(st: _State, bonus: int) -> _State:
    s = st.fork()
    s.score += bonus
    return s


def _finish(st: _State, outputs, graph, declared) -> Match:
    order = {id(n): i for i, n in enumerate(graph.nodes)} if graph is not None else {}
    nodes = sorted(st.nodes, key=lambda n: order.get(id(n), 0))
    return Match(st.binds, nodes, outputs, graph, declared)


def match_at(patterns: "Pattern | tuple", node: Node, graph: Graph, ctx: _Ctx | None = None
             ) -> "Match | MatchFailure":
    """Match a rule's pattern (one, or a tuple for several outputs) with its first output at
    ``node``. Further outputs are searched among the graph's nodes, in graph order."""
    pats = list(patterns) if isinstance(patterns, (tuple, list)) else [patterns]
    naming = _naming(pats)
    declared = naming.names
    ctx = ctx or _Ctx(graph)
    ctx.best = None           # the users cache is shared, failures are per attempt
    ctx.defaults = naming.defaults
    if not node.outputs:
        return MatchFailure(f"{node.name}: has no outputs")

    def go(k, st, outs):
        if k == len(pats):
            yield st, outs
            return
        if k == 0:
            cands = node.outputs[:1] if not isinstance(pats[0], Op) else \
                [node.outputs[pats[0]._output]] if pats[0]._output < len(node.outputs) else []
            site = node.name
        else:
            ops = pats[k].root_ops()
            cands = [o for n in graph.nodes if ops is None or n.qualified_op in ops
                     for o in n.outputs if id(n) not in st.node_ids]
            site = None
        for v in cands:
            for s in pats[k]._match(v, st, ctx, site or (v.producer.name if v.producer else v.name)):
                yield from go(k + 1, s, outs + [v])

    for st, outs in go(0, _State(), []):
        if _single_use_ok(st, ctx):
            return _finish(st, outs, graph, declared)
    return MatchFailure(ctx.best[1] if ctx.best else f"{node.name}: no match")


def capture_names(patterns: "Pattern | tuple") -> list[str]:
    pats = list(patterns) if isinstance(patterns, (tuple, list)) else [patterns]
    return _assign_default_names(pats)


def root_ops(patterns: "Pattern | tuple") -> frozenset | None:
    pats = list(patterns) if isinstance(patterns, (tuple, list)) else [patterns]
    return pats[0].root_ops()

