"""GridSample (ONNX spec, opset 22 semantics; 16 and 20 import as it) and AffineGrid (opset 20).

GridSample(X, grid) -> Y. X [N, C, d1..dr] (r >= 1), grid [N, o1..or, r] whose last axis holds
normalised coordinates in *reverse* dimension order (grid[..., 0] indexes dr, the width).
Y [N, C, o1..or]. Attributes: ``mode`` linear (N-linear) | nearest | cubic (Keys, a = -0.75;
any r, as the spec allows), ``padding_mode`` zeros | border | reflection, ``align_corners``.
Opset 16 spelled the modes bilinear/bicubic and allowed only 4-D X; its importer renames them.

Per spatial dim of size d, a normalised coordinate g maps to x = (g + 1) / 2 * (d - 1) with
align_corners, else ((g + 1) * d - 1) / 2; nearest rounds x half to even. A coordinate
outside [0, d-1] (align_corners) or [-0.5, d-0.5] is clamped to [0, d-1] (border) or
reflected into that range (reflection) before interpolation; the taps that interpolation then
reads outside the tensor are 0 (zeros), clamped (border) or reflected (reflection), each
dimension independently (as the ONNX reference and PyTorch do).

AffineGrid(theta, size) -> grid: theta [N, 2, 3] (2-D) or [N, 3, 4] (3-D), ``size`` (int64,
known at compile time) [N, C, H, W] or [N, C, D, H, W]; grid [N, H, W, 2] or [N, D, H, W, 3]
= theta @ (x, y[, z], 1) over the base grid of normalised pixel centres (align_corners: -1 to
1 inclusive; a dimension of size 1 has the one coordinate 0, as onnxruntime and PyTorch).

Dtypes: X, grid, theta f16/bf16/f32/f64 (computed in float32, float64 for f64).
Errors (ShapeError): rank or shape mismatches between X and grid, an unknown mode or
padding_mode, theta/size shapes that disagree.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from tensorfuse.ir.kernel import as_expr, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

_FLOATS = (DType.f16, DType.bf16, DType.f32, DType.f64)
_MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic", "bicubic": "cubic"}
_PADS = ("zeros", "border", "reflection")
CUBIC_A = -0.75


def _acc(dt: DType) -> DType:
    return DType.f64 if dt == DType.f64 else DType.f32


# ----------------------------------------------------------------------------- GridSample
def _gs_attrs(node):
    mode = node.attr("mode", "linear")
    if mode not in _MODES:
        raise ShapeError(f"mode must be linear, nearest or cubic, got {mode!r}")
    pad = node.attr("padding_mode", "zeros")
    if pad not in _PADS:
        raise ShapeError(f"padding_mode must be one of {_PADS}, got {pad!r}")
    return _MODES[mode], pad, bool(node.attr("align_corners", 0))


def _gs_infer(node) -> list[TensorType]:
    x, grid = node.inputs[0], node.input(1)
    if grid is None:
        raise ShapeError("input 1 (grid) is required")
    for name, v in (("X", x), ("grid", grid)):
        if v.dtype not in _FLOATS:
            raise ShapeError(f"{name} has dtype {v.dtype}; GridSample takes float tensors")
    r = x.type.rank - 2
    if r < 1:
        raise ShapeError(f"X must have rank >= 3 ([N, C, d1..dr]), got {list(x.shape)}")
    if grid.type.rank != r + 2 or grid.shape[-1] != r or grid.shape[0] != x.shape[0]:
        raise ShapeError(f"grid {list(grid.shape)} must be [N={x.shape[0]}, o1..o{r}, {r}] for X {list(x.shape)}")
    _gs_attrs(node)
    return [TensorType(x.dtype, x.shape[:2] + grid.shape[1:-1])]


def _borders(d: int, align: bool) -> tuple[float, float]:
    return (0.0, d - 1.0) if align else (-0.5, d - 0.5)


def _reflect_np(x, lo: float, hi: float):
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.trunc(dx / rng)
    r = dx - n * rng
    even = np.fmod(n, 2) == 0
    low_side = np.where(even, lo + r, hi - r)     # reflected from below
    high_side = np.where(even, hi - r, lo + r)    # reflected from above
    return np.where(below, low_side, np.where(above, high_side, x))


def _cubic_np(t):
    a = CUBIC_A
    x = np.abs(t)
    return [((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a,
            ((a + 2) * x - (a + 3)) * x * x + 1,
            ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1,
            ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a]


def _taps_np(coord, d, mode, pad, align):
    """Per output position: list of (index array int64, valid bool, weight) taps along one dim."""
    lo, hi = _borders(d, align)
    if mode == "nearest":
        coord = np.rint(coord)
    out = (coord < lo) | (coord > hi)
    if pad == "border":
        coord = np.where(out, np.clip(coord, 0, d - 1), coord)
    elif pad == "reflection":
        coord = np.where(out, _reflect_np(coord, lo, hi), coord)
    if mode == "nearest":
        raw = [(np.trunc(coord), np.ones_like(coord))]
    else:
        x0 = np.floor(coord)
        t = coord - x0
        if mode == "linear":
            raw = [(x0, 1 - t), (x0 + 1, t)]
        else:
            raw = list(zip([x0 - 1, x0, x0 + 1, x0 + 2], _cubic_np(t)))
    taps = []
    for i, w in raw:
        if pad == "zeros":
            valid = (i >= 0) & (i < d)
            idx = np.clip(i, 0, d - 1)
        elif pad == "border":
            valid, idx = np.ones(i.shape, bool), np.clip(i, 0, d - 1)
        else:
            valid, idx = np.ones(i.shape, bool), np.clip(np.trunc(_reflect_np(i, lo, hi)), 0, d - 1)
        taps.append((idx.astype(np.int64), valid, w))
    return taps


def _gs_reference(node, ins):
    x, grid = ins
    mode, pad, align = _gs_attrs(node)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    n, c = x.shape[:2]
    dims = x.shape[2:]
    r = len(dims)
    out_sp = grid.shape[1:-1]
    g = grid.astype(acc).reshape(n, -1, r)
    taps = []
    for k, d in enumerate(dims):
        gk = g[..., r - 1 - k]
        coord = (gk + 1) / 2 * (d - 1) if align else ((gk + 1) * d - 1) / 2
        taps.append(_taps_np(coord.astype(acc), d, mode, pad, align))
    xs = x.astype(acc)
    y = np.zeros((n, c, g.shape[1]), acc)
    bidx = np.arange(n)[:, None]
    for combo in itertools.product(*taps):
        w = np.ones(g.shape[:2], acc)
        valid = np.ones(g.shape[:2], bool)
        idx = [bidx]
        for i, v, wt in combo:
            w = w * wt
            valid &= v
            idx.append(i)
        # gather x[b, :, i1, i2, ...] -> [n, P, C]
        vals = xs.transpose(0, *range(2, 2 + r), 1)[tuple(idx)]
        y += np.where(valid, w, 0)[:, None, :] * np.moveaxis(vals, -1, 1)
    return [y.reshape((n, c) + tuple(out_sp)).astype(x.dtype)]


def _gs_lower(ctx: LowerCtx) -> None:
    x, grid = ctx.inputs
    y = ctx.outputs[0]
    if y.numel == 0:
        return
    mode, pad, align = _gs_attrs(ctx.node)
    acc = _acc(x.dtype)
    n, c = x.shape[:2]
    dims = x.shape[2:]
    r = len(dims)
    ntap = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    kb = ctx.kernel()
    idx_l = kb.local(DType.i64, (r * ntap,), hint="tap")
    w_l = kb.local(acc, (r * ntap,), hint="w")
    ok_l = kb.local(DType.bool, (r * ntap,), hint="ok")
    sm = kb.local(acc, (1,), hint="sum")

    def reflect(v, lo, hi):
        rng = hi - lo
        if rng <= 0:
            return as_expr(lo, acc)
        below, above = v < lo, v > hi
        dx = select(below, lo - v, v - hi)
        m = unop("trunc", dx / rng)
        rem = dx - m * rng
        even = (m - unop("floor", m / 2.0) * 2.0).eq(0.0)
        return select(below, select(even, lo + rem, hi - rem), select(above, select(even, hi - rem, lo + rem), v))

    with kb.loop(n, kind="parallel", hint="n") as b, kb.grid(grid.shape[1:-1]) as opos:
        for k, d in enumerate(dims):
            lo, hi = _borders(d, align)
            gk = grid[[b] + list(opos) + [r - 1 - k]].cast(acc)
            coord = (gk + 1.0) / 2.0 * float(d - 1) if align else ((gk + 1.0) * float(d) - 1.0) / 2.0
            if mode == "nearest":
                coord = unop("round", coord)
            if pad != "zeros":
                outside = (coord < lo) | (coord > hi)
                fixed = minimum(maximum(coord, 0.0), float(d - 1)) if pad == "border" else reflect(coord, lo, hi)
                coord = select(outside, fixed, coord)
            if mode == "nearest":
                raw = [(unop("trunc", coord), as_expr(1.0, acc))]
            else:
                x0 = unop("floor", coord)
                t = coord - x0
                if mode == "linear":
                    raw = [(x0, 1.0 - t), (x0 + 1.0, t)]
                else:
                    a = CUBIC_A
                    ax = unop("abs", t)
                    cw = [(((ax + 1.0) * a - 5 * a) * (ax + 1.0) + 8 * a) * (ax + 1.0) - 4 * a,
                          ((ax * (a + 2) - (a + 3)) * ax) * ax + 1.0,
                          (((1.0 - ax) * (a + 2) - (a + 3)) * (1.0 - ax)) * (1.0 - ax) + 1.0,
                          (((2.0 - ax) * a - 5 * a) * (2.0 - ax) + 8 * a) * (2.0 - ax) - 4 * a]
                    raw = list(zip([x0 - 1.0, x0, x0 + 1.0, x0 + 2.0], cw))
            for j, (fi, w) in enumerate(raw):
                if pad == "reflection":
                    fi = unop("trunc", reflect(fi, lo, hi))
                ii = fi.cast(DType.i64)
                slot = k * ntap + j
                kb.store(idx_l, slot, minimum(maximum(ii, 0), d - 1))
                kb.store(w_l, slot, w)
                kb.store(ok_l, slot, (ii >= 0) & (ii < d) if pad == "zeros" else as_expr(True, DType.bool))
        with kb.loop(c, hint="c") as ci:
            kb.store(sm, 0, as_expr(0.0, acc))
            for combo in itertools.product(range(ntap), repeat=r):
                slots = [k * ntap + j for k, j in enumerate(combo)]
                w = w_l[slots[0]]
                ok = ok_l[slots[0]]
                for s in slots[1:]:
                    w = w * w_l[s]
                    ok = ok & ok_l[s]
                val = x[[b, ci] + [idx_l[s] for s in slots]].cast(acc)
                term = w * val
                if pad == "zeros":
                    term = select(ok, term, as_expr(0.0, acc))
                kb.store(sm, 0, sm[0] + term)
            kb.store(y, [b, ci] + list(opos), sm[0].cast(y.dtype))


def _gs_import(ctx, proto, version):
    attrs = ctx.attrs(proto)
    if "mode" in attrs:
        attrs["mode"] = _MODES.get(attrs["mode"], attrs["mode"])
    return ctx.default_import(proto, attrs=attrs)


@op("GridSample", OpPatternKind.OPAQUE)
class GridSample:
    """Sample X at the normalised positions of ``grid`` (nearest, N-linear or cubic; zeros,
    border or reflection padding). ONNX spec: GridSample-22 (16/20 import as it). Shapes,
    dtypes and errors: see the module docstring. One kernel: per output position the taps and
    weights of each dimension go to local buffers, then every channel sums its taps."""

    infer = _gs_infer
    reference = _gs_reference
    lower = _gs_lower
    importer = _gs_import


# ----------------------------------------------------------------------------- AffineGrid
def _ag_geo(node):
    theta = node.inputs[0]
    size = const_input(node, 1, "size")
    if size is None:
        raise ShapeError("input 1 (size) is required")
    size = [int(s) for s in np.asarray(size).ravel()]
    if len(size) not in (4, 5):
        raise ShapeError(f"size must have 4 (2-D) or 5 (3-D) entries, got {size}")
    r = len(size) - 2
    if theta.dtype not in _FLOATS:
        raise ShapeError(f"theta has dtype {theta.dtype}; float tensors only")
    if theta.shape != (size[0], r, r + 1):
        raise ShapeError(f"theta {list(theta.shape)} must be [N={size[0]}, {r}, {r + 1}] for size {size}")
    if any(s < 1 for s in size[2:]):
        raise ShapeError(f"spatial sizes must be >= 1, got {size}")
    return size, r


def _ag_infer(node) -> list[TensorType]:
    size, r = _ag_geo(node)
    return [TensorType(node.inputs[0].dtype, tuple(size[:1]) + tuple(size[2:]) + (r,))]


def _base(d: int, align: bool, i):
    """Normalised coordinate of pixel i of d (works on numpy arrays and kernel Exprs)."""
    if align:
        return (i * (2.0 / (d - 1)) - 1.0) if d > 1 else i * 0.0     # one pixel: its centre, 0
    return (i * 2.0 + 1.0) / float(d) - 1.0


def _ag_reference(node, ins):
    theta = ins[0]
    size, r = _ag_geo(node)
    align = bool(node.attr("align_corners", 0))
    acc = np.float64 if theta.dtype == np.float64 else np.float32
    sp = size[2:]
    axes = [_base(d, align, np.arange(d, dtype=acc)).astype(acc) for d in sp]
    mesh = np.meshgrid(*axes, indexing="ij")                  # (z,) y, x over [D,] H, W
    homo = np.stack([m.ravel() for m in reversed(mesh)] + [np.ones(mesh[0].size, acc)])   # x, y, (z), 1
    out = np.matmul(theta.astype(acc), homo)                  # [N, r, P]
    return [np.moveaxis(out, 1, -1).reshape([size[0]] + sp + [r]).astype(theta.dtype)]


def _ag_lower(ctx: LowerCtx) -> None:
    theta = ctx.inputs[0]
    y = ctx.outputs[0]
    size, r = _ag_geo(ctx.node)
    align = bool(ctx.node.attr("align_corners", 0))
    acc = _acc(theta.dtype)
    sp = size[2:]
    kb = ctx.kernel(params=[theta, y])
    with kb.loop(size[0], kind="parallel", hint="n") as b, kb.grid(sp) as pos:
        coords = [_base(d, align, p.cast(acc)) for d, p in zip(reversed(sp), reversed(pos))]   # x, y, (z)
        for row in range(r):
            v = theta[b, row, r].cast(acc)
            for col, cv in enumerate(coords):
                v = v + theta[b, row, col].cast(acc) * cv
            kb.store(y, [b] + list(pos) + [row], v.cast(y.dtype))


@op("AffineGrid", OpPatternKind.OPAQUE)
class AffineGrid:
    """Sampling grid of an affine transform: grid[n, ..., :] = theta[n] @ (x, y[, z], 1).
    ONNX spec: AffineGrid-20. Shapes, dtypes and errors: see the module docstring."""

    infer = _ag_infer
    reference = _ag_reference
    lower = _ag_lower
    const_inputs = (1,)
