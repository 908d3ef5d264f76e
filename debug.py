"""Debug mode: one switch for the compiler's and the runtime's self-checks.

``TENSORFUSE_DEBUG`` decides when set ("0" or "" is off, anything else on); otherwise the older
``TENSORFUSE_VERIFY`` does, and running under pytest turns it on (tests/conftest.py also sets
``TENSORFUSE_DEBUG=1``). In debug mode:

- the pipeline verifies the graph after every pass (``ir.verify.verify_graph``, naming the
  pass) and its node order and definitions after every rule application (naming the rule);
- a module checks its memory plan against its kernel calls when it is made, and every run
  poisons each arena region when its value dies and checks, before each kernel call, that what
  the kernel reads is still what its producer wrote (``runtime.memory_plan``); a stale or
  unwritten read raises ``MemoryPlanError`` naming the kernel and the values.

This module imports nothing of tensorfuse: a process that only loads saved modules reads it too.
"""
from __future__ import annotations

import os

__all__ = ["debug_mode"]


def debug_mode() -> bool:
    """Is debug mode on (see the module docstring)? Read from the environment at each call."""
    v = os.environ.get("TENSORFUSE_DEBUG")
    if v is not None:
        return v.strip() not in ("", "0")
    return os.environ.get("TENSORFUSE_VERIFY", "") not in ("", "0") or "PYTEST_CURRENT_TEST" in os.environ
