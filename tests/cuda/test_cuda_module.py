"""The cuda runtime (``runtime.cuda_module.CudaModule``) under the CUDA simulator, on a hand-built
program whose kernels come from a fake library that honours the ``codegen.cuda.jit`` contract
(tests/cuda/fake_library.py): arena views at the plan's offsets, constants uploaded once, numpy
and device inputs, host and device outputs, run-time checks, profile, save/load and concurrent
runs. Expected values are computed with numpy and compared exactly (the kernels do one float32
operation per element, as numpy does)."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import zipfile  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402
from numba.core import config  # noqa: E402

import tensorfuse  # noqa: E402
from tensorfuse.codegen.base import get_backend  # noqa: E402
from tensorfuse.runtime import cuda_module  # noqa: E402
from tensorfuse.runtime.artifact import ArtifactError  # noqa: E402
from tensorfuse.runtime.cuda_module import DEVICE_ALIGNMENT, CudaModule  # noqa: E402

from fake_library import FakeLibrary, fake_program, reference  # noqa: E402

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1 at numba import")

SHAPE = (2, 3)


def make_module(shape=SHAPE):
    prog = fake_program(shape)
    lib = FakeLibrary(int(np.prod(shape)))
    return CudaModule(prog, lib, ["x"], ["y", "b"]), lib


def x_input(seed=0, shape=SHAPE):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3


def w_of(mod):
    return mod._consts[1]


def host_addr(dev) -> int:
    return dev._ary.ctypes.data          # the simulator's device arrays are host arrays


class CudaArrayLike:
    """An object that only exports ``__cuda_array_interface__`` (as CuPy and PyTorch CUDA
    tensors do); under the simulator its pointer is host memory."""

    def __init__(self, arr: np.ndarray, strides=None):
        self.arr = arr
        self._strides = strides

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.arr.shape, "typestr": self.arr.dtype.str, "data": (self.arr.ctypes.data, False),
                "strides": self._strides, "version": 3, "stream": None}


def test_run_with_numpy_inputs_matches_numpy():
    mod, lib = make_module()
    x = x_input()
    y, b = mod.run(x)
    ry, rb = reference(x, w_of(mod))
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == SHAPE
    assert b.dtype == np.bool_ and b.shape == SHAPE
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(b, rb)
    assert rb.any() and not rb.all()           # the test distinguishes both values
    assert lib.launches == {"check": 1, "add": 1, "relu": 1, "scale": 1, "positive": 1}
    y2, _ = mod(x=x + 1)
    np.testing.assert_array_equal(y2, reference(x + 1, w_of(mod))[0])


def test_one_arena_with_views_at_the_plan_offsets(monkeypatch):
    mod, _ = make_module()
    plan = mod.memory_plan
    assert plan.alignment % DEVICE_ALIGNMENT == 0
    made = []
    orig = cuda_module._CudaArena.__init__

    def counting(self, m):
        made.append(self)
        orig(self, m)
    monkeypatch.setattr(cuda_module._CudaArena, "__init__", counting)
    x = x_input()
    for _ in range(3):
        mod.run(x)
    assert len(made) == 1, "run() allocated an arena per run"
    arena = made[0]
    base = host_addr(arena.buffer)
    assert arena.buffer.size == mod.arena_bytes
    for s in (2, 3):                               # the temps: at the plan's offsets
        assert host_addr(arena.views[s]) - base == plan.offsets[s]
    for s in (0, 4, 5, 6):                         # input, outputs, status: after the plan's arena
        off = host_addr(arena.views[s]) - base
        assert off >= plan.arena_bytes and off % DEVICE_ALIGNMENT == 0
        assert off + mod._program.slots[s].nbytes <= mod.arena_bytes
    for s, v in arena.views.items():
        assert v.shape == (int(np.prod(mod._program.slots[s].shape)),) and v._ary.dtype == mod._program.slots[s].dtype
    # the constant is the module's one upload, not a copy per arena
    assert arena.views[1] is mod._const_views[1]
    np.testing.assert_array_equal(mod._const_views[1].copy_to_host(), w_of(mod).reshape(-1))


def test_constants_are_uploaded_once(monkeypatch):
    uploads = []
    orig = cuda.to_device

    def counting(a, *args, **kw):
        uploads.append(np.asarray(a).nbytes)
        return orig(a, *args, **kw)
    monkeypatch.setattr(cuda, "to_device", counting)
    mod, _ = make_module()
    assert len(uploads) == 1 and uploads[0] >= w_of(mod).nbytes
    for k in range(3):
        mod.run(x_input(k))
    assert len(uploads) == 1


def test_device_inputs_are_bound_without_a_copy():
    mod, lib = make_module()
    x = x_input(1)
    ry, rb = reference(x, w_of(mod))
    dx = cuda.to_device(x)
    y, b = mod.run(dx)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(b, rb)
    like = CudaArrayLike(x.copy())
    y, b = mod.run(x=like)
    np.testing.assert_array_equal(y, ry)
    # bound, not copied: the kernels saw the caller's memory (a write to it shows in the next run)
    like.arr[...] = 0
    np.testing.assert_array_equal(mod.run(like)[0], reference(np.zeros_like(x), w_of(mod))[0])


def test_device_inputs_are_checked_from_their_interface():
    mod, _ = make_module()
    with pytest.raises(ValueError, match=r"input 'x': expected dtype float32, got float64 \(a device array\)"):
        mod.run(cuda.to_device(np.zeros(SHAPE, np.float64)))
    with pytest.raises(ValueError, match=r"input 'x': expected shape \[2, 3\], got \[3, 2\] \(a device array\)"):
        mod.run(CudaArrayLike(np.zeros((3, 2), np.float32)))
    t = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"input 'x': a device array must be C-contiguous"):
        mod.run(CudaArrayLike(t.T, strides=t.T.strides))
    with pytest.raises(ValueError, match=r"input 'x' is missing: expected float32\[2, 3\]"):
        mod.run()
    with pytest.raises(ValueError, match=r"unknown input 'z'"):
        mod.run(z=x_input())
    with pytest.raises(ValueError, match=r"input 'x': expected shape \[2, 3\], got \[6\]"):
        mod.run(np.zeros(6, np.float32))


def test_return_device_gives_fresh_device_arrays():
    mod, _ = make_module()
    x1, x2 = x_input(1), x_input(2)
    y1, b1 = mod.run(x1, return_device=True)
    y2, _ = mod.run(x2, return_device=True)
    assert cuda.cudadrv.devicearray.is_cuda_ndarray(y1) and y1.shape == SHAPE and b1.shape == SHAPE
    # the second run did not overwrite the first's outputs (not views of the pooled arena)
    np.testing.assert_array_equal(y1.copy_to_host(), reference(x1, w_of(mod))[0])
    np.testing.assert_array_equal(b1.copy_to_host(), reference(x1, w_of(mod))[1])
    np.testing.assert_array_equal(y2.copy_to_host(), reference(x2, w_of(mod))[0])
    # device outputs feed another run as device inputs
    mod2, _ = make_module()
    np.testing.assert_array_equal(mod2.run(y1)[0], reference(reference(x1, w_of(mod))[0], w_of(mod2))[0])


def test_an_input_called_return_device_is_an_input():
    """The flag shares its name with nothing the user may call an input: an array passed as
    ``return_device=`` to a model with that input is the input (it was taken as the flag)."""
    prog = fake_program(SHAPE)
    mod = CudaModule(prog, FakeLibrary(int(np.prod(SHAPE))), ["return_device"], ["y", "b"])
    x = x_input(4)
    y, b = mod.run(return_device=x)
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, reference(x, w_of(mod))[0])
    y, _ = mod.run(x, return_device=True)           # a bool is still the flag
    assert cuda.cudadrv.devicearray.is_cuda_ndarray(y)


def test_a_failed_run_time_check_raises_and_the_next_run_is_clean():
    mod, _ = make_module()
    x = x_input()
    x[1, 2] = 123
    with pytest.raises(ValueError, match=r"x must be at most 100: got 123"):
        mod.run(x)
    x[1, 2] = 0
    np.testing.assert_array_equal(mod.run(x)[0], reference(x, w_of(mod))[0])


def test_profile_times_every_call_on_the_host_under_the_simulator():
    mod, lib = make_module()
    prof = mod.profile(x_input(), repeat=3, warmup=1)
    assert prof.clock == "host"
    assert sorted(r.call for r in prof) == [0, 1, 2, 3, 4]
    assert {r.kernel for r in prof} == set(FakeLibrary.KERNELS)
    assert all(r.median_ms > 0 for r in prof)
    assert lib.launches["add"] == 1 + 3 and lib.launches["scale"] == 4
    add = next(r for r in prof if r.kernel == "add")
    assert add.nodes == ["add_0"] and add.bytes_moved == 3 * 24
    assert "add_0" in str(prof)
    with pytest.raises(ValueError, match="repeat"):
        mod.profile(x_input(), repeat=0)
    bench = mod.benchmark(x_input(), repeat=2, warmup=0)
    assert bench.repeat == 2 and bench.min_ms > 0
    bench = mod.benchmark(cuda.to_device(x_input()), repeat=2, warmup=0, return_device=True)
    assert bench.repeat == 2 and bench.min_ms > 0
    prof = mod.profile(x=cuda.to_device(x_input()), repeat=1, warmup=0)
    assert len(prof) == 5
    with pytest.raises(ValueError, match=r"input 'x': expected shape"):
        mod.benchmark(np.zeros(4, np.float32), repeat=1)


def test_concurrent_runs_from_two_threads():
    mod, _ = make_module()
    xs = [x_input(k) for k in range(6)]
    results: dict[int, list] = {}
    errors = []

    def work(k):
        try:
            for j in range(k, len(xs), 2):
                results[j] = mod.run(xs[j])
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for j, x in enumerate(xs):
        ry, rb = reference(x, w_of(mod))
        np.testing.assert_array_equal(results[j][0], ry)
        np.testing.assert_array_equal(results[j][1], rb)


@pytest.fixture
def fake_loader(monkeypatch):
    """The cuda backend rebuilds libraries with the fake's from_blob."""
    monkeypatch.setattr(get_backend("cuda"), "load_library", FakeLibrary.from_blob)


