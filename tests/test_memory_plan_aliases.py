"""Reshapes as aliases in the static memory plan (issue 21; ``runtime.memory_plan`` point 4,
``compiler.lower._is_alias``): a standalone Reshape, Flatten, Squeeze or Unsqueeze whose output
is an intermediate lowers to no kernel and holds no bytes; it views its input's memory (an arena
buffer, a graph input, a constant, a graph output), and liveness counts its uses as uses of that
memory; a graph output that reshapes an intermediate takes the intermediate into its array. A
graph output is never an alias: it comes out as its own array even when it reshapes an input or
another output. Numbers against onnxruntime (optimisations off), exact for
Relu/Neg/Add chains, rtol 1e-6 where Exp or MatMul run. Runs are in debug mode
(tests/conftest.py), so every run also checks the plan and each value a kernel reads."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.runtime.memory_plan import MemoryPlan, check_plan, plan_memory, resolve_aliases
from tests.oracle import ort_run

RESHAPE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


@dataclass
class S:
    index: int
    kind: str
    nbytes: int
    name: str = ""


@dataclass
class C:
    slots: list[int]
    inplace_ok: list = field(default_factory=list)
    kernel: str = "k"


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_empty_tensor_value_info(n) for n in outputs],
                          initializer=[onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    m = onnx.shape_inference.infer_shapes(m)
    inferred = {vi.name: vi for vi in m.graph.value_info}
    for o in m.graph.output:
        if not o.type.HasField("tensor_type") and o.name in inferred:
            o.CopyFrom(inferred[o.name])
    return m


def _shape(name, dims):
    return (name, np.asarray(dims, np.int64))


def _run_and_compare(model, feeds, opt_level=0, rtol=1e-6, **kw):
    mod = tensorfuse.compile(model, opt_level=opt_level, cache=False, **kw)
    got = mod.run(**feeds)
    for g, e in zip(got, ort_run(model, feeds)):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=rtol, atol=0)
    return mod, got


def _reshape_calls(mod):
    return [c for c in mod.calls if RESHAPE_OPS & set(c.ops)]


# ----------------------------------------------------------------------------- the plan alone
def test_alias_has_no_bytes_and_extends_its_roots_life():
    # call 0: x -> a; (b = reshape of a, no call); call 1: x -> c; call 2: (b, c) -> y
    slots = [S(0, "input", 400), S(1, "temp", 400, "a"), S(2, "temp", 400, "b"), S(3, "temp", 400, "c"),
             S(4, "output", 400)]
    calls = [C([0, 1]), C([0, 3]), C([2, 3, 4])]
    plan = plan_memory(slots, calls, aliases={2: 1})
    assert plan.aliases == {2: 1}
    assert [b.slot for b in plan.buffers] == [1, 3]         # the alias has no buffer of its own
    assert plan.naive_bytes == 800
    a = next(b for b in plan.buffers if b.slot == 1)
    assert (a.first, a.last) == (0, 2)                      # a lives until b's last use
    c = next(b for b in plan.buffers if b.slot == 3)
    assert a.offset != c.offset and plan.arena_bytes == 2 * 448
    check_plan(plan, slots, calls)
    # without the alias the same calls would let c take a's place after call 0
    assert plan_memory(slots, [C([0, 1]), C([0, 3]), C([1, 3, 4])]).arena_bytes == 2 * 448
    assert plan_memory(slots, [C([0, 1]), C([1, 2]), C([0, 3]), C([3, 4])]).arena_bytes == 2 * 448


def test_alias_chains_resolve_and_bad_aliases_are_refused():
    slots = [S(0, "input", 64), S(1, "temp", 64), S(2, "temp", 64), S(3, "temp", 64), S(4, "output", 64),
             S(5, "temp", 32)]
    assert resolve_aliases({3: 2, 2: 1}, slots) == {3: 1, 2: 1}
    assert resolve_aliases({1: 0}, slots) == {1: 0}          # a view of a graph input
    with pytest.raises(ValueError, match="aliases itself"):
        resolve_aliases({1: 2, 2: 1})
    with pytest.raises(ValueError, match="only a temp may be an alias"):
        resolve_aliases({4: 1}, slots)
    with pytest.raises(ValueError, match="has 32 bytes"):
        resolve_aliases({5: 1}, slots)


def test_plan_with_aliases_round_trips_through_json():
    import json
    slots = [S(0, "input", 64), S(1, "temp", 64), S(2, "temp", 64), S(3, "output", 64)]
    plan = plan_memory(slots, [C([0, 1]), C([2, 3])], aliases={2: 1})
    back = MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back.aliases == {2: 1} and back == plan
    assert "1 aliases" in plan.summary()


# ----------------------------------------------------------------------------- compiled modules (llvm)
def test_reshape_between_kernels_is_an_alias():
    """Relu -> Reshape -> Flatten -> Unsqueeze -> Squeeze -> Neg at O0 (every op its own
    kernel): two kernels, the four reshapes views of Relu's buffer, one buffer in the plan."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Reshape", ["a", "s"], ["b"]),
             helper.make_node("Flatten", ["b"], ["c"], axis=1),
             helper.make_node("Unsqueeze", ["c", "ax"], ["d"]),
             helper.make_node("Squeeze", ["d", "ax"], ["e"]),
             helper.make_node("Neg", ["e"], ["y"])]
    model = _model(nodes, [("x", (2, 3, 4, 5))], ["y"], [_shape("s", [6, 4, 5]), _shape("ax", [0])])
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    mod, (y,) = _run_and_compare(model, {"x": x})
    assert [c.ops for c in mod.calls] == [["Relu"], ["Neg"]]
    plan = mod.memory_plan
    (buf,) = plan.buffers
    assert buf.name == "a" and len(plan.aliases) == 4 and set(plan.aliases.values()) == {buf.slot}
    assert plan.naive_bytes == x.nbytes and plan.arena_bytes == 512     # no bytes for the views (480 aligned to 64)
    assert y.shape == (6, 20)


