"""The llvm backend's schedules of MatMul, Gemm, MatMulInteger and their fused forms: schedule
key ``"matmul"``, workload :class:`ir.ops.linalg.MatMulSpec` (docs/architecture.md "CPU
codegen", "Adding a schedule").

``matmul_blocked`` (plevel 10): float32 with a constant 2-D B (the spec's ``const_b``).

- B' [K, N] (Gemm's transB is resolved while packing) is packed once into panels
  ``Bp [NBLK, K, NB*L]`` (``L`` lanes of the target, ``NB`` vectors per panel, zero-padded
  beyond N), so one reduction step reads NB contiguous vectors.
- The micro-kernel keeps an ``R x NB`` tile of vector accumulators (R rows of A, NB*L columns)
  in registers over the K reduction: per k, NB vector loads, R broadcasts of A[i, k] and R*NB
  FMAs. Rows of every batch of A are one row range (A [..., M, K] is [rows, K]).
- Parallel over (row block, column panel) tiles; the rows left over (rows % R) form a second
  parallel loop over panels with a smaller tile.
- ``finish`` (alpha, beta*C) and the fused epilogue run on whole accumulator vectors (the
  output index's last entry is a :class:`~ir.kernel.Ramp`) before one vector store; a vector
  that crosses N runs them per lane.

Knobs: ``register_tile`` (R, NB), constrained so R*NB accumulators + NB panel vectors + 2 fit
the vector registers; ``sweep_rows`` (row blocks one parallel task runs over its panel: 1 is a
task per tile); ``k_block`` (K in slices of this many steps, each slice run for all the task's
row blocks while the B panel's slice stays in L1, accumulators kept in a local buffer between
slices; K itself is one slice).

``matmul_register_tiles`` (plevel 7): float32 with B read along j at run time (no constant
B: attention's batched products), N at least one vector: ``matmul_blocked``'s register tile
with B's rows read in place instead of packed panels (:func:`emit_matmul_register_tiles`).

``matmul_panels`` (plevel 5): B contiguous along j (MatMul, Gemm without transB; any dtype),
K > 0. For a block of ``block_rows`` output rows and up to ``block_cols`` columns the
accumulators live in a local buffer and the innermost loop runs over j, contiguous in B and
Y (i-k-j order): each A element is loaded once per k and reused across the columns, each B row
across the rows; LLVM vectorises the j loop without reassociating a sum. The column-block
loop is outermost, so one [K, cols] panel of B is reused from L2 by every row block.

``matmul_dot`` (plevel 5): B read transposed (Gemm's transB), K at least two vectors: dot
products over contiguous k in ``dot_lanes`` partial sums (:func:`ir.ops.linalg.emit_dot_products`).
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import Expr, Ramp, as_expr, fma, minimum
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops.linalg import MatMulSpec, emit_dot_products
from tensorfuse.ir.strategy import register_schedule
from tensorfuse.ir.types import DType

from .conv2d import prefetch_knob, prefetch_lines, vector_registers

#: the register tile's rows at most (a candidate of ``register_tile``); the default formula
#: caps them at 8 (32 vector registers) or 6 (16)
MAX_TILE_ROWS = 12
#: vectors per B panel at most (a candidate of ``register_tile``)
MAX_TILE_VECTORS = 4
#: ``sweep_rows`` at most: the accumulators of the task's row blocks (sweep_rows x R x NB
#: vectors) live in a local buffer on the stack
MAX_SWEEP_ROWS = 64
#: parallel tasks a default sweep leaves at least, where the row blocks allow it
MIN_SWEEP_TASKS = 8
#: parallel tasks ``panels_per_task``'s default leaves at least (a task taking several
#: panels trades tasks for reuse of A; fewer than 4 measured no better at 1 and 2 threads)
PANEL_MIN_TASKS = 4
#: a sweep of at most this many row blocks is unrolled (more run as a loop)
UNROLL_SWEEP = 2
#: ``k_block`` candidates (reduction steps per slice) tried below K
K_BLOCKS = (32, 64, 128, 256, 512)

ROWS = 4      # panels schedule: output rows per register block (default)
COLS = 512    # panels schedule: output columns per accumulator block at most (bounds the local buffer)
PANEL_BYTES = 1 << 20   # column blocks sized so a [K, cols] panel of B stays in L2 (measured:
                        # narrower blocks than 128 columns cost more than the cache misses)


# ----------------------------------------------------------------------------- register tiles
def choose_gemm_tile(target, rows: int, n: int) -> tuple[int, int, int]:
    """(L, R, NB), the default register tile: lanes, rows per tile, vectors per panel; R*NB
    accumulators + NB + 2 fit the target's vector registers."""
    L = target.lanes(DType.f32)
    regs = vector_registers(target)
    nb = 2 if n > L else 1
    if regs >= 32 and n > 2 * L:
        nb = 3
    r = min((regs - nb - 2) // nb, 8 if regs >= 32 else 6, max(rows, 1))
    return L, max(1, r), nb


def register_tiles(target, rows: int, n: int) -> list[tuple[int, int]]:
    """Every (R, NB) the ``register_tile`` knob offers: NB <= MAX_TILE_VECTORS vectors, no
    panel wider than N needs, R <= MAX_TILE_ROWS rows (and no more than there are), with
    R*NB + NB + 2 <= the target's vector registers."""
    L = target.lanes(DType.f32)
    regs = vector_registers(target)
    out = []
    for nb in range(1, min(MAX_TILE_VECTORS, max(1, -(-n // L))) + 1):
        for r in range(1, min(MAX_TILE_ROWS, max(rows, 1)) + 1):
            if r * nb + nb + 2 <= regs:
                out.append((r, nb))
    return out


def row_group(target, units: int, unit_rows: int, K: int, N: int) -> int:
    """``row_group``'s default: 1 (each row unit walks every panel) while the packed B (K x N
    f32) fits half the target's L2 (``Target.l2_bytes``), so every panel a unit reads is in
    cache already; otherwise the most row units (a divisor of ``units``) whose rows of A
    (unit_rows x K f32 each) fit a quarter of L2, so a panel, read once from memory, serves the
    whole group while it stays in L2 (transformer MLPs at 64-512 tokens: B is 9.4 MB at
    768 x 3072)."""
    l2 = target.l2_bytes
    if 4 * K * N <= l2 // 2:
        return 1
    fit = max(1, (l2 // 4) // max(1, 4 * K * unit_rows))
    return max(d for d in _divisors(units) if d <= fit)


def sweep_default(target, full: int, R: int, blk: int, K: int, nblk: int = MIN_SWEEP_TASKS) -> tuple[int, int]:
    """(``sweep_rows``, ``k_block``)'s defaults, from the target's caches: one task sweeps the
    most row blocks (a divisor of ``full``) whose accumulators (sweep_rows x R x blk f32) fit
    an eighth of L2 (``Target.l2_bytes``), every one over the same slice of K, whose panel
    slice (k_block x blk f32) fits half of L1 (``Target.l1d_bytes``). So each slice of the
    packed B is read from memory once and serves all those rows from L1; in a model the
    weights come from L3 or DRAM at every call, and a panel read once per 8-row tile made
    ViT's MLP 1.16x onnxruntime's time (0.98x swept, with ``prefetch``; 12 layers of
    197 x 768 x 3072 and back, 1 thread, Xeon with 48 KiB L1 and 2 MiB L2). K that fits one
    slice is not sliced; (1, K) without a full row block. The parallel tasks (row units x
    ``nblk`` column panels) stay at least :data:`MIN_SWEEP_TASKS` where the rows allow it, so a
    narrow B (few panels) still splits over the threads."""
    if full < 1:
        return 1, K
    slices = [c for c in K_BLOCKS if c < K and c * blk * 4 <= target.l1d_bytes // 2]
    kc = max(slices) if slices and K * blk * 4 > target.l1d_bytes // 2 else K
    cap = max(1, (target.l2_bytes // 8) // (R * blk * 4))
    fits = [d for d in _divisors(full) if d <= min(cap, MAX_SWEEP_ROWS)]
    enough = [d for d in fits if (full // d) * nblk >= MIN_SWEEP_TASKS]
    return max(enough) if enough else 1, kc


def panels_default(units: int, nblk: int, sweep_floats: int, a_bytes: int, target) -> int:
    """``panels_per_task``'s default: 1 while the rows of A one sweep reads (``a_bytes``, rows
    x K f32) fit half of L2 (``Target.l2_bytes``): they stay there from one panel to the next.
    Larger (ViT's and BERT's second MLP GEMM, 197 or 128 rows x K = 3072: 2.4 / 1.5 MB) the
    task takes several panels, each slice of K over all of them in turn, so a slice of A (rows
    x k_block, 100 KB) serves them all from L2 instead of A streaming from L3 once per panel:
    the most panels (a divisor of ``nblk``) that leave :data:`PANEL_MIN_TASKS` parallel tasks
    (row units x panel groups) and whose accumulators (``sweep_floats`` f32 per panel) take
    at most a quarter of L2. 197 x 3072 x 768 in a 12-layer MLP, 1 thread: 6.52 -> 5.84 ms
    (4 panels), onnxruntime 5.6; the MLP 0.99x -> 0.94x onnxruntime (2 threads 1.00x -> 0.93x)."""
    if a_bytes <= target.l2_bytes // 2:
        return 1
    ok = [d for d in _divisors(nblk)
          if units * (nblk // d) >= PANEL_MIN_TASKS and d * sweep_floats * 4 <= target.l2_bytes // 4]
    return max(ok) if ok else 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pack_panels(b: np.ndarray, L: int, nb: int) -> np.ndarray:
    """B' [K, N] -> Bp [NBLK, K, nb*L] as float32 (zeros beyond N)."""
    k, n = b.shape
    blk = nb * L
    nblk = -(-n // blk)
    bp = np.zeros((k, nblk * blk), np.float32)
    bp[:, :n] = b
    return np.ascontiguousarray(bp.reshape(k, nblk, blk).transpose(1, 0, 2))


def _blocked_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    cb = mm.const_b
    return (cb is not None and mm.y.dtype == DType.f32 and mm.acc == DType.f32
            and cb.value.dtype == np.float32 and ctx.inputs[0].dtype == DType.f32)


@register_schedule("matmul", "llvm", "matmul_blocked", plevel=10, applies=_blocked_applies)
def emit_matmul_blocked(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Register tiles over B packed in panels (module docstring); one kernel."""
    cb, y, N, K = mm.const_b, mm.y, mm.N, mm.K
    rows = cb.rows
    L, R0, NB0 = choose_gemm_tile(ctx.target, rows, N)
    R, NB = knob("register_tile", register_tiles(ctx.target, rows, N), (R0, NB0),
                 doc="accumulator tile: rows of A x vectors of B's panel")
    blk = NB * L
    nblk = -(-N // blk)
    full = rows // R
    G0, KC0 = sweep_default(ctx.target, full, R, blk, K, nblk)
    G = knob("sweep_rows", [d for d in _divisors(full) if d <= MAX_SWEEP_ROWS], G0,
             doc="row blocks one parallel task runs over its column panel") if full > 1 else 1
    KC = knob("k_block", [c for c in K_BLOCKS if c < K] + [K], KC0,
              doc="reduction steps per slice (K: no slicing)") if K > K_BLOCKS[0] else K
    units = full // G if full else 0        # parallel tasks' row units (G row blocks each)
    MG = knob("row_group", _divisors(units), row_group(ctx.target, units, G * R, K, N),
              doc="row units per group: the panel loop runs inside a group, so one B panel is reused "
                  "from cache by the group's rows") if units > 1 and nblk > 1 else 1
    PF = prefetch_knob("the next panel", nblk > 1)
    sliced = G > 1 or KC < K
    # one task sweeping every full row block takes the last rows % R too, inside its slices
    tail = rows % R if sliced and units == 1 else 0
    sweep_floats = (G * R + tail) * NB * L      # one panel's accumulators in a sweep
    PG = knob("panels_per_task", [d for d in _divisors(nblk) if d * sweep_floats * 4 <= ctx.target.l2_bytes // 2],
              panels_default(units, nblk, sweep_floats, (G * R + tail) * K * 4, ctx.target),
              doc="column panels one sweeping task runs, each slice of K over all of them in turn (the "
                  "slice of A stays in cache across the panels)") if sliced and nblk > 1 else 1
    bp = ctx.pack(pack_panels(cb.value, L, NB), "bpanel")
    params = [p for p in ctx.default_params() if p is not cb.buffer] + [bp]
    kb = ctx.kernel(params=params)
    kb.kernel.comment += f"  [register tile {R} rows x {NB}x{L} columns, B packed {list(bp.shape)}]"
    acc = kb.local(DType.f32, ((PG * sweep_floats) if sliced else R * NB * L,), hint="acc")
    lanes = kb.local(DType.f32, (L,), hint="lanes")
    regs = kb.local(DType.f32, (R * NB * L,), hint="regs") if sliced and (G > UNROLL_SWEEP or PG > 1) else None

    def at(base, q: int):
        return q if base is None else base + q

    def zero(nrows: int, base=None):
        for q in range(nrows * NB):
            kb.store(acc, at(base, q * L), kb.broadcast(as_expr(0.0, DType.f32), L))

    def accumulate(i0: Expr, nrows: int, jb: Expr, base=None, k0=None, kn: int = K, buf=None):
        acc_ = acc if buf is None else buf
        with kb.reduce(kn, hint="k") as k:
            if k0 is not None:
                k = k0 + k
            bv = [bp.vload((jb * K + k) * blk + v * L, L) for v in range(NB)]
            if PF:
                prefetch_lines(kb, bp, (((jb + 1) % nblk) * K + k) * blk, blk, PF)
            for r in range(nrows):
                av = cb.a_elem(i0 + r, k)
                for v in range(NB):
                    q = at(base, (r * NB + v) * L)
                    kb.store(acc_, q, fma(av, bv[v], acc_.vload(q, L)))

    def finish(i0: Expr, nrows: int, jb: Expr, base=None):
        for r in range(nrows):
            i = i0 + r
            for v in range(NB):
                j0 = jb * blk + v * L
                vec = acc.vload(at(base, (r * NB + v) * L), L)

                def vector_store(vec=vec, j0=j0, i=i):
                    idx = cb.out_index(i, Ramp(j0, L))
                    kb.store(y, idx, ctx.apply_epilogue(cb.finish(vec, i, Ramp(j0, L)), idx))

                def lane_stores(vec=vec, j0=j0, i=i):
                    kb.store(lanes, 0, vec)
                    for ln in range(L):
                        with kb.if_(j0 + ln < N):
                            idx = cb.out_index(i, j0 + ln)
                            kb.store(y, idx, ctx.apply_epilogue(cb.finish(lanes[ln], i, j0 + ln), idx))
                if N % blk == 0:
                    vector_store()
                    continue
                if N % L == 0:               # vectors of the last panel are whole or past N
                    with kb.if_(j0 < N):
                        vector_store()
                    continue
                with kb.if_(j0 + L <= N) as full_vec:
                    vector_store()
                with kb.else_(full_vec):
                    lane_stores()

    def tile(i0: Expr, nrows: int, jb: Expr):
        zero(nrows)
        accumulate(i0, nrows, jb)
        finish(i0, nrows, jb)

    def sweep(i0: Expr, jb0: Expr, tail: int = 0):
        """G row blocks from row i0 (and ``tail`` more rows after them) over the PG panels from
        jb0, K in slices of KC: per slice and panel, every row block's accumulators (at its own
        offset in ``acc``) take the slice's steps while the slice of the panel stays in L1 (and
        the slice of A in L2, across the panels)."""
        step = R * NB * L

        def panels(fn):
            # fn(jb, base of the panel's accumulators in ``acc``; None: 0) for each of the PG panels
            if PG == 1:
                fn(jb0, None)
            else:
                with kb.loop(PG, hint="p") as p:
                    fn(jb0 + p, p * sweep_floats)

        def blocks(fn):
            # up to UNROLL_SWEEP row blocks are unrolled (their accumulators at constant
            # offsets, which LLVM keeps in registers); more run as a loop, and ``acc_slice``
            # moves a looped block's accumulators through ``regs``: at a loop-dependent offset
            # in ``acc`` LLVM kept them in memory (a load and a store per FMA, 3x slower)
            if G <= UNROLL_SWEEP:
                for g in range(G):
                    fn(as_expr(g))
            else:
                with kb.loop(G, hint="g") as g:
                    fn(g)
            if tail:
                fn(None)

        def rows_of(g, pb):
            i, n, base = (i0 + G * R, tail, G * step) if g is None else (i0 + g * R, R, g * step)
            return i, n, (base if pb is None else pb + base)

        def z(jb, pb):
            def f(g):
                _, n, base = rows_of(g, pb)
                zero(n, base)
            return f

        def acc_slice(k0, kn, jb, pb):
            def f(g):
                i, n, base = rows_of(g, pb)
                if regs is None:
                    accumulate(i, n, jb, base, k0, kn)
                    return
                # a looped block: its accumulators move to ``regs`` (constant offsets, which
                # LLVM keeps in registers) for the slice's reduction, and back after it
                for q in range(n * NB):
                    kb.store(regs, q * L, acc.vload(base + q * L, L))
                accumulate(i, n, jb, None, k0, kn, buf=regs)
                for q in range(n * NB):
                    kb.store(acc, base + q * L, regs.vload(q * L, L))
            return f

        def fin(jb, pb):
            def f(g):
                i, n, base = rows_of(g, pb)
                finish(i, n, jb, base)
            return f

        panels(lambda jb, pb: blocks(z(jb, pb)))
        nk, rest = divmod(K, KC)
        with kb.loop(nk, hint="kc") as kc:
            panels(lambda jb, pb: blocks(acc_slice(kc * KC, KC, jb, pb)))
        if rest:
            panels(lambda jb, pb: blocks(acc_slice(as_expr(nk * KC), rest, jb, pb)))
        panels(lambda jb, pb: blocks(fin(jb, pb)))

    def unit_panel(t: Expr) -> tuple[Expr, Expr]:
        """Task t's (row unit, panel): groups of MG row units outermost, then the panels, then
        the group's units (MG = 1: row unit-major, each task of a unit on the next panel)."""
        nt = nblk // PG             # the tasks' panel groups (PG panels each)
        if nt == 1:
            return t, as_expr(0)
        if MG == 1:
            return t / nt, (t % nt) * PG
        g, rem = t / (nt * MG), t % (nt * MG)
        return g * MG + rem % MG, (rem / MG) * PG

    if full:
        with kb.loop(units * (nblk // PG), kind="parallel", hint="t") as t:
            u, jb = unit_panel(t)
            if not sliced:
                tile(u * R, R, jb)
            else:
                sweep(u * (G * R), jb, tail)
    if rows % R and not tail:
        with kb.loop(nblk, kind="parallel", hint="jb") as jb:
            tile(as_expr(full * R), rows % R, jb)


# ----------------------------------------------------------------------------- register tiles, B at run time
def _tiles_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    L = ctx.target.lanes(DType.f32)
    return (mm.b_contiguous_in_j and mm.const_b is None and mm.integer is None and mm.acc == DType.f32
            and mm.y.dtype == DType.f32 and mm.K > 0 and mm.N >= L and mm.M > 0)


@register_schedule("matmul", "llvm", "matmul_register_tiles", plevel=7, applies=_tiles_applies)
def emit_matmul_register_tiles(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """f32 MatMul/Gemm whose B is read along j at run time (attention's Q K^T and P V, any
    batch): the register tile of ``matmul_blocked`` without packing, B's rows being contiguous
    in j already. Per batch entry and tile of R rows x NB vectors of columns, the R x NB
    accumulators stay in registers over all of K: per k, NB vector loads of B's row k, R
    broadcasts of A and R*NB FMAs; then ``finish`` and the fused epilogue on whole vectors
    before one store each. The columns past the last whole tile take a tile of their whole
    vectors, the last N % L columns a scalar loop per row. Knob ``register_tile`` (R, NB), as
    ``matmul_blocked``'s with NB*L <= N. The i-k-j ``matmul_panels`` kept its accumulators in
    memory (a load and a store per FMA): ViT's [12, 197, 64] x [12, 64, 197] scores ran at 27
    GFLOP/s, 3.5x onnxruntime's time."""
    M, N, K = mm.M, mm.N, mm.K
    L = ctx.target.lanes(DType.f32)
    tiles = [(r, nb) for r, nb in register_tiles(ctx.target, M, N) if nb * L <= N]
    _, R0, NB0 = choose_gemm_tile(ctx.target, M, N)
    NB0 = min(NB0, N // L)
    R0 = min(R0, max(r for r, nb in tiles if nb == NB0))
    R, NB = knob("register_tile", tiles, (R0, NB0), doc="accumulator tile: rows of A x vectors of B's row")
    kb = ctx.kernel()
    kb.kernel.comment += f"  [register tile {R} rows x {NB}x{L} columns, B read in place]"
    acc = kb.local(DType.f32, (R * NB * L,), hint="acc")
    sacc = kb.local(DType.f32, (L,), hint="sacc")
    blk = NB * L
    nj = N // blk
    rest_v = (N - nj * blk) // L
    tail0 = nj * blk + rest_v * L
    full = M // R

    with kb.grid(mm.batch) as bidx:
        def tile(i0: Expr, nrows: int, j0: Expr, nb: int):
            for q in range(nrows * nb):
                kb.store(acc, q * L, kb.broadcast(as_expr(0.0, DType.f32), L))
            with kb.reduce(K, hint="k") as k:
                bv = [mm.load_b(bidx, k, Ramp(j0 + v * L, L)) for v in range(nb)]
                for r in range(nrows):
                    av = mm.load_a(bidx, i0 + r, k)
                    for v in range(nb):
                        q = (r * nb + v) * L
                        kb.store(acc, q, fma(av, bv[v], acc.vload(q, L)))
            for r in range(nrows):
                for v in range(nb):
                    mm.store(ctx, kb, bidx, i0 + r, Ramp(j0 + v * L, L), acc.vload((r * nb + v) * L, L))

        def row_blocks(j0: Expr, nb: int):
            if full:
                with kb.loop(full, hint="ib", role="spatial") as ib:
                    tile(ib * R, R, j0, nb)
            if M % R:
                tile(as_expr(full * R), M % R, j0, nb)

        if nj:
            with kb.loop(nj, hint="jb", role="spatial") as jb:
                row_blocks(jb * blk, NB)
        if rest_v:
            row_blocks(as_expr(nj * blk), rest_v)
        if tail0 < N:                       # fewer than L columns: one scalar sum each
            with kb.loop(M, hint="i", role="spatial") as i:
                for c in range(N - tail0):
                    kb.store(sacc, c, as_expr(0.0, DType.f32))
                with kb.reduce(K, hint="k") as k:
                    av = mm.load_a(bidx, i, k)
                    for c in range(N - tail0):
                        kb.store(sacc, c, fma(av, mm.load_b(bidx, k, as_expr(tail0 + c)), sacc[c]))
                for c in range(N - tail0):
                    mm.store(ctx, kb, bidx, i, as_expr(tail0 + c), sacc[c])


# ----------------------------------------------------------------------------- i-k-j panels
def _panels_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    return mm.b_contiguous_in_j and mm.K > 0


@register_schedule("matmul", "llvm", "matmul_panels", plevel=5, applies=_panels_applies)
def emit_matmul_panels(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Row blocks x column blocks with accumulators in a local buffer, i-k-j order (module
    docstring); one kernel."""
    M, N, K, acc = mm.M, mm.N, mm.K, mm.acc
    # the B panel [K, cols] read by every row block should stay in L2
    cols0 = min(N, max(128, min(COLS, (PANEL_BYTES // max(K * 4, 1)) // 16 * 16)))
    cols = knob("block_cols", [c for c in (32, 64, 128, 256, 512, 1024) if c < N] + [N], cols0,
                doc="output columns per accumulator block")
    rb0 = ROWS if M >= ROWS else 1
    rb = knob("block_rows", [r for r in (1, 2, 4, 8) if r <= M], rb0, doc="output rows per register block")
    kb = ctx.kernel()
    with kb.grid(mm.batch) as bidx:
        nblk = -(-N // cols) if N else 0
        accbuf = kb.local(acc, (rb * cols,), hint="acc")
        full = M // rb

        def rows_block(i0: Expr, nrows: int, j0: Expr, width):
            with kb.loop(width, kind="vectorize", hint="j") as j:
                for r in range(nrows):
                    kb.store(accbuf, r * cols + j, as_expr(0, acc))
            with kb.loop(K, hint="k") as k:
                a_r = [mm.load_a(bidx, i0 + r, k) for r in range(nrows)]
                with kb.loop(width, kind="vectorize", hint="j") as j:
                    bv = mm.load_b(bidx, k, j0 + j)
                    for r in range(nrows):
                        kb.store(accbuf, r * cols + j, accbuf.flat(r * cols + j) + a_r[r] * bv)
            for r in range(nrows):
                with kb.loop(width, kind="vectorize", hint="j") as j:
                    mm.store(ctx, kb, bidx, i0 + r, j0 + j, accbuf.flat(r * cols + j))

        def all_rows(j0: Expr, width):
            if full:
                with kb.loop(full, hint="ib", role="spatial") as ib:
                    rows_block(ib * rb, rb, j0, width)
            for r in range(full * rb, M):   # at most rb-1 leftover rows
                rows_block(as_expr(r), 1, j0, width)

        if nblk == 1:
            all_rows(as_expr(0), N)
        else:
            with kb.loop(nblk, hint="jb", role="spatial") as jb:
                j0 = jb * cols
                all_rows(j0, minimum(as_expr(cols), N - j0))


# ----------------------------------------------------------------------------- dot products
def _dot_applies(ctx: LowerCtx, mm: MatMulSpec) -> bool:
    return not mm.b_contiguous_in_j and mm.K >= 2 * ctx.target.lanes(mm.acc)


@register_schedule("matmul", "llvm", "matmul_dot", plevel=5, applies=_dot_applies)
def emit_matmul_dot(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Dot products over contiguous k in vector partial sums (B read transposed); one kernel."""
    L = ctx.target.lanes(mm.acc)
    lanes = knob("dot_lanes", [c for c in (L // 2, L, 2 * L) if c > 1 and 2 * c <= mm.K], L,
                 doc="partial sums of each dot product (one vector of the accumulation dtype)")
    kb = ctx.kernel()
    with kb.grid(mm.batch) as bidx:
        emit_dot_products(ctx, kb, mm, bidx, lanes)
