"""Gemm, MatMul (and the other linalg ops) against onnxruntime (ONNX spec sections of each op)."""
import numpy as np
import pytest

from tensorfuse.ir.builder import Builder
from tensorfuse.ir.graph import Graph
from tensorfuse.ir.registry import ShapeError, get_op, run_reference
from tensorfuse.ir.types import TensorType, DType
from tests.oracle import assert_matches_ort, node_model, ort_run, rand

RT, AT = 1e-4, 1e-5


def _run_ref(op, arrays, **attrs):
    g = Graph()
    b = Builder(g)
    ins = [None if a is None else g.add_input(f"x{i}", TensorType.of(a)) for i, a in enumerate(arrays)]
    out = b.op(op, *ins, **attrs)
    return run_reference(out.producer, list(arrays))


# ----------------------------------------------------------------------------- MatMul
MATMUL_SHAPES = [
    ((3, 5), (5, 7)),
    ((1, 4), (4, 1)),
    ((2, 3, 5), (5, 7)),
    ((5,), (5, 7)),
    ((3, 5), (5,)),
    ((5,), (5,)),
    ((2, 1, 3, 5), (4, 5, 6)),
    ((4, 5, 6), (1, 6, 2)),
    ((3, 4), (2, 4, 5)),
    ((7, 9), (9, 600)),          # more columns than one accumulator block
    ((6, 0), (0, 3)),            # K = 0: zeros
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_f32(sa, sb):
    a, b = rand(*sa), rand(*sb, seed=1)
    assert_matches_ort(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, rtol=RT, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_dtypes(dtype):
    a = rand(2, 3, 4, dtype=dtype, low=0, high=5)
    b = rand(4, 5, dtype=dtype, seed=1, low=0, high=5)
    assert_matches_ort(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, rtol=1e-12, atol=0)


def test_matmul_f16():
    a, b = rand(3, 8, dtype=np.float16), rand(8, 5, dtype=np.float16, seed=1)
    assert_matches_ort(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, rtol=2e-3, atol=2e-3)


def test_matmul_int_wraps():
    a = np.full((2, 3), 2**31 - 1, np.int32)
    b = np.full((3, 2), 2, np.int32)
    got = _run_ref("MatMul", [a, b])[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.matmul(a, b))
    assert_matches_ort(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, opt_levels=(0,))


def test_matmul_old_opset():
    a, b = rand(3, 4), rand(4, 2, seed=1)
    assert_matches_ort(node_model("MatMul", {"a": a, "b": b}, opset=9), {"a": a, "b": b}, rtol=RT, atol=AT)


def test_matmul_reference_matches_ort():
    a, b = rand(2, 3, 4), rand(4, 5, seed=1)
    exp = ort_run(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b})[0]
    np.testing.assert_allclose(_run_ref("MatMul", [a, b])[0], exp, rtol=RT, atol=AT)


@pytest.mark.parametrize("sa,sb,msg", [((3, 4), (5, 2), "inner dimensions"),
                                       ((2, 3, 4), (3, 4, 5), "broadcast"),
                                       ((), (3,), "rank")])
def test_matmul_shape_errors(sa, sb, msg):
    g = Graph()
    x = g.add_input("a", TensorType(DType.f32, sa))
    y = g.add_input("b", TensorType(DType.f32, sb))
    with pytest.raises(ShapeError, match=msg):
        Builder(g).MatMul(x, y)


def test_matmul_dtype_mismatch():
    g = Graph()
    x = g.add_input("a", TensorType(DType.f32, (2, 3)))
    y = g.add_input("b", TensorType(DType.f64, (3, 2)))
    with pytest.raises(ShapeError, match="different dtypes"):
        Builder(g).MatMul(x, y)


def test_matmul_flops():
    g = Graph()
    x = g.add_input("a", TensorType(DType.f32, (2, 3, 4)))
    y = g.add_input("b", TensorType(DType.f32, (4, 5)))
    out = Builder(g).MatMul(x, y)
    assert get_op("MatMul").flops(out.producer) == 2 * 2 * 3 * 5 * 4


def test_matmul_loop_order_is_ikj():
    """B not a constant, the ``matmul_panels`` schedule (the ``schedule`` knob's alternative to
    the register tiles): in the kernel IR the k loop holds the j loop, which is innermost and
    reads B and the accumulators at j; what codegen produced: the kernel is split across the
    thread team (the entry hands it the team) and LLVM widened the j loop to vector multiplies
    and adds."""
    import re

    from tensorfuse.compiler.driver import build_module
    from tensorfuse.compiler.frontend.onnx import import_onnx
    from tensorfuse.compiler.lower import lower_graph
    from tensorfuse.compiler.target import Target
    from tensorfuse.ir.kernel import For, Load
    from tests.codegen_util import expr_nodes as nodes, function_ir, kernel_loops as loops, optimized_ir, parallel_kernels
    from tests.knob_util import Fixed
    a, b = rand(32, 64), rand(64, 64, seed=1)   # enough work to be split across threads
    m = node_model("MatMul", {"a": a, "b": b})
    graph = import_onnx(m)
    low = lower_graph(graph, Target.parse("llvm"), tuning=Fixed({"schedule": "matmul_panels"}))
    mod = build_module(low, graph, ["a", "b"], ["y"], "llvm")
    mod.num_threads = 2
    (k,) = mod.kernels
    assert k.schedule == "llvm.matmul_panels"


    (kl,) = [f for f in loops(k.body) if f.var.name.startswith("k")]
    inner = [s for s in kl.body if isinstance(s, For)]
    assert len(inner) == 1 and not any(isinstance(s, For) for s in inner[0].body)
    j = inner[0].var
    assert inner[0].extent.value == b.shape[1]              # all of B's row
    for st in inner[0].body:
        b_loads = [e for e in nodes(st.value) if isinstance(e, Load) and e.buf.name == "b"]
        assert b_loads and all(any(v is j for v in nodes(e.index)) for e in b_loads)
        assert any(v is j for v in nodes(st.index))
    assert parallel_kernels(mod) == {k.name}
    body = function_ir(optimized_ir(mod), k.name)
    assert re.search(r"fmul <\d+ x float>", body) and re.search(r"fadd <\d+ x float>", body)
    np.testing.assert_allclose(mod.run(a=a, b=b)[0], ort_run(m, {"a": a, "b": b})[0], rtol=RT, atol=AT)


# ----------------------------------------------------------------------------- Gemm
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("cshape", [None, (), (1,), (7,), (1, 7), (6, 1), (6, 7)])
def test_gemm(ta, tb, cshape):
    a = rand(*((5, 6) if ta else (6, 5)))
    b = rand(*((7, 5) if tb else (5, 7)), seed=1)
    inputs = {"a": a, "b": b}
    if cshape is not None:
        inputs["c"] = rand(*cshape, seed=2)
    m = node_model("Gemm", inputs, dict(transA=ta, transB=tb, alpha=0.5, beta=2.0))
    assert_matches_ort(m, inputs, rtol=RT, atol=AT)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (2.5, 0.0), (1.0, -0.5)])
