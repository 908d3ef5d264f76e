"""BatchNormalization in inference mode (ONNX operator spec, section "BatchNormalization";
IR semantics: BatchNormalization-15 with training_mode=0).

    Y = (X - input_mean) / sqrt(input_var + epsilon) * scale + B

per channel (dim 1). Training mode (running statistics as outputs) is not supported:
tensorfuse compiles inference graphs. Older versions are imported here: BatchNormalization-7
(``spatial``; ``spatial=0`` means per-activation statistics of shape [C, D1, ..., Dn]) and
BatchNormalization-9 (outputs beyond Y mean training, as onnxruntime reads them).
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from tensorfuse.ir.ops.conv import FLOAT_TYPES
from tensorfuse.ir.registry import OpPatternKind, ShapeError, op
from tensorfuse.ir.types import DType
from tensorfuse.ir.kernel import as_expr, unop

_NAMES = ("X", "scale", "B", "input_mean", "input_var")


def _check_inference(node_training_mode: int) -> None:
    if int(node_training_mode or 0) != 0:
        raise ShapeError("training_mode=1 is not supported: tensorfuse compiles inference graphs "
                         "(export the model in eval mode)")


def _compute_dtype(*dts: DType) -> np.dtype:
    return np.dtype(np.float64) if DType.f64 in dts else np.dtype(np.float32)


def _import(ctx, proto, version):
    attrs = ctx.attrs(proto)
    extra = [o for o in proto.output[1:] if o]
    if version >= 14:
        _check_inference(attrs.get("training_mode", 0))
    if extra:
        raise ShapeError(f"outputs {extra} (running or saved statistics) exist only in training mode, "
                         f"which tensorfuse does not support: export the model in eval mode")
    spatial = int(attrs.pop("spatial", 1))
    attrs.pop("is_test", None)
    attrs.pop("consumed_inputs", None)
    ins = [ctx.value(n) for n in proto.input]
    single = onnx.NodeProto()
    single.CopyFrom(proto)
    del single.output[1:]
    x = ins[0]
    if spatial == 0 and x.type.rank > 2 and ins[1] is not None and tuple(ins[1].shape) == tuple(x.shape[1:]):
        # per-activation statistics: BN over a flattened [N, C*D1*...*Dn] tensor is the same thing
        b = ctx.builder
        flat = int(np.prod(x.shape[1:]))
        x2 = b.op("Reshape", x, b.const(np.array([x.shape[0], flat], np.int64), "bn_shape"))
        ps = [b.op("Reshape", p, b.const(np.array([flat], np.int64), "bn_pshape")) for p in ins[1:5]]
        y2 = b.op("BatchNormalization", x2, *ps, name=ctx.node_name(proto),
                  **{k: v for k, v in attrs.items() if k in ("epsilon", "momentum")})
        y = b.op("Reshape", y2, b.const(np.array(x.shape, np.int64), "bn_yshape"),
                 out_names=[proto.output[0]], exact_names=True)
        return y
    return ctx.default_import(single, inputs=ins, attrs=attrs)


@op("BatchNormalization", OpPatternKind.OPAQUE)
class BatchNormalization:
    """Inference-mode batch normalization over channel dim 1. ONNX spec: BatchNormalization-15.

    Inputs: X [N, C, D1..Dn] (rank >= 2, f16/bf16/f32/f64), scale and B [C] (one float dtype),
    input_mean and input_var [C] (one float dtype). Output Y: X's type. Attribute epsilon
    (default 1e-5); momentum is accepted and unused in inference. Raises ShapeError for
    training_mode=1, parameter shapes other than [C], non-float dtypes.
    """

    importer = _import

    def infer(node):
        _check_inference(node.attr("training_mode", 0))
        ins = [node.input(i) for i in range(5)]
        for v, name in zip(ins, _NAMES):
            if v is None:
                raise ShapeError(f"input {name} is required")
            if v.dtype not in FLOAT_TYPES:
                raise ShapeError(f"{name} has dtype {v.dtype}; BatchNormalization takes float tensors")
        x = ins[0]
        if x.type.rank < 2:
            raise ShapeError(f"X must have rank >= 2 ([N, C, ...]), got shape {list(x.shape)}")
        c = x.shape[1]
        for v, name in zip(ins[1:], _NAMES[1:]):
            if tuple(v.shape) != (c,):
                raise ShapeError(f"{name} must have shape [{c}] (X has {c} channels), got {list(v.shape)}")
        if ins[1].dtype != ins[2].dtype:
            raise ShapeError(f"scale ({ins[1].dtype}) and B ({ins[2].dtype}) must have one dtype")
        if ins[3].dtype != ins[4].dtype:
            raise ShapeError(f"input_mean ({ins[3].dtype}) and input_var ({ins[4].dtype}) must have one dtype")
        return [x.type]

    def reference(node, ins):
        x, scale, b, mean, var = ins[:5]
        cd = _compute_dtype(*(DType.from_numpy(a.dtype) for a in ins[:5]))
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        eps = float(node.attr("epsilon", 1e-5))
        a = scale.astype(cd) / np.sqrt(var.astype(cd) + cd.type(eps))
        shift = b.astype(cd) - mean.astype(cd) * a      # as onnxruntime: x * a + (B - mean * a)
        y = x.astype(cd) * a.reshape(shape) + shift.reshape(shape)
        return [y.astype(x.dtype)]

    def lower(ctx):
        x, scale, bias, mean, var = ctx.inputs[:5]
        y = ctx.outputs[0]
        cdt = DType.f64 if DType.f64 in (x.dtype, scale.dtype, mean.dtype) else DType.f32
        eps = float(ctx.attr("epsilon", 1e-5))
        n, c = x.shape[:2]
        plane = math.prod(x.shape[2:])
        kb = ctx.kernel()
        # the coefficients live in a local buffer so that the inner loop's loads of them do not
        # depend on the (possibly aliasing) stores to y and are hoisted
        coef = kb.local(cdt, (2,), hint="coef")
        with kb.loop(n * c, kind="parallel", hint="nc") as nc:
            ch = nc % c if c > 1 else as_expr(0)
            a = scale[ch].cast(cdt) / unop("sqrt", var[ch].cast(cdt) + as_expr(eps, cdt))
            kb.store(coef, 0, a)
            kb.store(coef, 1, bias[ch].cast(cdt) - mean[ch].cast(cdt) * coef[0])
            with kb.loop(plane, kind="vectorize", hint="i") as i:
                off = nc * plane + i
                kb.store(y, off, (x.flat(off).cast(cdt) * coef[0] + coef[1]).cast(y.dtype))

    def flops(node):
        return 2.0 * node.inputs[0].type.numel
