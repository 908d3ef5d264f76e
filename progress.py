"""Progress bars on stderr for long compiles, benchmarks and verification (the command line).

Off by default: the library prints nothing. ``with progress.enabled(True): ...`` turns them on
for the calls inside (the ``tensorfuse`` command line does so when stderr is a terminal and
``--quiet`` is not given); :func:`iterate` then shows a bar over an iterable, and :func:`task`
a bar over one long job whose steps are reported from the code it calls (:func:`expect`,
:func:`advance`, :func:`stage`: a compile, ``compiler.driver``; its code generation reports
each kernel generated and each part LLVM compiled, also when the parts are compiled in
forked processes). Bars come from ``tqdm`` when it is installed, else from a small built-in
one-line bar.

This module imports nothing of tensorfuse, so every layer may report progress (the LLVM code
generator, ``codegen.llvm.backend``, does); ``compiler.progress`` re-exports it.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

__all__ = ["enabled", "iterate", "active", "status", "task", "expect", "advance", "stage", "Task"]

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


_TASK: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_progress_task", default=None)
#: seconds between redraws of a task's bar while no step is reported (its clock keeps moving
#: through a long opaque step, such as LLVM compiling a part)
REFRESH_S = 0.5


class Task:
    """The steps of one long job (see :func:`task`): ``total`` (grows with :meth:`expect`; 0
    while unknown), ``n`` (done), ``stages`` (every :meth:`stage` text, in order). Draws a bar
    on stderr when made with ``show``."""

    def __init__(self, desc: str, show: bool):
        self.desc, self.total, self.n, self.stages = desc, 0, 0, []
        self._bar = None
        self._simple = False
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = None
        if not show:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._simple = True
            return
        self._bar = tqdm(desc=desc, total=None, file=sys.stderr, leave=False, unit="step",
                         bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}{postfix}")
        self._thread = threading.Thread(target=self._refresh, name="tensorfuse-progress", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with contextlib.suppress(Exception):
                self._bar.refresh()

    def expect(self, n: int) -> None:
        """``n`` more steps to come."""
        self.total += int(n)
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()
        self._draw()

    def advance(self, n: int = 1) -> None:
        """``n`` steps done."""
        self.n += int(n)
        if self._bar is not None:
            self._bar.update(int(n))
        self._draw()

    def stage(self, text: str) -> None:
        """What the job does now (shown after the bar)."""
        self.stages.append(text)
        if self._bar is not None:
            self._bar.set_postfix_str(text)
        self._draw()

    def _draw(self) -> None:
        if not self._simple:
            return
        pct = f"{100 * self.n / self.total:3.0f}%" if self.total else "    "
        done = int(30 * self.n / self.total) if self.total else 0
        stage = self.stages[-1] if self.stages else ""
        sys.stderr.write(f"\r\033[K{self.desc}: {pct}[{'#' * done}{'.' * (30 - done)}] "
                         f"{time.perf_counter() - self._t0:5.1f} s {stage}")
        sys.stderr.flush()

    def finish(self) -> None:
        """The job is done: draw the bar's last frame at 100% (steps it skipped, e.g. code
        generation on a compile-cache hit, and updates tqdm held back count as done)."""
        self.total = max(self.total, self.n, 1)
        self.n = self.total
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.n = self.total
            with contextlib.suppress(Exception):
                self._bar.refresh()
        self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        if self._simple:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@contextlib.contextmanager
def task(desc: str) -> Iterator[Task | None]:
    """A bar over one long job (a compile) for the calls inside: they report with
    :func:`expect`, :func:`advance` and :func:`stage`. Yields the :class:`Task`; drawn only while
    progress is enabled. Inside another task it yields that one (the outer job counts the
    steps; one bar)."""
    outer = _TASK.get()
    if outer is not None:
        yield outer
        return
    t = Task(desc, bool(_ON.get()))
    token = _TASK.set(t)
    try:
        yield t
        t.finish()
    finally:
        _TASK.reset(token)
        t.close()


def expect(n: int) -> None:
    """``n`` more steps to come in the current :func:`task` (nothing outside one)."""
    t = _TASK.get()
    if t is not None:
        t.expect(n)


def advance(n: int = 1) -> None:
    """``n`` steps of the current :func:`task` done (nothing outside one)."""
    t = _TASK.get()
    if t is not None:
        t.advance(n)


def stage(text: str) -> None:
    """Say what the current :func:`task` does now (nothing outside one)."""
    t = _TASK.get()
    if t is not None:
        t.stage(text)
