import csv
import math
from pathlib import Path

from detector.checkpoint import load_checkpoint
from detector.metrics.coco import METRIC_NAMES
from detector.training.config import TrainConfig
from detector.training.results import results_row
from detector.training.trainer import train


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


def test_p_and_r_follow_the_map_columns_and_are_empty_where_unmatched(tmp_path):
    """results.csv's P and R (the val table's "all" row, Ultralytics' metrics/precision(B) and recall(B)) stand after
    the mAP columns, before ``precision``, the numeric one; empty for an epoch not evaluated and for a pass scored
    without them. A file written before they existed gets them after its own columns, empty in its older rows."""
    import csv

    import numpy as np

    from detector.metrics.coco import EvalResult
    from detector.metrics.loop import Validation
    from detector.runs import append_results

    stats = {"train/box": 1.0, "train/cls": 2.0, "train/dfl": 3.0, "lr": 0.01}
    matched = EvalResult(dict.fromkeys(METRIC_NAMES, 0.5), np.zeros(2), np.zeros(2), mean_precision=0.75,
                         mean_recall=0.25)
    row = results_row(0, stats, Validation(matched, 1.0, 4, np.zeros((0, 7))), "fp32")
    names = list(row)
    assert names[names.index("mAP_large") + 1:][:3] == ["P", "R", "precision"] and (row["P"], row["R"]) == (0.75, 0.25)
    unmatched = EvalResult(dict.fromkeys(METRIC_NAMES, 0.5), np.zeros(2), np.zeros(2))
    assert [results_row(0, stats, Validation(unmatched, 1.0, 4, np.zeros((0, 7))), "fp32")[k] for k in "PR"] == ["", ""]
    assert [results_row(1, stats, None, "fp32")[k] for k in "PR"] == ["", ""]

    older = tmp_path / "results.csv"
    older.write_text("epoch,train/box,train/cls,train/dfl,lr,mAP50-95\n1,1,2,3,0.01,0.5\n")  # before P and R
    append_results(older, row)
    rows = list(csv.DictReader(older.open()))
    header = list(rows[0])
    assert header[:6] == ["epoch", "train/box", "train/cls", "train/dfl", "lr", "mAP50-95"] and "P" in header[6:]
    assert [rows[0]["P"], rows[0]["R"], rows[1]["P"], rows[1]["R"]] == ["", "", "0.75", "0.25"]


def _large_boxes(data: Path) -> Path:
    """``data`` (tests.conftest.write_yolo_dataset's) with one box an image covering 80% of its side, of the class of
    its first shape: the boxes of a lively model (tests.conftest.lively_model) span nearly all of a 64 px image, so
    some match these at IoU 0.5, and P and R are not 0."""
    for labels in (data.parent / "labels").rglob("*.txt"):
        first = labels.read_text().split()[0]
        labels.write_text(f"{first} 0.5 0.5 0.8 0.8\n")
    return data


def _config(data: Path, project: Path, **overrides) -> TrainConfig:
    values = dict(data=str(data), device="cpu", imgsz=64, epochs=2, batch=4, workers=0, cache="none",
                  project=str(project), name="run", plots=False, amp_check=False, close_mosaic=1, seed=0,
                  warmup_epochs=0.5)
    return TrainConfig(**{**values, **overrides})


def test_an_epochs_p_and_r_are_what_val_reports_for_its_weights(tmp_path: Path, monkeypatch, capsys):
    """The P and R of an evaluated epoch, in results.csv and its line, are the "all" row `detector val` reports for
    the weights that epoch validated (its EMA, kept here in FP32: best.pt's FP16 would score otherwise) on the same
    data, in FP32 both; the epoch --val-interval skips has them empty."""
    import detector.metrics.table as table
    from detector.model import build_model
    from detector.training.validator import Validator
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val
    from tests.conftest import lively_model, write_checkpoint, write_yolo_dataset

    data = _large_boxes(write_yolo_dataset(tmp_path / "data"))
    validated, real_run = [], Validator.run

    def recorded(self, model, precision, **options):
        validated.append({name: tensor.detach().clone() for name, tensor in model.state_dict().items()})
        return real_run(self, model, precision, **options)

    monkeypatch.setattr(Validator, "run", recorded)
    # From a lively model at a rate that barely moves it: an epoch's model that finds boxes, in a second.
    start = write_checkpoint(lively_model(), tmp_path / "lively.pt")
    summary = train(_config(data, tmp_path, weights=str(start), lr0=1e-5, warmup_epochs=0, precision="fp32",
                            val_interval=2), progress=False)
    first, second = csv.DictReader((summary["run_dir"] / "results.csv").open())
    assert (first["P"], first["R"], first["mAP50"]) == ("", "", "")  # not evaluated
    assert len(validated) == 1 and 0 < float(second["P"]) < 1 and 0 < float(second["R"]) <= 1
    # best.pt (epoch 2, the one evaluated) and train()'s result keep them beside the mAPs, as Ultralytics' do.
    kept = load_checkpoint(summary["run_dir"] / "weights" / "best.pt")["metrics"]
    assert (f"{kept['P']:.6g}", f"{kept['R']:.6g}") == (second["P"], second["R"])
    assert {k: summary["metrics"][k] for k in ("P", "R")} == {k: kept[k] for k in ("P", "R")}

    model = build_model(num_classes=3, scale="n")
    model.load_state_dict(validated[0])
    weights = write_checkpoint(model.eval(), tmp_path / "epoch2.pt")
    reported, real_rows = [], table.per_class_rows
    monkeypatch.setattr(table, "per_class_rows", lambda *args: reported.append(real_rows(*args)) or reported[-1])
    returned = run_val(ValOptions(weights=weights, data=data, imgsz=64, batch=8, workers=0, device="cpu", fp32=True,
                                  plots=False, project=tmp_path / "val", verbose=False))
    everything = reported[0][0]
    assert (returned["P"], returned["R"]) == (everything.precision, everything.recall)  # val()'s result has them too
    assert everything.name == "all" and (second["P"], second["R"]) == (
        f"{everything.precision:.6g}", f"{everything.recall:.6g}")  # results.csv's 6 digits of the same number
    assert f"  P {everything.precision:.3f}  R {everything.recall:.3f} | " in capsys.readouterr().out


def test_a_run_resumed_from_a_results_csv_without_p_and_r_adds_them_at_its_end(tmp_path: Path):
    """A run begun by a version without P and R, resumed by this one: its results.csv keeps its columns where they
    are and gets P and R after them, empty in its older rows, filled in the rows this version writes."""
    from tests.conftest import write_yolo_dataset

    data = write_yolo_dataset(tmp_path / "data")
    partial = train(_config(data, tmp_path), progress=False, stop_after_epochs=1)
    results = partial["run_dir"] / "results.csv"
    with results.open() as file:  # the file as the older version wrote it
        older = [{k: v for k, v in row.items() if k not in ("P", "R")} for row in csv.DictReader(file)]
    with results.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(older[0]))
        writer.writeheader()
        writer.writerows(older)
    train(_config(data, tmp_path, resume=str(partial["run_dir"] / "weights" / "last.pt")), progress=False)
    first, second = csv.DictReader(results.open())
    assert list(first)[:len(older[0])] == list(older[0]) and list(first)[-2:] == ["P", "R"]
    assert (first["P"], first["R"]) == ("", "") and {k: first[k] for k in older[0]} == older[0]
    assert second["epoch"] == "2" and all(0 <= float(second[k]) <= 1 for k in "PR")
