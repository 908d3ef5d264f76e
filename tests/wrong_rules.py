"""A deliberately wrong rule for the verify tests (tests/test_verify.py, tests/test_cli.py),
loaded the way a researcher loads a rule under test: ``tensorfuse verify MODEL --rules
tests/wrong_rules.py:FoldBatchNormDropShift`` or ``tensorfuse.verify(model, rules=[...])``.

FoldBatchNormDropShift folds a BatchNormalization into a bias-free Conv but forgets the shift
``beta - mean * a``: right only when beta == mean * a, wrong for any real model.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.compiler.pattern import Any, Const, Optional, P
from tensorfuse.compiler.rewrite import Fail, Rule


class FoldBatchNormDropShift(Rule):
    """BatchNormalization(Conv(x, W)) ==> Conv(x, W * a[oc]) (WRONG: the shift beta - mean * a is dropped)."""
    rule_set = "fold"
    pattern = P.BatchNormalization(P.Conv(x=Any(), w=Const(), b=Optional(Const())).single_use(),
                                   gamma=Const(), beta=Const(), mean=Const(), var=Const())

    def condition(self, m):
        return m.b is None or Fail(f"{m.conv.name}: the Conv has a bias; this fold handles bias-free convs")

    def rewrite(self, m, build):
        eps = float(m.batchnormalization.attr("epsilon", 1e-5))
        a = m.gamma.data.astype(np.float64) / np.sqrt(m.var.data.astype(np.float64) + eps)
        w = m.w.data
        w2 = (w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        return build.Conv(m.x, build.const(w2, "w_bn"), **m.conv.attrs)
