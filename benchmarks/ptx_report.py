"""PTX report: what each cuda kernel of a model will cost on the GPU, read off its PTX without a GPU.

    .venv/bin/python benchmarks/ptx_report.py MODEL.onnx [--target "cuda -arch=sm_80"] [-O 2]
        [--precision fp32|tf32|auto] [--only WORD] [--json FILE]

Lowers MODEL as ``compile(MODEL, target="cuda")`` does (the level's passes with the NHWC layout
pass, the GPU schedules, duplicate kernels dropped), compiles each kernel to PTX with NVVM for
the architecture (default sm_90: the H200; NVVM alone makes PTX, no GPU or simulator needed),
and prints one row per kernel launch function:

- ``sched``: the schedule that emitted it; ``grid x block``: its launch;
- ``regs``, ``spill``: registers per thread and spill bytes (stores + loads) from ``ptxas -v``
  when a ptxas is on PATH or in a pip-installed CUDA toolkit (else ``-``); ``smem``: static shared
  memory (bytes); ``local``: ``ld.local``/``st.local`` in the PTX;
- the **inner loop** (the innermost loop holding FMAs, ``codegen/cuda/ptx_stats.py``):
  ``loop``: its instructions, ``fma/ins``: FMAs per instruction (1 is every issue slot an FMA),
  ``i64``: 64-bit integer instructions in it, ``i64ix``: those that are index arithmetic (not
  the address formation of a load: ``mul.wide``, ``add.s64``), ``mma``: tensor-core
  instructions in the inner loop (the whole kernel's without one), those of the linked TF32
  micro-kernels (``--precision tf32``; ``codegen/cuda/mma.py``, NVRTC's PTX) counted at their
  calls; ``ins/mma``: the inner loop's instructions, the micro-kernels' included, per ``mma``; ``outer``, ``o.i64ix``: the instructions and 64-bit index operations of the
  loop around it outside it (a GEMM's per-K-slice work: its global loads with their im2col
  index arithmetic, shared stores, the barrier), which the FMA share above leaves out;
- ``occ``: resident warps per SM over the maximum (64) from registers, shared memory and
  block size (``ptx_stats.occupancy``);
- ``GFLOP``, ``MB``: the kernel's FLOPs (the node's, first kernel of a node only) and the bytes
  of its parameters (each read or written once: a lower bound of its memory traffic);
  ``bound us``: the larger of the memory time (4.8 TB/s) and the compute time at the FP32 peak
  (67 TFLOP/s) derated by the inner loop's FMA share (for a TF32 kernel: 32 FMAs per lane per
  ``mma`` over ``ins/mma``, at most the TF32 tensor peak's 7.4x) and by the share of the 132 SMs its grid
  reaches
  (``ptx_stats.roofline``): an estimate for an H200, not a measurement.

Exit status 0; 2 for bad arguments or an environment that cannot make PTX (the simulator on).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile


def _arch(target: str) -> tuple[str, tuple[int, int]]:
    """(the target without ``-arch``, compute capability) of ``"cuda -arch=sm_80"``."""
    cc = (9, 0)
    rest = []
    for part in target.split():
        m = re.fullmatch(r"-arch=sm_(\d)(\d+)", part)
        if m:
            cc = (int(m.group(1)), int(m.group(2)))
        elif part.startswith("-arch"):
            raise SystemExit(f"ptx_report: bad {part!r} (expected -arch=sm_XY)")
        else:
            rest.append(part)
    return " ".join(rest) or "cuda", cc


def report(model: str, target: str = "cuda", opt_level: int = 2, only: str | None = None,
           precision: str | None = None) -> list[dict]:
    """One dict per launch function of ``model``'s cuda kernels (the columns of the module doc),
    lowered with ``compile``'s ``precision`` option."""
    from numba import cuda, types

    from tensorfuse.codegen.cuda.jit import build_library, param_type
    from tensorfuse.codegen.cuda import ptx_stats
    from tensorfuse.compiler.driver import dedupe_kernels
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.pipeline import optimize
    from tensorfuse.ir.target import Target
    from tensorfuse.ir.types import DType
    tgt_s, cc = _arch(target)
    tgt = Target.parse(tgt_s)
    graph = import_onnx(model)
    optimize(graph, opt_level, target=tgt)
    from tensorfuse.codegen.cuda import mma
    with mma.precision_scope(precision):
        lowered = lower_graph(graph, tgt)
    dedupe_kernels(lowered)
    linked = linked_spill = None
    flops = {}
    for c in lowered.calls:
        if c.flops is not None:
            flops.setdefault(c.kernel, c.flops)
    kernels = [k for k in lowered.kernels if only is None or only in k.name]
    arch = f"sm_{cc[0]}{cc[1]}"
    ptxas = ptx_stats.find_ptxas()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tf-ptx-report-") as d:
        lib = build_library(kernels, cache_dir=d)
        for k in kernels:
            mod = lib._module(k.name)
            sig = types.void(*[param_type(DType(t)) for t in lib._entries[k.name]["dtypes"]])
            nbytes = sum(b.numel * b.dtype.itemsize for b in k.params)
            for (fname, _, _), (grid, block) in zip(mod.LAUNCHES, lib.launch_config(k.name)):
                ptx, _ = cuda.compile_ptx(getattr(mod, fname), sig, cc=cc)
                tc = "_tfmma." in lib.sources[k.name]
                if tc and linked is None:       # the micro-kernels as the driver links them
                    mptx = mma.nvrtc_ptx(cc)
                    linked = ptx_stats.functions(mptx)
                    lres = ptx_stats.ptxas_resources(mptx, arch, ptxas) if ptxas else {}
                    linked_spill = (sum(r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in lres.values())
                                    if lres else None)
                res = ptx_stats.ptxas_resources(ptx, arch, ptxas) if ptxas else {}
                for st in ptx_stats.analyze_ptx(ptx, linked if tc else None):
                    r = res.get(st.name, {})
                    threads = math.prod(block)
                    bps, occ = ptx_stats.occupancy(threads, r.get("registers"), st.shared_bytes)
                    loop = st.loop
                    fl = flops.get(k.name)
                    ratio = loop.fma_ratio if loop else None
                    if loop and loop.mma:           # an m16n8k8 mma: 1024 FMAs, 32 per lane
                        ratio = min(32 / loop.instructions_per_mma, ptx_stats.H200_TF32_OVER_FP32)
                    roof = ptx_stats.roofline(fl, nbytes, fma_ratio=ratio,
                                              blocks=math.prod(grid))
                    rows.append({
                        "kernel": k.name, "function": fname, "schedule": k.schedule or "generic",
                        "grid": list(grid), "block": list(block), "registers": r.get("registers"),
                        "spill_bytes": (r["spill_stores"] + r["spill_loads"]) if "spill_stores" in r else None,
                        "stack_bytes": r.get("stack_bytes"), "shared_bytes": st.shared_bytes,
                        "local_ops": st.local_ops, "instructions": st.whole.instructions,
                        "loop_instructions": loop.instructions if loop else None,
                        "loop_fma": loop.fma if loop else None,
                        "fma_ratio": round(loop.fma_ratio, 3) if loop else None,
                        "loop_i64": loop.i64 if loop else None, "loop_i64_index": loop.i64_index if loop else None,
                        "loop_ld_shared": loop.ld_shared if loop else None,
                        "mma": loop.mma if loop else st.whole.mma,
                        "instructions_per_mma": (round(loop.instructions_per_mma, 1)
                                                 if loop and loop.mma else None),
                        "linked_local_ops": sum(f.local for f in linked.values()) if tc else None,
                        "linked_spill_bytes": linked_spill if tc else None,
                        "around_instructions": st.around.instructions if st.around else None,
                        "around_i64_index": st.around.i64_index if st.around else None,
                        "blocks_per_sm": bps, "occupancy": round(occ, 3), "flops": fl, "bytes": nbytes,
                        "bound_us": roof["bound"] * 1e6, "memory_us": roof["memory_s"] * 1e6,
                        "compute_us": roof["compute_s"] * 1e6 if roof["compute_s"] else None,
                        "arch": arch, "ptxas": bool(ptxas)})
    return rows


