"""The llvm backend's schedule of the global pools (GlobalAveragePool, GlobalMaxPool,
GlobalLpPool): schedule key ``"global_pool"`` (``ir.ops.pool.emit_global_pool``).

``global_pool_vector`` (plevel 5): float32 planes of at least one vector (``L`` lanes of the
target; LpPool: p 1 or 2) are read as L-lane vectors into U partial vector accumulators (sums:
another order of the additions than one running sum; max: NaN-propagating maxNum), combined,
reduced across lanes, then the tail elements one at a time. Parallel over (n, c). Knob
``accumulators`` (U: 1, 2, 4, 8, at most the plane's whole vectors; default
min(:data:`GLOBAL_ACCUMULATORS`, vectors)).
"""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import as_expr, maxnum, unop
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

#: partial vector accumulators per plane by default (independent add chains)
GLOBAL_ACCUMULATORS = 4


def _vector_ok(ctx, x, y, kind, p, acc_dt, params) -> bool:
    L = ctx.target.lanes(DType.f32)
    return x.dtype == DType.f32 and math.prod(x.shape[2:]) >= L and (kind != "lp" or p in (1, 2))


@register_schedule("global_pool", "llvm", "global_pool_vector", plevel=5, applies=_vector_ok)
def global_pool_vector(ctx, x, y, kind: str, p: int, acc_dt, params):
    """Vector partial accumulators per plane (module docstring); one kernel."""
    L = ctx.target.lanes(DType.f32)
    n_, c_ = x.shape[:2]
    plane = math.prod(x.shape[2:])
    nvec = plane // L
    U = knob("accumulators", [u for u in (1, 2, 4, 8) if u <= nvec], max(1, min(GLOBAL_ACCUMULATORS, nvec)),
             doc="partial vector accumulators per plane")
    f32 = DType.f32
    init = as_expr(float("nan") if kind == "max" else 0.0, f32)

    def red(a, b):
        return maxnum(a, b) if kind == "max" else a + b

    def term(v):
        if kind == "lp":
            return v * v if p == 2 else unop("abs", v)
        return v

    kb = ctx.kernel(params=params)
    acc = kb.local(f32, (U * L,), hint="acc")
    tot = kb.local(f32, (1,), hint="tot")
    with kb.loop(n_ * c_, kind="parallel", hint="nc") as nc:
        base = nc * plane
        for u in range(U):
            kb.store(acc, u * L, kb.broadcast(init, L))
        if nvec // U:
            with kb.reduce(nvec // U, hint="g") as g:
                for u in range(U):
                    v = x.vload(base + (g * U + u) * L, L)
                    kb.store(acc, u * L, red(acc.vload(u * L, L), term(v)))
        for r in range((nvec // U) * U, nvec):          # vectors left over: the first accumulators
            u = r % U
            kb.store(acc, u * L, red(acc.vload(u * L, L), term(x.vload(base + r * L, L))))
        for u in range(1, U):
            kb.store(acc, 0, red(acc.vload(0, L), acc.vload(u * L, L)))
        kb.store(tot, 0, acc[0])
        for ln in range(1, L):
            kb.store(tot, 0, red(tot[0], acc[ln]))
        for t in range(nvec * L, plane):
            kb.store(tot, 0, red(tot[0], term(x.flat(base + t))))
        v = tot[0]
        if kind == "avg":
            v = v / as_expr(float(plane), f32)
        elif kind == "lp" and p == 2:
            v = unop("sqrt", v)
        out_idx = [nc / c_ if c_ > 1 else nc, nc % c_ if c_ > 1 else as_expr(0)] + [as_expr(0)] * (len(x.shape) - 2)
        kb.store(y, out_idx, ctx.apply_epilogue(v.cast(y.dtype), out_idx))
    return kb
