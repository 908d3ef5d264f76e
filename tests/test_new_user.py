"""What a new user hit (issue 24, item 8): start-up of the command line, the CPU-only install and
the cuda extra, the README's first steps, one ratio convention, cache hits said, export_onnx of a
loaded module, --inputs matched by name, the compile's progress bar, `ir` served by the compile
cache, whole error messages, explain's labels of unnamed nodes, the size of a saved module."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorfuse
from cli_util import cli, run_cli
from oracle import ort_run

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "onnx", "numba", "numba_cuda", "llvmlite", "onnxruntime")


def _relu_tanh() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Tanh", ["r"], ["y"], name="tanh")]
    return helper.make_model(helper.make_graph(nodes, "small", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def _conv_relu_unnamed(cin: int = 3, cout: int = 4, hw: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 + Relu, then Conv 1x1 + Relu; no node has a name."""
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, hw, hw])
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.2, "w")
    w2 = numpy_helper.from_array(rng.standard_normal((cout, cout, 1, 1)).astype(np.float32) * 0.2, "w2")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"]),
             helper.make_node("Relu", ["c2"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w, w2]),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("newuser") / "small.onnx"
    onnx.save(_relu_tanh(), str(p))
    return p


# ----------------------------------------------------------------------------- start-up
def test_help_imports_no_heavy_module():
    code = ("import contextlib, io, sys\n"
            "from tensorfuse.compiler.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['--help']) == 0 and main(['compile', '--help']) == 0 and main(['ir', '--help']) == 0\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"--help imported {r.stdout.strip()}"


# ----------------------------------------------------------------------------- the cuda extra
def test_cpu_install_has_no_gpu_stack_and_make_installs_it():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}
    core = names(proj["dependencies"])
    assert not {n for n in core if n.startswith(("numba", "cuda", "nvidia"))}, core
    assert core >= {"numpy", "onnx", "llvmlite"}
    cuda = names(proj["optional-dependencies"]["cuda"])
    assert cuda >= {"numba", "numba-cuda", "nvidia-nvvm", "nvidia-cuda-nvrtc"}
    make = (ROOT / "Makefile").read_text()
    assert not {n for n in core if n == "ray"}, core         # Ray is the extra [ray], not a dependency
    # make test-cuda and the PTX gate need the cuda extra; the local-Ray tuning test the ray extra
    assert "pip install -q -e '.[test,cuda,ray]'" in make


def test_cuda_target_without_the_gpu_stack_names_the_extra(tmp_path):
    model = tmp_path / "small.onnx"
    onnx.save(_relu_tanh(), str(model))
    code = ("import sys\n"
            "sys.modules['numba_cuda'] = None        # as if pip install tensorfuse without [cuda]\n"
            "import tensorfuse\n"
            "for cache in (True, False):\n"
            "    try:\n"
            f"        tensorfuse.compile({str(model)!r}, target='cuda', cache=cache)\n"
            "    except tensorfuse.CompileError as e:\n"
            "        print('CompileError:', e)\n"
            "print('backend CUDA:', tensorfuse.backend.supports_device('CUDA'))\n"
            "from tensorfuse.compiler.cli import main\n"
            f"sys.exit(main(['compile', {str(model)!r}, '--target', 'cuda', '-o', {str(tmp_path / 'm.tfm')!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert len([ln for ln in lines if ln.startswith("CompileError:") and "pip install 'tensorfuse[cuda]'" in ln
                and "numba-cuda" in ln]) == 2, r.stdout
    assert "backend CUDA: False" in lines
    assert "hint: install the GPU stack: pip install 'tensorfuse[cuda]'" in r.stderr, r.stderr


# ----------------------------------------------------------------------------- README
def test_readme_starts_with_make_and_says_how_to_run_the_command():
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```\n(.*?)```", text, re.S).group(1)
    assert first == "make demo\nmake test\n"
    assert ".venv/bin/tensorfuse" in text and "source .venv/bin/activate" in text


