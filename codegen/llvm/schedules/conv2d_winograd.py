"""Winograd F(2x2, 3x3) for float32 3x3 convolutions of stride 1 (docs/architecture.md "CPU
codegen"). Graph layout stays NCHW.

Source: A. Lavin and S. Gray, "Fast Algorithms for Convolutional Neural Networks" (CVPR 2016),
section 4: each 2x2 output tile is ``Y = A^T [ sum_c (G g_c G^T) . (B^T d_c B) ] A`` over the
4x4 input patch ``d_c`` of each input channel ``c``, with

    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    G   = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
    A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]

so the 9 multiply-adds per output pixel and input channel of the direct convolution become 4
(16 per tile of 4 pixels): 2.25x fewer. The transforms of B and A only add and subtract, so
the rounding error stays that of a sum of a few more terms (the tests bound it against
onnxruntime); G's halves are applied at compile time in float64.

The kernel (:func:`emit_conv_winograd`), parallel over (n, row of tiles):

1. **Input transform.** Each input channel's 4 input rows of the tile row are copied into a
   zero-padded local (the border and the rows outside the image stay zero), then transformed
   with contiguous vectors over columns: with ``R_k`` the row read ``k`` columns on, the lanes of
   ``R_0 - R_2``, ``R_1 + R_2`` and ``R_2 - R_1`` at even column ``2 tx`` are the row transform's
   entries 0, 1 and 2 of tile ``tx`` (entry 3, ``R_1 - R_3`` at ``2 tx``, is ``R_0 - R_2``'s lane
   at ``2 tx + 1``). The column transform is then lane-wise over the 4 rows, and the vectors are
   stored as they are: V [4, 3, C, columns]; the GEMM reads each tile's entry from its lane.
2. **GEMM.** For each of the 16 transform positions, ``M[e] = U[e] V[e]`` with U the
   transformed weights (packed at compile time as U [16, MB, C, OB*L]), on the register tile of
   the direct schedule (OB channel vectors x P tiles,
   :func:`~codegen.llvm.schedules.conv2d.choose_tile`): per input channel OB weight vectors,
   P broadcasts of V, OB*P FMAs.
3. **Output transform**, on channel vectors (lanes = output channels), then the bias and the
   fused epilogue (:func:`~codegen.llvm.schedules.conv2d.store_channel_vector`) and the single
   store of each output pixel; pixels past an odd OH or OW are not stored.

Registered as ``conv2d_winograd`` (key ``"conv2d"``, llvm): the default where
:func:`winograd_ok` holds; it applies beyond that, below the row tiles, where
:func:`winograd_fits`. Knobs: the register tile (``tile_oc_vectors``, ``tile_cols``) and
``min_parallel_tasks`` (:data:`WINOGRAD_MIN_TASKS`).
"""
from __future__ import annotations

import contextlib

import numpy as np

from tensorfuse.ir.kernel import Buffer, KernelBuilder, as_expr, fma, select
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.types import DType

from .conv2d import (ConvGroups, choose_tile, pow2_candidates, register_thresholded, split_blocks,
                     store_channel_vector, tile_knobs, zero_fill)

#: the Winograd schedule needs at least this many input channels (the transforms' cost is per
#: input channel and tile, the GEMM's per input and output channel)
WINOGRAD_MIN_CHANNELS = 16

#: the parallel loop has at least this many tasks per kernel where the output channel blocks
#: allow (rows of tiles x groups of blocks)
WINOGRAD_MIN_TASKS = 12

