"""Every rewrite rule tested across the attributes of the ops it matches (issue 9).

For each rule of the catalogue (``compiler.pipeline.all_rules()``) a small graph that the rule
matches (:data:`SPECS`); for each attribute of each matched op, as ``onnx.defs`` lists it for the
graph's opset, a few non-default legal values (and, for ops whose parameters are inputs, such
as Clip's min/max, ReduceMean's axes or Dropout's ratio, those inputs). Each (rule, attribute,
value) is compiled at O0 and at the rule's level (O2; O3 for numerics-changing rules) and both
are compared with onnxruntime (optimisations off): rtol 1e-4, atol 1e-5 (folding and fusion
reassociate float32 arithmetic; O3's tanh GELU: atol 1e-3, its documented 4.8e-4 bound with
room). Where the rule did not fire, ``explain`` must give a reason at a candidate node; where
the sweep states whether a value must let the rule fire (``fires``), that is asserted too.

Attributes that are not swept are listed in each spec's ``not_swept`` with the reason; a test
checks that every schema attribute is either swept or listed, so a new attribute of an op (or a
new rule) cannot go unnoticed. The base case of each rule (every attribute at its default) must
fire. ``TF_SWEEP_FULL=1`` adds more values (more paddings, dilations, LeakyRelu alphas).

Size: 43 graphs over the 52 rules, about 384 combinations (about 406 with TF_SWEEP_FULL), about 115 s of CPU
(two compiles each). ``make test`` runs 287 of them: each rule's base case, the first value of
each swept attribute or input, and every value the rule must not fire for; the other 97 values
(a second padding, dilation, alpha ...) are marked heavy, so ``make test-heavy`` (.ci/run) runs
them (:func:`_in_default_suite`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from tensorfuse.ir.errors import TensorfuseError
from tensorfuse.compiler.explain import explain
from tensorfuse.compiler.pipeline import all_rules
from tests.fusion_util import graph_model
from tests.oracle import ort_run, rand

FULL = os.environ.get("TF_SWEEP_FULL", "") not in ("", "0")
RTOL, ATOL = 1e-4, 1e-5


# ----------------------------------------------------------------------------- model building
def _model(nodes, inputs: dict, outputs, inits: dict | None = None, opset: int = 17) -> onnx.ModelProto:
    return graph_model(nodes, inputs, outputs, inits, opset)


def _shape_of(nodes, inputs, inits, name, opset=17) -> tuple:
    m = _model(nodes, inputs, [name], inits, opset)
    o = m.graph.output[0].type.tensor_type.shape
    return tuple(d.dim_value for d in o.dim)


def _node(op, ins, outs, attrs: dict):
    return helper.make_node(op, ins, outs, **{k: v for k, v in attrs.items() if v is not None})


class B:
    """A model under construction: nodes, runtime inputs (arrays), initializers."""

    def __init__(self, opset: int = 17):
        self.nodes, self.inputs, self.inits, self.opset = [], {}, {}, opset

    def node(self, op, ins, out, attrs=None):
        self.nodes.append(_node(op, ins, [out], attrs or {}))
        return out

    def shape(self, name):
        return _shape_of(self.nodes, self.inputs, self.inits, name, self.opset)

    def done(self, outputs):
        return _model(self.nodes, self.inputs, outputs, self.inits, self.opset), dict(self.inputs)


# activation roles -> (op, default attrs); "silu" is Mul(x, Sigmoid(x))
ACTS = {"relu": "Relu", "clip": "Clip", "leakyrelu": "LeakyRelu", "sigmoid": "Sigmoid",
        "hardsigmoid": "HardSigmoid", "hardswish": "HardSwish", "silu": "Mul", "tanh": "Tanh", "gelu": "Gelu"}


def _activation(b: B, src: str, ov: dict) -> str:
    role = next((r for r in ACTS if r in ov), "relu")
    a = dict(ov.get(role, {}))
    if role == "silu":
        b.node("Sigmoid", [src], "sig")
        return b.node("Mul", [src, "sig"], "y")
    if role == "clip" and b.opset < 11:       # min and max are attributes before opset 11
        return b.node("Clip", [src], "y", {"min": 0.0, "max": 6.0} | a)
    if role == "clip":
        ins = [src]
        lo, hi = a.pop("input:min", 0.0), a.pop("input:max", 6.0)
        for nm, v in (("lo", lo), ("hi", hi)):
            if v is None:
                ins.append("")
            elif isinstance(v, str) and v == "runtime":
                b.inputs[nm] = np.array(-0.5 if nm == "lo" else 0.5, np.float32)
                ins.append(nm)
            else:
                b.inits[nm] = np.asarray(v, np.float32)
                ins.append(nm)
        while ins and ins[-1] == "":
            ins.pop()
        return b.node("Clip", ins, "y")
    return b.node(ACTS[role], [src], "y", a)


# ----------------------------------------------------------------------------- graphs per rule
def _conv_inputs(b: B, a: dict, transpose: bool = False):
    group = a.get("group") or 1
    k = a.get("kernel_shape") or [3, 3]
    cin, cout = 4, 4
    b.inputs["x"] = rand(1, cin, 4 if transpose else 7, 4 if transpose else 7, seed=0)
    w_shape = (cin, cout // group, *k) if transpose else (cout, cin // group, *k)
    b.inits["w"] = rand(*w_shape, seed=1, low=-0.5, high=0.5)
    b.inits["b"] = rand(cout, seed=2)


def _bn(b: B, src: str, a: dict, channels: int, out="y"):
    b.inits.update(g=rand(channels, seed=3, low=0.5, high=1.5), be=rand(channels, seed=4),
                   mu=rand(channels, seed=5), var=rand(channels, seed=6, low=0.5, high=2.0))
    if a.get("training_mode"):      # training mode has the running statistics as outputs too
        b.nodes.append(_node("BatchNormalization", [src, "g", "be", "mu", "var"], [out, "run_mu", "run_var"], a))
        return out
    return b.node("BatchNormalization", [src, "g", "be", "mu", "var"], out, a)


def g_conv_bn(ov):
    b = B(ov["_opset"])
    _conv_inputs(b, ov.get("conv", {}))
    b.node("Conv", ["x", "w", "b"], "c", ov.get("conv"))
    _bn(b, "c", ov.get("bn", {}), 4)
    return b.done(["y"])


def g_conv_patch(ov):
    """A patch-embedding Conv (kernel == strides, 12x12 by default) on a 3 x 26 x 29 image (not a
    multiple of the patch) into 6 channels, then Relu."""
    b = B(ov["_opset"])
    a = ov.get("conv", {})
    k = a.get("kernel_shape") or [12, 12]
    b.inputs["x"] = rand(1, 3, 26, 29, seed=0)
    b.inits["w"] = rand(6, 3 // (a.get("group") or 1), *k, seed=1, low=-0.5, high=0.5)
    b.inits["b"] = rand(6, seed=2)
    b.node("Conv", ["x", "w", "b"], "c", a)
    b.node("Relu", ["c"], "y")
    return b.done(["y"])


def g_scaled_conv(ov):
    """A squeeze-excitation scale (Sigmoid of a runtime [1, 8, 1, 1]) multiplying an 8 x 12 x 12
    input before a Conv into 6 channels (1x1 by default), then Relu."""
    b = B(ov["_opset"])
    a = ov.get("conv", {})
    k = a.get("kernel_shape") or [1, 1]
    b.inputs["x"] = rand(1, 8, 12, 12, seed=0)
    b.inputs["e"] = rand(1, 8, 1, 1, seed=3)
    b.inits["w"] = rand(6, 8 // (a.get("group") or 1), *k, seed=1, low=-0.5, high=0.5)
    b.inits["b"] = rand(6, seed=2)
    b.node("Sigmoid", ["e"], "s")
    b.node("Mul", ["x", "s"], "xs")
    b.node("Conv", ["xs", "w", "b"], "c", a)
    b.node("Relu", ["c"], "y")
    return b.done(["y"])


def g_pad_conv(ov):
    """A zero Pad of H and W (TF "SAME": 1 before, 2 after) before a 4 -> 4 channel Conv."""
    b = B(ov["_opset"])
    a = dict(ov.get("pad", {}))
    _conv_inputs(b, ov.get("conv", {}))
    b.inits["pads"] = np.array(a.pop("input:pads", [0, 0, 1, 1, 0, 0, 2, 2]), np.int64)
    b.inits["pv"] = np.array(a.pop("input:constant_value", 0.0), np.float32)
    b.node("Pad", ["x", "pads", "pv"], "p", a)
    b.node("Conv", ["p", "w", "b"], "y", ov.get("conv"))
    return b.done(["y"])


def g_convtranspose_bn(ov):
    b = B(ov["_opset"])
    _conv_inputs(b, ov.get("convtranspose", {}), transpose=True)
    b.node("ConvTranspose", ["x", "w", "b"], "c", ov.get("convtranspose"))
    _bn(b, "c", ov.get("bn", {}), 4)
    return b.done(["y"])


def g_conv_add(ov):
    b = B(ov["_opset"])
    _conv_inputs(b, ov.get("conv", {}))
    b.node("Conv", ["x", "w", "b"], "c", ov.get("conv"))
    b.inputs["z"] = rand(*b.shape("c"), seed=7)
    b.node("Add", ["c", "z"], "y")
    return b.done(["y"])


def g_conv_add_const(ov):
    b = B(ov["_opset"])
    _conv_inputs(b, ov.get("conv", {}))
    b.node("Conv", ["x", "w", "b"] if ov.get("conv_bias", {}).get("on", True) else ["x", "w"], "c", ov.get("conv"))
    b.inits["z"] = rand(4, 1, 1, seed=7)
    b.node("Add", ["c", "z"], "y")
    return b.done(["y"])


def g_conv_add_act(ov):
    """Conv + Add(runtime) + activation: the activation joins a FusedConv."""
    b = B(ov["_opset"])
    _conv_inputs(b, ov.get("conv", {}))
    b.node("Conv", ["x", "w", "b"], "c", ov.get("conv"))
    b.inputs["z"] = rand(*b.shape("c"), seed=7)
    b.node("Add", ["c", "z"], "s")
    _activation(b, "s", ov)
    return b.done(["y"])


def g_matmul_bias_act(ov):
    """MatMul + constant bias + activation: the activation joins a FusedMatMul."""
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 5, seed=0)
    b.inits["w"] = rand(5, 4, seed=1)
    b.inits["bias"] = rand(4, seed=2)
    b.node("MatMul", ["x", "w"], "p")
    b.node("Add", ["p", "bias"], "s")
    _activation(b, "s", ov)
    return b.done(["y"])


def g_conv_act(ov):
    b = B(ov["_opset"])
    _conv_inputs(b, ov.get("conv", {}))
    b.node("Conv", ["x", "w", "b"], "c", ov.get("conv"))
    _activation(b, "c", ov)
    return b.done(["y"])


def _gemm_inputs(b: B, a: dict, const_b: bool):
    b.inputs["a"] = rand(*((5, 3) if a.get("transA") else (3, 5)), seed=0)
    w = rand(*((4, 5) if a.get("transB") else (5, 4)), seed=1, low=-1, high=1)
    (b.inits if const_b else b.inputs)["w"] = w
    b.inits["c"] = rand(4, seed=2)


def g_gemm_bn(ov):
    b = B(ov["_opset"])
    _gemm_inputs(b, ov.get("gemm", {}), True)
    c_shape = ov.get("c", {}).get("shape")
    if c_shape is not None:
        b.inits["c"] = rand(*c_shape, seed=2)
    b.node("Gemm", ["a", "w", "c"], "p", ov.get("gemm"))
    _bn(b, "p", ov.get("bn", {}), 4)
    return b.done(["y"])


def g_gemm_act(ov):
    b = B(ov["_opset"])
    _gemm_inputs(b, ov.get("gemm", {}), False)
    b.node("Gemm", ["a", "w", "c"], "p", ov.get("gemm"))
    _activation(b, "p", ov)
    return b.done(["y"])


def g_gemm_reshape_act(ov):
    """Gemm -> Reshape -> activation (GPT-2's Conv1D then its GELU)."""
    b = B(ov["_opset"])
    _gemm_inputs(b, ov.get("gemm", {}), False)
    b.node("Gemm", ["a", "w", "c"], "p", ov.get("gemm"))
    b.inits["shape"] = np.array([1, 3, 4], np.int64)
    b.node("Reshape", ["p", "shape"], "r", ov.get("reshape"))
    _activation(b, "r", ov)
    return b.done(["y"])


def g_matmul_bn(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(3, 5, seed=0)
    b.inits["w"] = rand(5, 4, seed=1)
    b.node("MatMul", ["x", "w"], "p")
    _bn(b, "p", ov.get("bn", {}), 4)
    return b.done(["y"])


def g_matmul_bias(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 5, seed=0)
    b.inits["w"] = rand(5, 4, seed=1)
    b.inits["bias"] = rand(4, seed=2)
    b.node("MatMul", ["x", "w"], "p")
    b.node("Add", ["p", "bias"], "y")
    return b.done(["y"])


def g_matmul_act(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 5, seed=0)
    b.inputs["w"] = rand(5, 4, seed=1)
    b.node("MatMul", ["x", "w"], "p")
    _activation(b, "p", ov)
    return b.done(["y"])


def _ln(b: B, src: str, a: dict, shape):
    axis = a.get("axis", -1)
    axis = axis % len(shape)
    b.inits["scale"] = rand(*shape[axis:], seed=8, low=0.5, high=1.5)
    b.inits["B"] = rand(*shape[axis:], seed=9)
    return b.node("LayerNormalization", [src, "scale", "B"], "y", a)


def g_skip_ln(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 8, seed=0)
    b.inputs["skip"] = rand(2, 3, 8, seed=1)
    b.node("Add", ["x", "skip"], "s")
    _ln(b, "s", ov.get("layernormalization", {}), (2, 3, 8))
    return b.done(["y"])


def g_embed_ln(ov):
    b = B(ov["_opset"])
    b.inputs["ids"] = np.array([0, 5, 2, 2, 1, 4], np.int64)
    b.inits["table"] = rand(6, 6, seed=1)
    b.inputs["pos"] = rand(6, 6, seed=2)
    b.node("Gather", ["table", "ids"], "e", ov.get("gather"))
    b.node("Add", ["e", "pos"], "s")
    _ln(b, "s", ov.get("layernormalization", {}), (6, 6))
    return b.done(["y"])


def g_ln_parts(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(8, 8, seed=0)
    b.inits.update(two=np.float32(2.0), eps=np.float32(1e-5), gamma=rand(8, seed=1), beta=rand(8, seed=2))
    a1, a2 = (dict(ov.get(r, {})) for r in ("rm1", "rm2"))
    for a, nm in ((a1, "ax1"), (a2, "ax2")):
        axes = a.pop("input:axes", [-1])
        if b.opset < 18:             # axes is an attribute before opset 18
            a.setdefault("axes", axes)
        elif axes is not None:
            b.inits[nm] = np.array(axes, np.int64)
    b.node("ReduceMean", ["x", "ax1"] if "ax1" in b.inits else ["x"], "mean", a1)
    b.node("Sub", ["x", "mean"], "d")
    b.node("Pow", ["d", "two"], "d2")
    b.node("ReduceMean", ["d2", "ax2"] if "ax2" in b.inits else ["d2"], "var", a2)
    b.node("Add", ["var", "eps"], "ve")
    b.node("Sqrt", ["ve"], "sd")
    b.node("Div", ["d", "sd"], "n")
    b.node("Mul", ["n", "gamma"], "ng")
    b.node("Add", ["ng", "beta"], "y")
    return b.done(["y"])


def g_attention(ov):
    b = B(ov["_opset"])
    perm = ov.get("transpose", {}).get("perm", [0, 1, 3, 2])
    kt_shape = (1, 2, 3, 4)                # [b, h, d, s]
    k_shape = [0] * 4
    for i, p in enumerate(perm):
        k_shape[p] = kt_shape[i]
    b.inputs["q"] = rand(1, 2, 4, 3, seed=0)
    b.inputs["k"] = rand(*k_shape, seed=1)
    b.inputs["v"] = rand(1, 2, 4, 3, seed=2)
    b.inputs["mask"] = rand(1, 1, 4, 4, seed=3)
    b.inits["scale"] = np.float32(1 / math.sqrt(3))
    b.node("Transpose", ["k"], "kt", {"perm": perm})
    b.node("MatMul", ["q", "kt"], "qk")
    b.node("Mul", ["qk", "scale"], "sc")
    b.node("Add", ["sc", "mask"], "ms")
    b.node("Softmax", ["ms"], "p", ov.get("softmax"))
    b.node("MatMul", ["p", "v"], "y")
    return b.done(["y"])


def _gelu_erf(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 5, seed=0, low=-4, high=4)
    b.inits.update(r2=np.float32(math.sqrt(2)), one=np.float32(1.0), half=np.float32(0.5))
    b.node("Div", ["x", "r2"], "t")
    b.node("Erf", ["t"], "e")
    b.node("Add", ["e", "one"], "e1")
    b.node("Mul", ["x", "e1"], "xe")
    b.node("Mul", ["xe", "half"], "y")
    return b.done(["y"])


def _gelu_tanh(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 5, seed=0, low=-4, high=4)
    b.inits.update(three=np.float32(3.0), c=np.float32(0.044715), k=np.float32(math.sqrt(2 / math.pi)),
                   one=np.float32(1.0), half=np.float32(0.5))
    for op, ins, out in (("Pow", ["x", "three"], "x3"), ("Mul", ["x3", "c"], "cx3"), ("Add", ["x", "cx3"], "p"),
                         ("Mul", ["p", "k"], "kp"), ("Tanh", ["kp"], "t"), ("Add", ["t", "one"], "t1"),
                         ("Mul", ["x", "t1"], "xt"), ("Mul", ["xt", "half"], "y")):
        b.node(op, ins, out)
    return b.done(["y"])


def g_gelu_op(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 5, seed=0, low=-4, high=4)
    b.node("Gelu", ["x"], "y", ov.get("gelu"))
    return b.done(["y"])


def g_identity(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, seed=0)
    b.node("Identity", ["x"], "i")
    b.node("Neg", ["i"], "y")
    return b.done(["y"])


def g_dropout(ov):
    b = B(ov["_opset"])
    a = dict(ov.get("dropout", {}))
    b.inputs["x"] = rand(2, 3, seed=0)
    ins = ["x"]
    ratio, train = a.pop("input:ratio", None), a.pop("input:training_mode", None)
    if ratio is not None or train is not None:
        b.inits["ratio"] = np.array(0.5 if ratio is None else ratio, np.float32)
        ins.append("ratio")
    if train is not None:
        b.inits["train"] = np.array(train, np.bool_)
        ins.append("train")
    b.node("Dropout", ins, "d", a)
    b.node("Neg", ["d"], "y")
    return b.done(["y"])


def g_cast(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, seed=0, low=-3, high=3)
    b.node("Cast", ["x"], "c", ov.get("cast", {"to": TensorProto.FLOAT}))
    b.node("Neg", ["c"], "y")
    return b.done(["y"])


def _reshape(b: B, src, out, a: dict, default_shape, nm):
    a = dict(a)
    b.inits[nm] = np.array(a.pop("input:shape", default_shape), np.int64)
    return b.node("Reshape", [src, nm], out, a)


def g_noop_reshape(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 4, seed=0)
    if "flatten" in ov:
        b.inputs["x"] = rand(2, 12, seed=0)
        b.node("Flatten", ["x"], "r", ov["flatten"])
    else:
        _reshape(b, "x", "r", ov.get("reshape", {}), [2, 3, 4], "s")
    b.node("Neg", ["r"], "y")
    return b.done(["y"])


def g_collapse(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 4, seed=0)
    if "flatten" in ov:
        b.node("Flatten", ["x"], "r1", ov["flatten"])
    else:
        _reshape(b, "x", "r1", ov.get("reshape1", {}), [6, 4], "s1")
    _reshape(b, "r1", "r2", ov.get("reshape2", {}), [4, 6], "s2")
    b.node("Neg", ["r2"], "y")
    return b.done(["y"])


def g_transpose(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 4, seed=0)
    b.node("Transpose", ["x"], "t", ov.get("transpose", {"perm": [0, 1, 2]}))
    b.node("Neg", ["t"], "y")
    return b.done(["y"])


def g_transposes(ov):
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 4, seed=0)
    b.node("Transpose", ["x"], "t1", ov.get("inner", {"perm": [1, 0, 2]}))
    b.node("Transpose", ["t1"], "t2", ov.get("outer", {"perm": [0, 2, 1]}))
    b.node("Neg", ["t2"], "y")
    return b.done(["y"])


# ----------------------------------------------------------------------------- the sweep table
@dataclass
class V:
    """One swept value: ``value`` for the attribute, ``extra`` co-attributes of the same op
    that make it legal or meaningful, ``fires``: True/False when the rule must / must not fire."""
    value: Any
    extra: dict = field(default_factory=dict)
    fires: bool | None = None
    full_only: bool = False


@dataclass
class Spec:
    rule: str
    build: Callable[[dict], tuple]
    ops: dict                       # role -> ONNX op type
    sweep: dict                     # (role, attribute or "input:<name>") -> [V, ...]
    not_swept: dict = field(default_factory=dict)     # (role, attribute) -> why
    opset: int = 17
    level: int = 2
    atol: float = ATOL
    base: dict = field(default_factory=dict)           # overrides of the base case



# ----------------------------------------------------------------------------- quantized graphs
#: the output quantization step of the QDQ sweeps (compiler/rules/quantize.py): their outputs are
#: DequantizeLinear(QuantizeLinear(..)) values, compared within one step (docs/quantization.md)
Q_STEP = 0.05


def _q(b: B, src: str, scale: str, zp: str, out: str) -> str:
    b.node("QuantizeLinear", [src, scale, zp], out + "_q")
    return b.node("DequantizeLinear", [out + "_q", scale, zp], out)


def _q_out(b: B, src: str) -> str:
    b.inits.update(ys=np.float32(Q_STEP), yz=np.uint8(128))
    return _q(b, src, "ys", "yz", "y")


def g_qconv(ov, bn: bool = False):
    """DQ(x) and DQ(int8 W, per output channel) -> Conv (+ DQ'd int32 bias) [-> BN] -> Q -> DQ."""
    b = B(ov["_opset"])
    a = ov.get("conv", {})
    group = a.get("group") or 1
    k = a.get("kernel_shape") or [3, 3]
    rng = np.random.default_rng(7)
    b.inputs["x"] = rand(1, 4, 7, 7, seed=0)
    ws = (rng.random(4) * 0.01 + 0.005).astype(np.float32)
    b.inits.update(xs=np.float32(0.02), xz=np.uint8(128), w=rng.integers(-127, 128, (4, 4 // group, *k)).astype(np.int8),
                   ws=ws, bq=rng.integers(-300, 300, 4).astype(np.int32), bs=(np.float32(0.02) * ws).astype(np.float32))
    _q(b, "x", "xs", "xz", "xd")
    b.nodes.append(_node("DequantizeLinear", ["w", "ws"], ["wd"], {"axis": 0}))
    b.nodes.append(_node("DequantizeLinear", ["bq", "bs"], ["bd"], {"axis": 0}))
    b.node("Conv", ["xd", "wd", "bd"], "c", a)
    src = _bn(b, "c", ov.get("bn", {}), 4, out="cbn") if bn else "c"
    _q_out(b, src)
    return b.done(["y"])


def g_qconv_bn(ov):
    return g_qconv(ov, bn=True)


def g_qgemm(ov, op: str = "Gemm"):
    """DQ(a) and DQ(int8 B, per column) -> MatMul or Gemm (+ C) -> Q -> DQ."""
    b = B(ov["_opset"])
    a = ov.get("gemm", {})
    rng = np.random.default_rng(8)
    ta, tb = a.get("transA") or 0, a.get("transB") or 0
    b.inputs["a"] = rand(*((16, 3) if ta else (3, 16)), seed=0)
    b.inits.update(as_=np.float32(0.03), az=np.uint8(128), w=rng.integers(-127, 128, (8, 16) if tb else (16, 8)).astype(np.int8),
                   ws=(rng.random(8) * 0.01 + 0.002).astype(np.float32), c=rand(8, seed=2))
    _q(b, "a", "as_", "az", "ad")
    b.nodes.append(_node("DequantizeLinear", ["w", "ws"], ["wd"], {"axis": 0 if tb else 1}))
    if op == "Gemm":
        b.node("Gemm", ["ad", "wd", "c"], "p", a)
    else:
        b.node("MatMul", ["ad", "wd"], "p")
    _q_out(b, "p")
    return b.done(["y"])


def g_qmatmul(ov):
    return g_qgemm(ov, "MatMul")


def g_qmatmul_act(ov):
    """Q/DQ(a) x Q/DQ(b), both activations (attention's Q K^T) -> MatMul -> Q -> DQ."""
    b = B(ov["_opset"])
    b.inputs["a"] = rand(2, 5, 16, seed=0)
    b.inputs["b"] = rand(2, 16, 8, seed=1)
    b.inits.update(as_=np.float32(0.03), az=np.uint8(128), bs=np.float32(0.025), bz=np.uint8(120))
    _q(b, "a", "as_", "az", "ad")
    _q(b, "b", "bs", "bz", "bd")
    b.node("MatMul", ["ad", "bd"], "p")
    _q_out(b, "p")
    return b.done(["y"])


def g_dynamic_matmul(ov):
    """quantize_dynamic's chain: DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scale) -> Add(bias)."""
    b = B(ov["_opset"])
    rng = np.random.default_rng(9)
    b.inputs["x"] = rand(3, 16, seed=0)
    b.inits.update(w=rng.integers(-127, 128, (16, 8)).astype(np.int8), wz=np.int8(0), ws=np.float32(0.004),
                   bias=rand(8, seed=2))
    b.nodes.append(_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], {}))
    b.node("Mul", ["xs", "ws"], "s")
    b.node("MatMulInteger", ["xq", "w", "xz", "wz"], "acc")
    b.node("Cast", ["acc"], "accf", {"to": TensorProto.FLOAT})
    b.node("Mul", ["accf", "s"], "p")
    b.node("Add", ["p", "bias"], "y")
    return b.done(["y"])


def g_dynamic_conv(ov, patch: bool = False):
    """quantize_dynamic's Conv chain: DynamicQuantizeLinear -> ConvInteger (int8 W, scalar zero
    point) -> Cast -> Mul(scale) -> Add(bias [1, M, 1, 1]); on a 4 x 9 x 11 input, or a patch
    embedding's 3 x 26 x 29 image (kernel 12x12 by default) with ``patch``."""
    b = B(ov["_opset"])
    a = ov.get("conv", {})
    group = a.get("group") or 1
    rng = np.random.default_rng(10)
    c, k, hw = (3, [12, 12], (26, 29)) if patch else (4, [3, 3], (9, 11))
    k = a.get("kernel_shape") or k
    b.inputs["x"] = rand(1, c, *hw, seed=0)
    b.inits.update(w=rng.integers(-127, 128, (6 if patch else 4, c // group, *k)).astype(np.int8),
                   wz=np.int8(0), ws=np.float32(0.004), bias=rand(1, 6 if patch else 4, 1, 1, seed=2))
    b.nodes.append(_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], {}))
    b.node("Mul", ["xs", "ws"], "s")
    b.node("ConvInteger", ["xq", "w", "xz", "wz"], "acc", a)
    b.node("Cast", ["acc"], "accf", {"to": TensorProto.FLOAT})
    b.node("Mul", ["accf", "s"], "p")
    b.node("Add", ["p", "bias"], "y")
    return b.done(["y"])


def g_dynamic_conv_patch(ov):
    return g_dynamic_conv(ov, patch=True)


def g_qdq_transpose(ov):
    """Q -> DQ -> Transpose -> Q -> DQ with one scale: the Transpose moves int8."""
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 4, seed=0)
    b.inits.update(ys=np.float32(Q_STEP), yz=np.uint8(128))
    _q(b, "x", "ys", "yz", "xd")
    b.node("Transpose", ["xd"], "t", ov.get("transpose"))
    _q(b, "t", "ys", "yz", "y")
    return b.done(["y"])


def g_qconcat(ov):
    """Two Q -> DQ values with one scale -> Concat -> Q -> DQ: the Concat moves int8."""
    b = B(ov["_opset"])
    b.inputs["a"] = rand(1, 2, 3, 3, seed=0)
    b.inputs["c"] = rand(1, 2, 3, 3, seed=1)
    b.inits.update(ys=np.float32(Q_STEP), yz=np.uint8(128))
    _q(b, "a", "ys", "yz", "ad")
    _q(b, "c", "ys", "yz", "cd")
    b.node("Concat", ["ad", "cd"], "cat", {"axis": 1} | ov.get("concat", {}))
    _q(b, "cat", "ys", "yz", "y")
    return b.done(["y"])


def g_qresidual(ov):
    """DQ(x), DQ(int8 W) -> Conv -> Add(DQ(Q(r))) -> Q -> DQ: a quantized residual add."""
    b = B(ov["_opset"])
    rng = np.random.default_rng(10)
    b.inputs["x"] = rand(1, 4, 7, 7, seed=0)
    b.inputs["r"] = rand(1, 4, 7, 7, seed=1)
    b.inits.update(xs=np.float32(0.02), xz=np.uint8(128), w=rng.integers(-127, 128, (4, 4, 3, 3)).astype(np.int8),
                   ws=(rng.random(4) * 0.01 + 0.005).astype(np.float32), rs=np.float32(0.03), rz=np.uint8(120))
    _q(b, "x", "xs", "xz", "xd")
    _q(b, "r", "rs", "rz", "rd")
    b.nodes.append(_node("DequantizeLinear", ["w", "ws"], ["wd"], {"axis": 0}))
    b.node("Conv", ["xd", "wd"], "c", {"pads": [1, 1, 1, 1]})
    b.node("Add", ["c", "rd"], "s")
    _q_out(b, "s")
    return b.done(["y"])


def g_qrequant(ov):
    """Q -> DQ at one scale, then Q -> DQ at another: a requantization (Q(DQ(x)), two scales)."""
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 8, seed=0)
    b.inits.update(xs=np.float32(0.03), xz=np.uint8(120), ys=np.float32(Q_STEP), yz=np.uint8(7))
    b.node("QuantizeLinear", ["x", "xs", "xz"], "xq")
    b.node("DequantizeLinear", ["xq", "xs", "xz"], "xd", ov.get("dq", {}))
    b.node("QuantizeLinear", ["xd", "ys", "yz"], "yq", ov.get("q", {}))
    b.node("DequantizeLinear", ["yq", "ys", "yz"], "y")
    return b.done(["y"])


