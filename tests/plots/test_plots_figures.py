"""Every figure function writes a real PNG, quickly, from plain data."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from detector.data.dataset import collate
from detector.data.records import ImageRecord
from detector.metrics.matching import pr_curves
from detector.plots import (
    plot_batch,
    plot_confusion_matrix,
    plot_label_stats,
    plot_pr_curves,
    plot_results,
    plot_val_predictions,
)
from detector.plots.curves import read_numeric_columns

RESULTS_CSV = """epoch,train/box,train/cls,train/dfl,lr,mAP50-95,mAP50,mAP75,precision,images_per_s
0,2.1,3.0,1.5,0.01,,,,,120
1,1.9,2.6,1.4,0.01,0.10,0.20,0.08,0.3,121
2,1.7,2.2,1.3,0.009,,,,,119
3,1.6,2.0,1.25,0.008,0.18,0.31,0.15,0.4,nan
"""


def test_results_csv_with_empty_metric_cells(tmp_path: Path, assert_png) -> None:
    csv_path = tmp_path / "results.csv"
    csv_path.write_text(RESULTS_CSV)
    columns = read_numeric_columns(csv_path)
    assert np.isnan(columns["mAP50"][[0, 2]]).all() and columns["mAP50"][3] == 0.31
    assert np.isnan(columns["images_per_s"][3])
    out = plot_results(csv_path, tmp_path / "results.png")
    assert out == tmp_path / "results.png"
    assert_png(out, min_side=200)


def test_results_png_draws_the_learning_rate_beside_the_losses(tmp_path: Path, monkeypatch) -> None:
    """The top row held the three losses and left three places of the bottom row's six empty; the learning rate, a
    results.csv column Ultralytics' results.png draws, had no panel."""
    import detector.plots.curves as curves

    csv_path = tmp_path / "results.csv"
    csv_path.write_text(RESULTS_CSV)
    drawn = []
    monkeypatch.setattr(curves, "_plot_series", lambda axis, epochs, values, name, smooth=True: drawn.append(
        (name, axis.get_subplotspec().rowspan.start, values.tolist(), smooth)))
    curves.plot_results(csv_path, tmp_path / "results.png")
    assert [(name, row) for name, row, _, _ in drawn] == [("train/box", 0), ("train/cls", 0), ("train/dfl", 0),
                                                          ("lr", 0), ("mAP50-95", 1), ("mAP50", 1), ("mAP75", 1)]
    assert drawn[3][2:] == ([0.01, 0.01, 0.009, 0.008], False)  # the column as written, without a trend line
    assert curves.results_panels(["epoch", "lr"]) == [["lr"]]


def _panels_drawn(tmp_path: Path, monkeypatch, results_csv: str) -> list[tuple[str, int, int, list[float]]]:
    """results.png of ``results_csv``: each panel drawn, as (column, grid row, grid column, its values)."""
    import detector.plots.curves as curves

    csv_path = tmp_path / "results.csv"
    csv_path.write_text(results_csv)
    drawn = []
    monkeypatch.setattr(curves, "_plot_series", lambda axis, epochs, values, name, smooth=True: drawn.append(
        (name, axis.get_subplotspec().rowspan.start, axis.get_subplotspec().colspan.start, values.tolist())))
    curves.plot_results(csv_path, tmp_path / "results.png")
    return drawn


def test_results_png_draws_p_and_r_after_the_validation_losses(tmp_path: Path, monkeypatch) -> None:
    """results.csv's P and R (the val table's all row, as Ultralytics' results.png draws its precision and recall)
    get panels after the validation losses; ``precision`` (the numeric one, a word) gets none."""
    import detector.plots.curves as curves

    drawn = _panels_drawn(tmp_path, monkeypatch, "epoch,train/box,val/box,lr,mAP50-95,P,R,precision\n"
                          "1,2.1,2.4,0.01,0.1,0.30,0.20,bf16\n2,1.9,2.2,0.01,,,,bf16\n3,1.8,2.1,0.01,0.2,0.45,0.35,bf16\n")
    assert [(name, row, col) for name, row, col, _ in drawn] == [
        ("train/box", 0, 0), ("lr", 0, 1), ("val/box", 1, 0), ("P", 1, 1), ("R", 1, 2), ("mAP50-95", 2, 0)]
    assert drawn[3][3][0::2] == [0.30, 0.45] and np.isnan(drawn[3][3][1])  # an unevaluated epoch is not a zero
    assert curves.results_panels(["P", "R"]) == [["P", "R"]]


def test_results_png_draws_each_validation_loss_under_its_training_loss(tmp_path: Path, monkeypatch) -> None:
    """As Ultralytics' results.png: train/box, train/cls, train/dfl on top, val/box, val/cls, val/dfl below them
    (in that order even where a resumed run's file has them at its end), then the mAPs; a resumed run's older rows,
    blank there, are left out of the line rather than drawn as zeros."""
    drawn = _panels_drawn(tmp_path, monkeypatch, "epoch,train/box,train/cls,train/dfl,lr,mAP50-95,val_seconds,val/cls,"
                          "val/box,val/dfl\n1,2.1,3.0,1.5,0.01,0.1,1.0,,,\n2,1.9,2.6,1.4,0.01,0.2,1.0,2.4,1.8,1.3\n")
    assert [(name, row, col) for name, row, col, _ in drawn] == [
        ("train/box", 0, 0), ("train/cls", 0, 1), ("train/dfl", 0, 2), ("lr", 0, 3),
        ("val/box", 1, 0), ("val/cls", 1, 1), ("val/dfl", 1, 2), ("mAP50-95", 2, 0)]
    assert np.isnan(drawn[4][3][0]) and drawn[4][3][1] == 1.8  # the older row's blank: skipped where drawn


