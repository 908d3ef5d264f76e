"""Concat, Split and Slice (ONNX operator spec, opset 28 semantics).

All three are pure data movement along axes with offsets known at compile time; each lowers to
one kernel. Concat and Split move contiguous runs (the dims from the axis on): when every run
holds at least one vector they are block copies of L-lane vectors in one parallel loop
(:func:`emit_row_copies`), else a loop nest per input (Concat) or per output (Split). Slice is
one nest.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.ops._common import const_input, norm_axis
from tensorfuse.ir.ops.shape import axes_list, ints, lower_index_map
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import TensorType

INJ = OpPatternKind.INJECTIVE


# ----------------------------------------------------------------------------- block copies
#: vectors per copy job of :func:`emit_row_copies` (a job moves at most COPY_BLOCK_VECTORS * L
#: elements: per-job index arithmetic stays small next to it, and enough jobs remain for the
#: thread team)
COPY_BLOCK_VECTORS = 128


def row_copies_ok(bufs, rows_len, L: int) -> bool:
    """Whether :func:`emit_row_copies` suits copies whose contiguous runs have lengths
    ``rows_len``: every run at least one vector (shorter runs keep the per-element loop
    nests, whose per-row cost is lower), and no bool buffers (kept as bytes in memory, i1 in
    registers)."""
    from tensorfuse.ir.types import DType
    return all(b.dtype != DType.bool for b in bufs) and all(n >= L for n in rows_len if n)


def emit_row_copies(kb, copies, L: int) -> None:
    """One parallel loop of contiguous block copies. ``copies``: (src, src_offset, src_stride,
    dst, dst_offset, dst_stride, rows, row_len) tuples: row r of ``row_len`` elements goes from
    ``src`` flat offset src_offset + r*src_stride to ``dst`` flat offset dst_offset +
    r*dst_stride (a Concat input's rows into the output, a Split output's rows out of the
    input).

    The jobs of all copies form one loop (so one parallel region, no barrier between copies):
    each row is cut into blocks of COPY_BLOCK_VECTORS*L elements plus a remainder, and a job
    copies one of them with L-lane vector loads and stores (the remainder's last elements one
    at a time). An if-chain on the job index picks the copy."""
    from tensorfuse.ir.kernel import as_expr
    blk = COPY_BLOCK_VECTORS * L
    plans, base = [], 0
    for src, soff, ss, dst, doff, ds, rows, n in copies:
        if rows == 0 or n == 0:
            continue
        full, rem = n // blk, n % blk
        per_row = full + (1 if rem else 0)
        plans.append((base, src, soff, ss, dst, doff, ds, full, rem, per_row))
        base += rows * per_row
    if not plans:
        return

    def run(s_off, d_off, src, dst, count: int):
        nv = count // L
        if nv:
            with kb.loop(nv, hint="v") as v:
                kb.store(dst, d_off + v * L, src.vload(s_off + v * L, L))
        for e in range(nv * L, count):
            kb.store(dst, d_off + e, src.flat(s_off + e))

    def job(j, plan):
        b0, src, soff, ss, dst, doff, ds, full, rem, per_row = plan
        jj = j - b0 if b0 else j
        row = jj / per_row if per_row > 1 else jj
        blk_i = jj % per_row if per_row > 1 else as_expr(0)
        s0, d0 = soff + row * ss + blk_i * blk, doff + row * ds + blk_i * blk
        if full and rem:
            with kb.if_(blk_i < full) as st:
                run(s0, d0, src, dst, blk)
            with kb.else_(st):
                run(s0, d0, src, dst, rem)
        else:
            run(s0, d0, src, dst, blk if full else rem)

    def chain(j, i):
        if i == len(plans) - 1:
            job(j, plans[i])
            return
        with kb.if_(j < plans[i + 1][0]) as st:
            job(j, plans[i])
        with kb.else_(st):
            chain(j, i + 1)

    with kb.loop(base, kind="parallel", hint="job") as j:
        chain(j, 0)


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
        # rows: the dims before the axis; each input's row is contiguous in it and in Y
        rows, L = int(np.prod(y.shape[:a])), ctx.target.lanes(y.dtype)
        lens = [int(np.prod(b.shape[a:])) for b in ins]
        if row_copies_ok(ins + [y], lens, L):
            copies, off = [], 0
            for b, n in zip(ins, lens):
                copies.append((b, 0, n, y, off, int(np.prod(y.shape[a:])), rows, n))
                off += n
            emit_row_copies(kb, copies, L)
            return
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
        rows, L = int(np.prod(x.shape[:a])), ctx.target.lanes(x.dtype)
        lens = [int(np.prod(y.shape[a:])) for y in ctx.outputs]
        if row_copies_ok([x] + list(ctx.outputs), lens, L):
            copies, off = [], 0
            for y, n in zip(ctx.outputs, lens):
                copies.append((x, off, int(np.prod(x.shape[a:])), y, 0, n, rows, n))
                off += n
            emit_row_copies(kb, copies, L)
            return
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


@op("Slice", INJ, const_inputs=(1, 2, 3, 4), quant_passthrough="copy")
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

    def index_map(node, out_idx):
        p = _slice_of(node, node.inputs[0].shape, lambda i, w: const_input(node, i, w))
        return [i * st + s for i, (s, st, _) in zip(out_idx, p)]

    def lower(ctx):
        lower_index_map(ctx, lambda idx: Slice.index_map(ctx.node, idx))
