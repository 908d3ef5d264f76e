"""The graph IR's text form (docs/architecture.md, "IR levels, all printable"): print and parse back.

One statement a line; nodes in graph order; ``print_graph(parse_graph(t)) == t`` for printed
text, and ``parse_graph(print_graph(g))`` is structurally equal to ``g``::

    graph main(%x: f32[1,3,8,8], %"onnx::Mask_0": i64[1,4]) {
      const %w: f32[8,3,3,3] = digest:3f2a9c1b0e4d5a67
      const %shape: i64[2] = [1, -1]
      const %eps: f32[] = 1e-05
      %y: f32[1,8,8,8] = Conv(%x, %w) {group=1, kernel_shape=[3,3], pads=[1,1,1,1]} @conv_1
      %a: f32[1,4,8,8], %b: f32[1,4,8,8] = Split(%y) {axis=1, num_outputs=2} @split_0
      %z: f32[1,4,8,8] = tensorfuse::FusedConv(%a, _, %w) {activation="Relu"} @fused_2
      return %z, %b
    }

Names matching ``[A-Za-z0-9_.]+`` print bare, others as JSON strings (``%"onnx::Conv_12"``);
``_`` is an omitted input, ``domain::Op`` a non-default domain, ``@name`` the node name (none
when empty). Attributes, sorted by name: ints, floats (``repr``: ``inf``, ``nan``), strings,
``true``/``false``, lists ``[3,3]``, arrays in full: ``tensor(f32[1]: [0.0])``. Constants of at
most ``SMALL_CONST`` elements print values nested per shape, each the shortest text that reads
back to the same bits (NaN payloads and signs are not kept); larger ones print ``digest:`` and
16 hex digits of the sha256 of their C-order bytes. ``#`` comments and blank lines are ignored.

Graph-valued attributes (the ``body`` of a ``tensorfuse::FusedFunction`` made by fuse_ops) print
as nested blocks after the node's line, each graph with a scope of its own::

      %z: f32[4] = tensorfuse::FusedFunction(%x, %y) {anchor="", kind="BROADCAST"} @fused_0 {
        body = graph fused_0(%x: f32[4], %y: f32[1]) {
          %t: f32[4] = Add(%x, %y) @add_1
          %z: f32[4] = Relu(%t) @relu_2
          return %z
        }
      }

Large constants read back from ``parse_graph``'s ``constants`` (name -> array; dtype, shape and
digest must match the text). Without one, ``Value.data`` is a read-only array of zeros
(``known`` stays None) that remembers its digest, so it prints back the same;
:func:`placeholder_digest` tells such arrays apart. The parser takes the types from the text
and runs no inference; ``ir.verify.verify_graph`` checks them.
"""
from __future__ import annotations

import hashlib
import json
import re
import weakref

import numpy as np

from .graph import Graph, Node, Value
from .types import DType, TensorType

SMALL_CONST = 16   # constants with at most this many elements print their values

_PLAIN = re.compile(r"[A-Za-z0-9_.]+")
_NUM = re.compile(r"[-+]?(?:inf|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_.])")
_INT = re.compile(r"[-+]?\d+")
_STR = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_BOOL, _TENSOR = re.compile(r"(true|false)(?![A-Za-z0-9_.])"), re.compile(r"tensor\s*\(")
_GRAPH = re.compile(r"graph(?![A-Za-z0-9_.])")
_SPACE = re.compile(r"\s*")
_EOL = re.compile(r"(#.*)?$")
_DTYPE, _DIM, _HEX = re.compile(r"[a-z]+[0-9]*"), re.compile(r"\d+"), re.compile(r"[0-9a-f]{1,64}")
_CONST, _RETURN = re.compile(r"const(?=\s*%)"), re.compile(r"return(?![A-Za-z0-9_.\"(:])")

# id(array) -> digest, for the zero arrays standing in for large constants read without data
_PLACEHOLDERS: dict[int, str] = {}


def placeholder_digest(array) -> str | None:
    """The digest of a stand-in array made by :func:`parse_graph`, else None (real data)."""
    return _PLACEHOLDERS.get(id(array))


def _placeholder(t: TensorType, digest: str) -> np.ndarray:
    a = np.zeros(t.shape, t.dtype.numpy)
    a.flags.writeable = False    # the digest must stay true of what it names
    _PLACEHOLDERS[id(a)] = digest
    weakref.finalize(a, _PLACEHOLDERS.pop, id(a), None)
    return a


