"""Linear algebra: Gemm, MatMul (ONNX operator spec, sections "Gemm" and "MatMul").

The kernel builders here (:func:`emit_matmul`, :func:`emit_gemm`, :func:`emit_matmul_core`)
are shared with fused variants: they apply ``ctx.apply_epilogue`` to each output element right
before its single store.

Every MatMul-like product is described once, as a :class:`MatMulSpec`, and handed to the
schedule registry under the key ``"matmul"`` (``ir.strategy.dispatch``): the llvm backend's
schedules (``codegen/llvm/schedules/matmul.py``: register tiles over a packed constant B, the
cache-blocked i-k-j nest, dot products in vector partial sums) and the cuda backend's
(``codegen/cuda/schedules/matmul.py``: shared-memory tiles) compute it where they apply. When
none applies, the generic loop nest here runs: one dot product over k per output element
(:func:`emit_dot_products` with one partial sum), which every backend can run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tensorfuse.ir.kernel import Buffer, Const, Expr, KernelBuilder, Ramp, as_expr
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import broadcast_shapes
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

_MATMUL_TYPES = (DType.f16, DType.f32, DType.f64, DType.i32, DType.i64, DType.u32, DType.u64)


def acc_dtype(dt: DType) -> DType:
    """Accumulation dtype: f16 accumulates in f32; every other type in itself."""
    return DType.f32 if dt in (DType.f16, DType.bf16) else dt


def _strides(shape: Sequence[int]) -> list[int]:
    s, out = 1, []
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def bcast_offset(shape: Sequence[int], idx: Sequence[Expr]) -> Expr:
    """Flat offset into a row-major tensor of ``shape`` indexed by the trailing ``len(shape)``
    entries of ``idx`` with numpy broadcasting (size-1 dims read index 0)."""
    idx = list(idx)[len(idx) - len(shape):] if shape else []
    off: Expr = Const(0, DType.i64)
    for d, st, i in zip(shape, _strides(shape), idx):
        if d != 1:
            off = off + as_expr(i, DType.i64) * st
    return off


def unravel(i: Expr, dims) -> list:
    """Row-major multi-index of flat ``i`` over ``dims`` (constant ints)."""
    out = []
    for d in reversed(list(dims)):
        out.append(i % d if d > 1 else as_expr(0))
        i = i / d if d > 1 else i
    return out[::-1]


# ----------------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class ConstantB:
    """The same product seen as rows of A times one constant matrix, offered when B is a 2-D
    compile-time constant input (schedules may repack it, e.g. into register-tile panels).

    ``value``: B' as numpy [K, N] (Gemm's transB applied; B's dtype). ``buffer``: B's input
    Buffer (a kernel that reads the repacked copy leaves it out of its parameters). ``rows``:
    A's rows with its batch dims folded in (A [..., M, K] is [rows, K]). ``a_elem(i, k)``: the
    A' element of flat row ``i`` (dtype ``acc``); ``out_index(i, j)``: Y's index list;
    ``finish(v, i, j)``: the accumulated value in Y's dtype, before the epilogue."""

    value: np.ndarray
    buffer: Buffer
    rows: int
    a_elem: Callable
    out_index: Callable
    finish: Callable


@dataclass(frozen=True)
class IntegerOperands:
    """An integer product as buffers, for schedules that pack it (the llvm ``matmul_int8``):
    ``Y = finish((A - a_zero) @ (B - b_zero))`` in int32 (ONNX MatMulInteger-10). ``a``: u8/i8
    [..., M, K] (or [K]); ``b``: u8/i8 [..., K, N] (or [K]); ``a_zero``: None (0), a scalar, [M]
    or [..., M, 1] (A's dtype); ``b_zero``: None, a scalar, [N] or [..., 1, N] (B's dtype).
    With these, the spec's ``finish(v, bidx, i, j)`` may be called with ``j`` a
    :class:`~ir.kernel.Ramp` of contiguous columns and ``v`` a vector: it must read
    per-column parameters with ``Buffer.flat`` or index lists (which take a Ramp)."""

    a: Buffer
    b: Buffer
    a_zero: Buffer | None = None
    b_zero: Buffer | None = None


