"""``python -m detector predict``: run a .pt / .onnx / .engine model on an image, a folder or a video.

Writes ``<project>/<name>/predictions.json`` (a list, one entry per image or video frame:
``{"file", "frame", "boxes" [[x1, y1, x2, y2] original pixels], "scores", "labels", "names"}``) and, with
``--save``, annotated images (same file names) or an annotated ``<video stem>.mp4``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from detector.data.dataset import read_image_rgb
from detector.data.spec import IMAGE_SUFFIXES
from detector.device import resolve_device
from detector.inference import Backend, load_backend, prepare_batch, to_original_pixels, weights_or_latest
from detector.inference.torch_backend import half_precision
from detector.postprocess import NMSConfig
from detector.runs import next_run_dir
from detector.tuning import enlarge_onednn_cache
from detector.options import Options, option

VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg"}
PALETTE = [(56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207), (10, 249, 72),
           (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0), (168, 153, 44), (255, 194, 0)]  # BGR


@dataclass(kw_only=True)
class PredictOptions(Options):
    """The flags of ``python -m detector predict``."""

    weights: Path | None = option(None, ".pt, .onnx or .engine (default: the newest runs/train/*/weights/best.pt)")
    source: Path = option(help="an image, a folder of images, or a video file")
    save: bool = option(False, "write annotated images / video (default: off; predictions.json always)")
    conf: float = option(0.25, "score threshold (default: 0.25)")
    iou: float = option(0.7, "NMS IoU threshold (default: 0.7)")
    max_det: int = option(300, "detections kept per image (default: 300)")
    imgsz: int | None = option(None, "input size (default: the model's own: training or export size)")
    device: str = option("", "cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    half: bool = option(False, ".pt: FP16 weights + CUDA graphs on CUDA, BF16 on CPUs with native BF16, else FP32 "
                               "(default: off)")
    project: Path = option(Path("runs/predict"), "parent folder of runs (default: runs/predict)")
    name: str = option("exp", "run folder; exp, exp2, ... when taken (default: exp)")

def iterate_source(source: Path) -> Iterator[tuple[str, int | None, np.ndarray, float]]:
    """-> (file name, frame index or None, RGB ``uint8 [H, W, 3]``, fps (0 for images))."""
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"{source}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        for file in files:
            yield file.name, None, read_image_rgb(file), 0.0
    elif source.suffix.lower() in VIDEO_SUFFIXES:
        capture = cv2.VideoCapture(str(source))
        if not capture.isOpened():
            raise FileNotFoundError(f"{source}: cannot open video")
        fps = capture.get(cv2.CAP_PROP_FPS) or 30.0
        frame = 0
        while (read := capture.read())[0]:
            yield source.name, frame, cv2.cvtColor(read[1], cv2.COLOR_BGR2RGB), fps
            frame += 1
        capture.release()
    elif source.is_file() and source.suffix.lower() in IMAGE_SUFFIXES:
        yield source.name, None, read_image_rgb(source), 0.0
    else:
        raise FileNotFoundError(f"{source}: not an image, a folder or a video ({', '.join(sorted(VIDEO_SUFFIXES))})")


def annotate(image_rgb: np.ndarray, result: dict, names: list[str]) -> np.ndarray:
    """-> BGR copy with one labelled box per detection."""
    canvas = cv2.cvtColor(image_rgb, cv2.COLOR_RGB2BGR)
    thickness = max(1, round(sum(canvas.shape[:2]) / 600))
    for box, score, label in zip(result["boxes"].tolist(), result["scores"].tolist(), result["labels"].tolist()):
        colour = PALETTE[int(label) % len(PALETTE)]
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        cv2.rectangle(canvas, (x1, y1), (x2, y2), colour, thickness, cv2.LINE_AA)
        text = f"{names[int(label)] if int(label) < len(names) else label} {score:.2f}"
        origin = (x1, max(y1 - 3, 10))
        cv2.putText(canvas, text, origin, cv2.FONT_HERSHEY_SIMPLEX, thickness / 3, colour, thickness, cv2.LINE_AA)
    return canvas


def to_record(result: dict) -> dict:
    """A :func:`predict` result as JSON values (boxes rounded to 0.01 px, scores to 1e-4)."""
    return {
        "file": result["file"],
        "frame": result["frame"],
        "boxes": [[round(v, 2) for v in box] for box in result["boxes"].tolist()],
        "scores": [round(v, 4) for v in result["scores"].tolist()],
        "labels": result["labels"].tolist(),
        "names": list(result["names"]),
    }


def input_size(backend: Backend, requested: int | None) -> int:
    info = backend.info
    if requested and not info.dynamic and requested != info.imgsz:
        raise ValueError(f"this model was exported at a fixed {info.imgsz} px; drop --imgsz or export with --dynamic")
    size = requested or info.imgsz
    if size % info.stride:
        raise ValueError(f"--imgsz must be a multiple of {info.stride}; got {size}")
    return size


def predict(backend: Backend, source: Path, out_dir: Path | None, *, size: int, save: bool) -> list[dict]:
    """Run over every image/frame of ``source``; with ``save``, write annotations under ``out_dir``.

    Returns one dict per image or frame: ``{"file", "frame" (None for images), "boxes"`` float32 ``[N, 4]``
    xyxy original-image pixels, ``"scores"`` float32 ``[N]``, ``"labels"`` int64 ``[N]`` (numpy arrays),
    ``"names"`` (the class name of each label)``}``.
    """
    results, writer = [], None
    names = backend.info.names
    try:
        for file, frame, image, fps in iterate_source(source):
            start = time.perf_counter()
            batch, transforms = prepare_batch([image], size, device=getattr(backend, "device", None))
            detections = to_original_pixels(backend(batch)[0], transforms[0])
            labels = detections["labels"].cpu().numpy().astype(np.int64)
            results.append({
                "file": file, "frame": frame, "boxes": detections["boxes"].float().cpu().numpy(),
                "scores": detections["scores"].float().cpu().numpy(), "labels": labels,
                "names": [names[i] if i < len(names) else str(i) for i in labels.tolist()],
            })
            counts = Counter(results[-1]["names"]).most_common()
            where = file if frame is None else f"{file} frame {frame}"
            summary = ", ".join(f"{count} {name}" for name, count in counts) or "nothing"
            print(f"{where}: {summary} ({1000 * (time.perf_counter() - start):.1f} ms)")
            if not save or out_dir is None:
                continue
            canvas = annotate(image, detections, names)
            if frame is None:
                cv2.imwrite(str(out_dir / file), canvas)
            else:
                if writer is None:
                    path = out_dir / f"{Path(file).stem}.mp4"
                    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, canvas.shape[1::-1])
                writer.write(canvas)
    finally:
        if writer is not None:
            writer.release()
    return results


def run_predict(options: PredictOptions, *, backend: Backend | None = None, write: bool = True) -> list[dict]:
    """Load the model (unless ``backend`` is given), run, and with ``write`` (or ``--save``) write
    ``<project>/<name>/predictions.json``; returns :func:`predict`'s results.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: one line naming the file or flag.
    """
    enlarge_onednn_cache()  # before the first convolution: see detector/tuning.py
    device = resolve_device(options.device)
    if not options.source.exists():
        raise FileNotFoundError(f"{options.source}: no such image, folder or video")
    nms = NMSConfig(conf_threshold=options.conf, iou_threshold=options.iou, max_detections=options.max_det)
    if backend is None:
        precision = half_precision(device) if options.half else "fp32"
        backend = load_backend(weights_or_latest(options.weights), device=str(device), imgsz=options.imgsz, nms=nms,
                               precision=precision)
    else:
        backend.nms = nms
    baked = backend.info.nms
    if baked is not None and options.conf < baked.conf_threshold:
        warning = f"the graph has NMS inside at conf {baked.conf_threshold}; --conf {options.conf} cannot go lower"
        print(f"warning: {warning}", file=sys.stderr)
    size = input_size(backend, options.imgsz)
    out_dir = None
    if write or options.save:
        out_dir = next_run_dir(options.project, options.name)
        out_dir.mkdir(parents=True)
    results = predict(backend, options.source, out_dir, size=size, save=options.save)
    if out_dir is not None:
        # One record per line: readable, diffable, and still a single JSON list.
        records = [json.dumps(to_record(result)) for result in results]
        (out_dir / "predictions.json").write_text("[\n" + ",\n".join(records) + "\n]\n")
    where = f"; results in {out_dir}" if out_dir is not None else ""
    print(f"{backend.name} on {len(results)} images/frames at {size} px{where}")
    return results
