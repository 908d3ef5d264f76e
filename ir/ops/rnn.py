"""Recurrent layers: RNN, GRU, LSTM (ONNX operator spec, sections "RNN", "GRU" and "LSTM";
versions 7, 14 (adds ``layout``) and 22 (adds bfloat16) have the same equations).

Shapes (layout=0; layout=1 swaps the first two axes of X, initial_h/c, Y_h/c and puts batch
first in Y as [batch, seq, num_directions, hidden]):

- X: [seq_length, batch, input_size]; W: [num_directions, G*hidden, input_size];
  R: [num_directions, G*hidden, hidden]; B (optional): [num_directions, 2*G*hidden]
  (Wb then Rb); sequence_lens (optional, int32): [batch]; initial_h / initial_c (optional):
  [num_directions, batch, hidden]; P (LSTM, optional): [num_directions, 3*hidden].
- Y: [seq_length, num_directions, batch, hidden]; Y_h / Y_c: [num_directions, batch, hidden].

G is the number of gates: 1 (RNN), 3 (GRU: z, r, h), 4 (LSTM: i, o, f, c). num_directions is
2 for direction="bidirectional", else 1. ``sequence_lens`` may be computed at run time: each
batch entry runs its own number of steps (the reverse direction starts at its last valid
step); Y is zero past a sequence's length and Y_h / Y_c hold the state after its last valid
step. Lengths outside [0, seq_length] are a ShapeError when known at compile time and are
clamped into that range at run time.

Activations (case-insensitive names; ``activation_alpha`` / ``activation_beta`` are consumed
in the order of the ``activations`` list by the functions that take them, as onnxruntime
does; missing ones take the ONNX operators' defaults, as the spec says: LeakyRelu 0.01,
ThresholdedRelu 1, HardSigmoid 0.2/0.5, Elu 1, Affine 1/0, ScaledTanh 1/1; onnxruntime
instead uses 0 for Affine, ScaledTanh and ThresholdedRelu): Relu, Tanh, Sigmoid, Affine
(alpha*x+beta), LeakyRelu, ThresholdedRelu, ScaledTanh (alpha*tanh(beta*x)), HardSigmoid,
Elu, Softsign, Softplus. ``clip`` bounds the input of every gate activation to [-clip, clip]
(LSTM's h, applied to the cell state, is not clipped, nor is the cell state: as onnxruntime).

Numerics: float16 / bfloat16 compute in float32 (the recurrent state included) and round
once per stored output; float32 and float64 compute at their own precision.

Lowering: one kernel per node. For each direction and batch entry the hidden (and cell)
state lives in local buffers; each time step computes the gate pre-activations as dot
products over the contiguous rows of W and R into a local gate buffer, then updates the
state elementwise and stores one row of Y. A dot product of at least two vectors runs in
``dot_lanes`` partial sums (a knob; default one vector of the compute dtype,
``target.lanes``: 8 f32 on AVX2, 16 on AVX-512, 1 on cuda, where no knob is declared).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tensorfuse.ir.kernel import Buffer, Expr, KernelBuilder, as_expr, maximum, minimum, select, unop
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

I64 = DType.i64
_FLOATS = (DType.f16, DType.bf16, DType.f32, DType.f64)

#: gates per op, activation functions per direction, default activations, optional inputs
_SPEC = {
    "RNN": dict(gates=1, nacts=1, acts=["Tanh"]),
    "GRU": dict(gates=3, nacts=2, acts=["Sigmoid", "Tanh"]),
    "LSTM": dict(gates=4, nacts=3, acts=["Sigmoid", "Tanh", "Tanh"]),
}


# ----------------------------------------------------------------------------- activations
def _sigmoid_np(x):
    return 1 / (1 + np.exp(-x))


def _softplus_np(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _one(x):
    return as_expr(1.0, x.dtype)


#: lower-case name -> (uses alpha, uses beta, default alpha, default beta, numpy fn, Expr fn)
ACTIVATIONS: dict[str, tuple] = {
    "relu": (False, False, 0.0, 0.0, lambda x, a, b: np.maximum(x, 0),
             lambda x, a, b: maximum(x, 0.0)),
    "tanh": (False, False, 0.0, 0.0, lambda x, a, b: np.tanh(x), lambda x, a, b: unop("tanh", x)),
    "sigmoid": (False, False, 0.0, 0.0, lambda x, a, b: _sigmoid_np(x),
                lambda x, a, b: _one(x) / (unop("exp", -x) + 1.0)),
    "affine": (True, True, 1.0, 0.0, lambda x, a, b: x * a + b, lambda x, a, b: x * a + b),
    "leakyrelu": (True, False, 0.01, 0.0, lambda x, a, b: np.where(x < 0, x * a, x),
                  lambda x, a, b: select(x < 0, x * a, x)),
    "thresholdedrelu": (True, False, 1.0, 0.0, lambda x, a, b: np.where(x > a, x, 0),
                        lambda x, a, b: select(x > a, x, as_expr(0.0, x.dtype))),
    "scaledtanh": (True, True, 1.0, 1.0, lambda x, a, b: a * np.tanh(x * b),
                   lambda x, a, b: unop("tanh", x * b) * a),
    "hardsigmoid": (True, True, 0.2, 0.5, lambda x, a, b: np.clip(x * a + b, 0, 1),
                    lambda x, a, b: maximum(minimum(x * a + b, 1.0), 0.0)),
    "elu": (True, False, 1.0, 0.0, lambda x, a, b: np.where(x < 0, a * np.expm1(x), x),
            lambda x, a, b: select(x < 0, unop("expm1", x) * a, x)),
    "softsign": (False, False, 0.0, 0.0, lambda x, a, b: x / (1 + np.abs(x)),
                 lambda x, a, b: x / (unop("abs", x) + 1.0)),
    "softplus": (False, False, 0.0, 0.0, lambda x, a, b: _softplus_np(x),
                 lambda x, a, b: maximum(x, 0.0) + unop("log1p", unop("exp", -unop("abs", x)))),
}


class Act:
    """One activation function with its alpha and beta, usable on numpy arrays and Exprs."""

    def __init__(self, name: str, alpha: float, beta: float, clip: float | None):
        self.name, self.alpha, self.beta, self.clip = name, alpha, beta, clip
        spec = ACTIVATIONS[name.lower()]
        self._np, self._ex = spec[4], spec[5]
        self.key = (name.lower(), alpha, beta, clip)

    def np(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        if self.clip is not None:
            x = np.clip(x, t(-self.clip), t(self.clip))
        with np.errstate(over="ignore"):
            return self._np(x, t(self.alpha), t(self.beta)).astype(x.dtype)

    def expr(self, x: Expr) -> Expr:
        if self.clip is not None:
            x = maximum(minimum(x, self.clip), -self.clip)
        return self._ex(x, self.alpha, self.beta)


def _attrs(node) -> dict:
    """Validated attributes: direction, num_directions, activations per direction, clip ..."""
    spec = _SPEC[node.op]
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ShapeError(f"direction={direction!r}: must be 'forward', 'reverse' or 'bidirectional'")
    nd = 2 if direction == "bidirectional" else 1
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        raise ShapeError(f"layout={layout}: must be 0 or 1")
    clip = node.attr("clip", None)
    if clip is not None:
        clip = float(clip)
        if not clip > 0:
            raise ShapeError(f"clip={clip}: must be a positive threshold")
    # the attribute as set (RNN's schema default ["Tanh", "Tanh"] is the bidirectional one)
    names = list(node.attrs.get("activations") or [])
    k = spec["nacts"]
    if not names:
        names = spec["acts"] * nd
    elif node.op == "RNN" and nd == 1 and len(names) == 2:
        names = names[:1]      # the schema's default ["Tanh", "Tanh"] written out on a forward RNN
    elif len(names) != k * nd:
        raise ShapeError(f"activations has {len(names)} entries; {node.op} with direction={direction!r} "
                         f"takes {k * nd} ({k} per direction)")
    alphas = [float(a) for a in (node.attr("activation_alpha", None) or [])]
    betas = [float(b) for b in (node.attr("activation_beta", None) or [])]
    acts = []
    for n in names:
        if not isinstance(n, str) or n.lower() not in ACTIVATIONS:
            raise ShapeError(f"activation {n!r} is not supported (one of: Relu, Tanh, Sigmoid, Affine, LeakyRelu, "
                             f"ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)")
        ua, ub, da, db = ACTIVATIONS[n.lower()][:4]
        a = alphas.pop(0) if ua and alphas else da
        b = betas.pop(0) if ub and betas else db
        # LSTM's h (applied to the cell state, not to a gate) is not clipped: onnxruntime's
        # reading of "clip bounds the input of activations"
        unclipped = node.op == "LSTM" and len(acts) % k == 2
        acts.append(Act(n, a, b, None if unclipped else clip))
    if direction == "forward":
        reverse = [False]
    elif direction == "reverse":
        reverse = [True]
    else:
        reverse = [False, True]
    input_forget = bool(node.attr("input_forget", 0)) if node.op == "LSTM" else False
    lbr = bool(node.attr("linear_before_reset", 0)) if node.op == "GRU" else False
    return dict(nd=nd, layout=layout, acts=[acts[d * k:(d + 1) * k] for d in range(nd)],
                reverse=reverse, input_forget=input_forget, lbr=lbr, gates=spec["gates"])


# ----------------------------------------------------------------------------- inference
def _dims(node) -> tuple[int, int, int, int, int]:
    """(seq_length, batch, input_size, hidden, num_directions), checking every input's shape."""
    a = _attrs(node)
    G, nd = a["gates"], a["nd"]
    x, w, r = node.input(0), node.input(1), node.input(2)
    if x is None or w is None or r is None:
        raise ShapeError("inputs X, W and R are required")
    for v, what in ((x, "X"), (w, "W"), (r, "R")):
        if v.type.rank != 3:
            raise ShapeError(f"{what} must be 3-D, got shape {list(v.shape)}")
    S, Bt, I = x.shape if a["layout"] == 0 else (x.shape[1], x.shape[0], x.shape[2])
    H = r.shape[2]
    hs = node.attr("hidden_size", None)
    if hs is not None and int(hs) != H:
        raise ShapeError(f"hidden_size={hs} but R has shape {list(r.shape)} (hidden size {H})")
    if tuple(w.shape) != (nd, G * H, I):
        raise ShapeError(f"W has shape {list(w.shape)}, expected {[nd, G * H, I]} "
                         f"([num_directions, {G}*hidden_size, input_size])")
    if tuple(r.shape) != (nd, G * H, H):
        raise ShapeError(f"R has shape {list(r.shape)}, expected {[nd, G * H, H]} "
                         f"([num_directions, {G}*hidden_size, hidden_size])")
    dt = x.dtype
    if dt not in _FLOATS:
        raise ShapeError(f"dtype {dt} is not supported (f16, bf16, f32, f64)")
    state = (nd, Bt, H) if a["layout"] == 0 else (Bt, nd, H)
    expect = {3: ("B", (nd, 2 * G * H)), 5: ("initial_h", state)}
    if node.op == "LSTM":
        expect[6] = ("initial_c", state)
        expect[7] = ("P", (nd, 3 * H))
    for i, (what, shape) in expect.items():
        v = node.input(i)
        if v is None:
            continue
        if v.dtype != dt:
            raise ShapeError(f"{what} has dtype {v.dtype}, X has {dt}")
        if tuple(v.shape) != shape:
            raise ShapeError(f"{what} has shape {list(v.shape)}, expected {list(shape)}")
    for v, what in ((w, "W"), (r, "R")):
        if v.dtype != dt:
            raise ShapeError(f"{what} has dtype {v.dtype}, X has {dt}")
    sl = node.input(4)
    if sl is not None:
        if sl.dtype != DType.i32:
            raise ShapeError(f"sequence_lens must be int32, got {sl.dtype}")
        if tuple(sl.shape) != (Bt,):
            raise ShapeError(f"sequence_lens has shape {list(sl.shape)}, expected [{Bt}] ([batch_size])")
        lens = sl.const_value()
        if lens is not None and lens.size and (lens.min() < 0 or lens.max() > S):
            raise ShapeError(f"sequence_lens {lens.tolist()} must lie in [0, seq_length={S}]")
    return S, Bt, I, H, nd


