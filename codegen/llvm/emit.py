"""Kernel IR -> LLVM IR (llvmlite.ir).

Every kernel becomes ``void @name(ptr %args)``, ``args`` being an array of buffer pointers in
the kernel's parameter order. :func:`emit_entry` adds ``void @<entry>(ptr %slots)`` that calls
kernels in sequence, each with its buffers picked from the slot table (the runtime's memory
plan fills the table), so one native call runs the whole graph.

Semantics of the expression ops on integers follow C with two guards that C lacks: division
or remainder by zero gives 0 (numpy's result) and INT_MIN / -1 wraps, rather than trapping.
Float min/max propagate NaN (llvm.minimum / llvm.maximum, as numpy.minimum / maximum).
float -> int casts saturate (llvm.fptosi.sat), NaN -> 0.
"""
from __future__ import annotations

from llvmlite import ir

from ir.kernel import Bin, Buffer, Cast, Const, For, If, Kernel, Load, Select, Store, Un, Var
from ir.types import DType

PTR = ir.PointerType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I64 = ir.IntType(64)
F32 = ir.FloatType()


class CodegenError(Exception):
    """Kernel IR the LLVM backend cannot emit; names the kernel."""


def ltype(dt: DType, memory: bool = False) -> ir.Type:
    if dt == DType.bool:
        return I8 if memory else I1
    if dt == DType.f32:
        return F32
    if dt == DType.f64:
        return ir.DoubleType()
    if dt == DType.f16:
        return ir.HalfType()
    if dt.is_int:
        return ir.IntType(dt.itemsize * 8)
    raise CodegenError(f"dtype {dt} has no LLVM lowering")


_LIBM_UNARY = {"tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
               "erf", "log1p", "expm1"}
_INTRINSIC_UNARY = {"sqrt": "sqrt", "exp": "exp", "log": "log", "sin": "sin", "cos": "cos",
                    "floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "roundeven",
                    "abs": "fabs", "exp2": "exp2", "log2": "log2"}
_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}