def _fmt(v, spec: str = "", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def print_table(rows: list[dict], out=sys.stdout) -> None:
    hdr = (f"{'kernel':34s} {'sched':22s} {'grid x block':>13s} {'regs':>4s} {'spill':>5s} {'smem':>6s} "
           f"{'local':>5s} {'loop':>5s} {'fma/ins':>7s} {'i64':>4s} {'i64ix':>5s} {'outer':>5s} {'o.i64ix':>7s} "
           f"{'mma':>3s} {'ins/mma':>7s} {'occ':>5s} "
           f"{'GFLOP':>7s} {'MB':>6s} {'bound us':>8s}")
    print(hdr, file=out)
    print("-" * len(hdr), file=out)
    for r in rows:
        name = r["function"][2:] if r["function"].startswith("k_") else r["function"]
        sched = r["schedule"].replace("cuda.", "")
        print(f"{name[:34]:34s} {sched[:22]:22s} {str(r['grid'][0]) + 'x' + str(r['block'][0]):>13s} "
              f"{_fmt(r['registers']):>4s} {_fmt(r['spill_bytes']):>5s} {r['shared_bytes']:>6d} {r['local_ops']:>5d} "
              f"{_fmt(r['loop_instructions']):>5s} {_fmt(r['fma_ratio'], '.2f'):>7s} {_fmt(r['loop_i64']):>4s} "
              f"{_fmt(r['loop_i64_index']):>5s} {_fmt(r['around_instructions']):>5s} "
              f"{_fmt(r['around_i64_index']):>7s} {r['mma']:>3d} {_fmt(r['instructions_per_mma']):>7s} "
              f"{r['occupancy']:>5.2f} "
              f"{_fmt(r['flops'] / 1e9 if r['flops'] else None, '.3f'):>7s} {r['bytes'] / 1e6:>6.2f} "
              f"{r['bound_us']:>8.2f}", file=out)
    tot = sum(r["bound_us"] for r in rows)
    print(f"\n{len(rows)} launch functions; sum of the per-kernel bounds {tot:.1f} us on an H200 "
          f"(launch overhead not counted); ptxas: {'yes' if rows and rows[0]['ptxas'] else 'no'}", file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/ptx_report.py", description=__doc__.split("\n")[0])
    ap.add_argument("model", help="an ONNX model")
    ap.add_argument("--target", default="cuda", help='"cuda" (sm_90) or "cuda -arch=sm_XY"')
    ap.add_argument("-O", "--opt-level", type=int, default=2, choices=(0, 1, 2))
    ap.add_argument("--only", default=None, help="only kernels whose name contains this")
    ap.add_argument("--precision", default=None, choices=("fp32", "tf32", "auto"),
                    help="compile's precision option (tf32: the GEMM/conv kernels on tensor cores)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        print("ptx_report: PTX cannot be made under the CUDA simulator; unset NUMBA_ENABLE_CUDASIM", file=sys.stderr)
        return 2
    rows = report(args.model, args.target, args.opt_level, args.only, args.precision)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
