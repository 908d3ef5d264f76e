"""Schedules of kernel IR: the default CPU schedule and the parallel-loop verifier (docs/architecture.md
"Kernel IR, schedules and backends").

Hand schedules (conv, matmul ...) are written by their lowerings; :func:`default_schedule` covers
the long tail, as TVM's dlight fallback does: in each top-level loop nest it makes one spatial
loop ``parallel`` (codegen cuts it into one chunk per thread), and it leaves the innermost
contiguous loops to LLVM's loop vectoriser. The code is independent of the thread count: the
team size is a run-time value.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from .kernel import (I64, Barrier, Bin, Broadcast, Cast, Const, DotAcc, Expr, FMA, For, If, Kernel, Load, Lookup, Prefetch,
                     Ramp, Select, Shuffle, Store, TileOp, Un, Var, binop, Concat)

#: a nest whose estimated iteration count is below this stays on one thread (benchmarks/
#: dispatch.py measured 3-6 microseconds per parallel kernel at 2 threads on a 2-core Zen 3;
#: a 4096-element kernel ran slower at 2 threads than at 1)
MIN_PARALLEL_WORK = 32768
#: the parallel loop is the first of its nest with at least this many iterations, if any
MIN_PARALLEL_EXTENT = 16


class ScheduleError(Exception):
    """A schedule the kernel's semantics forbid (a parallel loop whose iterations may write
    the same element); names the kernel and the loop."""


def expr_children(e) -> tuple:
    """The direct sub-expressions of ``e``: operands, a load's index, a ramp's base, a select's
    condition (none for constants, variables and expression kinds without operands)."""
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, (Un, Cast, Broadcast)):
        return (e.a,)
    if isinstance(e, Ramp):
        return (e.base,)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, FMA):
        return (e.a, e.b, e.c)
    if isinstance(e, DotAcc):
        return (e.acc, e.a, e.b)
    if isinstance(e, Shuffle):
        return (e.a, e.b)
    if isinstance(e, Concat):
        return e.parts
    if isinstance(e, Lookup):
        return (e.index,)
    if hasattr(e, "operands"):          # a backend's intrinsic expression (codegen/cuda/mma.py)
        return e.operands()
    return ()


def expr_nodes(e):
    """An expression and every sub-expression (operands, load indices, select conditions),
    outer before inner."""
    yield e
    for x in expr_children(e):
        yield from expr_nodes(x)


def _vars(e) -> set:
    """ids of the loop variables ``e`` reads."""
    return {id(x) for x in expr_nodes(e) if isinstance(x, Var)}


def _stores(stmts, out: list) -> list:
    out.extend(s for s in walk_stmts(stmts) if isinstance(s, Store))
    return out


def parallel_violations(kernel: Kernel, loop: For) -> list[str]:
    """Why ``loop`` may not run its iterations on different threads: each store to a kernel
    parameter (global memory) inside it must be indexed by the loop's variable, so that two
    iterations never write one element; locals are per thread. Empty list: it may."""
    bad = []
    for st in _stores(loop.body, []):
        if st.buf.scope != "global":
            continue
        if id(loop.var) not in _vars(st.index):
            bad.append(f"store to {st.buf.name} does not depend on {loop.var.name}")
    return bad


def carried_locals(kernel: Kernel, loop: For) -> list[str]:
    """Locals an iteration of ``loop`` reads before it writes them and also writes: values
    carried from one iteration to the next (an accumulator), which a split across threads
    would sum per thread and lose. (A hand-marked parallel loop may hold such a local on
    purpose, a per-thread cache of what it packed; a loop the scheduler picks may not.)"""
    stored = {id(st.buf) for st in _stores(loop.body, []) if st.buf.scope == "local"}
    return [f"{b.name} is carried from one iteration of {loop.var.name} to the next"
            for b in kernel.locals if id(b) in stored and _first_access(loop.body, b) == "load"]


def _work(s) -> int:
    """Estimated element operations of a statement: a store counts its lanes (non-constant
    loop extents count as 8)."""
    if isinstance(s, For):
        n = s.extent.value - s.start.value if _const_bounds(s) else 8
        return max(n, 0) * max(1, sum(_work(c) for c in s.body))
    if isinstance(s, If):
        return max(1, sum(_work(c) for c in s.then + s.orelse))
    return s.value.lanes if isinstance(s, Store) else 1


def _const_bounds(f: For) -> bool:
    from .kernel import Const
    return isinstance(f.extent, Const) and isinstance(f.start, Const)


def _nest(s) -> list[For]:
    """The perfect nest a top-level statement starts: loops each of whose bodies is one loop."""
    out = []
    while isinstance(s, For):
        out.append(s)
        if len(s.body) != 1:
            break
        s = s.body[0]
    return out


def _demote(stmts, keep) -> None:
    for s in stmts:
        if isinstance(s, For):
            if s.kind == "parallel" and s is not keep:
                s.kind = "serial"
            _demote(s.body, keep)
        elif isinstance(s, If):
            _demote(s.then, keep), _demote(s.orelse, keep)


def default_schedule(kernel: Kernel) -> Kernel:
    """Give each top-level loop nest of ``kernel`` at most one parallel loop, in place.

    A hand-marked ``parallel`` loop in the nest's perfect part is kept when it has at least
    :data:`MIN_PARALLEL_EXTENT` iterations; otherwise the first spatial loop of the perfect
    nest with that many (else the widest spatial one) becomes parallel, provided the nest does
    at least :data:`MIN_PARALLEL_WORK` iterations, :func:`parallel_violations` finds nothing
    and (a loop not marked by hand) it carries no local from one iteration to the next
    (:func:`carried_locals`).
    Parallel marks anywhere else are made serial (codegen splits only one loop per nest).
    A GPU kernel (one with a launch shape: a cuda hand schedule) is left as it is.
    Returns the kernel."""
    if kernel.launch is not None:
        return kernel
    for top in kernel.body:
        nest = _nest(top)
        chosen = None
        if nest and _work(top) >= MIN_PARALLEL_WORK:
            cands = []
            for f in nest:
                if f.role != "spatial" or not _const_bounds(f):
                    break
                cands.append(f)
            wide = [f for f in cands if f.extent.value - f.start.value >= MIN_PARALLEL_EXTENT]
            marked = [f for f in cands if f.kind == "parallel"]
            order = ([m for m in marked if m in wide] + wide +
                     sorted(cands, key=lambda f: -(f.extent.value - f.start.value)))
            for f in order:
                if (f.extent.value - f.start.value >= 2 and not parallel_violations(kernel, f)
                        and (f in marked or not carried_locals(kernel, f))):
                    chosen = f
                    break
        _demote([top], chosen)
        if chosen is not None:
            chosen.kind = "parallel"
    if _thread0_fills_locals(kernel):
        _demote(kernel.body, None)
    return kernel


def _thread0_fills_locals(kernel: Kernel) -> bool:
    """Whether a top-level statement that runs on thread 0 alone (serial, storing to global
    memory) fills a local that a parallel statement reads before writing it: the other
    threads' copies would be unset. (A serial statement that stores only to locals runs on
    every thread, so each fills its own copy; see :func:`runs_on_thread0_only`.)"""
    filled = {id(st.buf) for s in kernel.body if runs_on_thread0_only(s)
              for st in _stores([s], []) if st.buf.scope == "local"}
    if not filled:
        return False
    return any(_first_access([s], b) == "load" for s in kernel.body if statement_is_parallel(s)
               for b in kernel.locals if id(b) in filled)


def _loads(e, buf) -> bool:
    """Whether ``e`` loads from ``buf``."""
    return any(isinstance(x, Load) and x.buf is buf for x in expr_nodes(e))


def _first_access(stmts, buf) -> str | None:
    """"load" or "store": how ``stmts`` first touch ``buf`` in program order (a load in either
    branch of an If, or in a loop's bounds, counts as first); None if they do not."""
    for s in stmts:
        if isinstance(s, Store):
            if _loads(s.value, buf) or _loads(s.index, buf):
                return "load"
            if s.buf is buf:
                return "store"
        elif isinstance(s, For):
            if _loads(s.start, buf) or _loads(s.extent, buf):
                return "load"
            r = _first_access(s.body, buf)
            if r:
                return r
        elif isinstance(s, If):
            if _loads(s.cond, buf):
                return "load"
            a, b = _first_access(s.then, buf), _first_access(s.orelse, buf)
            if "load" in (a, b):
                return "load"
            if a == b == "store":
                return "store"
    return None


def statement_is_parallel(s) -> bool:
    """Whether a top-level statement is a perfect loop nest whose loops down to a parallel one
    each hold just the next: codegen splits that loop across the thread team."""
    while isinstance(s, For):
        if s.kind == "parallel":
            return True
        if len(s.body) != 1:
            return False
        s = s.body[0]
    return False


def runs_on_thread0_only(s) -> bool:
    """Whether codegen runs a top-level statement on thread 0 alone: it is not parallel and
    stores to global memory (a statement that stores only to locals runs on every thread)."""
    return not statement_is_parallel(s) and any(st.buf.scope != "local" for st in _stores([s], []))


def verify_schedule(kernel: Kernel) -> None:
    """Raise ScheduleError when a parallel loop sits where codegen cannot split it (outside a
    top-level perfect nest, or a second one in a nest) or may write one element twice, or when
    a statement on thread 0 alone fills locals that a parallel statement reads. GPU kernels
    (with a launch shape) have no CPU schedule to verify. In debug mode (``tensorfuse.debug``)
    every kernel's loads and stores are also checked against their buffers' bounds
    (:func:`ir.bounds.check_kernel_bounds`: ScheduleError naming the access)."""
    from tensorfuse.debug import debug_mode
    if debug_mode():
        from .bounds import BoundsError, check_kernel_bounds
        try:
            check_kernel_bounds(kernel)
        except BoundsError as e:
            raise ScheduleError(str(e)) from None
    if kernel.launch is not None:
        return
    if _thread0_fills_locals(kernel):
        raise ScheduleError(f"kernel {kernel.name}: a statement on thread 0 alone fills locals that the "
                            f"other threads of a parallel statement would read unset")
    for top in kernel.body:
        nest = _nest(top)
        first = next((f for f in nest if f.kind == "parallel"), None)
        for f in all_loops([top]):
            if f.kind == "parallel" and f is not first:
                raise ScheduleError(f"kernel {kernel.name}: parallel loop {f.var.name} is not the first "
                                    f"parallel loop of a top-level perfect loop nest")
        if first is not None:
            why = parallel_violations(kernel, first)
            if why:
                raise ScheduleError(f"kernel {kernel.name}: loop {first.var.name} cannot be parallel: "
                                    + "; ".join(why))


def walk_stmts(stmts):
    """Every statement in ``stmts`` and in the loop bodies and If branches nested in them, each
    before the statements it holds (an If's then-branch before its else-branch)."""
    for s in stmts:
        yield s
        yield from walk_stmts(_nested(s))


def _nested(s) -> list:
    if isinstance(s, For):
        return s.body
    if isinstance(s, If):
        return s.then + s.orelse
    return []


def all_loops(stmts):
    """Every For in a statement list, outer before inner (both branches of an If)."""
    return (s for s in walk_stmts(stmts) if isinstance(s, For))


# ----------------------------------------------------------------------------- loop collapsing
def collapse_loops(kernel: Kernel) -> int:
    """Collapse each serial loop whose body is one serial loop into one loop, in place, where
    the two walk one contiguous range of every index that reads their variables (OpenMP's
    ``collapse``, TVM's ``fuse`` of two axes whose strides line up); returns the number of
    loops removed.

    Outer ``u`` in 0..A and inner ``w`` in 0..B (constant bounds, the same role) collapse when
    every integer index expression is affine in them with ``u``'s coefficient B times ``w``'s
    (:func:`_collapsible`): then ``u * B + w`` runs over 0..A*B as the one loop's variable does,
    and the body is the same function of it with ``u`` set to 0 and ``w`` the collapsed
    variable. A loop of one iteration goes whatever its variable indexes (it is 0). A copy of
    ``[1, 3, 28, 192]`` elements becomes one loop of 16128 instead of a nest whose 28-iteration
    loop LLVM unrolls after vectorising the 192 (each copy with its own aliasing checks: ten
    times the compile time). Parallel, vectorize and unroll loops are left as they are."""
    removed = 0

    def visit(stmts):
        nonlocal removed
        for s in stmts:
            if isinstance(s, For):
                while _collapse_pair(s):
                    removed += 1
                visit(s.body)
            elif isinstance(s, If):
                visit(s.then)
                visit(s.orelse)
    visit(kernel.body)
    return removed


def _collapse_pair(outer: For) -> bool:
    """Collapse ``outer`` with the one loop its body holds, in place (:func:`collapse_loops`);
    False when they cannot be."""
    if len(outer.body) != 1 or not isinstance(outer.body[0], For):
        return False
    inner = outer.body[0]
    if not (outer.kind == inner.kind == "serial" and outer.role == inner.role
            and _zero_based(outer) and _zero_based(inner)):
        return False
    a, b = int(outer.extent.value), int(inner.extent.value)
    if a == 1:
        zero, keep = outer.var, inner.var          # u is 0: w's loop as it is
    elif b == 1:
        zero, keep = inner.var, outer.var          # w is 0: u's loop as it is
    elif _collapsible(inner.body, outer.var, inner.var, b):
        zero, keep = outer.var, inner.var          # u * B + w = the collapsed variable
    else:
        return False
    body = _substitute_stmts(inner.body, {id(zero): Const(0, I64)})
    if body is None:
        return False
    outer.var, outer.extent, outer.body = keep, Const(a * b, I64), body
    outer.comment = outer.comment or inner.comment
    return True


def _zero_based(f: For) -> bool:
    """Whether ``f`` runs 0..n for a constant n >= 1."""
    return (isinstance(f.start, Const) and isinstance(f.extent, Const) and f.start.value == 0
            and f.extent.value >= 1)


def loaded_buffers(stmts) -> set[str]:
    """Names of the buffers ``stmts`` (and the statements nested in them) load from, in any
    expression they read."""
    return {x.buf.name for st in walk_stmts(stmts) for e in (_stmt_exprs(st) or [])
            for x in expr_nodes(e) if isinstance(x, Load)}


def _stmt_exprs(s):
    """The expressions a statement reads directly (not those of nested statements); None for a
    statement kind this walk does not know."""
    if isinstance(s, Store):
        return [s.index, s.value]
    if isinstance(s, For):
        return [s.start, s.extent]
    if isinstance(s, If):
        return [s.cond]
    if isinstance(s, Prefetch):
        return [s.index]
    if isinstance(s, TileOp):
        return [s.index] if s.index is not None else []
    if isinstance(s, Barrier):
        return []
    return None


def _expr_fields(e) -> list | None:
    """The sub-expressions held in ``e``'s fields; None when ``e`` is not a dataclass (an
    expression kind whose operands this walk cannot see)."""
    if not is_dataclass(e):
        return None
    out = []
    for f in fields(e):
        v = getattr(e, f.name)
        if isinstance(v, Expr):
            out.append(v)
        elif _expr_tuple(v):
            out.extend(v)
    return out


def _expr_tuple(v) -> bool:
    """Whether a field's value is a tuple of expressions (a Concat's parts; a Shuffle's mask
    is a tuple of ints)."""
    return isinstance(v, tuple) and bool(v) and all(isinstance(p, Expr) for p in v)


def _is_index_arith(e) -> bool:
    """Whether ``e`` is a node of integer index arithmetic: a scalar i64 variable, constant,
    sum, difference, or product with a constant."""
    if isinstance(e, (Var, Const)):
        return e.dtype == I64
    if isinstance(e, Bin) and e.dtype == I64 and e.lanes == 1:
        if e.op in ("add", "sub"):
            return True
        return e.op == "mul" and (isinstance(e.a, Const) or isinstance(e.b, Const))
    return False


def _collapsible(stmts, u: Var, w: Var, extent: int) -> bool:
    """Whether in every maximal tree of index arithmetic (:func:`_is_index_arith`) that
    ``stmts`` hold, the coefficient of ``u`` is ``extent`` times that of ``w`` (trees inside a
    load's index, a division's operands, a comparison ... each count on their own; a
    variable elsewhere, as a comparison's operand or a cast's, is such a tree by itself)."""
    forms: dict[int, tuple[int, int]] = {}      # id(index node) -> (coefficient of u, of w)
    seen: set[int] = set()                      # ids of the non-index nodes walked
    pending: list = []

    def form(e) -> tuple[int, int]:
        r = forms.get(id(e))
        if r is not None:
            return r
        if isinstance(e, Var):
            r = (1 if e is u else 0, 1 if e is w else 0)
        elif isinstance(e, Const):
            r = (0, 0)
        elif e.op == "mul":
            k, x = (e.a.value, e.b) if isinstance(e.a, Const) else (e.b.value, e.a)
            cu, cw = part(x)
            r = (k * cu, k * cw)
        else:
            (au, aw), (bu, bw) = part(e.a), part(e.b)
            r = (au + bu, aw + bw) if e.op == "add" else (au - bu, aw - bw)
        forms[id(e)] = r
        return r

    def part(e) -> tuple[int, int]:
        if _is_index_arith(e):
            return form(e)
        pending.append(e)           # an opaque term: its own operands are checked as roots
        return (0, 0)

    for s in walk_stmts(stmts):
        roots = _stmt_exprs(s)
        if roots is None:
            return False
        pending.extend(roots)
        while pending:
            e = pending.pop()
            if _is_index_arith(e):
                cu, cw = form(e)
                if cu != extent * cw:
                    return False
                continue
            if id(e) in seen:
                continue
            seen.add(id(e))
            ch = _expr_fields(e)
            if ch is None:
                return False
            pending.extend(ch)
    return True


def _substitute_stmts(stmts, m: dict) -> list | None:
    """Copies of ``stmts`` with each Var whose id is a key of ``m`` replaced by ``m[id]``
    (integer arithmetic on constants folded, as the builder folds it); None when a statement
    or expression kind is unknown to this walk."""
    memo: dict[int, object] = {}

    def sub(x):
        r = memo.get(id(x))
        if r is not None:
            return r
        if isinstance(x, Var):
            r = m.get(id(x), x)
        elif isinstance(x, Const):
            r = x
        else:
            if not is_dataclass(x):
                raise _Unknown
            ch = {}
            for f in fields(x):
                v = getattr(x, f.name)
                if isinstance(v, Expr):
                    ch[f.name] = sub(v)
                elif _expr_tuple(v):
                    parts = tuple(sub(p) for p in v)
                    ch[f.name] = v if all(a is b for a, b in zip(parts, v)) else parts
            if all(ch[k] is getattr(x, k) for k in ch):
                r = x
            elif isinstance(x, Bin):
                r = binop(x.op, ch["a"], ch["b"])
            else:
                r = replace(x, **ch)
        memo[id(x)] = r
        return r

    def stmt(s):
        if isinstance(s, Store):
            return Store(s.buf, sub(s.index), sub(s.value), s.stride)
        if isinstance(s, For):
            return For(s.var, sub(s.extent), [stmt(c) for c in s.body], s.kind, sub(s.start), s.comment, s.role)
        if isinstance(s, If):
            return If(sub(s.cond), [stmt(c) for c in s.then], [stmt(c) for c in s.orelse])
        if isinstance(s, Prefetch):
            return Prefetch(s.buf, sub(s.index), s.locality)
        if isinstance(s, TileOp):
            return replace(s, index=sub(s.index)) if s.index is not None else s
        if isinstance(s, Barrier):
            return s
        raise _Unknown

    try:
        return [stmt(s) for s in stmts]
    except _Unknown:
        return None


class _Unknown(Exception):
    """A statement or expression kind the loop collapsing walks do not know."""
