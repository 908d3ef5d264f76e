"""The llvm backend's schedule of Softmax and LogSoftmax over a contiguous last axis (schedule
key ``"softmax"``, ``ir.ops.softmax``).

``softmax_rows_vector`` (plevel 5): float32 rows of at least two vectors (``L`` lanes of the
target: 8 with AVX2, 16 with AVX-512) run each pass over the row in explicit vectors: the row
maximum in ``V`` vector partial maxima (then the lanes, then the scalar tail), ``exp(x - max)``
in vectors (``codegen/llvm/vmath.py``'s exp, stored to y) summed in ``V`` vector partial sums
(the whole vectors after the last block of ``V`` join the partials, and the last ``n % L``
elements run as the row's last whole vector, overlapping the one before: read before any
store, its overlap lanes add 0 to the sum (times a constant 0/1 lane vector) and are stored
with the values already there, so nothing runs one element at a time; rows of 208 and 197
had run 16 and 5 scalar exps: [2364, 208] 0.40 -> 0.16 ms, onnxruntime 0.16, 1 thread),
then ``y * (1 / sum)`` (Softmax) or ``x - max - log(sum)`` (LogSoftmax) in vectors. The generic nest
(``ir/ops/softmax.py``) walks a last-axis row one element at a time, where exp is a scalar
call: [1,4,128,128] took 0.27 ms against onnxruntime's 0.02 ms (1 thread, znver5). The max
is exact whatever the order (``row_max``: a NaN of the row still makes every output NaN, through
exp and the sum, as the generic nest); the sum adds in another
order, within float32 rounding of the running sum. Knob ``partial_vectors`` (V: 1, 2, 4;
default 2 where the row holds two V*L blocks, else 1).
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import as_expr, broadcast, row_max, unop
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.ops._common import lanes_tree
from tensorfuse.ir.ops.softmax import split_axis
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType


def _lanes(ctx) -> int:
    t = ctx.target
    return 1 if t is None or t.simt else t.lanes(DType.f32)


def _applies(ctx, log, axis, acc) -> bool:
    x, y = ctx.inputs[0], ctx.outputs[0]
    _, n, inner = split_axis(x.shape, axis)
    L = _lanes(ctx)
    return (inner == 1 and x.dtype == y.dtype == acc == DType.f32 and L > 1 and n >= 2 * L
            and ctx.epilogue is None)


@register_schedule("softmax", "llvm", "softmax_rows_vector", plevel=5, applies=_applies)
def softmax_rows_vector(ctx, log: bool, axis: int, acc) -> None:
    """Softmax (``log``: LogSoftmax) of f32 x [rows, n] along its contiguous last axis, in
    vectors (module docstring). Same shapes and dtypes as the op; writes ``ctx.kernel()``."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    rows, n, _ = split_axis(x.shape, axis)
    L = _lanes(ctx)
    cands = [v for v in (1, 2, 4) if v * L <= n]
    V = knob("partial_vectors", cands, 2 if 4 * L <= n else 1,
             doc="independent vector partial maxima / sums per row")
    W = V * L
    nb = n // W                      # whole blocks of V vectors
    nv = n // L                      # whole vectors
    t = n % L                        # elements after the whole vectors
    kb = ctx.kernel()
    part = kb.local(acc, (W,), hint="part")
    st = kb.local(acc, (2,), hint="stat")    # row max, row sum (LogSoftmax: max + log(sum))
    tl = kb.local(acc, (L,), hint="tail") if t else None
    keep = None
    if t:   # the last t lanes of the row's last L elements are new; 0/1 per lane
        keep = ctx.pack(np.array([0.0] * (L - t) + [1.0] * t, np.float32), "taillanes")
        kb.kernel.params.append(keep)

    with kb.loop(rows, hint="row", role="spatial") as r:
        base = r * n
        last = base + n - L          # the row's last vector (overlapping the whole vectors)
        # the row maximum (max is idempotent: the overlap counts twice, harmlessly)
        kb.store(part, 0, broadcast(as_expr(-math.inf, acc), W))
        with kb.loop(nb, hint="jb") as jb:
            for u in range(V):
                kb.store(part, u * L, row_max(part.vload(u * L, L), x.vload(base + jb * W + u * L, L)))
        for u in range(nv - nb * V):       # whole vectors after the blocks
            kb.store(part, u * L, row_max(part.vload(u * L, L), x.vload(base + nb * W + u * L, L)))
        if t:
            kb.store(part, 0, row_max(part.vload(0, L), x.vload(last, L)))
            kb.store(tl, 0, x.vload(last, L))    # read before y (which may alias x) is written
        kb.store(st, 0, lanes_tree(kb, part, 0, W, row_max))
        m = st[0]
        # exp(x - max), stored, and its sum
        kb.store(part, 0, broadcast(as_expr(0.0, acc), W))

        def exp_vector(off, u):
            e = unop("exp", x.vload(off, L) - broadcast(m, L))
            if not log:
                kb.store(y, off, e)
                e = y.vload(off, L)          # y may alias x (in place)
            kb.store(part, u * L, part.vload(u * L, L) + e)
        with kb.loop(nb, hint="jb") as jb:
            for u in range(V):
                exp_vector(base + jb * W + u * L, u)
        for u in range(nv - nb * V):       # whole vectors after the blocks
            exp_vector(base + nb * W + u * L, u)
        if t:
            # the last vector from the saved x: its overlap lanes store the values already
            # there (the same exp of the same x) and add nothing to the sum (times 0)
            e = unop("exp", tl.vload(0, L) - broadcast(m, L))
            if not log:
                kb.store(y, last, e)
                e = y.vload(last, L)
            kb.store(part, 0, part.vload(0, L) + e * keep.vload(0, L))
        kb.store(st, 1, lanes_tree(kb, part, 0, W, lambda a, b: a + b))
        if log:
            kb.store(st, 1, st[0] + unop("log", st[1]))
        else:       # one division a row, then products (a vector division costs ~10 products)
            kb.store(st, 1, 1.0 / st[1])
        # normalise; the last vector is read before the whole vectors are written and stored
        # after them, so its overlap lanes are normalised once
        if t:
            kb.store(tl, 0, x.vload(last, L) if log else y.vload(last, L))
        with kb.loop(nv, hint="jv") as jv:
            off = base + jv * L
            if log:
                kb.store(y, off, x.vload(off, L) - broadcast(st[1], L))
            else:
                kb.store(y, off, y.vload(off, L) * broadcast(st[1], L))
        if t:
            if log:
                kb.store(y, last, tl.vload(0, L) - broadcast(st[1], L))
            else:
                kb.store(y, last, tl.vload(0, L) * broadcast(st[1], L))
