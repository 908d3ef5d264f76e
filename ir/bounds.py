"""A static bounds check of the kernel IR (debug mode; issue 24).

Every Load and Store of a kernel addresses ``buf[index + l * stride]`` for its lanes l. Loop
variables range over ``[start, extent)`` (``For.extent`` is the exclusive end) with extents known at compile time, so an
index built from loop variables and constants has a range that interval arithmetic can bound:
:func:`check_kernel_bounds` raises :class:`BoundsError` for an access whose range provably
leaves ``[0, numel)`` of its buffer, naming the kernel, the buffer, its size and the range. A
pointwise conv that indexed an epilogue operand of 5 elements with a flat pixel offset (``a[14
: +8]``) fails this way at compile time instead of reading garbage at run time.

What is checked, and what is not (no false alarms: the check must never stop a correct kernel):

- Interval arithmetic over + - * (all four corners), integer division and remainder by a
  positive constant (C truncation), min/max, shifts by constants, casts between integer types,
  :class:`~ir.kernel.Ramp` (base + lanes - 1) and broadcasts.
- An ``If`` whose condition compares ``a * v + c`` (one loop variable v, a > 0) with a constant,
  or a conjunction of such, narrows v inside its ``then`` branch (``oc < m`` guards of channel
  tails). Accesses under any other condition, and in ``else`` branches, are not checked: the
  guard may be what keeps them in bounds.
- An access is reported only where its range is attained (:meth:`_Bounds.attained`): every
  variable of the index occurs once in it and ranges over exactly its loop's (or guard's)
  values, so the out-of-bounds end is really reached. Indices that read memory (gathers), use
  a select, read a variable twice (``t / n`` and ``t % n`` of one parallel loop) or a variable
  of a loop whose bounds read other variables (clamped taps) are not checked.
"""
from __future__ import annotations

from typing import Optional

from .kernel import Bin, Broadcast, Cast, Const, FMA, For, If, Kernel, Load, Prefetch, TileOp, Ramp, Select, Stmt, Store, Un, Var
from .schedule import expr_children

Interval = Optional[tuple]


class BoundsError(IndexError):
    """A kernel access whose index range provably leaves its buffer."""


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


