"""cuda schedule of the Reduce* ops (``ir.ops.reduce``, key ``"reduction"``): a thread block
per output element, the partials of each accumulation pass combined in shared memory."""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import Buffer, Const, Expr, LaunchShape
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from .blocks import block_row_reduce, block_threads_knob, unravel, use_block_rows

#: outputs below this many always take a cuda block each when their reduction is long, even
#: with strided (non-contiguous) reduced elements: one thread per output could not fill the GPU
BLOCK_OUTPUTS_MAX = 4096


def use_block_reduction(x: Buffer, y: Buffer, axes, acc: DType) -> bool:
    """Whether a Reduce* takes the block-per-output schedule (:func:`reduction_blocks`): a
    reduced extent of at least ``blocks.BLOCK_ROW_MIN`` (64) elements per output, a non-bool
    accumulator, and either contiguous reduced elements (no kept dim after the last reduced
    axis) or fewer than :data:`BLOCK_OUTPUTS_MAX` outputs. Otherwise the generic schedule runs
    one thread per output, whose reads coalesce across threads when the kept dims are
    innermost. Empty reductions and noop_with_empty_axes (extent 0 or 1) never qualify."""
    if not axes or acc == DType.bool or y.numel == 0:
        return False
    count = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    inner = int(np.prod(x.shape[max(axes) + 1:], dtype=np.int64))
    return use_block_rows(count) and (inner == 1 or y.numel < BLOCK_OUTPUTS_MAX)


def _applies(ctx, kb, x, y, axes, acc, passes, finish) -> bool:
    return all(ps.combine for ps in passes) and use_block_reduction(x, y, axes, acc)


@register_schedule("reduction", "cuda", "reduction_block_per_output", plevel=10, applies=_applies)
def reduction_blocks(ctx, kb, x: Buffer, y: Buffer, axes, acc: DType, passes, finish) -> None:
    """``ir.ops.reduce.emit_reduction`` as a cuda hand schedule, into the empty kernel ``kb``: a
    thread block per output element (block-stride over the outputs, keepdims or not: the same
    flat layout), its threads reducing strided parts of the output's reduced elements (flat
    reduced index ``r``; a run of consecutive axes is read at ``r * inner``), each pass's
    partials combined in shared memory (``Pass.combine``; :func:`.blocks.block_row_reduce`)
    before the next pass starts, thread 0 storing ``finish``. The same accumulation dtype and
    per-element steps as the CPU kernel, so maxNum's NaN skipping and LogSumExp's shift hold;
    sums are added in another order. Knob ``block_threads``."""
    shape = x.shape
    last = max(axes)
    outer_dims = [d for d in range(last + 1) if d not in axes]
    inner = int(np.prod(shape[last + 1:], dtype=np.int64))
    rdims = [shape[d] for d in axes]
    count = int(np.prod(rdims, dtype=np.int64))
    xs = Buffer("_", x.dtype, shape).strides
    kept = [shape[d] for d in outer_dims]
    consecutive = list(axes) == list(range(axes[0], last + 1))
    T = block_threads_knob(count, ctx.target)
    sh = kb.shared(acc, (T,), hint="red")
    part = kb.local(acc, (1,), hint="part")
    accs = [kb.local(acc, (1,), hint=f"acc{p}_") for p in range(len(passes))]
    n_out = y.numel
    with kb.loop(n_out, kind="blockIdx.x", hint="o") as o:
        oo = o / inner if inner > 1 else o
        xbase: Expr = o % inner if inner > 1 else Const(0, DType.i64)
        for d, i in zip(outer_dims, unravel(oo, kept) if kept else []):
            xbase = xbase + i * xs[d]

        def offset(r):
            if consecutive:
                return xbase + (r * inner if inner > 1 else r)
            off = xbase
            for d, i in zip(axes, unravel(r, rdims)):
                off = off + i * xs[d]
            return off
        for p, ps in enumerate(passes):
            prev = [a[0] for a in accs[:p]]
            block_row_reduce(kb, sh, part, T, count, ps.init(acc),
                             lambda a, r, ps=ps, prev=prev: ps.step(prev, a, x.flat(offset(r)).cast(acc)),
                             ps.combine, accs[p])
        with kb.loop(T, kind="threadIdx.x", hint="t") as t:
            with kb.if_(t.eq(0)):
                kb.store(y, o, finish([a[0] for a in accs], count))
    kb.kernel.launch = LaunchShape((max(1, min(n_out, ctx.target.max_blocks)),), (T,))
    kb.kernel.comment += f"  [cuda: a block of {T} threads per output, shared-memory reductions]"