class _FnEmitter:
    def __init__(self, module: ir.Module, kernel: Kernel):
        self.m = module
        self.k = kernel
        fn = module.globals.get(kernel.name)
        if fn is not None:
            raise CodegenError(f"kernel name {kernel.name} emitted twice")
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=kernel.name)
        self.fn.args[0].name = "args"
        entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.ptrs: dict[int, ir.Value] = {}
        self.vars: dict[int, ir.Value] = {}
        for i, buf in enumerate(kernel.params):
            slot = self.b.gep(self.fn.args[0], [ir.Constant(I64, i)], source_etype=PTR)
            p = self.b.load(slot, typ=PTR)
            p.name = buf.name
            self.ptrs[id(buf)] = p
        for buf in kernel.locals:
            self.ptrs[id(buf)] = self.b.alloca(ltype(buf.dtype, True), size=max(buf.numel, 1),
                                               name=buf.name)

    # -- helpers --------------------------------------------------------------------------
    def _decl(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        f = self.m.globals.get(name)
        if f is None:
            f = ir.Function(self.m, ir.FunctionType(ret, args), name=name)
        return f

    def _intrinsic(self, base: str, t: ir.Type, nargs: int = 1) -> ir.Function:
        suffix = {"float": "f32", "double": "f64", "half": "f16"}[str(t)]
        return self._decl(f"llvm.{base}.{suffix}", t, [t] * nargs)

    def _libm(self, name: str, t: ir.Type, nargs: int = 1) -> ir.Function:
        cname = name + ("f" if str(t) == "float" else "")
        return self._decl(cname, t, [t] * nargs)

    def _ptr(self, buf: Buffer) -> ir.Value:
        try:
            return self.ptrs[id(buf)]
        except KeyError:
            raise CodegenError(f"kernel {self.k.name}: buffer {buf.name} is not a parameter or local") from None

    # -- expressions ------------------------------------------------------------------------
    def expr(self, e) -> ir.Value:
        b = self.b
        if isinstance(e, Const):
            t = ltype(e.dtype)
            if e.dtype.is_float:
                return ir.Constant(t, float(e.value))
            return ir.Constant(t, int(e.value))
        if isinstance(e, Var):
            try:
                return self.vars[id(e)]
            except KeyError:
                raise CodegenError(f"kernel {self.k.name}: variable {e.name} used outside its loop") from None
        if isinstance(e, Load):
            p = b.gep(self._ptr(e.buf), [self.expr(e.index)], source_etype=ltype(e.buf.dtype, True))
            v = b.load(p, typ=ltype(e.buf.dtype, True))
            if e.buf.dtype == DType.bool:
                v = b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
            return v
        if isinstance(e, Bin):
            return self.binop(e.op, e.a.dtype, self.expr(e.a), self.expr(e.b))
        if isinstance(e, Un):
            return self.unop(e.op, e.a.dtype, self.expr(e.a))
        if isinstance(e, Cast):
            return self.cast(self.expr(e.a), e.a.dtype, e.dtype)
        if isinstance(e, Select):
            return b.select(self.expr(e.cond), self.expr(e.a), self.expr(e.b))
        raise CodegenError(f"kernel {self.k.name}: unknown expression {e!r}")

    def binop(self, op: str, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
        b = self.b
        if dt.is_float:
            if dt == DType.f16 and op in ("pow", "atan2", "rem"):
                return b.fptrunc(self.binop(op, DType.f32, b.fpext(x, F32), b.fpext(y, F32)), x.type)
            if op == "add": return b.fadd(x, y)
            if op == "sub": return b.fsub(x, y)
            if op == "mul": return b.fmul(x, y)
            if op == "div": return b.fdiv(x, y)
            if op == "rem": return b.frem(x, y)
            if op == "min": return b.call(self._intrinsic("minimum", x.type, 2), [x, y])
            if op == "max": return b.call(self._intrinsic("maximum", x.type, 2), [x, y])
            if op == "pow": return b.call(self._intrinsic("pow", x.type, 2), [x, y])
            if op == "atan2": return b.call(self._libm("atan2", x.type, 2), [x, y])
            if op == "ne": return b.fcmp_unordered("!=", x, y)
            if op in _FCMP: return b.fcmp_ordered(_FCMP[op], x, y)
            raise CodegenError(f"kernel {self.k.name}: float op {op} unsupported")
        signed = dt.is_signed and dt != DType.bool
        if op == "add": return b.add(x, y)
        if op == "sub": return b.sub(x, y)
        if op == "mul": return b.mul(x, y)
        if op in ("div", "rem") and isinstance(y, ir.Constant) and y.constant not in (0, -1):
            # constant divisor (index arithmetic): no guard needed
            if op == "div":
                return b.sdiv(x, y) if signed else b.udiv(x, y)
            return b.srem(x, y) if signed else b.urem(x, y)
        if op in ("div", "rem"):
            zero = ir.Constant(x.type, 0)
            bad = b.icmp_unsigned("==", y, zero)
            if signed:
                minv = ir.Constant(x.type, -(1 << (x.type.width - 1)))
                ovf = b.and_(b.icmp_signed("==", x, minv), b.icmp_signed("==", y, ir.Constant(x.type, -1)))
                bad = b.or_(bad, ovf)
            safe_y = b.select(bad, ir.Constant(x.type, 1), y)
            if op == "div":
                q = b.sdiv(x, safe_y) if signed else b.udiv(x, safe_y)
                if signed:  # INT_MIN / -1 wraps to INT_MIN, x / 0 gives 0
                    return b.select(b.icmp_unsigned("==", y, zero), zero, b.select(bad, b.neg(x), q))
                return b.select(bad, zero, q)
            r = b.srem(x, safe_y) if signed else b.urem(x, safe_y)
            return b.select(bad, zero, r)
        if op == "min":
            c = b.icmp_signed("<", x, y) if signed else b.icmp_unsigned("<", x, y)
            return b.select(c, x, y)
        if op == "max":
            c = b.icmp_signed(">", x, y) if signed else b.icmp_unsigned(">", x, y)
            return b.select(c, x, y)
        if op == "and": return b.and_(x, y)
        if op == "or": return b.or_(x, y)
        if op == "xor": return b.xor(x, y)
        if op == "shl":
            big = b.icmp_unsigned(">=", y, ir.Constant(y.type, x.type.width))
            return b.select(big, ir.Constant(x.type, 0), b.shl(x, y))
        if op == "shr":
            big = b.icmp_unsigned(">=", y, ir.Constant(y.type, x.type.width))
            return b.select(big, ir.Constant(x.type, 0), b.ashr(x, y) if signed else b.lshr(x, y))
        if op == "pow":
            f64 = ir.DoubleType()
            fx = b.sitofp(x, f64) if signed else b.uitofp(x, f64)
            fy = b.sitofp(y, f64) if signed else b.uitofp(y, f64)
            r = b.call(self._intrinsic("pow", f64, 2), [fx, fy])
            return self.cast(r, DType.f64, dt)
        cmp = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
        if op in cmp:
            return b.icmp_signed(cmp[op], x, y) if signed else b.icmp_unsigned(cmp[op], x, y)
        raise CodegenError(f"kernel {self.k.name}: integer op {op} unsupported for {dt}")

    def unop(self, op: str, dt: DType, x: ir.Value) -> ir.Value:
        b = self.b
        if dt.is_float:
            if op == "neg": return b.fneg(x)
            if op == "isnan": return b.fcmp_unordered("uno", x, x)
            if op == "isinf":
                a = b.call(self._intrinsic("fabs", x.type), [x])
                return b.fcmp_ordered("==", a, ir.Constant(x.type, float("inf")))
            if dt == DType.f16:
                return b.fptrunc(self.unop(op, DType.f32, b.fpext(x, F32)), x.type)
            if op in _INTRINSIC_UNARY:
                return b.call(self._intrinsic(_INTRINSIC_UNARY[op], x.type), [x])
            if op in _LIBM_UNARY:
                return b.call(self._libm(op, x.type), [x])
            raise CodegenError(f"kernel {self.k.name}: float op {op} unsupported")
        if op == "neg": return b.neg(x)
        if op == "not": return b.not_(x)
        if op == "abs":
            if not dt.is_signed:
                return x
            return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x)
        if op in ("isnan", "isinf"):
            return ir.Constant(I1, 0)
        if op in ("floor", "ceil", "round", "trunc"):
            return x
        raise CodegenError(f"kernel {self.k.name}: integer op {op} unsupported for {dt}")

    def _f64_to_f32_round_odd(self, x: ir.Value) -> ir.Value:
        """double -> float rounded to odd, so a further rounding to half is correctly rounded
        (no double-rounding error). A direct fptrunc double -> half becomes a call to
        __truncdfhf2, which the JIT cannot resolve in every process (a crash)."""
        b = self.b
        y = b.fptrunc(x, F32)
        back = b.fpext(y, x.type)
        inexact = b.fcmp_ordered("!=", back, x)
        fabs = self._intrinsic("fabs", x.type)
        rounded_up = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [x]))
        bits = b.bitcast(y, ir.IntType(32))
        bits = b.sub(bits, b.zext(rounded_up, ir.IntType(32)))    # truncate toward zero
        bits = b.or_(bits, b.zext(inexact, ir.IntType(32)))       # sticky bit: odd if inexact
        return b.bitcast(bits, F32)

    def cast(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
        b = self.b
        if src == dst:
            return x
        t = ltype(dst)
        if dst == DType.bool:
            if src.is_float:
                return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
            return b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
        if src.is_float and dst.is_float:
            if src == DType.f64 and dst == DType.f16:
                return b.fptrunc(self._f64_to_f32_round_odd(x), t)
            return b.fpext(x, t) if src.itemsize < dst.itemsize else b.fptrunc(x, t)
        if src.is_float:
            if src == DType.f16:
                x, src = b.fpext(x, F32), DType.f32
            name = "fptosi" if dst.is_signed else "fptoui"
            sfx = {"float": "f32", "double": "f64"}[str(x.type)]
            f = self._decl(f"llvm.{name}.sat.i{t.width}.{sfx}", t, [x.type])
            return b.call(f, [x])
        if dst.is_float:
            if src == DType.bool or not src.is_signed:
                return b.uitofp(x, t)
            return b.sitofp(x, t)
        # int -> int
        if x.type.width > t.width:
            return b.trunc(x, t)
        if x.type.width < t.width:
            return b.sext(x, t) if (src.is_signed and src != DType.bool) else b.zext(x, t)
        return x

    # -- statements -------------------------------------------------------------------------
    def stmts(self, body) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s) -> None:
        b = self.b
        if isinstance(s, Store):
            v = self.expr(s.value)
            if s.buf.dtype == DType.bool:
                v = b.zext(v, I8)
            p = b.gep(self._ptr(s.buf), [self.expr(s.index)], source_etype=ltype(s.buf.dtype, True))
            b.store(v, p)
        elif isinstance(s, For):
            start = self.expr(s.start)
            stop = self.expr(s.extent)
            pre = b.block
            header = self.fn.append_basic_block(f"{s.var.name}.head")
            body = self.fn.append_basic_block(f"{s.var.name}.body")
            exit_ = self.fn.append_basic_block(f"{s.var.name}.exit")
            b.branch(header)
            b.position_at_end(header)
            iv = b.phi(I64, name=s.var.name)
            iv.add_incoming(start, pre)
            b.cbranch(b.icmp_signed("<", iv, stop), body, exit_)
            b.position_at_end(body)
            self.vars[id(s.var)] = iv
            self.stmts(s.body)
            nxt = b.add(iv, ir.Constant(I64, 1))
            iv.add_incoming(nxt, b.block)
            b.branch(header)
            b.position_at_end(exit_)
        elif isinstance(s, If):
            cond = self.expr(s.cond)
            if s.orelse:
                with b.if_else(cond) as (then, orelse):
                    with then:
                        self.stmts(s.then)
                    with orelse:
                        self.stmts(s.orelse)
            else:
                with b.if_then(cond):
                    self.stmts(s.then)
        else:
            raise CodegenError(f"kernel {self.k.name}: unknown statement {s!r}")


def emit_kernel(module: ir.Module, kernel: Kernel) -> ir.Function:
    """Add one kernel to ``module``; raises CodegenError naming the kernel."""
    em = _FnEmitter(module, kernel)
    em.stmts(kernel.body)
    em.b.ret_void()
    return em.fn


def emit_entry(module: ir.Module, name: str, calls: list[tuple[str, list[int]]]) -> ir.Function:
    """``void @name(ptr %slots)``: calls each kernel with args gathered from the slot table."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    width = max([len(s) for _, s in calls] + [1])
    args = b.alloca(PTR, size=width, name="args")
    for kname, slots in calls:
        callee = module.globals[kname]
        for j, slot in enumerate(slots):
            p = b.load(b.gep(fn.args[0], [ir.Constant(I64, slot)], source_etype=PTR), typ=PTR)
            b.store(p, b.gep(args, [ir.Constant(I64, j)], source_etype=PTR))
        b.call(callee, [args])
    b.ret_void()
    return fn
