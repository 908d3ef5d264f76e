"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin,
CumSum, TopK (ONNX operator spec, the section of each op).

IR form of the Reduce* ops is the newest one: ``axes`` is the optional second input (a
compile-time constant), with ``keepdims`` and ``noop_with_empty_axes``. Versions that take
``axes`` as an attribute (ReduceSum before 13, the others before 18) are imported by turning
the attribute into a constant input.

Reduction kernels (why this loop order): the input dims split into the kept dims before the
last reduced axis ("outer"), the reduced dims, and the trailing kept dims ("inner", contiguous
in both input and output). Accumulators for a block of up to ``CHUNK`` inner positions live in
a local buffer; the loop over the inner block is innermost, so memory is read contiguously
whether the reduction runs over the last axis (inner = 1) or over leading axes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tensorfuse.ir.kernel import Buffer, Const, Expr, KernelBuilder, as_expr, broadcast, maximum, maxnum, minimum, minnum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import const_input, norm_axis
from tensorfuse.ir.ops.softmax import axis_blocks, split_axis
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

CHUNK = 1024
I64 = DType.i64
_NUM = (DType.f16, DType.f32, DType.f64, DType.i32, DType.i64, DType.u32, DType.u64)
_NUM8 = _NUM + (DType.i8, DType.u8)


def _acc(dt: DType) -> DType:
    return DType.f32 if dt == DType.f16 else dt


def _lowest(dt: DType):
    if dt.is_float:
        return -math.inf
    if dt == DType.bool:
        return False
    return int(np.iinfo(dt.numpy).min)


def _highest(dt: DType):
    if dt.is_float:
        return math.inf
    if dt == DType.bool:
        return True
    return int(np.iinfo(dt.numpy).max)


# ----------------------------------------------------------------------------- axes
def reduce_axes(node) -> tuple[int, ...]:
    """Normalised, sorted reduced axes. Empty axes mean all axes, or no axes at all with
    noop_with_empty_axes=1: then each element is "reduced" alone, so composite reductions
    still apply their elementwise steps (ReduceL1 gives |x|, ReduceLogSum log(x)), as the
    spec says. Raises ShapeError for out-of-range or repeated axes."""
    rank = node.inputs[0].type.rank
    a = const_input(node, 1, "axes")
    axes = [] if a is None else [int(v) for v in np.asarray(a).ravel()]
    if not axes:
        return () if node.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    norm = [norm_axis(v, rank, "axes entry") for v in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"axes {axes} name an axis twice")
    return tuple(sorted(norm))


def reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in axes)


# ----------------------------------------------------------------------------- kernel
@dataclass
class Pass:
    """One accumulation pass: ``init`` value, ``step(prev_accs, acc, x) -> acc``; ``combine(a,
    b)`` joins two partial accumulators (None: the pass cannot be split, so it has no cuda
    block schedule)."""
    init: Callable[[DType], Expr]
    step: Callable[[list, Expr, Expr], Expr]
    combine: Callable[[Expr, Expr], Expr] | None = None


