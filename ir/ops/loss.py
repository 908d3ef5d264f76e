"""NegativeLogLikelihoodLoss (ONNX spec, opsets 12/13/22) and SoftmaxCrossEntropyLoss (12/13).

Shapes: X (``input``/``scores``) [N, C, d1, ..., dk] (k >= 0), target [N, d1, ..., dk] of
int32/int64 class indices, optional weight [C] (X's dtype). Output ``loss``: [N, d1, ..., dk]
for ``reduction="none"``, a scalar for "sum" and "mean". SoftmaxCrossEntropyLoss has a second
optional output ``log_prob`` [N, C, d1, ..., dk] = LogSoftmax(X, axis=1).

Semantics: with ``lp`` = X (NLL) or LogSoftmax(X, axis=1) (SCE), and w[c] = weight[c] (1
without weights), ``loss[n, d] = -lp[n, t, d] * w[t]`` for t = target[n, d], and 0 where
t == ``ignore_index``. "sum" adds the losses; "mean" divides that sum by the sum of w[t] over
the targets that are not ignored (the count of them without weights; 0/0 gives NaN as in the
reference). A target outside [0, C) that is not ignore_index is out of contract in ONNX; the
kernels clamp it into range rather than read outside the tensor.

Dtypes: X and weight f16/bf16/f32/f64 (f16/bf16 accumulate in float32); target int32/int64.
Errors (ShapeError): X of rank < 2, a target shape other than [N, d1..dk], weight not [C],
an unknown reduction, dtype mismatches.
"""
from __future__ import annotations

import math

import numpy as np

from tensorfuse.ir.kernel import as_expr, maximum, minimum, select, unop
from tensorfuse.ir.lowering import LowerCtx
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType, TensorType

_FLOATS = (DType.f16, DType.bf16, DType.f32, DType.f64)
_REDUCTIONS = ("none", "sum", "mean")


def _infer(node, softmax: bool) -> list[TensorType]:
    x, t, w = node.inputs[0], node.input(1), node.input(2)
    if t is None:
        raise ShapeError("input 1 (target) is required")
    if x.dtype not in _FLOATS:
        raise ShapeError(f"input 0 has dtype {x.dtype}; f16, bf16, f32 or f64 are allowed")
    if t.dtype not in (DType.i32, DType.i64):
        raise ShapeError(f"target has dtype {t.dtype}; int32 or int64 are allowed")
    if x.type.rank < 2:
        raise ShapeError(f"input 0 must have rank >= 2 ([N, C, d1..dk]), got {list(x.shape)}")
    want = (x.shape[0],) + x.shape[2:]
    if t.shape != want:
        raise ShapeError(f"target shape {list(t.shape)} must be [N, d1..dk] = {list(want)}")
    if w is not None and (w.shape != (x.shape[1],) or w.dtype != x.dtype):
        raise ShapeError(f"weight must be {x.dtype}[{x.shape[1]}], got {w.type}")
    red = node.attr("reduction", "mean")
    if red not in _REDUCTIONS:
        raise ShapeError(f"reduction must be one of {_REDUCTIONS}, got {red!r}")
    out = [TensorType(x.dtype, t.shape if red == "none" else ())]
    if softmax:
        out.append(x.type)
    return out


def _acc_np(dt: np.dtype):
    return np.float64 if dt == np.float64 else np.float32


def _reference(node, ins, softmax: bool):
    x, t = ins[0], ins[1]
    w = ins[2] if len(ins) > 2 else None
    acc = _acc_np(x.dtype)
    n, c = x.shape[:2]
    xs = x.astype(acc).reshape(n, c, -1)
    tt = t.reshape(n, -1).astype(np.int64)
    with np.errstate(all="ignore"):
        if softmax:
            m = np.max(xs, axis=1, keepdims=True)
            lp = xs - m - np.log(np.sum(np.exp(xs - m), axis=1, keepdims=True))
        else:
            lp = xs
        ii = node.attr("ignore_index")
        valid = np.ones(tt.shape, bool) if ii is None else tt != ii
        tc = np.clip(tt, 0, c - 1)
        wt = np.ones(tt.shape, acc) if w is None else w.astype(acc)[tc]
        wt = np.where(valid, wt, acc(0))
        picked = np.take_along_axis(lp, tc[:, None, :], axis=1)[:, 0, :]
        loss = np.where(valid, -picked * wt, acc(0))
        red = node.attr("reduction", "mean")
        if red == "none":
            out = loss.reshape(t.shape)
        elif red == "sum":
            out = np.sum(loss)
        else:
            out = np.sum(loss) / np.sum(wt)
    res = [np.asarray(out).astype(x.dtype)]
    if softmax:
        res.append(lp.reshape(x.shape).astype(x.dtype))
    return res


