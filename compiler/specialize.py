"""Specialisation on input values: models whose shapes depend on the *values* of graph inputs.

tensorfuse compiles static shapes. Some ONNX inputs decide shapes rather than carry data:
Reshape's ``shape``, the ``axes`` of reductions, Squeeze and Unsqueeze, Slice's ``starts`` and
``ends``, Expand's and ConstantOfShape's ``shape``, Range's bounds, Tile's ``repeats``, TopK's
``k``, Pad's ``pads`` ... When such an input is a graph input (as in the ONNX backend node
tests, and in models that keep "shape" tensors as inputs), its value is unknown at compile time.

The mechanism: the frontend raises :class:`InputValuesNeeded` naming the graph inputs behind the
value that must be known (the input itself, or every graph input it is computed from).
``compiler.compile`` then returns a :class:`SpecializingModule`: its first ``run`` turns those
inputs into constants with the values given, compiles that specialised model (through the
compile cache) and runs it. Later runs with the same values of those inputs reuse the compiled
module; new values compile a new specialisation (the most recent :data:`MAX_SPECIALIZATIONS`
are kept). Inputs that carry data stay runtime inputs. Errors that the specialised model still
has (an unsupported attribute, a bad value) are raised by that first ``run``, as the
:class:`~ir.errors.UnsupportedModelError` or :class:`~ir.errors.CompileError` the
compiler gives.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tensorfuse.ir.errors import UnsupportedModelError

#: compiled specialisations a module keeps (least recently used dropped first)
MAX_SPECIALIZATIONS = 16


class InputValuesNeeded(UnsupportedModelError):
    """Compiling needs the values of graph inputs ``names`` (they decide shapes).

    ``compiler.compile`` answers it with a :class:`SpecializingModule`; elsewhere it is the
    plain UnsupportedModelError it derives from."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = list(names)


def graph_inputs_behind(graph, name: str | None) -> list[str]:
    """Graph inputs whose values decide the run-time value ``name`` (a ShapeError's
    ``needs_value``), in graph-input order; [] when name is None or the value does not depend
    on graph inputs."""
    if name is None:
        return []
    by_name = {v.name: v for v in graph.inputs}
    target = by_name.get(name)
    if target is None:
        target = next((o for n in graph.nodes for o in n.outputs if o.name == name), None)
    if target is None:
        return []
    found: set[int] = set()
    stack, seen = [target], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.producer is None:
            if any(v is i for i in graph.inputs):
                found.add(id(v))
            continue
        stack.extend(x for x in v.producer.inputs if x is not None)
    return [v.name for v in graph.inputs if id(v) in found]


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


