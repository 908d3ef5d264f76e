"""The context an op's ``lower`` function receives: buffers for its inputs and outputs, and
a way to open kernels. One op may emit several kernels; most emit one."""
from __future__ import annotations

import contextlib
import math
import contextvars
from typing import Any

import numpy as np

from .graph import Node
from .kernel import Buffer, Kernel, KernelBuilder, copy_index
from .types import DType


#: the target being lowered for (an ``ir.target.Target``); set by ``compiler.lower.lower_graph``
_TARGET: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_lower_target", default=None)


@contextlib.contextmanager
def lowering_target(target):
    """Within the block, every :attr:`LowerCtx.target` is ``target``."""
    tok = _TARGET.set(target)
    try:
        yield target
    finally:
        _TARGET.reset(tok)


class LowerCtx:
    """Lowering context for one node.

    ``inputs[i]`` is the Buffer of input i (None for an omitted optional input), ``outputs[j]``
    the Buffer of output j; buffers have the values' dtypes and shapes. ``const(i)`` is the
    compile-time value of input i (numpy) or None.
    """

    def __init__(self, node: Node, inputs: list[Buffer | None], outputs: list[Buffer], name: str,
                 status: Buffer | None = None, messages: list[str] | None = None):
        self.node = node
        #: the run's status word (i64[2]: error code, offending value) and the graph's error
        #: messages (code k is messages[k-1]); see check_indices
        self.status = status
        self.messages = messages if messages is not None else []
        self.inputs = inputs
        self.outputs = outputs
        self.name = name
        self.kernels: list[Kernel] = []
        #: set by fusion: (value Expr, output index list) -> Expr, applied by anchor ops
        #: (Conv, Gemm, MatMul, pools ...) to each output element before its single store;
        #: ``epilogue_inputs`` are extra Buffers it reads (add them to the kernel params).
        self.epilogue = None
        self.epilogue_inputs: list[Buffer] = []
        #: constants made while lowering (packed weights): (Buffer, array) pairs that
        #: ``lower_graph`` turns into constant slots
        self.packed: list[tuple[Buffer, np.ndarray]] = []
        #: scratch buffers made while lowering (:meth:`scratch`): temp slots of the node's own
        self.scratch_buffers: list[Buffer] = []
        #: views made while lowering (:meth:`view`): id(view) -> the buffer whose slot it reads
        self.view_of: dict[int, Buffer] = {}
        #: compile-time values of inputs seen through a view: input index -> array
        self.const_override: dict[int, np.ndarray] = {}

    def pack(self, array: np.ndarray, hint: str = "packed") -> Buffer:
        """A new compile-time constant (e.g. weights repacked for a micro-kernel) as a Buffer
        that kernels of this node may take as a parameter."""
        a = np.ascontiguousarray(array)
        from .types import DType
        buf = Buffer(f"{self.name}_{hint}{len(self.packed)}", DType.from_numpy(a.dtype), tuple(a.shape))
        self.packed.append((buf, a))
        return buf

    def view(self, buf: Buffer, shape) -> Buffer:
        """``buf``'s row-major bytes under another ``shape`` of the same element count (a
        1-D convolution's [N, C, L] seen as [N, C, 1, L]): a Buffer of its own that kernels
        take as a parameter in ``buf``'s slot. Raises ValueError when the counts differ."""
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != buf.numel:
            raise ValueError(f"view of {buf.name} {list(buf.shape)} as {list(shape)}: element counts differ")
        v = Buffer(buf.name, buf.dtype, shape, buf.scope)
        self.view_of[id(v)] = self.view_of.get(id(buf), buf)
        return v

    def base(self, buf: Buffer) -> Buffer:
        """The buffer a :meth:`view` stands for (``buf`` itself when it is none)."""
        return self.view_of.get(id(buf), buf)

    def scratch(self, dtype: DType, shape, hint: str = "scratch") -> Buffer:
        """A new global buffer that only this node's kernels use, to pass values from one of its
        kernels to the next (a split-K GEMM's partial sums): ``lower_graph`` gives it a temp
        slot, which the memory plan places like any intermediate (live from the node's first
        call that names it to its last). Its contents are undefined until a kernel writes them."""
        buf = Buffer(f"{self.name}_{hint}{len(self.scratch_buffers)}", dtype, tuple(int(d) for d in shape))
        self.scratch_buffers.append(buf)
        return buf

    @property
    def target(self):
        """The target lowered for: lanes per vector (``target.lanes(dtype)``), cache sizes and
        the thread count come from here, never from constants. Outside ``lower_graph`` (a test
        building one LowerCtx) it is the host CPU target."""
        t = _TARGET.get()
        if t is None:
            from tensorfuse.ir.target import Target   # the default only; lower_graph passes its own
            t = Target.parse("llvm")
        return t

    def apply_epilogue(self, value, out_idx):
        """The value to store at ``out_idx`` of output 0 after the fused epilogue (if any)."""
        return value if self.epilogue is None else self.epilogue(value, copy_index(out_idx))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attr(name, default)

    def const(self, i: int) -> np.ndarray | None:
        if i in self.const_override:
            return self.const_override[i]
        v = self.node.input(i)
        return None if v is None else v.const_value()

    def check_indices(self, i: int, dims, what: str = "index") -> None:
        """Emit a kernel that validates input ``i`` (integer indices) before the op's kernel: an
        index outside [-dim, dim) sets the run's status word, and ``Module.run`` raises a
        ValueError naming the node, the input and the offending value (as onnxruntime does:
        ONNX calls such indices an error). ``dims`` is one bound, or one per position of the
        innermost axis (GatherND/ScatterND tuples). Nothing is emitted for indices known at
        compile time (the numpy reference checks those) or without a status word."""
        ind = self.inputs[i]
        if ind is None or self.const(i) is not None or self.status is None or ind.numel == 0:
            return
        dims = [int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
        code = len(self.messages) + 1
        v = self.node.input(i)
        bounds = f"[-{dims[0]}, {dims[0] - 1}]" if len(set(dims)) == 1 else f"[-d, d-1] for d in {dims}"
        self.messages.append(f"{self.node.qualified_op} node '{self.node.name}': {what} in input "
                             f"'{v.name}' out of range {bounds}")
        kb = self.kernel(f"check{code}", params=[ind, self.status])
        with kb.loop(ind.numel) as j:
            k = ind.flat(j).cast(DType.i64)
            d = dims[0] if len(dims) == 1 else None
            if d is None:
                from .kernel import select
                pos = j % len(dims)
                d = dims[-1]
                for t in range(len(dims) - 2, -1, -1):
                    d = select(pos.eq(t), dims[t], d)
            with kb.if_(((k < -d) | (k >= d)) & self.status[0].eq(0)):   # the first error is reported
                kb.store(self.status, 0, code)
                kb.store(self.status, 1, k)

    def default_params(self) -> list[Buffer]:
        """Every present input, the epilogue's inputs, then the outputs, each once."""
        params = [b for b in self.inputs if b is not None]
        params += list(self.epilogue_inputs)
        params += [b for b in self.outputs if b is not None]
        uniq: list[Buffer] = []          # a buffer passed twice (Add(x, x)) is one parameter
        for b in params:
            if all(b is not u for u in uniq):
                uniq.append(b)
        return uniq

    def kernel(self, suffix: str = "", params: list[Buffer] | None = None) -> KernelBuilder:
        """Open a new kernel; its parameters default to every present input, then the outputs."""
        if params is None:
            params = self.default_params()
        name = self.name + (f"_{suffix}" if suffix else "")
        kb = KernelBuilder(name, params, comment=f"{self.node.qualified_op} {self.node.name}")
        self.kernels.append(kb.kernel)
        return kb
