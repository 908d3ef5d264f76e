"""A Concat whose inputs are contiguous byte ranges of its output lowers to no kernel: its inputs
become views of the output at their byte offsets (``compiler.lower._concat_views``,
``runtime.memory_plan`` alias offsets), so their producers write straight into it. Every
result is checked against onnxruntime (optimisations off) at 1 and 2 threads and with the
memory checks of debug mode; the cases where it must not apply keep their Concat kernel."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from tensorfuse.runtime.memory_plan import plan_memory, resolve_alias_offsets, resolve_aliases
from tests.oracle import ort_run

RTOL, ATOL = 1e-4, 1e-5


def _conv(rng, name, x, cin, cout, k=1):
    w = numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32), name + "_w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), name + "_b")
    node = helper.make_node("Conv", [x, w.name, b.name], [name], pads=[k // 2] * 4, kernel_shape=[k, k])
    return node, [w, b]


def fire_model(n=1, axis=1, extra_use=False, concat_is_output=False, nested=False, seed=0):
    """squeezenet's Fire module: a 1x1 squeeze conv + Relu, then a 1x1 and a 3x3 expand conv
    (+ Relu each), concatenated on ``axis``; ``extra_use``: the 1x1 expand's output is also a
    graph output; ``nested``: the concatenation is concatenated again with the squeeze output."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    e3 = 12 if axis == 1 else 10        # the channels agree off the concatenated axis
    for name, x, cin, cout, k in (("sq", "x", 8, 6, 1), ("e1", "sqr", 6, 10, 1), ("e3", "sqr", 6, e3, 3)):
        node, ws = _conv(rng, name, x, cin, cout, k)
        nodes += [node, helper.make_node("Relu", [name], [name + "r"])]
        inits += ws
    cat = "y" if concat_is_output else "cat"
    nodes.append(helper.make_node("Concat", ["e1r", "e3r"], [cat], axis=axis))
    outs_shape = {1: [n, 22, 9, 9], 2: [n, 10, 18, 9]}
    outputs = []
    if not concat_is_output:
        if nested:
            nodes.append(helper.make_node("Relu", ["sqr"], ["sqr2"]))
            nodes.append(helper.make_node("Concat", ["cat", "sqr2"], ["cat2"], axis=1))
            nodes.append(helper.make_node("Sigmoid", ["cat2"], ["y"]))
            outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 28, 9, 9]))
        else:
            nodes.append(helper.make_node("Sigmoid", [cat], ["y"]))
            outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, outs_shape[axis] if axis in outs_shape else None))
    else:
        outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, outs_shape[axis]))
    if extra_use:
        outputs.append(helper.make_tensor_value_info("e1r", TensorProto.FLOAT, [n, 10, 9, 9]))
    g = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 8, 9, 9])],
                          outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _concat_kernels(mod) -> int:
    return sum("Concat" in c.ops for c in mod.calls)


def _check(model, n=1, opt_level=2):
    x = np.random.default_rng(5).standard_normal((n, 8, 9, 9)).astype(np.float32)
    want = ort_run(model, {"x": x})
    mod = tensorfuse.compile(model, opt_level=opt_level, cache=False)
    for threads in (1, 2):
        mod.num_threads = threads
        for checked in (False, True):
            mod.check_memory = checked
            got = mod.run(x)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{threads} threads, checked {checked}")
    return mod


@pytest.mark.parametrize("opt_level", [0, 2])
def test_concat_of_two_conv_outputs_lowers_to_views(opt_level):
    """Fires: the two expand convs write into the Concat's output at byte offsets 0 and 10
    channels x 81 pixels x 4 bytes; no Concat kernel runs."""
    mod = _check(fire_model(), opt_level=opt_level)
    assert _concat_kernels(mod) == 0
    assert sorted(mod.memory_plan.alias_offsets.values()) == [10 * 81 * 4]
    roots = {mod.memory_plan.aliases[s] for s in mod.memory_plan.alias_offsets}
    assert len(roots) == 1


