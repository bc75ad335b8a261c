"""``python -m detector predict``: run a .pt / .onnx / .engine model on images, folders, globs, videos, webcams
and streams (every source :mod:`detector.inference.sources` reads).

Writes ``<project>/<name>/predictions.json`` (a list, one entry per image or video frame:
``{"file", "frame", "boxes" [[x1, y1, x2, y2] original pixels], "scores", "labels", "names"}``); with
``--save`` annotated images (under their names relative to the source folder) or an annotated
``<video stem>.mp4`` per video; with ``--save-txt`` YOLO labels ``labels/<image stem>.txt`` (``_<n>`` added for
a video's n-th frame, from 1 as Ultralytics numbers them; ``frame`` in the records counts from 0): one
``class cx cy w h`` line per box, normalised to the image, ``--save-conf`` adding the score, as Ultralytics writes
them.

Results are produced one frame at a time, or ``--batch`` frames per model call (:func:`predict_frames`); frames
are decoded ahead of the model in a small bounded queue, and nothing keeps a frame's pixels after its batch's
results, so a long video or a stream runs in constant memory (predictions.json's records, ~100 bytes per frame,
are the only thing that grows).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from detector.device import resolve_device
from detector.extras import Unavailable
from detector.files import write_image, write_text_atomically
from detector.data.letterbox import ImageMeta
from detector.inference import Backend, batch_to_original_pixels, load_backend, prepare_batch, weights_or_latest
from detector.inference.preprocess import Detections, finish_letterbox, stage_letterbox
from detector.inference.sources import READ_AHEAD, Frame, is_live, open_source, read_ahead
from detector.inference.torch_backend import half_precision
from detector.postprocess import NMSConfig
from detector.runs import claim_run_dir
from detector.tuning import tune_process
from detector.workflows.options import PredictOptions

PALETTE = [(56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207), (10, 249, 72),
           (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0), (168, 153, 44), (255, 194, 0)]  # BGR


def annotate(image_rgb: np.ndarray, result: dict, names: list[str], *, line_width: int | None = None,
             show_labels: bool = True, show_conf: bool = True) -> np.ndarray:
    """-> BGR copy with one box per detection, captioned with its class name and score unless told not to;
    ``line_width`` in pixels (default: scaled to the image, as Ultralytics scales it)."""
    canvas = cv2.cvtColor(image_rgb, cv2.COLOR_RGB2BGR)
    thickness = line_width or max(1, round(sum(canvas.shape[:2]) / 600))
    for box, score, label in zip(result["boxes"].tolist(), result["scores"].tolist(), result["labels"].tolist()):
        colour = PALETTE[int(label) % len(PALETTE)]
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        cv2.rectangle(canvas, (x1, y1), (x2, y2), colour, thickness, cv2.LINE_AA)
        caption = [names[int(label)] if int(label) < len(names) else str(label)] if show_labels else []
        text = " ".join(caption + ([f"{score:.2f}"] if show_conf else []))
        if text:
            origin = (x1, max(y1 - 3, 10))
            cv2.putText(canvas, text, origin, cv2.FONT_HERSHEY_SIMPLEX, thickness / 3, colour, thickness, cv2.LINE_AA)
    return canvas


def crop_box(image: np.ndarray, box: list[float], *, gain: float = 1.02, pad: int = 10) -> np.ndarray:
    """The part of ``image`` under one xyxy ``box``, widened as Ultralytics' ``save_crop`` widens it (each side
    times ``gain`` plus ``pad`` pixels, about the centre), cut at the image's edges; a view, maybe empty."""
    x1, y1, x2, y2 = box
    half_width, half_height = ((x2 - x1) * gain + pad) / 2, ((y2 - y1) * gain + pad) / 2
    centre_x, centre_y = (x1 + x2) / 2, (y1 + y2) / 2
    height, width = image.shape[:2]
    left, right = (min(max(int(v), 0), width) for v in (centre_x - half_width, centre_x + half_width))
    top, bottom = (min(max(int(v), 0), height) for v in (centre_y - half_height, centre_y + half_height))
    return image[top:bottom, left:right]


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


