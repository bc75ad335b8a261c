"""Training and validation figures (PNG, headless) and the matching behind PR curves / confusion matrix.

Each ``plot_*`` function takes plain data and an output path and returns the path it wrote.
"""

from detector.plots.batches import plot_batch, plot_val_predictions
from detector.plots.curves import plot_results
from detector.plots.labels import plot_label_stats
from detector.plots.matching import (
    DatasetMatches,
    PRCurves,
    confusion_matrix,
    match_dataset,
    match_predictions,
    pr_curves,
)
from detector.plots.metrics import plot_confusion_matrix, plot_pr_curves
from detector.plots.validation import ValidationStats, plot_all_validation, validation_stats

__all__ = [
    "DatasetMatches",
    "PRCurves",
    "ValidationStats",
    "confusion_matrix",
    "match_dataset",
    "match_predictions",
    "plot_all_validation",
    "plot_batch",
    "plot_confusion_matrix",
    "plot_label_stats",
    "plot_pr_curves",
    "plot_results",
    "plot_val_predictions",
    "pr_curves",
    "validation_stats",
]