def test_the_root_stays_alive_until_the_views_last_use():
    """a = Relu(x); b = Reshape(a); c = Exp(x); d = Neg(c); y = Add(b, d): a must not share memory
    with c or d, which are alive while b is still to be read (debug mode checks the run)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Reshape", ["a", "s"], ["b"]),
             helper.make_node("Exp", ["x"], ["c"]),
             helper.make_node("Neg", ["c"], ["c2"]),
             helper.make_node("Reshape", ["c2", "s"], ["d"]),
             helper.make_node("Add", ["b", "d"], ["y"])]
    model = _model(nodes, [("x", (4, 64))], ["y"], [_shape("s", [16, 16])])
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    mod, _ = _run_and_compare(model, {"x": x})
    assert not _reshape_calls(mod) and len(mod.memory_plan.aliases) == 2
    by = {b.name: b for b in mod.memory_plan.buffers}
    assert by["a"].last == len(mod.calls) - 1             # alive until Add reads b
    assert by["a"].offset != by["c"].offset


def test_reshape_of_a_graph_input_and_of_a_constant():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["b"]),
             helper.make_node("Flatten", ["w"], ["wf"], axis=0),
             helper.make_node("Reshape", ["wf", "s"], ["w2"]),
             helper.make_node("Add", ["b", "w2"], ["y"])]
    w = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    model = _model(nodes, [("x", (4, 6))], ["y"], [_shape("s", [2, 12]), ("w", w)])
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    mod, _ = _run_and_compare(model, {"x": x})
    assert [c.ops for c in mod.calls] == [["Add"]]
    slots = mod._program.slots
    kinds = {slots[r].kind for r in mod.memory_plan.aliases.values()}
    assert kinds == {"input", "const"} and mod.memory_plan.arena_bytes == 0
    assert x.flags.writeable and np.array_equal(x, np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32))


def test_outputs_that_reshape_an_input_or_another_output_are_their_own_arrays():
    """y1 = Reshape(x) and y3 = Flatten(y2) with y2 = Relu(x) a graph output too: each output is a
    fresh array (a copy kernel writes it), no output shares memory with an input or another."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y1"]),
             helper.make_node("Relu", ["x"], ["y2"]),
             helper.make_node("Flatten", ["y2"], ["y3"], axis=1),
             helper.make_node("Reshape", ["y2", "s"], ["t"]),
             helper.make_node("Neg", ["t"], ["y4"])]
    model = _model(nodes, [("x", (3, 8))], ["y1", "y2", "y3", "y4"], [_shape("s", [4, 6])])
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    mod, got = _run_and_compare(model, {"x": x})
    assert len(_reshape_calls(mod)) == 2                 # y1 and y3 are written by kernels
    slots = mod._program.slots
    assert [slots[s].name for s in mod.memory_plan.aliases] == ["t"]    # t views the output y2
    for i, a in enumerate(got):
        assert not np.shares_memory(a, x)
        for b in got[i + 1:]:
            assert not np.shares_memory(a, b)
    got[1][...] = 0                                     # y2 changed by the caller: y3 keeps its values
    np.testing.assert_array_equal(got[2], np.maximum(x, 0))