def detect(backend: Backend, frame: Frame, *, size: int, classes: tuple[int, ...] | None,
           nms: NMSConfig | None = None) -> dict[str, Any]:
    """One frame through the model -> ``{"file", "frame", "boxes"`` float32 ``[N, 4]`` xyxy original pixels,
    ``"scores"`` float32 ``[N]``, ``"labels"`` int64 ``[N]``, ``"names"}``; only ``classes`` kept when given,
    chosen before NMS and ``max_det`` as Ultralytics does (:meth:`Backend.postprocess`), so other classes take
    none of the ``max_det`` places; ``nms``: the thresholds (default: the backend's own)."""
    return detect_batch(backend, [frame], size=size, classes=classes, nms=nms)[0]


def detect_batch(backend: Backend, frames: list[Frame], *, size: int, classes: tuple[int, ...] | None,
                 nms: NMSConfig | None = None) -> list[dict[str, Any]]:
    """:func:`detect` for several frames in one model call (``--batch``): one letterboxed batch, one NMS call,
    one copy of the results to the host."""
    # No padding beyond the stride where the backend takes any shape as it is (see Backend.shapes_are_free): the
    # batch's images then share the smallest such canvas that holds them all.
    tight = backend.info.stride if getattr(backend, "shapes_are_free", False) else None
    batch, transforms = prepare_batch([frame.image for frame in frames], size,
                                      device=getattr(backend, "device", None), tight=tight)
    return frame_results(backend, frames, backend(batch, classes, nms), transforms)


def frame_results(backend: Backend, frames: list[Frame], batch_detections: Detections,
                  transforms: list[ImageMeta]) -> list[dict[str, Any]]:
    """A batch's detections (letterboxed pixels, on their device) as :func:`detect`'s results, one host copy."""
    names = backend.info.names
    results = []
    for frame, detections in zip(frames, batch_to_original_pixels(batch_detections, transforms)):
        boxes = detections["boxes"].float().numpy()
        scores = detections["scores"].float().numpy()
        labels = detections["labels"].numpy().astype(np.int64)
        results.append({"file": frame.name, "frame": frame.index, "boxes": boxes, "scores": scores, "labels": labels,
                        "names": [names[i] if i < len(names) else str(i) for i in labels.tolist()]})
    return results


def detect_batches(
    backend: Backend, batches: Iterable[list[Frame]], *, size: int, classes: tuple[int, ...] | None,
    pad_to: int | None = None, overlap: bool = True, nms: NMSConfig | None = None,
) -> Iterator[tuple[list[Frame], list[dict[str, Any]]]]:
    """:func:`detect_batch` over consecutive batches: ``(frames, results)`` per batch, in order. ``pad_to``: a short
    batch is filled up to it with copies of its last frame, whose results are dropped.

    On CUDA, with ``overlap``, the batches overlap: one batch's model is queued on the GPU, then the next batch is
    taken from the readers and copied into page-locked memory (the host half of the letterbox) while the GPU runs,
    and only then are the first batch's detections brought back, which waits for the GPU. A backend whose ``infer``
    waits for its own result (ONNX Runtime, TensorRT) gets the same results, without the overlap. Each result then
    comes one batch late: a live source (a webcam, a stream) passes ``overlap=False``. Elsewhere (the CPU
    computes as it is asked) one batch after the other. A source that fails partway still gets the results of
    every batch read before the error, then the error.
    """
    device = getattr(backend, "device", None)
    padded = ((batch + [batch[-1]] * max(0, (pad_to or 0) - len(batch)), len(batch)) for batch in batches)
    if not overlap or device is None or torch.device(device).type != "cuda":
        for frames, real in padded:
            yield frames[:real], detect_batch(backend, frames, size=size, classes=classes, nms=nms)[:real]
        return
    device, error = torch.device(device), None
    current = next(padded, None)
    staged = stage_letterbox([frame.image for frame in current[0]], size, pin=True) if current else None
    while current is not None and staged is not None:
        (frames, real), (images, transforms) = current, finish_letterbox(staged, device)
        raw = backend.infer(images)  # queued: the GPU runs it while the host reads and stages the next batch
        try:
            upcoming = next(padded, None)
            staged = stage_letterbox([frame.image for frame in upcoming[0]], size, pin=True) if upcoming else None
        except Exception as caught:  # the readers (or the staging) failed: this batch's results first, then the error
            upcoming, staged, error = None, None, caught
        results = frame_results(backend, frames, backend.postprocess(raw, classes, nms), transforms)
        yield frames[:real], results[:real]
        current = upcoming
    if error is not None:
        raise error


