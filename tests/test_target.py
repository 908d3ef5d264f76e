"""Targets (ir.target): parsing and canonical strings, CPU features LLVM gives a named CPU
(vector width, FMA, AVX-512 derived from them), errors for unknown CPUs, features and options,
code generated without the instructions a target turns off, and one end-to-end compile for a
target without AVX. The tests hold on AVX2 and AVX-512 machines alike."""
from __future__ import annotations

import platform

import numpy as np
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse import compiler
import tensorfuse.compiler.driver as driver
from tensorfuse.codegen.llvm import jit
from tensorfuse.ir.target import Target, _cache_sizes, _parse_size, last_level_cache_bytes
from tensorfuse.ir.types import DType

X86 = platform.machine().lower() in ("x86_64", "amd64")
x86_only = pytest.mark.skipif(not X86, reason="x86 CPU names and features")
HOST = jit.host_info()
HOST_ON = {f[1:] for f in HOST["features"].split(",") if f.startswith("+")}


# ----------------------------------------------------------------------------- parsing
def test_plain_llvm_is_this_cpu():
    t = Target.parse("llvm")
    assert str(t) == "llvm" and t.kind == "llvm" and t.options == ()
    assert t.is_host and t.cpu == HOST["cpu"] and t.triple == HOST["triple"]
    assert t.features == HOST["features"]                 # llvmlite's host features, as given
    assert t.feature_set == HOST_ON
    assert Target.parse(t) is t
    assert t.lanes(DType.f32) == max(1, t.vector_bits // 32)


@x86_only
def test_canonical_string_equality_and_hash():
    a = Target.parse("llvm   -mattr=+fma  -mcpu=znver3")
    b = Target.parse(f"llvm -mcpu=znver3 -mtriple={HOST['triple']} -mattr=+fma")
    assert str(a) == str(b) == "llvm -mcpu=znver3 -mattr=+fma"
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    c = Target.parse("llvm -mcpu=skylake-avx512 -mattr=-avx512f -mattr=+fma")     # repeated -mattr: merged
    assert str(c) == "llvm -mcpu=skylake-avx512 -mattr=-avx512f,+fma"
    assert c == Target.parse(str(c)) and c != a
    with pytest.raises(Exception):                        # frozen
        a.kind = "cuda"


@x86_only
def test_znver3_avx2_fma():
    t = Target.parse("llvm -mcpu=znver3")
    assert t.cpu == "znver3" and not t.is_host
    assert t.vector_bits == 256 and t.has_fma and not t.has_avx512
    assert {"avx2", "fma", "bmi2"} <= t.feature_set and "avx512f" not in t.feature_set
    assert "+avx2" in t.features.split(",") and "-avx512f" in t.features.split(",")
    assert (t.lanes(DType.f32), t.lanes(DType.f64), t.lanes(np.int8), t.lanes(np.dtype("float16"))) == (8, 4, 32, 16)


@x86_only
def test_skylake_avx512_and_turning_it_off():
    t = Target.parse("llvm -mcpu=skylake-avx512")
    assert t.vector_bits == 512 and t.has_avx512 and t.has_fma and t.lanes("float32") == 16
    off = Target.parse("llvm -mcpu=skylake-avx512 -mattr=-avx512f")
    assert off.vector_bits == 256 and not off.has_avx512 and off.has_fma and off.lanes(np.float32) == 8
    assert "avx512bw" not in off.feature_set               # LLVM's implications: bw needs f
    assert Target.parse("llvm -mcpu=skylake-avx512 -mattr=-avx512f,+fma").has_fma
    # features apply in order: -avx2 turns off what needs it (AVX-512); +avx2 after it brings AVX2 back only
    assert not Target.parse("llvm -mcpu=skylake-avx512 -mattr=-avx2").has_avx512
    back = Target.parse("llvm -mcpu=skylake-avx512 -mattr=-avx2,+avx2")
    assert back.vector_bits == 256 and "avx2" in back.feature_set


@x86_only
def test_baseline_x86_64_and_host_with_mattr():
    t = Target.parse("llvm -mcpu=x86-64")
    assert t.vector_bits == 128 and not t.has_fma and "sse2" in t.feature_set
    h = Target.parse("llvm -mattr=-avx")
    assert h.is_host and h.cpu == HOST["cpu"] and h.vector_bits == 128 and "avx2" not in h.feature_set
    assert h.feature_set <= HOST_ON


def test_cache_sizes(tmp_path):
    t = Target.parse("llvm")
    assert t.l1d_bytes >= 4096 and t.l2_bytes >= t.l1d_bytes
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                              (3, "Unified", "32M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert _cache_sizes(str(tmp_path)) == (48 << 10, 2 << 20)
    assert _cache_sizes(str(tmp_path / "missing")) == (32 << 10, 512 << 10)
    # the last level: the largest data or unified cache (a 128M instruction cache does not count)
    other = tmp_path / "other"
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (3, "Unified", "96M"), (4, "Instruction", "128M")]):
        d = other / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(str(other)) == 96 << 20 and last_level_cache_bytes(str(tmp_path)) == 32 << 20
    assert last_level_cache_bytes(str(tmp_path / "missing")) == 32 << 20      # the default
    assert _parse_size("1M") == 1 << 20 and _parse_size("512K") == 512 << 10


