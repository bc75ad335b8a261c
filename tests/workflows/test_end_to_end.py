"""``--end-to-end`` on val, predict and benchmark: a YOLO26 checkpoint runs its one-to-one head with the NMS-free
top-k on a tiny dataset; YOLOv8 is refused in one line naming the file; --augment with it is refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from detector.cli.predict import main as predict_main
from detector.cli.val import main as val_main
from detector.inference import load_backend
from detector.model import YOLO
from detector.postprocess import NMSConfig
from detector.workflows.options import BenchmarkOptions, PredictOptions, ValOptions
from detector.workflows.predict import run_predict
from detector.workflows.val import run_val
from tests.conftest import lively_model, write_checkpoint, write_yolo_dataset

REFUSAL = ("--end-to-end runs YOLO26's NMS-free (one-to-one) head, which only YOLO26 models have; this is a YOLOv8n "
           "model")


@pytest.fixture(scope="module")
def yolo26(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model: YOLO = lively_model(scale="26n")
    return write_checkpoint(model, tmp_path_factory.mktemp("yolo26") / "best.pt")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_yolo_dataset(tmp_path_factory.mktemp("shapes"), train=1, val=4)  # the checkpoint's 3 classes


def test_val_with_end_to_end_scores_the_one_to_one_head(yolo26: Path, data: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    common = {"weights": yolo26, "data": data, "workers": 0, "batch": 2, "device": "cpu", "plots": False,
              "project": tmp_path, "imgsz": 64}
    run_val(ValOptions(**common, name="usual"))
    assert "end-to-end" not in capsys.readouterr().out
    usual = json.loads((tmp_path / "usual" / "predictions.json").read_text())
    for half in (False, True):  # the autocast path, and --half's prepared copy
        metrics = run_val(ValOptions(**common, end_to_end=True, half=half, name=f"e2e-{half}"))
        said = capsys.readouterr().out
        assert 0 <= metrics["mAP50-95"] <= 1 and ("end-to-end" in said), said
        predictions = json.loads((tmp_path / f"e2e-{half}" / "predictions.json").read_text())
        # The top-k at conf 0.001 keeps min(300, anchors) = 84 pairs an image at 64 px (64 + 16 + 4 anchors; an
        # untrained head scores nearly every pair above 0.001); the usual head's NMS keeps another number.
        per_image = Counter(row["image_id"] for row in predictions)
        assert set(per_image.values()) == {84} and len(per_image) == 4, per_image
        assert Counter(row["image_id"] for row in usual) != per_image


def test_predict_with_end_to_end_gives_the_top_k_pairs(yolo26: Path, data: Path, tmp_path: Path) -> None:
    images = data.parent / "images" / "val"  # 4 synthetic 64 px images
    common = {"weights": yolo26, "source": str(images), "device": "cpu", "conf": 0.3, "max_det": 40,
              "project": tmp_path, "verbose": False}
    results = run_predict(PredictOptions(**common, end_to_end=True), write=False)
    usual = run_predict(PredictOptions(**common), write=False)
    assert len(results) == len(usual) == 4 and any(len(result["scores"]) for result in results)
    for result in results:
        scores = torch.from_numpy(result["scores"])
        assert len(scores) <= 40 and bool((scores > 0.3).all()) and torch.equal(scores, scores.sort(descending=True)[0])
    # Another branch's scores (lively_model drew its own weights), and no NMS.
    assert any(len(a["scores"]) != len(b["scores"]) or (a["scores"] != b["scores"]).any()
               for a, b in zip(results, usual))
    # A model loaded with its usual head cannot switch at predict time; one loaded end-to-end runs so.
    loaded = load_backend(yolo26)
    with pytest.raises(ValueError, match=r"^end_to_end= of a loaded model is chosen when it loads"):
        run_predict(PredictOptions(source=str(images), end_to_end=True, verbose=False), backend=loaded, write=False)
    loaded = load_backend(yolo26, nms=NMSConfig(end_to_end=True))
    again = run_predict(PredictOptions(source=str(images), conf=0.3, max_det=40, verbose=False), backend=loaded,
                        write=False)
    assert all((a["scores"] == b["scores"]).all() for a, b in zip(again, results))


def test_a_yolov8_checkpoint_is_refused_in_one_line_by_every_command(data: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    weights = write_checkpoint(lively_model(), tmp_path / "v8.pt")
    project = ["--project", str(tmp_path / "runs"), "--device", "cpu"]
    assert val_main(["--weights", str(weights), "--data", str(data), "--end-to-end", *project]) == 1
    assert predict_main(["--weights", str(weights), "--source", str(data.parent / "images"), "--end-to-end",
                         *project]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.endswith(f"{weights}: {REFUSAL}") for line in errors), errors
    from detector.workflows.benchmark import run_benchmark

    with pytest.raises(ValueError, match=rf"^{weights}: {REFUSAL}$".replace("(", r"\(").replace(")", r"\)")):
        run_benchmark(BenchmarkOptions(weights=weights, end_to_end=True, device="cpu", skip="onnx,pt2,engine"),
                      progress=lambda line: None)
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_augment_is_refused_with_end_to_end() -> None:
    refusal = r"^--augment merges its three views' boxes with NMS and --end-to-end runs without NMS: drop one$"
    with pytest.raises(ValueError, match=refusal):
        ValOptions(weights=Path("x.pt"), augment=True, end_to_end=True)
    with pytest.raises(ValueError, match=refusal):
        PredictOptions(source="x.jpg", augment=True, end_to_end=True)
