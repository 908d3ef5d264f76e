"""Progress bars on stderr for long compiles, benchmarks and verification (the command line).

Off by default: the library prints nothing. ``with progress.enabled(True): ...`` turns them on
for the calls inside (the ``tensorfuse`` command line does so when stderr is a terminal and
``--quiet`` is not given); :func:`iterate` then shows a bar over an iterable. Bars come from
``tqdm`` when it is installed, else from a small built-in one-line bar.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

__all__ = ["enabled", "iterate", "active", "status"]

_ON: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_progress", default=False)
#: iterables shorter than this get no bar
MIN_ITEMS = 8


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Show progress bars (on stderr) for the calls inside this context when ``on``."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)


def active() -> bool:
    return bool(_ON.get())


def iterate(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """``items``, with a progress bar named ``desc`` on stderr while progress is enabled and
    there are at least ``MIN_ITEMS`` of them."""
    if not _ON.get():
        return items
    if total is None:
        try:
            total = len(items)      # type: ignore[arg-type]
        except TypeError:
            total = None
    if total is not None and total < MIN_ITEMS:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return _SimpleBar(items, desc, total, unit)
    return tqdm(items, desc=desc, total=total, unit=unit, file=sys.stderr, leave=False)


class _SimpleBar:
    """A one-line bar redrawn with ``\\r`` at most 10 times a second, erased at the end."""

    def __init__(self, items, desc: str, total: int | None, unit: str):
        self.items, self.desc, self.total, self.unit = items, desc, total, unit

    def _draw(self, k: int, t0: float, last: list) -> None:
        now = time.perf_counter()
        if now - last[0] < 0.1 and k != self.total:
            return
        last[0] = now
        if self.total:
            done = int(30 * k / self.total)
            bar = f"[{'#' * done}{'.' * (30 - done)}] {k}/{self.total}"
        else:
            bar = f"{k} {self.unit}"
        sys.stderr.write(f"\r{self.desc}: {bar} {now - t0:5.1f} s")
        sys.stderr.flush()

    def __iter__(self):
        t0 = time.perf_counter()
        last = [0.0]
        k = 0
        try:
            for x in self.items:
                yield x
                k += 1
                self._draw(k, t0, last)
        finally:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def status(message: str | None) -> None:
    """Show ``message`` on one self-erasing stderr line while progress is enabled (None
    erases it): for steps whose count is not known ahead (bisection)."""
    if not _ON.get():
        return
    sys.stderr.write("\r\033[K" + (message or ""))
    sys.stderr.flush()
