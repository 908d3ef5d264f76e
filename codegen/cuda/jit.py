"""Building and launching cuda kernels: kernel IR -> source files -> ``cuda.jit``.

:func:`build_library` schedules each kernel for the GPU (:func:`tensorfuse.codegen.cuda.launches.cuda_launches`),
emits its Python source (:mod:`tensorfuse.codegen.cuda.emit`), writes it to a content-addressed
file (``<sha256 of the text>.py`` under the cache directory: files rather than ``exec``, so that
``cuda.jit(cache=True)`` can cache the compiled code beside them) and imports it. Each launch
function is wrapped with ``cuda.jit`` (``cache=True`` on a GPU; under the simulator caching
does not apply); :meth:`CudaLibrary.compile_all` compiles them all when the backend builds or
loads a module (else numba would at each kernel's first launch).

The runtime calls :meth:`CudaLibrary.launch` with one 1-D C-contiguous device array per kernel
parameter (flat views of its arena); launches are asynchronous on the default stream.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import zlib

from tensorfuse.ir.errors import CompileError
from tensorfuse.ir.kernel import Kernel
from tensorfuse.ir.types import DType

from .emit import ctor, emit_source

#: the blob format's version (:meth:`CudaLibrary.to_blob`)
BLOB_VERSION = 1
#: the generic schedule's block size and grid cap under the simulator, where each simulated
#: thread costs about half a millisecond: grid-stride loops cover the rest with few threads
SIM_BLOCK_THREADS = 32
SIM_MAX_BLOCKS = 4
#: environment variable naming a folder where every :class:`CudaLibrary` made in this process
#: also writes its kernels' sources with their parameter dtypes (:func:`export_sources`), for
#: the PTX gate (``python -m tensorfuse.compiler.ptx_gate --sources DIR``); ``make test-cuda``
#: sets it for the simulator tests
SOURCES_DIR_ENV = "TENSORFUSE_CUDA_SOURCES_DIR"


def simulator_enabled() -> bool:
    """Whether numba runs cuda kernels in its simulator (NUMBA_ENABLE_CUDASIM=1 when numba
    was imported)."""
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def default_cache_dir() -> str:
    """``cuda/`` under :func:`tensorfuse.runtime.cache.cache_dir`."""
    from tensorfuse.runtime.cache import cache_dir
    return os.path.join(str(cache_dir()), "cuda")


def _write_source(cache_dir: str, text: str, prefix: str = "tf_", suffix: str = ".py", digits: int = 32) -> str:
    """``text`` written once into ``cache_dir`` under a name made of its SHA-256 (``prefix``, the
    first ``digits`` hex digits, ``suffix``); the path. OSError when it cannot be written."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{prefix}{digest[:digits]}{suffix}")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)        # atomic: a concurrent writer writes the same text
    return path


def _import(path: str):
    name = "tensorfuse_cuda_" + os.path.basename(path)[3:-3]
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == path:
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # numba's cache locator looks the module up by name
    spec.loader.exec_module(mod)
    return mod


