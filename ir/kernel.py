"""Kernel IR: loop nests over buffers with schedule annotations (docs/architecture.md, IR level 3).

A :class:`Kernel` has buffer parameters and a body of statements: :class:`For` (with a kind:
``serial``, ``parallel``, ``vectorize`` or ``unroll``; on GPUs also ``blockIdx.x``,
``threadIdx.x`` and ``grid_stride``), :class:`Store`, :class:`If`, :class:`Barrier` (GPUs), and
scratch buffers (:class:`Buffer` with ``scope="local"``, per thread, or ``scope="shared"``, per
GPU thread block). A GPU kernel carries its launch shape (:class:`LaunchShape`). Expressions are typed
(:class:`Expr.dtype`); arithmetic operators build :class:`Bin` nodes, and Python numbers are
promoted to the other operand's dtype. Indices are int64 and buffers are row-major: ``buf[i, j]``
builds a :class:`Load` at the flat offset ``i*shape[1] + j``.

Codegen (``codegen/llvm``) turns a kernel into one function; kernels know nothing of ONNX.

Example: a ReLU kernel::

    kb = KernelBuilder("relu", [x, y])
    with kb.grid(y.shape) as idx:
        kb.store(y, idx, kb.max(x[idx], 0.0))
    print(kb.kernel)
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Sequence, Union

from .types import DType

I64 = DType.i64


# ----------------------------------------------------------------------------- expressions
class Expr:
    dtype: DType
    #: vector width: 1 for a scalar, n for a vector of n ``dtype`` elements (f32 x n)
    lanes = 1

    # arithmetic (Python numbers adopt the other operand's dtype)
    def __add__(self, o): return binop("add", self, o)
    def __radd__(self, o): return binop("add", o, self)
    def __sub__(self, o): return binop("sub", self, o)
    def __rsub__(self, o): return binop("sub", o, self)
    def __mul__(self, o): return binop("mul", self, o)
    def __rmul__(self, o): return binop("mul", o, self)
    def __truediv__(self, o): return binop("div", self, o)
    def __rtruediv__(self, o): return binop("div", o, self)
    def __floordiv__(self, o): return binop("div", self, o)   # integer division truncates (C)
    def __mod__(self, o): return binop("rem", self, o)        # remainder takes the dividend's sign (C)
    def __neg__(self): return unop("neg", self)
    def __and__(self, o): return binop("and", self, o)
    def __or__(self, o): return binop("or", self, o)
    def __xor__(self, o): return binop("xor", self, o)
    def __invert__(self): return unop("not", self)
    def __lt__(self, o): return binop("lt", self, o)
    def __le__(self, o): return binop("le", self, o)
    def __gt__(self, o): return binop("gt", self, o)
    def __ge__(self, o): return binop("ge", self, o)
    # == and != stay Python identity so Exprs can live in dicts; use eq()/ne()
    def eq(self, o): return binop("eq", self, o)
    def ne(self, o): return binop("ne", self, o)
    __hash__ = object.__hash__

    def cast(self, dtype: DType) -> "Expr":
        return self if dtype == self.dtype else Cast(dtype, self)


@dataclass(eq=False)
class Const(Expr):
    value: Union[int, float, bool]
    dtype: DType = I64


@dataclass(eq=False)
class Var(Expr):
    name: str
    dtype: DType = I64


@dataclass(eq=False)
class Load(Expr):
    """``buf[index]``; with ``lanes`` > 1 the vector of elements ``index + l * stride`` for
    l < lanes (``stride`` 1: the contiguous ``buf[index : index+lanes]``; else a gather)."""
    buf: "Buffer"
    index: Expr   # flat element offset (of the first lane)
    lanes: int = 1
    stride: int = 1

    @property
    def dtype(self):
        return self.buf.dtype


@dataclass(eq=False)
class Ramp(Expr):
    """The index vector ``base, base+1, ..., base+lanes-1`` as one entry of a buffer index list:
    ``buf[[i, Ramp(j0, 8)]]`` is the contiguous vector ``buf[i, j0 : j0+8]``; in another
    position, the vector strided by that dim (``buf[[Ramp(c0, 8), h, w]]``: 8 channels). A
    store through such an index writes a vector (vector epilogues index outputs this way)."""
    base: Expr
    lanes: int
    dtype: DType = I64


@dataclass(eq=False)
class Broadcast(Expr):
    """A scalar expression repeated in every lane of a vector."""
    a: Expr
    lanes: int

    @property
    def dtype(self):
        return self.a.dtype


@dataclass(eq=False)
class FMA(Expr):
    """``a * b + c`` with one rounding where the target has fused multiply-add (llvm.fmuladd:
    fused when the target has FMA, else a multiply and an add). Float dtypes only."""
    a: Expr
    b: Expr
    c: Expr

    @property
    def dtype(self):
        return self.a.dtype

    @property
    def lanes(self):
        return self.a.lanes


#: operand packings of :class:`DotAcc`: name -> (element dtype of ``a``, of ``b``, elements per
#: 32-bit lane)
DOT_PACKINGS = {"u8s8": (DType.u8, DType.i8, 4), "s16s16": (DType.i16, DType.i16, 2)}
#: instruction forms a :class:`DotAcc` may ask for (the meaning is the same for all): "" any
#: (plain LLVM IR, or scalar code), "vnni" (x86 ``vpdpbusd``, packing u8s8), "pmaddwd" (x86
#: ``vpmaddwd`` then ``vpaddd``, packing s16s16)
DOT_ISAS = ("", "vnni", "pmaddwd")


@dataclass(eq=False)
class DotAcc(Expr):
    """Integer dot-product-accumulate, lane by lane: ``acc`` (i32) plus, per 32-bit lane, the
    sum of the products of the narrow integers packed in that lane of ``a`` and ``b`` (both
    i32, little-endian: element t sits in bits [t*w, (t+1)*w)). ``packing`` (see
    :data:`DOT_PACKINGS`): ``"u8s8"``, four u8 of ``a`` times four i8 of ``b`` (Intel SDM,
    VPDPBUSD); ``"s16s16"``, two i16 times two i16 (Intel SDM, VPMADDWD). The products and
    their sum are exact (at most 4 * 255 * 128 in magnitude); adding ``acc`` wraps modulo
    2**32 (VPDPBUSD, not the saturating VPDPBUSDS). ``isa`` (:data:`DOT_ISAS`): the instruction
    form the schedule chose from the target's features; codegen honours it, the meaning does
    not depend on it."""
    acc: Expr
    a: Expr
    b: Expr
    packing: str = "u8s8"
    isa: str = ""

    @property
    def dtype(self):
        return DType.i32

    @property
    def lanes(self):
        return self.acc.lanes


def dot_acc(acc, a: Expr, b: Expr, packing: str = "u8s8", isa: str = "") -> Expr:
    """:class:`DotAcc` of ``acc + dot(a, b)`` per lane; scalar operands broadcast to the others'
    width. Raises TypeError for operands that are not i32, an unknown packing or isa, or an isa
    that does not take the packing."""
    if packing not in DOT_PACKINGS:
        raise TypeError(f"dot_acc packing must be one of {sorted(DOT_PACKINGS)}, got {packing!r}")
    if isa not in DOT_ISAS or (isa == "vnni" and packing != "u8s8") or (isa == "pmaddwd" and packing != "s16s16"):
        raise TypeError(f"dot_acc: isa {isa!r} does not take packing {packing!r}")
    acc = as_expr(acc, DType.i32)
    if not (acc.dtype == a.dtype == b.dtype == DType.i32):
        raise TypeError(f"dot_acc takes i32 operands (packed lanes), got {acc.dtype}, {a.dtype}, {b.dtype}")
    acc, a, b = _same_lanes("dot_acc", acc, a, b)
    return DotAcc(acc, a, b, packing, isa)


@dataclass(eq=False)
class Lookup(Expr):
    """A read of a constant table: ``table[index]`` per lane. ``table`` is a tuple of Python
    numbers (the values, ``dtype`` elements), ``index`` an i32 expression (scalar or vector) in
    [0, len(table)); an index outside is undefined behaviour in generated code (the semantics
    raise IndexError). Backends hold the table as a constant of the module (llvm: a private
    global, read with a gather for vectors; cuda: a module constant). Used by 8-bit
    elementwise chains turned into 256-entry tables (``tensorfuse::TableLookup``)."""
    table: tuple
    tdtype: DType
    index: Expr

    @property
    def dtype(self):
        return self.tdtype

    @property
    def lanes(self):
        return self.index.lanes

    @property
    def digest(self) -> str:
        """A short hex digest of the table's dtype and values: what names the table in
        generated code and in the kernel text (so kernels that differ only in their table
        differ in the text the kernel cache and ``dedupe_kernels`` key on)."""
        import hashlib
        return hashlib.sha1(repr((self.dtype.value, self.table)).encode()).hexdigest()[:16]


def lookup(table: Sequence, dtype: DType, index: Expr) -> Expr:
    """:class:`Lookup` of ``table`` (values of ``dtype``) at ``index`` (cast to i32). Raises
    TypeError for a non-integer index or an empty table."""
    if not len(table):
        raise TypeError("lookup: empty table")
    index = as_expr(index, DType.i32)
    if not (index.dtype.is_int or index.dtype == DType.bool):
        raise TypeError(f"lookup: the index must be an integer, got {index.dtype}")
    values = tuple(float(v) if dtype.is_float else int(v) for v in table)
    return Lookup(values, dtype, index.cast(DType.i32))


BINOPS_ARITH = ("add", "sub", "mul", "div", "rem", "min", "max", "pow", "and", "or", "xor",
                "shl", "shr", "atan2")
BINOPS_CMP = ("lt", "le", "gt", "ge", "eq", "ne")
UNOPS = ("neg", "not", "abs", "sqrt", "exp", "log", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "round",
         "trunc", "isnan", "isinf", "exp2", "log2", "log1p", "expm1")


@dataclass(eq=False)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self):
        return DType.bool if self.op in BINOPS_CMP else self.a.dtype

    @property
    def lanes(self):
        return self.a.lanes


@dataclass(eq=False)
class Un(Expr):
    op: str
    a: Expr

    @property
    def dtype(self):
        return DType.bool if self.op in ("isnan", "isinf") else self.a.dtype

    @property
    def lanes(self):
        return self.a.lanes


@dataclass(eq=False)
class Cast(Expr):
    dtype: DType
    a: Expr

    @property
    def lanes(self):
        return self.a.lanes


@dataclass(eq=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self):
        return self.a.dtype

    @property
    def lanes(self):
        return self.a.lanes


def as_expr(x, like: DType | None = None) -> Expr:
    """Wrap Python numbers as Const (of dtype ``like``, else i64/f32/bool by Python type)."""
    if isinstance(x, Expr):
        return x
    if like is None:
        like = DType.bool if isinstance(x, bool) else I64 if isinstance(x, int) else DType.f32
    if like.is_float:
        return Const(float(x), like)
    if like == DType.bool:
        return Const(bool(x), like)
    return Const(int(x), like)


def _same_lanes(what: str, *xs: Expr) -> list[Expr]:
    """Broadcast scalar operands to the vector width of the others; mixed widths are an error."""
    n = max(x.lanes for x in xs)
    if any(x.lanes not in (1, n) for x in xs):
        raise TypeError(f"{what}: operand vector widths differ ({[x.lanes for x in xs]})")
    return [Broadcast(x, n) if x.lanes != n else x for x in xs]


def binop(op: str, a, b) -> Expr:
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        raise TypeError("binop needs at least one Expr")
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: operand dtypes differ ({a.dtype} vs {b.dtype}); cast first")
    if a.lanes != b.lanes:
        a, b = _same_lanes(op, a, b)
    # fold the integer index arithmetic that lowering produces in bulk
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == I64:
        fold = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}
        if op in fold:
            return Const(fold[op](a.value, b.value), I64)
    if op == "add":
        if isinstance(b, Const) and b.value == 0 and not a.dtype.is_float:
            return a
        if isinstance(a, Const) and a.value == 0 and not a.dtype.is_float:
            return b
    if op == "mul" and not a.dtype.is_float:
        if isinstance(b, Const) and b.value == 1:
            return a
        if isinstance(a, Const) and a.value == 1:
            return b
        if (isinstance(a, Const) and a.value == 0) or (isinstance(b, Const) and b.value == 0):
            return Const(0, a.dtype)
    return Bin(op, a, b)


def unop(op: str, a: Expr) -> Expr:
    assert op in UNOPS, op
    return Un(op, a)


def select(cond, a, b) -> Expr:
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if a.dtype != b.dtype:
        raise TypeError(f"select: branch dtypes differ ({a.dtype} vs {b.dtype})")
    cond = as_expr(cond, DType.bool)
    if not (cond.lanes == a.lanes == b.lanes):
        cond, a, b = _same_lanes("select", cond, a, b)
    return Select(cond, a, b)


def broadcast(x, lanes: int) -> Expr:
    """``x`` (a scalar Expr) in each of ``lanes`` lanes; ``lanes`` == 1 returns ``x``."""
    x = as_expr(x)
    if lanes == 1 or x.lanes == lanes:
        return x
    if x.lanes != 1:
        raise TypeError(f"broadcast of a {x.lanes}-lane vector to {lanes} lanes")
    return Broadcast(x, lanes)


@dataclass(eq=False)
class Shuffle(Expr):
    """Lanes picked from two vectors of the same dtype and width n: lane i of the result is
    lane ``mask[i]`` of the concatenation ``a ++ b`` (0 <= mask[i] < 2n), as LLVM's
    ``shufflevector`` (LLVM Language Reference, "shufflevector" instruction). Schedules use it
    to transpose register tiles (the int8 channel layout, ``codegen/llvm/schedules``)."""
    a: Expr
    b: Expr
    mask: tuple

    @property
    def dtype(self):
        return self.a.dtype

    @property
    def lanes(self):
        return len(self.mask)


def shuffle(a: Expr, b: Expr, mask) -> Shuffle:
    """:class:`Shuffle` of ``a ++ b`` by ``mask``. Raises TypeError for operands of different
    dtypes or widths, scalars, or a mask entry outside [0, 2n)."""
    if not (isinstance(a, Expr) and isinstance(b, Expr)) or a.dtype != b.dtype or a.lanes != b.lanes or a.lanes < 2:
        raise TypeError(f"shuffle takes two vectors of one dtype and width, got {a!r}, {b!r}")
    mask = tuple(int(m) for m in mask)
    if not mask or any(not 0 <= m < 2 * a.lanes for m in mask):
        raise TypeError(f"shuffle mask entries must lie in [0, {2 * a.lanes}), got {mask}")
    return Shuffle(a, b, mask)


#: instruction forms of :class:`Concat` (its ``isa``): "" plain LLVM IR; "x86pack": where the
#: parts are saturating float -> u8 / i8 :class:`Cast` s, they may narrow together through the
#: x86 packs (Intel SDM: VPACKSSDW then VPACKUSWB or VPACKSSWB, and a VPERMD of the result's
#: dwords) at 16 lanes a part (AVX-512BW) or 8 (AVX2)
CONCAT_ISAS = ("", "x86pack")


@dataclass(eq=False)
class Concat(Expr):
    """The lanes of ``parts`` one after another (all of one dtype and width n; the result has
    len(parts) * n lanes), as one wide value a schedule stores with one store. ``isa``
    (:data:`CONCAT_ISAS`): the instruction form the schedule chose from the target's
    features; codegen honours it where the parts allow, the meaning does not depend on it."""
    parts: tuple
    isa: str = ""

    @property
    def dtype(self):
        return self.parts[0].dtype

    @property
    def lanes(self):
        return len(self.parts) * self.parts[0].lanes


def concat(parts: Sequence[Expr], isa: str = "") -> Expr:
    """:class:`Concat` of ``parts`` (2, 4 or 8 vectors of one dtype and width; one part is
    returned as it is). Raises TypeError for scalars, mixed dtypes or widths, another number of
    parts or an unknown ``isa``."""
    ps = tuple(parts)
    if isa not in CONCAT_ISAS:
        raise TypeError(f"concat isa must be one of {CONCAT_ISAS}, got {isa!r}")
    if len(ps) == 1:
        return ps[0]
    if len(ps) not in (2, 4, 8) or not all(isinstance(p, Expr) for p in ps):
        raise TypeError(f"concat takes 2, 4 or 8 expressions, got {len(ps)}")
    d, n = ps[0].dtype, ps[0].lanes
    if n < 2 or any(p.dtype != d or p.lanes != n for p in ps):
        raise TypeError(f"concat takes vectors of one dtype and width, got "
                        f"{[(p.dtype.value, p.lanes) for p in ps]}")
    return Concat(ps, isa)


def interleave(vectors: Sequence[Expr]) -> Expr:
    """The lane-wise interleaving of k vectors of n lanes (k a power of two): lane ``c*k + p``
    of the result is lane c of ``vectors[p]`` (an [n, k] transposition of the [k, n] tile the
    vectors form), built as log2(k) levels of pairwise :class:`Shuffle`. Raises ValueError for
    a k that is not a power of two."""
    vs = list(vectors)
    k = len(vs)
    if k < 1 or k & (k - 1):
        raise ValueError(f"interleave takes a power-of-two number of vectors, got {k}")
    n = vs[0].lanes
    g = 1                                           # lanes per source lane so far
    while len(vs) > 1:
        m = n * g                                   # lanes of each vector at this level
        mask = [src + c * g + t for c in range(n) for src in (0, m) for t in range(g)]
        vs = [shuffle(vs[i], vs[i + 1], mask) for i in range(0, len(vs), 2)]
        g *= 2
    return vs[0]


def fma(a, b, c) -> Expr:
    """``a * b + c`` (see :class:`FMA`); scalars broadcast to the vector operand's width."""
    a = as_expr(a, next((x.dtype for x in (b, c) if isinstance(x, Expr)), None))
    b, c = as_expr(b, a.dtype), as_expr(c, a.dtype)
    if not (a.dtype == b.dtype == c.dtype) or not a.dtype.is_float:
        raise TypeError(f"fma takes one float dtype, got {a.dtype}, {b.dtype}, {c.dtype}")
    a, b, c = _same_lanes("fma", a, b, c)
    return FMA(a, b, c)


