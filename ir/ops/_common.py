"""Helpers shared by op definitions: inference, references and lowering building blocks."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from tensorfuse.ir.kernel import Buffer, Const, Expr, KernelBuilder, as_expr
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.registry import ShapeError
from tensorfuse.ir.types import DType, TensorType


# ----------------------------------------------------------------------------- inference
def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """Numpy (multidirectional) broadcasting; raises ShapeError when shapes do not broadcast."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def present(node):
    return [v for v in node.inputs if v is not None]


def infer_same(node) -> list[TensorType]:
    """Output 0 has input 0's type."""
    return [node.inputs[0].type]


def infer_broadcast(node, out_dtype: DType | None = None) -> list[TensorType]:
    """Output shape broadcasts all present inputs; dtype is input 0's (or ``out_dtype``)."""
    ins = present(node)
    dts = {v.dtype for v in ins}
    if len(dts) > 1:
        raise ShapeError(f"inputs have different dtypes: {sorted(d.value for d in dts)}")
    return [TensorType(out_dtype or ins[0].dtype, broadcast_shapes(*[v.shape for v in ins]))]


#: the float dtypes of ONNX (tensor(float16), tensor(bfloat16), tensor(float), tensor(double))
FLOAT_DTYPES = (DType.f16, DType.bf16, DType.f32, DType.f64)


def check_float(v, what: str, allowed: Sequence[DType] = FLOAT_DTYPES) -> None:
    """Raise ShapeError unless the value ``v``'s dtype is one of ``allowed`` (the op's type
    constraint, default every float dtype): "X has dtype i32; only f16, f32 and f64 are allowed"."""
    if v.dtype not in allowed:
        names = [d.value for d in allowed]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        raise ShapeError(f"{what} has dtype {v.dtype}; only {listed} {'is' if len(names) == 1 else 'are'} allowed")


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def const_input(node, i: int, what: str) -> np.ndarray | None:
    """The compile-time value of input i; ShapeError if the input is given but not known."""
    v = node.input(i)
    if v is None:
        return None
    a = v.const_value()
    if a is None:
        raise ShapeError(f"input {i} ({what}) must be known at compile time (a constant or computed "
                         f"from static shapes), but '{v.name}' is computed at run time", needs_value=v.name)
    return a


def erf_np(x: np.ndarray) -> np.ndarray:
    """The error function on an array, in x's dtype: scipy.special.erf where scipy is
    installed, else math.erf element by element (as exact, slower). tensorfuse does not
    depend on scipy."""
    try:
        from scipy.special import erf
        return np.asarray(erf(x)).astype(x.dtype, copy=False)
    except ImportError:
        return np.vectorize(math.erf, otypes=[x.dtype])(x)


# ----------------------------------------------------------------------------- lowering
#: element types a flat elementwise loop computes in explicit vectors on a CPU target (see
#: :func:`flat_vector_loop`); others (bool, f16, 64-bit, the small ints of other ops) keep the
#: scalar loop that LLVM may vectorise itself
VECTOR_LOOP_DTYPES = (DType.f32, DType.i32, DType.u8, DType.i8)


def flat_vector_loop(ctx: LowerCtx, kb: KernelBuilder, numel: int, dtypes, body) -> None:
    """A flat loop over ``numel`` elements calling ``body(i, lanes)`` per step: on a CPU target,
    when every dtype in ``dtypes`` is one of :data:`VECTOR_LOOP_DTYPES`, in explicit vectors of
    the target's f32 lanes (``i`` the first element, ``lanes`` > 1: the body loads and stores
    ``lanes`` contiguous elements, so exp/erf/tanh run as vector code) plus a scalar tail;
    otherwise one ``vectorize`` loop of single elements (``lanes`` = 1). The vector loop is a
    spatial loop that ``default_schedule`` makes parallel."""
    tgt = ctx.target
    lanes = tgt.lanes(DType.f32) if not tgt.simt else 1
    if lanes <= 1 or numel < lanes or any(d not in VECTOR_LOOP_DTYPES for d in dtypes):
        with kb.loop(numel, kind="vectorize", role="spatial") as i:
            body(i, 1)
        return
    main = numel - numel % lanes
    with kb.loop(main // lanes, role="spatial", hint="v") as v:
        body(v * lanes, lanes)
    if main < numel:
        with kb.loop(numel, start=main, kind="vectorize", role="spatial", hint="t") as i:
            body(i, 1)


def lower_elementwise(ctx: LowerCtx, fn: Callable[..., Expr], inputs: Sequence[int] | None = None) -> None:
    """One kernel: out[idx] = fn(*loads) with numpy broadcasting of every present input.

    ``fn`` gets one Expr per input (None inputs skipped unless listed in ``inputs``).
    When no input broadcasts, the loop is flat over all elements, in explicit vectors where
    :func:`flat_vector_loop` allows.
    """
    out = ctx.outputs[0]
    bufs = [b for b in ctx.inputs if b is not None] if inputs is None else [ctx.inputs[i] for i in inputs]
    kb = ctx.kernel()
    if all(b is None or b.shape == out.shape for b in bufs):
        def body(i, lanes):
            loads = [None if b is None else (b.vload(i, lanes) if lanes > 1 else b.flat(i)) for b in bufs]
            kb.store(out, i, as_expr(fn(*loads), out.dtype))
        flat_vector_loop(ctx, kb, out.numel, [out.dtype] + [b.dtype for b in bufs if b is not None], body)
        return
    with kb.grid(out.shape) as idx:
        kb.store(out, idx, as_expr(fn(*[None if b is None else b.bcast(idx) for b in bufs]), out.dtype))


def lower_copy(ctx: LowerCtx, src: int = 0, dst: int = 0) -> None:
    """Flat element copy (Reshape, Flatten, Squeeze, Identity ...: same row-major data)."""
    a, y = ctx.inputs[src], ctx.outputs[dst]
    kb = ctx.kernel(params=[a, y])
    with kb.loop(y.numel, kind="vectorize", role="spatial") as i:
        kb.store(y, i, a.flat(i))


def lower_known(ctx: LowerCtx) -> None:
    """Write outputs whose values are known at compile time (Shape, Size ...) as constants."""
    for v, b in zip(ctx.node.outputs, ctx.outputs):
        data = v.const_value()
        if data is None:
            raise ShapeError(f"output {v.name} is not known at compile time")
        kb = ctx.kernel(params=[b])
        for i, x in enumerate(np.asarray(data).ravel().tolist()):
            kb.store(b, i, as_expr(x, b.dtype))


def lanes_tree(kb: KernelBuilder, buf: Buffer, off, n: int, op: Callable[[Expr, Expr], Expr]) -> Expr:
    """The ``n`` lanes ``buf[off : off + n]`` combined with ``op`` (maximum, +) in a tree: the
    upper half into the lower half as vectors of n/2 lanes, then n/4, ... down to ``buf[off]``,
    log2(n) dependent steps where a left-to-right chain takes n - 1 (a 16-lane row sum: 4 steps,
    not 15 additions each waiting for the last). ``n`` not a power of two: the chain. The lanes
    are overwritten; returns ``buf[off]`` (read where the expression is used, so use it before
    ``buf`` is written again). The order of a sum differs from the chain's (float rounding)."""
    if n & (n - 1):
        total = buf[off]
        for ln in range(1, n):
            total = op(total, buf[off + ln])
        return total
    h = n // 2
    while h >= 1:
        if h == 1:
            kb.store(buf, off, op(buf[off], buf[off + 1]))
        else:
            kb.store(buf, off, op(buf.vload(off, h), buf.vload(off + h, h)))
        h //= 2
    return buf[off]
