"""Constant folding through the registry's numpy references (the ops' meaning).

What is folded (:func:`fold_constants`), for a deterministic registered node whose inputs are
all constants (or whose outputs were computed at import, ``Value.known``):

- a *small* node, whose outputs take at most ``max(max_bytes, bytes of its inputs)``
  (``MAX_FOLD_BYTES``, 1 MiB, by default): always, as it never blows memory up much;
- a *large* node (ConstantOfShape, Expand, Tile, Range ... beyond that): only when its outputs
  are *weights only* (:func:`_weights_only`), and while the model's growth from folding stays
  within ``MAX_FOLD_GROWTH_BYTES`` (256 MiB). A weight (Conv's W, a Gemm's B ...) is read whole
  by its kernel at every call anyway: folding it costs memory once but saves the kernels that
  build it at every call, and lets the rules that want constant weights (BatchNorm folding)
  fire. An activation-shaped Expand read by an Add with a runtime tensor is no weight: the
  kernel broadcasts the small source for free, where the folded tensor would cost its bytes
  in memory and in memory traffic at every call.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.registry import find_op, is_deterministic, run_reference

#: default cap on the bytes one folded node may add beyond the constants it reads
MAX_FOLD_BYTES = 1 << 20

#: default cap on the model's growth (bytes) from constant folding, beyond which no more large
#: nodes fold (see the module docstring); ``fold_constants(max_growth=)`` overrides it
MAX_FOLD_GROWTH_BYTES = 256 << 20

#: weight (parameter) input positions of default-domain ops (ONNX input order): a kernel reads
#: these whole at every call, however they were computed
WEIGHT_INPUTS: dict[str, frozenset[int]] = {k: frozenset(v) for k, v in {
    "Conv": (1, 2),                      # W, B
    "ConvTranspose": (1, 2),             # W, B
    "DeformConv": (1, 3),                # W, B
    "ConvInteger": (1, 2, 3),            # w, x_zero_point, w_zero_point
    "QLinearConv": (1, 2, 3, 4, 5, 6, 7, 8),  # every scale, zero point, w and B
    "Gemm": (0, 1, 2),                   # A (W @ x layouts), B, C
    "MatMul": (0, 1),
    "MatMulInteger": (0, 1, 2, 3),
    "BatchNormalization": (1, 2, 3, 4),  # scale, B, input_mean, input_var
    "InstanceNormalization": (1, 2),     # scale, B
    "LayerNormalization": (1, 2),        # Scale, B
    "GroupNormalization": (1, 2),        # scale, bias
    "RNN": (1, 2, 3),                    # W, R, B
    "GRU": (1, 2, 3),
    "LSTM": (1, 2, 3, 7),                # W, R, B, P
    "Gather": (0,),                      # data: an embedding table
}.items()}


def _can_fold(n: Node) -> bool:
    # an op whose result is not a function of its inputs (OpDef.deterministic) never folds,
    # and neither does one the registry does not know
    return is_deterministic(n)


def _is_small(n: Node, max_bytes: int, relative: bool = True) -> bool:
    """Outputs known at import, or outputs within ``max(max_bytes, input bytes)`` (``relative``)
    or ``max_bytes``."""
    if all(o.known is not None for o in n.outputs):
        return True
    out_bytes = sum(o.type.nbytes for o in n.outputs)
    in_bytes = sum(v.type.nbytes for v in n.inputs if v is not None) if relative else 0
    return out_bytes <= max(max_bytes, in_bytes)


def _weights_only(n: Node, users: dict[Value, list[Node]], outputs: set[int], absorbs: set[int]) -> bool:
    """Every output of ``n`` is read, none is a graph output, and every read is in a weight
    position (``WEIGHT_INPUTS``) or by a node in ``absorbs``: one that folds too and whose
    outputs are small (``max_bytes``) or weights only in turn."""
    for o in n.outputs:
        readers = users.get(o, [])
        if id(o) in outputs or not readers:
            return False
        for u in readers:
            if id(u) in absorbs:
                continue
            weights = WEIGHT_INPUTS.get(u.op, frozenset()) if u.domain == "" else frozenset()
            if any(v is o and i not in weights for i, v in enumerate(u.inputs)):
                return False
    return True


def _plan(graph: Graph, max_bytes: int, users: dict[Value, list[Node]]) -> tuple[set[int], set[int]]:
    """(ids of nodes to fold, ids of those that are large), assuming every planned node folds.
    Forward: which nodes compute from constants only; backward (readers first): which of
    those fold, and which take a large input in (``_weights_only``)."""
    const = {id(v) for v in graph.constants.values()}
    computable = []
    for n in graph.nodes:
        if not _can_fold(n):
            continue
        present = [v for v in n.inputs if v is not None]
        if all(o.known is not None for o in n.outputs) or (present and all(id(v) in const for v in present)):
            computable.append(n)
            const.update(id(o) for o in n.outputs)
    outputs = {id(v) for v in graph.outputs}
    folds: set[int] = set()
    large: set[int] = set()
    absorbs: set[int] = set()
    for n in reversed(computable):       # readers come later in topological order
        weights = _weights_only(n, users, outputs, absorbs)
        if _is_small(n, max_bytes):
            folds.add(id(n))
            if weights or _is_small(n, max_bytes, relative=False):
                absorbs.add(id(n))
        elif weights:
            folds.add(id(n))
            large.add(id(n))
            absorbs.add(id(n))
    return folds, large


def _evaluate(n: Node) -> list[np.ndarray] | None:
    """The node's outputs (propagated at import, else by its reference), or None when an
    input is not a constant (yet)."""
    if all(o.known is not None for o in n.outputs):
        outs = [o.known for o in n.outputs]          # propagated at import (shape subgraphs)
    else:
        if any(v is not None and v.data is None for v in n.inputs) or not any(v is not None for v in n.inputs):
            return None
        outs = run_reference(n, [None if v is None else v.data for v in n.inputs])
    outs = [np.asarray(a) for a in outs]
    for o, a in zip(n.outputs, outs):
        if a.dtype != o.dtype.numpy or tuple(a.shape) != o.shape:
            raise ValueError(f"the reference gives {a.dtype}{list(a.shape)} for output '{o.name}', "
                             f"inference says {o.type}")
    return outs


def _install(graph: Graph, n: Node, outs: list[np.ndarray]) -> None:
    for o, a in zip(n.outputs, outs):
        o.data = np.ascontiguousarray(a).reshape(o.shape)  # (ascontiguousarray makes 0-d 1-d); the Value becomes the constant:
        o.known = None                                 # its name and readers stay
        o.producer = None
        graph.constants[o.name] = o


def fold_constants(graph: Graph, max_bytes: int = MAX_FOLD_BYTES, max_growth: int | None = None) -> bool:
    """Replace nodes whose inputs are all constants (or whose outputs were computed at import
    from static shapes, ``Value.known``: Shape, Gather, Unsqueeze, Concat, Slice, Cast, Reshape
    of shapes ...) by constants holding their outputs, computed by the op's numpy reference, so
    dtypes (bool, ints) are exact. Random ops are never folded. Which nodes fold:

    - a node whose outputs take at most ``max(max_bytes, bytes of its inputs)`` (``max_bytes``:
      1 MiB by default, ``MAX_FOLD_BYTES``): always;
    - a larger one (ConstantOfShape, Expand, Tile ...) when its outputs are *weights only*: none
      is a graph output, each is read, and every read is in a weight position
      (``WEIGHT_INPUTS``: Conv's W and B, BatchNormalization's statistics, Gemm's and MatMul's
      operands, an RNN's W, R and B, Gather's table ...) or by a node that folds too and whose
      own outputs are at most ``max_bytes`` or weights only in turn. So ConstantOfShape -> Mul
      by a constant -> Conv's W folds whole, while an Expand read by an Add with a runtime input,
      directly or through such a Mul, stays (the Add's kernel broadcasts it for free);
    - and a larger one only while the model's growth stays within ``max_growth`` bytes (None:
      ``MAX_FOLD_GROWTH_BYTES``, 256 MiB, read at call time). The growth counts every fold, in
      node order: its outputs' bytes minus those of the constants that nothing reads any more
      once it is folded (dead-node elimination removes them). It is kept on the graph
      (``graph.fold_growth``), so the pipeline's repeated calls share one budget (a
      ``Graph.copy`` starts afresh). A large node that would take it beyond ``max_growth``
      stays, and so do the folds waiting for its result. Rewrite rules that make new constants
      (BatchNorm folding) are not counted.

    Returns whether any node was folded. Raises PassError naming the node when a reference
    fails or disagrees with inference.
    """
    from tensorfuse.compiler.passes import PassError
    budget = MAX_FOLD_GROWTH_BYTES if max_growth is None else max_growth
    users = graph.users()
    folds, large = _plan(graph, max_bytes, users)
    if not folds:
        return False
    readers = {id(v): len(ns) for v, ns in users.items()}
    for v in graph.outputs:
        readers[id(v)] = readers.get(id(v), 0) + 1
    growth = getattr(graph, "fold_growth", 0)
    kept = []
    changed = False
    for n in graph.nodes:
        if id(n) not in folds:
            kept.append(n)
            continue
        inputs = list({id(v): v for v in n.inputs if v is not None}.values())
        freed = sum(v.type.nbytes for v in inputs if v.data is not None and readers.get(id(v), 0) == 1)
        delta = sum(o.type.nbytes for o in n.outputs) - freed
        if id(n) in large and growth + delta > budget:
            kept.append(n)
            continue
        try:
            outs = _evaluate(n)
        except Exception as e:
            raise PassError("fold_constants", n, e) from e
        if outs is None:                 # an input's producer stayed (the growth cap)
            kept.append(n)
            continue
        _install(graph, n, outs)
        for v in inputs:
            readers[id(v)] -= 1
        growth += delta
        changed = True
    if changed:
        graph.nodes = kept
        graph.fold_growth = growth
    return changed
