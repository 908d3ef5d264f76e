"""Concat, Split and Slice (ONNX operator spec, opset 28 semantics).

All three are pure data movement along axes with offsets known at compile time; each lowers to
one kernel with a loop nest per input (Concat) or per output (Split) or one nest (Slice).
"""
from __future__ import annotations

import numpy as np

from ir.ops._common import const_input, norm_axis
from ir.ops.shape import axes_list, ints, lower_index_map
from ir.registry import OpPatternKind, ShapeError, op
from ir.types import TensorType

INJ = OpPatternKind.INJECTIVE


# ----------------------------------------------------------------------------- Concat
def concat_shape(shapes, axis: int) -> tuple[tuple[int, ...], int]:
    """(output shape, normalised axis); ShapeError when ranks or non-axis dims differ."""
    r = len(shapes[0])
    if r == 0:
        raise ShapeError("cannot concatenate scalars (rank 0)")
    a = norm_axis(axis, r)
    for s in shapes[1:]:
        if len(s) != r:
            raise ShapeError(f"inputs have different ranks: {[list(x) for x in shapes]}")
        if any(s[i] != shapes[0][i] for i in range(r) if i != a):
            raise ShapeError(f"input shapes {[list(x) for x in shapes]} differ outside axis {a}")
    out = list(shapes[0])
    out[a] = sum(s[a] for s in shapes)
    return tuple(out), a


@op("Concat", INJ)
class Concat:
    """Concat(*inputs) -> inputs joined along ``axis`` (in [-r, r-1], required).

    All inputs share dtype, rank and every dim except ``axis`` (which may be 0: empty inputs add
    nothing). Raises ShapeError otherwise. ONNX spec: Concat-13.
    """

    def infer(node):
        ins = [v for v in node.inputs if v is not None]
        if not ins:
            raise ShapeError("needs at least one input")
        if len({v.dtype for v in ins}) > 1:
            raise ShapeError(f"inputs have different dtypes: {sorted({v.dtype.value for v in ins})}")
        axis = node.attr("axis")
        if axis is None:
            raise ShapeError("the axis attribute is required")
        shape, _ = concat_shape([v.shape for v in ins], axis)
        return [TensorType(ins[0].dtype, shape)]

    def reference(node, ins):
        ins = [a for a in ins if a is not None]
        _, a = concat_shape([x.shape for x in ins], node.attr("axis"))
        return [np.concatenate(ins, axis=a)]

    def lower(ctx):
        y = ctx.outputs[0]
        ins = [b for b in ctx.inputs if b is not None]
        _, a = concat_shape([b.shape for b in ins], ctx.attr("axis"))
        kb = ctx.kernel()
        off = 0
        for x in ins:
            if x.numel:
                with kb.grid(x.shape) as idx:
                    oidx = list(idx)
                    oidx[a] = idx[a] + off
                    kb.store(y, oidx, x[idx])
            off += x.shape[a]


