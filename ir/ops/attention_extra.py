"""ONNX ``RotaryEmbedding`` (opset 23), ``LinearAttention`` and ``CausalConvWithState`` (opset 27).

RotaryEmbedding (ONNX spec "RotaryEmbedding-23"): rotary positional embedding (RoPE).

- X is 4-D [B, H, S, D] or 3-D [B, S, H*D] (then the attribute ``num_heads`` = H is required).
  Y has X's shape and dtype (f16, bf16, f32).
- ``rotary_embedding_dim`` R (0: the head size D) rotates the first R entries of each head
  (R even, R <= D); the rest is copied. ``interleaved``: the pairs are (x[2j], x[2j+1]),
  otherwise (x[j], x[j + R/2]); each pair becomes (c*x1 - s*x2, s*x1 + c*x2).
- With ``position_ids`` (int64, broadcastable to [B, S]) the caches are [max_pos, R/2] and are
  indexed by position; positions outside [0, max_pos) are clamped (ONNX leaves them undefined).
  Without it the caches are [B, S, R/2] (leading dimensions may be 1 and broadcast).

LinearAttention (ONNX spec "LinearAttention-27"): the recurrent linear-attention family.
query [B, T, Hq*dk], key [B, T, Hkv*dk], value [B, T, Hkv*dv], past_state [B, Hkv, dk, dv]
(optional, zeros when absent), decay [B, T, Hkv*dk] or [B, T, Hkv] (log-space gate), beta
[B, T, Hkv] or [B, T, 1]. Per token t and key/value head (state S [dk, dv], float32):

- ``linear``: S += k (x) v;                       ``gated``: S = exp(g) * S + k (x) v
- ``delta``: S += k (x) beta * (v - S^T k);       ``gated_delta`` (default): S = exp(g) * S,
  then the delta update with the decayed S.
- output_t for query head h (reading key/value head h // (Hq/Hkv)) = scale * q_t^T S, scale
  default 1/sqrt(dk). ``chunk_size`` is a tuning hint without effect on the values.

Outputs: output [B, T, Hq*dv] in the query dtype; present_state [B, Hkv, dk, dv] in
past_state's dtype (the query's when past_state is absent). The recurrence runs in float32.

CausalConvWithState (ONNX spec "CausalConvWithState-27"): depthwise causal 1-D convolution with
a carried state. input [B, C, L], weight [C, 1, K], bias [C] (optional), past_state
[B, C, K-1] (optional, zeros when absent). With P = concat(past_state, input) along the last
axis: output[b, c, t] = act(bias[c] + sum_k weight[c, 0, k] * P[b, c, t + k]) with ``activation``
none, silu or swish (x * sigmoid(x)); present_state [B, C, K-1] = the last K-1 positions of P.
f16/bf16 accumulate in float32, round the convolution to the input dtype, then add the bias and
apply the activation in float32 as the reference does.

Errors (ShapeError): wrong ranks, shapes that disagree, head counts that do not divide, a missing
or forbidden decay/beta for the chosen update rule, unknown ``update_rule`` / ``activation``,
dtypes outside f16/bf16/f32 or differing between inputs that share a type.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import as_expr, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.ops._common import check_float
from tensorfuse.ir.ops.attention import _to_4d
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

_FLOATS = (DType.f16, DType.bf16, DType.f32)
_LOWP = (DType.f16, DType.bf16)


def _same_dtype(ref, pairs) -> None:
    for name, v in pairs:
        if v is not None and v.dtype != ref.dtype:
            raise ShapeError(f"{name} has dtype {v.dtype} but must match {ref.dtype}")


def _bcasts(dims, full) -> bool:
    return len(dims) == len(full) and all(d in (1, f) for d, f in zip(dims, full))


def _round(dt: np.dtype):
    """A function rounding float32 numpy values to dtype ``dt`` and back (identity for f32)."""
    if dt == np.float32:
        return lambda a: a
    return lambda a: np.asarray(a, np.float32).astype(dt).astype(np.float32)


# ============================================================================= RotaryEmbedding
class _RopeGeo:
    def __init__(self, node):
        x, cos, sin, pos = (node.input(i) for i in range(4))
        if cos is None or sin is None:
            raise ShapeError("inputs cos_cache and sin_cache are required")
        check_float(x, "X", _FLOATS)
        _same_dtype(x, (("cos_cache", cos), ("sin_cache", sin)))
        r = x.type.rank
        if r == 4:
            self.B, self.H, self.S, self.D = x.shape
        elif r == 3:
            nh = node.attr("num_heads")
            if not nh or nh <= 0:
                raise ShapeError("3-D X [batch, seq, hidden] needs the attribute num_heads > 0")
            self.B, self.S, hid = x.shape
            if hid % nh:
                raise ShapeError(f"hidden size {hid} is not a multiple of num_heads={nh}")
            self.H, self.D = nh, hid // nh
        else:
            raise ShapeError(f"X must be 3-D or 4-D, got shape {list(x.shape)}")
        self.rank = r
        R = node.attr("rotary_embedding_dim", 0) or self.D
        if R < 0 or R > self.D or R % 2:
            raise ShapeError(f"rotary_embedding_dim {R} must be even and at most the head size {self.D}")
        self.R = R
        half = R // 2
        if cos.shape != sin.shape:
            raise ShapeError(f"cos_cache {list(cos.shape)} and sin_cache {list(sin.shape)} differ")
        if pos is not None:
            if pos.dtype != DType.i64:
                raise ShapeError(f"position_ids must be int64, got {pos.dtype}")
            if not _bcasts(pos.shape, (self.B, self.S)):
                raise ShapeError(f"position_ids {list(pos.shape)} do not broadcast to [batch, seq] = {[self.B, self.S]}")
            if cos.type.rank != 2 or cos.shape[1] != half or cos.shape[0] == 0:
                raise ShapeError(f"with position_ids the caches must be [max_pos, {half}], got {list(cos.shape)}")
            self.max_pos = cos.shape[0]
        else:
            if cos.type.rank != 3 or cos.shape[2] != half or not _bcasts(cos.shape[:2], (self.B, self.S)):
                raise ShapeError(f"without position_ids the caches must be [{self.B}, {self.S}, {half}] "
                                 f"(leading dims may be 1), got {list(cos.shape)}")
        self.pos_shape = None if pos is None else tuple(pos.shape)
        self.cache_shape = tuple(cos.shape)
        self.interleaved = bool(node.attr("interleaved", 0))


def _rope_infer(node) -> list[TensorType]:
    _RopeGeo(node)
    return [node.inputs[0].type]


def _rope_reference(node, ins):
    g = _RopeGeo(node)
    x, cos, sin = ins[0], ins[1], ins[2]
    pos = ins[3] if len(ins) > 3 else None
    dt = x.dtype
    rd = _round(dt)
    x4 = x.reshape(g.B, g.S, g.H, g.D) if g.rank == 3 else x.transpose(0, 2, 1, 3)    # [B, S, H, D]
    if pos is not None:
        p = np.clip(pos.astype(np.int64), 0, g.max_pos - 1)
        cos, sin = cos[p], sin[p]
    c = cos.astype(np.float32)[:, :, None, :]
    s = sin.astype(np.float32)[:, :, None, :]
    xr = x4[..., :g.R].astype(np.float32)
    if g.interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :g.R // 2], xr[..., g.R // 2:]
    real = rd(rd(c * x1) - rd(s * x2))
    imag = rd(rd(s * x1) + rd(c * x2))
    y4 = np.array(x4, copy=True)
    if g.interleaved:
        y4[..., 0:g.R:2], y4[..., 1:g.R:2] = real, imag
    else:
        y4[..., :g.R // 2], y4[..., g.R // 2:g.R] = real, imag
    y = y4.reshape(x.shape) if g.rank == 3 else y4.transpose(0, 2, 1, 3)
    return [np.ascontiguousarray(y).astype(dt)]


def _rope_lower(ctx: LowerCtx) -> None:
    g = _RopeGeo(ctx.node)
    x, cos, sin = ctx.inputs[:3]
    pos = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    y = ctx.outputs[0]
    if y.numel == 0:
        return
    dt = x.dtype
    f32 = DType.f32

    def rd(e):
        return e if dt == f32 else e.cast(dt).cast(f32)

    D, R, half = g.D, g.R, g.R // 2
    kb = ctx.kernel()
    order = ("b", "h", "s") if g.rank == 4 else ("b", "s", "h")
    with kb.loop(g.B, kind="parallel", hint=order[0]) as l0, kb.loop(g.H if g.rank == 4 else g.S, hint=order[1]) as l1, \
            kb.loop(g.S if g.rank == 4 else g.H, hint=order[2]) as l2:
        b, h, s = (l0, l1, l2) if g.rank == 4 else (l0, l2, l1)

        def xi(d):
            return [b, h, s, d] if g.rank == 4 else [b, s, h * D + d]

        if pos is not None:
            pb = 0 if g.pos_shape[0] == 1 else b
            ps = 0 if g.pos_shape[1] == 1 else s
            p = minimum(maximum(pos[pb, ps], 0), g.max_pos - 1)

            def cache(buf, j):
                return buf[p, j].cast(f32)
        else:
            cb = 0 if g.cache_shape[0] == 1 else b
            cs = 0 if g.cache_shape[1] == 1 else s

            def cache(buf, j):
                return buf[cb, cs, j].cast(f32)

        with kb.loop(half, kind="vectorize", hint="j") as j:
            i1, i2 = (2 * j, 2 * j + 1) if g.interleaved else (j, j + half)
            x1, x2 = x[xi(i1)].cast(f32), x[xi(i2)].cast(f32)
            c, sn = cache(cos, j), cache(sin, j)
            kb.store(y, xi(i1), rd(rd(c * x1) - rd(sn * x2)).cast(dt))
            kb.store(y, xi(i2), rd(rd(sn * x1) + rd(c * x2)).cast(dt))
        if D > R:
            with kb.loop(D - R, kind="vectorize", hint="d") as d:
                kb.store(y, xi(d + R), x[xi(d + R)])


def _rope_flops(node) -> float:
    g = _RopeGeo(node)
    return 3.0 * g.B * g.H * g.S * g.R


@op("RotaryEmbedding", OpPatternKind.OPAQUE)
class RotaryEmbedding:
    """Rotary positional embedding. ONNX spec: RotaryEmbedding-23. X [B, H, S, D] or
    [B, S, H*D] (``num_heads``), caches [max_pos, R/2] with int64 ``position_ids`` [B, S] or
    [B, S, R/2] without; Y like X (f16/bf16/f32; low precision rounds after each product and
    sum as the ONNX function body does). See the module docstring for the attributes and errors.
    One kernel: per (batch, head, position) the R/2 rotated pairs, then the unrotated tail."""

    infer = _rope_infer
    reference = _rope_reference
    lower = _rope_lower
    flops = _rope_flops


# ============================================================================= LinearAttention
_RULES = ("linear", "gated", "delta", "gated_delta")


class _LinGeo:
    def __init__(self, node):
        q, k, v, past, decay, beta = (node.input(i) for i in range(6))
        if q is None or k is None or v is None:
            raise ShapeError("query, key and value are required")
        rule = node.attr("update_rule", "gated_delta")
        if rule not in _RULES:
            raise ShapeError(f"update_rule '{rule}' is not one of {', '.join(_RULES)}")
        self.rule = rule
        self.gating = rule in ("gated", "gated_delta")
        self.delta = rule in ("delta", "gated_delta")
        hq, hkv = node.attr("q_num_heads"), node.attr("kv_num_heads")
        if hq is None or hkv is None:
            raise ShapeError("the attributes q_num_heads and kv_num_heads are required")
        if hq <= 0 or hkv <= 0 or hq % hkv:
            raise ShapeError(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
        for name, x in (("query", q), ("key", k), ("value", v)):
            check_float(x, name, _FLOATS)
            if x.type.rank != 3:
                raise ShapeError(f"{name} must be 3-D [B, T, heads*size], got {list(x.shape)}")
        _same_dtype(q, (("key", k), ("value", v), ("decay", decay), ("beta", beta)))
        self.B, self.T = q.shape[0], q.shape[1]
        if k.shape[:2] != (self.B, self.T) or v.shape[:2] != (self.B, self.T):
            raise ShapeError(f"query {list(q.shape)}, key {list(k.shape)}, value {list(v.shape)} disagree on batch or length")
        if q.shape[2] % hq:
            raise ShapeError(f"query hidden size {q.shape[2]} is not a multiple of q_num_heads={hq}")
        if v.shape[2] % hkv:
            raise ShapeError(f"value hidden size {v.shape[2]} is not a multiple of kv_num_heads={hkv}")
        self.Hq, self.Hkv = hq, hkv
        self.dk, self.dv = q.shape[2] // hq, v.shape[2] // hkv
        if k.shape[2] != hkv * self.dk:
            raise ShapeError(f"key hidden size {k.shape[2]} must be kv_num_heads*d_k = {hkv}*{self.dk}")
        if self.gating and decay is None:
            raise ShapeError(f"update_rule '{rule}' requires the decay input")
        if not self.gating and decay is not None:
            raise ShapeError(f"update_rule '{rule}' takes no decay input")
        if self.delta and beta is None:
            raise ShapeError(f"update_rule '{rule}' requires the beta input")
        if not self.delta and beta is not None:
            raise ShapeError(f"update_rule '{rule}' takes no beta input")
        self.decay_per_head = False
        if decay is not None:
            if decay.type.rank != 3 or decay.shape[:2] != (self.B, self.T) or decay.shape[2] not in (hkv, hkv * self.dk):
                raise ShapeError(f"decay must be [{self.B}, {self.T}, {hkv}] or [{self.B}, {self.T}, {hkv * self.dk}], "
                                 f"got {list(decay.shape)}")
            self.decay_per_head = decay.shape[2] == hkv
        if beta is not None:
            if beta.type.rank != 3 or beta.shape[:2] != (self.B, self.T) or beta.shape[2] not in (hkv, 1):
                raise ShapeError(f"beta must be [{self.B}, {self.T}, {hkv}] or [{self.B}, {self.T}, 1], got {list(beta.shape)}")
        self.state_dtype = q.dtype
        if past is not None:
            check_float(past, "past_state", _FLOATS)
            if past.shape != (self.B, hkv, self.dk, self.dv):
                raise ShapeError(f"past_state {list(past.shape)} must be [{self.B}, {hkv}, {self.dk}, {self.dv}]")
            self.state_dtype = past.dtype
        s = node.attr("scale", 0.0)
        self.scale = float(np.float32(1.0 / math.sqrt(self.dk) if not s else s))


def _lin_infer(node) -> list[TensorType]:
    g = _LinGeo(node)
    dt = node.inputs[0].dtype
    return [TensorType(dt, (g.B, g.T, g.Hq * g.dv)), TensorType(g.state_dtype, (g.B, g.Hkv, g.dk, g.dv))]


def _lin_reference(node, ins):
    g = _LinGeo(node)
    ins = list(ins) + [None] * (6 - len(ins))
    q, k, v, past, decay, beta = ins[:6]
    f32 = np.float32
    q4 = _to_4d(q, g.Hq).astype(f32)          # [B, Hq, T, dk]
    k4 = _to_4d(k, g.Hkv).astype(f32)
    v4 = _to_4d(v, g.Hkv).astype(f32)
    if decay is not None:
        dec = decay.astype(f32).reshape(g.B, g.T, g.Hkv, -1)       # [B, T, Hkv, 1 or dk]
    if beta is not None:
        bet = beta.astype(f32).reshape(g.B, g.T, -1)               # [B, T, Hkv or 1]
    state = np.zeros((g.B, g.Hkv, g.dk, g.dv), f32) if past is None else past.astype(f32)
    rep = g.Hq // g.Hkv
    out = np.zeros((g.B, g.Hq, g.T, g.dv), f32)
    with np.errstate(all="ignore"):
        for t in range(g.T):
            kt, vt = k4[:, :, t, :], v4[:, :, t, :]
            if g.gating:
                state = state * np.exp(dec[:, t])[..., None]
            if g.delta:
                recalled = np.einsum("bhij,bhi->bhj", state, kt)
                vt = bet[:, t, :, None] * (vt - recalled)
            state = state + kt[..., :, None] * vt[..., None, :]
            read = np.repeat(state, rep, axis=1) if rep > 1 else state
            out[:, :, t, :] = f32(g.scale) * np.einsum("bhi,bhij->bhj", q4[:, :, t, :], read)
    y = out.transpose(0, 2, 1, 3).reshape(g.B, g.T, g.Hq * g.dv)
    return [y.astype(q.dtype), state.astype(g.state_dtype.numpy)]


def _lin_lower(ctx: LowerCtx) -> None:
    node = ctx.node
    g = _LinGeo(node)
    ins = ctx.inputs + [None] * (6 - len(ctx.inputs))
    q, k, v, past, decay, beta = ins[:6]
    outs = ctx.outputs + [None] * (2 - len(ctx.outputs))
    y, pres = outs[:2]
    f32 = DType.f32
    dk, dv, rep = g.dk, g.dv, g.Hq // g.Hkv
    kb = ctx.kernel()
    # the float32 state lives in present_state when that is float32, else in a scratch buffer
    local = pres is None or pres.dtype != f32
    st = kb.local(f32, (max(dk * dv, 1),), hint="state") if local else None
    u = kb.local(f32, (max(dv, 1),), hint="u")
    o = kb.local(f32, (max(dv, 1),), hint="o")
    scale = as_expr(g.scale, f32)
    with kb.loop(g.B, kind="parallel", hint="b") as b, kb.loop(g.Hkv, hint="hk") as hk:
        def S(i, j):
            return st.flat(i * dv + j) if local else pres[b, hk, i, j]

        def set_S(i, j, val):
            if local:
                kb.store(st, i * dv + j, val)
            else:
                kb.store(pres, [b, hk, i, j], val)

        with kb.loop(dk, hint="i") as i, kb.loop(dv, kind="vectorize", hint="j") as j:
            set_S(i, j, as_expr(0.0, f32) if past is None else past[b, hk, i, j].cast(f32))
        with kb.loop(g.T, hint="t") as t:
            if g.gating:
                if g.decay_per_head:
                    gate = unop("exp", decay[b, t, hk].cast(f32))
                    with kb.loop(dk, hint="i") as i, kb.loop(dv, kind="vectorize", hint="j") as j:
                        set_S(i, j, S(i, j) * gate)
                else:
                    with kb.loop(dk, hint="i") as i:
                        gate = unop("exp", decay[b, t, hk * dk + i].cast(f32))
                        with kb.loop(dv, kind="vectorize", hint="j") as j:
                            set_S(i, j, S(i, j) * gate)
            if g.delta:
                with kb.loop(dv, kind="vectorize", hint="j") as j:
                    kb.store(u, j, as_expr(0.0, f32))
                with kb.loop(dk, hint="i") as i:
                    ki = k[b, t, hk * dk + i].cast(f32)
                    with kb.loop(dv, kind="vectorize", hint="j") as j:
                        kb.store(u, j, u[j] + S(i, j) * ki)
                bt = beta[b, t, 0 if beta.shape[2] == 1 else hk].cast(f32)
                with kb.loop(dv, kind="vectorize", hint="j") as j:
                    kb.store(u, j, bt * (v[b, t, hk * dv + j].cast(f32) - u[j]))
            else:
                with kb.loop(dv, kind="vectorize", hint="j") as j:
                    kb.store(u, j, v[b, t, hk * dv + j].cast(f32))
            with kb.loop(dk, hint="i") as i:
                ki = k[b, t, hk * dk + i].cast(f32)
                with kb.loop(dv, kind="vectorize", hint="j") as j:
                    set_S(i, j, S(i, j) + ki * u[j])
            if y is not None:
                with kb.loop(rep, hint="g") as gq:
                    h = hk * rep + gq
                    with kb.loop(dv, kind="vectorize", hint="j") as j:
                        kb.store(o, j, as_expr(0.0, f32))
                    with kb.loop(dk, hint="i") as i:
                        qi = q[b, t, h * dk + i].cast(f32)
                        with kb.loop(dv, kind="vectorize", hint="j") as j:
                            kb.store(o, j, o[j] + qi * S(i, j))
                    with kb.loop(dv, kind="vectorize", hint="j") as j:
                        kb.store(y, [b, t, h * dv + j], (scale * o[j]).cast(y.dtype))
        if local and pres is not None:
            with kb.loop(dk, hint="i") as i, kb.loop(dv, kind="vectorize", hint="j") as j:
                kb.store(pres, [b, hk, i, j], S(i, j).cast(pres.dtype))


def _lin_flops(node) -> float:
    g = _LinGeo(node)
    per_head = 2.0 * g.dk * g.dv * (1 + (g.Hq // g.Hkv)) + (g.dk * g.dv if g.gating else 0) \
        + (2.0 * g.dk * g.dv + 2 * g.dv if g.delta else 0)
    return g.B * g.T * g.Hkv * per_head


@op("LinearAttention", OpPatternKind.OPAQUE)
class LinearAttention:
    """Recurrent linear attention (linear, gated, delta, gated_delta update rules) with
    grouped-query heads. ONNX spec: LinearAttention-27. query/key/value packed 3-D
    [B, T, H*d]; output [B, T, Hq*dv] (query dtype), present_state [B, Hkv, dk, dv]
    (past_state's dtype, else the query's). See the module docstring for decay/beta shapes
    and errors. One kernel: per (batch, kv head) the float32 state is updated token by token
    and read by the kv head's query heads."""

    infer = _lin_infer
    reference = _lin_reference
    lower = _lin_lower
    flops = _lin_flops


