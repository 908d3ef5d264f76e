"""Parallel LLVM code generation (codegen/llvm/backend.py ``_build_in_parts``): a large module's
kernels are dealt into groups emitted and compiled in forked children and linked as several
objects. Each kernel must be defined once, the linked code must compute what one object computes (the
relocation model once made it read wrong constants across objects: mobilenet_v2's output moved
by 0.15), a saved module must load, and a child that dies must be our CompileError."""
from __future__ import annotations

import os
import re
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.codegen.llvm import jit
from tensorfuse.ir.errors import CompileError


def _model() -> onnx.ModelProto:
    """Conv+Relu, a Softmax and an Exp/Tanh chain: kernels that use vector constants (masks,
    polynomial coefficients), which is where cross-object references go wrong."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 13])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 13])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 12, 13])
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1),
             helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Tanh", ["e"], ["t"]),
             helper.make_node("Mul", ["t", "r"], ["z"])]
    g = helper.make_graph(nodes, "par", [x], [y, z], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds():
    return np.random.default_rng(1).standard_normal((1, 8, 12, 13)).astype(np.float32)


@pytest.fixture
def split_everything(monkeypatch):
    """Split every module however small, into as many parts as asked."""
    from tensorfuse.codegen.llvm import backend
    monkeypatch.setattr(backend, "PARALLEL_MIN_SIZE", 0)
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "3")


def _defined(text: str) -> list[str]:
    return re.findall(r'^define (?!internal|private)[^@]*@"?([^"(]+)"?\(', text, re.M)


def test_parts_compute_what_one_object_computes(split_everything, monkeypatch, tmp_path):
    x = _feeds()
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "1")
    one = tensorfuse.compile(_model(), cache=False)
    # the module's object and the team helpers' (jit.team_runtime_object), linked as one
    assert jit.unpack_objects(one._object_code)[1:] == [jit.team_runtime_object()]
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "3")
    many = tensorfuse.compile(_model(), cache=False)
    assert len(jit.unpack_objects(many._object_code)) == 3 + 1
    a, b = one.run(x), many.run(x)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)                          # the same code, bit for bit
    # and against the oracle
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(_model().SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for u, r in zip(b, ref):
        np.testing.assert_allclose(u, r, rtol=1e-5, atol=1e-5)
    path = tmp_path / "m.tfm"
    many.save(str(path))
    back = tensorfuse.load(str(path))
    for u, v in zip(back.run(x), b):
        np.testing.assert_array_equal(u, v)


def test_pack_unpack_objects():
    objs = [b"\x7fELF one", b"\x7fELF two two", b"3"]
    blob = jit.pack_objects(objs)
    assert jit.unpack_objects(blob) == objs
    assert jit.pack_objects([b"\x7fELF"]) == b"\x7fELF"              # one object stays itself
    assert jit.unpack_objects(b"\x7fELF") == [b"\x7fELF"]
    with pytest.raises(ValueError, match="truncated"):
        jit.unpack_objects(blob[:-3])


def test_a_child_that_dies_is_a_compile_error(split_everything, monkeypatch):
    parent = os.getpid()
    real = jit._compile_part

    def dies_in_child(text, name, opt, target):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGABRT)     # what an LLVM abort does
        return real(text, name, opt, target)
    monkeypatch.setattr(jit, "_compile_part", dies_in_child)
    with pytest.raises(CompileError, match=r"died in a child process \(signal 6\)"):
        tensorfuse.compile(_model(), cache=False)


def test_compile_jobs_setting(monkeypatch):
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "1")
    assert jit.compile_jobs() == 1
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "two")
    with pytest.raises(ValueError, match="TENSORFUSE_COMPILE_JOBS"):
        jit.compile_jobs()
    monkeypatch.delenv("TENSORFUSE_COMPILE_JOBS")
    assert 1 <= jit.compile_jobs() <= 8


def test_kernels_emitted_in_parts_give_one_module_text(split_everything, monkeypatch):
    """With the kernels emitted and compiled in forked children, ``mod.llvm_ir`` is still one
    valid module (what the IR dumps and tests/codegen_util read), each kernel defined once,
    and it compiles to the same results."""
    from tensorfuse.codegen.llvm.backend import kernel_groups, kernel_size
    mod = tensorfuse.compile(_model(), cache=False)
    groups = kernel_groups(mod.kernels, 3)
    assert len(groups) == 3 and sorted(k.name for g in groups for k in g) == sorted(k.name for k in mod.kernels)
    sizes = sorted(sum(kernel_size(k.body) for k in g) for g in groups)
    assert sizes[0] > 0
    text = mod.llvm_ir
    jit.parse_and_verify(text, "merged")
    names = _defined(text)
    from tensorfuse.codegen.llvm.emit import TEAM_HELPERS
    assert sorted(names) == sorted([k.name for k in mod.kernels] + ["tf_run"])
    assert not re.search(r'^declare [^@]*@"(%s)"\(' % "|".join(map(re.escape, names)), text, re.M)
    # the team helpers are linked in as their own object (jit.team_runtime_object), not in the IR
    assert all(mod._lib.address(n) for n in TEAM_HELPERS)
    lib, _, _ = jit.compile_ir(text, "again")
    assert lib.address("tf_run")
    np.testing.assert_array_equal(mod.run(_feeds())[0], tensorfuse.compile(_model(), cache=False).run(_feeds())[0])
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "1")
    assert len(kernel_groups(mod.kernels, 1)) == 1


def _strided_slices_model(n: int = 4) -> onnx.ModelProto:
    """``n`` strided Slices of x (every other column from offset i): generic kernels whose
    loop around the innermost one carries loop metadata (``!llvm.loop``), one per part."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 10, 32])
    ys = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4, 4, 32]) for i in range(n)]
    ints = lambda name, v: onnx.numpy_helper.from_array(np.asarray(v, np.int64), name)     # noqa: E731
    inits = [ints("axes", [1]), ints("steps", [2]), ints("ends", [10])]
    nodes = []
    for i in range(n):
        inits.append(ints(f"start{i}", [i]))
        nodes.append(helper.make_node("Slice", ["x", f"start{i}", "ends", "axes", "steps"], [f"s{i}"]))
        nodes.append(helper.make_node("Slice", [f"s{i}", "zero", "four", "axes"], [f"y{i}"]))
    inits += [ints("zero", [0]), ints("four", [4])]
    g = helper.make_graph(nodes, "strided", [x], ys, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_metadata_of_parts_is_renumbered_in_the_module_text(split_everything, monkeypatch):
    """Each part numbers its metadata from !0: the merged ``llvm_ir`` renumbers them, so it
    parses, and every loop keeps its own loop ID (as many as one part's text has)."""
    m = _strided_slices_model()
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "1")
    one = tensorfuse.compile(m, cache=False)
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", "3")
    many = tensorfuse.compile(m, cache=False)
    assert len(jit.unpack_objects(many._object_code)) == 3 + 1
    ids = re.findall(r", !llvm\.loop (!\d+)", many.llvm_ir)
    assert len(ids) == len(re.findall(r", !llvm\.loop (!\d+)", one.llvm_ir)) >= 3
    assert len(set(ids)) == len(ids)                 # a loop ID of its own each
    for i in ids:                                    # each defined once, referring to itself
        assert len(re.findall(r"^%s = !\{ %s, " % (i, i), many.llvm_ir, re.M)) == 1
    jit.parse_and_verify(many.llvm_ir, "merged")
    x = np.random.default_rng(2).standard_normal((4, 10, 32)).astype(np.float32)
    for u, v in zip(one.run(x), many.run(x)):
        np.testing.assert_array_equal(u, v)
    for i, u in enumerate(many.run(x)):
        np.testing.assert_array_equal(u, x[:, i::2][:, :4])
