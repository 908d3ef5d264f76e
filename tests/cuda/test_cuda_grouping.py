"""fuse_ops groups on the cuda target (issue 22): a reduction with an elementwise prologue
(Softmax, LayerNormalization, ReduceSum: the cuda block schedules read the computed input) and
a loop group with a Transpose inside, each one kernel, run under the CUDA simulator against
onnxruntime (optimisations off). Tolerances rtol 1e-5, atol 1e-5: the block reductions sum in
another order than onnxruntime; outputs are of order 1."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import pathlib  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba.core import config  # noqa: E402
from onnx import helper  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cuda_util import lower_cuda, run_lowered  # noqa: E402
from fusion_util import graph_model  # noqa: E402
from oracle import ort_run, rand  # noqa: E402

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1 at numba import")


def N(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _cases():
    x, y = rand(2, 4, 40), rand(2, 4, 40, seed=1)
    return {
        "softmax_prologue": ([N("Mul", ["x", "s"], ["a"]), N("Add", ["a", "y"], ["b"]), N("Softmax", ["b"], ["z"])],
                             {"x": x, "y": y}, {"s": np.array(0.125, np.float32)}, ["Mul", "Add", "Softmax"]),
        "layernorm_prologue": ([N("Add", ["x", "y"], ["a"]), N("Relu", ["a"], ["r"]),
                                N("LayerNormalization", ["r", "w", "b"], ["z"], axis=-1)],
                               {"x": x, "y": y}, {"w": rand(40, seed=3), "b": rand(40, seed=4)},
                               ["Add", "Relu", "LayerNormalization"]),
        "reducesum_prologue": ([N("Mul", ["x", "x"], ["a"]), N("ReduceSum", ["a", "ax"], ["z"], keepdims=0)],
                               {"x": x}, {"ax": np.array([2], np.int64)}, ["Mul", "ReduceSum"]),
        "transpose_in_loop": ([N("Exp", ["x"], ["a"]), N("Transpose", ["a"], ["t"], perm=[2, 1, 0]),
                               N("Add", ["t", "w"], ["z"])], {"x": x}, {"w": rand(40, 4, 2, seed=5)},
                              ["Exp", "Transpose", "Add"]),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_group_is_one_kernel_and_matches_onnxruntime(case):
    nodes, feeds, inits, ops = _cases()[case]
    m = graph_model(nodes, feeds, ["z"], inits)
    lg = lower_cuda(m, 2)
    assert [c.ops for c in lg.calls] == [ops]
    (got,) = run_lowered(lg, list(feeds.values()))
    np.testing.assert_allclose(got, ort_run(m, feeds)[0], rtol=1e-5, atol=1e-5)
