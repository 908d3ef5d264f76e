"""runtime.Module: steady-state allocation, fresh outputs, constants held once, concurrent runs,
the per-kernel profiler and the whole-run benchmark."""
from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse


def mlp_model(n: int = 8, d: int = 256, seed: int = 0) -> onnx.ModelProto:
    """y = tanh(relu(x @ W1 + b1) @ W2 + b2 + x): constants, an anchor op, elementwise chains
    and a skip connection. x: f32[n, d]."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    b1 = rng.standard_normal(d).astype(np.float32)
    b2 = rng.standard_normal(d).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["h2"], name="mm2"),
             helper.make_node("Add", ["h2", "b2"], ["h2b"], name="bias2"),
             helper.make_node("Add", ["h2b", "x"], ["s"], name="skip"),
             helper.make_node("Tanh", ["s"], ["y"], name="tanh")]
    inits = [numpy_helper.from_array(a, k) for k, a in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2))]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (n, d))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (n, d))], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def mlp_ref(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    c = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    r = np.maximum(x @ c["w1"] + c["b1"], 0)
    return np.tanh(r @ c["w2"] + c["b2"] + x)


def x_input(seed: int, n: int = 8, d: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


@pytest.fixture(scope="module")
def mlp():
    model = mlp_model()
    return model, tensorfuse.compile(model, cache=False)


def test_matches_numpy_and_outputs_are_fresh(mlp):
    model, mod = mlp
    x1, x2 = x_input(1), x_input(2)
    y1 = mod.run(x1)[0]
    keep = y1.copy()
    y2 = mod.run(x2)[0]
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, keep)           # a later run never overwrites an output
    np.testing.assert_allclose(y1, mlp_ref(model, x1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y2, mlp_ref(model, x2), rtol=1e-4, atol=1e-5)
    # each output views a private allocation of its own (at most one cache line larger), its
    # data on a 64-byte boundary, contiguous and writable
    root = y1
    while root.base is not None:
        root = root.base
    assert root.flags.owndata and root.nbytes <= y1.nbytes + 64
    assert y1.ctypes.data % 64 == 0 and y1.flags.c_contiguous and y1.flags.writeable


def test_second_run_allocates_only_outputs():
    mod = tensorfuse.compile(mlp_model(n=128), cache=False)
    mod.check_memory = False        # the production path (debug mode's checked runs allocate)
    x = x_input(3, n=128)
    mod.run(x)
    arena = mod.memory_plan.arena_bytes
    assert arena >= 128 * 256 * 4
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        outs = mod.run(x)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out_bytes = sum(o.nbytes for o in outs)
    assert peak - base - out_bytes < 0.01 * arena, (peak - base, out_bytes, arena)
    assert current - base - out_bytes < 0.01 * arena


def test_constants_are_held_once(mlp):
    _, mod = mlp
    before = {s: (a.ctypes.data, a.nbytes) for s, a in mod._consts.items()}
    assert sum(n for _, n in before.values()) >= 2 * 256 * 256 * 4
    mod.run(x_input(4))
    arena = mod._acquire()
    try:
        for s, (addr, _) in before.items():
            assert arena.table[s] == addr            # the run reads the compiler's arrays directly
    finally:
        mod._release(arena)
    assert {s: (a.ctypes.data, a.nbytes) for s, a in mod._consts.items()} == before


@pytest.mark.parametrize("attempt", range(20))
def test_runs_from_two_threads_at_once(mlp, attempt):
    model, mod = mlp
    xs = [x_input(100 + attempt * 2 + t) for t in range(2)]
    want = [mod.run(x)[0] for x in xs]
    barrier = threading.Barrier(2)
    errors: list = []

    def worker(t: int):
        try:
            barrier.wait()
            for _ in range(15):
                got = mod.run(xs[t])[0]
                if not np.array_equal(got, want[t]):
                    errors.append(f"thread {t}: wrong result")
                    return
        except Exception as e:                   # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    np.testing.assert_allclose(want[0], mlp_ref(model, xs[0]), rtol=1e-4, atol=1e-5)
    assert len(mod._pool) <= 3                    # arenas are reused, not made per run


def test_profile_rows(mlp, capsys):
    _, mod = mlp
    prof = mod.profile(x_input(5), repeat=5)
    assert capsys.readouterr().out == ""              # it returns the table, prints nothing
    printed = str(prof)
    assert repr(prof) == printed                      # an interactive session shows the table once
    assert len(prof) == mod.num_kernels and sorted(r.call for r in prof) == list(range(mod.num_kernels))
    times = [r.median_ms for r in prof]
    assert times == sorted(times, reverse=True)
    assert abs(sum(r.share for r in prof) - 1.0) < 1e-9
    # rows name the model's nodes, also where fusion made new IR nodes (FusedMatMul ...)
    covered = [n for r in prof for n in r.nodes]
    assert sorted(covered) == sorted(["mm1", "bias1", "relu", "mm2", "bias2", "skip", "tanh"]), prof
    for r in prof:
        assert r.median_ms >= 0 and r.bytes_moved > 0
        call = next(c for c in mod.calls if c.kernel == r.kernel)
        assert (r.gflops is not None) == bool(call.flops)
        assert r.kernel in printed
    assert "median ms" in printed and "GFLOP/s" in str(prof)
    # profiling leaves the module working
    np.testing.assert_array_equal(mod.run(x_input(6))[0], mod.run(x_input(6))[0])


def test_profile_gflops_for_ops_with_flop_counts():
    # Conv declares its FLOP count: the profiler turns it into GFLOP/s
    x = np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((8, 4, 3, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 16, 16))],
                          initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    mod = tensorfuse.compile(m, cache=False)
    prof = mod.profile(x, repeat=3, show=False)
    conv = [r for r in prof if "conv" in r.nodes]
    assert conv and conv[0].gflops is not None and conv[0].gflops > 0
    assert conv[0].bytes_moved == x.nbytes + w.nbytes + 8 * 16 * 16 * 4


def test_profile_and_benchmark_check_inputs(mlp):
    _, mod = mlp
    with pytest.raises(ValueError, match="input 'x'"):
        mod.profile(np.zeros((2, 2), np.float32), show=False)
    with pytest.raises(ValueError, match="repeat"):
        mod.benchmark(x_input(0), repeat=0)


def test_benchmark(mlp):
    _, mod = mlp
    b = mod.benchmark(x_input(7), repeat=5)
    assert 0 < b.min_ms <= b.median_ms <= b.max_ms and b.repeat == 5
    assert "median" in str(b)


def test_trace_sources_follows_rewrites():
    from tensorfuse.compiler.rewrite import Application
    from tensorfuse.runtime.profile import trace_sources
    log = [Application("fold_bn", ["conv1", "bn1"], ["conv1_bn"]),
           Application("conv_relu", ["conv1_bn", "relu1"], ["fused_0"]),
           Application("keep_name", ["add"], ["add"])]
    assert trace_sources(["fused_0"], log) == ["conv1", "bn1", "relu1"]
    assert trace_sources(["add", "other"], log) == ["add", "other"]
    assert trace_sources(["x"], None) == ["x"]


def test_profile_table_keeps_every_onnx_name_and_marks_shared_kernels():
    """Long node lists wrap instead of being cut; calls of a kernel shared by repeated layers
    are told apart (call number) and marked xN."""
    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "x"
    for i in range(3):                       # three identical layers: one shared kernel
        w = f"layer{i}.weight"
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), w))
        nodes.append(helper.make_node("MatMul", [cur, w], [f"m{i}"], name=f"/encoder/layer.{i}/dense/MatMul"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"/encoder/layer.{i}/activation/Tanh"))
        cur = f"t{i}"
    for i in range(6):                       # a long chain of elementwise ops: one fused loop
        nodes.append(helper.make_node("Sigmoid" if i % 2 else "Neg", [cur], [f"e{i}"],
                                      name=f"/head/a_rather_long_module_name/op_{i}"))
        cur = f"e{i}"
    g = helper.make_graph(nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 16))],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, (4, 16))], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mod = tensorfuse.compile(m, cache=False)
    prof = mod.profile(rng.standard_normal((4, 16)).astype(np.float32), repeat=2)
    table = str(prof)
    for n in nodes:
        assert n.name in table, n.name                  # never cut
    shared = [r for r in prof if r.shared_by > 1]
    # the last layer's kernel also computes the elementwise chain: the first two share one
    assert len(shared) == 2 and len({r.kernel for r in shared}) == 1 and len({r.call for r in shared}) == 2
    assert all(r.shared_by == 2 for r in shared) and f"{shared[0].kernel} x2" in table


def test_thread_count_errors_name_where_the_value_came_from(monkeypatch):
    from tensorfuse.runtime.threads import resolve_num_threads
    monkeypatch.setenv("TENSORFUSE_NUM_THREADS", "0")
    with pytest.raises(ValueError, match="TENSORFUSE_NUM_THREADS must be a positive integer, got 0"):
        resolve_num_threads(None)           # the message named num_threads, not the variable
    monkeypatch.setenv("TENSORFUSE_NUM_THREADS", "abc")
    with pytest.raises(ValueError, match="TENSORFUSE_NUM_THREADS must be a positive integer, got 'abc'"):
        resolve_num_threads(None)
    with pytest.raises(ValueError, match="^num_threads must be a positive integer, got -2"):
        resolve_num_threads(-2)
    monkeypatch.setenv("TENSORFUSE_NUM_THREADS", "3")
    assert resolve_num_threads(None) == 3 and resolve_num_threads(2) == 2


@pytest.mark.parametrize("huge", ["1", "0"])
def test_large_constants_and_arena_on_huge_page_mappings(monkeypatch, tmp_path, huge):
    """Constants of at least HUGE_PAGE_MIN_BYTES in all are copied into one 2 MiB aligned
    mapping advised for transparent huge pages (each on a cache line), and so is an arena that
    large; a saved module loads its constants into such a mapping and keeps them there (no
    second copy); ``TENSORFUSE_HUGE_PAGES=0`` keeps numpy's memory. Results equal numpy's
    either way. (Whether the system backs the mapping with huge pages is its setting.)"""
    import mmap

    from tensorfuse.runtime import module as rm
    monkeypatch.setenv("TENSORFUSE_HUGE_PAGES", huge)
    model = mlp_model(n=600, d=1024)               # weights 2 x 1024x1024 f32: 8 MiB
    mod = tensorfuse.compile(model, cache=False)
    x = np.random.default_rng(0).standard_normal((600, 1024)).astype(np.float32)
    want = mlp_ref(model, x)
    np.testing.assert_allclose(mod.run(x)[0], want, rtol=1e-4, atol=1e-4)
    consts = [a for a in mod._consts.values() if a.nbytes]
    assert sum(a.nbytes for a in consts) >= rm.HUGE_PAGE_MIN_BYTES
    assert all(a.ctypes.data % 64 == 0 for a in consts)
    on = huge == "1" and hasattr(mmap, "MADV_HUGEPAGE")
    assert all(rm._in_mapping(a) for a in consts) == on
    if on:
        starts = sorted(a.ctypes.data for a in consts)
        assert starts[0] % rm.HUGE_PAGE_BYTES == 0 and starts[-1] - starts[0] < sum(a.nbytes for a in consts) + 64 * len(consts)
    arena = mod._acquire()
    try:
        assert mod.memory_plan.arena_bytes >= rm.HUGE_PAGE_MIN_BYTES
        assert rm._in_mapping(arena.buffer) == on
        assert (arena.buffer.ctypes.data % rm.HUGE_PAGE_BYTES == 0) or not on
    finally:
        mod._release(arena)
    path = tmp_path / "mlp.tfm"
    mod.save(str(path))
    loaded = tensorfuse.load(str(path))
    lc = [a for a in loaded._consts.values() if a.nbytes]
    assert all(rm._in_mapping(a) for a in lc) == on
    if on:      # views of the loaded file's buffer: one mapping, not copied into another
        assert len({id(_root(a)) for a in lc}) == 1
    np.testing.assert_allclose(loaded.run(x)[0], want, rtol=1e-4, atol=1e-4)


def _root(a):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a
