"""``tensorfuse.to_dot``: the fused graph as a Graphviz picture.

Each node of the optimised graph (one kernel: a fused group, or one op) is a cluster
``cluster_<n>`` labelled with its kernel name, its op pattern kind (the fill colour, see
``KIND_COLOURS``) and, given a profile, its median time. Inside a cluster are the IR nodes it
computes (a fused function's body nodes, or the node itself), each labelled with its op, name
and the ONNX nodes behind it; edges follow the values between them, labelled with the shape
where they cross clusters. Graph inputs and outputs are ellipses.

The text is written here (no dependency); rendering uses the ``graphviz`` Python package when
it is installed, else the ``dot`` binary when it is on PATH, else it writes the ``.dot`` file
and says how to render it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from dataclasses import dataclass, field
from typing import Any

__all__ = ["to_dot", "DotGraph", "KIND_COLOURS"]

#: fill colour of a cluster per op pattern kind (``ir.registry.OpPatternKind``)
KIND_COLOURS = {
    "ELEMWISE": "#c8e6c9",
    "BROADCAST": "#a5d6a7",
    "INJECTIVE": "#bbdefb",
    "COMM_REDUCE": "#ffe0b2",
    "OUT_ELEMWISE_FUSABLE": "#f8bbd0",
    "OPAQUE": "#e0e0e0",
}


def _q(s: str) -> str:
    """A DOT double-quoted string (``\\n`` inside stays a line break)."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\\\\n", "\\n") + '"'


@dataclass
class DotGraph:
    """The DOT text of a fused graph (``source``; also ``str()``), with the cluster of each
    graph node (``clusters``: {cluster id: graph node name}). :meth:`write` saves or renders it."""

    source: str
    clusters: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.source

    def write(self, path: str | os.PathLike) -> tuple[str, str]:
        """Write to ``path`` by its extension: ``.dot``/``.gv`` the text; ``.svg`` rendered
        (graphviz package, else the ``dot`` binary); ``.html`` a page holding the SVG. Without
        a renderer, an ``.svg``/``.html`` request writes ``<path>.dot`` instead and warns
        (UserWarning) saying so (and that it replaced a file of that name). Returns
        (the path written, a one-line note for the user). Raises ValueError for another
        extension, OSError (``runtime.outfile.OutputError``) when the file cannot be written,
        e.g. when its folder does not exist (none is created). A symbolic link is written
        through, a device or FIFO written into (``runtime.outfile``)."""
        path = os.fspath(path)
        ext = os.path.splitext(path)[1].lower()
        if ext in (".dot", ".gv"):
            _write_text(path, self.source)
            return path, f"wrote {path} ({_clusters(self.clusters)}); render it with: dot -Tsvg {path} -o " \
                         f"{os.path.splitext(path)[0]}.svg"
        if ext not in (".svg", ".html"):
            raise ValueError(f"graph output must end in .svg, .dot, .gv or .html, got {path!r}")
        svg = render_svg(self.source)
        if svg is None:
            alt = os.path.splitext(path)[0] + ".dot"
            replaced = os.path.lexists(alt)
            _write_text(alt, self.source)
            note = (f"neither the graphviz Python package nor the 'dot' binary is installed, so wrote "
                    f"{alt} instead of {path}{' (it replaced the file that was there)' if replaced else ''}; "
                    f"render it with: dot -Tsvg {alt} -o "
                    f"{os.path.splitext(path)[0]}.svg (apt install graphviz), or paste it into any "
                    f"Graphviz viewer")
            warnings.warn(note, UserWarning, stacklevel=2)     # a caller that ignores the note still hears
            return alt, note
        if ext == ".html":
            svg = svg[svg.find("<svg"):] if "<svg" in svg else svg
            page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tensorfuse fused graph</title>"
                    "</head><body>\n" + svg + "\n</body></html>\n")
            _write_text(path, page)
        else:
            _write_text(path, svg)
        return path, f"wrote {path} ({_clusters(self.clusters)})"


def _clusters(clusters) -> str:
    return f"{len(clusters)} cluster{'' if len(clusters) == 1 else 's'}"


def _write_text(path: str, text: str) -> None:
    """``runtime.outfile.write_text``: a regular file replaced atomically, a symbolic link
    written through, a device or FIFO written into; the folder must exist (OutputError, an
    OSError, otherwise)."""
    from tensorfuse.runtime.outfile import write_text
    write_text(path, text)


def render_svg(source: str) -> str | None:
    """SVG text of DOT ``source``, or None when no renderer is installed."""
    try:
        import graphviz
    except ImportError:
        graphviz = None
    if graphviz is not None:
        try:
            return graphviz.Source(source).pipe(format="svg").decode("utf-8")
        except graphviz.ExecutableNotFound:
            return None
    exe = shutil.which("dot")
    if exe is None:
        return None
    r = subprocess.run([exe, "-Tsvg"], input=source, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"dot failed: {r.stderr.strip()[:300]}")
    return r.stdout


