"""The compile cache (runtime.cache): hits, misses and their explanations, the cache place,
unwritable places, corrupt entries, and compile(cache=False). Every test uses its own
temporary cache folder."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import tensorfuse
import tensorfuse.runtime.cache as rc
from tensorfuse.codegen.llvm import jit
from tensorfuse.ir import cpu as cpu_info
from tensorfuse.ir.errors import ModelLoadError
from test_runtime_memory_plan import residual_model, residual_ref

SHAPE = (4, 64)


def x_input(seed):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def check(mod, x):
    np.testing.assert_allclose(mod.run(x)[0], residual_ref(x), rtol=1e-6)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(d))
    monkeypatch.setattr(rc, "_warned", set())
    return d


@pytest.fixture(scope="module")
def model():
    return residual_model(4, SHAPE)


def entries(d):
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def modules(d):
    """The cached modules (each entry is a module, its compile report and its key)."""
    return [n for n in entries(d) if n.endswith(".tfm")]


def test_miss_then_hit(cache, model):
    m1 = tensorfuse.compile(model)
    assert m1.cache_hit is False
    names = entries(cache)
    assert len(names) == 3 and {n.split(".", 1)[1] for n in names} == {"tfm", "key.json", "report.zip"}
    calls = jit.STATS["codegen_calls"]
    m2 = tensorfuse.compile(model)
    assert m2.cache_hit is True and jit.STATS["codegen_calls"] == calls       # no code generated
    x = x_input(0)
    np.testing.assert_array_equal(m2.run(x)[0], m1.run(x)[0])
    check(m2, x)
    assert m2.memory_plan == m1.memory_plan
    assert entries(cache) == names


def test_hit_serves_the_stored_report_without_recompiling(cache, model, monkeypatch):
    import tensorfuse.compiler.driver as driver
    m1 = tensorfuse.compile(model)

    def no_build(*a, **k):
        raise AssertionError("a cache hit recompiled the model")
    monkeypatch.setattr(driver, "_build", no_build)
    monkeypatch.setattr(driver, "import_onnx", no_build)
    m2 = tensorfuse.compile(model)
    assert m2.cache_hit and m2.report.from_cache and not m1.report.from_cache
    # graph, kernel IR, LLVM IR, rule log, passes and sources come from the entry
    assert str(m2.graph) == str(m1.graph)
    assert [str(k) for k in m2.kernels] == [str(k) for k in m1.kernels]
    assert m2.llvm_ir == m1.llvm_ir
    assert [str(a) for a in m2.rewrite_log] == [str(a) for a in m1.rewrite_log]
    assert [(p.name, p.changed) for p in m2.pass_records] == [(p.name, p.changed) for p in m1.pass_records]
    assert m2.report.sources == m1.report.sources == [c.sources for c in m1.calls]


def test_hit_graph_keeps_constant_values(cache, tmp_path):
    """The graph of a cache hit holds the real constants (those the module keeps and those it
    does not), so exporting it gives the model's numbers."""
    from onnx import TensorProto, helper, numpy_helper

    from oracle import ort_run
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
                           helper.make_node("Relu", ["u"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m1 = tensorfuse.compile(m)
    m2 = tensorfuse.compile(m)
    assert m2.cache_hit
    c1 = {k: v.data for k, v in m1.graph.constants.items()}
    c2 = {k: v.data for k, v in m2.graph.constants.items()}
    assert c1.keys() == c2.keys() and all(np.array_equal(c1[k], c2[k]) for k in c1)
    tensorfuse.export_onnx(m2.graph, tmp_path / "hit.onnx")
    x = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(ort_run(onnx.load(tmp_path / "hit.onnx"), {"x": x})[0], np.maximum(x @ w + b, 0),
                               rtol=1e-5, atol=1e-5)


def test_entry_without_a_report_is_a_miss(cache, model):
    tensorfuse.compile(model)
    next(cache.glob("*.report.zip")).unlink()
    m = tensorfuse.compile(model)
    assert m.cache_hit is False and m.graph is not None
    assert tensorfuse.compile(model).cache_hit is True


def test_cache_false_skips_it(cache, model):
    m = tensorfuse.compile(model, cache=False)
    assert entries(cache) == [] and m.cache_hit is None
    tensorfuse.compile(model)
    tensorfuse.compile(model, cache=False)
    assert len(modules(cache)) == 1


def test_path_bytes_and_proto_share_an_entry(cache, model, tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    assert tensorfuse.compile(str(p)).cache_hit is False
    assert tensorfuse.compile(p.read_bytes()).cache_hit is True
    assert tensorfuse.compile(model).cache_hit is True


def test_every_key_part_splits_entries(cache, model):
    tensorfuse.compile(model)
    assert tensorfuse.compile(model, opt_level=0).cache_hit is False
    assert tensorfuse.compile(residual_model(3, SHAPE)).cache_hit is False     # another graph
    assert len(modules(cache)) == 3


def test_cache_info_explains_a_miss(cache, model, monkeypatch):
    info = tensorfuse.cache_info(model)
    assert not info.hit and info.closest is None and "no entry" in str(info)
    tensorfuse.compile(model)
    assert tensorfuse.cache_info(model).hit
    info = tensorfuse.cache_info(model, opt_level=1)
    assert not info.hit
    assert [d.split(":")[0] for d in info.differences] == ["options.opt_level", "pipeline"], info.differences
    assert info.differences[0] == "options.opt_level: 1 (closest entry: 2)"
    info = tensorfuse.cache_info(residual_model(5, SHAPE))
    assert [d.split(":")[0] for d in info.differences] == ["model"]
    monkeypatch.setattr(rc, "source_digest", lambda: "0" * 64)
    info = tensorfuse.cache_info(model)
    assert [d.split(":")[0] for d in info.differences] == ["version.source"]
    assert "version.source" in str(info)


def _tanh_model():
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _tanh_to(op):
    from tensorfuse.compiler.pattern import Any, P
    from tensorfuse.compiler.rewrite import Rule

    class TanhSwap(Rule):
        """Tanh(x) ==> another op (a test rule that changes the result, so the test sees which code ran)."""
        pattern = P.Tanh(x=Any())

        def rewrite(self, m, build):
            return getattr(build, op)(m.x)
    return TanhSwap


def test_a_rule_appended_to_fuse_rules_is_part_of_the_key(cache, monkeypatch):
    # issue 9, defect 7: FUSE_RULES.append(...) as the tutorial does, then compile() again
    from tensorfuse.compiler import rules
    model, x = _tanh_model(), x_input(3)
    m0 = tensorfuse.compile(model)
    np.testing.assert_allclose(m0.run(x)[0], np.tanh(x), rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(rules, "FUSE_RULES", list(rules.FUSE_RULES))
    rules.FUSE_RULES.append(_tanh_to("Sigmoid"))
    info = tensorfuse.cache_info(model)
    assert not info.hit and [d.split(":")[0] for d in info.differences] == ["pipeline"], info.differences
    m1 = tensorfuse.compile(model)
    assert m1.cache_hit is False and [a.rule for a in m1.rewrite_log] == ["TanhSwap"]
    np.testing.assert_allclose(m1.run(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
    # the same rule name with another body (a rule edited in a notebook) is another entry too
    rules.FUSE_RULES[-1] = _tanh_to("Neg")
    m2 = tensorfuse.compile(model)
    assert m2.cache_hit is False
    np.testing.assert_allclose(m2.run(x)[0], -x, rtol=0, atol=0)
    # disabling it, or taking it out again, gives the first entry back
    assert tensorfuse.compile(model, disabled_rules=["TanhSwap"]).cache_hit is False
    rules.FUSE_RULES.pop()
    m3 = tensorfuse.compile(model)
    assert m3.cache_hit is True
    np.testing.assert_allclose(m3.run(x)[0], np.tanh(x), rtol=1e-5, atol=1e-6)


def test_a_replaced_pass_is_part_of_the_key(cache, model, monkeypatch):
    import tensorfuse.compiler.pipeline as pl
    from tensorfuse.compiler.passes import eliminate_dead_nodes
    before = pl.pipeline_digest(2)
    assert pl.pipeline_digest(2) == before and pl.pipeline_digest(1) != before

    def my_dce(g):
        return eliminate_dead_nodes(g)
    monkeypatch.setattr(pl, "eliminate_dead_nodes", my_dce)
    assert pl.pipeline_digest(2) != before


def test_cache_info_target_and_host_parts(cache, model, monkeypatch):
    tensorfuse.compile(model)
    host = dict(jit.host_info())
    monkeypatch.setattr(cpu_info, "host_info", lambda: dict(host, cpu="othercpu"))
    info = tensorfuse.cache_info(model)
    assert [d.split(":")[0] for d in info.differences] == ["target.cpu"]


def test_target_cpu_and_features_split_entries(cache, model):
    """A module compiled for other CPU features is never served for plain "llvm" (and back)."""
    from tensorfuse.ir.target import Target
    other = "llvm -mattr=-avx2" if "+avx2" in jit.host_info()["features"].split(",") else "llvm -mattr=+avx2"
    m1 = tensorfuse.compile(model, target=other)
    assert m1.cache_hit is False
    plain = tensorfuse.compile(model)
    assert plain.cache_hit is False and len(modules(cache)) == 2
    assert tensorfuse.compile(model, target=other).cache_hit is True
    assert tensorfuse.compile(model, target=other.replace(" ", "   ")).cache_hit is True      # canonical string
    assert tensorfuse.compile(model).cache_hit is True
    from tensorfuse.compiler.options import target_part
    parts = target_part(other)
    t = Target.parse(other)
    assert parts == {"target": str(t), "triple": t.triple, "cpu": t.cpu, "features": t.features,
                     "l1d_bytes": t.l1d_bytes, "l2_bytes": t.l2_bytes}
    plain_parts = target_part("llvm")
    assert plain_parts["features"] == jit.host_info()["features"] and plain_parts["features"] != parts["features"]
    from tensorfuse.runtime.threads import resolve_num_threads
    info = tensorfuse.cache_info(model, target=other, opt_level=1, num_threads=resolve_num_threads(None))
    assert [d.split(":")[0] for d in info.differences] == ["options.opt_level", "pipeline"]
    x = x_input(5)
    check(m1, x)


def test_default_places(tmp_path, monkeypatch, model):
    monkeypatch.setattr(rc, "_warned", set())
    monkeypatch.delenv("TENSORFUSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rc.cache_dir() == tmp_path / "xdg" / "tensorfuse"
    tensorfuse.compile(model)
    assert len(modules(tmp_path / "xdg" / "tensorfuse")) == 1
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert rc.cache_dir() == tmp_path / "home" / ".cache" / "tensorfuse"
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "mine"))
    assert rc.cache_dir() == tmp_path / "mine"


def test_unwritable_place_means_no_cache_and_one_warning(tmp_path, monkeypatch, model):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    monkeypatch.setattr(rc, "_warned", set())
    x = x_input(1)
    with pytest.warns(rc.CacheWarning, match="compile cache disabled: cannot write to"):
        m = tensorfuse.compile(model)
    check(m, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensorfuse.compile(model)                     # no second warning
        tensorfuse.compile(model, opt_level=0)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_entry_is_dropped_and_rebuilt(cache, model, damage):
    tensorfuse.compile(model)
    entry = next(cache.glob("*.tfm"))
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[:len(data) // 3]
    else:
        data = bytearray(b"\0" * len(data))
    entry.write_bytes(bytes(data))
    calls = jit.STATS["codegen_calls"]
    with pytest.warns(rc.CacheWarning, match="dropped a corrupt entry"):
        m = tensorfuse.compile(model)
    assert m.cache_hit is False and jit.STATS["codegen_calls"] == calls + 1
    x = x_input(2)
    check(m, x)
    assert tensorfuse.compile(model).cache_hit is True          # the rebuilt entry is good


def test_no_temporary_files_left(cache, model):
    tensorfuse.compile(model)
    tensorfuse.compile(model, opt_level=1)
    assert not [n for n in entries(cache) if n.startswith(".tmp")]


def test_dump_ir_bypasses_the_cache(cache, model, tmp_path):
    tensorfuse.compile(model, dump_ir=str(tmp_path / "dump"))
    assert entries(cache) == []


def test_bad_model_still_raises_the_compilers_error(cache, tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        tensorfuse.compile(str(tmp_path / "missing.onnx"))
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    with pytest.raises(ModelLoadError):
        tensorfuse.compile(str(tmp_path / "bad.onnx"))
    assert entries(cache) == []


def test_external_data_files_are_part_of_the_key(cache, tmp_path):
    from onnx import TensorProto, helper, numpy_helper
    c = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "ext",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
                          initializer=[numpy_helper.from_array(c, "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="ext.data", size_threshold=0)
    assert (tmp_path / "ext.data").is_file()
    x = x_input(3)
    m1 = tensorfuse.compile(str(path))
    assert m1.cache_hit is False
    np.testing.assert_array_equal(m1.run(x)[0], x + c)
    assert tensorfuse.compile(str(path)).cache_hit is True
    # new weights in the data file, the .onnx file unchanged: the entry must not be used
    with open(tmp_path / "ext.data", "r+b") as f:
        f.write((c * 2).tobytes())
    m3 = tensorfuse.compile(str(path))
    assert m3.cache_hit is False
    np.testing.assert_array_equal(m3.run(x)[0], x + 2 * c)
    assert tensorfuse.compile(str(path)).cache_hit is True


def test_compile_options_are_one_frozen_normalised_value(model):
    import dataclasses

    from tensorfuse.compiler.options import CompileOptions
    a = CompileOptions.create("llvm", 2, disabled_rules=["FuseConvAdd", "FuseConvActivation"],
                              input_shapes={"x": [4, 64]}, num_threads=1)
    b = CompileOptions.create("llvm   ", 2, disabled_rules=("FuseConvActivation", "FuseConvAdd"),
                              input_shapes={"x": (4, 64)}, num_threads=3)
    assert a == b and a.key(model) == b.key(model)           # num_threads is not part of the key
    assert "num_threads" not in a.key(model)["options"] and "cache" not in a.key(model)["options"]
    assert CompileOptions.create(disabled_rules="FuseConvAdd").disabled_rules == ("FuseConvAdd",)
    assert a.key(model) != CompileOptions.create("llvm", 1).key(model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.opt_level = 3
    with pytest.raises(ValueError, match="opt_level must be 0, 1, 2 or 3"):
        CompileOptions.create(opt_level=5)
    with pytest.raises(ValueError, match=r"input_shapes\['x'\]"):
        CompileOptions.create(input_shapes={"x": ["a"]})
