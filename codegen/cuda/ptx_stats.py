"""What a kernel's PTX says about its speed, without a GPU: registers, shared memory, spills, the
inner loop's instruction mix, and an occupancy and roofline estimate (issue 21's PTX report;
the command line is ``benchmarks/ptx_report.py``).

:func:`analyze_ptx` reads one PTX text (NVVM's output for one ``.entry``, as
``numba.cuda.compile_ptx`` gives it). The **inner loop** is the innermost loop that contains
FMAs: PTX loops are backward branches (``bra $L__BB0_3`` after the label ``$L__BB0_3:``); of the
loops whose body holds an ``fma``, those with no such loop nested inside, the one with the most
FMAs (or calls of the linked tensor-core micro-kernels, ``codegen/cuda/mma.py``, whose ``mma``
are counted at the call when :func:`analyze_ptx` is given NVRTC's PTX of them through
:func:`functions`). Its instruction mix counts PTX instructions (labels, directives and braces are not),
``fma.*`` (and ``mad.*`` of floats), ``mma``/``wmma``, and 64-bit integer operations in two
kinds (``around`` counts the same for the loop enclosing the inner loop, outside it: a GEMM's
per-K-slice work, global loads and their index arithmetic, shared stores, barriers):

- ``i64``: every integer instruction with a 64-bit type (``.s64/.u64/.b64``) except moves,
  loads, stores and ``cvta``;
- ``i64_index``: those that are index arithmetic rather than address formation, i.e. ``i64``
  less ``add.s64/.u64`` (base + offset), ``mul.wide`` and ``cvt`` from 32 bits (the widening of a
  32-bit index) and ``shl.b64`` by at most 3 (scaling it by the element size). CUDA C's own
  loops keep those few address operations; ``i64_index`` is what 64-bit index math costs.

:func:`ptxas_resources` runs ``ptxas -v`` (CUDA's assembler, when one is on PATH) for the
registers, shared memory, stack frame and spill bytes per entry. :func:`occupancy` and
:func:`roofline` estimate, for a :data:`H200` (sm_90: 132 SMs, 65536 registers and 228 KiB of
shared memory per SM, 64 warps per SM, about 67 TFLOP/s FP32 and 4.8 TB/s), the warps resident
per SM and the time bound of a kernel's FLOPs and bytes.

Imports nothing of the compiler; no numba needed (the caller compiles the PTX).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
    """The device the estimates are for."""

    name: str
    sms: int
    fp32_flops: float           # FLOP/s (an FMA is 2)
    bandwidth: float            # bytes/s of device memory
    regs_per_sm: int = 65536
    shared_per_sm: int = 228 * 1024
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    reg_alloc_unit: int = 256   # registers are allocated per warp in units of this many


#: NVIDIA H200 (SXM): 132 SMs of sm_90, ~67 TFLOP/s FP32 (non-tensor), HBM3e 4.8 TB/s
H200 = Gpu("H200", 132, 67e12, 4.8e12)
#: the H200's dense TF32 tensor-core peak (~495 TFLOP/s) over its FP32 peak
H200_TF32_OVER_FP32 = 495e12 / 67e12

_LABEL = re.compile(r"^\s*(\$?[\w$]+):\s*$")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$?[\w$]+)\s*;")
_ENTRY = re.compile(r"\.entry\s+([\w$]+)")
_SHARED = re.compile(r"^\s*(?:\.visible\s+|\.global\s+)?\.shared\s+(?:\.align\s+\d+\s+)?\.(?:b|f|u|s)(\d+)\s+[\w$]+\[(\d+)\]", re.M)
_INT64 = re.compile(r"\.(?:s64|u64|b64)\b")
_NOT_ARITH = ("mov", "ld", "st", "cvta", "ret", "bra", "call", "bar", "membar", "atom", "red")


@dataclass
class Mix:
    """Instruction counts of a stretch of PTX."""

    instructions: int = 0
    fma: int = 0
    mma: int = 0
    i64: int = 0
    i64_index: int = 0
    ld_shared: int = 0
    ld_global: int = 0
    local: int = 0
    vector_loads: int = 0
    #: calls of linked functions (the tensor-core micro-kernels), and the instructions those
    #: calls run (their ``mma`` are counted in ``mma``), when :func:`analyze_ptx` was given them
    calls: int = 0
    linked_instructions: int = 0

    @property
    def instructions_per_mma(self) -> float | None:
        """Instructions issued per ``mma`` (this stretch's and its linked calls'), or None."""
        return (self.instructions + self.linked_instructions) / self.mma if self.mma else None

    @property
    def fma_ratio(self) -> float:
        """FMAs per instruction (0 for an empty stretch)."""
        return self.fma / self.instructions if self.instructions else 0.0


@dataclass
class EntryStats:
    """One ``.entry`` of a PTX text: ``shared_bytes`` declared statically, ``local_ops`` the
    ``ld.local``/``st.local`` in the whole entry (spills or local arrays NVVM kept in memory),
    ``loop`` the inner loop's :class:`Mix` (None without an FMA loop), ``whole`` the entry's."""

    name: str
    shared_bytes: int = 0
    local_ops: int = 0
    loop: Mix | None = None
    loop_lines: tuple[int, int] | None = None
    #: the loop around the inner loop (a GEMM's K-slice loop: global loads, shared stores,
    #: barriers), its instructions outside the inner loop; None when there is none
    around: Mix | None = None
    whole: Mix = field(default_factory=Mix)
    # from ptxas -v (None without ptxas)
    registers: int | None = None
    stack_bytes: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None


def _instruction(line: str) -> str | None:
    """The opcode (``fma.rn.f32``) of a PTX line, or None for labels, directives, braces."""
    s = line.split("//", 1)[0].strip()
    if not s or s.startswith((".", "{", "}", "$")) or s.endswith(":"):
        return None
    if s.startswith("@"):
        parts = s.split(None, 1)
        s = parts[1] if len(parts) > 1 else ""
    op = s.split(None, 1)[0] if s else ""
    return op.rstrip(";") or None


_CALLEE = re.compile(r"^\s*call(?:\.uni)?\s*(?:\([^)]*\)\s*,)?\s*([A-Za-z_$][\w$]*)")


def _callee(lines: list[str], i: int) -> str | None:
    """The function a ``call`` at line i names (PTX writes it over several lines)."""
    mt = _CALLEE.match(" ".join(ln.strip() for ln in lines[i:i + 3]))
    return mt.group(1) if mt else None


def _count(lines: list[str], linked: dict | None = None) -> Mix:
    m = Mix()
    for i, ln in enumerate(lines):
        op = _instruction(ln)
        if op is None:
            continue
        m.instructions += 1
        base = op.split(".", 1)[0]
        if base == "call" and linked:
            f = linked.get(_callee(lines, i))
            if f is not None:
                m.calls += 1
                m.mma += f.mma
                m.linked_instructions += f.instructions
        if base == "fma" or (base == "mad" and (".f32" in op or ".f64" in op)):
            m.fma += 1
        if base in ("mma", "wmma") or op.startswith("wgmma"):
            m.mma += 1
        if op.startswith("ld.shared"):
            m.ld_shared += 1
        if op.startswith(("ld.global", "ld.param")) and op.startswith("ld.global"):
            m.ld_global += 1
        if op.startswith(("ld.local", "st.local")):
            m.local += 1
        if base == "ld" and (".v2." in op or ".v4." in op):
            m.vector_loads += 1
        if base in _NOT_ARITH or not _INT64.search(op):
            continue
        if ".f32" in op or ".f64" in op:        # cvt.f32.s64 and the like: a float result
            if base == "cvt" and op.split(".")[-2] in ("s64", "u64", "b64"):
                pass
            else:
                continue
        m.i64 += 1
        address = (op in ("add.s64", "add.u64") or op.startswith("mul.wide")
                   or (base == "cvt" and op.split(".")[-1] in ("u32", "s32") and op.split(".")[-2] in ("u64", "s64"))
                   or (op == "shl.b64" and re.search(r",\s*[0-3]\s*;", ln) is not None))
        if not address:
            m.i64_index += 1
    return m


def _loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first line, last line) of each loop: a branch back to a label above it."""
    labels = {}
    for i, ln in enumerate(lines):
        mt = _LABEL.match(ln)
        if mt:
            labels[mt.group(1)] = i
    out = []
    for j, ln in enumerate(lines):
        mt = _BRANCH.search(ln)
        if mt and labels.get(mt.group(1), j + 1) <= j:
            out.append((labels[mt.group(1)], j))
    return out