@dataclass(frozen=True)
class MatMulSpec:
    """``Y[b, i, j] = finish(sum_k load_a(b, i, k) * load_b(b, k, j), b, i, j)`` for ``b``
    over ``batch`` (a shape; () for none), i < M, j < N: what the ``"matmul"`` schedules get.

    ``load_a(bidx, i, k)`` / ``load_b(bidx, k, j)`` return Exprs of dtype ``acc`` (the
    accumulation dtype) for in-range indices; ``out_index(bidx, i, j)`` is the index list into
    ``y``; ``finish`` maps the accumulated Expr to ``y``'s dtype. ``b_contiguous_in_j``: B is
    read along j (False: Gemm's transB, B' contiguous in k). ``const_b``: the rows view
    (:class:`ConstantB`) when B is a 2-D constant, else None. ``integer``: the operands of an
    integer product (:class:`IntegerOperands`; ``load_a``/``load_b`` then subtract the zero
    points), else None."""

    y: Buffer
    M: int
    N: int
    K: int
    batch: tuple
    load_a: Callable
    load_b: Callable
    out_index: Callable
    finish: Callable
    acc: DType
    b_contiguous_in_j: bool = True
    const_b: ConstantB | None = None
    integer: IntegerOperands | None = None

    def store(self, ctx: LowerCtx, kb: KernelBuilder, bidx, i, j, value: Expr) -> None:
        """The one store of output element (bidx, i, j): ``finish`` then the epilogue."""
        oi = self.out_index(bidx, i, j)
        kb.store(self.y, oi, ctx.apply_epilogue(self.finish(value, bidx, i, j), oi))


