"""``results.csv`` -> ``results.png``: every loss column, the learning rate, P and R and every mAP column against
epoch."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from detector.plots.canvas import panel_grid, save_figure

TRAIN_LOSS_PREFIX, VAL_LOSS_PREFIX = "train/", "val/"  # loss columns: train/box, train/cls, train/dfl, val/box...
METRIC_PREFIX = "mAP"  # metric columns, e.g. mAP50-95, mAP50, mAP75
LEARNING_RATE = "lr"  # the weights' learning rate at the epoch's end: drawn after the losses, as it drives them
# The val table's "all" precision and recall (detector/metrics/loop.py's PR_COLUMNS; not the numeric precision,
# whose column is "precision"): drawn after the validation losses, as Ultralytics' results.png draws its P and R.
PRECISION_RECALL = ("P", "R")
SMOOTH_MIN_POINTS = 10  # draw a smoothed trend only when there are enough points for it to mean something


def read_numeric_columns(csv_path: str | Path) -> dict[str, np.ndarray]:
    """CSV -> ``{column: float array [rows]}``; empty or non-numeric cells become NaN.

    Header names are stripped of padding, so Ultralytics-style ``"   train/box"`` columns work too.
    """
    with open(csv_path, newline="") as file:
        rows = list(csv.reader(file))
    if not rows:
        return {}
    header = [name.strip() for name in rows[0]]
    columns: dict[str, list[float]] = {name: [] for name in header}
    for row in rows[1:]:
        if not any(cell.strip() for cell in row):
            continue
        for name, cell in zip(header, row + [""] * (len(header) - len(row))):
            columns[name].append(_to_float(cell))
    return {name: np.asarray(values, dtype=np.float64) for name, values in columns.items()}


def _to_float(cell: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def _smooth(values: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """Moving average over ``fraction`` of the series (odd window, edges padded), for the trend line."""
    window = max(3, int(round(len(values) * fraction)) // 2 * 2 + 1)
    padded = np.concatenate((np.full(window // 2, values[0]), values, np.full(window // 2, values[-1])))
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def plot_results(csv_path: str | Path, out_png: str | Path) -> Path:
    """Plot a training ``results.csv`` and return ``out_png``.

    Top row: one panel per training loss column (``train/*``), then the learning rate (``lr``); below it one per
    validation loss column (``val/*``), each under its training column as Ultralytics' results.png has them, then
    ``P`` and ``R``; bottom row: one panel per ``mAP*`` column. The x axis is the ``epoch`` column (row number when
    absent). Cells that are empty or not numbers (epochs without evaluation) are skipped, not drawn as zeros.
    """
    columns = read_numeric_columns(csv_path)
    epochs = columns.get("epoch")
    rows_count = max((len(v) for v in columns.values()), default=0)
    if epochs is None or np.isnan(epochs).all():
        epochs = np.arange(rows_count, dtype=np.float64)
    panel_rows = results_panels(list(columns))
    panel_cols = max(len(group) for group in panel_rows) or 1
    figure, axes = panel_grid(len(panel_rows), panel_cols, panel_in=(2.6, 2.0))
    for axis in axes.flat:
        axis.set_visible(False)
    for row, group in enumerate(panel_rows):
        for col, name in enumerate(group):
            # The learning rate is a schedule, not a noisy measurement: no trend line over it.
            _plot_series(axes[row, col], epochs, columns[name], name, smooth=name != LEARNING_RATE)
    if panel_rows == [[]]:
        axes[0, 0].set_visible(True)
        axes[0, 0].text(0.5, 0.5, "no loss or mAP columns", ha="center", va="center")
        axes[0, 0].set_axis_off()
    return save_figure(figure, out_png)


def results_panels(names: list[str]) -> list[list[str]]:
    """results.png's panels, row by row, of a results.csv with columns ``names``: the training losses and the
    learning rate (Ultralytics' three lr/pg columns are one here: the biases' warm-up ends at the weights' rate), the
    validation losses (a resumed run's file has them after its other columns: ordered as the training ones, so that
    val/box stands under train/box) with P and R after them (their row's other places: the mAPs' row is full), then
    the mAPs. The learning rate took none, while the top row left three of the bottom row's six places empty."""
    train = [name for name in names if name.startswith(TRAIN_LOSS_PREFIX)]
    place = {name[len(TRAIN_LOSS_PREFIX):]: index for index, name in enumerate(train)}  # box: 0, cls: 1, ...
    val = sorted((name for name in names if name.startswith(VAL_LOSS_PREFIX)),
                 key=lambda name: place.get(name[len(VAL_LOSS_PREFIX):], len(place)))
    metrics = [name for name in names if name.startswith(METRIC_PREFIX)]
    top = train + [LEARNING_RATE] * (LEARNING_RATE in names)
    middle = val + [name for name in PRECISION_RECALL if name in names]
    return [group for group in (top, middle, metrics) if group] or [[]]


def _plot_series(axis, epochs: np.ndarray, values: np.ndarray, name: str, *, smooth: bool = True) -> None:
    axis.set_visible(True)
    keep = ~np.isnan(values) & ~np.isnan(epochs)
    x, y = epochs[keep], values[keep]
    axis.set_title(name, fontsize=10)
    axis.set_xlabel("epoch", fontsize=8)
    axis.tick_params(labelsize=7)
    axis.grid(alpha=0.3)
    if not len(y):
        axis.text(0.5, 0.5, "no values", ha="center", va="center", transform=axis.transAxes, fontsize=8)
        return
    axis.plot(x, y, marker=".", linewidth=1.5, markersize=4, label="value")
    if smooth and len(y) >= SMOOTH_MIN_POINTS:
        axis.plot(x, _smooth(y), ":", linewidth=1.5, label="smooth")
