"""The llvm backend's schedule of a Transpose that swaps two groups of axes (schedule key
``"transpose"``, ``ir.ops.shape.Transpose``): NCHW <-> NHWC and every permutation that, with
adjacent axes merged, moves data as a batched 2-D transpose ``x [B, A, C] -> y [B, C, A]``
(ONNX spec: Transpose-21; ``perm = [0 .. k-1] + [j .. r-1] + [k .. j-1]``).

``transpose_blocks`` (plevel 5), elements of 4 bytes (float32, int32, uint32), A and C each
at least ``L`` (the target's float32 lanes: 8 with AVX2, 16 with AVX-512): x is read in
T x T blocks (T = :data:`BLOCK`, 8, or the knob), T rows of T contiguous elements as T
vectors, transposed in registers (log2(T) rounds of T two-vector shuffles,
:func:`transpose_vectors`) and written as T contiguous vectors of y; the A and C elements past
the last whole block are copied one at a time. Parallel over (b, block of A, run of C blocks). The generic nest (``lower_index_map``)
walks y's rows reading x with a stride of C elements: NHWC [1, 56, 56, 96] -> NCHW took
0.197 ms against 0.079 in blocks, onnxruntime 0.079 (Zen 4, 1 thread, a run with its output
allocation); convnext_tiny's 23 Transposes (channels-last LayerNorm) 2.0 ms of its 98, the
model 0.958x -> 0.938x onnxruntime at 1 thread. Knob ``transpose_block`` (L, L/2 or L/4
lanes, at least 4; default :data:`BLOCK`).
"""
from __future__ import annotations

import math

from tensorfuse.ir.kernel import shuffle
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

#: default lanes of the square blocks (at most the target's): 8 x 8 blocks of 256-bit vectors
#: even where 512-bit ones exist (NHWC [1, 56, 56, 96] -> NCHW, Zen 4, 1 thread: 0.079 ms in
#: 8 x 8 blocks, 0.074 in 4 x 4, 0.118 in 16 x 16, whose 16 rows and their shuffles take every
#: register; onnxruntime 0.079; the generic nest 0.197)
BLOCK = 8

#: fewest parallel tasks the (b, A block) tasks are split into along C where they are fewer
MIN_TASKS = 8


def transpose_groups(shape, perm) -> tuple[int, int, int] | None:
    """(B, A, C) where ``perm`` on ``shape`` moves data as x [B, A, C] -> y [B, C, A] (axes of
    size 1 dropped first, adjacent axes kept together merged), else None (the identity, or a
    permutation that is not one swap of two groups)."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    order = [a for a in perm if shape[a] != 1]
    pos = {a: i for i, a in enumerate(keep)}
    p = [pos[a] for a in order]                 # the permutation of the kept axes
    n = len(p)
    k = 0
    while k < n and p[k] == k:
        k += 1
    if k == n:
        return None
    # p[k:] must be [j .. n-1] + [k .. j-1] for some j > k
    j = p[k]
    if p[k:] != list(range(j, n)) + list(range(k, j)):
        return None
    dims = [shape[a] for a in keep]
    return math.prod(dims[:k]), math.prod(dims[k:j]), math.prod(dims[j:])


def transpose_vectors(rows: list) -> list:
    """The L x L block whose row i is ``rows[i]`` (L vectors of L lanes) transposed: vector j
    of the result holds lane j of every row. log2(L) rounds; in the round of step s, rows i and
    i + s (i with bit s clear) become (a with its lanes k of bit s set taken from b's lane k - s,
    b with its lanes k of bit s clear taken from a's lane k + s)."""
    L = len(rows)
    v = list(rows)
    s = 1
    while s < L:
        lo = [k if not k & s else L + k - s for k in range(L)]
        hi = [k + s if not k & s else L + k for k in range(L)]
        for i in range(L):
            if not i & s:
                a, b = v[i], v[i + s]
                v[i], v[i + s] = shuffle(a, b, lo), shuffle(a, b, hi)
        s *= 2
    return v


def _applies(ctx, perm) -> bool:
    x, y = ctx.inputs[0], ctx.outputs[0]
    L = ctx.target.lanes(DType.f32)
    g = transpose_groups(x.shape, perm)
    return (L >= 4 and g is not None and x.dtype.itemsize == 4 and x.dtype == y.dtype
            and g[1] >= L and g[2] >= L and ctx.epilogue is None)


@register_schedule("transpose", "llvm", "transpose_blocks", plevel=5, applies=_applies)
def transpose_blocks(ctx, perm) -> None:
    """x -> y = Transpose(x, perm) as a batched [B, A, C] -> [B, C, A] in register-transposed
    blocks (module docstring); 4-byte elements. Writes ``ctx.kernel()``."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    B, A, C = transpose_groups(x.shape, perm)
    L0 = ctx.target.lanes(DType.f32)
    cands = [w for w in (L0, L0 // 2, L0 // 4) if w >= 4]
    T = knob("transpose_block", cands, max(w for w in cands if w <= BLOCK or w == cands[-1]),
             doc="lanes of the square blocks transposed in registers")
    nab, nA = -(-A // T), A // T                # blocks of A (the last may be partial), whole ones
    ncb = C // T                                # whole blocks of C
    runs = max(1, min(ncb, -(-MIN_TASKS // (B * nab))))
    per = -(-ncb // runs)                       # C blocks per task
    runs = -(-ncb // per)
    kb = ctx.kernel()
    with kb.loop(B * nab * runs, kind="parallel", hint="task") as t:
        b = t / (nab * runs)
        ab = (t / runs) % nab
        run = t % runs
        a0 = ab * T
        xb, yb = b * (A * C), b * (C * A)
        c_lo = run * (per * T)

        def scalar(a_lo, a_n, c_from, c_n):
            """y[b, c, a] = x[b, a, c] for c in [c_from, c_from + c_n), a in [a_lo, a_lo + a_n)."""
            with kb.loop(c_n, hint="c") as ci:
                c = c_from + ci
                with kb.loop(a_n, hint="a") as ai:
                    a = a_lo + ai
                    kb.store(y, yb + c * A + a, x.flat(xb + a * C + c))

        with kb.if_(ab < nA) as whole:
            with kb.loop(per, hint="cb") as cbi:
                c0 = c_lo + cbi * T
                with kb.if_(c0 < ncb * T):
                    rows = [x.vload(xb + (a0 + i) * C + c0, T) for i in range(T)]
                    for j, v in enumerate(transpose_vectors(rows)):
                        kb.store(y, yb + (c0 + j) * A + a0, v)
            if C % T:                           # the C elements after the whole blocks
                with kb.if_(run.eq(runs - 1)):
                    scalar(a0, T, ncb * T, C % T)
        with kb.else_(whole):                   # the last, partial A block: every C of it
            if A % T:
                with kb.if_(run.eq(0)):
                    scalar(a0, A % T, 0, C)
    return kb