def test_concat_that_is_a_graph_output_takes_its_inputs_in_the_output_array():
    mod = _check(fire_model(concat_is_output=True))
    assert _concat_kernels(mod) == 0
    (root,) = {mod.memory_plan.aliases[s] for s in mod.memory_plan.alias_offsets}
    assert mod._program.slots[root].kind == "output"


def test_nested_concats_add_their_offsets():
    """The inner Concat's output is itself the first input of the outer one: its views end at
    the outer output with the offsets summed (0 and 10 x 81 x 4), and the squeeze Relu lands
    at 22 x 81 x 4."""
    mod = _check(fire_model(nested=True))
    assert _concat_kernels(mod) == 0
    assert sorted(mod.memory_plan.alias_offsets.values()) == [10 * 81 * 4, 22 * 81 * 4]
    assert len(set(mod.memory_plan.aliases[s] for s in mod.memory_plan.alias_offsets)) == 1


@pytest.mark.parametrize("case", ["batch2", "axis2", "other_consumer"])
def test_concat_keeps_its_kernel_where_views_cannot_hold_it(case):
    """Does not fire: at batch 2 each input is two separate ranges of the output; on axis 2
    (channels before it) likewise; an input that is also a graph output must come out as its
    own array."""
    model = {"batch2": lambda: fire_model(n=2), "axis2": lambda: fire_model(axis=2),
             "other_consumer": lambda: fire_model(extra_use=True)}[case]()
    mod = _check(model, n=2 if case == "batch2" else 1)
    assert _concat_kernels(mod) == 1
    assert not mod.memory_plan.alias_offsets


def test_saved_module_keeps_the_views(tmp_path):
    model = fire_model()
    mod = _check(model)
    path = tmp_path / "fire.tfm"
    mod.save(path)
    back = tensorfuse.load(path)
    assert back.memory_plan.alias_offsets == mod.memory_plan.alias_offsets
    x = np.random.default_rng(9).standard_normal((1, 8, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(back.run(x)[0], ort_run(model, {"x": x})[0], rtol=RTOL, atol=ATOL)


def test_alias_offsets_resolve_along_chains_and_are_bounded():
    class S:
        def __init__(self, index, kind, nbytes):
            self.index, self.kind, self.nbytes, self.name = index, kind, nbytes, f"s{index}"
    slots = [S(0, "temp", 16), S(1, "temp", 16), S(2, "temp", 32), S(3, "temp", 64), S(4, "temp", 32)]
    aliases, offs = {0: 2, 1: 2, 2: 3}, {1: 16, 2: 32}
    assert resolve_aliases(aliases, slots, offs) == {0: 3, 1: 3, 2: 3}
    assert resolve_alias_offsets(aliases, offs) == {0: 32, 1: 48, 2: 32}
    with pytest.raises(ValueError, match="offset 64"):
        resolve_aliases({0: 2, 1: 2, 2: 3}, slots, {1: 16, 2: 48})      # past the root's end
    with pytest.raises(ValueError, match="has 32 bytes"):
        resolve_aliases({4: 3}, slots)                                  # a part, but no offset

    class Call:
        def __init__(self, slots):
            self.slots = slots
    # producers of the two views (calls 0, 1) and the reader of their root (call 2): the root
    # lives from call 0; a temp of the same calls cannot take its memory
    plan = plan_memory(slots[:4] + [S(4, "temp", 64)], [Call([0]), Call([1, 4]), Call([3, 4])],
                       aliases=aliases, alias_offsets=offs)
    b = {p.slot: p for p in plan.buffers}
    assert set(b) == {3, 4} and b[3].first == 0 and b[3].last == 2
    assert b[3].offset + 64 <= b[4].offset or b[4].offset + 64 <= b[3].offset
    assert plan.alias_offsets == {0: 32, 1: 48, 2: 32}
