"""A backend-agnostic check of kernel-IR expression semantics against ``ir/semantics.py``.

For each source dtype (and vector width) :func:`build_group` makes ONE kernel: inputs ``a``,
``b``, ``c`` (1-D, ``n`` elements: ``a`` x ``b`` is every pair of the dtype's edge values --
0, -0, +-1, MIN/MAX, NaN, +-inf, denormals, large and small values, ties for rounding, shift
counts around the width --, ``c`` a fixed permutation of ``b``) and one output per case, each
``out_k[i] = expr_k(a[i], b[i], c[i])`` in a ``parallel`` loop (``lanes`` > 1: the vector form,
``out_k[Ramp(i*lanes)] = expr_k(a.vload(i*lanes), ...)``). A case is every Bin op, Un op and
Cast the spec defines on the dtype, FMA, Select, maxnum/minnum, and constant operands
(including the integer-division guards on a constant divisor). Batching every case of a dtype
into one kernel keeps the number of compiles small (one per group).

:func:`check_backend` runs the groups through a backend and compares each output with
:func:`tensorfuse.ir.semantics.evaluate`: bitwise (NaN = NaN of any sign and payload) for exact
ops, within :func:`~tensorfuse.ir.semantics.ulp_bound` (or the backend's own bounds, ``ulp``)
of :func:`~tensorfuse.ir.semantics.reference64` for approximate ones; FMA may be fused or
unfused unless ``fma`` says which. It raises AssertionError listing the failures (case, dtype,
lanes, inputs, got, expected) and returns the number of values checked.

A backend supplies ``run_kernel(kernel, inputs, out_shape_dtypes) -> list[np.ndarray]``: run
``kernel`` (params: the input buffers in order, then the output buffers) on the numpy
``inputs`` and return the outputs, one per ``(shape, numpy dtype)`` of ``out_shape_dtypes``.
The LLVM one is in ``tests/test_semantics.py``. For CUDA (under the simulator), about::

    import os; os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    from expr_cases import check_backend, DTYPES

    def run_cuda(kernel, inputs, out_shape_dtypes):
        fn = <build the numba.cuda kernel for `kernel` with codegen/cuda>
        d_in = [cuda.to_device(a) for a in inputs]
        d_out = [cuda.device_array(s, d) for s, d in out_shape_dtypes]
        <launch fn over the parallel loop's extent with d_in + d_out>
        return [d.copy_to_host() for d in d_out]

    def test_cuda_expression_semantics():
        assert check_backend(run_cuda, max_pairs=96) > 1000

``max_pairs`` caps ``n`` (a deterministic subset of the pairs: every pair of
:func:`special_values` first), to keep simulated launches small: 64 to 96 pairs keep the
NaN/inf/zero/MIN/MAX combinations of every dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tensorfuse.ir import semantics as sem
from tensorfuse.ir.kernel import (BINOPS_ARITH, BINOPS_CMP, UNOPS, Buffer, Cast, Const, Expr, KernelBuilder, Ramp, Var,
                                  binop, fma, maxnum, minnum, select, unop)
from tensorfuse.ir.types import DType

DTYPES = sem.DTYPES
#: (dtype, lanes[, loop kind]) groups :func:`check_backend` runs by default: every dtype with
#: scalar code in a ``parallel`` loop, and a few with explicit vectors of 4 to 16 lanes (up to
#: an AVX-512 register). (A ``vectorize`` loop over so many outputs is left scalar by LLVM's
#: loop vectoriser, too many pointers to check for overlap, so vectors are written explicitly.)
GROUPS = tuple((dt, 1) for dt in DTYPES) + (
    (DType.f32, 4), (DType.i32, 4), (DType.f16, 4), (DType.u8, 4), (DType.bool, 4),
    (DType.f32, 16), (DType.f64, 8), (DType.i64, 8), (DType.i8, 16), (DType.u16, 8))


def edge_values(dt: DType) -> np.ndarray:
    """The dtype's edge values (a 1-D array of ``dt``)."""
    if dt == DType.bool:
        return np.array([False, True])
    if dt.is_float:
        t = dt.numpy.type
        fi = np.finfo(t)
        tiny_den = np.array(fi.smallest_subnormal, t)
        v = [0.0, -0.0, 1.0, -1.0, 0.5, -1.5, 2.5, -2.5, 3.0, 0.1, -7.25, 100.0, 1e-3,
             float(fi.max), -float(fi.max), float(fi.tiny), float(tiny_den), -float(tiny_den) * 3,
             math.inf, -math.inf, math.nan, 300.0, -40000.0 if dt != DType.f16 else -4000.0]
        if dt != DType.f16:
            v += [1e10, -3e9]
        with np.errstate(all="ignore"):
            return np.array(v, np.float64).astype(t)
    lo, hi = sem._int_range(dt)
    w = dt.itemsize * 8
    v = [0, 1, 2, 3, 7, w - 1, w, w + 1, 100, hi, hi - 1, lo, lo + 1]
    if dt.is_signed:
        v += [-1, -7, -w]
    else:
        v += [hi // 2, hi // 2 + 1]
    return np.array([x for x in dict.fromkeys(v) if lo <= x <= hi], dt.numpy)


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    name: str
    make: Callable[[Expr, Expr, Expr], Expr]    # (a, b, c) -> expression


def _const_cases(dt: DType) -> list[Case]:
    out = []
    if dt.is_float:
        for v in (0.1, -2.5, 1e-5, 65504.0 if dt == DType.f16 else 3.4e38 if dt == DType.f32 else 1e300):
            out.append(Case(f"add_const({v})", lambda a, b, c, v=v: binop("add", a, Const(float(v), dt))))
        return out
    if dt == DType.bool:
        return [Case("and_const(True)", lambda a, b, c: binop("and", a, Const(True, dt)))]
    lo, hi = sem._int_range(dt)
    for v in (7, 3, 1, 0, hi) + ((-1, -3, lo) if dt.is_signed else ()):
        for op in ("div", "rem"):
            out.append(Case(f"{op}_const({v})", lambda a, b, c, v=v, op=op: binop(op, a, Const(v, dt))))
    out.append(Case(f"add_const({hi})", lambda a, b, c: binop("add", a, Const(hi, dt))))
    return out


def cases(dt: DType) -> list[Case]:
    """Every expression case for operands of dtype ``dt``."""
    out = []
    for op in BINOPS_ARITH + BINOPS_CMP:
        if sem.defined(op, dt):
            out.append(Case(op, lambda a, b, c, op=op: binop(op, a, b)))
    for op in UNOPS:
        if sem.defined(op, dt):
            out.append(Case(op, lambda a, b, c, op=op: unop(op, a)))
    for dst in DTYPES:
        if dst != dt:
            out.append(Case(f"cast_{dst}", lambda a, b, c, dst=dst: Cast(dst, a)))
    if dt.is_float:
        out.append(Case("fma", lambda a, b, c: fma(a, b, c)))
        out.append(Case("maxnum", lambda a, b, c: maxnum(a, b)))
        out.append(Case("minnum", lambda a, b, c: minnum(a, b)))
    cond = (lambda a, b: a) if dt == DType.bool else (lambda a, b: binop("lt", a, b))
    out.append(Case("select", lambda a, b, c: select(cond(a, b), b, c)))
    out += _const_cases(dt)
    return out


def special_values(dt: DType) -> np.ndarray:
    """The edge values every subset of pairs keeps paired with each other: 0, -0, +-1, NaN,
    +-inf and a denormal for floats; 0, +-1, MIN, MAX and the width for integers."""
    e = edge_values(dt)
    if dt == DType.bool:
        return e
    if dt.is_float:
        fi = np.finfo(dt.numpy)
        want = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, float(fi.smallest_subnormal)]
        return np.array(want, np.float64).astype(dt.numpy)
    lo, hi = sem._int_range(dt)
    return e[np.isin(e, [0, 1, -1, lo, hi, dt.itemsize * 8])]