def emit_reduction(kb: KernelBuilder, x: Buffer, y: Buffer | None, axes, acc: DType,
                   passes: list[Pass], finish: Callable[[list, int], Expr] | None,
                   load: Callable[[Expr], Expr] | None = None,
                   write_back: Callable[[list, Expr], Expr] | None = None,
                   wb_out: Buffer | None = None) -> None:
    """Reduce ``x`` over ``axes`` into ``y`` (keepdims or not: same flat layout).

    Each pass loops over the reduced elements once; pass i's step sees the finished
    accumulators of passes before it. ``finish(accs, count)`` gives the stored value (dtype
    ``y.dtype``). ``load(flat_offset)`` reads an input element (default: ``x.flat(off).cast(acc)``).
    With ``write_back``, a last loop over the reduced elements stores
    ``wb_out[off] = write_back(accs, load(off))`` at each input position (normalisations);
    ``y`` may then be None.
    """
    shape = x.shape
    rank = len(shape)
    load = load or (lambda off: x.flat(off).cast(acc))
    last = max(axes) if axes else -1
    outer_dims = [d for d in range(last + 1) if d not in axes]
    inner = int(np.prod(shape[last + 1:], dtype=np.int64))
    count = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    xs = Buffer("_", x.dtype, shape).strides
    kept_shape = [shape[d] for d in outer_dims]
    ys = Buffer("_", x.dtype, tuple(kept_shape)).strides if kept_shape else ()
    if (y.numel if y is not None else x.numel) == 0:
        return
    chunk = max(min(inner, CHUNK), 1)
    nblk = -(-inner // chunk)
    accs = [kb.local(acc, (chunk,), hint=f"acc{p}_") for p in range(len(passes))]
    with kb.grid(kept_shape) as oidx:
        xbase: Expr = Const(0, I64)
        ybase: Expr = Const(0, I64)
        for d, i, s in zip(outer_dims, oidx, ys):
            xbase = xbase + i * xs[d]
            ybase = ybase + i * s
        ybase = ybase * inner

        def block(t0, width):
            for p, ps in enumerate(passes):
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    kb.store(accs[p], t, ps.init(acc))
                with kb.grid([shape[d] for d in axes], role="reduce") as ridx:
                    off = xbase + t0
                    for d, i in zip(axes, ridx):
                        off = off + i * xs[d]
                    with kb.loop(width, kind="vectorize", hint="t") as t:
                        prev = [a[t] for a in accs[:p]]
                        kb.store(accs[p], t, ps.step(prev, accs[p][t], load(off + t)))
            if y is not None:
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    kb.store(y, ybase + t0 + t, finish([a[t] for a in accs], count))
            if write_back is not None:
                with kb.grid([shape[d] for d in axes]) as ridx:
                    off = xbase + t0
                    for d, i in zip(axes, ridx):
                        off = off + i * xs[d]
                    with kb.loop(width, kind="vectorize", hint="t") as t:
                        kb.store(wb_out, off + t, write_back([a[t] for a in accs], load(off + t)))

        if nblk == 1:
            block(Const(0, I64), inner)
        else:
            with kb.loop(nblk, hint="ib") as ib:
                block(ib * chunk, minimum(as_expr(chunk), inner - ib * chunk))


def _sum_pass(f=lambda x: x) -> Pass:
    return Pass(lambda dt: as_expr(0, dt), lambda prev, a, x: a + f(x), lambda a, b: a + b)


def _as_float(e: Expr, fn: Callable[[Expr], Expr], out: DType) -> Expr:
    """Apply a float function to an accumulator (ints go through f64 and truncate back)."""
    if e.dtype.is_float:
        return fn(e).cast(out)
    return fn(e.cast(DType.f64)).cast(out)


def _sq(x):
    return x * x


def _abs(x):
    return unop("abs", x)


# per op: (allowed dtypes, passes, finish(accs, count, out dtype), numpy reference, flops/elem)
def _mean_finish(accs, count, out):
    a = accs[0]
    if a.dtype.is_float:
        return (a / as_expr(float(count) if count else 0.0, a.dtype)).cast(out)
    return (a / as_expr(count, a.dtype)).cast(out)


def _lse_finish(accs, count, out):
    m = select(unop("isinf", accs[0]), as_expr(0.0, accs[0].dtype), accs[0])
    return (m + unop("log", accs[1])).cast(out)


def _lse_shift(m):
    return select(unop("isinf", m), as_expr(0.0, m.dtype), m)


def _nan_or(extreme, dt: DType):
    return math.nan if dt.is_float else extreme(dt)


def _empty_or(acc, count: int, extreme, out: DType):
    """The max/min accumulator, or for an empty reduced slice the spec's identity value."""
    if count == 0 and acc.dtype.is_float:
        return as_expr(extreme(acc.dtype), acc.dtype).cast(out) if acc.lanes == 1 else \
            broadcast(as_expr(extreme(acc.dtype), acc.dtype), acc.lanes).cast(out)
    return acc.cast(out)


_SPEC = {
    "ReduceSum": (_NUM, [_sum_pass()], lambda a, c, o: a[0].cast(o)),
    "ReduceMean": (_NUM, [_sum_pass()], _mean_finish),
    # NaN skipped (maxNum): the accumulator starts as NaN, so a slice of NaN only gives NaN; an
    # empty slice gives the spec's lowest / highest value
    "ReduceMax": (_NUM8 + (DType.bool,), [Pass(lambda dt: as_expr(_nan_or(_lowest, dt), dt),
                                               lambda p, a, x: maxnum(a, x), maxnum)], lambda a, c, o: _empty_or(a[0], c, _lowest, o)),
    "ReduceMin": (_NUM8 + (DType.bool,), [Pass(lambda dt: as_expr(_nan_or(_highest, dt), dt),
                                               lambda p, a, x: minnum(a, x), minnum)], lambda a, c, o: _empty_or(a[0], c, _highest, o)),
    "ReduceProd": (_NUM, [Pass(lambda dt: as_expr(1, dt), lambda p, a, x: a * x, lambda a, b: a * b)], lambda a, c, o: a[0].cast(o)),
    "ReduceL1": (_NUM, [_sum_pass(_abs)], lambda a, c, o: a[0].cast(o)),
    "ReduceL2": (_NUM, [_sum_pass(_sq)], lambda a, c, o: _as_float(a[0], lambda v: unop("sqrt", v), o)),
    "ReduceSumSquare": (_NUM, [_sum_pass(_sq)], lambda a, c, o: a[0].cast(o)),
    "ReduceLogSum": (_NUM, [_sum_pass()], lambda a, c, o: _as_float(a[0], lambda v: unop("log", v), o)),
    "ReduceLogSumExp": ((DType.f16, DType.f32, DType.f64),
                        [Pass(lambda dt: as_expr(-math.inf, dt), lambda p, a, x: maximum(a, x), maximum),
                         Pass(lambda dt: as_expr(0.0, dt),
                              lambda p, a, x: a + unop("exp", x - _lse_shift(p[0])), lambda a, b: a + b)],
                        _lse_finish),
}


def _np_reduce(name: str, x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    dt = x.dtype
    w = x.astype(np.float32) if dt == np.float16 else x
    ax = tuple(axes)
    if name == "ReduceSum":
        r = np.sum(w, axis=ax, keepdims=keepdims, dtype=w.dtype)
    elif name == "ReduceMean":
        if dt.kind in "iu":   # C division: truncates toward zero; by zero gives 0
            s = np.sum(w, axis=ax, keepdims=keepdims, dtype=w.dtype)
            n = int(np.prod([x.shape[a] for a in ax], dtype=np.int64))
            if n == 0:
                r = np.zeros_like(s)
            else:
                q = s // n
                r = np.where((s % n != 0) & (s < 0), q + 1, q) if dt.kind == "i" else q
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                r = np.sum(w, axis=ax, keepdims=keepdims) / w.dtype.type(
                    np.prod([x.shape[a] for a in ax], dtype=np.int64))
    elif name in ("ReduceMax", "ReduceMin"):
        if x.size == 0 or any(x.shape[a] == 0 for a in ax):
            fill = (_lowest if name == "ReduceMax" else _highest)(DType.from_numpy(dt))
            r = np.full(reduced_shape(x.shape, ax, keepdims), fill, dt)
        else:
            # NaN skipped (IEEE maxNum / minNum): NaN only where the whole slice is NaN
            r = (np.fmax if name == "ReduceMax" else np.fmin).reduce(x, axis=ax, keepdims=keepdims)
    elif name == "ReduceProd":
        r = np.prod(w, axis=ax, keepdims=keepdims, dtype=w.dtype)
    elif name == "ReduceL1":
        r = np.sum(np.abs(w), axis=ax, keepdims=keepdims, dtype=w.dtype)
    elif name == "ReduceL2":
        s = np.sum(w * w, axis=ax, keepdims=keepdims, dtype=w.dtype)
        r = np.sqrt(s.astype(np.float64) if dt.kind in "iu" else s)
    elif name == "ReduceSumSquare":
        r = np.sum(w * w, axis=ax, keepdims=keepdims, dtype=w.dtype)
    elif name == "ReduceLogSum":
        s = np.sum(w, axis=ax, keepdims=keepdims, dtype=w.dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(s.astype(np.float64) if dt.kind in "iu" else s)
    elif name == "ReduceLogSumExp":
        if w.size == 0:
            r = np.full(reduced_shape(x.shape, ax, keepdims), -np.inf, w.dtype)
        else:
            m = np.max(w, axis=ax, keepdims=True)
            m = np.where(np.isinf(m), 0, m)
            with np.errstate(divide="ignore"):
                r = np.log(np.sum(np.exp(w - m), axis=ax, keepdims=True)) + m
            if not keepdims:
                r = np.squeeze(r, axis=ax)
    else:
        raise KeyError(name)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(r).astype(dt)


def _import_axes_attr(new_since: int):
    def importer(ctx, proto, version):
        if version >= new_since:
            return ctx.default_import(proto)
        attrs = ctx.attrs(proto)
        axes = attrs.pop("axes", None)
        ins = [ctx.value(proto.input[0])]
        if axes is not None:
            ins.append(ctx.builder.const(np.asarray(axes, np.int64), "axes"))
        return ctx.default_import(proto, inputs=ins, attrs=attrs)
    return importer


def _make_reduce(name: str, new_since: int, flops_per_elem: float):
    allowed, passes, finish = _SPEC[name]

    def infer(node):
        x = node.inputs[0]
        if x.dtype not in allowed:
            raise ShapeError(f"input dtype {x.dtype} is not supported "
                             f"(allowed: {', '.join(d.value for d in allowed)})")
        axes = reduce_axes(node)
        return [TensorType(x.dtype, reduced_shape(x.shape, axes, bool(node.attr("keepdims", 1))))]

    def reference(node, ins):
        axes = reduce_axes(node)
        return [_np_reduce(name, ins[0], axes, bool(node.attr("keepdims", 1)))]

    def lower(ctx):
        axes = reduce_axes(ctx.node)
        x, y = ctx.inputs[0], ctx.outputs[0]
        acc = _acc(x.dtype)
        kb = ctx.kernel(params=[x, y])
        fin = lambda a, c: finish(a, c, y.dtype)      # noqa: E731
        # a backend schedule of "reduction" (ir.strategy; cuda: a block per output) or the generic nest
        if dispatch("reduction", ctx, kb=kb, x=x, y=y, axes=axes, acc=acc, passes=passes,
                    finish=fin) is NO_SCHEDULE:
            emit_reduction(kb, x, y, axes, acc, passes, fin)

    def flops(node):
        return flops_per_elem * node.inputs[0].type.numel

    doc = (f"{name} over ``axes`` (input 1, constant; empty: all axes, or none when "
           f"noop_with_empty_axes=1), keepdims. ONNX spec: {name}-{max(new_since, 13)}. x of any "
           f"rank, dtypes {', '.join(d.value for d in allowed)} (f16 accumulates in f32); output "
           f"same dtype. Older versions with an ``axes`` attribute (before {new_since}) are "
           f"imported with a constant axes input. Raises ShapeError for an axis out of range "
           f"or named twice, axes computed at run time, or an unsupported dtype." +
           (" NaN is skipped (IEEE maxNum / minNum, numpy.fmax / fmin): NaN only where the whole "
            "reduced slice is NaN; an empty slice gives the lowest / highest value (README \"NaN in "
            "max/min-like ops\")." if name in ("ReduceMax", "ReduceMin") else ""))
    cls = type(name, (), {"__doc__": doc, "infer": infer, "reference": reference, "lower": lower,
                          "importer": _import_axes_attr(new_since), "flops": flops,
                          "const_inputs": (1,)})
    return op(name, OpPatternKind.COMM_REDUCE, prologue=True)(cls)


for _name, _since, _fl in [("ReduceSum", 13, 1), ("ReduceMean", 18, 1), ("ReduceMax", 18, 1),
                           ("ReduceMin", 18, 1), ("ReduceProd", 18, 1), ("ReduceL1", 18, 2),
                           ("ReduceL2", 18, 2), ("ReduceSumSquare", 18, 2),
                           ("ReduceLogSum", 18, 1), ("ReduceLogSumExp", 18, 4)]:
    _make_reduce(_name, _since, _fl)


# ----------------------------------------------------------------------------- ArgMax / ArgMin
def _arg_infer(node):
    x = node.inputs[0]
    if x.dtype not in _NUM8:
        raise ShapeError(f"input dtype {x.dtype} is not supported")
    axis = norm_axis(node.attr("axis", 0), x.type.rank)
    if x.shape[axis] == 0:
        raise ShapeError(f"axis {axis} has size 0: there is no index to select")
    return [TensorType(I64, reduced_shape(x.shape, (axis,), bool(node.attr("keepdims", 1))))]


def _arg_ref(node, x: np.ndarray, largest: bool) -> np.ndarray:
    axis = norm_axis(node.attr("axis", 0), x.ndim)
    f = np.argmax if largest else np.argmin
    if node.attr("select_last_index", 0):
        r = x.shape[axis] - 1 - f(np.flip(x, axis), axis=axis)
    else:
        r = f(x, axis=axis)
    if node.attr("keepdims", 1):
        r = np.expand_dims(r, axis)
    return r.astype(np.int64)


def _arg_lower(ctx: LowerCtx, largest: bool) -> None:
    x, y = ctx.inputs[0], ctx.outputs[0]
    if (y.numel if y is not None else x.numel) == 0:
        return
    axis = norm_axis(ctx.attr("axis", 0), len(x.shape))
    last = bool(ctx.attr("select_last_index", 0))
    acc = _acc(x.dtype)
    kb = ctx.kernel(params=[x, y])
    chunk = max(min(split_axis(x.shape, axis)[2], CHUNK), 1)
    best = kb.local(acc, (chunk,), hint="best")
    arg = kb.local(I64, (chunk,), hint="arg")

    def body(base, width, inner, n, rbase):
        with kb.loop(width, kind="vectorize", hint="t") as t:
            kb.store(best, t, x.flat(base + t).cast(acc))
            kb.store(arg, t, as_expr(0, I64))
        with kb.loop(n, start=1, hint="j") as j:
            with kb.loop(width, kind="vectorize", hint="t") as t:
                v = x.flat(base + j * inner + t).cast(acc)
                if largest:
                    better = (v >= best[t]) if last else (v > best[t])
                else:
                    better = (v <= best[t]) if last else (v < best[t])
                kb.store(arg, t, select(better, j, arg[t]))   # before best changes
                kb.store(best, t, select(better, v, best[t]))
        with kb.loop(width, kind="vectorize", hint="t") as t:
            kb.store(y, rbase + t, arg[t])

    axis_blocks(kb, x.shape, axis, body)


@op("ArgMax", OpPatternKind.COMM_REDUCE)
class ArgMax:
    """Index (int64) of the largest element along ``axis`` (default 0). ONNX spec: ArgMax-13.

    Ties give the first index, or the last with select_last_index=1; keepdims (default 1)
    keeps the axis as size 1. Versions 1/11/12 mean the same for the attributes they have.
    x: numeric. Raises ShapeError for an axis out of range or of size 0.
    """
    infer = _arg_infer

    def reference(node, ins):
        return [_arg_ref(node, ins[0], True)]

    def lower(ctx):
        _arg_lower(ctx, True)

    def flops(node):
        return float(node.inputs[0].type.numel)


@op("ArgMin", OpPatternKind.COMM_REDUCE)
class ArgMin:
    """Index (int64) of the smallest element along ``axis`` (default 0). ONNX spec: ArgMin-13.

    Ties give the first index, or the last with select_last_index=1; keepdims (default 1)
    keeps the axis as size 1. Versions 1/11/12 mean the same for the attributes they have.
    x: numeric. Raises ShapeError for an axis out of range or of size 0.
    """
    infer = _arg_infer

    def reference(node, ins):
        return [_arg_ref(node, ins[0], False)]

    def lower(ctx):
        _arg_lower(ctx, False)

    def flops(node):
        return float(node.inputs[0].type.numel)


# ----------------------------------------------------------------------------- CumSum
def _cumsum_axis(node) -> int:
    a = const_input(node, 1, "axis")
    if a is None:
        raise ShapeError("axis (input 1) is required")
    a = np.asarray(a)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise ShapeError(f"axis must be one integer, got {a.dtype} of shape {list(a.shape)}")
    return norm_axis(int(a.ravel()[0]), node.inputs[0].type.rank)


@op("CumSum", OpPatternKind.OPAQUE, const_inputs=(1,))
class CumSum:
    """Cumulative sum along ``axis`` (input 1: a compile-time 0-D or 1-element int tensor).
    ONNX spec: CumSum-14.

    exclusive=1: element j sums the elements before j (the first is 0); reverse=1: sums run
    from the end. x: f16 (summed in f32), f32, f64, i32, i64, u32, u64, rank >= 1; y: same
    type and shape. Raises ShapeError for an axis out of range or computed at run time.
    """

    def infer(node):
        x = node.inputs[0]
        if x.dtype not in _NUM:
            raise ShapeError(f"input dtype {x.dtype} is not supported")
        if x.type.rank == 0:
            raise ShapeError("input must have rank >= 1")
        _cumsum_axis(node)
        return [x.type]

    def reference(node, ins):
        x = ins[0]
        axis = _cumsum_axis(node)
        w = x.astype(np.float32) if x.dtype == np.float16 else x
        if node.attr("reverse", 0):
            w = np.flip(w, axis)
        r = np.cumsum(w, axis=axis, dtype=w.dtype)
        if node.attr("exclusive", 0):
            r = r - w
            r = np.concatenate([np.zeros_like(np.take(r, [0], axis=axis)),
                                np.take(np.cumsum(w, axis=axis, dtype=w.dtype),
                                        range(x.shape[axis] - 1), axis=axis)], axis=axis)
        if node.attr("reverse", 0):
            r = np.flip(r, axis)
        return [r.astype(x.dtype)]

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        if y.numel == 0:
            return
        axis = _cumsum_axis(ctx.node)
        rev, excl = bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0))
        acc = _acc(x.dtype)
        kb = ctx.kernel(params=[x, y])
        chunk = max(min(split_axis(x.shape, axis)[2], CHUNK), 1)
        s = kb.local(acc, (chunk,), hint="sum")

        def body(base, width, inner, n, _rbase):
            with kb.loop(width, kind="vectorize", hint="t") as t:
                kb.store(s, t, as_expr(0, acc))
            with kb.loop(n, hint="j") as j:
                jj = (n - 1 - j) if rev else j
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    off = base + jj * inner + t
                    if excl:
                        kb.store(y, off, s[t].cast(y.dtype))
                        kb.store(s, t, s[t] + x.flat(off).cast(acc))
                    else:
                        kb.store(s, t, s[t] + x.flat(off).cast(acc))
                        kb.store(y, off, s[t].cast(y.dtype))

        axis_blocks(kb, x.shape, axis, body)

    def flops(node):
        return float(node.inputs[0].type.numel)


# ----------------------------------------------------------------------------- TopK
def _topk_k(node) -> int:
    k = const_input(node, 1, "K")
    if k is None:
        raise ShapeError("K (input 1) is required")
    k = np.asarray(k)
    if k.size != 1:
        raise ShapeError(f"K must hold one value, got shape {list(k.shape)}")
    return int(k.ravel()[0])


@op("TopK", OpPatternKind.OPAQUE, const_inputs=(1,))
class TopK:
    """The K largest (largest=1) or smallest elements along ``axis`` (default -1), with their
    int64 indices. ONNX spec: TopK-24.

    K (input 1) must be known at compile time. Outputs are always sorted (also for sorted=0,
    where ONNX leaves the order open); equal values are ordered by lower index first.
    TopK-1 (``k`` attribute) is imported with a constant K input; TopK-10 has no largest/sorted
    attributes and means their defaults. NaNs are not ordered (results with NaN inputs are
    unspecified). x: numeric. Raises ShapeError when K < 0, K > the axis size, or K is
    computed at run time.
    """

    def infer(node):
        x = node.inputs[0]
        if x.dtype not in _NUM8:
            raise ShapeError(f"input dtype {x.dtype} is not supported")
        axis = norm_axis(node.attr("axis", -1), x.type.rank)
        k = _topk_k(node)
        if not 0 <= k <= x.shape[axis]:
            raise ShapeError(f"K = {k} is outside 0..{x.shape[axis]} (the size of axis {axis})")
        shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
        return [TensorType(x.dtype, shape), TensorType(I64, shape)]

    def reference(node, ins):
        x = ins[0]
        axis = norm_axis(node.attr("axis", -1), x.ndim)
        k = _topk_k(node)
        n = x.shape[axis]
        if node.attr("largest", 1):
            # stable ascending sort of the reversed axis, read backwards: descending values,
            # equal values by ascending original index
            order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        else:
            order = np.argsort(x, axis=axis, kind="stable")
        idx = np.take(order, range(k), axis=axis).astype(np.int64)
        return [np.take_along_axis(x, idx, axis=axis), idx]

    def lower(ctx):
        x = ctx.inputs[0]
        vals, idxs = ctx.outputs[0], ctx.outputs[1] if len(ctx.outputs) > 1 else None
        if vals.numel == 0:
            return
        axis = norm_axis(ctx.attr("axis", -1), len(x.shape))
        k = _topk_k(ctx.node)
        largest = bool(ctx.attr("largest", 1))
        outer, n, inner = split_axis(x.shape, axis)
        kb = ctx.kernel(params=[x] + [b for b in ctx.outputs if b is not None])
        # k rounds of selection: round r picks the best element ordered after the previous pick
        # (value strictly worse, or equal value and higher index), so no scratch of size n.
        bv = kb.local(x.dtype, (1,), hint="bv")
        bi = kb.local(I64, (1,), hint="bi")
        pv = kb.local(x.dtype, (1,), hint="pv")
        pi = kb.local(I64, (1,), hint="pi")
        tk = kb.local(DType.bool, (1,), hint="take")
        with kb.loop(outer, hint="o") as o:
            with kb.loop(inner, hint="t") as t:
                base = o * (n * inner) + t
                obase = o * (k * inner) + t
                with kb.loop(k, hint="r") as r:
                    kb.store(bi, 0, as_expr(-1, I64))
                    kb.store(bv, 0, x.flat(base))
                    with kb.loop(n, hint="j") as j:
                        v = x.flat(base + j * inner)
                        after = (v < pv[0]) if largest else (v > pv[0])
                        after = r.eq(0) | after | (v.eq(pv[0]) & (j > pi[0]))
                        better = (v > bv[0]) if largest else (v < bv[0])
                        kb.store(tk, 0, after & (bi[0].eq(-1) | better))   # before bi/bv change
                        kb.store(bi, 0, select(tk[0], j, bi[0]))
                        kb.store(bv, 0, select(tk[0], v, bv[0]))
                    kb.store(pv, 0, bv[0])
                    kb.store(pi, 0, bi[0])
                    kb.store(vals, obase + r * inner, bv[0])
                    if idxs is not None:
                        kb.store(idxs, obase + r * inner, bi[0])

    def importer(ctx, proto, version):
        if version >= 10:
            return ctx.default_import(proto)
        attrs = ctx.attrs(proto)
        k = attrs.pop("k")
        ins = [ctx.value(proto.input[0]), ctx.builder.const(np.array([k], np.int64), "k")]
        return ctx.default_import(proto, inputs=ins, attrs=attrs)

    def flops(node):
        return float(node.inputs[0].type.numel) * max(_topk_k(node), 1)
