"""Images/s out of the training loader with full augmentation (mosaic, affine, HSV, flip, albumentations).

Shows whether the data pipeline can feed the model: compare with the training images/s from
benchmarks/train_speed.py (the goal is at least 3x).

    python benchmarks/data_speed.py                       # built-in dataset, 320 px
    python benchmarks/data_speed.py --data ../shared/data/coco128/coco128.yaml --imgsz 640
    python benchmarks/data_speed.py --pixel-augment device --imgsz 640 --batch 64 --caches ram   # what a GPU run's
                                                      # workers do: mosaic and affine left to the step (not timed here)
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import sys
import time

from torch.utils.data import DataLoader

from detector.data.augment import AugmentConfig
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data.sampler import EpochSampler
from detector.data.spec import load_dataset_spec
from detector.data.synthetic import generate_shapes
from detector.data.workers import worker_init


def measure(split, *, batch: int, workers: int, batches: int) -> float:
    sampler = EpochSampler(len(split.dataset), seed=0)
    loader = DataLoader(split.dataset, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0, worker_init_fn=worker_init(shares_cores_with_compute=False))
    seen, start, epoch = 0, None, 0
    while seen < batches * batch:
        sampler.set_epoch(epoch, use_mosaic=True)
        for images, _, _ in loader:
            if start is None:  # skip the first batch: worker start-up is not throughput
                start = time.perf_counter()
                continue
            seen += len(images)
            if seen >= batches * batch:
                break
        epoch += 1
    return seen / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--caches", default="ram,none")
    parser.add_argument("--pixel-augment", choices=("workers", "pixels", "device"), default="workers",
                        help="what the workers leave to the step (see train --pixel-augment); that part is not timed")
    args = parser.parse_args()
    spec = load_dataset_spec(args.data or generate_shapes())
    print(f"--pixel-augment {args.pixel_augment}, {args.imgsz} px, batch {args.batch}")
    print("| cache | workers | images/s |\n|---|---|---|")
    for cache in args.caches.split(","):
        split = build_split(spec, "train", image_size=args.imgsz, augment=AugmentConfig(), cache=cache)
        split.dataset.pixel_ops_on_device = args.pixel_augment in ("pixels", "device")
        split.dataset.geometry_on_device = args.pixel_augment == "device"
        for workers in (int(w) for w in args.workers.split(",")):
            rate = measure(split, batch=args.batch, workers=workers, batches=args.batches)
            print(f"| {cache} | {workers} | {rate:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
