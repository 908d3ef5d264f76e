"""Convolutions: Conv, ConvTranspose, ConvInteger (ONNX operator spec, sections "Conv",
"ConvTranspose", "ConvInteger"; IR semantics are those of Conv-22 / ConvTranspose-22 /
ConvInteger-10).

Layout is NCHW generalised to N-D: X is [N, C, D1, ..., Dn], W is [M, C/group, k1, ..., kn]
(ConvTranspose: [C, M/group, k1, ..., kn]). The geometry helpers here (:func:`conv_geometry`,
:func:`window_lo`, :func:`window_hi`) are shared with the pooling ops.

The generic kernels are built row by row: for each (n, output channel) and each output row
(all output spatial dims but the last), a local accumulator holds a row of outputs; the
reduction over (input channel, kernel taps) runs outside, and the innermost loop walks the
contiguous output columns, its range clamped so that no padding test runs per element. Bias
and the fused epilogue (``ctx.apply_epilogue``) are applied once per element before its
single store. A backend's schedules for 2-D convolutions (register tiles, Winograd,
depthwise: for llvm ``codegen/llvm/schedules/conv2d*.py``) replace that nest where they
apply (:func:`emit_conv`, schedule key ``"conv2d"``).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tensorfuse.ir.kernel import Buffer, Expr, KernelBuilder, as_expr, maximum, minimum, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import check_float
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

FLOAT_TYPES = (DType.f16, DType.f32, DType.f64, DType.bf16)
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
#: longest output row accumulated in one local buffer (longer rows are tiled)
ROW_TILE = 512


# ----------------------------------------------------------------------------- geometry
def ints_attr(node, name: str, n: int, default: int, what: str | None = None) -> list[int]:
    """An ints attribute of length ``n`` (the spatial rank), or ``[default] * n`` if absent."""
    v = node.attr(name)
    if v is None or len(v) == 0:
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise ShapeError(f"{what or name} has {len(v)} values, expected {n} (one per spatial dim)")
    return v


def conv_pads(node, nsp: int) -> list[int]:
    """The ``pads`` attribute as [begin..., end...] (2 * nsp values), zeros when absent."""
    v = node.attr("pads")
    if v is None or len(v) == 0:
        return [0] * (2 * nsp)
    v = [int(x) for x in v]
    if len(v) != 2 * nsp:
        raise ShapeError(f"pads has {len(v)} values, expected {2 * nsp} (begin and end per spatial dim)")
    if any(p < 0 for p in v):
        raise ShapeError(f"pads must be non-negative, got {v}")
    return v


@dataclass
class Geometry:
    """Resolved sliding-window geometry per spatial dim: kernel extent, stride, dilation,
    padding at begin/end, input and output sizes."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads_begin: list[int]
    pads_end: list[int]
    in_shape: list[int]
    out_shape: list[int]

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def dims_2d(self) -> tuple[int, ...]:
        """A 2-D geometry's sizes in the order the 2-D schedules name them:
        (H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw) (input, output, kernel, strides,
        dilations, begin pads)."""
        return (*self.in_shape, *self.out_shape, *self.kernel, *self.strides, *self.dilations, *self.pads_begin)


