"""The cuda emitter's table reads (:class:`~tensorfuse.ir.kernel.Lookup`: a module-level tuple
constant indexed at run time) on the CUDA simulator: scalar and 4-lane vector kernels against
the spec (``ir.semantics``), and a QDQ model whose quantized SiLU became a table
(``QuantizedElementwiseToTable``) compiled for cuda against onnxruntime's unfused result."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
import onnxruntime as ort
import pytest

import tensorfuse
from tensorfuse.codegen.cuda.jit import build_library
from tensorfuse.ir.kernel import Buffer, KernelBuilder, lookup
from tensorfuse.ir.types import DType

from test_table_lookup import _all_codes, _model, _unfused, silu  # noqa: E402


@pytest.mark.parametrize("dtype,lanes", [(DType.u8, 1), (DType.i8, 4), (DType.f32, 1)])
def test_cuda_lookup_against_the_spec(dtype, lanes):
    from numba import cuda
    rng = np.random.default_rng(3)
    npdt = {DType.u8: np.uint8, DType.i8: np.int8, DType.f32: np.float32}[dtype]
    table = (rng.standard_normal(256) if dtype.is_float else
             rng.integers(np.iinfo(npdt).min, np.iinfo(npdt).max, 256, endpoint=True)).astype(npdt)
    idx, out = Buffer("idx", DType.u8, (256,)), Buffer("out", dtype, (256,))
    kb = KernelBuilder(f"cuda_lookup_{dtype.value}_{lanes}", [idx, out])
    with kb.loop(256 // lanes, kind="parallel", hint="i") as i:
        ix = idx.vload(i * lanes, lanes) if lanes > 1 else idx.flat(i)
        kb.store(out, i * lanes, lookup(table.tolist(), dtype, ix.cast(DType.i32)))
    lib = build_library([kb.kernel], block=32, max_blocks=2)
    codes = rng.permutation(256).astype(np.uint8)
    d_out = cuda.device_array(256, npdt)
    lib.launch(kb.kernel.name, [cuda.to_device(codes), d_out])
    cuda.synchronize()
    np.testing.assert_array_equal(d_out.copy_to_host(), table[codes])


def test_cuda_model_with_a_table():
    m = _model(silu)
    x = _all_codes(2)      # TensorProto.UINT8
    mod = tensorfuse.compile(m, target="cuda", cache=False)
    assert "QuantizedElementwiseToTable" in [a.rule for a in mod.rewrite_log]
    (got,) = mod.run(x)
    (want,) = _unfused(m, {"x": x})
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
