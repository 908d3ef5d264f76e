"""Helpers for the fusion tests: small ONNX graphs of several nodes, and compiling an IR graph
that already contains fused ops (no frontend) to compare it with onnxruntime."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tensorfuse.ir.graph import Graph
from tensorfuse.ir.types import TensorType
from tests.oracle import np_to_onnx_type, rand


def graph_model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: Sequence[str],
                initializers: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    """A model of several nodes; output types come from ONNX shape inference."""
    g_in = [helper.make_tensor_value_info(k, np_to_onnx_type(v.dtype), v.shape) for k, v in inputs.items()]
    g_out = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    return typed_model(helper.make_graph(list(nodes), "t", g_in, g_out, initializer=inits), opset)


def typed_model(g: onnx.GraphProto, opset: int = 17, *, ir_version: int | None = None,
                strict: bool = True) -> onnx.ModelProto:
    """``g`` as a checked model whose untyped graph outputs take their types from ONNX shape
    inference (``strict``: inference errors are raised)."""
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version if ir_version is not None else min(m.ir_version, 10)
    m = onnx.shape_inference.infer_shapes(m, strict_mode=strict)
    inferred = {vi.name: vi for vi in list(m.graph.value_info) + list(m.graph.output)}
    for o in m.graph.output:
        if not o.type.HasField("tensor_type") and o.name in inferred:
            o.CopyFrom(inferred[o.name])
    onnx.checker.check_model(m)
    return m


def compile_graph(g: Graph):
    """Lower and build an IR graph directly (no passes): fused nodes run their own kernels."""
    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.lower import lower_graph
    return build_module(lower_graph(g), g, [v.name for v in g.inputs], [v.name for v in g.outputs])


def ir_inputs(g: Graph, arrays: dict[str, np.ndarray]):
    """Graph inputs named after ``arrays`` (in order); returns their Values."""
    return [g.add_input(k, TensorType.of(a)) for k, a in arrays.items()]


# ----------------------------------------------------------------------------- rule tests
def optimized(model, opt_level: int = 2, *, grouping: bool = False, **kw) -> Graph:
    """The model imported and run through the pipeline of ``opt_level`` (no code generation).
    The rule tests see what the catalogue made: fuse_ops grouping stays off unless ``grouping``."""
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.pipeline import optimize
    if not grouping:
        kw["disabled_rules"] = list(kw.get("disabled_rules", ())) + ["fuse_ops"]
    g = import_onnx(model)
    optimize(g, opt_level, **kw)
    return g


def count(g: Graph, op: str) -> int:
    """Nodes of ``op`` ("Conv", "tensorfuse::FusedConv") in ``g``."""
    return sum(1 for n in g.nodes if n.qualified_op == op)


def why_not(model, rule: str, opt_level: int = 2) -> str:
    """The reasons ``explain`` gives for ``rule`` not applying, joined (asserts it applies nowhere).
    ``model``: an ONNX model (replayed up to the rule's pass) or an IR graph (taken as is)."""
    from tensorfuse.compiler.explain import explain
    ex = explain(model, rule, opt_level=opt_level, quiet=True)
    assert ex, f"{rule}: no candidate node"
    assert not any(r.matched for r in ex), f"{rule} applies: {ex}"
    return " | ".join(r.reason for r in ex)


def conv_params(c: int, m: int, k: int, group: int = 1, bias: bool = True) -> tuple[list[str], dict[str, np.ndarray]]:
    """A Conv's input names from ``x`` and its random constants: W [m, c / group, k, k] (seed
    1) and, with ``bias``, b [m] (seed 2). Returns (inputs, initializers)."""
    inits = {"w": rand(m, c // group, k, k, seed=1)}
    if bias:
        inits["b"] = rand(m, seed=2)
    return ["x", *inits], inits
