"""tensorfuse as an ONNX backend (``onnx.backend.base.Backend``), for the ONNX backend test suite
and any tool that speaks that interface: ``import tensorfuse.backend as backend`` (as with
``onnxruntime.backend``), then ``backend.prepare(model, device="CPU").run(inputs)`` or
``backend.run_model(model, inputs)``.

Devices: "CPU" -> target "llvm"; "CUDA" -> target "cuda" (where a GPU or numba's CUDA simulator
is). ``prepare`` compiles at once when every input shape is static, otherwise on the first
``run`` with the shapes of the inputs it is given.

Not the code generators' backends (``codegen.base.Backend``: llvm, cuda), which ``compile``
picks by target.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from tensorfuse import compiler
from tensorfuse.ir.errors import UnsupportedModelError

__all__ = ["TensorfuseBackend", "TensorfuseRep", "prepare", "run_model", "run_node", "supports_device"]

_TARGETS = {DeviceType.CPU: "llvm", DeviceType.CUDA: "cuda"}


def _target(device: str) -> str:
    try:
        return _TARGETS[Device(device).type]
    except (KeyError, ValueError, AttributeError):
        raise ValueError(f"unknown device {device!r}; tensorfuse supports 'CPU' (and 'CUDA' when available)") from None


class TensorfuseRep(BackendRep):
    """A prepared model. ``run(inputs)`` takes a list (graph-input order) or a dict by name."""

    def __init__(self, model: onnx.ModelProto, target: str, **compile_kw: Any):
        self._model = model
        self._target = target
        self._kw = compile_kw
        inits = {t.name for t in model.graph.initializer}
        self._input_names = [i.name for i in model.graph.input if i.name not in inits]
        self._output_names = [o.name for o in model.graph.output]
        self.module = None
        try:
            self.module = compiler.compile(model, target=target, **compile_kw)
        except UnsupportedModelError as e:
            if "dynamic dimension" not in str(e) and "has no shape" not in str(e):
                raise

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            named = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            named = dict(zip(self._input_names, inputs))
        mod = self.module
        if mod is None:   # dynamic input shapes: compile for these
            shapes = {k: np.asarray(v).shape for k, v in named.items()}
            mod = compiler.compile(self._model, target=self._target, input_shapes=shapes, **self._kw)
        outs = mod.run(**named)
        return namedtupledict("Outputs", self._output_names)(*outs)


class TensorfuseBackend(Backend):
    """``onnx.backend.base.Backend`` implementation for tensorfuse."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TensorfuseRep:
        super().prepare(model, device, **kwargs)
        return TensorfuseRep(model, _target(device), **kwargs)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any) -> tuple:
        """Run one node: wraps it in a model whose input types come from ``inputs``."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        arrays = [np.asarray(a) for a in (inputs.values() if isinstance(inputs, dict) else inputs)]
        names = list(inputs) if isinstance(inputs, dict) else [n for n in node.input if n]
        vis = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(names, arrays)]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        outs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = onnx.helper.make_graph([node], "run_node", vis, outs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        # the checker wants typed outputs: take them from ONNX shape inference
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for o in model.graph.output:
            vi = types.get(o.name)
            if vi is None or not vi.type.HasField("tensor_type"):
                raise UnsupportedModelError(f"run_node: ONNX shape inference gives no type for output '{o.name}' "
                                            f"of {node.op_type}")
            o.CopyFrom(vi)
        return cls.run_model(model, dict(zip(names, arrays)), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            target = _target(device)
        except ValueError:
            return False
        from tensorfuse.codegen.base import get_backend
        return get_backend(target).unavailable_reason() is None     # cuda: a GPU or the simulator


prepare = TensorfuseBackend.prepare
run_model = TensorfuseBackend.run_model
run_node = TensorfuseBackend.run_node
supports_device = TensorfuseBackend.supports_device