# ============================================================================= CausalConvWithState
_ACTS = ("none", "silu", "swish")


class _ConvGeo:
    def __init__(self, node):
        x, w, bias, past = (node.input(i) for i in range(4))
        if w is None:
            raise ShapeError("input 1 (weight) is required")
        check_float(x, "input", _FLOATS)
        _same_dtype(x, (("weight", w), ("bias", bias), ("past_state", past)))
        if x.type.rank != 3:
            raise ShapeError(f"input must be 3-D [batch, channels, length], got {list(x.shape)}")
        self.B, self.C, self.L = x.shape
        if w.type.rank != 3 or w.shape[0] != self.C or w.shape[1] != 1 or w.shape[2] < 1:
            raise ShapeError(f"weight must be [{self.C}, 1, k] with k >= 1, got {list(w.shape)}")
        self.K = w.shape[2]
        if bias is not None and bias.shape != (self.C,):
            raise ShapeError(f"bias must be [{self.C}], got {list(bias.shape)}")
        if past is not None and past.shape != (self.B, self.C, self.K - 1):
            raise ShapeError(f"past_state must be [{self.B}, {self.C}, {self.K - 1}], got {list(past.shape)}")
        act = node.attr("activation", "none")
        if act not in _ACTS:
            raise ShapeError(f"activation '{act}' is not one of {', '.join(_ACTS)}")
        self.silu = act in ("silu", "swish")