def g_qtable(ov):
    """Q -> DQ -> LeakyRelu -> Q -> DQ: a quantized activation of one u8 tensor, a table."""
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 8, seed=0)
    b.inits.update(xs=np.float32(0.02), xz=np.uint8(128), ys=np.float32(Q_STEP), yz=np.uint8(40))
    _q(b, "x", "xs", "xz", "xd")
    b.node("LeakyRelu", ["xd"], "lr", {"alpha": 0.1} | ov.get("act", {}))
    _q(b, "lr", "ys", "yz", "y")
    return b.done(["y"])


def g_relu_q(ov):
    """Relu -> QuantizeLinear with zero point 0 (u8): the Q clips at 0 anyway."""
    b = B(ov["_opset"])
    b.inputs["x"] = rand(2, 3, 8, seed=0)
    b.inits.update(s=np.float32(Q_STEP), z=np.uint8(0))
    b.node("Relu", ["x"], "r")
    b.node("QuantizeLinear", ["r", "s", "z"], "y")
    return b.done(["y"])

CONV_V = {
    "strides": [V([2, 2]), V([1, 2])],
    "pads": [V([1, 1, 1, 1]), V([0, 1, 2, 0])],
    "dilations": [V([2, 2]), V([1, 2], full_only=True)],
    "group": [V(2), V(4)],
    "auto_pad": [V("SAME_UPPER", {"strides": [2, 2]}), V("SAME_LOWER", {"strides": [2, 2]}), V("VALID"),
                 V("SAME_UPPER", full_only=True)],
    "kernel_shape": [V([3, 3]), V([2, 3])],
}
CONVT_V = {
    "strides": [V([2, 2]), V([1, 2])],
    "pads": [V([1, 1, 1, 1]), V([0, 1, 1, 0])],
    "dilations": [V([2, 2])],
    "group": [V(2), V(4)],
    "output_padding": [V([1, 1], {"strides": [2, 2]}), V([1, 0], {"strides": [2, 2]}, full_only=True)],
    "output_shape": [V([10, 10], {"strides": [2, 2]}), V([9, 10], {"strides": [2, 2]}, full_only=True)],
    "auto_pad": [V("SAME_UPPER", {"strides": [2, 2]}), V("SAME_LOWER", {"strides": [2, 2]}), V("VALID")],
    "kernel_shape": [V([3, 3]), V([2, 3])],
}
BN_V = {
    "epsilon": [V(1e-2, fires=True), V(0.5, fires=True)],
    "momentum": [V(0.5, fires=True)],
    "training_mode": [V(1, fires=False)],
}
GEMM_V = {
    "alpha": [V(0.5), V(2.0)],
    "beta": [V(0.0), V(0.5)],
    "transA": [V(1)],
    "transB": [V(1)],
}
# activation attributes and inputs, keyed by activation role
ACT_V = {
    ("leakyrelu", "alpha"): [V(0.0), V(0.5), V(-1.0, full_only=True), V(3.0, full_only=True)],
    ("hardsigmoid", "alpha"): [V(0.5)],
    ("hardsigmoid", "beta"): [V(0.1)],
    ("gelu", "approximate"): [V("tanh", fires=True)],
    ("clip", "input:min"): [V(None, {"input:max": 0.5}), V(-0.25), V([0.5], full_only=True),
                            V("runtime", fires=False)],
    ("clip", "input:max"): [V(None), V(-1.0), V("runtime", fires=False)],
    ("relu", None): [V(None, fires=True)],
    ("sigmoid", None): [V(None, fires=True)],
    ("hardswish", None): [V(None, fires=True)],
    ("silu", None): [V(None, fires=True)],
    ("tanh", None): [V(None, fires=True)],
}
ACT_OPS = dict(ACTS)
LN_V = {
    "axis": [V(1), V(-2), V(0)],
    "epsilon": [V(1e-2, fires=True), V(0.3, fires=True)],
    "stash_type": [V(0, fires=False)],
}