@x86_only
def test_other_cpu_gets_default_cache_sizes():
    other = "znver4" if HOST["cpu"] != "znver4" else "znver3"
    t = Target.parse(f"llvm -mcpu={other}")
    assert (t.l1d_bytes, t.l2_bytes) == (32 << 10, 512 << 10)


# ----------------------------------------------------------------------------- errors
def test_unknown_cpu():
    with pytest.raises(ValueError, match=r"unknown CPU 'notacpu'.*valid names include") as e:
        Target.parse("llvm -mcpu=notacpu")
    assert HOST["cpu"] in str(e.value)
    assert HOST["cpu"] in Target.cpu_names()


@x86_only
def test_unknown_cpu_suggests_close_names():
    with pytest.raises(ValueError, match=r"unknown CPU 'znver33'.*znver3"):
        Target.parse("llvm -mcpu=znver33")


def test_unknown_feature():
    with pytest.raises(ValueError, match=r"unknown CPU feature 'notafeature'"):
        Target.parse("llvm -mattr=+notafeature")
    with pytest.raises(ValueError, match=r"'avx513f'.*did you mean avx512f"):
        Target.parse("llvm -mattr=-avx513f")
    with pytest.raises(ValueError, match=r"bad -mattr item 'avx2'"):
        Target.parse("llvm -mattr=avx2")
    assert "avx2" in Target.feature_names() or not X86


@pytest.mark.parametrize("opt", ["--foo", "-O3", "-mcpu", "-march=znver3"])
def test_unknown_option(opt):
    with pytest.raises(ValueError, match=rf"unknown option '{opt}' for the llvm target; valid options: -mcpu=.*-mattr="):
        Target.parse(f"llvm {opt}")


def test_other_triple_and_kinds():
    with pytest.raises(ValueError, match=r"-mtriple=riscv64-unknown-linux-gnu is not this machine's triple"):
        Target.parse("llvm -mtriple=riscv64-unknown-linux-gnu")
    with pytest.raises(ValueError, match="unknown target 'gpu'"):
        Target.parse("gpu")
    with pytest.raises(TypeError):
        Target.parse(3)
    assert str(Target.parse("cuda")) == "cuda"
    with pytest.raises(ValueError, match=r"unknown option '-arch=sm_80' for the cuda target"):
        Target.parse("cuda -arch=sm_80")


@x86_only
def test_combination_llvm_cannot_generate_code_for():
    # a 32-bit CPU on a 64-bit triple aborts LLVM: refused without taking this process down
    with pytest.raises(ValueError, match=r"LLVM cannot generate code for target 'llvm -mcpu=i386'"):
        Target.parse("llvm -mcpu=i386")