def pairs(dt: DType, max_pairs: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c): every pair of edge values, and c, a fixed permutation of b. With
    ``max_pairs``: at most that many, deterministic: every pair of :func:`special_values`
    first, then a fixed random choice of the other pairs."""
    e = edge_values(dt)
    a, b = np.repeat(e, len(e)), np.tile(e, len(e))
    if max_pairs is not None and len(a) > max_pairs:
        sp = set(_bits(special_values(dt)).tolist())
        is_sp = np.array([x in sp for x in _bits(a).tolist()]) & np.array([x in sp for x in _bits(b).tolist()])
        first, rest = np.flatnonzero(is_sp), np.flatnonzero(~is_sp)
        rng = np.random.default_rng(0)
        keep = first[:max_pairs] if len(first) >= max_pairs else \
            np.concatenate([first, rng.choice(rest, max_pairs - len(first), replace=False)])
        keep.sort()
        a, b = a[keep], b[keep]
    c = np.roll(b[::-1], 3)
    return a, b, c


@dataclass
class Group:
    dtype: DType
    lanes: int
    kernel: object
    inputs: list
    params_in: list          # the input Buffers
    outs: list               # (Case, Buffer, stored Expr)
    loop_var: object
    n: int


def build_group(dt: DType, lanes: int = 1, max_pairs: int | None = None, only: Callable | None = None,
                kind: str = "parallel") -> Group:
    """One kernel computing every case of ``dt`` (``only(case_name)`` filters) on the pairs, in
    a loop of ``kind`` ("parallel", "vectorize" or "serial")."""
    a, b, c = pairs(dt, max_pairs)
    pad = (-len(a)) % lanes
    if pad:
        a, b, c = (np.concatenate([x, x[:pad]]) for x in (a, b, c))
    n = len(a)
    bufs = [Buffer(nm, dt, (n,)) for nm in ("a", "b", "c")]
    chosen = [k for k in cases(dt) if only is None or only(k.name)]
    # an output's dtype is the expression's: build each once on a placeholder index first
    outs_bufs = []
    dummy = Var("dummy")
    for case in chosen:
        e = case.make(*[bb.vload(dummy, lanes) if lanes > 1 else bb.flat(dummy) for bb in bufs])
        outs_bufs.append(Buffer(f"out{len(outs_bufs)}_{_ident(case.name)}", e.dtype, (n,)))
    kb = KernelBuilder(f"sem_{dt}_x{lanes}_{kind}", bufs + outs_bufs)
    outs = []
    with kb.loop(n // lanes, kind=kind, hint="i") as i:
        base = i * lanes if lanes > 1 else i
        loads = [bb.vload(base, lanes) if lanes > 1 else bb.flat(base) for bb in bufs]
        for case, ob in zip(chosen, outs_bufs):
            e = case.make(*loads)
            if lanes > 1:
                kb.store(ob, [Ramp(base, lanes)], e)
            else:
                kb.store(ob, [base], e)
            outs.append((case, ob, kb.kernel.body[0].body[-1].value))
    return Group(dt, lanes, kb.kernel, [a, b, c], bufs, outs, i, n)


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


# ----------------------------------------------------------------------------- comparing
def _bits(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    return x.view(f"u{x.dtype.itemsize}")


def _fmt(v) -> str:
    v = np.asarray(v)
    if v.dtype.kind == "f":
        return f"{v.item()!r} ({int(_bits(v.reshape(1))[0]):#0{v.dtype.itemsize * 2 + 2}x})"
    return repr(v.item())


def _exact_mismatch(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    if want.dtype.kind == "f":
        both_nan = np.isnan(got) & np.isnan(want)
        return ~both_nan & (_bits(got) != _bits(want))
    return _bits(got) != _bits(want)


def compare(group: Group, results: list, fma_mode: str = "either", ulp: dict | None = None) -> tuple[int, list[str]]:
    """(values checked, failure lines) for one group's backend results."""
    env = {group.params_in[k]: group.inputs[k] for k in range(3)}
    env[group.loop_var] = np.arange(group.n // group.lanes)
    failures, checked = [], 0
    a, b, c = group.inputs
    for (case, ob, e), got in zip(group.outs, results):
        got = np.asarray(got).reshape(-1)
        if got.dtype != ob.dtype.numpy:
            failures.append(f"{case.name} {group.kernel.name}: result dtype {got.dtype}, "
                            f"expected {ob.dtype.numpy}")
            continue
        want = sem.evaluate(e, env, fma="fused").reshape(-1)
        if sem.is_approx(e):
            ref = sem.reference64(e, env).reshape(-1)
            if e.dtype.is_float:
                bound = (ulp or {}).get((case.name, e.dtype), sem.ulp_bound(e.op, e.dtype))
                err = sem.ulp_error(got, ref, e.dtype)
                bad = ~(err <= bound)
                how = lambda j: f"{err[j]:.3g} ulp > {bound} (ref {ref[j]!r})"  # noqa: E731
            else:   # integer pow: between the casts of ref -+ bound ulp(f64)
                # (the cast to bool is not monotone: bool results are compared exactly)
                bound = sem.ulp_bound(e.op, e.dtype)
                with np.errstate(all="ignore"):
                    sp = np.where(np.isfinite(ref), np.spacing(np.abs(ref)) * bound, 0.0)
                    lo = sem._cast(ref - sp, DType.f64, e.dtype)
                    hi = sem._cast(ref + sp, DType.f64, e.dtype)
                bad = _exact_mismatch(got, want)
                if e.dtype != DType.bool:
                    bad &= ~((got >= lo) & (got <= hi))
                how = lambda j: f"outside [{lo[j]}, {hi[j]}] (ref {ref[j]!r})"  # noqa: E731
        else:
            bad = _exact_mismatch(got, want)
            if e.__class__.__name__ == "FMA" and fma_mode != "fused":
                alt = sem.evaluate(e, env, fma="unfused").reshape(-1)
                bad_alt = _exact_mismatch(got, alt)
                bad = bad_alt if fma_mode == "unfused" else (bad & bad_alt)
            how = lambda j: "bitwise"  # noqa: E731
        checked += got.size
        for j in np.flatnonzero(bad)[:4]:
            lane_j = j
            ins = ", ".join(_fmt(x[lane_j]) for x in (a, b, c))
            failures.append(f"{case.name} {group.kernel.name}: inputs (a, b, c) = ({ins}): "
                            f"got {_fmt(got[j])}, expected {_fmt(want[j])} [{how(j)}]")
    return checked, failures


def check_backend(run_kernel, groups=GROUPS, fma: str = "either", ulp: dict | None = None,
                  max_pairs: int | None = None, only: Callable | None = None) -> int:
    """Check a backend's expressions against the spec (see the module docstring).

    ``groups``: (dtype, lanes[, loop kind]) tuples (:data:`GROUPS`); ``fma``: "either", "fused" or "unfused"; ``ulp``: the
    backend's own bounds, ``{(case name, dtype): ulp}``, overriding :func:`ulp_bound`;
    ``only(case_name)``: a filter. Returns the number of values checked; raises AssertionError
    listing (up to 60 of) the failures."""
    failures, total = [], 0
    for dt, lanes, *kind in groups:
        g = build_group(dt, lanes, max_pairs, only, *kind)
        if not g.outs:
            continue
        res = run_kernel(g.kernel, list(g.inputs), [((g.n,), ob.dtype.numpy) for _, ob, _ in g.outs])
        n, f = compare(g, res, fma, ulp)
        total += n
        failures += f
    if failures:
        raise AssertionError(f"{len(failures)} expression results differ from ir/semantics.py:\n"
                             + "\n".join(failures[:60]))
    return total
