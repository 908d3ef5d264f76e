"""Counts of an ONNX backend conformance run, per test category, from pytest's JUnit XML
(``make conformance-cuda`` writes it), beside the CPU variants' count.

Usage: ``python tests/conformance_counts.py RUN.xml [CPU.xml]``. Prints, per category
(node, simple, pytorch-converted, pytorch-operator), the tests passed, failed (errors
included) and skipped (excluded or outside the core subset) in RUN.xml, and the ratio of its
passes to the CPU passes: those of CPU.xml when given, else the number of ``_cpu`` tests the
suite runs (not excluded; every one of them must pass in ``make test``).
Exits 1 when RUN.xml has a failure.
"""
from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from collections import Counter

CATEGORIES = {"OnnxBackendNodeModelTest": "node", "OnnxBackendSimpleModelTest": "simple",
              "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
              "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator",
              "OnnxBackendRealModelTest": "real"}


def junit_counts(path: str) -> dict[str, Counter]:
    """{category: Counter(passed=, failed=, skipped=)} of the backend tests in a JUnit XML file."""
    out: dict[str, Counter] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        cat = CATEGORIES.get(case.get("classname", "").rsplit(".", 1)[-1])
        if cat is None:
            continue
        tags = {c.tag for c in case}
        kind = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        out.setdefault(cat, Counter())[kind] += 1
    return out


def cpu_run_counts() -> dict[str, int]:
    """{category: number of _cpu tests the suite runs (collected, not excluded)}."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import test_onnx_backend as t
    out = {}
    for clsname, cls in t.backend_test.test_cases.items():
        cat = CATEGORIES.get(clsname)
        if cat:
            out[cat] = sum(1 for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu")
                           and not getattr(getattr(cls, n), "__unittest_skip__", False))
    return out


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    run = junit_counts(argv[0])
    if len(argv) == 2:
        cpu = {c: n["passed"] for c, n in junit_counts(argv[1]).items()}
        cpu_how = "CPU passed"
    else:
        cpu = cpu_run_counts()
        cpu_how = "CPU runs (all pass in make test)"
    print(f"{'category':<18} {'passed':>7} {'failed':>7} {'skipped':>8} {cpu_how:>34} {'ratio':>7}")
    failed = 0
    for cat in CATEGORIES.values():
        if cat not in run:
            continue
        n = run[cat]
        failed += n["failed"]
        c = cpu.get(cat, 0)
        ratio = f"{n['passed'] / c:.1%}" if c else "-"
        print(f"{cat:<18} {n['passed']:>7} {n['failed']:>7} {n['skipped']:>8} {c:>34} {ratio:>7}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
