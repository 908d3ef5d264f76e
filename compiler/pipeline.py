"""The optimisation pipeline: named pass lists per optimisation level (docs/architecture.md).

- O0: nothing (import only; every op its own kernel).
- O1: constant folding (shape subgraphs included), dead-node elimination, CSE, identity
  elimination and Transpose/Reshape chains (``SIMPLIFY_RULES``), repeated to a fixed point.
- O2 (default): O1 + ``FOLD_RULES`` (BatchNorm folding) + ``FUSE_RULES`` (the fusion catalogue),
  with folding and DCE between them, then ``fuse_ops`` (compiler/passes/fuse_ops.py): the
  remaining elementwise chains and anchor epilogues grouped into fused functions.
- O3: O2 + ``O3_RULES`` and rules marked ``numerics_changing``.

Every pass is ``graph -> bool changed``; :func:`optimize` times each, verifies the graph after
each pass that changed it (in debug mode: ``verify=True``, ``TENSORFUSE_VERIFY=1``, or under
pytest), writes ``DIR/NN-<pass>.txt`` dumps when asked, and wraps any error in a CompileError
naming the pass.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from tensorfuse.compiler.errors import CompileError
from tensorfuse.compiler.passes import PassError, eliminate_common_subexpressions, eliminate_dead_nodes, fold_constants
from tensorfuse.compiler.passes.fold import MAX_FOLD_BYTES
from tensorfuse.compiler.passes.simplify import SIMPLIFY_RULES
from tensorfuse.compiler.rewrite import Application, RewriteError, RewritePass
from tensorfuse.ir.graph import Graph

#: O1's cleanup passes run as a group until none changes the graph (at most this many rounds)
CLEANUP_ROUNDS = 4
#: passes that ``disabled_rules`` may name too, to switch them off like a rule
SWITCHABLE_PASSES = ("fuse_ops",)


@dataclass
class PassRecord:
    """One pass run: name, seconds, whether it changed the graph, node counts around it."""

    name: str
    seconds: float
    changed: bool
    nodes_before: int
    nodes_after: int

    def __str__(self) -> str:
        mark = "changed" if self.changed else "-"
        return f"{self.name:<24} {self.seconds * 1e3:8.2f} ms  {self.nodes_before:>5} -> {self.nodes_after:<5} {mark}"


@dataclass
class PipelineResult:
    """What :func:`optimize` did: ``passes`` (PassRecords in order) and ``log`` (rule applications)."""

    opt_level: int
    passes: list[PassRecord] = field(default_factory=list)
    log: list[Application] = field(default_factory=list)

    def rule_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.log:
            out[a.rule] = out.get(a.rule, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> str:
        lines = [f"O{self.opt_level}: {len(self.passes)} pass runs, "
                 f"{sum(p.seconds for p in self.passes) * 1e3:.1f} ms"]
        lines += ["  " + str(p) for p in self.passes]
        lines += [f"  {n:>4} x {r}" for r, n in self.rule_counts().items()]
        return "\n".join(lines)


def rule_sets() -> dict[str, list]:
    """Every rule set by name (their classes, in order)."""
    from tensorfuse.compiler import rules
    return {"simplify": list(SIMPLIFY_RULES), "fold": list(rules.FOLD_RULES),
            "fuse": list(rules.FUSE_RULES), "o3": list(rules.O3_RULES)}


def all_rules() -> dict[str, type]:
    """Rule name -> rule class, over every rule set."""
    return {(r.__name__ if isinstance(r, type) else r.name): r for rs in rule_sets().values() for r in rs}


def _select(rules: Iterable, level: int, disabled: set[str]) -> list:
    out = []
    for r in rules:
        name = r.__name__ if isinstance(r, type) else r.name
        if name in disabled or (getattr(r, "numerics_changing", False) and level < 3):
            continue
        out.append(r)
    return out


def build_passes(opt_level: int = 2, *, disabled_rules: Iterable[str] = (), log: list | None = None,
                 fold_max_bytes: int = MAX_FOLD_BYTES) -> list[tuple[str, Callable[[Graph], bool]]]:
    """The named pass list of an optimisation level. A ``("cleanup", [...])`` entry is a group
    run to a fixed point. ``disabled_rules`` names rules, or passes of ``SWITCHABLE_PASSES``
    ("fuse_ops"), to leave out: one name (a string) or a list of names. Raises ValueError for an unknown level or rule name."""
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
    from tensorfuse.compiler.options import rule_names
    disabled = set(rule_names(disabled_rules))      # one name, or several
    unknown = disabled - set(all_rules()) - set(SWITCHABLE_PASSES)
    if unknown:
        raise ValueError(f"disabled_rules names unknown rules {sorted(unknown)}; known: {sorted(all_rules())}")
    log = log if log is not None else []
    sets = rule_sets()

    def fold(g: Graph) -> bool:
        return fold_constants(g, fold_max_bytes)

    cleanup: list = [("fold_constants", fold), ("dce", eliminate_dead_nodes),
                     ("cse", eliminate_common_subexpressions),
                     ("simplify", RewritePass("simplify", _select(sets["simplify"], opt_level, disabled), log))]
    if opt_level == 0:
        return []
    passes: list = [("cleanup", cleanup)]
    if opt_level >= 2:
        passes += [("fold_rules", RewritePass("fold_rules", _select(sets["fold"], opt_level, disabled), log)),
                   ("fold_constants", fold), ("dce", eliminate_dead_nodes)]
        fuse = sets["fuse"] + (sets["o3"] if opt_level >= 3 else [])
        passes += [("fuse", RewritePass("fuse", _select(fuse, opt_level, disabled), log)),
                   ("dce", eliminate_dead_nodes)]
        # docs/architecture.md "Grouping": what the catalogue left becomes fused functions, one kernel each
        if "fuse_ops" not in disabled:
            from tensorfuse.compiler.passes.fuse_ops import FuseOps
            passes += [("fuse_ops", FuseOps())]
    return passes


def _verify_default() -> bool:
    return os.environ.get("TENSORFUSE_VERIFY", "") not in ("", "0") or "PYTEST_CURRENT_TEST" in os.environ


def optimize(graph: Graph, opt_level: int = 2, *, disabled_rules: Iterable[str] = (),
             dump_ir: str | os.PathLike | None = None, verify: bool | None = None,
             fold_max_bytes: int = MAX_FOLD_BYTES) -> PipelineResult:
    """Run the level's passes on ``graph`` in place; returns the PipelineResult.

    ``dump_ir=DIR`` writes ``DIR/00-import.txt``, then ``DIR/NN-<pass>.txt`` after every pass
    that changed the graph, and ``DIR/rewrite_log.txt`` and ``DIR/passes.txt`` at the end.
    Raises CompileError naming the pass (and node) when a pass fails or leaves an invalid graph.
    """
    result = PipelineResult(opt_level)
    passes = build_passes(opt_level, disabled_rules=disabled_rules, log=result.log,
                          fold_max_bytes=fold_max_bytes)
    verify = _verify_default() if verify is None else verify
    dumper = _Dumper(dump_ir)
    dumper.write("import", graph)
    for name, p in passes:
        if isinstance(p, list):
            for _ in range(CLEANUP_ROUNDS):
                if not any([_run(n, q, graph, result, verify, dumper) for n, q in p]):
                    break
        else:
            _run(name, p, graph, result, verify, dumper)
    if dumper.dir is not None:
        with open(os.path.join(dumper.dir, "rewrite_log.txt"), "w") as f:
            f.write("".join(f"{a}\n" for a in result.log))
        with open(os.path.join(dumper.dir, "passes.txt"), "w") as f:
            f.write(result.summary() + "\n")
    return result


def _run(name: str, p: Callable, graph: Graph, result: PipelineResult, verify: bool, dumper) -> bool:
    before = len(graph.nodes)
    t0 = time.perf_counter()
    try:
        changed = bool(p(graph))
    except (PassError, RewriteError):
        raise
    except CompileError as e:
        raise CompileError(f"pass {name} failed: {e}") from e
    except Exception as e:
        raise PassError(name, None, e) from e
    result.passes.append(PassRecord(name, time.perf_counter() - t0, changed, before, len(graph.nodes)))
    if changed:
        if verify:
            from tensorfuse.ir.verify import VerifyError, verify_graph
            try:
                verify_graph(graph)
            except VerifyError as e:
                raise CompileError(f"the graph is invalid after pass {name}: {e}") from e
        dumper.write(name, graph)
    return changed


class _Dumper:
    def __init__(self, d):
        self.dir = os.fspath(d) if d is not None else None
        self.n = 0
        if self.dir is not None:
            os.makedirs(self.dir, exist_ok=True)

    def write(self, name: str, graph: Graph) -> None:
        if self.dir is None:
            return
        from tensorfuse.ir import print_graph
        with open(os.path.join(self.dir, f"{self.n:02d}-{name}.txt"), "w") as f:
            f.write(print_graph(graph))
        self.n += 1


def dump_kernels(dump_dir: str | os.PathLike, module) -> None:
    """Write each kernel's IR (``DIR/kernels/NNN-<kernel>.txt``) and the module's LLVM IR
    (``DIR/module.ll``) next to the graph dumps."""
    d = os.path.join(os.fspath(dump_dir), "kernels")
    os.makedirs(d, exist_ok=True)
    for i, k in enumerate(module.kernels):
        with open(os.path.join(d, f"{i:03d}-{k.name}.txt"), "w") as f:
            f.write(str(k) + "\n")
    if module.llvm_ir:
        with open(os.path.join(os.fspath(dump_dir), "module.ll"), "w") as f:
            f.write(module.llvm_ir)
