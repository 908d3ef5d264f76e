"""Test helpers for the cuda code generator under numba's CUDA simulator: lower a graph for the
cuda target, build its kernels (:func:`tensorfuse.codegen.cuda.jit.build_library`) and run the
calls in order on flat views of one device arena, as the cuda runtime does.

Simulated threads cost about half a millisecond each, so the library is built with small
blocks and few of them (:data:`BLOCK`, :data:`MAX_BLOCKS`): grid-stride loops cover the rest.
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np

from tensorfuse.codegen.cuda.jit import build_library
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.compiler.lower import lower_graph
from tensorfuse.ir.target import Target

BLOCK = 32
MAX_BLOCKS = 2
ALIGN = 256


def lower_cuda(model, opt_level: int = 0):
    """The LoweredGraph of an ONNX model for the cuda target, after the level's passes: what
    ``compile(model, target="cuda", opt_level=...)`` lowers (the pipeline for the cuda target,
    so at O1 and above the layout pass converts CNN ops to NHWC); ``lower_cuda.result`` is the
    ``PipelineResult`` (its ``layout_report``: None at O0)."""
    from tensorfuse.compiler.pipeline import optimize
    tgt = Target.parse("cuda")
    g = import_onnx(model)
    lower_cuda.result = optimize(g, opt_level, target=tgt)
    return lower_graph(g, tgt)


def run_lowered(lg, feeds: list[np.ndarray], library=None, cache_dir=None) -> list[np.ndarray]:
    """Run a LoweredGraph's calls on the simulator; returns the graph outputs (host arrays)
    and, as ``run_lowered.status``, the status word (None without one)."""
    from numba import cuda
    lib = library or build_library(lg.kernels, cache_dir=cache_dir, block=BLOCK, max_blocks=MAX_BLOCKS)
    offs, total = [], 0
    for s in lg.slots:
        offs.append(total)
        total += -(-max(s.nbytes, 1) // ALIGN) * ALIGN
    host = np.zeros(total, np.uint8)
    for slot, a in zip(lg.inputs, feeds):
        s = lg.slots[slot]
        host[offs[slot]:offs[slot] + s.nbytes] = np.ascontiguousarray(a, s.type.dtype.numpy).view(np.uint8).ravel()
    for slot, a in lg.consts.items():
        a = np.ascontiguousarray(a)
        host[offs[slot]:offs[slot] + a.nbytes] = a.view(np.uint8).ravel()
    for slot, root in getattr(lg, "aliases", {}).items():    # a reshape without a kernel: its input's bytes
        while root in lg.aliases:
            root = lg.aliases[root]
        offs[slot] = offs[root]
    arena = cuda.to_device(host)

    def view(slot):
        s = lg.slots[slot]
        n = int(np.prod(s.type.shape, dtype=np.int64))
        dt = s.type.dtype.numpy
        return arena[offs[slot]:offs[slot] + n * dt.itemsize].view(dt)
    for call in lg.calls:
        lib.launch(call.kernel, [view(s) for s in call.slots])
    cuda.synchronize()
    out = arena.copy_to_host()

    def read(slot):
        s = lg.slots[slot]
        dt = s.type.dtype.numpy
        return out[offs[slot]:offs[slot] + s.nbytes].view(dt).reshape(s.type.shape).copy()
    run_lowered.status = read(lg.status_slot) if lg.status_slot is not None else None
    return [read(s) for s in lg.outputs]


def run_cuda(model, inputs: dict, opt_level: int = 0) -> list[np.ndarray]:
    """Outputs of an ONNX model run through the cuda code generator (simulator)."""
    lg = lower_cuda(model, opt_level)
    return run_lowered(lg, list(inputs.values()))


def float_model(nodes, inputs: dict, outputs: dict, inits: dict, opset: int = 17):
    """An ONNX model of ``nodes`` with float32 inputs (name -> array, its shape declared),
    outputs (name -> shape) and initializers (name -> array)."""
    import onnx
    from onnx import TensorProto, helper
    f = TensorProto.FLOAT
    gr = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, f, v.shape) for k, v in inputs.items()],
                           [helper.make_tensor_value_info(k, f, s) for k, s in outputs.items()],
                           initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m
