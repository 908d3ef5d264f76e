"""Printing kernel IR as a small Python-like script (docs/architecture.md, IR level 3)."""
from __future__ import annotations

from .kernel import FMA, Concat, DotAcc, Shuffle, Barrier, Bin, Broadcast, Ramp, Buffer, Cast, Const, For, If, Kernel, Load, Lookup, Prefetch, TileOp, Select, Store, Un, Var

_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rem": "%", "lt": "<", "le": "<=",
        "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&", "or": "|", "xor": "^",
        "shl": "<<", "shr": ">>"}


def print_expr(e) -> str:
    if isinstance(e, Const):
        return repr(e.value) if e.dtype.value in ("i64", "f32", "bool") else f"{e.dtype.value}({e.value!r})"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        if e.lanes > 1:
            st = f" : {e.stride}" if e.stride != 1 else ""
            return f"{e.buf.name}[{print_expr(e.index)} : +{e.lanes}{st}]"
        return f"{e.buf.name}[{print_expr(e.index)}]"
    if isinstance(e, Ramp):
        return f"ramp({print_expr(e.base)}, {e.lanes})"
    if isinstance(e, Broadcast):
        return f"broadcast({print_expr(e.a)}, {e.lanes})"
    if isinstance(e, Shuffle):
        return f"shuffle({print_expr(e.a)}, {print_expr(e.b)}, [{', '.join(map(str, e.mask))}])"
    if isinstance(e, Concat):
        isa = f", {e.isa}" if e.isa else ""
        return f"concat({', '.join(print_expr(p) for p in e.parts)}{isa})"
    if isinstance(e, DotAcc):
        isa = f", {e.isa}" if e.isa else ""
        return f"dot_{e.packing}({print_expr(e.acc)}, {print_expr(e.a)}, {print_expr(e.b)}{isa})"
    if isinstance(e, FMA):
        return f"fma({print_expr(e.a)}, {print_expr(e.b)}, {print_expr(e.c)})"
    if isinstance(e, Bin):
        if e.op in _SYM:
            return f"({print_expr(e.a)} {_SYM[e.op]} {print_expr(e.b)})"
        return f"{e.op}({print_expr(e.a)}, {print_expr(e.b)})"
    if isinstance(e, Un):
        return f"{e.op}({print_expr(e.a)})"
    if isinstance(e, Cast):
        t = e.dtype.value + (f"x{e.lanes}" if e.lanes > 1 else "")
        return f"{t}({print_expr(e.a)})"
    if isinstance(e, Select):
        return f"select({print_expr(e.cond)}, {print_expr(e.a)}, {print_expr(e.b)})"
    if isinstance(e, Lookup):
        # the contents' digest: kernels that differ only in their table print differently (the
        # kernel cache and deduplication key on this text)
        return f"table<{e.dtype.value} x {len(e.table)} #{e.digest}>[{print_expr(e.index)}]"
    if hasattr(e, "print_with"):        # a backend's intrinsic expression (codegen/cuda/mma.py)
        return e.print_with(print_expr)
    raise TypeError(f"not an expression: {e!r}")


def _print_body(stmts, depth, out):
    pad = "  " * depth
    for s in stmts:
        if isinstance(s, For):
            kind = "" if s.kind == "serial" else s.kind + " "
            if s.role == "reduce" and s.kind == "serial":
                kind = "reduce "
            start = print_expr(s.start)
            cm = f"    # {s.comment}" if s.comment else ""
            out.append(f"{pad}{kind}for {s.var.name} in {start}..{print_expr(s.extent)}:{cm}")
            _print_body(s.body, depth + 1, out)
        elif isinstance(s, Store):
            span = f" : +{s.value.lanes}" if s.value.lanes > 1 else ""
            span += f" : {s.stride}" if s.value.lanes > 1 and s.stride != 1 else ""
            out.append(f"{pad}{s.buf.name}[{print_expr(s.index)}{span}] = {print_expr(s.value)}")
        elif isinstance(s, If):
            out.append(f"{pad}if {print_expr(s.cond)}:")
            _print_body(s.then, depth + 1, out)
            if s.orelse:
                out.append(f"{pad}else:")
                _print_body(s.orelse, depth + 1, out)
        elif isinstance(s, Barrier):
            out.append(f"{pad}barrier()")
        elif isinstance(s, Prefetch):
            out.append(f"{pad}prefetch {s.buf.name}[{print_expr(s.index)}] (locality {s.locality})")
        elif isinstance(s, TileOp):
            if s.op == "config":
                out.append(f"{pad}tile_config {', '.join(f'tmm{i}={r}x{c}B' for i, (r, c) in enumerate(s.shapes))}")
            elif s.op in ("load", "store"):
                arrow = "<-" if s.op == "load" else "->"
                out.append(f"{pad}tile_{s.op} tmm{s.tiles[0]} {arrow} {s.buf.name}[{print_expr(s.index)} + r*{s.stride}] "
                           f"({s.rows} x {s.colsb}B)")
            elif s.op in ("dpbusd", "dpbsud"):
                c, a, b = s.tiles
                out.append(f"{pad}tmm{c} += {s.op}(tmm{a}, tmm{b})")
            else:
                out.append(f"{pad}tile_{s.op}{' tmm%d' % s.tiles[0] if s.tiles else ''}")
        else:
            raise TypeError(f"not a statement: {s!r}")


def _buf(b: Buffer) -> str:
    return f"{b.name}: {b.dtype.value}[{','.join(map(str, b.shape))}]"


def _knob_text(v) -> str:
    return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)


def print_kernel(k: Kernel) -> str:
    head = f"kernel {k.name}({', '.join(_buf(b) for b in k.params)}):"
    out = [head + (f"    # {k.comment}" if k.comment else "")]
    if k.schedule:
        knobs = ", ".join(f"{n}={_knob_text(v)}" for n, v in k.knobs.items())
        out.append(f"  # schedule {k.schedule}" + (f" {{{knobs}}}" if knobs else ""))
    if k.launch is not None:
        out.append(f"  launch {k.launch}")
    for b in k.locals:
        out.append(f"  {'shared' if b.scope == 'shared' else 'local'} {_buf(b)}")
    _print_body(k.body, 1, out)
    return "\n".join(out) + "\n"