def _conv_infer(node) -> list[TensorType]:
    g = _ConvGeo(node)
    dt = node.inputs[0].dtype
    return [node.inputs[0].type, TensorType(dt, (g.B, g.C, g.K - 1))]


def _conv_reference(node, ins):
    g = _ConvGeo(node)
    ins = list(ins) + [None] * (4 - len(ins))
    x, w, bias, past = ins[:4]
    dt = x.dtype
    rd = _round(dt)
    if past is None:
        past = np.zeros((g.B, g.C, g.K - 1), dt)
    padded = np.concatenate([past, x], axis=2)
    wf = w[:, 0, :].astype(np.float32)                        # [C, K]
    acc = np.zeros((g.B, g.C, g.L), np.float32)
    for kk in range(g.K):
        acc += wf[None, :, kk, None] * padded[:, :, kk:kk + g.L].astype(np.float32)
    y = rd(acc)
    if bias is not None:
        y = rd(y + bias.astype(np.float32)[None, :, None])
    if g.silu:
        with np.errstate(over="ignore"):
            y = y * (1.0 / (1.0 + np.exp(-y)))
    present = padded[:, :, padded.shape[2] - (g.K - 1):]
    return [y.astype(dt), np.ascontiguousarray(present)]


def _conv_lower(ctx: LowerCtx) -> None:
    g = _ConvGeo(ctx.node)
    ins = ctx.inputs + [None] * (4 - len(ctx.inputs))
    x, w, bias, past = ins[:4]
    outs = ctx.outputs + [None] * (2 - len(ctx.outputs))
    y, pres = outs[:2]
    dt = x.dtype
    f32 = DType.f32
    K, L, P = g.K, g.L, g.K - 1

    def rd(e):
        return e if dt == f32 else e.cast(dt).cast(f32)

    def padded(b, c, p):
        """P[b, c, p] for p in [0, L + K - 1): the past (or zeros) then the input."""
        if P == 0:
            return x[b, c, p].cast(f32)
        before = as_expr(0.0, f32) if past is None else past[b, c, minimum(p, P - 1)].cast(f32)
        return select(p < P, before, x[b, c, maximum(p - P, 0)].cast(f32))

    kb = ctx.kernel()
    acc = kb.local(f32, (1,), hint="acc")
    with kb.loop(g.B, kind="parallel", hint="b") as b, kb.loop(g.C, hint="c") as c:
        if y is not None and L:
            with kb.loop(L, hint="t") as t:
                kb.store(acc, 0, as_expr(0.0, f32))
                with kb.loop(K, hint="k") as kk:
                    kb.store(acc, 0, acc[0] + w[c, 0, kk].cast(f32) * padded(b, c, t + kk))
                val = rd(acc[0])
                if bias is not None:
                    val = rd(val + bias[c].cast(f32))
                if g.silu:
                    val = val / (unop("exp", -val) + 1.0)
                kb.store(y, [b, c, t], val.cast(dt))
        if pres is not None and P:
            with kb.loop(P, kind="vectorize", hint="j") as j:
                kb.store(pres, [b, c, j], padded(b, c, j + L).cast(dt))


def _conv_flops(node) -> float:
    g = _ConvGeo(node)
    return g.B * g.C * g.L * (2.0 * g.K + (4 if g.silu else 0))


@op("CausalConvWithState", OpPatternKind.OPAQUE)
class CausalConvWithState:
    """Stateful causal depthwise 1-D convolution with optional bias and fused SiLU. ONNX spec:
    CausalConvWithState-27. input [B, C, L], weight [C, 1, K], bias [C], past_state
    [B, C, K-1] -> output [B, C, L], present_state [B, C, K-1] (f16/bf16/f32, all one dtype).
    One kernel: per (batch, channel) the K-tap sums over the virtual concatenation of past and
    input, then the K-1 trailing positions as the new state."""

    infer = _conv_infer
    reference = _conv_reference
    lower = _conv_lower
    flops = _conv_flops
