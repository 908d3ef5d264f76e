"""Data types and tensor types of the graph IR.

Every IR value has a :class:`TensorType`: an element :class:`DType` and a static shape
(a tuple of non-negative ints; ``()`` is a scalar). Text forms follow the IR printer:
``f32[1,3,224,224]``, ``i64[]``, ``bool[4]``.

The low-bit types (float8 ``f8e4m3fn``, ``f8e4m3fnuz``, ``f8e5m2``, ``f8e5m2fnuz``; float4
``f4e2m1``; integers ``i4``, ``u4``, ``i2``, ``u2``; :attr:`DType.is_lowbit`) are storage types:
one element per byte, as numpy holds them (``ml_dtypes``; the 4- and 2-bit integers in the low
bits of their byte), ONNX's packing of 4- and 2-bit tensors undone by ``onnx.numpy_helper``.
Only QuantizeLinear and DequantizeLinear compute on them (``ir/lowbit.py``); they are neither
:attr:`DType.is_float` nor :attr:`DType.is_int`, so no arithmetic op takes them, and kernels
see their bytes as :attr:`DType.storage` (u8).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import ml_dtypes  # onnx depends on it: numpy's bfloat16, float8, float4, int4 and int2
import numpy as np
from onnx import TensorProto


class DType(enum.Enum):
    """Element types. Value is the short text name used in IR dumps."""

    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    bool = "bool"
    f8e4m3fn = "f8e4m3fn"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2 = "f8e5m2"
    f8e5m2fnuz = "f8e5m2fnuz"
    f4e2m1 = "f4e2m1"
    i4 = "i4"
    u4 = "u4"
    i2 = "i2"
    u2 = "u2"

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(_TO_NP[self])

    @property
    def itemsize(self) -> int:
        """Bytes per element as stored in buffers (bool is one byte)."""
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        """f16, bf16, f32, f64: the float types arithmetic takes (not the low-bit floats)."""
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64)

    @property
    def is_int(self) -> bool:
        """The integer types arithmetic takes, i8 .. u64 (not the 4- and 2-bit integers)."""
        return self.name[0] in "iu" and not self.is_lowbit

    @property
    def is_lowbit(self) -> bool:
        """A storage-only type of fewer than 8 significant bits or a float8 (see the module
        docstring): f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f4e2m1, i4, u4, i2, u2."""
        return self in LOWBIT_DTYPES

    @property
    def storage(self) -> "DType":
        """The dtype kernels load and store this type's elements as: u8 for a low-bit type (one
        element per byte), the type itself otherwise."""
        return DType.u8 if self.is_lowbit else self

    @property
    def is_signed(self) -> bool:
        return self.name[0] in "if" or self is DType.bf16

    @property
    def onnx(self) -> int:
        return _TO_ONNX[self]

    @staticmethod
    def from_numpy(dt) -> "DType":
        dt = np.dtype(dt)
        try:
            return _FROM_NP[dt]
        except KeyError:
            raise TypeError(f"numpy dtype {dt} has no tensorfuse DType") from None

    @staticmethod
    def from_onnx(elem_type: int) -> "DType":
        try:
            return _FROM_ONNX[elem_type]
        except KeyError:
            name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
            raise TypeError(f"ONNX element type {name} is not supported") from None

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    def __str__(self) -> str:
        return self.value


#: the storage-only low-bit types (:attr:`DType.is_lowbit`)
LOWBIT_DTYPES = (DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz, DType.f4e2m1,
                 DType.i4, DType.u4, DType.i2, DType.u2)

_TO_NP = {
    DType.f16: np.float16, DType.f32: np.float32, DType.f64: np.float64,
    DType.i8: np.int8, DType.i16: np.int16, DType.i32: np.int32, DType.i64: np.int64,
    DType.u8: np.uint8, DType.u16: np.uint16, DType.u32: np.uint32, DType.u64: np.uint64,
    DType.bool: np.bool_, DType.bf16: ml_dtypes.bfloat16,
    DType.f8e4m3fn: ml_dtypes.float8_e4m3fn, DType.f8e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    DType.f8e5m2: ml_dtypes.float8_e5m2, DType.f8e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    DType.f4e2m1: ml_dtypes.float4_e2m1fn, DType.i4: ml_dtypes.int4, DType.u4: ml_dtypes.uint4,
    DType.i2: ml_dtypes.int2, DType.u2: ml_dtypes.uint2,
}
_FROM_NP = {np.dtype(v): k for k, v in _TO_NP.items()}
_TO_ONNX = {
    DType.f16: TensorProto.FLOAT16, DType.bf16: TensorProto.BFLOAT16, DType.f32: TensorProto.FLOAT,
    DType.f64: TensorProto.DOUBLE, DType.i8: TensorProto.INT8, DType.i16: TensorProto.INT16,
    DType.i32: TensorProto.INT32, DType.i64: TensorProto.INT64, DType.u8: TensorProto.UINT8,
    DType.u16: TensorProto.UINT16, DType.u32: TensorProto.UINT32, DType.u64: TensorProto.UINT64,
    DType.bool: TensorProto.BOOL,
    DType.f8e4m3fn: TensorProto.FLOAT8E4M3FN, DType.f8e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ,
    DType.f8e5m2: TensorProto.FLOAT8E5M2, DType.f8e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ,
    DType.f4e2m1: TensorProto.FLOAT4E2M1, DType.i4: TensorProto.INT4, DType.u4: TensorProto.UINT4,
    DType.i2: TensorProto.INT2, DType.u2: TensorProto.UINT2,
}
_FROM_ONNX = {v: k for k, v in _TO_ONNX.items()}


@dataclass(frozen=True)
class TensorType:
    """A static tensor type: dtype plus shape (row-major, dims >= 0)."""

    dtype: DType
    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"

    @staticmethod
    def of(array: np.ndarray) -> "TensorType":
        return TensorType(DType.from_numpy(array.dtype), array.shape)

    @staticmethod
    def parse(text: str) -> "TensorType":
        name, _, rest = text.strip().partition("[")
        if not rest.endswith("]"):
            raise ValueError(f"bad tensor type {text!r}")
        dims = rest[:-1].strip()
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        return TensorType(DType(name), shape)
