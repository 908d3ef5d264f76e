"""Resize and Upsample (ONNX operator spec, Resize-19 semantics; Upsample-7/9 and Resize-10/11
are imported as Resize).

Every resized axis maps output index y to a source coordinate x (``coordinate_transformation_
mode``), then to taps (input indices) and weights (``mode``): nearest gives one tap, linear two
(the coordinate clamped into [0, in-1]), cubic four (indices edge-clamped, or dropped and the rest
renormalised with ``exclude_outside``). With ``antialias`` (linear/cubic, an axis whose scale is
below 1), the filter's support is stretched by 1/scale: 2 - 2*(floor(-support/scale) + 1) taps around x,
weights filter((tap - x) * scale) normalised to sum 1 (indices edge-clamped, or dropped with
``exclude_outside``), as onnx.reference computes it. The output element is the sum over the taps of every
resized axis of the product of the weights times the input element. With tf_crop_and_resize, a
source coordinate outside [0, in-1] on any axis yields ``extrapolation_value``.

Coordinates and weights are computed in float32 with the operation order onnxruntime uses,
except nearest mode on an axis resized to ``sizes``, whose coordinate is exact where a rounding
tie is concerned (:func:`nearest_coord`, the spec's scale out/in); values accumulate in float32 (float64 for float64
data). Integer outputs are truncated toward zero and saturated (as onnxruntime does; with antialias
they are rounded half to even, as onnx.reference does -- onnxruntime's fixed-point antialias
path for integers rounds after each axis and can differ by 1). The same per-axis functions
build the numpy reference (on arrays) and the kernel (on kernel-IR expressions).

Extensions of the IR op beyond Resize-19, used by the importer for older versions:
coordinate_transformation_mode "tf_half_pixel_for_nn" (Resize-11: x = (y + 0.5) / scale) and
nearest_mode "simple" (Resize-10 and Upsample as onnxruntime runs them: ceil when an axis is
downsampled, else floor).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorfuse.ir.kernel import I64, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.ops.shape import axes_list, ints
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

F32 = np.float32
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
MODES = ("nearest", "linear", "cubic")
TAPS = {"nearest": 1, "linear": 2, "cubic": 4}


@dataclass
class AxisPlan:
    axis: int
    in_len: int
    out_len: int
    scale: float          # float32 value
    roi: tuple[float, float]
    #: the exact scale out/in as integers when it comes from ``sizes`` (stretch policy), else None
    ratio: tuple[int, int] | None = None


@dataclass
class ResizePlan:
    out_shape: tuple[int, ...]
    axes: list[AxisPlan]  # the axes that need interpolation (others are copied)
    mode: str
    coord: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    extrapolation: float
    antialias: bool = False


# ----------------------------------------------------------------------------- planning
def _nonempty(a):
    return a is not None and np.asarray(a).size > 0


def resize_plan(node, shape, roi, scales, sizes) -> ResizePlan:
    """Output shape and per-axis parameters; ShapeError for invalid attributes or inputs."""
    r = len(shape)
    mode = node.attr("mode", "nearest")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if mode not in MODES:
        raise ShapeError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if coord not in COORD_MODES:
        raise ShapeError(f"coordinate_transformation_mode {coord!r} is not one of {', '.join(COORD_MODES)}")
    if nearest not in NEAREST_MODES:
        raise ShapeError(f"nearest_mode {nearest!r} is not one of {', '.join(NEAREST_MODES[:4])}")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ShapeError(f"keep_aspect_ratio_policy {policy!r} is not stretch, not_larger or not_smaller")
    antialias = node.attr("antialias", 0)
    if antialias not in (0, 1):
        raise ShapeError(f"antialias {antialias!r} must be 0 or 1")
    if antialias and mode == "nearest":
        raise ShapeError("antialias applies to linear and cubic modes, not nearest")
    axes = node.attr("axes", None)
    axes = list(range(r)) if axes is None else axes_list(None, axes, r)
    n = len(axes)
    has_scales, has_sizes = _nonempty(scales), _nonempty(sizes)
    if has_scales == has_sizes:
        raise ShapeError("exactly one of scales and sizes must be given (non-empty)")
    roi_v = [0.0] * n + [1.0] * n
    if _nonempty(roi) and coord == "tf_crop_and_resize":
        roi_v = [float(v) for v in np.asarray(roi, dtype=np.float64).ravel()]
        if len(roi_v) != 2 * n:
            raise ShapeError(f"roi has {len(roi_v)} values, expected 2 x {n} axes")
    elif coord == "tf_crop_and_resize" and not _nonempty(roi):
        raise ShapeError("coordinate_transformation_mode tf_crop_and_resize needs the roi input")
    out = list(shape)
    scl = [F32(1.0)] * r
    exact: dict[int, tuple[int, int]] = {}
    if has_scales:
        sv = np.asarray(scales, dtype=np.float32).ravel()
        if len(sv) != n:
            raise ShapeError(f"scales has {len(sv)} values, expected {n}")
        if not np.isfinite(sv).all() or (sv <= 0).any():
            raise ShapeError(f"scales {sv.tolist()} must be positive and finite")
        for a, s in zip(axes, sv):
            scl[a] = F32(s)
            out[a] = int(np.floor(F32(s) * F32(shape[a])))
    else:
        sz = ints(sizes)
        if len(sz) != n:
            raise ShapeError(f"sizes has {len(sz)} values, expected {n}")
        if any(s < 0 for s in sz):
            raise ShapeError(f"sizes {sz} has a negative value")
        for a, s in zip(axes, sz):
            if shape[a] == 0:
                raise ShapeError(f"cannot resize the empty axis {a}")
        ratios = [F32(s) / F32(shape[a]) for a, s in zip(axes, sz)]
        if policy == "stretch":
            for a, s, q in zip(axes, sz, ratios):
                scl[a], out[a] = q, s
                exact[a] = (s, shape[a])
        else:
            q = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                scl[a] = q
                out[a] = int(np.floor(q * F32(shape[a]) + F32(0.5)))   # round half up (roundf)
    plans = []
    for k, a in enumerate(axes):
        rlo, rhi = roi_v[k], roi_v[n + k]
        trivial_roi = coord != "tf_crop_and_resize" or (rlo == 0.0 and rhi == 1.0)
        if out[a] == shape[a] and scl[a] == 1.0 and trivial_roi and coord != "tf_half_pixel_for_nn":
            continue
        if shape[a] == 0 and out[a] > 0:
            raise ShapeError(f"cannot resize the empty axis {a} to {out[a]}")
        plans.append(AxisPlan(a, shape[a], out[a], float(scl[a]), (rlo, rhi), exact.get(a)))
    return ResizePlan(tuple(out), plans, mode, coord, nearest, float(node.attr("cubic_coeff_a", -0.75)),
                      bool(node.attr("exclude_outside", 0)), float(node.attr("extrapolation_value", 0.0)),
                      bool(antialias))


# ----------------------------------------------------------------------------- per-axis math
class _NpMath:
    """Array versions of the few operations the per-axis functions need (float32 math)."""
    @staticmethod
    def f(v):
        return np.asarray(v).astype(np.float32)

    @staticmethod
    def i(v):
        return np.asarray(v).astype(np.int64)

    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    abs = staticmethod(np.abs)
    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)

    @staticmethod
    def eq(a, b):
        return a == b

    @staticmethod
    def c(v):
        return F32(v)

    @staticmethod
    def clampi(i, n):
        return np.clip(i, 0, n - 1)

    @staticmethod
    def d(v):
        return np.asarray(v).astype(np.float64)

    @staticmethod
    def cd(v):
        return np.float64(v)


class _IrMath:
    """Kernel-IR versions (float32 Exprs)."""
    @staticmethod
    def f(v):
        return v.cast(DType.f32)

    @staticmethod
    def i(v):
        return v.cast(I64)

    @staticmethod
    def floor(v):
        return unop("floor", v)

    @staticmethod
    def ceil(v):
        return unop("ceil", v)

    @staticmethod
    def abs(v):
        return unop("abs", v)

    @staticmethod
    def where(c, a, b):
        return select(c, a, b)

    minimum = staticmethod(minimum)
    maximum = staticmethod(maximum)

    @staticmethod
    def eq(a, b):
        return a.eq(b)

    @staticmethod
    def c(v):
        return as_expr(float(F32(v)), DType.f32)

    @staticmethod
    def clampi(i, n):
        return select(i < 0, 0, select(i > n - 1, n - 1, i))

    @staticmethod
    def d(v):
        return v.cast(DType.f64)

    @staticmethod
    def cd(v):
        return as_expr(float(v), DType.f64)


def source_coord(m, y, ax: AxisPlan, coord: str):
    """Source coordinate (float32) of output index ``y`` along one axis, as onnxruntime computes it."""
    yf = m.f(y)
    s = m.c(ax.scale)
    L, O = ax.in_len, ax.out_len
    if coord == "half_pixel":
        return (yf + m.c(0.5)) / s - m.c(0.5)
    if coord == "asymmetric":
        return yf / s
    if coord == "tf_half_pixel_for_nn":
        return (yf + m.c(0.5)) / s
    if coord == "pytorch_half_pixel":
        return (yf + m.c(0.5)) / s - m.c(0.5) if O > 1 else yf * m.c(0.0)
    if coord == "align_corners":
        return yf * m.c(L - 1) / m.c(O - 1) if O > 1 else yf * m.c(0.0)
    if coord == "half_pixel_symmetric":
        adjustment = F32(O) / (F32(ax.scale) * F32(L))
        offset = (F32(L) / F32(2.0)) * (F32(1.0) - adjustment)
        # onnxruntime adds the double literals 0.5 here: the sum is formed in float64
        v = m.cd(offset) + (m.d(y) + m.cd(0.5)) / m.cd(F32(ax.scale)) - m.cd(0.5)
        return m.f(v)
    if coord == "tf_crop_and_resize":
        rs, re = F32(ax.roi[0]), F32(ax.roi[1])
        if O > 1:
            return m.c(rs * F32(L - 1)) + (yf * m.c(re - rs) * m.c(L - 1)) / m.c(O - 1)
        return yf * m.c(0.0) + m.c(0.5 * (float(rs) + float(re)) * (L - 1))
    raise ShapeError(f"unknown coordinate_transformation_mode {coord!r}")


def nearest_coord(m, y, ax: AxisPlan, coord: str):
    """Source coordinate (float64) of output index ``y`` for nearest mode on an axis resized to
    ``sizes`` (``ax.ratio`` set), by the spec's formula (ONNX Resize-19: x_original = x_resized /
    scale ..., scale = length_resized / length_original) in exact arithmetic as far as rounding
    can tell: x = y * in / out is one correctly rounded float64 division of integers ((2y+1) * in
    over 2 * out for the half-pixel modes), so a coordinate that is exactly a tie (3.5) or an
    integer is exactly that, and one that is not never rounds onto it (the denominator is under
    2**31). A float32 quotient by the rounded float32 scale moved ties either way (issue 24 item 7:
    7 -> 8 rows, row 4: 4 / float32(8/7) is 3.4999998, the spec's 3.5 rounds up with
    round_prefer_ceil, as onnxruntime and onnx.reference do). Over every mode, nearest_mode and
    size pair up to 15 -> 32 where onnxruntime and onnx.reference agree, this agrees with both;
    the float32 quotient missed 33 of them.

    With a float32 ``scales`` input the kernel keeps :func:`source_coord` (float32, as onnxruntime
    computes it): the scale is then exact and the float32 quotient agreed with both oracles
    wherever they agree (and with onnxruntime more often where they do not)."""
    yd = m.d(y)
    L, O = ax.in_len, ax.out_len
    num, den = ax.ratio[1], ax.ratio[0]            # in / out: the reciprocal of the exact scale
    if coord == "align_corners":
        return yd * m.cd(L - 1) / m.cd(O - 1) if O > 1 else yd * m.cd(0.0)
    if coord == "pytorch_half_pixel" and O <= 1:
        return yd * m.cd(0.0)     # onnxruntime's 0 (onnx.reference's -0.5 takes the same index 0)
    if coord == "asymmetric":
        return (yd * m.cd(num)) / m.cd(den)
    x = ((yd * m.cd(2.0) + m.cd(1.0)) * m.cd(num)) / m.cd(2 * den)
    if coord == "tf_half_pixel_for_nn":
        return x
    # half_pixel, pytorch_half_pixel, and half_pixel_symmetric (whose offset
    # (in / 2) * (1 - out / (scale * in)) is 0 for the scale out / in)
    return x - m.cd(0.5)


def axis_taps(m, y, ax: AxisPlan, p: ResizePlan):
    """(indices, weights, extrapolated) for output index ``y`` along one axis: lists of ``TAPS``
    index (int64) and weight (float32) values, and a bool (or None)."""
    x = source_coord(m, y, ax, p.coord)
    L = ax.in_len
    ext = None
    if p.coord == "tf_crop_and_resize":
        ext = (x < m.c(0.0)) | (x > m.c(L - 1))

    if p.mode == "nearest":
        exact = ax.ratio is not None and p.coord != "tf_crop_and_resize"
        xr = nearest_coord(m, y, ax, p.coord) if exact else x
        half, one = (m.cd(0.5), m.cd(1.0)) if exact else (m.c(0.5), m.c(1.0))
        f = m.floor(xr)
        nm = p.nearest
        if nm == "simple":
            nm = "ceil" if ax.scale < 1.0 else "floor"
        if nm == "round_prefer_floor":
            r = m.where(xr - f <= half, f, f + one)
        elif nm == "round_prefer_ceil":
            r = m.where(xr - f < half, f, f + one)
        elif nm == "floor":
            r = f
        else:
            r = m.ceil(xr)
        return [m.clampi(m.i(r), L)], [None], ext
    if p.mode == "linear":
        xc = m.maximum(m.minimum(x, m.c(L - 1)), m.c(0.0))
        i0 = m.clampi(m.i(m.floor(xc)), L)
        i1 = m.clampi(i0 + 1, L)
        d1 = xc - m.f(i0)
        d2 = m.f(i1) - xc
        same = m.eq(i0, i1)
        w0 = m.where(same, m.c(0.5), d2)
        w1 = m.where(same, m.c(0.5), d1)
        return [i0, i1], [w0, w1], ext
    # cubic
    A = F32(p.cubic_a)
    f = m.floor(x)
    s = x - f
    base = m.i(f)
    s1, t, t1 = s + m.c(1.0), m.c(1.0) - s, m.c(2.0) - s
    ws = [((m.c(A) * s1 - m.c(5 * A)) * s1 + m.c(8 * A)) * s1 - m.c(4 * A),
          ((m.c(A + 2) * s - m.c(A + 3)) * s) * s + m.c(1.0),
          ((m.c(A + 2) * t - m.c(A + 3)) * t) * t + m.c(1.0),
          ((m.c(A) * t1 - m.c(5 * A)) * t1 + m.c(8 * A)) * t1 - m.c(4 * A)]
    raw = [base + (k - 1) for k in range(4)]
    if p.exclude_outside:
        ws = [m.where((i < 0) | (i > L - 1), m.c(0.0), w) for i, w in zip(raw, ws)]
        tot = ws[0] + ws[1] + ws[2] + ws[3]
        ws = [w / tot for w in ws]
    return [m.clampi(i, L) for i in raw], ws, ext


# ----------------------------------------------------------------------------- antialias
def antialias_window(ax: AxisPlan, p: ResizePlan):
    """(start, count) of the taps of the stretched filter when ``antialias`` applies to this axis
    (linear or cubic mode, scale < 1), else None. The filter's support (1 for linear, 2 for cubic)
    is stretched by 1/scale: taps are base + start + k for k < count, where base is the input index
    left of the source coordinate x (x - 1 when x is an integer) -- as onnx.reference does."""
    if not p.antialias or p.mode == "nearest" or ax.scale >= 1.0:
        return None
    support = 1.0 if p.mode == "linear" else 2.0
    start = int(np.floor(-support / ax.scale) + 1)
    return start, 2 - 2 * start


def _aa_filter(m, arg, p: ResizePlan):
    """Unnormalised filter weight at distance ``arg`` (already multiplied by the scale)."""
    a = m.abs(arg)
    if p.mode == "linear":
        return m.maximum(m.c(1.0) - a, m.c(0.0))
    A = F32(p.cubic_a)
    near = ((m.c(A + 2) * a - m.c(A + 3)) * a) * a + m.c(1.0)
    far = ((m.c(A) * a - m.c(5 * A)) * a + m.c(8 * A)) * a - m.c(4 * A)
    return m.where(a <= m.c(1.0), near, m.where(a < m.c(2.0), far, m.c(0.0)))


def _aa_base_ratio(m, x):
    f = m.floor(x)
    base = m.where(m.eq(x, f), f - m.c(1.0), f)
    return base, x - base


def np_antialias_taps(y, ax: AxisPlan, p: ResizePlan):
    """Numpy version of the antialiased taps: (indices, weights, extrapolated) as ``axis_taps``."""
    start, n = antialias_window(ax, p)
    x = source_coord(_NpMath, y, ax, p.coord)
    ext = None
    if p.coord == "tf_crop_and_resize":
        ext = (x < F32(0.0)) | (x > F32(ax.in_len - 1))
    base, ratio = _aa_base_ratio(_NpMath, x)
    k = np.arange(start, start + n)
    arg = (k.astype(np.float32)[None, :] - ratio[:, None]) * F32(ax.scale)
    w = _aa_filter(_NpMath, arg, p).astype(np.float32)
    raw = base.astype(np.int64)[:, None] + k[None, :]
    if p.exclude_outside:
        w = np.where((raw < 0) | (raw > ax.in_len - 1), F32(0.0), w)
    w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    idx = np.clip(raw, 0, ax.in_len - 1)
    return [idx[:, j] for j in range(n)], [w[:, j] for j in range(n)], ext


def emit_antialias_taps(kb, i, ax: AxisPlan, p: ResizePlan, ix, w, ex) -> None:
    """Kernel IR filling ``ix``/``w`` (length count) with the antialiased taps of output index ``i``."""
    start, n = antialias_window(ax, p)
    m = _IrMath
    x = source_coord(m, i, ax, p.coord)
    if ex is not None:
        kb.store(ex, 0, (x < m.c(0.0)) | (x > m.c(ax.in_len - 1)))
    br = kb.local(DType.f32, (3,), hint=f"aa{ax.axis}_")     # base, ratio, weight sum
    base, ratio = _aa_base_ratio(m, x)
    kb.store(br, 0, base)
    kb.store(br, 1, ratio)
    kb.store(br, 2, m.c(0.0))
    with kb.loop(n, hint="k") as k:
        arg = ((k + start).cast(DType.f32) - br.flat(1)) * m.c(ax.scale)
        wt = _aa_filter(m, arg, p)
        raw = br.flat(0).cast(I64) + (k + start)
        if p.exclude_outside:
            wt = select((raw < 0) | (raw > ax.in_len - 1), m.c(0.0), wt)
        kb.store(w, k, wt)
        kb.store(br, 2, br.flat(2) + wt)
        kb.store(ix, k, m.clampi(raw, ax.in_len))
    with kb.loop(n, hint="k") as k:
        kb.store(w, k, w.flat(k) / br.flat(2))


# ----------------------------------------------------------------------------- reference
def np_resize(x: np.ndarray, p: ResizePlan) -> np.ndarray:
    ct = np.float64 if x.dtype == np.float64 else np.float32
    res = x if p.mode == "nearest" else x.astype(ct)
    ext_all = None
    for ax in p.axes:
        y = np.arange(ax.out_len)
        if ax.out_len == 0 or ax.in_len == 0:
            shp = list(res.shape)
            shp[ax.axis] = ax.out_len
            res = np.zeros(shp, res.dtype)
            continue
        if antialias_window(ax, p) is not None:
            idx, ws, ext = np_antialias_taps(y, ax, p)
        else:
            idx, ws, ext = axis_taps(_NpMath, y, ax, p)
        bshape = [1] * x.ndim
        bshape[ax.axis] = -1
        if p.mode == "nearest":
            res = np.take(res, idx[0], axis=ax.axis)
        else:
            acc = 0
            for i, w in zip(idx, ws):
                acc = acc + np.take(res, i, axis=ax.axis) * w.astype(ct).reshape(bshape)
            res = acc
        if ext is not None:
            e = ext.reshape(bshape)
            ext_all = e if ext_all is None else (ext_all | e)
    if ext_all is not None:
        res = np.where(ext_all, np.asarray(p.extrapolation).astype(res.dtype), res)
    if x.dtype.kind in "iu":
        if p.mode != "nearest":
            info = np.iinfo(x.dtype)
            rnd = np.round if any(antialias_window(ax, p) for ax in p.axes) else np.trunc
            res = np.clip(rnd(res), info.min, info.max)
        return np.ascontiguousarray(res.astype(x.dtype))
    return np.ascontiguousarray(np.asarray(res).astype(x.dtype))


# ----------------------------------------------------------------------------- lowering
def emit_resize(ctx, x, y, p: ResizePlan) -> None:
    kb = ctx.kernel(params=[x, y])
    if y.numel == 0:
        return
    ct = DType.f64 if y.dtype == DType.f64 else DType.f32
    by_axis = {ax.axis: ax for ax in p.axes}
    ntaps = {ax.axis: (antialias_window(ax, p) or (0, TAPS[p.mode]))[1] for ax in p.axes}
    loc = {}
    for ax in p.axes:
        ix = kb.local(I64, (ntaps[ax.axis],), hint=f"ix{ax.axis}_")
        w = kb.local(DType.f32, (ntaps[ax.axis],), hint=f"w{ax.axis}_") if p.mode != "nearest" else None
        ex = kb.local(DType.bool, (1,), hint=f"ext{ax.axis}_") if p.coord == "tf_crop_and_resize" else None
        loc[ax.axis] = (ix, w, ex)
    acc = kb.local(ct, (1,)) if p.mode != "nearest" else None
    fill = as_expr(p.extrapolation, y.dtype)

    def inner(idx):
        ext = None
        for ax in p.axes:
            e = loc[ax.axis][2]
            if e is not None:
                ext = e.flat(0) if ext is None else ext | e.flat(0)
        if p.mode == "nearest":
            src = [loc[a][0].flat(0) if a in by_axis else i for a, i in enumerate(idx)]
            v = x[src]
            kb.store(y, idx, v if ext is None else select(ext, fill, v))
            return
        kb.store(acc, 0, as_expr(0.0, ct))

        def taps_loop(k, src, wprod):
            if k == len(p.axes):
                full = [src.get(a, i) for a, i in enumerate(idx)]
                xv = x[full].cast(ct)       # no resized axis (sizes == input shape): weight 1
                kb.store(acc, 0, acc.flat(0) + (xv if wprod is None else wprod.cast(ct) * xv))
                return
            ax = p.axes[k]
            ix, w, _ = loc[ax.axis]
            nt = ntaps[ax.axis]
            with kb.loop(nt, kind="unroll" if nt <= 4 else "serial", hint="t") as t:
                wt = w.flat(t)
                taps_loop(k + 1, {**src, ax.axis: ix.flat(t)}, wt if wprod is None else wprod * wt)

        taps_loop(0, {}, None)
        v = acc.flat(0)
        if y.dtype.is_int and any(antialias_window(ax, p) for ax in p.axes):
            v = unop("round", v)            # antialiased integers are rounded (to even), as onnx.reference
        v = v.cast(y.dtype)                 # integers: truncated and saturated, as onnxruntime
        kb.store(y, idx, v if ext is None else select(ext, fill, v))

    def nest(d, idx):
        if d == len(y.shape):
            inner(idx)
            return
        with kb.loop(y.shape[d], hint=f"i{d}_") as i:
            if d in by_axis and antialias_window(by_axis[d], p) is not None:
                ix, w, ex = loc[d]
                emit_antialias_taps(kb, i, by_axis[d], p, ix, w, ex)
            elif d in by_axis:
                ix, w, ex = loc[d]
                ids, ws, ext = axis_taps(_IrMath, i, by_axis[d], p)
                for k in range(TAPS[p.mode]):
                    kb.store(ix, k, ids[k])
                    if w is not None:
                        kb.store(w, k, ws[k])
                if ex is not None:
                    kb.store(ex, 0, ext)
            nest(d + 1, idx + [i])

    nest(0, [])


# ----------------------------------------------------------------------------- ops
def _plan_of(node, shape, get) -> ResizePlan:
    return resize_plan(node, shape, get(1, "roi"), get(2, "scales"), get(3, "sizes"))


def _resize_import(ctx, proto, version):
    attrs = ctx.attrs(proto)
    ins = [ctx.value(n) for n in proto.input]
    if version < 11:     # Resize-10: (X, scales), asymmetric coordinates, "simple" nearest
        attrs.setdefault("coordinate_transformation_mode", "asymmetric")
        attrs.setdefault("nearest_mode", "simple")
        ins = [ins[0], None, ins[1]]
    return ctx.default_import(proto, inputs=ins, attrs=attrs)


@op("Resize", OpPatternKind.INJECTIVE, const_inputs=(1, 2, 3))
class Resize:
    """Resize(X, roi?, scales?, sizes?) -> X interpolated to a new shape.

    X: any numeric dtype, any rank. roi (float, [2 x axes], only read for tf_crop_and_resize),
    scales (float32, one per axis) or sizes (int64, one per axis): exactly one of scales/sizes,
    all known at compile time. Attributes: mode nearest|linear|cubic (N-D: every listed axis
    is interpolated), coordinate_transformation_mode (half_pixel, half_pixel_symmetric,
    pytorch_half_pixel, align_corners, asymmetric, tf_crop_and_resize with extrapolation_value),
    nearest_mode (round_prefer_floor, round_prefer_ceil, floor, ceil), cubic_coeff_a,
    exclude_outside, keep_aspect_ratio_policy (stretch, not_larger, not_smaller; with sizes),
    axes, antialias (linear/cubic: downsampled axes use the filter stretched by 1/scale, weights
    normalised). Output: floor(in * scale) per axis, or sizes (rounded through the common scale
    for keep_aspect_ratio_policy). Raises ShapeError for invalid attributes or inputs (including
    antialias=1 with mode nearest). ONNX spec: Resize-19 (Resize-10/11/13/18 imported).
    """

    def infer(node):
        x = node.inputs[0]
        p = _plan_of(node, x.shape, lambda i, w: const_input(node, i, w))
        return [TensorType(x.dtype, p.out_shape)]

    def reference(node, ins):
        p = _plan_of(node, ins[0].shape, lambda i, w: ins[i] if i < len(ins) else None)
        return [np_resize(ins[0], p)]

    importer = _resize_import

    def lower(ctx):
        p = _plan_of(ctx.node, ctx.inputs[0].shape, lambda i, w: ctx.const(i))
        emit_resize(ctx, ctx.inputs[0], ctx.outputs[0], p)


def _upsample_import(ctx, proto, version):
    attrs = ctx.attrs(proto)
    x = ctx.value(proto.input[0])
    if version < 9:      # Upsample-7: scales is an attribute
        scales = ctx.builder.const(np.asarray(attrs.pop("scales"), np.float32), "scales")
    else:
        scales = ctx.value(proto.input[1])
    attrs["coordinate_transformation_mode"] = "asymmetric"
    attrs["nearest_mode"] = "simple"
    return ctx.default_import(proto, op="Resize", inputs=[x, None, scales], attrs=attrs)


def _upsample_as_resize(node):
    """The Resize node an Upsample node means (for inference, reference and lowering)."""
    from tensorfuse.ir.graph import Node
    attrs = {"mode": node.attr("mode", "nearest"), "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "simple"}
    return Node("Resize", [node.inputs[0], None, node.input(1)], [], attrs)


@op("Upsample", OpPatternKind.INJECTIVE, const_inputs=(1,))
class Upsample:
    """Upsample(X, scales) -> X resized by scales (>= 1) with asymmetric coordinates: mode nearest
    (floor of the source coordinate) or linear (bilinear on every scaled axis). The importer
    turns it into Resize. Raises ShapeError for invalid scales. ONNX spec: Upsample-9 (deprecated
    since 10; Upsample-7 had scales as an attribute)."""

    def infer(node):
        x = node.inputs[0]
        n = _upsample_as_resize(node)
        p = _plan_of(n, x.shape, lambda i, w: const_input(n, i, w))
        return [TensorType(x.dtype, p.out_shape)]

    def reference(node, ins):
        n = _upsample_as_resize(node)
        return [np_resize(ins[0], _plan_of(n, ins[0].shape, lambda i, w: ins[1] if i == 2 else None))]

    importer = _upsample_import

    def lower(ctx):
        n = _upsample_as_resize(ctx.node)
        p = _plan_of(n, ctx.inputs[0].shape, lambda i, w: ctx.const(1) if i == 2 else None)
        emit_resize(ctx, ctx.inputs[0], ctx.outputs[0], p)
