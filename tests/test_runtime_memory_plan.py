"""runtime.memory_plan: liveness, placement with reuse, in-place sharing; and compiled modules'
plans (real values checked against numpy so a wrong overlap shows as a wrong result)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.runtime.memory_plan import ALIGNMENT, MemoryPlan, MemoryPlanError, check_plan, plan_memory


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


def _check_no_overlap(plan: MemoryPlan):
    bufs = plan.buffers
    for b in bufs:
        assert b.offset % ALIGNMENT == 0
        assert b.offset + b.size <= plan.arena_bytes
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if a.shares == b.slot or b.shares == a.slot:
                continue
            same_group = a.offset == b.offset and (a.shares is not None or b.shares is not None)
            live_together = a.first <= b.last and b.first <= a.last
            if live_together and not same_group:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (a, b)


def test_chain_reuses_two_buffers():
    # x -> t1 -> t2 -> t3 -> t4 -> y : at most two temps alive at once
    slots = [S(0, "input", 400)] + [S(i, "temp", 400) for i in range(1, 5)] + [S(5, "output", 400)]
    calls = [C([i, i + 1]) for i in range(5)]
    plan = plan_memory(slots, calls)
    assert plan.naive_bytes == 1600
    assert plan.peak_live_bytes == 800
    assert plan.arena_bytes == 2 * 448          # 400 rounded up to 64
    assert [(b.first, b.last) for b in plan.buffers] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    _check_no_overlap(plan)


def test_inplace_chain_uses_one_buffer():
    slots = [S(0, "input", 400)] + [S(i, "temp", 400) for i in range(1, 5)] + [S(5, "output", 400)]
    calls = [C([0, 1])] + [C([i, i + 1], [(0, 1)]) for i in range(1, 4)] + [C([4, 5], [(0, 1)])]
    plan = plan_memory(slots, calls)
    assert plan.arena_bytes == 448 and plan.peak_live_bytes == 400
    assert [b.shares for b in plan.buffers] == [None, 1, 2, 3]
    assert len({b.offset for b in plan.buffers}) == 1


def test_inplace_refused_when_input_lives_on_or_sizes_differ():
    # t1 is read again by call 2, so call 1 must not overwrite it; t3 has another size
    slots = [S(0, "input", 256), S(1, "temp", 256), S(2, "temp", 256), S(3, "temp", 128), S(4, "output", 256)]
    calls = [C([0, 1]), C([1, 2], [(0, 1)]), C([1, 2, 3], [(0, 2), (1, 2)]), C([3, 4])]
    plan = plan_memory(slots, calls)
    by = {b.slot: b for b in plan.buffers}
    assert by[2].shares is None and by[3].shares is None
    _check_no_overlap(plan)


def test_inplace_never_into_graph_inputs_or_outputs():
    slots = [S(0, "input", 256), S(1, "temp", 256), S(2, "output", 256)]
    calls = [C([0, 1], [(0, 1)]), C([1, 2], [(0, 1)])]
    plan = plan_memory(slots, calls)
    assert all(b.shares is None for b in plan.buffers)


def test_diamond_liveness():
    # t1 feeds t2 and t3; t1 dies when t3 is made; t2 lives until the join
    slots = [S(0, "input", 64), S(1, "temp", 1024), S(2, "temp", 64), S(3, "temp", 2048), S(4, "output", 64)]
    calls = [C([0, 1]), C([1, 2]), C([1, 3]), C([2, 3, 4])]
    plan = plan_memory(slots, calls)
    by = {b.slot: (b.first, b.last) for b in plan.buffers}
    assert by == {1: (0, 2), 2: (1, 3), 3: (2, 3)}
    assert plan.peak_live_bytes == 1024 + 64 + 2048
    _check_no_overlap(plan)


def test_table_and_dict_round_trip():
    slots = [S(0, "input", 64), S(1, "temp", 1000, "conv_out"), S(2, "output", 64)]
    plan = plan_memory(slots, [C([0, 1]), C([1, 2])])
    text = str(plan)
    assert "conv_out" in text and "offset" in text and "peak live" in text and "naive" in text
    assert MemoryPlan.from_dict(plan.to_dict()) == plan


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 15), st.integers(0, 6)), min_size=1, max_size=30))
def test_random_lifetimes_never_overlap(specs):
    # random temps: (size, birth, extra lifetime); calls touch each temp at its birth and death
    ncalls = 24
    slots = [S(i, "temp", size) for i, (size, _, _) in enumerate(specs)]
    touch = [[] for _ in range(ncalls)]
    for i, (_, birth, span) in enumerate(specs):
        touch[birth].append(i)
        touch[min(birth + span, ncalls - 1)].append(i)
    calls = [C(sorted(set(t))) for t in touch]
    plan = plan_memory(slots, calls)
    _check_no_overlap(plan)
    check_plan(plan, slots, calls)
    assert plan.peak_live_bytes <= plan.arena_bytes <= plan.naive_bytes + ALIGNMENT * len(specs)


# ----------------------------------------------------------------------------- compiled
def _model(nodes, inputs, outputs):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m)


def residual_model(n_blocks=4, shape=(4, 64)):
    """y = relu(... relu(relu(x) + x) ...): elementwise chains with a skip connection each block."""
    nodes, prev = [], "x"
    for i in range(n_blocks):
        nodes += [helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"),
                  helper.make_node("Add", [f"r{i}", prev], [f"a{i}"], name=f"add{i}")]
        prev = f"a{i}"
    nodes.append(helper.make_node("Relu", [prev], ["y"], name="out"))
    return _model(nodes, [("x", shape)], ["y"])


def residual_ref(x, n_blocks=4):
    for _ in range(n_blocks):
        x = np.maximum(x, 0) + x
    return np.maximum(x, 0)


def test_compiled_chain_runs_in_place_and_matches_numpy():
    # O0: every op its own kernel (O2 fuses the whole chain into one kernel with no temps)
    mod = tensorfuse.compile(residual_model(), opt_level=0, cache=False)
    plan = mod.memory_plan
    assert plan.naive_bytes == 8 * 4 * 64 * 4
    assert plan.num_inplace > 0
    assert plan.arena_bytes <= 1.25 * plan.peak_live_bytes
    _check_no_overlap(plan)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x)[0], residual_ref(x), rtol=1e-6)
    np.testing.assert_allclose(mod.run(x * 2)[0], residual_ref(x * 2), rtol=1e-6)


def test_compiled_broadcast_is_not_in_place_into_the_smaller_operand():
    # Add(t[4,1] , s[4,8]) -> [4,8]: only the full-shape operand may share the output's memory
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Relu", ["z"], ["s"]),
             helper.make_node("Add", ["t", "s"], ["u"]), helper.make_node("Relu", ["u"], ["y"])]
    mod = tensorfuse.compile(_model(nodes, [("x", (4, 1)), ("z", (4, 8))], ["y"]), opt_level=0, cache=False)
    by = {b.name: b for b in mod.memory_plan.buffers}
    assert by["u"].shares == by["s"].slot            # never t's [4,1] buffer
    x = np.random.default_rng(1).standard_normal((4, 1)).astype(np.float32)
    z = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x, z)[0], np.maximum(np.maximum(x, 0) + np.maximum(z, 0), 0), rtol=1e-6)


@pytest.mark.parametrize("opt_level", [0, 2])
def test_plan_reported_on_module(opt_level):
    mod = tensorfuse.compile(residual_model(2, (3, 5)), opt_level=opt_level, cache=False)
    plan = mod.memory_plan
    assert plan.peak_live_bytes <= plan.arena_bytes <= plan.naive_bytes
    for b in plan.buffers:
        assert b.size == 3 * 5 * 4 and b.first <= b.last < mod.num_kernels
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x)[0], residual_ref(x, 2), rtol=1e-6)


# ----------------------------------------------------------------------------- the checker (debug mode)
def test_check_plan_accepts_reuse_and_in_place_and_refuses_overlap():
    slots = [S(0, "input", 400)] + [S(i, "temp", 400, f"t{i}") for i in range(1, 5)] + [S(5, "output", 400)]
    chain = [C([i, i + 1]) for i in range(5)]
    check_plan(plan_memory(slots, chain), slots, chain)
    inplace = [C([0, 1])] + [C([i, i + 1], [(0, 1)]) for i in range(1, 4)] + [C([4, 5], [(0, 1)])]
    check_plan(plan_memory(slots, inplace), slots, inplace)
    # the same one-buffer plan, but the calls do not allow in place: t1..t4 overlap while alive
    with pytest.raises(MemoryPlanError, match="slot 1 't1'.*and slot 2 't2'.*share arena memory while both are alive"):
        check_plan(plan_memory(slots, inplace), slots, chain)
    plan = plan_memory(slots, chain)
    plan.buffers = [b for b in plan.buffers if b.slot != 3]
    with pytest.raises(MemoryPlanError, match="slot 3 't3' is read or written by call 2 .* has no place"):
        check_plan(plan, slots, chain)


def _broken(mod, reader: str, early: str):
    """Move the buffer of ``early`` onto ``reader``'s while ``reader`` is still to be read."""
    by = {b.name: b for b in mod.memory_plan.buffers}
    by[early].offset = by[reader].offset
    by[early].shares = None
    mod._pool = []            # arenas are made from the plan


