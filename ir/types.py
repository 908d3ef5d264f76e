"""Data types and tensor types of the graph IR.

Every IR value has a :class:`TensorType`: an element :class:`DType` and a static shape
(a tuple of non-negative ints; ``()`` is a scalar). Text forms follow the IR printer:
``f32[1,3,224,224]``, ``i64[]``, ``bool[4]``.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

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

    @property
    def numpy(self) -> np.dtype:
        if self is DType.bf16:
            import ml_dtypes  # onnx depends on it
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(_TO_NP[self])

    @property
    def itemsize(self) -> int:
        """Bytes per element as stored in buffers (bool is one byte)."""
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64)

    @property
    def is_int(self) -> bool:
        return self.name[0] in "iu"

    @property
    def is_signed(self) -> bool:
        return self.name[0] == "i" or self.is_float

    @property
    def onnx(self) -> int:
        return _TO_ONNX[self]

    @staticmethod
    def from_numpy(dt) -> "DType":
        dt = np.dtype(dt)
        if dt.name == "bfloat16":
            return DType.bf16
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


_TO_NP = {
    DType.f16: np.float16, DType.f32: np.float32, DType.f64: np.float64,
    DType.i8: np.int8, DType.i16: np.int16, DType.i32: np.int32, DType.i64: np.int64,
    DType.u8: np.uint8, DType.u16: np.uint16, DType.u32: np.uint32, DType.u64: np.uint64,
    DType.bool: np.bool_,
}
_FROM_NP = {np.dtype(v): k for k, v in _TO_NP.items()}
_TO_ONNX = {
    DType.f16: TensorProto.FLOAT16, DType.bf16: TensorProto.BFLOAT16, DType.f32: TensorProto.FLOAT,
    DType.f64: TensorProto.DOUBLE, DType.i8: TensorProto.INT8, DType.i16: TensorProto.INT16,
    DType.i32: TensorProto.INT32, DType.i64: TensorProto.INT64, DType.u8: TensorProto.UINT8,
    DType.u16: TensorProto.UINT16, DType.u32: TensorProto.UINT32, DType.u64: TensorProto.UINT64,
    DType.bool: TensorProto.BOOL,
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
