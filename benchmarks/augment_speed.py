"""Where augmentation should run: the loader's work and the step's input work per image, for each --pixel-augment.

Each batch is made in this process (the loader's work: decode or RAM cache, draws, mosaic/affine or the
region copy, HSV, flips, collate) and then turned into the step's float input on ``--device`` (``step_input``:
the copy, the device-side warp and HSV/flips where they moved, the multi-scale resize). No model runs: this
times what the paths do differently. ``images/s`` is images over loader + input time together, the rate
one core would feed the step at; on CUDA the input phase is timed between ``torch.cuda.synchronize()`` calls,
and the loader's work includes pinning the batch, as the DataLoader's pin thread does. ``device-unfused`` is the
device path with its warp, HSV and flips as PyTorch ops instead of the one kernel of
``detector/data/warp_kernel.py`` (which runs on CUDA only; on the CPU both rows are the same code).

    python benchmarks/augment_speed.py                                   # built-in dataset, 320 px, CPU
    python benchmarks/augment_speed.py --data ../shared/data/coco128/coco128.yaml --imgsz 640 --device cuda
    python benchmarks/augment_speed.py --imgsz 640 --batch 64 --device cuda --paths device,device-unfused
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import time

import torch

from detector.data.augment import AugmentConfig
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data.spec import load_dataset_spec
from detector.data.synthetic import generate_shapes
from detector.data.batch_augment import carried_pixel_ops
from detector.training.step_input import step_input

# pixel ops on the device, geometry on the device, the fused kernel
PATHS = {"workers": (False, False, True), "pixels": (True, False, True), "device": (True, True, True),
         "device-unfused": (True, True, False)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(dataset, path: str, *, batch: int, batches: int, size: int, device: torch.device) -> tuple[float, float]:
    """Median seconds per batch: (loader work, step input work)."""
    dataset.pixel_ops_on_device, dataset.geometry_on_device, fused = PATHS[path]
    loader_times, input_times = [], []
    for index in range(batches + 1):  # the first batch warms caches and allocators: not timed
        keys = [((index * batch + i) % len(dataset), 0, True) for i in range(batch)]
        start = time.perf_counter()
        images, _, metas = collate([dataset[key] for key in keys])
        if device.type == "cuda":
            images = images.pin_memory()
        made = time.perf_counter()
        pixel_ops = carried_pixel_ops([meta.pixel_ops for meta in metas])
        step_input(images, size, device, channels_last=True, pixel_ops=pixel_ops, fused=fused)
        sync(device)
        if index:
            loader_times.append(made - start)
            input_times.append(time.perf_counter() - made)
    return statistics.median(loader_times), statistics.median(input_times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--paths", default="workers,pixels,device")
    args = parser.parse_args()
    device = torch.device(args.device)
    spec = load_dataset_spec(args.data or generate_shapes())
    split = build_split(spec, "train", image_size=args.imgsz, augment=AugmentConfig(), cache="ram")
    print(f"{device}, {torch.get_num_threads()} threads, {args.imgsz} px, batch {args.batch}, RAM cache, mosaic on\n")
    print("| --pixel-augment | loader ms/image | step input ms/image | images/s (loader + input) |\n|---|---|---|---|")
    for path in args.paths.split(","):
        loader, step = measure(split.dataset, path, batch=args.batch, batches=args.batches, size=args.imgsz,
                               device=device)
        print(f"| {path} | {1000 * loader / args.batch:.2f} | {1000 * step / args.batch:.2f} | "
              f"{args.batch / (loader + step):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