class _Bounds:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.env: dict[int, tuple[int, int]] = {}
        #: loop variables whose range is exact (every value in it is taken: constant start and
        #: extent, or narrowed by a guard); a variable of a loop whose bounds read other
        #: variables gets a covering range only
        self.exact: set[int] = set()
        self.memo: dict[int, Interval] = {}

    # ------------------------------------------------------------------ expressions
    def iv(self, e) -> Interval:
        """The (lo, hi) range of an integer expression, or None when unknown."""
        k = id(e)
        if k in self.memo:
            return self.memo[k]
        r = self._iv(e)
        if not isinstance(e, (Var, Const)):
            self.memo[k] = r
        return r

    def _iv(self, e) -> Interval:
        if isinstance(e, Const):
            v = e.value
            return (v, v) if isinstance(v, int) and not isinstance(v, bool) else None
        if isinstance(e, Var):
            return self.env.get(id(e))
        if isinstance(e, Ramp):
            b = self.iv(e.base)
            return None if b is None else (b[0], b[1] + e.lanes - 1)
        if isinstance(e, Broadcast):
            return self.iv(e.a)
        if isinstance(e, Cast):
            return self.iv(e.a) if e.dtype.is_int and e.a.dtype.is_int else None
        if isinstance(e, Un):
            a = self.iv(e.a)
            if a is None:
                return None
            if e.op == "neg":
                return (-a[1], -a[0])
            if e.op == "abs":
                lo = 0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))
                return (lo, max(abs(a[0]), abs(a[1])))
            return None
        if isinstance(e, Bin):
            a, b = self.iv(e.a), self.iv(e.b)
            if a is None or b is None:
                return None
            op = e.op
            if op == "add":
                return (a[0] + b[0], a[1] + b[1])
            if op == "sub":
                return (a[0] - b[1], a[1] - b[0])
            if op == "mul":
                c = [x * y for x in a for y in b]
                return (min(c), max(c))
            if op == "min":
                return (min(a[0], b[0]), min(a[1], b[1]))
            if op == "max":
                return (max(a[0], b[0]), max(a[1], b[1]))
            if op == "div" and b[0] > 0:
                c = [_tdiv(x, y) for x in a for y in b]
                return (min(c), max(c))
            if op == "rem" and b[0] == b[1] and b[0] > 0:
                d = b[0]
                if a[0] >= 0:
                    return a if a[1] < d else (0, d - 1)
                if a[1] <= 0:
                    return a if a[0] > -d else (-(d - 1), 0)
                return (-(d - 1), d - 1)
            if op in ("shl", "shr") and b[0] == b[1] and 0 <= b[0] < 63:
                f = (lambda x: x << b[0]) if op == "shl" else (lambda x: x >> b[0])
                return (f(a[0]), f(a[1]))
            return None
        return None                     # Load, Select, FMA, floats: unknown

    # ------------------------------------------------------------------ guards
    def _linear(self, e):
        """(var, a, c) when ``e`` is a * var + c with integer a > 0, c; else None."""
        if isinstance(e, Var):
            return (e, 1, 0) if id(e) in self.env else None
        if isinstance(e, Bin) and e.op in ("add", "sub"):
            ca, cb = self.iv(e.a), self.iv(e.b)
            if cb is not None and cb[0] == cb[1]:
                la = self._linear(e.a)
                if la is not None:
                    return (la[0], la[1], la[2] + (cb[0] if e.op == "add" else -cb[0]))
            if e.op == "add" and ca is not None and ca[0] == ca[1]:
                lb = self._linear(e.b)
                if lb is not None:
                    return (lb[0], lb[1], lb[2] + ca[0])
            return None
        if isinstance(e, Bin) and e.op == "mul":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                cy = self.iv(y)
                lx = self._linear(x)
                if lx is not None and cy is not None and cy[0] == cy[1] and cy[0] > 0:
                    return (lx[0], lx[1] * cy[0], lx[2] * cy[0])
        return None

    def narrow(self, cond) -> Optional[dict]:
        """The narrowed ranges a condition implies for the then-branch, or None (not understood)."""
        if isinstance(cond, Bin) and cond.op == "and":
            a = self.narrow(cond.a)
            if a is None:
                return None
            saved = dict(self.env)
            self.env.update(a)
            self.memo.clear()
            try:
                b = self.narrow(cond.b)
            finally:
                self.env = saved
                self.memo.clear()
            return None if b is None else {**a, **b}
        if not (isinstance(cond, Bin) and cond.op in ("lt", "le", "gt", "ge")):
            return None
        op, lhs, rhs = cond.op, cond.a, cond.b
        lin, k = self._linear(lhs), self.iv(rhs)
        if lin is None or k is None or k[0] != k[1]:
            lin, k = self._linear(rhs), self.iv(lhs)
            op = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[op]
            if lin is None or k is None or k[0] != k[1]:
                return None
        v, a, c = lin
        k = k[0]
        lo, hi = self.env[id(v)]
        # a * v + c (op) k
        if op == "lt":
            hi = min(hi, (k - c - 1) // a)
        elif op == "le":
            hi = min(hi, (k - c) // a)
        elif op == "gt":
            lo = max(lo, (k - c) // a + 1)
        else:
            lo = max(lo, -((c - k) // a))
        return {id(v): (lo, hi)}

    # ------------------------------------------------------------------ statements
    def attained(self, e) -> bool:
        """Whether both ends of ``e``'s range are taken by some iteration: every variable it
        reads has an exact range and occurs once (each operation is then monotone in each
        variable, or exact on its image, so the extremes lie at attainable corners)."""
        seen: set[int] = set()
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, Var):
                if id(x) in seen or id(x) not in self.exact:
                    return False
                seen.add(id(x))
            elif isinstance(x, (Load, Select, FMA)):
                return False
            else:
                stack += expr_children(x)
        return True

    def access(self, buf, index, lanes: int, stride: int, what: str, offset: int = 0) -> None:
        r = self.iv(index)
        if r is None:
            return
        lo, hi = r[0] + offset, r[1] + offset + (lanes - 1) * stride
        if (lo < 0 or hi >= buf.numel) and self.attained(index):
            raise BoundsError(
                f"kernel {self.kernel.name} ({self.kernel.comment.strip()[:160]}): {what} of "
                f"{buf.name} [{buf.numel} elements, shape {list(buf.shape)}] at elements {lo}..{hi} "
                f"({lanes} lane(s), stride {stride}): out of bounds")

    def expr_loads(self, e, checked: bool) -> None:
        """Check every load inside ``e`` (its index's loads too)."""
        stack = [e]
        seen: set[int] = set()
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if isinstance(x, Load) and checked:
                self.access(x.buf, x.index, x.lanes, x.stride, "load")
            stack += expr_children(x)

    def stmts(self, body: list[Stmt], checked: bool) -> None:
        for s in body:
            self.stmt(s, checked)

    def stmt(self, s: Stmt, checked: bool) -> None:
        if isinstance(s, For):
            start, ext = self.iv(s.start), self.iv(s.extent)       # extent: the exclusive end
            if ext is not None and start is not None and ext[1] <= start[0]:
                return                  # never runs
            if start is None or ext is None:
                saved = self.env.pop(id(s.var), None)
                self.memo.clear()
                self.stmts(s.body, checked)
                return
            self.env[id(s.var)] = (start[0], ext[1] - 1)
            if start[0] == start[1] and ext[0] == ext[1]:
                self.exact.add(id(s.var))
            self.memo.clear()
            self.stmts(s.body, checked)
            self.env.pop(id(s.var), None)
            self.exact.discard(id(s.var))
            self.memo.clear()
        elif isinstance(s, Store):
            self.expr_loads(s.value, checked)
            self.expr_loads(s.index, checked)
            if checked:
                self.access(s.buf, s.index, s.value.lanes, s.stride, "store")
        elif isinstance(s, Prefetch):
            self.expr_loads(s.index, checked)
            if checked:
                self.access(s.buf, s.index, 1, 1, "load")
        elif isinstance(s, TileOp) and s.op in ("load", "store"):
            self.expr_loads(s.index, checked)
            if checked:             # the first and the last row, each colsb bytes
                n = max(1, s.colsb // s.buf.dtype.itemsize)
                self.access(s.buf, s.index, n, 1, s.op)
                self.access(s.buf, s.index, n, 1, s.op, (s.rows - 1) * s.stride)
        elif isinstance(s, If):
            self.expr_loads(s.cond, checked)
            nar = self.narrow(s.cond) if checked else None
            if nar is not None and any(lo > hi for lo, hi in nar.values()):
                pass                    # the branch never runs
            elif nar is not None:
                saved = dict(self.env)
                self.env.update(nar)
                self.memo.clear()
                self.stmts(s.then, True)
                self.env = saved
                self.memo.clear()
            else:
                self.stmts(s.then, False)
            self.stmts(s.orelse, False)


def check_kernel_bounds(kernel: Kernel) -> None:
    """Raise :class:`BoundsError` for the first Load or Store of ``kernel`` whose index range
    (see the module docstring for what is bounded) leaves its buffer."""
    _Bounds(kernel).stmts(kernel.body, True)
