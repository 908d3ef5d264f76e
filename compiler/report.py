"""The compile report: what ``tensorfuse.compile`` did to a model, held by the Module it made.

A :class:`CompileReport` has the optimised graph IR (``graph``), the kernel IR (``kernels``,
one per distinct kernel), the LLVM IR text (``llvm_ir``), the rule applications in order
(``rewrite_log``, ``compiler.rewrite.Application``), the pass runs (``passes``,
``compiler.pipeline.PassRecord``), the options (``options``, ``compiler.options.CompileOptions``)
and, per native kernel call in run order, the ONNX node names it computes (``sources``, traced
back through the rule log by ``runtime.profile.trace_sources``), and the workloads whose knobs
came from tuning records (``tuned``, ``compiler.driver.tuned_workloads``: key, summary,
schedule, knobs, nodes, kernels) with ``num_distinct_kernels``, the kernels of the module.

On a compile-cache hit the report comes from the cache entry (``runtime.cache``), not from a
recompile: the rule log, pass records, LLVM IR and sources are read with the entry; the graph is
parsed from its stored text, with its constants, on first access to ``graph`` (resnet18: 0.5 s
on a busy 2-core machine, whose cold compile took 40 s); the kernel IR is lowered again from
that graph on first access to ``kernels`` (no optimisation passes and no LLVM code generation;
resnet18: 1.4 s there). ``from_cache`` says which. The entry keeps the graph's text and only
the constants the module does not hold itself (resnet18: a 3.6 MB report beside a 94 MB
module).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

REPORT_FORMAT = 1


@dataclass
class CompileReport:
    """See the module docstring. ``graph`` and ``kernels`` are computed on first access for a
    report that came from the compile cache."""

    options: Any
    llvm_ir: str | None
    rewrite_log: list
    passes: list
    sources: list[list[str]]
    from_cache: bool = False
    #: the layout pass's report (``compiler.passes.layout.LayoutReport``) where the target runs
    #: it (cuda), else None
    layout: Any = None
    #: the workloads that used a tuning record (``compiler.driver.tuned_workloads``), one dict each
    tuned: list = field(default_factory=list)
    #: distinct kernels of the module (None: not recorded, a report of an older entry)
    num_distinct_kernels: int | None = None
    _graph: Any = field(default=None, repr=False)
    _kernels: list | None = field(default=None, repr=False)
    _load_graph: Callable[[], Any] | None = field(default=None, repr=False)
    _load_kernels: Callable[[Any], list] | None = field(default=None, repr=False)

    @property
    def graph(self):
        """The optimised graph IR (``ir.Graph``)."""
        if self._graph is None and self._load_graph is not None:
            self._graph, self._load_graph = self._load_graph(), None
        return self._graph

    @property
    def kernels(self) -> list:
        """The kernel IR (``ir.kernel.Kernel``), one per distinct kernel, in first-call order."""
        if self._kernels is None and self._load_kernels is not None:
            self._kernels, self._load_kernels = self._load_kernels(self.graph), None
        return self._kernels if self._kernels is not None else []

    @property
    def num_tuned_kernels(self) -> int:
        """Distinct kernels whose schedule's knobs came from a tuning record."""
        return sum(t["kernels"] for t in self.tuned)

    def tuned_lines(self) -> list[str]:
        """One line per tuned workload: its summary, schedule, knobs and kernel count."""
        out = []
        for t in self.tuned:
            knobs = " ".join(f"{k}={v}" for k, v in t["knobs"].items()) or "(default knobs)"
            out.append(f"  {t['summary']}  [{t['workload']}, {t['nodes']} node{'' if t['nodes'] == 1 else 's'}]: "
                       f"{t['schedule']} {knobs}")
        return out

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for a in self.rewrite_log:
            counts[a.rule] = counts.get(a.rule, 0) + 1
        lines = [f"compiled at O{self.options.opt_level} for {self.options.target}"
                 f"{' (from the compile cache)' if self.from_cache else ''}: "
                 f"{len(self.passes)} pass runs, {len(self.rewrite_log)} rule applications, "
                 f"{len(self.sources)} kernel calls"]
        lines += [f"  {n:>4} x {r}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        if getattr(self.options, "tuning", None) is not None or self.tuned:
            of = f" of {self.num_distinct_kernels}" if self.num_distinct_kernels is not None else ""
            lines.append(f"kernels with tuned schedules: {self.num_tuned_kernels}{of}")
            lines += self.tuned_lines()
        return "\n".join(lines)

    # -- the cache's form ---------------------------------------------------------------
    def to_stored(self, module_consts: dict | None = None) -> tuple[dict, dict]:
        """(JSON data, {name: array}) to keep with a cache entry: the graph's text and the
        large constants it names by digest, but those the module itself holds (``module_consts``,
        matched by digest, dtype and shape), which are taken from the module on a hit."""
        from tensorfuse.ir.text import SMALL_CONST, array_digest, print_graph
        graph = self.graph
        held = {}
        for a in (module_consts or {}).values():
            held.setdefault((array_digest(a), a.dtype.str, tuple(a.shape)), True)
        consts, arrays = [], {}
        for g in _graphs(graph):
            for v in g.constants.values():
                a = v.data
                if a is None or a.size <= SMALL_CONST:
                    continue
                key = (array_digest(a), a.dtype.str, tuple(a.shape))
                entry = {"name": v.name, "digest": key[0], "dtype": key[1], "shape": list(key[2])}
                if key not in held:
                    entry["array"] = f"c{len(arrays)}"
                    arrays[entry["array"]] = a
                consts.append(entry)
        data = {"format": REPORT_FORMAT, "graph": print_graph(graph), "constants": consts,
                "llvm_ir": self.llvm_ir,
                "rewrite_log": [{"rule": a.rule, "nodes": list(a.nodes), "created": list(a.created)}
                                for a in self.rewrite_log],
                "passes": [asdict(p) for p in self.passes], "sources": self.sources,
                "layout": self.layout.to_dict() if self.layout is not None else None,
                "tuned": self.tuned, "num_distinct_kernels": self.num_distinct_kernels}
        return data, arrays

    @classmethod
    def from_stored(cls, stored, module, options, lower: Callable[[Any], list]) -> "CompileReport":
        """The report kept with a cache entry (``runtime.cache.StoredReport``) for the loaded
        ``module``; ``lower(graph)`` makes the kernel IR when ``kernels`` is first read. Raises
        ValueError for a report of another format."""
        from tensorfuse.compiler.pipeline import PassRecord
        from tensorfuse.compiler.rewrite import Application
        data = stored.data
        if data.get("format") != REPORT_FORMAT:
            raise ValueError(f"compile report format {data.get('format')!r}, expected {REPORT_FORMAT}")
        log = [Application(a["rule"], list(a["nodes"]), list(a["created"])) for a in data["rewrite_log"]]
        passes = [PassRecord(**p) for p in data["passes"]]

        def load_graph():
            from tensorfuse.ir.text import array_digest, parse_graph
            held = {}
            for a in module._consts.values():
                held.setdefault((array_digest(a), a.dtype.str, tuple(a.shape)), a)
            arrays = {}
            for c in data["constants"]:
                if "array" in c:
                    arrays[c["name"]] = stored.array(c["array"])
                else:
                    arrays[c["name"]] = held[(c["digest"], c["dtype"], tuple(c["shape"]))]
            return parse_graph(data["graph"], constants=arrays)

        layout = None
        if data.get("layout") is not None:
            from tensorfuse.compiler.passes.layout import LayoutReport
            layout = LayoutReport.from_dict(data["layout"])
        return cls(options, data.get("llvm_ir"), log, passes, [list(s) for s in data["sources"]], True,
                   layout=layout, tuned=list(data.get("tuned") or []),
                   num_distinct_kernels=data.get("num_distinct_kernels"),
                   _load_graph=load_graph, _load_kernels=lower)


def _graphs(graph):
    """The graph and, recursively, the graphs in its nodes' attributes (fused function bodies)."""
    from tensorfuse.ir.graph import Graph
    out, stack = [], [graph]
    while stack:
        g = stack.pop()
        out.append(g)
        for n in g.nodes:
            stack.extend(v for v in n.attrs.values() if isinstance(v, Graph))
    return out
