"""``tensorfuse::FusedFunction``: a group made by the ``fuse_ops`` pass (compiler/passes/fuse_ops.py),
its definition (the meaning is the body graph's) and its lowering to one kernel.

A group's body nodes after the anchor (or all of them, without an anchor) are elementwise or
broadcast ops with a ``scalar`` function in the registry; they are composed into one kernel-IR
expression per output element:

- **Anchored group** (``anchor`` names a body node, e.g. Conv, MatMul, a pool, FusedConv): the
  anchor's own ``lower`` builds the kernel, with a :class:`LowerCtx` whose ``apply_epilogue``
  runs the composed body on each output element before the anchor's single store. The anchor
  writes straight into the group's main output (the last body node's value); other values the
  group materialises (the anchor's own value included) are stored by the epilogue at the same
  index. External epilogue inputs (a
  residual, a bias) are kernel parameters (``ctx.epilogue_inputs``) loaded with numpy
  broadcasting against the output index. An anchor that sets its own epilogue (FusedConv's
  bias/activation) keeps it: the group's runs after it.
- **Prologue group** (``anchor`` names the last body node, an op with ``OpDef.prologue``:
  Softmax, LayerNormalization, a Reduce op): the body nodes before it are elementwise and
  compute its input 0; the anchor's own lowering builds the kernel and reads that input
  through a :class:`_ComputedBuffer`, which composes the prologue at each element read from
  loads of the prologue's inputs (all of the input's element count, or one element). Nothing
  of the prologue is stored.
- **Loop group** (no anchor): one loop nest over the outputs' common shape; flat (and
  vectorisable) when every value has that shape or one element, else a grid with broadcasting
  loads. Each output is stored at its element. A group with injective movers
  (``OpDef.index_map``: Transpose, Slice, the Reshape family) is a grid over the output in
  which a mover reads its input at the mapped index (:func:`_moving_grid`); one whose movers
  only reshape values of the full element count stays flat (a reshape keeps flat offsets).

Each body node's scalar is evaluated once per element: a value read more than once (or read
and stored) is kept in a one-element local buffer, which LLVM turns into a register; kernel-IR
expressions are trees, so sharing one would evaluate it again at each use. One-element
constant inputs are inlined as immediates.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.graph import Node, Value
from tensorfuse.ir.kernel import Buffer, Const, Expr, KernelBuilder, Load, as_expr, copy_index
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops.fused import DOMAIN
from tensorfuse.ir.registry import AttrSpec, OpPatternKind, ShapeError, get_op, has_scalar, op
from tensorfuse.ir.types import DType

#: dtypes of one-element constant inputs that are inlined as immediates
_INLINE_DTYPES = (DType.f32, DType.f64, DType.i32, DType.i64, DType.u8, DType.i8, DType.u16, DType.i16)


class _Group:
    """What the lowering needs of a FusedFunction node's body."""

    def __init__(self, ctx: LowerCtx):
        node = ctx.node
        body = node.attrs["body"]
        self.body = body
        self.buf: dict[int, Buffer] = {}          # body input -> the node's input Buffer
        self.outer: dict[int, Value] = {}         # body input -> the node's input Value
        self.imm: dict[int, Expr] = {}            # body input -> inlined constant
        for bv, v, b in zip(body.inputs, node.inputs, ctx.inputs):
            self.buf[id(bv)], self.outer[id(bv)] = b, v
            data = v.const_value()
            if data is not None and data.size == 1 and bv.dtype in _INLINE_DTYPES:
                x = np.asarray(data).reshape(()).item()
                if not isinstance(x, float) or math.isfinite(x):
                    self.imm[id(bv)] = as_expr(x, bv.dtype)
        self.out: dict[int, Buffer] = {id(bv): b for bv, b in zip(body.outputs, ctx.outputs)}
        # uses per body value: input slots of body nodes, plus one per store of it as an output
        self.uses: dict[int, int] = {}
        for n in body.nodes:
            for v in n.inputs:
                if v is not None:
                    self.uses[id(v)] = self.uses.get(id(v), 0) + 1
        for v in body.outputs:
            self.uses[id(v)] = self.uses.get(id(v), 0) + 1
        self._tmp: dict[tuple[int, int], Buffer] = {}

    def compose(self, kb: KernelBuilder, nodes: list[Node], env: dict[int, Expr], load,
                store, skip_store: Value | None = None, flat_moves: bool = False) -> None:
        """Evaluate ``nodes`` (elementwise, in order) into ``env`` (body value id -> Expr).

        ``load(bv)`` gives the Expr of body input ``bv``; ``store(buf, expr)`` stores an output
        at the current element (every output in ``self.out`` but ``skip_store``).
        ``flat_moves``: the loop runs over flat offsets, where a reshape-only node
        (``OpDef.reshape_only``) passes its input's element through."""
        for n in nodes:
            od = get_op(n.op, n.domain)
            if od.reshape_only and od.index_map is not None and flat_moves:
                v = n.inputs[0]         # the same element at the same flat offset
                e = env[id(v)] if id(v) in env else self.imm[id(v)] if id(v) in self.imm else load(v)
                env[id(n.outputs[0])] = e
                if id(n.outputs[0]) in self.out and n.outputs[0] is not skip_store:
                    store(self.out[id(n.outputs[0])], e)
                continue
            if not has_scalar(n, od) or len(n.outputs) != 1:
                raise ShapeError(f"body node {n.name} ({n.qualified_op}) has no per-element scalar "
                                 f"function; it cannot be fused into a loop or an epilogue")
            args = []
            for v in n.inputs:
                if v is None:
                    continue
                if id(v) in env:
                    args.append(env[id(v)])
                elif id(v) in self.imm:
                    args.append(self.imm[id(v)])
                elif id(v) in self.buf:
                    args.append(load(v))
                else:
                    raise ShapeError(f"body node {n.name} reads %{v.name}, which is neither a body "
                                     f"input nor computed before it in the epilogue")
            v = n.outputs[0]
            e = as_expr(od.scalar(n, *args), v.dtype)
            if e.dtype != v.dtype:
                raise ShapeError(f"body node {n.name}: scalar gives {e.dtype}, the value is {v.dtype}")
            env[id(v)] = e = self.shared(kb, v, e)
            if id(v) in self.out and v is not skip_store:
                store(self.out[id(v)], e)

    def shared(self, kb: KernelBuilder, v: Value, e: Expr) -> Expr:
        """``e`` itself, or a read of a local it was stored into when ``v`` is used again."""
        if self.uses.get(id(v), 0) < 2 or isinstance(e, (Load, Const)):
            return e
        key = (id(kb), id(v), e.lanes)
        tmp = self._tmp.get(key)
        if tmp is None:
            tmp = self._tmp[key] = kb.local(v.dtype, (e.lanes,), hint="v")
        kb.store(tmp, 0, e)
        return tmp.vload(0, e.lanes) if e.lanes > 1 else tmp[0]


