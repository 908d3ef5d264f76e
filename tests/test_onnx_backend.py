"""The ONNX backend test suite through the standard interface (``onnx.backend.test.BackendTest``).

By default the *core subset* runs: tests whose graph inputs and outputs are all float32, int64 or
bool tensors (as ``../shared/tools/onnx_conformance.py --only-float32`` selects them), over the
node, simple, pytorch-converted and pytorch-operator categories (1436 tests with onnx 1.23).
The real category (the light model zoo) runs with ``TENSORFUSE_BACKEND_ALL=1``, which runs every
test; by default ``tests/test_models.py`` compiles those nine models once and compares them with
onnxruntime, so CI does not pay for compiling them twice. Tests listed in ``onnx_backend_excludes.txt`` are
excluded, each with its reason there.

CUDA variants (``..._cuda``) run where ``supports_device("CUDA")`` holds: on a GPU, or under numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``; ``make conformance-cuda`` runs them there, outside the
default suite since the simulator is slow). ``onnx_backend_cuda_excludes.txt`` lists the tests that
fail on device CUDA only, each with its reason; its patterns exclude ``_cuda`` variants and never
a ``_cpu`` one.
"""
from __future__ import annotations

import os
import pathlib
import re
import tempfile
import warnings

import onnx
import onnx.backend.test
import pytest
from onnx.backend.test.loader import load_model_tests

from tensorfuse.backend import TensorfuseBackend

HERE = pathlib.Path(__file__).resolve().parent
CORE_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL}
CUDA_EXCLUDES = HERE / "onnx_backend_cuda_excludes.txt"
KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")

# onnx's runner caches light models under $ONNX_HOME; keep that out of the user's home
os.environ.setdefault("ONNX_HOME", os.path.join(tempfile.gettempdir(), "tensorfuse-onnx-home"))


def _is_core(case) -> bool:
    """Graph inputs (not initializers) and outputs all float32/int64/bool tensors, as the
    conformance tool's --only-float32 decides. simple/ and pytorch-*/ cases are files on disk."""
    model = case.model
    if model is None and case.model_dir:
        model = onnx.load(os.path.join(case.model_dir, "model.onnx"), load_external_data=False)
    if model is None:                      # real/: light models with float32 inputs and outputs
        return True
    inits = {t.name for t in model.graph.initializer}
    vis = [i for i in model.graph.input if i.name not in inits] + list(model.graph.output)
    for vi in vis:
        if vi.type.WhichOneof("value") != "tensor_type" or vi.type.tensor_type.elem_type not in CORE_TYPES:
            return False
    return True