def test_gemm_alpha_beta(alpha, beta):
    a, b, c = rand(4, 3), rand(3, 6, seed=1), rand(4, 6, seed=2)
    m = node_model("Gemm", {"a": a, "b": b}, dict(alpha=alpha, beta=beta), initializers={"c": c})
    assert_matches_ort(m, {"a": a, "b": b}, rtol=RT, atol=AT)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_opsets(opset):
    a, b, c = rand(3, 4), rand(4, 5, seed=1), rand(5, seed=2)
    m = node_model("Gemm", {"a": a, "b": b, "c": c}, dict(transB=0), opset=opset)
    assert_matches_ort(m, {"a": a, "b": b, "c": c}, rtol=RT, atol=AT)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 3e-3)])
def test_gemm_dtypes(dtype, tol):
    a, b, c = rand(3, 4, dtype=dtype), rand(5, 4, dtype=dtype, seed=1), rand(5, dtype=dtype, seed=2)
    m = node_model("Gemm", {"a": a, "b": b, "c": c}, dict(transB=1, alpha=0.5))
    assert_matches_ort(m, {"a": a, "b": b, "c": c}, rtol=tol, atol=tol)


def test_gemm_large_classifier():
    # the shape of resnet18's classifier: [1, 512] x [1000, 512]^T + [1000]
    a, w, c = rand(1, 512), rand(1000, 512, seed=1, low=-0.05, high=0.05), rand(1000, seed=2)
    m = node_model("Gemm", {"a": a}, dict(transB=1), initializers={"w": w, "c": c})
    assert_matches_ort(m, {"a": a}, rtol=RT, atol=1e-4)