def _keyed(role, table):
    return {(role, a): vs for a, vs in table.items()}


def _act_sweep(anchor_role, anchor_table, anchor_full=False):
    sw = dict(ACT_V)
    for k, vs in _keyed(anchor_role, anchor_table).items():
        sw[k] = [V(v.value, v.extra, v.fires, v.full_only or anchor_full) for v in vs]
    return sw


#: the patch-embedding rules' sweep: the patches stop being disjoint (strides, pads, dilations,
#: group) or too small (4x4), a base case of 12x12 patches
PATCH_V = {("conv", "strides"): [V([6, 6], fires=False)],
           ("conv", "pads"): [V([1, 1, 1, 1], fires=False)],
           ("conv", "dilations"): [V([2, 2], fires=False)],
           ("conv", "group"): [V(3, fires=False)],
           ("conv", "auto_pad"): [V("VALID", fires=True), V("SAME_UPPER", fires=False)],
           ("conv", "kernel_shape"): [V([16, 16], {"strides": [16, 16]}, fires=True),
                                      V([4, 4], {"strides": [4, 4]}, fires=False)]}
PATCH_BASE = {"conv": {"kernel_shape": [12, 12], "strides": [12, 12]}}


SPECS = [
    # simplification rules (O1+; checked at O2)
    Spec("RemoveIdentity", g_identity, {"identity": "Identity"}, {("identity", None): [V(None, fires=True)]}),
    Spec("RemoveInferenceDropout", g_dropout, {"dropout": "Dropout"},
         {("dropout", "seed"): [V(3, fires=True)],
          ("dropout", "input:ratio"): [V(0.0, fires=True), V(0.5, fires=True)],
          ("dropout", "input:training_mode"): [V(False, fires=True), V(True, {"input:ratio": 0.0}, fires=False)]}),
    Spec("RemoveSameTypeCast", g_cast, {"cast": "Cast"},
         {("cast", "to"): [V(TensorProto.FLOAT, fires=True), V(TensorProto.DOUBLE, fires=False),
                           V(TensorProto.FLOAT16, fires=False), V(TensorProto.INT32, fires=False)]},
         base={"cast": {"to": TensorProto.FLOAT}}),
    Spec("RemoveNoopReshape", g_noop_reshape, {"reshape": "Reshape", "flatten": "Flatten"},
         {("reshape", "allowzero"): [V(1, fires=True)],
          ("reshape", "input:shape"): [V([0, 3, 4], fires=True), V([2, -1, 4], fires=True), V([0, 0, -1], fires=True),
                                       V([6, 4], fires=False)],
          ("flatten", "axis"): [V(1, fires=True), V(0, fires=False), V(-1, fires=True), V(2, fires=False)]}),
    Spec("RemoveIdentityTranspose", g_transpose, {"transpose": "Transpose"},
         {("transpose", "perm"): [V([0, 1, 2], fires=True), V([0, 2, 1], fires=False), V(None, fires=False)]},
         base={"transpose": {"perm": [0, 1, 2]}}),
    Spec("ComposeTransposes", g_transposes, {"inner": "Transpose", "outer": "Transpose"},
         {("inner", "perm"): [V([1, 0, 2], fires=True), V([2, 0, 1], fires=True), V(None, fires=True)],
          ("outer", "perm"): [V([1, 0, 2], fires=True), V([2, 1, 0], fires=True), V(None, fires=True)]},
         base={"inner": {"perm": [1, 0, 2]}, "outer": {"perm": [0, 2, 1]}}),
    Spec("CollapseReshapes", g_collapse, {"reshape1": "Reshape", "reshape2": "Reshape", "flatten": "Flatten"},
         {("reshape1", "allowzero"): [V(1, fires=True)],
          ("reshape2", "allowzero"): [V(1, fires=True)],
          ("reshape1", "input:shape"): [V([0, 12], fires=True), V([-1, 2], fires=True)],
          ("reshape2", "input:shape"): [V([0, 2, 2], fires=True), V([3, 0, -1], fires=True), V([2, 0, -1], fires=True)],
          ("flatten", "axis"): [V(1, fires=True), V(2, fires=True), V(0, fires=True), V(-1, fires=True)]}),
    # folding
    # a patch-embedding Conv (strides == kernel) as a MatMul over the patches
    Spec("ConvPatchifyToMatMul", g_conv_patch, {"conv": "Conv"},
         PATCH_V, base=PATCH_BASE),
    Spec("StridedPointwiseConvSubsample", g_conv_patch, {"conv": "Conv"},
         {("conv", "strides"): [V([1, 1], fires=False), V([2, 3], fires=True)],
          ("conv", "pads"): [V([1, 1, 1, 1], fires=False)],
          ("conv", "dilations"): [V([2, 2], fires=True)],          # one tap: dilation changes nothing
          ("conv", "group"): [V(3, fires=True)],
          ("conv", "auto_pad"): [V("VALID", fires=True)],
          ("conv", "kernel_shape"): [V([3, 3], fires=False)]},
         base={"conv": {"kernel_shape": [1, 1], "strides": [2, 2]}}),
    # the squeeze-excitation scale read by a 1x1 conv (stride 1 only: a strided one is
    # subsampled first, and its plane is then below INPUT_SCALE_MIN_PIXELS)
    Spec("FuseConvInputScale", g_scaled_conv, {"mul": "Mul", "conv": "Conv"},
         {("conv", "strides"): [V([2, 2], fires=False)],
          ("conv", "pads"): [V([1, 1, 1, 1], fires=False)],
          ("conv", "dilations"): [V([2, 2], fires=True)],          # one tap: dilation changes nothing
          ("conv", "group"): [V(2, fires=False)],
          ("conv", "auto_pad"): [V("VALID", fires=True), V("SAME_UPPER", fires=True)],   # 1x1: no padding
          ("conv", "kernel_shape"): [V([3, 3], {"pads": [1, 1, 1, 1]}, fires=False)]},
         base={"conv": {"kernel_shape": [1, 1]}}),
    Spec("FoldBatchNormIntoConv", g_conv_bn, {"conv": "Conv", "bn": "BatchNormalization"},
         _keyed("conv", CONV_V) | _keyed("bn", BN_V)),
    Spec("FoldPadIntoConv", g_pad_conv, {"pad": "Pad", "conv": "Conv"},
         _keyed("conv", {k: vs for k, vs in CONV_V.items() if k != "auto_pad"})
         | {("conv", "auto_pad"): [V("VALID", fires=True), V("SAME_UPPER", fires=False)],
            ("pad", "mode"): [V("reflect", fires=False), V("edge", fires=False)],
            ("pad", "input:constant_value"): [V(0.0, fires=True), V(1.5, fires=False)],
            ("pad", "input:pads"): [V([0, 0, 0, 1, 0, 0, 1, 0], fires=True), V([1, 0, 1, 1, 0, 0, 1, 1], fires=False),
                                    V([0, 0, -1, 0, 0, 0, 1, 1], fires=False)]}),
    Spec("FoldBatchNormIntoConvTranspose", g_convtranspose_bn,
         {"convtranspose": "ConvTranspose", "bn": "BatchNormalization"},
         _keyed("convtranspose", CONVT_V) | _keyed("bn", BN_V)),
    Spec("FoldBatchNormIntoGemm", g_gemm_bn, {"gemm": "Gemm", "bn": "BatchNormalization"},
         _keyed("gemm", GEMM_V) | _keyed("bn", BN_V)),
    Spec("FoldBatchNormIntoGemm", g_gemm_bn, {"gemm": "Gemm"},         # C of shape [1, N] and [M, N]
         {("gemm", "beta"): [V(0.5, {("c", "shape"): (1, 4)}), V(0.5, {("c", "shape"): (3, 4)}),
                             V(0.0, {("c", "shape"): (3, 4)})],
          ("gemm", "alpha"): [V(2.0, {("c", "shape"): (3, 4)})],
          ("gemm", "transB"): [V(1, {("c", "shape"): (3, 4)})]},
         not_swept={("gemm", a): "swept above" for a in ("transA",)}),
    Spec("FoldBatchNormIntoMatMul", g_matmul_bn, {"matmul": "MatMul", "bn": "BatchNormalization"},
         _keyed("bn", BN_V)),
    # fusion
    Spec("GeluErf", _gelu_erf, {}, {(None, None): [V(None, fires=True)]}),
    Spec("GeluTanh", _gelu_tanh, {}, {(None, None): [V(None, fires=True)]}),
    Spec("LayerNormFromParts", g_ln_parts, {"rm1": "ReduceMean", "rm2": "ReduceMean"},
         {("rm1", "keepdims"): [V(0, fires=False), V(0, {("rm2", "keepdims"): 0}, fires=False)],
          ("rm2", "keepdims"): [V(0, fires=False)],
          ("rm1", "noop_with_empty_axes"): [V(1, fires=True), V(1, {"input:axes": None}, fires=False)],
          ("rm2", "noop_with_empty_axes"): [V(1, fires=True)],
          ("rm1", "input:axes"): [V([1], fires=True), V([0], fires=False), V([0, 1], fires=False),
                                  V([-2, -1], fires=False), V([0, 1], {("rm2", "input:axes"): [-2, -1]}, fires=True),
                                  V([0], {("rm2", "input:axes"): [0]}, fires=False)],
          ("rm2", "input:axes"): [V([0], fires=False)]},
         opset=18),
    Spec("LayerNormFromParts", g_ln_parts, {"rm1": "ReduceMean", "rm2": "ReduceMean"},     # axes attributes
         {("rm1", "axes"): [V([1], fires=True), V([0], fires=False), V(None, fires=False),
                            V([0, 1], {("rm2", "axes"): [1, 0]}, fires=True)],
          ("rm2", "axes"): [V([-1], fires=True), V(None, {("rm1", "axes"): None}, fires=True)],
          ("rm1", "keepdims"): [V(0, fires=False)], ("rm2", "keepdims"): [V(0, fires=False)]},
         opset=13),
    Spec("EmbedLayerNorm", g_embed_ln, {"gather": "Gather", "layernormalization": "LayerNormalization"},
         {("gather", "axis"): [V(1, fires=False), V(-2, fires=False)]} | _keyed("layernormalization", LN_V)),
    Spec("SkipLayerNorm", g_skip_ln, {"layernormalization": "LayerNormalization"}, _keyed("layernormalization", LN_V)),
    Spec("FuseAttention", g_attention, {"softmax": "Softmax", "transpose": "Transpose"},
         {("softmax", "axis"): [V(3, fires=True), V(-1, fires=True), V(2, fires=False), V(1, fires=False),
                                V(-2, fires=False), V(0, fires=False)],
          ("transpose", "perm"): [V([0, 2, 3, 1], fires=True), V([1, 0, 3, 2], fires=True), V([0, 1, 2, 3], fires=True)]}),
    Spec("FuseAttention", g_attention, {"softmax": "Softmax", "transpose": "Transpose"},      # Softmax-11: 2-D
         {("softmax", "axis"): [V(3, fires=True), V(-1, fires=True), V(1, fires=False), V(2, fires=False),
                                V(None, fires=False)],
          ("transpose", "perm"): [V([0, 2, 3, 1], fires=True)]}, opset=11,
         base={"softmax": {"axis": 3}}),      # (Softmax-11's default axis 1 is not attention's)
    Spec("FuseConvAdd", g_conv_add, {"conv": "Conv"}, _keyed("conv", CONV_V)),
    Spec("FuseConvAdd", g_conv_add_const, {"conv": "Conv"},               # the addend goes into the bias
         {("conv", "group"): [V(2, fires=True), V(2, {("conv_bias", "on"): False}, fires=True)],
          ("conv", "strides"): [V([2, 2], fires=True)],
          ("conv", "auto_pad"): [V("SAME_LOWER", {"strides": [2, 2]}, fires=True)]},
         not_swept={("conv", a): "swept with a runtime addend" for a in ("dilations", "kernel_shape", "pads")}),
    Spec("FuseConvActivation", g_conv_act, {"conv": "Conv"} | ACT_OPS, _act_sweep("conv", CONV_V), opset=20),
    Spec("FuseConvActivation", g_conv_act, {"conv": "Conv", "clip": "Clip"},        # Clip-6: attributes
         {("clip", "min"): [V(-0.25, fires=True), V(-math.inf, fires=True)],
          ("clip", "max"): [V(0.5, fires=True), V(math.inf, fires=True)]},   # (Clip-6 needs min <= max)
         not_swept={("conv", a): "swept at opset 20" for a in CONV_V}, opset=10, base={"clip": {}}),
    Spec("FuseConvActivation", g_conv_add_act, {"conv": "Conv", "leakyrelu": "LeakyRelu", "gelu": "Gelu"},
         {("conv", "group"): [V(2, fires=True)], ("conv", "strides"): [V([2, 2], fires=True)],
          ("conv", "dilations"): [V([2, 2], fires=True)],
          ("conv", "auto_pad"): [V("SAME_LOWER", {"strides": [2, 2]}, fires=True)],
          ("leakyrelu", "alpha"): [V(0.5, fires=True)], ("gelu", "approximate"): [V("tanh", fires=True)]},
         not_swept={("conv", a): "swept on a plain Conv" for a in ("kernel_shape", "pads")}, opset=20),
    Spec("FuseMatMulActivation", g_matmul_bias_act, {"leakyrelu": "LeakyRelu", "gelu": "Gelu", "clip": "Clip"},
         {("leakyrelu", "alpha"): [V(0.5, fires=True)], ("gelu", "approximate"): [V("tanh", fires=True)],
          ("clip", "input:min"): [V(-0.25, fires=True)], ("clip", "input:max"): [V(None, fires=True)]},
         opset=20),
    Spec("FuseMatMulBias", g_matmul_bias, {"matmul": "MatMul"}, {("matmul", None): [V(None, fires=True)]}),
    Spec("FuseMatMulActivation", g_matmul_act, {"matmul": "MatMul"} | ACT_OPS, _act_sweep("matmul", {}), opset=20),
    Spec("ActivationBeforeReshape", g_gemm_reshape_act, {"gemm": "Gemm", "reshape": "Reshape", "gelu": "Gelu"},
         {("reshape", "allowzero"): [V(1, fires=True)], ("gelu", "approximate"): [V("tanh", fires=True)]},
         not_swept={("gemm", a): "swept by FuseGemmActivation" for a in GEMM_V}, opset=20),
    Spec("FuseGemmActivation", g_gemm_act, {"gemm": "Gemm"} | ACT_OPS, _act_sweep("gemm", GEMM_V), opset=20),
    # O3
    Spec("ApproximateGelu", g_gelu_op, {"gelu": "Gelu"},
         {("gelu", "approximate"): [V("none", fires=True), V("tanh", fires=False)]}, opset=20, level=3, atol=1e-3),
    # quantization (compiler/rules/quantize.py): outputs within one quantization step
    Spec("QuantizeConv", g_qconv, {"conv": "Conv"}, _keyed("conv", CONV_V), opset=21, atol=Q_STEP * 1.001),
    Spec("FoldBatchNormIntoConvIntegerToFloat", g_qconv_bn, {"bn": "BatchNormalization"}, _keyed("bn", BN_V),
         opset=21, atol=Q_STEP * 1.001),
    Spec("FoldQuantizeScaleIntoConvIntegerToFloat", g_qconv, {"conv": "Conv"}, {},
         not_swept={("conv", a): "swept by QuantizeConv (the same graph)"
                    for a in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")},
         opset=21, atol=Q_STEP * 1.001),
    Spec("QuantizeMatMul", g_qmatmul, {"matmul": "MatMul"}, {}, opset=21, atol=Q_STEP * 1.001),
    Spec("FoldQuantizeScaleIntoMatMulIntegerToFloat", g_qmatmul, {"matmul": "MatMul"}, {}, opset=21,
         atol=Q_STEP * 1.001),
    Spec("FoldQuantizeScaleIntoAdd", g_qresidual, {"add": "Add"}, {}, opset=21, atol=Q_STEP * 1.001),
    Spec("QuantizeMatMulActivations", g_qmatmul_act, {"matmul": "MatMul"}, {}, opset=21, atol=Q_STEP * 1.001),
    Spec("QuantizeGemm", g_qgemm, {"gemm": "Gemm"},
         {("gemm", "alpha"): [V(0.5, fires=True)], ("gemm", "beta"): [V(2.0, fires=True), V(0.0, fires=True)],
          ("gemm", "transB"): [V(1, fires=True)], ("gemm", "transA"): [V(1, fires=False)]},
         opset=21, atol=Q_STEP * 1.001),
    Spec("DynamicMatMulToFloat", g_dynamic_matmul, {"cast": "Cast"},
         {("cast", "saturate"): [V(0, fires=True)]},
         not_swept={("cast", "to"): "the rule wants FLOAT (the chain quantize_dynamic writes)"}, opset=21),
    Spec("FoldBiasIntoMatMulIntegerToFloat", g_dynamic_matmul, {"cast": "Cast"}, {},
         not_swept={("cast", "saturate"): "swept by DynamicMatMulToFloat (the same graph)",
                    ("cast", "to"): "the rule wants FLOAT (the chain quantize_dynamic writes)"}, opset=21),
    Spec("DynamicConvToFloat", g_dynamic_conv, {"conv": "ConvInteger"}, _keyed("conv", CONV_V), opset=21),
    Spec("FoldBiasIntoConvIntegerToFloat", g_dynamic_conv, {"conv": "ConvInteger"}, {},
         not_swept={("conv", a): "swept by DynamicConvToFloat (the same graph)"
                    for a in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}, opset=21),
    Spec("QuantizedConvPatchifyToMatMul", g_dynamic_conv_patch, {"conv": "ConvInteger"},
         PATCH_V, base=PATCH_BASE, opset=21),
    Spec("DropQDQAroundDataMovement", g_qdq_transpose, {"transpose": "Transpose"},
         {("transpose", "perm"): [V([2, 0, 1], fires=True), V(None, fires=True)]},
         base={"transpose": {"perm": [0, 2, 1]}}, opset=21, atol=Q_STEP * 1.001),
    Spec("DropActivationBeforeSaturatingQuantize", g_relu_q, {"relu": "Relu"}, {}, opset=21),
    Spec("QuantizedElementwiseToTable", g_qtable, {"act": "LeakyRelu"},
         {("act", "alpha"): [V(0.5, fires=True), V(0.01, fires=True)]}, opset=21, atol=Q_STEP * 1.001),
    Spec("FoldRequantizeScale", g_qrequant, {"dq": "DequantizeLinear", "q": "QuantizeLinear"},
         {("dq", "axis"): [V(0, fires=True)], ("q", "axis"): [V(2, fires=True)]},
         not_swept={("dq", "block_size"): "blocked quantization needs a scale per block (the rule refuses it)",
                    ("q", "block_size"): "blocked quantization needs a scale per block (the rule refuses it)",
                    ("q", "saturate"): "defined for float8 outputs only",
                    ("q", "output_dtype"): "the zero point gives the output's dtype"},
         opset=21, atol=Q_STEP * 1.001),
    Spec("ConcatOnInt8", g_qconcat, {"concat": "Concat"},
         {("concat", "axis"): [V(0, fires=True), V(-1, fires=True), V(3, fires=True)]}, opset=21,
         atol=Q_STEP * 1.001),
]

def _combos(full: bool = FULL):
    out = []
    for s in SPECS:
        out.append((s, None, None, V(None, fires=True)))      # the base case
        for (role, attr), vs in s.sweep.items():
            if role is None and attr is None:
                continue
            for v in vs:
                if v.full_only and not full:
                    continue
                out.append((s, role, attr, v))
    return out


COMBOS = _combos()


def _in_default_suite(combos) -> list[bool]:
    """Per combination: does ``make test`` run it (else it is marked heavy)? The base cases,
    the first value of each (spec, role, attribute), and the values the rule must not fire for."""
    seen, out = set(), []
    for s, role, attr, v in combos:
        key = (id(s), role, attr)
        out.append((role is None and attr is None) or key not in seen or v.fires is False)
        seen.add(key)
    return out


def _id(c):
    s, role, attr, v = c
    if role is None and attr is None:
        return f"{s.rule}-base"
    extra = "".join(f",{'.'.join(k) if isinstance(k, tuple) else k}={x}" for k, x in v.extra.items())
    return f"{s.rule}-{role}.{attr}={v.value}{extra}"


def _overrides(s: Spec, role, attr, v: V) -> dict:
    ov = {k: dict(a) for k, a in s.base.items()}
    ov["_opset"] = s.opset           # the builders make models of the spec's opset
    if role is not None:
        a = ov.setdefault(role, {})
        if attr is not None:
            a[attr] = v.value
        for k, x in v.extra.items():     # "attr" of the same op, or (role, attr) of another
            if isinstance(k, tuple):
                ov.setdefault(k[0], {})[k[1]] = x
            else:
                a[k] = x
    return ov


def _compare(got, want, atol, what):
    assert len(got) == len(want), what
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.dtype == e.dtype and g.shape == e.shape, \
            f"{what} output {i}: {g.dtype}{list(g.shape)}, onnxruntime {e.dtype}{list(e.shape)}"
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=atol, err_msg=f"{what} output {i}")


