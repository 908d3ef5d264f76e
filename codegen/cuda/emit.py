"""Kernel IR -> numba.cuda Python source.

:func:`emit_source` turns the launches of one kernel (:func:`tensorfuse.codegen.cuda.launches.cuda_launches`)
into the text of a Python module: one plain function per launch (``jit.py`` wraps each with
``cuda.jit``) and a ``LAUNCHES`` table of (function name, grid, block). The module imports
``math`` (the simulator gets :mod:`tensorfuse.codegen.cuda.simmath` in its place).

The generated code keeps to what a GPU compiles, even where the simulator is lenient: every
value is typed as the kernel IR says (float literals spelled ``float32(...)``, integer results
of narrow types wrapped back to their type, since numba computes them in int64), no lists,
dicts, try, raise or return values, no device functions (the PTX gate compiles without a GPU,
and a device function's compilation asks for one): what a helper would do is written inline
as conditional expressions over temporaries. Locals become ``cuda.local.array``, shared
buffers ``cuda.shared.array``, static shapes both. Vector expressions (lanes > 1) are
scalarised lane by lane; a vector store computes every lane before storing any.

Expression semantics are the LLVM emitter's (``codegen/llvm/emit.py``), op by op: integer
division truncates, division or remainder by zero gives 0, INT_MIN / -1 wraps, the remainder
takes the dividend's sign; shifts by the width or more (or negative) give 0; float min/max
propagate NaN (and order -0 below +0); float remainder is C's fmod; float -> int casts
saturate (NaN -> 0); ``round`` rounds half to even; float16 arithmetic is done in float32 and
rounded back (the same results: float32 holds every float16 product and sum exactly enough),
f64 -> f16 rounds once.

Index arithmetic is 32-bit where it provably fits: an int64 expression built from constants,
loop variables of constant bounds and ``+ - * min max`` (and ``/ %`` of a non-negative
dividend by a positive constant) gets an interval (:meth:`_Fn.rng`); when every
sub-expression's interval lies inside int32, it is emitted in int32 (``/`` and ``%`` as
unsigned 32-bit divisions, which NVVM turns into a multiply-high and a shift), a load or store
at such a non-negative offset indexes with ``uint32`` (numba then skips its negative-index
wrap-around), and serial loops of such bounds count in int32. Everything else stays int64 as
the kernel IR types it. The intervals make this exact: no value that could leave int32 is
computed in it. (Before: 248 of the 315 PTX instructions of resnet18's layer-3 conv were 64-bit
integer operations, most of them floor-division fix-ups.)
"""
from __future__ import annotations

import re

from tensorfuse.ir.errors import CompileError
from tensorfuse.ir.kernel import (DOT_PACKINGS, FMA, GPU_LOOP_KINDS, DotAcc, Barrier, Prefetch, TileOp, Bin, Broadcast, Buffer, Cast, Const, For, If,
                                  Kernel, Load, Lookup, Ramp, Select, Shuffle, Store, Un, Var, Concat)
from tensorfuse.ir.schedule import expr_children
from tensorfuse.ir.types import DType

from .mma import MmaTile, render_call


class CodegenError(CompileError):
    """Kernel IR the cuda backend cannot emit; names the kernel."""


_CTOR = {DType.f16: "float16", DType.f32: "float32", DType.f64: "float64", DType.i8: "int8",
         DType.i16: "int16", DType.i32: "int32", DType.i64: "int64", DType.u8: "uint8",
         DType.u16: "uint16", DType.u32: "uint32", DType.u64: "uint64", DType.bool: "boolean"}
