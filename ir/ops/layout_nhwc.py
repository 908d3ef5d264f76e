"""Channels-last (NHWC) variants of the channel-sensitive CNN ops, for the cuda target's layout
pass (``compiler/passes/layout.py``; docs/architecture.md "GPU codegen").

Naming: each op keeps its ONNX name with the suffix ``NHWC``, in the ``tensorfuse`` domain
(``tensorfuse::ConvNHWC``), so a printed graph says at every node which layout it computes in;
the attributes are the ONNX op's, verbatim, and mean what they mean there (pads, strides,
dilations, kernel_shape, ceil_mode ... all over the spatial dims H, W). Only 2-D spatial
(4-D tensors) ops have NHWC variants.

Layouts:

- activations X, Y: [N, H, W, C] (the NCHW tensor transposed by perm [0, 2, 3, 1]);
- Conv weights W: **[KH, KW, C/group, M]** (ONNX's [M, C/group, KH, KW] transposed by
  perm [2, 3, 1, 0], "HWIO"). Output channels are innermost because the kernels map
  consecutive output channels to consecutive threads (GPU) or vector lanes: for one tap and
  one input channel, the M weights that neighbouring threads read are contiguous (coalesced),
  exactly as the output row y[n, oh, ow, :] they write. For a depthwise conv (C/group = 1)
  W[kh, kw, 0, :] is contiguous in the same channel order as x[n, ih, iw, :], so both loads
  of the inner product coalesce. The layout pass repacks constant weights once at compile time.
- per-channel parameters (bias B, BatchNormalization's scale/B/mean/var) stay [C]: in NHWC
  they broadcast along the last axis, numpy's own rule.

Ops here: ``ConvNHWC``, ``FusedConvNHWC`` (Conv + residual Z + activation, as FusedConv),
``MaxPoolNHWC``, ``AveragePoolNHWC``, ``GlobalAveragePoolNHWC``, ``GlobalMaxPoolNHWC``,
``BatchNormalizationNHWC``. Each one's inference and numpy reference are the NCHW op's,
through the transposes (so the meaning is the ONNX op's by construction). The lowerings are in
the generic style that both backends take: the spatial output positions (n, oh) parallel, then
a grid over (ow, output channel) with the channel innermost, reductions over the window taps
(ranges clamped, so padding costs no test) and input channels as ``kb.reduce`` loops, and the
fused epilogue (``ctx.apply_epilogue``) applied once per element before its single store.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.graph import Node, Value
from tensorfuse.ir.kernel import as_expr, maxnum, unop
from tensorfuse.ir.ops.conv import FLOAT_TYPES, Geometry, conv_geometry, conv_reference, window_hi, window_lo
from tensorfuse.ir.ops.fused import (ACTIVATION_ATTRS, DOMAIN, _check_addend, _epilogue, activation_np,
                                     activation_params)
from tensorfuse.ir.registry import OpPatternKind, ShapeError, get_op, onnx_attr_specs, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

#: activation NCHW -> NHWC and back; Conv weights OIHW -> HWIO and back
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
W_TO_HWIO = (2, 3, 1, 0)
W_TO_OIHW = (3, 2, 0, 1)

ANCHOR = OpPatternKind.OUT_ELEMWISE_FUSABLE


def nhwc_name(op_name: str) -> str:
    """The NHWC variant's op name of an ONNX op (``Conv`` -> ``ConvNHWC``)."""
    return op_name + "NHWC"


def _perm_shape(shape, perm) -> tuple[int, ...]:
    return tuple(int(shape[p]) for p in perm)


def _rank4(v: Value | None, what: str) -> None:
    if v is None:
        raise ShapeError(f"input {what} is required")
    if v.type.rank != 4:
        raise ShapeError(f"{what} must be 4-D (N, H, W, C), got shape {list(v.shape)}")