def minimum(a, b) -> Expr:
    """NaN-propagating minimum (as numpy.minimum)."""
    return binop("min", a, b)


def maximum(a, b) -> Expr:
    """NaN-propagating maximum (as numpy.maximum)."""
    return binop("max", a, b)


def maxnum(a, b) -> Expr:
    """NaN-skipping maximum (IEEE 754 maxNum, numpy.fmax): the larger of ``a`` and ``b``; a NaN
    operand is ignored, so the result is NaN only when both are. Integers: :func:`maximum`. The
    rule of tensorfuse's max-like reductions and windows (ReduceMax, MaxPool, GlobalMaxPool,
    README "NaN in max/min-like ops"). Two selects, which vectorise to compares and blends."""
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if not a.dtype.is_float:
        return maximum(a, b)
    return select(b > a, b, select(unop("isnan", a), b, a))


def row_max(a, b) -> Expr:
    """``select(b > a, b, a)``: one x86 ``maxps`` where :func:`maximum` (IEEE maximum: NaN and
    signed-zero rules) takes six instructions. A NaN ``b`` is skipped and a NaN ``a`` kept, so it
    is for maxima whose NaN still reaches the result another way: Softmax's and attention's row
    max, followed by exp(x - max) and the row sum, where any NaN of the row makes every output
    NaN as numpy's (and onnxruntime's) softmax does."""
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if not a.dtype.is_float:
        return maximum(a, b)
    return select(b > a, b, a)


