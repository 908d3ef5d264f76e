"""The op registry: one home for every fact about an op (docs/architecture.md).

Each :class:`OpDef` declares, once: the op name (ONNX's, verbatim) and domain, the attribute
schema with defaults (taken from ``onnx.defs`` for the default domain, so they are the ONNX
spec's), type and shape inference, a numpy reference implementation (the op's meaning, used
by constant folding, the interpreter and tests), the op pattern kind, and the lowering to
kernel IR. Passes ask the registry; they keep no lists of op names of their own.

IR semantics of a default-domain op are those of the newest opset that the installed onnx
defines; the frontend converts older versions (``OpDef.importer``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .types import TensorType


class OpPatternKind(enum.IntEnum):
    """TVM's op pattern kinds, ordered: a pass may ask ``kind <= INJECTIVE``."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    OPAQUE = 8


@dataclass
class AttrSpec:
    type: str               # "int", "float", "string", "ints", "floats", "strings", "tensor", "graph"
    default: Any = None
    required: bool = False


class ShapeError(ValueError):
    """Type or shape inference failed: the message names the op and what is wrong.

    ``needs_value`` is the name of the value whose compile-time value inference needed but
    which is computed at run time (None for other failures). ``reason`` is the message without
    the node it names (for callers that name the node their own way)."""

    def __init__(self, message: str, needs_value: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.needs_value = needs_value
        self.reason = message if reason is None else reason


@dataclass
class OpDef:
    """Everything about one op. See module docstring.

    infer(node) -> list[TensorType]; reference(node, inputs) -> list[np.ndarray];
    lower(ctx) emits kernel IR (see ``ir.lowering.LowerCtx``), or None when the op must be
    removed or decomposed before lowering; importer(ctx, proto, version) -> list[Value|None]
    converts an ONNX node of an older opset version (None: the default import).
    scalar(node, *xs) -> Expr: for elementwise/broadcast ops, the per-element function on
    kernel-IR expressions (one per present input); it gives the op its lowering (a broadcast
    loop) and lets fusion compose elementwise chains and anchor epilogues into one kernel.
    """

    name: str
    kind: OpPatternKind
    infer: Callable
    reference: Callable
    lower: Callable | None = None
    domain: str = ""
    attrs: dict[str, AttrSpec] = field(default_factory=dict)
    importer: Callable | None = None
    const_inputs: tuple[int, ...] = ()   # inputs whose values must be known at compile time
    flops: Callable | None = None        # node -> float FLOP count, for the profiler
    scalar: Callable | None = None       # elementwise ops: (node, *Exprs) -> Expr, for fusion
    #: node -> bool: where ``scalar`` applies to some nodes of the op only (QuantizeLinear with
    #: one scale is elementwise, with a scale per axis it is not): False keeps the node out of
    #: elementwise groups and epilogues, and it lowers through ``lower``; None: everywhere
    scalar_applies: Callable | None = None
    known: Callable | None = None        # node -> list[np.ndarray] | None: outputs that follow from
                                         # input types alone (Shape, Size), for data propagation
    #: False when the result is not a function of the inputs (random ops: RandomNormal,
    #: Bernoulli ...): such nodes are never constant-folded (compiler/passes/fold.py) and never
    #: merged by CSE (compiler/passes/cse.py); see :func:`is_deterministic`
    deterministic: bool = True
    #: op(a, b) == op(b, a) for all inputs (ONNX semantics; variadic ops: any order of two):
    #: a two-input pattern of such an op tries both operand orders (compiler/pattern.py)
    commutative: bool = False
    #: output 0 is input 0's row-major elements unchanged, under another shape (Reshape,
    #: Flatten, Squeeze, Unsqueeze; TVM's ``TReshapeOp``): the simplify rules collapse chains of
    #: them and remove one that keeps the shape (compiler/passes/simplify.py)
    reshape_only: bool = False
    #: an op the fusion catalogue builds around (Conv, ConvTranspose, Gemm, MatMul: BatchNorm
    #: folds into it, bias/residual/activation epilogues make it a tensorfuse::Fused* op); the
    #: fusion report of ``explain`` lists what became of each one (compiler/explain.py)
    fusion_anchor: bool = False
    #: an anchor (OUT_ELEMWISE_FUSABLE) whose lowering computes in its own output type and
    #: applies the epilogue only at the single store, so the epilogue may end in another dtype
    #: of the same shape (ConvIntegerToFloat -> QuantizeLinear stores u8): fuse_ops then lets
    #: dtype-changing elementwise ops join it (compiler/passes/fuse_ops.py)
    epilogue_casts: bool = False
    #: how a per-tensor QuantizeLinear/DequantizeLinear pair passes through the op's input 0
    #: (onnxruntime drops such DQ -> op -> Q pairs so data moves as int8): "copy" (every output
    #: element is an input element: Reshape, Transpose, Slice, Gather ...), "monotone" (a
    #: nondecreasing selection: MaxPool; needs a positive scale), "" (none). Read by
    #: compiler/rules/quantize.py
    quant_passthrough: str = ""
    #: injective ops that move elements of one data input (input 0; any other input a
    #: compile-time constant): ``index_map(node, out_idx) -> in_idx`` maps an output index (a
    #: list of i64 kernel-IR expressions, one per output dim) to the index of input 0 that holds
    #: that element (Transpose, Slice, the Reshape family). It lets fuse_ops put the op inside
    #: a loop group between elementwise ops (compiler/passes/fuse_ops.py); None: the op stands
    #: alone in grouping
    index_map: Callable | None = None
    #: a reduction-like op (Softmax, LayerNormalization, the Reduce ops) whose lowerings -- the
    #: generic one and every backend schedule -- read input 0 only through ``Buffer.flat``,
    #: ``vload``, ``[]`` and ``bcast``: fuse_ops may then give it an elementwise prologue,
    #: computed at each element the lowering reads instead of stored (ir/ops/fused_function.py)
    prologue: bool = False
    doc: str = ""

    def __post_init__(self):
        if self.lower is None and self.scalar is not None:
            from .ops._common import lower_elementwise
            scalar = self.scalar
            self.lower = lambda ctx: lower_elementwise(ctx, lambda *xs: scalar(ctx.node, *xs))

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.name}" if self.domain else self.name


