"""Helpers for the pass and pipeline tests: tiny graphs from IR text, models from onnx.parser."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

from tensorfuse import ir
from tensorfuse.ir.verify import verify_graph


def G(body: str, inputs: str = "%x: f32[2,3]", constants=None) -> ir.Graph:
    """A graph from IR text (checked by the verifier, with compile-time values propagated)."""
    g = ir.parse(f"graph g({inputs}) {{\n{body}\n}}", constants)
    _propagate(g)
    verify_graph(g)
    return g


def _propagate(g: ir.Graph) -> None:
    from tensorfuse.ir.builder import propagate_known
    for n in g.nodes:
        propagate_known(n)


def model(text: str, opset: int = 17) -> onnx.ModelProto:
    """An ONNX model from onnx.parser text (the ``<ir_version, opset_import>`` header is added)."""
    m = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n' + text)
    onnx.checker.check_model(m, full_check=True)
    return m


def needs_ops(*ops: str):
    """Skip until other developers have registered these ops."""
    missing = [o for o in ops if ir.find_op(o) is None]
    return pytest.mark.skipif(bool(missing), reason=f"ops not in the registry yet: {missing}")


def ops_of(g: ir.Graph) -> list[str]:
    return [n.op for n in g.nodes]


__all__ = ["G", "model", "needs_ops", "ops_of", "np"]
