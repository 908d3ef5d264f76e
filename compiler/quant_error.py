"""Where quantization loses accuracy: a per-layer report of a quantized model's tensors against
its float original (``tensorfuse verify QMODEL --float-model FLOAT.onnx``).

onnxruntime's quantizer keeps the float model's tensor names: each quantized activation is
``DequantizeLinear(QuantizeLinear(x))`` where ``x`` is the float model's tensor of that name (in
QDQ files). So for every such
``x`` the report compares the dequantized value the quantized model computes with the value the
float model computes for ``x`` (both through onnxruntime with optimisations off: the quantized
model's unfused QDQ semantics, which tensorfuse matches within one quantization step), on the
same inputs, as the relative L2 error ``||q - f|| / ||f||``. Errors grow along the network;
a jump between consecutive layers points at the layer to keep in float or recalibrate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LayerError:
    """One quantized tensor: the float model's name, the op that computes it there, its scale
    and the relative L2 error of the dequantized value against the float value."""

    name: str
    op: str
    scale: float | None
    rel_l2: float


@dataclass
class QuantErrorReport:
    """The per-layer errors in the float model's node order, and the model outputs' errors."""

    model: str
    float_model: str
    layers: list[LayerError] = field(default_factory=list)
    outputs: list[LayerError] = field(default_factory=list)

    def worst_jumps(self, k: int = 3) -> list[tuple[LayerError, float]]:
        """The ``k`` layers whose error grew most over the previous layer's."""
        jumps = []
        prev = 0.0
        for e in self.layers:
            jumps.append((e, e.rel_l2 - prev))
            prev = e.rel_l2
        return sorted(jumps, key=lambda t: -t[1])[:k]

    def __str__(self) -> str:
        lines = [f"quantization error of {self.model} against the float model {self.float_model} "
                 f"(relative L2 of each dequantized tensor vs the float tensor of the same name; "
                 f"onnxruntime, optimisations off, on both):"]
        for e in self.layers:
            sc = f"scale {e.scale:.3g}" if e.scale is not None else "dynamic"
            lines.append(f"  {e.rel_l2:9.2e}  {e.op:<20} {e.name}  ({sc})")
        for e in self.outputs:
            lines.append(f"  {e.rel_l2:9.2e}  output {e.name}")
        jumps = [f"{e.name} (+{d:.2e})" for e, d in self.worst_jumps() if d > 0]
        if jumps:
            lines.append("largest increases: " + ", ".join(jumps))
        return "\n".join(lines)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def quant_error_report(qmodel, float_model, inputs: dict[str, np.ndarray]) -> QuantErrorReport:
    """The report for quantized ``qmodel`` against its float original ``float_model`` (paths,
    bytes or ``onnx.ModelProto``) on ``inputs`` ({name: array}, the inputs both models take).
    Raises TensorfuseError when onnxruntime cannot run either model, ValueError when the two
    share no tensor name (not an original and its quantization)."""
    import os

    from onnx import numpy_helper

    from tensorfuse.compiler.frontend.onnx import load_model
    from tensorfuse.compiler.verify import _ort_values

    q = load_model(qmodel)
    f = load_model(float_model)
    f_ops = {o: n.op_type for n in f.graph.node for o in n.output if o}
    consts = {t.name: t for t in q.graph.initializer}
    # x -> (the dequantized value's name, scale): Q(x) -> DQ
    readers: dict[str, list] = {}
    for n in q.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    pairs: dict[str, tuple[str, float | None]] = {}
    for n in q.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in f_ops:
            dq = next((r for r in readers.get(n.output[0], []) if r.op_type == "DequantizeLinear"), None)
            if dq is None:
                continue
            s = consts.get(n.input[1])
            scale = float(numpy_helper.to_array(s).reshape(-1)[0]) if s is not None else None
            pairs.setdefault(n.input[0], (dq.output[0], scale))
    if not pairs:
        raise ValueError("the quantized model quantizes no tensor of the float model by name: "
                         "is it the quantization of that model?")
    fin = {k: v for k, v in inputs.items() if k in {i.name for i in f.graph.input}}
    fvals, _ = _ort_values(f, fin, list(pairs))
    qvals, _ = _ort_values(q, inputs, [dq for dq, _ in pairs.values()])
    label = lambda m: os.fspath(m) if isinstance(m, (str, os.PathLike)) else "model"  # noqa: E731
    rep = QuantErrorReport(label(qmodel), label(float_model))
    order = [o for n in f.graph.node for o in n.output if o in pairs]
    for x in order:
        dq, scale = pairs[x]
        if x in fvals and dq in qvals:
            rep.layers.append(LayerError(x, f_ops.get(x, "?"), scale, _rel(qvals[dq], fvals[x])))
    for o in f.graph.output:
        if o.name in fvals and o.name in qvals:
            rep.outputs.append(LayerError(o.name, "output", None, _rel(qvals[o.name], fvals[o.name])))
    return rep