# ----------------------------------------------------------------------------- Split
def split_sizes(node, shape, split, n_outputs: int | None = None) -> tuple[list[int], int]:
    """(chunk sizes, normalised axis) of Split-18: explicit ``split``, else ``num_outputs``
    chunks of ceil(dim / n) with a smaller last one, else equal parts for ``n_outputs``."""
    a = norm_axis(node.attr("axis", 0), len(shape))
    dim = shape[a]
    num = node.attr("num_outputs", None)
    if split is not None:
        sizes = ints(split)
        if num is not None:
            raise ShapeError("give either the split input or num_outputs, not both")
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ShapeError(f"split {sizes} does not sum to dim {dim} of axis {a} (shape {list(shape)})")
        return sizes, a
    if num is None:
        if not n_outputs:
            raise ShapeError("needs the split input or num_outputs (or a known number of outputs)")
        if dim % n_outputs:
            raise ShapeError(f"dim {dim} of axis {a} does not split into {n_outputs} equal parts")
        return [dim // n_outputs] * n_outputs, a
    num = int(num)
    if num < 1:
        raise ShapeError(f"num_outputs must be >= 1, got {num}")
    chunk = -(-dim // num)
    sizes = [chunk] * (num - 1) + [dim - chunk * (num - 1)]
    if sizes[-1] < 0:
        raise ShapeError(f"dim {dim} of axis {a} cannot be split into {num} chunks of {chunk}")
    return sizes, a


def _split_import(ctx, proto, version):
    attrs = ctx.attrs(proto)
    x = ctx.value(proto.input[0])
    split = attrs.pop("split", None)   # an attribute before Split-13
    ins = [x]
    if version >= 13 and len(proto.input) > 1 and proto.input[1]:
        ins.append(ctx.value(proto.input[1]))
    elif split is not None:
        ins.append(ctx.builder.const(np.asarray(split, dtype=np.int64), "split"))
    if len(ins) == 1 and "num_outputs" not in attrs:
        # equal parts, one per output: make the sizes explicit (the IR node does not know its
        # output count during inference)
        n = len(proto.output)
        a = norm_axis(attrs.get("axis", 0), x.type.rank)
        if x.shape[a] % n:
            raise ShapeError(f"dim {x.shape[a]} of axis {a} does not split into {n} equal parts")
        ins.append(ctx.builder.const(np.full(n, x.shape[a] // n, dtype=np.int64), "split"))
    return ctx.default_import(proto, inputs=ins, attrs=attrs)


@op("Split", INJ, const_inputs=(1,))
class Split:
    """Split(input, split?) -> chunks of input along ``axis`` (default 0).

    split: int64 1-D of chunk sizes summing to the axis dim, known at compile time; or the
    attribute num_outputs (chunks of ceil(dim/n), the last smaller). Any dtype. Raises ShapeError
    when the sizes do not fit. ONNX spec: Split-18 (split is an attribute before 13; the importer
    makes it an input, and makes equal splits explicit).
    """

    def infer(node):
        x = node.inputs[0]
        sizes, a = split_sizes(node, x.shape, const_input(node, 1, "split"), len(node.outputs) or None)
        out = []
        for s in sizes:
            shp = list(x.shape)
            shp[a] = s
            out.append(TensorType(x.dtype, tuple(shp)))
        return out

    def reference(node, ins):
        x = ins[0]
        sizes, a = split_sizes(node, x.shape, ins[1] if len(ins) > 1 else None, len(node.outputs) or None)
        return list(np.split(x, np.cumsum(sizes)[:-1], axis=a))

    importer = _split_import

    def lower(ctx):
        x = ctx.inputs[0]
        sizes, a = split_sizes(ctx.node, x.shape, ctx.const(1), len(ctx.outputs))
        kb = ctx.kernel(params=[x] + list(ctx.outputs))
        off = 0
        for y, s in zip(ctx.outputs, sizes):
            if y.numel:
                with kb.grid(y.shape) as idx:
                    iidx = list(idx)
                    iidx[a] = idx[a] + off
                    kb.store(y, idx, x[iidx])
            off += s


# ----------------------------------------------------------------------------- Slice
def slice_params(shape, starts, ends, axes=None, steps=None) -> list[tuple[int, int, int]]:
    """Per input axis (start, step, length) of Slice-13 with ONNX clamping: negative starts/ends
    count from the back; starts clamp to [0, dim] (step > 0) or [0, dim-1] (step < 0), ends to
    [0, dim] or [-1, dim-1]."""
    r = len(shape)
    starts, ends = ints(starts), ints(ends)
    if len(starts) != len(ends):
        raise ShapeError(f"starts ({len(starts)}) and ends ({len(ends)}) differ in length")
    axes = list(range(len(starts))) if axes is None else axes_list(None, axes, r)
    steps = [1] * len(starts) if steps is None else ints(steps)
    if not len(axes) == len(steps) == len(starts):
        raise ShapeError(f"starts, ends, axes and steps must have one entry per sliced axis "
                         f"(got {len(starts)}, {len(ends)}, {len(axes)}, {len(steps)})")
    if len(starts) > r:
        raise ShapeError(f"{len(starts)} sliced axes for an input of rank {r}")
    out = [(0, 1, d) for d in shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        dim = shape[a]
        if st == 0:
            raise ShapeError(f"step of axis {a} is 0")
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        n = max(0, -(-(e - s) // st))
        out[a] = (s if n else 0, st, n)
    return out


def _slice_of(node, x_shape, get):
    return slice_params(x_shape, get(1, "starts"), get(2, "ends"), get(3, "axes"), get(4, "steps"))


def _slice_import(ctx, proto, version):
    if version >= 10:
        return ctx.default_import(proto)
    attrs = ctx.attrs(proto)
    ins = [ctx.value(proto.input[0])]
    for name in ("starts", "ends", "axes"):
        v = attrs.pop(name, None)
        ins.append(None if v is None else ctx.builder.const(np.asarray(v, dtype=np.int64), name))
    return ctx.default_import(proto, inputs=ins, attrs=attrs)


@op("Slice", INJ, const_inputs=(1, 2, 3, 4))
class Slice:
    """Slice(data, starts, ends, axes?, steps?) -> data[start:end:step] on the listed axes.

    starts/ends/axes/steps: int32 or int64 1-D, known at compile time; negative values count
    from the back, out-of-range values clamp (INT_MAX ends mean "to the end"), negative steps
    slice backwards. Any dtype. Raises ShapeError for a zero step, repeated or out-of-range
    axes, or inputs of different lengths. ONNX spec: Slice-13 (Slice-1 had starts/ends/axes as
    attributes; the importer makes them inputs).
    """

    def infer(node):
        x = node.inputs[0]
        p = _slice_of(node, x.shape, lambda i, w: const_input(node, i, w))
        return [TensorType(x.dtype, tuple(n for _, _, n in p))]

    def reference(node, ins):
        x = ins[0]
        p = _slice_of(node, x.shape, lambda i, w: ins[i] if i < len(ins) else None)
        idx = tuple(np.arange(s, s + st * n, st) if n else np.arange(0) for s, st, n in p)
        return [x[np.ix_(*idx)] if x.ndim else x.copy()]

    importer = _slice_import

    def lower(ctx):
        p = _slice_of(ctx.node, ctx.inputs[0].shape, lambda i, w: ctx.const(i))
        lower_index_map(ctx, lambda idx: [i * st + s for i, (s, st, _) in zip(idx, p)])