def _proxy(node: Node, op_name: str, in_perms, out_perms) -> Node:
    """A detached node of the NCHW op: inputs and outputs of the transposed types (``in_perms``
    per input: a perm, or None to keep it), the ONNX attributes (activation ones dropped)."""
    ins = []
    for i, v in enumerate(node.inputs):
        p = in_perms[i] if i < len(in_perms) else None
        ins.append(None if v is None else Value(v.name, TensorType(v.dtype, _perm_shape(v.shape, p)) if p else v.type))
    outs = []
    for j, v in enumerate(node.outputs):
        p = out_perms[j] if j < len(out_perms) else None
        outs.append(Value(v.name, TensorType(v.dtype, _perm_shape(v.shape, p)) if p else v.type))
    attrs = {k: a for k, a in node.attrs.items() if k not in ACTIVATION_ATTRS}
    return Node(op_name, ins, outs, attrs, node.name)


def _t(a: np.ndarray | None, perm):
    return None if a is None else np.ascontiguousarray(np.transpose(a, perm))


def _nchw_infer(node: Node, op_name: str, in_perms, n_out: int = 1) -> list[TensorType]:
    """The NCHW op's inference through the transposes; outputs come back as NHWC types."""
    types = get_op(op_name).infer(_proxy(node, op_name, in_perms, ()))
    return [TensorType(t.dtype, _perm_shape(t.shape, TO_NHWC)) for t in types[:n_out]]


def _nchw_reference(node: Node, ins, op_name: str, in_perms, n_out: int = 1) -> list[np.ndarray]:
    proxy = _proxy(node, op_name, in_perms, [TO_NCHW] * len(node.outputs))
    args = [a if (i >= len(in_perms) or in_perms[i] is None) else _t(a, in_perms[i]) for i, a in enumerate(ins)]
    outs = get_op(op_name).reference(proxy, args)
    return [_t(np.asarray(o), TO_NHWC) for o in list(outs)[:n_out]]


# ----------------------------------------------------------------------------- geometry
def nhwc_conv_geometry(node: Node) -> Geometry:
    """Window geometry of a ConvNHWC/FusedConvNHWC node: X [N, H, W, C], W [KH, KW, C/g, M]."""
    x, w = node.inputs[0], node.inputs[1]
    ks = node.attr("kernel_shape")
    wk = [int(d) for d in w.shape[:2]]
    if ks is not None and len(ks) and [int(k) for k in ks] != wk:
        raise ShapeError(f"kernel_shape {list(ks)} does not match W's spatial dims {wk} (W is [KH, KW, C/g, M])")
    return conv_geometry(node, x.shape[1:3], wk)


def nhwc_pool_geometry(node: Node) -> Geometry:
    x = node.inputs[0]
    ks = node.attr("kernel_shape")
    if ks is None or len(ks) != 2:
        raise ShapeError(f"kernel_shape must have 2 values (KH, KW), got {ks}")
    return conv_geometry(node, x.shape[1:3], [int(k) for k in ks], ceil_mode=bool(node.attr("ceil_mode", 0)))


def _acc_dtype(dt: DType) -> DType:
    return DType.f32 if dt in (DType.f16, DType.bf16) else dt


def _conv_dims(x, w, group: int, geo: Geometry):
    """The sizes an NHWC conv kernel works with: (X's [N, H, W, C], W's [KH, KW, C/g, M],
    (OH, OW), M/group, the accumulator dtype, strides, dilations, leading pads)."""
    return (tuple(x.shape), tuple(w.shape), tuple(geo.out_shape), w.shape[3] // group, _acc_dtype(x.dtype),
            tuple(geo.strides), tuple(geo.dilations), tuple(geo.pads_begin))


