"""The executable module: a kernel table, a slot table and the memory behind it.

``Module.run(*arrays, **named) -> list[np.ndarray]`` runs the whole graph with one native call
(the entry function runs every kernel in order). Inputs are checked against ``input_info``:
a missing input, an unknown name, a wrong dtype or a wrong shape raises ``ValueError`` naming
the input with expected and got. Outputs are fresh arrays in graph output order.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from ir.types import DType, TensorType

_ENTRY_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@dataclass(frozen=True)
class TensorInfo:
    """Name, dtype (numpy) and static shape of a graph input or output."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name}: {TensorType(DType.from_numpy(self.dtype), self.shape)}"


class Module:
    """A compiled model for one target.

    Attributes: ``input_info`` / ``output_info`` (lists of TensorInfo), ``graph`` (the optimised
    graph IR), ``kernels`` (kernel IR), ``num_kernels`` (native kernel calls per run).
    """

    def __init__(self, lowered, library, entry: str, input_names, output_names, graph=None,
                 llvm_ir: str | None = None, target: str = "llvm"):
        self._lowered = lowered
        self._lib = library
        self._entry_name = entry
        self._entry = _ENTRY_T(library.address(entry))
        self.graph = graph
        self.llvm_ir = llvm_ir
        self.target = target
        slots = lowered.slots
        self.input_info = [TensorInfo(n, slots[s].type.dtype.numpy, slots[s].type.shape)
                           for n, s in zip(input_names, lowered.inputs)]
        self.output_info = [TensorInfo(n, slots[s].type.dtype.numpy, slots[s].type.shape)
                            for n, s in zip(output_names, lowered.outputs)]
        self._consts = dict(lowered.consts)
        self._temps = {s.index: np.empty(max(s.nbytes, 1), np.uint8) for s in slots if s.kind == "temp"}
        self._base = (ctypes.c_void_p * max(len(slots), 1))()
        for i, a in self._consts.items():
            self._base[i] = a.ctypes.data
        for i, a in self._temps.items():
            self._base[i] = a.ctypes.data
        self._lock = threading.Lock()

    @property
    def kernels(self):
        return self._lowered.kernels

    @property
    def num_kernels(self) -> int:
        return len(self._lowered.calls)

    def _check_inputs(self, arrays, named) -> list[np.ndarray]:
        infos = self.input_info
        if len(arrays) > len(infos):
            raise ValueError(f"run() got {len(arrays)} positional inputs, the model has {len(infos)}: "
                             f"{[i.name for i in infos]}")
        by_name = {i.name: k for k, i in enumerate(infos)}
        given: list = list(arrays) + [None] * (len(infos) - len(arrays))
        for name, a in named.items():
            if name not in by_name:
                raise ValueError(f"run() got an unknown input '{name}'; the model's inputs are {list(by_name)}")
            k = by_name[name]
            if given[k] is not None:
                raise ValueError(f"input '{name}' given twice (positionally and by name)")
            given[k] = a
        out = []
        for info, a in zip(infos, given):
            if a is None:
                raise ValueError(f"input '{info.name}' is missing: expected {info.dtype}{list(info.shape)}")
            if not isinstance(a, np.ndarray):
                a = np.asarray(a, dtype=info.dtype)
            if a.dtype != info.dtype:
                raise ValueError(f"input '{info.name}': expected dtype {info.dtype}, got {a.dtype}")
            if tuple(a.shape) != info.shape:
                raise ValueError(f"input '{info.name}': expected shape {list(info.shape)}, got {list(a.shape)}")
            out.append(np.ascontiguousarray(a))
        return out

    def run(self, *arrays, **named) -> list[np.ndarray]:
        """Run the model. Inputs by position (graph input order) or by name; returns outputs."""
        inputs = self._check_inputs(arrays, named)
        outs = [np.empty(i.shape, i.dtype) for i in self.output_info]
        with self._lock:
            table = (ctypes.c_void_p * len(self._base)).from_buffer_copy(self._base)
            for s, a in zip(self._lowered.inputs, inputs):
                table[s] = a.ctypes.data
            for s, a in zip(self._lowered.outputs, outs):
                table[s] = a.ctypes.data
            self._entry(ctypes.addressof(table))
        return outs

    __call__ = run

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.input_info))
        outs = ", ".join(map(str, self.output_info))
        return f"<tensorfuse.Module target={self.target} ({ins}) -> ({outs}), {self.num_kernels} kernels>"