def test_gemm_reference_matches_ort():
    a, b, c = rand(5, 4), rand(6, 5, seed=1), rand(1, 6, seed=2)
    attrs = dict(transA=1, transB=1, alpha=0.25, beta=3.0)
    exp = ort_run(node_model("Gemm", {"a": a, "b": b, "c": c}, attrs), {"a": a, "b": b, "c": c})[0]
    np.testing.assert_allclose(_run_ref("Gemm", [a, b, c], **attrs)[0], exp, rtol=RT, atol=AT)


def test_gemm_reference_int():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.arange(12, dtype=np.int64).reshape(3, 4)
    c = np.arange(4, dtype=np.int64)
    got = _run_ref("Gemm", [a, b, c], alpha=2.0, beta=3.0)[0]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, 2 * (a @ b) + 3 * c)


@pytest.mark.parametrize("sa,sb,sc,attrs,msg", [
    ((3, 4), (5, 2), None, {}, "inner dimensions"),
    ((3, 4, 1), (4, 2), None, {}, "2-D"),
    ((3, 4), (4, 2), (3,), {}, "does not broadcast"),
    ((4, 3), (4, 2), None, {"transA": 0}, "inner dimensions"),
])
def test_gemm_shape_errors(sa, sb, sc, attrs, msg):
    g = Graph()
    ins = [g.add_input("a", TensorType(DType.f32, sa)), g.add_input("b", TensorType(DType.f32, sb))]
    if sc is not None:
        ins.append(g.add_input("c", TensorType(DType.f32, sc)))
    with pytest.raises(ShapeError, match=msg):
        Builder(g).Gemm(*ins, **attrs)


def test_gemm_epilogue_applied_once():
    """The fusion hook: an epilogue set on the context changes every stored element."""
    from tensorfuse.ir.lowering import LowerCtx
    from tensorfuse.ir.kernel import Buffer, Store
    from tensorfuse.ir.ops.linalg import emit_gemm
    a, b, y = Buffer("a", DType.f32, (2, 3)), Buffer("b", DType.f32, (3, 4)), Buffer("y", DType.f32, (2, 4))
    g = Graph()
    xa = g.add_input("a", TensorType(DType.f32, (2, 3)))
    xb = g.add_input("b", TensorType(DType.f32, (3, 4)))
    node = Builder(g).Gemm(xa, xb).producer
    ctx = LowerCtx(node, [a, b], [y], "gemm")
    seen = []
    ctx.epilogue = lambda v, idx: (seen.append(len(idx)), v * 2.0)[1]
    emit_gemm(ctx, a, b, None, y)

    def stores(body):
        for s in body:
            if isinstance(s, Store) and s.buf is y:
                yield s
            for attr in ("body", "then", "orelse"):
                yield from stores(getattr(s, attr, []))
    assert len(list(stores(ctx.kernels[0].body))) == len(seen) >= 1
    assert set(seen) == {2}


