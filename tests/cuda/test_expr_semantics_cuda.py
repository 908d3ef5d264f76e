"""The cuda emitter's expressions against the spec, ``ir/semantics.py`` (issue 10: "test every
backend's expressions against it"), on the CUDA simulator: the edge-value kernels of
``tests/expr_cases.py`` (every Bin/Un op, cast, FMA, Select and maxnum/minnum per dtype, scalar
and vector forms) built by ``codegen/cuda`` and launched on flat device arrays as the cuda
runtime does. Exact ops are compared bit for bit; transcendental ones within the spec's ulp
bounds (``semantics.ulp_bound``: libdevice's documented maxima). The simulator executes the
generated Python with numpy scalars, so the same sources also go through the sm_90 PTX gate
(``make test-cuda``)."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np
import pytest

from expr_cases import GROUPS, check_backend
from tensorfuse.codegen.cuda.jit import build_library

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def run_cuda(kernel, inputs, out_shape_dtypes):
    from numba import cuda
    lib = build_library([kernel], block=32, max_blocks=2)
    d_in = [cuda.to_device(np.ascontiguousarray(a).reshape(-1)) for a in inputs]
    d_out = [cuda.device_array(int(np.prod(s)), d) for s, d in out_shape_dtypes]
    lib.launch(kernel.name, d_in + d_out)
    cuda.synchronize()
    return [d.copy_to_host().reshape(s) for d, (s, _) in zip(d_out, out_shape_dtypes)]


SCALAR = [g for g in GROUPS if g[1] == 1]
# three 4-lane groups only (f32, u8, bool; the i32 one alone took 137 s there): the cuda emitter scalarises vectors into straight-line code, and the
# PTX gate's numba lowering time grows with the square of a block's length (the 8- and 16-lane
# groups made 2400-2900-line kernels that took minutes and gigabytes to compile)
VECTOR = [g for g in GROUPS if g[1] == 4 and g[0].name in ("f32", "u8", "bool")]


@pytest.mark.parametrize("group", SCALAR, ids=lambda g: f"{g[0].name}")
def test_cuda_scalar_expressions_meet_the_spec(group):
    assert check_backend(run_cuda, groups=[group], max_pairs=64) > 100


def test_cuda_vector_expressions_meet_the_spec():
    """Kernels written with explicit vector lanes (the CPU schedules' form) are scalarised lane
    by lane by the cuda emitter and must give the same values."""
    assert check_backend(run_cuda, groups=VECTOR, max_pairs=24) > 500