def yolo_lines(result: dict, height: int, width: int, *, with_score: bool) -> str:
    """A result as YOLO label lines: ``class cx cy w h [score]``, normalised to the image, 6 significant digits."""
    lines = []
    for (x1, y1, x2, y2), score, label in zip(result["boxes"].tolist(), result["scores"].tolist(),
                                              result["labels"].tolist()):
        values = [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
        values += [score] if with_score else []
        lines.append(" ".join([str(int(label))] + [f"{value:.6g}" for value in values]) + "\n")
    return "".join(lines)


def output_stem(name: str) -> Path:
    """Where a frame's outputs go, without suffix: ``a/x.jpg`` -> ``a/x``; a URL -> its host and path as one name."""
    if "://" in name:
        return Path(re.sub(r"[^A-Za-z0-9._-]+", "_", name.split("://", 1)[1]).strip("_") or "stream")
    return Path(name).with_suffix("")


class Outputs:
    """What a run writes under its folder, one frame at a time: annotated images or videos, YOLO txt labels,
    and at :meth:`close` predictions.json (whole, atomically, for the frames done, even after Ctrl-C)."""

    def __init__(self, out_dir: Path, options: PredictOptions, names: list[str]) -> None:
        self.out_dir, self.options, self.names = out_dir, options, names
        self.records: list[str] = []
        self.videos: dict[str, cv2.VideoWriter] = {}
        self.staged: dict[str, tuple[Path, Path]] = {}
        self.crop_names: dict[Path, set[str]] = {}  # crops written so far, per class folder: none is overwritten
        self.stems: set[Path] = set()  # the sources' output names so far (claim_stem)
        self.video_stems: dict[str, Path] = {}

    def add(self, frame: Frame, result: dict) -> None:
        self.records.append(json.dumps(to_record(result)))
        stem = self.claim_stem(frame)
        # Video frames' files numbered from 1, as Ultralytics names them (clip_1.txt is predictions.json's frame 0).
        suffix = "" if frame.index is None else f"_{frame.index + 1}"
        if self.options.save_txt:
            text = yolo_lines(result, *frame.image.shape[:2], with_score=self.options.save_conf)
            # One file per image, empty when nothing was found: a processed background image, not a missing one.
            write_text_atomically(self.out_dir / "labels" / f"{stem}{suffix}.txt", text)
        if self.options.save_crop:
            self.save_crops(frame, result, f"{stem}{suffix}")
        if not self.options.save:
            return
        options = self.options
        canvas = annotate(frame.image, result, self.names, line_width=options.line_width,
                          show_labels=options.show_labels, show_conf=options.show_conf)
        if frame.index is None:
            # In its own format where OpenCV writes it; as JPEG where it cannot (.jfif and .mpo are JPEGs already).
            kind = Path(frame.name).suffix if cv2.haveImageWriter(f"x{Path(frame.name).suffix}") else ".jpg"
            write_image(self.out_dir / f"{stem}{kind}", canvas)  # atomic
            return
        if frame.name not in self.videos:
            path = self.out_dir / f"{stem}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = path.with_name(f".{path.stem}.partial.mp4")  # OpenCV picks the container by the suffix
            writer = cv2.VideoWriter(str(staged), cv2.VideoWriter_fourcc(*"mp4v"), frame.fps, canvas.shape[1::-1])
            if not writer.isOpened():
                raise Unavailable(f"{path}: cannot write video (this OpenCV build has no mp4v encoder)")
            self.videos[frame.name] = writer
            self.staged[frame.name] = (staged, path)
        self.videos[frame.name].write(canvas)

    def claim_stem(self, frame: Frame) -> Path:
        """The name (a path under the run folder, no suffix) of ``frame``'s outputs: its source's stem
        (:func:`output_stem`), one per source. A stem an earlier source of this run took (``x.jpg`` then ``x.png``;
        ``a/x.jpg`` and ``b/x.jpg`` in a list; ``clip.mp4`` then ``clip.avi``) gets the suffix in its name
        (``x_png``), then a number, with one warning line: no output overwrites another's. A video's frames
        share the stem its first frame claimed."""
        if frame.index is not None and frame.name in self.video_stems:
            return self.video_stems[frame.name]
        stem = output_stem(frame.name)
        if stem in self.stems:
            kind = Path(frame.name).suffix.lstrip(".")
            base = stem.with_name(f"{stem.name}_{kind}") if kind and "://" not in frame.name else stem
            candidate, count = base, 1
            while candidate in self.stems:
                count += 1
                candidate = base.with_name(f"{base.name}_{count}")
            print(f"warning: {frame.name}: an earlier source's outputs are named {stem.as_posix()}; this one's are "
                  f"{candidate.as_posix()}", file=sys.stderr)
            stem = candidate
        self.stems.add(stem)
        if frame.index is not None:
            self.video_stems[frame.name] = stem
        return stem

    def save_crops(self, frame: Frame, result: dict, stem: str) -> None:
        """Each detection's crop as ``crops/<class name>/<stem>.jpg``, then ``<stem>2.jpg`` ... for more of one
        class in one image, best first, as Ultralytics names them; a name this run has already written (a video's
        frame ``clip_1``'s second crop is ``clip_12``, frame 12's first) takes the next free number instead, as
        Ultralytics' ``increment_path`` does, so no crop overwrites another. A crop cut to nothing by the image's
        edge is not written."""
        for box, name in zip(result["boxes"].tolist(), result["names"]):
            crop = crop_box(frame.image, box)
            if not crop.size:
                continue
            folder = self.out_dir / "crops" / (name.replace("/", "_").replace(os.sep, "_") or "_")  # a name, no path
            taken = self.crop_names.setdefault(folder, set())
            count = 1
            while (candidate := f"{stem}{count if count > 1 else ''}.jpg") in taken:
                count += 1
            taken.add(candidate)
            write_image(folder / candidate, cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))

    def close(self) -> None:
        try:
            for name, writer in self.videos.items():
                writer.release()
                staged, path = self.staged[name]
                os.replace(staged, path)  # each video appears whole, once its frames are in
        finally:  # a video that could not be finished loses no record
            # One record per line: readable, diffable, and still a single JSON list.
            text = "[\n" + ",\n".join(self.records) + "\n]\n" if self.records else "[]\n"
            write_text_atomically(self.out_dir / "predictions.json", text)


