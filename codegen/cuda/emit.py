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
"""
from __future__ import annotations

import re

from tensorfuse.ir.errors import CompileError
from tensorfuse.ir.kernel import (FMA, GPU_LOOP_KINDS, Barrier, Bin, Broadcast, Buffer, Cast, Const, For, If,
                                  Kernel, Load, Ramp, Select, Store, Un, Var)
from tensorfuse.ir.schedule import expr_children
from tensorfuse.ir.types import DType


class CodegenError(CompileError):
    """Kernel IR the cuda backend cannot emit; names the kernel."""


_CTOR = {DType.f16: "float16", DType.f32: "float32", DType.f64: "float64", DType.i8: "int8",
         DType.i16: "int16", DType.i32: "int32", DType.i64: "int64", DType.u8: "uint8",
         DType.u16: "uint16", DType.u32: "uint32", DType.u64: "uint64", DType.bool: "boolean"}
_MATH_UNARY = {"sqrt", "exp", "log", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
               "asinh", "acosh", "atanh", "erf", "floor", "ceil", "trunc", "exp2", "log2", "log1p", "expm1"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_ATOM = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|-?[0-9]+|True|False|[a-z0-9]+\(-?[0-9a-z.+\-]+\)")

HEADER = '''from numba import cuda, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64, boolean
from numba.core.types import float16
from numba.core import config as _config
if _config.ENABLE_CUDASIM:
    from tensorfuse.codegen.cuda import simmath as math
else:
    import math
'''


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
            off = self.ex(e.index, 0)
            if lane:
                off = f"{off} + {lane * e.stride}"
            return f"{self.buf(e.buf)}[{off}]"
        if isinstance(e, Ramp):
            b = self.ex(e.base, 0)
            return f"({b} + {lane})" if lane else b
        if isinstance(e, Broadcast):
            return self.ex(e.a, 0)
        if isinstance(e, FMA):
            return self.fma(e.dtype, self.ex(e.a, lane), self.ex(e.b, lane), self.ex(e.c, lane))
        if isinstance(e, Bin):
            return self.binop(e.op, e.a.dtype, self.ex(e.a, lane), self.ex(e.b, lane), e.b, e.a)
        if isinstance(e, Un):
            return self.unop(e.op, e.a.dtype, self.ex(e.a, lane))
        if isinstance(e, Cast):
            return self.cast(self.ex(e.a, lane), e.a.dtype, e.dtype)
        if isinstance(e, Select):
            return f"({self.ex(e.a, lane)} if {self.ex(e.cond, lane)} else {self.ex(e.b, lane)})"
        raise self.err(f"unknown expression {e!r}")

    def fma(self, dt: DType, a: str, b: str, c: str) -> str:
        if dt == DType.f16:   # the LLVM emitter: fmul then fadd, each rounded to half
            return f"float16(float32(float16(float32({a}) * float32({b}))) + float32({c}))"
        return f"{ctor(dt)}(cuda.fma({a}, {b}, {c}))"

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
        if op == "min":
            x, y = self.atom(x), self.atom(y)
            return f"({x} if {x} < {y} else {y})"
        if op == "max":
            x, y = self.atom(x), self.atom(y)
            return f"({x} if {x} > {y} else {y})"
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
            f = self.tmp(f"float64({x}) ** float64({y})")
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
                idx, v = self.ex(s.index), self.ex(s.value)
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
            start, stop = self.ex(s.start), self.ex(s.extent)
            self.flush()
            v = self._bind(s.var, "v_" + s.var.name)
            if self.nonneg(s.start):
                self.nonneg_vars.add(id(s.var))
            if s.kind in GPU_LOOP_KINDS:
                base, step = {"grid_stride": ("cuda.grid(1)", "cuda.gridsize(1)"),
                              "threadIdx.x": ("cuda.threadIdx.x", "cuda.blockDim.x"),
                              "blockIdx.x": ("cuda.blockIdx.x", "cuda.gridDim.x")}[s.kind]
                end = self.atom(stop) if not _ATOM.fullmatch(stop) else stop
                self.flush()
                self.line(f"{v} = int64({base}) + {start}" + (f"    # {s.comment}" if s.comment else ""))
                self.line(f"while {v} < {end}:")
                self.depth += 1
                self.stmts(s.body)
                self.line(f"{v} += int64({step})")
                self.depth -= 1
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
        parts.append("\n".join(_Fn(lk, fname).emit()) + "\n")
        table.append(f"    ({fname!r}, {tuple(lk.launch.grid)!r}, {tuple(lk.launch.block)!r}),")
    parts.append("LAUNCHES = (\n" + "\n".join(table) + ("\n" if table else "") + ")\n")
    return "\n\n".join(parts)
