"""Dead-node elimination."""
from __future__ import annotations

from tensorfuse.ir.graph import Graph


def eliminate_dead_nodes(graph: Graph) -> bool:
    """Remove nodes none of whose outputs is read by a live node or is a graph output, then
    constants nothing reads. Graph outputs (and what computes them) are never removed.
    Returns whether anything was removed."""
    live: set[int] = {id(v) for v in graph.outputs}
    keep = []
    for n in reversed(graph.nodes):
        if any(id(o) in live for o in n.outputs):
            keep.append(n)
            live.update(id(v) for v in n.inputs if v is not None)
    changed = len(keep) != len(graph.nodes)
    if changed:
        keep.reverse()
        graph.nodes = keep
    return graph.remove_unused_constants() > 0 or changed
