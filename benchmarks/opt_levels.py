"""Per model and optimisation level: node count, kernels, compile time and the rule-log summary.

Usage: .venv/bin/python benchmarks/opt_levels.py [--models-dir DIR] [model-substring ...]
"""
from __future__ import annotations

import collections
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorfuse import compiler  # noqa: E402
from tensorfuse.compiler.frontend.onnx import import_onnx  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="substrings of model file names (default: all)")
    ap.add_argument("--models-dir", type=pathlib.Path, default=SHARED,
                    help="folder with models.json and the .onnx files (default: ../shared/models)")
    args = ap.parse_args()
    if not (args.models_dir / "models.json").exists():
        ap.error(f"{args.models_dir / 'models.json'} not found: give the shared models folder with --models-dir")
    entries = json.loads((args.models_dir / "models.json").read_text())["models"]
    wanted = args.models
    for e in entries:
        if wanted and not any(w in e["file"] for w in wanted):
            continue
        path = str(args.models_dir / e["file"])
        imported = len(import_onnx(path).nodes)
        print(f"\n{e['file']}: {e['node_count']} ONNX nodes, {imported} after import")
        for level in (0, 1, 2, 3):
            t0 = time.perf_counter()
            mod = tensorfuse.compile(path, opt_level=level, cache=False)
            dt = time.perf_counter() - t0
            rules = collections.Counter(str(r).split(":")[0] for r in mod.rewrite_log)
            hist = mod.graph.op_histogram()
            print(f"  O{level}: {len(mod.graph.nodes):4d} nodes, {mod.num_kernels:4d} kernel calls, "
                  f"compile {dt:6.2f} s; ops {dict(list(hist.items())[:8])}")
            if rules:
                print(f"       rules: {dict(rules)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
