"""Test helpers: build tiny ONNX models and compare tensorfuse with onnxruntime.

onnxruntime runs with every graph optimisation off (``ORT_DISABLE_ALL``), so it is the
reference implementation of ONNX semantics, not of its own rewrites.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

import tensorfuse

DEFAULT_OPSET = 17


def ort_session(model: onnx.ModelProto | bytes | str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_run(model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model).run(None, inputs)


def np_to_onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def node_model(op_type: str, inputs: dict[str, np.ndarray], attrs: dict[str, Any] | None = None,
               outputs: Sequence[str] = ("y",), opset: int = DEFAULT_OPSET,
               initializers: dict[str, np.ndarray] | None = None,
               input_names: Sequence[str] | None = None) -> onnx.ModelProto:
    """A one-node model. ``inputs`` are runtime graph inputs; ``initializers`` constants.
    ``input_names`` fixes the node's input order (use "" for an omitted optional input);
    by default it is inputs then initializers in dict order. Output types are left to
    ONNX shape inference."""
    initializers = initializers or {}
    names = list(input_names) if input_names is not None else list(inputs) + list(initializers)
    node = helper.make_node(op_type, names, list(outputs), **(attrs or {}))
    g_in = [helper.make_tensor_value_info(k, np_to_onnx_type(v.dtype), v.shape) for k, v in inputs.items()]
    g_out = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    graph = helper.make_graph([node], "t", g_in, g_out, initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10)
    m = onnx.shape_inference.infer_shapes(m)
    # outputs need a type for onnxruntime: copy them from shape inference
    inferred = {vi.name: vi for vi in list(m.graph.value_info) + list(m.graph.output)}
    for o in m.graph.output:
        if not o.type.HasField("tensor_type") and o.name in inferred:
            o.CopyFrom(inferred[o.name])
    return m


def assert_matches_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray], rtol: float = 1e-5,
                       atol: float = 1e-6, opt_levels: Sequence[int] = (0, 2), **compile_kw) -> list[np.ndarray]:
    """Compile at each opt level, run, and compare every output with onnxruntime (dtype,
    shape and values within rtol/atol). Returns tensorfuse's outputs of the last level."""
    expected = ort_run(model, inputs)
    got = None
    for lvl in opt_levels:
        mod = tensorfuse.compile(model, target="llvm", opt_level=lvl, **compile_kw)
        got = mod.run(**inputs)
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g.dtype == e.dtype, f"O{lvl} output {i}: dtype {g.dtype} != onnxruntime's {e.dtype}"
            assert g.shape == e.shape, f"O{lvl} output {i}: shape {g.shape} != onnxruntime's {e.shape}"
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"O{lvl} output {i}")
    return got


def rand(*shape, dtype=np.float32, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(low, high, size=shape).astype(dtype)


def model_inputs(entry: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Fixed-seed inputs for a models.json entry: floats in [-1, 1), ints in the stated range."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in entry["inputs"]:
        dt = np.dtype(spec["dtype"])
        if np.issubdtype(dt, np.integer):
            lo, hi = spec.get("range", [0, 2])
            out[spec["name"]] = rng.integers(lo, hi, size=spec["shape"]).astype(dt)
        else:
            out[spec["name"]] = rng.uniform(-1, 1, size=spec["shape"]).astype(dt)
    return out
