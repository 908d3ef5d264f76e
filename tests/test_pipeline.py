"""The optimisation pipeline (compiler/pipeline.py) and its wiring into compile()."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensorfuse
from tensorfuse import compiler
import tensorfuse
from tensorfuse import compiler
import tensorfuse.compiler.rules  # noqa: F401  (the rule sets, as compiler.rules)
from tensorfuse.ir.errors import CompileError
from tensorfuse.compiler.passes import PassError
from tensorfuse.compiler.pattern import Any, P
from tensorfuse.compiler.pipeline import build_passes, optimize
from tensorfuse.compiler.rewrite import Rule
from tensorfuse.compiler.frontend.onnx import import_onnx
from oracle import assert_matches_ort, rand
from passes_util import model, ops_of

MIXED = """agraph (float[2,3,4] x, float[4,6] w) => (float[6,6] y, float[6,4] z) {
    shp = Shape(x)
    i0 = Constant<value = int64 {0}>()
    d0 = Gather<axis = 0>(shp, i0)
    ax = Constant<value = int64[1] {0}>()
    u0 = Unsqueeze(d0, ax)
    three = Constant<value = int64[1] {3}>()
    p = Mul(u0, three)
    m1 = Constant<value = int64[1] {-1}>()
    s = Concat<axis = 0>(p, m1)
    r = Reshape(x, s)
    t1 = Transpose<perm = [1, 0]>(r)
    t2 = Transpose<perm = [1, 0]>(t1)
    a = MatMul(t2, w)
    b = MatMul(t2, w)
    c = Constant<value = float {0.5}>()
    ab = Add(a, b)
    q = Mul(ab, c)
    y = Relu(q)
    z = Transpose<perm = [1, 0]>(t1)
}"""


def test_every_level_compiles_and_matches_onnxruntime():
    m = model(MIXED)
    assert_matches_ort(m, {"x": rand(2, 3, 4), "w": rand(4, 6, seed=1)}, opt_levels=(0, 1, 2, 3),
                       rtol=1e-5, atol=1e-5, cache=False)


def test_levels_shrink_the_graph_and_o0_keeps_it():
    m = model(MIXED)
    n0 = len(import_onnx(m).nodes)
    g0 = tensorfuse.compile(m, opt_level=0, cache=False).graph
    g1 = tensorfuse.compile(m, opt_level=1, cache=False).graph
    assert len(g0.nodes) == n0
    assert "Shape" not in ops_of(g1) and ops_of(g1).count("MatMul") == 1
    assert ops_of(g1) == ["Reshape", "MatMul", "Add", "Mul", "Relu"]   # z = r: the Transposes cancel


def test_dump_ir_writes_changed_passes_log_and_kernels(tmp_path):
    m = model(MIXED)
    mod = tensorfuse.compile(m, opt_level=1, dump_ir=tmp_path, cache=False)
    files = sorted(os.listdir(tmp_path))
    graphs = [f for f in files if f.endswith(".txt") and f[:2].isdigit()]
    assert graphs[0] == "00-import.txt"
    assert [f[:2] for f in graphs] == [f"{i:02d}" for i in range(len(graphs))]
    changed = [r.name for r in mod.pass_records if r.changed]
    assert [f[3:-4] for f in graphs[1:]] == changed
    assert (tmp_path / graphs[-1]).read_text() == str(mod.graph)
    assert (tmp_path / "rewrite_log.txt").read_text() == "".join(f"{a}\n" for a in mod.rewrite_log)
    assert mod.rewrite_log[0].rule == "ComposeTransposes"
    assert "fold_constants" in (tmp_path / "passes.txt").read_text()
    kernels = sorted(os.listdir(tmp_path / "kernels"))
    assert len(kernels) == len(mod.kernels) and "define" in (tmp_path / "module.ll").read_text()


def test_rewrite_log_on_module_and_disabled_rules():
    m = model(MIXED)
    mod = tensorfuse.compile(m, opt_level=1, cache=False)
    assert str(mod.rewrite_log[0]) == "ComposeTransposes: Transpose_6, Transpose_7"
    mod = tensorfuse.compile(m, opt_level=1, disabled_rules=["ComposeTransposes"], cache=False)
    assert "ComposeTransposes" not in {a.rule for a in mod.rewrite_log}
    assert ops_of(mod.graph).count("Transpose") == 2      # t1 and t2 (z merged into t2 by CSE)
    with pytest.raises(ValueError, match="unknown rules.*NoSuchRule"):
        tensorfuse.compile(m, disabled_rules=["NoSuchRule"], cache=False)


def test_disabled_rules_takes_a_single_name():
    """A string is one rule name, not a sequence of one-letter names."""
    m = model(MIXED)
    one = tensorfuse.compile(m, opt_level=1, disabled_rules="ComposeTransposes", cache=False)
    assert "ComposeTransposes" not in {a.rule for a in one.rewrite_log}
    assert str(one.graph) == str(tensorfuse.compile(m, opt_level=1, disabled_rules=["ComposeTransposes"],
                                                    cache=False).graph)
    g = import_onnx(m)
    assert "ComposeTransposes" not in {a.rule for a in optimize(g, 1, disabled_rules="ComposeTransposes").log}
    with pytest.raises(ValueError, match=r"unknown rules \['NoSuchRule'\]"):
        tensorfuse.compile(m, disabled_rules="NoSuchRule", cache=False)
    with pytest.raises(TypeError, match="rule names"):
        tensorfuse.compile(m, disabled_rules=[3], cache=False)


class _MulByOneIsIdentity(Rule):
    """Relu(Relu(x)) ==> Relu(x) (a test rule for the fuse set)."""
    pattern = P.Relu(P.Relu(x=Any()).named("inner"))

    def rewrite(self, m, build):
        return m.inner.outputs[0]


class _NumericsChanging(Rule):
    """Tanh(x) ==> Tanh(x) as a new node (a test rule marked numerics-changing: O3 only)."""
    pattern = P.Tanh(x=Any())
    numerics_changing = True

    def condition(self, m):
        return m.tanh.name.startswith("keep") or False

    def rewrite(self, m, build):
        return build.Tanh(m.x, name="fast_" + m.tanh.name[5:])


def test_rule_sets_by_level(monkeypatch):
    monkeypatch.setattr(compiler.rules, "FUSE_RULES", [_MulByOneIsIdentity, _NumericsChanging])
    m = model("""agraph (float[2,3] x) => (float[2,3] y) {
        a = Relu(x)
        b = Relu(a)
        y = Tanh(b)
    }""")
    m.graph.node[2].name = "keep_tanh"
    logs = {lvl: [a.rule for a in tensorfuse.compile(m, opt_level=lvl, cache=False).rewrite_log] for lvl in (1, 2, 3)}
    assert logs == {1: [], 2: ["_MulByOneIsIdentity"], 3: ["_MulByOneIsIdentity", "_NumericsChanging"]}
    passes = [name for name, _ in build_passes(2)]
    assert passes == ["quantize", "cleanup", "fold_rules", "fold_constants", "dce", "fuse", "dce", "fuse_ops"]
    assert build_passes(0) == []


def test_verifier_between_passes_names_the_pass(monkeypatch):
    import tensorfuse.compiler.pipeline as pl

    def broken_dce(g):
        g.nodes = g.nodes[1:]
        return True
    monkeypatch.setattr(pl, "eliminate_dead_nodes", broken_dce)
    g = import_onnx(model(MIXED))
    with pytest.raises(CompileError, match="the graph is invalid after pass dce"):
        optimize(g, 1, verify=True)


def test_verifier_catches_a_pass_that_breaks_the_order_and_says_it_changed_nothing(monkeypatch):
    import tensorfuse.compiler.pipeline as pl

    def reordering_cse(g):      # swaps the first two nodes and claims no change
        g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]
        return False
    monkeypatch.setattr(pl, "eliminate_common_subexpressions", reordering_cse)
    g = import_onnx(model(MIXED))
    with pytest.raises(CompileError, match="invalid after pass cse(.|\n)*is used before it is defined"):
        optimize(g, 1, verify=True)


class _BreaksTheGraph(Rule):
    """Relu(Relu(x)) ==> Relu(x), and (wrongly) drops the node that makes the graph output z."""
    pattern = P.Relu(P.Relu(x=Any()).named("inner"))

    def rewrite(self, m, build):
        m.graph.nodes = [n for n in m.graph.nodes if n.op != "Tanh"]
        return m.inner.outputs[0]


def test_verifier_after_each_rule_names_the_rule_and_the_pass(monkeypatch):
    monkeypatch.setattr(compiler.rules, "FUSE_RULES", [_BreaksTheGraph])
    m = model("""agraph (float[2,3] x) => (float[2,3] y, float[2,3] z) {
        a = Relu(x)
        y = Relu(a)
        z = Tanh(x)
    }""")
    with pytest.raises(CompileError, match="invalid after rule _BreaksTheGraph at node .* in pass fuse"
                                           "(.|\n)*graph output %z is not defined"):
        optimize(import_onnx(m), 2, verify=True)
    optimize(import_onnx(m), 2, verify=False)      # unchecked, the broken graph goes through


def test_debug_mode_follows_tensorfuse_debug(monkeypatch):
    from tensorfuse.debug import debug_mode
    monkeypatch.setenv("TENSORFUSE_DEBUG", "1")
    assert debug_mode()
    monkeypatch.setenv("TENSORFUSE_DEBUG", "0")
    assert not debug_mode()
    monkeypatch.delenv("TENSORFUSE_DEBUG")
    monkeypatch.setenv("TENSORFUSE_VERIFY", "1")
    assert debug_mode()


def test_pass_exception_names_the_pass(monkeypatch):
    import tensorfuse.compiler.pipeline as pl

    def raising(g):
        raise IndexError("bad index")
    monkeypatch.setattr(pl, "eliminate_common_subexpressions", raising)
    with pytest.raises(PassError, match="pass cse failed at the graph: IndexError: bad index"):
        optimize(import_onnx(model(MIXED)), 1)


def test_pass_records_and_summary():
    g = import_onnx(model(MIXED))
    res = optimize(g, 2)
    assert res.passes and all(r.seconds >= 0 for r in res.passes)
    # the quantization rules come first (nothing to do in a float model), then O1's cleanup
    assert res.passes[0].name == "quantize" and not res.passes[0].changed
    assert res.passes[1].name == "fold_constants" and res.passes[1].changed
    s = res.summary()
    assert s.startswith("O2:") and "ComposeTransposes" in s
    assert res.rule_counts()["ComposeTransposes"] >= 1
    np.testing.assert_equal(res.passes[-1].nodes_after, len(g.nodes))
