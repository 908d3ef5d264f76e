"""A kernel library that honours the ``codegen.cuda.jit.CudaLibrary`` contract without the code
generator, for testing the cuda runtime (``runtime.cuda_module``) on a hand-built program.

Kernels (each argument is a flat 1-D device array of its slot's dtype):

- ``add(x, w, t)``: t = x + w, a real ``numba.cuda.jit`` kernel (one thread per element);
- ``relu(t, u)``: u = max(t, 0), computed on the host (device -> host -> device);
- ``scale(u, y)``: y = 2 u, a ``numba.cuda.jit`` kernel launched as two halves;
- ``positive(t, b)``: b = t > 0 (bool output);
- ``check(x, status)``: status = (1, the first x > 100 as an integer) when there is one.
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import json  # noqa: E402

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from tensorfuse.runtime.module import CallInfo, Program, SlotInfo  # noqa: E402

THREADS = 8


@cuda.jit
def _add(x, w, t):
    i = cuda.grid(1)
    if i < t.size:
        t[i] = x[i] + w[i]


@cuda.jit
def _scale(u, y, start):
    i = cuda.grid(1) + start
    if i < y.size:
        y[i] = u[i] * np.float32(2.0)


def _blocks(n: int) -> int:
    return max(1, -(-n // THREADS))


class FakeLibrary:
    """See the module docstring. ``launches`` counts launches per kernel (tests read it)."""

    KERNELS = ("add", "relu", "scale", "positive", "check")

    def __init__(self, numel: int):
        self.numel = numel
        self.kernel_names = list(self.KERNELS)
        self.sources = {k: f"# fake kernel {k}\n" for k in self.KERNELS}
        self.launches: dict[str, int] = {}

    def launch_config(self, name: str):
        n = self.numel
        if name == "scale":
            half = n // 2
            return [((_blocks(half),), (THREADS,)), ((_blocks(n - half),), (THREADS,))]
        return [((_blocks(n),), (THREADS,))]

    def launch(self, name: str, args: list) -> None:
        self.launches[name] = self.launches.get(name, 0) + 1
        for a in args:
            assert len(a.shape) == 1, f"{name}: argument of shape {a.shape} is not flat"
        if name == "add":
            (grid, block), = self.launch_config(name)
            _add[grid, block](*args)
        elif name == "scale":
            u, y = args
            half = y.size // 2
            (g0, b0), (g1, b1) = self.launch_config(name)
            _scale[g0, b0](u, y, 0)
            _scale[g1, b1](u, y, half)
        elif name == "relu":
            t, u = args
            u.copy_to_device(np.maximum(t.copy_to_host(), np.float32(0)))
        elif name == "positive":
            t, b = args
            b.copy_to_device(t.copy_to_host() > 0)
        elif name == "check":
            x, status = args
            h = x.copy_to_host()
            bad = np.nonzero(h > 100)[0]
            if bad.size:
                status.copy_to_device(np.array([1, int(h[bad[0]])], np.int64))
        else:
            raise KeyError(name)

    def to_blob(self) -> bytes:
        return json.dumps({"fake": True, "numel": self.numel}).encode()

    @staticmethod
    def from_blob(blob: bytes, cache_dir=None) -> "FakeLibrary":
        d = json.loads(blob)
        assert d["fake"] is True
        return FakeLibrary(d["numel"])


def fake_program(shape=(2, 3)) -> Program:
    """x (input) + w (const) -> t -> relu -> u -> *2 -> y (output); t > 0 -> b (output); a
    check of x writes the status slot."""
    f32 = np.dtype(np.float32)
    slots = [SlotInfo(0, "x", "input", f32, shape),
             SlotInfo(1, "w", "const", f32, shape),
             SlotInfo(2, "t", "temp", f32, shape),
             SlotInfo(3, "u", "temp", f32, shape),
             SlotInfo(4, "y", "output", f32, shape),
             SlotInfo(5, "b", "output", np.dtype(np.bool_), shape),
             SlotInfo(6, "status", "status", np.dtype(np.int64), (2,))]
    w = (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 2.5)
    calls = [CallInfo("check", [0, 6], ["check_x"], ["Check"], writes=[1]),
             CallInfo("add", [0, 1, 2], ["add_0"], ["Add"], flops=float(np.prod(shape)), writes=[2]),
             CallInfo("relu", [2, 3], ["relu_0"], ["Relu"], writes=[1]),
             CallInfo("scale", [3, 4], ["mul_0"], ["Mul"], writes=[1]),
             CallInfo("positive", [2, 5], ["greater_0"], ["Greater"], writes=[1])]
    return Program(slots, [0], [4, 5], calls, {1: w}, status_slot=6, messages=["x must be at most 100"])


def reference(x: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    t = x + w
    return [np.maximum(t, 0) * np.float32(2), t > 0]