def lower_fused_function(ctx: LowerCtx) -> None:
    """Lower a ``tensorfuse::FusedFunction`` node (see the module docstring).

    Raises ShapeError when the body cannot be lowered this way: a non-anchor node without a
    scalar function, outputs of different shapes in a loop group, an epilogue value whose type
    differs from the anchor's output, or an anchor whose kernel never applies the epilogue."""
    g = _Group(ctx)
    anchor_name = ctx.node.attr("anchor", "")
    if anchor_name:
        _lower_anchored(ctx, g, anchor_name)
    else:
        _lower_loop(ctx, g)


# ----------------------------------------------------------------------------- loop groups
def _lower_loop(ctx: LowerCtx, g: _Group) -> None:
    shapes = {tuple(v.shape) for v in g.body.outputs}
    if len(shapes) != 1:
        raise ShapeError(f"a fused loop needs outputs of one shape, got {sorted(map(list, shapes))}")
    (shape,) = shapes
    numel = math.prod(shape)
    movers = [n for n in g.body.nodes if not has_scalar(n, get_op(n.op, n.domain))]
    if not movers and _lookup_table(ctx, g, shape):
        return
    values = [v for v in g.body.inputs if id(v) not in g.imm] + [o for n in g.body.nodes for o in n.outputs]
    if movers:
        # a reshape keeps each element's flat offset: a group of full-size (or one-element)
        # values whose movers only reshape is still one flat loop
        flat = all(get_op(n.op, n.domain).reshape_only for n in movers) \
            and all(v.type.numel in (numel, 1) for v in values)
    else:
        flat = all(tuple(v.shape) == shape or v.type.numel == 1 for v in values)
    kb = ctx.kernel()
    if movers and not flat:
        _moving_grid(kb, g, shape)
        return          # not in place: a mover reads its input at another element than it writes
    if flat:
        from tensorfuse.ir.kernel import broadcast
        from tensorfuse.ir.ops._common import flat_vector_loop

        def body(i, lanes):
            def load(bv):
                b = g.buf[id(bv)]
                if bv.type.numel != numel:              # one element, read by every lane
                    return b.flat(0) if lanes == 1 else broadcast(b.flat(0), lanes)
                return b.flat(i) if lanes == 1 else b.vload(i, lanes)
            g.compose(kb, g.body.nodes, {}, load, lambda buf, e: kb.store(buf, i, e), flat_moves=True)
        flat_vector_loop(ctx, kb, numel, [v.dtype for v in values], body)
    elif not _broadcast_rows(ctx, kb, g, shape, values):
        with kb.grid(shape) as idx:
            g.compose(kb, g.body.nodes, {}, lambda bv: g.buf[id(bv)].bcast(idx),
                      lambda buf, e: kb.store(buf, idx, e))
    # one output written at the element its same-shape inputs are read: may run in place
    ctx.elementwise_inplace = len(ctx.outputs) == 1


