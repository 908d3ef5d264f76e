"""Kernel IR -> LLVM IR (llvmlite.ir).

Every kernel becomes ``void @name(ptr %args, ptr %team)``, ``args`` being an array of buffer
pointers in the kernel's parameter order. :func:`emit_entry` adds ``void @<entry>(ptr %slots,
ptr %team)`` that calls kernels in sequence, each with its buffers picked from the slot table
(the runtime's memory plan fills the table), so one native call runs the whole graph.

Threads: the runtime calls the entry once per thread of a team, each with its own ``team``
record (:data:`TEAM_FIELDS`), and the threads share the work of each *phase* through two
counters (:func:`phase_helpers`): a kernel's top-level ``parallel`` loop is one phase, cut
into chunks of about ``extent / (nthreads * chunks_per_thread)`` iterations; each thread owns
a contiguous range of them, claims its own from an atomic counter first and then the other
threads' (the calling thread works too); a statement or a run of serial
kernels that must run once is a phase of one chunk. A thread claims chunks of a phase only
once every chunk of the earlier phases is done (a count of finished chunks, not of threads that
arrived), so no thread ever waits for a particular other thread: one that is descheduled holds
back at most the chunk it is running, and when it wakes late it finds the phases it missed
exhausted (the counters only grow, so its claims fail) and takes part in the current one.
``team`` may be null: the kernel then runs every iteration itself (the profiler does this).

Loop kinds: ``parallel`` as above; ``unroll`` repeats the body once per iteration (constant
extents up to :data:`MAX_UNROLL`); ``vectorize`` marks the innermost loop that LLVM's loop
vectoriser widens to the target's lanes (it runs at every optimisation level we use); vector
types (``Load.lanes``, ``Broadcast``, vector ``Store``) become LLVM vector instructions directly.

Semantics of the expression ops on integers follow C with two guards that C lacks: division
or remainder by zero gives 0 (numpy's result) and INT_MIN / -1 wraps, rather than trapping.
Float min/max propagate NaN (llvm.minimum / llvm.maximum, as numpy.minimum / maximum).
float -> int casts saturate (llvm.fptosi.sat), NaN -> 0. The full table, per op and dtype, is
``ir/semantics.py`` (a numpy evaluator: the spec); tests/test_semantics.py checks this emitter
against it on edge values.
"""
from __future__ import annotations

from llvmlite import ir

from tensorfuse.ir.kernel import DOT_PACKINGS, GPU_LOOP_KINDS, FMA, Barrier, Concat, DotAcc, Bin, Broadcast, Buffer, Cast, Const, For, If, Kernel, Load, Lookup, Prefetch, TileOp, Select, Shuffle, Store, Un, Var
from tensorfuse.ir.schedule import expr_children, expr_nodes, runs_on_thread0_only, statement_is_parallel, all_loops, walk_stmts
from tensorfuse.ir.types import DType
# the team record and shared counters' layout belongs to the runtime (which loads saved modules
# without importing codegen)
from tensorfuse.runtime.threads import (CTL_CLOSED, CTL_TICKS, SYNC_CLAIMED, SYNC_DONE, TEAM_FIELDS,  # noqa: F401
                                        TEAM_RECORD_BYTES)

from . import vmath

PTR = ir.PointerType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I64 = ir.IntType(64)
F32 = ir.FloatType()



#: the most iterations an ``unroll`` loop may have
MAX_UNROLL = 64


class CodegenError(Exception):
    """Kernel IR the LLVM backend cannot emit; names the kernel."""


def ltype(dt: DType, memory: bool = False, lanes: int = 1) -> ir.Type:
    t = _scalar_ltype(dt, memory)
    return ir.VectorType(t, lanes) if lanes > 1 else t


def _scalar_ltype(dt: DType, memory: bool = False) -> ir.Type:
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


#: the longest buffer name used as an LLVM local name (longer ones are shortened)
MAX_LOCAL_NAME = 64


def local_name(name: str) -> str:
    """The LLVM local name for a buffer (an ONNX value) name: the name itself, or for one longer
    than :data:`MAX_LOCAL_NAME` its start and a hash of the whole. LLVM truncates local names
    of over 1024 characters while parsing IR, so two long names sharing a prefix would become
    one value ("multiple definition of local value"); names are only labels in the IR."""
    if len(name) <= MAX_LOCAL_NAME:
        return name
    import hashlib
    return f"{name[:MAX_LOCAL_NAME - 17]}.{hashlib.sha1(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


