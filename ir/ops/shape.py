"""Shape ops and pure data movement: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand,
Tile, Shape, Size (ONNX operator spec, "Operators" section of each op, opset 28 semantics).

Reshape-like ops (the row-major data is unchanged) lower to a flat copy; the others lower to one
loop nest over the output where each element is loaded from an input index computed from the
output index (``lower_index_map``). Shape and Size have outputs that follow from the static input
type alone: they are known at compile time (``OpDef.known``) and lower to constant stores.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tensorfuse.ir.kernel import Const, Expr, I64
from tensorfuse.ir.ops._common import broadcast_shapes, const_input, lower_copy, lower_known, norm_axis
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

INJ = OpPatternKind.INJECTIVE


# ----------------------------------------------------------------------------- helpers
def ints(a) -> list[int]:
    """A compile-time array (or list) as a list of Python ints."""
    return [int(x) for x in np.asarray(a).ravel().tolist()]


def prod(xs: Sequence[int]) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def lower_index_map(ctx, fn: Callable[[list], list], src: int = 0, dst: int = 0) -> None:
    """One kernel: ``out[idx] = in[fn(idx)]``; ``fn`` maps output index Vars to input index Exprs.

    The innermost loop runs over the output's last (contiguous) dimension.
    """
    x, y = ctx.inputs[src], ctx.outputs[dst]
    kb = ctx.kernel(params=[x, y])
    if y.numel == 0:
        return
    with kb.grid(y.shape) as idx:
        kb.store(y, idx, x[fn(idx)] if x.shape else x.flat(0))


def reshape_index(in_shape: Sequence[int], out_shape: Sequence[int], out_idx: Sequence) -> list:
    """The index into ``in_shape`` of the element at ``out_idx`` of the same row-major data
    viewed as ``out_shape`` (the two have equal element counts): the ``index_map`` of the
    Reshape family. Dims other than 1 are matched in runs whose sizes multiply to the same
    count ([128,256] -> [128,4,64]: {128}->{128}, {256}->{4,64}); a run of one dim on each side
    is the same index, otherwise the run's offset is split with // and %, so the common
    reshapes (splitting or merging heads) need no division on the unchanged dims. Dims of size
    1 read index 0."""
    zero = Const(0, I64)
    if prod(in_shape) == 0:
        return [zero] * len(in_shape)
    ins = [a for a, d in enumerate(in_shape) if d != 1]
    outs = [a for a, d in enumerate(out_shape) if d != 1]
    res: list = [zero] * len(in_shape)
    i = j = 0
    while i < len(ins):
        I, O = [ins[i]], [outs[j]]
        pi, po = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while pi != po:
            if pi < po:
                I.append(ins[i]); pi *= in_shape[ins[i]]; i += 1
            else:
                O.append(outs[j]); po *= out_shape[outs[j]]; j += 1
        if len(I) == 1 and len(O) == 1:
            res[I[0]] = out_idx[O[0]]
            continue
        off = None
        for a in O:                       # the run's row-major offset in the output
            off = out_idx[a] if off is None else off * out_shape[a] + out_idx[a]
        stride = pi
        for k, a in enumerate(I):
            stride //= in_shape[a]
            q = off // stride if stride > 1 else off
            res[a] = q % in_shape[a] if k > 0 else q
    return res


def _reshape_map(node, out_idx) -> list:
    return reshape_index(node.inputs[0].shape, node.outputs[0].shape, out_idx)


def axes_list(node, axes, rank: int, what: str = "axes") -> list[int]:
    """Normalise a list of axes against ``rank``; ShapeError on out-of-range or repeated axes."""
    out = [norm_axis(a, rank, what) for a in ints(axes)]
    if len(set(out)) != len(out):
        raise ShapeError(f"{what} {ints(axes)} has repeated axes")
    return out


def import_axes_attr_as_input(ctx, proto, attr: str, position: int):
    """Older versions had ``attr`` (a list of ints) as an attribute; the IR takes it as input
    ``position`` (an int64 constant). Omitted attribute: omitted input."""
    attrs = ctx.attrs(proto)
    vals = attrs.pop(attr, None)
    ins = [ctx.value(n) for n in proto.input]
    ins += [None] * (position - len(ins))
    ins = ins[:position]
    ins.append(None if vals is None else ctx.builder.const(np.asarray(vals, dtype=np.int64), attr))
    return ctx.default_import(proto, inputs=ins, attrs=attrs)


# ----------------------------------------------------------------------------- Reshape family
def reshape_shape(in_shape: Sequence[int], shape: Sequence[int], allowzero: int) -> tuple[int, ...]:
    """The output shape of ONNX Reshape-21 (0 copies the input dim unless allowzero; one -1 is
    inferred). Raises ShapeError when the shape is invalid or the element count differs."""
    shape = ints(shape)
    numel = prod(in_shape)
    out, infer_at = [], None
    if allowzero and 0 in shape and -1 in shape:
        raise ShapeError(f"shape {shape} has both 0 and -1 with allowzero=1")
    for i, s in enumerate(shape):
        if s == -1:
            if infer_at is not None:
                raise ShapeError(f"shape {shape} has more than one -1")
            infer_at = i
            out.append(1)
        elif s == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeError(f"shape {shape}: 0 at position {i} copies a dimension the input "
                                 f"{list(in_shape)} does not have")
            out.append(int(in_shape[i]))
        elif s < 0:
            raise ShapeError(f"shape {shape} has an invalid dimension {s}")
        else:
            out.append(s)
    if infer_at is not None:
        rest = prod(out)
        if rest == 0 or numel % rest:
            raise ShapeError(f"cannot reshape {list(in_shape)} ({numel} elements) to {shape}: "
                             f"the -1 dimension cannot be inferred")
        out[infer_at] = numel // rest
    if prod(out) != numel:
        raise ShapeError(f"cannot reshape {list(in_shape)} ({numel} elements) to {shape} "
                         f"({prod(out)} elements)")
    return tuple(out)


@op("Reshape", INJ, const_inputs=(1,), reshape_only=True, quant_passthrough="copy")
class Reshape:
    """Reshape(data, shape) -> data with a new shape, same row-major elements.

    shape: int64 1-D, known at compile time; 0 copies the input dim (allowzero=0) or is a zero dim
    (allowzero=1); one -1 is inferred. Any dtype. Raises ShapeError for an invalid shape or a
    different element count. ONNX spec: Reshape-21 (Reshape-5..19 are allowzero=0).
    """

    def infer(node):
        x = node.inputs[0]
        shape = const_input(node, 1, "shape")
        if shape is None:
            raise ShapeError("the shape input is required")
        return [TensorType(x.dtype, reshape_shape(x.shape, shape, node.attr("allowzero", 0)))]

    def reference(node, ins):
        return [ins[0].reshape(reshape_shape(ins[0].shape, ins[1], node.attr("allowzero", 0)))]

    lower = lower_copy
    index_map = _reshape_map


def flatten_shape(shape: Sequence[int], axis: int) -> tuple[int, int]:
    r = len(shape)
    if not -r <= axis <= r:
        raise ShapeError(f"axis {axis} is out of range for rank {r} (must be in [{-r}, {r}])")
    axis = axis + r if axis < 0 else axis
    return prod(shape[:axis]), prod(shape[axis:])


@op("Flatten", INJ, reshape_only=True, quant_passthrough="copy")
class Flatten:
    """Flatten(input) -> 2-D [prod(dims[:axis]), prod(dims[axis:])], axis in [-r, r] (default 1).

    Any dtype. Raises ShapeError for an out-of-range axis. ONNX spec: Flatten-21.
    """

    def infer(node):
        x = node.inputs[0]
        return [TensorType(x.dtype, flatten_shape(x.shape, node.attr("axis", 1)))]

    def reference(node, ins):
        return [ins[0].reshape(flatten_shape(ins[0].shape, node.attr("axis", 1)))]

    lower = lower_copy
    index_map = _reshape_map


def squeeze_shape(shape: Sequence[int], axes) -> tuple[int, ...]:
    if axes is None:
        return tuple(d for d in shape if d != 1)
    ax = axes_list(None, axes, len(shape))
    for a in ax:
        if shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of shape {list(shape)}: its size is {shape[a]}, not 1")
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def _squeeze_import(ctx, proto, version):
    if version >= 13:
        return ctx.default_import(proto)
    return import_axes_attr_as_input(ctx, proto, "axes", 1)


@op("Squeeze", INJ, const_inputs=(1,), reshape_only=True, quant_passthrough="copy")
class Squeeze:
    """Squeeze(data, axes?) -> data without the listed size-1 axes (all size-1 axes if omitted).

    axes: int64 1-D, known at compile time, each in [-r, r-1]. Any dtype. Raises ShapeError
    if a listed axis is not of size 1, out of range or repeated. ONNX spec: Squeeze-21 (before
    13, axes is an attribute; the importer makes it an input).
    """

    def infer(node):
        x = node.inputs[0]
        return [TensorType(x.dtype, squeeze_shape(x.shape, const_input(node, 1, "axes")))]

    def reference(node, ins):
        return [ins[0].reshape(squeeze_shape(ins[0].shape, ins[1] if len(ins) > 1 else None))]

    importer = _squeeze_import
    lower = lower_copy
    index_map = _reshape_map


def unsqueeze_shape(shape: Sequence[int], axes) -> tuple[int, ...]:
    r = len(shape) + len(ints(axes))
    ax = axes_list(None, axes, r)
    it = iter(shape)
    return tuple(1 if i in ax else next(it) for i in range(r))


@op("Unsqueeze", INJ, const_inputs=(1,), reshape_only=True, quant_passthrough="copy")
class Unsqueeze:
    """Unsqueeze(data, axes) -> data with size-1 axes inserted at ``axes`` of the output.

    axes: int64 1-D, known at compile time, each in [-(r+k), r+k-1] for k axes. Any dtype.
    Raises ShapeError for out-of-range or repeated axes. ONNX spec: Unsqueeze-21 (before 13,
    axes is an attribute; the importer makes it an input).
    """

    def infer(node):
        x = node.inputs[0]
        axes = const_input(node, 1, "axes")
        if axes is None:
            raise ShapeError("the axes input is required")
        return [TensorType(x.dtype, unsqueeze_shape(x.shape, axes))]

    def reference(node, ins):
        return [ins[0].reshape(unsqueeze_shape(ins[0].shape, ins[1]))]

    importer = _squeeze_import
    lower = lower_copy
    index_map = _reshape_map


# ----------------------------------------------------------------------------- Transpose
def transpose_perm(node, rank: int) -> list[int]:
    perm = node.attr("perm", None)
    if perm is None or (len(perm) == 0 and rank > 0):
        return list(range(rank))[::-1]
    perm = [int(p) for p in perm]
    if sorted(p % rank if -rank <= p < rank else p for p in perm) != list(range(rank)):
        raise ShapeError(f"perm {perm} is not a permutation of the {rank} axes")
    return [p % rank for p in perm]


@op("Transpose", INJ, quant_passthrough="copy")
class Transpose:
    """Transpose(data) -> data with axes permuted: out.shape[i] = in.shape[perm[i]].

    perm defaults to the reversed axes. Any dtype. Raises ShapeError if perm is not a
    permutation of the input's axes. ONNX spec: Transpose-21.
    """

    def infer(node):
        x = node.inputs[0]
        perm = transpose_perm(node, x.type.rank)
        return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]

    def reference(node, ins):
        return [np.ascontiguousarray(np.transpose(ins[0], transpose_perm(node, ins[0].ndim)))]

    def index_map(node, out_idx):
        perm = transpose_perm(node, node.inputs[0].type.rank)
        inv = [perm.index(a) for a in range(len(perm))]
        return [out_idx[inv[a]] for a in range(len(perm))]

    def lower(ctx):
        # a backend schedule for the swaps of two axis groups (NCHW <-> NHWC): llvm's
        # ``codegen/llvm/schedules/transpose.py`` transposes blocks in registers
        perm = transpose_perm(ctx.node, len(ctx.inputs[0].shape))
        if dispatch("transpose", ctx, perm=perm) is not NO_SCHEDULE:
            return
        lower_index_map(ctx, lambda idx: Transpose.index_map(ctx.node, idx))


# ----------------------------------------------------------------------------- Expand / Tile
def _bcast_index(in_shape, out_idx) -> list:
    r = len(in_shape)
    idx = list(out_idx)[len(out_idx) - r:] if r else []
    return [Const(0, I64) if d == 1 else i for d, i in zip(in_shape, idx)]


@op("Expand", OpPatternKind.BROADCAST, const_inputs=(1,), quant_passthrough="copy")
class Expand:
    """Expand(input, shape) -> input broadcast to broadcast(input.shape, shape) (bidirectional:
    a 1 in ``shape`` keeps the input's dim).

    shape: int64 1-D, known at compile time. Any dtype. Raises ShapeError when the shapes do not
    broadcast. ONNX spec: Expand-13.
    """

    def infer(node):
        x = node.inputs[0]
        shape = const_input(node, 1, "shape")
        if shape is None:
            raise ShapeError("the shape input is required")
        if any(s < 0 for s in ints(shape)):
            raise ShapeError(f"shape {ints(shape)} has a negative dimension")
        return [TensorType(x.dtype, broadcast_shapes(x.shape, ints(shape)))]

    def reference(node, ins):
        out = broadcast_shapes(ins[0].shape, ints(ins[1]))
        return [np.ascontiguousarray(np.broadcast_to(ins[0], out))]

    def lower(ctx):
        shp = ctx.inputs[0].shape
        lower_index_map(ctx, lambda idx: _bcast_index(shp, idx))


def tile_shape(shape, repeats) -> tuple[int, ...]:
    reps = ints(repeats)
    if len(reps) != len(shape):
        raise ShapeError(f"repeats has {len(reps)} elements, the input has rank {len(shape)}")
    if any(r < 0 for r in reps):
        raise ShapeError(f"repeats {reps} has a negative value")
    return tuple(d * r for d, r in zip(shape, reps))


@op("Tile", INJ, const_inputs=(1,), quant_passthrough="copy")
class Tile:
    """Tile(input, repeats) -> input repeated repeats[i] times along axis i.

    repeats: int64 1-D of length rank, >= 0, known at compile time. Any dtype. Raises ShapeError
    for a wrong length or a negative repeat. ONNX spec: Tile-13.
    """

    def infer(node):
        x = node.inputs[0]
        return [TensorType(x.dtype, tile_shape(x.shape, const_input(node, 1, "repeats")))]

    def reference(node, ins):
        tile_shape(ins[0].shape, ins[1])
        return [np.tile(ins[0], ints(ins[1])) if ins[0].ndim else ins[0].copy()]

    def lower(ctx):
        shp = ctx.inputs[0].shape
        lower_index_map(ctx, lambda idx: [Const(0, I64) if d == 1 else i % d for i, d in zip(idx, shp)])


# ----------------------------------------------------------------------------- Shape / Size
def _shape_slice(node, rank: int) -> tuple[int, int]:
    def clamp(v):
        v = v + rank if v < 0 else v
        return min(max(v, 0), rank)
    start = clamp(int(node.attr("start", 0)))
    end = node.attr("end", None)
    end = rank if end is None else clamp(int(end))
    return start, max(start, end)


def _shape_known(node):
    x = node.inputs[0]
    s, e = _shape_slice(node, x.type.rank)
    return [np.asarray(x.shape[s:e], dtype=np.int64)]


@op("Shape", OpPatternKind.OPAQUE)
class Shape:
    """Shape(data) -> int64 1-D: data's dims[start:end] (start/end clamped to [0, rank], negative
    counts from the back; defaults: whole shape). Any dtype; the value is known at compile time.
    ONNX spec: Shape-21 (start/end since 15).
    """

    def infer(node):
        s, e = _shape_slice(node, node.inputs[0].type.rank)
        return [TensorType(DType.i64, (e - s,))]

    def reference(node, ins):
        s, e = _shape_slice(node, ins[0].ndim)
        return [np.asarray(ins[0].shape[s:e], dtype=np.int64)]

    known = _shape_known
    lower = lower_known


@op("Size", OpPatternKind.OPAQUE)
class Size:
    """Size(data) -> int64 scalar: the number of elements of data. Any dtype; known at compile
    time. ONNX spec: Size-21."""

    def infer(node):
        return [TensorType(DType.i64, ())]

    def reference(node, ins):
        return [np.asarray(ins[0].size, dtype=np.int64)]

    def known(node):
        return [np.asarray(node.inputs[0].type.numel, dtype=np.int64)]

    lower = lower_known

