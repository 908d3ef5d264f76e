"""Schedules of kernel IR: the default CPU schedule and the parallel-loop verifier (DESIGN.md
"Kernel IR, schedules and backends").

Hand schedules (conv, matmul ...) are written by their lowerings; :func:`default_schedule` covers
the long tail, as TVM's dlight fallback does: in each top-level loop nest it makes one spatial
loop ``parallel`` (codegen cuts it into one chunk per thread), and it leaves the innermost
contiguous loops to LLVM's loop vectoriser. The code is independent of the thread count: the
team size is a run-time value.
"""
from __future__ import annotations

from .kernel import Bin, Broadcast, Cast, FMA, For, If, Kernel, Load, Select, Store, Un, Var

#: a nest whose estimated iteration count is below this stays on one thread (a barrier costs
#: about a microsecond; a few thousand scalar iterations cost about as much)
MIN_PARALLEL_WORK = 4096
#: the parallel loop is the first of its nest with at least this many iterations, if any
MIN_PARALLEL_EXTENT = 16


class ScheduleError(Exception):
    """A schedule the kernel's semantics forbid (a parallel loop whose iterations may write
    the same element); names the kernel and the loop."""


def _vars(e, out: set) -> set:
    if isinstance(e, Var):
        out.add(id(e))
    elif isinstance(e, Load):
        _vars(e.index, out)
    elif isinstance(e, (Bin,)):
        _vars(e.a, out), _vars(e.b, out)
    elif isinstance(e, (Un, Cast, Broadcast)):
        _vars(e.a, out)
    elif isinstance(e, Select):
        _vars(e.cond, out), _vars(e.a, out), _vars(e.b, out)
    elif isinstance(e, FMA):
        _vars(e.a, out), _vars(e.b, out), _vars(e.c, out)
    return out


def _stores(stmts, out: list) -> list:
    for s in stmts:
        if isinstance(s, Store):
            out.append(s)
        elif isinstance(s, For):
            _stores(s.body, out)
        elif isinstance(s, If):
            _stores(s.then, out), _stores(s.orelse, out)
    return out


def parallel_violations(kernel: Kernel, loop: For) -> list[str]:
    """Why ``loop`` may not run its iterations on different threads: each store to a kernel
    parameter (global memory) inside it must be indexed by the loop's variable, so that two
    iterations never write one element; locals are per thread. Empty list: it may."""
    bad = []
    for st in _stores(loop.body, []):
        if st.buf.scope != "global":
            continue
        if id(loop.var) not in _vars(st.index, set()):
            bad.append(f"store to {st.buf.name} does not depend on {loop.var.name}")
    return bad


def _work(s) -> int:
    """Estimated iterations of a statement (non-constant extents count as 8)."""
    if isinstance(s, For):
        n = s.extent.value - s.start.value if _const_bounds(s) else 8
        return max(n, 0) * max(1, sum(_work(c) for c in s.body))
    if isinstance(s, If):
        return max(1, sum(_work(c) for c in s.then + s.orelse))
    return 1


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
    at least :data:`MIN_PARALLEL_WORK` iterations and :func:`parallel_violations` finds nothing.
    Parallel marks anywhere else are made serial (codegen splits only one loop per nest).
    Returns the kernel."""
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
                if f.extent.value - f.start.value >= 2 and not parallel_violations(kernel, f):
                    chosen = f
                    break
        _demote([top], chosen)
        if chosen is not None:
            chosen.kind = "parallel"
    return kernel


def verify_schedule(kernel: Kernel) -> None:
    """Raise ScheduleError when a parallel loop sits where codegen cannot split it (outside a
    top-level perfect nest, or a second one in a nest) or may write one element twice."""
    for top in kernel.body:
        nest = _nest(top)
        first = next((f for f in nest if f.kind == "parallel"), None)
        for f in _all_loops([top]):
            if f.kind == "parallel" and f is not first:
                raise ScheduleError(f"kernel {kernel.name}: parallel loop {f.var.name} is not the first "
                                    f"parallel loop of a top-level perfect loop nest")
        if first is not None:
            why = parallel_violations(kernel, first)
            if why:
                raise ScheduleError(f"kernel {kernel.name}: loop {first.var.name} cannot be parallel: "
                                    + "; ".join(why))


def _all_loops(stmts):
    for s in stmts:
        if isinstance(s, For):
            yield s
            yield from _all_loops(s.body)
        elif isinstance(s, If):
            yield from _all_loops(s.then)
            yield from _all_loops(s.orelse)
