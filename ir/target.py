"""Targets: what code is generated for.

``Target.parse("llvm")`` is this machine's CPU (its name and features as llvmlite detects them);
options pick another CPU or change features, with LLVM's names::

    Target.parse("llvm -mcpu=znver3")                       # AMD Zen 3: AVX2 and FMA, no AVX-512
    Target.parse("llvm -mcpu=skylake-avx512 -mattr=-avx512f,+fma")
    Target.parse("llvm -mattr=-avx512f")                    # this CPU without AVX-512
    Target.parse("cuda")                                    # NVIDIA GPU (numba.cuda; NHWC)

Code generation (vector width, FMA and AVX-512 use, cache blocking) reads :attr:`Target.vector_bits`,
:meth:`Target.lanes`, :attr:`Target.has_fma`, :attr:`Target.has_avx512`, :attr:`Target.l1d_bytes`
and :attr:`Target.l2_bytes`, never constants, so one build serves AVX2 and AVX-512 machines.

The cuda target answers the same questions for a GPU thread (no SIMD vectors: ``lanes()`` is
1, so lowerings pick their scalar schedules; FMA; the shared memory of a block as "L1") and adds
the launch limits the cuda schedule reads: :attr:`Target.max_threads_per_block`,
:attr:`Target.max_shared_bytes`, :attr:`Target.warp_size`, :attr:`Target.block_threads` (the
generic schedule's block size) and :attr:`Target.max_blocks`.

Each kind answers through its :class:`TargetKind` (:data:`TARGET_KINDS`: :class:`LLVMKind`,
:class:`CUDAKind`, the GPU's limits as data in :class:`GPULimits`), and its :class:`KindTraits`
(:data:`KIND_TRAITS`) say what passes need to know of its backend: no code tests a kind's name.
What LLVM knows about CPUs comes from ``ir.cpu``. ``compiler.target`` re-exports this module.
"""
from __future__ import annotations

import difflib
import functools
import os
import re
from dataclasses import dataclass, field

_LLVM_OPTIONS = ("-mcpu=<cpu>", "-mattr=<+feature,-feature,...>", "-mtriple=<this machine's triple>")
_DEFAULT_L1D = 32 * 1024
_DEFAULT_L2 = 512 * 1024
_DEFAULT_LLC = 32 * 1024 * 1024
_GPU_L2 = 50 * 1024 * 1024
_SUGGESTED_CPUS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "znver3", "znver4", "skylake-avx512",
                   "icelake-server", "sapphirerapids", "generic", "neoverse-v1", "apple-m1")


def _cpu():
    """``ir.cpu`` (what LLVM knows about CPUs), imported on first use: a cuda target needs no
    LLVM, and tests that pretend to be another CPU replace ``ir.cpu.host_info``."""
    from tensorfuse.ir import cpu
    return cpu


@dataclass(frozen=True)
class KindTraits:
    """What passes and lowerings need to know about a target kind's backend, as data (so no
    code tests the kind's name): ``layout``, the graph layout its convolutions prefer ("NCHW"
    or "NHWC"; the layout pass converts to it); ``simt``, whether code runs one thread per output
    element (a GPU: scalar per-thread code, no SIMD vectors, no CPU register tiles);
    ``thread_team``, whether parallel loops run on tensorfuse's CPU thread team
    (``runtime.threads``); ``gpu``, whether tensors live in device memory; ``lowbit``,
    whether its modules take and return the low-bit storage types (float8, float4, int4, int2:
    ``ir/lowbit.py``) as ``ml_dtypes`` arrays (a kind without it refuses such a model)."""

    layout: str
    simt: bool
    thread_team: bool
    gpu: bool
    lowbit: bool = False


#: the traits of each target kind (a new backend adds its row)
KIND_TRAITS = {"llvm": KindTraits(layout="NCHW", simt=False, thread_team=True, gpu=False, lowbit=True),
               "cuda": KindTraits(layout="NHWC", simt=True, thread_team=False, gpu=True)}


