"""What the llvm backend's int8 schedules share (:mod:`.conv2d_int8`, :mod:`.matmul_int8`): the
integer dot product the target offers, and the compile-time packing of constant weights with
the sums that the zero-point correction needs.

Instruction forms (from the target's features, never assumed):

- ``vnni``: AVX-512 VNNI ``vpdpbusd`` (Intel SDM, "VPDPBUSD"): per 32-bit lane, four u8 of
  one operand times four s8 of the other, summed exactly and added to the int32 accumulator
  (wrapping; not the saturating ``vpdpbusds``). 16 lanes with ``avx512vnni``; 8 lanes (ymm) with
  ``avx512vnni`` + ``avx512vl``, or ``avxvnni``.
- ``pmaddwd``: without VNNI, on AVX2, ``vpmaddwd`` (Intel SDM, "PMADDWD") on operands widened
  to int16 at packing time: per 32-bit lane two i16 x i16 products, added exactly, then
  ``vpaddd``. We do not use ``vpmaddubsw``: its pairwise int16 sum saturates (255 * 127 * 2 =
  64770 > 32767), which would make u8 x s8 results depend on the data (MLAS documents the same
  limitation; onnxruntime's ``reduce_range`` quantizes weights to 7 bits to avoid it). Widened
  operands make every product exact for any u8/i8 values at the same multiply throughput
  (two ``vpmaddwd`` per cycle on Zen 3/4, each 16 multiply-adds at 256 bits), for twice the
  bytes of the packed activations.

The zero-point correction (ONNX ConvInteger / QLinearConv / MatMulInteger: the products are of
(x - xz) and (w - wz)). The packed operands are x_u = x + s (u8: s = 0; i8 with vnni: s = 128,
so x_u is u8) and w_p = w - c (i8: c = 0; u8 with vnni: c = 128, so w_p is s8); with the
int16 form s = c = 0. With a = xz + s (per tensor or per row) and d = c - wz (per output
channel), over the K reduction terms::

    sum (x - xz)(w - wz) = sum (x_u - a)(w_p + d)
                         = sum x_u*w_p + d * sum x_u - a * (sum w_p + K*d)

``sum w_p + K*d`` is packed per output channel at compile time (:class:`PackedWeights`
``corr``), ``d`` likewise; ``sum x_u`` (per output pixel or row) is computed only where some
``d`` is nonzero. Padding positions hold x_u = a, so they add 0; reduction terms added to make
K a multiple of the packing (4 or 2) hold x_u = 0 and w_p = 0. Everything is exact modulo 2**32,
as int32 accumulation is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorfuse.ir.kernel import Buffer
from tensorfuse.ir.types import DType

QUANT = (DType.u8, DType.i8)


@dataclass(frozen=True)
class DotForm:
    """The integer dot product a schedule emits: ``packing`` and ``isa`` of
    :class:`ir.kernel.DotAcc`, ``lanes`` (int32 accumulators per vector), ``per_lane`` (narrow
    elements packed per int32 lane: 4 or 2)."""
    packing: str
    isa: str
    lanes: int

    @property
    def per_lane(self) -> int:
        return 4 if self.packing == "u8s8" else 2

    @property
    def bits(self) -> int:
        return 32 // self.per_lane


def _features(target) -> frozenset:
    try:
        return frozenset(target.feature_set)
    except (AttributeError, ValueError):      # a target without CPU features (a stand-in)
        return frozenset()


def dot_forms(target) -> list[DotForm]:
    """Every integer dot-product form ``target`` has, the preferred first: VPDPBUSD at 16 and 8
    lanes, then VPMADDWD at 16 (AVX-512BW) and 8 (AVX2) lanes. Empty without AVX2."""
    f = _features(target)
    out = []
    if "avx512vnni" in f and "avx512f" in f:
        out.append(DotForm("u8s8", "vnni", 16))
    if ("avx512vnni" in f and "avx512vl" in f) or "avxvnni" in f:
        out.append(DotForm("u8s8", "vnni", 8))
    if out:
        return out
    if "avx512bw" in f:
        out.append(DotForm("s16s16", "pmaddwd", 16))
    if "avx2" in f:
        out.append(DotForm("s16s16", "pmaddwd", 8))
    return out


#: packed 32-bit words of one AMX tile row (64 bytes: 64 u8 / s8 values, four to a word): the
#: reduction step of the tile products
AMX_KQ = 16
#: 64-byte reduction steps per accumulator tile (KH * KW * C / 64 of a convolution, K / 64 of a
#: GEMM) from which ``int8_engine`` defaults to AMX tiles: with a single step each 16 x 16 block
#: of outputs pays a tile store and an epilogue reload for one tile product, and the vector dot
#: product is faster (Emerald Rapids, 1 thread, u8s8 ConvInteger 1x1 at 56x56: 64->256 0.386 ms
#: on tiles against 0.246 on VPDPBUSD, 64->64 0.093 / 0.066; two steps, 128->512 at 28x28,
#: 0.201 / 0.212; four, 256->64 at 56x56, 0.216 / 0.263)
AMX_MIN_STEPS = 2


def amx_by_default(words: int) -> bool:
    """Whether ``int8_engine`` defaults to AMX tiles for a reduction of ``words`` packed 32-bit
    words per output (four u8 / s8 values each: KH * KW * C / 4 of a convolution, K / 4 of a
    GEMM, rounded up): from :data:`AMX_MIN_STEPS` tile steps of :data:`AMX_KQ` words."""
    return -(-words // AMX_KQ) >= AMX_MIN_STEPS


def has_amx(target) -> bool:
    """Whether ``target`` has AMX tiles with the int8 dot product (``amx-tile`` and
    ``amx-int8``: Intel Sapphire Rapids and later) beside AVX-512 VNNI (whose 16-lane u8s8
    packing the tile products share: four k in one 32-bit lane, TDPBUSD's B operand)."""
    f = _features(target)
    return {"amx-tile", "amx-int8", "avx512vnni", "avx512f"} <= f


def activation_offset(form: DotForm, x_dtype: DType) -> int:
    """s: what is added to an activation to pack it (128 for i8 into VPDPBUSD's u8 operand)."""
    return 128 if (form.packing == "u8s8" and x_dtype == DType.i8) else 0


def weight_offset(form: DotForm, w_dtype: DType) -> int:
    """c: what is subtracted from a weight to pack it (128 for u8 into VPDPBUSD's s8 operand)."""
    return 128 if (form.packing == "u8s8" and w_dtype == DType.u8) else 0


def pack_lanes(v: np.ndarray, form: DotForm) -> np.ndarray:
    """Narrow integers [..., g] (g = ``form.per_lane``, already offset into the packing's range)
    -> int32 [...] with element t in bits [t*w, (t+1)*w) (little-endian, as ``DotAcc`` reads)."""
    dt = np.int8 if form.packing == "u8s8" else np.int16
    return np.ascontiguousarray(v.astype(np.int64).astype(dt)).view(np.int32)[..., 0]


def wrap32(v) -> np.ndarray:
    """int64 values modulo 2**32 as int32 (the correction is exact modulo 2**32)."""
    return (np.asarray(v, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


@dataclass
class PackedWeights:
    """Weights offset for ``form`` (``w_p`` int64 [M, K]: output channel, reduction term), with
    ``d`` [M] = c - wz and ``corr`` [M] = sum_k w_p + K*d (int32, wrapped), and whether any
    ``d`` is nonzero (``need_rowsum``)."""
    w_p: np.ndarray
    d: np.ndarray
    corr: np.ndarray
    need_rowsum: bool


def offset_weights(w2: np.ndarray, wz: np.ndarray | None, form: DotForm, w_dtype: DType) -> PackedWeights:
    """``w2`` [M, K] (u8/i8 constant weights, rows = output channels), ``wz`` None, a scalar or
    [M] (the weights' zero points): the offsets and correction terms (module docstring)."""
    m, k = w2.shape
    c = weight_offset(form, w_dtype)
    wzv = np.zeros(m, np.int64) if wz is None else np.broadcast_to(np.asarray(wz).astype(np.int64).reshape(-1), (m,))
    w_p = w2.astype(np.int64) - c
    d = c - wzv
    corr = w_p.sum(axis=1) + k * d
    return PackedWeights(w_p, d, wrap32(corr), bool(np.any(d != 0)))


def const_input(ctx, buf: Buffer | None) -> np.ndarray | None:
    """The compile-time value of the node input held by ``buf`` (None when ``buf`` is None,
    not an input of the node, or not constant)."""
    if buf is None:
        return None
    for i, b in enumerate(ctx.inputs):
        if b is buf:
            return ctx.const(i)
    return None


def packs_narrow(target, lanes: int) -> bool:
    """Whether ``target`` has the x86 packs that narrow int32 vectors of ``lanes`` lanes to bytes
    together (:class:`~ir.kernel.Concat` "x86pack": AVX-512BW at 16 lanes, AVX2 at 8)."""
    return {16: "avx512bw", 8: "avx2"}.get(lanes) in _features(target)


def epilogue_whole_vectors_ok(ctx, y: Buffer) -> bool:
    """Whether the fused epilogue may run on lanes past the valid outputs (a row's end, the
    flat layout's lanes between rows) whose results are then dropped: every tensor it reads
    is a scalar (a QuantizeLinear's scale or zero point: the same value in every lane), and
    none of them is a side output it stores (a side output has the output ``y``'s shape, so
    a scalar one only where ``y`` has one element). A tensor of the output's shape (a
    residual) would be read at the dropped lanes' positions, past a row or past its buffer's
    end, and a side output written there."""
    ins = list(ctx.epilogue_inputs)
    return all(b.numel == 1 for b in ins) and (not ins or y.numel > 1)
