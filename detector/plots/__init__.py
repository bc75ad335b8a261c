"""Training and validation figures (PNG, headless), what a run shows people, and optional TensorBoard.

Each ``plot_*`` function takes plain data and an output path and returns the path it wrote. The numbers
behind the PR curves and the confusion matrix come from :mod:`detector.metrics.matching`.

The names below are imported on first use: matplotlib takes 0.4-0.9 s to import on a 2-core CPU, and a process
that draws nothing (``--no-plots``, ``val``, ``predict``, each torchrun rank but the first) imports
:mod:`detector.plots.reporter`, which runs this file first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detector.plots.batches import plot_batch, plot_val_predictions
    from detector.plots.curves import plot_results
    from detector.plots.labels import plot_label_stats
    from detector.plots.metrics import plot_confusion_matrix, plot_pr_curves
    from detector.plots.tune import plot_tune_fitness
    from detector.plots.validation import plot_all_validation

_MODULES = {
    "plot_all_validation": "validation",
    "plot_batch": "batches",
    "plot_confusion_matrix": "metrics",
    "plot_label_stats": "labels",
    "plot_pr_curves": "metrics",
    "plot_results": "curves",
    "plot_tune_fitness": "tune",
    "plot_val_predictions": "batches",
}
__all__ = [
    "plot_all_validation",
    "plot_batch",
    "plot_confusion_matrix",
    "plot_label_stats",
    "plot_pr_curves",
    "plot_results",
    "plot_tune_fitness",
    "plot_val_predictions",
]


def draw(name: str, *args: Any) -> None:
    """Draw figure ``name`` (one of this package's ``plot_*`` functions) of ``args`` in this process: the default
    of the callers that may hand their figures to a run's helper process instead (detector/plots/worker.py)."""
    function = globals().get(name) or __getattr__(name)  # a function set on the package (a test's) comes first
    function(*args)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"detector.plots.{_MODULES[name]}"), name)
    raise AttributeError(f"module 'detector.plots' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