class _FnEmitter:
    def __init__(self, module: ir.Module, kernel: Kernel, avx512: bool = False):
        self.m = module
        self.k = kernel
        self.avx512 = avx512        # vmath may use AVX-512 instructions (VSCALEFPS in exp)
        fn = module.globals.get(kernel.name)
        if fn is not None:
            raise CodegenError(f"kernel name {kernel.name} emitted twice")
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name=kernel.name)
        self.fn.args[0].name = "args"
        self.fn.args[1].name = "team"
        # each kernel stays a function of its own, as the profiler times it: inlined into
        # the entry, the run measured slower than the sum of the kernels' own times
        self.fn.attributes.add("noinline")
        entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.split_ok = False
        self.chunk = None
        #: the generic schedule's loops that hold loops (other than ``unroll`` ones, which
        #: leave no loop) are not unrolled by LLVM (:meth:`_loop_id`); hand schedules unroll
        #: what they mean to themselves
        self.keep_outer_loops = kernel.schedule == "generic"
        self.ptrs: dict[int, ir.Value] = {}
        self.vars: dict[int, ir.Value] = {}
        self._memo: dict[int, tuple] = {}       # id(expr) -> (expr, value) in _memo_block
        self._memo_block = None
        self._pure: dict[int, tuple] = {}       # id(expr) -> (expr, has no Load)
        for i, buf in enumerate(kernel.params):
            slot = self.b.gep(self.fn.args[0], [ir.Constant(I64, i)], source_etype=PTR)
            p = self.b.load(slot, typ=PTR)
            p.name = local_name(buf.name)
            self.ptrs[id(buf)] = p
        for buf in kernel.locals:
            if buf.scope != "local":
                raise CodegenError(f"kernel {kernel.name}: buffer {buf.name} has scope {buf.scope!r}, "
                                   f"which the LLVM backend has not (GPU only)")
            a = self.b.alloca(ir.ArrayType(ltype(buf.dtype, True), max(buf.numel, 1)), name=local_name(buf.name))
            a.align = 64
            self.ptrs[id(buf)] = a
        self.nth, self.cpt = _team_shape(self.b, self.fn.args[1])   # after the allocas: entry block

    # -- helpers --------------------------------------------------------------------------
    def _loop_id(self, *options: str) -> ir.values.MDValue:
        """A new loop ID (LLVM LangRef "'llvm.loop'": a metadata node whose first operand is
        itself) carrying the string ``options``, e.g. ``llvm.loop.unroll.disable``.

        The generic schedule's loops that hold loops get ``llvm.loop.unroll.disable``: after
        vectorising an inner loop over a buffer LLVM cannot prove distinct from the one it
        writes, LLVM fully unrolled a short outer loop around it (28 rows of a [28, 576] copy:
        28 vectorised copies, each with its run-time overlap check and scalar fallback loop),
        over ten times the optimisation and instruction selection time of the loop as written,
        for the same work per row. The inner loops are vectorised and unrolled as before."""
        md = _LoopID(self.m, [], name=str(len(self.m.metadata)))
        md.operands = (md, *(self.m.add_metadata([ir.MetaDataString(self.m, o)]) for o in options))
        return md

    def _decl(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        f = self.m.globals.get(name)
        if f is None:
            f = ir.Function(self.m, ir.FunctionType(ret, args), name=name)
        return f

    def _intrinsic(self, base: str, t: ir.Type, nargs: int = 1) -> ir.Function:
        return self._decl(f"llvm.{base}.{_suffix(t)}", t, [t] * nargs)

    def _scalarised(self, x: ir.Value, fn, *more: ir.Value) -> ir.Value:
        """Apply a scalar emitter ``fn(lane of x, lanes of more...)`` to each lane of vectors
        (libm calls and casts that have no vector form)."""
        b = self.b
        out = None
        for i in range(x.type.count):
            k = ir.Constant(ir.IntType(32), i)
            lane = fn(b.extract_element(x, k), *[b.extract_element(m, k) for m in more])
            if out is None:
                out = ir.Constant(ir.VectorType(lane.type, x.type.count), ir.Undefined)
            out = b.insert_element(out, lane, k)
        return out

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
        """The value of ``e`` at the builder's position. A load-free expression object emitted
        again in the same basic block reuses its first value (kernel builders share index
        subexpressions such as a tile's base offset among many loads), so the IR LLVM has to
        clean up stays small; loads are emitted every time (a store may come between)."""
        if isinstance(e, (Const, Var)):
            return self._expr(e)
        blk = self.b.block
        if blk is not self._memo_block:
            self._memo, self._memo_block = {}, blk
        hit = self._memo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        v = self._expr(e)
        if self._load_free(e):
            if self.b.block is not self._memo_block:
                self._memo, self._memo_block = {}, self.b.block
            self._memo[id(e)] = (e, v)
        return v

    def _load_free(self, e) -> bool:
        hit = self._pure.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        if isinstance(e, (Const, Var)):
            r = True
        elif isinstance(e, (Bin, Un, Cast, Broadcast, Select, FMA, DotAcc, Shuffle, Concat)):
            r = all(self._load_free(c) for c in expr_children(e))
        else:                            # a Load, or anything else: emitted every time
            r = False
        self._pure[id(e)] = (e, r)
        return r

    def _expr(self, e) -> ir.Value:
        b = self.b
        if isinstance(e, Const):
            t = ltype(e.dtype)
            if e.dtype.is_float:
                return ir.Constant(t, float(e.value))
            return ir.Constant(t, int(e.value))
        if isinstance(e, Broadcast):
            return _splat(b, self.expr(e.a), e.lanes)
        if isinstance(e, FMA):
            x, y, z = self.expr(e.a), self.expr(e.b), self.expr(e.c)
            if e.dtype == DType.f16:
                return b.fadd(b.fmul(x, y), z)
            return b.call(self._intrinsic("fmuladd", x.type, 3), [x, y, z])
        if isinstance(e, DotAcc):
            return self.dot_acc(e, self.expr(e.acc), self.expr(e.a), self.expr(e.b))
        if isinstance(e, Concat):
            return self.concat(e)
        if isinstance(e, Shuffle):
            return b.shuffle_vector(self.expr(e.a), self.expr(e.b),
                                    ir.Constant(ir.VectorType(ir.IntType(32), len(e.mask)), list(e.mask)))
        if isinstance(e, Var):
            try:
                return self.vars[id(e)]
            except KeyError:
                raise CodegenError(f"kernel {self.k.name}: variable {e.name} used outside its loop") from None
        if isinstance(e, Load):
            et = ltype(e.buf.dtype, True)
            p = b.gep(self._ptr(e.buf), [self.expr(e.index)], source_etype=et)
            vt = ltype(e.buf.dtype, True, e.lanes)
            if e.lanes > 2 and e.stride == 2:            # two overlapping loads, the even elements
                q = b.gep(p, [ir.Constant(I64, e.lanes - 1)], source_etype=et)      # [i+L-1, i+2L-1)
                lo = b.load(p, typ=vt, align=e.buf.dtype.itemsize)
                hi = b.load(q, typ=vt, align=e.buf.dtype.itemsize)
                mask = [2 * ln if 2 * ln < e.lanes else 2 * ln + 1 for ln in range(e.lanes)]
                v = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ir.IntType(32), e.lanes), mask))
            elif e.lanes > 1 and e.stride != 1:          # a gather: one load per lane
                v = ir.Constant(vt, ir.Undefined)
                for ln in range(e.lanes):
                    q = b.gep(p, [ir.Constant(I64, ln * e.stride)], source_etype=et)
                    v = b.insert_element(v, b.load(q, typ=et, align=e.buf.dtype.itemsize),
                                         ir.Constant(ir.IntType(32), ln))
            else:
                v = b.load(p, typ=vt, align=e.buf.dtype.itemsize)
            if e.buf.dtype == DType.bool:
                v = b.icmp_unsigned("!=", v, ir.Constant(vt, 0) if e.lanes == 1 else
                                    ir.Constant(vt, [0] * e.lanes))
            return v
        if isinstance(e, Bin):
            if e.op == "or" and e.dtype == DType.i32 and e.lanes > 1:
                v = self._byte_window(e)
                if v is not None:
                    return v
            if e.op == "sub" and e.dtype == DType.f32 and e.lanes > 1:
                v = self._round_trip_less_offset(e)
                if v is not None:
                    return v
            return self.binop(e.op, e.a.dtype, self.expr(e.a), self.expr(e.b))
        if isinstance(e, Un):
            return self.unop(e.op, e.a.dtype, self.expr(e.a))
        if isinstance(e, Cast):
            inner = e.a
            if (isinstance(inner, Cast) and inner.dtype in (DType.u8, DType.u16) and e.dtype in (DType.f32, DType.f64)
                    and inner.a.dtype == e.dtype and e.lanes > 1):
                return self._unsigned_round_trip(self.expr(inner.a), inner.dtype, _integral(inner.a))
            if e.lanes > 1 and inner.dtype == DType.f32 and e.dtype in _NARROW_INTS:
                parts = _rounded_plus_offset(inner)
                if parts is not None:
                    return self._round_narrow(self.expr(parts[0]), None if parts[1] is None else self.expr(parts[1]),
                                              e.dtype)
            return self.cast(self.expr(e.a), e.a.dtype, e.dtype)
        if isinstance(e, Select):
            return b.select(self.expr(e.cond), self.expr(e.a), self.expr(e.b))
        if isinstance(e, Lookup):
            return self.lookup(e, self.expr(e.index))
        raise CodegenError(f"kernel {self.k.name}: unknown expression {e!r}")

    def lookup(self, e: Lookup, idx: ir.Value) -> ir.Value:
        """``table[idx]``: the table a private constant global of the module (one per distinct
        table), integers of at most 32 bits held as i32 so a vector index reads it with one
        ``llvm.masked.gather`` (VPGATHERDD), then truncated to the element type."""
        b = self.b
        wide = e.dtype.is_int and e.dtype.itemsize < 4
        et = ir.IntType(32) if wide else ltype(e.dtype, True)
        name = f"tf.table.{e.digest}"
        g = self.m.globals.get(name)
        if g is None:
            at = ir.ArrayType(et, len(e.table))
            g = ir.GlobalVariable(self.m, at, name)
            g.global_constant = True
            g.linkage = "private"
            g.align = 64
            g.initializer = ir.Constant(at, [int(v) if e.dtype.is_int else v for v in e.table])
        n = e.lanes
        if n == 1:
            p = b.gep(g, [ir.Constant(I64, 0), b.sext(idx, I64)], source_etype=g.value_type)
            v = b.load(p, typ=et, align=et.width // 8 if isinstance(et, ir.IntType) else 4)
        else:
            vt = ir.VectorType(et, n)
            ptrs = b.gep(g, [idx], source_etype=et)
            ptrs.type = ir.VectorType(PTR, n)            # a vector GEP: one address per lane
            fn = self._decl(f"llvm.masked.gather.{_suffix(vt)}.v{n}p0", vt,
                            [ir.VectorType(PTR, n), ir.IntType(32), ir.VectorType(I1, n), vt])
            v = b.call(fn, [ptrs, ir.Constant(ir.IntType(32), 4), ir.Constant(ir.VectorType(I1, n), [1] * n),
                            ir.Constant(vt, ir.Undefined)])
        if wide:
            v = b.trunc(v, ltype(e.dtype, True, n))
        return v

    def _byte_window(self, e: Bin) -> ir.Value | None:
        """An i32 vector whose every lane is bytes of one u8/i8 buffer near each other (what the
        int8 schedules pack for the dot products, :mod:`.schedules.int8`):
        ``OR_t ((i32(buf[base + l*s + o_t]) [+ c_t]) [& 255]) << 8*t`` over lanes l, as one load of
        the span they cover, a byte shuffle (``vpermb`` with AVX512-VBMI) and a byte add of the
        c_t, instead of a load, a widening, a shift and an or per byte (per strided load at
        s = 2: two loads and a shuffle). The same values: byte t of lane l is the low byte of
        term t (zero where no term has that byte). None where ``e`` is not of that form (then
        the ops are emitted as written)."""
        terms, stack = [], [e]
        while stack:
            x = stack.pop()
            if isinstance(x, Bin) and x.op == "or":
                stack += [x.a, x.b]
            else:
                terms.append(x)
        if len(terms) < 2 or len(terms) > 4:
            return None

        def const_of(x):
            if isinstance(x, Broadcast):
                x = x.a
            return x.value if isinstance(x, Const) and not x.dtype.is_float else None

        lanes = e.lanes
        parsed, base, buf, stride = {}, None, None, None
        for x in terms:
            shift = 0
            if isinstance(x, Bin) and x.op == "shl":
                shift = const_of(x.b)
                x = x.a
                if shift is None:
                    return None
            masked = False
            if isinstance(x, Bin) and x.op == "and":
                if const_of(x.b) != 255:
                    return None
                masked, x = True, x.a
            add = 0
            if isinstance(x, Bin) and x.op == "add" and masked:
                add = const_of(x.b)
                if add is None:
                    return None
                x = x.a
            if not (isinstance(x, Cast) and isinstance(x.a, Load) and x.a.lanes == lanes):
                return None
            ld = x.a
            if ld.buf.dtype not in (DType.u8, DType.i8) or (ld.buf.dtype == DType.i8 and not masked):
                return None
            if shift % 8 or not 0 <= shift <= 24 or shift // 8 in parsed:
                return None
            idx, off = ld.index, 0
            while isinstance(idx, Bin) and idx.op == "add" and const_of(idx.b) is not None:
                off += const_of(idx.b)
                idx = idx.a
            if buf is None:
                buf, stride, base = ld.buf, ld.stride, idx
            elif ld.buf is not buf or ld.stride != stride or not _same_expr(idx, base):
                return None
            parsed[shift // 8] = (off, add % 256)
        lo = min(o for o, _ in parsed.values())
        span = (lanes - 1) * stride + max(o for o, _ in parsed.values()) - lo + 1
        if stride < 1 or span > 64:
            return None
        b = self.b
        i8 = ir.IntType(8)
        et = ltype(buf.dtype, True)
        p = b.gep(self._ptr(buf), [b.add(self.expr(base), ir.Constant(I64, lo))], source_etype=et)
        # the span as two loads of a power-of-two width w (the first and the last w bytes,
        # overlapping; one where the span is a power of two): an odd-sized vector load became
        # byte inserts (x86 has no such load), and a wider one could read past the buffer
        w = 1 << (span.bit_length() - 1)
        first = b.load(p, typ=ir.VectorType(i8, w), align=1)
        if w == span:
            second = ir.Constant(ir.VectorType(i8, w), [0] * w)
            zero_at = w                           # a byte of the zero vector
        else:
            q = b.gep(p, [ir.Constant(I64, span - w)], source_etype=et)
            second = b.load(q, typ=ir.VectorType(i8, w), align=1)
            zero_at = None

        def pos(k: int) -> int:                   # byte k of the span in <first, second>
            return k if k < w else w + k - (span - w)
        mask, adds, zeros = [], [], []
        for ln in range(lanes):
            for t in range(4):
                if t in parsed:
                    mask.append(pos(ln * stride + parsed[t][0] - lo))
                    adds.append(parsed[t][1])
                    zeros.append(False)
                else:
                    mask.append(zero_at if zero_at is not None else 0)
                    adds.append(0)
                    zeros.append(True)
        v = b.shuffle_vector(first, second, ir.Constant(ir.VectorType(ir.IntType(32), 4 * lanes), mask))
        if zero_at is None and any(zeros):        # bytes no term has: zero them
            v = b.select(ir.Constant(ir.VectorType(ir.IntType(1), 4 * lanes), [not z for z in zeros]), v,
                         ir.Constant(ir.VectorType(i8, 4 * lanes), [0] * (4 * lanes)))
        if any(adds):
            v = b.add(v, ir.Constant(ir.VectorType(i8, 4 * lanes), adds))
        return b.bitcast(v, ir.VectorType(ir.IntType(32), lanes))

    def _round_trip_less_offset(self, e: Bin) -> ir.Value | None:
        """``float(T(round(a) + c)) - c`` for an f32 vector ``a``, an 8- or 16-bit integer type T
        and the same small integer ``c`` on both sides (a QuantizeLinear's zero point and the
        DequantizeLinear after it reading the same one: the fake-quantized value on its grid,
        before the DQ's scale) as ``clamp(round(a), lo - c, hi - c)``, NaN -> -c: the same value
        (integers within 2^24 are exact in f32, and a rounded value further out saturates to
        the same bound either way), without the add and the subtraction of ``c``. None where
        ``e`` is not of this form."""
        rt = e.a
        if not (isinstance(rt, Cast) and rt.dtype == DType.f32 and isinstance(rt.a, Cast)
                and rt.a.dtype in _NARROW_INTS and rt.a.a.dtype == DType.f32):
            return None
        parts = _rounded_plus_offset(rt.a.a)
        if parts is None or parts[1] is None or not _same_expr(parts[1], e.b):
            return None
        b = self.b
        a, c = self.expr(parts[0]), self.expr(parts[1])
        r = b.call(self._intrinsic("roundeven", a.type), [a])
        low, high = self._range_less(rt.a.dtype, c, a.type)
        return self._clamp(r, low, high, b.fneg(c), _int_range(rt.a.dtype)[0] == 0)

    def _range_less(self, dst: DType, c: ir.Value | None, t: ir.Type) -> tuple[ir.Value, ir.Value]:
        """(lo - c, hi - c) of the integer type ``dst``'s range as float vectors of type ``t``
        (c None: 0): the bounds of a value that ``c`` is added to afterwards."""
        lo, hi = _int_range(dst)
        lo_v = ir.Constant(t, [float(lo)] * t.count)
        hi_v = ir.Constant(t, [float(hi)] * t.count)
        return (lo_v, hi_v) if c is None else (self.b.fsub(lo_v, c), self.b.fsub(hi_v, c))

    def _unsigned_round_trip(self, x: ir.Value, mid: DType, integral: bool = False) -> ir.Value:
        """float(unsigned(x)) for a float vector x and an unsigned 8- or 16-bit ``mid``: the
        saturating cast's value (NaN and negatives 0, at most the type's maximum, truncated
        toward zero) kept in the float type, ``trunc(min(max(x, 0), hi))``, instead of the
        convert, narrowing, widening and convert back (a QuantizeLinear's u8 read by the
        DequantizeLinear after it in one epilogue: resnet's and mobilenet's residual blocks).
        The same value, +0.0 for every x below 1. ``integral``: x is known to hold integers
        (or NaN, +-inf; :func:`_integral`), so the clamped value needs no truncation (a
        requantization's ``round(v) + zero_point``: one 512-bit operation fewer per vector)."""
        b = self.b
        n = x.type.count
        zero = ir.Constant(x.type, [0.0] * n)
        hi = ir.Constant(x.type, [float((1 << (8 * mid.itemsize)) - 1)] * n)
        x = b.select(b.fcmp_ordered(">", x, zero), x, zero)
        x = b.select(b.fcmp_ordered(">", x, hi), hi, x)
        return x if integral else b.call(self._intrinsic("trunc", x.type), [x])

    def _round_narrow(self, a: ir.Value, c: ir.Value | None, dst: DType) -> ir.Value:
        """saturate(round_half_even(a) + c) to the 8- or 16-bit integer ``dst``, for an f32
        vector ``a`` and an integral f32 vector ``c`` of magnitude below 2^16 (None: 0): a
        requantization's last steps (``ir.ops.quant.quantize_expr``; MLAS's order). ``a`` is
        clamped to [lo - c, hi - c] (integers, exact in f32), converted to i32 rounding half to
        even (``llvm.lrint``: CVTPS2DQ under the default MXCSR rounding), and ``c`` added as an
        integer: the same value as rounding, adding, clamping and converting (rounding is
        monotonic and keeps integers), in one conversion instead of a rounding and a
        conversion. NaN -> 0, as the saturating cast gives."""
        v = self._round_i32(a, c, dst, False)
        return self.b.trunc(v, ir.VectorType(ltype(dst), a.type.count))

    def _round_i32(self, a: ir.Value, c: ir.Value | None, dst: DType, packs_saturate: bool) -> ir.Value:
        """:meth:`_round_narrow`'s value as i32 lanes before the truncation (within ``dst``'s
        range). ``packs_saturate`` (x86 targets only; :meth:`_pack_narrow`, which passes it only
        where ``c`` is None or a non-negative integer, :func:`_nonneg_integral`: a u8 zero
        point): the lanes go on to saturating packs, and for an unsigned ``dst`` only the upper
        clamp is applied: CVTPS2DQ (its x86 intrinsic, not ``llvm.lrint``, whose result is
        undefined there) gives 0x80000000 for NaN and for values below -2^31, and that plus
        ``c`` stays negative, which the packs saturate to 0, the value the clamp gives; any lane
        below the range saturates to 0 the same way. Other types keep both clamps (an i8 NaN goes to 0, not -128)."""
        b = self.b
        lo = _int_range(dst)[0]
        n = a.type.count
        vi = ir.VectorType(ir.IntType(32), n)
        low, high = self._range_less(dst, c, a.type)
        if packs_saturate and lo == 0 and n in (8, 16):
            x = b.select(b.fcmp_ordered(">", a, high), high, a)
            if n == 16:
                f = self._decl("llvm.x86.avx512.mask.cvtps2dq.512", vi, [a.type, vi, ir.IntType(16), ir.IntType(32)])
                v = b.call(f, [x, ir.Constant(vi, None), ir.Constant(ir.IntType(16), -1), ir.Constant(ir.IntType(32), 4)])
            else:
                v = b.call(self._decl("llvm.x86.avx.cvt.ps2dq.256", vi, [a.type]), [x])
        else:
            nan_to = ir.Constant(a.type, [0.0] * n) if c is None else b.fneg(c)    # rounds to 0 after + c
            # unsigned: NaN goes to low = -c, which gives 0 as well
            x = self._clamp(a, low, high, nan_to, lo == 0)
            v = b.call(self._decl(f"llvm.lrint.v{n}i32.v{n}f32", vi, [a.type]), [x])
        if c is not None:
            v = b.add(v, b.fptosi(c, vi))
        return v

    def concat(self, e: Concat) -> ir.Value:
        """:class:`Concat`: the parts joined by shufflevectors; with ``isa`` "x86pack" and parts
        that are vector casts f32 -> u8 / i8 of 16 or 8 lanes (a requantization's outputs),
        narrowed together by :meth:`_pack_narrow` instead of one VPMOVDB each."""
        ps = e.parts
        n = ps[0].lanes
        if (e.isa == "x86pack" and e.dtype in (DType.u8, DType.i8) and n in (8, 16) and len(ps) in (2, 4)
                and all(isinstance(p, Cast) and p.a.dtype == DType.f32 for p in ps)):
            return self._pack_narrow([p.a for p in ps], e.dtype)
        vals = [self.expr(p) for p in ps]
        while len(vals) > 1:
            m = 2 * vals[0].type.count
            mask = ir.Constant(ir.VectorType(ir.IntType(32), m), list(range(m)))
            vals = [self.b.shuffle_vector(vals[i], vals[i + 1], mask) for i in range(0, len(vals), 2)]
        return vals[0]

    def _pack_narrow(self, inners: list, dst: DType) -> ir.Value:
        """The saturating casts to ``dst`` (u8 or i8) of the f32 vectors ``inners`` (2 or 4,
        of n = 16 or 8 lanes), concatenated: each as i32 lanes (:meth:`_round_i32` where it is
        ``round(a) + c``, else clamped and truncated toward zero), then narrowed together with
        saturation (Intel SDM: VPACKSSDW pairs to i16, VPACKUSWB / VPACKSSWB to bytes, within
        each 128-bit lane) and the dwords put in order with one VPERMD: per 4 vectors about 4
        shuffles and one store, where a VPMOVDB each is a shuffle and a store of 16 bytes (the
        clamps before the conversions shrink as :meth:`_round_i32` says)."""
        b = self.b
        n = inners[0].lanes
        k = len(inners)
        vs = []
        for inner in inners:
            parts = _rounded_plus_offset(inner)
            if parts is not None:
                a, c = parts
                vs.append(self._round_i32(self.expr(a), None if c is None else self.expr(c), dst,
                                          c is None or _nonneg_integral(c)))
            else:
                vs.append(self._sat_i32(self.expr(inner), dst))
        i32v, i16v, i8v = (ir.VectorType(ir.IntType(w), n * 32 // w) for w in (32, 16, 8))
        wide = "avx512." if n == 16 else "avx2."
        sfx = ".512" if n == 16 else ""
        pdw = self._decl(f"llvm.x86.{wide}packssdw{sfx}", i16v, [i32v, i32v])
        pwb = self._decl(f"llvm.x86.{wide}pack{'us' if dst == DType.u8 else 'ss'}wb{sfx}", i8v, [i16v, i16v])
        ab = b.call(pdw, [vs[0], vs[1]])
        cd = b.call(pdw, [vs[2], vs[3]]) if k == 4 else ab
        x = b.bitcast(b.call(pwb, [ab, cd]), i32v)
        # 128-bit lane q of x holds 4 bytes of each of the parts (dword 4q + t: part t's lanes
        # 4q .. 4q+3); output dword m takes part m // NQ's chunk m % NQ
        nq = n // 4
        order = [4 * (m % nq) + m // nq for m in range(k * nq)]
        y = b.shuffle_vector(x, ir.Constant(i32v, None), ir.Constant(ir.VectorType(ir.IntType(32), len(order)), order))
        return b.bitcast(y, ir.VectorType(ir.IntType(8), k * n))

    def _narrow_sat_vector(self, x: ir.Value, dst: DType) -> ir.Value:
        """A float vector to an 8- or 16-bit integer vector, saturating, NaN -> 0 (what
        ``llvm.fptoui.sat`` means; x86 has no such instruction, and LLVM scalarises a vector of
        it: each QuantizeLinear epilogue lane became a compare, a convert and an insert). Here:
        NaN to 0, a clamp to the type's range (exact in f32 and f64), then an in-range
        conversion through i32 and a truncation, which stay vector instructions."""
        return self.b.trunc(self._sat_i32(x, dst), ir.VectorType(ltype(dst), x.type.count))

    def _sat_i32(self, x: ir.Value, dst: DType) -> ir.Value:
        """:meth:`_narrow_sat_vector`'s value as i32 lanes before the truncation."""
        n = x.type.count
        lo, hi = self._range_less(dst, None, x.type)
        x = self._clamp(x, lo, hi, ir.Constant(x.type, [0.0] * n), _int_range(dst)[0] == 0)
        return self.b.fptosi(x, ir.VectorType(ir.IntType(32), n))

    def _clamp(self, x: ir.Value, low: ir.Value, high: ir.Value, nan_to: ir.Value, nan_low: bool) -> ir.Value:
        """x clamped to [low, high], NaN -> ``nan_to``; ``nan_low``: NaN may go to ``low``
        (``nan_to`` is then unused): "x > low ? x : low" sends NaN and everything below to
        low in one compare (one VMAXPS with x first: x86's max returns its second operand for
        NaN), instead of a NaN test and its blend before the clamp (u8 requantization)."""
        b = self.b
        if nan_low:
            x = b.select(b.fcmp_ordered(">", x, low), x, low)
        else:
            x = b.select(b.fcmp_unordered("uno", x, x), nan_to, x)
            x = b.select(b.fcmp_ordered("<", x, low), low, x)
        return b.select(b.fcmp_ordered(">", x, high), high, x)

    def dot_acc(self, e: DotAcc, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        """:class:`DotAcc`: the instruction its ``isa`` names (Intel SDM: VPDPBUSD, whose
        accumulation wraps; VPMADDWD then VPADDD) at 8 or 16 lanes, else plain LLVM IR: the
        packed elements widened to i32, multiplied, and the products of each lane added up
        (LLVM may still select VPMADDWD there)."""
        bld = self.b
        n = e.lanes
        i32 = ir.IntType(32)
        if e.isa == "vnni" and n in (8, 16):
            t = ir.VectorType(i32, n)
            f = self._decl(f"llvm.x86.avx512.vpdpbusd.{32 * n}", t, [t, t, t])
            return bld.call(f, [acc, a, b])
        if e.isa == "pmaddwd" and n in (8, 16):
            t16 = ir.VectorType(ir.IntType(16), 2 * n)
            t = ir.VectorType(i32, n)
            name = "llvm.x86.avx2.pmadd.wd" if n == 8 else "llvm.x86.avx512.pmaddw.d.512"
            f = self._decl(name, t, [t16, t16])
            return bld.add(acc, bld.call(f, [bld.bitcast(a, t16), bld.bitcast(b, t16)]))
        ta, tb, g = DOT_PACKINGS[e.packing]
        w = 32 // g
        narrow = ir.VectorType(ir.IntType(w), g * n)
        wide = ir.VectorType(i32, g * n)

        def widen(v, dt):
            v = bld.bitcast(v, narrow)
            return bld.sext(v, wide) if dt.is_signed else bld.zext(v, wide)
        prod = bld.mul(widen(a, ta), widen(b, tb))
        und = ir.Constant(wide, ir.Undefined)
        total = acc
        for t in range(g):
            part = bld.shuffle_vector(prod, und, ir.Constant(ir.VectorType(i32, n), [l * g + t for l in range(n)]))
            if n == 1:
                part = bld.extract_element(part, ir.Constant(i32, 0))
            total = bld.add(total, part)
        return total

    def tile_op(self, s: TileOp) -> None:
        """:class:`TileOp` as LLVM's x86 AMX intrinsics with the tile numbers as immediates
        (``llvm.x86.ldtilecfg`` of a 64-byte configuration held in a private constant,
        ``tilezero``, ``tileloadd64``, ``tilestored64`` with the row stride in bytes, ``tdpbusd`` / ``tdpbsud``,
        ``tilerelease``)."""
        b = self.b
        i8, void = ir.IntType(8), ir.VoidType()
        imm = lambda t: ir.Constant(i8, t)
        if s.op == "config":
            cfg = bytearray(64)
            cfg[0] = 1                              # palette 1
            for t, (rows, colsb) in enumerate(s.shapes):
                cfg[16 + 2 * t:18 + 2 * t] = int(colsb).to_bytes(2, "little")
                cfg[48 + t] = rows
            name = "tf.tilecfg." + bytes(cfg).hex()
            g = self.m.globals.get(name)
            if g is None:
                at = ir.ArrayType(i8, 64)
                g = ir.GlobalVariable(self.m, at, name)
                g.global_constant = True
                g.linkage = "private"
                g.align = 64
                g.initializer = ir.Constant(at, bytearray(cfg))
            b.call(self._decl("llvm.x86.ldtilecfg", void, [PTR]), [b.bitcast(g, PTR)])
        elif s.op == "zero":
            b.call(self._decl("llvm.x86.tilezero", void, [i8]), [imm(s.tiles[0])])
        elif s.op in ("load", "store"):
            et = ltype(s.buf.dtype, True)
            p = b.gep(self._ptr(s.buf), [self.expr(s.index)], source_etype=et)
            stride = ir.Constant(I64, s.stride * s.buf.dtype.itemsize)
            name = "llvm.x86.tileloadd64" if s.op == "load" else "llvm.x86.tilestored64"
            b.call(self._decl(name, void, [i8, PTR, I64]), [imm(s.tiles[0]), b.bitcast(p, PTR), stride])
        elif s.op in ("dpbusd", "dpbsud"):
            b.call(self._decl(f"llvm.x86.t{s.op}", void, [i8, i8, i8]), [imm(t) for t in s.tiles])
        elif s.op == "release":
            b.call(self._decl("llvm.x86.tilerelease", void, []), [])
        else:
            raise CodegenError(f"kernel {self.k.name}: unknown tile operation {s.op!r}")

    def binop(self, op: str, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
        b = self.b
        if dt.is_float:
            if dt == DType.f16 and op in ("pow", "atan2", "rem"):
                f32 = _like(x.type, F32)
                return b.fptrunc(self.binop(op, DType.f32, b.fpext(x, f32), b.fpext(y, f32)), x.type)
            if op == "add": return b.fadd(x, y)
            if op == "sub": return b.fsub(x, y)
            if op == "mul": return b.fmul(x, y)
            if op == "div": return b.fdiv(x, y)
            if op == "rem": return b.frem(x, y)
            if op == "min": return b.call(self._intrinsic("minimum", x.type, 2), [x, y])
            if op == "max": return b.call(self._intrinsic("maximum", x.type, 2), [x, y])
            if op == "pow": return b.call(self._intrinsic("pow", x.type, 2), [x, y])
            if op == "atan2":
                if isinstance(x.type, ir.VectorType):
                    f = self._libm("atan2", x.type.element, 2)
                    return self._scalarised(x, lambda u, v: b.call(f, [u, v]), y)
                return b.call(self._libm("atan2", x.type, 2), [x, y])
            if op == "ne": return b.fcmp_unordered("!=", x, y)
            if op in _FCMP: return b.fcmp_ordered(_FCMP[op], x, y)
            raise CodegenError(f"kernel {self.k.name}: float op {op} unsupported")
        signed = dt.is_signed and dt != DType.bool
        if (op in _FOLD and isinstance(x, ir.Constant) and isinstance(y, ir.Constant) and x.type == I64
                and isinstance(x.constant, int) and isinstance(y.constant, int)
                and 0 <= x.constant < 1 << 31 and 0 <= y.constant < 1 << 31
                and (op not in ("div", "rem") or y.constant > 0) and (op != "sub" or x.constant >= y.constant)):
            # index arithmetic on constants (unrolled tiles): folded here, not left to LLVM
            return ir.Constant(I64, _FOLD[op](x.constant, y.constant))
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
                minv = ir.Constant(x.type, -(1 << (_elem(x.type).width - 1)))
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
            big = b.icmp_unsigned(">=", y, ir.Constant(y.type, _elem(x.type).width))
            return b.select(big, ir.Constant(x.type, 0), b.shl(x, y))
        if op == "shr":
            big = b.icmp_unsigned(">=", y, ir.Constant(y.type, _elem(x.type).width))
            return b.select(big, ir.Constant(x.type, 0), b.ashr(x, y) if signed else b.lshr(x, y))
        if op == "pow":
            f64 = _like(x.type, ir.DoubleType())
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
                return b.fptrunc(self.unop(op, DType.f32, b.fpext(x, _like(x.type, F32))), x.type)
            if dt == DType.f32 and op in ("exp", "log", "erf", "tanh"):
                v = vmath.emit_unary(b, op, x, self.avx512)   # inline, vectorisable (codegen/llvm/vmath.py)
                if v is not None:
                    return v
            if op in _INTRINSIC_UNARY:
                return b.call(self._intrinsic(_INTRINSIC_UNARY[op], x.type), [x])
            if op in _LIBM_UNARY:
                if isinstance(x.type, ir.VectorType):
                    f = self._libm(op, x.type.element)
                    return self._scalarised(x, lambda lane: b.call(f, [lane]))
                return b.call(self._libm(op, x.type), [x])
            raise CodegenError(f"kernel {self.k.name}: float op {op} unsupported")
        if op == "neg": return b.neg(x)
        if op == "not": return b.not_(x)
        if op == "abs":
            if not dt.is_signed:
                return x
            return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x)
        if op in ("isnan", "isinf"):       # false, in every lane of a vector
            t = _like(x.type, I1)
            return ir.Constant(t, [0] * t.count if isinstance(t, ir.VectorType) else 0)
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
        t = _like(x.type, ltype(dst))
        if dst == DType.bool:
            if src.is_float:
                return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
            return b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
        if src.is_float and dst.is_float:
            if src == DType.f64 and dst == DType.f16:
                if isinstance(x.type, ir.VectorType):
                    return self._scalarised(x, lambda u: b.fptrunc(self._f64_to_f32_round_odd(u), t.element))
                return b.fptrunc(self._f64_to_f32_round_odd(x), t)
            return b.fpext(x, t) if src.itemsize < dst.itemsize else b.fptrunc(x, t)
        if src.is_float:
            if src == DType.f16:
                x, src = b.fpext(x, _like(x.type, F32)), DType.f32
            if isinstance(x.type, ir.VectorType) and dst.itemsize <= 2:
                return self._narrow_sat_vector(x, dst)
            name = "fptosi" if dst.is_signed else "fptoui"
            t = _like(x.type, ltype(dst))     # (a vector's element type, not the vector)
            f = self._decl(f"llvm.{name}.sat.{_suffix(t)}.{_suffix(x.type)}", t, [x.type])
            return b.call(f, [x])
        if dst.is_float:
            if src == DType.bool or not src.is_signed:
                return b.uitofp(x, t)
            return b.sitofp(x, t)
        # int -> int
        if _elem(x.type).width > _elem(t).width:
            return b.trunc(x, t)
        if _elem(x.type).width < _elem(t).width:
            return b.sext(x, t) if (src.is_signed and src != DType.bool) else b.zext(x, t)
        return x

    # -- statements -------------------------------------------------------------------------
    def stmts(self, body) -> None:
        for s in body:
            self.stmt(s)

    def top(self, body) -> None:
        """The kernel body as phases (module docstring): a statement holding the parallel loop
        is a phase of many chunks; a run of statements that store to global memory (with the
        statements between them that fill only locals) is a phase of one chunk; a run of
        statements that fill only locals is executed by every thread (each fills its own copy)
        once the earlier phases are done. Where a run of one chunk fills locals that a later
        statement reads (they would be set on one thread only), the whole body is one phase of
        one chunk."""
        kinds = [_statement_kind(s) for s in body]
        if self._once_fills_later_locals(body, kinds):
            kinds = ["once"] * len(kinds)
        i = 0
        while i < len(body):
            if kinds[i] == "parallel":
                self._parallel_phase(body[i])
                i += 1
                continue
            j = i
            while j < len(body) and kinds[j] != "parallel":
                j += 1
            run = body[i:j]
            if "once" in kinds[i:j]:
                self._phase(ir.Constant(I64, 1), lambda _i, run=run: self.stmts(run))
            else:
                self._wait_earlier_phases()
                self.stmts(run)
            i = j

    @staticmethod
    def _once_fills_later_locals(body, kinds) -> bool:
        """Whether a run of statements holding a one-chunk phase fills locals that a statement
        after the run reads."""
        i = 0
        while i < len(body):
            j = i
            while j < len(body) and kinds[j] != "parallel":
                j += 1
            if "once" in kinds[i:j]:
                written = {id(st.buf) for st in _stores_in(body[i:j]) if st.buf.scope == "local"}
                if written and any(id(ld.buf) in written for ld in _loads_in(body[j:])):
                    return True
            i = max(j, i + 1)
        return False

    def _parallel_phase(self, s) -> None:
        """A perfect nest whose parallel loop is split into chunks; the loops above it (serial)
        run whole inside each chunk, as each thread ran them over its own range before."""
        b = self.b
        nest = _perfect_nest(s)
        par = next(f for f in nest if f.kind == "parallel")
        start = self.expr(par.start)
        stop = self.expr(par.extent)
        total = b.sub(stop, start)
        parts = b.mul(self.nth, self.cpt)
        # n = min(parts, total) chunks whose sizes differ by at most one iteration (chunk i:
        # [i total / n, (i + 1) total / n)), so each thread's range of chunks holds total / T
        # iterations give or take one: chunks of ceil(total / parts) iterations gave a 14-task
        # loop 8 and 6 (28 tasks: 16 and 12) at 2 threads
        one = ir.Constant(I64, 1)
        n = b.select(b.icmp_signed("<", total, parts), total, parts)
        n = b.select(b.icmp_signed("<", total, one), ir.Constant(I64, 0), n)
        div = b.select(b.icmp_signed("<", n, one), one, n)

        def chunk(i):
            lo = b.add(start, b.sdiv(b.mul(i, total), div))
            hi = b.add(start, b.sdiv(b.mul(b.add(i, one), total), div))
            self.chunk = (lo, hi)
            self.split_ok = True
            self.stmt(s)
            self.split_ok = False
            self.store_fence()
        self._phase(n, chunk)

    def store_fence(self) -> None:
        """SFENCE where the kernel may stream stores (:attr:`Kernel.stream`): its non-temporal
        stores are weakly ordered, so each chunk's become visible before the chunk is reported
        done (and the kernel's before it returns)."""
        if self.k.stream:
            self.b.call(self._decl("llvm.x86.sse.sfence", ir.VoidType(), []), [])

    def _phase(self, n: ir.Value, chunk) -> None:
        """Claim chunks of a phase of ``n`` until none is left, running ``chunk(i)`` (which
        emits the code of chunk ``i``) for each, then report them done at once (``tf_phase_end``).
        First a thread waits until the earlier phases are done (so it never holds a chunk while
        it waits). Null team: chunks 0..n-1 in order."""
        b = self.b
        team = self.fn.args[1]
        claim, wait, end = phase_helpers(self.m)
        b.call(wait, [team, n])
        pre = b.block
        head = self.fn.append_basic_block("phase.head")
        body = self.fn.append_basic_block("phase.body")
        exit_ = self.fn.append_basic_block("phase.exit")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name="mine")
        k.add_incoming(ir.Constant(I64, 0), pre)
        i = b.call(claim, [team, n, k], name="chunk")
        b.cbranch(b.icmp_signed("<", i, ir.Constant(I64, 0)), exit_, body)
        b.position_at_end(body)
        chunk(i)
        k.add_incoming(b.add(k, ir.Constant(I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(exit_)
        b.call(end, [team, n, k])

    def _wait_earlier_phases(self) -> None:
        self.b.call(phase_helpers(self.m)[1], [self.fn.args[1], ir.Constant(I64, 0)])

    def stmt(self, s) -> None:
        b = self.b
        if isinstance(s, Store):
            v = self.expr(s.value)
            lanes = s.value.lanes
            if s.buf.dtype == DType.bool:
                v = b.zext(v, ltype(DType.bool, True, lanes))
            et = ltype(s.buf.dtype, True)
            p = b.gep(self._ptr(s.buf), [self.expr(s.index)], source_etype=et)
            if lanes > 1 and s.stride != 1:              # a scatter: one store per lane
                for ln in range(lanes):
                    q = b.gep(p, [ir.Constant(I64, ln * s.stride)], source_etype=et)
                    _store(b, b.extract_element(v, ir.Constant(ir.IntType(32), ln)), q, s.buf.dtype.itemsize)
            elif s.buf.name in self.k.stream and _streams(s, lanes):
                _store(b, v, p, lanes * s.buf.dtype.itemsize, nontemporal=True)
            else:
                _store(b, v, p, s.buf.dtype.itemsize)
        elif isinstance(s, For):
            if s.kind not in ("serial", "parallel", "vectorize", "unroll"):
                raise CodegenError(f"kernel {self.k.name}: loop kind {s.kind!r} has no LLVM lowering"
                                   + (" (a GPU loop kind)" if s.kind in GPU_LOOP_KINDS else ""))
            if s.kind == "unroll":
                self._unrolled(s)
                return
            start = self.expr(s.start)
            stop = self.expr(s.extent)
            if s.kind == "parallel" and self.split_ok:
                self.split_ok = False
                start, stop = self.chunk          # the claimed chunk of [start, stop)
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
            latch = b.branch(header)
            if self.keep_outer_loops and any(f.kind != "unroll" for f in all_loops(s.body)):
                latch.set_metadata("llvm.loop", self._loop_id("llvm.loop.unroll.disable"))
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
        elif isinstance(s, Prefetch):
            et = ltype(s.buf.dtype, True)
            p = b.gep(self._ptr(s.buf), [self.expr(s.index)], source_etype=et)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            f = self._decl("llvm.prefetch.p0", ir.VoidType(), [i8p, i32, i32, i32])
            # (address, 0 = read, locality, 1 = data cache)
            b.call(f, [b.bitcast(p, i8p), ir.Constant(i32, 0), ir.Constant(i32, s.locality), ir.Constant(i32, 1)])
        elif isinstance(s, TileOp):
            self.tile_op(s)
        elif isinstance(s, Barrier):
            raise CodegenError(f"kernel {self.k.name}: a barrier (GPU only) has no LLVM lowering")
        else:
            raise CodegenError(f"kernel {self.k.name}: unknown statement {s!r}")

    def _unrolled(self, s: For) -> None:
        if not (isinstance(s.start, Const) and isinstance(s.extent, Const)):
            raise CodegenError(f"kernel {self.k.name}: unroll loop {s.var.name} needs constant bounds")
        n = int(s.extent.value) - int(s.start.value)
        if n > MAX_UNROLL:
            raise CodegenError(f"kernel {self.k.name}: unroll loop {s.var.name} has {n} iterations "
                               f"(at most {MAX_UNROLL})")
        for i in range(int(s.start.value), int(s.extent.value)):
            self.vars[id(s.var)] = ir.Constant(I64, i)
            # a pass's expressions read the loop variable: values memoised by an earlier pass in
            # the same basic block (a straight-line body) must not be reused
            self._memo, self._memo_block = {}, None
            self.stmts(s.body)


def _elem(t: ir.Type) -> ir.Type:
    return t.element if isinstance(t, ir.VectorType) else t


def _like(shape_of: ir.Type, scalar: ir.Type) -> ir.Type:
    """``scalar`` as a vector of ``shape_of``'s width when that is a vector type."""
    return ir.VectorType(scalar, shape_of.count) if isinstance(shape_of, ir.VectorType) else scalar


def _suffix(t: ir.Type) -> str:
    """LLVM's intrinsic type suffix: f32, f64, f16, i32, v8f32 ..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    return {"float": "f32", "double": "f64", "half": "f16"}[str(t)]


def _splat(b: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    i32 = ir.IntType(32)
    v = b.insert_element(ir.Constant(ir.VectorType(x.type, lanes), ir.Undefined), x, ir.Constant(i32, 0))
    return b.shuffle_vector(v, ir.Constant(ir.VectorType(x.type, lanes), ir.Undefined),
                            ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))


def kernel_is_parallel(kernel: Kernel) -> bool:
    """Whether any top-level statement of ``kernel`` splits its iterations across threads."""
    return any(statement_is_parallel(s) for s in kernel.body)


def _team_shape(b: ir.IRBuilder, team: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(team size, chunks per thread) from the team record; (1, 1) when ``team`` is null (a
    parallel loop is then one chunk)."""
    null = b.icmp_unsigned("==", team, ir.Constant(PTR, None))
    with b.if_else(null) as (alone, shared):
        with alone:
            a_blk = b.block
        with shared:
            nth = b.load(_field(b, team, "nthreads"), typ=I64)
            cpt = b.load(_field(b, team, "chunks_per_thread"), typ=I64)
            s_blk = b.block
    n = b.phi(I64, name="nthreads")
    n.add_incoming(ir.Constant(I64, 1), a_blk)
    n.add_incoming(nth, s_blk)
    c = b.phi(I64, name="chunks_per_thread")
    c.add_incoming(ir.Constant(I64, 1), a_blk)
    c.add_incoming(cpt, s_blk)
    return n, c


def _field(b: ir.IRBuilder, team: ir.Value, name: str) -> ir.Value:
    """The address of a team record field (:data:`TEAM_FIELDS`)."""
    return b.gep(team, [ir.Constant(I64, TEAM_FIELDS.index(name))], source_etype=I64)


class _LoopID(ir.values.MDValue):
    """A loop ID node (it is its own first operand): compared and hashed by identity, as
    llvmlite's operand-wise comparison of metadata would recurse into itself."""

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__


def _perfect_nest(s) -> list:
    """The loops of a top-level perfect nest down to its first parallel one."""
    out = []
    while isinstance(s, For):
        out.append(s)
        if s.kind == "parallel" or len(s.body) != 1:
            break
        s = s.body[0]
    return out


def _statement_kind(s) -> str:
    """How :meth:`_FnEmitter.top` runs a top-level statement: "parallel" (a phase of chunks of
    its parallel loop), "once" (in a phase of one chunk: it stores to global memory, or its
    parallel loop's bounds read loop variables or memory, so that threads could not agree on
    the chunks) or "every" (it fills only locals: every thread runs it)."""
    if statement_is_parallel(s):
        par = _perfect_nest(s)[-1]
        if not any(isinstance(e, (Var, Load)) for x in (par.start, par.extent) for e in expr_nodes(x)):
            return "parallel"
        return "once"
    return "once" if runs_on_thread0_only(s) else "every"


def _stores_in(stmts):
    return (s for s in walk_stmts(stmts) if isinstance(s, Store))


def _loads_in(stmts):
    for s in stmts:
        exprs = [s.index, s.value] if isinstance(s, Store) else [s.start, s.extent] if isinstance(s, For) \
            else [s.cond] if isinstance(s, If) else []
        for x in exprs:
            yield from (e for e in expr_nodes(x) if isinstance(e, Load))
        if isinstance(s, For):
            yield from _loads_in(s.body)
        elif isinstance(s, If):
            yield from _loads_in(s.then)
            yield from _loads_in(s.orelse)


#: the narrowest vector store that streams past the caches (:attr:`Kernel.stream`): a half
#: line (AVX2's 8 floats; two in a row fill the line's write-combining buffer)
STREAM_MIN_BYTES = 32


def _streams(s: Store, lanes: int) -> bool:
    """Whether store ``s`` of a streamed buffer is non-temporal: a contiguous vector of a power
    of two bytes, at least :data:`STREAM_MIN_BYTES` and at most a line, at an element offset
    whose known factors of two make it a multiple of its own size (the buffer starts on a
    cache line), so LLVM can give it the aligned VMOVNTPS / VMOVNTDQ."""
    nbytes = lanes * s.buf.dtype.itemsize
    return (s.stride == 1 and STREAM_MIN_BYTES <= nbytes <= 64 and not nbytes & (nbytes - 1)
            and pow2_multiple(s.index) * s.buf.dtype.itemsize % nbytes == 0)


def pow2_multiple(e, cap: int = 1 << 12) -> int:
    """The largest power of two (at most ``cap``) that divides the integer index ``e`` for every
    value of its variables: constants by their own factors of two, sums by the smaller of their
    terms', products by the product, shifts left by a constant by the shift; anything else 1."""
    if isinstance(e, Const):
        v = int(e.value)
        return cap if v == 0 else min(cap, v & -v)
    if isinstance(e, Cast):
        return pow2_multiple(e.a, cap)
    if isinstance(e, Bin):
        if e.op in ("add", "sub"):
            return min(pow2_multiple(e.a, cap), pow2_multiple(e.b, cap))
        if e.op == "mul":
            return min(cap, pow2_multiple(e.a, cap) * pow2_multiple(e.b, cap))
        if e.op == "shl" and isinstance(e.b, Const):
            return min(cap, pow2_multiple(e.a, cap) << int(e.b.value))
    return 1


def _store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, align: int, nontemporal: bool = False) -> None:
    # IRBuilder.store compares typed pointees (an alloca's), which vector stores do not match
    from llvmlite.ir import instructions
    st = instructions.StoreInstr(b.block, value, ptr)
    st.align = align
    b._insert(st)
    if nontemporal:
        st.set_metadata("nontemporal", b.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


def _store_atomic(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, ordering: str) -> None:
    # IRBuilder.store_atomic still compares typed pointees, which opaque pointers lack
    from llvmlite.ir import instructions
    b._insert(instructions.StoreAtomicInstr(b.block, value, ptr, ordering, value.type.width // 8))


def _sched_yield(module: ir.Module) -> ir.Function:
    return module.globals.get("sched_yield") or ir.Function(
        module, ir.FunctionType(ir.IntType(32), []), name="sched_yield")


#: a thread waiting for the earlier phases' chunks polls this many times (``pause`` between
#: polls) before each ``sched_yield``
PHASE_SPINS = 2000


def phase_helpers(module: ir.Module) -> tuple[ir.Function, ir.Function, ir.Function]:
    """The phase protocol's internal functions (``tf_claim``, ``tf_wait``, ``tf_phase_end``),
    added to ``module`` once.

    The team shares counters (the block at team field ``sync``, ``runtime.threads``
    ``sync_claimed_word``): for each thread ``r`` the slots claimed of its range, and the
    slots done; they only grow. A phase of ``n`` chunks over ``T`` threads has ``S = ceil(n /
    T)`` slots in each thread's range; range ``r`` holds chunks ``[ceil(r n / T), ceil((r + 1)
    n / T))``, so its last slot may be empty. A thread's ``base`` field is the count of slots
    of every phase before its next one (the runtime sets it at the start of each job: the done
    count); each range's counter stood at ``base / T`` when the phase began.

    - ``i64 tf_claim(ptr team, i64 n, i64 mine)``: for range r = tid, tid + 1, ... (mod T):
      while its counter c < base / T + S, compare-and-swap it to c + 1; the slot's chunk is
      returned, an empty slot is counted in the thread's ``empty`` field and the claiming goes
      on.
      -1 when every range is claimed. So a thread runs its own range front to back and then
      helps the others, and with kernels that split their loops alike the same thread writes
      and later reads each part of an activation. A late thread's base is an old phase's,
      whose ranges are all claimed: it gets -1. Null team: chunk ``mine`` (the chunks this
      thread ran of the phase) while below ``n``. A thread whose ``claims`` field is 0 (tests:
      ``ThreadTeam.set_claims``) always gets -1.
    - ``void tf_wait(ptr team, i64 n)``: until done >= base (acquire; the chunk writers
      release), so what every earlier phase wrote is visible and what it read may be
      overwritten. Called before claiming, so a thread never holds a chunk while it waits.
      Polls with ``pause``, calling ``sched_yield`` every :data:`PHASE_SPINS` polls.
    - ``void tf_phase_end(ptr team, i64 n, i64 ran)``: done += ``ran`` (the chunks this thread
      ran of the phase) + its empty slots (release; one atomic add per thread and phase, not
      per chunk: the done count's cache line moves between the cores once per thread and
      phase, about 0.2 us each on the 2-vCPU machine of issue 22), then empty = 0,
      ``chunks_run`` += ran and base += T S. A thread reports its chunks only when it finds no
      more to claim; the others wait for its last chunk in any case, so they wait no longer.

    Every thread sees the same phases with the same ``n`` (from constants, the team size and
    its chunks per thread), so the bases agree. Null team: wait, done and end do nothing."""
    names = ("tf_claim", "tf_wait", "tf_phase_end")
    if module.globals.get(names[0]) is not None:
        return tuple(module.globals[n] for n in names)
    x86 = _is_x86()
    claim = ir.Function(module, ir.FunctionType(I64, [PTR, I64, I64]), name="tf_claim")
    wait = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64]), name="tf_wait")
    end = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name="tf_phase_end")
    for f in (claim, wait, end):
        f.linkage = "internal"
    wait.attributes.add("noinline")
    zero, one, minus = ir.Constant(I64, 0), ir.Constant(I64, 1), ir.Constant(I64, -1)

    def null_or(fn, b, team, solo_block):
        shared = fn.append_basic_block("shared")
        b.cbranch(b.icmp_unsigned("==", team, ir.Constant(PTR, None)), solo_block, shared)
        b.position_at_end(shared)

    def counter(b, team, word):
        """The address of int64 ``word`` (a constant or an i64 value) of the shared block."""
        sync = b.load(_field(b, team, "sync"), typ=PTR)
        return b.gep(sync, [ir.Constant(I64, word) if isinstance(word, int) else word], source_etype=I64)

    def range_counter(b, team, r):
        """The claimed counter of thread ``r``'s range (``runtime.threads.sync_claimed_word``)."""
        return counter(b, team, b.select(b.icmp_signed("==", r, zero), ir.Constant(I64, SYNC_CLAIMED),
                                         b.mul(b.add(r, one), ir.Constant(I64, 8))))

    # tf_claim
    team, n, mine = claim.args
    b = ir.IRBuilder(claim.append_basic_block("entry"))
    solo = claim.append_basic_block("solo")
    none = claim.append_basic_block("none")
    null_or(claim, b, team, solo)
    claims = claim.append_basic_block("claims")
    b.cbranch(b.icmp_signed("==", b.load(_field(b, team, "claims"), typ=I64), zero), none, claims)
    b.position_at_end(claims)
    nth = b.load(_field(b, team, "nthreads"), typ=I64)
    tid = b.load(_field(b, team, "tid"), typ=I64)
    per = b.sdiv(b.add(n, b.sub(nth, one)), nth)                  # S = ceil(n / nthreads)
    rbase = b.sdiv(b.load(_field(b, team, "base"), typ=I64), nth)
    rlast = b.add(rbase, per)
    jloop = claim.append_basic_block("range")
    rsel = claim.append_basic_block("select")
    cl = claim.append_basic_block("loop")
    try_ = claim.append_basic_block("try")
    fail = claim.append_basic_block("fail")
    got = claim.append_basic_block("got")
    real = claim.append_basic_block("real")
    phantom = claim.append_basic_block("phantom")
    jnext = claim.append_basic_block("next")
    b.branch(jloop)
    b.position_at_end(jloop)
    j = b.phi(I64, name="j")
    j.add_incoming(zero, claims)
    b.cbranch(b.icmp_signed("<", j, nth), rsel, none)
    b.position_at_end(rsel)
    r = b.add(tid, j)
    r = b.select(b.icmp_signed(">=", r, nth), b.sub(r, nth), r)   # own range first, then the next
    word = range_counter(b, team, r)
    c0 = b.load_atomic(word, "monotonic", 8, typ=I64)
    b.branch(cl)
    b.position_at_end(cl)
    c = b.phi(I64, name="claimed")
    c.add_incoming(c0, rsel)
    b.cbranch(b.icmp_signed(">=", c, rlast), jnext, try_)
    b.position_at_end(try_)
    res = b.cmpxchg(word, c, b.add(c, one), "monotonic", "monotonic")
    b.cbranch(b.extract_value(res, 1), got, fail)
    b.position_at_end(fail)
    c.add_incoming(b.extract_value(res, 0), fail)
    b.branch(cl)
    b.position_at_end(got)

    def ceil_part(k):                                              # ceil(k n / T)
        return b.sdiv(b.add(b.mul(k, n), b.sub(nth, one)), nth)
    lo = ceil_part(r)                                              # range r: [ceil(r n / T), ceil((r + 1) n / T))
    hi = ceil_part(b.add(r, one))
    off = b.sub(c, rbase)
    b.cbranch(b.icmp_signed("<", off, b.sub(hi, lo)), real, phantom)
    b.position_at_end(real)
    b.ret(b.add(lo, off))
    b.position_at_end(phantom)                                    # a slot past the range: done at phase end
    ep = _field(b, team, "empty")
    b.store(b.add(b.load(ep, typ=I64), one), ep)
    c.add_incoming(b.add(c, one), phantom)
    b.branch(cl)
    b.position_at_end(jnext)
    j.add_incoming(b.add(j, one), jnext)
    b.branch(jloop)
    b.position_at_end(none)
    b.ret(minus)
    b.position_at_end(solo)
    b.ret(b.select(b.icmp_signed("<", mine, n), mine, minus))

    # tf_wait
    team, n = wait.args
    b = ir.IRBuilder(wait.append_basic_block("entry"))
    out = wait.append_basic_block("out")
    null_or(wait, b, team, out)
    base = b.load(_field(b, team, "base"), typ=I64)
    word = counter(b, team, SYNC_DONE)
    pre = b.block
    poll = wait.append_basic_block("poll")
    again = wait.append_basic_block("again")
    yld = wait.append_basic_block("yield")
    b.branch(poll)
    b.position_at_end(poll)
    k = b.phi(I64, name="k")
    k.add_incoming(zero, pre)
    d = b.load_atomic(word, "acquire", 8, typ=I64)
    b.cbranch(b.icmp_signed(">=", d, base), out, again)
    b.position_at_end(again)
    if x86:
        b.call(_pause(module), [])
    k1 = b.add(k, one)
    k.add_incoming(k1, again)
    b.cbranch(b.icmp_signed(">=", k1, ir.Constant(I64, PHASE_SPINS)), yld, poll)
    b.position_at_end(yld)
    b.call(_sched_yield(module), [])
    k.add_incoming(zero, yld)
    b.branch(poll)
    b.position_at_end(out)
    b.ret_void()

    # tf_phase_end
    team, n, ran = end.args
    b = ir.IRBuilder(end.append_basic_block("entry"))
    out = end.append_basic_block("out")
    null_or(end, b, team, out)
    ep = _field(b, team, "empty")
    fin = b.add(ran, b.load(ep, typ=I64))
    report = end.append_basic_block("report")
    bump = end.append_basic_block("base")
    b.cbranch(b.icmp_signed(">", fin, zero), report, bump)
    b.position_at_end(report)
    b.atomic_rmw("add", counter(b, team, SYNC_DONE), fin, "release")
    b.store(zero, ep)
    rp = _field(b, team, "chunks_run")
    b.store(b.add(b.load(rp, typ=I64), ran), rp)
    b.branch(bump)
    b.position_at_end(bump)
    bp = _field(b, team, "base")
    nth = b.load(_field(b, team, "nthreads"), typ=I64)
    slots = b.mul(b.sdiv(b.add(n, b.sub(nth, one)), nth), nth)   # S slots in each range
    b.store(b.add(b.load(bp, typ=I64), slots), bp)
    b.branch(out)
    b.position_at_end(out)
    b.ret_void()
    return claim, wait, end


def _is_x86() -> bool:
    from llvmlite import binding
    return binding.get_process_triple().startswith(("x86_64", "i686", "i386"))     # the code runs here


def _pause(module: ir.Module) -> ir.Function:
    return module.globals.get("llvm.x86.sse2.pause") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), []), name="llvm.x86.sse2.pause")


#: the thread team's native helpers (:func:`emit_team_helpers`; runtime/threads.py calls them)
TEAM_HELPERS = ("tf_spin", "tf_xchg", "tf_load", "tf_worker", "tf_lead", "tf_publish")
#: ... and where the process runs on Linux (x86-64 or AArch64), the workers' native sleep and wake
#: (futex): :func:`emit_team_helpers`
TEAM_SLEEP_HELPERS = ("tf_serve", "tf_wake")
#: the ``futex`` system call's number by architecture (Linux), and its private wait / wake operations
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129


def futex_syscall() -> int | None:
    """The ``futex`` system call number of the process's platform, or None (not Linux, or an
    architecture not in :data:`FUTEX_SYSCALL`): the workers then sleep on Python semaphores."""
    import sys

    from llvmlite import binding
    if not sys.platform.startswith("linux"):
        return None
    return FUTEX_SYSCALL.get(binding.get_process_triple().split("-")[0])
#: ``sched_yield`` every this many polls of a team helper's wait
SPIN_YIELD_EVERY = 2048


def _poll_wait(module: ir.Module, b: ir.IRBuilder, fn: ir.Function, k: ir.Value, t0: ir.Value,
               ticks: ir.Value, again: ir.Block, out: ir.Block) -> ir.Value:
    """One wait step of a polling loop: ``pause`` (x86), a ``sched_yield`` every
    :data:`SPIN_YIELD_EVERY` polls, then to ``again`` while fewer than ``ticks`` of
    ``llvm.readcyclecounter`` have passed since ``t0``, else to ``out``. Returns k + 1."""
    if _is_x86():
        b.call(_pause(module), [])
    k1 = b.add(k, ir.Constant(I64, 1))
    yld = fn.append_basic_block("yield")
    nxt = fn.append_basic_block("next")
    b.cbranch(b.icmp_signed("==", b.and_(k1, ir.Constant(I64, SPIN_YIELD_EVERY - 1)), ir.Constant(I64, 0)), yld, nxt)
    b.position_at_end(yld)
    b.call(_sched_yield(module), [])
    b.branch(nxt)
    b.position_at_end(nxt)
    dt = b.sub(b.call(_cycle_counter(module), []), t0)
    b.cbranch(b.icmp_unsigned("<", dt, ticks), again, out)
    return k1


def _cycle_counter(module: ir.Module) -> ir.Function:
    return module.globals.get("llvm.readcyclecounter") or ir.Function(
        module, ir.FunctionType(I64, []), name="llvm.readcyclecounter")


def emit_team_helpers(module: ir.Module) -> None:
    """Add the thread team's native helpers (``runtime/threads.py``, which calls them through
    ctypes, the GIL released) to ``module``, so a saved module carries them. The control block
    ``ctl`` is int64 words: 0 the job sequence (odd while a job is being published), 1 the
    job's entry, 2 its slot table, 3 its base (the chunks done before it: see
    :func:`phase_helpers`), ``8 t`` the last job worker ``t`` finished.

    - ``i64 tf_spin(ptr word, i64 value, i64 equal, i64 ticks)``: poll the int64 at ``word``
      (acquire loads; :func:`_poll_wait` between polls) until ``(*word == value) == equal``
      (returns 1) or ``ticks`` of the cycle counter have passed (returns 0);
    - ``i64 tf_xchg(ptr word, i64 value)`` (a sequentially consistent exchange, returning the
      old value) and ``i64 tf_load(ptr word)`` (a sequentially consistent load);
    - ``void tf_publish(ptr ctl, i64 entry, i64 slots, i64 base, i64 seq)``: publish job
      ``seq`` (even) as a sequence lock: ``ctl[0] = seq - 1``, a release fence, the three
      words, then ``ctl[0] = seq`` (release);
    - ``i64 tf_worker(ptr ctl, ptr team, i64 t, i64 last, i64 ticks)``: worker ``t``'s job loop:
      whenever ``ctl[0]`` (acquire) is even and differs from ``last`` it reads the job's words,
      an acquire fence, and ``ctl[0]`` again (retrying if it changed, so entry, slots and base
      are one job's), sets its record's ``base``, calls the entry with the slot table and
      ``team``, then publishes the sequence number in ``ctl[8 t]`` (release); it returns the
      last sequence it ran once ``ticks`` pass without a new job. It never waits for another
      thread: a job is over for it when it finds no chunk left to claim;
    - ``void tf_lead(i64 entry, ptr slots, ptr team, i64 base)``: the calling thread's part of a
      job: its ``base``, the entry, then a wait until every chunk of the job is done;
    - on Linux (:func:`futex_syscall`; :data:`TEAM_SLEEP_HELPERS`) ``i64 tf_serve(ptr ctl, ptr
      team, i64 t)``: worker ``t``'s whole life, natively, so that waking it never needs
      Python's GIL: ``tf_worker`` with ``ctl[CTL_TICKS]`` ticks; when it returns idle, unless
      ``ctl[CTL_CLOSED]`` is set, the worker sets its sleeping flag ``ctl[8 t + 1]``, reads the
      sequence once more (a job came: flag cleared, back to work) and waits on the flag's low
      32 bits with ``futex(FUTEX_WAIT_PRIVATE, 1)`` while it is 1; returns the last sequence it
      ran once closed; and ``void tf_wake(ptr ctl, i64 first, i64 end)``: for each worker
      ``first`` .. ``end`` - 1 (the team: 1 .. size - 1),
      clear its flag (an exchange) and, where it was set, ``futex(FUTEX_WAKE_PRIVATE)`` it. The
      flag is exchanged and the sequence read sequentially consistently on both sides, and the
      futex wait compares the flag in the kernel, so no wake is lost."""
    if module.globals.get("tf_lead") is not None:
        return
    spin = ir.Function(module, ir.FunctionType(I64, [PTR, I64, I64, I64]), name="tf_spin")
    word, value, equal, ticks = spin.args
    b = ir.IRBuilder(spin.append_basic_block("entry"))
    t0 = b.call(_cycle_counter(module), [])
    loop = spin.append_basic_block("loop")
    wait = spin.append_basic_block("wait")
    yes = spin.append_basic_block("yes")
    no = spin.append_basic_block("no")
    entry = b.block
    b.branch(loop)
    b.position_at_end(loop)
    k = b.phi(I64, name="k")
    k.add_incoming(ir.Constant(I64, 0), entry)
    v = b.load_atomic(word, "acquire", 8, typ=I64)
    hit = b.icmp_signed("==", b.zext(b.icmp_signed("==", v, value), I64), equal)
    b.cbranch(hit, yes, wait)
    b.position_at_end(wait)
    k1 = _poll_wait(module, b, spin, k, t0, ticks, loop, no)
    k.add_incoming(k1, b.block)
    b.position_at_end(yes)
    b.ret(ir.Constant(I64, 1))
    b.position_at_end(no)
    b.ret(ir.Constant(I64, 0))

    xchg = ir.Function(module, ir.FunctionType(I64, [PTR, I64]), name="tf_xchg")
    b = ir.IRBuilder(xchg.append_basic_block("entry"))
    b.ret(b.atomic_rmw("xchg", xchg.args[0], xchg.args[1], "seq_cst"))
    load = ir.Function(module, ir.FunctionType(I64, [PTR]), name="tf_load")
    b = ir.IRBuilder(load.append_basic_block("entry"))
    b.ret(b.load_atomic(load.args[0], "seq_cst", 8, typ=I64))

    work = ir.Function(module, ir.FunctionType(I64, [PTR, PTR, I64, I64, I64]), name="tf_worker")
    ctl, team, tix, last0, ticks = work.args
    entry_t = ir.FunctionType(ir.VoidType(), [PTR, PTR]).as_pointer()
    b = ir.IRBuilder(work.append_basic_block("entry"))
    start = b.call(_cycle_counter(module), [])
    entry = b.block
    job = work.append_basic_block("job")
    loop = work.append_basic_block("loop")
    read = work.append_basic_block("read")
    run = work.append_basic_block("run")
    wait = work.append_basic_block("wait")
    out = work.append_basic_block("out")
    b.branch(job)
    b.position_at_end(job)
    last = b.phi(I64, name="last")
    tj = b.phi(I64, name="t0")
    last.add_incoming(last0, entry)
    tj.add_incoming(start, entry)
    b.branch(loop)
    b.position_at_end(loop)
    k = b.phi(I64, name="k")
    k.add_incoming(ir.Constant(I64, 0), job)
    seq = b.load_atomic(ctl, "acquire", 8, typ=I64)
    busy = b.or_(b.icmp_signed("==", seq, last), b.icmp_signed("!=", b.and_(seq, ir.Constant(I64, 1)), ir.Constant(I64, 0)))
    b.cbranch(busy, wait, read)
    b.position_at_end(read)
    words = [b.load_atomic(b.gep(ctl, [ir.Constant(I64, w)], source_etype=I64), "monotonic", 8, typ=I64)
             for w in (1, 2, 3)]
    b.fence("acquire")
    again = b.load_atomic(ctl, "monotonic", 8, typ=I64)
    b.cbranch(b.icmp_signed("==", again, seq), run, wait)      # torn: poll again
    b.position_at_end(run)
    b.store(words[2], _field(b, team, "base"))
    b.call(b.inttoptr(words[0], entry_t), [b.inttoptr(words[1], PTR), team])
    fin = b.gep(ctl, [b.mul(tix, ir.Constant(I64, 8))], source_etype=I64)
    _store_atomic(b, seq, fin, "release")
    end = b.call(_cycle_counter(module), [])
    last.add_incoming(seq, b.block)
    tj.add_incoming(end, b.block)
    b.branch(job)
    b.position_at_end(wait)
    k1 = _poll_wait(module, b, work, k, tj, ticks, loop, out)
    k.add_incoming(k1, b.block)
    b.position_at_end(out)
    b.ret(last)

    pub = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, I64, I64]), name="tf_publish")
    ctl, fn_addr, slots, base, seq = pub.args
    b = ir.IRBuilder(pub.append_basic_block("entry"))
    _store_atomic(b, b.sub(seq, ir.Constant(I64, 1)), ctl, "monotonic")
    b.fence("release")
    for w, v in ((1, fn_addr), (2, slots), (3, base)):
        _store_atomic(b, v, b.gep(ctl, [ir.Constant(I64, w)], source_etype=I64), "monotonic")
    _store_atomic(b, seq, ctl, "release")
    b.ret_void()

    lead = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, PTR, PTR, I64]), name="tf_lead")
    fn_addr, slots, team, base = lead.args
    b = ir.IRBuilder(lead.append_basic_block("entry"))
    b.store(base, _field(b, team, "base"))
    b.call(b.inttoptr(fn_addr, entry_t), [slots, team])
    b.call(phase_helpers(module)[1], [team, ir.Constant(I64, 0)])
    b.ret_void()
    nr = futex_syscall()
    if nr is not None:
        _emit_sleep_helpers(module, work, nr)


