"""Regression tests for what the ONNX backend conformance run on device CUDA found
(``make conformance-cuda``; the CUDA-only exclusions and their reasons are in
``tests/onnx_backend_cuda_excludes.txt``). Each compiles a small model with
``compile(model, target="cuda")`` and compares it with ``onnx.reference`` under the CUDA
simulator (or on a GPU); shapes are tiny, so each test takes a few seconds at most."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tensorfuse  # noqa: E402
from tensorfuse.runtime.cuda_module import cuda_unavailable_reason  # noqa: E402

pytestmark = pytest.mark.skipif(cuda_unavailable_reason() is not None,
                                reason=f"cuda unavailable: {cuda_unavailable_reason()}")

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=22):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds, rtol=1e-5, atol=1e-6, **kw):
    """Outputs of the cuda module equal onnx.reference's (values and dtypes); returns them."""
    got = tensorfuse.compile(model, target="cuda", **kw).run(**feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("strides,group", [((1, 1), 1), ((2, 2), 2)])
def test_conv_transpose_lowers_for_cuda(strides, group):
    """ConvTranspose lowered with a NameError (``gpu`` undefined in emit_conv_transpose) for
    every target; on cuda its column tiles are of one element (one output per GPU thread)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = rng.standard_normal((2, 2 // group, 2, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=list(strides), group=group)
    oh, ow = (3 - 1) * strides[0] + 2, (3 - 1) * strides[1] + 3
    m = _model([node], [helper.make_tensor_value_info("x", F, x.shape), helper.make_tensor_value_info("w", F, w.shape)],
               [helper.make_tensor_value_info("y", F, (1, 2 // group * group, oh, ow))])
    (y,) = _check(m, {"x": x, "w": w})
    assert y.shape == (1, 2, oh, ow) and np.abs(y).max() > 0.1