def test_results_csv_padded_headers_and_header_only(tmp_path: Path, assert_png) -> None:
    padded = tmp_path / "padded.csv"
    padded.write_text("  epoch,  train/box,  mAP50\n 0, 1.0,\n 1, 0.9, 0.5\n")
    assert read_numeric_columns(padded)["train/box"].tolist() == [1.0, 0.9]
    assert_png(plot_results(padded, tmp_path / "padded.png"))
    empty = tmp_path / "empty.csv"
    empty.write_text("epoch,train/box,mAP50\n")
    assert_png(plot_results(empty, tmp_path / "empty.png"))


def test_label_stats(tmp_path: Path, assert_png) -> None:
    rng = np.random.default_rng(0)
    records = []
    for index in range(20):
        count = int(rng.integers(0, 6))
        labels = np.column_stack((rng.integers(0, 3, count), rng.uniform(0.2, 0.8, (count, 4)) * [1, 1, 0.3, 0.3]))
        records.append(ImageRecord(Path(f"{index}.jpg"), labels.astype(np.float32), index))
    assert_png(plot_label_stats(records, ["a", "b", "c"], tmp_path / "labels.png"), min_side=300)
    # No boxes at all must still draw (an all-background split).
    empty = [ImageRecord(Path("x.jpg"), np.zeros((0, 5), np.float32), 0)]
    assert_png(plot_label_stats(empty, ["a"], tmp_path / "labels_empty.png"))


def test_plot_batch_draws_boxes(tmp_path: Path, assert_png) -> None:
    images = torch.full((3, 3, 64, 64), 100, dtype=torch.uint8)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.5], [2, 1, 0.25, 0.25, 0.2, 0.2]])
    blank = tmp_path / "blank.png"
    assert_png(plot_batch(images, torch.zeros(0, 6), ["a", "b"], blank))
    drawn = assert_png(plot_batch(images, targets, ["a", "b"], tmp_path / "batch.png"))
    assert drawn.shape == assert_png(blank).shape
    assert (drawn != assert_png(blank)).any(), "boxes were not drawn"


def test_plot_batch_limits_images(tmp_path: Path, assert_png) -> None:
    images = torch.zeros((20, 3, 32, 32), dtype=torch.uint8)
    grid = assert_png(plot_batch(images, torch.zeros(0, 6), ["a"], tmp_path / "b.png", max_images=4))
    assert grid.shape[:2] == (2 * 32 + 6, 2 * 32 + 6)  # 2 x 2 tiles and one gap each way


def test_plot_val_predictions(tiny_split, tmp_path: Path, assert_png) -> None:
    images, targets, _ = collate([tiny_split.dataset[i] for i in range(len(tiny_split.dataset))])
    predictions = [
        {"boxes": torch.tensor([[10.0, 10, 30, 30], [5, 5, 9, 9]]), "scores": torch.tensor([0.9, 0.1]),
         "labels": torch.tensor([0, 1])}
        for _ in range(len(images))
    ]
    image = assert_png(plot_val_predictions(images, predictions, targets, ["a", "b"], tmp_path / "pred.png"))
    assert image.shape[1] > image.shape[0]  # two panels per image


def test_pr_and_confusion_figures_are_fast(tmp_path: Path, assert_png) -> None:
    rng = np.random.default_rng(0)
    num_classes, count = 80, 3000
    labels = rng.integers(0, num_classes, count)
    curves = pr_curves(rng.random(count) < 0.5, rng.random(count), labels, labels[: count // 2], num_classes)
    names = [f"class{i}" for i in range(num_classes)]
    start = time.perf_counter()
    assert_png(plot_pr_curves(curves, names, tmp_path / "PR_curve.png"), min_side=300)
    matrix = rng.integers(0, 5, (num_classes + 1, num_classes + 1))
    assert_png(plot_confusion_matrix(matrix, names, tmp_path / "confusion_matrix.png"), min_side=300)
    assert time.perf_counter() - start < 10  # generous for a loaded 2-core CI box; ~1 s when idle
    few = pr_curves(np.array([True, False]), np.array([0.9, 0.5]), np.array([0, 1]), np.array([0, 1]), 2)
    assert_png(plot_pr_curves(few, ["a", "b"], tmp_path / "PR_few.png"))
    assert_png(plot_confusion_matrix(np.eye(3, dtype=int), ["a", "b"], tmp_path / "cm_few.png", normalize=False))


def test_predictions_scored_in_a_rectangular_batch_are_drawn_where_the_square_shows_the_image():
    from detector.data.letterbox import ImageMeta
    from detector.plots.validation import in_letterbox

    # A 120 x 160 image at 160 px: scored in a 128-row canvas (4 rows above), drawn in the square (20 rows above).
    scored, shown = ImageMeta(7, (120, 160), 1.0, (0.0, 4.0)), ImageMeta(7, (120, 160), 1.0, (0.0, 20.0))
    detection = {"boxes": torch.tensor([[10.0, 14.0, 50.0, 44.0]]), "scores": torch.tensor([0.9]),
                 "labels": torch.tensor([1])}
    moved = in_letterbox(detection, scored, shown)
    assert torch.equal(moved["boxes"], torch.tensor([[10.0, 30.0, 50.0, 60.0]]))
    assert moved["scores"] is detection["scores"] and moved["labels"] is detection["labels"]
