"""Saved modules: one file with the code, memory plan, constants and metadata.

The file is a zip archive (stored, not compressed: weights do not compress), with no pickled
code anywhere:

- ``tensorfuse.json``: metadata. Format name and version, tensorfuse version, the ``backend``
  that made the module (``codegen.base.get_backend``; "llvm" for files that do not say) and the
  member holding its code (``code``), the target string, input and output info, the slot table,
  the kernel call table (for the profiler), the memory plan, the layout of the constants blob,
  the SHA-256 of the code and the CRC-32 of the constants, and what the backend adds: for llvm,
  what the code was generated for (``host``: target string, triple, CPU name, LLVM feature
  string, and ``needs``, the CPU features the code may use) and the entry symbol; for cuda, the
  device key (``cuda``: simulator or compute capability, numba-cuda version).
- the code: ``code.o`` (llvm: the relocatable object code llvmlite's
  ``TargetMachine.emit_object`` produced) or ``library.cuda`` (cuda: ``CudaLibrary.to_blob()``).
- ``consts.bin``: every constant's bytes, each at a 64-byte aligned offset, so loading is one
  read into one aligned buffer and the constants are views into it (held once, never copied).

``load(path)`` checks, in this order, that the file is a complete zip holding those members,
the format, the tensorfuse version, then what the backend checks (llvm: the target triple and
that this CPU has every feature the code needs, compared with llvmlite's host features; cuda:
a GPU or the simulator is there), then each member's checksum (SHA-256 for the code; CRC-32,
as zip itself uses, for the constants, which are read straight from the file into place), and
only then hands the code to the backend (llvm links the object code into the process: no LLVM
code generation). Every failure raises :class:`ArtifactError` saying which check failed.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import struct
import sys
import zipfile
import zlib

import numpy as np

from .memory_plan import MemoryPlan
from .module import CallInfo, Program, SlotInfo, aligned_empty

FORMAT = "tensorfuse-module"
FORMAT_VERSION = 1
META, CODE, CONSTS = "tensorfuse.json", "code.o", "consts.bin"
_ALIGN = 64


class ArtifactError(Exception):
    """A saved module cannot be written or loaded: the message names the file and the reason
    (not a tensorfuse file, truncated or corrupt, another tensorfuse version, another CPU)."""


class CPUFeaturesArtifactError(ArtifactError):
    """A saved module's code needs CPU features this CPU lacks (the message names them).
    ``cannot_run``: what running such a module, once loaded, says (see ``load(...,
    other_cpu=True)``)."""

    def __init__(self, message: str, cannot_run: str | None = None):
        super().__init__(message)
        self.cannot_run = cannot_run or message


def tensorfuse_version() -> str:
    """``tensorfuse.__version__`` (the package's root module defines it and imports nothing of the
    compiler, so a process that only loads saved modules never imports the compiler)."""
    from tensorfuse import __version__
    return __version__


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _dtype_str(dt: np.dtype) -> str:
    """How the file names a numpy dtype: ``dtype.str`` ("<f4"), or for an ``ml_dtypes`` type
    (float8, int4 ...; its ``str`` is "|V1" for every one of them) its name."""
    return dt.name if dt.num >= _FIRST_USER_DTYPE_NUM else dt.str


def _dtype_of(text: str) -> np.dtype:
    """The numpy dtype :func:`_dtype_str` wrote as ``text``."""
    import ml_dtypes
    t = getattr(ml_dtypes, text, None) if text.isidentifier() else None
    return np.dtype(t) if t is not None else np.dtype(text)


#: numpy's type numbers from here on are dtypes registered at run time (``ml_dtypes``')
_FIRST_USER_DTYPE_NUM = 256


def _pack_consts(consts: dict[int, np.ndarray]) -> tuple[np.ndarray, list[dict]]:
    layout, off = [], 0
    for s in sorted(consts):
        a = consts[s]
        layout.append({"slot": s, "offset": off, "nbytes": int(a.nbytes), "dtype": _dtype_str(a.dtype),
                       "shape": list(a.shape)})
        off += -(-a.nbytes // _ALIGN) * _ALIGN
    blob = np.zeros(off, np.uint8)
    for e in layout:
        blob[e["offset"]:e["offset"] + e["nbytes"]] = np.ascontiguousarray(consts[e["slot"]]).reshape(-1).view(np.uint8)
    return blob, layout


def _backend(name: str, path: str):
    """The backend a saved module names (``codegen.base.get_backend``); ArtifactError for one
    this tensorfuse does not know or cannot import."""
    from tensorfuse.codegen.base import get_backend
    try:
        return get_backend(name)
    except ValueError:
        raise ArtifactError(f"{path} was made by backend {name!r}, which this tensorfuse does not have") from None
    except ImportError as e:
        raise ArtifactError(f"{path} needs the {name} backend, which cannot be imported here ({e})") from None


def save_module(mod, path) -> None:
    """Write ``mod`` (a ``runtime.module.ModuleBase``) to ``path`` by ``runtime.outfile``'s rules:
    a regular file or a new path atomically (a temporary file in the same folder, then
    ``os.replace``), a symbolic link through to the file it names, a device or FIFO as a
    stream written into it (nothing there is replaced or removed); the folder of a new file
    must exist. The module's backend (``mod.backend``) gives the code blob and its own
    metadata. Raises ArtifactError when the module has no code to save or the file cannot be
    written (``cannot write PATH: REASON``, e.g. "No space left on device")."""
    path = os.fspath(path)
    backend = _backend(mod.backend, path)
    try:
        code, extra = backend.artifact_code(mod)
    except ArtifactError as e:
        raise ArtifactError(f"cannot save to {path}: {e}") from None
    prog = mod._program
    blob, layout = _pack_consts(mod._consts)
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "tensorfuse_version": tensorfuse_version(),
        "backend": backend.name, "code": backend.code_member,
        "target": mod.target,
        **extra,
        "inputs": [{"name": i.name, "dtype": _dtype_str(i.dtype), "shape": list(i.shape)} for i in mod.input_info],
        "outputs": [{"name": o.name, "dtype": _dtype_str(o.dtype), "shape": list(o.shape)} for o in mod.output_info],
        "slots": [{"index": s.index, "name": s.name, "kind": s.kind, "dtype": _dtype_str(s.dtype), "shape": list(s.shape)}
                  for s in prog.slots],
        "input_slots": prog.inputs, "output_slots": prog.outputs,
        "status_slot": prog.status_slot, "messages": prog.messages,
        "calls": [{"kernel": c.kernel, "slots": c.slots, "nodes": c.nodes, "ops": c.ops, "flops": c.flops,
                   "inplace_ok": [list(p) for p in c.inplace_ok], "sources": mod.source_nodes(c),
                   "writes": c.writes}
                  for c in prog.calls],
        "plan": mod.memory_plan.to_dict(),
        "consts": layout,
        "sha256": {backend.code_member: _sha(code)},
        "crc32": {CONSTS: zlib.crc32(blob)},
    }
    from .outfile import OutputError, open_output
    try:
        with open_output(path) as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                z.writestr(META, json.dumps(meta, indent=1))
                z.writestr(backend.code_member, bytes(code))
                z.writestr(CONSTS, memoryview(blob))
    except OutputError as e:
        err = ArtifactError(str(e))
        err.errno = e.errno         # the reason, for the command line's hint
        raise err from None


def _code_member(meta: dict) -> str:
    """The zip member holding the code blob (``code.o`` for files written before it was recorded)."""
    m = meta.get("code", CODE)
    return m if isinstance(m, str) and m not in (META, CONSTS) else CODE


def _read_meta(z: zipfile.ZipFile, path: str) -> dict:
    names = set(z.namelist())
    missing = [n for n in (META, CONSTS) if n not in names]
    if missing:
        raise ArtifactError(f"{path} is not a tensorfuse module file: it lacks {', '.join(missing)}")
    try:
        meta = json.loads(z.read(META))
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise ArtifactError(f"{path} is corrupt: its metadata cannot be read ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a tensorfuse module file (format {meta.get('format')!r})")
    if _code_member(meta) not in names:
        raise ArtifactError(f"{path} is not a tensorfuse module file: it lacks {_code_member(meta)}")
    return meta


def check_compatible(meta: dict, path: str = "the file") -> None:
    """Raise ArtifactError unless this tensorfuse and this machine can run the saved module: the
    format and tensorfuse version match, then the backend that made it (``meta["backend"]``,
    "llvm" for files that do not say) checks its own part (for llvm: the triple is this
    machine's and this CPU has every feature the code needs; for cuda: a GPU or the simulator
    is there)."""
    if meta.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path} has module format version {meta.get('format_version')}; this tensorfuse "
                            f"reads version {FORMAT_VERSION}")
    ours = tensorfuse_version()
    if meta.get("tensorfuse_version") != ours:
        raise ArtifactError(f"{path} was written by tensorfuse {meta.get('tensorfuse_version')}, this is tensorfuse "
                            f"{ours}: recompile the model with this version")
    _backend(str(meta.get("backend", "llvm")), path).check_compatible(meta, path)


def read_artifact(path, other_cpu: bool = False) -> tuple[dict, bytes, np.ndarray]:
    """(metadata, object code, constants blob) of a saved module, all checks done. With
    ``other_cpu``, code that needs CPU features this CPU lacks passes the check, and
    ``meta["_cannot_run"]`` says why it cannot run here."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ArtifactError(f"no such tensorfuse module file: {path}")
    try:
        with zipfile.ZipFile(path) as z:
            meta = _read_meta(z, path)
            try:
                check_compatible(meta, path)
            except CPUFeaturesArtifactError as e:
                if not other_cpu:
                    raise
                meta["_cannot_run"] = e.cannot_run
            member = _code_member(meta)
            code = z.read(member)
            info = z.getinfo(CONSTS)
            if info.compress_type != zipfile.ZIP_STORED:
                raise ArtifactError(f"{path} is not a tensorfuse module file: {CONSTS} is compressed")
            blob = _read_stored(path, info)
    except zipfile.BadZipFile as e:
        if _is_onnx_model(path):
            raise ArtifactError(f"{path} is an ONNX model, not a saved tensorfuse module: compile it with "
                                f"tensorfuse.compile({os.path.basename(path)!r}) (Module.save writes a module "
                                f"file that tensorfuse.load reads)") from None
        raise ArtifactError(f"{path} is truncated or corrupt (not a complete zip archive: {e})") from None
    except (EOFError, zipfile.LargeZipFile, OSError) as e:
        raise ArtifactError(f"{path} is truncated or corrupt ({type(e).__name__}: {e})") from None
    if (meta.get("sha256") or {}).get(member) != _sha(code):
        raise ArtifactError(f"{path} is corrupt: the checksum of {member} does not match")
    crc = zlib.crc32(blob)
    if crc != info.CRC or (meta.get("crc32") or {}).get(CONSTS) != crc:
        raise ArtifactError(f"{path} is corrupt: the checksum of {CONSTS} does not match")
    return meta, code, blob