def _moving_grid(kb: KernelBuilder, g: _Group, shape) -> None:
    """A loop group with injective movers (``OpDef.index_map``: Transpose, Slice, a reshape
    that is not flat here) as one grid over the outputs' shape ``shape``: each output is
    evaluated at the grid index, a value at an index by its node -- an elementwise node's
    inputs at the index broadcast to their shapes (trailing dims, a dim of 1 reads 0), a
    mover's input at ``index_map(index)``, a body input loaded there. A value reached at two
    indices (through a mover and directly) is computed at each; one used twice at the same
    index is kept in a one-element local per (value, index)."""
    zero = Const(0, DType.i64)
    producer = {id(o): n for n in g.body.nodes for o in n.outputs}
    memo: dict = {}
    mapped: dict = {}

    def key(ix):
        return tuple(id(e) for e in ix)

    def bidx(v: Value, ix):
        r = len(v.shape)
        t = list(ix)[len(ix) - r:] if r else []
        return [zero if d == 1 else i for d, i in zip(v.shape, t)]

    def at(v: Value, ix) -> Expr:
        k = (id(v), key(ix))
        e = memo.get(k)
        if e is not None:
            return e
        if id(v) in g.imm:
            e = g.imm[id(v)]
        elif id(v) in g.buf:
            b = g.buf[id(v)]
            e = b[list(ix)] if v.shape else b.flat(0)
        else:
            n = producer.get(id(v))
            if n is None:
                raise ShapeError(f"%{v.name} is neither a body input nor computed in the group")
            od = get_op(n.op, n.domain)
            if has_scalar(n, od) and len(n.outputs) == 1:
                args = [at(u, bidx(u, ix)) for u in n.inputs if u is not None]
                e = as_expr(od.scalar(n, *args), v.dtype)
                if e.dtype != v.dtype:
                    raise ShapeError(f"body node {n.name}: scalar gives {e.dtype}, the value is {v.dtype}")
            elif od.index_map is not None:
                mk = (id(n), key(ix))
                src = mapped.get(mk)
                if src is None:     # asked of the node with the outer values (constant inputs known)
                    proxy = Node(n.op, [None if u is None else g.outer.get(id(u), u) for u in n.inputs],
                                 [Value(o.name, o.type) for o in n.outputs], dict(n.attrs), n.name,
                                 n.domain)
                    src = mapped[mk] = od.index_map(proxy, list(ix))
                e = at(n.inputs[0], src)
            else:
                raise ShapeError(f"body node {n.name} ({n.qualified_op}) is neither elementwise nor an "
                                 f"index map; it cannot be fused into a loop")
            if g.uses.get(id(v), 0) >= 2 and not isinstance(e, (Load, Const)):
                tmp = kb.local(v.dtype, (1,), hint="v")
                kb.store(tmp, 0, e)
                e = tmp[0]
        memo[k] = e
        return e

    with kb.grid(shape) as idx:
        for o in g.body.outputs:
            kb.store(g.out[id(o)], idx, at(o, idx))


