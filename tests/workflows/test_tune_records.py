"""detector tune's records (detector/workflows/tune_records.py): fitness from a run, rows, the best settings file."""

from __future__ import annotations

from pathlib import Path

from detector.cli.flags import options_from_args
from detector.cli.train import parse_args
from detector.training.config import TrainConfig
from detector.workflows.tune_records import append_row, best_row, read_rows, run_metrics, write_best


def test_fitness_is_the_best_evaluated_epochs_map50_95(tmp_path: Path):
    path = tmp_path / "results.csv"
    path.write_text("epoch,mAP50-95,mAP50\n1,0.2,0.5\n2,,\n3,0.31,0.45\n4,0.3,0.6\n5,nan,0.7\n")
    assert run_metrics(path) == (0.31, 0.45)
    path.write_text("epoch,mAP50-95,mAP50\n1,,\n")
    assert run_metrics(path) is None and run_metrics(tmp_path / "missing.csv") is None


def test_rows_read_back_exactly_the_values_trained(tmp_path: Path):
    first = {"lr0": 1e-05, "degrees": 12.34567, "close_mosaic": 7}
    append_row(tmp_path, 1, (0.123456789, 0.5), 12.34, first)
    append_row(tmp_path, 2, None, 3.0, {"lr0": 0.00123, "degrees": 0.0, "close_mosaic": 0})  # a failed training
    append_row(tmp_path, 3, (0.2, 0.4), 5.0, {"lr0": 0.002, "degrees": 1.0, "close_mosaic": 3})
    rows = read_rows(tmp_path)
    assert [row["iteration"] for row in rows] == [1, 2, 3] and rows[0]["settings"] == first
    assert type(rows[0]["settings"]["close_mosaic"]) is int and rows[1]["fitness"] == 0.0
    assert rows[1]["mAP50-95"] is None and rows[0]["fitness"] == 0.123457
    assert best_row(rows)["iteration"] == 3
    lines = (tmp_path / "tune_results.csv").read_text().splitlines()
    assert lines[0] == "iteration,fitness,mAP50-95,mAP50,seconds,lr0,degrees,close_mosaic" and len(lines) == 4


def test_the_best_settings_file_is_what_train_cfg_reads(tmp_path: Path):
    settings = {"lr0": 0.00123, "box_gain": 12.34567, "close_mosaic": 3, "mosaic": 0.5}
    append_row(tmp_path, 1, (0.3, 0.6), 1.0, settings)
    path = write_best(tmp_path, read_rows(tmp_path)[0], 1, 10, ["--epochs", "3"])
    config = options_from_args(TrainConfig, parse_args([f"cfg={path}", "--data", "x.yaml", "--mosaic", "0.25"]))
    assert (config.lr0, config.box_gain, config.close_mosaic) == (0.00123, 12.34567, 3)
    assert config.mosaic == 0.25  # the command line's own win, as with any cfg= file
    assert path.read_text().startswith("# detector tune: best of 1 iterations (of 10)")