# ----------------------------------------------------------------------------- MatMulInteger
@pytest.mark.parametrize("ta,tb", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                   ((2, 1, 3, 4), (2, 4, 2))])
def test_matmulinteger(ta, tb, sa, sb):
    a = rand(*sa, dtype=ta, low=np.iinfo(ta).min, high=np.iinfo(ta).max)
    b = rand(*sb, dtype=tb, low=np.iinfo(tb).min, high=np.iinfo(tb).max, seed=1)
    m = node_model("MatMulInteger", {"a": a, "b": b}, opset=10)
    if tb == np.int8:
        # onnxruntime's u8 x s8 kernels may saturate int16 pair sums, and it has no s8 x s8
        # kernel: compare with onnx.reference (exact)
        import tensorfuse
        from onnx.reference import ReferenceEvaluator
        exp = ReferenceEvaluator(m).run(None, {"a": a, "b": b})[0]
        np.testing.assert_array_equal(tensorfuse.compile(m, opt_level=0).run(a=a, b=b)[0], exp)
        return
    assert_matches_ort(m, {"a": a, "b": b}, rtol=0, atol=0)


@pytest.mark.parametrize("bz", [np.array(130, np.uint8), np.array([7], np.uint8), np.arange(5, dtype=np.uint8)])
def test_matmulinteger_zero_points(bz):
    a = rand(3, 4, dtype=np.uint8, low=0, high=255)
    b = rand(4, 5, dtype=np.uint8, low=0, high=255, seed=1)
    m = node_model("MatMulInteger", {"a": a, "b": b}, opset=10,
                   initializers={"az": np.array(12, np.uint8), "bz": bz})
    assert_matches_ort(m, {"a": a, "b": b}, rtol=0, atol=0)