@dataclass(frozen=True)
class GPULimits:
    """The launch limits of a GPU kind, which GPU schedules read through :class:`Target`:
    ``max_threads_per_block``, ``max_shared_bytes`` (static shared memory of one block, bytes),
    ``warp_size``, ``block_threads`` (the generic schedule's block size), ``max_blocks`` (the
    most blocks a generic launch uses; a grid-stride loop covers larger extents) and
    ``l2_bytes`` (the device's L2 cache, bytes)."""

    max_threads_per_block: int
    max_shared_bytes: int
    warp_size: int
    block_threads: int
    max_blocks: int
    l2_bytes: int


class TargetKind:
    """How one target kind answers :class:`Target`'s questions, so that no code tests a kind's
    name: :data:`TARGET_KINDS` holds one per kind (a new backend adds a subclass and its row,
    and a row in :data:`KIND_TRAITS`). The base takes no options and has no CPU; each kind
    answers the code generation questions (:meth:`vector_bits` ... :meth:`l2_bytes`)."""

    #: the GPU launch limits, or None for a kind without GPU properties
    gpu: GPULimits | None = None

    def __init__(self, name: str):
        self.name = name

    @property
    def traits(self) -> KindTraits:
        return KIND_TRAITS[self.name]

    def canonical_options(self, opts: tuple) -> tuple:
        """The canonical option tuple of ``opts``; ValueError for an option the kind does not take."""
        if opts:
            raise ValueError(f"unknown option {opts[0]!r} for the {self.name} target: it takes no options")
        return ()

    def validate(self, options: tuple) -> None:
        """Check the canonical ``options`` beyond their syntax (ValueError); nothing to check here."""

    def resolve(self, target: "Target") -> "_Resolved | None":
        """The CPU the code is generated for (triple, CPU name, features), None without a CPU."""
        return None

    def vector_bits(self, target: "Target") -> int:
        """:attr:`Target.vector_bits`."""
        raise NotImplementedError

    def has_fma(self, target: "Target") -> bool:
        """:attr:`Target.has_fma`."""
        raise NotImplementedError

    def datapath_bits(self, target: "Target") -> int:
        """:attr:`Target.datapath_bits`: by default the register width."""
        return self.vector_bits(target)

    def has_avx512(self, target: "Target") -> bool:
        """:attr:`Target.has_avx512`."""
        raise NotImplementedError

    def l1d_bytes(self, target: "Target") -> int:
        """:attr:`Target.l1d_bytes`."""
        raise NotImplementedError

    def l2_bytes(self, target: "Target") -> int:
        """:attr:`Target.l2_bytes`."""
        raise NotImplementedError


#: CPUs whose vector units are narrower than their widest registers, so that each wider
#: operation issues as halves. AMD Zen 4 runs AVX-512 on its 256-bit units, a 512-bit
#: operation taking both halves of a pair (A. J. Yee, "Zen4's AVX512 teardown", numberworld.org,
#: 2022; his Zen 5 teardown, 2024, for the full 512-bit units that followed): a ``ymm``
#: VPDPBUSD does as much work per lane and cycle as a ``zmm`` one there.
_SPLIT_DATAPATH = {"znver4": 256}


class LLVMKind(TargetKind):
    """A CPU through LLVM: options ``-mcpu``, ``-mattr``, ``-mtriple``; the SIMD width, FMA and
    caches come from the CPU and its features."""

    def canonical_options(self, opts: tuple) -> tuple:
        return _canonical_llvm_options(opts)

    def validate(self, options: tuple) -> None:
        if options:
            _resolve(options)          # validates the CPU and features with LLVM (cached)

    def resolve(self, target: "Target") -> "_Resolved":
        return _host_resolved() if not target.options else _resolve(target.options)

    def vector_bits(self, target: "Target") -> int:
        on = target.feature_set
        if "avx512f" in on:
            return 512
        if "avx" in on or "avx2" in on:
            return 256
        if on & {"sse", "sse2", "neon", "altivec", "simd128"}:
            return 128
        return 0

    def has_fma(self, target: "Target") -> bool:
        on = target.feature_set
        return "fma" in on or ("neon" in on and target.triple.startswith(("aarch64", "arm64")))

    def has_avx512(self, target: "Target") -> bool:
        return "avx512f" in target.feature_set

    def datapath_bits(self, target: "Target") -> int:
        bits = self.vector_bits(target)
        return min(bits, _SPLIT_DATAPATH.get(target.cpu, bits))

    def l1d_bytes(self, target: "Target") -> int:
        return _cache_sizes()[0] if target._on_this_cpu() else _DEFAULT_L1D

    def l2_bytes(self, target: "Target") -> int:
        return _cache_sizes()[1] if target._on_this_cpu() else _DEFAULT_L2


