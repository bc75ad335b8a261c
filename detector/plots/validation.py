"""One call after a validation run: P / R per class at the best-F1 threshold, and the validation figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from detector.data.build import SplitData
from detector.data.dataset import ImageMeta, collate
from detector.plots.batches import plot_val_predictions
from detector.plots.matching import DatasetMatches, PRCurves, match_dataset, pr_curves
from detector.plots.metrics import plot_confusion_matrix, plot_pr_curves

Predictions = list[tuple[dict[str, torch.Tensor], ImageMeta]]


@dataclass
class ValidationStats:
    precision: np.ndarray  # [C] at best_confidence; NaN for classes without ground truth
    recall: np.ndarray  # [C]
    best_confidence: float
    curves: PRCurves
    matches: DatasetMatches
    files: list[Path] = field(default_factory=list)  # figures written, if any

    @property
    def mean_precision(self) -> float:
        return float(np.nanmean(self.precision)) if np.isfinite(self.precision).any() else 0.0

    @property
    def mean_recall(self) -> float:
        return float(np.nanmean(self.recall)) if np.isfinite(self.recall).any() else 0.0


def validation_stats(predictions: Predictions, split: SplitData, num_classes: int) -> ValidationStats:
    """Match ``run_validation(..., keep_predictions=True)``'s ``info["predictions"]`` to the split's labels.

    No figures; cheap enough to call every epoch for a ``precision`` / ``recall`` column.
    """
    matches = match_dataset(predictions, split.records, split.image_hw, num_classes)
    curves = pr_curves(matches.correct, matches.scores, matches.labels, matches.gt_labels, num_classes)
    return ValidationStats(curves.best_precision, curves.best_recall, curves.best_confidence, curves, matches)


def plot_all_validation(
    predictions: Predictions,
    split: SplitData,
    names: list[str],
    out_dir: str | Path,
    *,
    max_images: int = 16,
) -> ValidationStats:
    """Write ``PR_curve.png``, ``confusion_matrix.png`` and ``val_batch0_pred.png`` into ``out_dir``.

    ``val_batch0_pred.png`` shows the first ``max_images`` images of the split (ground truth left,
    predictions scoring >= 0.25 right; 0 skips it). Returns the per-class precision / recall for
    :func:`detector.report.per_class_table`.
    """
    out_dir = Path(out_dir)
    stats = validation_stats(predictions, split, len(names))
    stats.files.append(plot_pr_curves(stats.curves, names, out_dir / "PR_curve.png"))
    stats.files.append(plot_confusion_matrix(stats.matches.confusion, names, out_dir / "confusion_matrix.png"))
    count = min(max_images, len(split.dataset), len(predictions))
    if count:
        by_id = {meta.image_id: detection for detection, meta in predictions}
        images, targets, metas = collate([split.dataset[i] for i in range(count)])
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
        shown = [by_id.get(meta.image_id, empty) for meta in metas]
        stats.files.append(plot_val_predictions(images, shown, targets, names, out_dir / "val_batch0_pred.png"))
    return stats
