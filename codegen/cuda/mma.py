"""The tensor-core (TF32 ``mma.sync``) micro-kernel of the cuda GEMM and implicit-GEMM conv, and
the ``precision`` compile option it serves (docs/cuda.md, "Precision").

numba-cuda cannot emit ``mma`` itself; it calls foreign device functions declared with
``cuda.declare_device(..., link=[source.cu])``, whose CUDA C++ it compiles with NVRTC and links
into the kernel. :func:`cuda_source` is that C++: one ``extern "C"`` function per warp-tile
shape (``mf`` m-fragments x ``nf`` n-fragments), which rounds its float32 operands to TF32
(``cvt.rna.tf32.f32``: round to nearest, ties away from zero, 10 explicit mantissa bits; PTX ISA
9.7.9.21 "cvt") and issues ``mf * nf`` of
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` (PTX ISA 9.7.14.5.14 "mma", sm_80+),
accumulating in float32. It is called with the C ABI (``abi="c"``), so its 4 * mf * nf results
come back by value in the ``.param`` space: no local-memory return slot.

Fragment layout of one m16n8k8 TF32 mma (PTX ISA 9.7.14.5.1.x, "Matrix Fragments for mma.m16n8k8",
.tf32), lane ``L`` of the warp, ``g = L // 4``, ``q = L % 4``:

- A (16 x 8, row-major): ``a0 = A[g][q]``, ``a1 = A[g+8][q]``, ``a2 = A[g][q+4]``, ``a3 = A[g+8][q+4]``;
- B (8 x 8, column-major): ``b0 = B[q][g]``, ``b1 = B[q+4][g]``;
- C, D (16 x 8, float32): ``c0, c1 = C[g][2q], C[g][2q+1]``; ``c2, c3 = C[g+8][2q], C[g+8][2q+1]``.

The kernel IR carries the call as :class:`MmaTile`, a vector expression of 4 * mf * nf float32
lanes (the warp tile's accumulators of this lane) that the cuda emitter renders as one call of
``_tfmma.tile_<mf>x<nf>(...)``. Under numba's CUDA simulator, which cannot run linked device
code, ``tile_<mf>x<nf>`` is :func:`_sim_tile`: the same warp-level product in Python (the lanes of
a warp exchange their fragments through the simulated block, with two barriers), operands rounded
to TF32 by :func:`round_tf32` and products summed in float32, so simulator tests check the TF32
numerics. The generated source is the same in both modes.

Precision (:data:`PRECISIONS`): ``"fp32"`` keeps the FMA kernels (float32 products and sums, as
onnxruntime's CPU kernels up to summation order); ``"tf32"`` runs the GEMM/conv inner product on
tensor cores; ``"auto"`` is PyTorch's default convention (``torch.backends.cudnn.allow_tf32 =
True``, ``torch.backends.cuda.matmul.allow_tf32 = False``): TF32 for convolutions, FP32 for
MatMul/Gemm. The option is read by the schedules through :func:`precision_scope` /
:func:`forced_precision` while the driver lowers a graph.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from dataclasses import dataclass

import numpy as np

from tensorfuse.ir.kernel import Expr
from tensorfuse.ir.types import DType

#: the values of ``compile(..., precision=...)`` for target "cuda"
PRECISIONS = ("fp32", "tf32", "auto")
#: the warp-tile shapes (m-fragments, n-fragments) the C++ source defines, by the GEMM's
#: per-thread register tile R (R * R accumulators per thread = 4 * mf * nf)
TILE_SHAPES = {2: (1, 1), 4: (1, 4), 8: (2, 8)}
#: the architecture the micro-kernel needs (mma.sync with .tf32 operands: sm_80, PTX ISA 7.0)
MIN_CC = (8, 0)

_PRECISION: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_cuda_precision", default=None)


def check_precision(precision) -> str | None:
    """``precision`` checked: None or one of :data:`PRECISIONS`. ValueError otherwise."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))} (or None: 'fp32'), "
                         f"got {precision!r}")
    return precision


@contextlib.contextmanager
def precision_scope(precision: str | None):
    """Within the block the cuda GEMM schedules use ``precision`` (None: their defaults)."""
    tok = _PRECISION.set(check_precision(precision))
    try:
        yield
    finally:
        _PRECISION.reset(tok)


def forced_precision() -> str | None:
    """The precision the compile asked for (:func:`precision_scope`), or None."""
    return _PRECISION.get()


def gemm_precision(conv: bool) -> str:
    """The precision a float32 GEMM (``conv``: an implicit-GEMM convolution) runs in: the compile
    option's, with "auto" (and None, the default: "fp32") resolved as the module doc says."""
    p = forced_precision() or "fp32"
    if p == "auto":
        return "tf32" if conv else "fp32"
    return p


