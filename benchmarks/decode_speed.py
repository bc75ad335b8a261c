"""Milliseconds to decode one image file, the way training, validation, the RAM cache and ``predict`` do.

Four readers over the same files, one thread; each pass times every reader in turn (the order reversed on
every other pass, so this VM's drift falls on all of them alike); the median of ``--repeats`` passes:
- ``read_image_rgb``: ours (detector/data/images.py), RGB, EXIF rotation honoured;
- ``pillow copies``: Pillow with its ``exif_transpose`` and ``convert("RGB")`` as they come, each making a copy
  of the pixels when there is nothing to do (what ``read_image_rgb`` did before);
- ``pillow``: Pillow without those copies (what ``read_image_rgb`` does for what OpenCV does not decode);
- ``cv2.imread``: OpenCV's decoder (BGR), what Ultralytics reads with, for scale.

    python benchmarks/decode_speed.py --images ../shared/data/bccd/images/train
    python benchmarks/decode_speed.py --images datasets/shapes/images/train --count 300
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps

from detector.data.images import decode_with_pillow, read_image_rgb


def pillow_copies(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.ascontiguousarray(np.asarray(ImageOps.exif_transpose(image).convert("RGB")))


def pillow(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return decode_with_pillow(image)


def time_per_image(
    readers: dict[str, Callable[[Path], np.ndarray]], files: list[Path], repeats: int
) -> dict[str, float]:
    """Median milliseconds per image of each reader, the readers taking turns within every pass."""
    passes: dict[str, list[float]] = {name: [] for name in readers}
    for repeat in range(repeats):
        for name in list(readers)[:: 1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            for file in files:
                readers[name](file)
            passes[name].append((time.perf_counter() - start) / len(files) * 1e3)
    return {name: statistics.median(times) for name, times in passes.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="a folder of images")
    parser.add_argument("--count", type=int, default=200, help="how many of its files (sorted by name)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp"))
    files = files[: args.count]
    if not files:
        print(f"error: {args.images}: no images", file=sys.stderr)
        return 1
    cv2.setNumThreads(0)  # one thread each, as in a loader worker
    for read in files:  # the first pass warms the page cache for all three
        read_image_rgb(read)
    height, width = read_image_rgb(files[0]).shape[:2]
    print(f"{len(files)} files from {args.images} (first {width}x{height}), one thread, readers in turn, "
          f"median of {args.repeats} passes")
    print(f"{'reader':<16} {'ms/image':>9}")
    readers = {"read_image_rgb": read_image_rgb, "pillow copies": pillow_copies, "pillow": pillow,
               "cv2.imread": lambda path: cv2.imread(str(path), cv2.IMREAD_COLOR)}
    for name, milliseconds in time_per_image(readers, files, args.repeats).items():
        print(f"{name:<16} {milliseconds:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
