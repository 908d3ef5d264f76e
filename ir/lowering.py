"""The context an op's ``lower`` function receives: buffers for its inputs and outputs, and
a way to open kernels. One op may emit several kernels; most emit one."""
from __future__ import annotations

from typing import Any

import numpy as np

from .graph import Node
from .kernel import Buffer, Kernel, KernelBuilder


class LowerCtx:
    """Lowering context for one node.

    ``inputs[i]`` is the Buffer of input i (None for an omitted optional input), ``outputs[j]``
    the Buffer of output j; buffers have the values' dtypes and shapes. ``const(i)`` is the
    compile-time value of input i (numpy) or None.
    """

    def __init__(self, node: Node, inputs: list[Buffer | None], outputs: list[Buffer], name: str):
        self.node = node
        self.inputs = inputs
        self.outputs = outputs
        self.name = name
        self.kernels: list[Kernel] = []
        #: set by fusion: (value Expr, output index list) -> Expr, applied by anchor ops
        #: (Conv, Gemm, MatMul, pools ...) to each output element before its single store;
        #: ``epilogue_inputs`` are extra Buffers it reads (add them to the kernel params).
        self.epilogue = None
        self.epilogue_inputs: list[Buffer] = []

    def apply_epilogue(self, value, out_idx):
        """The value to store at ``out_idx`` of output 0 after the fused epilogue (if any)."""
        return value if self.epilogue is None else self.epilogue(value, list(out_idx))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attr(name, default)

    def const(self, i: int) -> np.ndarray | None:
        v = self.node.input(i)
        return None if v is None else v.const_value()

    def kernel(self, suffix: str = "", params: list[Buffer] | None = None) -> KernelBuilder:
        """Open a new kernel; its parameters default to every present input, then the outputs."""
        if params is None:
            params = [b for b in self.inputs if b is not None]
            params += list(self.epilogue_inputs)
            params += [b for b in self.outputs if b is not None]
            # a buffer passed twice (Add(x, x)) is one parameter
            uniq: list[Buffer] = []
            for b in params:
                if all(b is not u for u in uniq):
                    uniq.append(b)
            params = uniq
        name = self.name + (f"_{suffix}" if suffix else "")
        kb = KernelBuilder(name, params, comment=f"{self.node.qualified_op} {self.node.name}")
        self.kernels.append(kb.kernel)
        return kb