def array_digest(a: np.ndarray) -> str:
    """First 16 hex digits of the sha256 of the array's C-order bytes."""
    d = placeholder_digest(a)
    return d or hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


# -- printing ---------------------------------------------------------------------------------
def quote_name(name: str) -> str:
    return name if _PLAIN.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _float_text(x, dt: np.dtype) -> str:
    f = float(x)
    if f != f:
        return "nan"
    s = str(x)   # numpy's shortest text for this width; kept if it reads back bit-exactly
    same = _NUM.fullmatch(s) and np.array(float(s), dt).tobytes() == np.array(x, dt).tobytes()
    return s if same and re.search("[.en]", s) else repr(f)


def _elem_text(x, dt: np.dtype) -> str:
    if dt == np.bool_:
        return "true" if x else "false"
    return str(int(x)) if dt.kind in "iu" else _float_text(x, dt)


def array_text(a: np.ndarray) -> str:
    """Values nested per shape: ``[[1, 2], [3, 4]]``; a scalar prints bare."""
    a = np.asarray(a)
    if a.ndim == 0:
        return _elem_text(a[()], a.dtype)
    return "[" + ", ".join(array_text(a[i]) for i in range(a.shape[0])) + "]"


def attr_text(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, np.ndarray):
        return f"tensor({TensorType.of(v)}: {array_text(v)})"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(attr_text(x) for x in v) + "]"
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} has no text form")


def _ref(v: Value | None) -> str:
    return "_" if v is None else "%" + quote_name(v.name)


def _def(v: Value) -> str:
    return f"%{quote_name(v.name)}: {v.type}"


def node_text(n: Node) -> str:
    """One node as its line in a graph dump (without indentation)."""
    op = (quote_name(n.domain) + "::" if n.domain else "") + quote_name(n.op)
    s = f"{op}({', '.join(_ref(v) for v in n.inputs)})"
    if n.outputs:
        s = f"{', '.join(_def(v) for v in n.outputs)} = {s}"
    items = sorted((k, v) for k, v in n.attrs.items() if not isinstance(v, Graph))
    if items:
        s += " {" + ", ".join(f"{quote_name(k)}={attr_text(v)}" for k, v in items) + "}"
    if n.name:
        s += " @" + quote_name(n.name)
    return s


def _node_lines(n: Node, indent: str) -> list[str]:
    """A node's line; graph-valued attributes (a fused function's ``body``) follow as blocks
    ``name = graph ... { ... }`` inside ``{`` ... ``}``, one indentation level deeper."""
    subs = sorted((k, v) for k, v in n.attrs.items() if isinstance(v, Graph))
    if not subs:
        return [indent + node_text(n)]
    lines = [indent + node_text(n) + " {"]
    for k, sub in subs:
        block = _graph_lines(sub, indent + "  ")
        block[0] = f"{indent}  {quote_name(k)} = {block[0].lstrip()}"
        lines += block
    return lines + [indent + "}"]


def _const_text(v: Value) -> str:
    if v.data is None:
        return "?"   # a broken graph still prints; the verifier names the problem
    if placeholder_digest(v.data) is None and np.size(v.data) <= SMALL_CONST:
        return array_text(v.data)
    return "digest:" + array_digest(v.data)


def _graph_lines(g: Graph, indent: str = "") -> list[str]:
    lines = [f"{indent}graph {quote_name(g.name)}({', '.join(_def(v) for v in g.inputs)}) {{"]
    lines += [f"{indent}  const {_def(v)} = {_const_text(v)}" for v in g.constants.values()]
    for n in g.nodes:
        lines += _node_lines(n, indent + "  ")
    lines += [(f"{indent}  return " + ", ".join(_ref(v) for v in g.outputs)).rstrip(), indent + "}"]
    return lines


def print_graph(g: Graph) -> str:
    return "\n".join(_graph_lines(g)) + "\n"


