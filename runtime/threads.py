"""Thread counts for the native parallel loops (DESIGN.md "CPU codegen", Parallelism)."""
from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where the
    platform lacks it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_num_threads(n: int | None) -> int:
    """``n`` if given, else ``$TENSORFUSE_NUM_THREADS``, else :func:`available_cores`.
    Raises ValueError for a count below 1 or a variable that is not an integer."""
    if n is None:
        env = os.environ.get("TENSORFUSE_NUM_THREADS", "").strip()
        if env:
            try:
                n = int(env)
            except ValueError:
                raise ValueError(f"TENSORFUSE_NUM_THREADS must be a positive integer, got {env!r}") from None
        else:
            n = available_cores()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_threads must be a positive integer, got {n!r}")
    return n
