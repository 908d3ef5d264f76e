"""Running candidates in a child process (``compiler.tuner.worker``) with a timeout per request.

:class:`WorkerProcess` starts ``python -m tensorfuse.compiler.tuner.worker`` (the same Python,
the same environment, a session of its own so that a kill reaches anything it forked), sends
it JSON requests and waits for each answer at most a given time. A worker that exits while a
request is out (a crash: a signal, ``os._exit``) or that does not answer in time (a hang: it
is killed) yields a :class:`WorkerLost` saying which, with the end of its standard error; the
next request starts a fresh worker and sets the workload up again.

:class:`LocalMeasurer` is what both executors measure with: the local executor runs one in the
tuner's process, the Ray executor one per Ray task on the node the task landed on.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

#: seconds a worker may take to start (import tensorfuse) and set a workload up (compile and
#: run the default knobs once), at least; the candidate timeout is used when larger
SETUP_TIMEOUT_S = 120.0


class WorkerLost(Exception):
    """The worker died (``status`` "crash") or was killed after the timeout (``"timeout"``)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class WorkerProcess:
    """One child worker process; see the module docstring. ``env``: extra environment."""

    def __init__(self, env: dict | None = None):
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._log = None
        #: the setup request the running worker answered (None: none yet)
        self.setup_msg: dict | None = None
        self.identity: dict | None = None

    # -- process ---------------------------------------------------------------------
    def start(self, timeout: float = SETUP_TIMEOUT_S) -> None:
        self.close()
        self.setup_msg = None
        self._log = tempfile.TemporaryFile(prefix="tensorfuse-tune-worker-")
        self._buf = b""
        self.proc = subprocess.Popen([sys.executable, "-m", "tensorfuse.compiler.tuner.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=self.env, start_new_session=True, close_fds=True)
        hello = self._read(timeout, "starting")
        if not hello.get("ready"):
            err = hello.get("error", "the worker did not start")
            self.close()
            raise RuntimeError(f"the tuning worker could not start: {err}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Stop the worker (asked to exit, killed after a second) and forget it."""
        p, self.proc = self.proc, None
        if p is not None:
            if p.poll() is None:
                try:
                    p.stdin.write(b'{"op": "exit"}\n')
                    p.stdin.flush()
                    p.wait(timeout=1.0)
                except (OSError, subprocess.TimeoutExpired, ValueError):
                    self._kill(p)
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        if self._log is not None:
            self._log.close()
            self._log = None

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            try:
                p.kill()
            except OSError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stderr_tail(self, n: int = 1500) -> str:
        """The last ``n`` characters of the worker's standard error (its traceback, a fault message)."""
        if self._log is None:
            return ""
        try:
            self._log.flush()
            size = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, size - n))
            return self._log.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    # -- requests --------------------------------------------------------------------
    def request(self, msg: dict, timeout: float) -> dict:
        """Send ``msg`` and return the answer; WorkerLost when the worker dies or runs past
        ``timeout`` seconds (it is then killed)."""
        if not self.alive:
            raise WorkerLost("crash", "the worker is not running")
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass            # it died: the read below says how
        return self._read(timeout, msg.get("op", "request"))

    def _read(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                tail = self.stderr_tail()
                self._kill(self.proc)
                raise WorkerLost("timeout", f"no answer after {timeout:.0f} s ({what}); the worker was killed"
                                 + (f"; its last output: {tail[-500:]}" if tail else ""))
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not r:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = self.proc.wait()
                how = (f"killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
                       else f"exited with code {code}")
                tail = self.stderr_tail()
                raise WorkerLost("crash", f"the worker {how} ({what})" + (f": {tail[-800:]}" if tail else ""))
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)


class LocalMeasurer:
    """Candidates of one workload measured in a :class:`WorkerProcess`, restarted (and the
    workload set up again) after a crash or timeout.

    ``setup``: the worker's setup request (``compiler.tuner.worker``) with ``graph`` the path of
    the pickled one-node graph; ``timeout``: seconds per candidate; ``worker``: a worker to
    use (the executor's, shared by the workloads it tunes one after the other: a process start
    imports tensorfuse, seconds on a loaded machine), else one of its own, closed by
    :meth:`close`."""

    def __init__(self, setup: dict, timeout: float, env: dict | None = None, worker: WorkerProcess | None = None):
        self.setup_msg = dict(setup, op="setup")
        self.timeout = float(timeout)
        self.own = worker is None
        self.worker = WorkerProcess(env) if worker is None else worker
        self.identity: dict | None = None

    def _ensure(self) -> None:
        w = self.worker
        if w.alive and w.setup_msg is self.setup_msg:
            return
        t = max(SETUP_TIMEOUT_S, self.timeout)
        if not w.alive:
            w.start(t)
        w.setup_msg = None
        ans = w.request(self.setup_msg, t)
        if not ans.get("ok"):
            raise WorkerLost(ans.get("status", "error"), "setting the workload up (compiling and running the "
                                                         "default knobs) failed: " + str(ans.get("error")))
        w.setup_msg = self.setup_msg
        self.identity = w.identity = ans.get("identity")

    def start(self) -> None:
        """Start the worker and set the workload up; WorkerLost when that fails."""
        self._ensure()

    def resolve(self, knobs_list: list[dict]) -> list[dict]:
        """The effective values of each knob dict (see the worker's ``resolve``); an entry is
        ``{"error", "status"}`` when lowering raised, crashed or hung."""
        if not knobs_list:
            return []
        try:
            self._ensure()
            return self.worker.request({"op": "resolve", "knobs": list(knobs_list)},
                                       self.timeout + len(knobs_list) - 1)["results"]
        except WorkerLost as e:         # one by one, to find the one that kills it
            if len(knobs_list) == 1:
                return [{"error": str(e), "status": e.status}]
            return self._resolve_each(knobs_list)

    def _resolve_each(self, knobs_list: list[dict]) -> list[dict]:
        out = []
        for k in knobs_list:
            try:
                self._ensure()
                out.append(self.worker.request({"op": "resolve", "knobs": [k]}, self.timeout)["results"][0])
            except WorkerLost as e:
                out.append({"error": str(e), "status": e.status})
        return out

    def measure(self, knobs: dict, timing: dict | None = None) -> dict:
        """Measure one candidate: the worker's answer, or ``{"status": "crash"|"timeout",
        "error"}`` when it died or hung (it is restarted for the next one). ``timing``: set-up
        entries overridden for this measurement only (``repeat``, ``max_measure_s``: a
        confirmation takes more samples)."""
        try:
            self._ensure()
        except WorkerLost as e:
            return {"status": e.status if e.status in ("crash", "timeout") else "error", "error": str(e),
                    "setup_failed": True}
        try:
            msg = {"op": "measure", "knobs": knobs}
            if timing:
                msg["timing"] = dict(timing)
            return self.worker.request(msg, self.timeout)
        except WorkerLost as e:
            self.worker.close()
            return {"status": e.status, "error": str(e)}

    def close(self) -> None:
        """Stop the worker if it is this measurer's own."""
        if self.own:
            self.worker.close()
