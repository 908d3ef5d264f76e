"""The tensor-core (TF32 ``mma.sync``) path of the cuda GEMM and implicit-GEMM conv
(``codegen/cuda/mma.py``, ``codegen/cuda/schedules/gemm.py``) and the ``precision`` option, under
numba's CUDA simulator, where the micro-kernel runs as Python with the same warp-level
fragment exchange and TF32 operand rounding.

Tolerances (docs/cuda.md, "Precision"), against onnxruntime's float32 result ``ref``:

- ``fp32``: ``rtol = atol = 1e-4`` (float32 products and sums, a different summation order);
- ``tf32``: elementwise ``|got - ref| <= (2**-10 + K * 2**-24) * sum_k |a_ik| |b_kj| + 1e-6``: each
  operand rounded to 10 mantissa bits (relative error <= 2**-11 each, so <= 2**-10 per product),
  float32 accumulation of K terms; ``sum_k |a||b|`` is onnxruntime's result on the absolute
  values. Random N(0, 1) data at K of a few hundred gives errors around 1e-3 of that sum.

Shapes are tiny (a Python thread per simulated GPU thread) but cross tile edges, and one is
split-K.
"""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cuda_util as cu  # noqa: E402
from oracle import node_model, ort_run, rand  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _lower(model, level: int, precision):
    from tensorfuse.codegen.cuda.mma import precision_scope
    with precision_scope(precision):
        return cu.lower_cuda(model, level)


def _gemm_kernels(lg):
    """The tiled GEMM kernels (not a split-K sum kernel)."""
    return [k for k in lg.kernels if "output tiles" in k.comment]


def _precision(k) -> str:
    return "tf32" if "TF32 mma.sync" in k.comment else "fp32"


def _tf32_bound(abs_ref: np.ndarray, K: int) -> np.ndarray:
    return (2.0 ** -10 + K * 2.0 ** -24) * abs_ref + 1e-6


def _tf32_round_spec(x: np.ndarray) -> np.ndarray:
    """TF32 per the PTX ISA's cvt.rna written out in integers: keep 10 mantissa bits, round to
    nearest, ties away from zero (an independent check of ``mma.round_tf32``)."""
    out = []
    for v in np.asarray(x, np.float32).ravel():
        b = int(v.view(np.uint32))
        low = b & 0x1FFF
        b &= ~0x1FFF & 0xFFFFFFFF
        if low >= 0x1000:
            b += 0x2000
        out.append(np.uint32(b).view(np.float32))
    return np.array(out, np.float32).reshape(np.shape(x))


def test_round_tf32_is_cvt_rna():
    from tensorfuse.codegen.cuda.mma import round_tf32
    one = np.float32(1.0)
    ulp = 2.0 ** -10                                      # TF32's spacing at 1
    cases = np.array([1 + 2 ** -11, 1 + 2 ** -12, 1 + 3 * 2 ** -12, -(1 + 2 ** -11), 3.0, 0.0], np.float32)
    want = np.array([1 + ulp, 1, 1 + ulp, -(1 + ulp), 3.0, 0.0], np.float32)   # ties away from zero
    np.testing.assert_array_equal(round_tf32(cases), want)
    x = rand(1000)
    np.testing.assert_array_equal(round_tf32(x), _tf32_round_spec(x))
    assert np.isnan(round_tf32(np.float32("nan"))) and round_tf32(np.float32("inf")) == np.inf
    assert one == round_tf32(one)


def test_precision_option_is_checked_and_keyed():
    from tensorfuse.compiler.options import CompileOptions
    with pytest.raises(ValueError, match="precision must be one of"):
        CompileOptions.create("cuda", precision="bf16")
    with pytest.raises(ValueError, match="target 'cuda' only"):
        CompileOptions.create("llvm", precision="tf32")
    assert CompileOptions.create("llvm", precision="fp32").precision == "fp32"
    o = CompileOptions.create("cuda", precision="tf32")
    assert o.precision == "tf32" and o.key_options()["precision"] == "tf32"
    assert "precision" not in CompileOptions.create("cuda").key_options()     # old keys unchanged