class CUDAKind(TargetKind):
    """An NVIDIA GPU through numba.cuda: no options; one scalar thread per output element (no
    SIMD vectors), FMA, no AVX-512; a block's shared memory is its "L1"."""

    gpu = GPULimits(max_threads_per_block=1024, max_shared_bytes=48 * 1024, warp_size=32, block_threads=256,
                    max_blocks=65535, l2_bytes=_GPU_L2)

    def vector_bits(self, target: "Target") -> int:
        return 0

    def has_fma(self, target: "Target") -> bool:
        return True

    def has_avx512(self, target: "Target") -> bool:
        return False

    def l1d_bytes(self, target: "Target") -> int:
        return self.gpu.max_shared_bytes

    def l2_bytes(self, target: "Target") -> int:
        return self.gpu.l2_bytes


#: how each target kind answers Target's questions (a new backend adds its row)
TARGET_KINDS: dict[str, TargetKind] = {"llvm": LLVMKind("llvm"), "cuda": CUDAKind("cuda")}


@dataclass(frozen=True)
class Target:
    """A code generation target; make one with :meth:`parse`.

    ``kind``: "llvm" (a CPU through LLVM, NCHW) or "cuda" (NVIDIA GPU through numba.cuda, NHWC).
    ``options``: the canonical option tuple, e.g. ``("-mcpu=znver3", "-mattr=-avx512f,+fma")``
    (every ``-mattr`` merged into one, in the order given; ``-mtriple`` dropped, as it can only
    be this machine's). ``str(target)`` is the canonical string (``"llvm -mcpu=znver3"``), used
    in cache keys; targets compare and hash by it.

    Constructing a Target validates it: ValueError for an unknown kind or option, a CPU or
    feature name LLVM does not know, another triple, or a combination LLVM cannot generate
    code for.
    """

    kind: str
    options: tuple = field(default=())

    KINDS = tuple(TARGET_KINDS)

    def __post_init__(self):
        if self.kind not in Target.KINDS:
            raise ValueError(f"unknown target {self.kind!r}; expected one of {', '.join(Target.KINDS)}")
        object.__setattr__(self, "options", self._kind.canonical_options(tuple(self.options)))
        self._kind.validate(self.options)

    @staticmethod
    def parse(target: "str | Target") -> "Target":
        """A Target from a string such as ``"llvm"``, ``"llvm -mcpu=znver3 -mattr=-avx512f"`` or
        ``"cuda"`` (a Target is returned as is). Options of the llvm kind: ``-mcpu=NAME`` (an
        LLVM CPU name; default this machine's CPU), ``-mattr=+a,-b`` (features to turn on or
        off, LLVM's names, applied in order; may be repeated), ``-mtriple=T`` (only this
        machine's triple). Raises TypeError for a non-string, ValueError for an unknown kind,
        option, CPU or feature (the message names it and lists valid ones)."""
        if isinstance(target, Target):
            return target
        if not isinstance(target, str):
            raise TypeError(f"target must be a string such as 'llvm' or 'cuda', got {type(target).__name__}")
        parts = target.split()
        kind = parts[0] if parts else ""
        if kind not in Target.KINDS:
            raise ValueError(f"unknown target {target!r}; expected one of {', '.join(Target.KINDS)}")
        return Target(kind, tuple(parts[1:]))

    def __str__(self) -> str:
        return " ".join((self.kind,) + self.options)

    @property
    def _kind(self) -> TargetKind:
        return TARGET_KINDS[self.kind]

    @property
    def traits(self) -> KindTraits:
        """The :class:`KindTraits` of this target's kind."""
        return KIND_TRAITS[self.kind]

    @property
    def layout(self) -> str:
        """The graph layout this target's convolutions prefer: "NCHW" (llvm) or "NHWC" (cuda)."""
        return self.traits.layout

    @property
    def simt(self) -> bool:
        """One thread per output element, scalar code per thread (cuda); False for CPUs."""
        return self.traits.simt

    @staticmethod
    def cpu_names() -> list[str]:
        """Every CPU name LLVM accepts for ``-mcpu`` on this machine's triple."""
        return list(_cpu().query_target(_cpu().host_info()["triple"])["cpus"])

    @staticmethod
    def feature_names() -> list[str]:
        """Every feature name ``-mattr`` accepts: this machine's feature detection's and LLVM's
        (which adds tuning flags such as ``prefer-256-bit``), sorted."""
        llvm = _cpu()
        q = llvm.query_target(llvm.host_info()["triple"])
        return sorted(set(llvm.isa_feature_names()) | set(q["llvm_features"]))

    # -- what the code is generated for (llvm kind) --------------------------------------
    def _llvm(self) -> "_Resolved":
        r = self.__dict__.get("_resolved")
        if r is None:
            r = self._kind.resolve(self)
            if r is None:
                raise ValueError(f"the {self.kind} target has no CPU properties")
            object.__setattr__(self, "_resolved", r)    # not a field: equality and hash ignore it
        return r

    @property
    def triple(self) -> str:
        """The LLVM target triple (always this machine's, e.g. ``"x86_64-unknown-linux-gnu"``)."""
        return self._llvm().triple

    @property
    def cpu(self) -> str:
        """The LLVM CPU name: the ``-mcpu`` option, else this machine's CPU (``"znver3"``)."""
        return self._llvm().cpu

    @property
    def is_host(self) -> bool:
        """True when no ``-mcpu`` is given: the code is for this machine's CPU as detected
        (``-mattr`` may still change its features)."""
        return not any(o.startswith("-mcpu=") for o in self.options)

    @property
    def features(self) -> str:
        """The LLVM feature string the code is generated with: ``"+avx2,-avx512f,..."``, every
        feature of this machine's feature detection, on or off, sorted (for this machine's CPU,
        llvmlite's host features; for another ``-mcpu``, the features LLVM gives that CPU),
        with the ``-mattr`` changes applied (and their implications: ``-avx2`` also turns off
        AVX-512); ``-mattr`` features outside that list (tuning flags) follow, as given."""
        return self._llvm().features

    @property
    def feature_set(self) -> frozenset:
        """Names of the enabled features (those with ``+`` in :attr:`features`)."""
        return self._llvm().enabled

    @property
    def vector_bits(self) -> int:
        """Width in bits of the widest SIMD registers the code may use: 512 with AVX-512F, 256
        with AVX (or AVX2), 128 with SSE or AArch64 NEON, 0 without SIMD (and for cuda: a GPU
        thread is scalar; the warp is the vector)."""
        return self._kind.vector_bits(self)

    def lanes(self, dtype) -> int:
        """Elements of ``dtype`` (an ``ir.types.DType``, numpy dtype or anything ``np.dtype``
        takes) in one vector register: ``vector_bits // (8 * itemsize)``, at least 1."""
        itemsize = getattr(dtype, "itemsize", None)
        if not isinstance(itemsize, int):
            import numpy as np
            itemsize = np.dtype(dtype).itemsize
        return max(1, self.vector_bits // (8 * itemsize))

    @property
    def datapath_bits(self) -> int:
        """Width in bits of the vector execution units: one operation on :attr:`vector_bits`
        wide registers costs ``vector_bits / datapath_bits`` issue slots of a ``datapath_bits``
        wide one. Equal to :attr:`vector_bits` except on CPUs that split wide operations (AMD
        Zen 4, ``-mcpu=znver4``: 256 with AVX-512); schedules that choose between 512- and
        256-bit vectors count cost with it (a 56-pixel row: four 16-lane vectors or seven
        8-lane ones, 4 x 2 against 7 x 1 halves on Zen 4)."""
        return self._kind.datapath_bits(self)

    @property
    def has_fma(self) -> bool:
        """Fused multiply-add instructions are available (x86 FMA3; always with AArch64 NEON and
        on GPUs)."""
        return self._kind.has_fma(self)

    @property
    def has_avx512(self) -> bool:
        """AVX-512 Foundation (512-bit vectors, ``zmm`` registers) is enabled (never for cuda)."""
        return self._kind.has_avx512(self)

    @property
    def vector_registers(self) -> int:
        """Vector registers a CPU schedule may plan its register tiles with (x86: 32 ``zmm``
        with AVX-512, else 16)."""
        return 32 if self.has_avx512 else 16

    @property
    def l1d_bytes(self) -> int:
        """Level-1 data cache size in bytes, per core: read from
        ``/sys/devices/system/cpu/cpu0/cache`` when the target CPU is this machine's CPU, else
        (or when unreadable) 32 KiB. cuda: the static shared memory of one thread block
        (:attr:`max_shared_bytes`), the fast memory a block's tile lives in."""
        return self._kind.l1d_bytes(self)

    @property
    def l2_bytes(self) -> int:
        """Level-2 cache size in bytes (as :attr:`l1d_bytes`; default 512 KiB; cuda: 50 MiB, an
        H100/H200's L2)."""
        return self._kind.l2_bytes(self)

    # -- GPU launch limits (cuda kind) ----------------------------------------------------
    def _gpu_limits(self, what: str) -> GPULimits:
        limits = self._kind.gpu
        if limits is None:
            raise ValueError(f"the {self.kind} target has no GPU property {what}")
        return limits

    @property
    def max_threads_per_block(self) -> int:
        """The most threads one CUDA thread block may have (1024). ValueError for llvm."""
        return self._gpu_limits("max_threads_per_block").max_threads_per_block

    @property
    def max_shared_bytes(self) -> int:
        """The most static shared memory one thread block may declare (48 KiB). ValueError for
        llvm."""
        return self._gpu_limits("max_shared_bytes").max_shared_bytes

    @property
    def warp_size(self) -> int:
        """Threads per warp (32). ValueError for llvm."""
        return self._gpu_limits("warp_size").warp_size

    @property
    def block_threads(self) -> int:
        """Threads per block of the generic cuda schedule (256: 8 warps). ValueError for llvm."""
        return self._gpu_limits("block_threads").block_threads

    @property
    def max_blocks(self) -> int:
        """The most blocks a generic cuda launch uses (65535); a grid-stride loop covers larger
        extents. ValueError for llvm."""
        return self._gpu_limits("max_blocks").max_blocks

    def _on_this_cpu(self) -> bool:
        return self.is_host or self.cpu == _cpu().host_info()["cpu"]


# ----------------------------------------------------------------------------- options
def _canonical_llvm_options(opts: tuple) -> tuple:
    cpu, attrs = None, []
    for o in opts:
        if not isinstance(o, str):
            raise TypeError(f"target options are strings, got {o!r}")
        name, eq, value = o.partition("=")
        if name == "-mcpu" and eq:
            if not value:
                raise ValueError("-mcpu= needs a CPU name, e.g. -mcpu=znver3")
            if cpu is not None and cpu != value:
                raise ValueError(f"-mcpu given twice ({cpu!r} and {value!r})")
            cpu = value
        elif name == "-mattr" and eq:
            for a in value.split(","):
                if not re.fullmatch(r"[+-][A-Za-z0-9_.\-]+", a):
                    raise ValueError(f"bad -mattr item {a!r}: items are +feature or -feature, e.g. "
                                     f"-mattr=-avx512f,+fma")
                attrs.append(a)
        elif name == "-mtriple" and eq:
            host = _cpu().host_info()["triple"]
            if value != host:
                raise ValueError(f"-mtriple={value} is not this machine's triple ({host}): tensorfuse "
                                 f"generates code for this machine's architecture only")
        else:
            raise ValueError(f"unknown option {o!r} for the llvm target; valid options: {', '.join(_LLVM_OPTIONS)}")
    return ((f"-mcpu={cpu}",) if cpu is not None else ()) + ((f"-mattr={','.join(attrs)}",) if attrs else ())


# ----------------------------------------------------------------------------- resolving
@dataclass(frozen=True)
class _Resolved:
    triple: str
    cpu: str
    features: str
    enabled: frozenset


def _host_resolved() -> _Resolved:
    info = _cpu().host_info()
    enabled = frozenset(f[1:] for f in info["features"].split(",") if f.startswith("+"))
    return _Resolved(info["triple"], info["cpu"], info["features"], enabled)


@functools.lru_cache(maxsize=None)
def _resolve(options: tuple) -> _Resolved:
    """CPU, features and enabled features of the llvm target with these (canonical) options,
    asked of LLVM once per option tuple; ValueError for what LLVM does not know."""
    llvm = _cpu()
    host = llvm.host_info()
    cpu = next((o.split("=", 1)[1] for o in options if o.startswith("-mcpu=")), None)
    attrs = next((o.split("=", 1)[1].split(",") for o in options if o.startswith("-mattr=")), [])
    keys = llvm.isa_feature_names()
    base = host["features"] if cpu is None else ""
    features = ",".join(([base] if base else []) + attrs)
    q = llvm.query_target(host["triple"], cpu or host["cpu"], features)
    if cpu is not None and cpu not in q["cpus"]:
        near = difflib.get_close_matches(cpu, q["cpus"], n=6, cutoff=0.6)
        some = list(dict.fromkeys(near + [c for c in (host["cpu"],) + _SUGGESTED_CPUS if c in q["cpus"]]))
        raise ValueError(f"unknown CPU {cpu!r} (-mcpu): LLVM does not know it for {host['triple']}; valid names "
                         f"include {', '.join(some[:8])} (Target.cpu_names() lists all {len(q['cpus'])})")
    known = set(keys) | set(q["llvm_features"])
    unknown = [a[1:] for a in attrs if a[1:] not in known]
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(known), n=4, cutoff=0.6)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ValueError(f"unknown CPU feature{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"(-mattr){hint}; Target.feature_names() lists the {len(known)} names LLVM knows here")
    if "error" in q:
        raise ValueError(f"LLVM cannot generate code for target 'llvm {' '.join(options)}': {q['error']}")
    enabled = frozenset(q["enabled"])
    extra = [a for a in attrs if a[1:] not in set(keys)]
    flat = ",".join([("+" if k in enabled else "-") + k for k in keys] + extra)
    return _Resolved(host["triple"], cpu or host["cpu"], flat, enabled)


@functools.lru_cache(maxsize=None)
def _data_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[tuple[int, int], ...]:
    """(level, size in bytes) of each data or unified cache of this machine's first CPU that
    ``root`` (Linux sysfs) describes readably, in index order; () when it cannot be read."""
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return ()
    out = []
    for e in entries:
        try:
            def read(name):
                with open(os.path.join(root, e, name), encoding="ascii") as f:
                    return f.read().strip()
            level, kind, size = int(read("level")), read("type"), _parse_size(read("size"))
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            out.append((level, size))
    return tuple(out)


def _cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, int]:
    """(L1 data, L2) cache sizes in bytes of this machine's first CPU, defaults where unreadable."""
    l1d, l2 = _DEFAULT_L1D, _DEFAULT_L2
    for level, size in _data_caches(root):
        if level == 1:
            l1d = size
        elif level == 2:
            l2 = size
    return l1d, l2


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size in bytes of this machine's largest data or unified CPU cache (its last level;
    sysfs as for :attr:`Target.l1d_bytes`), :data:`_DEFAULT_LLC` where unreadable."""
    return max((size for _, size in _data_caches(root)), default=_DEFAULT_LLC)


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text.strip(), re.I)
    if not m:
        raise ValueError(f"bad cache size {text!r}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
