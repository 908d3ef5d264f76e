"""Issue 9 defect 6: NaN in max/min-like ops. The rule (README "NaN in max/min-like ops"):
reductions and windows (ReduceMax, ReduceMin, MaxPool, GlobalMaxPool) skip NaN (IEEE 754
maxNum / minNum, numpy.fmax / fmin): NaN only where every element is NaN; Clip keeps a NaN input
and a NaN bound clips nothing; elementwise Max / Min and Relu propagate NaN. onnxruntime agrees
wherever its own result does not depend on the order it visits elements in (its MaxPool and
ReduceMax keep a NaN they meet first or last, so it has no single rule)."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse
from oracle import assert_matches_ort, node_model, ort_run, rand

LEVELS = (0, 2)


def _run(model, feeds, lvl):
    return tensorfuse.compile(model, opt_level=lvl, cache=False).run(**feeds)[0]


def _with_nans(shape, where, seed=0):
    x = rand(*shape, seed=seed)
    for idx in where:
        x[idx] = np.nan
    return x


# -- against onnxruntime: NaN where ORT's result is order-independent ------------------------------
def test_global_max_pool_one_nan_pixel_matches_onnxruntime():
    # the squeezenet case: one NaN pixel must not make the channel's max NaN
    x = _with_nans((1, 4, 13, 13), [(0, 1, 6, 6), (0, 3, 0, 5)])
    m = node_model("GlobalMaxPool", {"x": x})
    got = assert_matches_ort(m, {"x": x}, opt_levels=LEVELS, cache=False)[0]
    assert np.isfinite(got).all()


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_with_nan_inside_the_slice_matches_onnxruntime(op):
    x = _with_nans((3, 37), [(0, 5), (1, 20), (1, 36), (2, 1)])     # never a slice's first element
    m = node_model(op, {"x": x}, dict(keepdims=0), initializers={"axes": np.array([1], np.int64)}, opset=18)
    got = assert_matches_ort(m, {"x": x}, opt_levels=LEVELS, cache=False)[0]
    assert np.isfinite(got).all()


def test_max_pool_nan_first_in_its_window_matches_onnxruntime():
    x = _with_nans((1, 2, 8, 8), [(0, 0, 0, 0), (0, 1, 2, 4), (0, 1, 6, 2)])   # top-left of 2x2 windows
    m = node_model("MaxPool", {"x": x}, dict(kernel_shape=[2, 2], strides=[2, 2]))
    got = assert_matches_ort(m, {"x": x}, opt_levels=LEVELS, cache=False)[0]
    assert np.isfinite(got).all()


@pytest.mark.parametrize("lo,hi", [(np.nan, 0.5), (-0.5, np.nan), (np.nan, np.nan), (1.0, -1.0)])
def test_clip_nan_bounds_match_onnxruntime(lo, hi):
    x = _with_nans((4, 19), [(0, 3), (2, 18)])
    m = node_model("Clip", {"x": x}, initializers={"lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)})
    got = assert_matches_ort(m, {"x": x}, opt_levels=LEVELS, cache=False)[0]
    assert np.isnan(got[0, 3]) and np.isnan(got[2, 18])              # a NaN input stays NaN


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_elementwise_max_min_propagate_nan_as_onnxruntime(op):
    a, b = _with_nans((3, 17), [(0, 0), (2, 9)]), _with_nans((3, 17), [(1, 4)], seed=1)
    m = node_model(op, {"a": a, "b": b})
    got = assert_matches_ort(m, {"a": a, "b": b}, opt_levels=LEVELS, cache=False)[0]
    assert np.isnan(got[0, 0]) and np.isnan(got[1, 4]) and np.isnan(got[2, 9])


# -- the rule itself, against numpy.fmax / fmin (corner cases where ORT depends on order) ------------
def _fmax_pool2d(x, k, s):
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    y = np.full((n, c, oh, ow), np.nan, x.dtype)
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = np.fmax.reduce(x[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, -1), axis=2)
    return y


@pytest.mark.parametrize("shape,k,s,indices", [((1, 3, 20, 37), 3, 1, False), ((1, 3, 20, 37), 3, 2, False),
                                               ((2, 2, 9, 9), 2, 2, True)])
@pytest.mark.parametrize("lvl", LEVELS)
def test_max_pool_skips_nan(shape, k, s, indices, lvl):
    x = rand(*shape)
    x[0, 0, :3, :3] = np.nan                      # a whole window of NaN: NaN
    x[0, 1, 5, :] = np.nan                        # NaN first, last and inside windows: skipped
    x[0, 1, 2:9, 7] = np.nan
    outs = ("y", "i") if indices else ("y",)
    m = node_model("MaxPool", {"x": x}, dict(kernel_shape=[k, k], strides=[s, s]), outputs=outs)
    got = tensorfuse.compile(m, opt_level=lvl, cache=False).run(x)[0]
    want = _fmax_pool2d(x, k, s)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[0, 0, 0, 0]) and np.isfinite(got[0, 1]).all()


@pytest.mark.parametrize("lvl", LEVELS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 2, 64, 64)])   # scalar and vector kernels
def test_global_max_pool_skips_nan(shape, lvl):
    x = rand(*shape)
    x[0, 0] = np.nan                              # a plane of NaN: NaN
    x[0, 1, 0, 0] = np.nan                        # first element NaN: skipped
    x[-1, -1, -1, -1] = np.nan                    # last element NaN: skipped
    got = _run(node_model("GlobalMaxPool", {"x": x}), {"x": x}, lvl)
    np.testing.assert_array_equal(got, np.fmax.reduce(x.reshape(*shape[:2], -1), axis=2)[..., None, None])
    assert np.isnan(got[0, 0]).all() and np.isfinite(got[0, 1:]).all()


@pytest.mark.parametrize("op,ufunc", [("ReduceMax", np.fmax), ("ReduceMin", np.fmin)])
@pytest.mark.parametrize("axes", [[1], [0], [0, 2]])
@pytest.mark.parametrize("lvl", LEVELS)
def test_reduce_skips_nan(op, ufunc, axes, lvl):
    x = rand(4, 6, 33)
    x[0, :, 0] = np.nan
    x[:, 0, :] = np.nan
    x[1, 2, 5] = np.nan
    x[:, :, 7] = np.nan
    m = node_model(op, {"x": x}, dict(keepdims=1), initializers={"axes": np.array(axes, np.int64)}, opset=18)
    got = _run(m, {"x": x}, lvl)
    np.testing.assert_array_equal(got, ufunc.reduce(x, axis=tuple(axes), keepdims=True))


def test_reduce_max_empty_slice_is_lowest():
    x = np.zeros((3, 0), np.float32)
    m = node_model("ReduceMax", {"x": x}, dict(keepdims=0), initializers={"axes": np.array([1], np.int64)}, opset=18)
    np.testing.assert_array_equal(_run(m, {"x": x}, 0), ort_run(m, {"x": x})[0])


@pytest.mark.parametrize("lo,hi", [(np.nan, 0.5), (0.0, np.nan)])
def test_clip_fused_into_conv_keeps_the_rule(lo, hi):
    # at O2 the Clip becomes FusedConv's activation epilogue: the same NaN rule applies there
    from onnx import helper
    from oracle import ort_run as _ort
    x, w = rand(1, 3, 8, 8), rand(4, 3, 3, 3, seed=1)
    x[0, 1, 4, 4] = np.nan
    m = node_model("Conv", {"x": x}, initializers={"w": w}, outputs=("c",))
    g = m.graph
    g.initializer.extend([helper.make_tensor("lo", 1, [], [lo]), helper.make_tensor("hi", 1, [], [hi])])
    g.node.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("y", 1, [1, 4, 6, 6]))
    mod = tensorfuse.compile(m, opt_level=2, cache=False)
    assert any(n.op == "FusedConv" for n in mod.graph.nodes)
    got, want = mod.run(x)[0], _ort(m, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got).any() and not np.isnan(got).all()
