"""fuse_ops: group what remains after the fusion catalogue into fused functions, one kernel each
(docs/architecture.md "Grouping (fuse_ops)"; TVM's FuseOps in spirit).

Grouping asks the registry only (``OpDef.kind``, ``OpDef.scalar``); it keeps no op names:

- An **elementwise op** here is a one-output op of kind ELEMWISE or BROADCAST with a ``scalar``
  function. Chains of them fuse into one group: one loop nest over the group's output shape,
  each external input loaded with broadcasting.
- An **anchor** is an op of kind OUT_ELEMWISE_FUSABLE (Conv, ConvTranspose, MatMul, Gemm, the
  pools, FusedConv/FusedMatMul/FusedGemm ...): its lowering applies ``ctx.apply_epilogue``.
  Elementwise ops after it join its epilogue when each keeps the anchor's output type (dtype
  and shape), so the epilogue runs on the value the anchor is about to store; the shape alone
  for an anchor with ``OpDef.epilogue_casts`` (a QuantizeLinear after an integer conv). The anchor's own
  value may have other consumers (or be a graph output): the epilogue then stores it too, in
  the same kernel (TVM requires a single consumer instead; storing it costs no extra pass over
  memory). An elementwise op next to both an anchored group and loop groups joins the anchor
  (the anchor's output is the larger tensor).
- An **injective mover** (``OpDef.index_map``: Transpose, Slice, Reshape/Flatten/Squeeze/
  Unsqueeze, one data input, the others compile-time constants) joins the loop group of its
  data input under the rule an elementwise op follows (same shape, or every value of the group
  consumed inside), and starts a loop group otherwise, so the elementwise ops after it can
  join: ``Exp -> Transpose -> Add`` is one kernel, its lowering reading Exp's operand at the
  transposed index. A mover never joins an anchor's epilogue (the epilogue runs at the
  anchor's output index). Its constant parameters (a Reshape's shape) are constants of the
  body, not inputs of the fused node.
- A **reduction with a prologue**: an op with ``OpDef.prologue`` (Softmax, LogSoftmax,
  LayerNormalization, the Reduce ops) whose input 0 is computed by an elementwise loop group
  that nothing else reads joins that group as its anchor and last node (``Mul -> Softmax``,
  ``Pow -> ReduceMean``): the prologue is recomputed at each element the reduction reads, never
  stored (:meth:`_Planner.take_prologue` has the conditions: flat-addressable values only).
- Every other op (other injective ops, reductions, opaque) stands alone.
- A value used outside its group, or a graph output, is materialised: it becomes an output of
  the group's fused function. Materialised values of a loop group all have the group's shape
  (a value before a mover with another shape is therefore never materialised: the mover then
  starts a group of its own);
  a loop group whose values are all consumed inside may widen to a larger broadcast shape (a
  mask computed at [1,1,1,S] then added to [B,H,S,S] scores), its small values then recomputed
  per element.
- Groups never merge into a cycle (a path that leaves a group and comes back through other
  groups): each merge is checked on the graph of groups.

A group of two or more nodes becomes a ``tensorfuse::FusedFunction`` node whose ``body`` graph
holds the group's nodes (defined and lowered in ``ir/ops/fused_function.py``); a group of one
stays a plain node; its kernel call names the body's nodes, so profiles trace kernels
back to the model. ``fuse_ops(graph, log)`` can also log each group like a rule application
(``fuse_ops: members -> fused node``); the pipeline keeps its rule log for rules.
"""
from __future__ import annotations

import numpy as np

from tensorfuse.ir.graph import Graph, Node, Value
from tensorfuse.ir.ops.fused import DOMAIN
from tensorfuse.ir.registry import OpPatternKind, find_op, has_scalar, is_elementwise

__all__ = ["fuse_ops", "FuseOps", "Group", "plan_groups"]


