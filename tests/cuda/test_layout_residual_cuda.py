"""Issue 21's residual graph on the cuda target under numba's CUDA simulator (``make test-cuda``):
a graph input feeding a Conv (+BN+Relu) and the Add after it made the layout pass's pushes
ping-pong for 10000 rounds; now, at O1 and O2, the graph keeps two Transposes (at the input and
at the output) and its kernels match onnxruntime (float32, rtol 1e-4, atol 1e-4: 3x3 convs over
4 channels, BatchNormalization folded at O2). The graph itself is ``issue_graph`` of
tests/test_layout_oscillation.py, where the pass is checked without the simulator.
"""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
import pytest

import cuda_util as cu
from oracle import ort_run
from test_layout_oscillation import issue_graph

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.mark.parametrize("opt_level", [1, 2], ids=["O1", "O2"])
def test_residual_from_the_graph_input_on_cuda(opt_level):
    model, feeds = issue_graph()
    lg = cu.lower_cuda(model, opt_level=opt_level)
    rep = cu.lower_cuda.result.layout_report
    assert rep.count == 2 and rep.counts()["pushed"] <= 20, str(rep)
    ops = [c.ops for c in lg.calls]
    assert ops[0] == ops[-1] == ["Transpose"] and ["Transpose"] not in ops[1:-1], ops
    if opt_level == 2:    # each Add+Relu tail is its conv kernel's epilogue
        assert len(ops) == 4, ops
    got = cu.run_lowered(lg, [feeds["x"]])[0]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