# ----------------------------------------------------------------------------- kernel core
def emit_dot_products(ctx: LowerCtx, kb: KernelBuilder, mm: MatMulSpec, bidx, lanes: int) -> None:
    """For one batch index ``bidx``: every output element as a dot product over k (i-j-k
    order), accumulated in ``lanes`` independent partial sums over consecutive k, added up at
    the end (a fixed reassociation of the sum that LLVM vectorises without fast-math); the
    K % lanes last terms go to the first sum. ``lanes`` = 1 is the plain running sum (the
    generic nest)."""
    M, N, K, acc = mm.M, mm.N, mm.K, mm.acc
    kmain = K - K % lanes
    s = kb.local(acc, (lanes,), hint="dot")
    with kb.loop(M, hint="i", role="spatial") as i:
        with kb.loop(N, hint="j", role="spatial") as j:
            with kb.loop(lanes, kind="vectorize", hint="l") as l:
                kb.store(s, l, as_expr(0, acc))
            with kb.loop(kmain // lanes, hint="kb") as kb_:
                with kb.loop(lanes, kind="vectorize", hint="l") as l:
                    k = kb_ * lanes + l
                    kb.store(s, l, s[l] + mm.load_a(bidx, i, k) * mm.load_b(bidx, k, j))
            if kmain < K:
                with kb.loop(K, start=kmain, hint="k") as k:
                    kb.store(s, 0, s[0] + mm.load_a(bidx, i, k) * mm.load_b(bidx, k, j))
            total = s.flat(0)
            for l in range(1, lanes):
                total = total + s.flat(l)
            mm.store(ctx, kb, bidx, i, j, total)


def emit_matmul_core(ctx: LowerCtx, mm: MatMulSpec) -> None:
    """Emit ``mm`` (:class:`MatMulSpec`): with the target backend's ``"matmul"`` schedule
    where one applies (``ir.strategy.dispatch``), else the generic nest, one kernel with one
    running sum per output element. The epilogue (``ctx.apply_epilogue``) is applied before
    the one store per element."""
    if dispatch("matmul", ctx, mm=mm) is not NO_SCHEDULE:
        return
    kb = ctx.kernel()
    with kb.grid(mm.batch) as bidx:
        emit_dot_products(ctx, kb, mm, bidx, 1)


def _scale(e: Expr, alpha: float) -> Expr:
    return e if alpha == 1.0 else e * as_expr(alpha, e.dtype)


def _constant_b(ctx: LowerCtx, a: Buffer, b: Buffer):
    """B as numpy when it is a 2-D compile-time constant input (and A has rank >= 2, and B is
    not empty: with K = 0 or N = 0 the plain loops give zeros), else None."""
    if len(b.shape) != 2 or len(a.shape) < 2 or ctx.inputs[1] is not b or b.numel == 0:
        return None
    return ctx.const(1)


def emit_matmul(ctx: LowerCtx, a: Buffer, b: Buffer, y: Buffer) -> None:
    """MatMul kernel with numpy.matmul semantics (1-D operands, broadcast batch dims), through
    :func:`emit_matmul_core` (on CPUs an f32 MatMul by a constant 2-D B gets register tiles
    over a packed B: ``codegen/llvm/schedules/matmul.py``)."""
    a_sh = (1,) + a.shape if len(a.shape) == 1 else a.shape
    b_sh = b.shape + (1,) if len(b.shape) == 1 else b.shape
    M, K = a_sh[-2:]
    N = b_sh[-1]
    batch = broadcast_shapes(a_sh[:-2], b_sh[:-2])
    acc = acc_dtype(y.dtype)
    a_st, b_st = _strides(a_sh), _strides(b_sh)

    def load_a(bidx, i, k):
        return a.flat(bcast_offset(a_sh[:-2], bidx) * (M * K) + i * a_st[-2] + k).cast(acc)

    def load_b(bidx, k, j):
        base = bcast_offset(b_sh[:-2], bidx) * (K * N) + k * b_st[-2]
        if isinstance(j, Ramp):             # the contiguous vector of B's row k from column j.base
            return b.flat(Ramp(base + j.base, j.lanes)).cast(acc)
        return b.flat(base + j).cast(acc)

    def out_index(bidx, i, j):
        return list(bidx) + ([i] if len(a.shape) > 1 else []) + ([j] if len(b.shape) > 1 else [])

    def finish(v, *_):
        return v.cast(y.dtype)

    bc = _constant_b(ctx, a, b)
    rows_view = None
    if bc is not None:
        rows_view = ConstantB(bc, b, a.numel // K, lambda i, k: a.flat(i * K + k).cast(acc),
                              lambda i, j: unravel(i, y.shape[:-1]) + [j], lambda v, i, j: finish(v))
    emit_matmul_core(ctx, MatMulSpec(y, M, N, K, tuple(batch), load_a, load_b, out_index, finish, acc,
                                     const_b=rows_view))


def emit_gemm(ctx: LowerCtx, a: Buffer, b: Buffer, c: Buffer | None, y: Buffer, *,
              alpha: float = 1.0, beta: float = 1.0, trans_a: bool = False,
              trans_b: bool = False) -> None:
    """Gemm kernel: Y = alpha * A' @ B' + beta * C, C broadcast unidirectionally to (M, N),
    through :func:`emit_matmul_core`.

    Integer types combine alpha and beta in f64 and cast back (as the ONNX reference does).
    """
    M, N = y.shape
    K = a.shape[0] if trans_a else a.shape[1]
    acc = acc_dtype(y.dtype)

    def load_a(_, i, k):
        return (a[k, i] if trans_a else a[i, k]).cast(acc)

    def load_b(_, k, j):
        return (b[j, k] if trans_b else b[k, j]).cast(acc)

    use_c = c is not None and beta != 0.0

    def finish(v, _, i, j):
        if acc.is_float:
            r = _scale(v, alpha)
            if use_c:
                r = r + _scale(c.bcast([i, j]).cast(acc), beta)
            return r.cast(y.dtype)
        if alpha == 1.0 and (not use_c or beta == 1.0):
            return (v + c.bcast([i, j]) if use_c else v).cast(y.dtype)
        r = _scale(v.cast(DType.f64), alpha)
        if use_c:
            r = r + _scale(c.bcast([i, j]).cast(DType.f64), beta)
        return r.cast(y.dtype)

    bc = _constant_b(ctx, a, b)
    rows_view = None
    if bc is not None:
        rows_view = ConstantB(bc.T if trans_b else bc, b, M, lambda i, k: load_a((), i, k),
                              lambda i, j: [i, j], lambda v, i, j: finish(v, (), i, j))
    emit_matmul_core(ctx, MatMulSpec(y, M, N, K, (), load_a, load_b, lambda _, i, j: [i, j], finish, acc,
                                     b_contiguous_in_j=not trans_b, const_b=rows_view))


# ----------------------------------------------------------------------------- MatMul
def matmul_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """Output shape of numpy.matmul; raises ShapeError on rank 0 or a K mismatch."""
    if len(a) == 0 or len(b) == 0:
        raise ShapeError(f"MatMul operands must have rank >= 1, got shapes {list(a)} and {list(b)}")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"inner dimensions differ: A {list(a)} has K={a2[-1]}, B {list(b)} has K={b2[-2]}")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    return batch + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())


