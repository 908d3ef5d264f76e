"""DFT and STFT against onnx.reference (onnxruntime lacks parts of these ops: IRFFT, DFT-20
with an axis input). ONNX spec sections DFT and STFT."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tensorfuse
from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, get_op, run_reference
from tensorfuse.ir.types import TensorType
from tests.oracle import node_model, rand


def _tol(dtype):
    return {np.float64: (1e-9, 1e-9), np.float32: (1e-4, 2e-4), np.float16: (2e-2, 5e-2)}[np.dtype(dtype).type]


def _type_output(model, expected):
    """ONNX shape inference gives no output shape for STFT without window and frame_length, or
    with run-time frame_step: state it (onnx.checker wants a shape) from the expected value."""
    out = model.graph.output[0]
    if not out.type.tensor_type.HasField("shape"):
        from onnx import helper
        out.CopyFrom(helper.make_tensor_value_info(out.name, helper.np_dtype_to_tensor_dtype(expected.dtype),
                                                   expected.shape))
        del model.graph.value_info[:]


def _check(model, inputs, dtype=np.float32, opt_levels=(0,)):
    """Compile at each level, run, compare with onnx.reference (dtype, shape, values)."""
    (expected,) = ReferenceEvaluator(model).run(None, inputs)
    _type_output(model, expected)
    rtol, atol = _tol(dtype)
    scale = max(1.0, float(np.max(np.abs(expected.astype(np.float64))))) if expected.size else 1.0
    got = None
    for lvl in opt_levels:
        mod = tensorfuse.compile(model, target="llvm", opt_level=lvl)
        got = mod.run(**inputs)[0]
        assert got.dtype == expected.dtype, f"O{lvl}: dtype {got.dtype} != {expected.dtype}"
        assert got.shape == expected.shape, f"O{lvl}: shape {got.shape} != {expected.shape}"
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol * scale, err_msg=f"O{lvl}")
    return got


def _dft20(x, axis=None, dft_length=None, **attrs):
    inits, names = {}, ["x", "", ""]
    if dft_length is not None:
        inits["len"] = np.array(dft_length, np.int64)
        names[1] = "len"
    if axis is not None:
        inits["axis"] = np.array(axis, np.int64)
        names[2] = "axis"
    while names[-1] == "":
        names.pop()
    return node_model("DFT", {"x": x}, attrs, opset=20, initializers=inits, input_names=names)


# ----------------------------------------------------------------------------- DFT-20
def _rfft_real(x, inverse, onesided):
    """The forward one-sided DFT (RFFT) takes real input only, the inverse one (IRFFT) complex
    input only (ONNX shape inference rejects the others; see test_dft_outside_spec_inputs)."""
    if onesided and not inverse:
        return np.ascontiguousarray(x[..., :1])
    if onesided and inverse and x.shape[-1] == 1:
        return np.concatenate([x, x[::-1] * 0.5], axis=-1)
    return x


CASES = [((2, 8, 1), None), ((2, 8, 2), 1), ((3, 7, 2), -2), ((2, 5, 3, 1), 1), ((2, 5, 3, 2), 2),
         ((2, 5, 3, 2), -3), ((4, 6, 2), 0), ((6, 1), 0), ((2, 3, 300, 2), 1)]


@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_dft20(shape, axis, inverse, onesided):
    x = _rfft_real(rand(*shape, seed=1), inverse, onesided)
    ax = -2 if axis is None else axis
    if inverse and onesided and shape[ax] == 1:
        pytest.skip("IRFFT of one bin has default length 0 (see test_dft_errors)")
    levels = (0, 2) if (shape, axis) == ((2, 5, 3, 2), 2) else (0,)
    _check(_dft20(x, axis, inverse=inverse, onesided=onesided), {"x": x}, opt_levels=levels)


@pytest.mark.parametrize("length", [1, 3, 6, 8, 9, 13])
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("cin", [1, 2])
def test_dft20_length_pads_or_truncates(length, inverse, onesided, cin):
    x = _rfft_real(rand(2, 8, 3, cin, seed=2), inverse, onesided)
    _check(_dft20(x, 1, length, inverse=inverse, onesided=onesided), {"x": x})


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 1), (0, 1)])
def test_dft20_dtypes(dtype, inverse, onesided):
    x = _rfft_real(rand(2, 10, 2, dtype=dtype, seed=3), inverse, onesided)
    _check(_dft20(x, 1, inverse=inverse, onesided=onesided), {"x": x}, dtype=dtype)


def test_dft20_round_trip():
    """ifft(fft(x)) == x, and irfft(rfft(x), n) == x for a real signal."""
    x = rand(3, 9, 2, dtype=np.float64, seed=4)
    f = tensorfuse.compile(_dft20(x, 1), target="llvm").run(x=x)[0]
    back = tensorfuse.compile(_dft20(f, 1, inverse=1), target="llvm").run(x=f)[0]
    np.testing.assert_allclose(back, x, rtol=1e-12, atol=1e-12)
    r = x[..., :1].copy()
    s = tensorfuse.compile(_dft20(r, 1, onesided=1), target="llvm").run(x=r)[0]
    assert s.shape == (3, 5, 2)
    back = tensorfuse.compile(_dft20(s, 1, 9, inverse=1, onesided=1), target="llvm").run(x=s)[0]
    np.testing.assert_allclose(back, r, rtol=1e-12, atol=1e-12)


def test_dft20_numpy_values():
    """The spec's formula directly: y[k] = sum_n x[n] exp(-2 pi i k n / N)."""
    x = rand(4, 7, 2, dtype=np.float64, seed=5)
    c = x[..., 0] + 1j * x[..., 1]
    y = tensorfuse.compile(_dft20(x, 1), target="llvm").run(x=x)[0]
    n = np.arange(7)
    w = np.exp(-2j * np.pi * np.outer(n, n) / 7)
    exp = np.einsum("kn,bn->bk", w, c)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], exp, rtol=1e-12, atol=1e-12)


