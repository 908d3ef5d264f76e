"""Signal processing: DFT and STFT (ONNX operator spec, sections DFT and STFT).

Complex tensors are real tensors with a trailing dimension: size 1 (real values) or 2
(real, imaginary). The IR form of DFT is DFT-20: ``dft_length`` (input 1) and ``axis``
(input 2, default -2) are optional inputs that must be known at compile time. DFT-17 (``axis``
an attribute, default 1) is imported with a constant axis input. STFT is STFT-17.

Kernels (why this form): a direct O(n^2) transform. For each output position along the
transformed axis, the twiddle factor of each input position is computed once (cos/sin in
f64 of the angle reduced exactly in integers, ``(k * n) mod L``) and applied to a block of up
to ``CHUNK`` positions of the dimensions after the axis (contiguous in the input), which are
accumulated in f64 local buffers; results are cast to the input dtype.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import Const, KernelBuilder, as_expr, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import const_input
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

CHUNK = 256
I64 = DType.i64
F64 = DType.f64
_FLOATS = (DType.f16, DType.bf16, DType.f32, DType.f64)


def _scalar_int(node, i: int, what: str) -> int | None:
    """A compile-time scalar int input (0-D or one element), or None when omitted."""
    a = const_input(node, i, what)
    if a is None:
        return None
    a = np.asarray(a)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise ShapeError(f"{what} (input {i}) must be one integer, got {a.dtype} of shape {list(a.shape)}")
    return int(a.ravel()[0])


# ----------------------------------------------------------------------------- DFT
def _dft_params(node):
    """(axis, N, L, out_axis_len, out_last, inverse, onesided) for a DFT-20 node."""
    x = node.inputs[0]
    shape = x.shape
    r = len(shape)
    if x.dtype not in _FLOATS:
        raise ShapeError(f"input dtype {x.dtype} is not supported (allowed: f16, bf16, f32, f64)")
    if r < 2:
        raise ShapeError(f"input must have rank >= 2 (signal dims, then the complex dim), got rank {r}")
    if shape[-1] not in (1, 2):
        raise ShapeError(f"the last dimension must be 1 (real) or 2 (complex), got {shape[-1]}")
    axis = _scalar_int(node, 2, "axis")
    axis = -2 if axis is None else axis
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ShapeError(f"axis {axis} is out of range for rank {r} (allowed: [{-r}, -2] and [0, {r - 2}]; "
                         f"the last dimension holds the complex parts)")
    axis %= r
    inverse = bool(node.attr("inverse", 0))
    onesided = bool(node.attr("onesided", 0))
    n = shape[axis]
    length = _scalar_int(node, 1, "dft_length")
    if length is None:
        length = 2 * (n - 1) if (inverse and onesided) else n
    if length < 1:
        raise ShapeError(f"dft_length must be >= 1, got {length}"
                         + (" (the default 2 * (axis size - 1) of an inverse one-sided DFT)"
                            if inverse and onesided and _scalar_int(node, 1, "dft_length") is None else ""))
    if onesided and not inverse:
        m, last = length // 2 + 1, 2
    elif onesided and inverse:
        m, last = length, 1
    else:
        m, last = length, 2
    return axis, n, length, m, last, inverse, onesided


def _dft_ref(x: np.ndarray, length: int, axis: int, inverse: bool, onesided: bool) -> np.ndarray:
    w = np.asarray(x, np.float64)
    sig = w[..., 0] if w.shape[-1] == 1 else w[..., 0] + 1j * w[..., 1]
    if inverse and onesided:
        return np.fft.irfft(sig, n=length, axis=axis)[..., None].astype(x.dtype)
    r = np.fft.ifft(sig, n=length, axis=axis) if inverse else np.fft.fft(sig, n=length, axis=axis)
    if onesided:
        r = np.take(r, range(length // 2 + 1), axis=axis)
    return np.stack([r.real, r.imag], axis=-1).astype(x.dtype)


def _emit_dft(kb: KernelBuilder, outer: int, m: int, j_ext: int, inner: int, length: int,
              sign: float, load, store, weight=None) -> None:
    """Direct DFT: for o < outer, k < m, t < inner:
    acc[o, k, t] = sum_{j < j_ext} weight(j) * load(o, j, t) * exp(sign * 2 pi i * (k j mod L) / L),
    then ``store(o, k, t, re, im)`` (f64 exprs). ``load`` gives (re, im) f64 exprs (im may be None)."""
    chunk = max(min(inner, CHUNK), 1)
    nblk = -(-inner // chunk)
    acr = kb.local(F64, (chunk,), hint="re")
    aci = kb.local(F64, (chunk,), hint="im")
    tw = kb.local(F64, (2,), hint="tw")
    step = 2.0 * math.pi / length
    with kb.loop(outer, hint="o") as o:
        with kb.loop(m, hint="k") as k:
            def block(t0, width):
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    kb.store(acr, t, as_expr(0.0, F64))
                    kb.store(aci, t, as_expr(0.0, F64))
                with kb.loop(j_ext, hint="j") as j:
                    ang = ((k * j) % length).cast(F64) * step
                    c = unop("cos", ang)
                    s = unop("sin", ang)
                    if sign < 0:
                        s = -s
                    if weight is not None:
                        wj = weight(j)
                        c, s = c * wj, s * wj
                    kb.store(tw, 0, c)     # once per (k, j), not per inner position
                    kb.store(tw, 1, s)
                    c, s = tw[0], tw[1]
                    with kb.loop(width, kind="vectorize", hint="t") as t:
                        xr, xi = load(o, j, t0 + t)
                        if xi is None:
                            kb.store(acr, t, acr[t] + xr * c)
                            kb.store(aci, t, aci[t] + xr * s)
                        else:
                            kb.store(acr, t, acr[t] + (xr * c - xi * s))
                            kb.store(aci, t, aci[t] + (xi * c + xr * s))
                with kb.loop(width, kind="vectorize", hint="t") as t:
                    store(o, k, t0 + t, acr[t], aci[t])

            if nblk == 1:
                block(Const(0, I64), inner)
            else:
                with kb.loop(nblk, hint="ib") as ib:
                    block(ib * chunk, minimum(as_expr(chunk), inner - ib * chunk))


@op("DFT", OpPatternKind.OPAQUE, const_inputs=(1, 2))
class DFT:
    """Discrete Fourier transform along one axis. ONNX spec: DFT-20 (DFT-17 imported).

    input: [..., 1] (real) or [..., 2] (real, imaginary), dtype f16/bf16/f32/f64 (computed in
    f64). dft_length (input 1, optional, int scalar) zero-pads or truncates the signal along
    the axis; default the axis size, or 2 * (size - 1) for an inverse one-sided DFT. axis
    (input 2, optional, default -2; DFT-17: attribute, default 1) in [-r, -2] or [0, r-2].
    Both inputs must be known at compile time. Output (same dtype), with L = dft_length:
    onesided=0: [..., L, ..., 2] (forward, or inverse with 1/L scaling); onesided=1,
    inverse=0 (RFFT): [..., L//2 + 1, ..., 2]; onesided=1, inverse=1 (IRFFT: one-sided
    spectrum -> real signal, as numpy.fft.irfft): [..., L, ..., 1]. Like onnx.reference, a
    complex input is accepted for RFFT (the full DFT cut to L//2 + 1 bins) and a real input
    for IRFFT. Raises ShapeError for a last dimension other than 1 or 2, an axis out of
    range, dft_length < 1, axis or dft_length computed at run time, or a non-float dtype.
    """

    def infer(node):
        x = node.inputs[0]
        axis, _n, _l, m, last, _inv, _one = _dft_params(node)
        shape = list(x.shape)
        shape[axis] = m
        shape[-1] = last
        return [TensorType(x.dtype, tuple(shape))]

    def reference(node, ins):
        axis, _n, length, _m, _last, inverse, onesided = _dft_params(node)
        return [_dft_ref(ins[0], length, axis, inverse, onesided)]

    def lower(ctx: LowerCtx):
        axis, n, length, m, last, inverse, onesided = _dft_params(ctx.node)
        x, y = ctx.inputs[0], ctx.outputs[0]
        if y.numel == 0:
            return
        shape = x.shape
        cin = shape[-1]
        outer = math.prod(shape[:axis])
        inner = math.prod(shape[axis + 1:-1])
        kb = ctx.kernel(params=[x, y])
        irfft = inverse and onesided
        j_ext = min(n, length // 2 + 1) if irfft else min(n, length)
        scale = 1.0 / length if inverse else 1.0

        def load(o, j, t):
            off = ((o * n + j) * inner + t) * cin
            xr = x.flat(off).cast(F64)
            return xr, (x.flat(off + 1).cast(F64) if cin == 2 else None)

        def store(o, k, t, re, im):
            off = ((o * m + k) * inner + t) * last
            if inverse:
                re, im = re * scale, im * scale
            kb.store(y, off, re.cast(y.dtype))
            if last == 2:
                kb.store(y, off + 1, im.cast(y.dtype))

        weight = None
        if irfft:
            # Hermitian extension: bins 1 .. ceil(L/2)-1 count twice (k and L-k); bin 0 and,
            # for even L, bin L/2 once (their imaginary parts drop out, as in numpy's irfft)
            def weight(j):
                once = j.eq(0) | (j * 2).eq(length)
                return select(once, as_expr(1.0, F64), as_expr(2.0, F64))
        _emit_dft(kb, outer, m, j_ext, inner, length, 1.0 if inverse else -1.0, load, store, weight)

    def importer(ctx, proto, version):
        if version >= 20:
            return ctx.default_import(proto)
        attrs = ctx.attrs(proto)
        axis = attrs.pop("axis", 1)
        ins = [ctx.value(n) for n in proto.input]
        ins = (ins + [None, None])[:2]
        ins.append(ctx.builder.const(np.array(axis, np.int64), "axis"))
        return ctx.default_import(proto, inputs=ins, attrs=attrs)

    def flops(node):
        _axis, n, length, m, _last, _inv, _one = _dft_params(node)
        return 8.0 * node.outputs[0].type.numel / node.outputs[0].shape[-1] * min(n, length)


# ----------------------------------------------------------------------------- STFT
def _stft_params(node):
    """(frame_step, frame_length, frames, bins, onesided) for an STFT node."""
    x = node.inputs[0]
    if x.dtype not in _FLOATS:
        raise ShapeError(f"signal dtype {x.dtype} is not supported (allowed: f16, bf16, f32, f64)")
    if x.type.rank != 3 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"signal must have shape [batch, signal_length, 1 or 2], got {list(x.shape)}")
    step = _scalar_int(node, 1, "frame_step")
    if step is None:
        raise ShapeError("frame_step (input 1) is required")
    if step < 1:
        raise ShapeError(f"frame_step must be >= 1, got {step}")
    win = node.input(2)
    if win is not None:
        if win.type.rank != 1:
            raise ShapeError(f"window must be 1-D, got shape {list(win.shape)}")
        if win.dtype != x.dtype:
            raise ShapeError(f"window dtype {win.dtype} differs from the signal's {x.dtype}")
    length = _scalar_int(node, 3, "frame_length")
    if length is None:
        length = win.shape[0] if win is not None else x.shape[1]
    elif win is not None and win.shape[0] != length:
        raise ShapeError(f"window length {win.shape[0]} differs from frame_length {length}")
    if length < 1:
        raise ShapeError(f"frame_length must be >= 1, got {length}")
    if length > x.shape[1]:
        raise ShapeError(f"frame_length {length} is longer than the signal ({x.shape[1]})")
    frames = (x.shape[1] - length) // step + 1
    onesided = bool(node.attr("onesided", 1))
    bins = length // 2 + 1 if onesided else length
    return step, length, frames, bins, onesided


@op("STFT", OpPatternKind.OPAQUE, const_inputs=(1, 3))
class STFT:
    """Short-time Fourier transform. ONNX spec: STFT-17.

    signal: [batch, signal_length, 1 (real) or 2 (complex)], f16/bf16/f32/f64 (computed in
    f64); frame_step (input 1, int scalar) and frame_length (input 3, optional int scalar;
    default window length, else signal_length) must be known at compile time; window (input
    2, optional, [frame_length], signal dtype; default all ones). frames =
    (signal_length - frame_length) // frame_step + 1. Output [batch, frames, bins, 2] (signal
    dtype): frame f is the DFT of signal[b, f*step : f*step + frame_length] * window, bins =
    frame_length // 2 + 1 with onesided=1 (default), else frame_length. Raises ShapeError for
    a bad signal shape, frame_step < 1, frame_length < 1 or longer than the signal, a window
    that is not 1-D, of another dtype or of a length other than frame_length, or
    frame_step/frame_length computed at run time.
    """

    def infer(node):
        x = node.inputs[0]
        _step, _length, frames, bins, _one = _stft_params(node)
        return [TensorType(x.dtype, (x.shape[0], frames, bins, 2))]

    def reference(node, ins):
        step, length, frames, bins, _one = _stft_params(node)
        x, win = ins[0], ins[2]
        w = np.asarray(x, np.float64)
        sig = w[..., 0] if w.shape[-1] == 1 else w[..., 0] + 1j * w[..., 1]
        window = np.ones(length) if win is None else np.asarray(win, np.float64)
        idx = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
        fr = sig[:, idx] * window                    # [batch, frames, length]
        r = np.fft.fft(fr, axis=-1)[..., :bins]
        return [np.stack([r.real, r.imag], axis=-1).astype(x.dtype)]

    def lower(ctx: LowerCtx):
        step, length, frames, bins, _one = _stft_params(ctx.node)
        x, y = ctx.inputs[0], ctx.outputs[0]
        win = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        if y.numel == 0:
            return
        batch, slen, cin = x.shape
        kb = ctx.kernel(params=[b for b in (x, win, y) if b is not None])

        def load(o, j, _t):
            b, f = o // frames, o % frames
            off = (b * slen + f * step + j) * cin
            xr = x.flat(off).cast(F64)
            xi = x.flat(off + 1).cast(F64) if cin == 2 else None
            if win is not None:
                wj = win.flat(j).cast(F64)
                xr = xr * wj
                xi = None if xi is None else xi * wj
            return xr, xi

        def store(o, k, _t, re, im):
            off = (o * bins + k) * 2
            kb.store(y, off, re.cast(y.dtype))
            kb.store(y, off + 1, im.cast(y.dtype))

        _emit_dft(kb, batch * frames, bins, length, 1, length, -1.0, load, store)

    def flops(node):
        _step, length, frames, bins, _one = _stft_params(node)
        return 8.0 * node.inputs[0].shape[0] * frames * bins * length
