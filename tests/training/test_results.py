import math

from detector.metrics.coco import METRIC_NAMES
from detector.training.results import results_row


def test_an_epoch_without_validation_has_empty_metrics_and_its_extra_stats_follow_the_columns():
    stats = {"train/box": 1.0, "train/cls": 2.0, "train/dfl": 3.0, "lr": 0.01, "images_per_s": 9.5}
    row = results_row(4, stats, None, "fp32")
    assert row["epoch"] == 5 and row["precision"] == "fp32" and row["evaluator"] == ""
    assert all(row[name] == "" for name in METRIC_NAMES) and math.isnan(row["val_seconds"])
    assert list(row)[-1] == "images_per_s" and row["images_per_s"] == 9.5


def test_validation_losses_follow_the_training_ones_and_a_resumed_runs_older_rows_read_blank(tmp_path):
    """val/box, val/cls, val/dfl stand beside train/box... as Ultralytics' columns do; a file written before they
    existed (a run resumed by this version) gets them after its own columns, empty in its older rows."""
    import csv

    import numpy as np

    from detector.metrics.coco import EvalResult
    from detector.metrics.loop import Validation
    from detector.runs import append_results

    stats = {"train/box": 1.0, "train/cls": 2.0, "train/dfl": 3.0, "lr": 0.01}
    scores = EvalResult(dict.fromkeys(METRIC_NAMES, 0.5), np.zeros(2), np.zeros(2), evaluator="faster-coco-eval 1.0")
    losses = {"val/box": 1.5, "val/cls": 2.5, "val/dfl": 3.5}
    validation = Validation(scores, 1.0, 4, np.zeros((0, 7)), losses=losses)
    row = results_row(0, stats, validation, "fp32")
    assert list(row)[:8] == ["epoch", "train/box", "train/cls", "train/dfl", "val/box", "val/cls", "val/dfl", "lr"]
    assert [row[name] for name in losses] == [1.5, 2.5, 3.5]
    unscored = results_row(1, stats, None, "fp32")
    assert [unscored[name] for name in losses] == ["", "", ""]  # an epoch not evaluated, as its metrics

    older = tmp_path / "results.csv"
    older.write_text("epoch,train/box,train/cls,train/dfl,lr\n1,1,2,3,0.01\n")  # before the columns existed
    append_results(older, results_row(1, stats, validation, "fp32"))
    rows = list(csv.DictReader(older.open()))
    assert [rows[0][name] for name in losses] == ["", "", ""] and [rows[1][name] for name in losses] == [
        "1.5", "2.5", "3.5"]
