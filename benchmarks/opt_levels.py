"""Per model and optimisation level: node count, kernels, compile time and the rule-log summary.

Models: .onnx files, folders (with a models.json, or every .onnx in them) or names of models in
``--models-dir`` (the shared models by default), as for bench_models.py.

Usage: .venv/bin/python benchmarks/opt_levels.py [--models-dir DIR] [MODEL ...]
"""
from __future__ import annotations

import collections
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tensorfuse  # noqa: E402
from bench_models import collect_models, declared_inputs, labels_for  # noqa: E402
from tensorfuse.compiler.frontend.onnx import import_onnx  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help=".onnx files, folders or model names (default: --models-dir)")
    ap.add_argument("--models-dir", type=pathlib.Path, default=SHARED,
                    help="folder with models.json and the .onnx files (default: ../shared/models)")
    args = ap.parse_args()
    models = collect_models(args)
    for (p, e), label in zip(models, labels_for(models)):
        path = str(p)
        dynamic = {} if e else declared_inputs(p, seed=0)[1]
        imported = len(import_onnx(path, input_shapes=dynamic or None).nodes)
        known = f"{e['node_count']} ONNX nodes, " if e and "node_count" in e else ""
        print(f"\n{label}: {known}{imported} after import")
        for level in (0, 1, 2, 3):
            t0 = time.perf_counter()
            mod = tensorfuse.compile(path, opt_level=level, cache=False, input_shapes=dynamic or None)
            dt = time.perf_counter() - t0
            rules = collections.Counter(a.rule for a in mod.rewrite_log)
            hist = mod.graph.op_histogram()
            print(f"  O{level}: {len(mod.graph.nodes):4d} nodes, {mod.num_kernels:4d} kernel calls, "
                  f"compile {dt:6.2f} s; ops {dict(list(hist.items())[:8])}")
            if rules:
                print(f"       rules: {dict(rules)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
