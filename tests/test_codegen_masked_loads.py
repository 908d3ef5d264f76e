"""Issue 9 defect 2: LLVM's SLP vectoriser turns unrolled loads with gaps into constant-mask
masked loads of odd widths, which LLVM's X86 instruction selection cannot lower on AVX-512
CPUs (the process aborts). ``codegen.llvm.jit`` scalarises them after optimisation; these
tests generate code for AVX-512 CPUs (no need to run it) in a child process, so an abort is a
failed test, not a dead test run."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorfuse
from tensorfuse.codegen.llvm import jit
from oracle import assert_matches_ort, node_model, rand

# the recipe: group=3, kernel 2x3, strides [1, 3], pads [2, 2, 1, 0], input 6x3x6x8
CT_ATTRS = dict(group=3, kernel_shape=[2, 3], strides=[1, 3], pads=[2, 2, 1, 0])


def _ct_model():
    return node_model("ConvTranspose", {"x": rand(6, 3, 6, 8)}, CT_ATTRS,
                      initializers={"w": rand(3, 1, 2, 3, seed=1)})


_CHILD = textwrap.dedent(r"""
    import json, re, sys
    import onnx, tensorfuse
    from tensorfuse.codegen.llvm import jit
    seen = []
    real = jit.optimize
    def spy(mod, opt=3, target=None):
        out = real(mod, opt, target) or mod
        # masked loads whose mask is a constant vector (the construct LLVM cannot select)
        seen.append(len(re.findall(r"@llvm\.masked\.load\.[\w.]+\(ptr [^,]*, <\d+ x i1> <", str(out))))
        return out
    jit.optimize = spy
    model = onnx.load_model_from_string(sys.stdin.buffer.read())
    tensorfuse.compile(model, target="llvm -mcpu=" + sys.argv[1], cache=False, opt_level=int(sys.argv[2]))
    print(json.dumps({"ok": True, "masked_loads": sum(seen)}))
""")


def _compile_in_child(model, cpu: str, opt_level: int = 2) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, cpu, str(opt_level)], input=model.SerializeToString(),
                       capture_output=True, timeout=600)
    assert r.returncode == 0, f"compiling for {cpu} ended with status {r.returncode}: " \
                              f"{r.stderr.decode(errors='replace')[-1500:]}"
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("cpu", ["znver4", "skylake-avx512"])
def test_conv_transpose_compiles_for_avx512(cpu):
    res = _compile_in_child(_ct_model(), cpu)
    assert res["ok"] and res["masked_loads"] == 0


def test_conv_transpose_recipe_matches_onnxruntime():
    assert_matches_ort(_ct_model(), {"x": rand(6, 3, 6, 8)}, rtol=1e-5, atol=1e-5, opt_levels=(0, 2))


_IR = """
define <4 x float> @f(ptr %p, <4 x float> %q) {
  %v = tail call <4 x float> @llvm.masked.load.v4f32.p0(ptr align 8 %p, <4 x i1> <i1 true, i1 false, i1 true, i1 true>, <4 x float> %q)
  ret <4 x float> %v
}
declare <4 x float> @llvm.masked.load.v4f32.p0(ptr, <4 x i1>, <4 x float>)
"""


def test_scalarised_masked_load_reads_only_enabled_lanes():
    text = jit.scalarize_constant_masked_loads(_IR)
    body = text.split("declare")[0]
    assert "@llvm.masked.load" not in body
    # lanes 0, 2 and 3 are loaded (lane 0 keeps the call's alignment), lane 1 keeps %q's
    assert "getelementptr inbounds float, ptr %p, i64 1" not in body
    assert [ln.split("load float, ptr ")[1] for ln in body.splitlines() if " = load float" in ln] == [
        "%tf.mload0.p0, align 8", "%tf.mload0.p2, align 4", "%tf.mload0.p3, align 4"]
    assert "%tf.mload0.v0 = insertelement <4 x float> %q, float %tf.mload0.l0, i64 0" in body
    assert "%v = insertelement <4 x float> %tf.mload0.v2, float %tf.mload0.l3, i64 3" in body
    assert jit.parse_and_verify(text, "t").get_function("f")


def test_runtime_mask_is_kept():
    ir = _IR.replace("<4 x i1> <i1 true, i1 false, i1 true, i1 true>", "<4 x i1> %m").replace(
        "ptr %p, <4 x float> %q", "ptr %p, <4 x float> %q, <4 x i1> %m")
    assert jit.scalarize_constant_masked_loads(ir) == ir