@pytest.mark.parametrize("a_shape,az_shape", [((3, 4), (3,)), ((2, 3, 4), (2, 3, 1)), ((2, 3, 4), (1, 3, 1))])
def test_matmulinteger_per_row_a_zero_point(a_shape, az_shape):   # onnxruntime: scalar a_zero_point only
    import tensorfuse
    from onnx.reference import ReferenceEvaluator
    a = rand(*a_shape, dtype=np.int8, low=-128, high=127)
    b = rand(4, 5, dtype=np.uint8, low=0, high=255, seed=1)
    az = rand(*az_shape, dtype=np.int8, low=-5, high=5, seed=2)
    bz = rand(1, 5, dtype=np.uint8, low=0, high=9, seed=3)
    m = node_model("MatMulInteger", {"a": a, "b": b}, opset=10, initializers={"az": az, "bz": bz})
    if az.ndim == 1:   # onnx.reference does not broadcast the per-row vector: the spec's formula
        exp = (a.astype(np.int32) - az.astype(np.int32)[:, None]) @ (b.astype(np.int32) - bz)
    else:
        exp = ReferenceEvaluator(m).run(None, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(tensorfuse.compile(m, opt_level=0).run(a=a, b=b)[0], exp)
    np.testing.assert_array_equal(_run_ref("MatMulInteger", [a, b, az, bz])[0], exp)


def test_matmulinteger_errors():
    g = Graph()
    a = g.add_input("a", TensorType(DType.f32, (3, 4)))
    b = g.add_input("b", TensorType(DType.u8, (4, 5)))
    with pytest.raises(ShapeError, match="not supported"):
        Builder(g).MatMulInteger(a, b)
    a8 = g.add_input("a8", TensorType(DType.u8, (3, 4)))
    with pytest.raises(ShapeError, match="b_zero_point"):
        Builder(g).MatMulInteger(a8, b, None, g.add_input("bz", TensorType(DType.u8, (4,))))


# ----------------------------------------------------------------------------- Einsum
EINSUM = [("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ii->i", [(4, 4)]),
          ("ii", [(4, 4)]), ("ij->ji", [(3, 4)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
          ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,i", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
          ("...ii->...i", [(2, 3, 3)]), ("ij...,jk...", [(3, 4, 2), (4, 5, 1)]), ("ij->", [(3, 4)]),
          ("bhid,bhjd->bhij", [(1, 2, 3, 4), (1, 2, 5, 4)]), ("i,i,i->", [(4,), (4,), (4,)]),
          ("...j,j", [(2, 3, 4), (4,)]), ("Ab,bC->CA", [(2, 3), (3, 4)]), ("i j , j k -> i k", [(2, 3), (3, 2)])]


@pytest.mark.parametrize("eq,shapes", EINSUM)
def test_einsum(eq, shapes):
    ins = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    assert_matches_ort(node_model("Einsum", ins, {"equation": eq}, opset=12), ins, rtol=RT, atol=1e-5,
                       opt_levels=(0,))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_einsum_dtypes(dtype):
    ins = {"a": rand(2, 3, dtype=dtype, low=-5, high=5), "b": rand(3, 4, dtype=dtype, low=-5, high=5, seed=1)}
    assert_matches_ort(node_model("Einsum", ins, {"equation": "ij,jk->ik"}), ins, rtol=1e-12, atol=0,
                       opt_levels=(0,))


def test_einsum_reference_matches_ort():
    a, b = rand(2, 3, 4), rand(2, 4, 5, seed=1)
    exp = ort_run(node_model("Einsum", {"a": a, "b": b}, {"equation": "bij,bjk->bik"}), {"a": a, "b": b})[0]
    np.testing.assert_allclose(_run_ref("Einsum", [a, b], equation="bij,bjk->bik")[0], exp, rtol=RT, atol=AT)


@pytest.mark.parametrize("eq,shapes,msg", [("ij,jk->ik", [(3, 4), (5, 6)], "sizes"),
                                           ("ijk->i", [(3, 4)], "rank"),
                                           ("ij,jk->iz", [(3, 4), (4, 5)], "appears in no input"),
                                           ("ij->ii", [(3, 3)], "repeats"),
                                           ("i1->i", [(3, 3)], "invalid label"),
                                           ("ij", [(3, 4), (4, 5)], "operand terms")])
def test_einsum_errors(eq, shapes, msg):
    g = Graph()
    ins = [g.add_input(f"x{i}", TensorType(DType.f32, s)) for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=msg):
        Builder(g).Einsum(*ins, equation=eq)


# ----------------------------------------------------------------------------- Det
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (5, 5), (2, 4, 4), (2, 3, 6, 6), (0, 3, 3)])
def test_det(shape):
    x = rand(*shape)
    assert_matches_ort(node_model("Det", {"x": x}, opset=11), {"x": x}, rtol=1e-4, atol=1e-5, opt_levels=(0,))


def test_det_singular_and_pivoting():
    x = np.array([[[0.0, 1.0], [1.0, 0.0]],            # needs a row swap: det -1
                  [[1.0, 2.0], [2.0, 4.0]],            # singular
                  [[0.0, 0.0], [0.0, 0.0]],            # zero pivot throughout
                  [[2.0, 0.0], [0.0, 3.0]]],
                 np.float32)
    got = assert_matches_ort(node_model("Det", {"x": x}), {"x": x}, rtol=1e-5, atol=1e-6, opt_levels=(0,))
    np.testing.assert_allclose(got[0], [-1.0, 0.0, 0.0, 6.0], atol=1e-6)


def test_det_f64_reference_and_errors():
    import tensorfuse
    x = rand(3, 4, 4, dtype=np.float64)      # onnxruntime has no f64 Det: numpy is the oracle
    got = tensorfuse.compile(node_model("Det", {"x": x}), opt_level=0).run(x=x)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-10)
    x32 = rand(2, 3, 3)
    exp = ort_run(node_model("Det", {"x": x32}), {"x": x32})[0]
    np.testing.assert_allclose(_run_ref("Det", [x32])[0], exp, rtol=1e-5, atol=1e-6)
    g = Graph()
    with pytest.raises(ShapeError, match="M, M"):
        Builder(g).Det(g.add_input("x", TensorType(DType.f32, (3, 4))))
    with pytest.raises(ShapeError, match="larger"):
        Builder(g).Det(g.add_input("y", TensorType(DType.f32, (65, 65))))


@pytest.mark.parametrize("K", [16, 21, 40])
def test_gemm_transposed_b_partial_sums(K):
    """B' read transposed: dot products with 8 partial sums and a scalar tail."""
    a, b, c = rand(5, K), rand(3, K, seed=1), rand(3, seed=2)
    m = node_model("Gemm", {"a": a, "b": b, "c": c}, dict(transB=1, alpha=1.5))
    assert_matches_ort(m, {"a": a, "b": b, "c": c}, rtol=RT, atol=1e-4)
