"""Constant folding through the registry's numpy references (the ops' meaning)."""
from __future__ import annotations

import numpy as np

from ir.graph import Graph, Node
from ir.registry import find_op, run_reference

#: default cap on the bytes one folded node may add beyond the constants it reads
MAX_FOLD_BYTES = 1 << 20

#: ops whose result is not a function of their inputs: never folded, never merged by CSE
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})


def _fold_node(graph: Graph, n: Node, max_bytes: int) -> bool:
    if n.op in NONDETERMINISTIC or find_op(n.op, n.domain) is None:
        return False
    out_bytes = sum(o.type.nbytes for o in n.outputs)
    if all(o.known is not None for o in n.outputs):
        outs = [o.known for o in n.outputs]          # propagated at import (shape subgraphs)
    else:
        if any(v is not None and v.data is None for v in n.inputs) or not any(v is not None for v in n.inputs):
            return False
        in_bytes = sum(v.type.nbytes for v in n.inputs if v is not None)
        if out_bytes > max(max_bytes, in_bytes):
            return False                             # Expand, Tile, ConstantOfShape ... stay
        outs = run_reference(n, [None if v is None else v.data for v in n.inputs])
    for o, a in zip(n.outputs, outs):
        a = np.asarray(a)
        if a.dtype != o.dtype.numpy or tuple(a.shape) != o.shape:
            raise ValueError(f"the reference gives {a.dtype}{list(a.shape)} for output '{o.name}', "
                             f"inference says {o.type}")
    for o, a in zip(n.outputs, outs):
        o.data = np.ascontiguousarray(a).reshape(o.shape)  # (ascontiguousarray makes 0-d 1-d); the Value becomes the constant:
        o.known = None                                 # its name and readers stay
        o.producer = None
        graph.constants[o.name] = o
    return True


def fold_constants(graph: Graph, max_bytes: int = MAX_FOLD_BYTES) -> bool:
    """Replace every node whose inputs are all constants (or whose outputs were computed at
    import from static shapes, ``Value.known``: Shape, Gather, Unsqueeze, Concat, Slice, Cast,
    Reshape of shapes ...) by constants holding its outputs, computed by the op's numpy
    reference, so dtypes (bool, ints) are exact. A node is left alone when its outputs would
    exceed both ``max_bytes`` and the bytes of its inputs (so folding never blows up memory),
    and when its op is random. Returns whether any node was folded.

    Raises PassError naming the node when a reference fails or disagrees with inference.
    """
    from compiler.passes import PassError
    kept = []
    changed = False
    for n in graph.nodes:
        try:
            folded = _fold_node(graph, n, max_bytes)
        except Exception as e:
            raise PassError("fold_constants", n, e) from e
        if folded:
            changed = True
        else:
            kept.append(n)
    if changed:
        graph.nodes = kept
    return changed