@dataclass(eq=False)
class MmaTile(Expr):
    """One k-step (k = 8) of a warp's ``16 mf x 8 nf`` output tile on tensor cores: ``a`` the
    lane's A fragments (4 per m-fragment, module doc layout), ``b`` its B fragments (2 per
    n-fragment), ``c`` its accumulators (4 per (m, n) fragment pair, m-major); the value is the
    4 * mf * nf float32 lanes ``D = tf32(A) tf32(B) + C`` (FP32 accumulation). All operands are
    float32 scalars; a warp-collective operation: every lane of the warp must evaluate it
    together, in uniform control flow."""
    a: tuple
    b: tuple
    c: tuple
    mf: int
    nf: int

    @property
    def dtype(self):
        return DType.f32

    @property
    def lanes(self):
        return 4 * self.mf * self.nf

    def operands(self) -> tuple:
        """Every operand (``ir.schedule.expr_children``)."""
        return (*self.a, *self.b, *self.c)

    def print_with(self, pr) -> str:
        """The kernel-IR text (``ir.kernel_text``): ``mma_tf32_<mf>x<nf>(a..; b..; c..)``."""
        return (f"mma_tf32_{self.mf}x{self.nf}({', '.join(map(pr, self.a))}; {', '.join(map(pr, self.b))}; "
                f"{', '.join(map(pr, self.c))})")


def func_name(mf: int, nf: int) -> str:
    return f"tile_{mf}x{nf}"


def render_call(e: MmaTile, operand) -> str:
    """The emitter's text of ``e``'s call: ``operand(x)`` renders a scalar operand."""
    args = ", ".join(operand(x) for x in (*e.a, *e.b, *e.c))
    return f"_tfmma.{func_name(e.mf, e.nf)}({args})"


# -- the CUDA C++ micro-kernel --------------------------------------------------------------------
def cuda_source() -> str:
    """The CUDA C++ of every :data:`TILE_SHAPES` micro-kernel (module doc), for NVRTC."""
    out = ["// tensorfuse TF32 tensor-core micro-kernels (generated by tensorfuse.codegen.cuda.mma)",
           "// PTX ISA 9.7.14.5.14 mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (sm_80+)",
           "static __device__ __forceinline__ unsigned tf32(float x) {",
           "    unsigned r; asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(r) : \"f\"(x)); return r; }"]
    for mf, nf in sorted(set(TILE_SHAPES.values())):
        n = 4 * mf * nf
        name = func_name(mf, nf)
        out.append(f"struct R_{name} {{ float v[{n}]; }};")
        params = [f"float a{i}" for i in range(4 * mf)] + [f"float b{i}" for i in range(2 * nf)] + \
                 [f"float c{i}" for i in range(n)]
        out.append(f'extern "C" __device__ R_{name} {name}({", ".join(params)}) {{')
        out.append(f"    R_{name} r;")
        for i in range(4 * mf):
            out.append(f"    unsigned A{i} = tf32(a{i});")
        for i in range(2 * nf):
            out.append(f"    unsigned B{i} = tf32(b{i});")
        for mi in range(mf):
            for ni in range(nf):
                o = 4 * (mi * nf + ni)
                out.append(
                    "    asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\"\n"
                    f"        : \"=f\"(r.v[{o}]), \"=f\"(r.v[{o + 1}]), \"=f\"(r.v[{o + 2}]), \"=f\"(r.v[{o + 3}])\n"
                    f"        : \"r\"(A{4 * mi}), \"r\"(A{4 * mi + 1}), \"r\"(A{4 * mi + 2}), \"r\"(A{4 * mi + 3}), "
                    f"\"r\"(B{2 * ni}), \"r\"(B{2 * ni + 1}),\n"
                    f"          \"f\"(c{o}), \"f\"(c{o + 1}), \"f\"(c{o + 2}), \"f\"(c{o + 3}));")
        out.append("    return r;\n}")
    return "\n".join(out) + "\n"


def source_path() -> str:
    """The C++ of :func:`cuda_source` written once (content-addressed) under the cuda cache
    folder; the path ``declare_device(link=...)`` names. OSError when it cannot be written."""
    from .jit import _write_source, default_cache_dir
    return _write_source(default_cache_dir(), cuda_source(), prefix="tfmma_", suffix=".cu", digits=16)