def minnum(a, b) -> Expr:
    """NaN-skipping minimum (IEEE 754 minNum, numpy.fmin); see :func:`maxnum`."""
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if not a.dtype.is_float:
        return minimum(a, b)
    return select(b < a, b, select(unop("isnan", a), b, a))


# ----------------------------------------------------------------------------- buffers
#: buffer scopes: "global" (a kernel parameter), "local" (scratch private to one thread),
#: "shared" (scratch shared by the threads of one GPU thread block; static shape)
SCOPES = ("global", "local", "shared")


@dataclass(eq=False)
class Buffer:
    """A dense row-major buffer. ``scope``: "global" (kernel parameter), "local" (scratch, one
    copy per thread) or "shared" (GPU only: one copy per thread block, see :data:`SCOPES`)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    scope: str = "global"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        s, out = 1, []
        for d in reversed(self.shape):
            out.append(s)
            s *= d
        return tuple(reversed(out))

    def offset(self, idx: Sequence) -> Expr:
        """Flat offset of an index list (of a vector's first lane when an entry is a
        :class:`Ramp`; at most one may be)."""
        idx = list(idx) if isinstance(idx, (list, tuple)) else [idx]
        if len(idx) != len(self.shape):
            raise IndexError(f"buffer {self.name} of rank {len(self.shape)} indexed with {len(idx)} indices")
        if sum(isinstance(i, Ramp) for i in idx) > 1:
            raise IndexError(f"buffer {self.name}: at most one Ramp index")
        off: Expr = Const(0, I64)
        for i, s in zip(idx, self.strides):
            off = off + as_expr(i.base if isinstance(i, Ramp) else i, I64) * s
        return off

    def index_vector(self, idx) -> tuple[int, int]:
        """(lanes, element stride) an index list addresses: its Ramp's width and the stride of
        the Ramp's dim, else (1, 1)."""
        idx = idx if isinstance(idx, (list, tuple)) else [idx]
        for i, s in zip(idx, self.strides):
            if isinstance(i, Ramp):
                return i.lanes, s
        return 1, 1

    def __getitem__(self, idx) -> Load:
        idx = idx if isinstance(idx, (list, tuple)) else [idx]
        lanes, stride = self.index_vector(idx)
        return Load(self, self.offset(idx), lanes, stride if lanes > 1 else 1)

    def flat(self, i) -> Load:
        """``buf[i]`` at flat offset ``i``; a :class:`Ramp` ``i`` loads the contiguous vector
        ``buf[base : base+lanes]`` (so per-column parameters read by a finish function serve
        scalar and vector columns alike)."""
        if isinstance(i, Ramp):
            return Load(self, as_expr(i.base, I64), i.lanes)
        return Load(self, as_expr(i, I64))

    def vload(self, i, lanes: int) -> Load:
        """The contiguous vector of ``lanes`` elements at flat offset ``i``."""
        return Load(self, as_expr(i, I64), lanes)

    def bcast(self, out_idx: Sequence) -> Load:
        """Load with numpy broadcasting against an output indexed by ``out_idx``: the buffer's
        dims align with the index's trailing entries, and a dim of size 1 reads index 0. A
        :class:`PixelIndex` (a flat pixel offset over the output's spatial dims) is mapped by
        :meth:`PixelIndex.operand_index`."""
        if isinstance(out_idx, PixelIndex):
            return self[out_idx.operand_index(self)]
        r = len(self.shape)
        idx = list(out_idx)[len(out_idx) - r:] if r else []
        idx = [Const(0, I64) if d == 1 else i for d, i in zip(self.shape, idx)]
        return self[idx] if r else Load(self, Const(0, I64))

    def __repr__(self) -> str:
        return f"{self.name}: {self.dtype.value}[{','.join(map(str, self.shape))}]"