def _infer(node) -> list[TensorType]:
    S, Bt, _, H, nd = _dims(node)
    dt = node.inputs[0].dtype
    if node.attr("layout", 0):
        y, st = (Bt, S, nd, H), (Bt, nd, H)
    else:
        y, st = (S, nd, Bt, H), (nd, Bt, H)
    outs = [TensorType(dt, y), TensorType(dt, st)]
    if node.op == "LSTM":
        outs.append(TensorType(dt, st))
    return outs


def _flops(node) -> float:
    S, Bt, I, H, nd = _dims(node)
    return 2.0 * S * Bt * nd * _SPEC[node.op]["gates"] * H * (I + H)


# ----------------------------------------------------------------------------- reference
def _reference(node, ins) -> list[np.ndarray]:
    """Direct transcription of the spec's equations, one batch entry and step at a time."""
    a = _attrs(node)
    ins = list(ins) + [None] * (8 - len(ins))
    X, W, R, Bv, sl, h0, c0, P = ins
    dt = X.dtype
    cd = np.float32 if dt.itemsize < 4 else dt
    if a["layout"]:
        X = np.swapaxes(X, 0, 1)
        h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
    S, Bt, _ = X.shape
    nd, H, G = a["nd"], R.shape[-1], a["gates"]
    X, W, R = X.astype(cd), W.astype(cd), R.astype(cd)
    Bv = np.zeros((nd, 2 * G * H), cd) if Bv is None else Bv.astype(cd)
    P = np.zeros((nd, 3 * H), cd) if P is None else P.astype(cd)
    h0 = np.zeros((nd, Bt, H), cd) if h0 is None else h0.astype(cd)
    c0 = np.zeros((nd, Bt, H), cd) if c0 is None else c0.astype(cd)
    lens = np.full(Bt, S) if sl is None else np.clip(sl.astype(np.int64), 0, S)
    Y = np.zeros((S, nd, Bt, H), cd)
    Yh = np.zeros((nd, Bt, H), cd)
    Yc = np.zeros((nd, Bt, H), cd)
    for d in range(nd):
        acts = a["acts"][d]
        wb, rb = Bv[d, :G * H], Bv[d, G * H:]
        for b in range(Bt):
            h, c = h0[d, b].copy(), c0[d, b].copy()
            L = int(lens[b])
            for s in range(L):
                t = L - 1 - s if a["reverse"][d] else s
                x = X[t, b]
                if node.op == "RNN":
                    h = acts[0].np(W[d] @ x + R[d] @ h + wb + rb)
                elif node.op == "GRU":
                    f, g = acts
                    gx = W[d] @ x + wb
                    z = f.np(gx[:H] + R[d, :H] @ h + rb[:H])
                    r = f.np(gx[H:2 * H] + R[d, H:2 * H] @ h + rb[H:2 * H])
                    if a["lbr"]:
                        hh = g.np(gx[2 * H:] + r * (R[d, 2 * H:] @ h + rb[2 * H:]))
                    else:
                        hh = g.np(gx[2 * H:] + R[d, 2 * H:] @ (r * h) + rb[2 * H:])
                    h = (1 - z) * hh + z * h
                else:
                    f, g, hf = acts
                    gates = W[d] @ x + R[d] @ h + wb + rb
                    pi, po, pf = P[d, :H], P[d, H:2 * H], P[d, 2 * H:]
                    i = f.np(gates[:H] + pi * c)
                    ff = 1 - i if a["input_forget"] else f.np(gates[2 * H:3 * H] + pf * c)
                    cc = g.np(gates[3 * H:])
                    c = ff * c + i * cc
                    o = f.np(gates[H:2 * H] + po * c)
                    h = o * hf.np(c)
                Y[t, d, b] = h
            Yh[d, b], Yc[d, b] = h, c
    if a["layout"]:
        Y = Y.transpose(2, 0, 1, 3)
        Yh, Yc = np.swapaxes(Yh, 0, 1), np.swapaxes(Yc, 0, 1)
    outs = [Y.astype(dt), Yh.astype(dt), Yc.astype(dt)]
    return outs[:len(node.outputs) or 3]