def export_sources(library: "CudaLibrary", folder: str) -> list[str]:
    """Write each kernel of ``library`` into ``folder`` as ``tf_<digest>.py`` (its source) and
    ``tf_<digest>.json`` (``{"kernel", "dtypes", "launches"}``: the kernel's name, its
    parameters' dtypes in order, its (grid, block) shapes), ``digest`` the sha256 of the source
    and dtypes, so a kernel exported twice is one pair of files. Returns the ``.py`` paths in
    ``library.kernel_names`` order. OSError when the folder cannot be written."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name in library.kernel_names:
        e = library._entries[name]
        text = e["source"]
        meta = {"kernel": name, "dtypes": list(e["dtypes"]), "launches": [[list(g), list(b)] for g, b in e["launches"]]}
        digest = hashlib.sha256((text + "\0" + json.dumps(meta["dtypes"])).encode("utf-8")).hexdigest()[:32]
        path = os.path.join(folder, f"tf_{digest}.py")
        if not os.path.exists(path):
            for ext, data in ((".json", json.dumps(meta)), (".py", text)):     # the .py last: a complete pair
                tmp = f"{path[:-3]}{ext}.{os.getpid()}.tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(data)
                os.replace(tmp, path[:-3] + ext)
        paths.append(path)
    return paths


def param_type(dt: DType):
    """The numba type of a kernel parameter of dtype ``dt``: a 1-D C-contiguous array."""
    from numba import types
    return types.Array(getattr(types, ctor(dt)), 1, "C")


class CudaLibrary:
    """The cuda kernels of a module, built by :func:`build_library`.

    ``kernel_names``: the kernels in build order; ``sources``: kernel name -> its Python
    source text. See :meth:`launch`, :meth:`launch_config`, :meth:`to_blob`, :meth:`ptx`."""

    def __init__(self, entries: list[dict], cache_dir: str | None = None, ptx: dict | None = None):
        self._cache_dir = cache_dir or default_cache_dir()
        self._entries = {e["name"]: e for e in entries}
        self.kernel_names: list[str] = [e["name"] for e in entries]
        self.sources: dict[str, str] = {e["name"]: e["source"] for e in entries}
        self._ptx = dict(ptx or {})
        self._modules: dict[str, object] = {}
        self._jitted: dict[str, list] = {}
        for e in entries:
            try:
                self._module(e["name"])
            except Exception as ex:     # a syntax or import error in generated code is ours
                raise CompileError(f"cuda kernel {e['name']}: its generated source does not import: "
                                   f"{type(ex).__name__}: {ex}") from ex
        folder = os.environ.get(SOURCES_DIR_ENV)
        if folder:
            export_sources(self, folder)

    def _module(self, name: str):
        mod = self._modules.get(name)
        if mod is None:
            mod = _import(_write_source(self._cache_dir, self.sources[name]))
            self._modules[name] = mod
        return mod

    def _launches(self, name: str) -> list:
        j = self._jitted.get(name)
        if j is None:
            from numba import cuda
            mod = self._module(name)
            # one dispatcher per function, shared by every library that loads this source
            jitted = mod.__dict__.setdefault("_tf_jitted", {})
            sim = simulator_enabled()
            # numba cannot pickle a kernel that links foreign code (the TF32 micro-kernel's CUDA
            # C++, codegen/cuda/mma.py) into its disk cache: such kernels compile without it
            cache = not sim and "_tfmma." not in self.sources[name]
            j = []
            for fname, (grid, block) in zip([f for f, _, _ in mod.LAUNCHES], self._entries[name]["launches"]):
                if fname not in jitted:
                    fn = getattr(mod, fname)
                    jitted[fname] = cuda.jit(fn, cache=True) if cache else cuda.jit(fn)
                j.append((jitted[fname], tuple(grid), tuple(block)))
            self._jitted[name] = j
        return j

    def compile_all(self) -> int:
        """Compile every launch function of every kernel now, at ``compile()`` (or load) time,
        instead of at its first launch: on a GPU each is compiled for the argument types the
        runtime passes (one 1-D C-contiguous array per parameter, :func:`param_type`) and kept
        in numba's disk cache beside its content-addressed source (``cache=True``), so a later
        compile or load of the same kernel reads it back (not the kernels that call the linked
        TF32 micro-kernel: numba cannot cache linked code, they compile each time); under the simulator this makes the
        simulated kernels (nothing to compile). Returns the number of launch functions.
        CompileError naming the kernel when numba or NVVM rejects one."""
        sim = simulator_enabled()
        n = 0
        for name in self.kernel_names:
            sig = tuple(param_type(DType(d)) for d in self._entries[name]["dtypes"])
            for fn, _, _ in self._launches(name):
                if not sim:
                    try:
                        fn.compile(sig)
                    except Exception as ex:
                        raise CompileError(f"cuda kernel {name}: compiling it failed: {type(ex).__name__}: {ex}") from ex
                n += 1
        return n

    def launch(self, name: str, args: list) -> None:
        """Run kernel ``name`` on the default stream (asynchronously). ``args``: one 1-D
        C-contiguous device array (or object with ``__cuda_array_interface__``) per kernel
        parameter, in ``kernel.params`` order, of the parameter's numpy dtype and length.
        KeyError for an unknown kernel, ValueError for a wrong number of arguments."""
        if name not in self._entries:
            raise KeyError(f"no cuda kernel {name!r} in this library")
        nparams = self._entries[name]["nparams"]
        if len(args) != nparams:
            raise ValueError(f"cuda kernel {name} takes {nparams} buffers, got {len(args)}")
        for fn, grid, block in self._launches(name):
            fn[grid, block](*args)

    def launch_config(self, name: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The (grid, block) of each launch kernel ``name`` makes, in order."""
        return [(tuple(g), tuple(b)) for g, b in self._entries[name]["launches"]]

    def to_blob(self) -> bytes:
        """Everything :meth:`from_blob` needs to rebuild this library in another process: the
        sources, launch shapes and parameter dtypes, and PTX made so far (:meth:`ptx`)."""
        doc = {"version": BLOB_VERSION, "kernels": list(self._entries.values()), "ptx": self._ptx}
        return zlib.compress(json.dumps(doc).encode("utf-8"))

    @staticmethod
    def from_blob(blob: bytes, cache_dir: str | None = None) -> "CudaLibrary":
        """The library :meth:`to_blob` saved. ValueError for a blob that is not one, or of
        another format version."""
        try:
            doc = json.loads(zlib.decompress(blob).decode("utf-8"))
        except (zlib.error, UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"not a cuda library blob: {e}") from None
        if not isinstance(doc, dict) or doc.get("version") != BLOB_VERSION:
            raise ValueError(f"cuda library blob of format version {doc.get('version') if isinstance(doc, dict) else '?'}; "
                             f"this tensorfuse reads version {BLOB_VERSION}")
        for e in doc["kernels"]:
            e["launches"] = [(tuple(g), tuple(b)) for g, b in e["launches"]]
        return CudaLibrary(doc["kernels"], cache_dir, doc.get("ptx"))

    def ptx(self, cc: tuple[int, int] = (9, 0)) -> dict[str, str]:
        """Kernel name -> PTX for compute capability ``cc``, compiled with
        ``numba.cuda.compile_ptx`` (no GPU needed); a kernel of several launches gives their
        PTX texts joined. RuntimeError under the simulator (it has no compiler); CompileError
        naming the kernel when NVVM rejects one."""
        if simulator_enabled():
            raise RuntimeError("PTX cannot be made under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
        from numba import cuda, types
        out = {}
        for name in self.kernel_names:
            key = f"{name}@sm_{cc[0]}{cc[1]}"
            if key in self._ptx:
                out[name] = self._ptx[key]
                continue
            mod = self._module(name)
            sig = types.void(*[param_type(DType(d)) for d in self._entries[name]["dtypes"]])
            texts = []
            for fname, _, _ in mod.LAUNCHES:
                try:
                    ptx, _ = cuda.compile_ptx(getattr(mod, fname), sig, cc=cc)
                except Exception as ex:
                    raise CompileError(f"cuda kernel {name}: compiling {fname} to PTX for sm_{cc[0]}{cc[1]} "
                                       f"failed: {type(ex).__name__}: {ex}") from ex
                texts.append(ptx)
            out[name] = self._ptx[key] = "\n".join(texts)
        return out


def build_library(kernels: list[Kernel], *, cache_dir: str | None = None, block: int | None = None,
                  max_blocks: int | None = None) -> CudaLibrary:
    """Schedule, emit and import ``kernels`` (kernel IR) for the GPU. ``block`` and
    ``max_blocks``: the generic schedule's threads per block and grid cap (defaults: the cuda
    target's, 256 and 65535; under the simulator :data:`SIM_BLOCK_THREADS` and
    :data:`SIM_MAX_BLOCKS`, so the launch shapes differ there; the grid of a hand-scheduled
    kernel is capped at ``max_blocks`` too, which its block-stride loops allow); a kernel whose
    node set the knob ``launch_threads`` to another value than its default takes that block
    size instead (``launches.launch_block``). ``cache_dir``:
    where the source files go (default :func:`default_cache_dir`). Raises CompileError naming
    the kernel when one cannot be emitted or its source does not import."""
    from tensorfuse.codegen.cuda.launches import BLOCK_THREADS, MAX_BLOCKS, cuda_launches, launch_block
    sim = simulator_enabled()
    block = block or (SIM_BLOCK_THREADS if sim else BLOCK_THREADS)
    max_blocks = max_blocks or (SIM_MAX_BLOCKS if sim else MAX_BLOCKS)
    entries, seen = [], set()
    for k in kernels:
        if k.name in seen:
            raise CompileError(f"cuda kernel name {k.name} given twice")
        seen.add(k.name)
        try:
            launches = cuda_launches(k, launch_block(k, block), max_blocks)
            src = emit_source(k.name, launches)
            # GPU loops are block- and grid-stride loops, so a smaller grid gives the same
            # results: hand schedules' grids are capped like the generic ones
            shapes = [((min(lk.launch.grid[0], max_blocks),) + tuple(lk.launch.grid[1:]), tuple(lk.launch.block))
                      for lk in launches]
        except CompileError:
            raise
        except Exception as ex:
            raise CompileError(f"cuda kernel {k.name}: code generation failed: {type(ex).__name__}: {ex}") from ex
        entries.append({"name": k.name, "source": src, "nparams": len(k.params),
                        "dtypes": [b.dtype.value for b in k.params],
                        "launches": shapes})
    return CudaLibrary(entries, cache_dir)
