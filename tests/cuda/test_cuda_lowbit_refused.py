"""The cuda target refuses the low-bit element types (float8, float4, int4, int2: ir/lowbit.py;
``KindTraits.lowbit`` is False for it) with an UnsupportedModelError naming every such tensor,
instead of moving ml_dtypes arrays it cannot read (the simulator read float8 bytes as their
float values). The llvm target compiles the same model."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba.core import config  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensorfuse  # noqa: E402
from tensorfuse.ir.errors import UnsupportedModelError  # noqa: E402

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1 at numba import")


def test_cuda_refuses_lowbit_tensors_and_names_them():
    vi = helper.make_tensor_value_info
    z4 = numpy_helper.from_array(np.zeros((), ml_dtypes.int4), "z4")
    nodes = [helper.make_node("DequantizeLinear", ["x", "s"], ["y"]),
             helper.make_node("QuantizeLinear", ["f", "s", "z4"], ["q"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT8E5M2, [4]), vi("s", TensorProto.FLOAT, []),
                                                         vi("f", TensorProto.FLOAT, [4])],
                                            [vi("y", TensorProto.FLOAT, [4]), vi("q", TensorProto.INT4, [4])], [z4]),
                          opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(UnsupportedModelError, match="cuda target does not support") as e:
        tensorfuse.compile(m, target="cuda", cache=False)
    msg = str(e.value)
    assert "f8e5m2: 'x'" in msg and "i4: 'z4'" in msg and "QuantizeLinear" in msg
    mod = tensorfuse.compile(m, target="llvm", cache=False)
    y, q = mod.run(np.array([1, -2, 0.5, 3], ml_dtypes.float8_e5m2), np.float32(2), np.array([1, -20, 4, 9], np.float32))
    np.testing.assert_array_equal(y, [2, -4, 1, 6])
    np.testing.assert_array_equal(q.astype(np.int64), [0, -8, 2, 4])