def _is_onnx_model(path: str) -> bool:
    """Does the file (not a zip) parse as an ONNX ModelProto with a graph? Only asked when
    loading failed, to say what the file is."""
    try:
        import onnx
        with open(path, "rb") as f:
            m = onnx.ModelProto.FromString(f.read())
        return m.HasField("graph") and (len(m.graph.node) > 0 or len(m.graph.output) > 0)
    except Exception:
        return False


def _read_stored(path: str, info: zipfile.ZipInfo) -> np.ndarray:
    """A stored member's bytes read straight from the file into a 64-byte aligned buffer (one
    copy, no decompression layer; the caller checks the CRC)."""
    blob = aligned_empty(info.file_size, _ALIGN)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(30)
        if len(head) != 30 or head[:4] != b"PK\x03\x04":
            raise ArtifactError(f"{path} is truncated or corrupt: bad local header of {info.filename}")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        view, got = memoryview(blob), 0
        while got < info.file_size:
            n = f.readinto(view[got:])
            if not n:
                raise ArtifactError(f"{path} is truncated: {info.filename} has {got} of {info.file_size} bytes")
            got += n
    return blob


def load(path, other_cpu: bool = False):
    """Load a module written by ``Module.save``: the backend that made it (recorded in the file)
    turns its code back into a runnable module (``runtime.module.Module`` for llvm: the object
    code is linked into this process, no LLVM code generation; ``runtime.cuda_module.CudaModule``
    for cuda). Raises ArtifactError (missing, truncated or corrupt file; another tensorfuse
    version; an incompatible CPU (CPUFeaturesArtifactError); no GPU or simulator for a cuda
    module). ``other_cpu``: load code that needs CPU features this CPU lacks anyway (the
    compile cache serves such modules to be saved); running it raises
    ``runtime.module.CPUFeaturesError``."""
    path = os.fspath(path)
    meta, code, blob = read_artifact(path, other_cpu=other_cpu)
    try:
        slots = [SlotInfo(s["index"], s["name"], s["kind"], _dtype_of(s["dtype"]), tuple(s["shape"]))
                 for s in meta["slots"]]
        consts = {}
        for e in meta["consts"]:
            a = blob[e["offset"]:e["offset"] + e["nbytes"]].view(_dtype_of(e["dtype"]))
            consts[e["slot"]] = a.reshape(e["shape"])
        calls = [CallInfo(c["kernel"], c["slots"], c["nodes"], c["ops"], c["flops"],
                          [tuple(p) for p in c.get("inplace_ok", [])], c.get("sources"), c.get("writes"))
                 for c in meta["calls"]]
        prog = Program(slots, meta["input_slots"], meta["output_slots"], calls, consts,
                       meta.get("status_slot"), list(meta.get("messages", [])))
        plan = MemoryPlan.from_dict(meta["plan"])
        in_names = [i["name"] for i in meta["inputs"]]
        out_names = [o["name"] for o in meta["outputs"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path} is corrupt: its metadata is incomplete ({type(e).__name__}: {e})") from None
    backend = _backend(str(meta.get("backend", "llvm")), path)
    module = backend.load(meta, code, prog, plan, in_names, out_names, path)
    if meta.get("_cannot_run"):
        module._cannot_run = meta["_cannot_run"]
    return module
