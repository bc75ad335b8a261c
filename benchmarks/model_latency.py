"""Batch-1 latency of each model scale through the PyTorch backend ``predict`` and ``val`` use for ``.pt`` weights.

Each scale is built with random weights (speed does not depend on them; 80 classes, as COCO) and prepared as
:class:`~detector.inference.torch_backend.TorchBackend` prepares a checkpoint: BatchNorm folded, channels-last,
weights converted once. The process is tuned as the inference commands tune it (``tune_process``: on the CPU,
freed memory kept in the heap). Printed: a markdown row per scale with parameters and the median latency of
the timed calls, pre- and post-processing excluded (``python -m detector benchmark`` times those, per backend).

    python benchmarks/model_latency.py                             # every scale, 640 px, on the CPU
    python benchmarks/model_latency.py --models n s --runs 20      # fewer scales, more calls
    python benchmarks/model_latency.py --device cuda               # on a GPU: FP32 here, add --half for FP16
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import time

import torch

from detector.architecture import MODEL_NAMES
from detector.device import resolve_device
from detector.inference.torch_backend import TorchBackend, half_precision
from detector.model import YOLO, build_model
from detector.model.metadata import ModelInfo
from detector.tuning import tune_process
from detector.workflows.benchmark import device_name



def time_model(model: YOLO, *, imgsz: int, device: torch.device, precision: str, runs: int, warmup: int) -> float:
    """Median milliseconds of one batch-1 forward pass of ``model``'s prepared copy with the box decode."""
    info = ModelInfo(names=[str(i) for i in range(80)], strides=tuple(model.strides), imgsz=imgsz, dynamic=True)
    backend = TorchBackend(model, info, device=str(device), precision=precision)
    image = torch.randint(0, 256, (1, 3, imgsz, imgsz), dtype=torch.uint8)
    times = []
    for index in range(warmup + runs):
        start = time.perf_counter()
        backend.infer(image)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODEL_NAMES), choices=MODEL_NAMES)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--half", action="store_true", help="FP16 on CUDA, BF16 on a CPU with native BF16")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    device = resolve_device(args.device)
    tune_process(device)  # before the first convolution, as the commands do
    precision = half_precision(device) if args.half else "fp32"
    print(f"{device_name(str(device))}, {torch.get_num_threads()} torch threads, {precision}, {args.imgsz} px, "
          f"batch 1, median of {args.runs} calls after {args.warmup}")
    print("\n| `--model` | parameters | latency ms |\n|---|---:|---:|")
    for scale in args.models:
        model = build_model(num_classes=80, scale=scale)
        parameters = sum(p.numel() for p in model.parameters()) / 1e6  # before BatchNorm folds into the copy
        milliseconds = time_model(model, imgsz=args.imgsz, device=device, precision=precision, runs=args.runs,
                                  warmup=args.warmup)
        print(f"| `{scale}` | {parameters:.2f} M | {milliseconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
