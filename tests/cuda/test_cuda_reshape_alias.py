"""Reshapes as aliases on the cuda target (issue 21; ``runtime.memory_plan`` point 4): a
standalone Reshape, Flatten, Squeeze or Unsqueeze of an intermediate, a graph input or a graph
output is no launch, its slot the flat view of the slot it reshapes; a graph output that
reshapes an intermediate takes the intermediate into its array (also with ``return_device``);
one that reshapes an input or another output is still its own array. Under the CUDA simulator, numbers
against onnxruntime (optimisations off): exact for Relu/Neg/Add chains, rtol 1e-5 with Exp."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")      # before numba is imported

import pathlib  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba.core import config  # noqa: E402
from onnx import helper  # noqa: E402

import tensorfuse  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from oracle import ort_run  # noqa: E402
from test_memory_plan_aliases import RESHAPE_OPS, _model, _shape  # noqa: E402

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1 at numba import")


def _compare(model, feeds, rtol=0.0, **kw):
    mod = tensorfuse.compile(model, target="cuda", cache=False, **kw)
    got = mod.run(**feeds)
    for g, e in zip(got, ort_run(model, feeds)):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=rtol, atol=0)
    return mod, got


def test_reshapes_between_kernels_and_of_inputs_are_no_launch():
    """a = Exp(x); b = Reshape(Flatten(a)); xi = Unsqueeze(Reshape(x)); y = Add(b, Squeeze(xi))."""
    nodes = [helper.make_node("Exp", ["x"], ["a"]),
             helper.make_node("Flatten", ["a"], ["af"], axis=1),
             helper.make_node("Reshape", ["af", "s"], ["b"]),
             helper.make_node("Reshape", ["x", "s"], ["xr"]),
             helper.make_node("Unsqueeze", ["xr", "ax"], ["xi"]),
             helper.make_node("Squeeze", ["xi", "ax"], ["xs"]),
             helper.make_node("Add", ["b", "xs"], ["y"])]
    model = _model(nodes, [("x", (2, 3, 8))], ["y"], [_shape("s", [4, 12]), _shape("ax", [0])])
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    mod, _ = _compare(model, {"x": x}, rtol=1e-5, opt_level=0)
    assert [c.ops for c in mod.calls] == [["Exp"], ["Add"]]
    plan = mod.memory_plan
    slots = mod._program.slots
    assert len(plan.aliases) == 5 and {slots[r].kind for r in plan.aliases.values()} == {"temp", "input"}
    assert len(plan.buffers) == 1 and plan.naive_bytes == x.nbytes


def test_outputs_that_reshape_an_input_or_another_output_are_their_own_arrays():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y1"]),
             helper.make_node("Relu", ["x"], ["y2"]),
             helper.make_node("Flatten", ["y2"], ["y3"], axis=0),
             helper.make_node("Reshape", ["y2", "s"], ["t"]),
             helper.make_node("Neg", ["t"], ["y4"])]
    model = _model(nodes, [("x", (3, 8))], ["y1", "y2", "y3", "y4"], [_shape("s", [4, 6])])
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    mod, got = _compare(model, {"x": x}, opt_level=0)
    assert sum(bool(RESHAPE_OPS & set(c.ops)) for c in mod.calls) == 2       # y1 and y3 are launches
    assert [mod._program.slots[s].name for s in mod.memory_plan.aliases] == ["t"]
    dev = mod.run(x=x, return_device=True)
    host = [d._ary for d in dev]                 # the simulator's device arrays wrap host memory
    for i, a in enumerate(host):                 # four distinct arrays
        assert not any(np.shares_memory(a, b) for b in host[i + 1:])
    for d, e in zip(dev, got):
        np.testing.assert_array_equal(d.copy_to_host(), e)


def test_an_intermediate_reshaped_into_graph_outputs_lives_in_the_first():
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node("Reshape", ["t", "s"], ["y1"]),
             helper.make_node("Flatten", ["t"], ["y2"], axis=0),
             helper.make_node("Neg", ["t"], ["z"])]
    model = _model(nodes, [("x", (3, 8))], ["y1", "y2", "z"], [_shape("s", [4, 6])])
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    mod, _ = _compare(model, {"x": x}, opt_level=0)
    assert [c.ops for c in mod.calls] == [["Relu"], ["Flatten"], ["Neg"]]
    slots = mod._program.slots
    assert {slots[a].name: slots[r].name for a, r in mod.memory_plan.aliases.items()} == {"t": "y1"}
    dev = mod.run(x=x, return_device=True)          # fresh device outputs: t goes into y1's array
    host = [d._ary for d in dev]
    for i, a in enumerate(host):
        assert not any(np.shares_memory(a, b) for b in host[i + 1:])
    np.testing.assert_array_equal(dev[0].copy_to_host(), np.maximum(x, 0).reshape(4, 6))