def read_excludes(path: pathlib.Path = HERE / "onnx_backend_excludes.txt") -> dict[str, str]:
    """{test-name regex: reason} from the exclude file (``regex  # reason`` per line)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pat, _, reason = line.partition("#")
        if not reason.strip():
            raise ValueError(f"exclude {pat.strip()!r} has no reason in {path.name}")
        out[pat.strip()] = reason.strip()
    return out


def cuda_only(pattern: str) -> str:
    """``pattern`` restricted to ``..._cuda`` test names (for the CUDA-only exclude file)."""
    return rf"(?=.*_cuda$)(?:{pattern})"


def _non_core_names() -> list[str]:
    names = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in KINDS:
            for case in load_model_tests(kind=kind):
                if not _is_core(case):
                    names.append(case.name)
    return names


def _real_names() -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [case.name for case in load_model_tests(kind="real")]


backend_test = onnx.backend.test.BackendTest(TensorfuseBackend, __name__)
for _pattern in read_excludes():
    backend_test.exclude(_pattern)
for _pattern in read_excludes(CUDA_EXCLUDES):
    backend_test.exclude(cuda_only(_pattern))
#: Tests outside the core subset that run by default all the same: the quantization ops'
#: (u8/i8 inputs or outputs), whose conformance issue 23 asks for
DEFAULT_NON_CORE = re.compile(r"^test_(quantizelinear|dequantizelinear|dynamicquantizelinear|qlinearconv|"
                              r"qlinearmatmul|convinteger|matmulinteger)")
if os.environ.get("TENSORFUSE_BACKEND_ALL") != "1":
    for _name in _non_core_names() + _real_names():
        if not DEFAULT_NON_CORE.match(_name):
            backend_test.exclude(rf"^{re.escape(_name)}_(cpu|cuda)$")

#: The expanded forms (the op's ONNX function body, 50-150 primitive nodes) of Attention,
#: LinearAttention and RotaryEmbedding cost 0.5-2.4 CPU-seconds each, 107 CPU-seconds together,
#: the most of any tests here: ``make test`` runs the op's own test of every case and the
#: expanded form of the representatives below (each feature once: 3d and 4d inputs, GQA,
#: causal, boolean and float masks, past/present, qk_matmul outputs, softcap, local windows,
#: the fully-masked-row robustness cases; gated delta rule; interleaved and partial rotary);
#: the other expanded forms are marked heavy, so ``make test-heavy`` (run by .ci/run) runs them.
HEAVY_EXPANDED = re.compile(r"^test_(attention|linear_attention|rotary_embedding)\w*_expanded_(cpu|cuda)$")
DEFAULT_EXPANDED = {
    "test_attention_3d_expanded", "test_attention_4d_expanded", "test_attention_4d_gqa_expanded",
    "test_attention_4d_causal_expanded", "test_attention_4d_attn_mask_bool_expanded",
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal_expanded",
    "test_attention_4d_softcap_expanded", "test_attention_local_window_expanded",
    "test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded",
    "test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded",
    "test_attention_24_fullymasked_qk_matmul_output_mode3_zero_expanded",
    "test_attention_causal_boolmask_nan_robustness_expanded", "test_attention_bidirectional_window_expanded",
    "test_linear_attention_linear_expanded", "test_linear_attention_gated_delta_expanded",
    "test_rotary_embedding_expanded", "test_rotary_embedding_with_interleaved_rotary_dim_expanded",
}
for _case in backend_test.test_cases.values():
    for _name in list(vars(_case)):
        if HEAVY_EXPANDED.match(_name) and _name.rsplit("_", 1)[0] not in DEFAULT_EXPANDED:
            setattr(_case, _name, pytest.mark.heavy(getattr(_case, _name)))

globals().update(backend_test.test_cases)


def test_every_exclude_has_a_reason_and_matches_a_test():
    excludes = read_excludes()
    names = set()
    for cat in backend_test._test_items.values():
        names.update(cat)
    for pat in excludes:
        assert any(re.search(pat, n) for n in names), f"exclude {pat!r} matches no test"
    for pat in read_excludes(CUDA_EXCLUDES):
        hits = [n for n in names if re.search(cuda_only(pat), n)]
        assert hits, f"cuda exclude {pat!r} matches no _cuda test"
        assert not any(re.search(cuda_only(pat), n) for n in names if n.endswith("_cpu"))


def test_backend_interface_run_node_and_devices():
    import numpy as np
    from tensorfuse import backend
    node = onnx.helper.make_node("Add", ["a", "b"], ["c"])
    (c,) = backend.run_node(node, [np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)])
    np.testing.assert_array_equal(c, np.ones((2, 3)) + np.arange(3))
    assert backend.supports_device("CPU")
    assert not backend.supports_device("TPU")


def test_backend_prepare_dynamic_shapes_compiles_at_run():
    import numpy as np
    from tensorfuse import backend
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 3])
    m = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                               opset_imports=[onnx.helper.make_opsetid("", 17)])
    rep = backend.prepare(m, "CPU")
    a = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(rep.run([a])[0], np.maximum(a, 0))
    np.testing.assert_array_equal(rep.run({"x": a[:1]}).y, np.maximum(a[:1], 0))
