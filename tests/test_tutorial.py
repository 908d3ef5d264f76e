"""Runs the code blocks of docs/writing-a-fusion-rule.md, then the tests they define."""
from __future__ import annotations

import pathlib
import re

from tensorfuse import compiler
import tensorfuse.compiler.rules  # noqa: F401  (the rule sets, as compiler.rules)

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "writing-a-fusion-rule.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_tutorial_code_runs_and_its_tests_pass(monkeypatch):
    monkeypatch.setattr(compiler.rules, "FUSE_RULES", list(compiler.rules.FUSE_RULES))
    ns: dict = {"__name__": "tutorial"}
    for code in blocks():
        exec(compile(code, str(DOC), "exec"), ns)
    tests = [f for k, f in ns.items() if k.startswith("test_") and callable(f)]
    assert len(tests) == 3
    for t in tests:
        t()


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
