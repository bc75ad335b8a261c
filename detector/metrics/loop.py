"""Validation loop shared by training, `detector val` and export parity checks.

Any backend plugs in as ``infer(images uint8 [B, 3, S, S]) -> list[{boxes, scores, labels}]`` with boxes
in letterboxed-input pixels; this module handles batching, letterbox undo and the COCO evaluator. Training's pass
also computes the loss: its ``infer`` is an :class:`~detector.metrics.val_loss.InferWithLoss`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from detector.data.build import SplitData
from detector.data.dataset import collate
from detector.data.letterbox import ImageMeta, rect_batches
from detector.data.workers import capped_workers, worker_init
from detector.metrics.background import BackgroundScorer, PendingScore
from detector.metrics.coco import DETECTION_COLUMNS, EvalResult, evaluate_coco, to_coco_detections, write_results_json
from detector.metrics.matching import prediction_rows, with_precision_recall
from detector.metrics.val_loss import InferWithLoss
from detector.model.yolo import INPUT_MULTIPLE
from detector.postprocess import detections_to_host

Detections = list[dict[str, torch.Tensor]]


def make_val_loader(
    split: SplitData, *, batch_size: int, workers: int, cpu_compute: bool = False, pin_memory: bool = False,
    rect: bool = False,
) -> DataLoader:
    """``cpu_compute``: the model runs on the CPU, so the workers yield to it (see detector.data.workers).

    ``pin_memory`` (a CUDA model): batches in page-locked memory, so the copy to the GPU runs asynchronously.
    ``rect``: batches of similar aspect ratio, each padded only to its own canvas (:func:`rect_batches`), for a
    model that takes any input shape; the images come in that order, not the split's.
    """
    dataset, order = split.dataset, None
    workers = capped_workers(workers)  # more than the cores only take turns on them (and PyTorch warns)
    if rect and len(dataset):
        order, canvases = rect_batches(split.records.image_hw, dataset.image_size, batch_size, INPUT_MULTIPLE)
        dataset = dataset.with_canvases(canvases)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        sampler=None if order is None else order.tolist(),
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=workers > 0,
        pin_memory=pin_memory,
        worker_init_fn=worker_init(shares_cores_with_compute=cpu_compute),
    )


@dataclass(frozen=True)
class Scoring:
    """How :func:`run_validation` scores its pass: with the ``coco_eval`` evaluator (a detector.choices.COCO_EVAL
    name), in ``background``'s worker (whose split and evaluator these must be) or, without one, in the calling
    process; ``precision_recall``: the val table's "all" P and R too (:attr:`EvalResult.mean_precision`,
    :attr:`~EvalResult.mean_recall`), matched where the mAP is computed, in the worker too."""

    coco_eval: str = "faster"
    background: BackgroundScorer | None = None
    precision_recall: bool = False


# The val table's "all" P and R in a pass's metrics (:attr:`Validation.metrics`), Ultralytics' metrics/precision(B) and
# metrics/recall(B): named as the table names them, since results.csv's ``precision`` is the numeric precision.
PR_COLUMNS = ("P", "R")


@dataclass
class Validation:
    """One pass of a model over a split, scored.

    Attributes:
        scores: the COCO metrics, the evaluator's summary and its name (:class:`EvalResult`; with the mean P and R
            where the pass asked for them), or, for a pass scored in the background, their :class:`PendingScore`
            until :attr:`result` is first read.
        seconds: wall time of the pass on the calling thread: loading, inference, NMS, and the evaluator unless
            it ran in the background.
        images: images scored.
        detections: the ``[N, 7]`` COCO results array (what predictions.json holds, for writing later).
        predictions: ``(detections, meta)`` per image when asked for (plots, the per-class table), else None.
        in_background: scored by a :class:`BackgroundScorer` (reading :attr:`result` may wait for it).
        losses: ``{val/box, val/cls, val/dfl}`` of a pass that computed the loss (:class:`InferWithLoss`), else empty;
            known when the pass returns, also where its scoring runs in the background.
    """

    scores: EvalResult | PendingScore
    seconds: float
    images: int
    detections: np.ndarray
    predictions: list[tuple[dict[str, torch.Tensor], ImageMeta]] | None = None
    in_background: bool = False
    losses: dict[str, float] = field(default_factory=dict)
    # Seconds of :attr:`seconds` by part: "loading" (blocked on the loader: decoding and letterboxing not yet done
    # by its workers), "inference" (the model, NMS and the detections brought to the host), "scoring" (the COCO
    # evaluation, the mean P and R where asked for, and predictions.json; 0 when scored in the background).
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def result(self) -> EvalResult:
        """The scores; for a pass scored in the background, waits for them the first time."""
        if isinstance(self.scores, PendingScore):
            self.scores = self.scores.result()
        return self.scores

    @property
    def metrics(self) -> dict[str, float]:
        """The COCO metrics, and ``P`` and ``R`` (the val table's "all" row) where the pass was scored for them: what
        best.pt and ``train()``'s result keep, as Ultralytics' checkpoints keep its precision and recall."""
        result = self.result
        if result.mean_precision is None or result.mean_recall is None:
            return result.metrics
        return {**result.metrics, **dict(zip(PR_COLUMNS, (result.mean_precision, result.mean_recall)))}


def in_json_pixels(detections: np.ndarray, scale: dict[int, float]) -> np.ndarray:
    """``[N, 7]`` rows with each listed image's boxes scaled from its file's pixels to its JSON entry's (rounded to
    3 decimals again, as :func:`to_coco_detections` leaves them)."""
    # One lookup per image, not per row: COCO val at --max-det 300 is 1.5M rows.
    ids, image_of_row = np.unique(detections[:, 0], return_inverse=True)
    factors = np.array([scale.get(int(image_id), 1.0) for image_id in ids], np.float64)[image_of_row.reshape(-1)]
    scaled = detections.copy()
    scaled[:, 1:5] = np.round(detections[:, 1:5] * factors[:, None], 3)
    return scaled


def run_validation(
    infer: Callable[[torch.Tensor], Detections] | InferWithLoss,
    split: SplitData,
    loader: Iterable[tuple],
    *,
    results_json: Path | None = None,
    progress: bool = True,
    keep_predictions: bool = False,
    scoring: Scoring = Scoring(),
) -> Validation:
    """Run ``infer`` over ``loader`` (:func:`make_val_loader` of ``split``, or the batches it yielded before) and
    score it as ``scoring`` says (the COCO evaluator of detector.metrics.coco, the mean P and R if asked for); with
    ``results_json``, write the COCO results there too. With a background scorer, the scoring runs in its worker
    and this returns without waiting for it (:attr:`Validation.result` waits). An :class:`InferWithLoss` ``infer`` takes
    each batch's targets too, and the pass's mean loss is :attr:`Validation.losses`."""
    coco_detections: list[np.ndarray] = []
    predictions = []
    start = time.perf_counter()
    loading = 0.0
    # On a terminal the bar vanishes when done. In a log (stderr not a terminal) its clearing left no newline, so the
    # line printed next (a run's "epoch N: mAP...", the per-class table) began after the bar's leftover and
    # ``grep '^epoch'`` missed it: there the bar stays, ending its line.
    batches = iter(tqdm(loader, desc="val", leave=not sys.stderr.isatty(), disable=not progress))
    while True:
        waited = time.perf_counter()
        batch = next(batches, None)
        loading += time.perf_counter() - waited
        if batch is None:
            break
        images, targets, metas = batch
        detections = infer(images, targets) if isinstance(infer, InferWithLoss) else infer(images)
        # On the host in one copy a batch, which the COCO rows and the per-image matching (P and R, the plots) both
        # read: on CUDA the rows' own boxes, scores and labels were three waits a batch, and P and R a fourth copy.
        # The same numbers: the copy is FP32, which the rows convert to anyway (tests/metrics/test_loop.py).
        detections = detections_to_host(detections)
        coco_detections.append(to_coco_detections(detections, metas, split.category_ids))
        if keep_predictions or scoring.precision_recall:
            predictions.extend(zip(detections, metas))
    # Waits for the device: counted in the inference time.
    mean_losses = infer.meter.means() if isinstance(infer, InferWithLoss) else {}
    inferred = time.perf_counter()
    assert split.ground_truth is not None, "evaluation split was built without ground truth"
    detections = np.concatenate(coco_detections) if coco_detections else np.zeros((0, len(DETECTION_COLUMNS)))
    if split.json_scale:
        detections = in_json_pixels(detections, split.json_scale)
    image_ids = split.records.image_ids.tolist()
    # The boxes the mean P and R are matched from: one array, which a background scorer's worker receives.
    rows = prediction_rows(predictions) if scoring.precision_recall else None
    if scoring.background is not None:
        if results_json is not None:
            write_results_json(results_json, detections, split.ground_truth)
        pending = scoring.background.submit(detections, image_ids, rows)
        parts = timing_parts(start, loading, inferred)
        return Validation(pending, sum(parts.values()), len(split.records), detections,
                          predictions if keep_predictions else None, in_background=True, losses=mean_losses,
                          parts=parts)
    result = evaluate_coco(split.ground_truth, detections, image_ids=image_ids, results_json=results_json,
                           backend=scoring.coco_eval)
    result = with_precision_recall(result, rows, split)
    parts = timing_parts(start, loading, inferred)
    return Validation(result, sum(parts.values()), len(split.records), detections,
                      predictions if keep_predictions else None, losses=mean_losses, parts=parts)


def timing_parts(start: float, loading: float, inferred: float) -> dict[str, float]:
    """:attr:`Validation.parts` of a pass begun at ``start`` whose batches were all inferred at ``inferred``."""
    return {"loading": loading, "inference": inferred - start - loading, "scoring": time.perf_counter() - inferred}
