"""Compile-time resource limits: the memory cap.

A model whose shapes make one tensor larger than the machine can hold (Conv pads of 2**30, a
ConstantOfShape of 4 TiB) would compile and then fail at run time when the memory plan's
arena is allocated, naming neither node nor shape. ``compile()`` refuses it instead: every
graph input and every node output must fit in the **memory cap**, in bytes.

The cap is ``compile(..., max_memory=N)`` if given, else ``$TENSORFUSE_MAX_MEMORY``, else this
machine's physical memory (``os.sysconf``; 64 GiB where that is unknown). Both take an integer
number of bytes or one with a binary suffix: ``"512M"``, ``"64G"``, ``"1T"`` (K, M, G, T =
2**10, 2**20, 2**30, 2**40; ``KiB``/``GB`` spellings too). The resolved cap is part of the
compile cache's key.
"""
from __future__ import annotations

import os
import re

from tensorfuse.ir.errors import UnsupportedModelError

#: the cap where the physical memory size is unknown
FALLBACK_MAX_MEMORY = 64 << 30
_SUFFIX = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}


def parse_size(text, what: str = "max_memory") -> int:
    """Bytes from an int or a string like ``"64G"`` / ``"512MiB"`` / ``"1000000"``. Raises
    ValueError naming ``what`` if it is not a positive size."""
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a positive number of bytes, got {text!r}")
    if isinstance(text, int):
        n = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([KMGTP]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
        if m is None:
            raise ValueError(f"{what} must be a number of bytes, optionally with a K/M/G/T suffix "
                             f"(e.g. 64G), got {text!r}")
        n = int(m[1]) << _SUFFIX[m[2].upper()]
    if n <= 0:
        raise ValueError(f"{what} must be a positive number of bytes, got {text!r}")
    return n


def physical_memory() -> int:
    """This machine's physical memory in bytes (:data:`FALLBACK_MAX_MEMORY` if unknown)."""
    try:
        n = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(n) if n > 0 else FALLBACK_MAX_MEMORY
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MAX_MEMORY


def resolve_max_memory(max_memory=None) -> int:
    """The memory cap in bytes: ``max_memory`` if not None, else ``$TENSORFUSE_MAX_MEMORY``,
    else :func:`physical_memory`. Raises ValueError for a malformed size."""
    if max_memory is not None:
        return parse_size(max_memory)
    env = os.environ.get("TENSORFUSE_MAX_MEMORY", "").strip()
    if env:
        return parse_size(env, "TENSORFUSE_MAX_MEMORY")
    return physical_memory()


def _human(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def check_memory(graph, max_memory: int) -> None:
    """Raise UnsupportedModelError if a graph input or a node output of ``graph`` needs more
    than ``max_memory`` bytes, naming the node (or input), the value, its shape and dtype."""
    def refuse(where: str, v) -> None:
        t = v.type
        raise UnsupportedModelError(
            f"{where}: '{v.name}' of shape {list(t.shape)} ({t.dtype.value}) needs {_human(t.nbytes)}, more "
            f"than the memory cap of {_human(max_memory)} (compile(max_memory=...) or $TENSORFUSE_MAX_MEMORY)")

    for v in graph.inputs:
        if v.type.nbytes > max_memory:
            refuse("graph input", v)
    for n in graph.nodes:
        for v in n.outputs:
            if v is not None and v.type.nbytes > max_memory:
                refuse(f"node '{n.name}' ({n.op}) output", v)
