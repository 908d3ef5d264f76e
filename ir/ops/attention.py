"""ONNX ``Attention`` (opsets 23, 24, 25) and ``RotaryEmbedding`` (opset 23).

Attention (ONNX spec, "Attention"): scaled dot-product attention with grouped-query heads,
an optional boolean or additive mask, causal and sliding-window masking, an internal KV cache
(``past_key``/``past_value`` -> ``present_key``/``present_value``), an external cache
(``nonpad_kv_seqlen``), a logit soft cap and the optional ``qk_matmul_output``.

Shapes (B batch, Hq/Hkv query/key-value heads, Sq/Skv sequence lengths, P past length,
T = P + Skv, D head size of Q and K, Dv head size of V):

- 4-D inputs: Q [B, Hq, Sq, D], K [B, Hkv, Skv, D], V [B, Hkv, Skv, Dv]; Y [B, Hq, Sq, Dv].
- 3-D inputs: Q [B, Sq, Hq*D], K [B, Skv, Hkv*D], V [B, Skv, Hkv*Dv] with the attributes
  ``q_num_heads`` and ``kv_num_heads``; Y [B, Sq, Hq*Dv].
- ``attn_mask`` broadcasts (right-aligned) to [B, Hq, Sq, T]; its last dimension may be
  shorter than T (the missing keys are masked out). ``past_key`` [B, Hkv, P, D],
  ``past_value`` [B, Hkv, P, Dv]; ``present_*`` are the past concatenated with K/V along the
  sequence axis (always 4-D). ``qk_matmul_output`` [B, Hq, Sq, T]. ``nonpad_kv_seqlen`` [B].

Semantics, per query row (b, h, i) and key j (query head h reads key-value head
h // (Hq / Hkv)): ``x = (Q.K) * scale`` (default 1/sqrt(D)); with ``softcap`` > 0,
``x = softcap * tanh(x / softcap)``. Key j is *allowed* unless the boolean mask is false there,
j is beyond the mask's last dimension, ``is_causal`` and j > i + offset, the window bounds
exclude it (``i + offset - j <= left_window_size``, ``j - i - offset <= right_window_size``,
-1 = unbounded) or j >= nonpad_kv_seqlen[b]. ``offset`` is P with a past cache,
nonpad_kv_seqlen[b] - Sq with an external cache, else 0. The score is x + float mask where
allowed, -inf elsewhere; softmax over j (in ``softmax_precision``, float32 at least); a row
whose bias is -inf at every key gives zeros (Y and mode-3 output), never NaN. Y = P @ V.
``qk_matmul_output_mode``: 0 the raw scaled Q.K, 1 after the soft cap, 2 the masked scores,
3 the softmax probabilities.

Dtypes: Q, K, V, past_* one float dtype (f16, bf16, f32, f64); mask bool or numeric;
nonpad_kv_seqlen int64. f16/bf16 compute in float32 (probabilities rounded to the input dtype
before the product with V, as the spec's function body does).

Errors (ShapeError): ranks other than 3/4 or not all equal, missing head-count attributes for
3-D inputs, head counts that do not divide, Q/K head sizes that differ, a mask that does not
broadcast, past_key without past_value, past cache together with nonpad_kv_seqlen, mixed dtypes.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import as_expr, fma, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

_FLOATS = (DType.f16, DType.bf16, DType.f32, DType.f64)
_PRECISION = {1: DType.f32, 10: DType.f16, 11: DType.f64, 16: DType.bf16}


# ----------------------------------------------------------------------------- geometry
class _Geo:
    """Shapes of one Attention node, validated (see module docstring for the letters)."""

    def __init__(self, node):
        ins = node.inputs + [None] * (7 - len(node.inputs))
        q, k, v, mask, pk, pv, nonpad = ins[:7]
        if q is None or k is None or v is None:
            raise ShapeError("Q, K and V are required")
        r = q.type.rank
        if r not in (3, 4) or k.type.rank != r or v.type.rank != r:
            raise ShapeError(f"Q, K, V must all be 3-D or all 4-D, got ranks {q.type.rank}, {k.type.rank}, {v.type.rank}")
        dt = q.dtype
        if dt not in _FLOATS:
            raise ShapeError(f"Q has dtype {dt}; Attention takes f16, bf16, f32 or f64")
        for name, x in (("K", k), ("V", v), ("past_key", pk), ("past_value", pv)):
            if x is not None and x.dtype != dt:
                raise ShapeError(f"{name} has dtype {x.dtype} but Q has {dt}; tensorfuse needs one dtype")
        self.rank = r
        self.dtype = dt
        qh, kvh = node.attr("q_num_heads"), node.attr("kv_num_heads")
        if r == 3:
            if qh is None or kvh is None:
                raise ShapeError("3-D Q/K/V need the attributes q_num_heads and kv_num_heads")
            if qh <= 0 or kvh <= 0:
                raise ShapeError(f"head counts must be positive, got q_num_heads={qh}, kv_num_heads={kvh}")
            self.B, self.Sq = q.shape[0], q.shape[1]
            self.Skv = k.shape[1]
            for name, x, h in (("Q", q, qh), ("K", k, kvh), ("V", v, kvh)):
                if x.shape[2] % h:
                    raise ShapeError(f"{name} hidden size {x.shape[2]} is not a multiple of its {h} heads")
            self.Hq, self.Hkv = qh, kvh
            self.D, self.Dk, self.Dv = q.shape[2] // qh, k.shape[2] // kvh, v.shape[2] // kvh
            if k.shape[0] != self.B or v.shape[0] != self.B or v.shape[1] != self.Skv:
                raise ShapeError(f"Q {list(q.shape)}, K {list(k.shape)}, V {list(v.shape)} disagree on batch or kv length")
        else:
            self.B, self.Hq, self.Sq, self.D = q.shape
            _, self.Hkv, self.Skv, self.Dk = k.shape
            self.Dv = v.shape[3]
            if k.shape[0] != self.B or v.shape[:3] != k.shape[:3]:
                raise ShapeError(f"Q {list(q.shape)}, K {list(k.shape)}, V {list(v.shape)} disagree on batch, heads or kv length")
            if qh is not None and qh != self.Hq or kvh is not None and kvh != self.Hkv:
                raise ShapeError(f"q_num_heads={qh}/kv_num_heads={kvh} contradict the 4-D shapes "
                                 f"({self.Hq}/{self.Hkv} heads)")
        if self.D != self.Dk:
            raise ShapeError(f"Q head size {self.D} differs from K head size {self.Dk}")
        if self.Hkv == 0 or self.Hq % self.Hkv:
            raise ShapeError(f"{self.Hq} query heads are not a multiple of {self.Hkv} key/value heads")
        if (pk is None) != (pv is None):
            raise ShapeError("past_key and past_value must be given together")
        if pk is not None and nonpad is not None:
            raise ShapeError("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        self.P = 0
        if pk is not None:
            if pk.type.rank != 4 or pv.type.rank != 4:
                raise ShapeError("past_key and past_value must be 4-D")
            self.P = pk.shape[2]
            if pk.shape != (self.B, self.Hkv, self.P, self.D) or pv.shape != (self.B, self.Hkv, self.P, self.Dv):
                raise ShapeError(f"past_key {list(pk.shape)} / past_value {list(pv.shape)} do not match "
                                 f"[{self.B}, {self.Hkv}, P, {self.D}] / [.., {self.Dv}]")
        self.T = self.P + self.Skv
        self.mask_shape = None
        if mask is not None:
            ms = mask.shape
            if not 1 <= len(ms) <= 4:
                raise ShapeError(f"attn_mask must have rank 1 to 4, got {list(ms)}")
            full = (self.B, self.Hq, self.Sq, self.T)
            for d, f in zip(reversed(ms[:-1]), reversed(full[:-1])):
                if d not in (1, f):
                    raise ShapeError(f"attn_mask {list(ms)} does not broadcast to [B, Hq, Sq, T] = {list(full)}")
            if ms[-1] > self.T or ms[-1] == 0:
                raise ShapeError(f"attn_mask's last dimension {ms[-1]} must be 1..{self.T} (the total kv length)")
            self.mask_shape = tuple(ms)
        if nonpad is not None:
            if nonpad.dtype != DType.i64 or nonpad.shape != (self.B,):
                raise ShapeError(f"nonpad_kv_seqlen must be int64 [{self.B}], got {nonpad.type}")
        prec = node.attr("softmax_precision")
        if prec is not None and prec not in _PRECISION:
            raise ShapeError(f"softmax_precision {prec} is not one of 1 (float), 10 (float16), 11 (double), 16 (bfloat16)")
        mode = node.attr("qk_matmul_output_mode", 0)
        if mode not in (0, 1, 2, 3):
            raise ShapeError(f"qk_matmul_output_mode must be 0..3, got {mode}")
        for a in ("left_window_size", "right_window_size"):
            if node.attr(a, -1) < -1:
                raise ShapeError(f"{a} must be -1 or nonnegative, got {node.attr(a)}")
        scale = node.attr("scale")
        if scale is None:
            scale = 1.0 / math.sqrt(self.D)
        # the spec scales Q and K each by sqrt(scale), cast to the input dtype
        ss = float(np.asarray(math.sqrt(scale), dtype=dt.numpy).astype(np.float64))
        self.sqrt_scale = ss
        self.scale = ss * ss


def _soft_dtype(node, dt: DType) -> DType:
    """The dtype the softmax runs in: ``softmax_precision`` if set, else the input's."""
    prec = node.attr("softmax_precision")
    return dt if prec is None else _PRECISION[prec]


