"""The PTX gate: every generated cuda kernel compiles to PTX for a real GPU, without one.

``python -m tensorfuse.codegen.cuda.ptx_gate [--sources DIR ...] [--models FILE.onnx ...]
[--shared-models [DIR]] [--cc 9.0] [--jobs N] [--no-ptxas] [--cache DIR] [--keep DIR]``

compiles, with ``numba.cuda.compile_ptx`` (libNVVM from pip, pinned to CUDA 13.0.88, see
pyproject's ``test`` extra), for compute capability ``--cc`` (default 9.0, the H200):

* ``--sources DIR``: every kernel a process exported there (``codegen.cuda.jit.export_sources``:
  ``tf_<digest>.py`` with its ``.json`` of parameter dtypes). ``make test-cuda`` runs the
  simulator tests with ``TENSORFUSE_CUDA_SOURCES_DIR`` set, then this gate over that folder, so
  the code the simulator accepted is also code NVVM accepts.
* ``--models FILE``: every kernel of an ONNX model as ``compile(FILE, target="cuda")`` makes it
  (import, the level-2 pipeline with the NHWC layout pass, lowering, duplicate kernels dropped,
  the GPU's schedules and launch shapes), emitted without a GPU or the simulator.
* ``--shared-models [DIR]``: ``--models`` for :data:`SHARED_MODELS` in DIR (default
  ``../shared/models`` beside the checkout); an absent folder is skipped with a notice, or is a
  failure under ``TENSORFUSE_REQUIRE_SHARED=1``.

Kernels are deduplicated by their source and dtypes (a kernel seen in an earlier group is not
compiled again) and compiled in ``--jobs`` worker processes. When ``ptxas`` is on PATH (CUDA's
assembler; ``--no-ptxas`` skips it) each PTX is also assembled with ``ptxas -arch=sm_XY``: NVVM
can write PTX that the CUDA 13.0 assembler rejects (a newer PTX ISA version, say). A PTX that
declares ``.extern .func`` fails too, ptxas or not: it calls a function it does not contain
(numba-cuda's float16 C++ shims), so it does not load by itself. ``--cache DIR`` remembers the
kernels that compiled with this toolchain and skips them on the next run; ``--keep DIR`` keeps
the models' exported sources.

Prints, per group, the kernels, the unique ones compiled, the failures (each with the first line
of its error) and the time; exits 0 when every kernel compiled, 1 on any failure or when there
was nothing to compile, 2 for bad arguments or an environment that cannot compile PTX (the CUDA
simulator switched on in this process, libNVVM missing).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

#: the shared models ``--shared-models`` compiles (issue 10's acceptance 2)
SHARED_MODELS = ("resnet18.unfolded.onnx", "mobilenet_v2.onnx", "bert_mini.unfolded.onnx")
#: ``../shared/models`` beside the checkout (the package folder is the repository root)
DEFAULT_SHARED_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "models"


@dataclass
class Unit:
    """One kernel to compile: its exported source file and parameter dtypes."""

    path: str
    kernel: str
    dtypes: list[str]
    key: str = ""

    def __post_init__(self):
        self.key = self.key or os.path.basename(self.path)[:-3]


@dataclass
class Result:
    """What compiling one :class:`Unit` gave: ``error`` is None when every launch function
    compiled (and assembled); else its first line. ``entries``: launch functions compiled;
    ``ptx_bytes``: their PTX's total size; ``seconds``: the worker's time."""

    key: str
    kernel: str
    error: str | None = None
    detail: str = ""
    entries: int = 0
    ptx_bytes: int = 0
    seconds: float = 0.0


@dataclass
class Group:
    """A set of kernels reported together (a sources folder, a model)."""

    name: str
    units: list[Unit] = field(default_factory=list)
    lower_seconds: float = 0.0
    setup_error: str | None = None


def read_sources(folder: str) -> list[Unit]:
    """The kernels exported into ``folder`` (``tf_*.py`` with their ``.json``), sorted by file
    name. ValueError when a source has no readable ``.json`` beside it."""
    units = []
    for py in sorted(pathlib.Path(folder).glob("tf_*.py")):
        meta_path = py.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{py}: no readable {meta_path.name} with its parameter dtypes ({e})") from None
        units.append(Unit(str(py), meta["kernel"], list(meta["dtypes"])))
    return units


def model_units(path: str, folder: str, opt_level: int = 2) -> list[Unit]:
    """Lower the ONNX model ``path`` for the cuda target as ``compile`` does, emit its kernels
    with the GPU's schedules (no GPU or simulator needed) and export them into ``folder``.
    Raises what the compiler raises (UnsupportedModelError, CompileError ...)."""
    from tensorfuse.codegen.cuda.jit import build_library, export_sources
    from tensorfuse.compiler.driver import dedupe_kernels
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.compiler.target import Target
    tgt = Target.parse("cuda")
    graph = import_onnx(path)
    optimize(graph, opt_level, target=tgt)
    lowered = lower_graph(graph, tgt)
    dedupe_kernels(lowered)
    lib = build_library(list(lowered.kernels), cache_dir=os.path.join(folder, "cache"))
    paths = export_sources(lib, folder)
    return [Unit(p, n, list(lib._entries[n]["dtypes"])) for p, n in zip(paths, lib.kernel_names)]


_EXTERN = re.compile(r"^\s*\.extern\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", re.M)


def unresolved_externs(ptx: str) -> list[str]:
    """The functions a PTX text declares ``.extern`` (calls it cannot resolve by itself: a
    numba-cuda C++ shim, such as its float16 operators, to be linked in at load time)."""
    return sorted(set(_EXTERN.findall(ptx)))


def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return str(text)[:300]


def compile_unit(unit: Unit, cc: tuple[int, int], ptxas: str | None) -> Result:
    """Compile every launch function of ``unit`` to PTX for ``cc`` (then assemble it with
    ``ptxas`` when given). Never raises: a failure is the Result's ``error``."""
    t0 = time.perf_counter()
    res = Result(unit.key, unit.kernel)
    try:
        from numba import cuda
        from tensorfuse.codegen.cuda.jit import _import, param_type
        from tensorfuse.ir.types import DType
        from numba import types
        mod = _import(unit.path)
        sig = types.void(*[param_type(DType(d)) for d in unit.dtypes])
        for fname, _, _ in mod.LAUNCHES:
            try:
                ptx, _ = cuda.compile_ptx(getattr(mod, fname), sig, cc=cc)
            except Exception as e:          # noqa: BLE001 - NVVM's or numba's error is the finding
                res.error = f"{fname}: compile_ptx: {type(e).__name__}: {_first_line(e)}"
                res.detail = str(e)
                break
            res.entries += 1
            res.ptx_bytes += len(ptx)
            externs = unresolved_externs(ptx)
            if externs:
                res.error = (f"{fname}: the PTX calls external functions it does not define: {', '.join(externs)} "
                             f"(it does not load without linking them in)")
                break
            if ptxas is not None:
                err = _assemble(ptx, cc, ptxas)
                if err is not None:
                    res.error = f"{fname}: ptxas: {_first_line(err)}"
                    res.detail = err
                    break
    except Exception as e:                  # noqa: BLE001 - an import error of the source
        res.error = f"{type(e).__name__}: {_first_line(e)}"
        res.detail = str(e)
    res.seconds = time.perf_counter() - t0
    return res


