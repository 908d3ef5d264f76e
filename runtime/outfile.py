"""Writing an output file without destroying what the path names (``Module.save``, ``export_onnx``,
``DotGraph.write`` and every ``-o`` of the command line).

What a path names decides how it is written:

- a regular file, or nothing yet: the new content goes to a temporary file in the same folder,
  which is flushed to disk (``fsync``) and renamed over the path (``os.replace``), so a reader
  never sees half a file and a failed write leaves the old file as it was. A file that
  existed keeps its permission bits; a new one gets ``0o666`` less the umask, as ``open()``
  would give it;
- a symbolic link (or a chain of them): the file it points to, by the rules here (a link to a
  regular file stays a link and the file it names gets the new content; a dangling link
  creates the file it names);
- a device node or a FIFO (``/dev/null``, ``/dev/stdout``, a named pipe): opened for writing
  and written into as a stream (nothing is created, truncated, renamed or removed; a FIFO
  waits for its reader, as ``cat > fifo`` does);
- a folder, a socket: refused.

The folder of a new file must exist: no folder is created (``-o /missing/dir/out.tfm`` is an
error naming ``/missing/dir``). Every failure, including one found only when the data is
flushed (``ENOSPC`` on ``/dev/full``), raises :class:`OutputError`, an ``OSError`` whose
message is ``cannot write PATH: REASON``.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tempfile
from typing import Iterator

__all__ = ["OutputError", "open_output", "write_bytes", "write_text"]


class OutputError(OSError):
    """An output file cannot be written: ``str(e)`` is ``cannot write PATH: REASON``;
    ``errno`` and ``filename`` as for any OSError."""

    def __init__(self, path: str, reason: str, err: int | None = None):
        super().__init__(err or 0, reason, path)
        self.message = f"cannot write {path}: {reason}"

    def __str__(self) -> str:
        return self.message


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def classify(path: str | os.PathLike) -> tuple[str, str]:
    """(kind, where to write) of an output path: kind "new" (nothing there yet; its folder
    exists), "regular" or "special" (a character or block device or a FIFO); where to write is
    the path with every symbolic link resolved for "new" and "regular" (the file a rename
    replaces), and the path itself for "special" (opened as given). Raises OutputError for a folder, a socket, a missing folder or a
    folder that is a file."""
    path = os.fspath(path)
    real = os.path.realpath(path)
    try:
        # the path itself, followed by the kernel: /dev/stdout on a pipe is a link to
        # "pipe:[N]", which names nothing as a path but opens
        st = os.stat(path)
    except FileNotFoundError:
        folder = os.path.dirname(real) or "."
        if not os.path.isdir(folder):
            shown = os.path.dirname(os.path.abspath(path)) if not os.path.islink(path) else folder
            if os.path.exists(folder):
                raise OutputError(path, f"{shown} is not a folder", errno.ENOTDIR) from None
            raise OutputError(path, f"the folder {shown} does not exist (no folder is created for an "
                                    f"output file)", errno.ENOENT) from None
        return "new", real
    except NotADirectoryError:
        raise OutputError(path, f"{os.path.dirname(os.path.abspath(path))} is not a folder", errno.ENOTDIR) from None
    except OSError as e:
        raise OutputError(path, _why(e), e.errno) from None
    if stat.S_ISREG(st.st_mode):
        return "regular", real
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return "special", path
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(path, "it is a folder", errno.EISDIR)
    raise OutputError(path, "it is neither a regular file, a device nor a FIFO (a socket?)", errno.EINVAL)


class _Stream(io.RawIOBase):
    """A write-only, unseekable view of a device or FIFO: ``zipfile`` then writes a stream
    (data descriptors) instead of seeking back, which a device cannot do."""

    def __init__(self, f):
        super().__init__()
        self._f = f

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b) -> int:
        return self._f.write(b)

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def tell(self) -> int:            # zipfile asks, and streams when it raises
        raise io.UnsupportedOperation("a device or FIFO has no position")

    def seek(self, *a) -> int:
        raise io.UnsupportedOperation("a device or FIFO cannot seek")


@contextlib.contextmanager
def open_output(path: str | os.PathLike) -> Iterator[io.RawIOBase]:
    """A binary file to write ``path``'s new content into (see the module docstring); on
    leaving the block without an exception the content is in place. The file is seekable
    for a regular or new path and not for a device or FIFO. Raises OutputError."""
    shown = os.fspath(path)
    kind, real = classify(shown)
    if kind == "special":
        try:
            fd = os.open(real, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise OutputError(shown, _why(e), e.errno) from None
        f = os.fdopen(fd, "wb")
        try:
            yield _Stream(f)
            f.flush()
        except OSError as e:
            with contextlib.suppress(OSError):
                f.close()
            raise OutputError(shown, _why(e), e.errno) from None
        except BaseException:
            with contextlib.suppress(OSError):
                f.close()
            raise
        try:
            f.close()
        except OSError as e:
            raise OutputError(shown, _why(e), e.errno) from None
        return
    folder = os.path.dirname(real) or "."
    if kind == "regular":
        try:
            mode = stat.S_IMODE(os.stat(real).st_mode)
        except OSError:
            mode = None
    else:
        mode = None
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(real) + ".", dir=folder)
    except OSError as e:
        raise OutputError(shown, _why(e), e.errno) from None
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, real)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(shown, _why(e), e.errno) from None
        raise


def write_bytes(path: str | os.PathLike, data) -> None:
    """Write ``data`` (bytes-like) as ``path``'s content by the rules of the module docstring;
    OutputError when it cannot."""
    with open_output(path) as f:
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            n = f.write(view[done:])
            done += len(view) - done if n is None else n


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """:func:`write_bytes` of ``text`` encoded."""
    write_bytes(path, text.encode(encoding))
