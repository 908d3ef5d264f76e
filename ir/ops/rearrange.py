"""Rearranging ops: DepthToSpace, SpaceToDepth, Trilu, ReverseSequence (ONNX operator spec,
opset 28 semantics). Each is one loop nest over the output loading from a computed input index."""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import I64, as_expr, select
from tensorfuse.ir.ops._common import norm_axis
from tensorfuse.ir.ops.shape import lower_index_map
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

INJ = OpPatternKind.INJECTIVE


# ----------------------------------------------------------------------------- Depth/Space
def _blocks(node, shape, to_space: bool):
    if len(shape) != 4:
        raise ShapeError(f"input must be 4-D (N, C, H, W), it has rank {len(shape)}")
    bs = node.attr("blocksize", None)
    if bs is None or int(bs) < 1:
        raise ShapeError(f"blocksize must be given and >= 1, got {bs}")
    bs = int(bs)
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ShapeError(f"mode {mode!r} is not DCR or CRD")
    n, c, h, w = shape
    if to_space:
        if c % (bs * bs):
            raise ShapeError(f"channels {c} are not divisible by blocksize^2 = {bs * bs}")
        return bs, mode, (n, c // (bs * bs), h * bs, w * bs)
    if h % bs or w % bs:
        raise ShapeError(f"spatial dims {h}x{w} are not divisible by blocksize {bs}")
    return bs, mode, (n, c * bs * bs, h // bs, w // bs)


def np_depth_to_space(x, bs, mode):
    b, c, h, w = x.shape
    if mode == "DCR":
        t = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(t.reshape(b, c // (bs * bs), h * bs, w * bs))


def np_space_to_depth(x, bs, mode):
    b, c, h, w = x.shape
    t = x.reshape(b, c, h // bs, bs, w // bs, bs)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(t.reshape(b, c * bs * bs, h // bs, w // bs))


@op("DepthToSpace", INJ, quant_passthrough="copy")
class DepthToSpace:
    """DepthToSpace(input) -> [N, C/bs^2, H*bs, W*bs]: depth moved into spatial blocks.

    mode DCR (default): channel = (i*bs + j) * C' + c; CRD: channel = c*bs^2 + i*bs + j, for the
    output pixel (h*bs + i, w*bs + j). Any dtype; 4-D input. Raises ShapeError for another rank
    or channels not divisible by bs^2. ONNX spec: DepthToSpace-13 (CRD since 11).
    """

    def infer(node):
        x = node.inputs[0]
        return [TensorType(x.dtype, _blocks(node, x.shape, True)[2])]

    def reference(node, ins):
        bs, mode, _ = _blocks(node, ins[0].shape, True)
        return [np_depth_to_space(ins[0], bs, mode)]

    def lower(ctx):
        bs, mode, (_, cq, _, _) = _blocks(ctx.node, ctx.inputs[0].shape, True)

        def src(idx):
            b, c, hh, ww = idx
            i, j = hh % bs, ww % bs
            ch = (i * bs + j) * cq + c if mode == "DCR" else c * (bs * bs) + i * bs + j
            return [b, ch, hh // bs, ww // bs]
        lower_index_map(ctx, src)


@op("SpaceToDepth", INJ, quant_passthrough="copy")
class SpaceToDepth:
    """SpaceToDepth(input) -> [N, C*bs^2, H/bs, W/bs]: spatial blocks moved into depth, the
    inverse of DepthToSpace with the same ``mode`` (DCR default; CRD since 28). Any dtype; 4-D
    input. Raises ShapeError for another rank or H, W not divisible by bs. ONNX spec:
    SpaceToDepth-28.
    """

    def infer(node):
        x = node.inputs[0]
        return [TensorType(x.dtype, _blocks(node, x.shape, False)[2])]

    def reference(node, ins):
        bs, mode, _ = _blocks(node, ins[0].shape, False)
        return [np_space_to_depth(ins[0], bs, mode)]

    def lower(ctx):
        bs, mode, _ = _blocks(ctx.node, ctx.inputs[0].shape, False)
        c_in = ctx.inputs[0].shape[1]

        def src(idx):
            b, ch, hh, ww = idx
            if mode == "DCR":
                blk, c = ch // c_in, ch % c_in
            else:
                c, blk = ch // (bs * bs), ch % (bs * bs)
            return [b, c, hh * bs + blk // bs, ww * bs + blk % bs]
        lower_index_map(ctx, src)


# ----------------------------------------------------------------------------- Trilu
@op("Trilu", INJ)
class Trilu:
    """Trilu(input, k?) -> the upper (upper=1, default: keep j - i >= k) or lower (keep
    j - i <= k) triangle of the last two dims; other elements 0. k: int64 scalar, may be computed
    at run time (default 0). Any dtype, rank >= 2. ONNX spec: Trilu-14.
    """

    def infer(node):
        x = node.inputs[0]
        if x.type.rank < 2:
            raise ShapeError(f"input must have rank >= 2, it has {x.type.rank}")
        k = node.input(1)
        if k is not None and (k.dtype != DType.i64 or k.type.numel != 1):
            raise ShapeError(f"k must be one int64 element, got {k.type}")
        return [x.type]

    def reference(node, ins):
        x = ins[0]
        k = int(np.asarray(ins[1]).reshape(())) if len(ins) > 1 and ins[1] is not None else 0
        f = np.triu if node.attr("upper", 1) else np.tril
        return [f(x, k).astype(x.dtype)]

    def lower(ctx):
        x = ctx.inputs[0]
        kbuf = ctx.inputs[1] if len(ctx.inputs) > 1 else None
        y = ctx.outputs[0]
        upper = bool(ctx.attr("upper", 1))
        known = ctx.const(1)
        kb = ctx.kernel(params=[x] + ([kbuf] if kbuf is not None and known is None else []) + [y])
        if y.numel == 0:
            return
        if kbuf is None:
            k = as_expr(0, I64)
        elif known is not None:
            k = as_expr(int(np.asarray(known).reshape(())), I64)
        else:
            k = kbuf.flat(0)
        zero = as_expr(0, y.dtype) if y.dtype != DType.bool else as_expr(False, DType.bool)
        with kb.grid(y.shape) as idx:
            d = idx[-1] - idx[-2]
            keep = (d >= k) if upper else (d <= k)
            kb.store(y, idx, select(keep, x[idx], zero))


# ----------------------------------------------------------------------------- ReverseSequence
def _rs_axes(node, x, lens):
    if x.type.rank < 2:
        raise ShapeError(f"input must have rank >= 2, it has {x.type.rank}")
    t = norm_axis(node.attr("time_axis", 0), x.type.rank, "time_axis")
    b = norm_axis(node.attr("batch_axis", 1), x.type.rank, "batch_axis")
    if t == b or t > 1 or b > 1:
        raise ShapeError(f"time_axis ({t}) and batch_axis ({b}) must be 0 and 1 in some order")
    if lens.type.rank != 1 or lens.shape[0] != x.shape[b]:
        raise ShapeError(f"sequence_lens must be 1-D of length {x.shape[b]} (the batch dim), got {lens.type}")
    return t, b


@op("ReverseSequence", INJ)
class ReverseSequence:
    """ReverseSequence(input, sequence_lens) -> for each batch index n, the first
    sequence_lens[n] elements along time_axis reversed, the rest copied.

    input: any dtype, rank >= 2; time_axis/batch_axis: 0 and 1 (either order); sequence_lens:
    int64 [batch] (read at run time; values are clamped into [0, T]). ONNX spec:
    ReverseSequence-10.
    """

    def infer(node):
        x, lens = node.inputs[:2]
        if lens.dtype not in (DType.i64, DType.i32):
            raise ShapeError(f"sequence_lens must be int64, got {lens.dtype}")
        _rs_axes(node, x, lens)
        return [x.type]

    def reference(node, ins):
        x, lens = ins
        t, b = _rs_axes(node, node.inputs[0], node.inputs[1])
        y = x.copy()
        for n in range(x.shape[b]):
            L = int(lens[n])
            sl = [slice(None)] * x.ndim
            sl[b] = n
            sl[t] = slice(0, L)
            src = list(sl)
            src[t] = slice(L - 1, None, -1) if L > 0 else slice(0, 0)
            y[tuple(sl)] = x[tuple(src)]
        return [y]

    def lower(ctx):
        x, lens = ctx.inputs
        y = ctx.outputs[0]
        t, b = _rs_axes(ctx.node, ctx.node.inputs[0], ctx.node.inputs[1])
        T = x.shape[t]
        kb = ctx.kernel()
        if y.numel == 0:
            return
        with kb.grid(y.shape) as idx:
            L = lens.flat(idx[b]).cast(I64)
            L = select(L < 0, 0, select(L > T, T, L))
            i = idx[t]
            src = list(idx)
            src[t] = select(i < L, L - 1 - i, i)
            kb.store(y, idx, x[src])
