"""The quantization section of ``explain``: which groups run as integer kernels, and every
QuantizeLinear / DequantizeLinear left in place with the reason it stayed.

The documents this project started from name the failure users of graph optimizers meet with
QDQ models: the Q/DQ nodes cut fusion patterns apart, and nobody says where. This report is
that triage, made automatic: for each DQ left, what reads it and why that reader did not take
the integer form (the first failed predicate of the quantization rule that roots there, or "no
integer kernel for this op"); for each Q left, what it quantizes; and where each one runs after
grouping (inside an integer kernel's epilogue, in an elementwise loop, or as a kernel of its
own). It reads the graph after the rule passes and before fuse_ops, with fuse_ops' plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tensorfuse.ir.graph import Graph, Node

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: the integer products the quantization rules make (compiler/rules/quantize.py)
INTEGER_OPS = ("tensorfuse::ConvIntegerToFloat", "com.microsoft::MatMulIntegerToFloat", "ConvInteger",
               "MatMulInteger", "QLinearConv", "QLinearMatMul")
#: the quantization rule rooted at each float product
_RULE_AT = {"Conv": "QuantizeConv", "MatMul": "QuantizeMatMul", "Gemm": "QuantizeGemm"}


@dataclass
class QuantizedGroup:
    """An integer kernel: its node, op, ONNX nodes, and the epilogue ops that run in it."""

    node: str
    op: str
    onnx_nodes: list[str]
    epilogue: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        src = f" [ONNX {', '.join(self.onnx_nodes)}]" if self.onnx_nodes and self.onnx_nodes != [self.node] else ""
        epi = f"; epilogue {' -> '.join(self.epilogue)}" if self.epilogue else ""
        stores = " (stores the quantized value)" if self.epilogue and self.epilogue[-1] == "QuantizeLinear" else ""
        return f"  {self.op} '{self.node}'{src}{epi}{stores}"


@dataclass
class QdqLeft:
    """A Q or DQ node left in place: where it runs and why it stayed."""

    node: str
    op: str
    where: str
    reasons: list[str]

    def __str__(self) -> str:
        lines = [f"  {self.op} '{self.node}' ({self.where})"]
        lines += [f"      - {r}" for r in self.reasons]
        return "\n".join(lines)


@dataclass
class QuantReport:
    """The quantization section of the fusion report."""

    groups: list[QuantizedGroup]
    moved: list[str]
    left: list[QdqLeft]

    def __str__(self) -> str:
        lines = [f"quantization: {len(self.groups)} integer kernel{'' if len(self.groups) == 1 else 's'}, "
                 f"{len(self.moved)} data-movement op{'' if len(self.moved) == 1 else 's'} on int8, "
                 f"{len(self.left)} QuantizeLinear/DequantizeLinear left in place"]
        lines += [str(g) for g in self.groups]
        if self.moved:
            lines.append("  on int8 (their DQ -> op -> Q dropped): " + ", ".join(self.moved))
        if self.left:
            lines.append("  left in place:")
            lines += [str(q) for q in self.left]
        return "\n".join(lines)


def _desc(n: Node) -> str:
    return f"{n.qualified_op} '{n.name}'"


def quant_report(graph: Graph, planned=None, rule_reasons: dict[str, dict[str, str]] | None = None,
                 moved: list[str] | None = None, sources=None) -> QuantReport | None:
    """The report for ``graph`` (after the rule passes, before fuse_ops). ``planned``: fuse_ops'
    groups of this graph (``_Planner.plan()``), for where each node runs; ``rule_reasons``: {node
    name: {rule: why not}} of the quantization pass's candidates; ``moved``: the data-movement
    nodes DropQDQAroundDataMovement made; ``sources(names)``: their ONNX nodes. None when the
    graph has neither Q/DQ nor integer ops."""
    from tensorfuse.ir.registry import find_op
    rule_reasons = rule_reasons or {}
    sources = sources or (lambda names: names)
    nodes = list(graph.nodes)
    if not any(n.op in QDQ_OPS or n.qualified_op in INTEGER_OPS for n in nodes) and not moved:
        return None
    users = graph.users()
    group_of = {}
    for grp in planned or ():
        for m in grp.nodes:
            group_of[id(m)] = grp

    def where(n: Node) -> str:
        grp = group_of.get(id(n))
        if grp is None or len(grp.nodes) < 2:
            return "a kernel of its own"
        if grp.anchor is not None and grp.anchor is not n:
            kind = "integer" if grp.anchor.qualified_op in INTEGER_OPS else "float"
            return f"in the epilogue of the {kind} kernel {_desc(grp.anchor)}"
        head = grp.nodes[0]
        return f"in the elementwise loop of {len(grp.nodes)} ops from {_desc(head)}"

    groups = []
    for n in nodes:
        if n.qualified_op not in INTEGER_OPS:
            continue
        grp = group_of.get(id(n))
        epi = [m.op for m in grp.nodes[1:]] if grp is not None and grp.anchor is n else []
        groups.append(QuantizedGroup(n.name, n.qualified_op, sources([n.name]), epi))

    left = []
    for n in nodes:
        if n.op not in QDQ_OPS:
            continue
        reasons = []
        if n.op == "DequantizeLinear":
            readers = users.get(n.outputs[0], [])
            if n.inputs[1].type.numel != 1:
                reasons.append("per-axis or blocked scale on a value computed at run time: no integer kernel takes it")
            for c in readers:
                od = find_op(c.op, c.domain)
                rule = _RULE_AT.get(c.qualified_op)
                if rule is not None:
                    why = rule_reasons.get(c.name, {}).get(rule, "the rule did not apply")
                    reasons.append(f"blocks {rule} at {_desc(c)}: {why}")
                elif od is not None and od.quant_passthrough:
                    qs = [u for u in users.get(c.outputs[0], []) if u.op == "QuantizeLinear"]
                    if not qs:
                        reasons.append(f"{_desc(c)} moves data, but its output is not quantized again "
                                       f"(no QuantizeLinear after it), so it moves float data")
                    for q in qs:
                        why = rule_reasons.get(q.name, {}).get("DropQDQAroundDataMovement", "the rule did not apply")
                        reasons.append(f"blocks DropQDQAroundDataMovement at {_desc(q)}: {why}")
                else:
                    reasons.append(f"{_desc(c)} has no integer kernel: it computes in float on the dequantized value")
            if any(v is n.outputs[0] for v in graph.outputs):
                reasons.append("its value is a graph output (float)")
        else:
            p = n.inputs[0].producer
            if p is None:
                reasons.append(f"quantizes the graph input '{n.inputs[0].name}'")
            elif p.qualified_op in INTEGER_OPS or (group_of.get(id(n)) is not None and group_of[id(n)].anchor is not None
                                                   and group_of[id(n)].anchor.qualified_op in INTEGER_OPS):
                reasons.append("requantizes an integer kernel's float result (stored as int8 for the next kernel)")
            else:
                rule = _RULE_AT.get(p.qualified_op)
                extra = ""
                if rule is not None:
                    extra = f"; {rule} did not apply there: " + rule_reasons.get(p.name, {}).get(rule, "?")
                reasons.append(f"quantizes the float output of {_desc(p)}{extra}")
        left.append(QdqLeft(n.name, n.op, where(n), reasons or ["(no reader)"]))
    return QuantReport(groups, list(moved or []), left)