# ----------------------------------------------------------------------------- ratios
def test_bench_ratio_is_tensorfuse_over_onnxruntime(small):
    r = cli("bench", small, "--threads", "1", "--repeat", "3", "--warmup", "1", "--top", "0")
    assert r.returncode == 0, r.stderr
    ours = float(re.search(r"tensorfuse   median +([\d.]+)", r.stdout).group(1))
    theirs = float(re.search(r"onnxruntime  median +([\d.]+)", r.stdout).group(1))
    m = re.search(r"ratio \(tensorfuse / onnxruntime median, lower is better\): ([\d.]+)x onnxruntime", r.stdout)
    assert m, r.stdout
    r, h = float(m.group(1)), 0.0005            # the medians are printed to 0.001 ms, the ratio to 0.01
    assert (ours - h) / (theirs + h) - 0.005 <= r <= (ours + h) / max(theirs - h, 1e-9) + 0.005, (r, ours, theirs)
    demo = (ROOT / "examples" / "demo.py").read_text()
    assert "ratio tensorfuse / onnxruntime" in demo and "ours / theirs" in demo


# ----------------------------------------------------------------------------- cache hits
def test_a_cache_hit_says_so(small, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    first = cli("compile", small, "-o", tmp_path / "a.tfm")
    second = cli("compile", small, "-o", tmp_path / "b.tfm")
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert "from the compile cache" not in first.stdout
    assert re.search(r"^compiled .* in [\d.]+ s \(from the compile cache\):", second.stdout, re.M), second.stdout
    run = cli("run", small)
    assert run.returncode == 0 and run.stdout.startswith(f"compiled {small} in "), run.stdout
    assert " s (from the compile cache); ran it once" in run.stdout.splitlines()[0]


# ----------------------------------------------------------------------------- export_onnx
def test_export_onnx_of_a_loaded_module_is_a_clear_error(tmp_path):
    mod = tensorfuse.compile(_relu_tanh())
    mod.save(tmp_path / "m.tfm")
    loaded = tensorfuse.load(tmp_path / "m.tfm")
    with pytest.raises(ValueError, match=r"loaded from a file \(tensorfuse.load\) keeps only its machine code"):
        tensorfuse.export_onnx(loaded.graph, tmp_path / "opt.onnx")
    with pytest.raises(ValueError, match="loaded from a file"):
        tensorfuse.export_onnx(loaded, tmp_path / "opt.onnx")
    assert not (tmp_path / "opt.onnx").exists()
    tensorfuse.export_onnx(mod, tmp_path / "opt.onnx")          # a compiled module: its graph
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(ort_run(onnx.load(str(tmp_path / "opt.onnx")), {"x": x})[0],
                               ort_run(_relu_tanh(), {"x": x})[0], rtol=1e-6)


# ----------------------------------------------------------------------------- --inputs
def test_inputs_file_with_a_wrongly_named_array_is_an_error(small, tmp_path):
    np.savez(tmp_path / "in.npz", input=np.ones((2, 3), np.float32))      # the model's input is 'x'
    r = cli("run", small, "--inputs", tmp_path / "in.npz")
    assert r.returncode == 2, r.stdout
    err = r.stderr.splitlines()
    assert err[0] == (f"tensorfuse run: error: {tmp_path / 'in.npz'} lacks the model's input(s) ['x']; "
                      f"it has 'input' float32[2, 3]"), r.stderr
    assert err[1].startswith("hint: the model's inputs: x: f32[2,3]") and "numpy.savez(path, x=array" in err[1]
    np.savez(tmp_path / "ok.npz", x=np.ones((2, 3), np.float32))
    assert cli("run", small, "--inputs", tmp_path / "ok.npz").returncode == 0


# ----------------------------------------------------------------------------- progress
@pytest.mark.parametrize("jobs,min_size", [("2", 0), ("1", 10 ** 9)], ids=["parallel", "one-process"])
def test_a_compile_shows_one_bar_over_its_code_generation(jobs, min_size, monkeypatch, capsys):
    from tensorfuse.codegen.llvm import backend
    from tensorfuse import progress
    monkeypatch.setenv("TENSORFUSE_COMPILE_JOBS", jobs)
    monkeypatch.setattr(backend, "PARALLEL_MIN_SIZE", min_size)     # split even this small model
    with progress.enabled(True), progress.task("compiling g") as t:
        mod = tensorfuse.compile(_conv_relu_unnamed(), cache=False)
    k = len(mod.kernels)
    assert k >= 2
    assert t.total == 2 * k and t.n == t.total, (t.n, t.total)       # each kernel's IR and machine code
    assert t.stages[:4] == ["importing", "optimising", "lowering", "generating code"]
    assert t.stages[4] == ("LLVM IR and machine code in 2 processes" if jobs == "2" else "LLVM IR")
    assert "compiling g:" in capsys.readouterr().err
    with progress.enabled(False), progress.task("quiet") as q:
        tensorfuse.compile(_conv_relu_unnamed(seed=1), cache=False)
    assert q.n == q.total > 0 and capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- ir
def test_ir_is_served_by_the_compile_cache(tmp_path, monkeypatch):
    from tensorfuse.compiler import driver
    model = tmp_path / "g.onnx"
    onnx.save(_conv_relu_unnamed(), str(model))
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    fresh = {lvl: cli("ir", model, "--level", lvl) for lvl in ("fused", "kernel", "llvm", "asm")}
    dumped = cli("ir", model, "--level", "llvm", "--diff")       # the dump-based path (no cache)
    for lvl, r in fresh.items():
        assert r.returncode == 0 and r.stdout, (lvl, r.stderr)

    def no_build(*a, **k):
        raise AssertionError("ir compiled from scratch")
    monkeypatch.setattr(driver, "_build", no_build)
    for lvl in ("graph", "fused", "kernel", "llvm", "asm"):
        r = cli("ir", model, "--level", lvl)
        assert r.returncode == 0, (lvl, r.stderr)
        if lvl in fresh:
            assert r.stdout == fresh[lvl].stdout, lvl
    assert "FusedConv" in fresh["fused"].stdout and "define" in fresh["llvm"].stdout
    assert cli("ir", model, "--level", "graph").stdout.count("= Conv(") == 2     # as imported
    assert cli("ir", model, "--level", "llvm", "--diff").stdout == dumped.stdout
    r = cli("ir", model, "--level", "fused", "--diff")          # per-pass dumps: a real compile
    assert r.returncode == 3 and "ir compiled from scratch" in r.stderr


# ----------------------------------------------------------------------------- errors
def test_unsupported_op_error_is_whole_and_its_hint_says_what_to_do(tmp_path):
    names = [f"/encoder/layer.{i}/attention/very_long_module_path_segment_{i:02d}/another_segment/Frobnicate"
             for i in range(8)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("v7", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Frobnicate", ["x" if i == 0 else f"v{i - 1}"], [f"v{i}"], name=n, domain="com.example")
             for i, n in enumerate(names)]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(m, str(tmp_path / "frob.onnx"))
    r = cli("compile", tmp_path / "frob.onnx", "-o", tmp_path / "frob.tfm")
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert lines[0] == "tensorfuse compile: error: the model uses ops tensorfuse does not support:", r.stderr
    assert lines[1] == "  com.example::Frobnicate: " + ", ".join(names), r.stderr
    hint = lines[2]
    assert hint.startswith("hint: ") and len(lines) == 3, r.stderr
    assert "Frobnicate" not in hint and "not support" not in hint and "named in the message" not in hint
    assert "register a lowering" in hint


# ----------------------------------------------------------------------------- explain
def test_explain_labels_unnamed_nodes_as_the_compiler_does(tmp_path):
    model = tmp_path / "unnamed.onnx"
    onnx.save(_conv_relu_unnamed(), str(model))
    text = str(tensorfuse.explain_report(str(model)))
    anchors = text.split("anchor ops of the model and the rules that fused them:\n")[1].splitlines()
    assert anchors == ["  Conv 'Conv_0' -> tensorfuse::FusedConv 'Conv_0': FuseConvActivation; with Relu 'Relu_1'",
                       "  Conv 'Conv_2' -> tensorfuse::FusedConv 'Conv_2': FuseConvActivation; with Relu 'Relu_3'"]
    assert "+ FuseConvActivation: Conv_0, Relu_1 -> Conv_0" in text
    one = str(tensorfuse.explain_report(str(model), node="Conv_2"))
    assert "Conv 'Conv_2' -> tensorfuse::FusedConv 'Conv_2'" in one
    # Conv_0 is named only as Conv_2's producer (why a rule rooted at Conv_2 does not apply),
    # never with its own applications or report lines
    assert all("Conv_0" not in ln or "produced by" in ln for ln in one.splitlines()), one
    r = cli("explain", model)
    assert r.returncode == 0 and "Conv ''" not in r.stdout and "Conv 'Conv_0' ->" in r.stdout


# ----------------------------------------------------------------------------- saved size
def test_a_saved_module_holds_only_the_constants_its_code_reads(tmp_path):
    # a 3x3 convolution whose weight the blocked schedule packs: the file held the original as
    # well as the packed copy (resnet18: 95.3 MB of constants for 46.8 MB of weights)
    model = _conv_relu_unnamed(cin=32, cout=64, hw=12)
    weights = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    mod = tensorfuse.compile(model)
    mod.save(tmp_path / "m.tfm")
    with zipfile.ZipFile(tmp_path / "m.tfm") as z:
        meta = json.loads(z.read("tensorfuse.json"))
        consts = z.getinfo("consts.bin").file_size
    read = {s for c in meta["calls"] for s in c["slots"]}
    assert {e["slot"] for e in meta["consts"]} <= read
    assert consts < 1.25 * weights, (consts, weights)
    x = np.random.default_rng(3).standard_normal((1, 32, 12, 12)).astype(np.float32)
    (got,) = tensorfuse.load(tmp_path / "m.tfm").run(x)
    (want,) = ort_run(model, {"x": x})
    assert float(np.abs(want).max()) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- another CPU
def _other_cpu_target() -> str | None:
    """A target whose code needs a CPU feature this CPU lacks, or None."""
    from tensorfuse.codegen.llvm import jit
    have = {f[1:] for f in jit.host_info()["features"].split(",") if f.startswith("+")}
    lacking = [f for f in ("amx-tile", "avx512fp16", "avx10.2", "sm4", "sve2", "sme") if f not in have]
    return f"llvm -mattr=+{lacking[0]}" if lacking else None


OTHER_CPU = _other_cpu_target()
needs_other_cpu = pytest.mark.skipif(OTHER_CPU is None, reason="this CPU has every feature the test could ask for")


@needs_other_cpu
def test_running_code_for_another_cpu_is_a_usage_error_with_the_compile_hint(small, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    from tensorfuse.runtime.module import CPUFeaturesError
    mod = tensorfuse.compile(small, target=OTHER_CPU, cache=False)
    with pytest.raises(CPUFeaturesError, match="which this CPU lacks") as e:
        mod.run(np.zeros((2, 3), np.float32))
    assert isinstance(e.value, RuntimeError)
    for command in ("run", "bench", "verify"):
        r = cli(command, small, "--target", OTHER_CPU)
        err = r.stderr.splitlines()
        assert r.returncode == 2, (command, r.stderr)
        assert err[0].startswith(f"tensorfuse {command}: error: this module was compiled for target "
                                 f"'{OTHER_CPU}'") and "which this CPU lacks" in err[0], r.stderr
        assert err[1].startswith("hint: ") and "bug" not in err[1], r.stderr
        assert f"tensorfuse compile MODEL --target \"{OTHER_CPU}\" -o OUT.tfm" in err[1], r.stderr
    assert cli("compile", small, "--target", OTHER_CPU, "-o", tmp_path / "other.tfm").returncode == 0
    r = cli("run", tmp_path / "other.tfm")
    assert r.returncode == 2 and "lacks" in r.stderr.splitlines()[0], r.stderr
    hint = r.stderr.splitlines()[1]
    assert "CPU that has these features" in hint and "version" not in hint, hint


@needs_other_cpu
def test_the_cache_serves_a_module_compiled_for_another_cpu(small, tmp_path, monkeypatch):
    import warnings
    from tensorfuse.runtime.module import CPUFeaturesError
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no "dropped a corrupt entry"
        first = tensorfuse.compile(small, target=OTHER_CPU)
        second = tensorfuse.compile(small, target=OTHER_CPU)
    assert first.cache_hit is False and second.cache_hit is True
    assert len(list((tmp_path / "cache").glob("*.tfm"))) == 1
    with pytest.raises(CPUFeaturesError, match="which this CPU lacks"):
        second.run(np.zeros((2, 3), np.float32))
    second.save(tmp_path / "s.tfm")             # what it is served for
    with zipfile.ZipFile(tmp_path / "s.tfm") as z:
        assert json.loads(z.read("tensorfuse.json"))["target"] == OTHER_CPU


def test_a_cache_warning_is_one_line_on_the_command_line(small, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORFUSE_CACHE_DIR", str(tmp_path / "cache"))
    assert cli("compile", small, "-o", tmp_path / "a.tfm").returncode == 0
    (entry,) = (tmp_path / "cache").glob("*.tfm")
    entry.write_bytes(entry.read_bytes()[:100])             # truncated
    r = run_cli("compile", small, "-o", tmp_path / "b.tfm")
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("tensorfuse: warning: tensorfuse compile cache: dropped a corrupt "
                                               "entry and rebuilding it ("), r.stderr


# ----------------------------------------------------------------------------- verify --inputs
def test_verify_checks_given_inputs_before_onnxruntime(small, tmp_path):
    with pytest.raises(ValueError, match=re.escape("input 'x': expected shape [2, 3], got [1, 3]")):
        tensorfuse.verify(small, inputs={"x": np.zeros((1, 3), np.float32)})
    with pytest.raises(ValueError, match=re.escape("input 'x': expected dtype float32, got float64")):
        tensorfuse.verify(small, inputs={"x": np.zeros((2, 3), np.float64)})
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 3), np.float32))
    r = cli("verify", small, "--inputs", tmp_path / "in.npz")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[0] == "tensorfuse verify: error: input 'x': expected shape [2, 3], got [1, 3]"
    assert "onnxruntime" not in r.stderr
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    assert tensorfuse.verify(small, inputs={"x": x}).ok


# ----------------------------------------------------------------------------- number options
@pytest.mark.parametrize("args,message", [
    (("run", "--seed", "-1"), "argument --seed: must be >= 0, got -1"),
    (("bench", "--seed", "-2"), "argument --seed: must be >= 0, got -2"),
    (("verify", "--seed", "-1"), "argument --seed: must be >= 0, got -1"),
    (("bench", "--top", "-1"), "argument --top: must be >= 0, got -1"),
    (("bench", "--repeat", "0"), "argument --repeat: must be >= 1, got 0"),
    (("bench", "--warmup", "-1"), "argument --warmup: must be >= 0, got -1"),
    (("run", "--threads", "0"), "argument --threads: must be >= 1, got 0"),
    (("verify", "--rtol=-0.001"), "argument --rtol: must be >= 0, got -0.001"),
    (("verify", "-O", "0"), "argument -O/--opt-level: invalid choice: 0"),
])
def test_number_options_are_checked_by_the_parser(small, args, message):
    r = cli(args[0], small, *args[1:])
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_help_texts_give_levels_and_defaults(capsys):
    for command in ("verify", "bench", "compile"):
        with pytest.raises(SystemExit):
            tensorfuse.compiler.cli.build_parser().parse_args([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "optimisation level 1..3 (default 2)" in out                  # verify refuses -O 0
    assert out.count("seed of the random inputs (default 0)") == 2      # verify's and bench's


# ----------------------------------------------------------------------------- random indices
def test_an_index_out_of_range_from_random_inputs_says_so(tmp_path):
    from tensorfuse.runtime.module import RunCheckError
    d = helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3])
    i = helper.make_tensor_value_info("idx", TensorProto.INT64, [5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])
    g = helper.make_graph([helper.make_node("Gather", ["data", "idx"], ["y"], name="gather")], "g", [d, i], [y])
    model = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    mod = tensorfuse.compile(model, cache=False)
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(RunCheckError, match=r"Gather node 'gather': index in input 'idx' out of range \[-4, 3\]: got 8"):
        mod.run(data=data, idx=np.array([0, 8, 1, 2, 3]))
    for command in ("run", "bench", "verify"):
        r = cli(command, model, "--seed", "3")          # seed 3 draws an index >= 4
        err = r.stderr.splitlines()
        assert r.returncode == 2 and "out of" in err[0], (command, r.stderr)
        assert err[-1].startswith("hint: the values came from random inputs (integers drawn from 0..9, seed 3)") \
            and "--inputs IN.npz" in err[-1], (command, r.stderr)
    idx = np.array([3, 0, -1, 2, 1])
    np.savez(tmp_path / "in.npz", data=data, idx=idx)
    r = cli("run", model, "--inputs", tmp_path / "in.npz")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(mod.run(data=data, idx=idx)[0], ort_run(onnx.load(str(model)),
                                                                          {"data": data, "idx": idx})[0])


# ----------------------------------------------------------------------------- ir --after
def test_ir_after_an_unknown_pass_lists_the_passes(small):
    r = cli("ir", small, "--after", "nosuchpass")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == ("tensorfuse ir: error: unknown pass 'nosuchpass'; passes at O2: "
                                        "quantize, fold_constants, dce, cse, simplify, fold_rules, fuse, fuse_ops"), r.stderr
    r = cli("ir", small, "-O", "1", "--after", "fuse_ops")
    assert r.returncode == 2 and "passes at O1: fold_constants, dce, cse, simplify\n" in r.stderr, r.stderr
    r = cli("ir", small, "--after", "fuse_ops")                  # a pass of the pipeline that changed it
    assert r.returncode == 0 and "Relu" in r.stdout and "Tanh" in r.stdout, r.stderr


# ----------------------------------------------------------------------------- graph without graphviz
def test_graph_without_graphviz_says_it_replaced_the_dot_file(small, tmp_path, monkeypatch):
    import tensorfuse.compiler.dot as dotmod
    monkeypatch.setattr(dotmod, "render_svg", lambda source: None)
    r = cli("graph", small, "-o", tmp_path / "g.html")
    assert r.returncode == 0 and f"wrote {tmp_path / 'g.dot'} instead of {tmp_path / 'g.html'};" in r.stdout, r.stdout
    (tmp_path / "g.dot").write_text("the user's own file")
    r = cli("graph", small, "-o", tmp_path / "g.html")
    assert r.returncode == 0, r.stderr
    assert (f"wrote {tmp_path / 'g.dot'} instead of {tmp_path / 'g.html'} (it replaced the file that was there);"
            in r.stdout), r.stdout
    assert (tmp_path / "g.dot").read_text().startswith("digraph")
    r = cli("graph", small, "-o", tmp_path / "one.dot")         # Relu + Tanh: one fused kernel
    assert r.returncode == 0 and f"wrote {tmp_path / 'one.dot'} (1 cluster);" in r.stdout, r.stdout


# ----------------------------------------------------------------------------- compile's outputs
def test_compile_outputs_said_plainly(small, tmp_path, capsys):
    r = cli("compile", small, "-o", os.devnull)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == f"wrote {os.devnull}", r.stdout   # nothing to run
    assert "1 kernel call (1 distinct kernel), 0 rule applications," in r.stdout.splitlines()[0], r.stdout
    r = cli("compile", small, "-o", "")
    assert r.returncode == 2 and r.stderr.startswith("tensorfuse compile: error: -o '' names no file"), r.stderr
    (tmp_path / "afile").write_text("x")
    r = cli("compile", small, "-o", tmp_path / "m.tfm", "--dump-ir", tmp_path / "afile" / "x")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[0] == (f"tensorfuse compile: error: --dump-ir {tmp_path / 'afile' / 'x'}: cannot "
                                        f"create the folder: Not a directory"), r.stderr
    assert not (tmp_path / "m.tfm").exists()
    with pytest.raises(SystemExit):
        tensorfuse.compiler.cli.build_parser().parse_args(["compile", "--help"])
    assert "(default: MODEL's base name with .tfm, in the current folder)" in " ".join(capsys.readouterr().out.split())
    r = cli("bench", small, "--repeat", "1", "--warmup", "0")
    assert r.returncode == 0 and ", 1 run after 0 warm-up (" in r.stdout and "1 kernel call)" in r.stdout, r.stdout


def test_the_fusion_rule_guide_counts_its_rule_right():
    text = (ROOT / "docs" / "writing-a-fusion-rule.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    said = int(re.search(r"That is the whole rule \((\d+) lines of code\)", text).group(1))
    assert said == sum(1 for ln in block.splitlines() if ln.strip())


@pytest.mark.parametrize("tqdm_there", [True, False], ids=["tqdm", "simple"])
def test_the_progress_bar_ends_at_100_percent(tqdm_there, monkeypatch, capsys):
    from tensorfuse import progress
    if not tqdm_there:
        monkeypatch.setitem(sys.modules, "tqdm", None)          # import fails: the simple bar
    with progress.enabled(True), progress.task("compiling m") as t:
        t.expect(25)
        t.advance(12)                   # 48%; the rest skipped (a cache hit) or not yet drawn
    frames = [f for f in re.split(r"[\r\n]", capsys.readouterr().err) if "compiling m:" in f]
    assert frames and "100%" in frames[-1], frames
    assert t.n == t.total == 25


def test_profile_stops_at_an_index_out_of_range(tmp_path):
    from tensorfuse.runtime.module import RunCheckError
    d = helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3])
    i = helper.make_tensor_value_info("idx", TensorProto.INT64, [5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])
    g = helper.make_graph([helper.make_node("Gather", ["data", "idx"], ["y"], name="gather")], "g", [d, i], [y])
    mod = tensorfuse.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), cache=False)
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(RunCheckError, match=r"index in input 'idx' out of range \[-4, 3\]: got 1000000"):
        mod.profile(data=data, idx=np.array([0, 1000000, 1, 2, 3]), repeat=1)
    assert len(mod.profile(data=data, idx=np.array([0, 3, 1, 2, -1]), repeat=2).rows) == len(mod.calls)
