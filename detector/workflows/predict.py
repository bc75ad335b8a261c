"""``python -m detector predict``: run a .pt / .onnx / .engine model on images, folders, globs, videos, webcams
and streams (every source :mod:`detector.inference.sources` reads).

Writes ``<project>/<name>/predictions.json`` (a list, one entry per image or video frame:
``{"file", "frame", "boxes" [[x1, y1, x2, y2] original pixels], "scores", "labels", "names"}``); with
``--save`` annotated images (under their names relative to the source folder) or an annotated
``<video stem>.mp4`` per video (:mod:`detector.workflows.outputs`); with ``--save-txt`` YOLO labels
``labels/<image stem>.txt`` (``_<n>`` added for a video's n-th frame, from 1 as Ultralytics numbers them;
``frame`` in the records counts from 0): one ``class cx cy w h`` line per box, normalised to the image,
``--save-conf`` adding the score, as Ultralytics writes them.

Results are produced one frame at a time, or ``--batch`` frames per model call (:func:`predict_frames`); frames
are decoded ahead of the model in a small bounded queue, and nothing keeps a frame's pixels after its batch's
results, so a long video or a stream runs in constant memory (predictions.json's records, ~100 bytes per frame,
are the only thing that grows).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from detector.device import resolve_device
from detector.data.letterbox import ImageMeta
from detector.inference import (
    Backend,
    batch_to_original_pixels,
    exported_precision_note,
    load_backend,
    prepare_batch,
    weights_or_latest,
)
from detector.inference.augmented import AugmentedBackend
from detector.inference.preprocess import Detections, finish_letterbox, stage_letterbox
from detector.inference.sources import READ_AHEAD, Frame, is_live, open_source, read_ahead
from detector.inference.torch_backend import half_precision
from detector.postprocess import NMSConfig
from detector.runs import claim_run_dir
from detector.tuning import tune_process
from detector.workflows.options import PredictOptions
from detector.workflows.outputs import Outputs


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
                     agnostic=options.agnostic_nms, end_to_end=options.end_to_end)


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


def baked_nms_limits(baked: NMSConfig, conf: float, iou: float, max_det: int) -> str:
    """What of ``--conf``/``--iou``/``--max-det`` a graph with NMS inside cannot honour ("" where nothing): a
    higher --conf still filters, a lower one, another IoU or more detections cannot be had from it (an end-to-end
    graph's top-k has no IoU)."""
    limits = [f"--conf {conf} cannot go lower"] if conf < baked.conf_threshold else []
    if iou != baked.iou_threshold and not baked.end_to_end:
        limits.append(f"--iou {iou} cannot change its IoU")
    if max_det > baked.max_detections:
        limits.append(f"--max-det {max_det} cannot give more than {baked.max_detections}")
    return "; ".join(limits) + ("; export it without --nms to choose them at predict time" if limits else "")


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
        weights = weights_or_latest(options.weights)
        backend = load_backend(weights, device=str(device), imgsz=options.imgsz, nms=nms, precision=precision)
        if note := exported_precision_note(weights, backend, half=options.half):
            print(note, file=sys.stderr)
    else:  # a model loaded once (detector.load): its device and precision were settled there
        if options.half or options.device:
            raise ValueError("half= and device= of a loaded model are chosen when it loads: "
                             "detector.load(weights, device=..., half=True); predict cannot change them")
        if options.end_to_end and not backend.info.end_to_end:  # its branch was chosen when it loaded
            raise ValueError("end_to_end= of a loaded model is chosen when it loads: "
                             "detector.load(weights, end_to_end=True); predict cannot change it")
    if options.augment:
        backend = AugmentedBackend(backend)  # ValueError for an export it cannot run: NMS inside, a fixed size
    baked = backend.info.nms
    if baked is not None and options.agnostic_nms:
        inside = "its top-k inside, over every (box, class) pair" if baked.end_to_end else "NMS inside, per class"
        raise ValueError(f"--agnostic-nms: this graph has {inside}; export it without --nms to choose at predict time")
    if baked is not None and (fixed := baked_nms_limits(baked, options.conf, options.iou, options.max_det)):
        inside = (f"its top-k inside (conf {baked.conf_threshold}," if baked.end_to_end
                  else f"NMS inside (conf {baked.conf_threshold}, IoU {baked.iou_threshold},")
        print(f"warning: the graph has {inside} {baked.max_detections} per image); {fixed}", file=sys.stderr)
    size = input_size(backend, options.imgsz)
    outputs = None
    if write or options.save or options.save_txt or options.save_crop or options.save_frames:
        # Claimed only now, once the model loaded and the source's first frame was read: a bad source or flag
        # leaves no run folder behind (claim_run_dir: atomic, two runs at once get different folders).
        out_dir = claim_run_dir(options.project, options.name)
        outputs = Outputs(out_dir, options, list(backend.info.names))
    results = predict_frames(backend, frames, size=size, options=options, outputs=outputs, with_image=stream,
                             live=is_live(options.source if source is None else source))
    where = f"; results in {outputs.out_dir}" if outputs is not None else ""
    def closing(count: int) -> None:
        if options.verbose:
            what = "image/frame" if count == 1 else "images/frames"
            print(f"{backend.name} on {count} {what} at {size} px{where}")

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
