"""The llvm backend's schedule of the row normalisations (LayerNormalization,
InstanceNormalization, GroupNormalization): schedule key ``"row_norm"``
(``ir.ops.norm.emit_row_norm``).

``row_norm_partial_sums`` (plevel 5): float32 rows of at least two vectors (``L`` lanes of the
target) sum their mean and their variance in ``V * L`` partial sums over whole vectors of
``V * L`` elements (V independent vector add chains), then the partial sums are added in lane
order and the scalar tail (n mod V*L elements) in order: another order of the additions than
one running sum, within float32 rounding of it. Knob ``sum_vectors`` (V: 1, 2, 4; default 1).

``layernorm_rows_partial_sums`` (plevel 5, key ``"layernorm_rows"``: the fused
SkipLayerNormalization and EmbedLayerNormalization, ``ir.ops.fused._emit_layernorm_rows``):
the same nest over each row's addend, stored first (default ``sum_vectors`` 2).
"""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import Buffer, KernelBuilder, as_expr
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.ops.norm import row_norm_nest
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType


def row_sum_lanes(x: Buffer, n: int, ct: DType, target) -> int:
    """Lanes of one partial-sum vector of the row statistics: the target's f32 vector width
    for f32 rows (computed in f32) of at least two vectors, else 1 (the generic nest's one
    running sum)."""
    if target is None or target.simt or ct != DType.f32 or x.dtype != DType.f32:
        return 1
    L = target.lanes(DType.f32)
    return L if L > 1 and n >= 2 * L else 1


def vector_row_sum(kb: KernelBuilder, acc: Buffer, part: Buffer, n: int, term) -> None:
    """acc[0] = the sum over j < n of ``term(j, lanes)``: ``part`` (W lanes) holds W partial
    sums of whole W-element vectors, then the lanes and the scalar tail are added in order."""
    ct = acc.dtype
    W = part.shape[0]
    nv = n // W
    kb.store(part, 0, kb.broadcast(as_expr(0.0, ct), W))
    with kb.loop(nv, hint="jv") as jv:
        kb.store(part, 0, part.vload(0, W) + term(jv * W, W))
    total = part[0]
    for ln in range(1, W):
        total = total + part[ln]
    kb.store(acc, 0, total)
    if n % W:
        with kb.loop(n, start=nv * W, hint="j") as j:
            kb.store(acc, 0, acc[0] + term(j, 1))


def _partial_sums_ok(ctx, kb, x, y, rows, n, eps, ct, post, mean_out, inv_out, m, v) -> bool:
    return row_sum_lanes(x, n, ct, ctx.target) > 1


@register_schedule("row_norm", "llvm", "row_norm_partial_sums", plevel=5, applies=_partial_sums_ok)
def row_norm_partial_sums(ctx, kb, x, y, rows, n, eps, ct, post, mean_out, inv_out, m, v) -> None:
    """Row statistics in vector partial sums (module docstring), into ``kb``."""
    L = row_sum_lanes(x, n, ct, ctx.target)
    V = knob("sum_vectors", [c for c in (1, 2, 4) if c * L <= n], 1,
             doc="vectors of partial sums of each row statistic")
    part = kb.local(ct, (V * L,), hint="part")
    row_norm_nest(kb, x, y, rows, n, eps, ct, post, mean_out, inv_out, m, v,
                  row_sum=lambda acc, term: vector_row_sum(kb, acc, part, n, term))


def _layernorm_rows_ok(ctx, kb, outer, inner, n, eps, addend, y, scale, bias, tmp, ct, acc, var) -> bool:
    return row_sum_lanes(tmp, n, ct, ctx.target) > 1


@register_schedule("layernorm_rows", "llvm", "layernorm_rows_partial_sums", plevel=5, applies=_layernorm_rows_ok)
def layernorm_rows_partial_sums(ctx, kb, outer, inner, n, eps, addend, y, scale, bias, tmp, ct, acc, var) -> None:
    """The fused LayerNorms (SkipLayerNormalization, EmbedLayerNormalization:
    ``ir.ops.fused._emit_layernorm_rows``) on llvm for f32 rows of at least two vectors, into
    ``kb``: per row (rows independent, parallel), the addend stored into ``tmp`` in one
    vectorised pass, then :func:`~ir.ops.norm.row_norm_nest` over ``tmp``'s contiguous row: the
    mean and the variance in ``V * L`` partial sums (:func:`vector_row_sum`, knob
    ``sum_vectors``), the normalised row times scale plus B. The generic nest sums in one
    running scalar chain (ViT-B/16's [197, 768] SkipLayerNorm: 0.26 ms, latency-bound)."""
    from tensorfuse.ir.ops.linalg import unravel
    L = row_sum_lanes(tmp, n, ct, ctx.target)
    V = knob("sum_vectors", [c for c in (1, 2, 4) if c * L <= n], 2 if 2 * L <= n else 1,
             doc="vectors of partial sums of each row statistic")
    part = kb.local(ct, (V * L,), hint="part")
    outer, inner = list(outer), list(inner)

    def addend_row(o, base):
        oidx = unravel(o, outer) if outer else []
        with kb.loop(n, kind="vectorize", hint="j") as j:
            kb.store(tmp, base + j, as_expr(addend(oidx + unravel(j, inner)), y.dtype))

    def post(o, j, normed):
        idx = (unravel(o, outer) if outer else []) + unravel(j, inner)
        yv = normed.cast(y.dtype) * scale.bcast(idx)
        return yv + bias.bcast(idx) if bias is not None else yv

    row_norm_nest(kb, tmp, y, math.prod(outer), n, eps, ct, post, None, None, acc, var,
                  row_sum=lambda a, term: vector_row_sum(kb, a, part, n, term), row_prologue=addend_row)