def test_save_and_load_round_trip(tmp_path, fake_loader):
    mod, _ = make_module()
    path = tmp_path / "m.tfm"
    mod.save(path)
    with zipfile.ZipFile(path) as z:
        meta = json.loads(z.read("tensorfuse.json"))
        assert {"tensorfuse.json", "library.cuda", "consts.bin"} <= set(z.namelist())
        assert json.loads(z.read("library.cuda")) == {"fake": True, "numel": 6}
    assert meta["backend"] == "cuda" and meta["code"] == "library.cuda" and meta["target"] == "cuda"
    assert meta["cuda"]["simulator"] is True
    assert meta["plan"]["alignment"] % DEVICE_ALIGNMENT == 0
    loaded = tensorfuse.load(path)
    assert isinstance(loaded, CudaModule) and loaded.report is None
    assert [str(i) for i in loaded.input_info] == [str(i) for i in mod.input_info]
    assert loaded.memory_plan.offsets == mod.memory_plan.offsets
    x = x_input(3)
    for a, b in zip(loaded.run(x), mod.run(x)):
        np.testing.assert_array_equal(a, b)
    assert loaded.calls[1].sources == ["add_0"]
    loaded.save(tmp_path / "again.tfm")           # a loaded module saves again
    np.testing.assert_array_equal(tensorfuse.load(tmp_path / "again.tfm").run(x)[0], mod.run(x)[0])


