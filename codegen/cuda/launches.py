"""The generic cuda schedule: any kernel as a sequence of GPU launches (docs/architecture.md
"Kernel IR, schedules and backends"; TVM's dlight fallback plays this part there).

The kernel IR's meaning is its serial one (statements in order); the CPU schedule runs a
top-level parallel loop on a thread team. On a GPU:

- each top-level statement becomes one launch; launches run in order on the stream, so
  statements that communicate through global buffers stay correct;
- a statement that starts a perfect nest of spatial loops (role "spatial" or kind parallel,
  constant bounds, every global store indexed by the loop) has that prefix of the nest fused
  into one linear index ``g`` over ``n`` iterations, run by a ``grid_stride`` loop (each loop
  variable becomes ``start + g // stride % extent`` in the body); the rest of the nest
  (reductions, loops of run-time extent) runs serially in each thread;
- a statement without such a loop runs on one thread (grid 1, block 1);
- locals (``scope="local"``) are per thread. A statement that stores only to locals has no
  effect of its own: it is copied to the front of each launch that reads those locals before
  writing them (each thread recomputes them, as each CPU thread does). When a statement that
  stores to global memory fills locals a later statement reads (the "thread 0 fills locals"
  pattern), or a local-filling statement reads a global the kernel writes, the whole kernel is
  one launch on one thread: correct, and rare (the CPU runs such kernels on one thread too).

Block size and the grid cap are parameters (defaults from the target: 256 threads, 65535
blocks); a launch of ``n`` iterations takes ``min(block, n)`` threads per block and
``min(ceil(n / block), max_blocks)`` blocks. A kernel that already has a launch shape (a hand
schedule with GPU loop kinds) is one launch as it stands.

The block size is a knob of each node whose kernels take this schedule, ``launch_threads``
(:func:`declare_launch_knob`, declared by the cuda backend's ``schedule_kernel`` while the node
lowers): a value other than its default (the target's ``block_threads``) replaces the block
size the library is built with (``jit.build_library``), for that kernel's launches.
"""
from __future__ import annotations

import math
from dataclasses import fields, replace

from tensorfuse.ir.kernel import (GPU_LOOP_KINDS, Buffer, Const, Expr, For, If, Kernel, LaunchShape, Load,
                                  Store, Var, binop)
from tensorfuse.ir.schedule import _first_access, _nest, _stores, all_loops, expr_nodes, parallel_violations

#: defaults of the generic schedule (the cuda target's block_threads and max_blocks)
BLOCK_THREADS = 256
MAX_BLOCKS = 65535


def substitute(e, m: dict):
    """``e`` with each Var whose id is a key of ``m`` replaced by ``m[id(var)]`` (a new tree
    where anything changed; shared sub-expressions stay shared)."""
    memo: dict[int, Expr] = {}

    def go(x):
        if not isinstance(x, Expr):
            return x
        r = memo.get(id(x))
        if r is not None:
            return r
        if isinstance(x, Var):
            r = m.get(id(x), x)
        else:
            ch = {f.name: go(getattr(x, f.name)) for f in fields(x)
                  if isinstance(getattr(x, f.name), Expr)}
            r = replace(x, **ch) if any(ch[k] is not getattr(x, k) for k in ch) else x
        memo[id(x)] = r
        return r
    return go(e)


def substitute_stmts(stmts, m: dict) -> list:
    """Copies of ``stmts`` with :func:`substitute` applied to every expression."""
    out = []
    for s in stmts:
        if isinstance(s, Store):
            out.append(Store(s.buf, substitute(s.index, m), substitute(s.value, m), s.stride))
        elif isinstance(s, For):
            out.append(For(s.var, substitute(s.extent, m), substitute_stmts(s.body, m), s.kind,
                           substitute(s.start, m), s.comment, s.role))
        elif isinstance(s, If):
            out.append(If(substitute(s.cond, m), substitute_stmts(s.then, m), substitute_stmts(s.orelse, m)))
        else:
            out.append(s)
    return out


def _const_loop(f: For) -> bool:
    return isinstance(f.start, Const) and isinstance(f.extent, Const)


def grid_prefix(kernel: Kernel, s) -> list[For]:
    """The loops of the perfect nest ``s`` starts that one GPU thread per iteration may run:
    the longest prefix of spatial loops (or parallel ones) with constant bounds whose global
    stores all depend on the loop variable (:func:`schedule.parallel_violations`)."""
    out = []
    for f in _nest(s):
        if not (f.role == "spatial" or f.kind == "parallel") or not _const_loop(f):
            break
        if f.kind not in ("serial", "parallel", "vectorize", "unroll"):
            break
        if f.extent.value - f.start.value < 1 or parallel_violations(kernel, f):
            break
        out.append(f)
    return out