#: the 8-bit dtypes whose every value a lookup table lists
_TABLE_DTYPES = (DType.u8, DType.i8)


def _lookup_table(ctx: LowerCtx, g: _Group, shape) -> bool:
    """A loop group that is a function of one 8-bit tensor (every other input a one-element
    constant; its nodes deterministic), such as a QDQ model's ``DQ -> Div -> Erf -> Q -> DQ ->
    Add -> Q -> ... -> Q`` GELU, as a table of its 256 results: the body's reference (the ops'
    meaning, ``FusedFunction.reference``) evaluated on every value of the input at compile
    time, then one load per element and output, ``y[i] = table[x[i]]``. The results are the
    reference's exactly (no vector erf or exp in between). Knob ``lookup_table`` (default: the
    body has at least 3 nodes, where the table's per-element load costs less than the chain of
    vector operations it replaces). Returns False (nothing emitted) where it does not apply."""
    var = [bv for bv in g.body.inputs if g.outer[id(bv)].const_value() is None]
    if len(var) != 1 or var[0].dtype not in _TABLE_DTYPES or tuple(var[0].shape) != tuple(shape):
        return False
    if any(g.outer[id(bv)].type.numel != 1 for bv in g.body.inputs if bv is not var[0]):
        return False
    if not all(get_op(n.op, n.domain).deterministic for n in g.body.nodes):
        return False
    from tensorfuse.ir.knobs import knob
    if not knob("lookup_table", [False, True], len(g.body.nodes) >= 3,
                doc="compute a one-8-bit-input group as a table of its 256 results"):
        return False
    (xv,) = var
    info = np.iinfo(xv.dtype.numpy)
    domain = np.arange(info.min, info.max + 1).astype(xv.dtype.numpy).reshape([1] * (len(shape) - 1) + [-1])
    ins = [domain if bv is xv else np.asarray(g.outer[id(bv)].const_value()) for bv in g.body.inputs]
    tables = get_op("FusedFunction", DOMAIN).reference(ctx.node, ins)
    x = g.buf[id(xv)]
    outs = [(g.out[id(o)], ctx.pack(np.asarray(t, o.dtype.numpy).reshape(-1), "table"))
            for o, t in zip(g.body.outputs, tables)]
    kb = ctx.kernel(params=[x] + [t for _, t in outs] + [b for b, _ in outs])
    with kb.loop(math.prod(shape), kind="vectorize", role="spatial") as i:
        k = x.flat(i).cast(DType.i64)
        if info.min:
            k = k - int(info.min)
        for b, t in outs:
            kb.store(b, i, t.flat(k))
    return True


def _row_split(shape: tuple[int, ...], in_shapes) -> int:
    """How many trailing axes of ``shape`` form the rows of a broadcast loop: the most axes
    (at least one) such that every input shape, aligned to the right, is either equal to
    ``shape`` on all of them or 1 on all of them (a [1,1,1,128] mask against [1,4,128,128]
    gives 1 axis; a [64,1,1] bias against [1,64,56,56] gives 2)."""
    r = len(shape)
    best = 0
    for k in range(1, r + 1):
        ok = True
        for s in in_shapes:
            tail = [1] * max(0, k - len(s)) + list(s[max(0, len(s) - k):])
            if not (tail == list(shape[r - k:]) or all(d == 1 for d in tail)):
                ok = False
                break
        if not ok:
            break
        best = k
    return best


