import math

from detector.metrics.coco import METRIC_NAMES
from detector.training.results import results_row


def test_an_epoch_without_validation_has_empty_metrics_and_its_extra_stats_follow_the_columns():
    stats = {"train/box": 1.0, "train/cls": 2.0, "train/dfl": 3.0, "lr": 0.01, "images_per_s": 9.5}
    row = results_row(4, stats, None, "fp32")
    assert row["epoch"] == 5 and row["precision"] == "fp32" and row["evaluator"] == ""
    assert all(row[name] == "" for name in METRIC_NAMES) and math.isnan(row["val_seconds"])
    assert list(row)[-1] == "images_per_s" and row["images_per_s"] == 9.5
