"""Elementwise and broadcasting math ops (ONNX operator spec, "Operators" section per op)."""
from __future__ import annotations

import numpy as np

from ir.kernel import maximum
from ir.ops._common import infer_broadcast, infer_same
from ir.registry import OpPatternKind, op

EW = OpPatternKind.ELEMWISE
BC = OpPatternKind.BROADCAST


@op("Relu", EW)
class Relu:
    """y = max(x, 0)."""
    infer = infer_same

    def reference(node, ins):
        return [np.maximum(ins[0], 0).astype(ins[0].dtype)]

    def scalar(node, x):
        return maximum(x, 0)


@op("Add", BC)
class Add:
    """y = a + b with numpy broadcasting."""
    infer = infer_broadcast

    def reference(node, ins):
        return [ins[0] + ins[1]]

    def scalar(node, a, b):
        return a + b