def to_dot(module_or_model: Any, *, profile: Any = None, inputs: dict | None = None,
           opt_level: int = 2, **compile_kw) -> DotGraph:
    """The fused graph of a compiled module as DOT (see the module docstring).

    module_or_model: a ``tensorfuse`` Module (from ``compile``), or a model (path, bytes,
    ``onnx.ModelProto``) compiled here at ``opt_level`` with ``compile_kw``. profile: None (no
    times), True (profile the module now on ``inputs``, default fixed-seed random inputs, and
    label each cluster with its median ms), or a ``Profile`` from ``Module.profile``.
    Returns a :class:`DotGraph`; prints nothing. Raises ValueError for a module without a
    graph (a saved module loaded from a file), and what ``compile`` raises.
    """
    from tensorfuse.ir.registry import find_op

    mod = module_or_model
    if not hasattr(mod, "run") or not hasattr(mod, "calls"):
        from tensorfuse.compiler.driver import compile as tf_compile
        mod = tf_compile(module_or_model, opt_level=opt_level, **compile_kw)
    graph = mod.graph
    if graph is None:
        raise ValueError("this module has no graph IR (it was loaded from a saved file); compile the model "
                         "to draw it")
    if profile is True:
        from tensorfuse.compiler.verify import random_inputs
        profile = mod.profile(**(inputs or random_inputs(mod.input_info)), show=False)
    # a kernel call names the IR nodes it computes: a fused function's body nodes, or the node
    owner: dict[str, str] = {}
    for n in graph.nodes:
        body = n.attrs.get("body") if n.op == "FusedFunction" else None
        owner[n.name] = n.name
        for m in (body.nodes if body is not None else ()):
            owner.setdefault(m.name, n.name)

    def owner_of(names) -> str | None:
        return next((owner[x] for x in names if x in owner), None)

    ms: dict[str, float] = {}
    for row in profile or ():
        o = owner_of(row.ir_nodes)
        if o is not None:
            ms[o] = ms.get(o, 0.0) + row.median_ms
    kernels: dict[str, list[str]] = {}
    for c in mod.calls:
        o = owner_of(c.nodes)
        if o is not None and c.kernel not in kernels.setdefault(o, []):
            kernels[o].append(c.kernel)
    log = getattr(mod, "rewrite_log", None)
    from tensorfuse.runtime.profile import trace_sources

    lines = ["digraph tensorfuse {",
             "  graph [rankdir=TB, fontname=Helvetica, fontsize=11, compound=true, label=" +
             _q(f"{graph.name}: {len(graph.nodes)} kernels; fill = op pattern kind: " +
                ", ".join(f"{k.lower()} {v}" for k, v in KIND_COLOURS.items())) + "];",
             "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=Helvetica, fontsize=10];",
             "  edge [fontname=Helvetica, fontsize=9];"]
    producer: dict[str, str] = {}          # value name -> dot id of the member that writes it
    ids: dict[str, str] = {}

    def nid(kind: str, name: str) -> str:
        key = f"{kind}:{name}"
        if key not in ids:
            ids[key] = f"{kind}{len(ids)}"
        return ids[key]

    for v in graph.inputs:
        i = nid("in", v.name)
        producer[v.name] = i
        text = v.name + "\\n" + str(v.type)
        lines.append(f"  {i} [shape=ellipse, fillcolor=\"#fff9c4\", label={_q(text)}];")
    clusters: dict[str, str] = {}
    edges: list[str] = []
    for k, n in enumerate(graph.nodes):
        body = n.attrs.get("body") if n.op == "FusedFunction" else None
        if body is not None:
            kind = str(n.attrs.get("kind") or "OPAQUE")
            members = list(body.nodes)
        else:
            od = find_op(n.op, n.domain)
            kind = od.kind.name if od is not None else "OPAQUE"
            members = [n]
        cid = f"cluster_{k}"
        clusters[cid] = n.name
        kname = ", ".join(kernels.get(n.name, [])) or "(no kernel)"
        label = f"{kname}  [{kind.lower()}]"
        if n.name in ms:
            label += f"\\n{ms[n.name]:.3f} ms"
        label += f"\\n{n.name}"
        lines.append(f"  subgraph {cid} {{")
        lines.append(f"    graph [style=\"filled,rounded\", fillcolor={_q(KIND_COLOURS.get(kind, '#e0e0e0'))}, "
                     f"label={_q(label)}, tooltip={_q(n.name)}];")
        local: dict[str, str] = {}
        for m in members:
            mid = nid("n", f"{k}/{m.name}")
            src = trace_sources([m.name], log)
            text = f"{m.qualified_op}\\n{m.name}"
            if src != [m.name]:
                shown = src[:3] + ([f"... {len(src) - 3} more"] if len(src) > 3 else [])
                text += "\\n(" + "\\n".join(shown) + ")"
            lines.append(f"    {mid} [label={_q(text)}, tooltip={_q(', '.join(src))}];")
            for v in m.inputs:
                if v is None:
                    continue
                src_id = local.get(v.name) or producer.get(v.name)
                if src_id is None:
                    continue            # a constant
                if v.name in local:
                    edges.append(f"  {src_id} -> {mid};")
                else:
                    edges.append(f"  {src_id} -> {mid} [label={_q(str(list(v.shape)))}];")
            for o in m.outputs:
                if o is not None:
                    local[o.name] = mid
        lines.append("  }")
        for o in n.outputs:
            if o is not None and o.name in local:
                producer[o.name] = local[o.name]
    out_names = list(getattr(graph, "output_names", None) or [v.name for v in graph.outputs])
    for v, shown in zip(graph.outputs, out_names):
        o = nid("out", shown)
        text = shown + "\\n" + str(v.type)
        lines.append(f"  {o} [shape=ellipse, fillcolor=\"#fff9c4\", label={_q(text)}];")
        if v.name in producer:
            edges.append(f"  {producer[v.name]} -> {o};")
    lines += edges
    lines.append("}")
    return DotGraph("\n".join(lines) + "\n", clusters)

