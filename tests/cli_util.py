"""Helpers of the command-line, verify, explain-report and graph tests: small ONNX models with
BatchNormalization, a subprocess runner for ``python -m tensorfuse``, and a DOT parser that
checks the syntax of what ``tensorfuse graph`` writes and reads its clusters back."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRONG_RULE = os.path.join(ROOT, "tests", "wrong_rules.py") + ":FoldBatchNormDropShift"


def bn_chain(n_biased: int = 1, channels: int = 4, seed: int = 1) -> onnx.ModelProto:
    """x[1,3,8,8] -> n_biased x (Conv with bias, BatchNormalization, Relu) -> Conv without bias
    -> BatchNormalization -> Add(., previous) -> Relu -> y. Node names: conv1.., bn1.., relu1..;
    the bias-free ones are conv<last>, bn<last>; then add, relu_out. Every BatchNormalization
    has a clearly non-zero shift."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))

    prev, cin = "x", 3
    for i in range(1, n_biased + 2):
        biased = i <= n_biased
        init(f"w{i}", rng.standard_normal((channels, cin, 3, 3)) * 0.3)
        ins = [prev, f"w{i}"]
        if biased:
            init(f"b{i}", rng.standard_normal(channels))
            ins.append(f"b{i}")
        init(f"g{i}", rng.uniform(0.5, 1.5, channels))
        init(f"be{i}", rng.standard_normal(channels) + 1.0)
        init(f"m{i}", rng.standard_normal(channels) * 0.1)
        init(f"v{i}", rng.uniform(0.5, 1.5, channels))
        nodes.append(helper.make_node("Conv", ins, [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"be{i}", f"m{i}", f"v{i}"],
                                      [f"n{i}"], name=f"bn{i}"))
        if biased:
            nodes.append(helper.make_node("Relu", [f"n{i}"], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
        cin = channels
    last = n_biased + 1
    nodes.append(helper.make_node("Add", [f"n{last}", prev], ["a"], name="add"))
    nodes.append(helper.make_node("Relu", ["a"], ["y"], name="relu_out"))
    g = helper.make_graph(nodes, "bn_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def shared_consumer_model() -> onnx.ModelProto:
    """A Conv whose output has two consumers, a Relu (graph output y) and a Sigmoid (output s),
    and a Conv followed by an Add that broadcasts it to a larger shape (output z)."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 1, 1)) * 0.5).astype(np.float32), "w")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 3, 1, 1)) * 0.5).astype(np.float32), "w2")
    big = numpy_helper.from_array(rng.standard_normal((2, 4, 4, 4)).astype(np.float32), "big")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
             helper.make_node("Conv", ["x", "w2"], ["c2"], name="conv_b"),
             helper.make_node("Add", ["c2", "big"], ["z"], name="add_big")]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "shared_consumer", [helper.make_tensor_value_info("x", f, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", f, [1, 4, 4, 4]),
                           helper.make_tensor_value_info("s", f, [1, 4, 4, 4]),
                           helper.make_tensor_value_info("z", f, [2, 4, 4, 4])], [w, w2, big])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def run_cli(*args, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m tensorfuse ARGS`` in the repository root; stdout and stderr captured."""
    return subprocess.run([sys.executable, "-m", "tensorfuse", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ))


# ----------------------------------------------------------------------------- DOT
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<arrow>->|--)|(?P<punct>[{}\[\]=;,])|'
                    r'(?P<id>[A-Za-z_\x80-\uffff][\w\x80-\uffff]*|-?(?:\.\d+|\d+(?:\.\d*)?)))', re.S)


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"DOT syntax error at {pos}: {text[pos:pos + 40]!r}")
        out.append(m.group(m.lastgroup))
        pos = m.end()
    return out


def parse_dot(text: str) -> dict:
    """Parse DOT (the grammar subset of graphviz's: graph / subgraph / node / edge / attribute
    statements); raises ValueError on a syntax error or an edge to an undeclared node. Returns
    {"clusters": {cluster id: {"nodes": [node ids], "attrs": {...}}}, "nodes": {id: attrs},
    "edges": [(a, b)]}."""
    toks = _tokens(text)
    i = 0

    def peek():
        return toks[i] if i < len(toks) else None

    def take(expect=None):
        nonlocal i
        if i >= len(toks):
            raise ValueError("DOT syntax error: unexpected end")
        t = toks[i]
        if expect is not None and t != expect:
            raise ValueError(f"DOT syntax error: expected {expect!r}, got {t!r}")
        i += 1
        return t

    def ident():
        t = take()
        if t in "{}[]=;,->":
            raise ValueError(f"DOT syntax error: expected an id, got {t!r}")
        return t[1:-1] if t.startswith('"') else t

    def attrs():
        out = {}
        while peek() == "[":
            take("[")
            while peek() != "]":
                k = ident()
                take("=")
                out[k] = ident()
                if peek() in (",", ";"):
                    take()
            take("]")
        return out

    res = {"clusters": {}, "nodes": {}, "edges": []}

    def stmts(cluster):
        while peek() != "}":
            t = peek()
            if t == ";":
                take()
                continue
            if t in ("graph", "node", "edge"):
                take()
                a = attrs()
                if t == "graph" and cluster is not None:
                    res["clusters"][cluster]["attrs"].update(a)
            elif t == "subgraph":
                take()
                name = ident() if peek() != "{" else f"anon{i}"
                take("{")
                if name.startswith("cluster"):
                    res["clusters"][name] = {"nodes": [], "attrs": {}}
                stmts(name if name.startswith("cluster") else cluster)
                take("}")
            else:
                a_id = ident()
                if peek() == "=":
                    take("=")
                    ident()
                elif peek() == "->":
                    chain = [a_id]
                    while peek() == "->":
                        take("->")
                        chain.append(ident())
                    attrs()
                    res["edges"] += list(zip(chain, chain[1:]))
                else:
                    res["nodes"][a_id] = attrs()
                    if cluster is not None:
                        res["clusters"][cluster]["nodes"].append(a_id)

    take("digraph")
    if peek() != "{":
        ident()
    take("{")
    stmts(None)
    take("}")
    if i != len(toks):
        raise ValueError("DOT syntax error: text after the graph")
    for a, b in res["edges"]:
        if a not in res["nodes"] or b not in res["nodes"]:
            raise ValueError(f"edge {a} -> {b} names an undeclared node")
    return res


class CliResult:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(*args) -> CliResult:
    """``tensorfuse.compiler.cli.main(ARGS)`` in this process (no interpreter start-up), with
    stdout and stderr captured: for the variations of a command that a subprocess test covers."""
    import contextlib
    import io

    from tensorfuse.compiler.cli import main
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    finally:
        os.chdir(cwd)
    return CliResult(rc, out.getvalue(), err.getvalue())
