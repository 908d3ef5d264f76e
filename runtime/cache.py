"""The compile cache: compiled modules on disk, keyed by everything that changes the code.

Place: ``$TENSORFUSE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/tensorfuse``, else
``~/.cache/tensorfuse``. An entry, named by the SHA-256 of its key, is three files: the saved
module (``.tfm``, :mod:`runtime.artifact`, written atomically), its compile report
(``.report.zip``: the optimised graph's text and the constants it needs that the module does
not hold, the rule log, the pass records, the LLVM IR and each kernel call's ONNX nodes; written
before the module, so a found entry has it), and a small JSON file holding the key's parts, so
that a miss can be explained (``tensorfuse.cache_info``). The key is built in one place,
``compiler.options.cache_key``; its parts:

- ``model``: SHA-256 of the serialized model (a path: the file's bytes; bytes as given; a
  ModelProto: its serialization). External data files of a model path are hashed when the
  entry is written and checked when it is found;
- ``target``: the canonical target string, and for "llvm" the triple, CPU name and feature
  string the code is generated for (``ir.target.Target``: this CPU's, or ``-mcpu``'s with
  the ``-mattr`` changes) and the L1d/L2 cache sizes;
- ``options``: every compile option but ``cache`` and ``num_threads`` (``opt_level``,
  ``input_shapes`` ...), canonicalised (dicts sorted, tuples as lists);
- ``pipeline``: a digest of the passes and rules the compile runs, by name and source code
  (``compiler.pipeline.pipeline_digest``), so a rule under test (``compile(..., rules=[...])``),
  a rule added to ``FUSE_RULES`` at run time, edited in a notebook, or a pass replaced, never
  gets the old pipeline's code;
- ``version``: the tensorfuse version and a digest of tensorfuse's own source files, so a changed
  compiler never serves code an older one generated.

The compiler (``compiler.driver``) looks entries up and stores them; this module only keeps
files under a key it is given and imports nothing of the compiler. An unwritable or unusable
cache place means no cache and one warning (:class:`CacheWarning`), never an error. A corrupt
entry (bad checksum, truncated, unreadable report) is detected on lookup, dropped with a
warning, and rebuilt. Compiles with ``dump_ir`` set bypass the cache (they must write the dumps).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any

ENTRY_SUFFIX = ".tfm"
KEY_SUFFIX = ".key.json"
REPORT_SUFFIX = ".report.zip"
REPORT_JSON = "report.json"
_warned: set[str] = set()


class CacheWarning(UserWarning):
    """The compile cache could not be used (unwritable place) or dropped a corrupt entry."""


def cache_dir() -> pathlib.Path:
    """Where cached modules live (see the module docstring)."""
    env = os.environ.get("TENSORFUSE_CACHE_DIR")
    if env:
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "tensorfuse"


# ----------------------------------------------------------------------------- the key
@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """SHA-256 over tensorfuse's Python sources (the package root, ir, compiler, codegen, runtime)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in ("__init__.py", "ir", "compiler", "codegen", "runtime"):
        for p in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else [root / pkg]:
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def external_files(path: str) -> list[str]:
    """The files holding a model file's external tensor data (none for most models)."""
    with open(path, "rb") as f:
        data = f.read()
    if b"location" not in data:         # the key of every external-data entry
        return []
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data
    try:
        proto = onnx.load_model_from_string(data)
    except Exception:
        return []
    folder, files = os.path.dirname(os.path.abspath(path)), []
    for t in _get_all_tensors(proto):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc and os.path.join(folder, loc) not in files:
                files.append(os.path.join(folder, loc))
    return files


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def model_digest(model: Any) -> str:
    """SHA-256 of the model's content: a path's file bytes (external data files, which few
    models have, are checked apart: see :func:`cached_compile`), bytes as given, a ModelProto's
    serialization."""
    if isinstance(model, (str, os.PathLike)):
        return file_digest(os.fspath(model))
    if isinstance(model, (bytes, bytearray, memoryview)):
        return hashlib.sha256(model).hexdigest()
    return hashlib.sha256(model.SerializeToString()).hexdigest()