def predict_frames(
    backend: Backend, frames: Iterable[Frame], *, size: int, options: PredictOptions, outputs: Outputs | None = None,
    with_image: bool = False, live: bool = False,
) -> Iterator[dict[str, Any]]:
    """:func:`detect` on each frame (``options.batch`` frames per model call), a one-line summary printed per
    frame, written through ``outputs``; ``with_image``: each result also carries its frame (``"image"``, RGB
    ``uint8 [H, W, 3]``); ``live``: a webcam or stream, whose results must not wait for the next batch."""
    # On CUDA a backend of free batch captures or builds per input shape (PyTorch's and the pt2 package's CUDA graphs,
    # onnxruntime's TensorRT engines): a short last batch is filled up with copies of its last frame, one more replay
    # instead of one more capture, and their results dropped. Fixed-batch exports pad batches themselves.
    pad_to = options.batch if backend.free_batch and on_cuda(backend) else None
    try:
        batches = detect_batches(backend, in_batches(frames, options.batch), size=size, classes=options.classes,
                                 pad_to=pad_to, overlap=not live, nms=nms_config(options))
        start = time.perf_counter()
        for batch, results in batches:
            share = 1000 * (time.perf_counter() - start) / len(batch)  # each frame's share of the batch's wait
            for frame, result in zip(batch, results):
                counts = Counter(result["names"]).most_common()
                where = frame.name if frame.index is None else f"{frame.name} frame {frame.index}"
                summary = ", ".join(f"{count} {name}" for name, count in counts) or "nothing"
                if options.verbose:
                    print(f"{where}: {summary} ({share:.1f} ms)")
                if outputs is not None:
                    outputs.add(frame, result)
                yield {**result, "image": frame.image} if with_image else result
            start = time.perf_counter()
    finally:
        if outputs is not None:
            outputs.close()


def nms_config(options: PredictOptions) -> NMSConfig:
    """The run's NMS thresholds, handed to every model call (never set on a loaded model's backend, which two
    streams at once may share)."""
    return NMSConfig(conf_threshold=options.conf, iou_threshold=options.iou, max_detections=options.max_det,
                     agnostic=options.agnostic_nms)


def on_cuda(backend: Backend) -> bool:
    device = getattr(backend, "device", None)
    return device is not None and torch.device(device).type == "cuda"