# ----------------------------------------------------------------------------- Conv
def emit_conv_nhwc(ctx, x, w, b, y, group: int, geo: Geometry):
    """One kernel: y[n, oh, ow, m] = epilogue(sum over (kh, kw, ic) of x[n, ih, iw, g*C/g + ic] *
    w[kh, kw, ic, m] (+ b[m])), with ih = oh*sh - ph + kh*dh (iw alike) and g = m / (M/group).

    Loops: (n, oh) parallel; (ow, m) a grid with m innermost; the taps inside the input (ranges
    clamped) and the input channels of the group as reductions into a one-element accumulator
    (x's float type; f32 for f16/bf16).

    A backend schedule registered for ``"conv2d_nhwc"`` (``ir.strategy``) replaces this form
    where it applies: on cuda an implicit GEMM through shared-memory tiles, or a depthwise
    schedule with the weights in shared memory (``codegen/cuda/schedules/conv_nhwc.py``)."""
    kb = dispatch("conv2d_nhwc", ctx, x=x, w=w, b=b, y=y, group=group, geo=geo)
    if kb is not NO_SCHEDULE:
        return kb
    (n_, h_, w_, c_), (kh_, kw_, cg, m_), (oh_, ow_), mg, acc_dt, (sh, sw), (dh, dw), (ph, pw) = \
        _conv_dims(x, w, group, geo)
    kb = ctx.kernel()
    acc = kb.local(acc_dt, (1,), hint="acc")
    with kb.loop(n_ * oh_, kind="parallel", hint="nh") as nh:
        n = nh / oh_ if oh_ > 1 else nh
        oh = nh % oh_ if oh_ > 1 else as_expr(0)
        with kb.grid([ow_, m_]) as (ow, oc):
            g = oc / mg if group > 1 else as_expr(0)
            kb.store(acc, 0, as_expr(0, acc_dt))
            ih0 = oh * sh - ph
            iw0 = ow * sw - pw
            with kb.reduce(window_hi(h_ - ih0, dh, kh_), start=window_lo(-ih0, dh), hint="kh") as kh:
                with kb.reduce(window_hi(w_ - iw0, dw, kw_), start=window_lo(-iw0, dw), hint="kw") as kw:
                    ih = ih0 + kh * dh
                    iw = iw0 + kw * dw
                    with kb.reduce(cg, hint="ic") as ic:
                        c = g * cg + ic if group > 1 else ic
                        kb.store(acc, 0, acc[0] + x[[n, ih, iw, c]].cast(acc_dt) * w[[kh, kw, ic, oc]].cast(acc_dt))
            v = acc[0]
            if b is not None:
                v = v + b[oc].cast(acc_dt)
            idx = [n, oh, ow, oc]
            kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
    return kb


def _check_conv_nhwc(node) -> int:
    x, w, b = node.input(0), node.input(1), node.input(2)
    _rank4(x, "X")
    _rank4(w, "W ([KH, KW, C/group, M])")
    for v, what in ((x, "X"), (w, "W"), (b, "B")):
        if v is not None and v.dtype not in FLOAT_TYPES:
            raise ShapeError(f"{what} has dtype {v.dtype}; {node.op} takes f16, bf16, f32 or f64")
    return int(node.attr("group", 1))


_CONV_IN = (TO_NCHW, W_TO_OIHW, None)