def canon(v: Any) -> Any:
    """``v`` as JSON values: dicts sorted by key, tuples and sets as lists, arrays as lists."""
    if isinstance(v, dict):
        return {str(k): canon(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [canon(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((canon(x) for x in v), key=repr)
    if hasattr(v, "tolist"):                       # numpy arrays and scalars
        return canon(v.tolist())
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def version_part() -> dict:
    """The key's version part: the tensorfuse version and :func:`source_digest`."""
    from tensorfuse import __version__
    return {"tensorfuse": __version__, "source": source_digest()}


def key_digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- entries
def _warn_once(tag: str, message: str) -> None:
    if tag not in _warned:
        _warned.add(tag)
        warnings.warn(message, CacheWarning, stacklevel=4)


def _atomic_write(path: pathlib.Path, mode: str, write) -> None:
    """Write ``path`` through a temporary file in its folder, renamed over it when ``write(f)``
    succeeds (readers never see half a file); the temporary file is removed on any failure."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_json(path: pathlib.Path, obj: dict) -> None:
    _atomic_write(path, "w", lambda f: json.dump(obj, f, indent=1, sort_keys=True))


def _drop(d: pathlib.Path, digest: str) -> None:
    for suffix in (ENTRY_SUFFIX, KEY_SUFFIX, REPORT_SUFFIX):
        try:
            (d / (digest + suffix)).unlink()
        except OSError:
            pass


def _external_ok(d: pathlib.Path, digest: str) -> bool:
    """The external data files the entry was compiled with are unchanged."""
    try:
        ext = json.loads((d / (digest + KEY_SUFFIX)).read_text()).get("external") or {}
        return all(os.path.isfile(p) and file_digest(p) == h for p, h in ext.items())
    except (OSError, ValueError, AttributeError):
        return False


class StoredReport:
    """The compile report kept with a cache entry: ``data`` (the JSON the compiler stored) and
    the arrays stored with it, read on demand by :meth:`array` (numpy ``.npy`` members of the
    report file; no pickles). The compiler turns it back into its report
    (``compiler.report.CompileReport.from_stored``)."""

    def __init__(self, path: pathlib.Path, data: dict, members: set[str]):
        self.path, self.data, self._members = path, data, members

    def has_array(self, name: str) -> bool:
        return name + ".npy" in self._members

    def array(self, name: str):
        """The stored array ``name``. Raises KeyError when the report has none of that name and
        CacheCorrupt when the file cannot be read back."""
        import io

        import numpy as np
        if not self.has_array(name):
            raise KeyError(name)
        try:
            with zipfile.ZipFile(self.path) as z:
                return np.load(io.BytesIO(z.read(name + ".npy")), allow_pickle=False)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise CacheCorrupt(f"the compile cache entry {self.path} is corrupt ({e}); clear it "
                               f"(delete the file) and compile again") from None


class CacheCorrupt(Exception):
    """A cache entry's report became unreadable after it was found (deleted or damaged)."""


def _read_report(path: pathlib.Path) -> StoredReport:
    with zipfile.ZipFile(path) as z:
        members = set(z.namelist())
        data = json.loads(z.read(REPORT_JSON))
    if not isinstance(data, dict):
        raise ValueError("the report is not a JSON object")
    return StoredReport(path, data, members)


def _write_report(path: pathlib.Path, data: dict, arrays: dict) -> None:
    """Write the report file atomically: ``report.json`` and one ``NAME.npy`` per array."""
    import io

    import numpy as np
    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            z.writestr(REPORT_JSON, json.dumps(data))
            for name, a in arrays.items():
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
                z.writestr(name + ".npy", buf.getvalue())
    _atomic_write(path, "wb", write)


@dataclass
class CacheEntry:
    """What a cache hit gives back: the saved module (loaded, runnable) and the compile report
    stored with it (None for an entry stored without one)."""

    module: Any
    report: StoredReport | None


def lookup(parts: dict, d: pathlib.Path | None = None, external: bool = False,
           need_report: bool = True) -> CacheEntry | None:
    """The cache entry for this key, or None: missing, stale external data, no report when
    ``need_report``, or corrupt (then dropped with a warning). A module compiled for another CPU
    is served (it cannot run here, and says so when run). Imports nothing of the compiler."""
    from .artifact import ArtifactError, load
    d = d or cache_dir()
    digest = key_digest(parts)
    path = d / (digest + ENTRY_SUFFIX)
    if not path.is_file():
        return None
    if external and not _external_ok(d, digest):
        return None
    rpath = d / (digest + REPORT_SUFFIX)
    report = None
    try:
        if rpath.is_file():
            report = _read_report(rpath)
        elif need_report:
            return None
        return CacheEntry(load(path, other_cpu=True), report)     # compiled for another CPU: served
    except (ArtifactError, OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        warnings.warn(f"tensorfuse compile cache: dropped a corrupt entry and rebuilding it ({e})", CacheWarning,
                      stacklevel=3)
        _drop(d, digest)
        return None


def store(parts: dict, module, d: pathlib.Path | None = None, external: dict | None = None,
          report: dict | None = None, arrays: dict | None = None) -> bool:
    """Write ``module`` under this key, with its compile report (``report``: JSON values,
    ``arrays``: {name: numpy array} kept next to it) and ``external`` ({external data file:
    sha256}, checked on lookup). The report is written before the module, so an entry that is
    found has its report. False (and one warning per place) when the place is unwritable."""
    from .artifact import ArtifactError
    can_save = getattr(module, "can_save", None)
    if not (can_save() if can_save is not None else getattr(module, "_object_code", None)):
        return False                                    # nothing a file could hold
    d = d or cache_dir()
    digest = key_digest(parts)
    try:
        d.mkdir(parents=True, exist_ok=True)
        if report is not None:
            _write_report(d / (digest + REPORT_SUFFIX), report, arrays or {})
        module.save(d / (digest + ENTRY_SUFFIX))
        _write_json(d / (digest + KEY_SUFFIX), dict(parts, external=external or {}))
        return True
    except (OSError, ArtifactError) as e:
        _warn_once(str(d), f"tensorfuse compile cache disabled: cannot write to {d} ({e}); compiling without "
                           f"a cache (set TENSORFUSE_CACHE_DIR to a writable folder)")
        return False


def usable(d: pathlib.Path | None = None) -> bool:
    """False once the place was found unwritable in this process (a warning said so)."""
    return str(d or cache_dir()) not in _warned


# ----------------------------------------------------------------------------- explaining
@dataclass
class CacheInfo:
    """Whether a compile would hit the cache, and if not, why. ``differences`` lists the key
    parts that differ from the closest entry (none when the cache is empty)."""

    hit: bool
    path: str
    key: dict
    closest: dict | None = None
    differences: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.hit:
            return f"cache hit: {self.path}"
        if self.closest is None:
            return f"cache miss: no entry in {pathlib.Path(self.path).parent} to compare with"
        return "cache miss; the closest entry differs in: " + "; ".join(self.differences)


def _diff(new: Any, old: Any, where: str, out: list[str]) -> None:
    if isinstance(new, dict) and isinstance(old, dict):
        for k in sorted(set(new) | set(old)):
            _diff(new.get(k), old.get(k), f"{where}.{k}" if where else k, out)
    elif new != old:
        show = lambda v: (v[:12] + "...") if isinstance(v, str) and len(v) > 40 else json.dumps(v)  # noqa: E731
        out.append(f"{where}: {show(new)} (closest entry: {show(old)})")


def explain(parts: dict, d: pathlib.Path | None = None) -> CacheInfo:
    d = d or cache_dir()
    digest = key_digest(parts)
    path = d / (digest + ENTRY_SUFFIX)
    if path.is_file():
        return CacheInfo(True, str(path), parts)
    best, best_diff = None, None
    for kp in sorted(d.glob("*" + KEY_SUFFIX)) if d.is_dir() else []:
        try:
            old = json.loads(kp.read_text())
        except (OSError, ValueError):
            continue
        old.pop("external", None)
        diffs: list[str] = []
        _diff(parts, old, "", diffs)
        if best_diff is None or len(diffs) < len(best_diff):
            best, best_diff = old, diffs
    return CacheInfo(False, str(path), parts, best, best_diff or [])