class SpecializingModule:
    """A module compiled at its first run for the values of the inputs ``specialized_on``.

    ``run(*arrays, **named)`` takes every graph input (graph-input order, or by name) like
    :meth:`runtime.Module.run` and returns the outputs in graph-output order. Raises ValueError
    for a missing, unknown or mistyped input; compile errors of the specialised model as the
    compiler raises them. ``specializations`` holds the compiled modules by input values.
    """

    def __init__(self, model: onnx.ModelProto, names: list[str], target: str, options: dict[str, Any]):
        self._model = model
        self._target = target
        self._options = dict(options)
        inits = {t.name for t in model.graph.initializer}
        self._inputs = [vi for vi in model.graph.input if vi.name not in inits]
        self.input_names = [vi.name for vi in self._inputs]
        self.output_names = [vi.name for vi in model.graph.output]
        self.specialized_on = [n for n in self.input_names if n in set(names)]
        self.specializations: OrderedDict[tuple, Any] = OrderedDict()

    def _gather(self, arrays, named) -> dict[str, np.ndarray]:
        if len(arrays) > len(self.input_names):
            raise ValueError(f"run() got {len(arrays)} positional inputs, the model has "
                             f"{len(self.input_names)}: {self.input_names}")
        given = dict(zip(self.input_names, arrays))
        for k, a in named.items():
            if k not in self.input_names:
                raise ValueError(f"run() got an unknown input '{k}'; the model's inputs are {self.input_names}")
            if k in given:
                raise ValueError(f"input '{k}' given twice (positionally and by name)")
            given[k] = a
        missing = [n for n in self.input_names if n not in given]
        if missing:
            raise ValueError(f"input '{missing[0]}' is missing")
        return given

    def _bound_array(self, vi: onnx.ValueInfoProto, a: Any) -> np.ndarray:
        tt = vi.type.tensor_type
        dt = _np_dtype(tt.elem_type)
        if not isinstance(a, np.ndarray):
            a = np.asarray(a, dtype=dt)
        if a.dtype != dt:
            raise ValueError(f"input '{vi.name}': expected dtype {dt}, got {a.dtype}")
        if tt.HasField("shape"):
            dims = tt.shape.dim
            if len(dims) != a.ndim or any(d.HasField("dim_value") and d.dim_value != s
                                          for d, s in zip(dims, a.shape)):
                want = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
                raise ValueError(f"input '{vi.name}': expected shape {want}, got {list(a.shape)}")
        return np.ascontiguousarray(a).reshape(a.shape)   # ascontiguousarray makes 0-d arrays 1-d

    def module_for(self, *arrays, **named):
        """The compiled module specialised for these inputs' values, and the remaining inputs
        by name (compiling it on first use)."""
        given = self._gather(arrays, named)
        vis = {vi.name: vi for vi in self._inputs}
        bound = {n: self._bound_array(vis[n], given[n]) for n in self.specialized_on}
        key = tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in bound.items())
        mod = self.specializations.get(key)
        if mod is None:
            from tensorfuse import compiler
            model = self._with_constants(bound)
            opts = dict(self._options)
            if opts.get("input_shapes"):
                opts["input_shapes"] = {k: v for k, v in opts["input_shapes"].items() if k not in bound}
            try:
                mod = compiler.compile(model, target=self._target, **opts)
            except UnsupportedModelError as e:
                # the values given do not fit the model (a Reshape to a shape of another size
                # ...): say which inputs and values
                vals = "; ".join(f"'{n}' = {np.array2string(a.ravel()[:16], separator=', ')}"
                                 + (" ..." if a.size > 16 else "") for n, a in bound.items())
                raise UnsupportedModelError(f"the model cannot run with the given values of input {vals}: {e}") from None
            self.specializations[key] = mod
            while len(self.specializations) > MAX_SPECIALIZATIONS:
                self.specializations.popitem(last=False)
        else:
            self.specializations.move_to_end(key)
        rest = {n: a for n, a in given.items() if n not in bound}
        return mod, rest

    def _with_constants(self, bound: dict[str, np.ndarray]) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        keep = [vi for vi in model.graph.input if vi.name not in bound]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in bound.items())
        return model

    def specialized_model(self, **values) -> onnx.ModelProto:
        """The ONNX model the module compiles for ``values`` (an array for each input of
        ``specialized_on``): those inputs turned into initializers, the others left as inputs
        (what onnxruntime runs to check the specialisation). ValueError for a missing or
        mistyped value."""
        vis = {vi.name: vi for vi in self._inputs}
        missing = [n for n in self.specialized_on if n not in values]
        if missing:
            raise ValueError(f"input '{missing[0]}' is missing")
        return self._with_constants({n: self._bound_array(vis[n], values[n]) for n in self.specialized_on})

    def run(self, *arrays, **named) -> list[np.ndarray]:
        mod, rest = self.module_for(*arrays, **named)
        return mod.run(**rest)

    __call__ = run

    def __repr__(self) -> str:
        return (f"<SpecializingModule: compiled per value of {self.specialized_on}, "
                f"{len(self.specializations)} specialisation(s)>")


def specialize(error: InputValuesNeeded, model: Any, target: str, options: dict[str, Any]) -> SpecializingModule:
    """The module that compiles ``model`` at run time for the values ``error`` asks for."""
    from tensorfuse.compiler.frontend.onnx import load_model
    return SpecializingModule(load_model(model), error.names, target, options)