def test_debug_mode_runs_are_checked_and_poison_dead_values():
    mod = tensorfuse.compile(residual_model(), opt_level=0, cache=False)
    assert mod.check_memory        # tests/conftest.py turns debug mode on
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(mod.run(x)[0], residual_ref(x), rtol=1e-6)
    arena = mod._pool[0]
    for b in mod.memory_plan.buffers:      # every temp has died by the end of the run
        region = arena.buffer[arena.base_offset + b.offset:arena.base_offset + b.offset + b.size].view(np.float32)
        assert np.isnan(region).all(), b


def test_a_plan_that_reuses_a_region_too_early_is_caught():
    nodes = [helper.make_node("Neg", ["x"], ["t"], name="neg"), helper.make_node("Exp", ["x"], ["u"], name="exp"),
             helper.make_node("Add", ["t", "u"], ["y"], name="add")]
    mod = tensorfuse.compile(_model(nodes, [("x", (4, 64))], ["y"]), opt_level=0, cache=False)
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    _broken(mod, "t", "u")     # Exp writes u over t, which Add still reads
    mod.check_memory = False
    np.testing.assert_allclose(mod.run(x)[0], 2 * np.exp(x), rtol=1e-5)      # unchecked: silently wrong
    mod.check_memory = True
    with pytest.raises(MemoryPlanError, match="'t'.*and .*'u'.*share arena memory while both are alive"):
        mod.run(x)
    mod._plan_checked = True           # past the static check, the run itself catches the stale read
    with pytest.raises(MemoryPlanError, match=r"\(add_\d+: add\) reads slot \d+ 't', written by call 0 "
                                              r"\(neg_\d+: neg\), but its arena region was overwritten since by "
                                              r"slot \d+ 'u' \(call 1 \(exp_\d+: exp\)\)"):
        mod.run(x)


def test_a_kernel_reading_a_value_before_it_is_written_is_caught():
    x = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)
    mod = tensorfuse.compile(residual_model(), opt_level=0, cache=False)
    calls = mod._program.calls
    i = next(k for k, c in enumerate(calls) if c.nodes == ["add0"])
    calls[i], calls[i + 1] = calls[i + 1], calls[i]          # relu1 before add0, which makes its input
    mod._plan_checked = True
    with pytest.raises(MemoryPlanError, match=r"\(relu_\d+: relu1\) reads slot \d+ 'a0' before any kernel wrote it"):
        mod.run(x)
