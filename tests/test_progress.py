"""tensorfuse.progress: bars on stderr only when enabled (the command line: a terminal, no --quiet)."""
from __future__ import annotations

import sys

from tensorfuse import progress


def test_off_by_default_and_for_short_iterables(capsys):
    items = list(range(20))
    assert progress.iterate(items, "x") is items
    with progress.enabled(True):
        short = [1, 2]
        assert progress.iterate(short, "x") is short
        progress.status(None)
    with progress.enabled(False):
        progress.status("hidden")
    assert capsys.readouterr().err == "\r\033[K"            # the enabled status(None) only erased


def test_enabled_bar_draws_on_stderr_and_erases(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)          # the built-in bar, whatever is installed
    with progress.enabled(True):
        assert progress.active()
        got = list(progress.iterate(range(10), "compiling", unit="kernel"))
    assert got == list(range(10)) and not progress.active()
    err = capsys.readouterr().err
    assert "compiling: [" in err and "10/10" in err and err.endswith("\r\033[K")
