"""tensorfuse IR: types, the typed graph IR, the op registry and kernel IR."""
from .types import DType, TensorType
from .graph import Graph, Node, Value
from .builder import Builder
from .registry import OpDef, OpPatternKind, ShapeError, get_op, find_op, all_ops, register, op

__all__ = ["DType", "TensorType", "Graph", "Node", "Value", "Builder", "OpDef", "OpPatternKind",
           "ShapeError", "get_op", "find_op", "all_ops", "register", "op", "parse", "print_graph",
           "verify_graph"]


def parse(text: str, constants=None) -> Graph:
    from .text import parse_graph
    return parse_graph(text, constants)


def print_graph(g: Graph) -> str:
    from .text import print_graph as _p
    return _p(g)


def verify_graph(g: Graph, **kw) -> None:
    """Check a graph's invariants; raises ir.verify.VerifyError listing every problem."""
    from .verify import verify_graph as _v
    _v(g, **kw)
