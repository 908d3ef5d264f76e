"""The layout pass: channel-sensitive CNN ops to channels-last (NHWC), for the cuda target
(docs/architecture.md "GPU codegen"; the NHWC ops are in ``ir/ops/layout_nhwc.py``).

What it does, in order:

1. **Convert.** Every 2-D Conv, ``tensorfuse::FusedConv``, MaxPool (without an Indices output
   in use), AveragePool, GlobalAveragePool, GlobalMaxPool and (unfolded) BatchNormalization on
   4-D tensors becomes its NHWC variant (``ConvNHWC`` ...) between two Transposes:
   ``Transpose(perm=[0,2,3,1])`` on the activation inputs (X, and FusedConv's residual Z) and
   ``Transpose(perm=[0,3,1,2])`` on the output, which keeps its value (name and consumers).
   Constant Conv weights are repacked once, here, at compile time, from [M, C/g, KH, KW] to
   [KH, KW, C/g, M] (a non-constant W gets a Transpose(perm=[2,3,1,0]) instead); a per-channel
   constant Z is permuted as a constant.
2. **Push and cancel**, to a fixed point:

   - ``Transpose(Transpose(x, p1), p2)`` becomes x when p1[p2] is the identity (a *cancelled*
     pair: both are logged), else one ``Transpose(x, p1[p2])`` (composed);
   - two Transposes of one value with one perm are merged (the second reads the first);
   - a Transpose inserted here whose permutation only moves axes of size 1 (the [N,C,1,1] <->
     [N,1,1,C] around a global pool) moves no data: it becomes a Reshape;
   - a Transpose ``T(x, p)`` made here is pushed below an op C that reads it when C is
     elementwise or broadcasting (the registry's ``kind <= BROADCAST`` with a ``scalar``:
     Relu, Clip, Add with a residual, Mul by a per-channel constant ...) or a Concat, and each
     other input of C is a constant (permuted at compile time: a [C,1,1] per-channel constant
     becomes [C], rank-lower operands are right-aligned first), a one-element value, or a
     Transpose with the same perm, or any other value of the same rank (a Transpose with the
     inverse perm is put on it, which may merge with or cancel against others). C then computes in x's layout (Concat's axis remapped to
     p[axis]) and one Transpose with perm p follows it. A push is kept only when, after the
     cancellations it allows, it strictly lowers the cost (bytes moved by Transposes, then
     their number, then how far up the graph they sit: :meth:`_Layout.cost`): a push that
     would strand an extra Transpose (a value with a consumer that must stay NCHW) is not
     made, and one that ties in bytes and number is made only when it moves Transposes down
     towards the outputs. So no state comes back and the pass ends: a residual straight from
     a graph input into the Add after a Conv once made the Transpose after the Conv and the
     input's Transpose take turns below that Add until ``MAX_ROUNDS`` (issue 21). A push that
     alone does not lower the cost is still made when up to
     ``LOOKAHEAD`` further pushes of the Transposes of the chain (the one left after C, and
     the pushed one while it has other consumers) bring it down: in
     Conv -> Tanh -> Mul(tanh, conv) at the graph output, the push below Tanh leaves a
     Transpose on each of Mul's inputs, and the push below Mul merges them into one at the
     output, so the tail computes in NHWC and fuses into the conv's group. Such a chain is
     made all at once (the first chain found that pays, tried on copies of the graph).

   Transposes the model has itself are never pushed, changed or turned into Reshapes unless
   they meet one of ours (then the pair is composed or cancelled, which keeps their meaning).
3. **Report.** :class:`LayoutReport` lists the Transposes left (the model's own included, each
   marked with its origin), their bytes and where they are, and every event (inserted,
   cancelled, composed, pushed, reshaped, converted, repacked); ``str(report)`` is a table.

Ops that must stay NCHW (everything else: Reshape, Softmax, Resize, a Conv on 5-D data ...)
read the NCHW value through the output Transpose, which then stays. A graph output keeps its
NCHW layout and value: a Transpose producing it is never removed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.ops.layout_nhwc import NHWC_VARIANTS, TO_NCHW, TO_NHWC, W_TO_HWIO
from tensorfuse.ir.registry import OpPatternKind, find_op, has_scalar, infer_types
from tensorfuse.ir.types import TensorType

DOMAIN = "tensorfuse"
LAYOUTS = ("NCHW", "NHWC")
#: push-and-cancel rounds at most (each round moves Transposes down the graph)
MAX_ROUNDS = 10000
#: pushes a push that adds Transpose bytes may be followed by to pay for itself (push_chain)
LOOKAHEAD = 3
#: graph copies one push_chain search may make (a value with many consumers branches)
MAX_TRIALS = 32


@dataclass
class LayoutEvent:
    """One thing the layout pass did: ``action`` is "converted", "repacked", "inserted",
    "cancelled", "composed", "merged" (a duplicate Transpose of the same value), "pushed" or
    "reshaped"; ``node`` the node it is about (the
    Transpose, or the converted op); ``detail`` a short sentence."""

    action: str
    node: str
    detail: str = ""

    def __str__(self) -> str:
        return f"layout: {self.action:<9} {self.node}  {self.detail}".rstrip()


@dataclass
class TransposeLeft:
    """A Transpose node in the graph after the pass: node and value names, perm, the shape it
    writes, its bytes, ``origin`` ("layout": inserted by the pass, "model": the model's own)
    and ``where`` (e.g. "graph input %x -> ConvNHWC conv1")."""

    node: str
    input: str
    output: str
    perm: list[int]
    shape: tuple[int, ...]
    nbytes: int
    origin: str
    where: str


@dataclass
class LayoutReport:
    """What the layout pass left and did.

    ``layout``: the layout converted to ("NHWC"); ``transposes``: the :class:`TransposeLeft`
    entries; ``count`` and ``bytes``: their number and the bytes they write per run;
    ``events``: the :class:`LayoutEvent` log; ``converted``: {NHWC op name: count}."""

    layout: str = "NHWC"
    transposes: list[TransposeLeft] = field(default_factory=list)
    events: list[LayoutEvent] = field(default_factory=list)
    converted: dict[str, int] = field(default_factory=dict)
    #: (replaced node names, new node names) of each conversion and push, in order: the
    #: pipeline writes them into the rewrite log as rule "layout" applications, so profiles and
    #: ``explain`` trace an NHWC node back to the model's node
    derived: list = field(default_factory=list, repr=False, compare=False)

    @property
    def count(self) -> int:
        return len(self.transposes)

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for t in self.transposes)

    def counts(self) -> dict[str, int]:
        """Events by action."""
        out: dict[str, int] = {}
        for e in self.events:
            out[e.action] = out.get(e.action, 0) + 1
        return out

    def to_dict(self) -> dict:
        """JSON data (the compile cache keeps the report with its entry); :meth:`from_dict` reads it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LayoutReport":
        return cls(d["layout"], [TransposeLeft(**{**t, "shape": tuple(t["shape"])}) for t in d["transposes"]],
                   [LayoutEvent(**e) for e in d["events"]], dict(d["converted"]),
                   [(list(a), list(b)) for a, b in d.get("derived", ())])

    def __str__(self) -> str:
        c = self.counts()
        conv = ", ".join(f"{n} x{k}" for n, k in sorted(self.converted.items())) or "nothing"
        lines = [f"layout {self.layout}: converted {conv}; {c.get('inserted', 0)} Transposes inserted, "
                 f"{c.get('cancelled', 0)} inverse pairs cancelled, {c.get('pushed', 0)} pushes, {c.get('composed', 0)} composed, "
                 f"{c.get('merged', 0)} merged, {c.get('reshaped', 0)} became Reshapes",
                 f"{self.count} Transposes left, {self.bytes} bytes per run"]
        if self.transposes:
            lines.append(f"  {'node':<28} {'perm':<14} {'shape':<20} {'bytes':>10}  {'origin':<6} where")
            for t in self.transposes:
                lines.append(f"  {t.node:<28} {str(t.perm):<14} {str(list(t.shape)):<20} {t.nbytes:>10}  "
                             f"{t.origin:<6} {t.where}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- helpers
def _perm_of(n: Node) -> list[int]:
    from tensorfuse.ir.ops.shape import transpose_perm
    return transpose_perm(n, n.inputs[0].type.rank)


def _inverse(p) -> list[int]:
    return [list(p).index(i) for i in range(len(p))]


def _moves_only_unit_axes(perm, shape) -> bool:
    """Does the permutation keep the order of the axes of size > 1 (so it moves no data)?"""
    big = [a for a in perm if shape[a] != 1]
    return big == sorted(big)


class _Layout:
    def __init__(self, graph: Graph, report: LayoutReport):
        self.g = graph
        self.report = report
        #: names of the Transpose nodes this pass made (their origin in the report)
        self.ours: set[str] = set()

    # -- building -------------------------------------------------------------------------
    def log(self, action: str, node: str, detail: str = "") -> None:
        self.report.events.append(LayoutEvent(action, node, detail))

    def transpose(self, x: Value, perm, out: Value | None = None, why: str = "") -> Node:
        """A new Transpose node (not placed in the node list) of ``x``; ``out`` is the Value it
        defines (a fresh one when None)."""
        g = self.g
        name = g.fresh_node_name("layout_Transpose")
        shape = tuple(x.shape[p] for p in perm)
        if out is None:
            out = Value(g.fresh_name(f"{x.name}_{'nhwc' if list(perm) == list(TO_NHWC) else 't'}"),
                        TensorType(x.dtype, shape))
        assert out.shape == shape, (out.shape, shape)
        n = Node("Transpose", [x], [out], {"perm": [int(p) for p in perm]}, name)
        self.ours.add(name)
        self.log("inserted", name, f"perm {list(perm)} on %{x.name} {why}".rstrip())
        return n

    def users(self) -> dict:
        return self.g.users()

    # -- 1. convert -------------------------------------------------------------------------
    def convertible(self, n: Node, users) -> str | None:
        """The NHWC op name ``n`` converts to, or None."""
        if n.domain not in ("", DOMAIN) or n.op not in NHWC_VARIANTS:
            return None
        if (n.op == "FusedConv") != (n.domain == DOMAIN):
            return None
        x = n.input(0)
        if x is None or x.type.rank != 4 or not n.outputs or n.outputs[0].type.rank != 4:
            return None
        extra = n.outputs[1:]
        outs = {id(v) for v in self.g.outputs}
        if any(users.get(v) or id(v) in outs for v in extra):
            return None                    # MaxPool's Indices are NCHW positions: keep it NCHW
        if n.op in ("Conv", "FusedConv"):
            w = n.input(1)
            if w is None or w.type.rank != 4:
                return None
            z = n.input(3)
            if z is not None and not (z.type.rank == 4 and z.shape == n.outputs[0].shape) and not z.is_const:
                return None
        if n.op == "BatchNormalization" and any(n.input(i) is None for i in range(5)):
            return None
        return NHWC_VARIANTS[n.op]

    def convert_all(self) -> None:
        users = self.users()
        new_nodes: list[Node] = []
        for n in self.g.nodes:
            target = self.convertible(n, users)
            if target is None:
                new_nodes.append(n)
                continue
            new_nodes += self.convert(n, target)
            self.report.converted[target] = self.report.converted.get(target, 0) + 1
        self.g.nodes = new_nodes

    def convert(self, n: Node, target: str) -> list[Node]:
        g = self.g
        out: list[Node] = []
        ins = list(n.inputs)
        tx = self.transpose(ins[0], TO_NHWC, why=f"into {target} {n.name}")
        out.append(tx)
        ins[0] = tx.outputs[0]
        if n.op in ("Conv", "FusedConv"):
            w = ins[1]
            if w.is_const:
                packed = g.add_const(np.ascontiguousarray(np.transpose(w.data, W_TO_HWIO)), f"{w.name}_hwio")
                ins[1] = packed
                self.log("repacked", n.name, f"weights %{w.name} {list(w.shape)} -> %{packed.name} "
                                             f"{list(packed.shape)} [KH, KW, C/g, M]")
            else:
                tw = self.transpose(w, W_TO_HWIO, why=f"weights of {n.name}")
                out.append(tw)
                ins[1] = tw.outputs[0]
            z = n.input(3)
            if z is not None:
                if z.is_const:       # Z' with Transpose(Z', [0,3,1,2]) = Z, i.e. Z in NHWC
                    ins[3] = self.permuted_const(z, TO_NCHW, 4)
                else:
                    tz = self.transpose(z, TO_NHWC, why=f"residual of {target} {n.name}")
                    out.append(tz)
                    ins[3] = tz.outputs[0]
        y = n.outputs[0]
        y_nhwc = Value(g.fresh_name(f"{y.name}_nhwc"), TensorType(y.dtype, tuple(y.shape[p] for p in TO_NHWC)))
        conv = Node(target, ins, [y_nhwc], dict(n.attrs), g.fresh_name(f"{n.name}_nhwc"), DOMAIN)
        (t,) = infer_types(conv)[:1]
        if t != y_nhwc.type:
            raise AssertionError(f"{target} {conv.name} infers {t}, expected {y_nhwc.type}")
        self.log("converted", conv.name, f"{n.qualified_op} {n.name} -> {DOMAIN}::{target}")
        self.report.derived.append(([n.name], [conv.name]))
        out.append(conv)
        out.append(self.transpose(y_nhwc, TO_NCHW, out=y, why=f"out of {target} {conv.name}"))
        return out

    def permuted_const(self, c: Value, perm, rank: int, keep_rank: bool = False) -> Value:
        """Constant ``c`` (right-aligned against rank ``rank``) as the operand u' with
        Transpose(u', perm) broadcast-equal to it; leading 1s dropped (down to rank 1) unless
        ``keep_rank`` (Concat's operands keep the rank)."""
        a = c.data.reshape((1,) * (rank - c.type.rank) + tuple(c.shape))
        b = np.ascontiguousarray(np.transpose(a, _inverse(perm)))
        while not keep_rank and b.ndim > 1 and b.shape[0] == 1:
            b = b.reshape(b.shape[1:])
        if b.shape == tuple(c.shape) and np.array_equal(b, c.data):
            return c
        return self.g.add_const(b, f"{c.name}_{'nhwc' if list(perm) == list(TO_NCHW) else 't'}")

    # -- 2. cancel, compose, reshape ----------------------------------------------------------
    def simplify_once(self, reshape: bool = False) -> bool:
        """One sweep of merging, cancelling and composing Transposes (and with ``reshape``,
        turning ours that move only size-1 axes into Reshapes: done last, so that pairs cancel
        first)."""
        g = self.g
        changed = False
        produced = {id(o): n for n in g.nodes for o in n.outputs}
        outs = {id(v) for v in g.outputs}
        ins = {id(v) for v in g.inputs} | {id(v) for v in g.constants.values()}
        new_nodes = []
        seen: dict[tuple, Node] = {}        # (input, perm) -> the first Transpose computing it
        for n in g.nodes:
            if n.op != "Transpose" or n.domain not in ("", "ai.onnx"):
                new_nodes.append(n)
                continue
            key = (id(n.inputs[0]), tuple(_perm_of(n)))
            first = seen.get(key)
            if first is not None and (n.name in self.ours or first.name in self.ours) and id(n.outputs[0]) not in outs:
                g.replace_all_uses(n.outputs[0], first.outputs[0])
                self.log("merged", n.name, f"computes what {first.name} does: %{n.outputs[0].name} is "
                                           f"%{first.outputs[0].name}")
                changed = True
                continue
            src = produced.get(id(n.inputs[0]))
            if src is not None and src.op == "Transpose" and src.domain in ("", "ai.onnx") and \
                    (n.name in self.ours or src.name in self.ours):
                p1, p2 = _perm_of(src), _perm_of(n)
                q = [p1[j] for j in p2]
                x, y = src.inputs[0], n.outputs[0]
                if q == list(range(len(q))):
                    if id(y) in outs and (id(x) in ins or id(x) in outs):
                        new_nodes.append(n)        # a graph output stays its own value
                        continue
                    g.replace_all_uses(y, x)
                    # one event per inverse pair: src may pair with several consumers, and stays
                    # while any other use is left
                    self.log("cancelled", n.name, f"perm {p2} after {src.name} perm {p1}: %{y.name} is %{x.name}")
                    changed = True
                    continue                      # n is gone; src dies with DCE if unused
                n.inputs = [x]
                n.attrs["perm"] = q
                self.ours.add(n.name)
                self.log("composed", n.name, f"with {src.name}: perm {p1} then {p2} = {q}")
                changed = True
                new_nodes.append(n)
                seen.setdefault((id(x), tuple(q)), n)
                continue
            if reshape and n.name in self.ours and _moves_only_unit_axes(_perm_of(n), n.inputs[0].shape):
                shape = g.add_const(np.array(n.outputs[0].shape, np.int64), f"{n.name}_shape")
                r = Node("Reshape", [n.inputs[0], shape], n.outputs, {}, g.fresh_node_name("layout_Reshape"))
                self.log("reshaped", n.name, f"perm {_perm_of(n)} on {list(n.inputs[0].shape)} moves only "
                                             f"size-1 axes: {r.name}")
                new_nodes.append(r)
                changed = True
                continue
            new_nodes.append(n)
            seen.setdefault(key, n)
        g.nodes = new_nodes
        if changed:
            from tensorfuse.compiler.passes.dce import eliminate_dead_nodes
            eliminate_dead_nodes(g)
        return changed

    def simplify(self, reshape: bool = False) -> None:
        for _ in range(MAX_ROUNDS):
            if not self.simplify_once(reshape):
                return

    # -- 2. push ----------------------------------------------------------------------------
    def push_plan(self, t_node: Node, c: Node, produced) -> list | None:
        """How C's inputs change when the Transpose ``t_node`` is pushed below it: a list with,
        per input, ("same", v) / ("src", x) / ("const", v) entries, or None when C cannot take
        the push."""
        if c.domain not in ("", "ai.onnx") or len(c.outputs) != 1:
            return None
        t = t_node.outputs[0]
        p = _perm_of(t_node)
        r = len(p)
        od = find_op(c.op, c.domain)
        if od is None:
            return None
        is_concat = c.op == "Concat"
        if not is_concat and not (od.kind <= OpPatternKind.BROADCAST and has_scalar(c, od)):
            return None
        if c.outputs[0].type.rank != r:
            return None
        plan = []
        for v in c.inputs:
            if v is None:
                plan.append(("same", None))
            elif v is t:
                plan.append(("src", t_node.inputs[0]))
            elif (pn := produced.get(id(v))) is not None and pn.op == "Transpose" and \
                    pn.domain in ("", "ai.onnx") and _perm_of(pn) == p:
                plan.append(("src", pn.inputs[0]))
            elif v.type.numel == 1 and v.type.rank <= r and not is_concat:
                plan.append(("same", v))
            elif v.is_const and v.type.rank <= r and (not is_concat or v.type.rank == r):
                plan.append(("const", v))
            elif v.type.rank == r:
                plan.append(("insert", v))     # a Transpose on it: kept only if it pays (worth)
            else:
                return None
        return plan

    def push(self, t_node: Node, c: Node, plan) -> None:
        g = self.g
        p = _perm_of(t_node)
        r = len(p)
        ins, before = [], []
        for kind, v in plan:
            if kind == "insert":
                tv = self.transpose(v, _inverse(p), why=f"into {c.op} {c.name}, pushed below it")
                before.append(tv)
                ins.append(tv.outputs[0])
            else:
                ins.append(v if kind in ("same", "src") else self.permuted_const(v, p, r, c.op == "Concat"))
        attrs = dict(c.attrs)
        if c.op == "Concat":
            axis = int(c.attr("axis"))
            axis = axis + r if axis < 0 else axis
            attrs["axis"] = int(p[axis])
        y = c.outputs[0]
        y2 = Value(g.fresh_name(f"{y.name}_t"), TensorType(y.dtype, tuple(y.shape[i] for i in _inverse(p))))
        c2 = Node(c.op, ins, [y2], attrs, g.fresh_name(f"{c.name}_t"), c.domain)
        (ty,) = infer_types(c2)[:1]
        if ty != y2.type:
            raise AssertionError(f"pushing {t_node.name} below {c.name}: {ty} != {y2.type}")
        tn = self.transpose(y2, p, out=y, why=f"after {c.op} {c2.name}")
        i = g.nodes.index(c)
        g.nodes[i:i + 1] = before + [c2, tn]
        self.log("pushed", t_node.name, f"below {c.op} {c.name} (now {c2.name}, followed by {tn.name})")
        self.report.derived.append(([c.name], [c2.name]))
        from tensorfuse.compiler.passes.dce import eliminate_dead_nodes
        eliminate_dead_nodes(g)

    def cost(self) -> tuple[int, int, int]:
        """(bytes written by Transposes, their number, minus the sum of their depths): a push
        is kept only when it makes this tuple strictly smaller (compared in order). A
        Transpose that moves only size-1 axes costs nothing (it becomes a Reshape).

        The depth of a Transpose is the number of ops other than Transposes on the longest
        path from a graph input or constant to it (Transposes pass their input's depth on).
        Pushes only move Transposes (the ops pushed below are re-made with the same inputs up
        to Transposes and permuted constants), so an op's depth never changes, and the sum is
        at most the number of Transposes times the graph's depth. With equal bytes and number
        a push is thus kept only when it moves Transposes down towards the outputs: a tie that
        moves one down and another up (a residual from a graph input: the Transpose after a
        Conv pushed below the Add, then the input's Transpose pushed below it back, ...) is not,
        no state comes back, and the pass ends (issue 21)."""
        b = n = d = 0
        depth: dict[int, int] = {}
        for node in self.g.nodes:
            if node.op == "Transpose":
                x = node.inputs[0]
                dx = depth.get(id(x), 0)
                depth[id(node.outputs[0])] = dx
                if not _moves_only_unit_axes(_perm_of(node), x.shape):
                    v = node.outputs[0]
                    b += v.type.numel * v.dtype.itemsize
                    n += 1
                    d += dx
                continue
            dn = 1 + max((depth.get(id(v), 0) for v in node.inputs if v is not None), default=0)
            for o in node.outputs:
                depth[id(o)] = dn
        return b, n, -d

    def push_all(self) -> bool:
        """Try each push once per round; keep a push (with its follow-ups, :meth:`push_chain`)
        when, after the cancellations it allows, it strictly lowers :meth:`cost`. Each round
        keeps one (or ends the pass); the cost takes finitely many values (see :meth:`cost`) and
        never comes back, so the rounds end (``MAX_ROUNDS`` is a guard only)."""
        changed = False
        for _ in range(MAX_ROUNDS):
            done = False
            produced = {id(o): n for n in self.g.nodes for o in n.outputs}
            users = self.users()
            for t_node in list(self.g.nodes):
                if t_node.op != "Transpose" or t_node.name not in self.ours:
                    continue
                for c in users.get(t_node.outputs[0], []):
                    if self.push_plan(t_node, c, produced) is None:
                        continue
                    chain = self.push_chain(t_node, c)
                    if chain is None:
                        continue
                    for value, consumer in chain:
                        if not self.push_step(value, consumer):      # the trial said it can
                            raise AssertionError(f"layout: push of %{value} below {consumer} "
                                                 f"no longer applies")
                        self.simplify()
                    done = changed = True
                    break
                if done:
                    break
            if not done:
                return changed
        return changed

    def push_step(self, value: str, consumer: str) -> bool:
        """Push the Transpose of ours that produces the value named ``value`` below the node
        named ``consumer``; False (nothing changed) when there is no such push."""
        produced = {o.name: n for n in self.g.nodes for o in n.outputs}
        tn = produced.get(value)
        if tn is None or tn.op != "Transpose" or tn.name not in self.ours:
            return False
        try:
            cn = self.g.node(consumer)
        except KeyError:
            return False
        if not any(v is tn.outputs[0] for v in cn.inputs):
            return False
        plan = self.push_plan(tn, cn, {id(o): n for n in self.g.nodes for o in n.outputs})
        if plan is None:
            return False
        self.push(tn, cn, plan)
        return True

    def trial(self) -> "_Layout":
        """A copy of the graph to try pushes on (its node and value names are the same, and
        pushes made on it in the same order make the same names)."""
        t = _Layout(self.g.copy(), LayoutReport())
        t.ours = set(self.ours)
        return t

    def push_chain(self, t_node: Node, c: Node, depth: int = LOOKAHEAD) -> list | None:
        """The pushes to make, as [(value name, consumer node name)], starting with ``t_node``
        below ``c``, or None when no such chain pays. A push alone may add a Transpose that the
        next ones take away: Conv -> Tanh -> Mul(tanh, conv) needs the Transpose pushed below
        Tanh (now one on each of Mul's inputs: more bytes) and then below Mul (both inputs come
        through the same perm: one Transpose left, after Mul). So when the push alone does not
        lower :meth:`cost`, the search goes on, at most ``depth`` more pushes, with the
        Transposes of the chain: the one of ``t_node``'s value (while it has consumers left)
        and the one after each op pushed below, each below any of its consumers; the first
        chain whose end costs strictly less than the start (the rule of :meth:`push_all`) is
        returned. Each step is tried on a copy of the graph, ``MAX_TRIALS`` copies at most."""
        trial = self.trial()
        before = trial.cost()
        return trial._chain(t_node.outputs[0].name, c.name, [t_node.outputs[0].name], before, depth,
                            [MAX_TRIALS - 1])

    def _chain(self, value: str, consumer: str, frontier: list, before: tuple[int, int, int], depth: int,
               budget: list) -> list | None:
        """Push on this trial copy (mutated), then search on copies of it. ``frontier``: the
        names of the values whose Transposes the chain may push next; ``budget``: [copies
        left], shared by the whole search."""
        try:
            y = self.g.node(consumer).outputs[0].name
        except (KeyError, IndexError):
            return None
        if not self.push_step(value, consumer):
            return None
        self.simplify()
        if self.cost() < before:              # strictly: see cost()
            return [(value, consumer)]
        if depth <= 0:
            return None
        # C's output keeps its value, now defined by the Transpose after C: it may go further
        frontier = frontier + [y]
        produced = {o.name: n for n in self.g.nodes for o in n.outputs}
        users = self.users()
        ids = {id(o): n for n in self.g.nodes for o in n.outputs}
        for v in reversed(frontier):           # the newest Transpose first
            tn = produced.get(v)
            if tn is None or tn.op != "Transpose" or tn.name not in self.ours:
                continue
            for u in users.get(tn.outputs[0], []):
                if self.push_plan(tn, u, ids) is None:
                    continue
                if budget[0] <= 0:
                    return None
                budget[0] -= 1
                rest = self.trial()._chain(v, u.name, frontier, before, depth - 1, budget)
                if rest is not None:
                    return [(value, consumer)] + rest
        return None

    # -- 3. report ----------------------------------------------------------------------------
    def fill_report(self) -> None:
        g = self.g
        users = self.users()
        produced = {id(o): n for n in g.nodes for o in n.outputs}
        ins = {id(v) for v in g.inputs}
        outs = {id(v) for v in g.outputs}
        for n in g.nodes:
            if n.op != "Transpose":
                continue
            x, y = n.inputs[0], n.outputs[0]
            src = "graph input" if id(x) in ins else "constant" if x.is_const else \
                f"{produced[id(x)].qualified_op} {produced[id(x)].name}" if id(x) in produced else "?"
            dst = [f"{u.qualified_op} {u.name}" for u in users.get(y, [])]
            if id(y) in outs:
                dst.append("graph output")
            where = f"{src} %{x.name} -> {', '.join(dst) or 'nothing'}"
            self.report.transposes.append(TransposeLeft(
                n.name, x.name, y.name, _perm_of(n), tuple(y.shape), y.type.numel * y.dtype.itemsize,
                "layout" if n.name in self.ours else "model", where))


def layout_transform(graph: Graph, layout: str = "NHWC") -> LayoutReport:
    """Convert ``graph`` in place to ``layout`` ("NHWC"; "NCHW" changes nothing) as the module
    docstring describes, and return the :class:`LayoutReport`. The graph stays valid and
    computes the same values (graph outputs keep their NCHW layout, names and types).
    Raises ValueError for an unknown layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    report = LayoutReport(layout)
    st = _Layout(graph, report)
    if layout == "NHWC":
        st.convert_all()
        st.simplify()
        st.push_all()
        st.simplify(reshape=True)
        from tensorfuse.compiler.passes.dce import eliminate_dead_nodes
        eliminate_dead_nodes(graph)
    st.fill_report()
    return report


class LayoutPass:
    """The pipeline's pass object: ``LayoutPass("NHWC")(graph) -> changed``; ``report`` is the
    :class:`LayoutReport` of the last run."""

    def __init__(self, layout: str = "NHWC", log: list | None = None):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.report: LayoutReport | None = None
        #: the pipeline's rewrite log: each conversion and push is appended as a rule "layout"
        #: ``compiler.rewrite.Application`` (matched: the replaced node, created: the new one)
        self.log = log

    def __call__(self, graph: Graph) -> bool:
        self.report = layout_transform(graph, self.layout)
        if self.log is not None:
            from tensorfuse.compiler.rewrite import Application
            self.log.extend(Application("layout", list(a), list(b)) for a, b in self.report.derived)
        return bool(self.report.events)
