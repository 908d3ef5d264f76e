"""cuda schedules of the row normalisations: a thread block per row, the sum and the sum of
squared deviations each reduced in shared memory. Keys: ``"row_norm"``
(``ir.ops.norm.emit_row_norm``: LayerNormalization, InstanceNormalization,
GroupNormalization) and ``"layernorm_rows"`` (``ir.ops.fused._emit_layernorm_rows``: the fused
SkipLayerNormalization and EmbedLayerNormalization)."""
from __future__ import annotations

from tensorfuse.ir.kernel import LaunchShape, as_expr, unop
from tensorfuse.ir.strategy import register_schedule

from .blocks import block_row_reduce, block_strided, block_threads_knob, unravel, use_block_rows


def _row_norm_ok(ctx, kb, x, y, rows, n, eps, ct, post, mean_out, inv_out, m, v) -> bool:
    return use_block_rows(n)


def _add(a, b):
    return a + b


def _row_scratch(ctx, kb, n: int, ct):
    """(T, shared partials [T], the thread's partial [1], 0 of ``ct``) for a block-per-row
    reduction over rows of ``n`` elements (knob ``block_threads`` sets T)."""
    T = block_threads_knob(n, ctx.target)
    return T, kb.shared(ct, (T,), hint="red"), kb.local(ct, (1,), hint="part"), as_expr(0.0, ct)


@register_schedule("row_norm", "cuda", "row_norm_block_per_row", plevel=10, applies=_row_norm_ok)
def row_norm(ctx, kb, x, y, rows, n, eps, ct, post, mean_out, inv_out, m, v) -> None:
    """``emit_row_norm`` on cuda for rows of at least ``blocks.BLOCK_ROW_MIN`` elements, into
    ``kb`` (whose kernel holds nothing else; ``m`` and ``v`` its mean and inverse-deviation
    locals): a block per row, the sum and the sum of squared deviations each a
    :func:`.blocks.block_row_reduce`, then every thread writes its elements; thread 0 stores
    the optional per-row statistics. Knob ``block_threads``."""
    T, sh, part, zero = _row_scratch(ctx, kb, n, ct)

    with kb.loop(rows, kind="blockIdx.x", hint="o") as o:
        base = o * n
        block_row_reduce(kb, sh, part, T, n, zero, lambda a, c: a + x.flat(base + c).cast(ct), _add, m,
                         final=lambda s: s / as_expr(float(n), ct))

        def sq(a, c):
            d = x.flat(base + c).cast(ct) - m[0]
            return a + d * d
        block_row_reduce(kb, sh, part, T, n, zero, sq, _add, v,
                         final=lambda s: as_expr(1.0, ct) / unop("sqrt", s / as_expr(float(n), ct) + as_expr(eps, ct)))
        with kb.loop(T, kind="threadIdx.x", hint="t") as t:
            block_strided(kb, T, t, n, lambda c: kb.store(y, base + c, post(o, c, (x.flat(base + c).cast(ct) - m[0]) * v[0])))
            if mean_out is not None or inv_out is not None:
                with kb.if_(t.eq(0)):
                    if mean_out is not None:
                        kb.store(mean_out, o, m[0].cast(mean_out.dtype))
                    if inv_out is not None:
                        kb.store(inv_out, o, v[0].cast(inv_out.dtype))
    kb.kernel.launch = LaunchShape((max(1, min(rows, ctx.target.max_blocks)),), (T,))
    kb.kernel.comment += f"  [cuda: a block of {T} threads per row, shared-memory reductions]"


def _layernorm_rows_ok(ctx, kb, outer, inner, n, eps, addend, y, scale, bias, tmp, ct, acc, var) -> bool:
    return use_block_rows(n)


@register_schedule("layernorm_rows", "cuda", "layernorm_block_per_row", plevel=10, applies=_layernorm_rows_ok)
def layernorm_rows(ctx, kb, outer, inner, n, eps, addend, y, scale, bias, tmp, ct, acc, var) -> None:
    """The fused LayerNorms on cuda (rows of ``n`` >= ``blocks.BLOCK_ROW_MIN`` elements): a
    block per row; the first :func:`.blocks.block_row_reduce` also stores the row's addend
    into ``tmp``, the second sums the squared deviations, then every thread writes its
    elements. Knob ``block_threads``."""
    rows = 1
    for d in outer:
        rows *= d
    T, sh, part, zero = _row_scratch(ctx, kb, n, ct)

    with kb.loop(rows, kind="blockIdx.x", hint="o") as o:
        oidx = unravel(o, list(outer))

        def at(c):
            return oidx + unravel(c, list(inner))

        def first(a, c):
            idx = at(c)
            kb.store(tmp, idx, as_expr(addend(idx), y.dtype))
            return a + tmp[idx].cast(ct)
        block_row_reduce(kb, sh, part, T, n, zero, first, _add, acc, final=lambda s: s / float(n))

        def second(a, c):
            d = tmp[at(c)].cast(ct) - acc[0]
            return a + d * d
        block_row_reduce(kb, sh, part, T, n, zero, second, _add, var,
                         final=lambda s: 1.0 / unop("sqrt", s / float(n) + eps))
        with kb.loop(T, kind="threadIdx.x", hint="t") as t:
            def third(c):
                idx = at(c)
                yv = ((tmp[idx].cast(ct) - acc[0]) * var[0]).cast(y.dtype) * scale.bcast(idx)
                if bias is not None:
                    yv = yv + bias.bcast(idx)
                kb.store(y, idx, yv)
            block_strided(kb, T, t, n, third)
    kb.kernel.launch = LaunchShape((max(1, min(rows, ctx.target.max_blocks)),), (T,))
    kb.kernel.comment += f"  [cuda: a block of {T} threads per row, shared-memory reductions]"