def _conv_model():
    # 2 x 6 x 7 = 84 output pixels (three 32-tiles, the last partial), 24 output channels
    # (a partial tile), K = 3 * 3 * 6 = 54 (a partial 16-deep slice)
    x = rand(2, 6, 6, 7)
    w = rand(24, 6, 3, 3, seed=1)
    m = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": w, "b": rand(24, seed=2)})
    mabs = node_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers={"w": np.abs(w)})
    return m, x, ort_run(mabs, {"x": np.abs(x)})[0], 54


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_conv_each_precision_at_its_tolerance(precision):
    m, x, abs_ref, K = _conv_model()
    lg = _lower(m, 2, precision)
    (k,) = _gemm_kernels(lg)
    assert _precision(k) == precision
    got = cu.run_lowered(lg, [x])[0]
    ref = ort_run(m, {"x": x})[0]
    if precision == "fp32":
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    else:
        err = np.abs(got - ref)
        assert np.all(err <= _tf32_bound(abs_ref, K)), float(np.max(err / _tf32_bound(abs_ref, K)))
        assert np.max(err) > 1e-6          # the operands really were rounded: not the fp32 result


@pytest.mark.parametrize("level", [0, 2])
def test_matmul_tf32_split_k(level):
    """A 20 x 136 x 24 MatMul: one (partial) 32-tile, K = 136 in 9 slices of 16 (the last
    partial), so split-K (S = 2, the second split shorter) with its partial kernel on tensor
    cores and the sum kernel after it."""
    a, b = rand(20, 136), rand(136, 24, seed=3)
    m = node_model("MatMul", {"a": a}, initializers={"b": b})
    lg = _lower(m, level, "tf32")
    (k,) = _gemm_kernels(lg)
    assert _precision(k) == "tf32" and k.knobs["split_k"] > 1, k.knobs
    assert len(lg.kernels) == 2               # partials, then their sum
    got = cu.run_lowered(lg, [a])[0]
    ref = ort_run(m, {"a": a})[0]
    bound = _tf32_bound(np.abs(a) @ np.abs(b), 136)
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / bound))


def test_auto_follows_pytorch_convention():
    """"auto": TF32 for the convolution (cuDNN's allow_tf32 default), FP32 for MatMul (PyTorch's
    matmul default); without the option every GEMM is FP32."""
    m, *_ = _conv_model()
    a = rand(32, 40)
    mm = node_model("MatMul", {"a": a}, initializers={"b": rand(40, 24, seed=3)})
    assert [_precision(k) for k in _gemm_kernels(_lower(m, 2, "auto"))] == ["tf32"]
    assert [_precision(k) for k in _gemm_kernels(_lower(mm, 2, "auto"))] == ["fp32"]
    assert [_precision(k) for k in _gemm_kernels(_lower(m, 2, None))] == ["fp32"]


def test_compile_records_precision(tmp_path):
    import tensorfuse
    a = rand(32, 40)
    mm = node_model("MatMul", {"a": a}, initializers={"b": rand(40, 24, seed=3)})
    mod = tensorfuse.compile(mm, target="cuda", precision="tf32", cache=False)
    got = mod.run(a)[0]
    ref = ort_run(mm, {"a": a})[0]
    bound = _tf32_bound(np.abs(a) @ np.abs(rand(40, 24, seed=3)), 40)
    assert np.all(np.abs(got - ref) <= bound)
    assert [_precision(k) for k in mod.report.kernels if "output tiles" in k.comment] == ["tf32"]


@pytest.mark.parametrize("knobs,frags", [({"tile": 32, "thread_tile": 2}, "16x8")])
def test_register_tile_2_warp_tiles(knobs, frags):
    """The 1x1 warp tile (register tile 2) besides the default 1x4 (register tile 8 is not
    offered with TF32: it spills): a 40 x 24 x 40 MatMul (partial tiles, K in three 16-deep
    slices, the last partial)."""
    from knob_util import Fixed
    from tensorfuse.codegen.cuda.mma import precision_scope
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    a, b = rand(40, 40), rand(40, 24, seed=5)
    m = node_model("MatMul", {"a": a}, initializers={"b": b})
    g = import_onnx(m)
    optimize(g, 2, target=Target.parse("cuda"))
    with precision_scope("tf32"):
        lg = lower_graph(g, Target.parse("cuda"), tuning=Fixed(knobs))
    (k,) = _gemm_kernels(lg)
    assert f"warp tiles of {frags}" in k.comment and k.knobs["thread_tile"] == knobs["thread_tile"], k.comment
    got = cu.run_lowered(lg, [a])[0]
    ref = ort_run(m, {"a": a})[0]
    bound = _tf32_bound(np.abs(a) @ np.abs(b), 40)
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / bound))
