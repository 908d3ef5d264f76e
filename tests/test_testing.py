"""tensorfuse.testing: the public helpers that check rules and models against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx.parser
import pytest

import tensorfuse
import tensorfuse.compiler.rules  # noqa: F401  (the rule sets, as compiler.rules)
from tensorfuse import compiler
from tensorfuse.compiler.pattern import Any, P
from tensorfuse.compiler.rewrite import Rule
from tensorfuse.testing import check_rule, random_inputs


def relu_model():
    return onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        agraph (float[2,3] x, int64[4] ids) => (float[2,3] y, int64[4] z) {
            r = Relu(x)
            y = Exp(r)
            z = Neg(ids)
        }""")


class _DropRelu(Rule):
    """Exp(Relu(x)) ==> Exp(x): deliberately wrong (a test rule)."""
    pattern = P.Exp(P.Relu(x=Any()).single_use())

    def rewrite(self, m, build):
        return build.Exp(m.x)


class _NeverFires(Rule):
    """Tanh(x) ==> Tanh(x) (a test rule that finds nothing in relu_model)."""
    pattern = P.Tanh(x=Any())

    def rewrite(self, m, build):
        return build.Tanh(m.x)


def test_a_wrong_rule_is_caught_against_onnxruntime():
    with pytest.raises(AssertionError, match="with _DropRelu at O2 output 0"):
        check_rule(relu_model(), _DropRelu)


def test_a_rule_that_does_not_fire_is_reported():
    with pytest.raises(AssertionError, match="_NeverFires did not fire at O2"):
        check_rule(relu_model(), _NeverFires)
    with pytest.raises(AssertionError, match="_NeverFires did not fire at O2"):
        check_rule(relu_model(), "_NeverFires", rules=[_NeverFires, _DropRelu])
    check = check_rule(relu_model(), _NeverFires, fires=False, rules=[_DropRelu], disabled_rules="_DropRelu")
    assert check.applications == [] and check.max_abs_err == 0.0
    with pytest.raises(AssertionError, match="fired where it must not"):
        check_rule(relu_model(), _DropRelu, fires=False)


def test_a_built_in_rule_is_checked_without_being_added():
    check = check_rule(relu_model(), "FuseConvActivation", fires=False)
    assert check.rule == "FuseConvActivation" and check.applications == []
    before = list(compiler.rules.FUSE_RULES)
    check_rule(relu_model(), _NeverFires, fires=False)
    assert compiler.rules.FUSE_RULES == before
    with pytest.raises(ValueError, match="unknown rule '_NeverFires'"):
        check_rule(relu_model(), "_NeverFires")          # a rule under test by name needs rules=


def test_random_inputs_follow_the_declared_types():
    feeds = random_inputs(relu_model(), seed=3)
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (2, 3)
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].shape == (4,) and feeds["ids"].min() >= 0
    np.testing.assert_array_equal(random_inputs(relu_model(), seed=3)["x"], feeds["x"])


def test_public_name():
    assert tensorfuse.testing.check_rule is check_rule
