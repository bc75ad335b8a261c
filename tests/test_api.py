"""The Python API (detector/api.py): each verb on a tiny synthetic dataset, against the command it wraps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detector import export, load, predict, train, val
from detector.checkpoint import is_stripped, load_checkpoint
from detector.cli.predict import main as predict_main
from tests.conftest import write_yolo_dataset

TRAIN_FLAGS = dict(device="cpu", imgsz=64, epochs=1, batch=4, workers=0, cache="none", plots=False,
                   amp_check=False, close_mosaic=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One tiny training run through the API, shared by the tests below."""
    root = tmp_path_factory.mktemp("api")
    data = write_yolo_dataset(root / "data")
    summary = train(data=str(data), project=root / "runs", name="exp", **TRAIN_FLAGS)
    return {**summary, "data": data, "root": root}


def test_import_detector_stays_cheap():
    code = ("import sys, detector; from detector import train, val, predict, export, load; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_keywords_are_the_option_objects_fields():
    # Checked before any work: no model is loaded, no file is read.
    with pytest.raises(TypeError, match=r"^predict: unknown argument 'max_dets'; known: .*\bmax_det\b"):
        predict("x.jpg", max_dets=5)
    with pytest.raises(TypeError, match=r"^predict: missing argument 'source' \(--source\)$"):
        predict(weights="x.pt")
    with pytest.raises(TypeError, match=r"^train: unknown argument 'epoch'; known: .*\bepochs\b"):
        train(epoch=3)
    with pytest.raises(ValueError, match=r"^--model: invalid choice: 'z'"):  # TrainConfig's choices, as the flag's
        train(model="z")
    with pytest.raises(ValueError, match=r"^--conf: expected float, got 'high'$"):
        predict("x.jpg", conf="high")


def test_train_returns_metrics_the_run_folder_and_a_stripped_best(run: dict):
    assert 0 <= run["metrics"]["mAP50-95"] <= 1 and run["epochs_done"] == 1 and not run["interrupted"]
    assert run["best"] == Path(run["run_dir"]) / "weights" / "best.pt" and is_stripped(load_checkpoint(run["best"]))


def test_val_returns_the_metrics(run: dict):
    metrics = val(weights=run["best"], data=run["data"], device="cpu", workers=0, plots=False,
                  project=run["root"] / "val")
    assert {"mAP50-95", "mAP50", "mAP75"} <= metrics.keys() and all(0 <= v <= 1 for v in metrics.values())
    with pytest.raises(ValueError, match="--split: invalid choice: 'bogus'"):
        val(weights=run["best"], data=run["data"], split="bogus")


def test_predict_and_a_loaded_model_give_the_commands_detections(run: dict, tmp_path: Path):
    images = Path(run["data"]).parent / "images" / "val"
    flags = dict(conf=0.001, device="cpu")
    results = predict(images, weights=run["best"], **flags)
    names = sorted(p.name for p in images.iterdir())
    assert [r["file"] for r in results] == names and sum(len(r["boxes"]) for r in results) > 0
    for result in results:
        assert result["boxes"].dtype == np.float32 and result["boxes"].shape == (len(result["scores"]), 4)
        assert result["scores"].dtype == np.float32 and result["labels"].dtype == np.int64
        assert len(result["names"]) == len(result["labels"])
    assert predict_main(["--source", str(images), "--weights", str(run["best"]), "--conf", "0.001", "--device", "cpu",
                         "--project", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "exp" / "predictions.json").read_text())
    for record, result in zip(records, results, strict=True):
        np.testing.assert_allclose(np.array(record["boxes"]).reshape(-1, 4), result["boxes"], atol=0.005 + 1e-4)
        assert record["labels"] == result["labels"].tolist()
    model = load(run["best"], device="cpu")
    assert model.names == ["circle", "square", "triangle"]
    for loaded, result in zip(model.predict(images, conf=0.001), results, strict=True):
        np.testing.assert_array_equal(loaded["boxes"], result["boxes"])  # same code, same weights: identical
        np.testing.assert_array_equal(loaded["scores"], result["scores"])


def test_predict_writes_nothing_unless_asked(run: dict, tmp_path: Path):
    image = next((Path(run["data"]).parent / "images" / "val").iterdir())
    predict(image, weights=run["best"], device="cpu", project=tmp_path / "quiet")
    assert not (tmp_path / "quiet").exists()
    predict(image, weights=run["best"], device="cpu", project=tmp_path / "saved", save=True)
    assert sorted(p.name for p in (tmp_path / "saved" / "exp").iterdir()) == sorted([image.name, "predictions.json"])


def test_export_returns_the_checked_files(run: dict, tmp_path: Path):
    pytest.importorskip("onnx", reason="the 'export' extra")
    pytest.importorskip("onnxruntime", reason="the 'export' extra")
    best = tmp_path / "best.pt"
    best.write_bytes(Path(run["best"]).read_bytes())
    assert export(weights=best, format="onnx", device="cpu") == [tmp_path / "best.onnx"]
    assert (tmp_path / "best.onnx").is_file()
    assert load(tmp_path / "best.onnx", device="cpu").names == ["circle", "square", "triangle"]


def test_a_stripped_best_starts_a_fine_tune(run: dict, capsys: pytest.CaptureFixture):
    summary = train(data=str(run["data"]), weights=str(run["best"]), project=run["root"] / "runs", name="tune",
                    **TRAIN_FLAGS)
    assert summary["epochs_done"] == 1
    assert f"tensors from {run['best']} (scale n)" in capsys.readouterr().out


def test_the_verbs_stay_functions_after_every_subpackage_is_imported():
    # No subpackage is named like a verb: importing one sets it as an attribute of `detector`.
    import detector.exporting.onnx  # noqa: F401
    import detector.training.trainer  # noqa: F401

    assert detector.export is export and detector.train is train
    assert all(callable(getattr(detector, verb)) for verb in ("train", "val", "predict", "export", "load"))