# ----------------------------------------------------------------------------- lowering
def _dot_into(kb: KernelBuilder, s: Buffer, n: int, la: Callable, lb: Callable, lanes: int) -> None:
    """s[l] += sum over k = l (mod lanes) of la(k) * lb(k). ``lanes`` partial sums make the
    loop vectorisable without reassociating the sum; lanes=1 is a plain scalar loop."""
    main = n - n % lanes if lanes > 1 else 0
    if main:
        with kb.loop(main // lanes, hint="kb") as kb_:
            with kb.loop(lanes, kind="vectorize", hint="l") as l:
                k = kb_ * lanes + l
                kb.store(s, l, s[l] + la(k) * lb(k))
    if main < n:
        with kb.loop(n, start=main, hint="k") as k:
            kb.store(s, 0, s[0] + la(k) * lb(k))


def _lower(ctx: LowerCtx) -> None:
    node = ctx.node
    a = _attrs(node)
    S, Bt, I, H, nd = _dims(node)
    G, lay = a["gates"], a["layout"]
    ins = list(ctx.inputs) + [None] * (8 - len(ctx.inputs))
    x, w, r, bias, sl, h0, c0, p = ins
    outs = list(ctx.outputs) + [None] * (3 - len(ctx.outputs))
    y, yh, yc = outs
    if node.op != "LSTM":
        yc = None
    dt = x.dtype
    cd = DType.f32 if dt in (DType.f16, DType.bf16) else dt
    kb = ctx.kernel()
    hbuf = kb.local(cd, (H,), hint="h")
    cbuf = kb.local(cd, (H,), hint="c") if node.op == "LSTM" else None
    gates = kb.local(cd, (G * H,), hint="gates")
    tmp = kb.local(cd, (H,), hint="rh") if node.op == "GRU" and not a["lbr"] else None
    # dot products in ``lanes`` partial sums (vectorisable without reassociating the sum): one
    # vector of the compute dtype by default; dot products shorter than two vectors run as
    # scalar loops (less code, as fast)
    L = ctx.target.lanes(cd)
    lanes_all = knob("dot_lanes", [c for c in (1, L // 2, L, 2 * L) if c >= 1], L,
                     doc="partial sums of each gate's dot product") if L > 1 else 1
    s = kb.local(cd, (lanes_all,), hint="dot")
    ln = kb.local(I64, (1,), hint="len")

    def ld(buf, off):
        return buf.flat(off).cast(cd) if buf.dtype != cd else buf.flat(off)

    def x_at(t, b, k):
        return ld(x, ((t * Bt + b) if lay == 0 else (b * S + t)) * I + k)

    def state_off(d, b, j):
        return ((d * Bt + b) if lay == 0 else (b * nd + d)) * H + j

    def y_off(t, d, b, j):
        return (((t * nd + d) * Bt + b) if lay == 0 else ((b * S + t) * nd + d)) * H + j

    def bias_at(d, k):   # k indexes [Wb; Rb] of direction d
        return ld(bias, d * 2 * G * H + k) if bias is not None else as_expr(0.0, cd)

    def gate_sum(d, g, b, t, hvec, with_x=True, with_r=True, w_bias=True, r_bias=True):
        """bias + W[d, g, :] . x[t, b, :] + R[d, g, :] . hvec (each part optional)."""
        n = max(I if with_x else 0, H if with_r else 0)
        lanes = lanes_all if n >= 2 * lanes_all else 1
        with kb.loop(lanes, kind="vectorize", hint="l") as l:
            kb.store(s, l, as_expr(0.0, cd))
        if with_x:
            _dot_into(kb, s, I, lambda k: ld(w, (d * G * H + g) * I + k), lambda k: x_at(t, b, k), lanes)
        if with_r:
            _dot_into(kb, s, H, lambda k: ld(r, (d * G * H + g) * H + k), lambda k: hvec.flat(k), lanes)
        total = s.flat(0)
        for l in range(1, lanes):
            total = total + s.flat(l)
        if w_bias:
            total = total + bias_at(d, g)
        if r_bias:
            total = total + bias_at(d, G * H + g)
        return total

    def directions():
        """(direction index, reverse?, activations) per direction: one loop over both when
        they share their activations (half the code), else each emitted on its own."""
        if nd == 2 and [x.key for x in a["acts"][0]] == [x.key for x in a["acts"][1]]:
            with kb.loop(2, hint="d") as dv:
                yield dv, dv.eq(1), a["acts"][0]
        else:
            for d in range(nd):
                yield d, a["reverse"][d], a["acts"][d]

    for d, rev, acts in directions():
        with kb.loop(Bt, hint="b") as b:
            if sl is not None:
                kb.store(ln, 0, minimum(maximum(sl.flat(b).cast(I64), 0), S))
            else:
                kb.store(ln, 0, as_expr(S, I64))
            L = ln[0]
            with kb.loop(H, kind="vectorize", hint="j") as j:
                kb.store(hbuf, j, ld(h0, state_off(d, b, j)) if h0 is not None else as_expr(0.0, cd))
                if cbuf is not None:
                    kb.store(cbuf, j, ld(c0, state_off(d, b, j)) if c0 is not None else as_expr(0.0, cd))
            with kb.loop(L, hint="s") as st:
                t = select(rev, L - 1 - st, st) if isinstance(rev, Expr) else (L - 1 - st) if rev else st
                if node.op == "RNN":
                    with kb.loop(H, hint="g") as g:
                        kb.store(gates, g, gate_sum(d, g, b, t, hbuf))
                    with kb.loop(H, hint="j") as j:
                        kb.store(hbuf, j, acts[0].expr(gates[j]))
                elif node.op == "GRU":
                    f, gact = acts
                    with kb.loop(2 * H, hint="g") as g:
                        kb.store(gates, g, gate_sum(d, g, b, t, hbuf))
                    with kb.loop(H, hint="j") as j:   # r gate, activated in place
                        kb.store(gates, H + j, f.expr(gates[H + j]))
                    if a["lbr"]:
                        with kb.loop(H, hint="j") as j:
                            g = j + 2 * H
                            rh = gate_sum(d, g, b, t, hbuf, with_x=False, w_bias=False)
                            kb.store(gates, g, rh)
                            xh = gate_sum(d, g, b, t, hbuf, with_r=False, r_bias=False)
                            kb.store(gates, g, xh + gates[H + j] * gates[g])
                    else:
                        with kb.loop(H, kind="vectorize", hint="j") as j:
                            kb.store(tmp, j, gates[H + j] * hbuf[j])
                        with kb.loop(H, hint="j") as j:
                            kb.store(gates, j + 2 * H, gate_sum(d, j + 2 * H, b, t, tmp))
                    with kb.loop(H, hint="j") as j:
                        z = f.expr(gates[j])
                        hh = gact.expr(gates[2 * H + j])
                        kb.store(hbuf, j, (_one(z) - z) * hh + z * hbuf[j])
                else:
                    f, gact, hact = acts

                    def peep(k, j):
                        return ld(p, d * 3 * H + k * H + j) if p is not None else None

                    with kb.loop(G * H, hint="g") as g:
                        kb.store(gates, g, gate_sum(d, g, b, t, hbuf))
                    with kb.loop(H, hint="j") as j:
                        cprev = cbuf[j]
                        pre_i = gates[j] if p is None else gates[j] + peep(0, j) * cprev
                        kb.store(gates, j, f.expr(pre_i))          # i
                        i_ = gates[j]
                        if a["input_forget"]:
                            ff = _one(i_) - i_
                        else:
                            pre_f = gates[2 * H + j]
                            ff = f.expr(pre_f if p is None else pre_f + peep(2, j) * cprev)
                        cc = gact.expr(gates[3 * H + j])
                        kb.store(cbuf, j, ff * cprev + i_ * cc)
                        cnew = cbuf[j]
                        pre_o = gates[H + j] if p is None else gates[H + j] + peep(1, j) * cnew
                        kb.store(hbuf, j, f.expr(pre_o) * hact.expr(cnew))
                if y is not None:
                    with kb.loop(H, kind="vectorize", hint="j") as j:
                        kb.store(y, y_off(t, d, b, j), hbuf[j].cast(dt) if cd != dt else hbuf[j])
            if y is not None:   # steps past this sequence's length are zero
                with kb.loop(S, start=L, hint="t") as t:
                    with kb.loop(H, kind="vectorize", hint="j") as j:
                        kb.store(y, y_off(t, d, b, j), as_expr(0.0, dt))
            for out, buf in ((yh, hbuf), (yc, cbuf)):
                if out is not None:
                    with kb.loop(H, kind="vectorize", hint="j") as j:
                        kb.store(out, state_off(d, b, j), buf[j].cast(dt) if cd != dt else buf[j])


# ----------------------------------------------------------------------------- ops
@op("RNN", OpPatternKind.OPAQUE)
class RNN:
    """Simple recurrent layer: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb), f = Tanh by default.
    ONNX spec: RNN-22 (RNN-7 and -14 import unchanged; -14 added ``layout``).

    Inputs X, W, R, B?, sequence_lens?, initial_h?; outputs Y, Y_h (shapes in the module
    docstring, G = 1). dtypes f16, bf16, f32, f64 (one for all), sequence_lens int32. Raises
    ShapeError for inconsistent shapes or dtypes, an unknown direction or activation, a wrong
    number of activations, layout other than 0/1, clip <= 0, hidden_size differing from R's,
    or compile-time sequence_lens outside [0, seq_length].
    """
    infer = _infer
    reference = _reference
    lower = _lower
    flops = _flops


@op("GRU", OpPatternKind.OPAQUE)
class GRU:
    """Gated recurrent unit. ONNX spec: GRU-22 (GRU-7 and -14 import unchanged; -14 added
    ``layout``). Gates z, r, h (W, R, B rows in that order); f = Sigmoid, g = Tanh by default:

        z = f(X W_z^T + H R_z^T + Wb_z + Rb_z);  r = f(X W_r^T + H R_r^T + Wb_r + Rb_r)
        h = g(X W_h^T + (r * H) R_h^T + Rb_h + Wb_h)          linear_before_reset = 0
        h = g(X W_h^T + r * (H R_h^T + Rb_h) + Wb_h)          linear_before_reset != 0
        H' = (1 - z) * h + z * H

    Inputs X, W, R, B?, sequence_lens?, initial_h?; outputs Y, Y_h (module docstring, G = 3).
    dtypes and errors as RNN.
    """
    infer = _infer
    reference = _reference
    lower = _lower
    flops = _flops


@op("LSTM", OpPatternKind.OPAQUE)
class LSTM:
    """Long short-term memory. ONNX spec: LSTM-22 (LSTM-7 and -14 import unchanged; -14
    added ``layout``). Gates i, o, f, c (W, R, B rows in that order), peepholes P = [Pi, Po,
    Pf]; f = Sigmoid, g = Tanh, h = Tanh by default:

        i = f(X W_i^T + H R_i^T + Pi * C + Wb_i + Rb_i)
        f_t = f(X W_f^T + H R_f^T + Pf * C + Wb_f + Rb_f)     (1 - i when input_forget != 0)
        c = g(X W_c^T + H R_c^T + Wb_c + Rb_c);  C' = f_t * C + i * c
        o = f(X W_o^T + H R_o^T + Po * C' + Wb_o + Rb_o);  H' = o * h(C')

    Inputs X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?; outputs Y, Y_h, Y_c
    (module docstring, G = 4). dtypes and errors as RNN.
    """
    infer = _infer
    reference = _reference
    lower = _lower
    flops = _flops