#: G of F(2x2, 3x3) (the weight transform)
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def winograd_ok(ctx: LowerCtx, c_: int, m_: int, geo) -> bool:
    """Whether :func:`emit_conv_winograd` applies (the caller has checked the register-blocked
    schedule's conditions: f32, 2-D, constant weights; ``c_`` and ``m_`` are the channels of a
    group): a 3x3 kernel of stride 1 and dilation 1, at least :data:`WINOGRAD_MIN_CHANNELS`
    input channels and one vector of output channels, and an output plane of at least 4x4 whose
    rows give at least one vector of tiles."""
    if geo.rank != 2 or tuple(geo.kernel) != (3, 3):
        return False
    if tuple(geo.strides) != (1, 1) or tuple(geo.dilations) != (1, 1):
        return False
    L = ctx.target.lanes(DType.f32)
    OH, OW = geo.out_shape
    return c_ >= WINOGRAD_MIN_CHANNELS and m_ >= L and OH >= 4 and -(-OW // 2) >= L // 2


def transform_weights(w: np.ndarray, blk: int) -> np.ndarray:
    """W [M, C, 3, 3] -> U [16, MB, C, blk] (float32): ``U[4 xi + nu, mb, c, j] = (G g G^T)[xi, nu]``
    of output channel ``mb * blk + j`` (zeros beyond M), computed in float64."""
    m, c = w.shape[:2]
    mb = -(-m // blk)
    wp = np.zeros((mb * blk, c, 3, 3), np.float64)
    wp[:m] = w
    u = np.einsum("xi,mcij,yj->xymc", G, wp, G)             # [4, 4, M', C]
    return np.ascontiguousarray(u.reshape(16, mb, blk, c).transpose(0, 1, 3, 2)).astype(np.float32)


def emit_conv_winograd(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, geo,
                       params: list[Buffer] | None = None, grp: ConvGroups | None = None) -> KernelBuilder:
    """Emit y = conv(x, w) + b with the fused epilogue by Winograd F(2x2, 3x3) (module
    docstring). X [N, C, H, W], W [M, C/group, 3, 3] (a compile-time constant), Y [N, M, OH, OW],
    all f32, stride 1, dilation 1, any pads; ``grp``: the groups of a grouped convolution
    (:class:`~codegen.llvm.schedules.conv2d.ConvGroups`). Returns the KernelBuilder."""
    grp = grp or ConvGroups(x, y)
    n_, c_, m_ = grp.n, grp.c, grp.m
    H, W, OH, OW, _, _, _, _, _, _, ph, pw = geo.dims_2d()
    L = ctx.target.lanes(DType.f32)
    half = L // 2                       # tiles per vector of columns
    TY, TX = -(-OH // 2), -(-OW // 2)
    NV = -(-TX // half)                 # column vectors per row of tiles
    VC = NV * L                         # columns of V per (row, kind, channel)
    WR = VC + 2                         # columns of the padded row the transform reads
    _, OB, P = tile_knobs(ctx.target, m_, TX, choose_tile(ctx.target, m_, TX), "2x2 output tiles of a row")
    blk = OB * L
    MB = -(-m_ // blk)
    u = grp.pack(ctx, lambda wg: transform_weights(wg, blk), "wino")
    params = [p for p in (params or ctx.default_params()) if p is not w] + [u]
    # groups of channel blocks per row of tiles, so that small planes still give every thread
    # work (the input transform is repeated per group; the groups outermost, so each thread
    # streams only its groups' weights)
    min_tasks = knob("min_parallel_tasks", pow2_candidates(1, 64, WINOGRAD_MIN_TASKS, 24, 48), WINOGRAD_MIN_TASKS,
                     doc="parallel tasks (rows of tiles x groups of output channel blocks) aimed at")
    per, MG = split_blocks(MB, -(-min_tasks // (n_ * TY)))
    MPG = per * blk                     # output channels of a group
    kb = ctx.kernel(params=params)
    kb.kernel.comment += (f"  [winograd F(2x2,3x3): {TY}x{TX} tiles, register tile {OB}x{L} channels x {P} tiles, "
                          f"weights transformed {list(u.shape)}"
                          + (f", {MG} groups of output channel blocks per row" if MG > 1 else "") + "]")
    acc = kb.local(DType.f32, (OB * P * L,), hint="acc")
    out = kb.local(DType.f32, (L,), hint="lanes")
    xr = kb.local(DType.f32, (4 * WR,), hint="rows")          # one channel's 4 padded rows
    v = kb.local(DType.f32, (4 * 3 * c_ * VC,), hint="v")      # V [4, 3, C, VC]
    zero = kb.broadcast(as_expr(0.0, DType.f32), L)
    wvec = W // L * L                   # columns of an input row copied by vectors
    mo = kb.local(DType.f32, (16 * TX * MPG,), hint="m")       # M [16, TX, MPG]
    with kb.loop(n_ * TY * MG, kind="parallel", hint="t") as t:
        ty = t % TY
        n = (t / TY) % n_ if MG > 1 else t / TY
        mg = t / (n_ * TY) if MG > 1 else as_expr(0)
        ih0 = ty * 2 - ph
        # 1. input transform
        zero_fill(kb, xr, 4 * WR, L)
        with kb.loop(c_, hint="c", role="spatial") as c:
            for r in range(4):
                ih = ih0 + r
                dst = r * WR + pw
                with kb.if_((ih >= 0) & (ih < H)):
                    src = ((n * c_ + c) * H + ih) * W
                    if wvec:
                        with kb.loop(wvec // L, hint="cv", role="spatial") as cv:
                            kb.store(xr, dst + cv * L, x.vload(src + cv * L, L))
                    for iw in range(wvec, W):
                        kb.store(xr, dst + iw, x.flat(src + iw))
            with kb.loop(NV, hint="g", role="spatial") as g:
                c0 = g * L
                kinds = []              # [kind][row]: R0 - R2, R1 + R2, R2 - R1
                for r in range(4):
                    r0 = xr.vload(r * WR + c0, L)
                    r1 = xr.vload(r * WR + c0 + 1, L)
                    r2 = xr.vload(r * WR + c0 + 2, L)
                    kinds.append((r0 - r2, r1 + r2, r2 - r1))
                for k in range(3):
                    d = [kinds[r][k] for r in range(4)]
                    cols = (d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3])
                    for xi in range(4):
                        kb.store(v, ((xi * 3 + k) * c_ + c) * VC + c0, cols[xi])
        # 2. the 16 GEMMs
        with kb.loop(16, hint="e", role="spatial") as e:
            xi = e / 4
            nu = e % 4
            last = nu.eq(3)
            kind = select(last, as_expr(0), nu)
            vbase = (xi * 3 + kind) * (c_ * VC) + select(last, as_expr(1), as_expr(0))
            with kb.loop(per, hint="mb", role="spatial") as j:
                mb = mg * per + j

                def tile(q0, width: int):
                    for i in range(OB * width):
                        kb.store(acc, i * L, zero)
                    with kb.reduce(c_, hint="ic") as ic:
                        wrow = ((e * MB + mb) * c_ + ic) * blk
                        wv = [u.vload(grp.woff(u, n, wrow + o * L), L) for o in range(OB)]
                        for p in range(width):
                            xv = v.flat(vbase + ic * VC + (q0 + p) * 2)
                            for o in range(OB):
                                a = (o * width + p) * L
                                kb.store(acc, a, fma(wv[o], xv, acc.vload(a, L)))
                    for o in range(OB):
                        for p in range(width):
                            kb.store(mo, (e * TX + q0 + p) * MPG + j * blk + o * L,
                                     acc.vload((o * width + p) * L, L))

                with kb.if_(mb < MB) if MB % per else contextlib.nullcontext():
                    if TX // P:
                        with kb.loop(TX // P, hint="tp", role="spatial") as tp:
                            tile(tp * P, P)
                    if TX % P:
                        tile(as_expr(TX // P * P), TX % P)
        # 3. output transform, bias, epilogue, store
        with kb.loop(TX, hint="q", role="spatial") as q, kb.loop(per * OB, hint="o", role="spatial") as oj:
            ov = mg * (per * OB) + oj
            # the last group's blocks past MB are skipped
            with kb.if_(ov < MB * OB) if MB % per else contextlib.nullcontext():
                mm = [[mo.vload(((xi * 4 + nu) * TX + q) * MPG + oj * L, L) for nu in range(4)] for xi in range(4)]
                s0 = [mm[0][j] + mm[1][j] + mm[2][j] for j in range(4)]
                s1 = [mm[1][j] - mm[2][j] - mm[3][j] for j in range(4)]
                outs = {(0, 0): s0[0] + s0[1] + s0[2], (0, 1): s0[1] - s0[2] - s0[3],
                        (1, 0): s1[0] + s1[1] + s1[2], (1, 1): s1[1] - s1[2] - s1[3]}
                for (i, j), vec in outs.items():
                    oh = ty * 2 + i
                    ow = q * 2 + j
                    conds = []              # the half tiles past an odd OH or OW
                    if i and OH % 2:
                        conds.append(oh < OH)
                    if j and OW % 2:
                        conds.append(ow < OW)
                    cond = conds[0] & conds[1] if len(conds) == 2 else conds[0] if conds else None
                    with kb.if_(cond) if cond is not None else contextlib.nullcontext():
                        store_channel_vector(ctx, kb, y, b, out, vec, n, ov * L, [oh, ow], m_, blk, grp)
    return kb


#: Winograd also applies (below the row tiles, for the "schedule" knob) to 3x3 convolutions of
#: stride 1 outside :func:`winograd_ok`'s measured range whose locals (V and M) take at most
#: this many bytes
WINOGRAD_LOCAL_MAX_BYTES = 1 << 20


def winograd_fits(ctx: LowerCtx, c_: int, m_: int, geo) -> bool:
    """Whether :func:`emit_conv_winograd` can run a convolution beyond :func:`winograd_ok`: a 3x3
    kernel of stride 1 and dilation 1 whose locals V [4, 3, C, columns] and M [16, tiles,
    channels] (all output channels in one group, 4 vectors of padding) fit
    :data:`WINOGRAD_LOCAL_MAX_BYTES`."""
    if geo.rank != 2 or tuple(geo.kernel) != (3, 3):
        return False
    if tuple(geo.strides) != (1, 1) or tuple(geo.dilations) != (1, 1):
        return False
    L = ctx.target.lanes(DType.f32)
    TX = -(-geo.out_shape[1] // 2)
    VC = -(-TX // (L // 2)) * L
    return (12 * c_ * VC + 16 * TX * (m_ + 4 * L)) * 4 <= WINOGRAD_LOCAL_MAX_BYTES


register_thresholded("winograd", emit_conv_winograd, winograd_ok, winograd_fits)
