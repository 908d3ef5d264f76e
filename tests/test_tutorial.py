"""Runs the code blocks of docs/writing-a-fusion-rule.md, then the tests they define."""
from __future__ import annotations

import pathlib
import re

import tensorfuse
from tensorfuse import compiler
import tensorfuse.compiler.rules  # noqa: F401  (the rule sets, as compiler.rules)

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "writing-a-fusion-rule.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_tutorial_code_runs_and_its_tests_pass():
    before = {k: list(getattr(compiler.rules, k)) for k in ("FOLD_RULES", "FUSE_RULES", "O3_RULES")}
    ns: dict = {"__name__": "tutorial"}
    for code in blocks():
        exec(compile(code, str(DOC), "exec"), ns)
    tests = [f for k, f in ns.items() if k.startswith("test_") and callable(f)]
    assert len(tests) == 3
    for t in tests:
        t()
    # the rule under test changed nothing global: a compile without rules= does not see it
    assert {k: list(getattr(compiler.rules, k)) for k in before} == before
    plain = tensorfuse.compile(ns["l2_model"](), cache=False)
    assert "FuseReduceL2" not in [a.rule for a in plain.rewrite_log]


def test_tutorial_rule_on_the_command_line(tmp_path):
    """The tutorial's rule block as a file, given to the command line with --rules as the
    tutorial says: verify counts its applications; the same rule in front of the built-ins."""
    import onnx
    from cli_util import cli
    rule_file = tmp_path / "my_rules.py"
    rule_file.write_text(next(b for b in blocks() if "class FuseReduceL2" in b))
    ns: dict = {"__name__": "tutorial"}
    for code in blocks():
        exec(compile(code, str(DOC), "exec"), ns)
    model = tmp_path / "l2.onnx"
    onnx.save(ns["l2_model"](), model)
    r = cli("verify", model, "--rules", f"{rule_file}:FuseReduceL2", "--no-groups")
    assert r.returncode == 0, r.stderr
    assert "rule under test FuseReduceL2: applied 1 time\n" in r.stdout and "result: PASS" in r.stdout
    r = cli("explain", model, "--rules", f"{rule_file}:FuseReduceL2", "--rule", "FuseReduceL2")
    assert "pass fuse (rules in order: FuseReduceL2, " in r.stdout, r.stdout


def test_tutorial_rule_is_short():
    rule = next(b for b in blocks() if "class FuseReduceL2" in b)
    lines = [ln for ln in rule.splitlines() if ln.strip()]
    assert len(lines) < 25


def test_tutorial_runs_outside_the_test_folder(tmp_path):
    """The tutorial's code needs nothing of tests/ (tensorfuse.testing has its helpers): run it
    in a fresh interpreter from another folder, with only the installed package importable."""
    import subprocess
    import sys
    script = ("import re, sys\n"
              "ns = {'__name__': 'tutorial'}\n"
              f"text = open({str(DOC)!r}).read()\n"
              "for code in re.findall(r'```python\\n(.*?)```', text, re.S):\n"
              "    exec(compile(code, 'tutorial', 'exec'), ns)\n"
              "tests = [f for k, f in ns.items() if k.startswith('test_') and callable(f)]\n"
              "assert len(tests) == 3\n"
              "for t in tests:\n"
              "    t()\n"
              "assert not any(m == 'oracle' for m in sys.modules)\n"
              "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