class Group:
    """A set of nodes that becomes one kernel: ``nodes`` in graph order, the ``anchor`` node
    (or None for a loop group), ``shape`` (loop groups: the shape of their materialised
    values; anchored groups: the anchor's output shape) and ``kind`` (the largest op pattern
    kind of the members; OUT_ELEMWISE_FUSABLE with an anchor)."""

    __slots__ = ("nodes", "anchor", "shape", "kind", "fusable")

    def __init__(self, node: Node, kind: OpPatternKind, fusable: bool, anchor: Node | None = None):
        self.nodes = [node]
        self.anchor = anchor
        self.shape = tuple(node.outputs[0].shape) if node.outputs else ()
        self.kind = kind
        self.fusable = fusable          # loop group of elementwise ops, or an anchored group

    def __repr__(self) -> str:
        return f"<Group {self.kind.name} anchor={self.anchor and self.anchor.name} {[n.name for n in self.nodes]}>"


def _is_elementwise(n: Node, od) -> bool:
    return is_elementwise(n, od)


def _is_mover(n: Node, od) -> bool:
    """An injective op that moves the elements of one data input (``OpDef.index_map``: Transpose,
    Slice, the Reshape family), its other inputs compile-time constants: it may sit inside a
    loop group, whose lowering reads its input at the mapped index."""
    return (od is not None and od.kind == OpPatternKind.INJECTIVE and od.index_map is not None
            and len(n.outputs) == 1 and bool(n.inputs) and n.inputs[0] is not None
            and all(v is None or v.const_value() is not None for v in n.inputs[1:])
            and n.outputs[0].type.numel > 0)


def _is_anchor(n: Node, od) -> bool:
    return od is not None and od.kind == OpPatternKind.OUT_ELEMWISE_FUSABLE and od.lower is not None \
        and len(n.outputs) >= 1


