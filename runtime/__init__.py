"""tensorfuse runtime: executable modules (kernels + memory plan), saved and loaded.

``ModuleBase`` is what every module has; ``Module`` runs native CPU code (the llvm backend),
``CudaModule`` runs numba.cuda kernels (the cuda backend; importing it imports no numba).
"""
from .artifact import ArtifactError, load
from .cuda_module import CudaModule
from .memory_plan import MemoryPlan, PlannedBuffer
from .module import Module, ModuleBase, TensorInfo
from .profile import Benchmark, Profile, ProfileRow

__all__ = ["ArtifactError", "Benchmark", "CudaModule", "MemoryPlan", "Module", "ModuleBase", "PlannedBuffer",
           "Profile", "ProfileRow", "TensorInfo", "load"]
