"""Indexing ops: Gather (ONNX operator spec, opset 28 semantics).

Indices are read at run time. ONNX makes an out-of-range index an error; a compiled kernel
cannot raise, so after wrapping negative indices (i + dim) the kernels clamp indices into
[0, dim-1] to stay memory-safe. The numpy references raise IndexError instead.
"""
from __future__ import annotations

import numpy as np

from ir.kernel import I64, Expr, select
from ir.ops._common import norm_axis
from ir.registry import OpPatternKind, ShapeError, op
from ir.types import DType, TensorType

INJ = OpPatternKind.INJECTIVE
INDEX_DTYPES = (DType.i32, DType.i64)


def check_index_dtype(v, what: str = "indices", allowed=INDEX_DTYPES) -> None:
    if v.dtype not in allowed:
        raise ShapeError(f"{what} must be {' or '.join(d.value for d in allowed)}, got {v.dtype.value}")


def wrap_index(k: Expr, dim: int) -> Expr:
    """An index read at run time as i64: negative counts from the back, then clamped to
    [0, dim-1] (out-of-range indices are an ONNX error; clamping keeps the kernel in bounds)."""
    k = k.cast(I64)
    k = select(k < 0, k + dim, k)
    return select(k < 0, 0, select(k > dim - 1, dim - 1, k))


def np_wrap(idx: np.ndarray, dim: int, what: str = "index") -> np.ndarray:
    """Negative indices + dim; IndexError naming the first out-of-range index."""
    idx = np.asarray(idx).astype(np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if bad.any():
        raise IndexError(f"{what} {int(idx[bad].ravel()[0])} is out of range for a dimension of size {dim}")
    return np.where(idx < 0, idx + dim, idx)


@op("Gather", INJ)
class Gather:
    """Gather(data, indices) -> data indexed along ``axis`` (default 0) by indices.

    data: any dtype, rank r >= 1; indices: int32/int64 of any rank q (negative values count
    from the back). Output: data.shape[:axis] + indices.shape + data.shape[axis+1:], data's
    dtype. Raises ShapeError for a scalar data input, a bad axis or index dtype.
    ONNX spec: Gather-13.
    """

    def infer(node):
        data, ind = node.inputs[0], node.inputs[1]
        check_index_dtype(ind)
        if data.type.rank == 0:
            raise ShapeError("data must have rank >= 1")
        a = norm_axis(node.attr("axis", 0), data.type.rank)
        return [TensorType(data.dtype, data.shape[:a] + ind.shape + data.shape[a + 1:])]

    def reference(node, ins):
        data, ind = ins
        a = norm_axis(node.attr("axis", 0), data.ndim)
        return [np.take(data, np_wrap(ind, data.shape[a]), axis=a)]

    def lower(ctx):
        data, ind = ctx.inputs
        y = ctx.outputs[0]
        a = norm_axis(ctx.attr("axis", 0), len(data.shape))
        q = len(ind.shape)
        kb = ctx.kernel()
        if y.numel == 0:
            return
        with kb.grid(y.shape) as idx:
            k = wrap_index(ind[idx[a:a + q]] if q else ind.flat(0), data.shape[a])
            kb.store(y, idx, data[idx[:a] + [k] + idx[a + q:]])
