"""Where candidates are measured: in a local child process (``"local"``), or in Ray tasks spread
over the nodes of a Ray cluster (``"ray"``).

Both open a *session* per workload with ``resolve(knob dicts)`` (the effective values each
stands for: always in a local worker, since lowering is cheap and the tuner dedupes on its
answers before anything is measured) and ``measure(list of effective values, timing=None)`` (one result
dict per candidate; ``timing`` overrides set-up entries such as ``repeat`` for these
measurements, see ``compiler.tuner.worker``; a crash or hang is ``{"status": "crash" |
"timeout", "error"}``).

**Ray.** ``pip install "tensorfuse[ray]"``. Each batch of candidates is one Ray task that
needs the custom resource ``tensorfuse_measure`` (one unit, :data:`RAY_RESOURCE`): a node that
declares one unit runs one measurement at a time, so timings on a node never overlap. The
task writes the workload's graph to a temporary folder on its node and measures its batch in
a child worker there (the same crash and timeout handling as locally); the results (with the
node's host name and target identity) come back to the tuner, which appends the records to its
one file. Start each node of a cluster with the resource declared::

    ray start --head --resources='{"tensorfuse_measure": 1}'                      # first node
    ray start --address=HEAD:6379 --resources='{"tensorfuse_measure": 1}'         # each other one

and tune with ``tensorfuse tune MODEL -o R.jsonl --executor ray --ray-address HEAD:6379`` (or
``ray_address="auto"`` on a cluster node). Without an address and without a running Ray
instance in the process, the tuner starts a local one with ``{"tensorfuse_measure": 1}``; a
running instance (``ray.init`` called before) is used as it is. The machines must be alike
(same CPU and features): every record carries the target identity of the node that measured
it, so a record from a different node is never used for this CPU (``compiler.tuning``).
"""
from __future__ import annotations

import os
import pickle
import tempfile

from .local import LocalMeasurer, WorkerLost, WorkerProcess
from .plugins import PLUGINS_ENV, plugin_specs

#: the Ray custom resource a measurement task needs one unit of (nodes declare one each)
RAY_RESOURCE = "tensorfuse_measure"
#: candidates per Ray task (each task starts a worker and compiles the default once)
RAY_BATCH = 4


class LocalSession:
    """Resolve and measure in the executor's local child worker (started on first use)."""

    slots = 1

    def __init__(self, graph_path: str, setup: dict, timeout: float, worker: WorkerProcess):
        self.m = LocalMeasurer(dict(setup, graph=graph_path), timeout, worker=worker)

    @property
    def identity(self):
        return self.m.identity

    def start(self) -> None:
        self.m.start()

    def resolve(self, knobs_list: list[dict]) -> list[dict]:
        return self.m.resolve(knobs_list)

    def measure(self, values_list: list[dict], timing: dict | None = None) -> list[dict]:
        return [self.m.measure(v, timing) for v in values_list]

    def close(self) -> None:
        self.m.close()


class LocalExecutor:
    """Candidates measured one at a time in a child process of this one (one process for the
    workloads in turn, replaced when a candidate kills it)."""

    name = "local"

    def __init__(self):
        self.worker = WorkerProcess()

    def session(self, graph_path: str, graph_bytes: bytes, setup: dict, timeout: float) -> LocalSession:
        return LocalSession(graph_path, setup, timeout, self.worker)

    def close(self) -> None:
        self.worker.close()


def measure_batch(graph_bytes: bytes, setup: dict, values_list: list[dict], timeout: float,
                  plugins: str = "") -> dict:
    """What a Ray task runs on its node: the workload (pickled one-node graph) written to a
    temporary folder, set up in a local worker, each candidate measured. Returns
    ``{"node", "identity", "results"}`` (one result per candidate; a failed set-up gives each
    candidate that failure)."""
    import socket
    env = {PLUGINS_ENV: plugins} if plugins else None
    with tempfile.TemporaryDirectory(prefix="tensorfuse-tune-") as d:
        path = os.path.join(d, "workload.pkl")
        with open(path, "wb") as f:
            f.write(graph_bytes)
        m = LocalMeasurer(dict(setup, graph=path), timeout, env=env)
        try:
            try:
                m.start()
            except (WorkerLost, RuntimeError) as e:
                st = getattr(e, "status", "error")
                return {"node": socket.gethostname(), "identity": None,
                        "results": [{"status": st if st in ("crash", "timeout") else "error", "error": str(e),
                                     "setup_failed": True} for _ in values_list]}
            results = [m.measure(v) for v in values_list]
        finally:
            m.close()
    return {"node": socket.gethostname(), "identity": m.identity, "results": results}


