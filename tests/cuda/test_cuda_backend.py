"""``compile(model, target="cuda")`` through the driver, the cuda backend and the compile cache,
under the CUDA simulator, with ``codegen.cuda.jit`` replaced by a recording stand-in (the code
generator is tested on its own): the backend hands the lowered kernels to ``build_library``, the
runtime launches every kernel call in order with one flat device array per kernel parameter of
the parameter's dtype and length, and a cache hit loads the module back through
``CudaLibrary.from_blob``."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import sys  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba.core import config  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import tensorfuse  # noqa: E402
from tensorfuse.runtime.cuda_module import CudaModule  # noqa: E402

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1 at numba import")


class RecordingLibrary:
    """The ``CudaLibrary`` contract; ``launch`` records (kernel, [(shape, dtype) of each arg])."""

    built: list = []

    def __init__(self, names):
        self.kernel_names = list(names)
        self.sources = {n: f"# {n}\n" for n in names}
        self.calls: list = []

    def compile_all(self):
        self.compiled = True
        return len(self.kernel_names)

    def launch(self, name, args):
        assert name in self.kernel_names
        assert getattr(self, "compiled", False), "a kernel launched before compile_all"
        self.calls.append((name, [(tuple(a.shape), a._ary.dtype) for a in args]))

    def launch_config(self, name):
        return [((1,), (32,))]

    def to_blob(self) -> bytes:
        return ",".join(self.kernel_names).encode()

    @staticmethod
    def from_blob(blob, cache_dir=None):
        return RecordingLibrary(blob.decode().split(","))


@pytest.fixture
def fake_jit(monkeypatch, tmp_path):
    mod = types.ModuleType("tensorfuse.codegen.cuda.jit")

    def build_library(kernels, *, cache_dir=None):
        RecordingLibrary.built.append([k.name for k in kernels])
        return RecordingLibrary([k.name for k in kernels])
    mod.build_library = build_library
    mod.CudaLibrary = RecordingLibrary
    monkeypatch.setitem(sys.modules, "tensorfuse.codegen.cuda.jit", mod)
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    RecordingLibrary.built = []
    return mod


def small_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    z = helper.make_tensor_value_info("z", TensorProto.INT64, [2])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"]),
             helper.make_node("ArgMax", ["x"], ["z"], axis=1, keepdims=0)]
    g = helper.make_graph(nodes, "g", [x], [y, z])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_compile_for_cuda_builds_launches_and_caches(fake_jit):
    m = small_model()
    mod = tensorfuse.compile(m, target="cuda")
    assert isinstance(mod, CudaModule) and mod.cache_hit is False and mod.target == "cuda"
    assert RecordingLibrary.built == [[k.name for k in mod.kernels]]
    assert mod.report is not None and mod.llvm_ir is None
    assert [str(i) for i in mod.input_info] == ["x: f32[2,3]"]
    assert [o.dtype for o in mod.output_info] == [np.float32, np.int64]
    outs = mod.run(np.ones((2, 3), np.float32))
    assert [o.shape for o in outs] == [(2, 3), (2,)] and outs[1].dtype == np.int64
    # every call launched in order, each parameter a flat device array of its Buffer's dtype and length
    params = {k.name: k.params for k in mod.kernels}
    assert [c for c, _ in mod.library.calls] == [c.kernel for c in mod.calls]
    for name, args in mod.library.calls:
        assert args == [((b.numel,), np.dtype(b.dtype.numpy)) for b in params[name]]
    # the cache: a second compile loads the module back through CudaLibrary.from_blob
    again = tensorfuse.compile(m, target="cuda")
    assert isinstance(again, CudaModule) and again.cache_hit is True
    assert len(RecordingLibrary.built) == 1, "a cache hit rebuilt the library"
    assert again.library.kernel_names == mod.library.kernel_names
    assert [k.name for k in again.kernels] == [k.name for k in mod.kernels]
    assert [o.shape for o in again.run(np.ones((2, 3), np.float32))] == [(2, 3), (2,)]


def test_every_kernel_is_made_at_compile_time(tmp_path, monkeypatch):
    """``compile(target="cuda")`` makes every kernel's launch functions before the first run
    (``CudaLibrary.compile_all``: on a GPU it compiles them to device code and numba caches them;
    under the simulator it makes the simulated kernels), as does loading the module back from the
    compile cache."""
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    m = small_model()
    for _ in range(2):                          # built, then loaded back from the cache
        mod = tensorfuse.compile(m, target="cuda")
        lib = mod.library
        assert set(lib._jitted) == set(lib.kernel_names) and lib.kernel_names
        outs = mod.run(np.ones((2, 3), np.float32))
        assert [o.shape for o in outs] == [(2, 3), (2,)]
    assert mod.cache_hit is True
