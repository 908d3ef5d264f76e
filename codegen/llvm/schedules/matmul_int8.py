"""The llvm backend's int8 GEMM schedule: schedule key ``"matmul"``, name ``matmul_int8``, for
the integer products of ``ir.ops.linalg.emit_integer_matmul`` (MatMulInteger, QLinearMatMul,
MatMulIntegerToFloat: ``MatMulSpec.integer``).

Where it applies: A u8 or i8 [..., M, K] with a scalar zero point (any value, read at run time)
or one per row ([M], A 2-D); B u8 or i8 [K, N], a compile-time constant, with a constant zero
point (scalar or [N]), or B [..., K, N] computed at run time (attention's Q K^T and P V) with
A's batch dims and a per-tensor zero point; a target with an integer dot product
(:func:`int8.dot_forms`).

- B is packed at compile time into panels ``Bp [NBLK, Kq, NB*L]`` int32: lane j of a panel
  holds the ``g`` consecutive k (4 for VPDPBUSD, 2 for VPMADDWD) of column j, offset as
  :mod:`.int8` says, zero beyond K and N; the corrections per column are a second constant.
- A run-time B is packed the same way by a first kernel (``<name>_packb``), per batch, into a
  scratch slot, with its column sums (:func:`_pack_b_at_run_time`); the GEMM's tasks then keep
  to one batch (rows of one batch share its panels).
- Each parallel task takes a block of ``sweep_rows`` x R rows of A (A's batch dims folded into
  the rows) and packs them into a per-thread panel ``Ap [rows, Kq]`` int32 (``g`` k per int32,
  offset to u8 or widened to i16), with each row's sum where a B zero point needs it.
- Micro-kernel: R rows x NB vectors of L columns, R*NB int32 accumulators in registers over
  Kq steps of NB vector loads of Bp, R broadcasts of Ap and R*NB ``DotAcc``.
- Epilogue on registers: the zero-point correction, the op's ``finish(v, bidx, i, Ramp(j0, L))``,
  ``ctx.apply_epilogue``, one vector store (lane by lane past N); u8 / i8 outputs of a row's
  column vectors narrowed 4 (or 2) at a time (``int8_narrow``, as in ``conv2d_int8``).

Knobs: ``int8_tile`` (R, NB), ``int8_narrow`` (``pack`` where N is a whole number of panels, the
output u8 / i8 and the target has AVX-512BW at 16 lanes or AVX2 at 8; ``vector``), ``sweep_rows`` (R-row tiles per task and packed panel),
``col_split`` (panels split into this many parallel tasks), ``panel_major`` (tasks ordered part
by part, the row blocks inside: a constant B over half of L2 is read from memory once, not once
per row block; its default also sizes ``col_split`` so a part fits a quarter of L2).
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import Expr, Ramp, as_expr, binop, broadcast, concat, dot_acc, maximum, minimum
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops.linalg import MatMulSpec, unravel
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from . import int8
from .conv2d import vector_registers

#: default bound of a task's packed rows of A (they stay in L1 while every panel reads them)
A_PANEL_BYTES = 24 * 1024
#: parallel tasks the default ``col_split`` aims at
MIN_TASKS = 8
#: rows of A (per group) from which ``int8_engine`` defaults to AMX tiles where the target has
#: them (a 16-row tile half empty below; K must also span :data:`int8.AMX_MIN_STEPS` tile steps:
#: u8s8 3136x64x256 0.367 ms on tiles against 0.286 on VPDPBUSD, Emerald Rapids, 1 thread)
AMX_MIN_ROWS = 16


def _applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    io = mm.integer
    if io is None or mm.acc != DType.i32 or mm.K == 0 or mm.N == 0 or mm.M == 0:
        return False
    a, b = io.a, io.b
    if a.dtype not in int8.QUANT or b.dtype not in int8.QUANT or len(b.shape) < 2 or len(a.shape) < 2:
        return False
    if not int8.dot_forms(ctx.target):
        return False
    if int8.const_input(ctx, b) is None or len(b.shape) != 2:
        # B computed at run time (attention's products of two activations): packed by a first
        # kernel, per batch; A and B have the same batch dims, B's zero point is per tensor
        if b.numel == 0 or tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
            return False
        if io.b_zero is not None and io.b_zero.numel != 1:
            return False
    elif io.b_zero is not None and (int8.const_input(ctx, io.b_zero) is None or
                                    io.b_zero.numel not in (1, mm.N) or len(io.b_zero.shape) > 1):
        return False
    if io.a_zero is not None and io.a_zero.numel != 1 and not (len(io.a_zero.shape) == 1 and len(a.shape) == 2):
        return False
    return True


def _default_tile(regs: int, rows: int, nvec: int) -> tuple[int, int]:
    nb = min(4 if regs >= 32 else 2, nvec)
    r = max(1, min((regs - nb - 2) // nb, 8 if regs >= 32 else 6, rows))
    return r, nb


@register_schedule("matmul", "llvm", "matmul_int8", plevel=40, applies=_applies)
def emit_matmul_int8(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Integer GEMM on the target's dot-product instruction over B packed in panels (module
    docstring); one kernel."""
    io = mm.integer
    a, b, y = io.a, io.b, mm.y
    K, N, M = mm.K, mm.N, mm.M
    rows = a.numel // K
    bv = int8.const_input(ctx, b) if len(b.shape) == 2 else None
    runtime_b = bv is None
    # row groups that share one B: the batches of a run-time B, else all rows
    NGRP = b.numel // (K * N) if runtime_b else 1
    RG = rows // NGRP
    forms = int8.dot_forms(ctx.target)
    amx = int8.has_amx(ctx.target) and not runtime_b and knob(
        "int8_engine", ["dot", "amx"],
        "amx" if RG >= AMX_MIN_ROWS and int8.amx_by_default(-(-K // 4)) else "dot",
        doc="dot: the vector dot product (VPDPBUSD / VPMADDWD) on registers; amx: AMX tiles "
            "(TDPBUSD on 16 x 64-byte tiles)") == "amx"
    if amx:
        forms = [f for f in forms if f.isa == "vnni" and f.lanes == 16]
    widths = [f.lanes for f in forms]
    L = knob("int8_lanes", widths, widths[0], doc="int32 lanes (output columns) per vector")
    form = next(f for f in forms if f.lanes == L)
    g = form.per_lane
    Kq = -(-K // g)
    nvec = -(-N // L)
    regs = vector_registers(ctx.target)
    if amx:
        # tiles of 16 rows: R / 16 A tiles and NB B tiles feed R / 16 * NB accumulator tiles,
        # at most 8 tiles in all; K in steps of 64 (16 packed words), zero beyond K
        Kq = -(-Kq // int8.AMX_KQ) * int8.AMX_KQ
        tiles = [(r, nb) for r in (16, 32) for nb in (1, 2) if nb <= nvec]
        tile0 = (32 if RG >= 32 else 16, min(2, nvec))
    else:
        tiles = [(r, nb) for nb in range(1, min(4, nvec) + 1) for r in range(1, min(12, RG) + 1)
                 if r * nb + nb + 2 <= regs]
        tile0 = _default_tile(regs, RG, nvec)
    R, NB = knob("int8_tile", tiles, tile0, doc="register tile: rows x column vectors (amx: rows in tiles of 16)")
    blk = NB * L
    NBLK = -(-N // blk)
    full = RG // R
    g0 = max(1, min(max(full, 1), A_PANEL_BYTES // max(1, R * Kq * 4)))
    G = knob("sweep_rows", [d for d in range(1, min(16, max(full, 1)) + 1)], g0,
             doc="row tiles per parallel task (its packed rows of A)") if full > 1 else 1
    ntask_rows = NGRP * -(-RG // (G * R))
    split0 = 1 if ntask_rows >= MIN_TASKS else min(NBLK, -(-MIN_TASKS // ntask_rows))
    splits = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= NBLK]
    # a constant B larger than half of L2 (a transformer's 768 x 3072 weight: 2.4 MB) would
    # stream from memory once per row block: its panels go in parts that fit a quarter of L2,
    # and the tasks walk the row blocks inside a part (each re-packs its rows of A, K bytes a row)
    b_bytes = NBLK * Kq * blk * 4
    big_b = NGRP == 1 and full > 1 and b_bytes > ctx.target.l2_bytes // 2
    if big_b:
        need = -(-b_bytes // max(1, ctx.target.l2_bytes // 4))
        split0 = max(split0, next((s for s in splits if s >= need), splits[-1]))
    SPLIT = knob("col_split", splits, split0, doc="column panels split into this many parallel tasks")
    per = -(-NBLK // SPLIT)
    PM = knob("panel_major", [False, True], big_b and SPLIT > 1,
              doc="tasks walk the row blocks inside a part of the panels (B's part reused from L2)") \
        if NGRP == 1 and SPLIT > 1 and full > 1 else False

    i32 = DType.i32
    if runtime_b:
        bp, cb, rowsum, d_expr = _pack_b_at_run_time(ctx, io, form, K, N, Kq, blk, NBLK, NGRP)
    else:
        # ---- B packed at compile time: columns are the "output channels" of int8.offset_weights
        bz = int8.const_input(ctx, io.b_zero)
        pw = int8.offset_weights(np.ascontiguousarray(bv.T), bz, form, b.dtype)
        wpad = np.zeros((NBLK * blk, Kq * g), np.int64)      # (Kq: AMX pads it to whole steps)
        wpad[:N, :K] = pw.w_p
        bp = ctx.pack(int8.pack_lanes(wpad.reshape(NBLK, blk, Kq, g).transpose(0, 2, 1, 3), form), "bint8")
        corr = np.zeros((2, NBLK * blk), np.int32)
        corr[0, :N] = pw.corr
        corr[1, :N] = int8.wrap32(pw.d)
        cb = ctx.pack(corr, "bcorr")
        rowsum = pw.need_rowsum
        d_expr = None
    # B's zero point stays a parameter: CSE merges equal constants, so the buffer may also be
    # A's zero point or one the fused epilogue reads (a QuantizeLinear's)
    params = [p for p in ctx.default_params() if p is not b] + [bp, cb]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += (f"  [int8 {'amx tdpbusd' if amx else form.isa} {form.packing} x{L}: tile {R} rows x {NB}x{L} columns, "
                          f"{G} tiles per task, B packed {list(bp.shape)}"
                          f"{' at run time' if runtime_b else ''}]")
    s_off = int8.activation_offset(form, a.dtype)
    mask = (1 << form.bits) - 1
    GR = G * R
    ap = kb.local(i32, (GR * Kq,), hint="apanel")
    rs = kb.local(i32, (GR,), hint="rowsum")
    acc = kb.local(i32, (R * NB * L,), hint="acc")
    epi_loop = not amx and R > 1 and knob(
        "int8_epilogue", ["loop", "unrolled"], "loop",
        doc="the tile's row epilogues in a loop over its rows (one copy of a fused epilogue), or unrolled") == "loop"
    accs = kb.local(i32, (R * NB * L,), hint="accs") if epi_loop else None
    lanes_buf = kb.local(i32, (L,), hint="lanes")
    # u8 / i8 outputs of a row's NB column vectors (contiguous in Y, every panel whole) narrow
    # together through the x86 packs (ir.kernel.Concat "x86pack"), 4 or 2 at a time, and store
    # as one vector
    narrow_pack = (y.dtype in (DType.u8, DType.i8) and NB > 1 and N % blk == 0
                   and int8.packs_narrow(ctx.target, L)
                   and knob("int8_narrow", ["pack", "vector"], "pack",
                            doc="u8 / i8 outputs of a row's column vectors narrowed together by x86 packs, "
                                "or each by its own conversion") == "pack")
    a_rank_batch = len(a.shape) - 2
    batch_dims = y.shape[:-2] if len(y.shape) >= 2 else ()

    def xu(v: Expr) -> Expr:
        e = v.cast(i32) + s_off if s_off else v.cast(i32)
        return e & mask

    def a_of(r: Expr) -> Expr:
        """a of the correction for flat row r: its zero point plus the packing offset."""
        if io.a_zero is None:
            return as_expr(s_off, i32)
        z = io.a_zero.flat(0) if io.a_zero.numel == 1 else io.a_zero.flat(r)
        return z.cast(i32) + s_off

    def pack_rows(r0: Expr, nrows: int):
        with kb.loop(nrows, hint="pr") as pr:
            src = (r0 + pr) * K
            if rowsum:
                kb.store(rs, pr, as_expr(0, i32))
            with kb.loop(K // g, kind="vectorize", hint="kq") as kq:
                vals = [xu(a.flat(src + kq * g + t)) for t in range(g)]
                word = vals[0]
                for t in range(1, g):
                    word = word | binop("shl", vals[t], as_expr(t * form.bits, i32))
                kb.store(ap, pr * Kq + kq, word)
            if K % g:
                vals = [xu(a.flat(src + (K // g) * g + t)) for t in range(K % g)]
                word = vals[0]
                for t in range(1, len(vals)):
                    word = word | binop("shl", vals[t], as_expr(t * form.bits, i32))
                kb.store(ap, pr * Kq + K // g, word)
            if Kq > -(-K // g):        # AMX: the words up to a whole tile step are zero
                with kb.loop(Kq, start=-(-K // g), kind="vectorize", hint="kz") as kz:
                    kb.store(ap, pr * Kq + kz, as_expr(0, i32))
            if rowsum:
                # the row's sum of x_u = x + s, as numbers (not masked to the packed bits)
                with kb.loop(K, hint="k") as k:
                    v = a.flat(src + k).cast(i32)
                    kb.store(rs, pr, rs[pr] + (v + s_off if s_off else v))

    def tile(r0: Expr, lr0, nrows: int, jb: Expr, grp=0):
        """Rows r0 .. r0+nrows-1 (panel rows lr0 ..) x panel jb (of row group grp's B)."""
        (tile_amx if amx else tile_dot)(r0, lr0, nrows, jb, grp)

    def tile_dot(r0: Expr, lr0, nrows: int, jb: Expr, grp=0):
        """:func:`tile` on vector registers: R x NB accumulators over the Kq words."""
        pj = jb + grp * NBLK if runtime_b else jb
        for q in range(nrows * NB):
            kb.store(acc, q * L, broadcast(as_expr(0, i32), L))
        with kb.reduce(Kq, hint="kq") as kq:
            bvs = [bp.vload((pj * Kq + kq) * blk + v * L, L) for v in range(NB)]
            for r in range(nrows):
                av = broadcast(ap.flat((lr0 + r) * Kq + kq), L)
                for v in range(NB):
                    q = (r * NB + v) * L
                    kb.store(acc, q, dot_acc(acc.vload(q, L), av, bvs[v], form.packing, form.isa))
        if epi_loop and nrows > 1:
            # the accumulators to a second local read at a run-time row (``acc`` keeps
            # constant offsets, so it stays in registers through the reduction), then one
            # copy of the row's epilogue in a loop over the rows
            for q in range(nrows * NB):
                kb.store(accs, q * L, acc.vload(q * L, L))
            with kb.loop(nrows, hint="er") as r:
                row_epilogue(r0, lr0, r, jb, grp, accs)
        else:
            for r in range(nrows):
                row_epilogue(r0, lr0, r, jb, grp)

    def tile_amx(r0: Expr, lr0, nrows: int, jb: Expr, grp=0):
        """As :func:`tile` on AMX tiles: rows lr0 .. lr0+R-1 of the panel (those past nrows
        are not stored) x panel jb; tile numbers: accumulators 0..3, A 4..5, B 6..7."""
        nt = R // 16
        for q in range(nt * NB):
            kb.tile_zero(q)
        with kb.reduce(Kq // int8.AMX_KQ, hint="ks") as ks:
            for ti in range(nt):
                kb.tile_load(4 + ti, ap, (lr0 + ti * 16) * Kq + ks * int8.AMX_KQ, Kq, 16, 64)
            for v in range(NB):
                kb.tile_load(6 + v, bp, (jb * Kq + ks * int8.AMX_KQ) * blk + v * L, blk, 16, 64)
            for ti in range(nt):
                for v in range(NB):
                    kb.tile_dpbusd(ti * NB + v, 4 + ti, 6 + v)
        for ti in range(nt):
            for v in range(NB):
                kb.tile_store(ti * NB + v, acc, (ti * 16 * NB + v) * L, NB * L, 16, 64)
        with kb.loop(nrows, hint="er") as r:
            row_epilogue(r0, lr0, r, jb, grp)

    def row_epilogue(r0: Expr, lr0, r, jb: Expr, grp, src=None):
        """Row r of the tile in ``src`` (default ``acc``): the zero-point correction, the op's
        finish, the fused epilogue and the store of its NB vectors."""
        src = acc if src is None else src
        row = r0 + r
        bidx = unravel(row / M, batch_dims) if batch_dims else []
        i = row % M if batch_dims else row

        def corrected(v):
            j0 = jb * blk + v * L
            val = src.vload((r * NB + v) * L, L)
            if runtime_b:
                if rowsum:
                    val = val + rs.flat(lr0 + r) * d_expr
                val = val - a_of(row) * cb.vload(grp * (NBLK * blk) + j0, L)
            else:
                if rowsum:
                    val = val + rs.flat(lr0 + r) * cb.vload(NBLK * blk + j0, L)
                val = val - a_of(row) * cb.vload(j0, L)
            return val, j0
        if narrow_pack:
            k = 4 if NB % 4 == 0 else 2
            for v0 in range(0, NB - NB % k, k):
                parts = []
                for v in range(v0, v0 + k):
                    val, j0 = corrected(v)
                    idx = mm.out_index(bidx, i, Ramp(j0, L))
                    parts.append(ctx.apply_epilogue(mm.finish(val, bidx, i, Ramp(j0, L)), idx))
                kb.store(y, mm.out_index(bidx, i, Ramp(jb * blk + v0 * L, k * L)), concat(parts, "x86pack"))
            vs = range(NB - NB % k, NB)
        else:
            vs = range(NB)
        for v in vs:
            val, j0 = corrected(v)

            def vector_store(val=val, j0=j0, bidx=bidx, i=i):
                idx = mm.out_index(bidx, i, Ramp(j0, L))
                kb.store(y, idx, ctx.apply_epilogue(mm.finish(val, bidx, i, Ramp(j0, L)), idx))

            def lane_stores(val=val, j0=j0, bidx=bidx, i=i):
                # the row's last N % L columns: a loop over them with one copy of the finish
                # and epilogue (unrolled over the L lanes, a QDQ attention's epilogue made
                # 16 copies per vector: 34k lines of LLVM IR per QK^T kernel of ViT)
                kb.store(lanes_buf, 0, val)
                # the vector's columns before N: N % L in the row's last vector, none in the
                # vectors of the last panel past it
                with kb.loop(maximum(minimum(as_expr(N) - j0, as_expr(L)), as_expr(0)), hint="ln") as ln:
                    idx = mm.out_index(bidx, i, j0 + ln)
                    kb.store(y, idx, ctx.apply_epilogue(mm.finish(lanes_buf[ln], bidx, i, j0 + ln), idx))
            if N % blk == 0:
                vector_store()
            elif N % L == 0:
                with kb.if_(j0 < N):
                    vector_store()
            else:
                with kb.if_(j0 + L <= N) as whole:
                    vector_store()
                with kb.else_(whole):
                    lane_stores()

    def panels(part: Expr, body):
        lo = part * per if SPLIT > 1 else as_expr(0)
        hi = minimum(lo + per, as_expr(NBLK)) if SPLIT > 1 else as_expr(NBLK)
        with kb.loop(hi, start=lo, hint="jb", role="spatial") as jb:
            body(jb)

    nfull = RG // GR
    if nfull:
        with kb.loop(NGRP * nfull * SPLIT, kind="parallel", hint="t") as t:
            grp = t / (nfull * SPLIT) if NGRP > 1 else 0
            tt = t % (nfull * SPLIT) if NGRP > 1 else t
            if PM:          # part-major: consecutive tasks share the part's panels
                blkrow, part = tt % nfull, tt / nfull
            else:
                blkrow = tt / SPLIT if SPLIT > 1 else tt
                part = tt % SPLIT if SPLIT > 1 else as_expr(0)
            r0 = blkrow * GR + grp * RG if NGRP > 1 else blkrow * GR
            if amx:
                kb.tile_config([(16, 64)] * 8)
            pack_rows(r0, GR)

            def body(jb):
                # a loop, not G unrolled copies: the tile's epilogue (a QDQ model's Q -> DQ -> Add
                # -> Q chains, several stores) is then emitted once per tile shape, which keeps
                # compile time in check (bert_mini QDQ: 1 MB of kernel IR per GEMM when unrolled)
                if G == 1:
                    tile(r0, as_expr(0), R, jb, grp)
                else:
                    with kb.loop(G, hint="gi") as gi:
                        tile(r0 + gi * R, gi * R, R, jb, grp)
            panels(part, body)
            if amx:
                kb.tile_release()
    rest = RG - nfull * GR
    if rest:
        with kb.loop(NGRP * SPLIT, kind="parallel", hint="t") as t:
            grp = t / SPLIT if NGRP > 1 and SPLIT > 1 else (t if NGRP > 1 else 0)
            part = t % SPLIT if SPLIT > 1 else as_expr(0)
            r0 = grp * RG + nfull * GR if NGRP > 1 else as_expr(nfull * GR)
            if amx:
                kb.tile_config([(16, 64)] * 8)
            pack_rows(r0, rest)

            def body_rest(jb):
                if rest // R == 1:
                    tile(r0, as_expr(0), R, jb, grp)
                elif rest // R > 1:
                    with kb.loop(rest // R, hint="gi") as gi:
                        tile(r0 + gi * R, gi * R, R, jb, grp)
                if rest % R:
                    tile(r0 + (rest // R) * R, (rest // R) * R, rest % R, jb, grp)
            panels(part, body_rest)
            if amx:
                kb.tile_release()


def _pack_b_at_run_time(ctx: LowerCtx, io, form, K: int, N: int, Kq: int, blk: int, NBLK: int, NGRP: int):
    """A first kernel packing a run-time B [NGRP, K, N] (u8/i8) as the compile-time path packs
    a constant one: per batch p, words ``bp[p, jb, kq, jj]`` (int32 holding the ``g`` values
    b[p, kq*g + t, jb*blk + jj] - c, c = :func:`int8.weight_offset`, zero beyond K and N) and
    the column corrections ``cb[p, j] = sum_k (b[p, k, j] - zb)`` (wrapping int32). Returns
    (bp, cb, whether rows need their sum, d = c - zb as an expression): the GEMM's correction
    is acc + d * rowsum(a_u) - (za + s) * cb[p, j], as :mod:`.int8` derives."""
    b, bz = io.b, io.b_zero
    i32 = DType.i32
    g, bits = form.per_lane, form.bits
    mask = (1 << bits) - 1
    c = int8.weight_offset(form, b.dtype)
    bp = ctx.scratch(i32, (NGRP * NBLK * Kq * blk,), "bint8")
    cb = ctx.scratch(i32, (NGRP * NBLK * blk,), "bcorr")
    zconst = int8.const_input(ctx, bz)
    if bz is None:
        d_expr, rowsum = as_expr(c, i32), c != 0
    elif zconst is not None:
        dv = c - int(np.asarray(zconst).reshape(()))
        d_expr, rowsum = as_expr(dv, i32), dv != 0
    else:
        d_expr, rowsum = as_expr(c, i32) - bz.flat(0).cast(i32), True
    kb = ctx.kernel("packb", params=[b] + ([bz] if bz is not None else []) + [bp, cb])
    kb.kernel.comment += f"  [B [{NGRP}, {K}, {N}] packed for {form.isa} {form.packing}: {list(bp.shape)} words]"

    def lane(v):
        e = v.cast(i32) - c if c else v.cast(i32)
        return e & mask

    with kb.loop(NGRP, hint="p", role="spatial") as p:
        src = p * (K * N)
        dst = p * (NBLK * Kq * blk)
        if N % blk or K % g:
            with kb.loop(NBLK * Kq * blk, kind="vectorize", hint="z") as z:
                kb.store(bp, dst + z, as_expr(0, i32))

        def words(kq, nt: int, jb, ncols: int):
            with kb.loop(ncols, kind="vectorize", hint="jj") as jj:
                j = jb * blk + jj
                w = lane(b.flat(src + (kq * g) * N + j))
                for t in range(1, nt):
                    w = w | binop("shl", lane(b.flat(src + (kq * g + t) * N + j)), as_expr(t * bits, i32))
                kb.store(bp, dst + (jb * Kq + kq) * blk + jj, w)

        def word_row(kq, nt: int):
            if N // blk:
                with kb.loop(N // blk, hint="jb") as jb:
                    words(kq, nt, jb, blk)
            if N % blk:
                words(kq, nt, as_expr(N // blk), N % blk)

        if K // g:
            with kb.loop(K // g, hint="kq") as kq:
                word_row(kq, g)
        if K % g:
            word_row(as_expr(K // g), K % g)
        # column sums of b - zb
        cdst = p * (NBLK * blk)
        init = as_expr(0, i32) if bz is None else as_expr(0, i32) - bz.flat(0).cast(i32) * K
        with kb.loop(NBLK * blk, kind="vectorize", hint="j") as j:
            kb.store(cb, cdst + j, init)
        with kb.loop(K, hint="k") as k:
            with kb.loop(N, kind="vectorize", hint="j") as j:
                kb.store(cb, cdst + j, cb.flat(cdst + j) + b.flat(src + k * N + j).cast(i32))
    return bp, cb, rowsum, d_expr
