"""What decoding video frames ahead of the model saves: predict over a video with and without the reader thread,
and what padding each frame only to the stride saves against the square letterbox.

A synthetic ``--frames`` x 1280x720 MP4 (moving shapes, mp4v) is written to a temporary folder, then the
nano model (fresh weights: the time does not depend on them) runs over it at ``--imgsz`` through
:func:`detector.workflows.predict.predict_frames`, once reading frames inline and once through
:func:`detector.inference.sources.read_ahead` (the path ``detector predict`` takes), and once more read ahead
but letterboxed to the square (``shapes_are_free`` off, as for an export) instead of the tight 640x384 canvas a
1280x720 frame gets at 640 px. Prints ms per frame for each, best of ``--repeats``.

    python benchmarks/predict_read_ahead.py                      # 120 frames, 320 px, best of 3
    python benchmarks/predict_read_ahead.py --frames 60 --imgsz 640
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

from detector.inference.sources import open_source, read_ahead
from detector.inference.torch_backend import TorchBackend
from detector.model import build_model
from detector.model.metadata import ModelInfo
from detector.workflows.options import PredictOptions
from detector.workflows.predict import predict_frames


def write_video(path: Path, frames: int, width: int = 1280, height: int = 720) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 30, (width, height))
    rng = np.random.default_rng(0)
    background = rng.integers(0, 80, (height, width, 3), dtype=np.uint8)
    for index in range(frames):
        image = background.copy()
        cv2.circle(image, (100 + 8 * index % (width - 200), height // 2), 60, (40, 200, 240), -1)
        cv2.rectangle(image, (width // 3, 50 + 4 * index % (height - 200)), (width // 3 + 150, 200), (240, 80, 60), -1)
        writer.write(image)
    writer.release()


def time_run(backend: TorchBackend, video: Path, imgsz: int, ahead: bool) -> float:
    """Seconds per frame over the whole video (printing silenced)."""
    frames = read_ahead(open_source(video)) if ahead else open_source(video)
    options = PredictOptions(source=str(video), imgsz=imgsz)
    start, count = time.perf_counter(), 0
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in predict_frames(backend, frames, size=imgsz, options=options):
            count += 1
    return (time.perf_counter() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(num_classes=80, scale="n")
    info = ModelInfo(names=[str(i) for i in range(80)], strides=model.strides, imgsz=args.imgsz, dynamic=True)
    backend = TorchBackend(model, info, device="cpu")
    with tempfile.TemporaryDirectory() as folder:
        video = Path(folder) / "clip.mp4"
        write_video(video, args.frames)
        time_run(backend, video, args.imgsz, ahead=True)  # warm-up: oneDNN kernels, file cache
        results = {}
        for name, ahead, tight in (("inline", False, True), ("read ahead", True, True),
                                   ("read ahead, square canvas", True, False)):
            backend.shapes_are_free = tight
            results[name] = min(time_run(backend, video, args.imgsz, ahead) for _ in range(args.repeats))
    print(f"| reading | ms per frame ({args.frames} frames 1280x720, {args.imgsz} px, {torch.get_num_threads()} "
          "threads) |\n|---|---|")
    for name, seconds in results.items():
        print(f"| {name} | {1000 * seconds:.1f} |")


if __name__ == "__main__":
    main()
