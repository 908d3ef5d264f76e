"""Export real architectures that are not in ../shared/models to ONNX, for benchmarks and tuning.

Random weights, seeded (``torch.manual_seed(0)``); the models come from ``transformers`` (configs
of the published architectures, built without downloading weights). Convolutions get He-normal
weights and BatchNorms trained-like statistics (``_conv_init``), so CNN activations keep their
magnitude through the network. Each model is exported with
both torch exporters: TorchScript (``dynamo=False``, file ``NAME.ts.onnx``) and the default
(``torch.export``, ``NAME.dynamo.onnx``), opset 17 or the exporter's default. The files go to
``--out`` (never into the repository). torch, transformers and onnxscript are benchmark-only
dependencies: the tests never need them. Usage::

    python benchmarks/export_models.py --out /work/exported [--exporter ts dynamo] [NAME ...]

Names: vit_b_16 (ViT-Base/16, 224x224, 197 tokens), gpt2_small (12 layers, 64 tokens),
bert_base (128 tokens), distilbert (128 tokens), convnext_tiny, resnet50, regnet_y_800mf
(RegNet-Y 800MF-like config), swin_tiny, mobilenet_v2_hf (transformers' MobileNetV2),
efficientnet_b0, t5_encoder (t5-small encoder, 64 tokens), whisper_tiny_encoder (80x3000 mel).
After export each file is checked with ``onnx.checker`` and run once through onnxruntime
against torch's output (max abs difference printed).
"""
from __future__ import annotations

import argparse
import pathlib
import sys


def _models():
    import torch
    import transformers as tr

    def vision(cfg_cls, model_cls, size=224, **kw):
        def make():
            m = model_cls(cfg_cls(**kw)).eval()
            return m, (torch.randn(1, 3, size, size),), ["pixel_values"]
        return make

    def text(cfg_cls, model_cls, seq, vocab, **kw):
        def make():
            m = model_cls(cfg_cls(**kw)).eval()
            ids = torch.randint(0, vocab, (1, seq))
            return m, (ids,), ["input_ids"]
        return make

    def t5_encoder():
        cfg = tr.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128)
        m = tr.T5EncoderModel(cfg).eval()
        return m, (torch.randint(0, 32128, (1, 64)),), ["input_ids"]

    def whisper_encoder():
        cfg = tr.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4,
                               decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536)
        m = tr.WhisperModel(cfg).get_encoder().eval()
        return m, (torch.randn(1, 80, 3000),), ["input_features"]

    return {
        "vit_b_16": vision(tr.ViTConfig, tr.ViTModel),
        "gpt2_small": text(tr.GPT2Config, tr.GPT2Model, 64, 50257),
        "bert_base": text(tr.BertConfig, tr.BertModel, 128, 30522),
        "distilbert": text(tr.DistilBertConfig, tr.DistilBertModel, 128, 30522),
        "convnext_tiny": vision(tr.ConvNextConfig, tr.ConvNextModel),
        "resnet50": vision(tr.ResNetConfig, tr.ResNetModel, depths=[3, 4, 6, 3], layer_type="bottleneck",
                           hidden_sizes=[256, 512, 1024, 2048]),
        "regnet_y_800mf": vision(tr.RegNetConfig, tr.RegNetModel, depths=[1, 3, 8, 2],
                                 hidden_sizes=[64, 144, 320, 784], groups_width=16, layer_type="y"),
        "swin_tiny": vision(tr.SwinConfig, tr.SwinModel),
        "mobilenet_v2_hf": vision(tr.MobileNetV2Config, tr.MobileNetV2Model),
        # EfficientNetConfig's defaults are B7 (width 2.0, depth 3.1, 600x600): B0's coefficients
        "efficientnet_b0": vision(tr.EfficientNetConfig, tr.EfficientNetModel, width_coefficient=1.0,
                                  depth_coefficient=1.0, image_size=224, hidden_dim=1280, dropout_rate=0.2),
        "t5_encoder": t5_encoder,
        "whisper_tiny_encoder": whisper_encoder,
    }


class _FirstOutput:
    """Wraps a transformers model so the export has one output: last_hidden_state."""

    def __new__(cls, model):
        import torch

        class W(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *args):
                out = self.m(*args)
                return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state
        return W(model).eval()


def _conv_init(model) -> None:
    """He-normal convolution weights and BatchNorm statistics of a trained network's order of
    magnitude (scale, variance in [0.5, 1.5], shift and mean within +-0.1), in place.
    transformers' own initialisation (normal, std 0.02, unit BatchNorm) makes deep CNNs'
    activations vanish: EfficientNet-B0's output was exactly 0 and MobileNetV2's about 1e-21,
    so no numerical comparison could fail and denormal arithmetic could distort the timings."""
    import torch
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                fan_in = m.weight[0].numel()
                m.weight.normal_(0.0, (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.uniform_(-0.1, 0.1)
            elif isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def export(name: str, make, out: pathlib.Path, exporters: list[str]) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    torch.manual_seed(0)
    model, args, in_names = make()
    _conv_init(model)
    model = _FirstOutput(model)
    with torch.no_grad():
        ref = model(*args).numpy()
    for ex in exporters:
        path = out / f"{name}.{ex}.onnx"
        if ex == "ts":
            torch.onnx.export(model, args, str(path), input_names=in_names, output_names=["output"],
                              opset_version=17, dynamo=False)
        else:
            torch.onnx.export(model, args, str(path), input_names=in_names, output_names=["output"],
                              dynamo=True, external_data=False)
        m = onnx.load(str(path))
        onnx.checker.check_model(m)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
        print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB, nodes {len(m.graph.node)}, "
              f"max abs diff vs torch {float(np.max(np.abs(got - ref))):.2e}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models to export (default: all)")
    ap.add_argument("--out", type=pathlib.Path, required=True, help="folder for the .onnx files")
    ap.add_argument("--exporter", nargs="+", choices=["ts", "dynamo"], default=["ts", "dynamo"])
    a = ap.parse_args()
    models = _models()
    bad = [n for n in a.names if n not in models]
    if bad:
        ap.error(f"unknown model(s) {bad}; known: {', '.join(models)}")
    a.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in a.names or list(models):
        try:
            export(name, models[name], a.out, a.exporter)
        except Exception as e:      # one model's failure does not stop the others
            failed += 1
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
