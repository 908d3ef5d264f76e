"""The ``tensorfuse`` command line through subprocesses: every subcommand with its exit code
(0 success, 1 mismatch in verify, 2 bad usage or input with a one-line error and a hint)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from llvmlite import binding as llvm

import tensorfuse
from cli_util import WRONG_RULE, bn_chain, cli, parse_dot, run_cli, shared_consumer_model
from oracle import ort_run

COMMANDS = ("compile", "run", "bench", "ir", "explain", "verify", "graph", "tune")


@pytest.fixture(scope="module")
def bn_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "bn_chain.onnx"
    onnx.save(bn_chain(1), str(path))
    return path


def _one_line_error(r, command: str):
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 2 and lines[0].startswith(f"tensorfuse {command}: error: ") and \
        lines[1].startswith("hint: "), r.stderr
    return lines[0]


def test_help_lists_every_command_with_examples():
    r = run_cli("--help")
    assert r.returncode == 0
    for c in COMMANDS:
        assert f"\n    {c} " in r.stdout, c
    h = run_cli("verify", "--help")
    assert h.returncode == 0 and "example:\n  tensorfuse verify" in h.stdout
    for c in COMMANDS:
        h = cli(c, "--help")
        assert h.returncode == 0 and "example:\n  tensorfuse " + c in h.stdout, c
    assert run_cli().returncode == 2                        # no command: usage on stderr
    r = cli("compile")
    assert r.returncode == 2 and "required: MODEL" in r.stderr
    assert cli("frobnicate").returncode == 2


def test_bad_input_is_one_line_and_a_hint(tmp_path):
    r = run_cli("compile", tmp_path / "nope.onnx")
    assert r.returncode == 2 and "no such file" in _one_line_error(r, "compile")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    r = run_cli("run", junk)
    assert r.returncode == 2 and "is not a valid ONNX model" in _one_line_error(r, "run")
    r = cli("run", junk, "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr
    r = cli("compile", junk, "--input-shape", "x:1,2")
    assert r.returncode == 2 and "--input-shape 'x:1,2' is not NAME=D1,D2" in _one_line_error(r, "compile")
    r = cli("verify", junk, "--rules", "tests/wrong_rules.py:Nope")
    assert r.returncode == 2 and "has no 'Nope'" in _one_line_error(r, "verify")
    assert "FoldBatchNormDropShift" in r.stderr             # the hint lists the rules it has


def test_compile_then_run_a_saved_module(bn_model, tmp_path):
    out = tmp_path / "m.tfm"
    r = run_cli("compile", bn_model, "-o", out, "-O", "2", "--input-shape", "x=1,3,8,8")
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout and "kernel calls" in r.stdout
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (ref,) = ort_run(onnx.load(str(bn_model)), {"x": x})
    (got,) = tensorfuse.load(out).run(x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    np.savez(tmp_path / "in.npz", x=x)
    r = run_cli("run", out, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert r.returncode == 0, r.stderr
    assert "output y: float32[1, 4, 8, 8]" in r.stdout and "loaded" in r.stdout
    r = cli("run", out, "--inputs", tmp_path / "in.npz", "--target", "llvm -mcpu=znver3", "-O", "3")
    assert r.returncode == 0 and "is a saved module" in r.stderr and "--target, -O do not apply" in r.stderr
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_allclose(z["y"], ref, rtol=1e-4, atol=1e-5)
    np.savez(tmp_path / "bad.npz", z=x, w=x)
    r = cli("run", out, "--inputs", tmp_path / "bad.npz")
    assert r.returncode == 2 and "lacks the model's input(s) ['x']" in _one_line_error(r, "run")
    np.savez(tmp_path / "extra.npz", x=x, xx=x)      # an unknown name is an error, not ignored
    r = cli("run", out, "--inputs", tmp_path / "extra.npz")
    assert r.returncode == 2 and "has array(s) ['xx'] that are not inputs" in _one_line_error(r, "run")


def test_compile_dump_ir_has_optimised_llvm_and_assembly(bn_model, tmp_path):
    d = tmp_path / "dumps"
    r = cli("compile", bn_model, "-o", tmp_path / "m.tfm", "-O", "1", "--dump-ir", d)
    assert r.returncode == 0, r.stderr
    assert (d / "00-import.txt").exists() and (d / "module.ll").exists()
    assert f'target triple = "{llvm.get_process_triple()}"' in (d / "module.opt.ll").read_text()
    assert "\nconv_0:" in (d / "module.s").read_text()


def test_run_a_model_on_random_inputs(bn_model):
    r = cli("run", bn_model, "--seed", "4")
    assert r.returncode == 0, r.stderr
    assert "random inputs, seed 4" in r.stdout and "output y: float32[1, 4, 8, 8]" in r.stdout


def test_bench(bn_model):
    r = run_cli("bench", bn_model, "--threads", "1", "--repeat", "3", "--warmup", "1", "--top", "2")
    assert r.returncode == 0, r.stderr
    for s in ("tensorfuse   median", "onnxruntime  median", "p90", "ratio (tensorfuse / onnxruntime median, lower is better)",
              "top 2 kernels"):
        assert s in r.stdout, s
    assert cli("bench", bn_model, "--repeat", "0").returncode == 2


def test_ir_levels(bn_model):
    r = run_cli("ir", bn_model, "--level", "graph")
    assert r.returncode == 0 and "BatchNormalization(" in r.stdout
    r = cli("ir", bn_model, "--after", "fold_rules")
    assert r.returncode == 0 and "BatchNormalization" not in r.stdout and "Conv(" in r.stdout
    r = cli("ir", bn_model, "--level", "fused", "--diff")
    assert r.returncode == 0
    assert "--- after import" in r.stdout and "+++ after fold_rules" in r.stdout and "+++ after fuse" in r.stdout
    assert any(line.startswith("-") and "BatchNormalization(" in line for line in r.stdout.splitlines())
    r = cli("ir", bn_model, "--level", "kernel")
    assert r.returncode == 0 and "kernel " in r.stdout and "for " in r.stdout
    r = cli("ir", bn_model, "--level", "llvm")
    assert r.returncode == 0 and f'target triple = "{llvm.get_process_triple()}"' in r.stdout
    r = cli("ir", bn_model, "--level", "asm")
    assert r.returncode == 0 and "\nfusedconv_0:" in r.stdout and ".globl\tfusedconv_0" in r.stdout
    r = cli("ir", bn_model, "--after", "nope")
    assert r.returncode == 2 and "unknown pass 'nope'; passes at O2:" in _one_line_error(r, "ir")
    r = cli("ir", bn_model, "--level", "asm", "--diff")
    assert r.returncode == 2 and "--diff is for" in _one_line_error(r, "ir")


def test_verify_names_the_wrong_rule_and_its_onnx_nodes(bn_model):
    """Acceptance 1: a deliberately wrong BatchNorm fold (drops the shift) injected with --rules."""
    r = cli("verify", bn_model, "--no-groups")
    assert r.returncode == 0 and "result: PASS" in r.stdout, r.stdout + r.stderr
    assert "random inputs (seed 0)" in r.stdout.splitlines()[0]
    r = run_cli("verify", bn_model, "--rules", WRONG_RULE)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first bad rewrite: application 2, rule FoldBatchNormDropShift, on ONNX nodes conv2, bn2" in r.stdout
    assert "first group that diverges" in r.stdout and "result: MISMATCH" in r.stdout


def test_explain_says_why_the_activation_was_not_fused(tmp_path):
    path = tmp_path / "shared.onnx"
    onnx.save(shared_consumer_model(), str(path))
    r = run_cli("explain", path)
    assert r.returncode == 0, r.stderr
    assert "- FuseConvActivation: relu: input 0: output 'c' has another consumer: sigmoid (Sigmoid)" in r.stdout
    r = cli("explain", path, "--rule", "FuseConvActivation", "--node", "relu")
    assert r.returncode == 0 and "relu (Relu): no rule applies" in r.stdout
    assert "sigmoid (Sigmoid): no rule applies" not in r.stdout
    r = cli("explain", path, "--rule", "Nope")
    assert r.returncode == 2 and "unknown rule 'Nope'" in _one_line_error(r, "explain")


@pytest.mark.shared
def test_explain_lists_every_conv_of_mobilenet_unfolded(shared_models):
    """Acceptance 2 through the command line."""
    path = shared_models / "mobilenet_v2.unfolded.onnx"
    r = cli("explain", path)
    assert r.returncode == 0, r.stderr
    convs = [n.name for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("  Conv '")]
    assert len(lines) == len(convs) == 52
    for name, line in zip(convs, lines):
        assert line.startswith(f"  Conv '{name}' -> ") and ": FoldBatchNormIntoConv" in line, line


def test_graph_writes_dot(bn_model, tmp_path):
    r = run_cli("graph", bn_model, "-o", tmp_path / "g.dot", "--profile")
    assert r.returncode == 0, r.stderr
    parsed = parse_dot((tmp_path / "g.dot").read_text())
    assert len(parsed["clusters"]) == 2
    assert all(" ms\\n" in c["attrs"]["label"] for c in parsed["clusters"].values())
    r = cli("graph", bn_model, "-o", tmp_path / "g.png")
    assert r.returncode == 2 and "must be .svg, .dot, .gv or .html" in _one_line_error(r, "graph")


@pytest.mark.slow
@pytest.mark.shared
def test_graph_of_resnet18_clusters_equal_the_fused_groups(shared_models, tmp_path):
    """Acceptance 3: the .dot parses back and its clusters are the optimised graph's nodes
    (one kernel each), each holding that node's members."""
    path = shared_models / "resnet18.unfolded.onnx"
    r = run_cli("graph", path, "-o", tmp_path / "resnet18.dot")
    assert r.returncode == 0, r.stderr
    parsed = parse_dot((tmp_path / "resnet18.dot").read_text())
    mod = tensorfuse.compile(str(path))             # a cache hit: the subprocess compiled it
    groups = mod.graph.nodes
    clusters = parsed["clusters"]
    assert len(clusters) == len(groups)
    labels = sorted(c["attrs"]["label"].split("\\n")[-1] for c in clusters.values())
    assert labels == sorted(n.name for n in groups)
    for n in groups:
        [c] = [c for c in clusters.values() if c["attrs"]["label"].split("\\n")[-1] == n.name]
        body = n.attrs.get("body") if n.op == "FusedFunction" else None
        assert len(c["nodes"]) == (len(body.nodes) if body is not None else 1)
    kernels = {c.kernel for c in mod.calls}
    labels = {n: c["attrs"]["label"].split("  [")[0] for n, c in clusters.items()}
    # a reshape of an intermediate is an alias in the memory plan: its cluster says it runs no kernel
    from tensorfuse.ir.registry import get_op
    aliases = [n for n in groups if get_op(n.op, n.domain).reshape_only]
    assert sorted(v for v in labels.values() if v == "(no kernel)") == ["(no kernel)"] * len(aliases)
    assert {v for v in labels.values() if v != "(no kernel)"} == kernels


