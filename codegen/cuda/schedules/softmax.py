"""cuda schedule of Softmax and LogSoftmax over a contiguous last axis (``ir.ops.softmax``, key
``"softmax"``): a thread block per row, the row max and sum reduced in shared memory."""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import LaunchShape, as_expr, maximum, unop
from tensorfuse.ir.ops.softmax import split_axis
from tensorfuse.ir.strategy import register_schedule

from .blocks import block_reduce, block_strided, block_threads_knob, use_block_rows


def _applies(ctx, log, axis, acc) -> bool:
    _, n, inner = split_axis(ctx.inputs[0].shape, axis)
    return inner == 1 and use_block_rows(n)


@register_schedule("softmax", "cuda", "softmax_block_per_row", plevel=10, applies=_applies)
def softmax_rows(ctx, log: bool, axis: int, acc) -> None:
    """Softmax (``log``: LogSoftmax) over a contiguous last axis of at least
    ``blocks.BLOCK_ROW_MIN`` elements on a GPU: one thread block per row (block-stride over
    rows), each thread reducing a strided part of the row, the row max and sum reduced in
    shared memory (:func:`.blocks.block_reduce`). Same results as the CPU form up to the
    order of the sum. Knob ``block_threads``."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    rows, n, _ = split_axis(x.shape, axis)
    T = block_threads_knob(n, ctx.target)
    kb = ctx.kernel()
    sh = kb.shared(acc, (T,), hint="red")
    part = kb.local(acc, (1,), hint="part")
    m = kb.local(acc, (1,), hint="max")
    s = kb.local(acc, (1,), hint="sum")
    keep_exp = not log and acc == y.dtype

    def threads():
        return kb.loop(T, kind="threadIdx.x", hint="t")

    with kb.loop(rows, kind="blockIdx.x", hint="row") as r:
        base = r * n
        with threads() as t:
            kb.store(part, 0, as_expr(-math.inf, acc))
            block_strided(kb, T, t, n, lambda c: kb.store(part, 0, maximum(part[0], x.flat(base + c).cast(acc))))
            kb.store(sh, t, part[0])
        block_reduce(kb, sh, T, maximum)
        with threads() as t:
            kb.store(m, 0, sh[0])
            kb.store(part, 0, as_expr(0.0, acc))

            def add_exp(c):
                e = unop("exp", x.flat(base + c).cast(acc) - m[0])
                if keep_exp:
                    kb.store(y, base + c, e)
                    e = y.flat(base + c)
                kb.store(part, 0, part[0] + e)
            block_strided(kb, T, t, n, add_exp)
        kb.barrier()                     # every thread has read sh[0] before it is overwritten
        with threads() as t:
            kb.store(sh, t, part[0])
        block_reduce(kb, sh, T, lambda a, b: a + b)
        with threads() as t:
            kb.store(s, 0, m[0] + unop("log", sh[0]) if log else sh[0])

            def write(c):
                if log:
                    v = x.flat(base + c).cast(acc) - s[0]
                elif keep_exp:
                    v = y.flat(base + c) / s[0]
                else:
                    v = unop("exp", x.flat(base + c).cast(acc) - m[0]) / s[0]
                kb.store(y, base + c, v.cast(y.dtype))
            block_strided(kb, T, t, n, write)
        kb.barrier()                     # sh[0] read by all before the next row's partials
    kb.kernel.launch = LaunchShape((max(1, min(rows, ctx.target.max_blocks)),), (T,))
    kb.kernel.comment += f"  [cuda: a block of {T} threads per row, shared-memory reductions]"
