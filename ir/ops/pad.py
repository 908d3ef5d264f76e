"""Pad and CenterCropPad (ONNX operator spec, opset 28 semantics).

Per axis, ``pads`` gives (begin, end) element counts; negative counts crop. The data is cropped
first, then padded from the cropped extent n: ``constant`` fills with a value, ``edge`` repeats
the border, ``reflect`` mirrors without repeating the border (period 2(n-1)), ``wrap`` repeats
periodically (period n). One kernel: each output element loads from an input index computed
per axis (clamped, so a constant-mode element never reads out of bounds) or takes the value.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.kernel import I64, as_expr, select
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.ops.shape import axes_list, ints
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import TensorType

MODES = ("constant", "reflect", "edge", "wrap")


def pad_plan(shape, pads, axes=None) -> list[tuple[int, int, int]]:
    """Per input axis (crop_start, n, pad_begin, pad_end): the kept input range
    [crop_start, crop_start+n) and the padding around it. Output dim = pad_begin + n + pad_end."""
    r = len(shape)
    pads = ints(pads)
    axes = list(range(r)) if axes is None else axes_list(None, axes, r)
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"pads has {len(pads)} values, expected 2 x {len(axes)} axes")
    pb = [0] * r
    pe = [0] * r
    for k, a in enumerate(axes):
        pb[a], pe[a] = pads[k], pads[len(axes) + k]
    plan = []
    for d, b, e in zip(shape, pb, pe):
        lo, hi = max(0, -b), d - max(0, -e)
        if hi < lo:
            raise ShapeError(f"pads {pads} crop more than the whole dimension {d}")
        plan.append((lo, hi - lo, max(b, 0), max(e, 0)))
    return plan


def _out_shape(plan) -> tuple[int, ...]:
    return tuple(b + n + e for _, n, b, e in plan)


def _check_mode(mode: str, plan) -> None:
    if mode not in MODES:
        raise ShapeError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if mode != "constant":
        for _, n, b, e in plan:
            if n == 0 and (b or e):
                raise ShapeError(f"{mode} padding of an empty dimension")


def np_source_index(i: np.ndarray, lo: int, n: int, b: int, mode: str):
    """Input indices (and in-range mask) for output positions i along one axis."""
    j = i - b
    inside = (j >= 0) & (j < n)
    if mode == "edge" or mode == "constant":
        c = np.clip(j, 0, max(n - 1, 0))
    elif mode == "wrap":
        c = np.mod(j, n)
    else:
        p = 2 * (n - 1)
        c = np.zeros_like(j) if p == 0 else np.mod(j, p)
        c = np.where(c >= n, p - c, c)
    return lo + c, inside


def expr_source_index(i, lo: int, n: int, b: int, mode: str):
    """Kernel-IR form of :func:`np_source_index`: (index Expr, in-range Expr or None)."""
    j = i - b if b else i
    inside = None
    if mode in ("edge", "constant"):
        inside = (j >= 0) & (j < n)
        c = select(j < 0, 0, select(j > n - 1, n - 1, j))
    elif mode == "wrap":
        m = j % n
        c = select(m < 0, m + n, m)
    else:
        p = 2 * (n - 1)
        if p == 0:
            c = as_expr(0, I64)
        else:
            m = j % p
            m = select(m < 0, m + p, m)
            c = select(m >= n, p - m, m)
    return c + lo if lo else c, inside


def np_pad(x: np.ndarray, plan, mode: str, value) -> np.ndarray:
    out_shape = _out_shape(plan)
    idx, mask = [], np.ones(out_shape, bool)
    for a, (lo, n, b, e) in enumerate(plan):
        src, inside = np_source_index(np.arange(out_shape[a]), lo, n, b, mode)
        idx.append(src)
        shp = [1] * len(plan)
        shp[a] = -1
        mask = mask & inside.reshape(shp)
    if 0 in out_shape:
        return np.zeros(out_shape, x.dtype)
    if x.size == 0 or any(n == 0 for _, n, _, _ in plan):
        return np.full(out_shape, value, x.dtype)
    y = x[np.ix_(*idx)] if x.ndim else x.copy()
    if mode == "constant":
        y = np.where(mask, y, np.asarray(value).astype(x.dtype))
    return np.ascontiguousarray(y.astype(x.dtype))


def emit_pad(ctx, x, y, plan, mode: str, value, value_buf=None) -> None:
    """One kernel for Pad: ``value`` is a Python number, or ``value_buf`` a scalar buffer."""
    params = [x] + ([value_buf] if value_buf is not None else []) + [y]
    kb = ctx.kernel(params=params)
    if y.numel == 0:
        return
    fill = value_buf.flat(0) if value_buf is not None else as_expr(value, y.dtype)
    if x.numel == 0 or any(n == 0 for _, n, _, _ in plan):
        with kb.loop(y.numel) as i:
            kb.store(y, i, fill)
        return
    with kb.grid(y.shape) as idx:
        src, cond = [], None
        for i, (lo, n, b, e) in zip(idx, plan):
            if b == 0 and e == 0:
                src.append(i + lo if lo else i)
                continue
            c, inside = expr_source_index(i, lo, n, b, mode)
            src.append(c)
            if inside is not None:
                cond = inside if cond is None else cond & inside
        v = x[src] if x.shape else x.flat(0)
        if mode == "constant" and cond is not None:
            v = select(cond, v, fill)
        kb.store(y, idx, v)


def _pad_import(ctx, proto, version):
    if version >= 11:
        return ctx.default_import(proto)
    attrs = ctx.attrs(proto)               # Pad-2: pads and value are attributes
    x = ctx.value(proto.input[0])
    pads = ctx.builder.const(np.asarray(attrs.pop("pads"), np.int64), "pads")
    value = ctx.builder.const(np.asarray(attrs.pop("value", 0.0)).astype(x.dtype.numpy), "pad_value")
    return ctx.default_import(proto, inputs=[x, pads, value], attrs=attrs)


def _pad_node_plan(node, shape, pads, axes):
    if pads is None:
        raise ShapeError("the pads input is required")
    plan = pad_plan(shape, pads, axes)
    _check_mode(node.attr("mode", "constant"), plan)
    return plan


@op("Pad", OpPatternKind.INJECTIVE, const_inputs=(1, 3))
class Pad:
    """Pad(data, pads, constant_value?, axes?) -> data padded (or cropped, for negative pads).

    pads: int64 [2 * len(axes)] = all begins then all ends, known at compile time; axes (int32/
    int64, known at compile time) default to every axis. constant_value: scalar of data's dtype
    (default 0; may be computed at run time). mode: constant | reflect | edge | wrap. Any dtype.
    Raises ShapeError for a bad pads length, an unknown mode, crops larger than a dimension, or
    non-constant padding of an empty axis. ONNX spec: Pad-23 (Pad-2 had pads/value attributes;
    the importer makes them inputs).
    """

    def infer(node):
        x = node.inputs[0]
        plan = _pad_node_plan(node, x.shape, const_input(node, 1, "pads"), const_input(node, 3, "axes"))
        cv = node.input(2)
        if cv is not None and (cv.dtype != x.dtype or cv.type.numel != 1):
            raise ShapeError(f"constant_value must be one element of dtype {x.dtype}, got {cv.type}")
        return [TensorType(x.dtype, _out_shape(plan))]

    def reference(node, ins):
        x = ins[0]
        get = lambda i: ins[i] if i < len(ins) else None  # noqa: E731
        plan = _pad_node_plan(node, x.shape, get(1), get(3))
        value = 0 if get(2) is None else np.asarray(get(2)).reshape(())
        return [np_pad(x, plan, node.attr("mode", "constant"), value)]

    importer = _pad_import

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        plan = _pad_node_plan(ctx.node, x.shape, ctx.const(1), ctx.const(3))
        cv = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        known = ctx.const(2) if cv is not None else None
        value, vbuf = 0, None
        if cv is not None:
            if known is not None:
                value = np.asarray(known).reshape(()).item()
            else:
                vbuf = cv
        emit_pad(ctx, x, y, plan, ctx.attr("mode", "constant"), value, vbuf)


def _ccp_plan(node, shape, target):
    target = ints(target)
    r = len(shape)
    axes = node.attr("axes", None)
    axes = list(range(r)) if axes is None else axes_list(None, axes, r)
    if len(target) != len(axes):
        raise ShapeError(f"shape has {len(target)} values for {len(axes)} axes")
    pads = [0] * (2 * r)
    for a, t in zip(axes, target):
        if t < 0:
            raise ShapeError(f"shape {target} has a negative dimension")
        d = shape[a]
        b = (t - d) // 2 if t >= d else -((d - t) // 2)
        pads[a], pads[r + a] = b, (t - d) - b
    return pad_plan(shape, pads)


@op("CenterCropPad", OpPatternKind.INJECTIVE, const_inputs=(1,))
class CenterCropPad:
    """CenterCropPad(input, shape) -> input center-cropped or zero-padded to ``shape`` on
    ``axes`` (default all). shape: int32/int64 1-D, known at compile time. Any dtype. A crop
    of odd excess starts at excess//2; a pad of odd excess puts excess//2 before.
    Raises ShapeError for a length mismatch. ONNX spec: CenterCropPad-18.
    """

    def infer(node):
        x = node.inputs[0]
        return [TensorType(x.dtype, _out_shape(_ccp_plan(node, x.shape, const_input(node, 1, "shape"))))]

    def reference(node, ins):
        return [np_pad(ins[0], _ccp_plan(node, ins[0].shape, ins[1]), "constant", 0)]

    def lower(ctx):
        x, y = ctx.inputs[0], ctx.outputs[0]
        emit_pad(ctx, x, y, _ccp_plan(ctx.node, x.shape, ctx.const(1)), "constant", 0)