def _emit_sleep_helpers(module: ir.Module, work: ir.Function, nr: int) -> None:
    """``tf_serve`` and ``tf_wake`` (:func:`emit_team_helpers`) with futex system call ``nr``."""
    syscall = module.globals.get("syscall") or ir.Function(
        module, ir.FunctionType(I64, [I64], var_arg=True), name="syscall")
    null = ir.Constant(PTR, None)

    def word(b, ctl, i):
        return b.gep(ctl, [ir.Constant(I64, i)], source_etype=I64)

    def flag_of(b, ctl, t):                       # worker t's sleeping flag: word 8 t + 1
        return b.gep(ctl, [b.add(b.mul(t, ir.Constant(I64, 8)), ir.Constant(I64, 1))], source_etype=I64)

    serve = ir.Function(module, ir.FunctionType(I64, [PTR, PTR, I64]), name="tf_serve")
    ctl, team, tix = serve.args
    b = ir.IRBuilder(serve.append_basic_block("entry"))
    flag = flag_of(b, ctl, tix)
    entry = b.block
    top = serve.append_basic_block("top")
    idle = serve.append_basic_block("idle")
    came = serve.append_basic_block("came")
    sleep = serve.append_basic_block("sleep")
    wait = serve.append_basic_block("wait")
    done = serve.append_basic_block("done")
    b.branch(top)
    b.position_at_end(top)
    last = b.phi(I64, name="last")
    last.add_incoming(ir.Constant(I64, 0), entry)
    run = serve.append_basic_block("run")
    quit_ = serve.append_basic_block("quit")
    closed0 = b.load_atomic(word(b, ctl, CTL_CLOSED), "acquire", 8, typ=I64)
    b.cbranch(b.icmp_signed("!=", closed0, ir.Constant(I64, 0)), quit_, run)
    b.position_at_end(quit_)
    b.ret(last)
    b.position_at_end(run)
    ticks = b.load_atomic(word(b, ctl, CTL_TICKS), "monotonic", 8, typ=I64)
    ran = b.call(work, [ctl, team, tix, last, ticks])
    closed = b.load_atomic(word(b, ctl, CTL_CLOSED), "acquire", 8, typ=I64)
    b.cbranch(b.icmp_signed("!=", closed, ir.Constant(I64, 0)), done, idle)
    b.position_at_end(idle)
    b.atomic_rmw("xchg", flag, ir.Constant(I64, 1), "seq_cst")
    seq = b.load_atomic(ctl, "seq_cst", 8, typ=I64)
    b.cbranch(b.icmp_signed("!=", seq, ran), came, sleep)
    b.position_at_end(came)                       # a job came meanwhile: awake again
    b.atomic_rmw("xchg", flag, ir.Constant(I64, 0), "seq_cst")
    last.add_incoming(ran, b.block)
    b.branch(top)
    b.position_at_end(sleep)
    up = b.load_atomic(flag, "seq_cst", 8, typ=I64)
    back = b.block
    last.add_incoming(ran, back)
    b.cbranch(b.icmp_signed("==", up, ir.Constant(I64, 0)), top, wait)
    b.position_at_end(wait)
    b.call(syscall, [ir.Constant(I64, nr), flag, ir.Constant(I64, FUTEX_WAIT_PRIVATE), ir.Constant(I64, 1), null])
    b.branch(sleep)
    b.position_at_end(done)
    b.ret(ran)

    wake = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name="tf_wake")
    ctl, first, size = wake.args
    b = ir.IRBuilder(wake.append_basic_block("entry"))
    entry = b.block
    loop = wake.append_basic_block("loop")
    call = wake.append_basic_block("call")
    nxt = wake.append_basic_block("next")
    out = wake.append_basic_block("out")
    b.branch(loop)
    b.position_at_end(loop)
    t = b.phi(I64, name="t")
    t.add_incoming(first, entry)
    b.cbranch(b.icmp_signed("<", t, size), call, out)
    b.position_at_end(call)
    f = flag_of(b, ctl, t)
    was = b.atomic_rmw("xchg", f, ir.Constant(I64, 0), "seq_cst")
    sys_blk = wake.append_basic_block("futex")
    b.cbranch(b.icmp_signed("==", was, ir.Constant(I64, 1)), sys_blk, nxt)
    b.position_at_end(sys_blk)
    b.call(syscall, [ir.Constant(I64, nr), f, ir.Constant(I64, FUTEX_WAKE_PRIVATE), ir.Constant(I64, 1)])
    b.branch(nxt)
    b.position_at_end(nxt)
    t.add_incoming(b.add(t, ir.Constant(I64, 1)), nxt)
    b.branch(loop)
    b.position_at_end(out)
    b.ret_void()


