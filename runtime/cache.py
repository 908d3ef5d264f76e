"""The compile cache: compiled modules on disk, keyed by everything that changes the code.

Place: ``$TENSORFUSE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/tensorfuse``, else
``~/.cache/tensorfuse``. An entry is a saved module (:mod:`runtime.artifact`, written atomically)
named by the SHA-256 of its key, plus a small JSON file holding the key's parts, so that a miss
can be explained (:func:`cache_info`). The key's parts:

- ``model``: SHA-256 of the serialized model (a path: the file's bytes; bytes as given; a
  ModelProto: its serialization). External data files of a model path are hashed when the
  entry is written and checked when it is found;
- ``target``: the canonical target string, and for "llvm" the triple, CPU name and feature
  string the code is generated for (``compiler.target.Target``: this CPU's, or ``-mcpu``'s with
  the ``-mattr`` changes) and the L1d/L2 cache sizes;
- ``options``: every compile option but ``cache`` (``opt_level``, ``input_shapes`` ...),
  canonicalised (dicts sorted, tuples as lists);
- ``version``: the tensorfuse version and a digest of tensorfuse's own source files, so a changed
  compiler never serves code an older one generated.

An unwritable or unusable cache place means no cache and one warning (:class:`CacheWarning`),
never an error. A corrupt entry (bad checksum, truncated) is detected on load, dropped with a
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
from dataclasses import dataclass, field
from typing import Any, Callable

ENTRY_SUFFIX = ".tfm"
KEY_SUFFIX = ".key.json"
_BYPASS_OPTIONS = ("dump_ir",)        # options with side effects a cached module cannot replay
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


def _canon(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_canon(x) for x in v), key=repr)
    if hasattr(v, "tolist"):                       # numpy arrays and scalars
        return _canon(v.tolist())
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _target_part(target: str) -> dict:
    """The target string (canonical) and, for "llvm", what the code is generated for: triple,
    CPU name, LLVM feature string (this CPU's, or the ``-mcpu``'s with the ``-mattr`` changes)
    and the cache sizes kernels are blocked for."""
    from tensorfuse.compiler.target import Target
    tgt = Target.parse(target)
    part = {"target": str(tgt)}
    if tgt.kind == "llvm":
        part.update(triple=tgt.triple, cpu=tgt.cpu, features=tgt.features, l1d_bytes=tgt.l1d_bytes,
                    l2_bytes=tgt.l2_bytes)
    return part


def _version_part() -> dict:
    from tensorfuse import __version__
    return {"tensorfuse": __version__, "source": source_digest()}


def make_key(model: Any, target: str, options: dict) -> dict:
    """The key's parts: {"model", "target", "options", "version"} (all JSON values)."""
    return {"model": model_digest(model), "target": _target_part(target),
            "options": _canon({k: v for k, v in options.items() if k != "cache"}),
            "version": _version_part()}


def key_digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- entries
def _warn_once(tag: str, message: str) -> None:
    if tag not in _warned:
        _warned.add(tag)
        warnings.warn(message, CacheWarning, stacklevel=4)


def _write_json(path: pathlib.Path, obj: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _drop(d: pathlib.Path, digest: str) -> None:
    for suffix in (ENTRY_SUFFIX, KEY_SUFFIX):
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


def lookup(parts: dict, d: pathlib.Path | None = None, external: bool = False):
    """The cached module for this key, or None (missing, stale external data, or corrupt:
    then dropped with a warning)."""
    from .artifact import ArtifactError, load
    d = d or cache_dir()
    digest = key_digest(parts)
    path = d / (digest + ENTRY_SUFFIX)
    if not path.is_file():
        return None
    if external and not _external_ok(d, digest):
        return None
    try:
        return load(path)
    except ArtifactError as e:
        warnings.warn(f"tensorfuse compile cache: dropped a corrupt entry and rebuilding it ({e})", CacheWarning,
                      stacklevel=3)
        _drop(d, digest)
        return None


def store(parts: dict, module, d: pathlib.Path | None = None, external: dict | None = None) -> bool:
    """Write ``module`` under this key (``external``: {external data file: sha256}, checked on
    lookup); False (and one warning per place) when the place is unwritable."""
    from .artifact import ArtifactError
    if not getattr(module, "_object_code", None):       # nothing a file could hold
        return False
    d = d or cache_dir()
    digest = key_digest(parts)
    try:
        d.mkdir(parents=True, exist_ok=True)
        module.save(d / (digest + ENTRY_SUFFIX))
        _write_json(d / (digest + KEY_SUFFIX), dict(parts, external=external or {}))
        return True
    except (OSError, ArtifactError) as e:
        _warn_once(str(d), f"tensorfuse compile cache disabled: cannot write to {d} ({e}); compiling without "
                           f"a cache (set TENSORFUSE_CACHE_DIR to a writable folder)")
        return False


def cached_compile(model: Any, target: str, options: dict, build: Callable[[], Any]):
    """``build()`` through the cache: a hit loads the saved module (its graph, kernel IR and
    LLVM IR are rebuilt by ``build`` on first access); a miss builds and stores it. For a model
    path with external data files, their digests are recorded with the entry and checked on
    lookup (the common model without external data costs nothing extra)."""
    if any(options.get(k) for k in _BYPASS_OPTIONS):
        return build()
    d = cache_dir()
    if str(d) in _warned:                      # found unwritable earlier in this process
        return build()
    try:
        parts = make_key(model, target, options)
    except Exception:       # unreadable path, not a model ...: the compiler says what is wrong
        return build()
    is_path = isinstance(model, (str, os.PathLike))
    mod = lookup(parts, d, external=is_path)
    if mod is not None:
        mod._rebuild = build
        mod.cache_hit = True
        return mod
    mod = build()
    ext = {p: file_digest(p) for p in external_files(os.fspath(model))} if is_path else {}
    store(parts, mod, d, ext)
    mod.cache_hit = False
    return mod


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


def cache_info(model: Any, *args, **kwargs) -> CacheInfo:
    """Would ``compiler.compile(model, *args, **kwargs)`` hit the compile cache? Returns a
    :class:`CacheInfo`; on a miss, ``differences`` names each key part (model content, target,
    host CPU, an option, the tensorfuse version or sources) that differs from the closest entry."""
    import inspect

    from tensorfuse.compiler.driver import compile as _compile
    bound = inspect.signature(_compile).bind(model, *args, **kwargs)
    bound.apply_defaults()
    opts = dict(bound.arguments)
    opts.pop("model", None)
    opts.pop("num_threads", None)          # a run-time setting, not part of the key
    target = opts.pop("target", "llvm")
    extra = opts.pop("kwargs", None)
    if isinstance(extra, dict):
        opts.update(extra)
    from tensorfuse.compiler.limits import resolve_max_memory
    opts["max_memory"] = resolve_max_memory(opts.get("max_memory"))   # as compile() keys it
    from tensorfuse.compiler.target import Target
    return explain(make_key(model, str(Target.parse(target)), opts))
