"""Differential testing of random valid ONNX graphs against onnxruntime (issue 9).

    python tests/fuzz/random_graphs.py --seed 1 --count 1000 [--jobs N] [--out DIR] [--time-limit S]

Graph ``i`` of a run is ``graphgen.generate(seed * 1_000_003 + i)`` (with zero-sized dims and
degenerate conv shapes since issue 24; ``--classic`` gives the earlier graphs of a seed); each is compiled at O0, O2 and
O3 in a child process (an abort or hang is counted, not fatal), run, and compared with
onnxruntime (``ORT_DISABLE_ALL``) within the bounds of ``fuzz.graphgen``. ``--target "llvm
-mcpu=znver4"`` compiles for another CPU (AVX-512 on a machine without it) and does not run. Prints the counts of
ok / mismatch / crash / hang / internal error / refused (our own UnsupportedModelError on a
valid graph) per level and the time. Each failure is shrunk (``graphgen.shrink``: outputs and
nodes deleted while the same failure persists) and saved in ``--out`` (default
``fuzz-failures/``) as ``<seed>-O<level>-<kind>.onnx`` with its inputs (``.npz``) and a
``.txt`` saying what failed. Exit status 1 if anything failed.
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fuzz import graphgen  # noqa: E402
from fuzz.graphgen import LEVELS, check_case, check_model, generate, shrink  # noqa: E402

KINDS = ("ok", "mismatch", "crash", "hang", "internal", "refused")


def graph_seed(seed: int, i: int) -> int:
    return seed * 1_000_003 + i


def shrink_failure(case, outcome, timeout, target="llvm"):
    """Shrink ``case`` while the same kind of failure persists at the same level."""
    def still(m, feeds):
        (o,) = check_model(m, feeds, None, levels=(outcome.level,), timeout=timeout, target=target)
        return o.kind == outcome.kind
    return shrink(case.model, case.feeds, still)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first graph index (resume a run)")
    ap.add_argument("--jobs", type=int, default=1, help="graphs checked at once (child processes)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per compile+run before it counts as a hang")
    ap.add_argument("--out", default="fuzz-failures", help="folder for shrunk failures")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--target", default="llvm",
                    help='another CPU, e.g. "llvm -mcpu=znver4" (AVX-512): compile only, count aborts and errors')
    ap.add_argument("--ops", default=None, help="comma-separated generator names (conv,pool,...): draw only these")
    ap.add_argument("--max-nodes", type=int, default=None, help="ops drawn per graph (default: 1 to 6 generators)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds: start no graph after this (the summary counts the graphs done)")
    ap.add_argument("--classic", action="store_true",
                    help="no zero-sized dimensions and no degenerate conv shapes: the graphs seeds gave before issue 24")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    counts = {lvl: collections.Counter() for lvl in LEVELS}
    graphs_failed = []
    lock = threading.Lock()
    t0 = time.time()
    done = [0]
    nodes = [0]

    def one(i):
        if args.time_limit is not None and time.time() - t0 > args.time_limit:
            return
        s = graph_seed(args.seed, i)
        case = generate(s, max_nodes=args.max_nodes, ops=tuple(args.ops.split(',')) if args.ops else None,
                        zeros=not args.classic, degenerate=not args.classic)
        res = check_case(case, timeout=args.timeout, target=args.target)
        bad = [o for o in res if o.kind != "ok"]
        with lock:
            done[0] += 1
            nodes[0] += len(case.model.graph.node)
            for o in res:
                counts[o.level][o.kind] += 1
            for o in bad:
                print(f"graph {i} (seed {s}, ops {','.join(case.ops)}): O{o.level} {o.kind}: {o.detail}", flush=True)
            if done[0] % 50 == 0:
                el = time.time() - t0
                print(f"... {done[0]}/{args.count} graphs, {el:.0f} s ({el / done[0]:.2f} s/graph)", flush=True)
        if bad:
            out.mkdir(parents=True, exist_ok=True)
            o = bad[0]
            name = f"{s}-O{o.level}-{o.kind}"
            case.save(str(out / (name + ".orig.onnx")))
            m, feeds = (case.model, case.feeds) if args.no_shrink else shrink_failure(case, o, args.timeout, args.target)
            graphgen.Case(s, m, feeds).save(str(out / (name + ".onnx")))
            (out / (name + ".txt")).write_text(
                f"seed {s} (--seed {args.seed}, graph {i}); ops {case.ops}\n"
                + "\n".join(f"O{x.level} {x.kind}: {x.detail}" for x in bad)
                + f"\nshrunk: {len(case.model.graph.node)} -> {len(m.graph.node)} nodes\n")
            with lock:
                graphs_failed.append(name)

    idx = range(args.start, args.start + args.count)
    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as ex:
            list(ex.map(one, idx))
    else:
        for i in idx:
            one(i)
    el = time.time() - t0
    if done[0] < args.count:
        print(f"\n--time-limit {args.time_limit:g} s: {done[0]} of {args.count} graphs checked "
              f"(graphs start in order: --start {args.start + done[0]} resumes)")
    print(f"\n{done[0]} graphs (seed {args.seed}, {nodes[0]} nodes, {nodes[0] / max(done[0], 1):.1f} per graph), "
          f"{el:.0f} s, {el / max(done[0], 1):.2f} s per graph with {args.jobs} job(s)")
    print("level  " + "  ".join(f"{k:>9}" for k in KINDS))
    for lvl in LEVELS:
        print(f"O{lvl}     " + "  ".join(f"{counts[lvl][k]:>9}" for k in KINDS))
    if graphs_failed:
        print(f"{len(graphs_failed)} failing graphs saved in {out}/: " + ", ".join(graphs_failed))
    return 1 if graphs_failed else 0


if __name__ == "__main__":
    sys.exit(main())
