"""The blocked schedules at every vector width our machines have: 4 lanes (SSE, a real target
here), 8 (AVX2) and 16 (AVX-512). The 16-lane layout is checked on any host by a target whose
``vector_bits`` says 512 while LLVM still generates for this CPU (it splits each 16-lane vector
into what the CPU has): the tiles, packing and tails of the 16-lane case then run here too.
Every model is compared with onnxruntime (optimisations off)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from oracle import ort_run

RTOL, ATOL = 1e-4, 1e-4


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _c(rng, name, *shape, scale=0.2):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def conv_net():
    """3x3 conv (blocked), a 1x1 conv with a residual Add (pointwise), depthwise convs (stride 1
    with Clip, stride 2), a conv with channels not a multiple of any width, then Gemm."""
    rng = np.random.default_rng(0)
    N = helper.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"]),
             N("Conv", ["r1", "w2", "b2"], ["c2"]), N("Add", ["c2", "r1"], ["s2"]), N("Relu", ["s2"], ["r2"]),
             N("Conv", ["r2", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], group=40), N("Clip", ["cd", "lo", "hi"], ["rd"]),
             N("Conv", ["rd", "wd2"], ["cd2"], pads=[1, 1, 1, 1], strides=[2, 2], group=40),
             N("Conv", ["cd2", "w3"], ["c3"], pads=[1, 1, 1, 1]), N("Sigmoid", ["c3"], ["r3"]),
             N("GlobalAveragePool", ["r3"], ["g"]), N("Flatten", ["g"], ["f"]),
             N("Gemm", ["f", "wg", "bg"], ["y"], transB=1)]
    inits = [_c(rng, "w1", 40, 5, 3, 3), _c(rng, "b1", 40), _c(rng, "w2", 40, 40, 1, 1), _c(rng, "b2", 40),
             _c(rng, "wd", 40, 1, 3, 3), _c(rng, "bd", 40), _c(rng, "wd2", 40, 1, 3, 3),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
             _c(rng, "w3", 21, 40, 3, 3), _c(rng, "wg", 37, 21), _c(rng, "bg", 37)]
    return _model(nodes, [("x", [2, 5, 19, 23])], [("y", [2, 37])], inits), {"x": rng.standard_normal((2, 5, 19, 23)).astype(np.float32)}


def wino_net():
    """Two 3x3 stride-1 convs on a plane wide enough for Winograd F(2x2, 3x3) at every width
    (17 tiles per row: three vectors of 8 tiles at 16 lanes, the last partial), odd height,
    output channels not a multiple of any width, a residual Add and Relu."""
    rng = np.random.default_rng(2)
    N = helper.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"]),
             N("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), N("Add", ["c2", "x"], ["s"]),
             N("Relu", ["s"], ["y"])]
    inits = [_c(rng, "w1", 37, 20, 3, 3), _c(rng, "b1", 37), _c(rng, "w2", 20, 37, 3, 3), _c(rng, "b2", 20)]
    return _model(nodes, [("x", [1, 20, 9, 34])], [("y", [1, 20, 9, 34])], inits), {"x": rng.standard_normal((1, 20, 9, 34)).astype(np.float32)}


def mlp():
    """MatMul by constants with Gelu (Erf) and LayerNormalization, N not a multiple of 16."""
    rng = np.random.default_rng(1)
    N = helper.make_node
    nodes = [N("MatMul", ["x", "w1"], ["h"]), N("Add", ["h", "b1"], ["hb"]), N("Div", ["hb", "s2"], ["u"]),
             N("Erf", ["u"], ["e"]), N("Add", ["e", "one"], ["e1"]), N("Mul", ["hb", "e1"], ["g2"]),
             N("Mul", ["g2", "half"], ["gl"]), N("MatMul", ["gl", "w2"], ["o"]),
             N("LayerNormalization", ["o", "ga", "be"], ["y"], axis=-1, epsilon=1e-5)]
    inits = [_c(rng, "w1", 48, 72), _c(rng, "b1", 72), _c(rng, "w2", 72, 40), _c(rng, "ga", 40, scale=1.0),
             _c(rng, "be", 40)] + [numpy_helper.from_array(np.array(v, np.float32), n)
                                   for n, v in (("s2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    return _model(nodes, [("x", [3, 13, 48])], [("y", [3, 13, 40])], inits), {"x": rng.standard_normal((3, 13, 48)).astype(np.float32)}


@pytest.fixture
def width(vector_width):
    """(target, lanes) at each vector width (tests/conftest.py VECTOR_WIDTHS)."""
    return vector_width


@pytest.mark.parametrize("build", [conv_net, wino_net, mlp])
def test_blocked_schedules_at_each_vector_width(width, build):
    target, lanes = width
    assert target.lanes(np.float32) == lanes
    model, feeds = build()
    mod = tensorfuse.compile(model, target=target, cache=False, num_threads=2)
    blocked = [k for k in mod.kernels if "register tile" in k.comment]
    assert blocked, "no kernel used a blocked schedule"
    if build is conv_net:
        assert sum("[depthwise" in k.comment for k in mod.kernels) == 2
    if build is wino_net:
        assert sum("winograd" in k.comment for k in mod.kernels) == 2, [k.comment for k in mod.kernels]
    assert any(f"x{lanes} " in k.comment or f"x{lanes}]" in k.comment or f"x{lanes} columns" in k.comment
               or f"{lanes} pixels" in k.comment for k in blocked), [k.comment for k in blocked]
    (y,) = mod.run(**feeds)
    np.testing.assert_allclose(y, ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_small_plane_pointwise_takes_flat_tiles_at_16_lanes(width):
    """A 1x1 conv on a 7x7 plane: 49 pixels fill 4 vectors of 16 lanes to 77%, so at 16 lanes it
    takes the flat tiles (channels as lanes), at 8 and 4 lanes (88%, 94%) the pointwise GEMM
    (POINTWISE_MIN_LANE_USE); a residual Add and Relu fused; it matches onnxruntime either way."""
    from tensorfuse.codegen.llvm.schedules.conv2d import POINTWISE_MIN_LANE_USE, pointwise_lane_use
    target, lanes = width
    rng = np.random.default_rng(5)
    N = helper.make_node
    nodes = [N("Conv", ["x", "w", "b"], ["c"]), N("Add", ["c", "z"], ["s"]), N("Relu", ["s"], ["y"])]
    model = _model(nodes, [("x", [1, 96, 7, 7]), ("z", [1, 160, 7, 7])], [("y", [1, 160, 7, 7])],
                   [_c(rng, "w", 160, 96, 1, 1), _c(rng, "b", 160)])
    feeds = {"x": rng.standard_normal((1, 96, 7, 7)).astype(np.float32),
             "z": rng.standard_normal((1, 160, 7, 7)).astype(np.float32)}

    class Geo:
        out_shape = [7, 7]
    use = pointwise_lane_use(target, 160, 96, Geo())
    assert (use < POINTWISE_MIN_LANE_USE) == (lanes == 16), use
    mod = tensorfuse.compile(model, target=target, cache=False, num_threads=2)
    (k,) = [k for k in mod.kernels if "register tile" in k.comment or "pointwise" in k.comment]
    assert ("[flat pixel tiles" in k.comment) == (lanes == 16), k.comment
    (y,) = mod.run(**feeds)
    np.testing.assert_allclose(y, ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)