def _check_types(node, allowed) -> DType:
    dts = {v.dtype for v in node.inputs if v is not None}
    dt = node.inputs[0].dtype
    if len(dts) > 1:
        raise ShapeError(f"inputs have different dtypes: {sorted(d.value for d in dts)}")
    if dt not in allowed:
        raise ShapeError(f"dtype {dt} is not supported (allowed: {', '.join(d.value for d in allowed)})")
    return dt


def _matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == np.float16:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return np.matmul(a, b)


@op("MatMul", OpPatternKind.OUT_ELEMWISE_FUSABLE, fusion_anchor=True)
class MatMul:
    """Y = A @ B with numpy.matmul semantics. ONNX spec: MatMul-13.

    A: [..., M, K] (1-D A: [K], a 1 is prepended then removed), B: [..., K, N] (1-D B: [K],
    a 1 is appended then removed); batch dims broadcast. dtypes f16 (accumulated in f32),
    f32, f64, i32, i64, u32, u64; integers wrap. Raises ShapeError for rank-0 operands, a K
    mismatch, batch dims that do not broadcast or mixed dtypes.
    """

    def infer(node):
        dt = _check_types(node, _MATMUL_TYPES)
        return [TensorType(dt, matmul_shape(node.inputs[0].shape, node.inputs[1].shape))]

    def reference(node, ins):
        return [_matmul_ref(ins[0], ins[1])]

    def lower(ctx):
        emit_matmul(ctx, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0])

    def flops(node):
        a = node.inputs[0].shape
        return 2.0 * node.outputs[0].type.numel * a[-1]


# ----------------------------------------------------------------------------- Gemm
def _gemm_dims(node) -> tuple[int, int, int]:
    a, b = node.inputs[0].shape, node.inputs[1].shape
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"A and B must be 2-D, got shapes {list(a)} and {list(b)}")
    M, K = (a[1], a[0]) if node.attr("transA", 0) else a
    K2, N = (b[1], b[0]) if node.attr("transB", 0) else b
    if K != K2:
        raise ShapeError(f"inner dimensions differ: A' has K={K}, B' has K={K2} "
                         f"(transA={node.attr('transA', 0)}, transB={node.attr('transB', 0)})")
    return M, N, K


@op("Gemm", OpPatternKind.OUT_ELEMWISE_FUSABLE, fusion_anchor=True)
class Gemm:
    """Y = alpha * A' @ B' + beta * C. ONNX spec: Gemm-13.

    A' = transpose(A) if transA else A, shape [M, K]; B' likewise [K, N]; C (optional since
    Gemm-11) broadcasts unidirectionally to [M, N]. Gemm-7 and -9 (C required) and -11 have
    the same meaning where C is given, so older versions import unchanged. dtypes f16 (f32
    accumulation), f32, f64, i32, i64, u32, u64. Raises ShapeError when A or B is not 2-D,
    K differs, C does not broadcast to [M, N], or dtypes differ.
    """

    def infer(node):
        dt = _check_types(node, _MATMUL_TYPES)
        M, N, _ = _gemm_dims(node)
        c = node.input(2)
        if c is not None:
            cs = (1,) * (2 - c.type.rank) + c.shape if c.type.rank <= 2 else None
            if cs is None or any(d not in (1, t) for d, t in zip(cs, (M, N))):
                raise ShapeError(f"C of shape {list(c.shape)} does not broadcast to [M, N] = {[M, N]}")
        return [TensorType(dt, (M, N))]

    def reference(node, ins):
        a, b, c = ins[0], ins[1], ins[2] if len(ins) > 2 else None
        if node.attr("transA", 0):
            a = a.T
        if node.attr("transB", 0):
            b = b.T
        alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
        dt = a.dtype
        if dt == np.float16 or dt.kind in "iu":
            wide = np.float32 if dt == np.float16 else np.float64
            r = a.astype(wide) @ b.astype(wide) if dt == np.float16 else (a @ b)
            if dt.kind in "iu" and alpha == 1.0 and (c is None or beta in (0.0, 1.0)):
                return [(r + c if c is not None and beta == 1.0 else r).astype(dt)]
            r = r.astype(wide) * wide(alpha)
            if c is not None and beta != 0.0:
                r = r + wide(beta) * c.astype(wide)
            return [np.broadcast_to(r, (a.shape[0], b.shape[1])).astype(dt)]
        r = (a @ b)
        if alpha != 1.0:
            r = r * dt.type(alpha)
        if c is not None and beta != 0.0:
            r = r + (c if beta == 1.0 else dt.type(beta) * c)
        return [r.astype(dt)]

    def lower(ctx):
        a, b = ctx.inputs[0], ctx.inputs[1]
        c = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        emit_gemm(ctx, a, b, c, ctx.outputs[0], alpha=float(ctx.attr("alpha", 1.0)),
                  beta=float(ctx.attr("beta", 1.0)), trans_a=bool(ctx.attr("transA", 0)),
                  trans_b=bool(ctx.attr("transB", 0)))

    def flops(node):
        M, N, K = _gemm_dims(node)
        return 2.0 * M * N * K + (2.0 * M * N if node.input(2) is not None else 0.0)