def _conv_nhwc_flops(node) -> float:
    x, w = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    macs = y.type.numel * (x.shape[3] // int(node.attr("group", 1))) * w.shape[0] * w.shape[1]
    return 2.0 * macs + (y.type.numel if node.input(2) is not None else 0)


@op("ConvNHWC", ANCHOR, domain=DOMAIN, attrs=onnx_attr_specs("Conv"))
class ConvNHWC:
    """ONNX Conv-22 (2-D, grouped, any strides/pads/dilations/auto_pad) in channels-last layout.

    Inputs: X [N, H, W, C], W [KH, KW, C/group, M] (ONNX's W transposed by perm [2, 3, 1, 0]),
    optional B [M]; one float dtype (f16, bf16, f32, f64). Output Y [N, OH, OW, M]: Conv's Y
    transposed by perm [0, 2, 3, 1]. Attributes: Conv's. Raises ShapeError for non-4-D inputs
    and whatever Conv raises (channels not matching group, bad attribute lengths, empty output).
    """

    def infer(node):
        _check_conv_nhwc(node)
        return _nchw_infer(node, "Conv", _CONV_IN)

    def reference(node, ins):
        return _nchw_reference(node, ins, "Conv", _CONV_IN)

    def lower(ctx):
        b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        emit_conv_nhwc(ctx, ctx.inputs[0], ctx.inputs[1], b, ctx.outputs[0], int(ctx.attr("group", 1)),
                       nhwc_conv_geometry(ctx.node))

    flops = _conv_nhwc_flops


@op("FusedConvNHWC", ANCHOR, domain=DOMAIN, attrs={**onnx_attr_specs("Conv"), **ACTIVATION_ATTRS})
class FusedConvNHWC:
    """Y = activation(ConvNHWC(X, W, B) + Z): ``tensorfuse::FusedConv`` in channels-last layout.

    Inputs: X [N, H, W, C], W [KH, KW, C/group, M], B [M] (optional), Z (optional residual,
    unidirectionally broadcastable to Y [N, OH, OW, M]); one float dtype. Attributes: Conv's
    plus ``activation`` / ``activation_params`` (see ``ir.ops.activations.FUSED_ACTIVATIONS``). Z and the
    activation run in the kernel's epilogue before its single store. Raises ShapeError as
    ConvNHWC does, and for an unknown activation or a Z that does not broadcast to Y.
    """

    def infer(node):
        _check_conv_nhwc(node)
        activation_params(node)
        (t,) = _nchw_infer(node, "Conv", _CONV_IN)
        if not t.dtype.is_float:
            raise ShapeError(f"FusedConvNHWC needs a float type, got {t.dtype}")
        _check_addend(node.input(3), t.shape, t.dtype, "Z")
        return [t]

    def reference(node, ins):
        proxy = _proxy(node, "Conv", _CONV_IN, [TO_NCHW])
        x, w = _t(ins[0], TO_NCHW), _t(ins[1], W_TO_OIHW)
        b = ins[2] if len(ins) > 2 else None
        y = _t(get_op("Conv").reference(proxy, [x, w, b])[0], TO_NHWC)
        z = ins[3] if len(ins) > 3 else None
        if z is not None:
            y = (y + z).astype(y.dtype)
        name, params = activation_params(node)
        return [activation_np(name, params, y)]

    def lower(ctx):
        x, w = ctx.inputs[0], ctx.inputs[1]
        b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        z = ctx.inputs[3] if len(ctx.inputs) > 3 else None
        ctx.epilogue = _epilogue(ctx, z)
        emit_conv_nhwc(ctx, x, w, b, ctx.outputs[0], int(ctx.attr("group", 1)), nhwc_conv_geometry(ctx.node))

    def flops(node):
        return _conv_nhwc_flops(node) + 2.0 * node.outputs[0].type.numel


# ----------------------------------------------------------------------------- pools
def emit_pool_nhwc(ctx, x, y, geo: Geometry, kind: str, count_include_pad: int = 0):
    """One kernel for MaxPoolNHWC ("max": NaN skipped, IEEE maxNum, as MaxPool) or
    AveragePoolNHWC ("avg": divided by the taps inside the input, or inside the padded input
    with ``count_include_pad``, as AveragePool). Loops as :func:`emit_conv_nhwc`, channels
    innermost."""
    n_, h_, w_, c_ = x.shape
    oh_, ow_ = geo.out_shape
    acc_dt = x.dtype if kind == "max" else _acc_dtype(x.dtype)
    (sh, sw), (dh, dw), (ph, pw) = geo.strides, geo.dilations, geo.pads_begin
    kh_, kw_ = geo.kernel
    kb = ctx.kernel()
    acc = kb.local(acc_dt, (1,), hint="acc")
    if kind == "max":
        init = float("nan") if acc_dt.is_float else int(np.iinfo(acc_dt.numpy).min)
    else:
        init = 0.0
    with kb.loop(n_ * oh_, kind="parallel", hint="nh") as nh:
        n = nh / oh_ if oh_ > 1 else nh
        oh = nh % oh_ if oh_ > 1 else as_expr(0)
        with kb.grid([ow_, c_]) as (ow, c):
            kb.store(acc, 0, as_expr(init, acc_dt))
            ih0 = oh * sh - ph
            iw0 = ow * sw - pw
            with kb.reduce(window_hi(h_ - ih0, dh, kh_), start=window_lo(-ih0, dh), hint="kh") as kh:
                with kb.reduce(window_hi(w_ - iw0, dw, kw_), start=window_lo(-iw0, dw), hint="kw") as kw:
                    xv = x[[n, ih0 + kh * dh, iw0 + kw * dw, c]]
                    if kind == "max":
                        kb.store(acc, 0, maxnum(acc[0], xv))
                    else:
                        kb.store(acc, 0, acc[0] + xv.cast(acc_dt))
            v = acc[0]
            if kind == "avg":
                cnt = as_expr(1)
                for o0, d, k, lo_lim, hi_lim in (
                        (ih0, dh, kh_, -ph if count_include_pad else 0, h_ + geo.pads_end[0] if count_include_pad else h_),
                        (iw0, dw, kw_, -pw if count_include_pad else 0, w_ + geo.pads_end[1] if count_include_pad else w_)):
                    lo = window_lo(lo_lim - o0, d)
                    hi = window_hi(hi_lim - o0, d, k)
                    cnt = cnt * (as_expr(hi) - lo)
                v = v / cnt.cast(acc_dt)
            idx = [n, oh, ow, c]
            kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
    return kb


def emit_global_pool_nhwc(ctx, x, y, kind: str):
    """y[n, 0, 0, c] = mean ("avg") or maxNum ("max") of x[n, :, :, c]: (n, c) parallel with c
    innermost, the H*W positions as a reduction. A backend schedule registered for
    ``"global_pool_nhwc"`` (``ir.strategy``) may emit the kernel instead: on cuda, planes of at
    least 16 positions take blocks of channel tiles (``codegen/cuda/schedules/pool.py``)."""
    n_, h_, w_, c_ = x.shape
    plane = h_ * w_
    acc_dt = x.dtype if kind == "max" else _acc_dtype(x.dtype)
    kb = dispatch("global_pool_nhwc", ctx, x=x, y=y, kind=kind, acc_dt=acc_dt)
    if kb is not NO_SCHEDULE:
        return kb
    kb = ctx.kernel()
    acc = kb.local(acc_dt, (1,), hint="acc")
    with kb.loop(n_ * c_, kind="parallel", hint="nc") as nc:
        n = nc / c_ if c_ > 1 else nc
        c = nc % c_ if c_ > 1 else as_expr(0)
        kb.store(acc, 0, as_expr(float("nan") if kind == "max" else 0.0, acc_dt))
        with kb.reduce(plane, hint="hw") as hw:
            xv = x.flat((n * plane + hw) * c_ + c)
            kb.store(acc, 0, maxnum(acc[0], xv) if kind == "max" else acc[0] + xv.cast(acc_dt))
        v = acc[0]
        if kind == "avg":
            v = v / as_expr(float(plane), acc_dt)
        idx = [n, as_expr(0), as_expr(0), c]
        kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
    return kb


def _pool_infer(node, op_name):
    _rank4(node.input(0), "X")
    if op_name == "MaxPool" and len(node.outputs) > 1:
        raise ShapeError("MaxPoolNHWC has no Indices output (keep such a MaxPool in NCHW)")
    return _nchw_infer(node, op_name, (TO_NCHW,))


def _pool_flops(node) -> float:
    ks = node.attr("kernel_shape") or []
    return float(node.outputs[0].type.numel * math.prod(int(k) for k in ks))


@op("MaxPoolNHWC", ANCHOR, domain=DOMAIN, attrs=onnx_attr_specs("MaxPool"))
class MaxPoolNHWC:
    """ONNX MaxPool-22 (2-D) in channels-last layout: X [N, H, W, C] -> Y [N, OH, OW, C].

    Attributes: MaxPool's (kernel_shape required; strides, pads, auto_pad, dilations,
    ceil_mode; storage_order only matters for Indices, which this op does not have). Dtypes as
    MaxPool (f16, bf16, f32, f64, i8, u8). NaN is skipped (maxNum), as in MaxPool. Raises
    ShapeError for a non-4-D X, a second output, and whatever MaxPool raises.
    """

    def infer(node):
        return _pool_infer(node, "MaxPool")

    def reference(node, ins):
        return _nchw_reference(node, ins, "MaxPool", (TO_NCHW,))

    def lower(ctx):
        emit_pool_nhwc(ctx, ctx.inputs[0], ctx.outputs[0], nhwc_pool_geometry(ctx.node), "max")

    flops = _pool_flops


@op("AveragePoolNHWC", ANCHOR, domain=DOMAIN, attrs=onnx_attr_specs("AveragePool"))
class AveragePoolNHWC:
    """ONNX AveragePool-22 (2-D) in channels-last layout: X [N, H, W, C] -> Y [N, OH, OW, C].

    Attributes: AveragePool's (kernel_shape required; strides, pads, auto_pad, dilations,
    ceil_mode, count_include_pad). Float dtypes. Raises ShapeError for a non-4-D X and whatever
    AveragePool raises.
    """

    def infer(node):
        return _pool_infer(node, "AveragePool")

    def reference(node, ins):
        return _nchw_reference(node, ins, "AveragePool", (TO_NCHW,))

    def lower(ctx):
        emit_pool_nhwc(ctx, ctx.inputs[0], ctx.outputs[0], nhwc_pool_geometry(ctx.node), "avg",
                       count_include_pad=int(ctx.attr("count_include_pad", 0)))

    flops = _pool_flops


@op("GlobalAveragePoolNHWC", ANCHOR, domain=DOMAIN, attrs={})
class GlobalAveragePoolNHWC:
    """ONNX GlobalAveragePool-22 in channels-last layout: X [N, H, W, C] -> Y [N, 1, 1, C]
    (mean over H and W). Float dtypes. Raises ShapeError for a non-4-D X."""

    def infer(node):
        return _pool_infer(node, "GlobalAveragePool")

    def reference(node, ins):
        return _nchw_reference(node, ins, "GlobalAveragePool", (TO_NCHW,))

    def lower(ctx):
        emit_global_pool_nhwc(ctx, ctx.inputs[0], ctx.outputs[0], "avg")

    def flops(node):
        return float(node.inputs[0].type.numel)


@op("GlobalMaxPoolNHWC", ANCHOR, domain=DOMAIN, attrs={})
class GlobalMaxPoolNHWC:
    """ONNX GlobalMaxPool-22 in channels-last layout: X [N, H, W, C] -> Y [N, 1, 1, C] (max
    over H and W, NaN skipped as GlobalMaxPool). Float dtypes. Raises ShapeError for a non-4-D X."""

    def infer(node):
        return _pool_infer(node, "GlobalMaxPool")

    def reference(node, ins):
        return _nchw_reference(node, ins, "GlobalMaxPool", (TO_NCHW,))

    def lower(ctx):
        emit_global_pool_nhwc(ctx, ctx.inputs[0], ctx.outputs[0], "max")

    def flops(node):
        return float(node.inputs[0].type.numel)


# ----------------------------------------------------------------------------- BatchNormalization
@op("BatchNormalizationNHWC", OpPatternKind.OPAQUE, domain=DOMAIN, attrs=onnx_attr_specs("BatchNormalization"))
class BatchNormalizationNHWC:
    """ONNX BatchNormalization-15 (inference mode) over the last axis: X [N, H, W, C], scale,
    B, input_mean, input_var [C]; Y = X * a + (B - mean * a), a = scale / sqrt(var + epsilon),
    computed in f32 (f64 for f64), as BatchNormalization. Output: X's type. Raises ShapeError
    for a non-4-D X, training_mode=1, and whatever BatchNormalization raises.
    """

    def infer(node):
        _rank4(node.input(0), "X")
        return _nchw_infer(node, "BatchNormalization", (TO_NCHW,))

    def reference(node, ins):
        return _nchw_reference(node, ins, "BatchNormalization", (TO_NCHW,))

    def lower(ctx):
        x, scale, bias, mean, var = ctx.inputs[:5]
        y = ctx.outputs[0]
        cdt = DType.f64 if DType.f64 in (x.dtype, scale.dtype, mean.dtype) else DType.f32
        eps = float(ctx.attr("epsilon", 1e-5))
        n_, h_, w_, c_ = x.shape
        kb = ctx.kernel()
        with kb.loop(n_ * h_, kind="parallel", hint="nh") as nh:
            with kb.grid([w_, c_]) as (w, c):
                a = scale[c].cast(cdt) / unop("sqrt", var[c].cast(cdt) + as_expr(eps, cdt))
                off = (nh * w_ + w) * c_ + c
                v = x.flat(off).cast(cdt) * a + (bias[c].cast(cdt) - mean[c].cast(cdt) * a)
                kb.store(y, off, v.cast(y.dtype))

    def flops(node):
        return 2.0 * node.inputs[0].type.numel


#: NCHW op name -> its NHWC variant (the layout pass converts through this table)
NHWC_VARIANTS = {
    "Conv": "ConvNHWC",
    "FusedConv": "FusedConvNHWC",
    "MaxPool": "MaxPoolNHWC",
    "AveragePool": "AveragePoolNHWC",
    "GlobalAveragePool": "GlobalAveragePoolNHWC",
    "GlobalMaxPool": "GlobalMaxPoolNHWC",
    "BatchNormalization": "BatchNormalizationNHWC",
}
