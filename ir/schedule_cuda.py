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
"""
from __future__ import annotations

import math
from dataclasses import fields, replace

from .kernel import (GPU_LOOP_KINDS, Buffer, Const, Expr, For, If, Kernel, LaunchShape, Load,
                     Store, Var, binop)
from .schedule import _first_access, _nest, _stores, all_loops, expr_nodes, parallel_violations

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


# ----------------------------------------------------------------------------- hand schedules
#: rows shorter than this stay one thread per row (the generic schedule): a block per row
#: would leave most of its threads idle and pay a barrier per reduction step
BLOCK_ROW_MIN = 64


def use_block_rows(n: int, target) -> bool:
    """Whether rows of ``n`` elements take a block-per-row cuda hand schedule."""
    return target is not None and target.kind == "cuda" and n >= BLOCK_ROW_MIN


def block_threads_for(n: int, target=None) -> int:
    """Threads per block for a block that cooperates on ``n`` elements: the smallest power of
    two >= ``n``, at least a warp (32) and at most the target's ``block_threads`` (256)."""
    cap = target.block_threads if target is not None and target.kind == "cuda" else BLOCK_THREADS
    t = 32
    while t < n and t < cap:
        t *= 2
    return t


def block_strided(kb, T: int, t, n: int, body) -> None:
    """``body(c)`` for each ``c = t, t+T, t+2T ... < n`` (the elements thread ``t`` of a block
    of ``T`` threads handles, coalesced across the block); a reduce loop, since the thread's
    iterations accumulate into its own partials."""
    steps = -(-n // T)
    with kb.reduce(steps, hint="it") as it:
        c = it * T + t
        if n % T == 0:
            body(c)
        else:
            with kb.if_(c < n):
                body(c)


def block_reduce(kb, sh, T: int, combine, hint: str = "t", keep: int = 1) -> None:
    """Tree reduction of the shared buffer ``sh[0:T]`` (``T`` a power of two, one value per
    thread already stored, no barrier needed before) into ``sh[0]`` with ``combine(a, b)``:
    log2(T) steps, each a ``threadIdx.x`` loop and a barrier; every thread may read ``sh[0]``
    afterwards. With ``keep`` (a power of two dividing ``T``) the reduction stops at
    ``sh[0:keep]``: ``sh[c]`` combines ``sh[c], sh[c + keep], sh[c + 2 keep] ...`` (``keep``
    independent reductions whose values are interleaved, e.g. one per channel of a tile)."""
    kb.barrier()
    s = T // 2
    while s >= keep:
        with kb.loop(T, kind="threadIdx.x", hint=hint) as t:
            with kb.if_(t < s):
                kb.store(sh, t, combine(sh[t], sh[t + s]))
        kb.barrier()
        s //= 2


def block_row_reduce(kb, sh, part, T: int, n: int, init, step, combine, result, final=None) -> None:
    """One reduction of ``n`` elements by a block of ``T`` threads (``T`` a power of two), inside
    a ``blockIdx.x`` loop: each thread folds ``step(partial, c)`` over its elements
    ``c = t, t+T, ...`` (:func:`block_strided`) into the local ``part`` from ``init``, the
    partials meet in the shared ``sh[0:T]`` (:func:`block_reduce` with ``combine``), and every
    thread stores the total (``final(total)`` with ``final``) into its local ``result`` (a
    1-element buffer). Ends with a barrier, so ``sh`` may be reused at once. ``combine`` must be
    the fold ``step`` makes (sums: the order of the additions changes; maxNum, min, products:
    same results); ``step`` may emit stores of its own before returning the new partial."""
    with kb.loop(T, kind="threadIdx.x", hint="t") as t:
        kb.store(part, 0, init)
        block_strided(kb, T, t, n, lambda c: kb.store(part, 0, step(part[0], c)))
        kb.store(sh, t, part[0])
    block_reduce(kb, sh, T, combine)
    with kb.loop(T, kind="threadIdx.x", hint="t") as t:
        kb.store(result, 0, sh[0] if final is None else final(sh[0]))
    kb.barrier()                       # every thread has read sh[0] before it is overwritten


#: the square output tile of the cuda matmul schedule: a block of MATMUL_TILE^2 threads, one
#: output element each, A and B staged through shared memory in MATMUL_TILE-wide K slices
MATMUL_TILE = 16


def unravel(i, dims) -> list:
    """Index list of flat index ``i`` (an Expr) over ``dims`` (row-major)."""
    out, stride = [], 1
    for k in range(len(dims) - 1, -1, -1):
        q = i / stride if stride > 1 else i
        out.append(q if k == 0 else q % dims[k])
        stride *= dims[k]
    return out[::-1]


def tiled_gemm(ctx, kb, M: int, N: int, K: int, batch, load_a, load_b, store, acc, T: int = MATMUL_TILE) -> None:
    """The cuda shared-memory GEMM schedule, into the empty kernel of ``kb``:
    ``store(bidx, i, j, sum over k of load_a(bidx, i, k) * load_b(bidx, k, j))`` for every
    ``bidx`` over ``batch`` (a shape; () for none), i < M, j < N.

    A thread block of T*T threads per T x T output tile (block-stride over batch x tiles, so
    any grid cap is fine), one output element per thread; the K dimension runs in slices of T,
    each slice of A [T rows, T k] and B [T k, T cols] staged through shared memory (``acc``
    dtype, 2 T^2 elements) with zeros beyond M, N and K; one accumulator per thread summing k in
    order; ``store`` only for i < M and j < N. ``load_a``/``load_b`` get in-range indices (they
    are clamped before the call) and return Exprs of dtype ``acc``; they may gather (an
    implicit GEMM's im2col loads) and return zero themselves for padding. Sets the kernel's
    launch shape. Used by MatMul/Gemm (ir/ops/linalg.py) and ConvNHWC (ir/ops/layout_nhwc.py)."""
    from .kernel import as_expr, minimum, select
    mt, nt = -(-M // T), -(-N // T)
    nb = math.prod(batch) if batch else 1
    sa = kb.shared(acc, (T * T,), hint="ta")
    sb = kb.shared(acc, (T * T,), hint="tb")
    part = kb.local(acc, (1,), hint="acc")
    zero = as_expr(0, acc)

    def threads():
        return kb.loop(T * T, kind="threadIdx.x", hint="t")

    with kb.loop(nb * mt * nt, kind="blockIdx.x", hint="blk") as blk:
        tile = blk % (mt * nt) if nb > 1 else blk
        bidx = unravel(blk / (mt * nt), list(batch)) if batch else []
        i0 = (tile / nt) * T if nt > 1 else tile * T
        j0 = (tile % nt) * T if nt > 1 else as_expr(0)
        with threads() as t:
            kb.store(part, 0, zero)
        with kb.reduce(-(-K // T), hint="kt") as kt:
            k0 = kt * T
            with threads() as t:
                ty, tx = t / T, t % T
                i, k = i0 + ty, k0 + tx
                kb.store(sa, t, select((i < M) & (k < K), load_a(bidx, minimum(i, M - 1), minimum(k, K - 1)), zero))
                kk, j = k0 + ty, j0 + tx
                kb.store(sb, t, select((kk < K) & (j < N), load_b(bidx, minimum(kk, K - 1), minimum(j, N - 1)), zero))
            kb.barrier()
            with threads() as t:
                ty, tx = t / T, t % T
                with kb.reduce(T, hint="q") as q:
                    kb.store(part, 0, part[0] + sa[ty * T + q] * sb[q * T + tx])
            kb.barrier()
        with threads() as t:
            i, j = i0 + t / T, j0 + t % T
            with kb.if_((i < M) & (j < N)):
                store(bidx, i, j, part[0])
    kb.kernel.launch = LaunchShape((max(1, min(nb * mt * nt, ctx.target.max_blocks)),), (T * T,))
    kb.kernel.comment += f"  [cuda: {T}x{T} output tiles, shared-memory A and B slices]"
