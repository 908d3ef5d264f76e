"""numba-cuda on a NumPy without ``row_stack`` (NumPy 2.5, as on the H200 device image):
importing tensorfuse's cuda runtime or code generator first restores the alias
(``runtime/cuda_compat.py``), so ``numba.cuda`` imports and a kernel compiles."""
import os
import subprocess
import sys

CHILD = r"""
import numpy as np
if hasattr(np, "row_stack"):
    del np.row_stack                  # as NumPy 2.5 is
import tensorfuse.codegen.cuda        # the shim runs on import
from numba import cuda
assert np.row_stack is np.vstack

@cuda.jit
def add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1

x = np.zeros(8, np.float32)
add_one[1, 8](x)
assert (x == 1).all(), x
print("ok")
"""


def test_numba_cuda_imports_and_runs_on_a_numpy_without_row_stack():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=os.environ.get("NUMBA_ENABLE_CUDASIM", "1"))
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