def conv_geometry(node, in_sp: Sequence[int], kernel: Sequence[int], *, ceil_mode: bool = False) -> Geometry:
    """Output size and effective pads of a sliding window op (Conv, pools).

    auto_pad NOTSET: out = floor_or_ceil((in + pb + pe - ((k-1)*d + 1)) / s) + 1; with
    ``ceil_mode`` the last window must start inside the input or the left padding (ONNX
    MaxPool/AveragePool spec). VALID: as NOTSET with zero pads. SAME_UPPER / SAME_LOWER:
    out = ceil(in / s) and total padding max(0, (out-1)*s + (k-1)*d + 1 - in), the odd unit
    at the end (UPPER) or the beginning (LOWER). Raises ShapeError on bad attributes or an
    empty output.
    """
    nsp = len(in_sp)
    strides = ints_attr(node, "strides", nsp, 1)
    dil = ints_attr(node, "dilations", nsp, 1)
    if any(s <= 0 for s in strides):
        raise ShapeError(f"strides must be positive, got {strides}")
    if any(d <= 0 for d in dil):
        raise ShapeError(f"dilations must be positive, got {dil}")
    if any(k <= 0 for k in kernel):
        raise ShapeError(f"kernel_shape must be positive, got {list(kernel)}")
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        raise ShapeError(f"auto_pad must be one of {AUTO_PADS}, got {auto_pad!r}")
    pb, pe, out = [], [], []
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nsp):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in_sp[i])
            small, big = total // 2, total - total // 2
            pb.append(small if auto_pad == "SAME_UPPER" else big)
            pe.append(big if auto_pad == "SAME_UPPER" else small)
            out.append(o)
    else:
        pads = conv_pads(node, nsp) if auto_pad == "NOTSET" else [0] * (2 * nsp)
        pb, pe = pads[:nsp], pads[nsp:]
        for i in range(nsp):
            span = in_sp[i] + pb[i] + pe[i] - ((kernel[i] - 1) * dil[i] + 1)
            if span < 0:
                raise ShapeError(f"spatial dim {i}: the (dilated) kernel extent {(kernel[i] - 1) * dil[i] + 1} "
                                 f"exceeds the padded input size {in_sp[i] + pb[i] + pe[i]}")
            if ceil_mode:
                o = -(-span // strides[i]) + 1
                if (o - 1) * strides[i] >= in_sp[i] + pb[i]:
                    o -= 1
            else:
                o = span // strides[i] + 1
            out.append(o)
    if any(o <= 0 for o in out):
        raise ShapeError(f"output spatial shape {out} is empty")
    return Geometry(list(kernel), strides, dil, pb, pe, list(in_sp), out)


def _cdiv(numer, den: int):
    """ceil(numer / den) for den > 0; exact for ints, and for Exprs whenever the caller clamps
    the result below at 0 (C division truncates toward zero)."""
    if isinstance(numer, int):
        return -(-numer // den)
    return numer if den == 1 else (numer + (den - 1)) / den


def window_lo(numer, den: int):
    """max(0, ceil(numer / den)): first index t >= 0 with t*den >= numer."""
    c = _cdiv(numer, den)
    return max(0, c) if isinstance(c, int) else maximum(c, 0)


def window_hi(numer, den: int, cap):
    """min(cap, ceil(numer / den)): end of the range t*den < numer, capped. Correct whenever
    the range starts at >= 0 (a negative result only means an empty range)."""
    c = _cdiv(numer, den)
    if isinstance(c, int) and isinstance(cap, int):
        return min(cap, c)
    return minimum(as_expr(c), cap) if isinstance(c, Expr) else minimum(as_expr(cap), c)


def flat_offset(shape: Sequence[int], idx: Sequence) -> Expr:
    """Row-major flat offset of ``idx`` (ints or Exprs) in a tensor of ``shape``."""
    off = as_expr(0)
    for d, i in zip(shape, idx):
        off = off * d + i
    return off


# ----------------------------------------------------------------------------- Conv
def conv_kernel_shape(node, w_shape: Sequence[int]) -> list[int]:
    """kernel_shape attribute, else W's spatial dims; ShapeError if they disagree."""
    ks = node.attr("kernel_shape")
    wk = [int(d) for d in w_shape[2:]]
    if ks is None or len(ks) == 0:
        return wk
    ks = [int(k) for k in ks]
    if ks != wk:
        raise ShapeError(f"kernel_shape {ks} does not match W's spatial dims {wk}")
    return ks


def conv_geometry_of(node, w_index: int = 1) -> Geometry:
    """Geometry of a Conv-like node from the types of X (input 0) and W (input ``w_index``)."""
    x, w = node.inputs[0], node.inputs[w_index]
    return conv_geometry(node, x.shape[2:], conv_kernel_shape(node, w.shape))


def _check_ranks_and_group(node, x, w) -> int:
    """X is [N, C, D1, ...] with W of the same rank, and group is positive; returns group."""
    if x.type.rank < 3:
        raise ShapeError(f"X must be [N, C, D1, ...] with at least one spatial dim, got {list(x.shape)}")
    if w.type.rank != x.type.rank:
        raise ShapeError(f"W has rank {w.type.rank}, X has rank {x.type.rank}; they must match")
    group = int(node.attr("group", 1))
    if group <= 0:
        raise ShapeError(f"group must be positive, got {group}")
    return group


def _infer_conv_shape(node, x, w, b) -> tuple[int, ...]:
    group = _check_ranks_and_group(node, x, w)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if c != cg * group:
        raise ShapeError(f"X has {c} channels but W expects {cg} per group x {group} groups = {cg * group}")
    if m % group:
        raise ShapeError(f"W's {m} output channels are not divisible by group={group}")
    if b is not None and tuple(b.shape) != (m,):
        raise ShapeError(f"B must have shape [{m}] (one bias per output channel), got {list(b.shape)}")
    geo = conv_geometry(node, x.shape[2:], conv_kernel_shape(node, w.shape))
    return (n, m, *geo.out_shape)


def conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, group: int, geo: Geometry,
                   acc_dtype=None) -> np.ndarray:
    """Direct N-D grouped convolution in numpy (accumulates in ``acc_dtype``)."""
    acc_dtype = np.dtype(acc_dtype or (np.float64 if x.dtype == np.float64 else np.float32))
    nsp = geo.rank
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    pad = [(0, 0), (0, 0)]
    for i in range(nsp):
        # explicit end padding may be larger than needed or cut off by floor division
        need = (geo.out_shape[i] - 1) * geo.strides[i] + (geo.kernel[i] - 1) * geo.dilations[i] + 1
        pad.append((geo.pads_begin[i], max(0, need - geo.in_shape[i] - geo.pads_begin[i])))
    xp = np.pad(x.astype(acc_dtype), pad)
    xg = xp.reshape(n, group, cg, *xp.shape[2:])
    wg = w.astype(acc_dtype).reshape(group, mg, cg, *w.shape[2:])
    y = np.zeros((n, group, mg, *geo.out_shape), acc_dtype)
    for k in np.ndindex(*geo.kernel):
        sl = tuple(slice(k[i] * geo.dilations[i],
                         k[i] * geo.dilations[i] + (geo.out_shape[i] - 1) * geo.strides[i] + 1,
                         geo.strides[i]) for i in range(nsp))
        xs = xg[(slice(None), slice(None), slice(None)) + sl]          # [n, g, cg, out...]
        wk = wg[(slice(None), slice(None), slice(None)) + tuple(k)]    # [g, mg, cg]
        y += np.einsum("ngc...,gmc->ngm...", xs, wk)
    y = y.reshape(n, m, *geo.out_shape)
    if b is not None:
        y += b.astype(acc_dtype).reshape(1, m, *([1] * nsp))
    return y


def _conv1d_as_2d(ctx: LowerCtx, x: Buffer, w: Buffer, b, y: Buffer, group: int, geo: Geometry, acc_dtype,
                  finish, params, x_zero, w_zero):
    """A 1-D convolution (X [N, C, L], W [M, C/group, K], Y [N, M, OL]) offered to the 2-D
    ``conv2d`` schedules as one of height 1: X, W and Y seen as [N, C, 1, L], [M, C/group, 1, K]
    and [N, M, 1, OL] (:meth:`LowerCtx.view`, the same slots), the geometry with a height of
    kernel 1, stride 1, no pads; the fused epilogue sees Y's own 3-D index. Whisper's and
    wav2vec's front-end convolutions and temporal CNNs get the register-blocked schedules instead
    of the generic row loop. Returns what ``dispatch`` returns (NO_SCHEDULE: none applies, and
    the context is as it was)."""
    def up(buf):
        return None if buf is None else ctx.view(buf, tuple(buf.shape[:2]) + (1,) + tuple(buf.shape[2:]))
    xv, wv, yv = up(x), up(w), up(y)
    geo2 = Geometry([1] + list(geo.kernel), [1] + list(geo.strides), [1] + list(geo.dilations),
                    [0] + list(geo.pads_begin), [0] + list(geo.pads_end), [1] + list(geo.in_shape),
                    [1] + list(geo.out_shape))
    swap = {id(x): xv, id(w): wv, id(y): yv}
    saved = (ctx.inputs, ctx.outputs, dict(ctx.const_override))
    ctx.inputs = [swap.get(id(t), t) if t is not None else None for t in ctx.inputs]
    ctx.outputs = [swap.get(id(t), t) if t is not None else None for t in ctx.outputs]
    for i, t in enumerate(ctx.inputs):     # compile-time values (packed weights) in the views' shapes
        if t is not None and (t is xv or t is wv) and ctx.const(i) is not None:
            ctx.const_override[i] = np.asarray(ctx.const(i)).reshape(t.shape)
    apply = ctx.apply_epilogue      # the epilogue indexes Y [N, M, OL]: drop the height index
    ctx.apply_epilogue = lambda v, idx: apply(v, list(idx[:2]) + list(idx[3:]))
    if params is not None:
        params = [swap.get(id(t), t) for t in params]
    try:
        done = dispatch("conv2d", ctx, x=xv, w=wv, b=b, y=yv, group=group, geo=geo2, acc_dtype=acc_dtype,
                        hooks=(finish,) if finish is not None else (), params=params, x_zero=x_zero,
                        w_zero=w_zero)
    finally:
        ctx.inputs, ctx.outputs, ctx.const_override = saved
        del ctx.apply_epilogue
    return done


def emit_conv(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, group: int,
              geo: Geometry, *, acc_dtype: DType | None = None,
              x_zero: Buffer | None = None, w_zero: Buffer | None = None,
              finish: Callable[[Expr, Expr], Expr] | None = None,
              params: list[Buffer] | None = None, x_scale: Buffer | None = None) -> KernelBuilder:
    """Emit one kernel computing y = conv(x, w) (+ b), then the fused epilogue, for an N-D
    grouped convolution with resolved geometry ``geo`` (reusable by fused variants).

    Loop nest: parallel over (n, oc); serial over output rows (all spatial dims but the last)
    and tiles of ``ROW_TILE`` columns; a local row accumulator of ``acc_dtype`` (default: x's
    float type, f32 for f16/bf16); reduction over (ic, kernel taps) with clamped tap ranges;
    innermost the output columns. ``finish(acc, oc)`` turns the accumulator (bias added) into
    y's dtype (default: a cast).

    The integer path (ConvInteger, QLinearConv, the quantized ops of ``ir.ops.quant``):
    ``acc_dtype=i32`` with x and w u8/i8, ``x_zero`` (a scalar buffer of x's dtype, or None for
    0) and ``w_zero`` (w's dtype, a scalar or [M] per output channel, or None): the products
    are of (x - x_zero) and (w - w_zero[oc]) in int32 (ONNX ConvInteger-10), padding
    contributing 0; ``b`` (int32 [M]) is added before ``finish``. The zero points are buffers,
    not load functions, so a schedule sees what it may precompute (the llvm ``conv2d_int8``
    packs a constant w with its zero points at compile time).

    ``x_scale``: None, or a buffer [1 or N, C, 1..1] of x's dtype by which each input channel is
    multiplied where it is read (``tensorfuse::FusedConv``'s input S: y = conv(x * S, w)); the
    schedules asked are then those registered for ``"conv2d_input_scale"`` (keywords as below
    plus ``x_scale``), so a schedule that does not read S is never chosen.

    First the target's backend schedules registered for the key ``"conv2d"``
    (``ir.strategy.dispatch``; the llvm ones in ``codegen/llvm/schedules/conv2d*.py``) are
    asked, with the keywords ``x, w, b, y, group, geo, acc_dtype, params, x_zero, w_zero`` and
    ``hooks`` = ``(finish,)`` (None when not given; the float schedules take no hooks); the loop
    nest above is the generic one, used where none applies.
    """
    workload = dict(x=x, w=w, b=b, y=y, group=group, geo=geo, acc_dtype=acc_dtype,
                    hooks=(finish,) if finish is not None else (), params=params, x_zero=x_zero, w_zero=w_zero)
    if x_scale is not None:
        done = dispatch("conv2d_input_scale", ctx, **workload, x_scale=x_scale)
    elif geo.rank == 1 and not ctx.target.simt and acc_dtype in (None, DType.f32) and x.dtype == DType.f32:
        done = _conv1d_as_2d(ctx, x, w, b, y, group, geo, acc_dtype, finish, params, x_zero, w_zero)
    else:
        done = dispatch("conv2d", ctx, **workload)
    if done is not NO_SCHEDULE:
        return done
    if acc_dtype is None:
        acc_dtype = DType.f32 if x.dtype in (DType.f16, DType.bf16) else x.dtype

    def load_x(v, n, c):
        v = v.cast(acc_dtype) - x_zero.flat(0).cast(acc_dtype) if x_zero is not None else v.cast(acc_dtype)
        if x_scale is not None:
            v = v * x_scale.flat((n if x_scale.shape[0] > 1 else 0) * c_ + c).cast(acc_dtype)
        return v

    def load_w(v, oc):
        return v.cast(acc_dtype) - _channel(w_zero, oc, acc_dtype) if w_zero is not None else v.cast(acc_dtype)
    finish = finish or (lambda v, oc: v.cast(y.dtype))
    nsp = geo.rank
    n_, c_ = x.shape[:2]
    m_ = y.shape[1]
    cg, mg = c_ // group, m_ // group
    out, ins = geo.out_shape, geo.in_shape
    ow_n = out[-1]
    # a SIMT target (cuda): one output element per GPU thread (column tiles of 1, the tile loop spatial)
    gpu = ctx.target.simt
    tile = 1 if gpu else min(ow_n, ROW_TILE)
    kb = ctx.kernel(params=params)
    acc = kb.local(acc_dtype, (tile,), hint="row")
    s_l, d_l, p_l, k_l = geo.strides[-1], geo.dilations[-1], geo.pads_begin[-1], geo.kernel[-1]
    with kb.loop(n_ * m_, kind="parallel", hint="nm") as nm:
        n = nm / m_ if m_ > 1 else nm
        oc = nm % m_ if m_ > 1 else as_expr(0)
        g = oc / mg if group > 1 else as_expr(0)
        with kb.grid(out[:-1]) as orow, _tiles(kb, ow_n, tile, "spatial" if gpu else "") as (ow0, tw):
            with kb.loop(tw, kind="vectorize", hint="j") as j:
                kb.store(acc, j, as_expr(0, acc_dtype))
            with kb.loop(cg, hint="ic") as ic:
                c = g * cg + ic if group > 1 else ic
                taps, irow = [], []
                st = contextlib.ExitStack()
                for d in range(nsp - 1):
                    o0 = orow[d] * geo.strides[d] - geo.pads_begin[d]     # input index of tap 0
                    lo = window_lo(-o0, geo.dilations[d])
                    hi = window_hi(ins[d] - o0, geo.dilations[d], geo.kernel[d])
                    kd = st.enter_context(kb.loop(hi, start=lo, hint=f"k{d}_"))
                    taps.append(kd)
                    irow.append(o0 + kd * geo.dilations[d])
                with st, kb.loop(k_l, hint="kw") as kw:
                    off = kw * d_l - p_l                                   # iw = ow*s + off
                    lo = maximum(window_lo(-off, s_l), ow0) if tile < ow_n else window_lo(-off, s_l)
                    hi = window_hi(ins[-1] - off, s_l, ow0 + tw if tile < ow_n else ow_n)
                    wv = load_w(w[[oc, ic, *taps, kw]], oc)
                    xrow = flat_offset(x.shape, [n, c, *irow, 0])
                    with kb.loop(hi, start=lo, kind="vectorize", hint="ow") as ow:
                        a = ow - ow0 if tile < ow_n else ow
                        kb.store(acc, a, acc[a] + wv * load_x(x.flat(xrow + ow * s_l + off), n, c))
            with kb.loop(tw, kind="vectorize", hint="j") as j:
                v = acc[j]
                if b is not None:
                    v = v + b[oc].cast(acc_dtype)
                idx = [n, oc, *orow, ow0 + j if tile < ow_n else j]
                kb.store(y, idx, ctx.apply_epilogue(finish(v, oc), idx))
    return kb


@contextlib.contextmanager
def _tiles(kb: KernelBuilder, n: int, tile: int, role: str = ""):
    """A loop over column tiles when a row is longer than ``tile``; yields (tile start, tile
    width) as Exprs (constants when there is one tile). ``role``: the tile loop's."""
    if tile >= n:
        yield as_expr(0), as_expr(n)
        return
    with kb.loop(-(-n // tile), hint="t", role=role) as t:
        ow0 = t * tile
        yield ow0, minimum(as_expr(tile), n - ow0)


def conv_flops(node) -> float:
    x, w = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    macs = y.type.numel * (x.shape[1] // int(node.attr("group", 1))) * math.prod(w.shape[2:])
    return 2.0 * macs + (y.type.numel if node.input(2) is not None else 0)


@op("Conv", OpPatternKind.OUT_ELEMWISE_FUSABLE, fusion_anchor=True)
class Conv:
    """N-D grouped convolution. ONNX spec: Conv-22 (same semantics since Conv-1).

    Inputs: X [N, C, D1..Dn], W [M, C/group, k1..kn], optional B [M]; all one float dtype
    (f16, bf16, f32, f64). Output Y [N, M, O1..On] with O from pads/auto_pad/strides/dilations
    (see :func:`conv_geometry`); kernel_shape defaults to W's spatial dims. Raises ShapeError
    for mismatched ranks, channels not matching group, bad attribute lengths, an empty output.
    """

    def infer(node):
        x, w, b = node.input(0), node.input(1), node.input(2)
        for v, what in ((x, "X"), (w, "W"), (b, "B")):
            if v is not None:
                check_float(v, what)
                if v.dtype != x.dtype:
                    raise ShapeError(f"{what} has dtype {v.dtype}, X has {x.dtype}; they must match")
        return [TensorType(x.dtype, _infer_conv_shape(node, x, w, b))]

    def reference(node, ins):
        x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
        geo = conv_geometry_of(node)
        return [conv_reference(x, w, b, int(node.attr("group", 1)), geo).astype(x.dtype)]

    def lower(ctx):
        x, w = ctx.inputs[0], ctx.inputs[1]
        b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        emit_conv(ctx, x, w, b, ctx.outputs[0], int(ctx.attr("group", 1)), conv_geometry_of(ctx.node))

    flops = conv_flops


# ----------------------------------------------------------------------------- ConvTranspose
def conv_transpose_geometry(node, in_sp: Sequence[int], kernel: Sequence[int]) -> Geometry:
    """Output size and pads of ConvTranspose (ONNX spec ConvTranspose-22).

    Natural size per dim: s*(in-1) + output_padding + (k-1)*d + 1. ``output_shape`` (spatial
    dims) fixes the size and the pads: total = natural - out, the odd unit at the
    start unless auto_pad is SAME_UPPER. Without it, SAME_UPPER/SAME_LOWER make out = in * s
    the same way (SAME_UPPER: the odd unit at the end); an output_shape up to stride-1 beyond
    the natural size adds outputs (bias only) at the end; VALID means zero pads; NOTSET uses
    ``pads``: out = natural - pb - pe. ``Geometry.in_shape`` holds the input (X) sizes.
    """
    nsp = len(in_sp)
    strides = ints_attr(node, "strides", nsp, 1)
    dil = ints_attr(node, "dilations", nsp, 1)
    opad = ints_attr(node, "output_padding", nsp, 0, "output_padding")
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dil):
        raise ShapeError(f"strides {strides} and dilations {dil} must be positive")
    if any(p < 0 for p in opad):
        raise ShapeError(f"output_padding must be non-negative, got {opad}")
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        raise ShapeError(f"auto_pad must be one of {AUTO_PADS}, got {auto_pad!r}")
    natural = [strides[i] * (in_sp[i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(nsp)]
    out_attr = node.attr("output_shape")
    if out_attr is not None and len(out_attr) > 0:
        out = [int(o) for o in out_attr]
        if len(out) != nsp:
            raise ShapeError(f"output_shape {out_attr} must have {nsp} values (one per spatial dim)")
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [in_sp[i] * strides[i] for i in range(nsp)]
    else:
        out = None
    if out is not None:
        pb, pe = [], []
        for i in range(nsp):
            total = natural[i] - out[i]
            if total <= -strides[i]:
                raise ShapeError(f"output_shape {out} exceeds the size {natural} that the input, strides, kernel "
                                 f"and output_padding give by a stride or more (onnxruntime refuses it too)")
            total = max(total, 0)     # a smaller excess (< stride) is zeros at the end, as in onnxruntime
            small, big = total // 2, total - total // 2
            pb.append(small if auto_pad == "SAME_UPPER" else big)
            pe.append(big if auto_pad == "SAME_UPPER" else small)
    else:
        pads = conv_pads(node, nsp) if auto_pad == "NOTSET" else [0] * (2 * nsp)
        pb, pe = pads[:nsp], pads[nsp:]
        out = [natural[i] - pb[i] - pe[i] for i in range(nsp)]
    if any(o <= 0 for o in out):
        raise ShapeError(f"output spatial shape {out} is empty")
    return Geometry(list(kernel), strides, dil, pb, pe, list(in_sp), out)


def conv_transpose_geometry_of(node) -> Geometry:
    x, w = node.inputs[0], node.inputs[1]
    return conv_transpose_geometry(node, x.shape[2:], conv_kernel_shape(node, w.shape))


def conv_transpose_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, group: int,
                             geo: Geometry) -> np.ndarray:
    """Transposed convolution in numpy: each input position scatters x * w into the output
    at o = i*s - pb + k*d (positions outside [0, out) are dropped)."""
    cd = np.float64 if x.dtype == np.float64 else np.float32
    nsp = geo.rank
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    xg = x.astype(cd).reshape(n, group, cg, *x.shape[2:])
    wg = w.astype(cd).reshape(group, cg, mg, *w.shape[2:])
    y = np.zeros((n, group, mg, *geo.out_shape), cd)
    for k in np.ndindex(*geo.kernel):
        src, dst = [], []
        for i in range(nsp):
            s, off = geo.strides[i], k[i] * geo.dilations[i] - geo.pads_begin[i]   # o = i*s + off
            lo = max(0, -(-(-off) // s))
            hi = min(geo.in_shape[i], -(-(geo.out_shape[i] - off) // s))
            if hi <= lo:
                break
            src.append(slice(lo, hi))
            dst.append(slice(lo * s + off, (hi - 1) * s + off + 1, s))
        else:
            contrib = np.einsum("ngc...,gcm->ngm...", xg[(slice(None),) * 3 + tuple(src)],
                                wg[(slice(None),) * 3 + tuple(k)])
            y[(slice(None),) * 3 + tuple(dst)] += contrib
    y = y.reshape(n, group * mg, *geo.out_shape)
    if b is not None:
        y += b.astype(cd).reshape(1, -1, *([1] * nsp))
    return y


def emit_conv_transpose(ctx: LowerCtx, x: Buffer, w: Buffer, b: Buffer | None, y: Buffer, group: int,
                        geo: Geometry, params: list[Buffer] | None = None) -> KernelBuilder:
    """One kernel for an N-D grouped transposed convolution, gathered per output row.

    Parallel over (n, oc); per output row a local accumulator; for each (ic, outer taps) whose
    input row exists (o + pb - k*d divisible by the stride: one test per row, not per element)
    the innermost loop walks the input columns that land in the row, scattering into it with
    the stride. Bias and the fused epilogue are applied before the single store.
    """
    acc_dtype = DType.f32 if x.dtype in (DType.f16, DType.bf16) else x.dtype
    nsp = geo.rank
    n_, c_ = x.shape[:2]
    m_ = y.shape[1]
    cg, mg = c_ // group, m_ // group
    out, ins = geo.out_shape, geo.in_shape
    ow_n = out[-1]
    gpu = ctx.target.simt               # one output element per GPU thread, as in emit_conv
    tile = 1 if gpu else min(ow_n, ROW_TILE)
    tiled = tile < ow_n
    kb = ctx.kernel(params=params)
    acc = kb.local(acc_dtype, (tile,), hint="row")
    s_l, d_l, p_l, k_l = geo.strides[-1], geo.dilations[-1], geo.pads_begin[-1], geo.kernel[-1]
    with kb.loop(n_ * m_, kind="parallel", hint="nm") as nm:
        n = nm / m_ if m_ > 1 else nm
        oc = nm % m_ if m_ > 1 else as_expr(0)
        g = oc / mg if group > 1 else as_expr(0)
        ocg = oc % mg if group > 1 else oc
        with kb.grid(out[:-1]) as orow, _tiles(kb, ow_n, tile, "spatial" if gpu else "") as (ow0, tw):
            with kb.loop(tw, kind="vectorize", hint="j") as j:
                kb.store(acc, j, as_expr(0, acc_dtype))
            with kb.loop(cg, hint="ic") as ic:
                c = g * cg + ic if group > 1 else ic
                taps, irow = [], []
                st = contextlib.ExitStack()
                for d in range(nsp - 1):
                    s, dl = geo.strides[d], geo.dilations[d]
                    base = orow[d] + geo.pads_begin[d]                    # = i*s + k*d
                    lo = window_lo(base - (ins[d] - 1) * s, dl)
                    hi = window_hi(base + 1, dl, geo.kernel[d])
                    kd = st.enter_context(kb.loop(hi, start=lo, hint=f"k{d}_"))
                    numer = base - kd * dl
                    if s > 1:
                        st.enter_context(kb.if_((numer % s).eq(0)))
                    taps.append(kd)
                    irow.append(numer / s if s > 1 else numer)
                with st, kb.loop(k_l, hint="kw") as kw:
                    off = kw * d_l - p_l                                  # ow = iw*s + off
                    lo = window_lo(ow0 - off, s_l) if tiled else window_lo(-off, s_l)
                    hi = window_hi((ow0 + tw if tiled else ow_n) - off, s_l, ins[-1])
                    wv = w[[c, ocg, *taps, kw]].cast(acc_dtype)
                    xrow = flat_offset(x.shape, [n, c, *irow, 0])
                    with kb.loop(hi, start=lo, kind="vectorize", hint="iw") as iw:
                        a = iw * s_l + off - ow0 if tiled else iw * s_l + off
                        kb.store(acc, a, acc[a] + wv * x.flat(xrow + iw).cast(acc_dtype))
            with kb.loop(tw, kind="vectorize", hint="j") as j:
                v = acc[j]
                if b is not None:
                    v = v + b[oc].cast(acc_dtype)
                idx = [n, oc, *orow, ow0 + j if tiled else j]
                kb.store(y, idx, ctx.apply_epilogue(v.cast(y.dtype), idx))
    return kb


@op("ConvTranspose", OpPatternKind.OUT_ELEMWISE_FUSABLE, fusion_anchor=True)
class ConvTranspose:
    """N-D grouped transposed convolution. ONNX spec: ConvTranspose-22.

    Inputs: X [N, C, D1..Dn], W [C, M/group, k1..kn], optional B [M]; one float dtype.
    Output Y [N, M, O1..On] (see :func:`conv_transpose_geometry` for output_shape,
    output_padding, pads and auto_pad). Raises ShapeError for mismatched ranks or channels,
    bad attribute lengths, an empty output.
    """

    def infer(node):
        x, w, b = node.input(0), node.input(1), node.input(2)
        for v, what in ((x, "X"), (w, "W"), (b, "B")):
            if v is not None:
                check_float(v, what)
                if v.dtype != x.dtype:
                    raise ShapeError(f"{what} has dtype {v.dtype}, X has {x.dtype}; they must match")
        group = _check_ranks_and_group(node, x, w)
        n, c = x.shape[:2]
        if w.shape[0] != c:
            raise ShapeError(f"W's first dim ({w.shape[0]}) must equal X's {c} channels")
        if c % group:
            raise ShapeError(f"X's {c} channels are not divisible by group={group}")
        m = w.shape[1] * group
        if b is not None and tuple(b.shape) != (m,):
            raise ShapeError(f"B must have shape [{m}] (one bias per output channel), got {list(b.shape)}")
        geo = conv_transpose_geometry_of(node)
        return [TensorType(x.dtype, (n, m, *geo.out_shape))]

    def reference(node, ins):
        x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
        y = conv_transpose_reference(x, w, b, int(node.attr("group", 1)), conv_transpose_geometry_of(node))
        return [y.astype(x.dtype)]

    def lower(ctx):
        x, w = ctx.inputs[0], ctx.inputs[1]
        b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        emit_conv_transpose(ctx, x, w, b, ctx.outputs[0], int(ctx.attr("group", 1)),
                            conv_transpose_geometry_of(ctx.node))

    def flops(node):
        x, w = node.inputs[0], node.inputs[1]
        macs = x.type.numel * w.shape[1] * math.prod(w.shape[2:])
        return 2.0 * macs + (node.outputs[0].type.numel if node.input(2) is not None else 0)


# ----------------------------------------------------------------------------- ConvInteger / QLinearConv
QUANT_TYPES = (DType.u8, DType.i8)


def _zero_point(node, i: int, like, m: int | None, what: str) -> None:
    """Check a zero point / scale input: a scalar ([] or [1]), or [m] per output channel."""
    v = node.input(i)
    if v is None:
        return
    if like is not None and v.dtype != like:
        raise ShapeError(f"{what} has dtype {v.dtype}, expected {like}")
    ok = v.type.numel == 1 and v.type.rank <= 1
    if m is not None and tuple(v.shape) == (m,):
        ok = True
    if not ok:
        per = f" or [{m}]" if m is not None else ""
        raise ShapeError(f"{what} must be a scalar{per}, got shape {list(v.shape)}")


def _channel(buf: Buffer | None, oc: Expr, dt: DType) -> Expr | None:
    """Element of a per-tensor or per-output-channel parameter buffer, cast to dt."""
    if buf is None:
        return None
    return (buf.flat(oc) if buf.numel > 1 else buf.flat(0)).cast(dt)


def _per_channel(a: np.ndarray | None, m: int, dtype) -> np.ndarray:
    if a is None:
        return np.zeros((1, m) + (1,), dtype)[..., 0]
    return np.broadcast_to(np.asarray(a).reshape(-1), (m,)).astype(dtype).reshape(1, m)


@op("ConvInteger", OpPatternKind.OUT_ELEMWISE_FUSABLE)
class ConvInteger:
    """Integer convolution: y = conv(x - x_zero_point, w - w_zero_point), accumulated in int32.
    ONNX spec: ConvInteger-10.

    Inputs: x (u8/i8) [N, C, D1..Dn], w (u8/i8) [M, C/group, k1..kn], optional x_zero_point
    (scalar, x's dtype), optional w_zero_point (scalar or [M], w's dtype). Output y: i32
    [N, M, O1..On]. Attributes as Conv; padding contributes zero (it holds x_zero_point).
    """

    def infer(node):
        x, w = node.input(0), node.input(1)
        for v, what in ((x, "x"), (w, "w")):
            if v.dtype not in QUANT_TYPES:
                raise ShapeError(f"{what} has dtype {v.dtype}; ConvInteger takes u8 or i8")
        _zero_point(node, 2, x.dtype, None, "x_zero_point")
        _zero_point(node, 3, w.dtype, w.shape[0] if w.type.rank else None, "w_zero_point")
        return [TensorType(DType.i32, _infer_conv_shape(node, x, w, None))]

    def reference(node, ins):
        x, w = ins[0], ins[1]
        xz = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros((), x.dtype)
        wz = ins[3] if len(ins) > 3 and ins[3] is not None else None
        m = w.shape[0]
        xs = x.astype(np.int64) - np.asarray(xz).astype(np.int64).reshape(())
        ws = w.astype(np.int64) - _per_channel(wz, m, np.int64).reshape((m,) + (1,) * (w.ndim - 1))
        y = conv_reference(xs, ws, None, int(node.attr("group", 1)), conv_geometry_of(node), acc_dtype=np.int64)
        return [y.astype(np.int32)]

    def lower(ctx):
        x, w = ctx.inputs[0], ctx.inputs[1]
        xz = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        wz = ctx.inputs[3] if len(ctx.inputs) > 3 else None
        emit_conv(ctx, x, w, None, ctx.outputs[0], int(ctx.attr("group", 1)), conv_geometry_of(ctx.node),
                  acc_dtype=DType.i32, x_zero=xz, w_zero=wz)

    flops = conv_flops


@op("QLinearConv", OpPatternKind.OUT_ELEMWISE_FUSABLE)
class QLinearConv:
    """Quantized convolution. ONNX spec: QLinearConv-10.

    Inputs: x (u8/i8), x_scale (f32 scalar), x_zero_point (x's dtype, scalar), w (u8/i8),
    w_scale (f32, scalar or [M]), w_zero_point (w's dtype, scalar or [M]), y_scale (f32 scalar),
    y_zero_point (scalar; its dtype is y's), optional B (i32 [M], scale x_scale*w_scale, zero
    point 0). y = saturate(round_half_even(acc * x_scale * w_scale / y_scale) + y_zero_point)
    with acc the int32 convolution of (x - x_zp) and (w - w_zp) plus B.
    """

    def infer(node):
        x, w = node.input(0), node.input(3)
        for v, what in ((x, "x"), (w, "w")):
            if v.dtype not in QUANT_TYPES:
                raise ShapeError(f"{what} has dtype {v.dtype}; QLinearConv takes u8 or i8")
        m = w.shape[0] if w.type.rank else None
        for i, what, like, per in ((1, "x_scale", DType.f32, None), (2, "x_zero_point", x.dtype, None),
                                   (4, "w_scale", DType.f32, m), (5, "w_zero_point", w.dtype, m),
                                   (6, "y_scale", DType.f32, None)):
            if node.input(i) is None and what.endswith("scale"):
                raise ShapeError(f"input {what} is required")
            _zero_point(node, i, like, per, what)
        yz = node.input(7)
        if yz is None:
            raise ShapeError("input y_zero_point is required (it gives y's dtype)")
        _zero_point(node, 7, None, None, "y_zero_point")
        if yz.dtype not in QUANT_TYPES:
            raise ShapeError(f"y_zero_point has dtype {yz.dtype}; expected u8 or i8")
        b = node.input(8)
        if b is not None and (b.dtype != DType.i32 or tuple(b.shape) != (m,)):
            raise ShapeError(f"B must be i32 [{m}], got {b.dtype}{list(b.shape)}")
        return [TensorType(yz.dtype, _infer_conv_shape(node, x, w, None))]

    def reference(node, ins):
        ins = list(ins) + [None] * (9 - len(ins))
        x, xs, xz, w, ws, wz, ys, yz, b = ins
        m = w.shape[0]
        xi = x.astype(np.int64) - (0 if xz is None else np.asarray(xz).astype(np.int64).reshape(()))
        wi = w.astype(np.int64) - _per_channel(wz, m, np.int64).reshape((m,) + (1,) * (w.ndim - 1))
        acc = conv_reference(xi, wi, b, int(node.attr("group", 1)), conv_geometry_of(node, 3), acc_dtype=np.int64)
        shape = (1, m) + (1,) * (x.ndim - 2)
        scale = (np.float32(np.asarray(xs).reshape(())) * _per_channel(ws, m, np.float32)
                 / np.float32(np.asarray(ys).reshape(()))).reshape(shape)
        y = np.rint(acc.astype(np.float32) * scale) + np.float32(np.asarray(yz).reshape(()))
        info = np.iinfo(yz.dtype)
        return [np.clip(y, info.min, info.max).astype(yz.dtype)]

    def lower(ctx):
        x, xs, xz, w, ws, wz, ys, yz = ctx.inputs[:8]
        b = ctx.inputs[8] if len(ctx.inputs) > 8 else None
        y = ctx.outputs[0]
        i32, f32 = DType.i32, DType.f32
        info = np.iinfo(y.dtype.numpy)

        def finish(acc, oc):
            scale = xs.flat(0) * _channel(ws, oc, f32) / ys.flat(0)
            q = unop("round", acc.cast(f32) * scale) + yz.flat(0).cast(f32)
            return minimum(maximum(q, float(info.min)), float(info.max)).cast(y.dtype)

        emit_conv(ctx, x, w, b, y, int(ctx.attr("group", 1)), conv_geometry_of(ctx.node, 3),
                  acc_dtype=i32, x_zero=xz, w_zero=wz, finish=finish)

    flops = conv_flops
