#!/usr/bin/env bash
# The inference table of docs/inference.md's GPU section in one device call (a few minutes; the pt2 compiles take
# most of it): a fresh nano checkpoint with 80 classes (latency does not depend on the weights), then `detector
# benchmark` at 640 px, batch 1 and batch 32, for every backend present, logged under $OUT.
#
#   bash benchmarks/gpu_inference.sh                 # on the GPU machine, from the repository root
#   DEVICE=cpu SKIP=pt2 bash benchmarks/gpu_inference.sh   # the same on a CPU, without the pt2 compile
#   SKIP=onnx,engine THROUGHPUT=0 bash benchmarks/gpu_inference.sh   # batch 1 only: PyTorch's graphs against pt2
set -euo pipefail
OUT=${OUT:-/tmp/out}; DEVICE=${DEVICE:-cuda}; SKIP=${SKIP:-}; RUNS=${RUNS:-50}; LIMIT=${LIMIT:-540}  # s, the benchmark
THROUGHPUT=${THROUGHPUT:-32}  # images per call of the throughput column; 0: none (each pt2 batch size is a compile)
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
"$PYTHON" - "$OUT/nano80.pt" <<'PY'
import sys

from detector.checkpoint import save_checkpoint
from detector.model import build_model

model = build_model(num_classes=80, scale="n")
save_checkpoint({"model": model.state_dict(), "ema": None, "epoch": 0, "config": {"imgsz": 640},
                 "model_args": {"num_classes": 80, "scale": "n", "reg_max": model.reg_max},
                 "names": [f"class{index}" for index in range(80)]}, sys.argv[1])
PY
timeout "$LIMIT" "$PYTHON" -m detector benchmark --weights "$OUT/nano80.pt" --imgsz 640 --device "$DEVICE" \
  --runs "$RUNS" --throughput-runs 5 --throughput-batch "$THROUGHPUT" ${SKIP:+--skip "$SKIP"} 2>&1 \
  | tee "$OUT/inference.log"
rm -f "$OUT/nano80.pt"