def nvrtc_ptx(cc: tuple[int, int] = (9, 0)) -> str:
    """:func:`cuda_source` compiled to PTX for ``sm_<cc>`` by NVRTC (cuda-bindings), as numba
    links it; no GPU needed. RuntimeError with NVRTC's log when it fails."""
    from cuda.bindings import nvrtc
    src = cuda_source().encode()
    err, prog = nvrtc.nvrtcCreateProgram(src, b"tfmma.cu", 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcCreateProgram: {err}")
    try:
        opts = [f"--gpu-architecture=compute_{cc[0]}{cc[1]}".encode(), b"-rdc=true", b"-std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, n = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed on the mma micro-kernels: {log.decode(errors='replace')}")
        _, n = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * n
        nvrtc.nvrtcGetPTX(prog, buf)
        return buf.rstrip(b"\0 ").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_LINKED: dict = {}


def linked_functions(cc: tuple[int, int] = (9, 0)) -> frozenset:
    """The function names :func:`nvrtc_ptx` defines for ``cc`` (the ``.extern .func`` a kernel
    calling them may declare: linked in at load time). Cached per ``cc``."""
    import re
    if cc not in _LINKED:
        _LINKED[cc] = frozenset(re.findall(r"^\.visible\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_]\w*)",
                                           nvrtc_ptx(cc), re.M))
    return _LINKED[cc]


# -- the simulator's Python form ---------------------------------------------------------------
def round_tf32(x) -> np.ndarray:
    """float32 values rounded to TF32 as ``cvt.rna.tf32.f32`` does: 10 explicit mantissa bits,
    round to nearest with ties away from zero (PTX ISA 9.7.9.21), kept as float32 (low 13 bits
    zero). NaN and infinities pass unchanged."""
    a = np.asarray(x, dtype=np.float32)
    bits = a.view(np.uint32)
    r = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(a), r, a).astype(np.float32)


_SIM_LOCK = threading.Lock()


def _sim_tile(mf: int, nf: int, *args):
    """The simulator's :class:`MmaTile` call: the calling lane's fragments go into a per-block
    table, a barrier, each lane rebuilds its warp's A (16 mf x 8) and B (8 x 8 nf) from the
    table and computes its own outputs, a barrier (so no lane overwrites its fragments before
    all have read them)."""
    th = threading.current_thread()
    mgr = th._manager                       # numba's simulated block (numba_cuda simulator.kernel)
    with _SIM_LOCK:
        table = mgr.__dict__.setdefault("_tf_mma", {})
    table[th.thread_id] = args
    th.syncthreads()
    lane, w0 = th.thread_id % 32, th.thread_id - th.thread_id % 32
    A = np.zeros((16 * mf, 8), np.float32)
    B = np.zeros((8, 8 * nf), np.float32)
    for L in range(32):
        f = table[w0 + L]
        g, q = L // 4, L % 4
        for mi in range(mf):
            a = f[4 * mi: 4 * mi + 4]
            r = 16 * mi + g
            A[r, q], A[r + 8, q], A[r, q + 4], A[r + 8, q + 4] = a
        for ni in range(nf):
            b = f[4 * mf + 2 * ni: 4 * mf + 2 * ni + 2]
            B[q, 8 * ni + g], B[q + 4, 8 * ni + g] = b
    th.syncthreads()
    A, B = round_tf32(A), round_tf32(B)
    g, q = lane // 4, lane % 4
    c = args[4 * mf + 2 * nf:]
    out = []
    for mi in range(mf):
        for ni in range(nf):
            o = 4 * (mi * nf + ni)
            for h in range(2):
                for j in range(2):
                    row, col = 16 * mi + g + 8 * h, 8 * ni + 2 * q + j
                    s = np.float32(c[o + 2 * h + j])
                    s = np.float32(s + np.dot(A[row], B[:, col]))   # float32 products and sums
                    out.append(s)
    return tuple(out)


def _make(name: str):
    """``tile_<mf>x<nf>``: the linked C++ device function on a GPU (and for PTX), the Python
    form :func:`_sim_tile` under the simulator."""
    from numba.core import config
    for mf, nf in set(TILE_SHAPES.values()):
        if func_name(mf, nf) == name:
            break
    else:
        raise AttributeError(name)
    if config.ENABLE_CUDASIM:
        return lambda *a: _sim_tile(mf, nf, *a)
    from numba import cuda, types
    n = 4 * mf * nf
    sig = types.UniTuple(types.float32, n)(*([types.float32] * (4 * mf + 2 * nf + n)))
    return cuda.declare_device(name, sig, link=[source_path()], abi="c")


def __getattr__(name: str):
    """The ``tile_*`` functions, made on first use (so importing this module for
    :class:`MmaTile` needs neither numba nor a writable cache folder)."""
    if not name.startswith("tile_"):
        raise AttributeError(name)
    fn = _make(name)
    globals()[name] = fn
    return fn