class PixelIndex(list):
    """An output index whose spatial part is one flat pixel offset: ``[n, c, 0, ..., 0, p]``
    addresses element (n, c, p // W, p % W) of an NCHW output whose trailing ``len(spatial)``
    dims are ``spatial`` ([H, W]; p may be a :class:`Ramp` of contiguous pixels that crosses
    rows). As a plain index list it gives the right flat offset into any buffer of the output's
    shape (its spatial dims are contiguous and innermost), so stores take it as it is; only
    broadcasting needs to know which entry is flat, because a spatial dim of size 1 must not
    be mistaken for a broadcast dim that reads index 0 (the width-1 conv residual of issue 24).

    Schedules that vectorise over flattened pixels (the pointwise conv) pass it to
    ``ctx.apply_epilogue``; an epilogue operand must then broadcast over the spatial dims as a
    whole (:meth:`addresses`): right-aligned to the output, its spatial dims are either all
    equal to ``spatial`` or all 1. :meth:`operand_index` raises ShapeError for any other."""

    def __init__(self, idx: Sequence, spatial: Sequence[int]):
        super().__init__(idx)
        self.spatial = tuple(int(d) for d in spatial)
        if not 1 <= len(self.spatial) <= len(self) - 1:
            raise IndexError(f"PixelIndex of {len(self)} entries with spatial dims {self.spatial}")

    def copy(self) -> "PixelIndex":
        return PixelIndex(self, self.spatial)

    def _aligned(self, shape: Sequence[int]) -> tuple[int, ...]:
        r = len(self)
        if len(shape) > r:
            raise IndexError(f"an operand of rank {len(shape)} against an output index of {r} entries")
        return (1,) * (r - len(shape)) + tuple(shape)

    def addresses(self, shape: Sequence[int]) -> bool:
        """Whether an operand of ``shape`` broadcasts over the spatial dims as a whole (so the
        flat pixel offset, or 0, addresses it)."""
        sp = self._aligned(shape)[len(self) - len(self.spatial):]
        return sp == self.spatial or all(d == 1 for d in sp)

    def operand_index(self, buf: "Buffer") -> list:
        """The index list into ``buf`` (numpy broadcasting against the output): leading dims of
        size 1 read 0, spatial dims read the flat offset (all equal to the output's) or 0 (all
        1). Raises ShapeError (``ir.registry``) for an operand that broadcasts along only some
        spatial dims ([W], [H, 1], ...): no flat pixel offset addresses it."""
        k = len(self.spatial)
        r = len(buf.shape)
        lead = len(self) - k
        shape = self._aligned(buf.shape)
        if not self.addresses(buf.shape):
            from .registry import ShapeError
            raise ShapeError(f"operand {buf.name} of shape {list(buf.shape)} broadcasts along only some "
                             f"of the output's spatial dims {list(self.spatial)}: a flat pixel index "
                             f"cannot address it (the schedule must not take such an epilogue)")
        full = shape[lead:] == self.spatial and not all(d == 1 for d in shape[lead:])
        idx = [Const(0, I64) if d == 1 else i for d, i in zip(shape[:lead], self[:lead])]
        idx += [Const(0, I64)] * (k - 1) + [self[-1] if full else Const(0, I64)]
        return idx[len(idx) - r:] if r else []


