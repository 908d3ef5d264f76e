"""tensorfuse.explain_report: the fusion report (rule passes, fused groups, anchors' fate)."""
from __future__ import annotations

import onnx
import pytest

import tensorfuse
from cli_util import bn_chain, shared_consumer_model
from wrong_rules import FoldBatchNormDropShift


def _pass(rep, name):
    [p] = [p for p in rep.passes if p.name == name]
    return p


def test_report_of_a_small_model(capsys):
    rep = tensorfuse.explain_report(bn_chain(1))
    assert capsys.readouterr().out == ""                    # prints nothing
    assert repr(rep) == str(rep)
    fold = _pass(rep, "fold_rules")
    assert [(a.rule, a.nodes) for a in fold.applied] == [("FoldBatchNormIntoConv", ["conv1", "bn1"]),
                                                         ("FoldBatchNormIntoConv", ["conv2", "bn2"])]
    fuse = _pass(rep, "fuse")
    assert {a.rule for a in fuse.applied} >= {"FuseConvActivation"}
    fates = {a.node: a for a in rep.anchors}
    assert set(fates) == {"conv1", "conv2"}
    assert fates["conv1"].rules[:2] == ["FoldBatchNormIntoConv", "FuseConvActivation"]
    assert "BatchNormalization 'bn1'" in fates["conv1"].with_nodes and "Relu 'relu1'" in fates["conv1"].with_nodes
    text = str(rep)
    assert "Conv 'conv1' -> tensorfuse::FusedConv" in text


def test_the_first_rule_in_pipeline_order_wins():
    rep = tensorfuse.explain_report(bn_chain(1), rules=[FoldBatchNormDropShift])
    fold = _pass(rep, "fold_rules")
    assert fold.rules[0] == "FoldBatchNormDropShift"
    first, second = fold.applied
    assert (first.rule, first.also_matched) == ("FoldBatchNormIntoConv", [])     # conv1 has a bias
    assert (second.rule, second.nodes) == ("FoldBatchNormDropShift", ["conv2", "bn2"])
    assert second.also_matched == ["FoldBatchNormIntoConv"]
    assert "FoldBatchNormIntoConv matched here too; FoldBatchNormDropShift wins" in str(rep)


def test_why_an_activation_was_not_fused_into_a_shared_conv():
    rep = tensorfuse.explain_report(shared_consumer_model())
    fuse = _pass(rep, "fuse")
    left = {c.node: dict(c.reasons) for c in fuse.not_applied}
    why = left["relu"]["FuseConvActivation"]
    assert why == "relu: input 0: output 'c' has another consumer: sigmoid (Sigmoid)", why
    assert "another consumer" in left["sigmoid"]["FuseConvActivation"]
    # fuse_ops then groups them (an anchor's value may have other consumers) ...
    [grp] = [g for g in rep.groups if g.anchor == "conv"]
    assert grp.fused is not None and [n for n, _ in grp.members] == ["conv", "relu", "sigmoid"]
    # ... and says why the broadcasting Add stayed out of the other Conv's group
    [grp_b] = [g for g in rep.groups if g.anchor == "conv_b"]
    assert grp_b.fused is None
    assert any("Add 'add_big' not fused into the group of conv_b: its output is f32[2,4,4,4], the anchor's "
               "f32[1,4,4,4]" in w for w in grp_b.not_fused), grp_b.not_fused
    text = str(rep)
    assert "- FuseConvActivation: relu: input 0: output 'c' has another consumer" in text


def test_filters_and_errors():
    m = bn_chain(1)
    rep = tensorfuse.explain_report(m, rule="FoldBatchNormIntoConv")
    assert [p.name for p in rep.passes] == ["fold_rules"] and rep.groups == []
    assert all("FoldBatchNormIntoConv" in a.rules for a in rep.anchors) and len(rep.anchors) == 2
    rep = tensorfuse.explain_report(m, node="conv2")
    assert [a.node for a in rep.anchors] == ["conv2"]
    assert [a.nodes for a in _pass(rep, "fold_rules").applied] == [["conv2", "bn2"]]
    with pytest.raises(ValueError, match=r"unknown rule 'Nope'.*'fuse_ops'"):
        tensorfuse.explain_report(m, rule="Nope")
    with pytest.raises(ValueError, match="no node 'nosuchnode' in the model"):   # was an empty report
        tensorfuse.explain_report(m, node="nosuchnode")


@pytest.mark.shared
def test_every_conv_of_mobilenet_unfolded_with_its_rules(shared_models):
    """Acceptance 2: every Conv of mobilenet_v2.unfolded is listed with the rules that fused it."""
    path = shared_models / "mobilenet_v2.unfolded.onnx"
    convs = [n.name for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "Conv"]
    rep = tensorfuse.explain_report(path)
    fates = {a.node: a for a in rep.anchors if a.op == "Conv"}
    assert set(fates) == set(convs) and len(convs) == 52
    for name in convs:
        assert fates[name].rules[0] == "FoldBatchNormIntoConv", fates[name]
        assert f"Conv '{name}' -> " in str(rep)
    fused_act = [a for a in fates.values() if "FuseConvActivation" in a.rules]
    assert len(fused_act) == 35 and all(any(w.startswith("Clip ") for w in a.with_nodes) for a in fused_act)
