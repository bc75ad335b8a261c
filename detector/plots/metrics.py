"""PR-curve and confusion-matrix figures (the numbers come from :mod:`detector.metrics.matching`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from detector.metrics.matching import CONF_GRID, RECALL_GRID, PRCurves
from detector.plots.canvas import new_figure, panel_grid, save_figure

MAX_LEGEND_CLASSES = 20  # beyond this many classes, per-class lines are drawn grey and unlabelled
MAX_ANNOTATED_CLASSES = 30  # write the value in each confusion-matrix cell up to this many classes


def plot_pr_curves(curves: PRCurves, names: list[str], out_png: str | Path) -> Path:
    """Left: precision against recall per class (AP50 in the legend) and their mean; right: F1 against
    confidence, with the best-F1 threshold marked. Returns ``out_png``."""
    has_truth = curves.instances > 0
    labelled = int(has_truth.sum()) <= MAX_LEGEND_CLASSES
    figure, axes = panel_grid(1, 2, panel_in=(5.6, 5.0))
    pr_axis, f1_axis = axes[0]
    for cls in np.flatnonzero(has_truth):
        style = {"linewidth": 1, "label": f"{names[cls]} {curves.ap50[cls]:.3f}"} if labelled else {
            "linewidth": 0.8, "color": "grey", "alpha": 0.5}
        pr_axis.plot(RECALL_GRID, curves.precision_at_recall[cls], **style)
        f1_axis.plot(CONF_GRID, curves.f1[cls], **({"linewidth": 1} if labelled else style))
    if has_truth.any():
        mean_ap = float(np.nanmean(curves.ap50))
        pr_axis.plot(RECALL_GRID, curves.precision_at_recall[has_truth].mean(0), color="blue", linewidth=3,
                     label=f"all classes {mean_ap:.3f} mAP@0.5")
        mean_f1 = curves.f1[has_truth].mean(0)
        best = int(np.abs(CONF_GRID - curves.best_confidence).argmin())
        f1_axis.plot(CONF_GRID, mean_f1, color="blue", linewidth=3,
                     label=f"all classes {mean_f1[best]:.2f} at {curves.best_confidence:.3f}")
        f1_axis.axvline(curves.best_confidence, color="blue", linestyle=":", linewidth=1)
    else:
        pr_axis.text(0.5, 0.5, "no ground truth", ha="center", va="center")
    for axis, x_label, y_label, title in (
        (pr_axis, "Recall", "Precision", "Precision-Recall (IoU 0.5)"),
        (f1_axis, "Confidence", "F1", "F1-Confidence (IoU 0.5)"),
    ):
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1.01)
        axis.set_xlabel(x_label)
        axis.set_ylabel(y_label)
        axis.set_title(title, fontsize=11)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="lower left" if axis is pr_axis else "upper right", fontsize=7)
    return save_figure(figure, out_png)


def plot_confusion_matrix(
    matrix: np.ndarray, names: list[str], out_png: str | Path, normalize: bool = True
) -> Path:
    """Draw a ``[C + 1, C + 1]`` confusion matrix (rows predicted, columns true, last = background).

    With ``normalize`` each column is divided by its total, so a cell reads "share of true class j
    predicted as i"; the background column (false positives) is scaled the same way. Returns ``out_png``.
    ``normalize`` may be given by position: a figure helper's jobs (detector/plots/worker.py) carry no keywords.
    """
    labels = [*names, "background"]
    values = matrix.astype(np.float64)
    if normalize:
        values = values / np.maximum(values.sum(0, keepdims=True), 1)
    font = max(4, 10 - len(labels) // 10)
    # Margins by hand (not constrained layout): with 80 classes its second draw pass over ~160 tick
    # labels doubles the time. Room for the longest rotated name, at ~0.6 em per character.
    margin = 0.7 + max(len(label) for label in labels) * font * 0.6 / 72
    side = min(3 + 0.14 * len(labels), 12)
    width, height = margin + side + 1.4, margin + side + 0.5
    figure = new_figure(width, height, constrained=False)
    axis = figure.add_axes((margin / width, margin / height, side / width, side / height))
    colorbar_axis = figure.add_axes(((margin + side + 0.2) / width, margin / height, 0.25 / width, side / height))
    shown = np.where(values > 0, values, np.nan)  # empty cells stay white, like the figure background
    image = axis.imshow(shown, cmap="Blues", vmin=0, vmax=1 if normalize else max(values.max(), 1))
    figure.colorbar(image, cax=colorbar_axis)
    ticks = np.arange(len(labels))
    axis.set_xticks(ticks, labels, rotation=90, fontsize=font)
    axis.set_yticks(ticks, labels, fontsize=font)
    axis.set_xlabel("True")
    axis.set_ylabel("Predicted")
    axis.set_title("Confusion Matrix" + (" (normalised by true class)" if normalize else ""), fontsize=11)
    if len(labels) <= MAX_ANNOTATED_CLASSES:
        threshold = 0.5 * np.nanmax(values) if values.any() else 1
        for row, col in zip(*np.nonzero(values)):
            text = f"{values[row, col]:.2f}" if normalize else str(int(values[row, col]))
            axis.text(col, row, text, ha="center", va="center", fontsize=font,
                      color="white" if values[row, col] > threshold else "black")
    return save_figure(figure, out_png)