@pytest.mark.parametrize("combo", [pytest.param(c, id=_id(c), marks=[] if light else [pytest.mark.heavy])
                                   for c, light in zip(COMBOS, _in_default_suite(COMBOS))])
def test_rule_across_attribute_values(combo):
    s, role, attr, v = combo
    model, feeds = s.build(_overrides(s, role, attr, v))
    want = ort_run(model, feeds)
    what = _id(combo)
    refused = {}
    fired = None
    for lvl in (0, s.level):
        try:
            mod = tensorfuse.compile(model, opt_level=lvl, cache=False)
        except TensorfuseError as e:      # our documented error: then at every level
            refused[lvl] = e
            continue
        _compare(mod.run(**feeds), want, s.atol, f"{what} at O{lvl}")
        if lvl == s.level:
            log = mod.rewrite_log
            fired = any(a.rule == s.rule for a in log)
    if refused:
        assert len(refused) == 2 and type(refused[0]) is type(refused[s.level]), \
            f"{what}: refused at some levels only: {refused}"
        return
    if not fired:
        ex = explain(model, s.rule, opt_level=s.level)
        assert ex, f"{what}: {s.rule} did not fire and explain finds no candidate node"
        for r in ex:
            if r.matched:     # then another rule of the same pass took the nodes first
                took = [a for a in log if set(a.nodes) & set(r.nodes)]
                assert took, f"{what}: {s.rule} did not fire but explain says it applies: {ex}"
            else:
                assert r.reason, f"{what}: explain gives no reason: {ex}"
    if v.fires is not None:
        assert fired == v.fires, f"{what}: {s.rule} {'did not fire' if v.fires else 'fired'}" + (
            "" if fired else f"; explain: {explain(model, s.rule, opt_level=s.level)}")


