"""Graph passes. Each has one contract: ``pass(graph) -> bool`` (whether it changed the graph);
the pipeline (:mod:`compiler.pipeline`) times them, and an error inside one names the pass and
the node (:class:`PassError`).

- :func:`fold_constants` (fold.py): evaluate nodes whose inputs are known, through the registry's
  numpy references; shape subgraphs included; large results only when weights alone read them.
- :func:`eliminate_dead_nodes` (dce.py): remove nodes nothing reads; graph outputs stay.
- :func:`eliminate_common_subexpressions` (cse.py): merge equal constants and equal nodes.
- :data:`SIMPLIFY_RULES` (simplify.py): identity elimination, Transpose and Reshape chains.
"""
from __future__ import annotations

from tensorfuse.ir.errors import CompileError


class PassError(CompileError):
    """A pass failed; the message names the pass and the node."""

    def __init__(self, pass_name: str, node, cause: BaseException | str):
        where = f"node {node.name} ({node.qualified_op})" if node is not None else "the graph"
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"pass {pass_name} failed at {where}: {why}")
        self.pass_name = pass_name
        self.node = node


from tensorfuse.compiler.passes.cse import eliminate_common_subexpressions  # noqa: E402
from tensorfuse.compiler.passes.dce import eliminate_dead_nodes  # noqa: E402
from tensorfuse.compiler.passes.fold import fold_constants  # noqa: E402
from tensorfuse.compiler.passes.simplify import SIMPLIFY_RULES, simplify  # noqa: E402

__all__ = ["PassError", "fold_constants", "eliminate_dead_nodes", "eliminate_common_subexpressions",
           "SIMPLIFY_RULES", "simplify"]