# ----------------------------------------------------------------------------- MatMulInteger
def _zp_loader(zp: Buffer | None, batch_rank: int, rows: int, per: str):
    """Zero point reader: scalar / 1-element, a vector per row (A, ``per="row"``) or per column
    (B, ``per="col"``), or N-D [..., M, 1] / [..., 1, N] with broadcast batch dims."""
    if zp is None:
        return lambda bidx, r: Const(0, DType.i32)
    numel = zp.numel
    if numel == 1:
        return lambda bidx, r: zp.flat(0).cast(DType.i32)
    if len(zp.shape) == 1:
        return lambda bidx, r: zp.flat(r).cast(DType.i32)
    bshape = zp.shape[:-2]
    return lambda bidx, r: zp.flat(bcast_offset(bshape, bidx) * rows + r).cast(DType.i32)


def _check_zp(zp, x_shape, per: str, what: str) -> None:
    if zp is None or zp.type.numel == 1:
        return
    M_or_N = x_shape[-2] if per == "row" else x_shape[-1]
    s = tuple(zp.shape)
    ok = (len(s) == 1 and s[0] == M_or_N and len(x_shape) >= 1) or \
         (len(s) >= 2 and ((s[-2:] == (M_or_N, 1)) if per == "row" else (s[-2:] == (1, M_or_N))))
    if not ok:
        want = f"[{M_or_N}] or [..., {M_or_N}, 1]" if per == "row" else f"[{M_or_N}] or [..., 1, {M_or_N}]"
        raise ShapeError(f"{what} of shape {list(s)} must be a scalar, {want}")


def emit_integer_matmul(ctx: LowerCtx, a: Buffer, b: Buffer, y: Buffer, azp: Buffer | None,
                        bzp: Buffer | None, finish: Callable | None = None) -> None:
    """Y = finish((A - a_zero_point) @ (B - b_zero_point), bidx, i, j): the int32 product of
    u8/i8 matrices with numpy.matmul shapes (MatMulInteger-10's zero points: scalar, per row of
    A, per column of B), through :func:`emit_matmul_core`. ``finish`` (default: the int32 sum)
    maps the accumulated i32 Expr of output element (bidx, i, j) to Y's dtype, before the
    fused epilogue (QLinearMatMul requantizes there); ``finish`` may get a vector ``v`` and a
    :class:`~ir.kernel.Ramp` ``j`` (:class:`IntegerOperands`). The zero points go to the
    schedules as buffers (``MatMulSpec.integer``): the llvm ``matmul_int8`` packs a constant B
    with its zero point at compile time (``codegen/llvm/schedules/matmul_int8.py``)."""
    a_sh = (1,) + a.shape if len(a.shape) == 1 else a.shape
    b_sh = b.shape + (1,) if len(b.shape) == 1 else b.shape
    M, K = a_sh[-2:]
    N = b_sh[-1]
    batch = broadcast_shapes(a_sh[:-2], b_sh[:-2])
    za = _zp_loader(azp, len(batch), M, "row")
    zb = _zp_loader(bzp, len(batch), N, "col")
    i32 = DType.i32

    def load_a(bidx, i, k):
        return a.flat(bcast_offset(a_sh[:-2], bidx) * (M * K) + i * K + k).cast(i32) - za(bidx, i)

    def load_b(bidx, k, j):
        return b.flat(bcast_offset(b_sh[:-2], bidx) * (K * N) + k * N + j).cast(i32) - zb(bidx, j)

    def out_index(bidx, i, j):
        return list(bidx) + ([i] if len(a.shape) > 1 else []) + ([j] if len(b.shape) > 1 else [])

    emit_matmul_core(ctx, MatMulSpec(y, M, N, K, tuple(batch), load_a, load_b, out_index,
                                     finish or (lambda v, *_: v), i32,
                                     integer=IntegerOperands(a, b, azp, bzp)))


