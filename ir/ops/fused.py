"""Fused ops of the ``tensorfuse`` domain: what the fusion catalogue (compiler/rules) rewrites into.

Each op means exactly the composition of ONNX ops that the rules replace; its numpy reference
is that composition, so constant folding and the tests read it as the definition. The kernels
compute in one pass what the unfused graph computes in several (a row of scores in a local
buffer for attention, the sum of the addends kept in the output row for the LayerNorms).

Ops here:

- ``Attention(Q, K, V, mask?)``: softmax(Q @ K^T * scale + mask) @ V, softmax on the last axis
  (or, with ``mask_fill``, a bool mask selecting between the scores and the fill).
- ``SkipLayerNormalization(X, skip, scale, B?, bias?)``: LayerNormalization(X + skip + bias),
  optionally also returning the sum.
- ``EmbedLayerNormalization(table_0, ids_0, ..., scale, B?, addend...)``: LayerNormalization of
  the sum of embedding Gathers and dense addends (BERT's embedding block).
- ``FusedConv``, ``FusedMatMul``, ``FusedGemm`` (anchor + bias + residual + activation) reuse
  the anchor kernels through ``LowerCtx.epilogue``; see the second half of this module.
- ``FusedFunction`` (attribute ``body``: a graph), a group made by the fuse_ops pass, one
  kernel, is defined and lowered in ``ir/ops/fused_function.py``.

The activations the anchored ops take are ``ir.ops.activations.FUSED_ACTIVATIONS``, evaluated
through the registry's own scalar and reference functions of the ops they stand for (Relu,
Clip, Sigmoid, Gelu ...), so that float16 computes in float32 and rounds once however it was
fused.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.graph import Node, Value
from tensorfuse.ir.kernel import KernelBuilder, Ramp, as_expr, broadcast, fma, interleave, maximum, minimum, row_max, select, unop
from tensorfuse.ir.ops._common import broadcast_shapes, check_float, erf_np, lanes_tree, norm_axis
from tensorfuse.ir.ops.activations import ACTIVATION_ATTRS, activation_expr, activation_np, activation_params
from tensorfuse.ir.ops.gather import np_wrap
from tensorfuse.ir.registry import AttrSpec, OpPatternKind, ShapeError, op
from tensorfuse.ir.knobs import knob
from tensorfuse.ir.strategy import NO_SCHEDULE, dispatch
from tensorfuse.ir.types import DType, TensorType

DOMAIN = "tensorfuse"
#: Attention keeps K^T of one batch entry in a local (stack) buffer up to this many elements
ATTENTION_KT_LOCAL = 16384

# ----------------------------------------------------------------------------- helpers
def _compute_dtype(dt: DType) -> DType:
    """Normalisation statistics are computed in f32 (ONNX stash_type=1), f64 stays f64."""
    return DType.f64 if dt == DType.f64 else DType.f32


def _same_dtype(vals: list[tuple[str, Value]]) -> DType:
    dts = {v.dtype for _, v in vals}
    if len(dts) != 1:
        raise ShapeError("inputs must share one dtype, got " + ", ".join(f"{n}: {v.dtype}" for n, v in vals))
    return dts.pop()


def _unidirectional(shape: tuple[int, ...], target: tuple[int, ...], what: str) -> None:
    shape, target = tuple(shape), tuple(target)
    if len(shape) > len(target) or any(a not in (1, b) for a, b in zip(shape[::-1], target[::-1])):
        raise ShapeError(f"{what} of shape {list(shape)} is not unidirectionally broadcastable to {list(target)}")


def _layernorm_np(s: np.ndarray, axis: int, eps: float, scale, bias) -> np.ndarray:
    """ONNX LayerNormalization (stash_type=1) on numpy."""
    ct = np.float64 if s.dtype == np.float64 else np.float32
    axes = tuple(range(axis, s.ndim))
    x = s.astype(ct)
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    y = (d / np.sqrt(var + ct(eps))).astype(s.dtype)
    y = y * scale
    if bias is not None:
        y = y + bias
    return y.astype(s.dtype)


def _emit_layernorm_rows(kb: KernelBuilder, shape: tuple[int, ...], axis: int, eps: float,
                         addend, y, scale, bias, sum_out=None, ctx=None) -> None:
    """Shared LayerNorm kernel body: per outer index, s = addend(idx) over the normalised dims is
    stored into ``sum_out`` (or ``y`` as scratch), then mean, variance (two passes) and the
    normalisation with scale and bias are written to ``y``. ``ctx``: the node's lowering
    context; a backend schedule registered for ``"layernorm_rows"`` (``ir.strategy``) may emit
    the kernel (holding nothing else) instead: the cuda one runs a thread block per row."""
    ct = _compute_dtype(y.dtype)
    outer, inner = shape[:axis], shape[axis:]
    n = 1
    for d in inner:
        n *= d
    tmp = sum_out if sum_out is not None else y
    acc = kb.local(ct, (1,), hint="mean")
    var = kb.local(ct, (1,), hint="var")
    if ctx is not None and dispatch("layernorm_rows", ctx, kb=kb, outer=outer, inner=inner, n=n, eps=eps,
                                    addend=addend, y=y, scale=scale, bias=bias, tmp=tmp, ct=ct, acc=acc,
                                    var=var) is not NO_SCHEDULE:
        return
    with kb.grid(outer, kind="serial") as oidx:
        kb.store(acc, 0, 0.0)
        with kb.grid(inner) as iidx:
            idx = list(oidx) + list(iidx)
            s = as_expr(addend(idx), y.dtype)
            kb.store(tmp, idx, s)
            kb.store(acc, 0, acc[0] + tmp[idx].cast(ct))
        mean = acc[0] / float(n)
        kb.store(var, 0, 0.0)
        with kb.grid(inner) as iidx:
            idx = list(oidx) + list(iidx)
            d = tmp[idx].cast(ct) - mean
            kb.store(var, 0, var[0] + d * d)
        inv = 1.0 / unop("sqrt", var[0] / float(n) + eps)
        with kb.grid(inner) as iidx:
            idx = list(oidx) + list(iidx)
            yv = ((tmp[idx].cast(ct) - mean) * inv).cast(y.dtype) * scale.bcast(idx)
            if bias is not None:
                yv = yv + bias.bcast(idx)
            kb.store(y, idx, yv)


# ----------------------------------------------------------------------------- Attention
@op("Attention", OpPatternKind.OPAQUE, domain=DOMAIN,
    attrs={"scale": AttrSpec("float", None, required=True), "mask_fill": AttrSpec("float", None)})
class Attention:
    """Scaled dot-product attention: Y = Softmax(Q @ K^T * scale + mask, axis=-1) @ V.

    Inputs: Q [b..., Sq, D], K [b..., Sk, D], V [b..., Sk, Dv], mask (optional) broadcastable
    to [b..., Sq, Sk]; batch dims broadcast as in MatMul. Q, K, V one float dtype. Output:
    Y [b..., Sq, Dv]. Attributes: ``scale`` (required float); ``mask_fill`` (optional float).
    Without ``mask_fill`` the mask is additive, of Q's dtype, and the op means the ONNX ops
    MatMul(Q, Transpose(K)) -> Mul(scale) -> Add(mask) -> Softmax(axis=-1) -> MatMul(., V)
    (ONNX spec: MatMul-13, Mul-14, Add-14, Softmax-13). With ``mask_fill`` the mask is bool
    and selects: the scores are Where(mask, Q @ K^T * scale, mask_fill) (Where-16), the form
    GPT-2 and other causal models export (a constant lower-triangular mask, a fill such as
    float32's lowest value). Raises ShapeError on rank < 2, mismatched D / Sk, a mask that
    does not broadcast, a mask of the wrong dtype, or mixed dtypes.
    """

    def infer(node):
        q, k, v = node.inputs[:3]
        mask = node.input(3)
        where = node.attr("mask_fill") is not None
        named = [("Q", q), ("K", k), ("V", v)] + ([("mask", mask)] if mask is not None and not where else [])
        dt = _same_dtype(named)
        if where and (mask is None or mask.dtype != DType.bool):
            raise ShapeError(f"mask_fill is set: the mask must be bool, got "
                             f"{'none' if mask is None else mask.dtype}")
        check_float(q, "Q")
        if node.attr("scale") is None:
            raise ShapeError("attribute 'scale' is required")
        for nm, t in named[:3]:
            if t.type.rank < 2:
                raise ShapeError(f"{nm} must have rank >= 2, got {t.type}")
        sq, d = q.shape[-2:]
        sk, dk = k.shape[-2:]
        skv, dv = v.shape[-2:]
        if d != dk:
            raise ShapeError(f"Q's last dim {d} != K's last dim {dk}")
        if sk != skv:
            raise ShapeError(f"K has {sk} keys but V has {skv} rows")
        batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        if mask is not None:
            ms = (1,) * max(0, 2 - mask.type.rank) + tuple(mask.shape)
            ok = all(a in (1, b) for a, b in zip(ms[-2:], (sq, sk)))
            if not ok:
                raise ShapeError(f"mask of shape {list(mask.shape)} does not broadcast to scores [{sq},{sk}]")
            batch = broadcast_shapes(batch, ms[:-2])
        return [TensorType(dt, tuple(batch) + (sq, dv))]

    def reference(node, ins):
        q, k, v, mask = (list(ins) + [None])[:4]
        dt = q.dtype
        if k.shape[-2] == 0:        # no keys: an empty sum over them, zeros (as MatMul gives)
            return [np.matmul(np.zeros(q.shape[:-1] + (0,), dt), v).astype(dt)]
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * dt.type(node.attr("scale"))
        fill = node.attr("mask_fill")
        if mask is not None and fill is not None:
            s = np.where(mask, s, dt.type(fill))
        elif mask is not None:
            s = s + mask
        s = s - s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        p = (e / e.sum(axis=-1, keepdims=True)).astype(dt)
        return [np.matmul(p, v).astype(dt)]

    def lower(ctx):
        q, k, v = ctx.inputs[:3]
        mask = ctx.inputs[3] if len(ctx.inputs) > 3 else None
        y = ctx.outputs[0]
        scale = float(ctx.attr("scale"))
        ct = _compute_dtype(y.dtype)
        batch = y.shape[:-2]
        sq, dv = y.shape[-2:]
        sk, d = k.shape[-2:]
        kb = ctx.kernel()
        scores = kb.local(ct, (sk,), hint="scores")
        acc = kb.local(ct, (dv,), hint="out")
        dot = kb.local(ct, (1,), hint="dot")
        mx = kb.local(ct, (1,), hint="max")
        tot = kb.local(ct, (1,), hint="sum")

        def bidx(buf, b, rows):
            # the batch part of buf's index against the output batch index b, plus rows
            r = len(buf.shape) - 2
            bb = list(b)[len(b) - r:] if r else []
            bb = [0 if dim == 1 else i for dim, i in zip(buf.shape[:r], bb)]
            return bb + rows

        # K^T of one batch entry in a local buffer when small enough, so that a row of scores
        # accumulates over contiguous keys (vectorisable) instead of one dot product per key
        # on a SIMT target (a GPU) a thread per (batch, query row) instead: no per-batch K^T
        # copy in each thread
        gpu = ctx.target.simt
        L = ctx.target.lanes(DType.f32)
        # the vector rows (f32, value columns in whole vectors) pad the keys to whole vectors:
        # K^T's rows and the score row are ``ks`` long, the lanes past sk score -inf
        vec_ok = not gpu and ct == y.dtype == DType.f32 and dv % L == 0 and sk > 0
        ks = -(-sk // L) * L if vec_ok else sk
        fill = ctx.attr("mask_fill")
        if vec_ok and ks * d > ATTENTION_KT_LOCAL:
            # K^T too large for the stack (long sequences: Whisper's 1500 frames): a first
            # kernel writes every batch entry's K^T [d, ks] into a scratch buffer, then the
            # vector rows read it there (the same schedule as the local copy, not the scalar
            # dot product per key)
            _attention_scratch_kt(ctx, kb, q, k, v, y, mask, fill, batch, bidx, scale, L, sk, ks, d)
            return
        transpose_k = not gpu and ks * d <= ATTENTION_KT_LOCAL
        if not transpose_k:
            ks = sk
        kt = kb.local(ct, (d * ks,), hint="kt") if transpose_k else None

        def finish_score(b, i, j, value):
            sc = apply_mask(value.cast(y.dtype) * scale, mask, fill, list(b) + [i, j])
            kb.store(scores, j, sc.cast(ct))

        vec = transpose_k and vec_ok

        # K^T in blocks of L keys, [ks / L, d, L], each L x L tile transposed in registers
        blocked = vec and d % L == 0 and not L & (L - 1) and knob(
            "attention_kt", ["blocked", "columns"], "blocked",
            doc="K^T copied as register-transposed tiles into key blocks, or element by element") == "blocked"

        with kb.grid(batch) as b:
            if blocked:
                _attention_kt_tiles(kb, k, kt, b, bidx, sk, ks, d, L)
                _attention_rows_vector(ctx, kb, q, v, y, mask, fill, b, bidx, kt, scale, L, sk, kt_blocked=True)
                return
            if transpose_k:
                with kb.loop(sk, hint="k") as j:
                    with kb.loop(d, hint="d") as c:
                        kb.store(kt, c * ks + j, k[bidx(k, b, [j, c])].cast(ct))
                if ks > sk:     # the padding keys: zeros (their scores are replaced by -inf)
                    with kb.loop(d, hint="d") as c:
                        for j in range(sk, ks):
                            kb.store(kt, c * ks + j, as_expr(0.0, ct))
            if vec:
                _attention_rows_vector(ctx, kb, q, v, y, mask, fill, b, bidx, kt, scale, L, sk)
                return
            with kb.loop(sq, hint="q", role="spatial" if gpu else "") as i:
                if transpose_k:
                    with kb.loop(sk, kind="vectorize", hint="k") as j:
                        kb.store(scores, j, 0.0)
                    with kb.loop(d, hint="d") as c:
                        qv = q[bidx(q, b, [i, c])].cast(ct)
                        with kb.loop(sk, kind="vectorize", hint="k") as j:
                            kb.store(scores, j, scores[j] + qv * kt[c * sk + j])
                    with kb.loop(sk, kind="vectorize", hint="k") as j:
                        finish_score(b, i, j, scores[j])
                else:
                    with kb.loop(sk, hint="k") as j:
                        kb.store(dot, 0, 0.0)
                        with kb.loop(d, hint="d") as c:
                            kb.store(dot, 0, dot[0] + q[bidx(q, b, [i, c])].cast(ct) * k[bidx(k, b, [j, c])].cast(ct))
                        finish_score(b, i, j, dot[0])
                kb.store(mx, 0, -math.inf)
                with kb.loop(sk, hint="k") as j:
                    kb.store(mx, 0, maximum(mx[0], scores[j]))
                kb.store(tot, 0, 0.0)
                with kb.loop(sk, hint="k") as j:
                    # expressions are trees evaluated where used: store, then read back
                    kb.store(scores, j, unop("exp", scores[j] - mx[0]))
                    kb.store(tot, 0, tot[0] + scores[j])
                with kb.loop(dv, kind="vectorize", hint="d") as c:
                    kb.store(acc, c, 0.0)
                with kb.loop(sk, hint="k") as j:
                    p = scores[j]
                    with kb.loop(dv, kind="vectorize", hint="d") as c:
                        kb.store(acc, c, acc[c] + p * v[bidx(v, b, [j, c])].cast(ct))
                # no keys at all (an empty key/value cache, sk = 0): the attention is an empty
                # sum, 0, where 1 / tot would make 0 * inf = NaN (issue 24 item 6)
                inv = 1.0 / tot[0] if sk > 0 else 0.0
                with kb.loop(dv, kind="vectorize", hint="d") as c:
                    kb.store(y, list(b) + [i, c], (acc[c] * inv).cast(y.dtype))

    def flops(node):
        y = node.outputs[0]
        b = int(np.prod(y.shape[:-2], dtype=np.int64))
        sq, dv = y.shape[-2:]
        sk, d = node.inputs[1].shape[-2:]
        return float(b * sq * sk * (2 * d + 2 * dv + 5))


#: query rows the vector attention rows compute together (a knob, ``attention_rows``): each K^T
#: and V vector loaded is used by every row of the block, and the rows' accumulators are
#: independent FMA chains (one row alone waits on FMA latency)
ATTENTION_ROWS = (1, 2, 4, 6, 8, 12)


def apply_mask(score, mask, fill, idx):
    """The masked score: ``score + mask[idx]`` (additive mask), ``Where(mask[idx], score, fill)``
    (bool mask, ``fill`` the Attention's ``mask_fill``), or ``score`` without a mask; ``idx`` may
    end in a Ramp (a vector of keys)."""
    if mask is None:
        return score
    if fill is None:
        return score + mask.bcast(idx)
    return select(mask.bcast(idx), score, as_expr(float(fill), score.dtype))


def _attention_scratch_kt(ctx, kb, q, k, v, y, mask, fill, batch, bidx, scale: float, L: int, sk: int,
                          ks: int, d: int) -> None:
    """f32 attention whose K^T does not fit a local buffer (``ks * d > ATTENTION_KT_LOCAL``):
    kernel ``<node>_kt`` transposes K of every output batch entry into a scratch buffer
    ``[*batch, d, ks]`` (keys padded with zeros to ``ks``, a whole number of vectors), then
    ``kb`` (opened by the caller; the scratch joins its parameters) runs
    :func:`_attention_rows_vector` per batch entry on its slice. Scratch bytes:
    4 * prod(batch) * d * ks (Whisper-tiny's encoder, 6 heads x 64 x 1504: 2.3 MB)."""
    f32 = DType.f32
    kts = ctx.scratch(f32, tuple(batch) + (d, ks), "kt")
    # the K^T kernel runs first: the attention kernel (already opened) moves behind it
    ctx.kernels.remove(kb.kernel)
    kk = ctx.kernel("kt", params=[k, kts])
    with kk.grid(batch) as b:
        with kk.loop(sk, hint="k") as j:
            with kk.loop(d, hint="d") as c:
                kk.store(kts, list(b) + [c, j], k[bidx(k, b, [j, c])])
        if ks > sk:
            with kk.loop(d, hint="d") as c:
                for j in range(sk, ks):
                    kk.store(kts, list(b) + [c, as_expr(j)], as_expr(0.0, f32))
    ctx.kernels.append(kb.kernel)
    kb.kernel.params.append(kts)
    with kb.grid(batch) as b:
        _attention_rows_vector(ctx, kb, q, v, y, mask, fill, b, bidx, kts, scale, L, sk,
                               kt_base=kts.offset(list(b) + [0, 0]), ks=ks)


def _attention_kt_tiles(kb, k, kt, b, bidx, sk: int, ks: int, d: int, L: int) -> None:
    """K^T of batch entry ``b`` into ``kt`` in key blocks: ``kt[(t*d + c)*L + p] = K[t*L + p, c]``
    (keys past ``sk`` 0), each L x L tile as L row loads of K interleaved in registers
    (:func:`~ir.kernel.interleave`: lane c*L + p = row p's lane c) and stored as one run, instead
    of d x sk scalar copies (ViT-B's 197 keys x 64 per head: 12.6 thousand). ``d`` a multiple of
    ``L``, ``L`` a power of two."""
    zero = broadcast(as_expr(0.0, DType.f32), L)
    full, rest = divmod(sk, L)

    def tiles(t, rows: int) -> None:
        with kb.loop(d // L, hint="cb") as cb:
            vs = [k.vload(k.offset(bidx(k, b, [t * L + p, cb * L])), L) if p < rows else zero for p in range(L)]
            kb.store(kt, (t * d + cb * L) * L, interleave(vs))
    if full:
        with kb.loop(full, hint="kb") as t:
            tiles(t, L)
    if rest:
        tiles(as_expr(full), rest)


def _attention_rows_vector(ctx, kb, q, v, y, mask, fill, b, bidx, kt, scale: float, L: int, sk: int,
                           kt_base=None, ks: int | None = None, kt_blocked: bool = False) -> None:
    """Rows of f32 attention with vector registers (value columns in whole vectors; the ``sk``
    keys padded to whole vectors: ``kt`` is K^T [d, ks], ks = sk rounded up to L, the padding
    lanes scoring -inf so their exp is 0).

    Query rows in blocks of R (knob ``attention_rows``, default 6 with 32 vector registers, else
    4), the sq % R rows left over as one smaller block. Per block: scores in tiles of key
    vectors held in registers over the d reduction (each K^T vector loaded once for the R rows,
    Q[i, c] broadcast), scaled and masked on the vectors (the last, partial vector lane by
    lane); per row the max as a vector max (exact),
    exp and the sum as vectors (the sum added up in L partial sums); then P @ V in tiles of value
    columns over the sk keys (each V vector loaded once for the R rows), times 1/sum at the
    store. A tile's vectors are chosen so the R x tile accumulators and the tile's loads fit
    the target's vector registers (``Target.vector_registers``); the tiles of one row block
    differ in size by at most one vector (13 key vectors in 4 tiles: 4+3+3+3, not 4+4+4+1, whose
    1-vector tile waits on its FMA chains). ``kt_blocked``: K^T in key blocks
    (:func:`_attention_kt_tiles`) instead of [d, ks]."""
    sq, dv = y.shape[-2:]
    d = q.shape[-1]
    if ks is None:
        ks = kt.shape[0] // d   # K^T's rows: sk padded to whole vectors
    kt0 = as_expr(0) if kt_base is None else kt_base     # K^T's offset in kt (the scratch form)
    f32 = DType.f32
    regs = ctx.target.vector_registers
    # 6 rows where 32 vector registers hold 6 x 4 accumulators (AVX-512: 5-10% faster than 4
    # at S = 128-197, each K^T / V vector feeding more FMAs), else 4
    R = knob("attention_rows", [r for r in ATTENTION_ROWS if r <= max(sq, 1)], min(6 if regs >= 32 else 4, max(sq, 1)),
             doc="query rows computed together (sharing each K^T / V vector load)")
    def spans(nvec: int) -> list[tuple[int, int]]:
        # (first vector, vectors) of each tile: as few tiles as the registers allow, their sizes
        # within one of each other (ViT's 197 keys, 13 vectors, at R = 6: 4+3+3+3)
        most = max(1, min(nvec, (regs - 2) // (R + 1)))
        n = -(-nvec // most)
        sizes = [nvec // n + (1 if i < nvec % n else 0) for i in range(n)]
        return [(sum(sizes[:i]), sz) for i, sz in enumerate(sizes)]
    QS, VS = spans(ks // L), spans(dv // L)
    TQ, TV = max(n for _, n in QS), max(n for _, n in VS)
    sc = kb.local(f32, (R * ks,), hint="scores")
    accv = kb.local(f32, (R * max(TQ, TV) * L,), hint="accv")
    red = kb.local(f32, (L,), hint="red")
    mxv = kb.local(f32, (L,), hint="rowmax")
    inv = kb.local(f32, (R * L,), hint="inv")
    zero = kb.broadcast(as_expr(0.0, f32), L)
    tail = sk % L      # keys in the last, partial vector (0: none)
    pad = ctx.pack(np.array([0.0] * tail + [-math.inf] * (L - tail), np.float32), "keypad") if tail else None
    if pad is not None:
        kb.kernel.params.append(pad)

    def block(i0, nr: int) -> None:
        for c0, nv in QS:
            for r in range(nr):
                for t in range(nv):
                    kb.store(accv, (r * TQ + t) * L, zero)
            with kb.reduce(d, hint="d") as c:
                kv = [kt.vload(((c0 + t) * d + c) * L if kt_blocked else kt0 + c * ks + (c0 + t) * L, L)
                      for t in range(nv)]
                for r in range(nr):
                    qv = q[bidx(q, b, [i0 + r, c])]
                    for t in range(nv):
                        a = (r * TQ + t) * L
                        kb.store(accv, a, fma(qv, kv[t], accv.vload(a, L)))
            for r in range(nr):
                i = i0 + r
                for t in range(nv):
                    j0 = (c0 + t) * L
                    val = accv.vload((r * TQ + t) * L, L) * scale
                    if j0 + L <= sk:
                        kb.store(sc, r * ks + j0, apply_mask(val, mask, fill, list(b) + [i, Ramp(as_expr(j0), L)]))
                        continue
                    # the last vector: keys j0..sk-1, then padding lanes, which a constant
                    # vector of 0 and -inf turns into -inf in one add (scores are finite, or
                    # the row is NaN in the reference as well)
                    kb.store(sc, r * ks + j0, val + pad.vload(0, L))
                    if mask is not None:
                        for j in range(j0, sk):
                            kb.store(sc, r * ks + j, apply_mask(sc[r * ks + j], mask, fill, list(b) + [i, as_expr(j)]))
        for r in range(nr):
            base = r * ks
            kb.store(red, 0, sc.vload(base, L))
            with kb.reduce(ks // L, start=1, hint="k") as t:
                kb.store(red, 0, row_max(red.vload(0, L), sc.vload(base + t * L, L)))
            mx = lanes_tree(kb, red, 0, L, row_max)
            kb.store(mxv, 0, kb.broadcast(mx, L))       # the row max, read once per vector
            kb.store(red, 0, zero)
            with kb.reduce(ks // L, hint="k") as t:
                kb.store(sc, base + t * L, unop("exp", sc.vload(base + t * L, L) - mxv.vload(0, L)))
                kb.store(red, 0, red.vload(0, L) + sc.vload(base + t * L, L))
            tot = lanes_tree(kb, red, 0, L, lambda a, c: a + c)
            kb.store(inv, r * L, kb.broadcast(1.0 / tot, L))
        for c0, nv in VS:
            for r in range(nr):
                for t in range(nv):
                    kb.store(accv, (r * TV + t) * L, zero)
            with kb.reduce(sk, hint="k") as j:
                vv = [v.vload(v.offset(bidx(v, b, [j, (c0 + t) * L])), L) for t in range(nv)]
                for r in range(nr):
                    pj = sc[r * ks + j]
                    for t in range(nv):
                        a = (r * TV + t) * L
                        kb.store(accv, a, fma(pj, vv[t], accv.vload(a, L)))
            for r in range(nr):
                for t in range(nv):
                    kb.store(y, list(b) + [i0 + r, Ramp(as_expr((c0 + t) * L), L)],
                             accv.vload((r * TV + t) * L, L) * inv.vload(r * L, L))

    full = sq // R
    if full:
        with kb.loop(full, hint="qb", role="spatial") as ib:
            block(ib * R, R)
    if sq % R:
        # the rows left over as one block of sq % R rows (ViT's 197 rows at R = 6: the last 5
        # together, each K^T / V vector load feeding 5 rows' FMA chains, not 5 blocks of one
        # row waiting on FMA latency; vit:197 at 1 thread 0.95 -> 0.91x onnxruntime)
        block(as_expr(full * R), sq % R)


# ----------------------------------------------------------------------------- SkipLayerNorm
@op("SkipLayerNormalization", OpPatternKind.OPAQUE, domain=DOMAIN,
    attrs={"axis": AttrSpec("int", -1), "epsilon": AttrSpec("float", 1e-5)})
class SkipLayerNormalization:
    """Y = LayerNormalization(X + skip (+ bias), scale, B, axis, epsilon); output 1 (optional) is
    the sum X + skip (+ bias) itself.

    Inputs: X, skip, scale, B (optional), bias (optional), one float dtype; X, skip and bias
    broadcast (numpy) to the sum's shape S; scale and B are unidirectionally broadcastable to S.
    Outputs: Y of shape S, and optionally the sum (shape S). Statistics are computed in f32
    (f64 for f64), as ONNX LayerNormalization with stash_type=1 (ONNX spec: Add-14,
    LayerNormalization-17). Raises ShapeError on mixed dtypes or shapes that do not broadcast.
    """

    def infer(node):
        x, skip, scale = node.inputs[:3]
        bias_ln, bias = node.input(3), node.input(4)
        named = [("X", x), ("skip", skip), ("scale", scale)]
        named += [(n, v) for n, v in (("B", bias_ln), ("bias", bias)) if v is not None]
        dt = _same_dtype(named)
        check_float(x, "X")
        shape = broadcast_shapes(x.shape, skip.shape, *([bias.shape] if bias is not None else []))
        norm_axis(node.attr("axis"), len(shape))
        _unidirectional(scale.shape, shape, "scale")
        if bias_ln is not None:
            _unidirectional(bias_ln.shape, shape, "B")
        t = TensorType(dt, shape)
        return [t, t]

    def reference(node, ins):
        x, skip, scale, b, bias = (list(ins) + [None] * 5)[:5]
        s = x + skip
        if bias is not None:
            s = s + bias
        s = s.astype(x.dtype)
        axis = norm_axis(node.attr("axis"), s.ndim)
        return [_layernorm_np(s, axis, float(node.attr("epsilon")), scale, b), s]

    def lower(ctx):
        x, skip, scale = ctx.inputs[:3]
        b = ctx.inputs[3] if len(ctx.inputs) > 3 else None
        bias = ctx.inputs[4] if len(ctx.inputs) > 4 else None
        y = ctx.outputs[0]
        s_out = ctx.outputs[1] if len(ctx.outputs) > 1 else None
        axis = norm_axis(ctx.attr("axis"), len(y.shape))

        def addend(idx):
            s = x.bcast(idx) + skip.bcast(idx)
            return s + bias.bcast(idx) if bias is not None else s

        kb = ctx.kernel()
        _emit_layernorm_rows(kb, y.shape, axis, float(ctx.attr("epsilon")), addend, y, scale, b, s_out,
                             ctx=ctx)

    def flops(node):
        return 10.0 * node.outputs[0].type.numel


# ----------------------------------------------------------------------------- EmbedLayerNorm
def _embed_parts(node):
    """(gathers [(table, ids)], scale, B, addends) of an EmbedLayerNormalization node."""
    k = int(node.attr("num_gathers"))
    ins = node.inputs
    if k < 1 or len(ins) < 2 * k + 1:
        raise ShapeError(f"num_gathers={k} needs at least {2 * k + 1} inputs, got {len(ins)}")
    gathers = [(ins[2 * i], ins[2 * i + 1]) for i in range(k)]
    scale = ins[2 * k]
    b = ins[2 * k + 1] if len(ins) > 2 * k + 1 else None
    addends = [v for v in ins[2 * k + 2:] if v is not None]
    return gathers, scale, b, addends


@op("EmbedLayerNormalization", OpPatternKind.OPAQUE, domain=DOMAIN,
    attrs={"num_gathers": AttrSpec("int", None, required=True), "axis": AttrSpec("int", -1),
           "epsilon": AttrSpec("float", 1e-5)})
class EmbedLayerNormalization:
    """Y = LayerNormalization(Gather(table_0, ids_0) + ... + Gather(table_k-1, ids_k-1) + addends).

    Inputs: ``num_gathers`` pairs (table [V_i, H...], ids int32/int64 of any shape), then scale,
    B (optional) and any number of dense addends. Gather is on axis 0 (ONNX Gather-13, negative
    ids count from the end; ids out of range make ``Module.run`` raise a ValueError and the
    reference an IndexError, as for Gather);
    every term broadcasts (numpy) to the sum's shape S; scale and B are unidirectionally
    broadcastable to S; LayerNormalization-17 with ``axis`` and ``epsilon``, statistics in f32.
    Outputs: Y [S] and optionally the sum [S]. Raises ShapeError on mixed float dtypes,
    non-integer ids or shapes that do not broadcast.
    """

    def infer(node):
        gathers, scale, b, addends = _embed_parts(node)
        named = [(f"table_{i}", t) for i, (t, _) in enumerate(gathers)] + [("scale", scale)]
        named += [("B", b)] if b is not None else []
        named += [(f"addend_{i}", a) for i, a in enumerate(addends)]
        dt = _same_dtype(named)
        check_float(scale, "scale")
        shapes = []
        for i, (t, ids) in enumerate(gathers):
            if ids.dtype not in (DType.i32, DType.i64):
                raise ShapeError(f"ids_{i} must be int32 or int64, got {ids.type}")
            if t.type.rank < 1:
                raise ShapeError(f"table_{i} must have rank >= 1")
            shapes.append(tuple(ids.shape) + tuple(t.shape[1:]))
        shape = broadcast_shapes(*shapes, *[a.shape for a in addends])
        norm_axis(node.attr("axis"), len(shape))
        _unidirectional(scale.shape, shape, "scale")
        if b is not None:
            _unidirectional(b.shape, shape, "B")
        t = TensorType(dt, shape)
        return [t, t]

    def reference(node, ins):
        k = int(node.attr("num_gathers"))
        s = None
        for i in range(k):
            t, ids = ins[2 * i], ins[2 * i + 1]
            # as Gather: an id out of range raises (IndexError naming it), never clipped; the
            # kernel's run-time check raises a ValueError for it (onnxruntime's contrib
            # EmbedLayerNormalization fails on such ids too)
            g = np.take(t, np_wrap(ids, t.shape[0], "id"), axis=0)
            s = g if s is None else s + g
        scale = ins[2 * k]
        b = ins[2 * k + 1] if len(ins) > 2 * k + 1 else None
        for a in ins[2 * k + 2:]:
            if a is not None:
                s = s + a
        s = s.astype(scale.dtype)
        axis = norm_axis(node.attr("axis"), s.ndim)
        return [_layernorm_np(s, axis, float(node.attr("epsilon")), scale, b), s]

    def lower(ctx):
        k = int(ctx.attr("num_gathers"))
        ins = ctx.inputs
        gathers = [(ins[2 * i], ins[2 * i + 1]) for i in range(k)]
        for i in range(k):
            ctx.check_indices(2 * i + 1, ins[2 * i].shape[0], "id")
        scale = ins[2 * k]
        b = ins[2 * k + 1] if len(ins) > 2 * k + 1 else None
        addends = [a for a in ins[2 * k + 2:] if a is not None]
        y = ctx.outputs[0]
        s_out = ctx.outputs[1] if len(ctx.outputs) > 1 else None
        axis = norm_axis(ctx.attr("axis"), len(y.shape))

        def gather(t, ids, idx):
            r_ids, r_t = len(ids.shape), len(t.shape) - 1
            gshape = tuple(ids.shape) + tuple(t.shape[1:])
            gi = list(idx)[len(idx) - len(gshape):]
            gi = [as_expr(0) if dim == 1 else e for dim, e in zip(gshape, gi)]
            row = ids[gi[:r_ids]] if r_ids else ids.flat(0)
            row = row.cast(DType.i64)
            nrow = t.shape[0]
            row = select(row < 0, row + nrow, row)
            row = minimum(maximum(row, 0), nrow - 1)
            return t[[row] + gi[r_ids:r_ids + r_t]]

        def addend(idx):
            s = None
            for t, ids in gathers:
                g = gather(t, ids, idx)
                s = g if s is None else s + g
            for a in addends:
                s = s + a.bcast(idx)
            return s

        kb = ctx.kernel()
        _emit_layernorm_rows(kb, y.shape, axis, float(ctx.attr("epsilon")), addend, y, scale, b, s_out,
                             ctx=ctx)

    def flops(node):
        return 10.0 * node.outputs[0].type.numel


# ----------------------------------------------------------------------------- anchored ops
def _proxy(node: Node, op_name: str, n_inputs: int) -> Node:
    """A detached node of the anchor op (same attributes, first inputs) for reuse of its infer
    and reference; its outputs are fresh Values so the real node's producers stay intact."""
    outs = [Value(v.name, v.type) for v in node.outputs[:1]]
    attrs = {k: v for k, v in node.attrs.items() if k not in ACTIVATION_ATTRS}
    return Node(op_name, node.inputs[:n_inputs], outs, attrs, node.name)


def _check_addend(v: Value | None, shape: tuple[int, ...], dt: DType, what: str) -> None:
    if v is None:
        return
    if v.dtype != dt:
        raise ShapeError(f"{what} has dtype {v.dtype}, the output has {dt}; they must match")
    _unidirectional(v.shape, shape, what)


def _epilogue(ctx, addend_buf):
    """Epilogue: (+ addend broadcast to the output) then the activation, in the output dtype."""
    name, params = activation_params(ctx.node)

    def epi(value, idx):
        if addend_buf is not None:
            value = value + addend_buf.bcast(idx)
        return activation_expr(name, params, value)
    return epi


def _anchored_infer(node, anchor: str, n_anchor_inputs: int, addend_index: int, what: str):
    from tensorfuse.ir.registry import get_op
    activation_params(node)
    (t,) = get_op(anchor).infer(_proxy(node, anchor, n_anchor_inputs))[:1]
    if not t.dtype.is_float:
        raise ShapeError(f"{anchor} with an activation needs a float type, got {t.dtype}")
    _check_addend(node.input(addend_index), t.shape, t.dtype, what)
    return [t]


def _anchored_reference(node, ins, anchor: str, n_anchor_inputs: int, addend_index: int):
    from tensorfuse.ir.registry import get_op
    anchor_ins = list(ins[:n_anchor_inputs]) + [None] * (n_anchor_inputs - len(ins[:n_anchor_inputs]))
    y = get_op(anchor).reference(_proxy(node, anchor, n_anchor_inputs), anchor_ins)[0]
    z = ins[addend_index] if len(ins) > addend_index else None
    if z is not None:
        y = (y + z).astype(y.dtype)
    name, params = activation_params(node)
    return [activation_np(name, params, y)]


def _conv_attrs():
    from tensorfuse.ir.registry import onnx_attr_specs
    return {**onnx_attr_specs("Conv"), **ACTIVATION_ATTRS}


def _gemm_attrs():
    from tensorfuse.ir.registry import onnx_attr_specs
    return {**onnx_attr_specs("Gemm"), **ACTIVATION_ATTRS}


@op("FusedConv", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain=DOMAIN, attrs=_conv_attrs())
class FusedConv:
    """Y = activation(Conv(X * S, W, B) + Z).

    Inputs: X [N, C, D1..Dn], W [M, C/group, k1..kn], B [M] (optional), Z (optional residual,
    unidirectionally broadcastable to Y), S (optional input-channel scale [1 or N, C, 1..1]:
    the squeeze-excitation Mul before a projection conv, folded by
    ``compiler.rules.fuse_conv.FuseConvInputScale``); one float dtype. Attributes: every Conv attribute
    (ONNX spec: Conv-22) plus ``activation`` (one of ``ir.ops.activations.FUSED_ACTIVATIONS``, "" for none) and
    ``activation_params`` (Clip: min, max; LeakyRelu: alpha; HardSigmoid: alpha, beta).
    Means Conv -> Add(Z) -> activation op (Relu-14, Clip-13, LeakyRelu-16, Sigmoid-13,
    HardSigmoid-6, HardSwish-14, x*Sigmoid(x), Tanh-13, Gelu-20). The anchor kernel is Conv's
    (:func:`ir.ops.conv.emit_conv`); Z and the activation run in its epilogue before the single
    store; S multiplies X where the kernel reads it (each input channel's plane by its factor,
    so zero padding stays zero). Raises ShapeError as Conv does, and for an unknown activation,
    a Z that does not broadcast to Y or an S that is not [1 or N, C, 1..1] of X's dtype.
    """

    def infer(node):
        (t,) = _anchored_infer(node, "Conv", 3, 3, "Z")
        s = node.input(4)
        if s is not None:
            x = node.inputs[0]
            if s.dtype != x.dtype:
                raise ShapeError(f"S has dtype {s.dtype}, X has {x.dtype}; they must match")
            want = f"[1 or {x.shape[0]}, {x.shape[1]}{', 1' * (x.type.rank - 2)}]"
            if (s.type.rank != x.type.rank or s.shape[0] not in (1, x.shape[0]) or s.shape[1] != x.shape[1]
                    or any(d != 1 for d in s.shape[2:])):
                raise ShapeError(f"S (the input-channel scale) has shape {list(s.shape)}, expected {want}")
        return [t]

    def reference(node, ins):
        ins = list(ins)
        if len(ins) > 4 and ins[4] is not None:
            ins[0] = (ins[0] * ins[4]).astype(ins[0].dtype)
        return _anchored_reference(node, ins[:4], "Conv", 3, 3)

    def lower(ctx):
        from tensorfuse.ir.ops.conv import conv_geometry_of, emit_conv
        x, w = ctx.inputs[0], ctx.inputs[1]
        b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        z = ctx.inputs[3] if len(ctx.inputs) > 3 else None
        s = ctx.inputs[4] if len(ctx.inputs) > 4 else None
        ctx.epilogue = _epilogue(ctx, z)
        emit_conv(ctx, x, w, b, ctx.outputs[0], int(ctx.attr("group", 1)), conv_geometry_of(ctx.node),
                  x_scale=s)

    def flops(node):
        from tensorfuse.ir.ops.conv import conv_flops
        return conv_flops(node) + 2.0 * node.outputs[0].type.numel


@op("FusedMatMul", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain=DOMAIN, attrs=dict(ACTIVATION_ATTRS))
class FusedMatMul:
    """Y = activation(MatMul(A, B) + bias).

    Inputs: A, B as ONNX MatMul-13 (numpy.matmul semantics), bias (optional) unidirectionally
    broadcastable to Y (the rules give a bias along the last axis), one float dtype.
    Attributes ``activation`` / ``activation_params`` as for FusedConv (Gelu and GeluTanh are
    ONNX Gelu-20 with approximate "none" / "tanh"). The kernel is MatMul's
    (:func:`ir.ops.linalg.emit_matmul`) with bias and activation in its epilogue. Raises
    ShapeError as MatMul does, and for an unknown activation or a bias that does not broadcast.
    """

    def infer(node):
        return _anchored_infer(node, "MatMul", 2, 2, "bias")

    def reference(node, ins):
        return _anchored_reference(node, ins, "MatMul", 2, 2)

    def lower(ctx):
        from tensorfuse.ir.ops.linalg import emit_matmul
        bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        ctx.epilogue = _epilogue(ctx, bias)
        emit_matmul(ctx, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0])

    def flops(node):
        a = node.inputs[0].shape
        return node.outputs[0].type.numel * (2.0 * a[-1] + 2.0)


@op("FusedGemm", OpPatternKind.OUT_ELEMWISE_FUSABLE, domain=DOMAIN, attrs=_gemm_attrs())
class FusedGemm:
    """Y = activation(alpha * A' @ B' + beta * C).

    Inputs and the attributes alpha, beta, transA, transB as ONNX Gemm-13; plus ``activation``
    / ``activation_params`` as for FusedConv. The kernel is Gemm's
    (:func:`ir.ops.linalg.emit_gemm`) with the activation in its epilogue. Raises ShapeError as
    Gemm does, and for an unknown activation.
    """

    def infer(node):
        return _anchored_infer(node, "Gemm", 3, 99, "")

    def reference(node, ins):
        return _anchored_reference(node, ins, "Gemm", 3, 99)

    def lower(ctx):
        from tensorfuse.ir.ops.linalg import emit_gemm
        a, b = ctx.inputs[0], ctx.inputs[1]
        c = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        ctx.epilogue = _epilogue(ctx, None)
        emit_gemm(ctx, a, b, c, ctx.outputs[0], alpha=float(ctx.attr("alpha", 1.0)),
                  beta=float(ctx.attr("beta", 1.0)), trans_a=bool(ctx.attr("transA", 0)),
                  trans_b=bool(ctx.attr("transB", 0)))

    def flops(node):
        from tensorfuse.ir.registry import get_op
        return get_op("Gemm").flops(_proxy(node, "Gemm", 3)) + 2.0 * node.outputs[0].type.numel