def _broadcast_rows(ctx: LowerCtx, kb: KernelBuilder, g: _Group, shape, values) -> bool:
    """A loop group whose inputs broadcast, as one spatial loop over rows (the leading axes)
    and, per row, a loop over the trailing axes in explicit vectors of the target's f32 lanes
    plus a scalar tail: an input that is whole along the row is read as contiguous vectors,
    one that is 1 along it as one element in every lane. Returns False (the caller emits the
    per-element grid) when the target has no vectors, a dtype has no vector loop, or the rows
    are shorter than one vector (see :func:`_row_split`)."""
    from tensorfuse.ir.kernel import broadcast
    from tensorfuse.ir.ops._common import VECTOR_LOOP_DTYPES

    tgt = ctx.target
    lanes = tgt.lanes(DType.f32) if not tgt.simt else 1
    ins = [bv for bv in g.body.inputs if id(bv) not in g.imm]
    if lanes <= 1 or any(v.dtype not in VECTOR_LOOP_DTYPES for v in values) or not shape:
        return False
    k = _row_split(tuple(shape), [tuple(bv.shape) for bv in ins])
    if k == 0:
        return False
    rank = len(shape)
    inner = math.prod(shape[rank - k:])
    rows = math.prod(shape[:rank - k])
    if inner < lanes:
        return False
    # per input: strides of its aligned outer axes (0 where it broadcasts) and whether it is
    # whole along the row
    plan = {}
    for bv in ins:
        s = tuple(bv.shape)
        full = tuple(s[max(0, len(s) - k):]) == tuple(shape[rank - k:]) and len(s) >= k
        b = g.buf[id(bv)]
        strides = b.strides
        outer = []
        for ax in range(rank - k):
            j = ax - (rank - len(s))
            if j >= 0 and s[j] != 1:
                outer.append((ax, strides[j]))
        plan[id(bv)] = (full, outer)
    out_strides = [math.prod(shape[ax + 1:rank - k]) for ax in range(rank - k)]
    with kb.loop(rows, role="spatial", hint="r") as r:
        coords = {}

        def coord(ax):
            if ax not in coords:
                c = r if out_strides[ax] == 1 else r // out_strides[ax]
                coords[ax] = c if ax == 0 else c % shape[ax]
            return coords[ax]

        bases = {}
        for bv in ins:
            full, outer = plan[id(bv)]
            off = 0
            for ax, st in outer:
                off = coord(ax) * st + off
            bases[id(bv)] = off

        def row_body(j, w):
            def load(bv):
                b = g.buf[id(bv)]
                full, _ = plan[id(bv)]
                if not full:
                    e = b.flat(bases[id(bv)])
                    return e if w == 1 else broadcast(e, w)
                off = bases[id(bv)] + j
                return b.flat(off) if w == 1 else b.vload(off, w)
            o = r * inner + j
            g.compose(kb, g.body.nodes, {}, load, lambda buf, e: kb.store(buf, o, e))

        main = inner - inner % lanes
        with kb.loop(main // lanes, role="spatial", hint="v") as v:
            row_body(v * lanes, lanes)
        if main < inner:
            with kb.loop(inner, start=main, kind="vectorize", role="spatial", hint="t") as t:
                row_body(t, 1)
    return True


# ----------------------------------------------------------------------------- anchored groups
class _AnchorCtx(LowerCtx):
    """The anchor's lowering context: the group's epilogue runs after the anchor's own (if it
    sets one), and may store materialised values through the kernel being built."""

    def __init__(self, node, inputs, outputs, name, group_epilogue):
        self._own = None
        super().__init__(node, inputs, outputs, name)
        self._group_epilogue = group_epilogue
        self.current: KernelBuilder | None = None
        self.applied = 0

    @property
    def epilogue(self):
        return self._own

    @epilogue.setter
    def epilogue(self, fn):
        self._own = fn

    def apply_epilogue(self, value, out_idx):
        self.applied += 1
        idx = copy_index(out_idx)
        if self._own is not None:
            value = self._own(value, idx)
        return self._group_epilogue(self.current, value, idx)

    def kernel(self, suffix: str = "", params: list[Buffer] | None = None) -> KernelBuilder:
        kb = super().kernel(suffix, params)
        self.current = kb
        return kb


def _lower_anchored(ctx: LowerCtx, g: _Group, anchor_name: str) -> None:
    nodes = g.body.nodes
    k = next(i for i, n in enumerate(nodes) if n.name == anchor_name)
    anchor, epi = nodes[k], nodes[k + 1:]
    if k != 0:
        _lower_prologue(ctx, g, nodes[:k], anchor, epi)
        return
    if not epi:
        raise ShapeError(f"the anchor {anchor_name} has no epilogue nodes")
    a_out = anchor.outputs[0]
    main = epi[-1].outputs[0]
    if id(main) not in g.out:
        raise ShapeError(f"the last body node's value %{main.name} must be a body output")
    casts = get_op(anchor.op, anchor.domain).epilogue_casts
    for n in epi:
        if n.outputs[0].type != a_out.type and not (casts and n.outputs[0].shape == a_out.shape):
            raise ShapeError(f"epilogue node {n.name} gives {n.outputs[0].type}, the anchor {anchor_name} "
                             f"gives {a_out.type}; an epilogue keeps the anchor's type")
    # the anchor as a node of the outer graph: its inputs are the FusedFunction node's (so
    # ctx.const works), its outputs fresh Values (the real producers stay intact)
    proxy = Node(anchor.op, [None if v is None else g.outer[id(v)] for v in anchor.inputs],
                 [Value(o.name, o.type) for o in anchor.outputs], dict(anchor.attrs), anchor.name,
                 anchor.domain)
    ins = [None if v is None else g.buf[id(v)] for v in anchor.inputs]
    outs = [g.out[id(main)]]
    for o in anchor.outputs[1:]:
        if id(o) not in g.out:
            raise ShapeError(f"the anchor's output %{o.name} must be a body output")
        outs.append(g.out[id(o)])
    # every tensor the epilogue reads, the anchor's own inputs included (a quantized residual
    # that dequantizes the conv's u8 input): schedules decide from this list how the epilogue
    # may be evaluated (on whole vectors, by flat pixel); default_params passes each buffer once
    extra: list[Buffer] = []
    for n in epi:
        for v in n.inputs:
            if v is not None and id(v) in g.buf and id(v) not in g.imm:
                extra.append(g.buf[id(v)])
    side = [g.out[id(v)] for v in [a_out] + [n.outputs[0] for n in epi] if id(v) in g.out and v is not main]
    for b in extra + side:
        if all(b is not e for e in ctx.epilogue_inputs):
            ctx.epilogue_inputs.append(b)

    def group_epilogue(kb, value, idx):
        if kb is None:
            raise ShapeError(f"the anchor {anchor_name} applied its epilogue outside a kernel")
        env = {id(a_out): g.shared(kb, a_out, value)}
        if id(a_out) in g.out:          # the anchor's value is read outside the group too
            kb.store(g.out[id(a_out)], idx, env[id(a_out)])
        g.compose(kb, epi, env, lambda bv: g.buf[id(bv)].bcast(idx),
                  lambda buf, e: kb.store(buf, idx, e), skip_store=main)
        return env[id(main)]

    sub = _AnchorCtx(proxy, ins, outs, ctx.name, group_epilogue)
    sub.epilogue_inputs = list(ctx.epilogue_inputs)
    od = get_op(anchor.op, anchor.domain)
    if od.lower is None:
        raise ShapeError(f"the anchor {anchor.qualified_op} has no lowering")
    od.lower(sub)
    if sub.applied == 0 and any(b.numel for b in outs + side):
        # (an anchor with an empty output -- a zero-sized dim -- emits no loop to put it in,
        # and its group has nothing to compute)
        raise ShapeError(f"{anchor.qualified_op} is marked OUT_ELEMWISE_FUSABLE but its lowering never "
                         f"calls ctx.apply_epilogue; it cannot anchor a fused group")
    ctx.kernels.extend(sub.kernels)
    ctx.packed.extend(sub.packed)
    ctx.scratch_buffers.extend(sub.scratch_buffers)
    ctx.view_of.update(sub.view_of)


# ----------------------------------------------------------------------------- prologue groups
class _ComputedBuffer(Buffer):
    """Input 0 of a reduction with an elementwise prologue, as the reduction's lowering sees it:
    a Buffer of the value's dtype and shape whose reads (``flat``, ``vload``, ``[]``,
    ``bcast``) return the prologue composed at the element read, from loads of the prologue's
    inputs at the same flat offset (each has the value's element count, or one element, which
    every lane reads). ``kb`` is the kernel being built (a one-element local per value the
    prologue reads twice, fresh at each read, so two reads in one expression never share it);
    ``sources`` are the Buffers the kernel takes in its place."""

    def __init__(self, value: Value, g: _Group, nodes: list[Node]):
        super().__init__(value.name, value.dtype, tuple(value.shape))
        self.value, self.g, self.nodes = value, g, nodes
        self.kb: KernelBuilder | None = None
        read = {id(v) for n in nodes for v in n.inputs if v is not None}
        self.sources = [g.buf[id(bv)] for bv in g.body.inputs if id(bv) in read and id(bv) not in g.imm]

    def _compute(self, load) -> Expr:
        g, kb, env = self.g, self.kb, {}
        if kb is None:
            raise ShapeError(f"the prologue of %{self.value.name} is read outside a kernel")
        for n in self.nodes:
            od = get_op(n.op, n.domain)
            args = []
            for v in n.inputs:
                if v is None:
                    continue
                args.append(env[id(v)] if id(v) in env else g.imm[id(v)] if id(v) in g.imm else load(v))
            o = n.outputs[0]
            e = as_expr(od.scalar(n, *args), o.dtype)
            if e.dtype != o.dtype:
                raise ShapeError(f"body node {n.name}: scalar gives {e.dtype}, the value is {o.dtype}")
            if g.uses.get(id(o), 0) >= 2 and not isinstance(e, (Load, Const)):
                tmp = kb.local(o.dtype, (e.lanes,), hint="v")
                kb.store(tmp, 0, e)
                e = tmp.vload(0, e.lanes) if e.lanes > 1 else tmp[0]
            env[id(o)] = e
        return env[id(self.value)]

    def _read(self, off, lanes: int, stride: int = 1) -> Expr:
        from tensorfuse.ir.kernel import broadcast

        def load(bv):
            b = self.g.buf[id(bv)]
            if b.numel != self.numel:                   # one element, read by every lane
                return b.flat(0) if lanes == 1 else broadcast(b.flat(0), lanes)
            return Load(b, as_expr(off, DType.i64), lanes, stride if lanes > 1 else 1)
        return self._compute(load)

    def flat(self, i):
        from tensorfuse.ir.kernel import Ramp
        if isinstance(i, Ramp):
            return self._read(i.base, i.lanes)
        return self._read(i, 1)

    def vload(self, i, lanes: int):
        return self._read(i, lanes)

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, (list, tuple)) else [idx]
        lanes, stride = self.index_vector(idx)
        return self._read(self.offset(idx), lanes, stride)


