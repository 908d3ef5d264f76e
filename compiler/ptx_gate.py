"""The PTX gate's command line: every generated cuda kernel compiles to PTX for a real GPU, without one.

``python -m tensorfuse.compiler.ptx_gate [--sources DIR ...] [--models FILE.onnx ...]
[--shared-models [DIR]] [--cc 9.0] [--jobs N] [--no-ptxas] [--cache DIR] [--keep DIR]``

compiles, with ``numba.cuda.compile_ptx`` (libNVVM from pip, pinned to CUDA 13.0.88, see
pyproject's ``test`` extra), for compute capability ``--cc`` (default 9.0, the H200):

* ``--sources DIR``: every kernel a process exported there (``codegen.cuda.jit.export_sources``:
  ``tf_<digest>.py`` with its ``.json`` of parameter dtypes). ``make test-cuda`` runs the
  simulator tests with ``TENSORFUSE_CUDA_SOURCES_DIR`` set, then this gate over that folder, so
  the code the simulator accepted is also code NVVM accepts.
* ``--models FILE``: every kernel of an ONNX model as ``compile(FILE, target="cuda")`` makes it
  (import, the level-2 pipeline with the NHWC layout pass, lowering, duplicate kernels dropped,
  the GPU's schedules and launch shapes), emitted without a GPU or the simulator
  (:func:`model_units`).
* ``--shared-models [DIR]``: ``--models`` for :data:`SHARED_MODELS` in DIR (default
  ``../shared/models`` beside the checkout); an absent folder is skipped with a notice, or is a
  failure under ``TENSORFUSE_REQUIRE_SHARED=1``.

The kernels are compiled by the gate's library, ``codegen.cuda.ptx_gate`` (deduplicated,
``--jobs`` worker processes, ``ptxas`` when it is on PATH and ``--no-ptxas`` is not given,
``--cache DIR`` remembering the kernels that compiled with this toolchain); ``--keep DIR`` keeps
the models' exported sources. The model lowering lives here, in the compiler, so that
``codegen`` imports nothing of it.

Prints, per group, the kernels, the unique ones compiled, the failures (each with the first line
of its error) and the time; exits 0 when every kernel compiled, 1 on any failure or when there
was nothing to compile, 2 for bad arguments or an environment that cannot compile PTX (the CUDA
simulator switched on in this process, libNVVM missing).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

from tensorfuse.codegen.cuda.ptx_gate import Group, Unit, check_environment, first_line, read_sources, run_gate

#: the shared models ``--shared-models`` compiles (issue 10's acceptance 2)
SHARED_MODELS = ("resnet18.unfolded.onnx", "mobilenet_v2.onnx", "bert_mini.unfolded.onnx")
#: ``../shared/models`` beside the checkout (the package folder is the repository root)
DEFAULT_SHARED_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "models"


def model_units(path: str, folder: str, opt_level: int = 2) -> list[Unit]:
    """Lower the ONNX model ``path`` for the cuda target as ``compile`` does, emit its kernels
    with the GPU's schedules (no GPU or simulator needed) and export them into ``folder``.
    Raises what the compiler raises (UnsupportedModelError, CompileError ...)."""
    from tensorfuse.codegen.cuda.jit import build_library, export_sources
    from tensorfuse.compiler.driver import dedupe_kernels
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    tgt = Target.parse("cuda")
    graph = import_onnx(path)
    optimize(graph, opt_level, target=tgt)
    lowered = lower_graph(graph, tgt)
    dedupe_kernels(lowered)
    lib = build_library(list(lowered.kernels), cache_dir=os.path.join(folder, "cache"))
    paths = export_sources(lib, folder)
    return [Unit(p, n, list(lib._entries[n]["dtypes"])) for p, n in zip(paths, lib.kernel_names)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorfuse.compiler.ptx_gate",
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
    reason = check_environment()
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
                g.setup_error = f"{type(e).__name__}: {first_line(e)}"
            g.lower_seconds = time.perf_counter() - t0
            groups.append(g)
        failures = run_gate(groups, cc, max(1, a.jobs), ptxas, cache=a.cache)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    # through the package module (not __main__), as the worker processes import it
    from tensorfuse.compiler.ptx_gate import main as _main
    sys.exit(_main())
