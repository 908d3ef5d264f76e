"""Time tensorfuse's cuda target against PyTorch eager on the same GPU (run by gpu_check.sh).

    python benchmarks/gpu_bench.py [--repeat 50] [--out table.md] [--precision tf32|fp32]
        [--models resnet18:1,mobilenet_v2:1,bert_mini:1,resnet50:1,resnet50:32]

Models (NAME:BATCH): torchvision's resnet18, resnet50 and mobilenet_v2 (3x224x224, PyTorch in
channels_last) and a BERT-mini encoder from transformers (4 layers, hidden 256, 4 heads, 128
tokens), random weights, exported to ONNX here with ``torch.onnx.export``. ``--precision``
applies to both sides: tf32 (default; issue 21's comparison "PyTorch eager channels_last with
TF32 on": ``torch.backends.cudnn.allow_tf32`` and ``torch.backends.cuda.matmul.allow_tf32`` set,
tensorfuse compiled with ``precision="tf32"``) or fp32 (both off). Each side runs ``--warmup``
times, then ``--repeat`` timed runs; a run's time is CUDA-event time around it (ms); the table
gives medians and the ratio tensorfuse / PyTorch. Inputs are torch CUDA tensors, which
tensorfuse takes through ``__cuda_array_interface__`` (no host copy), and its outputs stay on the
device (``return_device=True``). Also checks that both sides agree (max abs difference). Each
row is printed as soon as it is measured.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import numpy as np


def _models(spec: str):
    import torch
    import torchvision
    out = []
    for item in spec.split(","):
        name, _, batch = item.strip().partition(":")
        batch = int(batch or 1)
        if name == "bert_mini":
            from transformers import BertConfig, BertModel
            cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
            class Encoder(torch.nn.Module):     # keyword arguments: transformers 5 moved the positions
                def __init__(self):
                    super().__init__()
                    self.bert = BertModel(cfg)

                def forward(self, ids, mask):
                    return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

            bert = Encoder().eval().cuda()
            ids = torch.randint(0, cfg.vocab_size, (batch, 128), device="cuda")
            mask = torch.ones(batch, 128, dtype=torch.int64, device="cuda")
            out.append((f"bert_mini b{batch}", bert, (ids, mask), False))
            continue
        ctor = getattr(torchvision.models, name)
        m = ctor(weights=None).eval().cuda()
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        out.append((f"{name} b{batch}", m, (x,), True))
    return out


def _time(fn, warmup: int, repeat: int) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--precision", choices=("tf32", "fp32"), default="tf32",
                   help="both sides: TF32 on (PyTorch's allow_tf32 flags; tensorfuse precision='tf32') or off")
    p.add_argument("--models", default="resnet18:1,mobilenet_v2:1,bert_mini:1,resnet50:1,resnet50:32",
                   help="NAME:BATCH,... (resnet18, resnet50, mobilenet_v2 or any torchvision model; bert_mini)")
    a = p.parse_args(argv)
    import torch
    tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32

    import tensorfuse
    rows = ["| model | tensorfuse cuda ms | PyTorch eager ms | ratio | compile s | max abs diff | max abs diff / max abs |",
            "|---|---|---|---|---|---|---|"]
    tmp = tempfile.mkdtemp()
    print(f"precision {a.precision} on both sides", flush=True)
    import time
    for name, model, inputs, cnn in _models(a.models):
        path = os.path.join(tmp, name.replace(" ", "_") + ".onnx")
        try:
            with torch.no_grad():
                torch.onnx.export(model, inputs, path, opset_version=17, dynamo=False)
                if cnn:
                    model = model.to(memory_format=torch.channels_last)
                    inputs = tuple(t.to(memory_format=torch.channels_last) for t in inputs)
                t0 = time.perf_counter()
                mod = tensorfuse.compile(path, target="cuda", cache=False, precision=a.precision)
                compile_s = time.perf_counter() - t0
                ours = lambda: mod.run(*[t.contiguous() for t in inputs], return_device=True)  # noqa: E731
                theirs = lambda: model(*inputs)  # noqa: E731
                got = mod.run(*[t.contiguous().cpu().numpy() for t in inputs])[0]
                want = theirs()
                want = (want.last_hidden_state if hasattr(want, "last_hidden_state") else want).float().cpu().numpy()
                diff = float(np.max(np.abs(got - want)))
                rel = diff / max(float(np.max(np.abs(want))), 1e-30)
                t_ours = _time(ours, a.warmup, a.repeat)
                t_theirs = _time(theirs, a.warmup, a.repeat)
            rows.append(f"| {name} | {t_ours:.3f} | {t_theirs:.3f} | {t_ours / t_theirs:.2f}x | {compile_s:.1f} | "
                        f"{diff:.2e} | {rel:.2e} |")
        except Exception as e:      # one model's failure must not lose the others' rows
            rows.append(f"| {name} | error: {type(e).__name__}: {str(e)[:200]} | | | | | |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