def test_dft20_runtime_length_and_axis_specialise():
    """dft_length / axis as graph inputs: compiled for the values given at the first run."""
    x = rand(2, 6, 4, 2, seed=6)
    m = node_model("DFT", {"x": x, "len": np.array(5, np.int64), "axis": np.array(2, np.int64)},
                   {}, opset=20)
    ins = {"x": x, "len": np.array(5, np.int64), "axis": np.array(2, np.int64)}
    (expected,) = ReferenceEvaluator(m).run(None, ins)
    got = tensorfuse.compile(m, target="llvm").run(**ins)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin,inverse,onesided,out_shape", [(2, 0, 1, (2, 4, 3, 2)), (1, 1, 1, (2, 10, 3, 1))])
def test_dft_outside_spec_inputs(cin, inverse, onesided, out_shape):
    """Like onnx.reference: RFFT of a complex input (full DFT cut to L//2+1 bins) and IRFFT of
    a real input (imaginary parts 0). ONNX shape inference leaves the output untyped, so the
    model states it."""
    from onnx import TensorProto, helper
    x = rand(2, 6, 3, cin, dtype=np.float64, seed=13)
    m = _dft20(x, 1, inverse=inverse, onesided=onesided)
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.DOUBLE, out_shape))
    got = tensorfuse.compile(m, target="llvm").run(x=x)[0]
    c = x[..., 0] + (1j * x[..., 1] if cin == 2 else 0)
    if inverse:
        exp = np.fft.irfft(c, n=10, axis=1)[..., None]
    else:
        f = np.fft.fft(c, axis=1)[:, :4]
        exp = np.stack([f.real, f.imag], axis=-1)
    np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    g, xi = _g(x.shape, np.float64)
    out = Builder(g).op("DFT", xi, None, g.add_const(np.array(1, np.int64)), inverse=inverse, onesided=onesided)
    np.testing.assert_allclose(run_reference(out.producer, [x, None, np.array(1)])[0], exp, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- DFT-17
@pytest.mark.parametrize("attrs", [{}, {"axis": 2}, {"axis": -2}, {"axis": 1, "inverse": 1},
                                   {"axis": 1, "onesided": 1}, {"axis": 2, "onesided": 1, "inverse": 1}])
@pytest.mark.parametrize("length", [None, 7])
def test_dft17(attrs, length):
    x = _rfft_real(rand(2, 6, 5, 2, seed=7), attrs.get("inverse", 0), attrs.get("onesided", 0))
    inits = {} if length is None else {"len": np.array(length, np.int64)}
    m = node_model("DFT", {"x": x}, attrs, opset=17, initializers=inits)
    _check(m, {"x": x}, opt_levels=(0, 2) if attrs == {} else (0,))


# ----------------------------------------------------------------------------- errors / reference
def _g(shape, dtype=np.float32):
    g = Graph()
    return g, g.add_input("x", TensorType.of(np.zeros(shape, dtype)))


@pytest.mark.parametrize("shape,axis,length,attrs,msg", [
    ((2, 4, 3), None, None, {}, "last dimension must be 1"),
    ((4,), None, None, {}, "rank >= 2"),
    ((2, 4, 2), -1, None, {}, "out of range"),
    ((2, 4, 2), 2, None, {}, "out of range"),
    ((2, 4, 2), -4, None, {}, "out of range"),
    ((2, 4, 2), 1, 0, {}, "dft_length must be >= 1"),
    ((2, 1, 2), 1, None, {"inverse": 1, "onesided": 1}, "dft_length must be >= 1"),
])
def test_dft_errors(shape, axis, length, attrs, msg):
    g, x = _g(shape)
    ins = [x, None if length is None else g.add_const(np.array(length, np.int64)),
           None if axis is None else g.add_const(np.array(axis, np.int64))]
    while ins[-1] is None:
        ins.pop()
    with pytest.raises(ShapeError, match=msg):
        Builder(g).op("DFT", *ins, **attrs)


def test_dft_errors_dtype_and_runtime_length():
    g, x = _g((2, 4, 2), np.int32)
    with pytest.raises(ShapeError, match="not supported"):
        Builder(g).DFT(x)
    g, x = _g((2, 4, 2))
    n = g.add_input("n", TensorType.of(np.array(3, np.int64)))
    with pytest.raises(ShapeError, match="compile time"):
        Builder(g).DFT(x, n)


@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_dft_reference_matches_onnx_reference(inverse, onesided):
    x = rand(3, 6, 4, 2, seed=8)
    g, xi = _g(x.shape)
    out = Builder(g).op("DFT", xi, g.add_const(np.array(7, np.int64)), g.add_const(np.array(2, np.int64)),
                        inverse=inverse, onesided=onesided)
    got = run_reference(out.producer, [x, np.array(7, np.int64), np.array(2, np.int64)])[0]
    (exp,) = ReferenceEvaluator(_dft20(x, 2, 7, inverse=inverse, onesided=onesided)).run(None, {"x": x})
    assert got.dtype == exp.dtype and got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
    assert get_op("DFT").flops(out.producer) > 0


# ----------------------------------------------------------------------------- STFT
def _stft(x, step, window=None, length=None, **attrs):
    inits = {"step": np.array(step, np.int64)}
    names = ["x", "step", "", ""]
    if window is not None:
        inits["window"] = window
        names[2] = "window"
    if length is not None:
        inits["length"] = np.array(length, np.int64)
        names[3] = "length"
    while names[-1] == "":
        names.pop()
    return node_model("STFT", {"x": x}, attrs, opset=17, initializers=inits, input_names=names)


def _hann(n, dtype=np.float32):
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(dtype)


@pytest.mark.parametrize("shape", [(1, 64, 1), (2, 37, 2)])
@pytest.mark.parametrize("step,win,length", [(8, 16, None), (5, None, 12), (3, 10, 10), (4, None, None),
                                             (1, 7, None)])
@pytest.mark.parametrize("onesided", [0, 1])
def test_stft(shape, step, win, length, onesided):
    x = rand(*shape, seed=9)
    w = None if win is None else _hann(win)
    levels = (0, 2) if (shape, step) == ((2, 37, 2), 8) else (0,)
    _check(_stft(x, step, w, length, onesided=onesided), {"x": x}, opt_levels=levels)


def test_stft_window_runtime_and_f64():
    """The window may be a run-time input; f64 signals compute to f64 precision."""
    x = rand(2, 40, 1, dtype=np.float64, seed=10)
    w = _hann(8, np.float64)
    m = node_model("STFT", {"x": x, "window": w}, {}, opset=17,
                   initializers={"step": np.array(4, np.int64)}, input_names=["x", "step", "window"])
    _check(m, {"x": x, "window": w}, dtype=np.float64)


def test_stft_runtime_step_specialises():
    x = rand(1, 50, 1, seed=11)
    ins = {"x": x, "step": np.array(6, np.int64), "length": np.array(10, np.int64)}
    m = node_model("STFT", ins, {}, opset=17, input_names=["x", "step", "", "length"])
    (expected,) = ReferenceEvaluator(m).run(None, ins)
    _type_output(m, expected)
    got = tensorfuse.compile(m, target="llvm").run(**ins)[0]
    assert got.shape == (1, 7, 6, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,step,win,length,msg", [
    ((1, 16), 4, None, None, "shape \\[batch, signal_length, 1 or 2\\]"),
    ((1, 16, 3), 4, None, None, "shape \\[batch, signal_length, 1 or 2\\]"),
    ((1, 16, 1), 0, None, None, "frame_step must be >= 1"),
    ((1, 16, 1), 4, None, 20, "longer than the signal"),
    ((1, 16, 1), 4, None, 0, "frame_length must be >= 1"),
    ((1, 16, 1), 4, 8, 6, "differs from frame_length"),
])
def test_stft_errors(shape, step, win, length, msg):
    g, x = _g(shape)
    ins = [x, g.add_const(np.array(step, np.int64)),
           None if win is None else g.add_const(np.ones(win, np.float32)),
           None if length is None else g.add_const(np.array(length, np.int64))]
    while ins[-1] is None:
        ins.pop()
    with pytest.raises(ShapeError, match=msg):
        Builder(g).op("STFT", *ins)


def test_stft_reference_matches_onnx_reference():
    x = rand(2, 30, 2, seed=12)
    w = _hann(8)
    g, xi = _g(x.shape)
    out = Builder(g).op("STFT", xi, g.add_const(np.array(3, np.int64)), g.add_const(w), onesided=0)
    got = run_reference(out.producer, [x, np.array(3, np.int64), w, None])[0]
    (exp,) = ReferenceEvaluator(_stft(x, 3, w, onesided=0)).run(None, {"x": x})
    assert got.dtype == exp.dtype and got.shape == exp.shape == (2, 8, 8, 2)
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
