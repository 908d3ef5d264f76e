"""Common-subexpression elimination: equal constants, then equal nodes."""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.graph import Graph, Value
from tensorfuse.ir.registry import is_deterministic


def _const_key(v: Value):
    """Dtype, shape and a cheap fingerprint (first and last bytes); equal keys are then
    compared in full, so large weights are not hashed."""
    b = np.ascontiguousarray(v.data).reshape(-1).view(np.uint8)
    return (v.type.dtype, v.type.shape, b[:64].tobytes(), b[-64:].tobytes())


def _same_bytes(a: Value, b: Value) -> bool:
    x = np.ascontiguousarray(a.data).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b.data).reshape(-1).view(np.uint8)
    return x.shape == y.shape and bool(np.array_equal(x, y))


def _attr_key(x):
    """Attributes compared strictly: 1 differs from 1.0 and True; arrays by dtype, shape, bytes."""
    if isinstance(x, (bool, np.bool_)):
        return ("b", bool(x))
    if isinstance(x, (int, np.integer)):
        return ("i", int(x))
    if isinstance(x, (float, np.floating)):
        return ("f", float(x).hex() if x == x else "nan")
    if isinstance(x, np.ndarray):
        return ("t", str(x.dtype), x.shape, np.ascontiguousarray(x).tobytes())
    if isinstance(x, (list, tuple)):
        return ("l", tuple(_attr_key(y) for y in x))
    return (type(x).__name__, x)


def eliminate_common_subexpressions(graph: Graph) -> bool:
    """Merge constants with equal dtype, shape and bytes (so -0.0 and 0.0 stay apart, equal
    NaNs merge), then nodes with equal op, domain, attributes and inputs (in graph order, so
    chains of duplicates collapse in one call); nodes of ops whose result is not a function of
    their inputs (``OpDef.deterministic`` False: random ops) or that the registry does not know
    are never merged. Later duplicates are redirected to the first;
    graph outputs keep their names (``graph.output_names``). Returns whether anything merged."""
    changed = False
    first: dict = {}
    repl: dict[int, Value] = {}
    for name, v in list(graph.constants.items()):
        k = _const_key(v)
        same = next((o for o in first.get(k, ()) if _same_bytes(o, v)), None)
        if same is not None:
            repl[id(v)] = same
            del graph.constants[name]
        else:
            first.setdefault(k, []).append(v)
    seen: dict = {}
    kept = []
    for n in graph.nodes:
        if repl:
            n.inputs = [repl.get(id(v), v) if v is not None else None for v in n.inputs]
        key = (n.domain, n.op, len(n.outputs), tuple(id(v) if v is not None else None for v in n.inputs),
               tuple(sorted((k, _attr_key(a)) for k, a in n.attrs.items())))
        if not is_deterministic(n):     # two draws of a random op are two different values
            kept.append(n)
            continue
        same = seen.get(key)
        if same is not None and all(a.type == b.type for a, b in zip(n.outputs, same.outputs)):
            for a, b in zip(n.outputs, same.outputs):
                repl[id(a)] = b
            continue
        seen[key] = n
        kept.append(n)
    if repl:
        changed = True
        graph.nodes = kept
        graph.outputs = [repl.get(id(v), v) for v in graph.outputs]
    return changed
