"""Saved modules (runtime.artifact): one file, bit-exact after loading, loaded in a fresh process
without LLVM code generation, and clear errors for other versions, other CPUs, truncated or
corrupt files; the write is atomic."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tensorfuse
from tensorfuse import compiler
import tensorfuse
from tensorfuse import runtime
from tensorfuse.codegen.llvm import jit
from tensorfuse.runtime.artifact import CODE, CONSTS, META, ArtifactError
from test_runtime_module import mlp_model, mlp_ref, x_input

ROOT = pathlib.Path(__file__).resolve().parent.parent

# a fresh interpreter where generating code is impossible: the LLVM IR emitter cannot be
# imported and every code-generating function of the JIT raises
LOAD_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
sys.modules["tensorfuse.codegen.llvm.emit"] = None
import tensorfuse.codegen.llvm.jit as jit
def _no_codegen(*a, **k):
    raise AssertionError("LLVM code generation in a process that only loads a saved module")
jit.compile_ir = jit.optimize = jit.parse_and_verify = _no_codegen
import time
import numpy as np
t0 = time.perf_counter()
import tensorfuse
from tensorfuse import runtime
mod = tensorfuse.load(sys.argv[2])
t1 = time.perf_counter()
feeds = dict(np.load(sys.argv[3]))
outs = mod.run(**feeds)
np.savez(sys.argv[4], *outs)
assert jit.STATS["codegen_calls"] == 0, jit.STATS
assert "tensorfuse.compiler" not in sys.modules, "loading imported the compiler"
print(f"load_s={t1 - t0:.4f}")
"""


def load_in_fresh_process(path, feeds: dict, tmp_path) -> tuple[list[np.ndarray], float]:
    """Run a saved module in a new interpreter; returns its outputs and the load time (s)."""
    xin, yout = tmp_path / "feeds.npz", tmp_path / "outs.npz"
    np.savez(xin, **feeds)
    r = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(ROOT), str(path), str(xin), str(yout)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    load_s = float(r.stdout.strip().split("load_s=")[-1])
    with np.load(yout) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))], load_s


@pytest.fixture(scope="module")
def mlp():
    model = mlp_model(n=4, d=64)
    return model, tensorfuse.compile(model, cache=False)


def _rewrite(src, dst, meta_change=None, member_change=None):
    """Copy a saved module, changing its metadata or one member's bytes."""
    with zipfile.ZipFile(src) as z:
        items = {n: z.read(n) for n in z.namelist()}
    if meta_change:
        meta = json.loads(items[META])
        meta_change(meta)
        items[META] = json.dumps(meta).encode()
    if member_change:
        name, fn = member_change
        items[name] = fn(items[name])
    with zipfile.ZipFile(dst, "w") as z:
        for n, b in items.items():
            z.writestr(n, b)


def test_round_trip_is_bit_exact(mlp, tmp_path):
    model, mod = mlp
    path = tmp_path / "mlp.tfm"
    mod.save(path)
    assert path.is_file() and [p.name for p in tmp_path.iterdir()] == ["mlp.tfm"]
    before = jit.STATS["codegen_calls"]
    loaded = tensorfuse.load(path)
    assert jit.STATS["codegen_calls"] == before
    x = x_input(0, n=4, d=64)
    np.testing.assert_array_equal(loaded.run(x)[0], mod.run(x)[0])
    np.testing.assert_allclose(loaded.run(x)[0], mlp_ref(model, x), rtol=1e-4, atol=1e-5)
    assert loaded.input_info == mod.input_info and loaded.output_info == mod.output_info
    assert loaded.memory_plan == mod.memory_plan
    assert [c.kernel for c in loaded.calls] == [c.kernel for c in mod.calls]
    assert [c.nodes for c in loaded.calls] == [c.nodes for c in mod.calls]
    prof = loaded.profile(x, repeat=2, show=False)          # the call table survives the file
    assert len(prof) == mod.num_kernels
    assert sorted(n for r in prof for n in r.nodes) == sorted(n for r in mod.profile(x, repeat=1, show=False)
                                                               for n in r.nodes)
    assert loaded.graph is None
    with pytest.raises(AttributeError, match="machine code, not kernel IR"):
        loaded.kernels


