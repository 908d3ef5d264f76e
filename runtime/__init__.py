"""tensorfuse runtime: executable modules (kernels + memory plan), saved and loaded."""
from .artifact import ArtifactError, load
from .memory_plan import MemoryPlan, PlannedBuffer
from .module import Module, TensorInfo
from .profile import Benchmark, Profile, ProfileRow

__all__ = ["ArtifactError", "Benchmark", "MemoryPlan", "Module", "PlannedBuffer", "Profile", "ProfileRow",
           "TensorInfo", "load"]
