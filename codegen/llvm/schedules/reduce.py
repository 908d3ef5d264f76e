"""The llvm backend's schedule of the Reduce* ops (``ir.ops.reduce``, key ``"reduction"``):
:func:`reduction_rows_vector`.

``reduction_rows_vector`` (plevel 5): float32 reductions over trailing axes (no kept dim after
the last reduced one, so each output reduces one contiguous row of ``count`` elements: a
squeeze-excitation ``ReduceMean`` over [H, W] as torch's dynamo exporter writes
GlobalAveragePool, a ``ReduceSum``/``ReduceMax`` over the last axis), at least one vector per
row. Each pass's step (``ir.ops.reduce.Pass``) runs on ``U`` partial vector accumulators of
``L`` lanes, which its ``combine`` then joins (vectors, then lanes) before the tail elements
are stepped one at a time: the generic nest's per-element steps in another order of the
additions (max/min keep maxNum's NaN skipping: every partial starts at the pass's init).
Parallel over the outputs. Knob ``accumulators`` (U: 1, 2, 4, 8, at most the row's whole
vectors; default min(:data:`ACCUMULATORS`, vectors)).

The generic nest runs such a reduction as one scalar dependency chain per output (one add
every 4 cycles): efficientnet_b0's dynamo export spent 1.1 ms in its 16 squeeze ReduceMeans,
the TorchScript export's GlobalAveragePools 0.25 ms.
"""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import broadcast
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

#: partial vector accumulators per row by default (independent dependency chains)
ACCUMULATORS = 4


def _trailing(x, axes) -> bool:
    return bool(axes) and tuple(axes) == tuple(range(axes[0], len(x.shape)))


def _applies(ctx, kb, x, y, axes, acc, passes, finish) -> bool:
    L = ctx.target.lanes(DType.f32)
    return (x.dtype == DType.f32 and acc == DType.f32 and _trailing(x, axes)
            and all(ps.combine for ps in passes) and y.numel > 0
            and math.prod(x.shape[d] for d in axes) >= L)


@register_schedule("reduction", "llvm", "reduction_rows_vector", plevel=5, applies=_applies)
def reduction_rows_vector(ctx, kb, x, y, axes, acc: DType, passes, finish) -> None:
    """Vector partial accumulators per contiguous row (module docstring), into the empty
    kernel ``kb``: y [outputs] (keepdims or not: the same flat layout) from x viewed as
    [outputs, count]."""
    L = ctx.target.lanes(DType.f32)
    count = math.prod(x.shape[d] for d in axes)
    nvec = count // L
    U = knob("accumulators", [u for u in (1, 2, 4, 8) if u <= nvec], max(1, min(ACCUMULATORS, nvec)),
             doc="partial vector accumulators per row")
    part = kb.local(acc, (U * L,), hint="part")
    tots = [kb.local(acc, (1,), hint=f"tot{p}_") for p in range(len(passes))]
    with kb.loop(y.numel, kind="parallel", hint="o") as o:
        base = o * count
        for p, ps in enumerate(passes):
            prev_s = [t[0] for t in tots[:p]]           # the earlier passes' finished values
            prev_v = [broadcast(a, L) for a in prev_s]
            row_partials(kb, x, base, count, L, part, tots[p], broadcast(ps.init(acc), L),
                         lambda a, v, prev_v=prev_v, ps=ps: ps.step(prev_v, a, v), ps.combine,
                         lambda t, v, prev_s=prev_s, ps=ps: ps.step(prev_s, t, v))
        kb.store(y, o, finish([t[0] for t in tots], count))


def row_partials(kb, x, base, count: int, L: int, part, tot, init, step, combine, tail_step) -> None:
    """Reduce the contiguous row ``x[base : base + count]`` into ``tot[0]``: ``part`` (a local
    of U*L elements) holds U partial vector accumulators, each starting at ``init`` (an L-lane
    vector); ``step(acc, v)`` takes the row's vectors in turn (the vectors left over after
    whole rounds of U go to the first accumulators), ``combine(a, b)`` joins the accumulators
    and then their lanes in order, and ``tail_step(t, e)`` takes the last count % L elements
    one at a time. The loop shared by ``reduction_rows_vector`` and the global pools'
    ``global_pool_vector`` (:mod:`.pool`)."""
    U = part.numel // L
    nvec = count // L
    for u in range(U):
        kb.store(part, u * L, init)
    if nvec // U:
        with kb.reduce(nvec // U, hint="g") as g:
            for u in range(U):
                kb.store(part, u * L, step(part.vload(u * L, L), x.vload(base + (g * U + u) * L, L)))
    for r in range((nvec // U) * U, nvec):              # whole vectors left over
        u = r % U
        kb.store(part, u * L, step(part.vload(u * L, L), x.vload(base + r * L, L)))
    for u in range(1, U):
        kb.store(part, 0, combine(part.vload(0, L), part.vload(u * L, L)))
    kb.store(tot, 0, part[0])
    for ln in range(1, L):
        kb.store(tot, 0, combine(tot[0], part[ln]))
    for t in range(nvec * L, count):                     # the tail, one element at a time
        kb.store(tot, 0, tail_step(tot[0], x.flat(base + t)))