def _assemble(ptx: str, cc: tuple[int, int], ptxas: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="tf-ptxas-") as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        p = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-o", os.path.join(d, "k.cubin"), src],
                           capture_output=True, text=True)
        return None if p.returncode == 0 else (p.stderr or p.stdout or f"exit status {p.returncode}")


def _worker_init():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"


def _worker(args):
    unit, cc, ptxas = args
    return compile_unit(unit, cc, ptxas)


def _check_environment() -> str | None:
    """Why PTX cannot be made in this process, or None."""
    if "numba" in sys.modules:
        from numba.core import config
        if config.ENABLE_CUDASIM:
            return "numba was imported with the CUDA simulator on (NUMBA_ENABLE_CUDASIM=1): run the gate in its own process"
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    try:
        from numba import cuda
        if not cuda.cudadrv.nvvm.is_available():
            return "libNVVM is not available (pip install nvidia-nvvm==13.0.88 nvidia-cuda-nvrtc==13.0.88)"
    except Exception as e:                  # noqa: BLE001
        return f"numba.cuda cannot be imported: {type(e).__name__}: {e}"
    return None


def _toolchain_id(cc, ptxas: str | None) -> str:
    """What a cached success depends on besides the source: cc, numba-cuda's and NVVM's
    versions, and whether ptxas (which one) assembled it."""
    from importlib.metadata import PackageNotFoundError, version
    parts = [f"sm_{cc[0]}{cc[1]}"]
    for dist in ("numba-cuda", "nvidia-nvvm", "nvidia-cuda-nvrtc"):
        try:
            parts.append(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist}=?")
    if ptxas:
        p = subprocess.run([ptxas, "--version"], capture_output=True, text=True)
        parts.append("ptxas=" + (p.stdout.strip().splitlines() or ["?"])[-1])
    return ";".join(parts)


