"""Training and validation figures (PNG, headless), what a run shows people, and optional TensorBoard.

Each ``plot_*`` function takes plain data and an output path and returns the path it wrote. The numbers
behind the PR curves and the confusion matrix come from :mod:`detector.metrics.matching`.
"""

from detector.plots.batches import plot_batch, plot_val_predictions
from detector.plots.curves import plot_results
from detector.plots.labels import plot_label_stats
from detector.plots.metrics import plot_all_validation, plot_confusion_matrix, plot_pr_curves

__all__ = [
    "plot_all_validation",
    "plot_batch",
    "plot_confusion_matrix",
    "plot_label_stats",
    "plot_pr_curves",
    "plot_results",
    "plot_val_predictions",
]