def emit_kernel(module: ir.Module, kernel: Kernel, avx512: bool = False) -> ir.Function:
    """Add one kernel to ``module``; raises CodegenError naming the kernel. ``avx512``: the
    target has AVX-512F (``Target.has_avx512``), so the inline math may use its instructions."""
    em = _FnEmitter(module, kernel, avx512)
    em.top(kernel.body)
    em.store_fence()
    em.b.ret_void()
    return em.fn


#: i64 ops :meth:`_FnEmitter.binop` folds when both operands are small non-negative constants
#: and so is the result (where C's and Python's results agree)
_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "div": lambda a, b: a // b, "rem": lambda a, b: a % b}


def emit_entry(module: ir.Module, name: str, calls: list[tuple[str, list[int]]],
               parallel: dict[str, bool] | None = None, team_helpers: bool = True) -> ir.Function:
    """``void @name(ptr %slots, ptr %team)``: calls each kernel with args gathered from the
    slot table. ``parallel[kernel]`` says whether a kernel splits work across the team: such a
    kernel gets the team (every thread calls it and takes part in its phases); a run of serial
    kernels is one phase of one chunk (:func:`phase_helpers`) whose claimer calls them with a
    null team. ``team_helpers``: also define :data:`TEAM_HELPERS` in ``module`` (False where
    they are linked in as ``jit.team_runtime_object``, as the backend does)."""
    parallel = parallel or {}
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    team = fn.args[1]
    width = max([len(s) for _, s in calls] + [1])
    args = b.alloca(PTR, size=width, name="args")
    claim, wait, end = phase_helpers(module)

    def call(kname, slots, with_team):
        for j, slot in enumerate(slots):
            p = b.load(b.gep(fn.args[0], [ir.Constant(I64, slot)], source_etype=PTR), typ=PTR)
            b.store(p, b.gep(args, [ir.Constant(I64, j)], source_etype=PTR))
        b.call(module.globals[kname], [args, team if with_team else ir.Constant(PTR, None)])

    i = 0
    while i < len(calls):
        if parallel.get(calls[i][0]):
            call(*calls[i], True)
            i += 1
            continue
        j = i
        while j < len(calls) and not parallel.get(calls[j][0]):
            j += 1
        b.call(wait, [team, ir.Constant(I64, 1)])
        pre = b.block
        head = fn.append_basic_block("serial.head")
        body = fn.append_basic_block("serial.body")
        exit_ = fn.append_basic_block("serial.exit")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name="mine")
        k.add_incoming(ir.Constant(I64, 0), pre)
        got = b.call(claim, [team, ir.Constant(I64, 1), k])
        b.cbranch(b.icmp_signed("<", got, ir.Constant(I64, 0)), exit_, body)
        b.position_at_end(body)
        for kname, slots in calls[i:j]:
            call(kname, slots, False)
        k.add_incoming(ir.Constant(I64, 1), b.block)
        b.branch(head)
        b.position_at_end(exit_)
        b.call(end, [team, ir.Constant(I64, 1), k])
        i = j
    b.ret_void()
    if team_helpers:
        emit_team_helpers(module)
    return fn


