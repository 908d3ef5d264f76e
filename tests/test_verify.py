"""tensorfuse.verify: outputs against onnxruntime, bisection to the rewrite that broke them, the
first fused group that diverges; the hooks it uses (application_limit, rules under test)."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from tensorfuse.compiler.pipeline import rules_under_test
from tensorfuse.compiler.rewrite import application_limit
from tensorfuse.compiler.verify import LINEAR_WINDOW, compare
from cli_util import bn_chain
from wrong_rules import FoldBatchNormDropShift


def test_compare_tolerance_nan_and_shape():
    ref = np.array([1.0, -2.0, 0.0, np.nan], np.float32)
    assert compare("y", ref + np.float32(1e-4), ref, rtol=1e-3, atol=1e-4).ok
    c = compare("y", ref + np.array([0, 0, 1e-3, 0], np.float32), ref, rtol=1e-3, atol=1e-4)
    assert not c.ok and c.max_abs == pytest.approx(1e-3, rel=1e-3) and c.score == pytest.approx(10, rel=1e-3)
    got = ref.copy()
    got[3] = 1.0
    assert not compare("y", got, ref, 1e-3, 1e-4).ok                  # NaN where the reference has none
    assert "shape [2, 2]" in compare("y", np.zeros((2, 2)), np.zeros(4), 1e-3, 1e-4).note
    assert not compare("i", np.array([1, 2]), np.array([1, 3]), 0, 0).ok


def test_a_correct_model_passes():
    res = tensorfuse.verify(bn_chain(1))
    assert res.ok and bool(res) and res.culprit is None
    assert res.applications >= 2 and res.groups_compared >= 1 and res.first_bad_group is None
    assert [c.name for c in res.level] == ["y"] and res.level[0].max_abs < 1e-4
    assert "result: PASS" in str(res) and repr(res) == str(res)


def test_application_limit_reproduces_the_log_prefix():
    m = bn_chain(2)
    full = tensorfuse.compile(m, cache=False).rewrite_log
    assert len(full) >= 4
    for n in (0, 1, 3):
        with application_limit(n):
            log = tensorfuse.compile(m, cache=False).rewrite_log
        assert [(a.rule, a.nodes) for a in log] == [(a.rule, a.nodes) for a in full[:n]]
    with pytest.raises(ValueError, match="count >= 0"):
        with application_limit(-1):
            pass


def test_rules_under_test_checks():
    with pytest.raises(ValueError, match="is a built-in rule"):
        rules_under_test([tensorfuse.compiler.rules.fold_batchnorm.FoldBatchNormIntoConv])

    class Bad(FoldBatchNormDropShift):
        """BatchNormalization(Conv) ==> Conv (test)."""
        rule_set = "nope"
    with pytest.raises(ValueError, match="rule_set must be one of"):
        rules_under_test([Bad])
    with pytest.raises(ValueError, match="rule_set must be one of"):
        tensorfuse.verify(bn_chain(1), rules=[Bad])


@pytest.mark.parametrize("n_biased", [1, pytest.param(6, marks=pytest.mark.heavy)])
def test_wrong_rule_is_named_with_its_onnx_nodes(n_biased):
    # the wrong fold fires only on the last (bias-free) Conv: after n_biased correct folds
    m = bn_chain(n_biased)
    last = n_biased + 1
    res = tensorfuse.verify(m, rules=[FoldBatchNormDropShift])
    assert not res.ok and res.o0[0].ok and not res.level[0].ok
    c = res.culprit
    assert c is not None and c.rule == "FoldBatchNormDropShift"
    assert c.onnx_nodes == [f"conv{last}", f"bn{last}"]
    assert c.index == n_biased + 1          # the folds run before fusion, in graph order
    assert c.error_before < 1e-4 < 0.05 < c.error_after
    # halves, then one by one: a handful of compiles, not one per application
    assert len(res.bisect_steps) <= int(np.ceil(np.log2(max(res.applications, 2)))) + LINEAR_WINDOW + 1
    g = res.first_bad_group
    assert g is not None and f"conv{last}" in g.onnx_nodes and not g.check.ok
    text = str(res)
    assert f"rule FoldBatchNormDropShift, on ONNX nodes conv{last}, bn{last}" in text
    assert "result: MISMATCH" in text


def test_verify_given_inputs_and_bad_arguments():
    m = bn_chain(1)
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    res = tensorfuse.verify(m, inputs={"x": x}, groups=False)
    assert res.ok and res.group_level is None
    with pytest.raises(ValueError, match="opt_level 1, 2 or 3"):
        tensorfuse.verify(m, 0)
    with pytest.raises(ValueError, match="rtol and atol"):
        tensorfuse.verify(m, rtol=-1)
    with pytest.raises(tensorfuse.ModelLoadError):
        tensorfuse.verify(b"not a model")


def test_random_ids_stay_inside_the_tables_they_index():
    """Random integer inputs were drawn from [0, 10), so an id input indexing a table of 2 rows
    (BERT's token_type_ids) failed every CLI run and verify without --inputs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tensorfuse.compiler.verify import index_limits, random_inputs
    table = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "table")
    big = numpy_helper.from_array(np.ones((3, 50), np.float32), "big")
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])
    cols = helper.make_tensor_value_info("cols", TensorProto.INT32, [5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 5])
    g = helper.make_graph([helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.INT64),
                           helper.make_node("Gather", ["table", "i"], ["y"]),
                           helper.make_node("Gather", ["big", "cols"], ["z"], axis=1)],
                          "ids", [ids, cols], [y, z], [table, big])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert index_limits(model) == {"ids": 2, "cols": 50}
    mod = tensorfuse.compile(model)
    feeds = random_inputs(mod.input_info, 0, index_limits(model))
    assert feeds["ids"].max() == 1 and feeds["ids"].min() == 0     # both rows, nothing beyond
    assert feeds["cols"].max() >= 2                                 # the wide table keeps [0, 10)
    y_got, _ = mod.run(**feeds)
    np.testing.assert_array_equal(y_got, np.arange(8, dtype=np.float32).reshape(2, 4)[feeds["ids"]])
    res = tensorfuse.verify(model)                                   # random inputs inside
    assert res.ok
    assert "for target 'llvm'" in str(res) and "random inputs (seed 0)" in str(res)
    onnx.checker.check_model(model)
