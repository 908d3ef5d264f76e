"""Frontend fuzzing in the default suite (issue 9): mutated models must get our own errors.

A fixed-seed sample of ``tests/fuzz/fuzz_models.py``: byte-level and structural mutations of
small models and random graphs, each compiled (O2) and run in a child process. Only
``TensorfuseError`` subclasses (and ValueError from ``Module.run``'s index checks) may come out;
never another exception type, a crash or a hang. Failures that match a defect issue 9
listed (``fuzz.mutate.known_defect``, all fixed) are reported apart, so a message says whether
a listed defect came back or a new one appeared.
About 30 s on 2 cores (160 mutations at about 0.15 s each, measured while other jobs shared them).
"""
from __future__ import annotations

import functools
import os

import pytest

from fuzz import mutate as mu
from fuzz.fuzz_models import report, run
from fuzz.isolate import run_isolated

SEED = 20261201
COUNT = 160


@functools.lru_cache(maxsize=1)
def _results():
    return run(SEED, COUNT, ort=False, verbose=False)


def test_mutations_give_only_documented_errors():
    table, failures = _results()
    new = [f for f in failures if mu.known_defect(f[1], f[3]) is None]
    assert not new, "new failures (mutation index, mutation, category, detail):\n" + "\n".join(map(str, new)) \
        + "\n" + report(table)
    # the sample is not degenerate: most mutations are refused, some still compile and run
    cats = {c for (c, _d, _o) in table}
    assert {"ok", "documented"} <= cats, report(table)


def test_mutations_hit_no_listed_defect():
    _table, failures = _results()
    known = [f for f in failures if mu.known_defect(f[1], f[3]) is not None]
    assert not known, "\n".join(map(str, known))


def test_isolation_counts_an_abort_and_a_hang():
    """The harness itself: an abort is a crash, a sleep past the timeout a hang, and the next
    job gets a fresh worker."""
    import time
    assert run_isolated(os.abort, ()) == ("crash", "signal 6 (SIGABRT)")
    assert run_isolated(time.sleep, (30,), timeout=1)[0] == "hang"
    assert run_isolated(max, (1, 2)) == ("ok", 2)


def test_classify_names_internal_errors():
    """A TensorfuseError is documented; one raised from an AttributeError is not; a TypeError
    is internal and says where."""
    from tensorfuse.ir.errors import CompileError, ModelLoadError

    def wrapped():
        try:
            b"x".encode()
        except AttributeError as e:
            raise CompileError("codegen failed") from e
    for fn, cat in ((lambda: (_ for _ in ()).throw(ModelLoadError("bad")), "documented"),
                    (wrapped, "internal"), (lambda: int("x") + "", "internal")):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            from fuzz.isolate import describe_exception
            got = mu.classify(("raised", describe_exception(e)))
        assert got[0] == cat, got
