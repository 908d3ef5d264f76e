#!/usr/bin/env bash
# The cuda target on a real GPU, in one prepared run (it installs nothing):
#   1. resnet18, mobilenet_v2, bert_mini (batch 1, 128 tokens) and resnet50 (batch 1 and 32)
#      compiled with tensorfuse's cuda target and timed against PyTorch eager (channels_last for the
#      CNNs), TF32 on for both (gpu_bench.py --precision; GPU_BENCH_ARGS passes more), on the same
#      GPU: median of CUDA-event timings after warm-up, written as a table, a row at a time;
#   2. the GPU tests (tests/cuda) without the simulator, in GPU_TEST_WORKERS processes (default 8);
#   3. one summary line.
# Each step has a time limit (GPU_BENCH_TIMEOUT, default 420 s; GPU_TESTS_TIMEOUT, default 600 s), so
# that a lease of a few minutes still brings back what finished.
# Needs: python3 with numba-cuda, onnx, onnxruntime, torch, torchvision, transformers and
# pytest-xdist (the device image has them); the PyTorch models are built there with random weights
# and exported to ONNX, so no model files have to travel.
#   usage: bash benchmarks/gpu_check.sh [OUT_DIR]      (default: ./gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-gpu-check}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
# the repository root is the tensorfuse package: make it importable under that name
SHIM="$(mktemp -d)"; ln -s "$PWD" "$SHIM/tensorfuse"
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NUMBA_ENABLE_CUDASIM=0 TENSORFUSE_GPU_TESTS=1
nvidia-smi -L 2>&1 | tee "$OUT/gpu.txt"
echo "== models against PyTorch eager"
timeout "${GPU_BENCH_TIMEOUT:-420}" "$PY" benchmarks/gpu_bench.py --out "$OUT/gpu_table.md" ${GPU_BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/gpu_bench.txt"
echo "== GPU tests (no simulator)"
timeout "${GPU_TESTS_TIMEOUT:-600}" "$PY" -m pytest -q -p no:cacheprovider -n "${GPU_TEST_WORKERS:-8}" tests/cuda 2>&1 \
    | tee "$OUT/gpu_tests.txt" | tail -25
echo "== summary"
rows=$(grep "^| [a-z]" "$OUT/gpu_bench.txt" 2>/dev/null | sort -u | wc -l)
echo "gpu_check: models timed: ${rows:-0} (rows in $OUT/gpu_bench.txt); GPU tests: $(tail -1 "$OUT/gpu_tests.txt")"
