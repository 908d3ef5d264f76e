"""Frontend fuzzing: compile mutated ONNX files in a child process and classify what happens.

    python tests/fuzz/fuzz_models.py --seed 1 --count 1000 [--jobs N] [--real] [--boundary] [--out DIR]

Bases: the small models of ``fuzz.mutate.base_models``, some random graphs of
``fuzz.graphgen`` and, with ``--real``, the shared real models (``../shared/models``; each
compile of a big model that survives its mutation takes seconds). Mutation ``i`` is
``mutate(seed * 1_000_003 + i)``: structural edits of the ModelProto and byte-level edits of the
file (with ``--boundary``, the byte-level edit sets one to three bytes to 0x00, 0x01, 0x7f,
0x80 or 0xff). Each file is compiled (O2) and, when it compiles, run on random inputs, in a child process
(an abort is a crash, over ``--timeout`` s a hang), and loaded and run by onnxruntime in the
same way. Outcomes: ok, documented error (a TensorfuseError subclass; ValueError from run, the
run-time index checks), internal exception (any other type), crash, hang. Prints the breakdown
by error class beside onnxruntime's (loads+runs / loads, run fails / rejects); files with an
internal error, a crash or a hang are saved in ``--out`` (default ``fuzz-models-failures/``).
Exit status 1 if there was any.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fuzz import mutate as mu  # noqa: E402
from fuzz.isolate import run_isolated  # noqa: E402

SHARED = HERE.parent.parent.parent / "shared" / "models"


def bases(real: bool, n_random: int = 6) -> dict[str, bytes]:
    from fuzz import graphgen
    out = {k: m.SerializeToString() for k, m in mu.base_models().items()}
    for s in range(n_random):
        out[f"random{s}"] = graphgen.generate(7_000_000 + s, max_nodes=4).model.SerializeToString()
    if real and (SHARED / "models.json").exists():
        for e in json.loads((SHARED / "models.json").read_text())["models"]:
            if e.get("size_mb", 0) < 60:
                out[e["file"]] = (SHARED / e["file"]).read_bytes()
    return out


def run(seed: int, count: int, start: int = 0, jobs: int = 1, timeout: float = 60.0, real: bool = False,
        out: pathlib.Path | None = None, verbose: bool = True, ort: bool = True, boundary: bool = False):
    """Fuzz ``count`` mutations; returns (table: Counter of (category, detail, ort outcome),
    failures: list of (index, mutation name, category, detail))."""
    bs = bases(real)
    table = collections.Counter()
    failures = []
    lock = threading.Lock()

    def one(i):
        name, data = mu.mutate(seed * 1_000_003 + i, bs, boundary=boundary)
        cat, detail = mu.classify(run_isolated(mu.tensorfuse_outcome, (data,), timeout=timeout))
        o = run_isolated(mu.ort_outcome, (data,), timeout=timeout) if ort else ("ok", "-")
        ortres = o[1] if o[0] == "ok" else f"onnxruntime {o[0]}"
        with lock:
            table[(cat, detail, ortres)] += 1
            if cat not in ("ok", "documented"):
                failures.append((i, name, cat, detail))
                if verbose:
                    print(f"mutation {i} ({name}): {cat}: {detail}", flush=True)
                if out is not None:
                    out.mkdir(parents=True, exist_ok=True)
                    (out / f"{seed}-{i}.onnx").write_bytes(data)
                    (out / f"{seed}-{i}.txt").write_text(f"{name}\n{cat}: {detail}\nonnxruntime: {ortres}\n")
    idx = range(start, start + count)
    if jobs > 1:
        with ThreadPoolExecutor(jobs) as ex:
            list(ex.map(one, idx))
    else:
        for i in idx:
            one(i)
    return table, failures


def report(table) -> str:
    by_cat = collections.Counter()
    for (cat, _d, _o), n in table.items():
        by_cat[cat] += n
    lines = ["category: " + ", ".join(f"{k} {by_cat[k]}" for k in ("ok", "documented", "internal", "crash", "hang"))]
    rows = collections.defaultdict(collections.Counter)
    for (cat, d, o), n in table.items():
        rows[(cat, d)][o] += n
    ort_kinds = sorted({o for (_c, _d, o) in table})
    lines.append(f"{'tensorfuse outcome':<60} {'count':>6}   onnxruntime: " + " / ".join(ort_kinds))
    for (cat, d), c in sorted(rows.items(), key=lambda kv: (-sum(kv[1].values()))):
        lines.append(f"{(cat + ': ' + d)[:60]:<60} {sum(c.values()):>6}   " + " / ".join(str(c[k]) for k in ort_kinds))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--real", action="store_true", help="also mutate the shared real models")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime's side")
    ap.add_argument("--boundary", action="store_true", help="byte-level edits set bytes to boundary values")
    ap.add_argument("--out", default="fuzz-models-failures")
    args = ap.parse_args(argv)
    t0 = time.time()
    table, failures = run(args.seed, args.count, args.start, args.jobs, args.timeout, args.real,
                          pathlib.Path(args.out), ort=not args.no_ort, boundary=args.boundary)
    el = time.time() - t0
    print(f"\n{args.count} mutations (seed {args.seed}), {el:.0f} s, {el / max(args.count, 1):.2f} s each "
          f"with {args.jobs} job(s)")
    print(report(table))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
