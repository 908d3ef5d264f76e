"""RoiAlign (ONNX operator spec, section "RoiAlign": RoiAlign-16; RoiAlign-10 imported).

For each region of interest r (rois[r] = x1, y1, x2, y2 in input-image coordinates, scaled by
``spatial_scale``; shifted by -0.5 with coordinate_transformation_mode half_pixel) and each
channel, the region is divided into output_height x output_width bins; each bin is sampled on a
regular grid of sampling_ratio x sampling_ratio points (or ceil(roi_size / output_size) per axis
when sampling_ratio is 0). Each sample is bilinearly interpolated in X[batch_indices[r], c]
(a sample beyond [-1, H] x [-1, W] contributes 0; coordinates are clamped at 0 and at the last
row/column). mode avg averages the samples; mode max takes, over the samples, the largest of
the four weighted corner values (as onnxruntime and onnx.reference do).

With output_half_pixel (RoiAlign-10's only behaviour) no -0.5 shift is applied and the ROI's
width and height are at least 1. Coordinates and accumulation use float32 (float64 for float64
data), as onnxruntime computes in the data type.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import I64, as_expr, maximum, select, unop
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

FLOATS = (DType.f16, DType.f32, DType.f64)
CT_MODES = ("half_pixel", "output_half_pixel")


def _attrs(node):
    mode = node.attr("mode", "avg")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    sr = int(node.attr("sampling_ratio", 0))
    ss = float(node.attr("spatial_scale", 1.0))
    if mode not in ("avg", "max"):
        raise ShapeError(f"mode {mode!r} is not avg or max")
    if coord not in CT_MODES:
        raise ShapeError(f"coordinate_transformation_mode {coord!r} is not half_pixel or output_half_pixel")
    if oh < 1 or ow < 1:
        raise ShapeError(f"output_height {oh} and output_width {ow} must be >= 1")
    if sr < 0:
        raise ShapeError(f"sampling_ratio {sr} must be >= 0")
    return mode, coord == "half_pixel", oh, ow, sr, ss


def _check(node, x, rois, bi):
    if x.dtype not in FLOATS:
        raise ShapeError(f"X has dtype {x.dtype.value}; RoiAlign takes f16, f32 or f64")
    if rois.dtype != x.dtype:
        raise ShapeError(f"rois has dtype {rois.dtype.value}, X has {x.dtype.value}; they must match")
    if bi.dtype != DType.i64:
        raise ShapeError(f"batch_indices has dtype {bi.dtype.value}, expected int64")
    if len(x.shape) != 4:
        raise ShapeError(f"X must be 4-D [N, C, H, W], got shape {list(x.shape)}")
    if len(rois.shape) != 2 or rois.shape[1] != 4:
        raise ShapeError(f"rois must be [num_rois, 4], got shape {list(rois.shape)}")
    if list(bi.shape) != [rois.shape[0]]:
        raise ShapeError(f"batch_indices must be [num_rois] = [{rois.shape[0]}], got shape {list(bi.shape)}")


# ----------------------------------------------------------------------------- reference
def roi_align_reference(x, rois, bi, mode, half_pixel, oh, ow, sr, ss):
    ct = np.float64 if x.dtype == np.float64 else np.float32
    N, C, H, W = x.shape
    R = rois.shape[0]
    y = np.zeros((R, C, oh, ow), ct)
    xd = x.astype(ct)
    c = ct
    for r in range(R):
        b = int(bi[r])
        if not 0 <= b < N:
            raise ValueError(f"batch_indices[{r}] = {b} is outside [0, {N})")
        off = c(0.5) if half_pixel else c(0.0)
        sw, sh, ew, eh = (rois[r].astype(ct) * c(ss) - off)
        rw, rh = ew - sw, eh - sh
        if not half_pixel:
            rw, rh = max(rw, c(1.0)), max(rh, c(1.0))
        bh, bw = rh / c(oh), rw / c(ow)
        gh = sr if sr > 0 else int(np.ceil(rh / c(oh)))
        gw = sr if sr > 0 else int(np.ceil(rw / c(ow)))
        gh, gw = max(gh, 0), max(gw, 0)
        count = c(max(gh * gw, 1))

        def axis(start, bsize, grid, n_out, L):
            p = np.arange(n_out, dtype=ct)[:, None]
            g = np.arange(grid, dtype=ct)[None, :]
            v = start + p * bsize + ((g + c(0.5)) * bsize) / c(grid)
            valid = ~((v < c(-1.0)) | (v > c(L)))
            v = np.maximum(v, c(0.0))
            lo = np.floor(v).astype(np.int64)
            edge = lo >= L - 1
            lo = np.where(edge, L - 1, lo)
            hi = np.where(edge, L - 1, lo + 1)
            v = np.where(edge, c(L - 1), v)
            lw = (v - lo.astype(ct)).astype(ct)
            hw = (c(1.0) - lw).astype(ct)
            return lo, hi, np.where(valid, lw, c(0.0)), np.where(valid, hw, c(0.0))

        ylo, yhi, ly, hy = axis(sh, bh, gh, oh, H)           # [oh, gh]
        xlo, xhi, lx, hx = axis(sw, bw, gw, ow, W)           # [ow, gw]
        Y = (slice(None), None, slice(None), None)           # -> [oh, 1, gh, 1]
        X = (None, slice(None), None, slice(None))           # -> [1, ow, 1, gw]
        img = xd[b]                                          # [C, H, W]
        terms = [(hy[Y] * hx[X], img[:, ylo[Y], xlo[X]]), (hy[Y] * lx[X], img[:, ylo[Y], xhi[X]]),
                 (ly[Y] * hx[X], img[:, yhi[Y], xlo[X]]), (ly[Y] * lx[X], img[:, yhi[Y], xhi[X]])]
        if gh * gw == 0:
            continue
        if mode == "avg":
            s = terms[0][0] * terms[0][1] + terms[1][0] * terms[1][1] + terms[2][0] * terms[2][1] \
                + terms[3][0] * terms[3][1]                  # [C, oh, ow, gh, gw]
            y[r] = s.sum(axis=(3, 4)) / count
        else:
            m = terms[0][0] * terms[0][1]
            for w, v in terms[1:]:
                m = np.maximum(m, w * v)
            y[r] = m.max(axis=(3, 4))
    return y.astype(x.dtype)


# ----------------------------------------------------------------------------- lowering
def emit_roi_align(ctx, x, rois, bi, y, mode, half_pixel, oh, ow, sr, ss):
    kb = ctx.kernel(params=[x, rois, bi, y])
    if y.numel == 0:
        return kb
    N, C, H, W = x.shape
    R = rois.shape[0]
    ct = DType.f64 if x.dtype == DType.f64 else DType.f32

    def c(v):
        return as_expr(float(v), ct)

    P = kb.local(ct, (5,), hint="roi")          # start_h, start_w, bin_h, bin_w, count
    G = kb.local(I64, (3,), hint="grid")        # grid_h, grid_w, batch index
    yi = kb.local(I64, (2,), hint="yi")
    yw = kb.local(ct, (2,), hint="yw")          # ly, hy (0 when the sample row is outside)
    acc = kb.local(ct, (1,), hint="acc")
    seen = kb.local(DType.bool, (1,), hint="seen")

    def bilinear_axis(v, L):
        valid = ~((v < c(-1.0)) | (v > c(L)))
        v = maximum(v, c(0.0))
        lo = unop("floor", v).cast(I64)
        edge = lo >= L - 1
        lo2 = select(edge, as_expr(L - 1, I64), lo)
        hi = select(edge, as_expr(L - 1, I64), lo + 1)
        v2 = select(edge, c(L - 1), v)
        lw = v2 - lo2.cast(ct)
        return lo2, hi, select(valid, lw, c(0.0)), select(valid, c(1.0) - lw, c(0.0))

    with kb.loop(R, kind="parallel", hint="r") as r:
        off = c(0.5 if half_pixel else 0.0)
        sw = rois[r, 0].cast(ct) * c(ss) - off
        sh = rois[r, 1].cast(ct) * c(ss) - off
        rw = rois[r, 2].cast(ct) * c(ss) - off - sw
        rh = rois[r, 3].cast(ct) * c(ss) - off - sh
        if not half_pixel:
            rw, rh = maximum(rw, c(1.0)), maximum(rh, c(1.0))
        kb.store(P, 0, sh)
        kb.store(P, 1, sw)
        kb.store(P, 2, rh / c(oh))
        kb.store(P, 3, rw / c(ow))
        if sr > 0:
            kb.store(G, 0, as_expr(sr, I64))
            kb.store(G, 1, as_expr(sr, I64))
        else:
            kb.store(G, 0, maximum(unop("ceil", rh / c(oh)).cast(I64), as_expr(0, I64)))
            kb.store(G, 1, maximum(unop("ceil", rw / c(ow)).cast(I64), as_expr(0, I64)))
        kb.store(P, 4, maximum(G.flat(0) * G.flat(1), as_expr(1, I64)).cast(ct))
        b = bi[r]
        kb.store(G, 2, select(b < 0, as_expr(0, I64), select(b > N - 1, as_expr(N - 1, I64), b)))
        with kb.loop(C, hint="c") as ch, kb.loop(oh, hint="ph") as ph, kb.loop(ow, hint="pw") as pw:
            kb.store(acc, 0, c(0.0))
            if mode == "max":
                kb.store(seen, 0, as_expr(False, DType.bool))
            with kb.loop(G.flat(0), hint="iy") as iy:
                yv = P.flat(0) + ph.cast(ct) * P.flat(2) + ((iy.cast(ct) + c(0.5)) * P.flat(2)) / G.flat(0).cast(ct)
                lo, hi, lw, hw = bilinear_axis(yv, H)
                kb.store(yi, 0, lo)
                kb.store(yi, 1, hi)
                kb.store(yw, 0, lw)
                kb.store(yw, 1, hw)
                with kb.loop(G.flat(1), hint="ix") as ix:
                    xv = P.flat(1) + pw.cast(ct) * P.flat(3) + ((ix.cast(ct) + c(0.5)) * P.flat(3)) / G.flat(1).cast(ct)
                    xlo, xhi, lx, hx = bilinear_axis(xv, W)
                    bb = G.flat(2)
                    t = [(yw.flat(1) * hx) * x[bb, ch, yi.flat(0), xlo].cast(ct),
                         (yw.flat(1) * lx) * x[bb, ch, yi.flat(0), xhi].cast(ct),
                         (yw.flat(0) * hx) * x[bb, ch, yi.flat(1), xlo].cast(ct),
                         (yw.flat(0) * lx) * x[bb, ch, yi.flat(1), xhi].cast(ct)]
                    if mode == "avg":
                        kb.store(acc, 0, acc.flat(0) + (t[0] + t[1] + t[2] + t[3]))
                    else:
                        val = maximum(maximum(maximum(t[0], t[1]), t[2]), t[3])
                        kb.store(acc, 0, select(seen.flat(0), maximum(acc.flat(0), val), val))
                        kb.store(seen, 0, as_expr(True, DType.bool))
            out = acc.flat(0) / P.flat(4) if mode == "avg" else acc.flat(0)
            kb.store(y, [r, ch, ph, pw], out.cast(y.dtype))
    return kb


# ----------------------------------------------------------------------------- op
def _roialign_import(ctx, proto, version):
    attrs = ctx.attrs(proto)
    if version < 16:     # RoiAlign-10: no coordinate_transformation_mode; it behaved as output_half_pixel
        attrs["coordinate_transformation_mode"] = "output_half_pixel"
    return ctx.default_import(proto, attrs=attrs)


@op("RoiAlign", OpPatternKind.OPAQUE)
class RoiAlign:
    """RoiAlign(X, rois, batch_indices) -> Y: bilinearly sampled, pooled regions of interest.

    X: [N, C, H, W] (f16, f32, f64); rois: [num_rois, 4] (x1, y1, x2, y2; X's dtype);
    batch_indices: [num_rois] int64 (each in [0, N); the kernel clamps out-of-range indices, the
    reference raises ValueError). Y: [num_rois, C, output_height, output_width], X's dtype.
    Attributes: mode avg|max, output_height, output_width (>= 1), sampling_ratio (>= 0; 0 =
    adaptive ceil(roi_size / output_size)), spatial_scale, coordinate_transformation_mode
    half_pixel|output_half_pixel. Raises ShapeError for invalid ranks, shapes, dtypes or
    attributes. ONNX spec: RoiAlign-16 (RoiAlign-10 imported with output_half_pixel).
    """

    def infer(node):
        x, rois, bi = node.inputs[0], node.inputs[1], node.inputs[2]
        _check(node, x, rois, bi)
        _, _, oh, ow, _, _ = _attrs(node)
        return [TensorType(x.dtype, (rois.shape[0], x.shape[1], oh, ow))]

    def reference(node, ins):
        return [roi_align_reference(ins[0], ins[1], ins[2], *_attrs(node))]

    importer = _roialign_import

    def lower(ctx):
        emit_roi_align(ctx, *ctx.inputs[:3], ctx.outputs[0], *_attrs(ctx.node))