def _rewrite_meta(src, dst, change):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "tensorfuse.json":
                meta = json.loads(data)
                change(meta)
                data = json.dumps(meta).encode()
            zout.writestr(item, data)


def test_load_checks_version_and_code_checksum(tmp_path, fake_loader):
    mod, _ = make_module()
    mod.save(tmp_path / "m.tfm")
    _rewrite_meta(tmp_path / "m.tfm", tmp_path / "old.tfm", lambda m: m.update(tensorfuse_version="0.0.1"))
    with pytest.raises(ArtifactError, match=r"written by tensorfuse 0\.0\.1"):
        tensorfuse.load(tmp_path / "old.tfm")
    _rewrite_meta(tmp_path / "m.tfm", tmp_path / "bad.tfm", lambda m: m["sha256"].update({"library.cuda": "0" * 64}))
    with pytest.raises(ArtifactError, match=r"corrupt: the checksum of library\.cuda does not match"):
        tensorfuse.load(tmp_path / "bad.tfm")


def test_a_library_that_cannot_be_rebuilt_is_an_artifact_error(tmp_path, monkeypatch):
    mod, _ = make_module()
    mod.save(tmp_path / "m.tfm")

    def broken(blob):
        raise KeyError("sources")
    monkeypatch.setattr(get_backend("cuda"), "load_library", broken)
    with pytest.raises(ArtifactError, match=r"its cuda kernel library cannot be loaded \(KeyError"):
        tensorfuse.load(tmp_path / "m.tfm")


LOAD_WITHOUT_GPU = r"""
import sys
sys.path.insert(0, sys.argv[1])
import tensorfuse
from tensorfuse.runtime.artifact import ArtifactError
try:
    tensorfuse.load(sys.argv[2])
except ArtifactError as e:
    print("ERR", e)
else:
    print("LOADED")
"""


def test_loading_without_gpu_or_simulator_is_a_clear_error(tmp_path):
    mod, _ = make_module()
    mod.save(tmp_path / "m.tfm")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_GPU, _shim(),
                        str(tmp_path / "m.tfm")], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip()
    if "LOADED" in out:
        pytest.skip("this machine has a usable GPU")
    assert out.startswith("ERR ") and "is a cuda module, which cannot run here" in out, out
    assert "CUDA driver library cannot be found" in out or "libNVVM" in out or "GPU" in out, out


def _shim() -> str:
    """A sys.path entry that imports this tree as ``tensorfuse`` (the one this process uses)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(tensorfuse.__file__)))


def test_a_module_cannot_be_made_without_gpu_or_simulator(monkeypatch):
    monkeypatch.setattr(cuda_module, "cuda_unavailable_reason", lambda: "no usable CUDA GPU (test)")
    with pytest.raises(RuntimeError, match=r"cannot run a cuda module here: no usable CUDA GPU \(test\)"):
        make_module()


def test_cuda_sources_and_report_attributes():
    mod, lib = make_module()
    assert mod.cuda_sources == lib.sources and mod.library is lib
    assert mod.backend == "cuda" and mod.target == "cuda" and mod.layout_report is None
    assert mod.num_kernels == 5 and mod.report is None and mod.graph is None
    assert repr(mod).startswith("<tensorfuse.CudaModule target=cuda (x: f32[2,3]) -> (y: f32[2,3], b: bool[2,3])")


def test_num_threads_is_one_and_checked():
    mod, _ = make_module()
    mod.num_threads = 4
    assert mod.num_threads == 1
    with pytest.raises(ValueError):
        mod.num_threads = 0
