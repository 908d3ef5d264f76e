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
    """onnxruntime as the reference (``compiler.verify.reference_session``: optimisations off)."""
    from tensorfuse.compiler.verify import reference_session
    return reference_session(model)


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


def assert_outputs_depend_on_inputs(outs_a: Sequence[np.ndarray], outs_b: Sequence[np.ndarray], rtol: float,
                                    atol: float, what: str = "model", factor: float = 20.0,
                                    every_output: bool = True) -> float:
    """Guard of a whole-model comparison: the reference outputs for two different inputs
    (``outs_a``, ``outs_b``: lists of arrays in graph output order, usually onnxruntime's, see
    :func:`other_inputs`) must differ by much more than the tolerance of the comparison, or
    the comparison cannot fail (a model whose activations die out with depth gives nearly the
    same output for any input, so a wrong early layer goes unseen).

    A float output *moves* when its largest ``|a - b|`` exceeds ``factor`` times
    ``atol + rtol * max|a|`` (the largest error ``assert_allclose(rtol=rtol, atol=atol)`` lets
    through); an integer or bool output when it changes anywhere. ``every_output``: every
    output must move (default), else at least one. Returns the smallest ratio
    ``max|a - b| / (atol + rtol * max|a|)`` over the float outputs that count (inf when there
    are none). Raises AssertionError naming the output that does not move and by how much."""
    assert len(outs_a) == len(outs_b), f"{what}: {len(outs_a)} outputs vs {len(outs_b)}"
    ratios: list[float] = []
    failures: list[str] = []
    for i, (a, b) in enumerate(zip(outs_a, outs_b)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"{what} output {i}: shapes {a.shape} and {b.shape} for the two inputs"
        if a.size == 0:
            continue
        if not np.issubdtype(a.dtype, np.floating):
            if np.any(a != b):
                ratios.append(float("inf"))
            else:
                failures.append(f"{what} output {i}: the same {a.dtype} values for two different inputs")
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        tol = atol + rtol * float(np.max(np.abs(a64)))
        diff = float(np.max(np.abs(a64 - b64)))
        ratio = diff / tol if tol > 0 else float("inf")
        if ratio > factor:
            ratios.append(ratio)
        else:
            failures.append(f"{what} output {i}: two different inputs give outputs that differ by at most "
                            f"{diff:.3g}, {ratio:.3g}x the comparison's tolerance {tol:.3g} (atol {atol:g} + "
                            f"rtol {rtol:g} * max|y|); under {factor:g}x, a comparison of it cannot see errors")
    if every_output:
        assert not failures, "; ".join(failures)
    else:
        assert ratios, "no output moves: " + "; ".join(failures)
    return min(ratios, default=float("inf"))


def other_inputs(feeds: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    """A second set of inputs like ``feeds`` (same names, dtypes and shapes) for
    :func:`assert_outputs_depend_on_inputs`: floats drawn anew from a fixed-seed standard
    normal distribution (another image), integer and bool arrays shuffled (token ids stay in
    their range, a mask keeps its count)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in feeds.items():
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.floating):
            out[k] = rng.standard_normal(v.shape).astype(v.dtype)
        else:
            flat = v.copy().reshape(-1)
            rng.shuffle(flat)
            out[k] = flat.reshape(v.shape)
    return out