def _value_dependent_model(path):
    """Relu(x) reshaped to the shape given in input s: its shapes depend on s's value."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
                          "dyn", [x, s], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_value_dependent_models_compile_for_the_given_inputs(tmp_path):
    """A model whose shapes depend on an input's value (compile gives a SpecializingModule) ran
    into AttributeError in every command; now the commands that take --inputs compile it for
    those values and the others say what to do (exit 2)."""
    model = _value_dependent_model(tmp_path / "dyn.onnx")
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 5
    np.savez(tmp_path / "in.npz", x=x, s=np.array([3, 4]))
    r = cli("run", model, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_array_equal(z["y"], np.maximum(x, 0).reshape(3, 4))
    r = cli("verify", model, "--inputs", tmp_path / "in.npz")
    assert r.returncode == 0 and "result: PASS" in r.stdout, r.stdout + r.stderr
    assert "the given inputs" in r.stdout and "seed" not in r.stdout.splitlines()[0]
    r = cli("bench", model, "--inputs", tmp_path / "in.npz", "--repeat", "2", "--warmup", "1")
    assert r.returncode == 0 and "ratio" in r.stdout, r.stderr
    for cmd in ("run", "verify", "graph"):          # no values given
        r = cli(cmd, model, *(["-o", tmp_path / "g.dot"] if cmd == "graph" else []))
        assert r.returncode == 2 and "depend on the values of input(s) ['s']" in _one_line_error(r, cmd)
        assert "--inputs" in r.stderr
    r = cli("compile", model, "-o", tmp_path / "m.tfm")
    assert r.returncode == 2 and "depend on the values" in _one_line_error(r, "compile")
    assert "tensorfuse run MODEL --inputs" in r.stderr
    np.savez(tmp_path / "nos.npz", x=x)
    r = cli("run", model, "--inputs", tmp_path / "nos.npz")
    assert r.returncode == 2 and "lacks the model's input(s) ['s']" in _one_line_error(r, "run")