class _Planner:
    def __init__(self, graph: Graph):
        self.g = graph
        self.pos = {id(n): i for i, n in enumerate(graph.nodes)}
        self.users = graph.users()
        self.graph_outputs = {id(v) for v in graph.outputs}
        self.group_of: dict[int, Group] = {}

    # -- queries ------------------------------------------------------------------------------
    def consumers(self, v: Value) -> list[Node]:
        return self.users.get(v, [])

    def closed(self, grp: Group, extra: Node) -> bool:
        """Every value of ``grp`` is read only inside ``grp`` or by ``extra``, none a graph output."""
        members = {id(m) for m in grp.nodes} | {id(extra)}
        return all(id(o) not in self.graph_outputs and all(id(u) in members for u in self.consumers(o))
                   for m in grp.nodes for o in m.outputs)

    def makes_cycle(self, groups: list[Group], n: Node) -> bool:
        """Whether merging ``groups`` and ``n`` would create a path that leaves the merged group
        and comes back into it through other nodes or groups (the group graph must stay a DAG).
        Only nodes before ``n`` can lie on such a path: they are grouped already."""
        members = {id(m) for grp in groups for m in grp.nodes} | {id(n)}
        limit = self.pos[id(n)]
        seen: set[int] = {id(grp) for grp in groups}
        stack = [u for grp in groups for m in grp.nodes for o in m.outputs for u in self.consumers(o)
                 if id(u) not in members]
        while stack:
            x = stack.pop()
            if self.pos[id(x)] >= limit:
                continue
            gx = self.group_of[id(x)]
            if id(gx) in seen:
                continue
            seen.add(id(gx))
            for m in gx.nodes:
                for o in m.outputs:
                    for u in self.consumers(o):
                        if id(u) in members:
                            return True
                        stack.append(u)
        return False

    def can_join_anchor(self, grp: Group, n: Node) -> bool:
        a = grp.anchor
        out = a.outputs[0]
        if n.outputs[0].type != out.type:
            od = find_op(a.op, a.domain)
            # an anchor that applies its epilogue at the store takes another dtype of its shape
            if not (od.epilogue_casts and n.outputs[0].shape == out.shape):
                return False
        # n may read the anchor's first output and epilogue values, not the anchor's other outputs
        epilogue_values = {id(out)} | {id(m.outputs[0]) for m in grp.nodes[1:]}
        for v in n.inputs:
            if v is not None and v.producer is not None and self.group_of.get(id(v.producer)) is grp \
                    and id(v) not in epilogue_values:
                return False
        return True

    def can_join_loop(self, grp: Group, n: Node) -> bool:
        return grp.shape == tuple(n.outputs[0].shape) or self.closed(grp, n)

    # -- planning -----------------------------------------------------------------------------
    def merge(self, groups: list[Group], n: Node) -> None:
        target = groups[0]
        for grp in groups[1:]:
            target.nodes += grp.nodes
            target.kind = max(target.kind, grp.kind)
        target.nodes.append(n)
        if len(groups) > 1:
            target.nodes.sort(key=lambda m: self.pos[id(m)])
            if target.anchor is not None and target.nodes[0] is not target.anchor:
                # side chains (:meth:`side_chains`) precede the anchor in the graph but do not
                # depend on it: the body starts with the anchor, as its lowering requires
                target.nodes.remove(target.anchor)
                target.nodes.insert(0, target.anchor)
        od = find_op(n.op, n.domain)
        if target.anchor is None:
            target.kind = max(target.kind, od.kind)
            target.shape = tuple(n.outputs[0].shape)
        for m in target.nodes:
            self.group_of[id(m)] = target

    def plan(self) -> list[Group]:
        order: list[Group] = []
        for n in self.g.nodes:
            od = find_op(n.op, n.domain)
            if _is_anchor(n, od):
                grp = Group(n, OpPatternKind.OUT_ELEMWISE_FUSABLE, True, anchor=n)
            elif _is_elementwise(n, od):
                if self.join(n):
                    continue
                grp = Group(n, od.kind, True)
            elif _is_mover(n, od):
                if self.join(n, loops_only=True):
                    continue
                grp = Group(n, od.kind, True)
            elif self.take_prologue(n, od):
                continue
            else:
                grp = Group(n, od.kind if od is not None else OpPatternKind.OPAQUE, False)
            self.group_of[id(n)] = grp
            order.append(grp)
        seen: set[int] = set()
        out = []
        for grp in order:     # merged groups live on in their first member's Group object
            grp = self.group_of[id(grp.nodes[0])]
            if id(grp) not in seen:
                seen.add(id(grp))
                out.append(grp)
        return out

    def widening_read(self, n: Node) -> bool:
        """Whether ``n`` is a DequantizeLinear of an 8-bit value (per tensor) whose float result
        only elementwise nodes read (no graph output): in the producer's epilogue it would be
        stored as float, 4x the bytes of the 8-bit value (a quantized ResNet block's output,
        which the next block's residual Add reads as float: 2x the time of onnxruntime's
        QLinearConv + QLinearAdd for resnet50's 64->256 1x1 convs). Kept out of the producer,
        it forms a loop group that the consumer's anchor takes as a side chain
        (:meth:`side_chains`): the producer stores the 8-bit value, the consumer reads it and
        dequantizes it in its epilogue."""
        if n.op != "DequantizeLinear" or n.domain or n.inputs[0].dtype.itemsize != 1:
            return False
        x = n.inputs[0]
        if x.producer is None or any(p is not None and p.type.numel != 1 for p in n.inputs[1:]):
            return False
        # the float value itself must be storable nowhere: no graph output, and every reader
        # elementwise (a consumer's epilogue or loop can recompute it there)
        y = n.outputs[0]
        return id(y) not in self.graph_outputs and all(_is_elementwise(u, find_op(u.op, u.domain))
                                                       for u in self.consumers(y))

    def read_by_epilogue(self, n: Node, depth: int = 8) -> bool:
        """Whether a reader of ``n``'s value also reads a value an anchor computes (directly or
        through at most ``depth`` elementwise nodes): that reader will join the anchor's
        epilogue, which can take ``n`` as a side chain."""
        out = n.outputs[0]

        def from_anchor(v, d):
            p = v.producer if v is not None else None
            if p is None or d < 0:
                return False
            od = find_op(p.op, p.domain)
            if _is_anchor(p, od):
                return True
            return _is_elementwise(p, od) and any(from_anchor(u, d - 1) for u in p.inputs if u is not None)
        return any(from_anchor(v, depth) for u in self.consumers(out) for v in u.inputs if v is not None and v is not out)

    def epilogue_of_producer(self, n: Node) -> bool:
        """Whether widening read ``n`` (:meth:`widening_read`) and all its readers can join the
        epilogue of the anchor group that computes its 8-bit input (a quantized residual block's
        last conv: Q -> DQ -> Add(DQ(shortcut)) -> Q, the block's Add then in that conv's
        kernel, where onnxruntime runs it as a QLinearAdd pass over both u8 tensors). Every
        reader must be elementwise, of the anchor's output shape, and read besides ``n`` only
        constants, values of that group, or widening reads of 8-bit values computed before
        ``n``'s (those become the epilogue's side chains: :meth:`side_chains`); of several such
        reads, the latest producer's epilogue takes the readers."""
        x = n.inputs[0]
        grp = self.group_of.get(id(x.producer))
        if grp is None or grp.anchor is None or not grp.fusable:
            return False
        here = self.pos[id(x.producer)]
        y = n.outputs[0]
        users = self.consumers(y)
        if not users:
            return False
        shape = tuple(grp.anchor.outputs[0].shape)
        for u in users:
            if not _is_elementwise(u, find_op(u.op, u.domain)) or tuple(u.outputs[0].shape) != shape:
                return False
            for v in u.inputs:
                if v is None or v is y or v.producer is None or v.const_value() is not None:
                    continue
                p = v.producer
                if self.group_of.get(id(p)) is grp:
                    continue
                src = p.inputs[0].producer if p.inputs and p.inputs[0] is not None else None
                if not (self.widening_read(p) and src is not None and id(src) in self.pos
                        and self.pos[id(src)] < here):
                    return False
        return True

    def side_chains(self, grp: Group, n: Node) -> list[Group]:
        """Loop groups computing an input of ``n`` (joining anchored ``grp``) that only ``n``
        reads, of the anchor's output shape, elementwise only (no movers): merged into ``grp``,
        their values are computed in its epilogue at each output element instead of stored
        (the widening reads of :meth:`widening_read`)."""
        shape = tuple(grp.anchor.outputs[0].shape)
        out = []
        for v in n.inputs:
            p = v.producer if v is not None else None
            lg = self.group_of.get(id(p)) if p is not None else None
            if (lg is None or lg is grp or lg.anchor is not None or not lg.fusable or lg in out
                    or lg.shape != shape or not self.closed(lg, n)
                    or not all(_is_elementwise(m, find_op(m.op, m.domain)) for m in lg.nodes)
                    or not any(self.widening_read(m) for m in lg.nodes)):
                continue
            if self.makes_cycle([grp, lg], n):
                continue
            out.append(lg)
        return out

    def prologue_only(self, n: Node) -> bool:
        """Whether elementwise ``n`` feeds only a reduction that will take it as its prologue
        (``n``'s value is read by one node, a reduction with ``OpDef.prologue``, as its input 0
        alone; every input of ``n`` has that value's element count or one element; not a graph
        output). Such an ``n`` stays out of an anchor's epilogue: in the epilogue its value
        would be stored and read back by the reduction (T5's RMSNorm ``MatMul -> Add -> Pow ->
        ReduceMean``: the Pow is computed where the ReduceMean reads the Add instead)."""
        out = n.outputs[0]
        users = self.consumers(out)
        if len(users) != 1 or id(out) in self.graph_outputs:
            return False
        r = users[0]
        od = find_op(r.op, r.domain)
        if od is None or not od.prologue or r.inputs[0] is not out or any(v is out for v in r.inputs[1:]):
            return False
        return all(v is None or v.type.numel in (out.type.numel, 1) for v in n.inputs)

    def take_prologue(self, n: Node, od) -> bool:
        """Put reduction-like node ``n`` (``OpDef.prologue``: Softmax, LayerNormalization, the
        Reduce ops) into the loop group that computes its input 0, as that group's anchor and
        last node; False when it cannot. The group must be elementwise only (no movers), every
        value in it and every input of it have input 0's element count or one element (so the
        reduction's flat offsets address them all), all of its values be consumed inside it or
        by ``n`` (none a graph output: the prologue is recomputed where ``n`` reads it, never
        stored), and ``n``'s other inputs come from outside it. The group then takes no more
        nodes (a reduction applies no epilogue)."""
        if od is None or not od.prologue or not n.inputs or n.inputs[0] is None or len(n.outputs) < 1:
            return False
        x = n.inputs[0]
        grp = self.group_of.get(id(x.producer)) if x.producer is not None else None
        if grp is None or grp.anchor is not None or not grp.fusable or x.type.numel == 0:
            return False
        if not all(_is_elementwise(m, find_op(m.op, m.domain)) for m in grp.nodes):
            return False
        if any(v is not None and v.type.numel not in (x.type.numel, 1)
               for m in grp.nodes for v in list(m.inputs) + list(m.outputs)):
            return False
        if any(v is not None and v.producer is not None and self.group_of.get(id(v.producer)) is grp
               for v in n.inputs[1:]):
            return False
        if not self.closed(grp, n) or self.makes_cycle([grp], n):
            return False
        grp.nodes.append(n)
        grp.anchor = n
        grp.fusable = False
        grp.kind = max(grp.kind, od.kind)
        self.group_of[id(n)] = grp
        return True

    def join(self, n: Node, loops_only: bool = False) -> bool:
        """Put elementwise node ``n`` into a producer's group; False when none can take it.
        ``loops_only``: ``n`` is an injective mover (``_is_mover``): it joins only the loop group
        of its data input (input 0), never an anchor's epilogue (which runs at the anchor's
        output index)."""
        cands: list[Group] = []
        for v in (n.inputs[:1] if loops_only else n.inputs):
            p = v.producer if v is not None else None
            grp = self.group_of.get(id(p)) if p is not None else None
            if grp is not None and grp.fusable and all(grp is not c for c in cands):
                cands.append(grp)
        if loops_only and find_op(n.op, n.domain).reshape_only:
            # reshapes alone lower to no kernel (memory-plan aliases): grouping them would copy
            cands = [grp for grp in cands if not all(find_op(m.op, m.domain).reshape_only for m in grp.nodes)]
        cands.sort(key=lambda grp: -max(self.pos[id(m)] for m in grp.nodes))    # latest first
        to_prologue = not loops_only and self.prologue_only(n)
        if self.widening_read(n):
            if self.epilogue_of_producer(n):
                # its readers will join the producer's epilogue with it: its float value is
                # computed there and never stored
                cands = [grp for grp in cands if grp is self.group_of.get(id(n.inputs[0].producer))]
            elif self.read_by_epilogue(n):
                # stays out of the producer's group: the consumer's anchor recomputes it
                return False
            else:
                # a loop group may take it (its consumers then join that loop), an anchor not
                cands = [grp for grp in cands if grp.anchor is None]
        for grp in cands:
            if grp.anchor is not None and not loops_only and not to_prologue and self.can_join_anchor(grp, n) and not self.makes_cycle([grp], n):
                sides = self.side_chains(grp, n)
                self.merge([grp] + sides, n)
                return True
        loops = [grp for grp in cands if grp.anchor is None and self.can_join_loop(grp, n)]
        choices = ([loops] if len(loops) > 1 else []) + [[grp] for grp in loops]
        for choice in choices:
            if not self.makes_cycle(choice, n):
                self.merge(choice, n)
                return True
        return False