def test_an_intermediate_reshaped_into_graph_outputs_lives_in_the_first():
    """t = Relu(x); y1 = Reshape(t), y2 = Flatten(t), z = Neg(t): t is written straight into y1's
    array (no copy), y2 is a copy (its own array), Neg reads t from y1."""
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node("Reshape", ["t", "s"], ["y1"]),
             helper.make_node("Flatten", ["t"], ["y2"], axis=0),
             helper.make_node("Neg", ["t"], ["z"])]
    model = _model(nodes, [("x", (3, 8))], ["y1", "y2", "z"], [_shape("s", [4, 6])])
    x = np.random.default_rng(7).standard_normal((3, 8)).astype(np.float32)
    mod, got = _run_and_compare(model, {"x": x})
    assert [c.ops for c in mod.calls] == [["Relu"], ["Flatten"], ["Neg"]]
    slots = mod._program.slots
    assert {slots[a].name: slots[r].name for a, r in mod.memory_plan.aliases.items()} == {"t": "y1"}
    assert mod.memory_plan.arena_bytes == 0
    for i, a in enumerate(got):
        assert not any(np.shares_memory(a, b) for b in got[i + 1:])


def test_optimised_model_with_matmul_reshape_softmax():
    """At O2: MatMul -> Reshape -> Softmax -> Reshape -> MatMul, the reshapes between kernels
    views; same numbers as onnxruntime."""
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Reshape", ["h", "s1"], ["h4"]),
             helper.make_node("Softmax", ["h4"], ["p"], axis=-1),
             helper.make_node("Reshape", ["p", "s2"], ["p2"]),
             helper.make_node("MatMul", ["p2", "w2"], ["y"])]
    model = _model(nodes, [("x", (6, 16))], ["y"], [("w1", w1), ("w2", w2), _shape("s1", [6, 4, 8]),
                                                   _shape("s2", [6, 32])])
    x = rng.standard_normal((6, 16)).astype(np.float32)
    mod, _ = _run_and_compare(model, {"x": x}, opt_level=2, rtol=1e-5)
    assert not _reshape_calls(mod)


def test_saved_module_keeps_its_aliases(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["b"]),
             helper.make_node("Neg", ["b"], ["y"])]
    model = _model(nodes, [("x", (4, 6))], ["y"], [_shape("s", [6, 4])])
    x = np.random.default_rng(6).standard_normal((4, 6)).astype(np.float32)
    mod, (y,) = _run_and_compare(model, {"x": x})
    mod.save(tmp_path / "m.tfm")
    back = tensorfuse.load(tmp_path / "m.tfm")
    assert back.memory_plan.aliases == mod.memory_plan.aliases and len(back.calls) == 2
    np.testing.assert_array_equal(back.run(x=x)[0], y)