class _PrologueCtx(LowerCtx):
    """The reduction's lowering context: its kernels take the prologue's inputs in place of
    the computed input 0, which reads through the kernel being built."""

    def __init__(self, node, inputs, outputs, name, computed: _ComputedBuffer):
        super().__init__(node, inputs, outputs, name)
        self.computed = computed

    def kernel(self, suffix: str = "", params: list[Buffer] | None = None) -> KernelBuilder:
        params = self.default_params() if params is None else params
        out: list[Buffer] = []
        for b in params:
            for s in (self.computed.sources if b is self.computed else [b]):
                if all(s is not u for u in out):
                    out.append(s)
        kb = super().kernel(suffix, out)
        self.computed.kb = kb
        return kb


def _lower_prologue(ctx: LowerCtx, g: _Group, pro: list[Node], anchor: Node, epi: list[Node]) -> None:
    """A reduction-like anchor (``OpDef.prologue``) after its elementwise prologue ``pro``: the
    anchor's own lowering, reading input 0 through a :class:`_ComputedBuffer`."""
    od = get_op(anchor.op, anchor.domain)
    if not od.prologue:
        raise ShapeError(f"the anchor {anchor.name} ({anchor.qualified_op}) takes no prologue: it must be "
                         f"the body's first node")
    if epi:
        raise ShapeError(f"the anchor {anchor.name} has a prologue and epilogue nodes; a reduction "
                         f"with a prologue takes none")
    x = anchor.inputs[0]
    if x is None or all(x is not n.outputs[0] for n in pro):
        raise ShapeError(f"the prologue of {anchor.name} does not compute its input 0")
    for n in pro:
        if not has_scalar(n, get_op(n.op, n.domain)):
            raise ShapeError(f"prologue node {n.name} ({n.qualified_op}) is not elementwise")
    computed = _ComputedBuffer(x, g, pro)
    ins: list[Buffer | None] = [computed]
    outer: list[Value | None] = [Value(x.name, x.type)]
    for v in anchor.inputs[1:]:
        if v is not None and v.is_const:      # a body constant (ReduceSum's axes): no buffer
            ins.append(None)
            outer.append(v)
            continue
        if v is not None and id(v) not in g.buf:
            raise ShapeError(f"input %{v.name} of {anchor.name} is computed in the group; only input 0 may be")
        ins.append(None if v is None else g.buf[id(v)])
        outer.append(None if v is None else g.outer[id(v)])
    outs = []
    for o in anchor.outputs:
        if id(o) not in g.out:
            raise ShapeError(f"the anchor's output %{o.name} must be a body output")
        outs.append(g.out[id(o)])
    proxy = Node(anchor.op, outer, [Value(o.name, o.type) for o in anchor.outputs], dict(anchor.attrs),
                 anchor.name, anchor.domain)
    sub = _PrologueCtx(proxy, ins, outs, ctx.name, computed)
    od.lower(sub)
    ctx.kernels.extend(sub.kernels)
    ctx.packed.extend(sub.packed)
    ctx.scratch_buffers.extend(sub.scratch_buffers)


