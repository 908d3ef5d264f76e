"""Detection ops: NonMaxSuppression and DeformConv (ONNX operator spec, sections
"NonMaxSuppression" (NonMaxSuppression-11) and "DeformConv" (DeformConv-22)).

NonMaxSuppression's output shape depends on the values of its inputs. tensorfuse compiles
static shapes, so those inputs must be known at compile time: when they are graph inputs the
frontend's specialisation (``compiler/specialize.py``) makes them constants per run-time value;
when they are computed at run time inside the graph, compiling fails with "the output shape
depends on data". With known inputs the outputs are computed by the numpy reference at compile
time and the kernel writes them (:func:`lower_data_dependent`).

Also home of the helpers for such data-dependent ops (:func:`data_input`,
:func:`lower_data_dependent`), used by Unique in ``ir/ops/misc.py``.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from tensorfuse.ir.kernel import I64, Buffer, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.ops.conv import FLOAT_TYPES, Geometry, conv_geometry, conv_kernel_shape, flat_offset
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op, run_reference
from tensorfuse.ir.types import DType, TensorType


# ----------------------------------------------------------------------------- data-dependent
def data_input(node, i: int, what: str) -> np.ndarray | None:
    """The compile-time value of input i of an op whose output shape depends on that value.

    Like :func:`const_input` (None for an omitted input; the error carries ``needs_value`` so
    that ``compiler.compile`` specialises on the graph inputs behind it), with a message saying
    why: "the output shape depends on data"."""
    try:
        return const_input(node, i, what)
    except ShapeError as e:
        raise ShapeError(f"the output shape depends on data, which tensorfuse does not support at run time: "
                         f"{e}", needs_value=e.needs_value) from None


def lower_data_dependent(ctx: LowerCtx) -> None:
    """Write the outputs of a node whose inputs are all known at compile time: the numpy
    reference computes them and one kernel stores them as constants (outputs of any size; the
    propagated ``Value.known`` is limited to small tensors)."""
    ins = []
    for i, v in enumerate(ctx.node.inputs):
        a = None if v is None else ctx.const(i)
        if v is not None and a is None:
            raise ShapeError(f"{ctx.node.qualified_op} node '{ctx.node.name}': input '{v.name}' is not known "
                             "at compile time (the output shape depends on data)")
        ins.append(a)
    outs = run_reference(ctx.node, ins)
    bufs = [b for b in ctx.outputs if b is not None]
    kb = ctx.kernel(params=bufs)
    for b, data in zip(ctx.outputs, outs):
        if b is None:
            continue
        if tuple(data.shape) != tuple(b.shape):
            raise ShapeError(f"{ctx.node.qualified_op} node '{ctx.node.name}': the reference gives shape "
                             f"{list(data.shape)}, inference {list(b.shape)}")
        for k, x in enumerate(np.asarray(data).ravel().tolist()):
            kb.store(b, k, as_expr(x, b.dtype))


# ----------------------------------------------------------------------------- NonMaxSuppression
def _scalar(a: np.ndarray | None, what: str, dtype, default):
    if a is None or a.size == 0:
        return default
    if a.size != 1:
        raise ShapeError(f"{what} must be a scalar (or one element), got shape {list(a.shape)}")
    return dtype(a.ravel()[0])


def _corners(box: np.ndarray, center: bool) -> tuple:
    """(y_min, x_min, y_max, x_max) of one box in float32 arithmetic."""
    if center:
        xc, yc, w, h = box
        half_w, half_h = w / np.float32(2), h / np.float32(2)
        return yc - half_h, xc - half_w, yc + half_h, xc + half_w
    y1, x1, y2, x2 = box
    return min(y1, y2), min(x1, x2), max(y1, y2), max(x1, x2)


def _suppresses(a: tuple, b: tuple, iou_threshold: np.float32) -> bool:
    """IoU(a, b) > iou_threshold (boxes as corners); degenerate boxes never suppress."""
    iy0, ix0 = max(a[0], b[0]), max(a[1], b[1])
    iy1, ix1 = min(a[2], b[2]), min(a[3], b[3])
    if ix1 <= ix0 or iy1 <= iy0:
        return False
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a = (a[3] - a[1]) * (a[2] - a[0])
    area_b = (b[3] - b[1]) * (b[2] - b[0])
    union = area_a + area_b - inter
    if inter <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(inter / union > iou_threshold)


def nms_reference(boxes: np.ndarray, scores: np.ndarray, max_out: int, iou_threshold: np.float32,
                  score_threshold: np.float32 | None, center: bool) -> np.ndarray:
    """Greedy NMS per (batch, class): candidates with score > score_threshold (all when it is
    None), in decreasing score (ties: lower box index first); a candidate is kept unless its
    IoU with a box kept before in the same class exceeds iou_threshold; at most ``max_out``."""
    sel = []
    boxes = np.asarray(boxes, np.float32)
    scores = np.asarray(scores, np.float32)
    nb, nc, ns = scores.shape
    for bi in range(nb):
        corners = [_corners(boxes[bi, k], center) for k in range(ns)]
        for ci in range(nc):
            s = scores[bi, ci]
            cand = [k for k in range(ns) if score_threshold is None or s[k] > score_threshold]
            cand.sort(key=lambda k: (-s[k], k))
            kept: list[int] = []
            for k in cand:
                if len(kept) >= max_out:
                    break
                if not any(_suppresses(corners[k], corners[j], iou_threshold) for j in kept):
                    kept.append(k)
                    sel.append((bi, ci, k))
    return np.asarray(sel, np.int64).reshape(len(sel), 3)


def _nms_args(node, vals):
    boxes, scores = vals[0], vals[1]
    max_out = max(_scalar(vals[2], "max_output_boxes_per_class", int, 0), 0)
    iou = _scalar(vals[3], "iou_threshold", np.float32, np.float32(0))
    score = _scalar(vals[4], "score_threshold", np.float32, None)
    cpb = int(node.attr("center_point_box", 0))
    if cpb not in (0, 1):
        raise ShapeError(f"center_point_box must be 0 or 1, got {cpb}")
    return boxes, scores, max_out, iou, score, bool(cpb)


@op("NonMaxSuppression", OpPatternKind.OPAQUE)
class NonMaxSuppression:
    """NonMaxSuppression(boxes, scores, max_output_boxes_per_class?, iou_threshold?,
    score_threshold?) -> selected_indices int64 [num_selected, 3] of (batch, class, box).

    boxes: f32 [num_batches, spatial_dimension, 4] as [y1, x1, y2, x2] (any diagonal corner
    pair) or, with center_point_box=1, [x_center, y_center, width, height]; scores: f32
    [num_batches, num_classes, spatial_dimension]; max_output_boxes_per_class: int64 scalar
    (absent: 0, no output); iou_threshold: f32 scalar (absent: 0), boxes with IoU strictly
    greater are suppressed; score_threshold: f32 scalar, boxes need a score strictly greater
    (absent: no filter). Output rows: batches, then classes, then decreasing score.

    The output shape depends on the values of every input, so all must be known at compile
    time (graph inputs are specialised on; values computed at run time raise ShapeError,
    "the output shape depends on data"). Raises ShapeError for bad shapes, dtypes or
    center_point_box. ONNX spec: NonMaxSuppression-11 (same semantics as -10).
    """

    def infer(node):
        boxes, scores = node.inputs[0], node.inputs[1]
        for v, what, dt in ((boxes, "boxes", DType.f32), (scores, "scores", DType.f32),
                            (node.input(2), "max_output_boxes_per_class", DType.i64),
                            (node.input(3), "iou_threshold", DType.f32), (node.input(4), "score_threshold", DType.f32)):
            if v is not None and v.dtype != dt:
                raise ShapeError(f"{what} must be {dt.value}, got {v.dtype.value}")
        if boxes.type.rank != 3 or boxes.shape[2] != 4:
            raise ShapeError(f"boxes must be [num_batches, spatial_dimension, 4], got {list(boxes.shape)}")
        if scores.type.rank != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            raise ShapeError(f"scores must be [num_batches={boxes.shape[0]}, num_classes, spatial_dimension="
                             f"{boxes.shape[1]}], got {list(scores.shape)}")
        names = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")
        vals = [data_input(node, i, names[i]) for i in range(5)]
        out = nms_reference(*_nms_args(node, vals))
        return [TensorType(DType.i64, out.shape)]

    def reference(node, ins):
        ins = list(ins) + [None] * (5 - len(ins))
        return [nms_reference(*_nms_args(node, ins))]

    lower = lower_data_dependent


# ----------------------------------------------------------------------------- DeformConv
def _deform_plan(node, x, w, off, b, mask) -> tuple[Geometry, int, int]:
    """Geometry, group and offset_group of a DeformConv node; ShapeError when inconsistent."""
    if x.type.rank < 3:
        raise ShapeError(f"X must be [N, C, D1, ...] with at least one spatial dim, got {list(x.shape)}")
    nsp = x.type.rank - 2
    if w.type.rank != x.type.rank:
        raise ShapeError(f"W has rank {w.type.rank}, X has rank {x.type.rank}; they must match")
    group, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    if group <= 0 or og <= 0:
        raise ShapeError(f"group and offset_group must be positive, got {group} and {og}")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if c != cg * group:
        raise ShapeError(f"X has {c} channels but W expects {cg} per group x {group} groups = {cg * group}")
    if m % group:
        raise ShapeError(f"W's {m} output channels are not divisible by group={group}")
    if c % og:
        raise ShapeError(f"X's {c} channels are not divisible by offset_group={og}")
    ks = conv_kernel_shape(node, w.shape)
    geo = conv_geometry(node, x.shape[2:], ks)
    taps = math.prod(ks)
    want = (n, og * taps * nsp, *geo.out_shape)
    if tuple(off.shape) != want:
        raise ShapeError(f"offset must have shape {list(want)} (N, offset_group * prod(kernel) * {nsp}, "
                         f"output spatial dims), got {list(off.shape)}")
    if mask is not None and tuple(mask.shape) != (n, og * taps, *geo.out_shape):
        raise ShapeError(f"mask must have shape {[n, og * taps, *geo.out_shape]}, got {list(mask.shape)}")
    if b is not None and tuple(b.shape) != (m,):
        raise ShapeError(f"B must have shape [{m}] (one bias per output channel), got {list(b.shape)}")
    return geo, group, og


def deform_conv_reference(x, w, off, b, mask, group: int, og: int, geo: Geometry) -> np.ndarray:
    """Deformable convolution in float64: each tap samples X (multilinear interpolation, zero
    outside the input) at its regular position plus its offset, scaled by the mask."""
    x = np.asarray(x, np.float64)
    n, c = x.shape[:2]
    nsp, ks, out = geo.rank, geo.kernel, geo.out_shape
    taps = math.prod(ks)
    off = np.asarray(off, np.float64).reshape(n, og, taps, nsp, *out)
    grids = np.meshgrid(*[np.arange(k) for k in ks], *[np.arange(o) for o in out], indexing="ij")
    cols = np.zeros((n, c, taps, *out))
    cog = c // og
    nidx = np.arange(n).reshape((n,) + (1,) * (1 + nsp))
    for g in range(og):
        pos = []
        for d in range(nsp):
            base = grids[nsp + d] * geo.strides[d] - geo.pads_begin[d] + grids[d] * geo.dilations[d]
            pos.append(base.reshape(1, taps, *out) + off[:, g, :, d])      # [n, taps, *out]
        lo = [np.floor(p) for p in pos]
        xt = np.moveaxis(x[:, g * cog:(g + 1) * cog], 1, -1)                 # [n, *in, cog]
        acc = np.zeros((n, taps, *out, cog))
        for corner in itertools.product((0, 1), repeat=nsp):
            wt = np.ones_like(pos[0])
            valid = np.ones(pos[0].shape, bool)
            idx = []
            for d in range(nsp):
                i = lo[d] + corner[d]
                fr = pos[d] - lo[d]
                wt = wt * (fr if corner[d] else 1 - fr)
                valid &= (i >= 0) & (i < geo.in_shape[d])
                idx.append(np.clip(i, 0, geo.in_shape[d] - 1).astype(np.int64))
            v = xt[(nidx,) + tuple(idx)]                                     # [n, taps, *out, cog]
            acc += np.where(valid, wt, 0.0)[..., None] * v
        cols[:, g * cog:(g + 1) * cog] = np.moveaxis(acc, -1, 1)
    if mask is not None:
        mk = np.asarray(mask, np.float64).reshape(n, og, 1, taps, *out)
        cols = (cols.reshape(n, og, cog, taps, *out) * mk).reshape(cols.shape)
    m, cg = w.shape[:2]
    mg = m // group
    wf = np.asarray(w, np.float64).reshape(m, cg, taps)
    y = np.zeros((n, m, *out))
    for g in range(group):
        y[:, g * mg:(g + 1) * mg] = np.einsum("mct,nct...->nm...", wf[g * mg:(g + 1) * mg],
                                              cols[:, g * cg:(g + 1) * cg])
    if b is not None:
        y += np.asarray(b, np.float64).reshape((1, m) + (1,) * nsp)
    return y


def emit_deform_conv(ctx: LowerCtx, x: Buffer, w: Buffer, off: Buffer, b: Buffer | None,
                     mask: Buffer | None, y: Buffer, group: int, og: int, geo: Geometry):
    """One kernel: parallel over (n, output channel), then output positions; a local
    accumulator sums, over the group's input channels and the kernel taps, W times the
    multilinearly interpolated X at the tap's offset position (times the mask). Computes in
    f64 for f64 inputs, else f32; bias and the fused epilogue apply before the single store."""
    cdt = DType.f64 if x.dtype == DType.f64 else DType.f32
    nsp, ks, out, ins = geo.rank, geo.kernel, geo.out_shape, geo.in_shape
    n_, c_ = x.shape[:2]
    m_, cg = w.shape[:2]
    mg, cog, taps = m_ // group, c_ // og, math.prod(ks)
    kb = ctx.kernel()
    acc = kb.local(cdt, (1,), hint="acc")
    lo = kb.local(I64, (nsp,), hint="lo")
    fr = kb.local(cdt, (nsp,), hint="fr")
    with kb.loop(n_ * m_, kind="parallel", hint="nm") as nm:
        n = nm / m_
        oc = nm % m_
        with kb.grid(out) as o:
            kb.store(acc, 0, b[oc].cast(cdt) if b is not None else as_expr(0, cdt))
            with kb.loop(cg, hint="ic") as icl:
                c = (oc / mg) * cg + icl
                g = c / cog
                with kb.grid(ks) as k:
                    ch = g * taps + flat_offset(ks, k)
                    for d in range(nsp):
                        base = o[d] * geo.strides[d] + (k[d] * geo.dilations[d] - geo.pads_begin[d])
                        kb.store(fr, d, base.cast(cdt) + off[[n, ch * nsp + d, *o]].cast(cdt))
                        kb.store(lo, d, unop("floor", fr[d]).cast(I64))
                        kb.store(fr, d, fr[d] - lo[d].cast(cdt))
                    val = None
                    for corner in itertools.product((0, 1), repeat=nsp):
                        wt, ok, idx = None, None, []
                        for d in range(nsp):
                            i = lo[d] + corner[d]
                            t = fr[d] if corner[d] else 1 - fr[d]
                            wt = t if wt is None else wt * t
                            inb = (i >= 0) & (i < ins[d])
                            ok = inb if ok is None else ok & inb
                            idx.append(maximum(minimum(i, ins[d] - 1), 0))
                        term = select(ok, x[[n, c, *idx]].cast(cdt) * wt, as_expr(0, cdt))
                        val = term if val is None else val + term
                    if mask is not None:
                        val = val * mask[[n, ch, *o]].cast(cdt)
                    kb.store(acc, 0, acc[0] + w[[oc, icl, *k]].cast(cdt) * val)
            idx = [n, oc, *o]
            kb.store(y, idx, ctx.apply_epilogue(acc[0].cast(y.dtype), idx))
    return kb


@op("DeformConv", OpPatternKind.OUT_ELEMWISE_FUSABLE)
class DeformConv:
    """Deformable convolution (N-D): Y[n, oc, o] = B[oc] + sum over the group's input channels
    c and kernel taps k of W[oc, c, k] * mask[n, g, k, o] * X[n, c] sampled at
    o*strides - pads_begin + k*dilations + offset[n, g, k, :, o], g = c's offset group.

    Inputs (one float dtype: f16, bf16, f32, f64): X [N, C, D1..Dn]; W [oC, C/group, k1..kn];
    offset [N, offset_group * prod(k) * n, O1..On] (per tap, one offset per spatial dim);
    optional B [oC]; optional mask [N, offset_group * prod(k), O1..On] (default ones).
    Fractional positions are interpolated (bilinear in 2-D); samples outside the input are 0.
    Output Y [N, oC, O1..On] as for Conv with pads/strides/dilations (no auto_pad). Raises
    ShapeError for mismatched ranks, channels, group/offset_group, offset or mask shapes.
    ONNX spec: DeformConv-22 (same semantics as DeformConv-19).
    """

    def infer(node):
        x, w, off, b, mask = (node.input(i) for i in range(5))
        for v, what in ((x, "X"), (w, "W"), (off, "offset"), (b, "B"), (mask, "mask")):
            if v is not None:
                if v.dtype not in FLOAT_TYPES:
                    raise ShapeError(f"{what} has dtype {v.dtype.value}; DeformConv takes f16, bf16, f32 or f64")
                if v.dtype != x.dtype:
                    raise ShapeError(f"{what} has dtype {v.dtype.value}, X has {x.dtype.value}; they must match")
        geo, _, _ = _deform_plan(node, x, w, off, b, mask)
        return [TensorType(x.dtype, (x.shape[0], w.shape[0], *geo.out_shape))]

    def reference(node, ins):
        ins = list(ins) + [None] * (5 - len(ins))
        v = node.inputs
        geo, group, og = _deform_plan(node, v[0], v[1], v[2], node.input(3), node.input(4))
        return [deform_conv_reference(*ins[:5], group, og, geo).astype(ins[0].dtype)]

    def lower(ctx):
        bufs = list(ctx.inputs) + [None] * (5 - len(ctx.inputs))
        n = ctx.node
        geo, group, og = _deform_plan(n, n.inputs[0], n.inputs[1], n.inputs[2], n.input(3), n.input(4))
        emit_deform_conv(ctx, *bufs[:5], ctx.outputs[0], group, og, geo)

    def flops(node):
        x, w = node.inputs[0], node.inputs[1]
        nsp = x.type.rank - 2
        per = (x.shape[1] // int(node.attr("group", 1))) * math.prod(w.shape[2:])
        return node.outputs[0].type.numel * per * (2.0 + 3 * 2 ** nsp)
