"""tensorfuse: a tensor compiler for ONNX models.

The public API, imported lazily so that a process which only loads saved modules
(``tensorfuse.load``) never imports the compiler:

- :func:`compile` (``tensorfuse.compiler.driver.compile``): ONNX model -> executable module;
- :func:`tune` (``tensorfuse.compiler.tuner.tune``): measure schedule knobs per workload into a
  tuning-records file that ``compile(..., tuning=...)`` uses;
- :func:`load`: a module saved with ``Module.save``;
- :func:`explain` (one rule), :func:`explain_report` (the whole fusion report), :func:`verify`
  (against onnxruntime, naming the rewrite that changed the numbers), :func:`to_dot` (the fused
  graph as Graphviz), :func:`export_onnx`, :func:`cache_info`; ``backend`` (the ONNX backend);
  ``testing`` (checking rules and models against onnxruntime: ``tensorfuse.testing.check_rule``);
- the error classes :class:`TensorfuseError`, :class:`CompileError`, :class:`ModelLoadError`,
  :class:`UnsupportedModelError`, :class:`ArtifactError`, :class:`CPUFeaturesError` (running code
  compiled for a CPU with features this one lacks), :class:`RunCheckError` (an index out of range
  at run time).

The sub-packages keep the layout of the repository: ``tensorfuse.compiler`` (frontend, rewrites,
passes, driver), ``tensorfuse.ir`` (graph IR, op registry, kernel IR, lowerings),
``tensorfuse.codegen`` (LLVM code generation) and ``tensorfuse.runtime`` (modules, memory plans,
saved artifacts, the compile cache). ``python -m tensorfuse`` runs the command line.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute)
_API = {
    "compile": ("tensorfuse.compiler.driver", "compile"),
    "tune": ("tensorfuse.compiler.tuner", "tune"),
    "explain": ("tensorfuse.compiler.explain", "explain"),
    "explain_report": ("tensorfuse.compiler.explain", "explain_report"),
    "verify": ("tensorfuse.compiler.verify", "verify"),
    "to_dot": ("tensorfuse.compiler.dot", "to_dot"),
    "export_onnx": ("tensorfuse.compiler.export", "export_onnx"),
    "cache_info": ("tensorfuse.compiler.driver", "cache_info"),
    "CompileOptions": ("tensorfuse.compiler.options", "CompileOptions"),
    "load": ("tensorfuse.runtime.artifact", "load"),
    "Module": ("tensorfuse.runtime.module", "Module"),                # the llvm target's module
    "CudaModule": ("tensorfuse.runtime.cuda_module", "CudaModule"),   # the cuda target's module
    "ModuleBase": ("tensorfuse.runtime.module", "ModuleBase"),        # what both have in common
    "backend": ("tensorfuse.backend", None),              # onnx.backend.base.Backend, "CPU"/"CUDA"
    "testing": ("tensorfuse.testing", None),              # check_rule, assert_matches_ort (onnxruntime)
    "TensorfuseError": ("tensorfuse.ir.errors", "TensorfuseError"),
    "CompileError": ("tensorfuse.ir.errors", "CompileError"),
    "ModelLoadError": ("tensorfuse.ir.errors", "ModelLoadError"),
    "UnsupportedModelError": ("tensorfuse.ir.errors", "UnsupportedModelError"),
    "ArtifactError": ("tensorfuse.runtime.artifact", "ArtifactError"),
    "CPUFeaturesError": ("tensorfuse.runtime.module", "CPUFeaturesError"),
    "RunCheckError": ("tensorfuse.runtime.module", "RunCheckError"),
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    try:
        module, attr = _API[name]
    except KeyError:
        raise AttributeError(f"module 'tensorfuse' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))
