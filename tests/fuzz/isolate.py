"""Run one job in a child process, so that an abort (LLVM's ``report_fatal_error``), a signal or a
hang is an outcome to count, not the end of the fuzzing run.

Children fork from a *forkserver* that imported onnx, onnxruntime and tensorfuse once and never
ran anything (no thread team, no onnxruntime thread pool): a child starts in a clean state,
whatever the parent process (pytest, say) has run before. A child is a *worker* that serves
jobs one after another (its warm caches halve the time of a small compile) until one of them
crashes or hangs; the next job then gets a fresh worker. Each thread of the parent has its own
worker, so ``--jobs N`` threads run N compiles at once.

:func:`run_isolated` returns ``("ok", value)``, ``("raised", (type name, module, message,
is TensorfuseError))``, ``("crash", "signal N (NAME)")`` or ``("hang", "timeout after T s")``.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import atexit
import faulthandler
import traceback
from typing import Any, Callable

_PRELOAD = ["numpy", "onnx", "onnx.reference", "onnxruntime", "tensorfuse", "tensorfuse.compiler.driver",
            "fuzz.graphgen", "fuzz.mutate"]
_ctx = None


def context():
    """The forkserver context (created once, with the heavy imports preloaded)."""
    global _ctx
    if _ctx is None:
        # the forkserver child process inherits these; no thread team in the compile children
        os.environ.setdefault("TENSORFUSE_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # the IR verifier after every pass (as under pytest): node order, defined-before-use
        os.environ.setdefault("TENSORFUSE_VERIFY", "1")
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(_PRELOAD)
    return _ctx


def describe_exception(e: BaseException) -> tuple[str, str, str, bool, str]:
    """(type name, module, first 300 characters of the message, is a TensorfuseError, the
    innermost traceback frame) of an exception. A TensorfuseError raised *from* another
    exception that is not one (a CompileError wrapping an AttributeError of codegen) is an
    internal error in our clothes: it counts as not ours, and the message names the cause."""
    from tensorfuse.ir.errors import TensorfuseError
    cause = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    inner = e
    while cause is not None and not isinstance(cause, TensorfuseError):
        inner = cause
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    tb = traceback.extract_tb(inner.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    ours = isinstance(e, TensorfuseError) and inner is e
    msg = str(e)[:300] if inner is e else f"{type(inner).__name__} inside {type(e).__name__}: {str(e)[:300]}"
    return (type(e).__name__, type(e).__module__, msg, ours, where)


def _serve(conn):
    while True:
        try:
            job = conn.recv()
        except EOFError:
            os._exit(0)
        if job is None:
            os._exit(0)
        fn, args, timeout = job
        if os.environ.get("TENSORFUSE_FUZZ_TRACEBACK", "1") != "0":    # where a hang hangs, on stderr
            faulthandler.dump_traceback_later(max(1.0, timeout - 2), exit=False)
        try:
            out = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - every exception is an outcome here
            out = ("raised", describe_exception(e))
        faulthandler.cancel_dump_traceback_later()
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            conn.send(("raised", describe_exception(e)))


class Worker:
    """One child process serving jobs; restarted after a crash or a hang."""

    def __init__(self):
        self.proc = None
        self.conn = None

    def _start(self):
        ctx = context()
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def stop(self):
        if self.proc is not None:
            try:
                self.conn.send(None)
            except Exception:  # noqa: BLE001
                pass
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
            self.conn.close()
        self.proc = self.conn = None

    def call(self, fn: Callable, args: tuple, timeout: float):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        try:
            self.conn.send((fn, args, timeout))
            if self.conn.poll(timeout):
                return self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
        else:     # no answer in time: a hang
            self.proc.kill()
            self.proc.join()
            self.conn.close()
            self.proc = self.conn = None
            return ("hang", f"timeout after {timeout:g} s")
        self.proc.join(10)
        code = self.proc.exitcode
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        self.proc = self.conn = None
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "?"
            return ("crash", f"signal {-code} ({name})")
        return ("crash", f"exit status {code} without a result")


_local = threading.local()
_workers: list[Worker] = []


def run_isolated(fn: Callable, args: tuple = (), timeout: float = 60.0) -> tuple[str, Any]:
    """Call ``fn(*args)`` (a module-level function, picklable arguments) in this thread's
    worker process; ``("crash", ...)`` or ``("hang", ...)`` if it dies or overruns ``timeout``."""
    w = getattr(_local, "worker", None)
    if w is None:
        w = _local.worker = Worker()
        _workers.append(w)
    return w.call(fn, args, timeout)


def stop_workers() -> None:
    """End every worker process (also done at exit)."""
    for w in _workers:
        w.stop()
    _workers.clear()
    _local.__dict__.clear()


atexit.register(stop_workers)
