"""Unique, Col2Im and TensorScatter (ONNX operator spec, sections "Unique" (Unique-11),
"Col2Im" (Col2Im-18) and "TensorScatter" (TensorScatter-24)), and the ai.onnx.ml ops Binarizer and
ArrayFeatureExtractor (ONNX-ML operator spec).

Unique's output shapes depend on the values of X: X must be known at compile time (a graph
input is specialised on by ``compiler.compile``; an X computed at run time inside the graph is
refused with "the output shape depends on data"), see ``ir/ops/detection.py``. Col2Im's
image_shape and block_shape decide its output shape and must be known at compile time too.
TensorScatter reads its write indices at run time.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import as_expr, maximum, minimum, select
from tensorfuse.ir.ops._common import const_input, norm_axis
from tensorfuse.ir.ops.conv import conv_pads, flat_offset, ints_attr
from tensorfuse.ir.ops.detection import data_input, lower_data_dependent
from tensorfuse.ir.registry import OpPatternKind, ShapeError, onnx_attr_specs, op
from tensorfuse.ir.types import DType, TensorType


# ----------------------------------------------------------------------------- Unique
def unique_reference(x: np.ndarray, axis: int | None, sorted_: bool):
    """(Y, indices, inverse_indices, counts) of ONNX Unique: numpy.unique's results, and for
    sorted=0 the unique values (or slices along ``axis``) in order of first occurrence."""
    x = np.asarray(x)
    src = x.ravel() if axis is None else x
    ax = 0 if axis is None else axis
    y, idx, inv, cnt = np.unique(src, return_index=True, return_inverse=True, return_counts=True,
                                 axis=None if axis is None else axis)
    inv = np.asarray(inv).reshape(-1)
    if not sorted_:
        order = np.argsort(idx, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
        y = np.take(src, idx, axis=ax)
    return [y.astype(x.dtype), idx.astype(np.int64), inv.astype(np.int64), cnt.astype(np.int64)]


def _unique_axis(node, rank: int) -> int | None:
    axis = node.attr("axis", None)
    if axis is None:
        return None
    if rank == 0:
        raise ShapeError("axis is given but X is a scalar")
    return norm_axis(int(axis), rank)


@op("Unique", OpPatternKind.OPAQUE)
class Unique:
    """Unique(X) -> Y, indices?, inverse_indices?, counts?: the unique elements of X flattened
    (or, with ``axis``, the unique slices along axis), ascending (sorted=1, the default,
    lexicographic for slices) or in order of first occurrence (sorted=0).

    X: any numeric or bool dtype, any rank. Y: X's dtype, [num_unique] (flattened) or X's shape
    with dim ``axis`` = num_unique; indices (first occurrence in X, flattened or along axis),
    inverse_indices (X's element/slice -> its index in Y) and counts: int64 1-D. Output shapes
    depend on X's values, so X must be known at compile time (graph inputs are specialised on;
    an X computed at run time raises ShapeError "the output shape depends on data"). Raises
    ShapeError for a bad axis or string X. ONNX spec: Unique-11.
    """

    def infer(node):
        x = node.inputs[0]
        axis = _unique_axis(node, x.type.rank)
        if int(node.attr("sorted", 1)) not in (0, 1):
            raise ShapeError(f"sorted must be 0 or 1, got {node.attr('sorted')}")
        outs = unique_reference(data_input(node, 0, "X"), axis, bool(node.attr("sorted", 1)))
        return [TensorType(x.dtype, outs[0].shape)] + [TensorType(DType.i64, o.shape) for o in outs[1:]]

    def reference(node, ins):
        x = np.asarray(ins[0])
        return unique_reference(x, _unique_axis(node, x.ndim), bool(node.attr("sorted", 1)))

    lower = lower_data_dependent


# ----------------------------------------------------------------------------- Col2Im
def _col2im_plan(node, shape, image, block):
    """(spatial rank, strides, dilations, pads, blocks per dim, channels) for Col2Im."""
    if len(shape) != 3:
        raise ShapeError(f"input must be [N, C * prod(block_shape), L], got {list(shape)}")
    image = [int(v) for v in np.asarray(image).ravel()]
    block = [int(v) for v in np.asarray(block).ravel()]
    nsp = len(image)
    if nsp == 0 or len(block) != nsp:
        raise ShapeError(f"image_shape {image} and block_shape {block} must be non-empty and of equal length")
    if any(v <= 0 for v in image + block):
        raise ShapeError(f"image_shape {image} and block_shape {block} must be positive")
    strides = ints_attr(node, "strides", nsp, 1)
    dil = ints_attr(node, "dilations", nsp, 1)
    pads = conv_pads(node, nsp)
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dil):
        raise ShapeError(f"strides {strides} and dilations {dil} must be positive")
    nb = [(image[d] + pads[d] + pads[d + nsp] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1
          for d in range(nsp)]
    if any(v <= 0 for v in nb):
        raise ShapeError(f"the dilated block {block} does not fit the padded image {image} (blocks per dim {nb})")
    taps = math.prod(block)
    if shape[1] % taps:
        raise ShapeError(f"input dim 1 ({shape[1]}) is not divisible by prod(block_shape) = {taps}")
    if shape[2] != math.prod(nb):
        raise ShapeError(f"input dim 2 ({shape[2]}) must be the number of blocks {' * '.join(map(str, nb))} "
                         f"= {math.prod(nb)}")
    return nsp, image, block, strides, dil, pads, nb, shape[1] // taps


def _acc_dtype(dt: DType) -> DType:
    return DType.f32 if dt in (DType.f16, DType.bf16) else dt


@op("Col2Im", OpPatternKind.INJECTIVE)
class Col2Im:
    """Col2Im(input, image_shape, block_shape) -> output [N, C, *image_shape]: the inverse of
    im2col; each column block is added back at its sliding-window position (overlaps sum).

    input: [N, C * prod(block_shape), L] with L the number of blocks, enumerated row-major;
    image_shape, block_shape: int64 1-D of the spatial rank, known at compile time (they decide
    the output shape); attributes strides, dilations (default 1) and pads ([begin..., end...],
    default 0) per spatial dim. Any numeric dtype (f16/bf16 accumulate in f32). Raises
    ShapeError when L or dim 1 do not match the geometry, or for bad attributes.
    ONNX spec: Col2Im-18.
    """

    def infer(node):
        x = node.inputs[0]
        if x.dtype == DType.bool:
            raise ShapeError("input must be numeric, got bool")
        for i, what in ((1, "image_shape"), (2, "block_shape")):
            if node.inputs[i].dtype != DType.i64:
                raise ShapeError(f"{what} must be int64, got {node.inputs[i].dtype.value}")
        image = const_input(node, 1, "image_shape")
        block = const_input(node, 2, "block_shape")
        _, image, _, _, _, _, _, c = _col2im_plan(node, x.shape, image, block)
        return [TensorType(x.dtype, (x.shape[0], c, *image))]

    def reference(node, ins):
        x = np.asarray(ins[0])
        nsp, image, block, strides, dil, pads, nb, c = _col2im_plan(node, x.shape, ins[1], ins[2])
        adt = _acc_dtype(DType.from_numpy(x.dtype)).numpy
        n = x.shape[0]
        padded = [image[d] + pads[d] + pads[d + nsp] for d in range(nsp)]
        out = np.zeros((n, c, *padded), adt)
        cols = x.astype(adt).reshape(n, c, math.prod(block), *nb)
        for t, k in enumerate(np.ndindex(*block)):
            sl = tuple(slice(k[d] * dil[d], k[d] * dil[d] + (nb[d] - 1) * strides[d] + 1, strides[d])
                       for d in range(nsp))
            out[(slice(None), slice(None)) + sl] += cols[:, :, t]
        crop = tuple(slice(pads[d], pads[d] + image[d]) for d in range(nsp))
        return [out[(slice(None), slice(None)) + crop].astype(x.dtype)]

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        nsp, image, block, strides, dil, pads, nb, c = _col2im_plan(ctx.node, x.shape, ctx.const(1), ctx.const(2))
        adt = _acc_dtype(x.dtype)
        n = x.shape[0]
        kb = ctx.kernel(params=[x, y])
        acc = kb.local(adt, (1,))
        # gather form: each output pixel sums the taps that land on it, in tap order
        with kb.loop(n * c, kind="parallel", hint="nc") as nc:
            with kb.grid(image) as px:
                kb.store(acc, 0, as_expr(0, adt))
                with kb.grid(block) as k:
                    ok, q = None, []
                    for d in range(nsp):
                        t = px[d] + (pads[d] - k[d] * dil[d])
                        qd = t / strides[d] if strides[d] > 1 else t
                        cond = (t >= 0) & (qd < nb[d])
                        if strides[d] > 1:
                            cond = cond & (t % strides[d]).eq(0)
                        ok = cond if ok is None else ok & cond
                        q.append(qd)
                    row = (nc % c) * math.prod(block) + flat_offset(block, k)
                    src = flat_offset(x.shape, [nc / c, row, flat_offset(nb, q)])
                    with kb.if_(ok):
                        kb.store(acc, 0, acc[0] + x.flat(src).cast(adt))
                kb.store(y, flat_offset(y.shape, [nc / c, nc % c, *px]), acc[0].cast(y.dtype))


# ----------------------------------------------------------------------------- TensorScatter
def _scatter_axis(node, past, update, wi) -> int:
    rank = len(past.shape)
    if rank < 2:
        raise ShapeError(f"past_cache must have rank >= 2 (batch and sequence dims), got {list(past.shape)}")
    axis = norm_axis(int(node.attr("axis", -2)), rank)
    if axis == 0:
        raise ShapeError("axis must not be 0 (the batch dimension)")
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ShapeError(f"mode must be 'linear' or 'circular', got {mode!r}")
    if len(update.shape) != rank or any(a != b for d, (a, b) in enumerate(zip(past.shape, update.shape))
                                        if d != axis) or update.shape[axis] > past.shape[axis]:
        raise ShapeError(f"update {list(update.shape)} must match past_cache {list(past.shape)} except in "
                         f"dim {axis}, where it may not be longer")
    if wi is not None and tuple(wi.shape) != (past.shape[0],):
        raise ShapeError(f"write_indices must have shape [{past.shape[0]}] (one per batch), got {list(wi.shape)}")
    return axis


@op("TensorScatter", OpPatternKind.INJECTIVE)
class TensorScatter:
    """TensorScatter(past_cache, update, write_indices?) -> present_cache: past_cache with
    update written along ``axis`` (default -2, never 0) from write_indices[b] on, per batch b.

    past_cache: any dtype, [B, D1, ..., max_sequence_length (at axis), ..., Dn]; update: the
    same shape except sequence_length <= max_sequence_length at axis; write_indices: int64 [B]
    read at run time (absent: zeros). mode "linear" writes at write_index + i (ONNX requires it
    to stay below max_sequence_length; the kernel skips rows outside, the numpy reference raises
    IndexError), "circular" at (write_index + i) mod max_sequence_length. Output: past_cache's
    type. Raises ShapeError for mismatched shapes, axis 0 or an unknown mode.
    ONNX spec: TensorScatter-24.
    """

    def infer(node):
        past, update, wi = node.inputs[0], node.inputs[1], node.input(2)
        if update.dtype != past.dtype:
            raise ShapeError(f"update has dtype {update.dtype.value}, past_cache {past.dtype.value}; they must match")
        if wi is not None and wi.dtype != DType.i64:
            raise ShapeError(f"write_indices must be int64, got {wi.dtype.value}")
        _scatter_axis(node, past, update, wi)
        return [past.type]

    def reference(node, ins):
        past, update = np.asarray(ins[0]), np.asarray(ins[1])
        wi = ins[2] if len(ins) > 2 else None
        axis = _scatter_axis(node, past, update, wi)
        m, s = past.shape[axis], update.shape[axis]
        out = past.copy()
        for b in range(past.shape[0]):
            pos = (0 if wi is None else int(wi[b])) + np.arange(s)
            if node.attr("mode", "linear") == "circular":
                pos = pos % m
            elif s and (pos[0] < 0 or pos[-1] >= m):
                raise IndexError(f"write index {pos[0]} + sequence length {s} is outside [0, {m}] (batch {b})")
            view = out[b]      # a view: the one index array then keeps its place
            view[(slice(None),) * (axis - 1) + (pos,)] = update[b]
        return [out]

    def lower(ctx):
        past, update, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        wi = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        axis = _scatter_axis(ctx.node, past, update, wi)
        m = past.shape[axis]
        circular = ctx.attr("mode", "linear") == "circular"
        kb = ctx.kernel()
        with kb.loop(y.numel, kind="vectorize") as i:
            kb.store(y, i, past.flat(i))
        if update.numel == 0:
            return
        with kb.grid(update.shape) as idx:
            t = idx[axis] if wi is None else wi.flat(idx[0]) + idx[axis]
            dst = list(idx)
            if circular:
                dst[axis] = (t % m + m) % m
                kb.store(y, dst, update[idx])
            else:
                dst[axis] = t
                with kb.if_((t >= 0) & (t < m)):
                    kb.store(y, dst, update[idx])


# ----------------------------------------------------------------------------- ai.onnx.ml
ML = "ai.onnx.ml"
ML_TYPES = (DType.f32, DType.f64, DType.i64, DType.i32)


def _check_ml_type(v, what: str) -> None:
    if v.dtype not in ML_TYPES:
        raise ShapeError(f"{what} must be float, double, int64 or int32, got {v.dtype.value}")


def _binarizer_infer(node):
    _check_ml_type(node.inputs[0], "X")
    return [node.inputs[0].type]


@op("Binarizer", OpPatternKind.ELEMWISE, domain=ML, attrs=onnx_attr_specs("Binarizer", ML))
class Binarizer:
    """Y = 1 where X > threshold (attribute, default 0.0), else 0; X's dtype and shape.

    X: f32, f64, int64 or int32 (integers compare as f64 with the threshold). Raises ShapeError
    for other dtypes. ONNX-ML spec: ai.onnx.ml Binarizer-1.
    """

    infer = _binarizer_infer

    def reference(node, ins):
        x = np.asarray(ins[0])
        t = float(node.attr("threshold", 0.0))
        xs = x if x.dtype == np.float32 else x.astype(np.float64)
        return [(xs > (np.float32(t) if x.dtype == np.float32 else t)).astype(x.dtype)]

    def scalar(node, x):
        t = float(node.attr("threshold", 0.0))
        xs = x if x.dtype in (DType.f32, DType.f64) else x.cast(DType.f64)
        return select(xs > as_expr(t, xs.dtype), as_expr(1, x.dtype), as_expr(0, x.dtype))


@op("ArrayFeatureExtractor", OpPatternKind.INJECTIVE, domain=ML, attrs={})
class ArrayFeatureExtractor:
    """ArrayFeatureExtractor(X, Y) -> Z: the elements of X's last axis at the indices Y.

    X: f32, f64, int64 or int32 [..., D]; Y: int64 indices of any shape (flattened), read at
    run time (an index outside [0, D) is an ONNX error: the numpy reference raises IndexError,
    the kernel clamps to stay in bounds). Z: X.shape[:-1] + [Y.size] (for 1-D X: [1, Y.size],
    as onnxruntime). Raises ShapeError for bad dtypes or a scalar X. ONNX-ML spec: ai.onnx.ml
    ArrayFeatureExtractor-1.
    """

    def infer(node):
        x, y = node.inputs[0], node.inputs[1]
        _check_ml_type(x, "X")
        if y.dtype != DType.i64:
            raise ShapeError(f"Y must be int64, got {y.dtype.value}")
        if x.type.rank == 0:
            raise ShapeError("X must have rank >= 1")
        pre = x.shape[:-1] if x.type.rank > 1 else (1,)
        return [TensorType(x.dtype, (*pre, y.type.numel))]

    def reference(node, ins):
        x, y = np.asarray(ins[0]), np.asarray(ins[1]).ravel()
        d = x.shape[-1]
        if ((y < 0) | (y >= d)).any():
            raise IndexError(f"index {int(y[(y < 0) | (y >= d)][0])} is out of range for the last axis of size {d}")
        z = x[..., y]
        return [z.reshape(1, -1) if x.ndim == 1 else z]

    def lower(ctx):
        x, y = ctx.inputs
        z = ctx.outputs[0]
        d = x.shape[-1]
        kb = ctx.kernel()
        if z.numel == 0:
            return
        with kb.grid(z.shape) as idx:
            k = maximum(minimum(y.flat(idx[-1]), d - 1), 0)
            pre = idx[:-1] if len(x.shape) > 1 else []
            kb.store(z, idx, x[[*pre, k]])