# ----------------------------------------------------------------------------- coverage of the sweep
def test_every_rule_of_the_catalogue_is_swept_and_fires_in_its_base_case():
    specs = {s.rule for s in SPECS}
    assert specs == set(all_rules()), (f"rules without a sweep: {sorted(set(all_rules()) - specs)}; "
                                       f"sweeps of unknown rules: {sorted(specs - set(all_rules()))}")
    bases = [c for c in COMBOS if c[1] is None and c[2] is None]
    assert {c[0].rule for c in bases} == specs and all(c[3].fires for c in bases)


def test_every_attribute_of_every_matched_op_is_swept():
    missing = []
    for s in SPECS:
        for role, op in s.ops.items():
            schema = onnx.defs.get_schema(op, s.opset)
            for attr in schema.attributes:
                if (role, attr) not in s.sweep and (role, attr) not in s.not_swept:
                    missing.append(f"{s.rule}: {op} ({role}).{attr}")
    assert not missing, "attributes neither swept nor listed as not swept:\n" + "\n".join(missing)


def test_the_sweep_exercises_enough_combinations():
    n = len(COMBOS)
    assert n >= 260, n
    # and real values: 224 combinations set an attribute or input of a matched op (the others
    # are base cases, attribute-free activations, ops without attributes)
    assert sum(1 for c in COMBOS if c[2] is not None) >= 220