def test_compile_refuses_a_bad_target_before_any_work(monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("the model was imported for a target that does not exist")
    monkeypatch.setattr(driver, "import_onnx", no_work)
    calls = jit.STATS["codegen_calls"]
    with pytest.raises(ValueError, match="unknown CPU 'notacpu'"):
        tensorfuse.compile(relu_add_model(), target="llvm -mcpu=notacpu")
    with pytest.raises(ValueError, match="unknown option '--foo'"):
        tensorfuse.compile(relu_add_model(), target="llvm --foo", cache=False)
    assert jit.STATS["codegen_calls"] == calls


# ----------------------------------------------------------------------------- generated code
SAXPY = """
define void @saxpy(ptr noalias %x, ptr noalias %y, float %a) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %n, %loop ]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %py = getelementptr inbounds float, ptr %y, i64 %i
  %vx = load float, ptr %px
  %vy = load float, ptr %py
  %m = fmul fast float %vx, %a
  %s = fadd fast float %m, %vy
  store float %s, ptr %py
  %n = add nuw nsw i64 %i, 1
  %c = icmp ult i64 %n, 4096
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


def asm(target):
    return jit.emit_assembly(SAXPY, "saxpy", target=target)


@x86_only
def test_turned_off_isa_is_not_used():
    a = asm("llvm -mattr=-avx")                           # this CPU without AVX: SSE only
    assert "xmm" in a and "ymm" not in a and "zmm" not in a
    a = asm("llvm -mcpu=x86-64 -mattr=-avx2,-avx512f")
    assert "ymm" not in a and "zmm" not in a and "vfmadd" not in a
    a = asm("llvm -mcpu=znver3 -mattr=-avx512f")          # never AVX-512, even on an AVX-512 host
    assert "zmm" not in a and "ymm" in a and "vfmadd" in a
    a = asm("llvm -mcpu=znver4 -mattr=-avx512f")
    assert "zmm" not in a and "ymm" in a


@x86_only
def test_default_uses_the_widest_vectors_of_this_cpu():
    if "avx2" not in HOST_ON:
        pytest.skip("this CPU has no AVX2")
    a = asm(None)
    assert "ymm" in a or "zmm" in a       # zmm on AVX-512 CPUs LLVM does not tune for 256 bits (Zen 4)
    assert asm("llvm") == a
    assert "zmm" in asm("llvm -mcpu=znver4")              # assembly only: runs nowhere


def test_target_machine_follows_the_target():
    t = Target.parse("llvm -mattr=-avx") if X86 else Target.parse("llvm")
    assert jit.target_machine(t).triple == HOST["triple"]
    info = jit.target_info(t)
    assert (info["target"], info["cpu"], info["features"]) == (str(t), t.cpu, t.features)
    assert set(info["needs"]) <= t.feature_set


# ----------------------------------------------------------------------------- end to end
def relu_add_model(shape=(4, 37)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "relu_add", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


@x86_only
def test_compile_for_a_cpu_without_avx_runs():
    target = "llvm -mcpu=x86-64 -mattr=-avx,-avx2"
    mod = tensorfuse.compile(relu_add_model(), target=target, cache=False)
    x = np.random.default_rng(0).standard_normal((4, 37)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x)[0], np.maximum(x, 0) + x, rtol=1e-6)
    info = mod._lib.target_info
    assert info["target"] == target and info["cpu"] == "x86-64" and "avx" not in info["needs"]
    a = jit.emit_assembly(mod.llvm_ir, "relu_add", target=target)   # what compile_ir generated
    assert "ymm" not in a and "zmm" not in a


@x86_only
def test_a_module_for_features_this_cpu_lacks_refuses_to_run_but_saves(tmp_path):
    """Code compiled for a feature this CPU lacks would die of an illegal instruction: run()
    raises instead, naming the feature; the module can still be saved for a CPU that has it."""
    host = set(jit.host_info()["features"].split(","))
    lacking = [f for f in ("avx512f", "amx-tile", "avx512fp16", "avxvnniint8", "avx512vp2intersect", "amx-fp16")
               if f"-{f}" in host]      # (a Sapphire Rapids Xeon has the first three)
    assert lacking, "this CPU has every candidate feature"
    feature = lacking[0]
    mod = tensorfuse.compile(relu_add_model(), target=f"llvm -mattr=+{feature}", cache=False)
    x = np.ones((4, 37), np.float32)
    with pytest.raises(RuntimeError, match=feature):
        mod.run(x)
    with pytest.raises(RuntimeError, match=feature):
        mod.profile(x, show=False)
    mod.save(tmp_path / "m.tfm")
    from tensorfuse import runtime
    with pytest.raises(runtime.artifact.ArtifactError, match=feature):
        tensorfuse.load(tmp_path / "m.tfm")


def test_datapath_bits_split_and_full():
    """Zen 4 runs its 512-bit AVX-512 operations on 256-bit units (``datapath_bits`` 256 with
    ``vector_bits`` 512); Intel's AVX-512 CPUs and x86-64-v4 have full-width units; without
    AVX-512 both are the register width; cuda has no CPU vectors."""
    zen4 = Target.parse("llvm -mcpu=znver4")
    assert (zen4.vector_bits, zen4.datapath_bits) == (512, 256)
    for t in ("llvm -mcpu=x86-64-v4", "llvm -mcpu=sapphirerapids", "llvm -mcpu=znver3",
              "llvm -mcpu=znver4 -mattr=-avx512f"):
        tt = Target.parse(t)
        assert tt.datapath_bits == tt.vector_bits, t
    assert Target.parse("llvm -mcpu=znver4 -mattr=-avx512f").datapath_bits == 256
    assert Target.parse("cuda").datapath_bits == 0