def copy_index(idx: Sequence) -> list:
    """A copy of an output index list that keeps its kind (:class:`PixelIndex` stays one)."""
    return idx.copy() if isinstance(idx, PixelIndex) else list(idx)


# ----------------------------------------------------------------------------- statements
class Stmt:
    pass


#: loop kinds codegen implements: parallel (split across the thread team), vectorize (the
#: innermost loop left to LLVM's loop vectoriser), unroll (the body repeated per iteration;
#: constant extents only)
CPU_LOOP_KINDS = ("serial", "parallel", "vectorize", "unroll")
#: GPU loop kinds (the cuda backend only; the LLVM backend refuses them): ``blockIdx.x`` runs
#: iteration ``v`` on block ``v`` (block-stride: ``v += gridDim.x`` while ``v < extent``),
#: ``threadIdx.x`` on thread ``v`` of its block (``v += blockDim.x``), ``grid_stride`` on
#: thread ``cuda.grid(1)`` of the whole grid (``v += cuda.gridsize(1)``). Iterations of such a
#: loop run concurrently: the loop must be spatial.
GPU_LOOP_KINDS = ("blockIdx.x", "threadIdx.x", "grid_stride")
LOOP_KINDS = CPU_LOOP_KINDS + GPU_LOOP_KINDS