class RaySession:
    """Resolve in a local worker; measure in Ray tasks, :data:`RAY_BATCH` candidates a task,
    as many tasks at once as the cluster has ``tensorfuse_measure`` units."""

    def __init__(self, executor: "RayExecutor", graph_path: str, graph_bytes: bytes, setup: dict, timeout: float):
        self.ex = executor
        self.local = LocalMeasurer(dict(setup, graph=graph_path, reference=False), timeout, worker=executor.resolver)
        self.setup = setup
        self.timeout = timeout
        self.graph_ref = executor.ray.put(graph_bytes)
        self.identity = None

    @property
    def slots(self) -> int:
        return self.ex.slots * RAY_BATCH

    def start(self) -> None:
        self.local.start()

    def resolve(self, knobs_list: list[dict]) -> list[dict]:
        return self.local.resolve(knobs_list)

    def measure(self, values_list: list[dict], timing: dict | None = None) -> list[dict]:
        ray = self.ex.ray
        setup = dict(self.setup, **(timing or {}))
        batches = [values_list[i:i + RAY_BATCH] for i in range(0, len(values_list), RAY_BATCH)]
        # a task's own timeout: its worker's start and set-up, then each candidate's limit
        refs = [self.ex.remote.remote(self.graph_ref, setup, b, self.timeout, self.ex.plugins) for b in batches]
        out: list[dict] = []
        for b, ref in zip(batches, refs):
            try:
                ans = ray.get(ref)
            except Exception as e:      # noqa: BLE001 - the task itself failed (its node died ...)
                out += [{"status": "error", "error": f"Ray task failed: {type(e).__name__}: {e}"} for _ in b]
                continue
            for r in ans["results"]:
                r.setdefault("identity", ans.get("identity"))
                r.setdefault("node", ans.get("node"))
                out.append(r)
            if ans.get("identity") is not None:
                self.identity = ans["identity"]
        return out

    def close(self) -> None:
        self.local.close()


class RayExecutor:
    """Candidates measured in Ray tasks (module docstring). ``address``: a cluster's address
    (``ray.init(address=...)``) or None (a running instance in this process, else a local one
    started here and shut down by :meth:`close`). Raises ImportError naming the extra when Ray
    is not installed, and RuntimeError when no node declares the resource."""

    name = "ray"

    def __init__(self, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise ImportError("the ray executor needs Ray: pip install 'tensorfuse[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")     # no usage report from a library's ray.init
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(resources={RAY_RESOURCE: 1}, include_dashboard=False, log_to_driver=False)
            self.started = True
        units = int(ray.cluster_resources().get(RAY_RESOURCE, 0))
        if units < 1:
            if self.started:
                ray.shutdown()
            raise RuntimeError(f"no node of the Ray cluster declares the resource {RAY_RESOURCE!r}: start each "
                               f"node with ray start ... --resources='{{\"{RAY_RESOURCE}\": 1}}' (one "
                               f"measurement per node at a time), or ray.init(resources={{\"{RAY_RESOURCE}\": 1}}) "
                               f"for a local instance")
        self.slots = units
        self.plugins = ",".join(os.path.abspath(p) if p.endswith(".py") else p for p in plugin_specs())
        self.remote = ray.remote(resources={RAY_RESOURCE: 1}, num_cpus=0, max_retries=0)(measure_batch)
        #: the local worker that resolves candidates (lowering only) before they are sent
        self.resolver = WorkerProcess()

    def session(self, graph_path: str, graph_bytes: bytes, setup: dict, timeout: float) -> RaySession:
        return RaySession(self, graph_path, graph_bytes, setup, timeout)

    def close(self) -> None:
        self.resolver.close()
        if self.started:
            self.ray.shutdown()
            self.started = False


def make_executor(executor: str, ray_address: str | None = None):
    """The executor named ``executor`` ("local" or "ray"). Raises ValueError for another name."""
    if executor == "local":
        if ray_address:
            raise ValueError("ray_address is for executor='ray'")
        return LocalExecutor()
    if executor == "ray":
        return RayExecutor(ray_address)
    raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")


def graph_bytes(graph) -> bytes:
    return pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
