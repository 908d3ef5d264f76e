"""The TF32 tensor-core kernels' PTX, without a GPU or the simulator: a tiled MatMul lowered with
``precision="tf32"`` compiles to sm_90 PTX with NVVM (in a child process with
``NUMBA_ENABLE_CUDASIM=0``, so this runs beside the simulator tests), its inner loop calls the
linked micro-kernel, and NVRTC's PTX of that micro-kernel (what ``declare_device(link=...)``
links in) holds the ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` and
``cvt.rna.tf32.f32`` instructions; neither part touches local memory (no ``ld.local`` /
``st.local``: no spills, no return slot), and with a ``ptxas`` both assemble with 0 spill bytes
and no stack frame (the calls' arguments and results fit the calling convention's registers).
"""
import json
import os
import subprocess
import sys

import pytest

_CHILD = r'''
import json, sys, tempfile
sys.path[:0] = sys.argv[1:3]
import numpy as np
from oracle import node_model, rand
from tensorfuse.codegen.cuda import mma, ptx_stats
from tensorfuse.codegen.cuda.jit import build_library
from tensorfuse.compiler.frontend.onnx import import_onnx
from tensorfuse.compiler.lower import lower_graph
from tensorfuse.compiler.pipeline import optimize
from tensorfuse.ir.target import Target
from tensorfuse.codegen.cuda.ptx_gate import unresolved_externs
a = rand(32, 64)
m = node_model("MatMul", {"a": a}, initializers={"b": rand(64, 24, seed=1)})
tgt = Target.parse("cuda")
g = import_onnx(m)
optimize(g, 2, target=tgt)
with mma.precision_scope("tf32"):
    lg = lower_graph(g, tgt)
(k,) = [k for k in lg.kernels if "output tiles" in k.comment]
with tempfile.TemporaryDirectory() as d:
    lib = build_library([k], cache_dir=d)
    ptx = lib.ptx((9, 0))[k.name]
micro = mma.nvrtc_ptx((9, 0))
linked = ptx_stats.functions(micro)
(st,) = ptx_stats.analyze_ptx(ptx, linked)
out = {"comment": k.comment, "loop_mma": st.loop.mma if st.loop else 0, "calls": st.loop.calls if st.loop else 0,
       "kernel_local": st.local_ops, "externs": unresolved_externs(ptx),
       "linked": sorted(mma.linked_functions((9, 0))),
       "micro_mma": micro.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
       "micro_cvt": micro.count("cvt.rna.tf32.f32"),
       "micro_local": sum(f.local for f in linked.values()),
       "kernel_fma": st.whole.fma}
ptxas = ptx_stats.find_ptxas()
if ptxas:
    res = {**ptx_stats.ptxas_resources(ptx, "sm_90", ptxas), **ptx_stats.ptxas_resources(micro, "sm_90", ptxas)}
    out["spill_bytes"] = sum(r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in res.values())
    out["stack_bytes"] = sum(r.get("stack_bytes", 0) for r in res.values())
print("RESULT " + json.dumps(out))
'''


def test_tf32_kernel_ptx_has_mma_and_no_local_memory():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    p = subprocess.run([sys.executable, "-c", _CHILD, here, os.path.dirname(here)], env=env,
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines and ("NVVM" in p.stderr or "libnvvm" in p.stderr.lower()):
        pytest.skip(f"no NVVM here: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert "TF32 mma.sync" in r["comment"]
    # 32 x 24 outputs: one 32-tile, 4x4 registers, so warp tiles of 16 x 32 (1 x 4 fragments):
    # per 16-deep slice two k-steps of four calls of tile_1x1 (one mma each)
    assert r["calls"] == 8 and r["loop_mma"] == 8, r
    assert r["externs"] == ["tile_1x1"] and set(r["externs"]) <= set(r["linked"])
    assert r["micro_mma"] == 1 + 4 + 16 and r["micro_cvt"] == 6 + 12 + 24      # A and B operands per shape
    assert r["kernel_local"] == 0 and r["micro_local"] == 0, r
    assert r["kernel_fma"] == 0          # the inner product is not on the FMA units
    if "spill_bytes" in r:             # and no stack frame for the calls (local memory)
        assert r["spill_bytes"] == 0 and r["stack_bytes"] == 0, r
