"""Shared test configuration.

* The compile cache goes to a temporary folder for the whole session (never ~/.cache).
* Debug mode is on (``TENSORFUSE_DEBUG=1`` unless set otherwise; ``tensorfuse.debug``): the
  graph is verified after every pass and rule application, and compiled modules poison freed
  arena regions and check that no kernel reads a reused one (``runtime.memory_plan``).
* Within a test process LLVM compiles a given IR text for a given target once
  (:func:`_memoize_llvm_codegen`; ``TENSORFUSE_TEST_LLVM_MEMO=0`` switches it off).
* ``tests/cuda/`` (the cuda target under the CUDA simulator) is collected only by ``make test-cuda``
  (``NUMBA_ENABLE_CUDASIM=1``) or on a GPU (``TENSORFUSE_GPU_TESTS=1``); the PTX tests
  (``test_codegen_cuda_ptx.py``, ``test_ptx_gate.py``) only by its PTX gate (``TENSORFUSE_PTX_TESTS=1``).
* ``shared_models`` fixture: the folder ../shared/models beside the checkout. Tests that need it
  skip with a visible reason where it is absent (a user's own clone) and fail instead when
  ``TENSORFUSE_REQUIRE_SHARED=1`` (which .ci/run sets).
* :data:`HEAVY_IDS`: fixture-parametrised tests marked ``heavy`` by id (out of ``make test``).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

SHARED_MODELS = ROOT.parent / "shared" / "models"

os.environ.setdefault("TENSORFUSE_DEBUG", "1")

# tests/cuda/ runs the cuda target's kernels: under numba's CUDA simulator, which must be switched
# on before numba is first imported, so it is its own pytest run (`make test-cuda`, which sets
# NUMBA_ENABLE_CUDASIM=1), or on a real GPU with TENSORFUSE_GPU_TESTS=1 (benchmarks/gpu_check.sh).
# The default run (`make test`) leaves it out.
if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and os.environ.get("TENSORFUSE_GPU_TESTS") != "1":
    collect_ignore = ["cuda"]
# The PTX tests (NVVM compiles for sm_90, no simulator) run with the PTX gate in `make test-cuda`
# (TENSORFUSE_PTX_TESTS=1), which keeps the default run within its time.
# So do the cuda compiles of every shared model (test_cuda_models.py, a simulator subprocess).
if os.environ.get("TENSORFUSE_PTX_TESTS") != "1":
    collect_ignore = globals().get("collect_ignore", []) + ["test_codegen_cuda_ptx.py", "test_ptx_gate.py",
                                                            "test_cuda_models.py"]

# The compile cache (runtime/cache.py) of the whole test session lives in a fresh temporary
# folder, so tests never read or write the user's ~/.cache/tensorfuse. Tests of the cache itself
# point TENSORFUSE_CACHE_DIR at their own tmp_path with monkeypatch.
import atexit as _atexit
import shutil as _shutil
import tempfile as _tempfile

# The first process (pytest itself, or the xdist controller before it starts its workers) makes
# the folder and removes it at exit; xdist workers inherit it through the environment, so a model
# compiled by one test (a light model-zoo graph, say) is a cache hit for the others.
if os.environ.get("TENSORFUSE_TEST_CACHE_OWNER") is None:
    os.environ["TENSORFUSE_TEST_CACHE_OWNER"] = str(os.getpid())
    os.environ["TENSORFUSE_CACHE_DIR"] = _session_cache = _tempfile.mkdtemp(prefix="tensorfuse-test-cache-")
    _atexit.register(_shutil.rmtree, _session_cache, ignore_errors=True)


def _memoize_llvm_codegen(limit_bytes: int = 128 << 20) -> None:
    """Within one test process, LLVM compiles a given LLVM IR text for a given target once.

    ``codegen.llvm.jit._compile_part`` (IR text -> object code and optimised IR text) is a pure
    function of its IR text, module name, optimisation level and target (triple, CPU name and
    feature string; the host's, looked up at the call, for None), and it is most of a small
    compile's time. Tests compile the same IR again and again: a one-op model at O0 and at O2
    (same graph after the passes), the same conv at 1 and 2 threads (the thread count is not
    part of the code), ``codegen_util.optimized_ir`` regenerating a module's optimised IR. Here
    the second and later compiles of the same text get the first one's object code and
    optimised IR (byte for byte what LLVM gave it), least recently used entries dropped past
    ``limit_bytes``; an IR text that LLVM rejects raises each time. Everything before LLVM
    (import, passes, lowering, LLVM IR emission) and after it (linking, running) still runs for
    every compile. ``TENSORFUSE_TEST_LLVM_MEMO=0`` switches it off (about 30% more CPU time for
    the default suite)."""
    if os.environ.get("TENSORFUSE_TEST_LLVM_MEMO", "1").strip() in ("0", ""):
        return
    import collections
    import hashlib

    from tensorfuse.codegen.llvm import jit
    real = jit._compile_part
    memo: collections.OrderedDict = collections.OrderedDict()
    held = [0]

    def _compile_part(ir_text: str, name: str, opt: int, target):
        t = jit._as_target(target)
        if t is None:
            info = jit.host_info()
            where = ("host", info["triple"], info["cpu"], info["features"])
        else:
            where = (str(t), t.triple, t.cpu, t.features)
        key = (hashlib.sha256(ir_text.encode()).digest(), jit.module_name(name), opt, where)
        if key in memo:
            memo.move_to_end(key)
            return memo[key]
        out = real(ir_text, name, opt, target)
        memo[key] = out
        held[0] += len(out[0]) + len(out[1])
        while held[0] > limit_bytes and len(memo) > 1:
            _k, (obj, text) = memo.popitem(last=False)
            held[0] -= len(obj) + len(text)
        return out

    _compile_part.__wrapped__ = real
    jit._compile_part = _compile_part


_memoize_llvm_codegen()


def shared_models_dir() -> pathlib.Path:
    """../shared/models, or skip (fail under TENSORFUSE_REQUIRE_SHARED=1) when absent."""
    if not (SHARED_MODELS / "models.json").exists():
        msg = f"{SHARED_MODELS} is absent: the shared real models are not available in this clone"
        if os.environ.get("TENSORFUSE_REQUIRE_SHARED") == "1":
            pytest.fail(msg + " (TENSORFUSE_REQUIRE_SHARED=1)")
        pytest.skip(msg)
    return SHARED_MODELS


def shared_model_entries() -> list[dict]:
    """Entries of models.json, or [] when absent (the tests then skip via the fixture)."""
    p = SHARED_MODELS / "models.json"
    return json.loads(p.read_text())["models"] if p.exists() else []


@pytest.fixture
def shared_models() -> pathlib.Path:
    return shared_models_dir()


#: the vector widths our machines have, as targets that run on this host: 4 lanes (an SSE
#: target), the host's own, and the 16-lane AVX-512 layout (``vector_bits`` made 512, so the
#: schedules tile for 16 lanes and 32 registers while LLVM splits the vectors for this CPU)
VECTOR_WIDTHS = ("sse-4-lanes", "host", "avx512-16-lanes")


def width_target(name: str, monkeypatch):
    """(Target, f32 lanes) for one of :data:`VECTOR_WIDTHS` (``monkeypatch`` undoes the
    16-lane layout after the test)."""
    import numpy as np

    from tensorfuse.ir.target import Target
    if name == "sse-4-lanes":
        return Target.parse("llvm -mattr=-avx,-avx2,-fma"), 4
    if name == "avx512-16-lanes":
        monkeypatch.setattr(Target, "vector_bits", property(lambda self: 512))
        monkeypatch.setattr(Target, "has_avx512", property(lambda self: True))
        return Target.parse("llvm"), 16
    t = Target.parse("llvm")
    return t, t.lanes(np.float32)


@pytest.fixture(params=VECTOR_WIDTHS)
def vector_width(request, monkeypatch):
    """(Target, f32 lanes) at each of :data:`VECTOR_WIDTHS`."""
    return width_target(request.param, monkeypatch)


#: single parametrisations moved to the heavy run (``make test-heavy``, which CI runs after the
#: default suite, so nothing leaves CI), keeping one representative per axis of a matrix in the
#: default suite's 15 minutes: test names without the file part (``*`` matches any run of characters)
HEAVY_IDS = (
    # the MLP's GELU epilogues on 16-lane register tiles take LLVM several seconds; the 4-lane
    # run stays in the default suite and conv_net / wino_net run at every width
    "test_blocked_schedules_at_each_vector_width[host-mlp]",
    "test_blocked_schedules_at_each_vector_width[avx512-16-lanes-mlp]",
    # the shared panel with s8 activations (u8 with the shared panel, s8 with per-task panels stay)
    "test_conv_int8_vector_pack[shared-*-int8]",
    # the slowest geometries of the sweeps (the others, and the cases that must not fire, stay)
    "test_scale_folds_into_the_conv[kw5]", "test_scale_folds_into_the_conv[kw6]",
    "test_scale_folds_into_the_conv[kw7]", "test_scale_folds_into_the_conv[kw8]",
    "test_gridsample_2d[cubic-reflection-0]",
    "test_gridsample_3d[linear-reflection]",
    "test_conv1d_runs_the_2d_schedules[8-24-33-1-1-0-1-1-False-llvm]",
    # whole-model and whole-tuner runs that others in the default suite repeat in small
    # (bert_mini dynamic and the random QDQ graphs; the tuner's other tests)
    "test_quantized_model_runs_integer_kernels_within_onnxruntimes_error[squeezenet1_1-qdq_u8s8]",
    "test_tune_records_failures_resume_and_tuned_compile",
)


def pytest_collection_modifyitems(config, items):
    """Mark the tests :data:`HEAVY_IDS` names ``heavy``."""
    import re
    heavy = re.compile("|".join(re.escape(p).replace(r"\*", ".*") for p in HEAVY_IDS))
    for item in items:
        if heavy.fullmatch(item.name):
            item.add_marker(pytest.mark.heavy)