def test_metadata(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    with zipfile.ZipFile(tmp_path / "m.tfm") as z:
        assert set(z.namelist()) == {META, CODE, CONSTS}
        meta = json.loads(z.read(META))
        code = z.read(CODE)
    host = jit.host_info()
    assert meta["tensorfuse_version"] == compiler.__version__
    assert (meta["host"]["triple"], meta["host"]["cpu"], meta["host"]["features"]) == (
        host["triple"], host["cpu"], host["features"])
    assert meta["inputs"] == [{"name": "x", "dtype": "<f4", "shape": [4, 64]}]
    assert meta["outputs"] == [{"name": "y", "dtype": "<f4", "shape": [4, 64]}]
    assert meta["plan"]["arena_bytes"] == mod.memory_plan.arena_bytes
    assert {c["kernel"] for c in meta["calls"]} == {c.kernel for c in mod.calls}
    from tensorfuse.codegen.llvm.jit import unpack_objects
    assert all(o[:4] == b"\x7fELF" or o[:4] in (b"\xcf\xfa\xed\xfe", b"\x64\x86")    # object files: the
               for o in unpack_objects(code))                                             # module's, the team's


def test_loads_and_runs_in_a_fresh_process_without_codegen(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    x = x_input(1, n=4, d=64)
    outs, _ = load_in_fresh_process(tmp_path / "m.tfm", {"x": x}, tmp_path)
    np.testing.assert_array_equal(outs[0], mod.run(x)[0])


# the cache-hit path of the runtime: a fresh interpreter finds a compile cache entry by its key
# (as the compiler built it) and runs the module; neither the compiler nor code generation is
# imported, and the stored compile report is read without them
CACHE_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
sys.modules["tensorfuse.codegen.llvm.emit"] = None
import pathlib
import numpy as np
import tensorfuse.runtime.cache as rc
parts = json.loads(pathlib.Path(sys.argv[2]).read_text())
parts.pop("external")
entry = rc.lookup(parts, pathlib.Path(sys.argv[2]).parent)
assert entry is not None and entry.report is not None
assert entry.report.data["rewrite_log"] is not None and entry.report.data["graph"].startswith("graph ")
feeds = dict(np.load(sys.argv[3]))
np.savez(sys.argv[4], *entry.module.run(**feeds))
bad = sorted(m for m in sys.modules if m.startswith("tensorfuse.compiler"))
assert not bad, f"the cache-hit path imported {bad}"
"""


def test_cache_hit_path_imports_nothing_of_the_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    model = mlp_model(n=4, d=64)
    mod = tensorfuse.compile(model)
    assert mod.cache_hit is False
    key = next((tmp_path / "cache").glob("*.key.json"))
    x = x_input(2, n=4, d=64)
    xin, yout = tmp_path / "feeds.npz", tmp_path / "outs.npz"
    np.savez(xin, x=x)
    r = subprocess.run([sys.executable, "-c", CACHE_SCRIPT, str(ROOT), str(key), str(xin), str(yout)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(yout) as z:
        np.testing.assert_array_equal(z["arr_0"], mod.run(x)[0])


def test_loaded_module_saves_again(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "a.tfm")
    tensorfuse.load(tmp_path / "a.tfm").save(tmp_path / "b.tfm")
    x = x_input(2, n=4, d=64)
    np.testing.assert_array_equal(tensorfuse.load(tmp_path / "b.tfm").run(x)[0], mod.run(x)[0])


def test_other_version_is_refused(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    _rewrite(tmp_path / "m.tfm", tmp_path / "old.tfm", meta_change=lambda m: m.update(tensorfuse_version="0.0.1"))
    with pytest.raises(ArtifactError, match=r"written by tensorfuse 0\.0\.1, this is tensorfuse " + compiler.__version__):
        tensorfuse.load(tmp_path / "old.tfm")


HOST_ON = {f[1:] for f in jit.host_info()["features"].split(",") if f.startswith("+")}
#: CPU features this machine lacks (the first is claimed by rewritten files)
LACKING = [f for f in ("amx-tile", "avx512fp16", "avx10.2", "sm4", "sve2", "sme") if f not in HOST_ON]


def test_metadata_records_what_the_code_was_compiled_for(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    with zipfile.ZipFile(tmp_path / "m.tfm") as z:
        meta = json.loads(z.read(META))
    assert meta["target"] == meta["host"]["target"] == "llvm"
    needs = meta["host"]["needs"]
    assert needs == sorted(needs) and set(needs) <= HOST_ON and not set(needs) & jit.SYSTEM_ONLY_FEATURES
    assert set(needs) == {f[1:] for f in meta["host"]["features"].split(",") if f.startswith("+")} \
        - jit.SYSTEM_ONLY_FEATURES


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 CPU names")
def test_module_for_another_cpu_saves_its_target_and_loads(tmp_path):
    target = "llvm -mcpu=x86-64 -mattr=-avx,-avx2"
    model = mlp_model(n=4, d=64)
    mod = tensorfuse.compile(model, target=target, cache=False)
    mod.save(tmp_path / "m.tfm")
    with zipfile.ZipFile(tmp_path / "m.tfm") as z:
        meta = json.loads(z.read(META))
    assert meta["target"] == meta["host"]["target"] == target
    assert meta["host"]["cpu"] == "x86-64" and "-avx" in meta["host"]["features"].split(",")
    assert "sse2" in meta["host"]["needs"] and "avx" not in meta["host"]["needs"]
    loaded = tensorfuse.load(tmp_path / "m.tfm")
    assert loaded.target == target
    x = x_input(3, n=4, d=64)
    np.testing.assert_array_equal(loaded.run(x)[0], mod.run(x)[0])
    np.testing.assert_allclose(loaded.run(x)[0], mlp_ref(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not LACKING, reason="this CPU has every feature the test could claim")
def test_missing_cpu_features_are_named(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    lack = LACKING[0]

    def other_cpu(meta):
        meta["host"]["cpu"] = "futurecpu"
        meta["host"]["features"] += f",+{lack},+warp-drive"
        meta["host"]["needs"] = sorted(meta["host"]["needs"] + [lack, "warp-drive"])
    _rewrite(tmp_path / "m.tfm", tmp_path / "cpu.tfm", meta_change=other_cpu)
    host_cpu = jit.host_info()["cpu"]
    names = ", ".join(sorted([lack, "warp-drive"]))
    with pytest.raises(ArtifactError, match=rf"this module was compiled for futurecpu \(target 'llvm'\) and needs "
                                            rf"{re.escape(names)}; this CPU \({host_cpu}\) lacks them: recompile it here"):
        tensorfuse.load(tmp_path / "cpu.tfm")
    tensorfuse.load(tmp_path / "m.tfm")                    # the file as saved still loads


@pytest.mark.skipif(not LACKING, reason="this CPU has every feature the test could claim")
def test_file_without_needs_is_checked_on_its_features(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")

    def old_file(meta):
        del meta["host"]["needs"]
        meta["host"]["features"] += f",+{LACKING[0]}"
    _rewrite(tmp_path / "m.tfm", tmp_path / "old.tfm", meta_change=old_file)
    with pytest.raises(ArtifactError, match=rf"needs {re.escape(LACKING[0])}; this CPU .* lacks it"):
        tensorfuse.load(tmp_path / "old.tfm")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 CPU features")
def test_system_only_features_are_not_needed(mlp, tmp_path):
    # CPU features virtual machines hide (Zen's mwaitx, rdpru) that the code never uses are
    # not a reason to refuse a module compiled for that CPU
    from tensorfuse.ir.target import Target
    info = jit.target_info(Target.parse("llvm -mcpu=znver3"))
    assert "+mwaitx" in info["features"].split(",") and "mwaitx" not in info["needs"] and "avx2" in info["needs"]
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")

    def vm(meta):
        del meta["host"]["needs"]           # a file without the list: judged on its features
        meta["host"]["features"] = meta["host"]["features"].replace("-mwaitx", "+mwaitx").replace("-rdpru", "+rdpru")
    _rewrite(tmp_path / "m.tfm", tmp_path / "vm.tfm", meta_change=vm)
    x = x_input(4, n=4, d=64)
    np.testing.assert_array_equal(tensorfuse.load(tmp_path / "vm.tfm").run(x)[0], mod.run(x)[0])


def test_other_triple_is_refused(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    _rewrite(tmp_path / "m.tfm", tmp_path / "arm.tfm",
             meta_change=lambda m: m["host"].update(triple="aarch64-unknown-linux-gnu"))
    with pytest.raises(ArtifactError, match="machine code for aarch64-unknown-linux-gnu"):
        tensorfuse.load(tmp_path / "arm.tfm")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file(mlp, tmp_path, keep):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    data = (tmp_path / "m.tfm").read_bytes()
    (tmp_path / "t.tfm").write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ArtifactError, match="truncated or corrupt"):
        tensorfuse.load(tmp_path / "t.tfm")


@pytest.mark.parametrize("member", [CODE, CONSTS])
def test_corrupt_member_is_detected(mlp, tmp_path, member):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    # the zip stays well-formed (fresh CRC), so the metadata's checksum must catch it
    flip = (member, lambda b: b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 0xFF]) + b[len(b) // 2 + 1:])
    _rewrite(tmp_path / "m.tfm", tmp_path / "c.tfm", member_change=flip)
    with pytest.raises(ArtifactError, match=f"corrupt: the checksum of {member}"):
        tensorfuse.load(tmp_path / "c.tfm")


def test_flipped_byte_in_place_is_detected(mlp, tmp_path):
    _, mod = mlp
    mod.save(tmp_path / "m.tfm")
    data = bytearray((tmp_path / "m.tfm").read_bytes())
    data[len(data) // 2] ^= 0x5A
    (tmp_path / "f.tfm").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupt"):
        tensorfuse.load(tmp_path / "f.tfm")


def test_not_a_module_file(tmp_path):
    (tmp_path / "x.tfm").write_bytes(b"hello, not a zip")
    with pytest.raises(ArtifactError, match="truncated or corrupt"):
        tensorfuse.load(tmp_path / "x.tfm")
    with zipfile.ZipFile(tmp_path / "z.tfm", "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(ArtifactError, match="not a tensorfuse module file"):
        tensorfuse.load(tmp_path / "z.tfm")
    with pytest.raises(ArtifactError, match="no such tensorfuse module file"):
        tensorfuse.load(tmp_path / "missing.tfm")


def test_loading_an_onnx_model_says_so(mlp, tmp_path):
    import onnx
    model, _ = mlp
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(ArtifactError, match=r"is an ONNX model, not a saved tensorfuse module: compile it with "
                                            r"tensorfuse.compile\('m.onnx'\)"):
        tensorfuse.load(tmp_path / "m.onnx")


def test_write_is_atomic(mlp, tmp_path, monkeypatch):
    _, mod = mlp
    path = tmp_path / "m.tfm"
    mod.save(path)
    good = path.read_bytes()

    def fail(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(zipfile.ZipFile, "writestr", fail)
    with pytest.raises(ArtifactError, match="cannot write .*No space left"):
        mod.save(path)
    assert path.read_bytes() == good                            # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["m.tfm"]    # no temporary left behind


def test_unwritable_destination(mlp, tmp_path):
    _, mod = mlp
    (tmp_path / "file").write_text("")
    with pytest.raises(ArtifactError, match="cannot write"):
        mod.save(tmp_path / "file" / "m.tfm")
    assert os.listdir(tmp_path) == ["file"]


def test_saved_file_mode_follows_the_umask(mlp, tmp_path):
    _, mlp = mlp
    """A saved module is written through a temporary file (mkstemp: mode 0600) and renamed;
    the result gets the mode open() would give, 0666 less the umask, not 0600."""
    old = os.umask(0o022)
    try:
        mlp.save(str(tmp_path / "m.tfm"))
        os.umask(0o077)
        mlp.save(str(tmp_path / "private.tfm"))
    finally:
        os.umask(old)
    assert (tmp_path / "m.tfm").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.tfm").stat().st_mode & 0o777 == 0o600
