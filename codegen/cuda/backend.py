"""The cuda backend: kernel IR -> numba.cuda kernels (``codegen.cuda.jit.build_library``), run by
``runtime.cuda_module.CudaModule``.

A saved cuda module holds the library blob (``library.cuda``: ``CudaLibrary.to_blob()``:
sources, launch shapes, PTX when built on a GPU), the memory plan and the constants, with the
same format and version checks as a CPU module; loading needs a GPU or the CUDA simulator.
"""
from __future__ import annotations

from tensorfuse.codegen.base import Backend, program_of


def _device_key() -> dict:
    """What the generated code depends on besides its source: the simulator or the GPU's compute
    capability, and the numba-cuda version. CompileError naming ``pip install 'tensorfuse[cuda]'``
    when the GPU stack is not installed (the compile cache asks this first)."""
    from tensorfuse.runtime.cuda_module import gpu_stack_missing
    missing = gpu_stack_missing()
    if missing is not None:
        from tensorfuse.ir.errors import CompileError
        raise CompileError(missing)
    from numba.core import config
    try:
        from importlib.metadata import version
        numba_cuda = version("numba-cuda")
    except Exception:                   # noqa: BLE001 - not installed as a distribution
        numba_cuda = None
    key = {"numba_cuda": numba_cuda, "simulator": bool(config.ENABLE_CUDASIM)}
    if not config.ENABLE_CUDASIM:
        try:
            from numba import cuda
            if cuda.is_available():
                key["compute_capability"] = list(cuda.get_current_device().compute_capability)
        except Exception:               # noqa: BLE001 - no GPU: the key says nothing more
            pass
    return key


class CUDABackend(Backend):
    """NVIDIA GPUs through numba.cuda (target kind ``"cuda"``); modules are
    ``runtime.cuda_module.CudaModule``."""

    name = "cuda"
    schedules_module = "tensorfuse.codegen.cuda.schedules"
    code_member = "library.cuda"

    def target_key(self, target) -> dict:
        """``{"target": "cuda", "numba_cuda", "simulator", "compute_capability"}`` (the last on
        a GPU only)."""
        return {"target": str(target), **_device_key()}

    def unavailable_reason(self) -> str | None:
        """Why the cuda target cannot run here, or None when it can (the simulator,
        ``NUMBA_ENABLE_CUDASIM=1``, first; then a GPU with libNVVM):
        ``runtime.cuda_module.cuda_unavailable_reason``."""
        from tensorfuse.runtime.cuda_module import cuda_unavailable_reason
        return cuda_unavailable_reason()

    def schedule_kernel(self, kernel, target):
        """The generic schedule (``Backend.schedule_kernel``), then, for a kernel without a hand
        schedule, the knob ``launch_threads`` of the grid-stride launches it will be built with
        (``codegen.cuda.launches.declare_launch_knob``); the launches themselves are made when
        the library is built (``jit.build_library``), so the kernel IR stays serial."""
        from tensorfuse.codegen.cuda.launches import declare_launch_knob
        super().schedule_kernel(kernel, target)
        declare_launch_knob(kernel, target)
        return kernel

    def build(self, lowered, graph, input_names, output_names, target, *, log=None):
        """Compile every kernel with ``codegen.cuda.jit.build_library`` (and, on a GPU, to device
        code: ``CudaLibrary.compile_all``, so no kernel compiles at the first run) and make the
        :class:`~runtime.cuda_module.CudaModule` (constants uploaded); (the module, None: no
        code text for the report). Raises CompileError when the cuda code generator is missing or fails, or when no GPU
        or simulator is available."""
        from tensorfuse.ir.errors import CompileError
        from tensorfuse.runtime.cuda_module import CudaModule, cuda_unavailable_reason
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise CompileError(f"target 'cuda' is not available here: {reason}")
        try:
            from tensorfuse.codegen.cuda.jit import build_library
        except ImportError as e:
            raise CompileError(f"the cuda code generator (codegen.cuda.jit) cannot be imported: {e}") from e
        library = build_library(list(lowered.kernels))
        library.compile_all()           # every kernel now, not at the first run
        try:
            return CudaModule(program_of(lowered, log), library, input_names, output_names,
                              target=str(target) if target is not None else "cuda"), None
        except RuntimeError as e:
            raise CompileError(str(e)) from e

    def artifact_code(self, module) -> tuple[bytes, dict]:
        """``library.to_blob()`` and ``{"target", "cuda": {the device key}}``."""
        from tensorfuse.runtime.artifact import ArtifactError
        to_blob = getattr(module.library, "to_blob", None)
        if to_blob is None:
            raise ArtifactError("this module's kernel library cannot be serialised (no to_blob)")
        return bytes(to_blob()), {"target": module.target, "cuda": _device_key()}

    def check_compatible(self, meta: dict, path: str = "the file") -> None:
        """A GPU or the simulator is available here; ArtifactError with the reason otherwise."""
        from tensorfuse.runtime.artifact import ArtifactError
        from tensorfuse.runtime.cuda_module import cuda_unavailable_reason
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise ArtifactError(f"{path} is a cuda module, which cannot run here: {reason}")

    def load_library(self, blob: bytes):
        """The kernel library from its blob (``codegen.cuda.jit.CudaLibrary.from_blob``)."""
        from tensorfuse.codegen.cuda.jit import CudaLibrary
        return CudaLibrary.from_blob(blob)

    def load(self, meta, blob, program, plan, input_names, output_names, path="the file"):
        """The :class:`~runtime.cuda_module.CudaModule` of a saved cuda module. ArtifactError
        when the library cannot be rebuilt from its blob or the device is unusable."""
        from tensorfuse.runtime.artifact import ArtifactError
        from tensorfuse.runtime.cuda_module import CudaModule
        try:
            library = self.load_library(blob)
            if hasattr(library, "compile_all"):     # at load, not at the first run (numba's disk cache)
                library.compile_all()
        except Exception as e:          # noqa: BLE001 - whatever the library raises names the cause
            raise ArtifactError(f"{path}: its cuda kernel library cannot be loaded ({type(e).__name__}: {e})") from None
        try:
            return CudaModule(program, library, input_names, output_names, target=meta.get("target", "cuda"),
                              plan=plan)
        except (RuntimeError, ValueError) as e:
            raise ArtifactError(f"{path}: {e}") from None
