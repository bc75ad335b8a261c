"""Label statistics of a split -> ``labels.png``: what the model will be asked to find, at a glance."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from detector.data.records import ImageRecord, Records
from detector.plots.canvas import panel_grid, save_figure

HIST_BINS = 50  # per axis of the 2-D histograms
MAX_TICK_LABELS = 40  # name every bar up to this many classes; beyond, label by index only


def stack_labels(records: Sequence[ImageRecord]) -> np.ndarray:
    """All records' labels as one ``[N, 5]`` float array (class, cx, cy, w, h normalised)."""
    if isinstance(records, Records):  # the flat store has them in one array already
        return records.labels.astype(np.float64)
    arrays = [r.labels.reshape(-1, 5) for r in records]
    return np.concatenate(arrays).astype(np.float64) if arrays else np.zeros((0, 5))


def plot_label_stats(records: Sequence[ImageRecord], names: list[str], out_png: str | Path) -> Path:
    """Four panels: instances per class, boxes per image, box-centre heat map, box width x height heat map.

    ``records`` hold normalised labels, so the heat maps are in image fractions (0-1) whatever the
    image sizes. Returns ``out_png``.
    """
    labels = stack_labels(records)
    classes = labels[:, 0].astype(int)
    counts = np.bincount(classes, minlength=len(names))[: len(names)]
    per_image = records.box_counts() if isinstance(records, Records) else np.array([len(r.labels) for r in records])

    named = len(names) <= MAX_TICK_LABELS
    font = max(5, 10 - len(names) // 8)
    # The gap under the top row holds the rotated class names (~0.6 em a character).
    name_room = 0.6 * font / 72 * max((len(n) for n in names), default=0) if named else 0.3
    figure, axes = panel_grid(2, 2, panel_in=(5.0, 3.6), gaps_in=(0.9, 0.7 + name_room))
    (bars, per_image_axis), (centres, sizes) = axes
    bars.bar(np.arange(len(names)), counts, color="#4c72b0")
    bars.set_title(f"instances per class ({len(labels)} boxes, {len(records)} images)", fontsize=10)
    bars.set_ylabel("instances")
    if named:
        bars.set_xticks(np.arange(len(names)), names, rotation=90, fontsize=font)
    else:
        bars.set_xlabel("class index")

    top = max(int(per_image.max(initial=0)), 1)
    per_image_axis.hist(per_image, bins=np.arange(top + 2) - 0.5, color="#55a868")
    per_image_axis.set_title("boxes per image", fontsize=10)
    per_image_axis.set_xlabel("boxes")
    per_image_axis.set_ylabel("images")

    _heat_map(centres, labels[:, 1], labels[:, 2], "box centres", "x", "y", invert_y=True)
    _heat_map(sizes, labels[:, 3], labels[:, 4], "box sizes", "width", "height", invert_y=False)
    return save_figure(figure, out_png)


def _heat_map(axis, x: np.ndarray, y: np.ndarray, title: str, x_label: str, y_label: str, *, invert_y: bool) -> None:
    """2-D histogram over [0, 1]^2 on a log colour scale (a few huge boxes must not hide the rest)."""
    edges = np.linspace(0, 1, HIST_BINS + 1)
    counts, _, _ = np.histogram2d(x, y, bins=(edges, edges))
    # imshow wants [rows = y, cols = x]; log1p keeps empty bins at zero.
    origin = "upper" if invert_y else "lower"
    axis.imshow(np.log1p(counts.T), extent=(0, 1, 1, 0) if invert_y else (0, 1, 0, 1), origin=origin,
                cmap="Blues", aspect="auto", interpolation="nearest")
    axis.set_title(title, fontsize=10)
    axis.set_xlabel(x_label)
    axis.set_ylabel(y_label)
