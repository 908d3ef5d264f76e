"""The public package: ``import tensorfuse`` gives the user API, the repository's folders install
as ``tensorfuse.*`` sub-packages, and nothing generic (``compiler``, ``runtime``, ``ir``,
``codegen``) lands at the top level of site-packages or ``sys.modules``."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib
import zipfile

import pytest

import tensorfuse

ROOT = pathlib.Path(__file__).resolve().parent.parent
GENERIC = ("compiler", "runtime", "ir", "codegen")


def test_public_api_names_resolve():
    for name in tensorfuse.__all__:
        assert getattr(tensorfuse, name) is not None, name
    assert tensorfuse.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert issubclass(tensorfuse.CompileError, tensorfuse.TensorfuseError)
    assert hasattr(tensorfuse.backend, "prepare")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tensorfuse.nope  # noqa: B018


def test_onnx_backend_imports_as_a_module():
    """``import tensorfuse.backend`` as with onnxruntime.backend (it failed: the attribute existed,
    the module did not), and it runs a model."""
    import numpy as np
    from onnx import TensorProto, helper

    import tensorfuse.backend as backend
    assert backend is tensorfuse.backend
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    a = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    assert backend.supports_device("CPU")
    (out,) = backend.run_model(model, [a])
    np.testing.assert_array_equal(out, np.maximum(a, 0))


def test_pyproject_lists_every_sub_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"tensorfuse"} | {
        "tensorfuse." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in GENERIC for p in (ROOT / top).rglob("__init__.py")}
    assert listed == found


def test_no_generic_top_level_modules_are_imported():
    code = ("import sys, tensorfuse, tensorfuse.compiler, tensorfuse.runtime, tensorfuse.ir.ops, "
            "tensorfuse.codegen.llvm.jit\n"
            f"bad = [m for m in sys.modules if m.split('.')[0] in {GENERIC!r}]\n"
            "assert not bad, bad\n")
    # run from another directory so that the repository root is not on sys.path
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_python_dash_m_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "tensorfuse", "--help"], cwd=ROOT / "tests",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage: tensorfuse" in r.stdout


@pytest.mark.slow
def test_the_wheel_installs_only_the_tensorfuse_package(tmp_path):
    # what `pip install .` would put into site-packages: build the wheel and read its file list
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = tmp_path.glob("tensorfuse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tensorfuse", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for sub in ("tensorfuse/__init__.py", "tensorfuse/__main__.py", "tensorfuse/compiler/driver.py",
                "tensorfuse/ir/ops/__init__.py", "tensorfuse/codegen/llvm/jit.py", "tensorfuse/runtime/module.py"):
        assert sub in names, sub
    assert not any(n.startswith(("tensorfuse/tests/", "tensorfuse/benchmarks/", "tensorfuse/examples/")) for n in names)
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "tensorfuse = tensorfuse.compiler.cli:main" in entry


def test_the_demo_runs(tmp_path):
    """``make demo`` is the README's first command: examples/demo.py on a small model (the
    bundled MobileNetV2 is what make demo runs; the script takes any model path). It was broken
    by the package rename (``tensorfuse`` used, ``compiler`` imported) and no test noticed."""
    import subprocess
    import sys

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "demo",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=[w])
    p = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    demo = pathlib.Path(__file__).resolve().parent.parent / "examples" / "demo.py"
    r = subprocess.run([sys.executable, str(demo), str(p)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "max abs error:" in r.stdout and "time per run:    tensorfuse" in r.stdout
    assert "output change:" in r.stdout and "warning" not in r.stdout
    # a model whose output does not depend on its input: its error figure shows nothing (the
    # bundled MobileNetV2 was such a model: random weights, activations dying out with depth)
    zero = numpy_helper.from_array(np.zeros((1, 3, 8, 8), np.float32), "zero")
    g = helper.make_graph([helper.make_node("Mul", ["x", "zero"], ["y"])], "blind",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], initializer=[zero])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    r = subprocess.run([sys.executable, str(demo), str(p)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "output change:   0 between two random inputs" in r.stdout
    assert "warning:         the output hardly depends on the input" in r.stdout
