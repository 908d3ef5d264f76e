"""Tuning plugins: extra modules the tuner and its worker processes import before lowering, so
that the schedules they register (``ir.strategy.register_schedule``) take part in tuning.

``$TENSORFUSE_TUNE_PLUGINS`` names them: module names or paths of ``.py`` files, separated by
commas (or ``os.pathsep``). The tuner's tests use it to inject a schedule whose knob makes a
candidate raise, exit or compute wrong values (tests/tune_plugin.py).
"""
from __future__ import annotations

import os
import sys

#: the environment variable naming extra modules (names or .py paths, separated by commas or
#: ``os.pathsep``) that the tuner and its workers import before lowering: schedules registered
#: there (``ir.strategy.register_schedule``) take part in tuning. The tests use it to inject a
#: schedule whose knob makes a candidate raise, exit or compute wrong values.
PLUGINS_ENV = "TENSORFUSE_TUNE_PLUGINS"


def plugin_specs(spec: str | None = None) -> list[str]:
    """The plugin modules named by ``spec`` (default ``$TENSORFUSE_TUNE_PLUGINS``), in order."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    return [p.strip() for chunk in spec.split(",") for p in chunk.split(os.pathsep) if p.strip()]


_LOADED: dict[str, object] = {}


def load_plugins(specs: list[str] | None = None) -> list:
    """Import each plugin (a module name, or a path ending in ``.py``) once per process; returns
    the modules. Raises ImportError naming the plugin and the variable when one fails."""
    import importlib
    import importlib.util
    mods = []
    for s in plugin_specs() if specs is None else specs:
        if s in _LOADED:
            mods.append(_LOADED[s])
            continue
        try:
            if s.endswith(".py"):
                name = "tensorfuse_tune_plugin_" + os.path.splitext(os.path.basename(s))[0]
                if name in sys.modules:
                    mod = sys.modules[name]
                else:
                    spec = importlib.util.spec_from_file_location(name, s)
                    if spec is None or spec.loader is None:
                        raise ImportError(f"no such file: {s}")
                    mod = importlib.util.module_from_spec(spec)
                    sys.modules[name] = mod
                    spec.loader.exec_module(mod)
            else:
                mod = importlib.import_module(s)
        except Exception as e:
            if s.endswith(".py"):
                sys.modules.pop("tensorfuse_tune_plugin_" + os.path.splitext(os.path.basename(s))[0], None)
            raise ImportError(f"tuning plugin {s!r} (from ${PLUGINS_ENV}) failed to import: "
                              f"{type(e).__name__}: {e}") from e
        _LOADED[s] = mod
        mods.append(mod)
    return mods