def _integral(e) -> bool:
    """Whether the float expression ``e`` holds only integers (or NaN, +-inf): a rounding
    (floor, ceil, round, trunc), an integer cast to float, an integral constant, and sums,
    differences, products, minima, maxima and selections of such (a float sum or product of
    integers rounds to an integer: every float of magnitude 2^24 and up is one). False where
    unsure."""
    if isinstance(e, Broadcast):
        return _integral(e.a)
    if isinstance(e, Const):
        return isinstance(e.value, (int, bool)) or float(e.value).is_integer()
    if isinstance(e, Un):
        return e.op in ("floor", "ceil", "round", "trunc")
    if isinstance(e, Cast):
        return not e.a.dtype.is_float or _integral(e.a)
    if isinstance(e, Bin):
        return e.op in ("add", "sub", "mul", "min", "max") and _integral(e.a) and _integral(e.b)
    if isinstance(e, Select):
        return _integral(e.a) and _integral(e.b)
    return False


def _int_range(dst: DType) -> tuple[int, int]:
    """(min, max) of the integer type ``dst``."""
    bits = 8 * dst.itemsize
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dst.is_signed else (0, (1 << bits) - 1)


#: the integer types a float vector narrows to through the 32-bit conversion
_NARROW_INTS = (DType.u8, DType.i8, DType.u16, DType.i16)