def in_batches(frames: Iterable[Frame], size: int) -> Iterator[list[Frame]]:
    """``frames`` in lists of ``size``, the last one shorter if need be. A source that fails partway (a video in a
    folder that will not open) hands over the frames read before the error, then raises it: they are predicted
    and written, as one frame at a time would have done."""
    batch: list[Frame] = []
    try:
        for frame in frames:
            batch.append(frame)
            if len(batch) == size:
                yield batch
                batch = []
    except Exception:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def run_predict(options: PredictOptions, *, backend: Backend | None = None, write: bool = True,
                source: Any = None, stream: bool = False) -> list[dict] | Iterator[dict]:
    """Load the model (unless ``backend`` is given) and run it over ``source`` (default: ``options.source``;
    the API passes arrays, PIL images and lists here); returns :func:`detect`'s results, a list, or with
    ``stream`` a generator that runs as it is read (``"image"``, the RGB frame, added to each result). With
    ``write`` (or ``--save``/``--save-txt``) the outputs go to ``<project>/<name>``.

    The source's first frame, the model, the input size and the run folder are settled before this returns, so
    a bad flag or an unreadable source raises here even with ``stream`` (and no run folder is made for it).

    Raises:
        FileNotFoundError, ValueError, Unavailable, CheckpointError: one line naming the file or flag.
    """
    # A loaded model (detector.load) runs where it was loaded: tuning the process for the default device instead
    # would skip the CPU's heap setting on a machine with a GPU.
    device = getattr(backend, "device", None) or resolve_device(options.device)
    tune_process(device)  # before the first convolution: see detector/tuning.py
    frames = first_frame_checked(read_frames(options.source if source is None else source, options.batch,
                                             vid_stride=options.vid_stride))
    nms = nms_config(options)
    if backend is None:
        precision = half_precision(device) if options.half else "fp32"
        backend = load_backend(weights_or_latest(options.weights), device=str(device), imgsz=options.imgsz, nms=nms,
                               precision=precision)
    else:  # a model loaded once (detector.load): its device and precision were settled there
        if options.half or options.device:
            raise ValueError("half= and device= of a loaded model are chosen when it loads: "
                             "detector.load(weights, device=..., half=True); predict cannot change them")
    baked = backend.info.nms
    if baked is not None and options.agnostic_nms:
        raise ValueError("--agnostic-nms: this graph has NMS inside, per class; export it without --nms to choose "
                         "at predict time")
    if baked is not None and options.conf < baked.conf_threshold:
        warning = f"the graph has NMS inside at conf {baked.conf_threshold}; --conf {options.conf} cannot go lower"
        print(f"warning: {warning}", file=sys.stderr)
    size = input_size(backend, options.imgsz)
    outputs = None
    if write or options.save or options.save_txt or options.save_crop:
        # Claimed only now, once the model loaded and the source's first frame was read: a bad source or flag
        # leaves no run folder behind (claim_run_dir: atomic, two runs at once get different folders).
        out_dir = claim_run_dir(options.project, options.name)
        outputs = Outputs(out_dir, options, list(backend.info.names))
    results = predict_frames(backend, frames, size=size, options=options, outputs=outputs, with_image=stream,
                             live=is_live(options.source if source is None else source))
    where = f"; results in {outputs.out_dir}" if outputs is not None else ""
    def closing(count: int) -> None:
        if options.verbose:
            print(f"{backend.name} on {count} images/frames at {size} px{where}")

    if stream:
        return closing_line(results, closing)
    done = list(results)
    closing(len(done))
    return done


def read_frames(source: Any, batch: int, *, vid_stride: int = 1) -> Iterator[Frame]:
    """``source``'s frames (a video's or stream's every ``vid_stride``-th), decoded ahead of a model that takes
    ``batch`` at a time: the reader holds a whole next batch, so it decodes while the model runs this one
    (:data:`READ_AHEAD` frames for one at a time)."""
    return read_ahead(open_source(source, vid_stride=vid_stride), READ_AHEAD + batch - 1)


def first_frame_checked(frames: Iterator[Frame]) -> Iterator[Frame]:
    """``frames`` with the first one already read, so a source that cannot be read fails now, not later."""
    try:
        first = next(frames)
    except StopIteration:
        return iter(())
    return itertools.chain([first], frames)


def closing_line(results: Generator[dict, None, None], closing: Callable[[int], None]) -> Iterator[dict]:
    """The stream :func:`run_predict` returns: the results, then ``closing(count)`` (the closing line) once they
    are all read.

    Closing it early (a ``break``) closes ``results`` at once: the reader thread stops, a capture is released and
    predictions.json is written for the frames done.
    """
    count = 0
    try:
        for count, result in enumerate(results, 1):
            yield result
    finally:
        results.close()
    closing(count)
