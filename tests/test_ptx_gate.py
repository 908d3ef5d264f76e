"""The PTX gate (``compiler.ptx_gate``, its library ``codegen.cuda.ptx_gate``): kernels exported
by ``codegen.cuda.jit`` compile to PTX for sm_90 with ``numba.cuda.compile_ptx`` (no GPU),
failures are reported and make the exit status 1, and the regressions the gate found stay fixed.

Runs in the default suite, where numba is imported without the simulator; skipped under it.
"""
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

numba_config = pytest.importorskip("numba.core.config")
pytestmark = pytest.mark.skipif(bool(numba_config.ENABLE_CUDASIM), reason="PTX needs numba without the simulator")

from test_codegen_cuda_ptx import _nvvm_ok  # noqa: E402  (tests/ is on sys.path: conftest)


needs_nvvm = pytest.mark.skipif(not _nvvm_ok(), reason="libNVVM not found (pip install nvidia-nvvm==13.0.88)")


def _kernels(nodes, inputs, outputs):
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    m = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs), opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 10
    g = import_onnx(m)
    optimize(g, 2, target="cuda")
    return lower_graph(g, Target.parse("cuda")).kernels


def _f16_to_bool_kernels():
    h, b = TensorProto.FLOAT16, TensorProto.BOOL
    return _kernels([helper.make_node("IsNaN", ["x"], ["n"]), helper.make_node("IsInf", ["x"], ["i"]),
                     helper.make_node("Cast", ["x"], ["c"], to=b)],
                    [helper.make_tensor_value_info("x", h, [2, 8])],
                    [helper.make_tensor_value_info(v, b, [2, 8]) for v in ("n", "i", "c")])


def _relu_kernels():
    f = TensorProto.FLOAT
    return _kernels([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", f, [4, 8])],
                    [helper.make_tensor_value_info("y", f, [4, 8])])


def test_unresolved_externs_finds_extern_functions():
    from tensorfuse.codegen.cuda.ptx_gate import unresolved_externs
    ptx = (".version 9.0\n.target sm_90\n"
           ".extern .func  (.param .b32 func_retval0) _ZneRK6__halfS1__nbst\n(\n\t.param .b64 p0\n);\n"
           ".extern .func vprintf(.param .b64 a, .param .b64 b);\n"
           ".visible .entry k(\n)\n{\n\tret;\n}\n")
    assert unresolved_externs(ptx) == ["_ZneRK6__halfS1__nbst", "vprintf"]
    assert unresolved_externs(".visible .entry k()\n{\n ret;\n}\n") == []


def test_export_sources_writes_source_and_dtypes_once(tmp_path):
    from tensorfuse.codegen.cuda.jit import build_library, export_sources
    from tensorfuse.codegen.cuda.ptx_gate import read_sources
    lib = build_library(_relu_kernels(), cache_dir=str(tmp_path / "cache"))
    paths = export_sources(lib, str(tmp_path / "out"))
    assert paths == export_sources(lib, str(tmp_path / "out"))      # content-addressed: the same files
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        [os.path.basename(p) for p in paths] + [os.path.basename(p)[:-3] + ".json" for p in paths])
    units = read_sources(str(tmp_path / "out"))
    assert [(u.kernel, u.dtypes) for u in units] == [(n, ["f32", "f32"]) for n in lib.kernel_names]
    meta = json.loads((tmp_path / "out" / (os.path.basename(paths[0])[:-3] + ".json")).read_text())
    assert meta["launches"] == [[list(g), list(b)] for g, b in lib.launch_config(lib.kernel_names[0])]
    with open(paths[0]) as f:
        assert f.read() == lib.sources[lib.kernel_names[0]]


def test_sources_dir_env_exports_every_library(tmp_path, monkeypatch):
    from tensorfuse.codegen.cuda.jit import SOURCES_DIR_ENV, build_library
    monkeypatch.setenv(SOURCES_DIR_ENV, str(tmp_path / "exported"))
    lib = build_library(_relu_kernels(), cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "exported").glob("tf_*.py"))) == len(lib.kernel_names) == 1


@needs_nvvm
def test_f16_isnan_isinf_cast_bool_compile_without_extern_functions(tmp_path):
    # regression: IsNaN of float16 was emitted as `x != x` and Cast float16 -> bool as
    # `x != float16(0.0)` on float16 values, whose numba-cuda lowering calls the external C++
    # shim _ZneRK6__halfS1__nbst: compile_ptx accepted it, ptxas rejected it ("Unresolved extern
    # function"), and the PTX does not load on its own. Both now compare in float32.
    from tensorfuse.codegen.cuda.jit import build_library, export_sources
    from tensorfuse.codegen.cuda.ptx_gate import compile_unit, read_sources
    lib = build_library(_f16_to_bool_kernels(), cache_dir=str(tmp_path / "cache"))
    src = " ".join(lib.sources.values())
    assert "float16(0.0)" not in src and "float32(g_x[" in src
    export_sources(lib, str(tmp_path / "out"))
    units = read_sources(str(tmp_path / "out"))
    assert units
    for u in units:
        r = compile_unit(u, (9, 0), None)
        assert r.error is None, r.error
        assert r.entries >= 1 and r.ptx_bytes > 0


@needs_nvvm
def test_gate_passes_good_kernels_and_fails_bad_ones(tmp_path, capsys):
    from tensorfuse.codegen.cuda.jit import build_library, export_sources
    from tensorfuse.compiler.ptx_gate import main
    good = tmp_path / "good"
    export_sources(build_library(_relu_kernels(), cache_dir=str(tmp_path / "cache")), str(good))
    assert main(["--sources", str(good), "--jobs", "1", "--no-ptxas", "--cache", str(tmp_path / "ok")]) == 0
    out = capsys.readouterr().out
    assert "1 kernels, 1 unique (1 launch functions), 1 compiled here, 0 failed" in out
    # the second run finds it in the cache
    assert main(["--sources", str(good), "--jobs", "1", "--no-ptxas", "--cache", str(tmp_path / "ok")]) == 0
    assert "0 compiled here, 0 failed" in capsys.readouterr().out
    # a source the simulator would run but NVVM cannot type: a list in kernel code
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tf_bad.py").write_text("from numba import cuda\n\n"
                                   "def k_bad(g_x):\n    i = cuda.grid(1)\n    t = [1.0, 2.0]\n"
                                   "    if i < 2:\n        g_x[i] = t.pop()\n\n"
                                   "LAUNCHES = (('k_bad', (1,), (2,)),)\n")
    (bad / "tf_bad.json").write_text(json.dumps({"kernel": "bad_0", "dtypes": ["f32"], "launches": [[[1], [2]]]}))
    assert main(["--sources", str(bad), "--jobs", "1", "--no-ptxas"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED bad_0 ({bad / 'tf_bad.py'}): k_bad: compile_ptx:" in out
    assert "1 kernels, 1 unique, 1 failed" in out
    # an empty folder is a failure, not a pass
    (tmp_path / "empty").mkdir()
    assert main(["--sources", str(tmp_path / "empty"), "--jobs", "1"]) == 1
    assert "no exported kernels" in capsys.readouterr().out