def _small_integral(e) -> bool:
    """Whether the f32 expression ``e`` is an integer of magnitude below 2^16 in every lane: an
    8- or 16-bit integer cast to float (a zero point), or such a constant, or a broadcast of
    one."""
    if isinstance(e, Broadcast):
        return _small_integral(e.a)
    if isinstance(e, Const):
        return float(e.value).is_integer() and abs(float(e.value)) < 65536
    if isinstance(e, Cast):
        return e.a.dtype.is_int and e.a.dtype.itemsize <= 2
    return False


def _nonneg_integral(e) -> bool:
    """Whether the small integral f32 expression ``e`` (:func:`_small_integral`) is also
    non-negative in every lane: an unsigned integer cast to float, a constant >= 0, or a
    broadcast of one."""
    if isinstance(e, Broadcast):
        return _nonneg_integral(e.a)
    if isinstance(e, Const):
        return float(e.value) >= 0
    if isinstance(e, Cast):
        return e.a.dtype.is_int and not e.a.dtype.is_signed and e.a.dtype.itemsize <= 2
    return False


def _rounded_plus_offset(e):
    """(a, c) where the f32 expression ``e`` is ``round(a) + c`` (either order) with ``c`` a
    small integer (:func:`_small_integral`), (a, None) where it is ``round(a)``, else None."""
    if isinstance(e, Un) and e.op == "round":
        return e.a, None
    if isinstance(e, Bin) and e.op == "add":
        for r, c in ((e.a, e.b), (e.b, e.a)):
            if isinstance(r, Un) and r.op == "round" and _small_integral(c):
                return r.a, c
    return None


def _same_expr(a, b) -> bool:
    """Whether two kernel expressions compute the same value by their structure (the same
    ops, constants, variables and buffers): index expressions that a schedule built twice."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        return a.value == b.value and a.dtype == b.dtype
    if isinstance(a, Bin):
        return a.op == b.op and _same_expr(a.a, b.a) and _same_expr(a.b, b.b)
    if isinstance(a, Un):
        return a.op == b.op and _same_expr(a.a, b.a)
    if isinstance(a, Cast):
        return a.dtype == b.dtype and _same_expr(a.a, b.a)
    if isinstance(a, Broadcast):
        return a.lanes == b.lanes and _same_expr(a.a, b.a)
    if isinstance(a, Load):
        return a.buf is b.buf and a.lanes == b.lanes and a.stride == b.stride and _same_expr(a.index, b.index)
    return False          # Var: only itself (identity above); anything else: not compared
