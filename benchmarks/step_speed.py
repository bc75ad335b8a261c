"""The bare training step (forward, loss, backward, optimizer), without the data loader: what each lever buys.

Each row runs in its own process, because oneDNN reads its kernel-cache size once per process. Batches come
from the built-in dataset (mosaic on, cached in RAM), so the loss sees realistic targets.

    python benchmarks/step_speed.py                  # 320 px, batch 16, nano model
    python benchmarks/step_speed.py --cycles 4 --compile

Rows: FP32 / BF16 autocast, NCHW / channels-last, one fixed size / the default multi-scale sizes in turn
(160-480 px at 320), and under multi-scale oneDNN's default kernel cache (1024) against the one detector sets
and glibc's default heap against the held one the trainer sets (detector/runtime.py explains both).
Prints a markdown table of images/s and milliseconds per phase (input: resize + float conversion).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass

import torch
from isolated import run_isolated

from detector.multiscale import MultiScale
from detector.runtime import ONEDNN_CACHE_ENV

ROW = r"""
import json, sys, time
import torch
from detector.runtime import enlarge_onednn_cache
enlarge_onednn_cache()  # as every run does first thing, before any convolution
from detector.data.augment import AugmentConfig
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data.spec import load_dataset_spec
from detector.data.synthetic import generate_shapes
from detector.engine import step_input
from detector.multiscale import MultiScale
from detector.loss import DetectionLoss
from detector.model import build_model
from detector.runtime import hold_freed_memory

args = json.loads(sys.argv[1])
if not args["default_heap"]:
    hold_freed_memory()  # as the trainer does on the CPU
torch.manual_seed(0)
spec = load_dataset_spec(generate_shapes())
model = build_model(num_classes=spec.num_classes, scale="n").train()
if args["channels_last"]:
    model.to(memory_format=torch.channels_last)
criterion = DetectionLoss(num_classes=spec.num_classes, strides=model.strides)
optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9, nesterov=True)
dataset = build_split(spec, "train", image_size=args["imgsz"], augment=AugmentConfig(), cache="ram").dataset
batches = [collate([dataset[(i + b * args["batch"], 0, True)] for i in range(args["batch"])]) for b in range(6)]
ladder = MultiScale(args["imgsz"], enabled=args["multi_scale"]).ladder()
step_model = torch.compile(model) if args["compile"] else model
phases = {"input": 0.0, "forward": 0.0, "loss": 0.0, "backward": 0.0, "optimizer": 0.0}

def step(index, record):
    images, targets, _ = batches[index % len(batches)]
    size = ladder[(index * 7) % len(ladder)]  # every size in turn, not in order
    tp = time.perf_counter()
    x = step_input(images, size, torch.device("cpu"), channels_last=args["channels_last"])
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args["bf16"]):
        outputs = step_model(x)
    t1 = time.perf_counter()
    loss, _ = criterion(outputs, targets, x.shape[2:])
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t4 = time.perf_counter()
    if record:
        for name, seconds in zip(phases, (t0 - tp, t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            phases[name] += seconds

for index in range(2 * len(ladder)):  # warm-up: every size's kernels built (compiled, with --compile)
    step(index, False)
start = time.perf_counter()
for index in range(args["steps"]):
    step(index, True)
seconds = time.perf_counter() - start
print("RESULT", json.dumps({"images_per_s": args["steps"] * args["batch"] / seconds,
                            **{k: 1000 * v / args["steps"] for k, v in phases.items()}}))
"""

@dataclass(frozen=True)
class Row:
    label: str
    bf16: bool
    channels_last: bool
    multi_scale: bool
    default_cache: bool = False  # oneDNN's own 1024-entry kernel cache instead of detector's
    default_heap: bool = False  # glibc's own malloc behaviour instead of the held heap
    compile: bool = False


ROWS = [
    Row("FP32, NCHW, fixed size", False, False, False),
    Row("FP32, channels-last, fixed size (= --unamp --no-multi-scale)", False, True, False),
    Row("BF16, NCHW, fixed size", True, False, False),
    Row("BF16, channels-last, fixed size (= --no-multi-scale)", True, True, False),
    Row("BF16, channels-last, multi-scale, oneDNN default cache", True, True, True, default_cache=True),
    Row("BF16, channels-last, multi-scale, glibc default heap", True, True, True, default_heap=True),
    Row("BF16, channels-last, multi-scale (= default)", True, True, True),
    Row("FP32, channels-last, multi-scale, glibc default heap", False, True, True, default_heap=True),
    Row("FP32, channels-last, multi-scale (= --unamp)", False, True, True),
]
COMPILE_ROW = Row("BF16, channels-last, fixed size, torch.compile", True, True, False, compile=True)


def run_row(row: Row, *, imgsz: int, batch: int, steps: int) -> dict:
    env = dict(os.environ)
    if row.default_cache:
        env[ONEDNN_CACHE_ENV] = "1024"  # oneDNN's own default; detector keeps a value set by the user
    else:
        env.pop(ONEDNN_CACHE_ENV, None)
    return run_isolated(ROW, {**asdict(row), "imgsz": imgsz, "batch": batch, "steps": steps}, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=2,
                        help="timed steps per row = cycles x the multi-scale sizes (after two warm-up cycles)")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile row (BF16, channels-last, fixed)")
    args = parser.parse_args()
    rows = [*ROWS, COMPILE_ROW] if args.compile else ROWS
    steps = args.cycles * len(MultiScale(args.imgsz).ladder())  # whole cycles: every size equally often
    print(f"threads {torch.get_num_threads()}, imgsz {args.imgsz}, batch {args.batch}, {args.cycles} cycles\n")
    print("| step | images/s | input ms | forward ms | loss ms | backward ms | optimizer ms |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        r = run_row(row, imgsz=args.imgsz, batch=args.batch, steps=steps)
        print(f"| {row.label} | {r['images_per_s']:.1f} | {r['input']:.0f} | {r['forward']:.0f} | {r['loss']:.0f} | "
              f"{r['backward']:.0f} | {r['optimizer']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