_REGISTRY: dict[tuple[str, str], OpDef] = {}

_ONNX_ATTR_TYPES = {1: "float", 2: "int", 3: "string", 4: "tensor", 5: "graph", 6: "floats", 7: "ints",
                    8: "strings", 9: "tensors", 10: "graphs", 11: "sparse_tensor", 13: "type_proto"}


def onnx_attr_specs(name: str, domain: str = "") -> dict[str, AttrSpec]:
    """Attribute schema of the newest version of an ONNX op, from ``onnx.defs``."""
    import onnx.defs
    from onnx import helper
    try:
        schema = onnx.defs.get_schema(name, onnx.defs.onnx_opset_version(), domain)
    except Exception:
        return {}
    out = {}
    for aname, a in schema.attributes.items():
        default = None
        if a.default_value is not None and a.default_value.name:
            default = helper.get_attribute_value(a.default_value)
            if isinstance(default, bytes):
                default = default.decode()
            if isinstance(default, list):
                default = [x.decode() if isinstance(x, bytes) else x for x in default]
        out[aname] = AttrSpec(_ONNX_ATTR_TYPES.get(int(a.type), "?"), default, bool(a.required))
    return out


def register(opdef: OpDef) -> OpDef:
    """Add an op to the registry (default-domain attrs come from onnx.defs unless given)."""
    key = (opdef.domain, opdef.name)
    if key in _REGISTRY:
        raise ValueError(f"op {opdef.qualified_name} registered twice")
    if not opdef.attrs and opdef.domain == "":
        opdef.attrs = onnx_attr_specs(opdef.name)
    _REGISTRY[key] = opdef
    return opdef


