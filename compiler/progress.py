"""Progress bars, re-exported from their home :mod:`tensorfuse.progress` (they moved there so
that code generators report progress without importing the compiler);
``tensorfuse.compiler.progress`` keeps working for code that imports it from here."""
from tensorfuse.progress import (MIN_ITEMS, REFRESH_S, Task, active, advance, enabled, expect,  # noqa: F401
                                 iterate, stage, status, task)

__all__ = ["enabled", "iterate", "active", "status", "task", "expect", "advance", "stage", "Task"]
