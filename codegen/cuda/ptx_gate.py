"""The PTX gate's library: every generated cuda kernel compiles to PTX for a real GPU, without one.

The command line is :mod:`tensorfuse.compiler.ptx_gate` (``python -m tensorfuse.compiler.ptx_gate
--sources DIR ... --models FILE.onnx ...``), which also lowers whole models for the cuda target;
this module compiles kernels that are already exported, and imports nothing of the compiler.

Kernels exported by a process (``codegen.cuda.jit.export_sources``: ``tf_<digest>.py`` with its
``.json`` of parameter dtypes) are read with :func:`read_sources` and compiled by
:func:`run_gate`, with ``numba.cuda.compile_ptx`` (libNVVM from pip, pinned to CUDA 13.0.88, see
pyproject's ``test`` extra), for a compute capability (the H200's 9.0 by default).

Kernels are deduplicated by their source and dtypes (a kernel seen in an earlier group is not
compiled again) and compiled in worker processes. When ``ptxas`` is given (CUDA's assembler)
each PTX is also assembled with ``ptxas -arch=sm_XY``: NVVM can write PTX that the CUDA 13.0
assembler rejects (a newer PTX ISA version, say). A PTX that declares ``.extern .func`` fails
too, ptxas or not: it calls a function it does not contain (numba-cuda's float16 C++ shims), so
it does not load by itself. A cache folder remembers the kernels that compiled with this
toolchain and skips them on the next run.

:func:`run_gate` prints, per group, the kernels, the unique ones compiled, the failures (each
with the first line of its error) and the time.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

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


_EXTERN = re.compile(r"^\s*\.extern\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", re.M)


def unresolved_externs(ptx: str) -> list[str]:
    """The functions a PTX text declares ``.extern`` (calls it cannot resolve by itself: a
    numba-cuda C++ shim, such as its float16 operators, to be linked in at load time)."""
    return sorted(set(_EXTERN.findall(ptx)))


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (at most 300 characters)."""
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
                res.error = f"{fname}: compile_ptx: {type(e).__name__}: {first_line(e)}"
                res.detail = str(e)
                break
            res.entries += 1
            res.ptx_bytes += len(ptx)
            from tensorfuse.codegen.cuda.mma import linked_functions
            externs = [e for e in unresolved_externs(ptx) if e not in linked_functions(cc)]
            if externs:
                res.error = (f"{fname}: the PTX calls external functions it does not define: {', '.join(externs)} "
                             f"(it does not load without linking them in)")
                break
            if ptxas is not None:
                err = _assemble(ptx, cc, ptxas)
                if err is not None:
                    res.error = f"{fname}: ptxas: {first_line(err)}"
                    res.detail = err
                    break
    except Exception as e:                  # noqa: BLE001 - an import error of the source
        res.error = f"{type(e).__name__}: {first_line(e)}"
        res.detail = str(e)
    res.seconds = time.perf_counter() - t0
    return res


def _assemble(ptx: str, cc: tuple[int, int], ptxas: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="tf-ptxas-") as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        # -c: a kernel calling the linked tensor-core micro-kernels (codegen/cuda/mma.py) is
        # relocatable code until the driver links NVRTC's PTX in
        rel = ["-c"] if unresolved_externs(ptx) else []
        p = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", *rel, "-o", os.path.join(d, "k.cubin"), src],
                           capture_output=True, text=True)
        return None if p.returncode == 0 else (p.stderr or p.stdout or f"exit status {p.returncode}")


def _worker_init():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"


def _worker(args):
    unit, cc, ptxas = args
    return compile_unit(unit, cc, ptxas)


def check_environment() -> str | None:
    """Why PTX cannot be made in this process, or None (the simulator was switched on, libNVVM
    or numba.cuda is missing); switches the simulator off for numba imported later."""
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


if __name__ == "__main__":
    sys.exit("the PTX gate's command line is python -m tensorfuse.compiler.ptx_gate")