def launch_shape(n: int, block: int = BLOCK_THREADS, max_blocks: int = MAX_BLOCKS) -> LaunchShape:
    """The (grid, block) of a grid-stride launch over ``n`` iterations (see the module doc)."""
    b = max(1, min(block, n))
    return LaunchShape((max(1, min(-(-n // b), max_blocks)),), (b,))


def _grid_stride(kernel: Kernel, s, nest: list[For], name: str) -> For:
    """``s`` with ``nest`` fused into one grid-stride loop over a new variable ``name``."""
    g = Var(name)
    exts = [int(f.extent.value) - int(f.start.value) for f in nest]
    m, stride = {}, 1
    for f, n in zip(reversed(nest), reversed(exts)):
        q = g if stride == 1 else binop("div", g, Const(stride))
        if f is not nest[0]:
            q = binop("rem", q, Const(n))
        m[id(f.var)] = binop("add", q, Const(int(f.start.value)))
        stride *= n
    body = substitute_stmts(nest[-1].body, m)
    dims = " x ".join(f"{f.var.name}[{n}]" for f, n in zip(nest, exts))
    return For(g, Const(math.prod(exts)), body, "grid_stride", Const(0), f"fused {dims}", "spatial")


def _locals_only(s) -> bool:
    return all(st.buf.scope == "local" for st in _stores([s], []))


def _reads_global(s, bufs: set) -> bool:
    """Whether statement ``s`` loads any buffer whose id is in ``bufs``."""
    def exprs(t):
        if isinstance(t, Store):
            yield t.index
            yield t.value
        elif isinstance(t, For):
            yield t.start
            yield t.extent
            for c in t.body:
                yield from exprs(c)
        elif isinstance(t, If):
            yield t.cond
            for c in t.then + t.orelse:
                yield from exprs(c)
    return any(isinstance(x, Load) and id(x.buf) in bufs for e in exprs(s) for x in expr_nodes(e))


def _used_locals(kernel: Kernel, stmts) -> list[Buffer]:
    ids = {id(st.buf) for st in _stores(stmts, [])}

    def scan(ss):
        for t in ss:
            if isinstance(t, Store):
                es = [t.index, t.value]
            elif isinstance(t, For):
                es = [t.start, t.extent]
                scan(t.body)
            elif isinstance(t, If):
                es = [t.cond]
                scan(t.then), scan(t.orelse)
            else:
                es = []
            for e in es:
                ids.update(id(x.buf) for x in expr_nodes(e) if isinstance(x, Load))
    scan(stmts)
    return [b for b in kernel.locals if id(b) in ids]


def cuda_launches(kernel: Kernel, block: int = BLOCK_THREADS, max_blocks: int = MAX_BLOCKS) -> list[Kernel]:
    """The launches that run ``kernel`` on a GPU, in order: kernels with the same parameters
    as ``kernel``, a body of GPU loops and a :class:`LaunchShape` each (named
    ``<kernel>_l<i>`` when there are several). ``kernel`` is not changed. See the module doc."""
    if kernel.launch is not None or any(f.kind in GPU_LOOP_KINDS for f in all_loops(kernel.body)):
        if kernel.launch is None:
            raise ValueError(f"kernel {kernel.name} has GPU loops but no launch shape")
        return [kernel]
    body = kernel.body
    local_ids = {id(b) for b in kernel.locals if b.scope == "local"}
    stored_global = {id(st.buf) for st in _stores(body, []) if st.buf.scope == "global"}
    # for each statement, the earlier statements whose locals it reads before writing them
    needs: list[list[int]] = []
    serial_all = False
    for j, s in enumerate(body):
        reads = [b for b in kernel.locals if id(b) in local_ids and _first_access([s], b) == "load"]
        prod = sorted({i for i in range(j) for b in reads
                       if any(st.buf is b for st in _stores([body[i]], []))})
        for i in prod:
            if not _locals_only(body[i]) or _reads_global(body[i], stored_global):
                serial_all = True
        needs.append(prod)
    if serial_all:
        return [Kernel(kernel.name, kernel.params, list(body), list(kernel.locals),
                       kernel.comment + "  [cuda: one thread (a global-storing statement fills locals)]",
                       LaunchShape((1,), (1,)))]

    def closure(j: int) -> list[int]:
        seen, todo = set(), list(needs[j])
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(needs[i])
        return sorted(seen)

    launches = []
    for j, s in enumerate(body):
        if _locals_only(s):
            continue                # stores only to locals: copied into the launches that read them
        pre = [body[i] for i in closure(j)]
        nest = grid_prefix(kernel, s)
        if nest:
            n = math.prod(int(f.extent.value) - int(f.start.value) for f in nest)
            stmt = _grid_stride(kernel, s, nest, f"g{len(launches)}")
            shape = launch_shape(n, block, max_blocks)
        else:
            stmt, shape = s, LaunchShape((1,), (1,))
        lb = pre + [stmt]
        launches.append(Kernel(kernel.name, kernel.params, lb, _used_locals(kernel, lb), kernel.comment, shape))
    if len(launches) > 1:
        for i, k in enumerate(launches):
            k.name = f"{kernel.name}_l{i}"
    return launches


#: the candidates of the generic schedule's ``launch_threads`` knob
LAUNCH_THREADS = (32, 64, 128, 256, 512, 1024)


def declare_launch_knob(kernel: Kernel, target) -> int | None:
    """Declare the knob ``launch_threads`` (threads per block of the generic schedule's
    launches; candidates :data:`LAUNCH_THREADS` up to ``target.max_threads_per_block``, default
    ``target.block_threads``) for ``kernel`` when :func:`cuda_launches` will schedule it (no
    launch shape, no GPU loops), and return its value; None for a hand-scheduled kernel."""
    from tensorfuse.ir.knobs import knob
    if kernel.launch is not None or any(f.kind in GPU_LOOP_KINDS for f in all_loops(kernel.body)):
        return None
    return knob("launch_threads", [t for t in LAUNCH_THREADS if t <= target.max_threads_per_block],
                target.block_threads, doc="threads per block of the generic grid-stride launches")


def launch_block(kernel: Kernel, block: int) -> int:
    """The block size to build ``kernel``'s generic launches with: its node's ``launch_threads``
    knob where that is not the default (a tuned value), else ``block`` (the build's default)."""
    v = kernel.knobs.get("launch_threads") if kernel.knobs else None
    return int(v) if isinstance(v, int) and v != BLOCK_THREADS else block
