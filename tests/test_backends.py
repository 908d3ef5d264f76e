"""Backends as objects (``codegen.base``): the registry, the LLVM backend behind ``compile`` and
``load``, the backend name a saved module records, and the cuda target's detection (in
subprocesses: this process's numba may or may not be the simulator)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tensorfuse
from tensorfuse.codegen import base
from tensorfuse.codegen.llvm.backend import LLVMBackend
from tensorfuse.compiler.options import target_part
from tensorfuse.ir.target import Target
from tensorfuse.runtime.artifact import ArtifactError
from test_runtime_module import mlp_model, x_input

SHIM = os.path.dirname(os.path.dirname(os.path.abspath(tensorfuse.__file__)))


@pytest.fixture(scope="module")
def mlp():
    return tensorfuse.compile(mlp_model(n=4, d=16), cache=False)


def test_registry_gives_one_instance_per_backend():
    b = base.get_backend("llvm")
    assert isinstance(b, LLVMBackend) and b is base.get_backend("llvm")
    assert b.name == "llvm" and b.code_member == "code.o"
    assert base.backend_names() == ["cuda", "llvm"]
    with pytest.raises(ValueError, match=r"unknown backend 'vulkan'; known backends: cuda, llvm"):
        base.get_backend("vulkan")


def test_the_cache_key_target_part_comes_from_the_backend():
    tgt = Target.parse("llvm -mattr=-avx512f")
    assert target_part(str(tgt)) == base.get_backend("llvm").target_key(tgt)
    part = target_part("llvm")
    assert part["target"] == "llvm" and {"triple", "cpu", "features", "l1d_bytes", "l2_bytes"} <= set(part)


def test_compile_builds_through_the_llvm_backend(mlp, monkeypatch):
    built = []
    b = base.get_backend("llvm")
    orig = type(b).build

    def spy(self, lowered, *a, **k):
        built.append(len(lowered.kernels))
        return orig(self, lowered, *a, **k)
    monkeypatch.setattr(type(b), "build", spy)
    m = tensorfuse.compile(mlp_model(n=4, d=16), cache=False)
    assert built and m.backend == "llvm" and m.layout_report is None
    x = x_input(2, n=4, d=16)
    np.testing.assert_array_equal(m.run(x)[0], mlp.run(x)[0])


def test_a_saved_module_records_its_backend_and_older_files_load_as_llvm(mlp, tmp_path):
    mlp.save(tmp_path / "m.tfm")
    with zipfile.ZipFile(tmp_path / "m.tfm") as z:
        meta = json.loads(z.read("tensorfuse.json"))
    assert meta["backend"] == "llvm" and meta["code"] == "code.o"
    x = x_input(2, n=4, d=16)

    def rewrite(dst, change):
        with zipfile.ZipFile(tmp_path / "m.tfm") as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
            for item in zin.infolist():
                data = zin.read(item.filename)
                if item.filename == "tensorfuse.json":
                    m = json.loads(data)
                    change(m)
                    data = json.dumps(m).encode()
                zout.writestr(item, data)
    # a file written before backends were recorded
    rewrite(tmp_path / "old.tfm", lambda m: (m.pop("backend"), m.pop("code")))
    np.testing.assert_array_equal(tensorfuse.load(tmp_path / "old.tfm").run(x)[0], mlp.run(x)[0])
    rewrite(tmp_path / "other.tfm", lambda m: m.update(backend="vulkan"))
    with pytest.raises(ArtifactError, match=r"made by backend 'vulkan', which this tensorfuse does not have"):
        tensorfuse.load(tmp_path / "other.tfm")


def test_the_runtime_does_not_import_a_code_generator():
    # the runtime package and the registry import no backend until one is asked for
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import tensorfuse.runtime, tensorfuse.codegen.base\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('tensorfuse.codegen.llvm', "
            "'tensorfuse.codegen.cuda', 'tensorfuse.compiler', 'numba')))\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code, SHIM], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


DETECT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import tensorfuse
from tensorfuse.compiler import driver
from tensorfuse.compiler.target import cuda_available, cuda_unavailable_reason
def no_work(*a, **k):
    raise AssertionError("the model was imported although the cuda target is unavailable")
driver.import_onnx = no_work
reason = cuda_unavailable_reason()
print("REASON", reason)
assert cuda_available() == (reason is None)
print("SUPPORTS", tensorfuse.backend.supports_device("CUDA"))
if reason is not None:
    try:
        tensorfuse.compile(b"not even a model", target="cuda")
    except tensorfuse.CompileError as e:
        print("ERR", e)
"""


def _detect(env_change: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(env_change)
    r = subprocess.run([sys.executable, "-c", DETECT, SHIM], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_without_gpu_or_simulator_compile_for_cuda_fails_at_once_with_the_reason():
    out = _detect({})
    if "REASON None" in out:
        pytest.skip("this machine has a usable GPU")
    assert "SUPPORTS False" in out
    err = next(line for line in out.splitlines() if line.startswith("ERR "))
    assert "target 'cuda' is not available here" in err
    # this machine has no GPU: the reason is numba's, the missing driver (or libNVVM)
    assert "CUDA driver library cannot be found" in err or "libNVVM" in err or "GPU" in err, err
    assert "NUMBA_ENABLE_CUDASIM=1" in err


def test_under_the_simulator_the_cuda_target_is_available():
    out = _detect({"NUMBA_ENABLE_CUDASIM": "1"})
    assert "REASON None" in out and "SUPPORTS True" in out