@dataclass(eq=False)
class For(Stmt):
    var: Var
    extent: Expr
    body: list = field(default_factory=list)
    kind: str = "serial"        # serial | parallel | vectorize | unroll
    start: Expr = field(default_factory=lambda: Const(0, I64))
    comment: str = ""
    #: "spatial": iterations write disjoint outputs (may run in parallel); "reduce": they
    #: accumulate into the same values (ordered); "" unknown: treated as "reduce"
    role: str = ""


@dataclass(eq=False)
class Store(Stmt):
    """``buf[index] = value``; a vector value of n lanes writes ``index + l * stride``."""
    buf: Buffer
    index: Expr
    value: Expr
    stride: int = 1


@dataclass(eq=False)
class If(Stmt):
    cond: Expr
    then: list = field(default_factory=list)
    orelse: list = field(default_factory=list)


@dataclass(eq=False)
class Barrier(Stmt):
    """GPU only: every thread of the block waits here until all have arrived, and their
    stores to shared memory before it are visible after it (``cuda.syncthreads()``). Every
    thread of the block must reach the same barrier (not inside a divergent branch)."""


@dataclass(eq=False)
class Prefetch(Stmt):
    """A hint that ``buf[index]``'s cache line will be read soon: the CPU backend emits
    ``llvm.prefetch`` (x86 ``prefetcht0`` for ``locality`` 3, ``prefetcht1`` for 2,
    ``prefetcht2`` for 1, ``prefetchnta`` for 0); the GPU backend emits nothing. It never
    changes a result and never faults, but its index must still lie inside ``buf`` (bounds
    checking treats it as a read). Used where a schedule streams weights from beyond L2 and the
    hardware prefetcher, which stops at 4 KiB pages, falls behind."""
    buf: Buffer
    index: Expr
    locality: int = 3


#: AMX tile operations (:class:`TileOp`)
TILE_OPS = ("config", "zero", "load", "store", "dpbusd", "dpbsud", "release")
#: x86 AMX: tile registers tmm0..tmm7, each at most 16 rows of 64 bytes
AMX_TILES, AMX_MAX_ROWS, AMX_MAX_COLSB = 8, 16, 64


@dataclass(eq=False)
class TileOp(Stmt):
    """An x86 AMX operation on the tile registers tmm0..tmm7 (Intel 64 and IA-32 Architectures
    Software Developer's Manual, vol. 1 ch. 18 "Intel Advanced Matrix Extensions", and the
    instruction reference: LDTILECFG, TILEZERO, TILELOADD, TILESTORED, TDPBUSD, TILERELEASE);
    CPU backend only, on targets with ``amx-tile`` (and ``amx-int8`` for ``dpbusd``).

    - ``config``: ``shapes`` gives (rows, bytes per row) of each tile 0..7 (palette 1); every
      later operation on a tile uses that shape. Loading a configuration zeroes the tiles.
    - ``zero``: tile ``tiles[0]`` = 0.
    - ``load`` / ``store``: tile ``tiles[0]`` from / to ``rows`` rows of ``colsb`` bytes, row
      ``r`` at element ``index + r * stride`` of ``buf`` (``stride`` in elements).
    - ``dpbusd``: for tiles (c, a, b): c[m, n] += sum over k < colsb(a) of u8 a[m, k] * s8
      b[k // 4, 4 n + k % 4] (int32 lanes, wrapping), the 16 x 16 int32 product of an u8
      [16, 64] tile and an s8 [64, 16] one packed four k to a 32-bit lane.
    - ``dpbsud``: as ``dpbusd`` with a signed (s8) and b unsigned (u8): TDPBSUD.
    - ``release``: the tiles back to their initial state (the thread's extended state small
      again).
    Bounds checking treats a load as a read and a store as a write of each row."""
    op: str
    tiles: tuple = ()
    buf: "Buffer | None" = None
    index: "Expr | None" = None
    stride: int = 0
    rows: int = 0
    colsb: int = 0
    shapes: tuple = ()