# ----------------------------------------------------------------------------- FusedFunction
def _fused_body(node: Node):
    from tensorfuse.ir.graph import Graph
    body = node.attrs.get("body")
    if not isinstance(body, Graph):
        raise ShapeError("attribute 'body' must be a graph (the group's subgraph)")
    return body


@op("FusedFunction", OpPatternKind.OPAQUE, domain=DOMAIN,
    attrs={"body": AttrSpec("graph", None, required=True), "kind": AttrSpec("string", "OPAQUE"),
           "anchor": AttrSpec("string", "")})
class FusedFunction:
    """A group made by the ``fuse_ops`` pass (docs/architecture.md "Grouping"), computed by one kernel.

    Attribute ``body`` is a graph: its inputs are the group's external inputs (this node's
    inputs, in order, same types), its outputs the values the group materialises (this node's
    outputs: values used outside the group, graph outputs, an anchor's extra outputs). ``kind``
    names the group's op pattern kind (``ir.registry.OpPatternKind``: ELEMWISE, BROADCAST,
    INJECTIVE, OUT_ELEMWISE_FUSABLE; a prologue group has its reduction's, COMM_REDUCE or
    OPAQUE); ``anchor`` names the body node whose kernel computes the group
    ("" for none): the body nodes after it form its epilogue, those before it (a reduction's
    elementwise prologue) compute its input 0. Without an anchor, every body
    node is an elementwise/broadcast op with a ``scalar`` function and the group is one loop
    nest, except injective movers (``OpDef.index_map``) whose constant parameters are
    constants of the body. The meaning is the body's (the numpy reference evaluates it node by node); the
    lowering is :func:`lower_fused_function`. Raises ShapeError when the inputs do
    not match the body's inputs in number and type, the body has no outputs, or ``kind`` /
    ``anchor`` name nothing.
    """

    def infer(node):
        from tensorfuse.ir.registry import OpPatternKind as K
        body = _fused_body(node)
        if len(node.inputs) != len(body.inputs):
            raise ShapeError(f"{len(node.inputs)} inputs but the body takes {len(body.inputs)}")
        for i, (v, b) in enumerate(zip(node.inputs, body.inputs)):
            if v is None:
                raise ShapeError(f"input {i} is omitted; a fused function takes every input")
            if v.type != b.type:
                raise ShapeError(f"input {i} %{v.name} is {v.type} but body input %{b.name} is {b.type}")
        if not body.outputs:
            raise ShapeError("the body has no outputs")
        kind = node.attr("kind")
        if kind not in K.__members__:
            raise ShapeError(f"kind {kind!r} is not an op pattern kind ({', '.join(K.__members__)})")
        anchor = node.attr("anchor", "")
        if anchor and not any(n.name == anchor for n in body.nodes):
            raise ShapeError(f"anchor {anchor!r} names no node of the body")
        return [v.type for v in body.outputs]

    def reference(node, ins):
        from tensorfuse.ir.registry import run_reference
        body = _fused_body(node)
        env = {id(b): a for b, a in zip(body.inputs, ins)}
        env.update({id(v): v.data for v in body.constants.values()})
        for n in body.nodes:
            outs = run_reference(n, [None if v is None else env[id(v)] for v in n.inputs])
            env.update({id(o): a for o, a in zip(n.outputs, outs)})
        return [env[id(v)] for v in body.outputs]

    lower = lower_fused_function

    def flops(node):
        total = 0.0
        for n in _fused_body(node).nodes:
            od = n.opdef
            total += od.flops(n) if od.flops is not None else float(n.outputs[0].type.numel if n.outputs else 0)
        return total