# -- parsing ----------------------------------------------------------------------------------
class _Line:
    """A cursor over one line of text; errors name the line number and column."""

    def __init__(self, text: str, lineno: int):
        self.s, self.lineno, self.pos = text, lineno, 0

    def error(self, msg: str):
        raise ValueError(f"line {self.lineno}, column {self.pos + 1}: {msg}\n  {self.s.strip()}")

    def skip(self) -> int:
        self.pos = _SPACE.match(self.s, self.pos).end()
        return self.pos

    def match(self, rx: re.Pattern) -> str | None:
        """The token ``rx`` matches after spaces (and moves past it), else None."""
        m = rx.match(self.s, self.skip())
        if m is None:
            return None
        self.pos = m.end()
        return m.group()

    def need(self, rx: re.Pattern, what: str) -> str:
        tok = self.match(rx)
        return self.error(f"expected {what}") if tok is None else tok

    def accept(self, tok: str) -> bool:
        if self.peek(tok):
            self.pos += len(tok)
            return True
        return False

    def expect(self, tok: str) -> None:
        if not self.accept(tok):
            self.error(f"expected {tok!r}")

    def at_end(self) -> bool:
        return self.match(_EOL) is not None

    def end(self) -> None:
        if not self.at_end():
            self.error(f"unexpected {self.s[self.pos:self.pos + 12]!r}")

    def peek(self, tok: str) -> bool:
        return self.s.startswith(tok, self.skip())

    def seq(self, close: str, item) -> list:
        """``item()`` results separated by ',' up to ``close`` (the opener is already read)."""
        items: list = []
        while not self.accept(close):
            if items:
                self.expect(",")
            items.append(item())
        return items

    def commas(self, item) -> list:
        """One or more ``item()`` results separated by ','."""
        items = [item()]
        while self.accept(","):
            items.append(item())
        return items

    def string(self) -> str:
        tok = self.need(_STR, "a string")
        try:
            return json.loads(tok)
        except ValueError as e:
            self.error(f"bad string {tok}: {e}")

    def name(self, what: str) -> str:
        return self.string() if self.peek('"') else self.need(_PLAIN, what)

    def type(self) -> TensorType:
        dt = self.need(_DTYPE, "a type like f32[2,3]")
        if dt not in DType.__members__:
            self.error(f"unknown dtype {dt!r}")
        self.expect("[")
        return TensorType(DType[dt], self.seq("]", lambda: int(self.need(_DIM, "a dimension"))))

    def typed(self, what: str) -> tuple[str, TensorType]:
        """``%name: type``"""
        self.expect("%")
        name = self.name(what)
        self.expect(":")
        return name, self.type()

    def boolean(self) -> bool | None:
        word = self.match(_BOOL)
        return None if word is None else word == "true"

    def array(self, t: TensorType) -> np.ndarray:
        """Values nested per shape (see :func:`array_text`), as an array of type ``t``."""
        def rec():
            if self.accept("["):
                return self.seq("]", rec)
            if t.dtype is DType.bool:
                b = self.boolean()
                return self.error("expected true or false") if b is None else b
            tok = self.need(_NUM, "a number")
            if t.dtype.is_float:
                return float(tok)
            return int(tok) if _INT.fullmatch(tok) else self.error(f"expected an integer for {t.dtype}, got {tok}")

        data = rec()
        try:
            a = np.array(data, dtype=t.dtype.numpy)
        except (ValueError, OverflowError) as e:
            self.error(f"bad values for {t}: {e}")
        if a.size == 0 and t.numel == 0:
            a = a.reshape(t.shape)
        if a.shape != t.shape:
            self.error(f"values have shape {list(a.shape)} but the type is {t}")
        return a

    def attr(self) -> tuple[str, object]:
        key = self.name("an attribute name")
        self.expect("=")
        return key, self.attr_value()

    def attr_value(self):
        if self.peek('"'):
            return self.string()
        if self.accept("["):
            return self.seq("]", self.attr_value)
        b = self.boolean()
        if b is not None:
            return b
        if self.match(_TENSOR):
            t = self.type()
            self.expect(":")
            a = self.array(t)
            self.expect(")")
            return a
        tok = self.need(_NUM, "a number")
        return int(tok) if _INT.fullmatch(tok) else float(tok)