def split_entries(ptx: str) -> list[tuple[str, list[str]]]:
    """(entry name, its lines) for each ``.entry`` of a PTX text, which may be several modules
    joined (each from ``.version``); a module's declarations before its first entry (its
    ``.shared`` arrays, say) go with each of its entries."""
    out: list[tuple[str, list[str]]] = []
    modules = re.split(r"(?m)^(?=\.version\b)", ptx)
    for mod in modules:
        lines = mod.splitlines()
        starts = [i for i, ln in enumerate(lines) if _ENTRY.search(ln)]
        if not starts:
            continue
        header = lines[:starts[0]]
        for a, b in zip(starts, starts[1:] + [len(lines)]):
            out.append((_ENTRY.search(lines[a]).group(1), header + lines[a:b]))
    return out


def functions(ptx: str) -> dict[str, Mix]:
    """Name -> :class:`Mix` of each ``.func`` a PTX text defines (NVRTC's output for the linked
    tensor-core micro-kernels, ``codegen/cuda/mma.py``): what one call of it runs."""
    out = {}
    lines = ptx.splitlines()
    for i, ln in enumerate(lines):
        mt = re.match(r"^\.visible\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", ln)
        if not mt:
            continue
        j = i
        while j < len(lines) and lines[j].strip() != "{":
            j += 1
        depth, k = 0, j
        while k < len(lines):
            depth += lines[k].count("{") - lines[k].count("}")
            if depth == 0:
                break
            k += 1
        out[mt.group(1)] = _count(lines[j:k + 1])
    return out


