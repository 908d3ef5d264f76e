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