def plan_groups(graph: Graph) -> list[Group]:
    """The groups of ``graph`` in graph order of their first node (every node in exactly one;
    see the module docstring for the rules). Does not change the graph."""
    return _Planner(graph).plan()


def _materialised(grp: Group, users, graph_outputs: set[int]) -> list[Value]:
    members = {id(m) for m in grp.nodes}
    out = []
    for m in grp.nodes:
        for k, o in enumerate(m.outputs):
            extra = m is grp.anchor and k > 0           # an anchor's other outputs (MaxPool's Indices)
            last = m is grp.nodes[-1] and grp.anchor is not None
            if extra or last or id(o) in graph_outputs or any(id(u) not in members for u in users.get(o, ())):
                out.append(o)
    return out


def _fused_node(graph: Graph, grp: Group, outputs: list[Value]) -> Node:
    """The FusedFunction node for ``grp``: the body copies the members with fresh Values."""
    ops: list[str] = []
    for m in grp.nodes:
        if m.op.lower() not in ops:
            ops.append(m.op.lower())
    # named after the group's anchor (else its first node): the model's names stay visible in
    # the graph, the memory plan and the kernels; the members leave the graph, so it is free
    named = grp.anchor if grp.anchor is not None and grp.anchor.name else grp.nodes[0]
    name = named.name or graph.fresh_name("fused_" + "_".join(ops[:4]) + ("_etc" if len(ops) > 4 else ""))
    body = Graph(name)
    vmap: dict[int, Value] = {}
    ext: list[Value] = []
    # a compile-time input read as a parameter of a mover (a Reshape's shape, a Slice's starts)
    # or of a reduction after a prologue (a ReduceSum's axes) is a constant of the body there,
    # so the body's nodes type-check on their own; where the same value is also read as data
    # (CSE's one [1] as an Unsqueeze's axes and an Equal's operand: the ONNX NLLLoss expansion)
    # it is an input of the body for those slots as well
    def is_param(m: Node, k: int, v: Value) -> bool:
        od = find_op(m.op, m.domain)
        mover = od.index_map is not None and not has_scalar(m)
        reduction = m is grp.anchor and m is not grp.nodes[0] and od.prologue
        return bool(mover and k > 0 or reduction and k in od.const_inputs) and v.const_value() is not None

    members = {id(m) for m in grp.nodes}
    cmap: dict[int, Value] = {}

    def body_value(v: Value, param: bool) -> Value:
        if v.producer is not None and id(v.producer) in members:
            return vmap[id(v)]          # a member's output (members are in topological order)
        if param:                       # a parameter slot: a body constant
            bv = cmap.get(id(v))
            if bv is None:
                name = body.fresh_name(v.name)
                bv = cmap[id(v)] = Value(name, v.type, data=np.asarray(v.const_value()))
                body.constants[name] = bv
            return bv
        bv = vmap.get(id(v))
        if bv is None:                  # read before defined in the group: an external input
            bv = vmap[id(v)] = Value(body.fresh_name(v.name), v.type)
            body.inputs.append(bv)
            ext.append(v)
        return bv

    for m in grp.nodes:
        ins = [None if v is None else body_value(v, is_param(m, k, v)) for k, v in enumerate(m.inputs)]
        outs = []
        for o in m.outputs:
            bo = vmap[id(o)] = Value(o.name, o.type)
            body.reserve(o.name)
            outs.append(bo)
        body.reserve(m.name)
        body.nodes.append(Node(m.op, ins, outs, dict(m.attrs), m.name, m.domain))
    body.outputs = [vmap[id(o)] for o in outputs]
    attrs = {"body": body, "kind": grp.kind.name, "anchor": grp.anchor.name if grp.anchor is not None else ""}
    return Node("FusedFunction", ext, outputs, attrs, name, DOMAIN)