def analyze_entry(name: str, lines: list[str], linked: dict | None = None) -> EntryStats:
    """:class:`EntryStats` of one entry's lines (see the module doc). ``linked``: name ->
    :class:`Mix` of functions linked in at load time (:func:`functions`): a call of one counts
    its ``mma`` (and makes its loop an inner-loop candidate, as an FMA does)."""
    st = EntryStats(name)
    text = "\n".join(lines)
    st.shared_bytes = sum(int(bits) // 8 * int(n) for bits, n in _SHARED.findall(text))
    st.whole = _count(lines, linked)
    st.local_ops = st.whole.local
    fma_lines = [i for i, ln in enumerate(lines) if (_instruction(ln) or "").split(".", 1)[0] in ("fma",)
                 or (_instruction(ln) or "").startswith(("mma", "wmma", "wgmma"))
                 or (linked and (_instruction(ln) or "").startswith("call") and _callee(lines, i) in linked)]
    loops = [(a, b) for a, b in _loops(lines) if any(a <= i <= b for i in fma_lines)]
    inner = [(a, b) for a, b in loops
             if not any((c, d) != (a, b) and a <= c and d <= b for c, d in loops)]
    if inner:
        a, b = max(inner, key=lambda ab: sum(ab[0] <= i <= ab[1] for i in fma_lines))
        st.loop_lines = (a, b)
        st.loop = _count(lines[a:b + 1], linked)
        outer = [(c, d) for c, d in _loops(lines) if c <= a and b <= d and (c, d) != (a, b)]
        if outer:
            c, d = min(outer, key=lambda cd: cd[1] - cd[0])
            st.around = _count(lines[c:a] + lines[b + 1:d + 1], linked)
    return st


def analyze_ptx(ptx: str, linked: dict | None = None) -> list[EntryStats]:
    """:class:`EntryStats` for each ``.entry`` of ``ptx`` (``linked``: :func:`analyze_entry`)."""
    return [analyze_entry(n, ls, linked) for n, ls in split_entries(ptx)]


_PTXAS_FN = re.compile(r"Compiling entry function '([\w$]+)'|Function properties for ([\w$]+)")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def find_ptxas() -> str | None:
    """The ``ptxas`` on PATH, or in a pip-installed CUDA toolkit (``nvidia/cuda_nvcc/bin``)."""
    p = shutil.which("ptxas")
    if p:
        return p
    try:
        import nvidia            # noqa: F401 - the namespace package of NVIDIA's wheels
        for root in nvidia.__path__:
            cand = os.path.join(root, "cuda_nvcc", "bin", "ptxas")
            if os.path.exists(cand):
                return cand
    except ImportError:
        pass
    return None


def ptxas_resources(ptx: str, arch: str = "sm_90", ptxas: str | None = None) -> dict[str, dict]:
    """Entry (or, for relocatable PTX, function) name -> {registers, stack_bytes, spill_stores,
    spill_loads} from ``ptxas -v`` (a function's registers count towards its callers').
    RuntimeError when ptxas rejects the PTX; {} without a ptxas."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="tf-ptxas-") as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        # -c (relocatable): a kernel calling functions linked in at load time (the tensor-core
        # micro-kernels, ``codegen/cuda/mma.py``), or NVRTC's PTX of those functions
        rel = ["-c"] if re.search(r"^\s*\.extern\s+\.func|^\.visible\s+\.func", ptx, re.M) else []
        p = subprocess.run([ptxas, f"-arch={arch}", "-v", *rel, "-o", os.path.join(d, "k.cubin"), src],
                           capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ptxas failed: {(p.stderr or p.stdout).strip()[:500]}")
    out: dict[str, dict] = {}
    cur = None
    for ln in (p.stderr + p.stdout).splitlines():
        mt = _PTXAS_FN.search(ln)
        if mt:
            cur = out.setdefault(mt.group(1) or mt.group(2), {})
            continue
        if cur is None:
            continue
        mt = _PTXAS_STACK.search(ln)
        if mt:
            cur["stack_bytes"], cur["spill_stores"], cur["spill_loads"] = map(int, mt.groups())
        mt = _PTXAS_USED.search(ln)
        if mt:
            cur["registers"] = int(mt.group(1))
    return out


def occupancy(threads: int, registers: int | None, shared_bytes: int, gpu: Gpu = H200) -> tuple[int, float]:
    """(blocks resident per SM, occupancy as resident warps / the SM's maximum) of a block of
    ``threads`` threads using ``registers`` per thread (None: not limiting) and
    ``shared_bytes`` of shared memory."""
    warps = -(-threads // 32)
    lim = [gpu.max_blocks_per_sm, gpu.max_warps_per_sm // warps]
    if registers:
        per_warp = -(-registers * 32 // gpu.reg_alloc_unit) * gpu.reg_alloc_unit
        lim.append(gpu.regs_per_sm // (per_warp * warps))
    if shared_bytes:
        lim.append(gpu.shared_per_sm // shared_bytes)
    blocks = max(0, min(lim))
    return blocks, blocks * warps / gpu.max_warps_per_sm


def roofline(flops: float | None, nbytes: int, gpu: Gpu = H200, fma_ratio: float | None = None,
             blocks: int | None = None) -> dict:
    """A kernel's time bounds (seconds) on ``gpu``: ``memory_s`` (``nbytes`` at full
    bandwidth), ``compute_s`` (``flops`` at peak FP32), and ``issue_s``: the compute bound once
    the inner loop's FMA share of instructions (``fma_ratio``: one FMA per issue slot is peak)
    and the grid's fill of the SMs (``blocks`` over the SM count, at most 1) are counted;
    ``bound`` is the largest of them, ``intensity`` FLOP per byte. An estimate: latency,
    occupancy and the loop's overhead outside the inner loop are not modelled."""
    out = {"memory_s": nbytes / gpu.bandwidth, "compute_s": None, "issue_s": None,
           "intensity": (flops / nbytes) if flops and nbytes else None}
    if flops:
        out["compute_s"] = flops / gpu.fp32_flops
        eff = 1.0
        if fma_ratio is not None:
            eff *= max(fma_ratio, 1e-3)
        if blocks is not None:          # SMs without a block of this grid idle
            eff *= min(1.0, blocks / gpu.sms)
        out["issue_s"] = out["compute_s"] / eff
    out["bound"] = max(v for v in (out["memory_s"], out["compute_s"], out["issue_s"]) if v is not None)
    return out