def op(name: str, kind: OpPatternKind, *, domain: str = "", **kw) -> Callable:
    """Decorator form: the decorated class provides ``infer``, ``reference``, ``lower`` ...

    Example::

        @op("Relu", OpPatternKind.ELEMWISE)
        class Relu:
            infer = same_as_input
            def reference(node, x): ...
    """
    def deco(cls):
        fields = {k: v for k, v in vars(cls).items() if not k.startswith("__")}
        fields.update(kw)
        doc = (cls.__doc__ or "").strip()
        register(OpDef(name=name, kind=kind, domain=domain, doc=doc, **fields))
        return cls
    return deco


def has_scalar(node, od: "OpDef | None" = None) -> bool:
    """Does ``node``'s op give it a per-element ``scalar`` function (``OpDef.scalar``, where
    ``OpDef.scalar_applies`` allows)? The question fusion asks before composing it."""
    od = od if od is not None else find_op(node.op, node.domain)
    return od is not None and od.scalar is not None and (od.scalar_applies is None or bool(od.scalar_applies(node)))


def is_elementwise(node, od: "OpDef | None" = None) -> bool:
    """Is ``node`` an elementwise op as fusion and the rules see it: one output, kind ELEMWISE
    or BROADCAST, a per-element ``scalar`` (:func:`has_scalar`), at least one input read?"""
    od = od if od is not None else find_op(node.op, node.domain)
    return (od is not None and od.kind <= OpPatternKind.BROADCAST and has_scalar(node, od)
            and len(node.outputs) == 1 and any(v is not None for v in node.inputs))


def is_deterministic(node) -> bool:
    """Is ``node``'s result a function of its inputs and attributes alone (``OpDef.deterministic``)?
    False for ops not in the registry, which nothing may fold or merge either."""
    od = find_op(node.op, node.domain)
    return od is not None and od.deterministic


_LOADED = False


def op_names(flag: str, domain: str = "") -> tuple[str, ...]:
    """Names of the ops of ``domain`` (default: ONNX's) whose OpDef attribute ``flag`` is true
    (``"commutative"``, ``"reshape_only"``, ``"fusion_anchor"``), sorted. AttributeError for
    a name that is not an OpDef field."""
    if flag not in OpDef.__dataclass_fields__:
        raise AttributeError(f"OpDef has no field {flag!r}")
    return tuple(o.name for o in all_ops() if o.domain == domain and getattr(o, flag))


def _ensure_loaded() -> None:
    # a flag, not the import statement each time: find_op runs for every node in every pass,
    # and ``from . import ops`` costs about 0.2 ms even when the package is loaded
    global _LOADED
    if not _LOADED:
        from . import ops  # noqa: F401  (registers every op)
        _LOADED = True


def find_op(name: str, domain: str = "") -> OpDef | None:
    _ensure_loaded()
    return _REGISTRY.get((domain if domain != "ai.onnx" else "", name))


def get_op(name: str, domain: str = "") -> OpDef:
    od = find_op(name, domain)
    if od is None:
        raise KeyError(f"op {domain + '::' if domain else ''}{name} is not in the registry")
    return od


def all_ops() -> list[OpDef]:
    _ensure_loaded()
    return sorted(_REGISTRY.values(), key=lambda o: (o.domain, o.name))


def infer_types(node) -> list[TensorType]:
    """Run the op's inference, wrapping failures in ShapeError naming node and op."""
    od = get_op(node.op, node.domain)
    try:
        types = od.infer(node)
    except ShapeError as e:
        raise ShapeError(f"{node.qualified_op} node '{node.name}': {e}", e.needs_value, e.reason) from None
    except (ValueError, IndexError, TypeError, KeyError) as e:
        reason = f"{type(e).__name__}: {e}"
        raise ShapeError(f"{node.qualified_op} node '{node.name}': {reason}", reason=reason) from e
    return list(types)


def run_reference(node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Evaluate a node with its numpy reference; outputs are cast to the inferred dtypes."""
    od = get_op(node.op, node.domain)
    outs = od.reference(node, inputs)
    if isinstance(outs, np.ndarray) or np.isscalar(outs):
        outs = [outs]
    res = []
    for o, v in zip(outs, node.outputs):
        a = np.asarray(o)
        if v is not None and a.dtype != v.type.dtype.numpy:
            a = a.astype(v.type.dtype.numpy)
        res.append(a)
    return res
