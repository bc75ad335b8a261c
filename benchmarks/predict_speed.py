"""Predict over a folder of photos: images per second at each ``--batch``, beside what decoding alone reaches.

Writes ``--images`` synthetic 640x480 JPEGs to a temporary folder, then runs the nano model (fresh weights: the
time does not depend on them) over the folder the way ``detector predict`` does (the folder's images decoded on
several threads, read ahead of the model, ``--batch`` images per model call) and prints images/s per batch size,
best of ``--repeats``, after one untimed pass per batch size (CUDA graphs are captured per batch shape then).
The "decode only" row reads the folder without the model: the ceiling the model cannot pass.

    python benchmarks/predict_speed.py                                       # CPU, FP32, batches 1 and 8
    python benchmarks/predict_speed.py --device cuda --half --images 512 --batches 1,8,32
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from detector.data.synthetic import make_image
from detector.inference.sources import DECODE_THREADS
from detector.inference.torch_backend import TorchBackend, half_precision
from detector.model import build_model
from detector.model.metadata import ModelInfo
from detector.workflows.options import PredictOptions
from detector.workflows.predict import predict_frames, read_frames


def write_photos(folder: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    for index in range(count):
        rgb = make_image(rng, 640)[0][80:560]  # 480 x 640, a 4:3 photo
        cv2.imwrite(str(folder / f"{index:05d}.jpg"), rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])


def images_per_second(run, count: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return count / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batches", default="1,8", help="comma-separated --batch values")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--half", action="store_true", help="as predict --half: FP16 on CUDA, BF16 on native CPUs")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    batches = [int(part) for part in args.batches.split(",")]
    torch.manual_seed(0)
    model = build_model(num_classes=80, scale="n")
    info = ModelInfo(names=[str(i) for i in range(80)], strides=model.strides, imgsz=args.imgsz, dynamic=True)
    precision = half_precision(args.device) if args.half else "fp32"
    backend = TorchBackend(model, info, device=args.device, precision=precision)
    # Each row as it is measured, so a run cut short by a time limit still leaves the rows before.
    print(f"| {args.images} 640x480 JPEGs at {args.imgsz} px on {args.device} ({DECODE_THREADS} decode threads, "
          f"{torch.get_num_threads()} torch threads) | images/s |\n|---|---:|", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        write_photos(Path(folder), args.images)

        def decode_only() -> None:
            for _ in read_frames(folder, 1):
                pass

        decode_only()  # the page cache, as for every row after it
        print(f"| decode only | {images_per_second(decode_only, args.images, args.repeats):.1f} |", flush=True)
        for batch in batches:
            options = PredictOptions(source=folder, imgsz=args.imgsz, batch=batch)

            def predict(options: PredictOptions = options) -> None:
                frames = read_frames(folder, options.batch)
                with contextlib.redirect_stdout(io.StringIO()):  # the per-image lines
                    for _ in predict_frames(backend, frames, size=args.imgsz, options=options):
                        pass
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize(args.device)

            predict()  # untimed: kernels chosen, graphs captured for this batch shape
            rate = images_per_second(predict, args.images, args.repeats)
            print(f"| {backend.name}, --batch {batch} | {rate:.1f} |", flush=True)


if __name__ == "__main__":
    main()