#: the most threads a CUDA thread block may have, and the most static shared memory per block
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_BYTES = 48 * 1024


@dataclass(frozen=True)
class LaunchShape:
    """A GPU kernel's launch: ``grid`` blocks of ``block`` threads (tuples of 1 to 3 dims,
    x first). ValueError for a non-positive dim or over :data:`MAX_THREADS_PER_BLOCK` threads
    per block."""
    grid: tuple
    block: tuple

    def __post_init__(self):
        for what, t in (("grid", self.grid), ("block", self.block)):
            if not (1 <= len(t) <= 3) or any(not isinstance(d, int) or d < 1 for d in t):
                raise ValueError(f"launch {what} must be 1 to 3 positive ints, got {t!r}")
        if math.prod(self.block) > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"launch block {self.block} has {math.prod(self.block)} threads "
                             f"(at most {MAX_THREADS_PER_BLOCK})")

    @property
    def threads(self) -> int:
        """Threads in the whole launch."""
        return math.prod(self.grid) * math.prod(self.block)

    def __str__(self) -> str:
        return f"grid={self.grid} block={self.block}"


@dataclass(eq=False)
class Kernel:
    """A compiled unit: ``params`` are global buffers in call order; ``locals`` are scratch
    (local or shared scope). ``launch``: the GPU launch shape (None for CPU kernels, and for
    GPU kernels before scheduling: the cuda schedule sets it)."""

    name: str
    params: list[Buffer]
    body: list[Stmt] = field(default_factory=list)
    locals: list[Buffer] = field(default_factory=list)
    comment: str = ""
    launch: "LaunchShape | None" = None
    #: the schedule that emitted it (``"<backend>.<name>"``, "generic" for the generic loop
    #: nest), the values of the knobs its node declared (``ir.knobs``) and its node's workload
    #: key; set by ``compiler.lower.lower_graph``
    schedule: str = ""
    knobs: dict = field(default_factory=dict)
    workload: str = ""
    #: names of params whose stores may stream past the caches (non-temporal): a graph output
    #: that no kernel reads and that is larger than L2 (set by ``compiler.lower.lower_graph``);
    #: the CPU backend streams each whole 64-byte vector store into one at an offset it can
    #: prove to be a multiple of 64 bytes (the runtime starts every output on a cache line)
    stream: frozenset = frozenset()

    def __str__(self) -> str:
        from .kernel_text import print_kernel
        return print_kernel(self)