class _Parser:
    def __init__(self, constants):
        self.constants = constants or {}
        self.env: dict[str, Value] = {}
        self.g: Graph | None = None
        self.last: _Line | None = None

    def define(self, ln: _Line, name: str, t: TensorType, data=None) -> Value:
        if name in self.env:
            ln.error(f"value %{quote_name(name)} is defined twice")
        v = self.env[name] = Value(name, t, data=data)
        self.g.reserve(name)
        return v

    def ref(self, ln: _Line) -> Value:
        ln.expect("%")
        name = ln.name("a value name")
        return self.env[name] if name in self.env else ln.error(f"undefined value %{quote_name(name)}")

    def header(self, ln: _Line) -> None:
        if not ln.match(_GRAPH):
            ln.error("expected 'graph NAME(...) {'")
        self.g = Graph(ln.name("a graph name"))
        ln.expect("(")
        self.g.inputs = ln.seq(")", lambda: self.define(ln, *ln.typed("an input name")))
        ln.expect("{")
        ln.end()

    def const(self, ln: _Line) -> None:
        name, t = ln.typed("a constant name")
        ln.expect("=")
        if not ln.accept("digest:"):
            data = ln.array(t)
        elif name in self.constants:
            digest = ln.need(_HEX, "hex digits")
            data = np.asarray(self.constants[name])
            if data.dtype != t.dtype.numpy or data.shape != t.shape:
                ln.error(f"constants[{name!r}] is {data.dtype}{list(data.shape)}, the text says {t}")
            if not hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest().startswith(digest):
                ln.error(f"constants[{name!r}] does not match digest {digest}")
        else:
            data = _placeholder(t, ln.need(_HEX, "hex digits"))
        ln.end()
        self.g.constants[name] = self.define(ln, name, t, data)

    def node(self, ln: _Line, lines=None) -> None:
        outs = ln.commas(lambda: ln.typed("an output name")) if ln.peek("%") else []
        if outs:
            ln.expect("=")
        op, domain = ln.name("an op name"), ""
        if ln.accept("::"):
            domain, op = op, ln.name("an op name")
        ln.expect("(")
        inputs = ln.seq(")", lambda: None if ln.accept("_") else self.ref(ln))
        attrs: dict = {}
        if ln.accept("{"):
            for key, value in ln.seq("}", ln.attr):
                if key in attrs:
                    ln.error(f"attribute {key} given twice")
                attrs[key] = value
        node_name = ln.name("a node name") if ln.accept("@") else ""
        if lines is not None and ln.accept("{"):
            ln.end()
            for key, sub in self.blocks(ln, lines):
                if key in attrs:
                    ln.error(f"attribute {key} given twice")
                attrs[key] = sub
        else:
            ln.end()
        values = [self.define(ln, name, t) for name, t in outs]
        if node_name:
            self.g.reserve(node_name)
        self.g.nodes.append(Node(op, inputs, values, attrs, node_name, domain))

    def ret(self, ln: _Line) -> None:
        self.g.outputs = [] if ln.at_end() else ln.commas(lambda: self.ref(ln))
        ln.end()


    def blocks(self, opener: _Line, lines) -> list[tuple[str, Graph]]:
        """Graph-valued attributes ``name = graph ... { ... }`` up to the node's closing ``}``."""
        out = []
        for ln in lines:
            self.last = ln
            if ln.accept("}"):
                ln.end()
                return out
            key = ln.name("an attribute name")
            ln.expect("=")
            out.append((key, self.graph(ln, lines)))
        self.last.error(f"missing closing '}}' of the node on line {opener.lineno}")

    def graph(self, ln: _Line, lines) -> Graph:
        """A ``graph NAME(...) {`` block from its header line to its ``}``; a nested graph has
        a scope of its own (it reads no value of the graph around it)."""
        outer_g, outer_env = self.g, self.env
        self.env = {}
        self.header(ln)
        g, returned = self.g, False
        for ln in lines:
            self.last = ln
            if ln.accept("}"):
                if not returned:
                    ln.error("missing 'return' before '}'")
                ln.end()
                break
            if returned:
                ln.error("expected '}' after 'return'")
            if ln.match(_CONST):
                self.const(ln)
            elif ln.match(_RETURN):
                self.ret(ln)
                returned = True
            else:
                self.node(ln, lines)
        else:
            self.last.error("missing closing '}'")
        self.g, self.env = outer_g, outer_env
        return g


def _lines(text: str):
    """The lines that are not blank or comments, as cursors."""
    for i, raw in enumerate(text.split("\n")):
        ln = _Line(raw.rstrip("\r"), i + 1)
        if not ln.at_end():
            yield ln


def parse_graph(text: str, constants: dict[str, np.ndarray] | None = None) -> Graph:
    """Read a graph from its text form (see the module docstring); ValueError names the line."""
    p = _Parser(constants)
    lines = _lines(text)
    first = next(lines, None)
    if first is None:
        _Line("", 0).error("empty text, expected a graph")
    p.last = first
    g = p.graph(first, lines)
    extra = next(lines, None)
    if extra is not None:
        extra.error("text after the closing '}'")
    return g