def _lower(ctx: LowerCtx, softmax: bool) -> None:
    node = ctx.node
    x, t = ctx.inputs[0], ctx.inputs[1]
    w = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    loss = ctx.outputs[0]
    logp = ctx.outputs[1] if softmax and len(ctx.outputs) > 1 else None
    n, c = x.shape[:2]
    dsz = int(np.prod(x.shape[2:], dtype=np.int64))
    acc = DType.f64 if x.dtype == DType.f64 else DType.f32
    ii = node.attr("ignore_index")
    red = node.attr("reduction", "mean")
    kb = ctx.kernel()
    num = kb.local(acc, (1,), hint="num")
    den = kb.local(acc, (1,), hint="den")
    mx = kb.local(acc, (1,), hint="max")
    lse = kb.local(acc, (1,), hint="lse")
    zero = as_expr(0.0, acc)
    kb.store(num, 0, zero)
    kb.store(den, 0, zero)

    def xat(i, ci, di):
        return x.flat(i * (c * dsz) + ci * dsz + di).cast(acc)

    with kb.loop(n, hint="n") as i, kb.loop(dsz, hint="d") as di:
        if softmax:
            kb.store(mx, 0, as_expr(-math.inf, acc))
            with kb.loop(c, hint="c") as ci:
                kb.store(mx, 0, maximum(mx[0], xat(i, ci, di)))
            kb.store(lse, 0, zero)
            with kb.loop(c, hint="c") as ci:
                kb.store(lse, 0, lse[0] + unop("exp", xat(i, ci, di) - mx[0]))
            kb.store(lse, 0, mx[0] + unop("log", lse[0]))
            if logp is not None:
                with kb.loop(c, hint="c") as ci:
                    kb.store(logp, i * (c * dsz) + ci * dsz + di, (xat(i, ci, di) - lse[0]).cast(logp.dtype))
        tv = t.flat(i * dsz + di).cast(DType.i64)
        tc = minimum(maximum(tv, 0), c - 1)
        wv = as_expr(1.0, acc) if w is None else w.flat(tc).cast(acc)
        lp = xat(i, tc, di)
        if softmax:
            lp = lp - lse[0]
        lv = -lp * wv
        if ii is not None:
            valid = tv.ne(as_expr(int(ii), DType.i64))
            lv = select(valid, lv, zero)
            wv = select(valid, wv, zero)
        if red == "none":
            kb.store(loss, i * dsz + di, lv.cast(loss.dtype))
        else:
            kb.store(num, 0, num[0] + lv)
            kb.store(den, 0, den[0] + wv)
    if red == "sum":
        kb.store(loss, 0, num[0].cast(loss.dtype))
    elif red == "mean":
        kb.store(loss, 0, (num[0] / den[0]).cast(loss.dtype))


def _flops(node) -> float:
    x = node.inputs[0]
    return float(3 * x.type.numel)


@op("NegativeLogLikelihoodLoss", OpPatternKind.OPAQUE)
class NegativeLogLikelihoodLoss:
    """loss = -input[n, target[n, d], d] * weight[target] with ignore_index and reduction
    none/sum/mean. ONNX spec: NegativeLogLikelihoodLoss-22 (12 and 13 mean the same); see the
    module docstring for shapes, dtypes and errors. One kernel over (n, d)."""

    def infer(node):
        return _infer(node, False)

    def reference(node, ins):
        return _reference(node, ins, False)

    def lower(ctx):
        _lower(ctx, False)

    flops = _flops


@op("SoftmaxCrossEntropyLoss", OpPatternKind.OPAQUE)
class SoftmaxCrossEntropyLoss:
    """NegativeLogLikelihoodLoss of LogSoftmax(scores, axis=1), with the optional second output
    log_prob. ONNX spec: SoftmaxCrossEntropyLoss-13 (12 means the same). One kernel over (n, d):
    max and log-sum-exp over C, then the picked log-probability."""

    def infer(node):
        return _infer(node, True)

    def reference(node, ins):
        return _reference(node, ins, True)

    def lower(ctx):
        _lower(ctx, True)

    flops = _flops