def fuse_ops(graph: Graph, log: list | None = None) -> bool:
    """Replace each group of two or more nodes by a ``tensorfuse::FusedFunction`` node (see the
    module docstring). Appends one ``compiler.rewrite.Application`` per fused function to
    ``log`` when given. Returns whether the graph changed."""
    groups = [grp for grp in plan_groups(graph) if len(grp.nodes) > 1]
    if not groups:
        return False
    from tensorfuse.compiler.rewrite import Application
    users = graph.users()
    graph_outputs = {id(v) for v in graph.outputs}
    place: dict[int, Node | None] = {}
    for grp in groups:
        if grp.anchor is not None and not grp.anchor.name:
            grp.anchor.name = graph.fresh_node_name(grp.anchor.op)
        fused = _fused_node(graph, grp, _materialised(grp, users, graph_outputs))
        for m in grp.nodes:
            place[id(m)] = None
        place[id(grp.nodes[-1])] = fused
        if log is not None:
            log.append(Application("fuse_ops", [m.name for m in grp.nodes], [fused.name]))
    graph.nodes = [place.get(id(n), n) for n in graph.nodes if place.get(id(n), n) is not None]
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.constants.values()}
    for n in graph.nodes:
        if any(v is not None and id(v) not in defined for v in n.inputs):
            graph.toposort()    # a group's early value read by a node placed before the group
            break
        defined.update(id(o) for o in n.outputs)
    return True


class FuseOps:
    """fuse_ops as a pipeline pass: ``FuseOps(log)(graph) -> changed``."""

    def __init__(self, log: list | None = None):
        self.log = log

    def __call__(self, graph: Graph) -> bool:
        return fuse_ops(graph, self.log)