def _infer(node) -> list[TensorType]:
    g = _Geo(node)
    dt = g.dtype
    y = (g.B, g.Hq, g.Sq, g.Dv) if g.rank == 4 else (g.B, g.Sq, g.Hq * g.Dv)
    return [TensorType(dt, y), TensorType(dt, (g.B, g.Hkv, g.T, g.D)),
            TensorType(dt, (g.B, g.Hkv, g.T, g.Dv)), TensorType(dt, (g.B, g.Hq, g.Sq, g.T))]


# ----------------------------------------------------------------------------- reference
def _to_4d(x: np.ndarray, heads: int) -> np.ndarray:
    b, s, hid = x.shape
    return x.reshape(b, s, heads, hid // heads).transpose(0, 2, 1, 3)


def _reference(node, ins):
    g = _Geo(node)
    ins = list(ins) + [None] * (7 - len(ins))
    q, k, v, mask, pk, pv, nonpad = ins[:7]
    dt = q.dtype
    lowp = dt == np.float16 or dt.name == "bfloat16"
    sd = _soft_dtype(node, DType.from_numpy(dt)).numpy
    acc = np.float64 if np.float64 in (dt, sd) else np.float32

    def rs(a):      # round to the softmax precision
        return a if sd == acc else a.astype(sd).astype(acc)

    def rd(a):      # round to the input dtype
        return a if dt == acc else a.astype(dt).astype(acc)

    if g.rank == 3:
        q, k, v = _to_4d(q, g.Hq), _to_4d(k, g.Hkv), _to_4d(v, g.Hkv)
    pres_k = k if pk is None else np.concatenate([pk, k], axis=2)
    pres_v = v if pv is None else np.concatenate([pv, v], axis=2)
    rep = g.Hq // g.Hkv
    kk = np.repeat(pres_k, rep, axis=1).astype(acc)
    vv = np.repeat(pres_v, rep, axis=1).astype(acc)
    with np.errstate(all="ignore"):
        if lowp:    # Q and K scaled by sqrt(scale) in their own dtype, as the spec's function body
            ss = dt.type(g.sqrt_scale)
            x = rd(np.matmul((q * ss).astype(acc), np.swapaxes((kk.astype(dt) * ss).astype(acc), -1, -2)))
        else:
            x = np.matmul(q.astype(acc), np.swapaxes(kk, -1, -2)) * acc(g.scale)     # [B,Hq,Sq,T]
        raw = x
        cap = node.attr("softcap", 0.0) or 0.0
        if cap > 0:
            x = rd(cap * np.tanh(rd(x / cap)))
        capped = x
        T, Sq = g.T, g.Sq
        allowed = np.ones((g.B, 1, Sq, T), bool)
        bias = np.zeros((g.B, 1, Sq, T), acc)
        if mask is not None:
            tm = mask.shape[-1]
            m = mask
            if tm < T:
                pad = [(0, 0)] * (m.ndim - 1) + [(0, T - tm)]
                m = np.pad(m, pad, constant_values=False if m.dtype == np.bool_ else -np.inf)
            m = m.reshape((1,) * (4 - m.ndim) + m.shape)
            if mask.dtype == np.bool_:
                allowed = allowed & m
            else:
                bias = bias + m.astype(acc)
                allowed = allowed & np.ones(m.shape, bool)
        if nonpad is not None:
            off = (nonpad.astype(np.int64) - Sq).reshape(g.B, 1, 1, 1)
        else:
            off = np.full((g.B, 1, 1, 1), g.P, np.int64)
        i = np.arange(Sq).reshape(1, 1, Sq, 1)
        j = np.arange(T).reshape(1, 1, 1, T)
        pos = i + off
        if node.attr("is_causal", 0):
            allowed = allowed & (j <= pos)
        left, right = node.attr("left_window_size", -1), node.attr("right_window_size", -1)
        if left >= 0:
            allowed = allowed & (pos - j <= left)
        if right >= 0:
            allowed = allowed & (j - pos <= right)
        if nonpad is not None:
            allowed = allowed & (j < nonpad.reshape(g.B, 1, 1, 1))
        full_bias = np.where(allowed, bias, -np.inf)
        scores = rd(x + rd(full_bias))
        dead = np.all(np.isneginf(full_bias), axis=-1, keepdims=True)
        sr = rs(scores)
        mx = np.max(sr, axis=-1, keepdims=True)
        e = rs(np.exp(rs(sr - np.where(dead, 0, mx))))
        p = rs(e / rs(np.sum(e, axis=-1, keepdims=True)))
        p = np.where(dead, acc(0), p)
        if lowp:
            p = p.astype(dt).astype(acc)
        y = np.matmul(p, vv)
    mode = node.attr("qk_matmul_output_mode", 0)
    qk = {0: raw, 1: capped, 2: np.broadcast_to(scores, raw.shape), 3: p}[mode]
    if g.rank == 3:
        y = y.transpose(0, 2, 1, 3).reshape(g.B, g.Sq, g.Hq * g.Dv)
    return [y.astype(dt), pres_k.astype(dt), pres_v.astype(dt), np.ascontiguousarray(qk).astype(dt)]


# ----------------------------------------------------------------------------- lowering
def _lower(ctx: LowerCtx) -> None:
    node = ctx.node
    g = _Geo(node)
    ins = ctx.inputs + [None] * (7 - len(ctx.inputs))
    q, k, v, mask, pk, pv, nonpad = ins[:7]
    outs = ctx.outputs + [None] * (4 - len(ctx.outputs))
    y, pres_k, pres_v, qk_out = outs[:4]
    dt = g.dtype
    sd = _soft_dtype(node, dt)
    acc = DType.f64 if DType.f64 in (dt, sd) else DType.f32
    lowp = dt in (DType.f16, DType.bf16)

    def rs(e):      # round to the softmax precision
        return e if sd == acc else e.cast(sd).cast(acc)

    def rd(e):      # round to the input dtype (f16/bf16 compute in f32, rounding where ONNX does)
        return e if dt == acc else e.cast(dt).cast(acc)

    rank3 = g.rank == 3
    P, T, Sq, D, Dv = g.P, g.T, g.Sq, g.D, g.Dv
    rep = g.Hq // g.Hkv
    mode = node.attr("qk_matmul_output_mode", 0)
    cap = float(node.attr("softcap", 0.0) or 0.0)
    causal = bool(node.attr("is_causal", 0))
    left, right = node.attr("left_window_size", -1), node.attr("right_window_size", -1)

    def new_k(b, hk, j, d):
        return k[b, j, hk * D + d] if rank3 else k[b, hk, j, d]

    def new_v(b, hk, j, d):
        return v[b, j, hk * Dv + d] if rank3 else v[b, hk, j, d]

    # present_key / present_value: the past followed by the new keys/values
    for pres, past, new, width in ((pres_k, pk, new_k, D), (pres_v, pv, new_v, Dv)):
        if pres is None:
            continue
        kb = ctx.kernel("present_k" if pres is pres_k else "present_v")
        with kb.loop(g.B, kind="parallel", hint="b") as b, kb.loop(g.Hkv, hint="h") as hk:
            if past is not None and P:
                with kb.loop(P, hint="j") as j, kb.loop(width, kind="vectorize", hint="d") as d:
                    kb.store(pres, [b, hk, j, d], past[b, hk, j, d])
            with kb.loop(g.Skv, hint="j") as j, kb.loop(width, kind="vectorize", hint="d") as d:
                kb.store(pres, [b, hk, j + P, d], new(b, hk, j, d))

    def key(b, hk, j, d):
        if pres_k is not None:
            return pres_k[b, hk, j, d]
        if pk is None or P == 0:
            return new_k(b, hk, j, d)
        return select(j < P, pk[b, hk, minimum(j, P - 1), d], new_k(b, hk, maximum(j - P, 0), d))

    def value(b, hk, j, d):
        if pres_v is not None:
            return pres_v[b, hk, j, d]
        if pv is None or P == 0:
            return new_v(b, hk, j, d)
        return select(j < P, pv[b, hk, minimum(j, P - 1), d], new_v(b, hk, maximum(j - P, 0), d))

    def query(b, h, i, d):
        return q[b, i, h * D + d] if rank3 else q[b, h, i, d]

    kb = ctx.kernel()
    s = kb.local(acc, (max(T, 1),), hint="score")
    dot = kb.local(acc, (1,), hint="dot")
    mx = kb.local(acc, (1,), hint="max")
    tot = kb.local(acc, (1,), hint="sum")
    live = kb.local(DType.bool, (1,), hint="live")
    yacc = kb.local(acc, (max(Dv, 1),), hint="yacc")
    ninf = as_expr(-math.inf, acc)
    scale = as_expr(g.scale, acc)
    # dot products of contiguous f32 rows: L-lane partial sums (FMA), added up at the end
    L = ctx.target.lanes(DType.f32)
    vec_dot = (dt == acc == DType.f32 and D >= L and (pres_k is not None or pk is None or P == 0))
    dv = kb.local(acc, (L,), hint="dotv") if vec_dot else None

    def key_row(b, hk, j, d):
        buf = pres_k if pres_k is not None else k
        idx = [b, hk, j, d] if (pres_k is not None or not rank3) else [b, j, hk * D + d]
        return buf.vload(buf.offset(idx), L)

    def query_row(b, h, i, d):
        return q.vload(q.offset([b, i, h * D + d] if rank3 else [b, h, i, d]), L)

    with kb.loop(g.B, kind="parallel", hint="b") as b, kb.loop(g.Hq, hint="h", role="spatial") as h, \
            kb.loop(Sq, hint="i", role="spatial") as i:
        hk = h // rep if rep > 1 else h
        if nonpad is not None:
            npad = nonpad[b]
            pos = i + (npad - Sq)
        else:
            npad = None
            pos = i + P
        kb.store(mx, 0, ninf)
        kb.store(live, 0, as_expr(False, DType.bool))
        with kb.loop(T, hint="j") as j:
            kb.store(dot, 0, as_expr(0.0, acc))
            if vec_dot:
                kb.store(dv, 0, kb.broadcast(as_expr(0.0, acc), L))
                with kb.reduce(D // L, hint="dq") as dq:
                    kb.store(dv, 0, fma(query_row(b, h, i, dq * L), key_row(b, hk, j, dq * L), dv.vload(0, L)))
                total = dv[0]
                for ln in range(1, L):
                    total = total + dv[ln]
                kb.store(dot, 0, total)
            with kb.loop(D, start=(D // L) * L if vec_dot else 0, kind="vectorize", hint="d") as d:
                if lowp:    # Q and K scaled by sqrt(scale) in their own dtype, as the spec's function body
                    qs = (query(b, h, i, d) * as_expr(g.sqrt_scale, dt)).cast(acc)
                    kb.store(dot, 0, dot[0] + qs * (key(b, hk, j, d) * as_expr(g.sqrt_scale, dt)).cast(acc))
                else:
                    kb.store(dot, 0, dot[0] + query(b, h, i, d).cast(acc) * key(b, hk, j, d).cast(acc))
            x = rd(dot[0]) if lowp else dot[0] * scale
            if qk_out is not None and mode == 0:
                kb.store(qk_out, [b, h, i, j], x.cast(dt))
            if cap > 0:
                x = rd(as_expr(cap, acc) * unop("tanh", rd(x / cap)))
            if qk_out is not None and mode == 1:
                kb.store(qk_out, [b, h, i, j], x.cast(dt))
            ok = None

            def conj(c):
                return c if ok is None else ok & c

            bias = None
            if mask is not None:
                ms = g.mask_shape
                tm = ms[-1]
                full = [b, h, i]
                idx = [as_expr(0) if d_ == 1 else full[len(full) - (len(ms) - 1) + n]
                       for n, d_ in enumerate(ms[:-1])]
                idx.append(minimum(j, tm - 1) if tm < T else j)
                mval = mask[idx]
                if tm < T:
                    ok = conj(j < tm)
                if mask.dtype == DType.bool:
                    ok = conj(mval)
                else:
                    bias = mval.cast(acc)
            if causal:
                ok = conj(j <= pos)
            if left >= 0:
                ok = conj(pos - j <= left)
            if right >= 0:
                ok = conj(j - pos <= right)
            if npad is not None:
                ok = conj(j < npad)
            score = x if bias is None else rd(x + rd(bias))
            attend = None
            if bias is not None:
                attend = bias > ninf
            if ok is not None:
                score = select(ok, score, ninf)
                attend = ok if attend is None else ok & attend
            if qk_out is not None and mode == 2:
                kb.store(qk_out, [b, h, i, j], score.cast(dt))
            kb.store(s, j, rs(score))
            kb.store(mx, 0, maximum(mx[0], s[j]))
            kb.store(live, 0, live[0] | (as_expr(True, DType.bool) if attend is None else attend))
        # softmax over the row; a row with no attendable key is all zeros
        kb.store(tot, 0, as_expr(0.0, acc))
        m0 = select(live[0], mx[0], as_expr(0.0, acc))
        with kb.loop(T, hint="j") as j:
            kb.store(s, j, rs(unop("exp", rs(s[j] - m0))))
            kb.store(tot, 0, tot[0] + s[j])
        with kb.loop(max(Dv, 0), kind="vectorize", hint="d") as d:
            kb.store(yacc, d, as_expr(0.0, acc))
        with kb.loop(T, hint="j") as j:
            p = select(live[0], rs(s[j] / rs(tot[0])), as_expr(0.0, acc))
            if lowp:
                p = p.cast(dt).cast(acc)
            kb.store(s, j, p)
            if qk_out is not None and mode == 3:
                kb.store(qk_out, [b, h, i, j], s[j].cast(dt))
            with kb.loop(Dv, kind="vectorize", hint="d") as d:
                kb.store(yacc, d, yacc[d] + s[j] * value(b, hk, j, d).cast(acc))
        with kb.loop(Dv, kind="vectorize", hint="d") as d:
            yi = [b, i, h * Dv + d] if rank3 else [b, h, i, d]
            kb.store(y, yi, yacc[d].cast(dt))


def _flops(node) -> float:
    g = _Geo(node)
    return 2.0 * g.B * g.Hq * g.Sq * g.T * (g.D + g.Dv)


@op("Attention", OpPatternKind.OPAQUE)
class Attention:
    """Scaled dot-product attention, ONNX spec: Attention-23/24/25 (see the module docstring
    for shapes, masks, caches, the soft cap and the four ``qk_matmul_output_mode`` values).

    One kernel computes a row of scores per (batch, query head, query) in a local buffer of the
    total kv length, its softmax and the product with V; ``present_*`` are written first when
    requested and then read as the keys/values. Every opset version imports as the newest: the
    window attributes of opset 25 default to unbounded, which is what the older versions mean.
    """

    infer = _infer
    reference = _reference
    lower = _lower
    flops = _flops
