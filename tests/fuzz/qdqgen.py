"""Seeded random float models quantized by onnxruntime's own quantizer, and the differential check
of the quantization contract (issue 23; docs/quantization.md).

:func:`float_model` (seed -> ONNX model) draws a small network from the blocks quantized models
are made of, each with random geometry: convolutions (kernel 1, 3 or 5, stride 1 or 2, pads,
groups, depthwise, bias or none) followed by Relu, Clip(0, 6), Sigmoid-gating (x * Sigmoid(x))
or nothing; residual blocks (Relu(Conv(x) + x)); MaxPool / AveragePool; a Concat of two
convolution branches; and a head (GlobalAveragePool, Flatten, Gemm; or Flatten, MatMul, Add),
or, for the transformer kind, token blocks: MatMul + bias with Relu, a residual Add, and an
attention core (MatMul(x, Transpose(x)), scale, Softmax, MatMul with x). Weights are random
(He-scaled), so every tensor keeps its magnitude.

:func:`quantize` runs ``onnxruntime.quantization.quantize_static`` on it as a user would: QDQ
format, MinMax calibration on seeded random inputs, recipe ``u8s8`` (uint8 activations, int8
weights per channel) or ``s8s8`` (int8 activations and weights, per tensor).

:func:`check` compiles the quantized model with tensorfuse (O2) and compares its outputs on two
fresh inputs with onnxruntime's unfused QDQ semantics (``ORT_DISABLE_ALL``) under the contract
of docs/quantization.md: relative L2 error at most ``max(2 * e_ort, 1%)``, where ``e_ort`` is
onnxruntime's own fused int8 error (``ORT_ENABLE_ALL``) against the same reference.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RECIPES = ("u8s8", "s8s8")
KINDS = ("cnn", "transformer")


class _G:
    """A graph under construction: nodes, initializers, fresh names, value shapes."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def const(self, arr: np.ndarray, p: str = "w") -> str:
        nm = self.name(p)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def node(self, op: str, ins: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def weight(self, *shape, fan_in: int) -> str:
        return self.const((self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))


def _activation(g: _G, x: str) -> str:
    kind = g.rng.choice(["relu", "clip", "swish", "none"])
    if kind == "relu":
        return g.node("Relu", [x])
    if kind == "clip":
        return g.node("Clip", [x, g.const(np.array(0, np.float32), "lo"), g.const(np.array(6, np.float32), "hi")])
    if kind == "swish":
        return g.node("Mul", [x, g.node("Sigmoid", [x])])
    return x


def _conv(g: _G, x: str, c: int, h: int, w: int, *, k=None, stride=None, oc=None, group=None, same=False):
    """A Conv of random geometry on x [1, c, h, w]; (output, oc, oh, ow)."""
    rng = g.rng
    k = k or int(rng.choice([1, 3, 3, 5]))
    k = min(k, h, w) if not same else k
    stride = stride or (1 if same else int(rng.choice([1, 1, 2])))
    pad = k // 2 if same or rng.random() < 0.7 else 0
    if group is None:
        r = rng.random()
        group = c if r < 0.25 else (2 if r < 0.35 and c % 2 == 0 else 1)
    if oc is None:
        oc = c if group == c else int(rng.choice([4, 8, 16])) * (group if group > 1 else 1) // max(group, 1) * 1
        oc = max(group, oc - oc % group)
    wname = g.weight(oc, c // group, k, k, fan_in=(c // group) * k * k)
    ins = [x, wname]
    if rng.random() < 0.8:
        ins.append(g.const((rng.standard_normal(oc) * 0.1).astype(np.float32), "b"))
    y = g.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    return y, oc, oh, ow


def _cnn(g: _G) -> tuple[list, list]:
    rng = g.rng
    c, h, w = int(rng.choice([3, 4, 8])), int(rng.integers(7, 17)), int(rng.integers(7, 17))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])]
    x = "x"
    for _ in range(int(rng.integers(2, 5))):
        block = rng.choice(["conv", "conv", "residual", "pool", "concat"])
        if block == "conv" or (block != "conv" and min(h, w) < 4):
            x, c, h, w = _conv(g, x, c, h, w)
            x = _activation(g, x)
        elif block == "residual":
            y, _, _, _ = _conv(g, x, c, h, w, k=3, oc=c, group=1, same=True)
            x = g.node("Relu", [g.node("Add", [y, x])])
        elif block == "pool":
            op = str(rng.choice(["MaxPool", "AveragePool"]))
            k = int(rng.choice([2, 3]))
            s = int(rng.choice([1, 2]))
            p = int(rng.integers(0, k // 2 + 1)) if k > 2 else 0
            x = g.node(op, [x], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
            h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        else:
            a, ca, _, _ = _conv(g, x, c, h, w, k=1, stride=1, group=1)
            b, cb, _, _ = _conv(g, x, c, h, w, k=3, same=True, group=1)
            x = g.node("Concat", [g.node("Relu", [a]), g.node("Relu", [b])], axis=1)
            c = ca + cb
    n_out = int(rng.choice([5, 10]))
    if rng.random() < 0.5:
        f = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
        y = g.node("Gemm", [f, g.weight(n_out, c, fan_in=c), g.const(np.zeros(n_out, np.float32), "b")], transB=1)
    else:
        f = g.node("Flatten", [x])
        y = g.node("Add", [g.node("MatMul", [f, g.weight(c * h * w, n_out, fan_in=c * h * w)]),
                           g.const((rng.standard_normal(n_out) * 0.1).astype(np.float32), "b")])
    return inputs, [y]


def _transformer(g: _G) -> tuple[list, list]:
    rng = g.rng
    s, d = int(rng.choice([5, 8, 16])), int(rng.choice([8, 16, 32]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, d])]
    x = "x"
    for _ in range(int(rng.integers(1, 4))):
        block = rng.choice(["mlp", "residual", "attention"])
        if block == "mlp":
            dh = int(rng.choice([8, 16, 48]))
            y = g.node("Add", [g.node("MatMul", [x, g.weight(d, dh, fan_in=d)]),
                               g.const((rng.standard_normal(dh) * 0.1).astype(np.float32), "b")])
            x, d = _activation(g, y), dh
        elif block == "residual":
            y = g.node("MatMul", [x, g.weight(d, d, fan_in=d)])
            x = g.node("Add", [g.node("Relu", [y]), x])
        else:
            scores = g.node("MatMul", [x, g.node("Transpose", [x], perm=[0, 2, 1])])
            scaled = g.node("Mul", [scores, g.const(np.array(1.0 / np.sqrt(d), np.float32), "scale")])
            x = g.node("MatMul", [g.node("Softmax", [scaled], axis=-1), x])
    return inputs, [x]


def float_model(seed: int, kind: str = "cnn") -> onnx.ModelProto:
    """A random float32 model of ``kind`` (cnn or transformer) for ``seed``; checked by onnx."""
    g = _G(np.random.default_rng(seed))
    inputs, outs = (_cnn if kind == "cnn" else _transformer)(g)
    graph = helper.make_graph(g.nodes, f"qdq_{kind}_{seed}", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.checker.check_model(m)
    return m


def feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


class _Reader:
    def __init__(self, items):
        self.it = iter(items)

    def get_next(self):
        return next(self.it, None)


def quantize(model: onnx.ModelProto, recipe: str, seed: int, calib: int = 4) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime's ``quantize_static`` (QDQ, MinMax) with ``recipe``
    (u8s8: uint8 activations, int8 per-channel weights; s8s8: int8 per tensor). ValueError for
    another recipe."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    rng = np.random.default_rng(seed + 1)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "f.onnx"), os.path.join(tmp, "q.onnx")
        onnx.save(model, src)
        act = QuantType.QUInt8 if recipe == "u8s8" else QuantType.QInt8
        quantize_static(src, dst, _Reader([feeds(model, rng) for _ in range(calib)]), quant_format=QuantFormat.QDQ,
                        activation_type=act, weight_type=QuantType.QInt8, per_channel=recipe == "u8s8",
                        calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"ActivationSymmetric": False})
        return onnx.load(dst)


@dataclasses.dataclass
class Result:
    name: str
    ours: float       # relative L2 error of tensorfuse O2 against the unfused QDQ reference
    theirs: float     # onnxruntime's fused int8 error against the same reference
    limit: float      # max(2 * theirs, 1%)

    @property
    def ok(self) -> bool:
        return self.ours <= self.limit


def rel_l2(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    num = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
    den = sum(float(np.sum(w.astype(np.float64) ** 2)) for w in want)
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def check(qmodel: onnx.ModelProto, seed: int, opt_level: int = 2, ours_model: onnx.ModelProto | None = None
          ) -> list[Result]:
    """Compile ``qmodel`` (or ``ours_model``: a test that the check can fail compiles a corrupted
    copy) with tensorfuse and compare each output on two fresh inputs with onnxruntime's unfused
    QDQ semantics of ``qmodel`` under the contract (module docstring)."""
    import onnxruntime as ort

    import tensorfuse
    rng = np.random.default_rng(seed + 2)
    ins = [feeds(qmodel, rng) for _ in range(2)]
    off = ort.SessionOptions()
    off.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = qmodel.SerializeToString()
    ref = ort.InferenceSession(data, off, providers=["CPUExecutionProvider"])
    fused = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    mod = tensorfuse.compile(ours_model if ours_model is not None else qmodel, opt_level=opt_level)
    out = []
    for k, o in enumerate(ref.get_outputs()):
        want = [ref.run(None, f)[k] for f in ins]
        theirs = rel_l2([fused.run(None, f)[k] for f in ins], want)
        ours = rel_l2([mod.run(**f)[k] for f in ins], want)
        out.append(Result(o.name, ours, theirs, max(2 * theirs, 0.01)))
    return out
