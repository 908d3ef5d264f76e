"""tensorfuse as an ONNX backend: ``import tensorfuse.backend as backend`` (as with
``onnxruntime.backend``), then ``backend.prepare(model, device="CPU").run(inputs)`` or
``backend.run_model(model, inputs)``. Devices: "CPU" (target "llvm") and "CUDA" (target "cuda",
where a GPU or numba's CUDA simulator is there). The implementation is
:mod:`tensorfuse.compiler.backend` (``onnx.backend.base.Backend``)."""
from tensorfuse.compiler.backend import (TensorfuseBackend, TensorfuseRep, prepare, run_model,  # noqa: F401
                                         run_node, supports_device)

__all__ = ["TensorfuseBackend", "TensorfuseRep", "prepare", "run_model", "run_node", "supports_device"]
