"""The optimisation pipeline: named pass lists per optimisation level (docs/architecture.md).

- O0: nothing (import only; every op its own kernel).
- O1: constant folding (shape subgraphs included), dead-node elimination, CSE, identity
  elimination and Transpose/Reshape chains (``SIMPLIFY_RULES``), repeated to a fixed point.
- O2 (default): ``QUANTIZE_RULES`` first (integer kernels for QDQ products, before folding), then
  O1 + ``FOLD_RULES`` (BatchNorm folding) + ``FUSE_RULES`` (the fusion catalogue),
  with folding and DCE between them, then ``fuse_ops`` (compiler/passes/fuse_ops.py): the
  remaining elementwise chains and anchor epilogues grouped into fused functions.
- O3: O2 + ``O3_RULES`` and rules marked ``numerics_changing``.

Layout (``compiler/passes/layout.py``): for a target whose preferred layout is NHWC
(``target.layout``, from the kind's ``KindTraits``: cuda), or when
forced with ``layout="NHWC"`` (any target: the NHWC ops lower for llvm too), the ``layout``
pass runs at O1 and above after the rule rewrites (BatchNorm folded, FusedConv made) and
before ``fuse_ops``, so grouping sees the NHWC ops; its :class:`LayoutReport` is
``PipelineResult.layout_report`` and its events are in the summary.

Every pass is ``graph -> bool changed``; :func:`optimize` times each, verifies the graph after
every pass, and its order after every rule application (in debug mode: ``verify=True``,
``TENSORFUSE_DEBUG=1``, see ``tensorfuse.debug``; the test suite runs in it), writes
``DIR/NN-<pass>.txt`` dumps when asked, and wraps any error in a CompileError
naming the pass.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from tensorfuse.ir.errors import CompileError
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
    #: the layout pass's report (``compiler.passes.layout.LayoutReport``), None when it did not run
    layout_report: object | None = None

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
        if self.layout_report is not None:
            lines += ["  " + ln for ln in str(self.layout_report).splitlines()]
        return "\n".join(lines)


RULE_SET_NAMES = ("quantize", "simplify", "fold", "fuse", "o3")


def _rule_name(r) -> str:
    return r.__name__ if isinstance(r, type) else r.name


def rules_under_test(rules: Iterable | None) -> tuple:
    """``rules`` (the ``rules=`` option of ``tensorfuse.compile``, ``explain``, ``verify``,
    ``testing.check_rule``; the command line's ``--rules``) checked, as a tuple in the given
    order. Each is a :class:`~compiler.rewrite.Rule` subclass or instance; it joins the rule
    set its ``rule_set`` attribute names (:func:`rule_set_of`) *in front of* that set's
    built-in rules. Raises ValueError for something that is not a rule, a bad ``rule_set``, a
    name that a built-in rule (or another rule given) has already."""
    from tensorfuse.compiler.rewrite import Rule
    if rules is None:
        return ()
    if isinstance(rules, (type, Rule)):
        rules = [rules]
    out: list = []
    names: set[str] = set()
    builtin = None
    for r in rules:
        if not ((isinstance(r, type) and issubclass(r, Rule) and r.pattern is not None) or isinstance(r, Rule)):
            raise ValueError(f"rules= takes Rule classes or instances (tensorfuse.compiler.rewrite.Rule), got {r!r}")
        name = _rule_name(r)
        rule_set_of(r)
        if builtin is None:
            builtin = all_rules()
        if name in builtin:
            if builtin[name] is r:
                raise ValueError(f"rule {name!r} is a built-in rule and runs already; rules= is for rules under "
                                 f"test (disabled_rules switches a built-in one off)")
            raise ValueError(f"rule {name!r} has the name of a built-in rule; rename it")
        if name in names:
            raise ValueError(f"rule {name!r} is given twice in rules=")
        names.add(name)
        out.append(r)
    return tuple(out)


def rule_sets(rules: Iterable = ()) -> dict[str, list]:
    """Every rule set by name (their classes, in order): the built-in ones
    (``compiler.rules``, ``SIMPLIFY_RULES``) with the rules under test (``rules``, see
    :func:`rules_under_test`) in front of their set, in the order given."""
    from tensorfuse.compiler import rules as builtin
    sets = {"quantize": list(builtin.QUANTIZE_RULES), "simplify": list(SIMPLIFY_RULES), "fold": list(builtin.FOLD_RULES),
            "fuse": list(builtin.FUSE_RULES), "o3": list(builtin.O3_RULES)}
    added: dict[str, list] = {}
    for r in rules or ():
        added.setdefault(rule_set_of(r), []).append(r)
    for name, extra in added.items():
        sets[name] = extra + sets[name]
    return sets


def rule_set_of(rule) -> str:
    """The set a rule under test joins: its ``rule_set`` class attribute (one of
    ``RULE_SET_NAMES``), default "fuse"; "o3" for a ``numerics_changing`` rule."""
    default = "o3" if getattr(rule, "numerics_changing", False) else "fuse"
    name = getattr(rule, "rule_set", default)
    if name not in RULE_SET_NAMES:
        raise ValueError(f"rule {getattr(rule, '__name__', rule)!r}: rule_set must be one of "
                         f"{list(RULE_SET_NAMES)}, got {name!r}")
    return name


def all_rules(rules: Iterable = ()) -> dict[str, type]:
    """Rule name -> rule class (or instance), over every rule set, with the rules under test
    ``rules``."""
    return {_rule_name(r): r for rs in rule_sets(rules).values() for r in rs}


def _select(rules: Iterable, level: int, disabled: set[str], layout: str = "NCHW") -> list:
    out = []
    for r in rules:
        name = r.__name__ if isinstance(r, type) else r.name
        if name in disabled or (getattr(r, "numerics_changing", False) and level < 3):
            continue
        if getattr(r, "layouts", None) is not None and layout not in r.layouts:
            continue
        out.append(r)
    return out


def resolve_layout(target=None, layout: str | None = None) -> str:
    """The layout the pipeline converts to: ``layout`` when given ("NHWC" or "NCHW"), else
    the target's preferred layout (``Target.layout``: "NHWC" for cuda; "NCHW", no layout pass,
    for llvm) and "NCHW" without a target. ``target``: None, a target
    string or an ``ir.target.Target``. Raises ValueError for an unknown layout."""
    from tensorfuse.compiler.passes.layout import LAYOUTS
    if layout is not None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
        return layout
    if target is None:
        return "NCHW"
    from tensorfuse.ir.target import Target
    return Target.parse(target).layout


def build_passes(opt_level: int = 2, *, disabled_rules: Iterable[str] = (), log: list | None = None,
                 fold_max_bytes: int = MAX_FOLD_BYTES,
                 verify: bool | None = None, layout: str = "NCHW",
                 rules: Iterable = ()) -> list[tuple[str, Callable[[Graph], bool]]]:
    """The named pass list of an optimisation level. A ``("cleanup", [...])`` entry is a group
    run to a fixed point. ``disabled_rules`` names rules, or passes of ``SWITCHABLE_PASSES``
    ("fuse_ops"), to leave out: one name (a string) or a list of names. ``verify``: the rewrite
    passes check the node order after each rule application (None: in debug mode). ``layout``
    "NHWC" adds the layout pass (a ``compiler.passes.layout.LayoutPass``) at O1 and above,
    before ``fuse_ops``. ``rules``: rules under test (:func:`rules_under_test`), each tried
    before the built-in rules of its set. Raises ValueError for an unknown level, rule name or
    layout, or a bad rule under test."""
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")
    layout = resolve_layout(None, layout)
    from tensorfuse.compiler.options import rule_names
    disabled = set(rule_names(disabled_rules))      # one name, or several
    rules = rules_under_test(rules)
    known = all_rules(rules)
    unknown = disabled - set(known) - set(SWITCHABLE_PASSES)
    if unknown:
        raise ValueError(f"disabled_rules names unknown rules {sorted(unknown)}; known: {sorted(known)}")
    log = log if log is not None else []
    sets = rule_sets(rules)

    def fold(g: Graph) -> bool:
        return fold_constants(g, fold_max_bytes)

    cleanup: list = [("fold_constants", fold), ("dce", eliminate_dead_nodes),
                     ("cse", eliminate_common_subexpressions),
                     ("simplify", RewritePass("simplify", _select(sets["simplify"], opt_level, disabled, layout), log, verify=verify))]
    if opt_level == 0:
        return []
    passes: list = []
    if opt_level >= 2:
        # before the first constant folding, which would fold DequantizeLinear(W) into float W
        passes += [("quantize", RewritePass("quantize", _select(sets["quantize"], opt_level, disabled, layout), log,
                                            verify=verify))]
    passes += [("cleanup", cleanup)]
    from tensorfuse.compiler.passes.layout import LayoutPass
    layout_passes = [("layout", LayoutPass(layout, log)), ("dce", eliminate_dead_nodes)] if layout != "NCHW" else []
    if opt_level == 1:
        passes += layout_passes
    if opt_level >= 2:
        passes += [("fold_rules", RewritePass("fold_rules", _select(sets["fold"], opt_level, disabled, layout), log, verify=verify)),
                   ("fold_constants", fold), ("dce", eliminate_dead_nodes)]
        fuse = sets["fuse"] + (sets["o3"] if opt_level >= 3 else [])
        passes += [("fuse", RewritePass("fuse", _select(fuse, opt_level, disabled, layout), log, verify=verify)),
                   ("dce", eliminate_dead_nodes)]
        passes += layout_passes      # after BatchNorm folding and FusedConv, before grouping
        # docs/architecture.md "Grouping": what the catalogue left becomes fused functions, one kernel each
        if "fuse_ops" not in disabled:
            from tensorfuse.compiler.passes.fuse_ops import FuseOps
            passes += [("fuse_ops", FuseOps())]
    return passes


def pipeline_digest(opt_level: int = 2, disabled_rules: Iterable[str] = (), layout: str = "NCHW",
                    rules: Iterable = ()) -> str:
    """SHA-256 over the passes and rules that :func:`build_passes` selects for this level: each
    one's name, qualified name and source code (``inspect.getsource``; for a function, also the
    functions and classes it reads from its globals, so a pass monkeypatched in changes it too;
    for a rule or pass defined outside tensorfuse, also the whole source of the module defining
    it, which holds its sub-patterns and helpers; for a class made by a factory function, the
    plain values its methods close over). tensorfuse's own code counts by name: its files are
    in the key's version part. Code whose source cannot be read (typed at
    the interactive prompt) is hashed by its bytecode and constants. The compile cache's key
    includes it (``runtime.cache``), so a rule under test (``rules``, in the order given), a
    rule edited in a notebook, ``FUSE_RULES.append(MyRule)`` or a replaced pass never gets
    machine code the old pipeline made."""
    import hashlib
    h = hashlib.sha256()
    for name, p in build_passes(opt_level, disabled_rules=disabled_rules, verify=False, layout=layout, rules=rules):
        h.update(f"pass {name}\0".encode())
        for sub_name, q in (p if isinstance(p, list) else [(name, p)]):
            h.update(f"{sub_name}\0".encode())
            if isinstance(q, RewritePass):
                for r in q.rules:
                    _hash_code(h, type(r))
            else:
                _hash_code(h, q)
    return h.hexdigest()


def _hash_code(h, obj, depth: int = 0) -> None:
    import inspect
    import sys
    import types
    fn = obj if isinstance(obj, (types.FunctionType, types.MethodType, type)) else type(obj)
    fn = getattr(fn, "__func__", fn)
    mod_name = getattr(fn, "__module__", None) or ""
    h.update(f"{mod_name}.{getattr(fn, '__qualname__', repr(fn))}\0".encode())
    if not mod_name.startswith("tensorfuse."):
        # tensorfuse's own files are in the key's version part already (and reading their
        # source again would cost a tenth of a second per compile)
        try:
            h.update(inspect.getsource(fn).encode())
        except (OSError, TypeError):
            _hash_bytecode(h, fn)
        mod = sys.modules.get(mod_name)
        if mod is not None:     # the module's helpers and shared sub-patterns
            try:
                h.update(inspect.getsource(mod).encode())
            except (OSError, TypeError):
                pass
    if isinstance(fn, type):      # a class made by a factory: the values its methods close over
        for f in vars(fn).values():
            for cell in getattr(f, "__closure__", None) or ():
                try:
                    c = cell.cell_contents
                except ValueError:
                    continue
                if isinstance(c, (str, int, float, bool, bytes, tuple, frozenset, type(None))):
                    h.update(repr(c).encode())
                elif isinstance(c, (types.FunctionType, type)) and depth == 0:
                    _hash_code(h, c, depth + 1)
    if depth == 0 and isinstance(fn, types.FunctionType):
        for gname in fn.__code__.co_names:       # the functions it calls by global name
            g = fn.__globals__.get(gname)
            if isinstance(g, (types.FunctionType, type)) and g is not fn:
                _hash_code(h, g, depth + 1)
        for cell in fn.__closure__ or ():
            try:
                c = cell.cell_contents
            except ValueError:
                continue
            if isinstance(c, types.FunctionType):
                _hash_code(h, c, depth + 1)


def _hash_bytecode(h, obj) -> None:
    import types
    codes = []
    if isinstance(obj, type):
        codes = [f.__code__ for f in vars(obj).values() if isinstance(f, types.FunctionType)]
        h.update(repr(sorted(k for k in vars(obj))).encode())
    elif hasattr(obj, "__code__"):
        codes = [obj.__code__]
    stack = list(codes)
    while stack:
        c = stack.pop()
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                stack.append(k)
            else:
                h.update(repr(k).encode())


def _verify_default() -> bool:
    from tensorfuse.debug import debug_mode
    return debug_mode()


def optimize(graph: Graph, opt_level: int = 2, *, disabled_rules: Iterable[str] = (),
             dump_ir: str | os.PathLike | None = None, verify: bool | None = None,
             fold_max_bytes: int = MAX_FOLD_BYTES, target=None, layout: str | None = None,
             rules: Iterable = ()) -> PipelineResult:
    """Run the level's passes on ``graph`` in place; returns the PipelineResult.

    ``target`` (None, a target string or an ``ir.target.Target``) chooses the layout: a
    cuda target runs the layout pass (NHWC); ``layout="NHWC"`` forces it on any target (the
    NHWC ops lower for llvm too: for tests and experiments), ``layout="NCHW"`` switches it
    off. With the pass, ``result.layout_report`` is its ``LayoutReport`` (also written to
    ``DIR/layout.txt`` with ``dump_ir``).

    ``rules``: rules under test (:func:`rules_under_test`), each tried before the built-in
    rules of its set; their applications are in ``result.log`` like the others.

    ``dump_ir=DIR`` writes ``DIR/00-import.txt``, then ``DIR/NN-<pass>.txt`` after every pass
    that changed the graph, and ``DIR/rewrite_log.txt`` and ``DIR/passes.txt`` at the end.
    Raises CompileError naming the pass (and node) when a pass fails or leaves an invalid graph.
    """
    result = PipelineResult(opt_level)
    verify = _verify_default() if verify is None else verify
    passes = build_passes(opt_level, disabled_rules=disabled_rules, log=result.log,
                          fold_max_bytes=fold_max_bytes, verify=verify, layout=resolve_layout(target, layout),
                          rules=rules)
    dumper = _Dumper(dump_ir)
    dumper.write("import", graph)
    for name, p in passes:
        if isinstance(p, list):
            for _ in range(CLEANUP_ROUNDS):
                if not any([_run(n, q, graph, result, verify, dumper) for n, q in p]):
                    break
        else:
            _run(name, p, graph, result, verify, dumper)
            if name == "layout":
                result.layout_report = p.report
    if dumper.dir is not None:
        if result.layout_report is not None:
            with open(os.path.join(dumper.dir, "layout.txt"), "w") as f:
                f.write(str(result.layout_report) + "\n" + "".join(f"{e}\n" for e in result.layout_report.events))
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
    if verify:   # after every pass: one that says it changed nothing may still have broken the graph
        from tensorfuse.ir.verify import VerifyError, verify_graph
        try:
            verify_graph(graph)
        except VerifyError as e:
            raise CompileError(f"the graph is invalid after pass {name}: {e}") from e
    if changed:
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


def optimized_llvm(llvm_ir: str, target: str = "llvm", name: str = "module") -> tuple[str, str]:
    """(optimised LLVM IR, assembly) of a module's LLVM IR text for ``target`` (a target string
    such as "llvm" or "llvm -mcpu=znver3"), as ``compile`` generates them: the same pass
    pipeline and target machine; the IR carries the target's triple and data layout."""
    from tensorfuse.codegen.llvm import jit
    t = jit._as_target(target or "llvm")
    tm = jit.target_machine(t)
    mod = jit.parse_and_verify(llvm_ir, name)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    jit.optimize(mod, 3, t)
    return str(mod), tm.emit_assembly(mod)


def dump_kernels(dump_dir: str | os.PathLike, module) -> None:
    """Write each kernel's IR (``DIR/kernels/NNN-<kernel>.txt``), the module's LLVM IR
    (``DIR/module.ll``), the optimised LLVM IR (``DIR/module.opt.ll``) and the assembly
    (``DIR/module.s``) for the module's target next to the graph dumps."""
    d = os.path.join(os.fspath(dump_dir), "kernels")
    os.makedirs(d, exist_ok=True)
    for i, k in enumerate(module.kernels):
        with open(os.path.join(d, f"{i:03d}-{k.name}.txt"), "w") as f:
            f.write(str(k) + "\n")
    if module.llvm_ir:
        with open(os.path.join(os.fspath(dump_dir), "module.ll"), "w") as f:
            f.write(module.llvm_ir)
        opt_ir, asm = optimized_llvm(module.llvm_ir, getattr(module, "target", "llvm"))
        with open(os.path.join(os.fspath(dump_dir), "module.opt.ll"), "w") as f:
            f.write(opt_ir)
        with open(os.path.join(os.fspath(dump_dir), "module.s"), "w") as f:
            f.write(asm)