@op("MatMulInteger", OpPatternKind.OUT_ELEMWISE_FUSABLE)
class MatMulInteger:
    """Y = (A - a_zero_point) @ (B - b_zero_point) in int32, numpy.matmul shapes.
    ONNX spec: MatMulInteger-10.

    A, B: int8 or uint8 (each its own); zero points (optional, A's / B's dtype): a scalar, a
    per-row vector [M] (or [..., M, 1]) for A, a per-column vector [N] (or [..., 1, N]) for B.
    Y: int32 (accumulation wraps in 32 bits). Raises ShapeError for other dtypes, shape
    mismatches as MatMul, or zero points of the wrong shape or dtype.
    """

    def infer(node):
        a, b = node.inputs[0], node.inputs[1]
        for v, what in ((a, "A"), (b, "B")):
            if v.dtype not in (DType.i8, DType.u8):
                raise ShapeError(f"{what} dtype {v.dtype} is not supported (i8, u8)")
        for i, (x, what, per) in ((2, (a, "a_zero_point", "row")), (3, (b, "b_zero_point", "col"))):
            zp = node.input(i)
            if zp is not None:
                if zp.dtype != x.dtype:
                    raise ShapeError(f"{what} dtype {zp.dtype} differs from its matrix's {x.dtype}")
                xs = (1,) + x.shape if (per == "row" and x.type.rank == 1) else x.shape
                xs = xs + (1,) if (per == "col" and x.type.rank == 1) else xs
                _check_zp(zp, xs, per, what)
        return [TensorType(DType.i32, matmul_shape(a.shape, b.shape))]

    def reference(node, ins):
        a, b = ins[0].astype(np.int32), ins[1].astype(np.int32)
        azp = ins[2] if len(ins) > 2 and ins[2] is not None else None
        bzp = ins[3] if len(ins) > 3 and ins[3] is not None else None
        if azp is not None:
            azp = azp.astype(np.int32)
            a = a - (azp.reshape(-1, 1) if azp.ndim == 1 and azp.size > 1 else azp)
        if bzp is not None:
            b = b - bzp.astype(np.int32)
        return [np.matmul(a, b).astype(np.int32)]

    def lower(ctx):
        azp = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        bzp = ctx.inputs[3] if len(ctx.inputs) > 3 else None
        emit_integer_matmul(ctx, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], azp, bzp)

    def flops(node):
        return 2.0 * node.outputs[0].type.numel * node.inputs[0].shape[-1]


# ----------------------------------------------------------------------------- Einsum
_EINSUM_TYPES = (DType.u8, DType.u16, DType.u32, DType.u64, DType.i8, DType.i16, DType.i32, DType.i64,
                 DType.f16, DType.f32, DType.f64)


