"""Images/s out of the training loader with full augmentation (mosaic, affine, HSV, flip, albumentations).

Shows whether the data pipeline can feed the model: compare with the training images/s from
benchmarks/train_speed.py (the goal is at least 3x).

    python benchmarks/data_speed.py                       # built-in dataset, 320 px
    python benchmarks/data_speed.py --data ../shared/data/coco128/coco128.yaml --imgsz 640
    python benchmarks/data_speed.py --pixel-augment device --imgsz 640 --batch 64 --caches ram   # what a GPU run's
                                                      # workers do: mosaic and affine left to the step (not timed here)
    python benchmarks/data_speed.py --pixel-augment device --imgsz 640 --batch 64 --caches ram --copy-out
                                                      # and each batch copied out as the pin thread does (on CUDA:
                                                      # the pin thread), the workers' buffers fresh or pooled
    python benchmarks/data_speed.py ... --copy-out --pin-threads 1    # the pin thread's copy on one thread
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import sys
import time

import torch
from torch.utils.data import DataLoader

from detector.data.augment import AugmentConfig
from detector.data.build import build_split
from detector.data.dataset import collate
from detector.data import pinned
from detector.data.device_augment import WarpBatch
from detector.data.sampler import EpochSampler
from detector.data.spec import load_dataset_spec
from detector.data.synthetic import generate_shapes
from detector.data.workers import PREFETCH_FACTOR, release, stop_workers, worker_init


def measure(split, *, batch: int, workers: int, batches: int, copy_out: str) -> float:
    """Images/s out of the loader. ``copy_out``: "" (batches dropped as they come), "fresh" (each batch's pixels copied
    into one buffer kept here, as the pin thread copies them into page-locked memory on CUDA; the workers' buffers
    made afresh for every batch) or "pooled" (the same, the workers' buffers reused once copied: the training loader's
    on CUDA, detector.data.workers.BatchPool). On CUDA the copy is the DataLoader's own pin thread's."""
    sampler = EpochSampler(len(split.dataset), seed=0)
    pin = bool(copy_out) and torch.cuda.is_available()
    loader = DataLoader(split.dataset, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0, pin_memory=pin,
                        prefetch_factor=PREFETCH_FACTOR if workers else None,
                        worker_init_fn=worker_init(shares_cores_with_compute=False,
                                                   pool_slots=pool_slots(copy_out, pin)))
    kept: dict[int, torch.Tensor] = {}  # a buffer per copied tensor's size class, reused as pinned memory is
    seen, start, epoch = 0, None, 0
    while seen < batches * batch:
        sampler.set_epoch(epoch, use_mosaic=True)
        for images, _, _ in loader:
            if copy_out and not pin:
                copied_out(images, kept)
            if start is None:  # skip the first batch: worker start-up is not throughput
                start = time.perf_counter()
                continue
            seen += len(images)
            if seen >= batches * batch:
                break
        epoch += 1
    rate = seen / (time.perf_counter() - start)
    stop_workers(loader)  # and the buffers' mappings kept for them
    return rate


def pool_slots(copy_out: str, pin: bool) -> int:
    """The training loader's (detector.training.builders): PREFETCH_FACTOR buffers a worker, freed by the pin thread
    before the loop receives a batch. Copied out here instead, a batch is freed after the DataLoader has sent the
    worker its next index: one buffer more."""
    return (PREFETCH_FACTOR + (0 if pin else 1)) if copy_out == "pooled" else 0


def copied_out(images: torch.Tensor | WarpBatch, kept: dict[int, torch.Tensor]) -> None:
    """What the pin thread does to a batch, without CUDA: its pixels copied into reused memory, then freed."""
    pixels = images.atlas if isinstance(images, WarpBatch) else images
    flat = pixels.reshape(-1)
    size_class = 1 << (flat.numel() - 1).bit_length()  # as the pinned-memory cache rounds
    if size_class not in kept:
        kept[size_class] = torch.empty(size_class, dtype=pixels.dtype)
    kept[size_class][: flat.numel()].copy_(flat)
    if isinstance(images, WarpBatch):
        release(images.ticket, images.atlas)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--caches", default="ram,none")
    parser.add_argument("--copy-out", action="store_true",
                        help="copy each batch out as the pin thread does on CUDA (the pin thread itself there), "
                             "with the workers' buffers fresh and pooled (detector.data.workers.BatchPool): a row each")
    parser.add_argument("--pixel-augment", choices=("workers", "pixels", "device"), default="workers",
                        help="what the workers leave to the step (see train --pixel-augment); that part is not timed")
    parser.add_argument("--pin-threads", type=lambda text: max(1, int(text)), default=None,
                        help="on CUDA, threads for the pin thread's copy of a device-path batch (default: training's, "
                             "detector.data.pinned.copy_threads; 1: one thread, as PyTorch's own pin_memory)")
    args = parser.parse_args()
    spec = load_dataset_spec(args.data or generate_shapes())
    pinned.COPY_THREADS = args.pin_threads
    pin_threads = f", pin copy on {args.pin_threads or pinned.copy_threads()} thread(s)" \
        if args.copy_out and torch.cuda.is_available() else ""
    print(f"--pixel-augment {args.pixel_augment}, {args.imgsz} px, batch {args.batch}{pin_threads}")
    print("| cache | workers | worker buffers | images/s |\n|---|---|---|---|")
    for cache in args.caches.split(","):
        split = build_split(spec, "train", image_size=args.imgsz, augment=AugmentConfig(), cache=cache)
        split.dataset.pixel_ops_on_device = args.pixel_augment in ("pixels", "device")
        split.dataset.geometry_on_device = args.pixel_augment == "device"
        for workers in (int(w) for w in args.workers.split(",")):
            # only the device path's batches (WarpBatch) are freed once copied out, so only they are pooled
            pooled = ("fresh", "pooled") if args.pixel_augment == "device" else ("fresh",)
            for copy_out in pooled if args.copy_out else ("",):
                rate = measure(split, batch=args.batch, workers=workers, batches=args.batches, copy_out=copy_out)
                buffers = f"{copy_out}, copied out{' (pin thread)' if torch.cuda.is_available() else ''}" \
                    if copy_out else "fresh"
                print(f"| {cache} | {workers} | {buffers} | {rate:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
