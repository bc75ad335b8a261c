"""A validation pass's figures: PR curves, confusion matrix, and predictions beside ground truth.

No matplotlib here: the PR curves and the confusion matrix go to ``draw`` (a training run's helper process,
detector/plots/worker.py, or the functions of :mod:`detector.plots.metrics` in this process); the prediction images
are OpenCV's (detector/plots/batches.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from detector.data.build import SplitData
from detector.data.dataset import collate
from detector.data.letterbox import ImageMeta, unletterbox_boxes
from detector.metrics.matching import Predictions, ValidationStats, validation_stats
from detector.plots import draw as draw_here
from detector.plots.batches import plot_val_predictions


def plot_all_validation(
    predictions: Predictions,
    split: SplitData,
    names: list[str],
    out_dir: str | Path,
    *,
    max_images: int = 16,
    draw: Callable[..., None] = draw_here,
) -> ValidationStats:
    """Write ``PR_curve.png``, ``confusion_matrix.png`` (counts) and ``confusion_matrix_normalized.png`` (each true
    class's column as shares), as Ultralytics names them (through ``draw``), and ``val_batch0_pred.png`` into
    ``out_dir``.

    ``val_batch0_pred.png`` shows the first ``max_images`` images of the split (ground truth left,
    predictions scoring >= 0.25 right; 0 skips it). Returns the per-class precision / recall for
    :func:`detector.metrics.table.per_class_table`, with the figures' paths (written once ``draw`` has drawn them).
    """
    out_dir = Path(out_dir)
    stats = validation_stats(predictions, split, len(names))
    for name, data, file, *options in (
            ("plot_pr_curves", stats.curves, "PR_curve.png"),
            ("plot_confusion_matrix", stats.matches.confusion, "confusion_matrix.png", False),
            ("plot_confusion_matrix", stats.matches.confusion, "confusion_matrix_normalized.png", True)):
        draw(name, data, names, out_dir / file, *options)
        stats.files.append(out_dir / file)
    count = min(max_images, len(split.dataset), len(predictions))
    if count:
        by_id = {meta.image_id: (detection, meta) for detection, meta in predictions}
        images, targets, metas = collate([split.dataset[i] for i in range(count)])
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
        shown = [in_letterbox(*by_id[meta.image_id], meta) if meta.image_id in by_id else empty for meta in metas]
        stats.files.append(plot_val_predictions(images, shown, targets, names, out_dir / "val_batch0_pred.png"))
    return stats


def in_letterbox(detection: dict[str, torch.Tensor], scored: ImageMeta, shown: ImageMeta) -> dict[str, torch.Tensor]:
    """``detection``'s boxes, in the pixels of the letterbox they were scored in (``scored``: a rectangular
    batch's canvas), moved into the letterbox ``shown`` (the square the figure draws)."""
    boxes = unletterbox_boxes(detection["boxes"], scored) * torch.tensor(shown.scale_xy * 2, dtype=torch.float32)
    return {**detection, "boxes": boxes + torch.tensor(shown.pad * 2, dtype=boxes.dtype)}
