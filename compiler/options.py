"""Compile options as one frozen value, and the compile cache's key built from them.

:class:`CompileOptions` holds every keyword of ``tensorfuse.compile`` but the model, checked and
normalised once (``disabled_rules`` a sorted tuple, ``input_shapes`` a sorted tuple of
``(name, shape)`` pairs, the target string canonical), so that two calls that mean the same
compile have equal options. :func:`cache_key` is the one place the compile cache's key is built
(see :mod:`tensorfuse.runtime.cache` for what each part means); ``runtime.cache`` only stores and
finds entries under a key it is given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

#: options that do not change the generated code: they are not part of the cache key
#: (``num_threads`` is a run-time setting of the module; ``cache`` says whether to use it)
NOT_IN_KEY = ("cache", "num_threads")


def rule_names(disabled_rules: str | Iterable[str] | None) -> tuple[str, ...]:
    """A rule name, or an iterable of names, as a sorted tuple (a single string is one name,
    not a sequence of letters). Raises TypeError for anything else."""
    if disabled_rules is None:
        return ()
    if isinstance(disabled_rules, str):
        return (disabled_rules,) if disabled_rules else ()
    try:
        names = list(disabled_rules)
    except TypeError:
        raise TypeError(f"disabled_rules must be a rule name or a list of rule names, got "
                        f"{type(disabled_rules).__name__}") from None
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"disabled_rules must hold rule names (strings), got {bad[0]!r}")
    return tuple(sorted(set(names)))


def _shapes(input_shapes) -> tuple[tuple[str, tuple], ...] | None:
    if input_shapes is None:
        return None
    if not isinstance(input_shapes, dict):
        raise TypeError(f"input_shapes must be a dict {{input name: shape}}, got {type(input_shapes).__name__}")
    out = []
    for name, shape in input_shapes.items():
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ValueError(f"input_shapes['{name}'] must be a sequence of integers, got {shape!r}") from None
        out.append((str(name), dims))
    return tuple(sorted(out))


@dataclass(frozen=True)
class CompileOptions:
    """Everything ``tensorfuse.compile`` was asked for, but the model (see that function for
    each option's meaning). Build it with :meth:`create`, which checks and normalises.

    ``target``: canonical target string (``ir.target.Target``); ``opt_level``: 0..3;
    ``input_shapes``: ``((input name, shape), ...)`` sorted by name, or None;
    ``disabled_rules``: sorted rule names; ``dump_ir``: a folder or None; ``cache``: use the
    compile cache; ``num_threads``: the requested thread count (None: the default);
    ``max_memory``: the resolved memory cap in bytes (``compiler.limits.resolve_max_memory``);
    ``rules``: the rules under test, a tuple of Rule classes or instances in the order given
    (``compiler.pipeline.rules_under_test``), each tried before the built-in rules of its set;
    ``tuning``: the tuning records (``compiler.tuning.TuningRecords``) chosen for ``target`` and
    the thread count, or None; the key holds their ``digest()`` (the knobs they choose), not
    the file's path.
    """

    target: str = "llvm"
    opt_level: int = 2
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    disabled_rules: tuple[str, ...] = ()
    dump_ir: str | None = None
    cache: bool = True
    num_threads: int | None = field(default=None, compare=False)
    max_memory: int | None = None
    rules: tuple = ()
    tuning: Any = field(default=None, compare=False)
    #: ``tuning.digest()`` (None without records): what the records change in the code
    tuning_digest: str | None = None
    #: cuda GEMM/conv precision, None (fp32), "fp32", "tf32" or "auto" (``codegen.cuda.mma``)
    precision: str | None = None

    @classmethod
    def create(cls, target: str = "llvm", opt_level: int = 2, *, input_shapes=None, disabled_rules=(),
               dump_ir=None, cache: bool = True, num_threads: int | None = None,
               max_memory: int | str | None = None, rules=(), tuning=None,
               precision: str | None = None) -> "CompileOptions":
        """Check and normalise. ``tuning``: None, a records file path, a list of paths or
        records, or ``compiler.tuning.TuningRecords`` (chosen again for this target and the
        thread count ``num_threads`` resolves to). Raises ValueError (opt_level not 0..3, a
        bad shape, a bad rule under test, a corrupt records file), TypeError (disabled_rules,
        input_shapes or tuning of the wrong kind), FileNotFoundError (a records file that does
        not exist), CompileError (a target that does not parse or is not available)."""
        import os

        from tensorfuse.ir.errors import CompileError
        from tensorfuse.compiler.limits import resolve_max_memory
        from tensorfuse.compiler.pipeline import rules_under_test
        from tensorfuse.ir.target import Target
        if isinstance(opt_level, bool) or opt_level not in (0, 1, 2, 3):
            raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
        tgt = Target.parse(target)
        from tensorfuse.codegen.cuda.mma import check_precision
        if check_precision(precision) not in (None, "fp32") and tgt.kind != "cuda":
            raise ValueError(f"precision={precision!r} applies to target 'cuda' only; the {tgt.kind} target "
                             f"computes in fp32")
        from tensorfuse.codegen.base import get_backend
        reason = get_backend(tgt.kind).unavailable_reason()     # e.g. cuda without a GPU or simulator
        if reason is not None:
            raise CompileError(f"target '{tgt.kind}' is not available here: {reason}")
        records = None
        if tuning is not None:
            from tensorfuse.compiler.tuning import as_tuning
            from tensorfuse.runtime.threads import resolve_num_threads
            records = as_tuning(tuning, tgt, resolve_num_threads(num_threads))
        return cls(str(tgt), int(opt_level), _shapes(input_shapes), rule_names(disabled_rules),
                   None if dump_ir is None else os.fspath(dump_ir), bool(cache), num_threads,
                   resolve_max_memory(max_memory), rules_under_test(rules), records,
                   records.digest() if records is not None else None, precision)

    @property
    def input_shapes_dict(self) -> dict[str, tuple[int, ...]] | None:
        return None if self.input_shapes is None else dict(self.input_shapes)

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``tensorfuse.compile`` (but ``target``) these options stand for."""
        return {"opt_level": self.opt_level, "input_shapes": self.input_shapes_dict,
                "disabled_rules": self.disabled_rules, "dump_ir": self.dump_ir, "cache": self.cache,
                "num_threads": self.num_threads, "max_memory": self.max_memory, "rules": self.rules,
                "tuning": self.tuning, "precision": self.precision}

    def key_options(self) -> dict[str, Any]:
        """The options part of the cache key: every option but :data:`NOT_IN_KEY`, as JSON values
        (the rules under test by name here; their code is in the key's pipeline part; tuning
        records by :attr:`tuning_digest`, present only with records, so that the key of a
        compile without them is what it was before records existed)."""
        d = {"opt_level": self.opt_level,
                "input_shapes": None if self.input_shapes is None else {k: list(v) for k, v in self.input_shapes},
                "disabled_rules": list(self.disabled_rules), "dump_ir": self.dump_ir,
                "max_memory": self.max_memory,
                "rules": [r.__name__ if isinstance(r, type) else r.name for r in self.rules]}
        if self.tuning_digest is not None:
            d["tuning"] = self.tuning_digest
        if self.precision is not None:
            d["precision"] = self.precision
        return d

    def key(self, model: Any) -> dict:
        """The compile cache key of compiling ``model`` with these options (:func:`cache_key`)."""
        return cache_key(model, self)


def target_part(target: str) -> dict:
    """The key's target part, as the target's backend gives it (``codegen.base.Backend.target_key``):
    the canonical target string and, for "llvm", what the code is generated for: triple, CPU
    name, LLVM feature string (this CPU's, or the ``-mcpu``'s with the ``-mattr`` changes) and
    the cache sizes kernels are blocked for; for "cuda", the device's compute capability (or
    the simulator) and the numba-cuda version."""
    from tensorfuse.codegen.base import get_backend
    from tensorfuse.ir.target import Target
    tgt = Target.parse(target)
    return get_backend(tgt.kind).target_key(tgt)


def cache_key(model: Any, options: CompileOptions) -> dict:
    """The compile cache's key, the one place it is built: ``{"model", "target", "options",
    "pipeline", "version"}``, all JSON values (``runtime.cache`` documents each part). Raises OSError for
    an unreadable model path."""
    from tensorfuse.runtime import cache as rc
    from tensorfuse.compiler.pipeline import pipeline_digest
    return {"model": rc.model_digest(model), "target": target_part(options.target),
            "options": rc.canon(options.key_options()),
            "pipeline": pipeline_digest(options.opt_level, options.disabled_rules, rules=options.rules),
            "version": rc.version_part()}
