"""Building blocks of the cuda hand schedules: a thread block cooperating on one row (its
elements strided across the block's threads, coalesced) and tree reductions through shared
memory (docs/architecture.md "GPU codegen"). The schedules of this package use them; they
register nothing themselves.

The block size of every row schedule is a knob, ``block_threads`` (:func:`block_threads_knob`):
a power of two from a warp (32) up to the target's ``max_threads_per_block`` (1024), no larger
than needed to give each element of the row a thread; the default is :func:`block_threads_for`,
the formula the schedules always used.
"""
from __future__ import annotations

from tensorfuse.ir.knobs import knob

from ..launches import BLOCK_THREADS     # the cap of block_threads_for without a target

#: rows shorter than this stay one thread per row (the generic schedule): a block per row
#: would leave most of its threads idle and pay a barrier per reduction step
BLOCK_ROW_MIN = 64
#: the smallest block of a row schedule: one warp
WARP = 32


def use_block_rows(n: int) -> bool:
    """Whether rows of ``n`` elements take a block-per-row cuda hand schedule (at least
    :data:`BLOCK_ROW_MIN` elements)."""
    return n >= BLOCK_ROW_MIN


def block_threads_for(n: int, target=None) -> int:
    """Threads per block for a block that cooperates on ``n`` elements: the smallest power of
    two >= ``n``, at least a warp (32) and at most the target's ``block_threads`` (256)."""
    cap = target.block_threads if target is not None else BLOCK_THREADS
    t = WARP
    while t < n and t < cap:
        t *= 2
    return t


def pow2_range(lo: int, hi: int) -> list[int]:
    """The powers of two ``p`` with ``lo <= p <= hi`` (``lo`` a power of two)."""
    out, p = [], lo
    while p <= hi:
        out.append(p)
        p *= 2
    return out


def block_threads_knob(n: int, target) -> int:
    """Declare the knob ``block_threads`` of a schedule whose block cooperates on rows of ``n``
    elements and return its value: candidates the powers of two from 32 to the smallest one
    >= ``n`` (at most ``target.max_threads_per_block``); default :func:`block_threads_for`.
    Any candidate is correct (a thread past the row's end does nothing but take part in the
    reduction with the fold's identity)."""
    hi = WARP
    while hi < n and hi < target.max_threads_per_block:
        hi *= 2
    return knob("block_threads", pow2_range(WARP, hi), block_threads_for(n, target),
                doc="threads per block (one block per row, partials reduced in shared memory)")


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


def unravel(i, dims) -> list:
    """Index list of flat index ``i`` (an Expr) over ``dims`` (row-major)."""
    out, stride = [], 1
    for k in range(len(dims) - 1, -1, -1):
        q = i / stride if stride > 1 else i
        out.append(q if k == 0 else q % dims[k])
        stride *= dims[k]
    return out[::-1]