def parse_einsum(equation: str, shapes: Sequence[Sequence[int]]):
    """Parse an einsum equation against operand shapes.

    Returns (terms, out_term, sizes): each term a list of labels per operand dim (ellipsis
    dims become labels "...0", "...1", ... aligned to the right), the output labels, and
    label -> size (size-1 dims broadcast). Raises ShapeError for malformed equations, a term
    whose rank differs from its operand's, or sizes that disagree.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms_txt = lhs.split(",")
    if len(terms_txt) != len(shapes):
        raise ShapeError(f"equation '{equation}' has {len(terms_txt)} operand terms, {len(shapes)} inputs given")

    def split(term: str, rank: int | None, what: str):
        if term.count("...") > 1:
            raise ShapeError(f"{what} '{term}' has more than one ellipsis")
        head, ell, tail = term.partition("...")
        for ch in head + tail:
            if not ch.isalpha():
                raise ShapeError(f"{what} '{term}' has the invalid label {ch!r}")
        n_ell = 0
        if ell:
            if rank is not None:
                n_ell = rank - len(head) - len(tail)
                if n_ell < 0:
                    raise ShapeError(f"{what} '{term}' has more labels than the operand's rank {rank}")
        elif rank is not None and len(head) != rank:
            raise ShapeError(f"{what} '{term}' has {len(head)} labels but the operand has rank {rank}")
        return list(head), bool(ell), n_ell, list(tail)

    parts = [split(t, len(s), f"term {i}") for i, (t, s) in enumerate(zip(terms_txt, shapes))]
    n_ell = max([p[2] for p in parts] + [0])
    ell_labels = [f"...{k}" for k in range(n_ell)]
    terms = []
    for head, has_ell, ne, tail in parts:
        terms.append(head + (ell_labels[n_ell - ne:] if has_ell else []) + tail)
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for lab, d in zip(term, shape):
            if lab not in sizes or sizes[lab] == 1:
                sizes[lab] = d
            elif d not in (1, sizes[lab]):
                raise ShapeError(f"label '{lab}' has sizes {sizes[lab]} and {d}")
    if arrow:
        head, has_ell, _, tail = split(rhs, None, "output term")
        out = head + (ell_labels if has_ell else []) + tail   # no "..." in it: those dims are summed
        for lab in head + tail:
            if lab not in sizes:
                raise ShapeError(f"output label '{lab}' appears in no input term")
        if len(set(out)) != len(out):
            raise ShapeError(f"output term '{rhs}' repeats a label")
    else:
        counts: dict[str, int] = {}
        for term in terms:
            for lab in term:
                if not lab.startswith("..."):
                    counts[lab] = counts.get(lab, 0) + 1
        out = ell_labels + sorted(l for l, c in counts.items() if c == 1)
    return terms, out, sizes


@op("Einsum", OpPatternKind.OPAQUE)
class Einsum:
    """Einstein summation: output[out] = sum over the other labels of prod_i input_i[term_i].
    ONNX spec: Einsum-12 (-28 adds bfloat16).

    Explicit ("ij,jk->ik") and implicit ("ij,jk": the labels used once, sorted) forms, repeated
    labels in one term (diagonals), and ellipsis broadcasting (aligned right, size-1 dims
    broadcast). Inputs share one numeric dtype (f16 accumulates in f32); output likewise.
    Lowered directly: a loop per output label, then a loop per summed label. Raises ShapeError
    for malformed equations, rank or size mismatches and mixed dtypes.
    """

    def infer(node):
        ins = node.inputs
        dts = {v.dtype for v in ins}
        if len(dts) != 1:
            raise ShapeError(f"inputs have different dtypes: {sorted(d.value for d in dts)}")
        if ins[0].dtype not in _EINSUM_TYPES:
            raise ShapeError(f"dtype {ins[0].dtype} is not supported")
        _, out, sizes = parse_einsum(node.attr("equation"), [v.shape for v in ins])
        return [TensorType(ins[0].dtype, tuple(sizes[l] for l in out))]

    def reference(node, ins):
        dt = ins[0].dtype
        w = [a.astype(np.float32) for a in ins] if dt == np.float16 else list(ins)
        r = np.einsum(node.attr("equation").replace(" ", ""), *w)
        return [np.asarray(r).astype(dt)]

    def lower(ctx):
        ins, y = ctx.inputs, ctx.outputs[0]
        terms, out, sizes = parse_einsum(ctx.attr("equation"), [b.shape for b in ins])
        summed = [l for l in dict.fromkeys(l for t in terms for l in t) if l not in out]
        acc = acc_dtype(y.dtype)
        kb = ctx.kernel()
        s = kb.local(acc, (1,), hint="sum")
        with kb.grid([sizes[l] for l in out]) as oidx:
            var = dict(zip(out, oidx))
            kb.store(s, 0, as_expr(0, acc))
            with kb.grid([sizes[l] for l in summed]) as sidx:
                var.update(zip(summed, sidx))
                prod = None
                for b, term in zip(ins, terms):
                    idx = [Const(0, DType.i64) if d == 1 else var[l] for l, d in zip(term, b.shape)]
                    v = (b[idx] if idx else b.flat(0)).cast(acc)
                    prod = v if prod is None else prod * v
                kb.store(s, 0, s[0] + prod)
            kb.store(y, list(oidx) if oidx else 0, s[0].cast(y.dtype))

    def flops(node):
        terms, out, sizes = parse_einsum(node.attr("equation"), [v.shape for v in node.inputs])
        labels = set(l for t in terms for l in t) | set(out)
        return float(np.prod([sizes[l] for l in labels])) * len(node.inputs)


# ----------------------------------------------------------------------------- Det
DET_MAX = 64   # the matrix is factorised in a local (stack) buffer


@op("Det", OpPatternKind.OPAQUE)
class Det:
    """Determinant of square matrices: X [*, M, M] -> Y [*]. ONNX spec: Det-22 (same as -11).

    LU factorisation with partial pivoting per matrix (f16 computed in f32). M is limited to
    ``DET_MAX`` (64) because the matrix is factorised in stack memory. Raises ShapeError for
    rank < 2, non-square matrices, M > 64 or integer dtypes.
    """

    def infer(node):
        x = node.inputs[0]
        if x.dtype not in (DType.f16, DType.f32, DType.f64):
            raise ShapeError(f"dtype {x.dtype} is not supported (f16, f32, f64)")
        if x.type.rank < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"input must be [*, M, M], got {list(x.shape)}")
        if x.shape[-1] > DET_MAX:
            raise ShapeError(f"matrices larger than {DET_MAX}x{DET_MAX} are not supported, got M = {x.shape[-1]}")
        return [TensorType(x.dtype, x.shape[:-2])]

    def reference(node, ins):
        x = ins[0]
        w = x.astype(np.float32) if x.dtype == np.float16 else x
        return [np.asarray(np.linalg.det(w)).astype(x.dtype)]

    def lower(ctx):
        from tensorfuse.ir.kernel import select, unop
        x, y = ctx.inputs[0], ctx.outputs[0]
        M = x.shape[-1]
        batch = int(np.prod(x.shape[:-2], dtype=np.int64))
        if batch == 0:
            return
        acc = acc_dtype(x.dtype)
        kb = ctx.kernel()
        L = kb.local(acc, (max(M * M, 1),), hint="lu")
        det = kb.local(acc, (1,), hint="det")
        p = kb.local(DType.i64, (1,), hint="piv")
        pv = kb.local(acc, (1,), hint="pivabs")
        f = kb.local(acc, (1,), hint="f")
        tmp = kb.local(acc, (1,), hint="tmp")
        with kb.loop(batch, hint="b") as b:
            with kb.loop(M * M, kind="vectorize", hint="e") as e:
                kb.store(L, e, x.flat(b * (M * M) + e).cast(acc))
            kb.store(det, 0, as_expr(1.0, acc))
            with kb.loop(M, hint="k") as k:
                kb.store(p, 0, k)
                kb.store(pv, 0, unop("abs", L.flat(k * M + k)))
                with kb.loop(M, start=k + 1, hint="i") as i:
                    a = unop("abs", L.flat(i * M + k))
                    kb.store(p, 0, select(a > pv[0], i, p[0]))   # before pv changes
                    kb.store(pv, 0, select(a > pv[0], a, pv[0]))
                with kb.if_(p[0].ne(k)):
                    with kb.loop(M, hint="j") as j:
                        kb.store(tmp, 0, L.flat(k * M + j))
                        kb.store(L, k * M + j, L.flat(p[0] * M + j))
                        kb.store(L, p[0] * M + j, tmp[0])
                    kb.store(det, 0, -det[0])
                piv = L.flat(k * M + k)
                kb.store(det, 0, det[0] * piv)
                with kb.loop(M, start=k + 1, hint="i") as i:
                    # a zero pivot makes the determinant 0; skip the elimination, avoid 0/0
                    kb.store(f, 0, select(piv.eq(as_expr(0.0, acc)), as_expr(0.0, acc), L.flat(i * M + k) / piv))
                    with kb.loop(M, start=k + 1, kind="vectorize", hint="j") as j:
                        kb.store(L, i * M + j, L.flat(i * M + j) - f[0] * L.flat(k * M + j))
            kb.store(y, b, det[0].cast(y.dtype))

    def flops(node):
        M = node.inputs[0].shape[-1]
        return float(node.outputs[0].type.numel) * (2.0 / 3.0) * M ** 3
