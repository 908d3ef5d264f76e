"""tensorfuse.to_dot: the fused graph as DOT, one cluster per kernel (parsed back)."""
from __future__ import annotations

import pytest

import tensorfuse
from tensorfuse.compiler.dot import KIND_COLOURS, render_svg
from tensorfuse.ir.registry import find_op
from cli_util import bn_chain, parse_dot, shared_consumer_model


def test_clusters_are_the_graph_nodes_with_kernel_names(tmp_path):
    mod = tensorfuse.compile(shared_consumer_model())
    dot = tensorfuse.to_dot(mod)
    parsed = parse_dot(dot.source)
    names = [n.name for n in mod.graph.nodes]
    assert sorted(dot.clusters.values()) == sorted(names)
    assert set(parsed["clusters"]) == set(dot.clusters)
    by_node = {n.name: n for n in mod.graph.nodes}
    kernels = {n: c.kernel for c in mod.calls for n in c.nodes}
    for n in mod.graph.nodes:               # a fused function's call names its body nodes
        if n.op == "FusedFunction":
            kernels[n.name] = kernels[n.attrs["body"].nodes[0].name]
    for cid, info in parsed["clusters"].items():
        node = by_node[dot.clusters[cid]]
        body = node.attrs.get("body") if node.op == "FusedFunction" else None
        assert len(info["nodes"]) == (len(body.nodes) if body is not None else 1)
        assert info["attrs"]["label"].startswith(kernels[node.name])
        kind = node.attrs["kind"] if body is not None else find_op(node.op, node.domain).kind.name
        assert info["attrs"]["fillcolor"] == KIND_COLOURS[kind]
    assert {KIND_COLOURS["OUT_ELEMWISE_FUSABLE"], KIND_COLOURS["BROADCAST"]} <= \
        {c["attrs"]["fillcolor"] for c in parsed["clusters"].values()}
    assert len(parsed["edges"]) >= len(names)
    path, note = dot.write(tmp_path / "g.dot")
    assert path.endswith("g.dot") and "dot -Tsvg" in note
    assert parse_dot((tmp_path / "g.dot").read_text())["clusters"].keys() == parsed["clusters"].keys()


def test_profile_times_and_svg_request(tmp_path):
    mod = tensorfuse.compile(bn_chain(1))
    dot = tensorfuse.to_dot(mod, profile=True)
    labels = [c["attrs"]["label"] for c in parse_dot(dot.source)["clusters"].values()]
    assert labels and all(" ms\\n" in lab for lab in labels)
    if render_svg("digraph { a }") is None:         # no renderer here: the .dot and how to render it
        with pytest.warns(UserWarning, match="instead of"):
            path, note = dot.write(tmp_path / "g.svg")
        assert path == str(tmp_path / "g.dot") and "dot -Tsvg" in note and not (tmp_path / "g.svg").exists()
    else:
        path, note = dot.write(tmp_path / "g.svg")
        assert path == str(tmp_path / "g.svg") and "<svg" in (tmp_path / "g.svg").read_text()
    with pytest.raises(ValueError, match="must end in"):
        dot.write(tmp_path / "g.png")


def test_svg_request_without_a_renderer_warns(tmp_path, monkeypatch):
    """A caller that asks for .svg and ignores the returned note still hears that a .dot was
    written instead (it was silent)."""
    import tensorfuse.compiler.dot as dotmod
    monkeypatch.setattr(dotmod, "render_svg", lambda source: None)
    dot = tensorfuse.to_dot(tensorfuse.compile(bn_chain(1)))
    with pytest.warns(UserWarning, match=r"wrote .*g\.dot instead of .*g\.svg"):
        path, _ = dot.write(tmp_path / "g.svg")
    assert path == str(tmp_path / "g.dot") and (tmp_path / "g.dot").exists() and not (tmp_path / "g.svg").exists()


def test_a_model_path_is_compiled():
    dot = tensorfuse.to_dot(bn_chain(1))
    assert len(dot.clusters) == 2 and "fusedconv" in dot.source