def _cache_path(cache: str, key: str, toolchain: str) -> str:
    import hashlib
    return os.path.join(cache, hashlib.sha256(f"{key};{toolchain}".encode()).hexdigest()[:32] + ".ok")


def run_gate(groups: list[Group], cc=(9, 0), jobs: int = 2, ptxas: str | None = None, out=None,
             cache: str | None = None) -> int:
    """Compile every group's kernels (deduplicated across groups, in ``jobs`` processes) and
    print the counts; returns the number of failures (kernels, and groups that could not be
    lowered). ``cache``: a folder remembering the kernels that compiled with this toolchain
    (:func:`_toolchain_id`), which are then not compiled again (failures are never cached)."""
    import multiprocessing as mp
    out = out if out is not None else sys.stdout
    seen: dict[str, Result] = {}
    toolchain = _toolchain_id(cc, ptxas) if cache else ""
    if cache:
        os.makedirs(cache, exist_ok=True)
    cached = 0
    failures = 0
    total_kernels = 0
    pool = None
    t_all = time.perf_counter()
    try:
        if jobs > 1:
            pool = mp.get_context("spawn").Pool(jobs, initializer=_worker_init)
        for g in groups:
            if g.setup_error is not None:
                failures += 1
                print(f"[ptx-gate] {g.name}: FAILED before compiling: {g.setup_error}", file=out)
                continue
            t0 = time.perf_counter()
            by_key: dict[str, Unit] = {}
            for u in g.units:
                by_key.setdefault(u.key, u)
            todo = []
            for k, u in by_key.items():
                if k in seen:
                    continue
                if cache and os.path.exists(_cache_path(cache, k, toolchain)):
                    seen[k] = Result(k, u.kernel, entries=json.loads(open(_cache_path(cache, k, toolchain)).read())["entries"])
                    cached += 1
                    continue
                todo.append(u)
            todo.sort(key=lambda u: -os.path.getsize(u.path))      # the longest first: the workers finish together
            args = [(u, cc, ptxas) for u in todo]
            results = pool.imap_unordered(_worker, args) if pool is not None else map(_worker, args)
            for r in results:
                seen[r.key] = r
                if cache and r.error is None:
                    with open(_cache_path(cache, r.key, toolchain), "w") as f:
                        f.write(json.dumps({"kernel": r.kernel, "entries": r.entries, "seconds": round(r.seconds, 2)}))
            wall = time.perf_counter() - t0
            mine = [seen[k] for k in by_key]
            bad = [r for r in mine if r.error is not None]
            new_bad = [r for r in bad if r.key in {u.key for u in todo}]
            failures += len(new_bad)
            total_kernels += len(g.units)
            launches = sum(r.entries for r in mine)
            lower = f", lowering {g.lower_seconds:.1f} s" if g.lower_seconds else ""
            print(f"[ptx-gate] {g.name}: {len(g.units)} kernels, {len(by_key)} unique ({launches} launch functions), "
                  f"{len(todo)} compiled here, {len(bad)} failed; {wall:.1f} s wall{lower}, "
                  f"{sum(r.seconds for r in seen.values() if r.key in {u.key for u in todo}):.1f} s in workers",
                  file=out)
            for r in bad:
                print(f"[ptx-gate]   FAILED {r.kernel} ({by_key[r.key].path}): {r.error}", file=out)
            slow = sorted((r for r in mine if r.seconds > 0 and r.key in {u.key for u in todo}), key=lambda r: -r.seconds)[:3]
            if slow:
                print("[ptx-gate]   slowest: " + ", ".join(f"{r.kernel} ({r.key}) {r.seconds:.1f} s" for r in slow), file=out)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    print(f"[ptx-gate] sm_{cc[0]}{cc[1]}{' + ptxas' if ptxas else ''}: {total_kernels} kernels, {len(seen)} unique, "
          f"{failures} failed{f', {cached} known good from the cache' if cache else ''}; {time.perf_counter() - t_all:.1f} s",
          file=out)
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorfuse.codegen.cuda.ptx_gate",
                                 description="Compile every generated cuda kernel to PTX (no GPU needed).")
    ap.add_argument("--sources", action="append", default=[], metavar="DIR",
                    help="a folder of exported kernel sources (TENSORFUSE_CUDA_SOURCES_DIR of a test run)")
    ap.add_argument("--models", nargs="+", default=[], metavar="FILE", help="ONNX models to lower for cuda")
    ap.add_argument("--shared-models", nargs="?", const=str(DEFAULT_SHARED_DIR), default=None, metavar="DIR",
                    help=f"also the models {', '.join(SHARED_MODELS)} in DIR (default {DEFAULT_SHARED_DIR})")
    ap.add_argument("--cc", default="9.0", help="compute capability, MAJOR.MINOR (default 9.0)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    ap.add_argument("--no-ptxas", action="store_true", help="do not assemble the PTX even when ptxas is on PATH")
    ap.add_argument("--cache", metavar="DIR", help="remember the kernels that compiled (by source, dtypes and toolchain) "
                    "in DIR and skip them next time")
    ap.add_argument("--keep", metavar="DIR", help="export the models' kernels into DIR (kept) instead of a temporary folder")
    a = ap.parse_args(argv)
    try:
        cc = tuple(int(x) for x in a.cc.split("."))
        assert len(cc) == 2
    except (ValueError, AssertionError):
        ap.error(f"--cc {a.cc!r}: expected MAJOR.MINOR such as 9.0")
    reason = _check_environment()
    if reason is not None:
        print(f"[ptx-gate] cannot compile PTX here: {reason}", file=sys.stderr)
        return 2
    models = list(a.models)
    if a.shared_models is not None:
        d = pathlib.Path(a.shared_models)
        if (d / "models.json").exists():
            models += [str(d / m) for m in SHARED_MODELS]
        elif os.environ.get("TENSORFUSE_REQUIRE_SHARED") == "1":
            print(f"[ptx-gate] {d} is absent (TENSORFUSE_REQUIRE_SHARED=1)", file=sys.stderr)
            return 1
        else:
            print(f"[ptx-gate] {d} is absent: the shared models are skipped", file=sys.stderr)
    if not a.sources and not models:
        ap.error("nothing to compile: give --sources, --models or --shared-models")
    ptxas = None if a.no_ptxas else shutil.which("ptxas")
    why = "skipped (--no-ptxas)" if a.no_ptxas else "not on PATH, skipped"
    print(f"[ptx-gate] compile_ptx for sm_{cc[0]}{cc[1]}; ptxas: {ptxas or why}; {a.jobs} jobs")
    groups = []
    for d in a.sources:
        g = Group(f"sources {d}")
        try:
            if not os.path.isdir(d):
                raise ValueError(f"{d} is not a folder")
            g.units = read_sources(d)
            if not g.units:
                raise ValueError(f"no exported kernels (tf_*.py) in {d}")
        except ValueError as e:
            g.setup_error = str(e)
        groups.append(g)
    tmp = None if a.keep else tempfile.mkdtemp(prefix="tf-ptx-gate-")
    try:
        for m in models:
            g = Group(f"model {os.path.basename(m)}")
            t0 = time.perf_counter()
            folder = os.path.join(a.keep or tmp, os.path.basename(m).replace(".", "_"))
            try:
                g.units = model_units(m, folder)
            except Exception as e:          # noqa: BLE001 - the compiler's error is the finding
                g.setup_error = f"{type(e).__name__}: {_first_line(e)}"
            g.lower_seconds = time.perf_counter() - t0
            groups.append(g)
        failures = run_gate(groups, cc, max(1, a.jobs), ptxas, cache=a.cache)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    # through the package module, so the worker processes unpickle the same classes
    from tensorfuse.codegen.cuda.ptx_gate import main as _main
    sys.exit(_main())