class KernelBuilder:
    """Imperative construction of a kernel body with nested ``with`` blocks."""

    def __init__(self, name: str, params: Sequence[Buffer], comment: str = ""):
        self.kernel = Kernel(name, list(params), comment=comment)
        self._stack: list[list[Stmt]] = [self.kernel.body]
        self._n = 0

    def _emit(self, s: Stmt) -> None:
        self._stack[-1].append(s)

    def var(self, hint: str = "i") -> Var:
        self._n += 1
        return Var(f"{hint}{self._n}")

    @contextlib.contextmanager
    def loop(self, extent, kind: str = "serial", start=0, hint: str = "i", comment: str = "",
             role: str = ""):
        """``for v in start..extent`` (extent is the exclusive end). Yields the loop Var.
        ``kind``: serial | parallel | vectorize | unroll, or a GPU kind (see :data:`LOOP_KINDS`); ``role``:
        "spatial" | "reduce" | "" (a ``parallel`` loop is spatial by its author's word)."""
        if kind not in LOOP_KINDS:
            raise ValueError(f"loop kind must be one of {LOOP_KINDS}, got {kind!r}")
        if kind == "parallel" or kind in GPU_LOOP_KINDS:
            role = "spatial"
        v = self.var(hint)
        f = For(v, as_expr(extent, I64), [], kind, as_expr(start, I64), comment, role)
        self._emit(f)
        self._stack.append(f.body)
        try:
            yield v
        finally:
            self._stack.pop()

    @contextlib.contextmanager
    def grid(self, shape: Sequence[int], kind: str = "serial", role: str = "spatial"):
        """Nested loops over ``shape``; yields the list of index Vars (empty for a scalar).
        ``role``: "spatial" (each point its own output) or "reduce" (the points accumulate into
        the same values: never split across threads)."""
        with contextlib.ExitStack() as st:
            idx = []
            for d, n in enumerate(shape):
                idx.append(st.enter_context(self.loop(n, kind if d == 0 else "serial", hint=f"i{d}_",
                                                      role=role)))
            yield idx

    @contextlib.contextmanager
    def reduce(self, extent, kind: str = "serial", start=0, hint: str = "r"):
        """A reduction loop: its iterations accumulate into the same values, in order."""
        with self.loop(extent, kind, start, hint, role="reduce") as v:
            yield v

    @contextlib.contextmanager
    def if_(self, cond: Expr):
        if isinstance(cond, bool):
            # ``v == 0`` on an Expr is Python's identity test (False), not a comparison: write
            # ``v.eq(0)``; a constant condition is a mistake either way
            raise TypeError(f"if_ needs a boolean Expr, got the Python value {cond!r} (use Expr.eq / .ne)")
        s = If(as_expr(cond, DType.bool))
        self._emit(s)
        self._stack.append(s.then)
        try:
            yield s
        finally:
            self._stack.pop()

    @contextlib.contextmanager
    def else_(self, s: If):
        self._stack.append(s.orelse)
        try:
            yield
        finally:
            self._stack.pop()

    def local(self, dtype: DType, shape: Sequence[int] = (1,), hint: str = "acc") -> Buffer:
        """A scratch buffer private to one kernel invocation (stack memory: keep it small)."""
        self._n += 1
        b = Buffer(f"{hint}{self._n}", dtype, tuple(shape), "local")
        self.kernel.locals.append(b)
        return b

    def shared(self, dtype: DType, shape: Sequence[int], hint: str = "sh") -> Buffer:
        """GPU only: a scratch buffer shared by the threads of a block, of static ``shape``
        (positive ints); ValueError when the kernel's shared buffers exceed
        :data:`MAX_SHARED_BYTES`."""
        if any(not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(f"shared buffer shape must be positive ints (static), got {tuple(shape)!r}")
        self._n += 1
        b = Buffer(f"{hint}{self._n}", dtype, tuple(shape), "shared")
        used = sum(x.numel * x.dtype.itemsize for x in self.kernel.locals if x.scope == "shared")
        if used + b.numel * dtype.itemsize > MAX_SHARED_BYTES:
            raise ValueError(f"kernel {self.kernel.name}: shared buffers would take "
                             f"{used + b.numel * dtype.itemsize} bytes (at most {MAX_SHARED_BYTES})")
        self.kernel.locals.append(b)
        return b

    def barrier(self) -> None:
        """GPU only: a :class:`Barrier` (``cuda.syncthreads()``)."""
        self._emit(Barrier())

    def prefetch(self, buf: Buffer, idx, locality: int = 3) -> None:
        """A :class:`Prefetch` of ``buf[idx]`` (a flat index or a full index list); locality
        0..3 (3: into L1, 2: into L2). ValueError for another locality."""
        if locality not in (0, 1, 2, 3):
            raise ValueError(f"prefetch locality must be 0..3, got {locality!r}")
        off = buf.offset(idx) if isinstance(idx, (list, tuple)) else as_expr(idx, I64)
        self._emit(Prefetch(buf, off, locality))

    def tile_config(self, shapes) -> None:
        """A :class:`TileOp` ``config``: ``shapes`` lists (rows, bytes per row) of tiles 0, 1, ...
        (at most 8; unlisted tiles unused). ValueError past 16 rows or 64 bytes."""
        shapes = tuple((int(r), int(c)) for r, c in shapes)
        if len(shapes) > AMX_TILES or any(not (0 < r <= AMX_MAX_ROWS and 0 < c <= AMX_MAX_COLSB and c % 4 == 0)
                                          for r, c in shapes):
            raise ValueError(f"AMX tile shapes must be at most {AMX_TILES} of (1..16 rows, 4..64 bytes), got {shapes}")
        self._emit(TileOp("config", shapes=shapes))

    def tile_zero(self, t: int) -> None:
        """A :class:`TileOp` ``zero`` of tile ``t``."""
        self._emit(TileOp("zero", (t,)))

    def tile_load(self, t: int, buf: Buffer, idx, stride: int, rows: int, colsb: int) -> None:
        """A :class:`TileOp` ``load``: tile ``t`` from ``rows`` rows of ``colsb`` bytes of ``buf``,
        row r at flat element ``idx + r * stride``."""
        self._emit(TileOp("load", (t,), buf, as_expr(idx, I64), int(stride), int(rows), int(colsb)))

    def tile_store(self, t: int, buf: Buffer, idx, stride: int, rows: int, colsb: int) -> None:
        """A :class:`TileOp` ``store`` of tile ``t`` (as :meth:`tile_load`, the other way)."""
        self._emit(TileOp("store", (t,), buf, as_expr(idx, I64), int(stride), int(rows), int(colsb)))

    def tile_dpbusd(self, c: int, a: int, b: int) -> None:
        """A :class:`TileOp` ``dpbusd``: tile c += tile a (u8) x tile b (s8, four k per lane)."""
        self._emit(TileOp("dpbusd", (c, a, b)))

    def tile_dpbsud(self, c: int, a: int, b: int) -> None:
        """A :class:`TileOp` ``dpbsud``: tile c += tile a (s8) x tile b (u8, four k per lane)."""
        self._emit(TileOp("dpbsud", (c, a, b)))

    def tile_release(self) -> None:
        """A :class:`TileOp` ``release``."""
        self._emit(TileOp("release"))

    def store(self, buf: Buffer, idx, value) -> None:
        off = buf.offset(idx) if isinstance(idx, (list, tuple)) else as_expr(idx, I64)
        value = as_expr(value, buf.dtype)   # a vector value stores its lanes contiguously
        n, stride = buf.index_vector(idx) if isinstance(idx, (list, tuple)) else (1, 1)
        if n > 1 and value.lanes == 1:
            value = Broadcast(value, n)
        elif value.lanes != n and n > 1:
            raise TypeError(f"store of a {value.lanes}-lane value through a {n}-lane index into {buf.name}")
        if value.dtype != buf.dtype:
            raise TypeError(f"store of {value.dtype} into {buf.dtype} buffer {buf.name}")
        self._emit(Store(buf, off, value, stride if n > 1 else 1))

    # convenience re-exports
    fma = staticmethod(fma)
    dot_acc = staticmethod(dot_acc)
    broadcast = staticmethod(broadcast)
    max = staticmethod(maximum)
    min = staticmethod(minimum)
    select = staticmethod(select)