_MATH_UNARY = {"sqrt", "exp", "log", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
               "asinh", "acosh", "atanh", "erf", "floor", "ceil", "trunc", "exp2", "log2", "log1p", "expm1"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
#: an ``unroll`` loop of at most this many iterations (constant bounds) is emitted unrolled
MAX_UNROLL = 64
_NARROW_OPS = ("add", "sub", "mul", "min", "max", "div", "rem")
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
#: the largest stride of a GPU loop: a grid-stride loop's threads in a grid of 65535 blocks of
#: 1024 (the launch caps grids at the target's ``max_blocks``, 65535)
_GPU_STRIDE_MAX = 65535 * 1024
_ATOM = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|-?[0-9]+|True|False|[a-z0-9]+\(-?[0-9a-z.+\-]+\)")

HEADER = '''from numba import cuda, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64, boolean
from numba.core.types import float16
from numba.core import config as _config
if _config.ENABLE_CUDASIM:
    from tensorfuse.codegen.cuda import simmath as math
else:
    import math
'''
#: imported by kernels that call the tensor-core micro-kernels (``mma.py``)
MMA_IMPORT = "from tensorfuse.codegen.cuda import mma as _tfmma\n"


def ctor(dt: DType) -> str:
    try:
        return _CTOR[dt]
    except KeyError:
        raise CodegenError(f"dtype {dt.value} has no cuda lowering") from None


def _float_lit(v: float, dt: DType) -> str:
    v = float(v)
    if v != v:
        s = "math.nan"
    elif v in (float("inf"), float("-inf")):
        s = "math.inf" if v > 0 else "-math.inf"
    else:
        s = repr(v)
    return f"{ctor(dt)}({s})"


def _int_lit(v: int, dt: DType) -> str:
    return str(int(v)) if dt == DType.i64 and v >= 0 else f"{ctor(dt)}({int(v)})"


class _Fn:
    """Emits one launch function."""

    def __init__(self, k: Kernel, fname: str):
        self.k = k
        self.fname = fname
        self.lines: list[str] = []
        self.depth = 1
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.ntmp = 0
        self.pre: list[str] = []
        self.memo: dict[tuple[int, int], str] = {}
        self.shared: set[int] = set()
        self.nonneg_vars: set[int] = set()     # loop variables that start at >= 0 and count up
        self.var_rng: dict[int, tuple[int, int]] = {}   # loop variable -> [lo, hi] (constant bounds)
        self.i32_vars: set[int] = set()        # loop variables emitted as int32 (serial range loops)
        self.rmemo: dict[int, tuple[int, int] | None] = {}
        self.tables: dict[str, str] = {}       # module constant name -> its definition
        for b in k.params:
            self._bind(b, "g_" + b.name)
        for b in k.locals:
            self._bind(b, ("s_" if b.scope == "shared" else "l_") + b.name)

    def err(self, msg: str) -> CodegenError:
        return CodegenError(f"kernel {self.k.name}: {msg}")

    def _bind(self, obj, base: str) -> str:
        name, n = base, 1
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        self.names[id(obj)] = name
        return name

    def buf(self, b: Buffer) -> str:
        try:
            return self.names[id(b)]
        except KeyError:
            raise self.err(f"buffer {b.name} is not a parameter or local") from None

    def line(self, s: str) -> None:
        self.lines.append("    " * self.depth + s)

    def tmp(self, s: str) -> str:
        self.ntmp += 1
        t = f"t{self.ntmp}"
        self.pre.append(f"{t} = {s}")
        return t

    def atom(self, s: str) -> str:
        """``s`` if it is a name or literal, else a temporary holding it (to use it twice)."""
        return s if _ATOM.fullmatch(s) else self.tmp(s)

    # -- statement-level common sub-expressions --------------------------------------------
    def begin(self, roots) -> None:
        refs: dict[int, int] = {}
        seen: set[int] = set()

        def visit(e):
            if id(e) in seen:
                return
            seen.add(id(e))
            for c in expr_children(e):
                refs[id(c)] = refs.get(id(c), 0) + 1
                visit(c)
        for r in roots:
            refs[id(r)] = refs.get(id(r), 0) + 1
            visit(r)
        self.shared = {i for i, n in refs.items() if n > 1}
        self.memo = {}
        self.pre = []

    def flush(self) -> None:
        for p in self.pre:
            self.line(p)
        self.pre = []

    # -- expressions -------------------------------------------------------------------------
    def ex(self, e, lane: int = 0) -> str:
        key = (id(e), lane)
        if key in self.memo:
            return self.memo[key]
        s = self._ex(e, lane)
        if id(e) in self.shared and not isinstance(e, (Const, Var)):
            s = self.atom(s)
            self.memo[key] = s
        return s

    def _ex(self, e, lane: int) -> str:
        if isinstance(e, Const):
            if e.dtype == DType.bool:
                return "True" if e.value else "False"
            if e.dtype.is_float:
                return _float_lit(e.value, e.dtype)
            ctor(e.dtype)
            return _int_lit(e.value, e.dtype)
        if isinstance(e, Var):
            try:
                return self.names[id(e)]
            except KeyError:
                raise self.err(f"variable {e.name} used outside its loop") from None
        if isinstance(e, Load):
            off = self.index(e.index) if e.lanes == 1 else self.ex(e.index, 0)
            if lane:
                off = f"{off} + {lane * e.stride}"
            return f"{self.buf(e.buf)}[{off}]"
        if isinstance(e, Ramp):
            b = self.ex(e.base, 0)
            return f"({b} + {lane})" if lane else b
        if isinstance(e, Broadcast):
            return self.ex(e.a, 0)
        if isinstance(e, Concat):                 # lane ``lane`` is one lane of one part
            n = e.parts[0].lanes
            return self.ex(e.parts[lane // n], lane % n)
        if isinstance(e, Shuffle):                # lane ``lane`` is one lane of a or b
            m = e.mask[lane]
            return self.ex(e.a, m) if m < e.a.lanes else self.ex(e.b, m - e.a.lanes)
        if isinstance(e, FMA):
            return self.fma(e.dtype, self.ex(e.a, lane), self.ex(e.b, lane), self.ex(e.c, lane))
        if isinstance(e, DotAcc):
            return self.dot_acc(e, lane)
        if isinstance(e, MmaTile):        # one call of the tensor-core micro-kernel, lanes its results
            key = (id(e), -1)
            if key not in self.memo:
                self.memo[key] = self.tmp(render_call(e, self.ex))
            return f"{self.memo[key]}[{lane}]"
        if isinstance(e, Bin):
            if self.narrow(e):
                return self.narrow_bin(e)
            if e.op in _CMP and all(self.fits32(c) for c in (e.a, e.b)):     # a 32-bit compare
                return f"({self.ex32(e.a)} {_CMP[e.op]} {self.ex32(e.b)})"
            return self.binop(e.op, e.a.dtype, self.ex64(e.a, lane), self.ex64(e.b, lane), e.b, e.a)
        if isinstance(e, Un):
            return self.unop(e.op, e.a.dtype, self.ex(e.a, lane))
        if isinstance(e, Cast):
            return self.cast(self.ex(e.a, lane), e.a.dtype, e.dtype)
        if isinstance(e, Lookup):
            # a module-level tuple constant (numba indexes a homogeneous tuple at run time)
            name = f"_TABLE_{e.digest}"
            if name not in self.tables:
                vals = ", ".join(_float_lit(v, e.dtype) if e.dtype.is_float else str(int(v)) for v in e.table)
                self.tables[name] = f"{name} = ({vals},)"
            v = f"{name}[{self.ex(e.index, lane)}]"
            return v if e.dtype.is_float or e.dtype == DType.i64 else f"{ctor(e.dtype)}({v})"
        if isinstance(e, Select):
            return f"({self.ex64(e.a, lane)} if {self.ex(e.cond, lane)} else {self.ex64(e.b, lane)})"
        raise self.err(f"unknown expression {e!r}")

    def dot_acc(self, e, lane: int) -> str:
        """:class:`DotAcc` scalarised: per lane, the packed elements unpacked with shifts and
        masks (sign-extended by xor/subtract), their products summed in int64, added to the
        accumulator and wrapped to int32 as every int32 add here is."""
        ta, tb, g = DOT_PACKINGS[e.packing]
        w = 32 // g
        mask, half = (1 << w) - 1, 1 << (w - 1)
        a, b = self.atom(f"int64({self.ex(e.a, lane)})"), self.atom(f"int64({self.ex(e.b, lane)})")

        def elem(v, t, dt):
            u = f"(({v} >> {t * w}) & {mask})"
            return f"(({u} ^ {half}) - {half})" if dt.is_signed else u
        terms = " + ".join(f"{elem(a, t, ta)} * {elem(b, t, tb)}" for t in range(g))
        return f"int32(int64({self.ex(e.acc, lane)}) + {terms})"

    def fma(self, dt: DType, a: str, b: str, c: str) -> str:
        if dt == DType.f16:   # the LLVM emitter: fmul then fadd, each rounded to half
            return f"float16(float32(float16(float32({a}) * float32({b}))) + float32({c}))"
        return f"{ctor(dt)}(cuda.fma({a}, {b}, {c}))"

    # -- 32-bit index arithmetic -----------------------------------------------------------
    def rng(self, e):
        """[lo, hi] of an int64 index expression (constants, loop variables of constant bounds,
        + - * min max, / % of a non-negative dividend by a positive constant), else None."""
        key = id(e)
        if key in self.rmemo:
            return self.rmemo[key]
        r = None
        if e.dtype == DType.i64 and e.lanes == 1:
            if isinstance(e, Const):
                r = (int(e.value), int(e.value))
            elif isinstance(e, Var):
                r = self.var_rng.get(id(e))
            elif isinstance(e, Bin) and e.op in _NARROW_OPS:
                a, b = self.rng(e.a), self.rng(e.b)
                if a is not None and b is not None:
                    if e.op == "add":
                        r = (a[0] + b[0], a[1] + b[1])
                    elif e.op == "sub":
                        r = (a[0] - b[1], a[1] - b[0])
                    elif e.op == "mul":
                        ps = [x * y for x in a for y in b]
                        r = (min(ps), max(ps))
                    elif e.op == "min":
                        r = (min(a[0], b[0]), min(a[1], b[1]))
                    elif e.op == "max":
                        r = (max(a[0], b[0]), max(a[1], b[1]))
                    elif isinstance(e.b, Const) and b[0] > 0 and a[0] >= 0:
                        d = b[0]
                        r = (a[0] // d, a[1] // d) if e.op == "div" else (0, min(a[1], d - 1))
        self.rmemo[key] = r
        return r

    def narrow(self, e) -> bool:
        """Whether ``e`` is emitted as an int32 expression (its interval, and so every
        sub-expression's, fits int32)."""
        if isinstance(e, Var):
            return id(e) in self.i32_vars
        if not (isinstance(e, Bin) and e.op in _NARROW_OPS):
            return False
        r = self.rng(e)
        return r is not None and _I32_MIN <= r[0] and r[1] <= _I32_MAX

    def fits32(self, e) -> bool:
        """Whether ``e`` has an interval inside int32 (:meth:`rng`)."""
        r = self.rng(e)
        return r is not None and _I32_MIN <= r[0] and r[1] <= _I32_MAX

    def ex32(self, e) -> str:
        """``e`` (an expression with an interval inside int32) as an int32-typed string."""
        s = self.ex(e)
        if self.narrow(e):
            return s
        if isinstance(e, Const):
            return f"int32({int(e.value)})"
        return f"int32({s})"

    def ex64(self, e, lane: int = 0) -> str:
        """``e`` as :meth:`ex` gives it, widened back to int64 where it was emitted in int32
        (an int64 parent that is not itself 32-bit: numba promotes, the simulator's numpy
        scalars would not)."""
        s = self.ex(e, lane)
        return f"int64({s})" if e.dtype == DType.i64 and self.narrow(e) else s

    def index(self, e, lane: int = 0) -> str:
        """A load or store offset: ``uint32`` when it is a 32-bit expression known >= 0, with a
        constant addend kept outside (``uint32(base) + 16``: numba adds it in 64 bits, so NVVM
        folds it into the instruction's immediate offset, as it cannot through a 32-bit add
        that might wrap)."""
        s = self.ex(e, lane)
        r = self.rng(e) if lane == 0 else None
        if r is None or r[0] < 0 or r[1] > _I32_MAX or isinstance(e, Const):
            return s
        if isinstance(e, Bin) and e.op == "add" and isinstance(e.b, Const) and e.b.value > 0:
            rb = self.rng(e.a)
            if rb is not None and rb[0] >= 0:
                return f"{self.index(e.a)} + {int(e.b.value)}"
        return f"uint32({s})"

    def narrow_bin(self, e) -> str:
        # every node wrapped back to int32: numba widens int32 + int32 to int64, and LLVM does
        # not narrow a whole tree back from one truncation at its root
        x, y = self.ex32(e.a), self.ex32(e.b)
        if e.op in _ARITH:
            return f"int32({x} {_ARITH[e.op]} {y})"
        if e.op in ("min", "max"):      # the builtin (a select): a conditional expression costs
            return f"int32({e.op}({x}, {y}))"      # numba's compiler two basic blocks
        sym = "//" if e.op == "div" else "%"        # dividend >= 0, divisor a positive constant
        return f"int32(uint32({x}) {sym} uint32({int(e.b.value)}))"

    def nonneg(self, e) -> bool:
        """Whether integer expression ``e`` is known to be >= 0 (index arithmetic over loop
        variables), so that C division by a positive constant is Python's floor division."""
        if isinstance(e, Const):
            return not e.dtype.is_float and e.value >= 0
        if isinstance(e, Var):
            return id(e) in self.nonneg_vars
        if isinstance(e, Bin) and e.op in ("add", "mul", "div", "rem", "min", "max"):
            return self.nonneg(e.a) and self.nonneg(e.b) and (e.op not in ("div", "rem") or
                                                             (isinstance(e.b, Const) and e.b.value > 0))
        return False

    def binop(self, op: str, dt: DType, x: str, y: str, yexpr=None, xexpr=None) -> str:
        T = ctor(dt)
        if dt == DType.f16:
            if op in _CMP:
                return f"(float32({x}) {_CMP[op]} float32({y}))"
            return f"float16({self.binop(op, DType.f32, f'float32({x})', f'float32({y})')})"
        if dt.is_float:
            if op in _ARITH:
                return f"({x} {_ARITH[op]} {y})"
            if op == "div":
                return f"({x} / {y})"
            if op in _CMP:
                return f"({x} {_CMP[op]} {y})"
            if op == "rem":
                return f"{T}(math.fmod({x}, {y}))"
            if op == "pow":
                return f"{T}({x} ** {y})"
            if op == "atan2":
                return f"{T}(math.atan2({x}, {y}))"
            if op in ("min", "max"):
                x, y = self.atom(x), self.atom(y)
                neg = f"math.copysign({T}(1.0), {x}) < {T}(0.0)"
                if op == "min":
                    return (f"({x} if ({x} < {y} or {x} != {x}) else ({y} if ({y} < {x} or {x} != {y}) "
                            f"else ({x} if {neg} else {y})))")
                return (f"({x} if ({x} > {y} or {x} != {x}) else ({y} if ({y} > {x} or {x} != {y}) "
                        f"else ({y} if {neg} else {x})))")
            raise self.err(f"float op {op} unsupported")
        if dt == DType.bool:
            if op in ("and", "min"):
                return f"({x} & {y})"
            if op in ("or", "max"):
                return f"({x} | {y})"
            if op in ("xor", "ne"):
                return f"({x} != {y})"
            if op in _CMP:
                return f"(int64({x}) {_CMP[op]} int64({y}))"
            # bool is a 1-bit unsigned integer (ir/semantics.py): add/sub wrap (xor), mul and
            # div (x / 0 = 0) are and, rem is always 0, a shift by 1 (the only count >= W
            # besides 0) gives 0, pow is the saturating cast of x ** y (0 ** 0 = 1)
            if op in ("add", "sub"):
                return f"({x} != {y})"
            if op in ("mul", "div"):
                return f"({x} & {y})"
            if op == "rem":
                return "False"
            if op in ("shl", "shr"):
                return f"({x} & (not {y}))"
            if op == "pow":
                return f"({x} | (not {y}))"
            raise self.err(f"bool op {op} unsupported")
        if not dt.is_int:
            raise self.err(f"op {op} unsupported for {dt.value}")
        signed = dt.is_signed
        W = dt.itemsize * 8
        if op in _ARITH:
            r = f"({x} {_ARITH[op]} {y})"
            return r if dt == DType.i64 else f"{T}{r}"
        if op in _CMP:
            return f"({x} {_CMP[op]} {y})"
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            return f"{T}({x} {sym} {y})"
        if op in ("min", "max"):       # the builtin (a select): no basic blocks for numba to analyse
            return f"{T}({op}({x}, {y}))"
        if op in ("shl", "shr"):
            y = self.atom(y)
            ok = f"({y} >= 0 and {y} < {W})" if signed else f"{y} < {T}({W})"
            sym = "<<" if op == "shl" else ">>"
            return f"({T}({x} {sym} {y}) if {ok} else {T}(0))"
        if op in ("div", "rem"):
            x = self.atom(x)
            d = yexpr.value if isinstance(yexpr, Const) else None
            if not signed:
                if d is not None and d != 0:
                    return f"{T}({x} {'//' if op == 'div' else '%'} {y})"
                y = self.atom(y)
                sym = "//" if op == "div" else "%"
                return f"({T}({x} {sym} {y}) if {y} != {T}(0) else {T}(0))"
            if d is not None and d > 0:          # constant positive divisor (index arithmetic)
                if xexpr is not None and self.nonneg(xexpr):
                    return f"{T}({x} {'//' if op == 'div' else '%'} {y})"
                if op == "div":
                    q = self.tmp(f"{x} // {y}")
                    return f"({T}({q} + 1) if ({x} < 0 and {q} * {y} != {x}) else {T}({q}))"
                r = self.tmp(f"{x} % {y}")
                return f"({T}({r} - {y}) if ({x} < 0 and {r} != 0) else {T}({r}))"
            y = self.atom(y)
            ys = self.tmp(f"({y} if ({y} != 0 and {y} != -1) else {T}(1))")
            if op == "div":
                q = self.tmp(f"{x} // {ys}")
                return (f"({T}(0) if {y} == 0 else ({T}(-{x}) if {y} == -1 else "
                        f"({T}({q} + 1) if ({x} % {ys} != 0 and (({x} < 0) != ({ys} < 0))) else {T}({q}))))")
            r = self.tmp(f"{x} % {ys}")
            return (f"({T}(0) if ({y} == 0 or {y} == -1) else "
                    f"({T}({r} - {ys}) if ({r} != 0 and (({r} < 0) != ({x} < 0))) else {T}({r})))")
        if op == "pow":
            # x ** y in float64, then the saturating cast; a GPU's pow is not exact on integers
            # (3 ** 1 gave 2.9999999 and so 2 on the H200), so a whole result (y >= 0) is
            # rounded first: exact below 2^53, as the host's libm pow
            p = self.tmp(f"float64({x}) ** float64({y})")
            f = self.tmp(f"(math.floor({p} + 0.5) if {y} >= 0 else {p})")
            return self.cast(f, DType.f64, dt)
        raise self.err(f"integer op {op} unsupported for {dt.value}")

    def unop(self, op: str, dt: DType, x: str) -> str:
        T = ctor(dt)
        if dt.is_float:
            if dt == DType.f16 and op in ("isnan", "isinf"):
                # compared as float32: numba-cuda's float16 ``!=`` is an external C++ function
                # (``_ZneRK6__halfS1__nbst``) that the PTX does not contain (the PTX gate found it)
                x = f"float32({x})"
            if op == "isnan":
                x = self.atom(x)
                return f"({x} != {x})"
            if op == "isinf":
                return f"math.isinf({x})"
            if dt == DType.f16:
                if op == "neg":
                    return f"float16(-float32({x}))"
                return f"float16({self.unop(op, DType.f32, f'float32({x})')})"
            if op == "neg":
                return f"(-{x})"
            if op == "abs":
                return f"{T}(abs({x}))"
            if op in _MATH_UNARY:
                return f"{T}(math.{op}({x}))"
            if op == "round":       # half to even (llvm.roundeven)
                x = self.atom(x)
                return (f"({x} if (math.isinf({x}) or {x} != {x}) else "
                        f"{T}(math.copysign({x} - math.remainder({x}, {T}(1.0)), {x})))")
            raise self.err(f"float op {op} unsupported")
        if dt == DType.bool:
            if op == "not":
                return f"(not {x})"
            if op in ("isnan", "isinf"):
                return "False"
            if op in ("abs", "floor", "ceil", "round", "trunc", "neg"):    # neg: 0 - x wraps to x
                return x
            raise self.err(f"bool op {op} unsupported")
        if op == "neg":
            return f"{T}(-{x})"
        if op == "not":
            return f"{T}(~{x})"
        if op == "abs":
            if not dt.is_signed:
                return x
            x = self.atom(x)
            return f"({T}(-{x}) if {x} < 0 else {x})"
        if op in ("isnan", "isinf"):
            return "False"
        if op in ("floor", "ceil", "round", "trunc"):
            return x
        raise self.err(f"integer op {op} unsupported for {dt.value}")

    def cast(self, x: str, src: DType, dst: DType) -> str:
        if src == dst:
            return x
        T = ctor(dst)
        ctor(src)
        if dst == DType.bool:
            if src == DType.f16:            # in float32: float16 != is an external C++ shim in numba-cuda
                return f"(float32({x}) != float32(0.0))"
            if src.is_float:
                return f"({x} != {ctor(src)}(0.0))"
            return f"({x} != {ctor(src)}(0))"
        if src == DType.bool:
            one, zero = (("1.0", "0.0") if dst.is_float else ("1", "0"))
            return f"({T}({one}) if {x} else {T}({zero}))"
        if src.is_float and dst.is_float:
            return f"{T}({x})"
        if src.is_float:                    # saturating (llvm.fptosi.sat / fptoui.sat)
            if src == DType.f16:
                x, src = f"float32({x})", DType.f32
            F = ctor(src)
            x = self.atom(x)
            W = dst.itemsize * 8
            lo, hi = (-(1 << (W - 1)), (1 << (W - 1)) - 1) if dst.is_signed else (0, (1 << W) - 1)
            return (f"({T}(0) if {x} != {x} else ({T}({lo}) if {x} <= {F}({float(lo)!r}) else "
                    f"({T}({hi}) if {x} >= {F}({float(hi + 1)!r}) else {T}({x}))))")
        return f"{T}({x})"                  # int -> float, int -> int (truncate or extend)

    # -- statements -------------------------------------------------------------------------
    def stmts(self, body) -> None:
        n = len(self.lines)
        for s in body:
            self.stmt(s)
        if len(self.lines) == n:
            self.line("pass")

    def stmt(self, s) -> None:
        if isinstance(s, Store):
            self.begin([s.index, s.value])
            b = self.buf(s.buf)
            lanes = s.value.lanes
            if s.value.dtype != s.buf.dtype:
                raise self.err(f"store of {s.value.dtype.value} into {s.buf.dtype.value} buffer {s.buf.name}")
            if lanes == 1:
                idx, v = self.index(s.index), self.ex(s.value)
                self.flush()
                self.line(f"{b}[{idx}] = {v}")
                return
            idx = self.atom(self.ex(s.index))
            vals = [self.atom(self.ex(s.value, ln)) for ln in range(lanes)]
            self.flush()
            for ln, v in enumerate(vals):
                off = f"{idx} + {ln * s.stride}" if ln else idx
                self.line(f"{b}[{off}] = {v}")
        elif isinstance(s, For):
            self.begin([s.start, s.extent])
            r0, r1 = self.rng(s.start), self.rng(s.extent)
            i32 = (r0 is not None and r1 is not None and _I32_MIN <= r0[0] and r1[1] <= _I32_MAX
                   and s.kind not in GPU_LOOP_KINDS)
            if i32:                                     # numba's 32-bit range iterator
                start, stop = self.ex32(s.start), self.ex32(s.extent)
            else:
                start, stop = self.ex(s.start), self.ex(s.extent)
            self.flush()
            v = self._bind(s.var, "v_" + s.var.name)
            if self.nonneg(s.start):
                self.nonneg_vars.add(id(s.var))
            if r0 is not None and r1 is not None:       # the variable runs over [start, extent - 1]
                self.var_rng[id(s.var)] = (r0[0], max(r0[0], r1[1] - 1))
            if i32:
                self.i32_vars.add(id(s.var))
            if s.kind in GPU_LOOP_KINDS:
                base, step = {"grid_stride": ("cuda.grid(1)", "cuda.gridsize(1)"),
                              "threadIdx.x": ("cuda.threadIdx.x", "cuda.blockDim.x"),
                              "blockIdx.x": ("cuda.blockIdx.x", "cuda.gridDim.x")}[s.kind]
                end = self.atom(stop) if not _ATOM.fullmatch(stop) else stop
                self.flush()
                if (r0 is not None and r1 is not None and r0[0] >= 0
                        and r1[1] + _GPU_STRIDE_MAX <= _I32_MAX):
                    # a 32-bit counter: no value it takes (at most extent + one stride) leaves int32
                    self.i32_vars.add(id(s.var))
                    self.line(f"{v} = int32(int32({base}) + {start})" + (f"    # {s.comment}" if s.comment else ""))
                    self.line(f"while {v} < {end}:")
                    self.depth += 1
                    self.stmts(s.body)
                    self.line(f"{v} = int32({v} + int32({step}))")
                    self.depth -= 1
                else:
                    self.line(f"{v} = int64({base}) + {start}" + (f"    # {s.comment}" if s.comment else ""))
                    self.line(f"while {v} < {end}:")
                    self.depth += 1
                    self.stmts(s.body)
                    self.line(f"{v} += int64({step})")
                    self.depth -= 1
            elif (s.kind == "unroll" and i32 and isinstance(s.start, Const) and isinstance(s.extent, Const)
                  and 0 <= s.extent.value - s.start.value <= MAX_UNROLL):
                # unrolled here, not left to NVVM (which unrolls numba's range loops by 2 to 4):
                # the variable a constant in each copy, a register tile's shared-memory offsets
                # fold into the loads' immediates
                for c in range(int(s.start.value), int(s.extent.value)):
                    self.line(f"{v} = int32({c})" + (f"    # {s.comment}" if s.comment and c == s.start.value else ""))
                    self.stmts(s.body)
            elif s.kind in ("serial", "parallel", "vectorize", "unroll"):
                self.line(f"for {v} in range({start}, {stop}):" + (f"    # {s.comment}" if s.comment else ""))
                self.depth += 1
                self.stmts(s.body)
                self.depth -= 1
            else:
                raise self.err(f"loop kind {s.kind!r} has no cuda lowering")
        elif isinstance(s, If):
            self.begin([s.cond])
            c = self.ex(s.cond)
            self.flush()
            self.line(f"if {c}:")
            self.depth += 1
            self.stmts(s.then)
            self.depth -= 1
            if s.orelse:
                self.line("else:")
                self.depth += 1
                self.stmts(s.orelse)
                self.depth -= 1
        elif isinstance(s, Barrier):
            self.line("cuda.syncthreads()")
        elif isinstance(s, Prefetch):
            pass                        # a CPU cache hint: nothing on the GPU
        elif isinstance(s, TileOp):
            raise self.err("an x86 AMX tile operation has no cuda lowering (llvm schedules only)")
        else:
            raise self.err(f"unknown statement {s!r}")

    def emit(self) -> list[str]:
        k = self.k
        args = ", ".join(self.names[id(b)] for b in k.params)
        out = [f"def {self.fname}({args}):"]
        if k.comment:
            out.append(f"    # {k.comment}")
        for b in k.locals:
            kind = "shared" if b.scope == "shared" else "local"
            out.append(f"    {self.names[id(b)]} = cuda.{kind}.array({max(b.numel, 1)}, {ctor(b.dtype)})")
        self.stmts(k.body)
        return out + self.lines


def function_name(launch: Kernel) -> str:
    """The Python name of a launch's function in the generated module."""
    return "k_" + launch.name


def emit_source(name: str, launches: list[Kernel]) -> str:
    """The Python module text running kernel ``name`` as ``launches`` (kernels with launch
    shapes, from :func:`tensorfuse.codegen.cuda.launches.cuda_launches`). Raises CodegenError naming
    the kernel for IR the cuda backend cannot emit (a bfloat16 buffer, an unknown op)."""
    parts = [f'"""tensorfuse cuda kernel {name}: generated by tensorfuse.codegen.cuda.emit; do not edit."""',
             HEADER]
    table = []
    for lk in launches:
        if lk.launch is None:
            raise CodegenError(f"kernel {lk.name}: no launch shape (run the cuda schedule first)")
        for b in lk.params + lk.locals:
            if b.dtype not in _CTOR:
                raise CodegenError(f"kernel {name}: buffer {b.name} of dtype {b.dtype.value} has no cuda lowering")
        fname = function_name(lk)
        fn = _Fn(lk, fname)
        text = "\n".join(fn.emit()) + "\n"
        for tname, tdef in fn.tables.items():
            if tdef not in parts:
                parts.append(tdef)
        parts.append(text)
        if "_tfmma." in parts[-1] and MMA_IMPORT not in parts:
            parts.insert(2, MMA_IMPORT)
        table.append(f"    ({fname!r}, {tuple(lk.launch.grid)!r}, {tuple(lk.launch.block)!r}),")
    parts.append("LAUNCHES = (\n" + "\n".join(table) + ("\n" if table else "") + ")\n")
    return "\n\n".join(parts)
