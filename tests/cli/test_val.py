"""``python -m detector val`` end to end: files, one-line errors (the image-size rule: tests/workflows/test_val.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.checkpoint import save_checkpoint
from detector.cli import main as detector_main
from detector.cli.val import main
from detector.model import build_model

NAMES = ["cat", "dog"]
PNG_FILES = ("PR_curve.png", "confusion_matrix.png", "confusion_matrix_normalized.png", "val_batch0_pred.png")


def write_dataset(root: Path) -> Path:
    """Five 64x64 images with one or two rectangles each, YOLO labels, and a data YAML."""
    rng = np.random.default_rng(0)
    for index in range(5):
        image = rng.integers(0, 50, (64, 64, 3), dtype=np.uint8)
        rows = [(index % 2, 0.25 + 0.1 * index, 0.5, 0.3, 0.4)] + ([(1, 0.7, 0.3, 0.2, 0.2)] if index < 2 else [])
        for cls, cx, cy, w, h in rows:
            top, bottom, left, right = (round(v * 64) for v in (cy - h / 2, cy + h / 2, cx - w / 2, cx + w / 2))
            image[top:bottom, left:right] = 200 - 100 * cls
        for kind in ("images", "labels"):
            (root / kind / "val").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / "images" / "val" / f"{index}.jpg"), image)
        (root / "labels" / "val" / f"{index}.txt").write_text("".join(" ".join(map(str, row)) + "\n" for row in rows))
    yaml_path = root / "data.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return yaml_path


@pytest.fixture
def val_inputs(tmp_path: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = build_model(num_classes=2, scale="n")
    weights = tmp_path / "best.pt"
    model_args = {"num_classes": 2, "scale": "n", "reg_max": 16}
    save_checkpoint({"model": model.state_dict(), "ema": None, "model_args": model_args, "names": NAMES,
                     "config": {"imgsz": 64}, "epoch": 0}, weights)
    return weights, write_dataset(tmp_path / "data")


def test_val_command_end_to_end(val_inputs, tmp_path: Path, capsys) -> None:
    weights, data = val_inputs
    common = ["--weights", str(weights), "--data", str(data), "--workers", "0", "--batch", "4", "--device", "cpu",
              "--project", str(tmp_path / "runs")]
    # --conf 0 keeps every candidate, so even a random model's (tiny) scores give detections to score and plot.
    assert main([*common, "--conf", "0", "--name", "exp", "--fp32"]) == 0
    out = capsys.readouterr().out
    assert "imgsz 64" in out and "FP32" in out  # size taken from the checkpoint's config
    assert "COCO eval faster-coco-eval " in out  # the default evaluator, named with its version
    assert "Average Precision" in out and out.count("\nall ") == 1
    run = tmp_path / "runs" / "exp"
    predictions = json.loads((run / "predictions.json").read_text())
    assert predictions and {"image_id", "category_id", "bbox", "score"} <= set(predictions[0])
    assert "AP50-95" in (run / "results.txt").read_text()
    assert re.search(r"Speed: [\d.]+ ms per image: [\d.]+ ms waiting for images \(decoding, letterboxing\), "
                     r"[\d.]+ ms inference and NMS, [\d.]+ ms scoring \(faster-coco-eval\)$", out.strip(), re.M)
    for name in PNG_FILES:
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert cv2.imread(str(run / name)) is not None
    # A second run goes to exp2; --no-plots writes no figures; the dispatcher reaches the same main;
    # --coco-eval pycocotools scores the same predictions to the same printed numbers.
    assert detector_main(["val", *common, "--conf", "0", "--name", "exp", "--fp32", "--no-plots",
                          "--coco-eval", "pycocotools"]) == 0
    assert "COCO eval pycocotools " in capsys.readouterr().out
    second = tmp_path / "runs" / "exp2"
    assert (second / "predictions.json").is_file() and not any((second / n).exists() for n in PNG_FILES)
    summaries = [[line for line in (folder / "results.txt").read_text().splitlines() if line.startswith(" Average")]
                 for folder in (run, second)]
    assert len(summaries[0]) == 12 and summaries[0] == summaries[1]


def test_val_augmented_scores_more_candidates_on_both_pytorch_paths(val_inputs, tmp_path: Path, capsys) -> None:
    """``--augment`` on the autocast path and on ``--half``'s prepared copy: the three views' boxes meet in one NMS,
    so at --conf 0 more candidates survive than from the plain pass (per image, capped at 300)."""
    weights, data = val_inputs
    common = ["--weights", str(weights), "--data", str(data), "--workers", "0", "--batch", "4", "--device", "cpu",
              "--project", str(tmp_path / "runs"), "--conf", "0", "--no-plots"]
    counts = {}
    runs = (("plain", ["--fp32"]), ("augmented", ["--fp32", "--augment"]), ("half", ["--half", "--augment"]))
    for name, flags in runs:
        assert main([*common, "--name", name, *flags]) == 0
        said = capsys.readouterr().out
        assert ("), augmented, COCO eval" in said.splitlines()[0]) == (name != "plain"), said.splitlines()[0]
        counts[name] = len(json.loads((tmp_path / "runs" / name / "predictions.json").read_text()))
    assert counts["augmented"] > counts["plain"] and counts["half"] > counts["plain"], counts


def test_val_errors_are_one_line_and_return_1(val_inputs, tmp_path: Path, capsys) -> None:
    weights, data = val_inputs
    project = ["--project", str(tmp_path / "runs"), "--device", "cpu"]
    assert main(["--weights", str(tmp_path / "missing.pt"), "--data", str(data), *project]) == 1
    assert main(["--weights", str(weights), "--data", str(tmp_path / "missing.yaml"), *project]) == 1
    assert main(["--weights", str(weights), "--data", str(data), "--split", "test", *project]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("error: ") for line in errors)
    assert "missing.pt" in errors[0] and "missing.yaml" in errors[1] and "test" in errors[2]
    assert not (tmp_path / "runs").exists()
    # The training split, as Ultralytics' split=train scores it (a check for overfitting).
    assert main(["--weights", str(weights), "--data", str(data), "--split", "train", "--no-plots", *project]) == 0
    assert "'train' (" in capsys.readouterr().out


def test_val_finds_a_shipped_dataset_under_datasets_dir(val_inputs, tmp_path: Path, capsys) -> None:
    weights, _ = val_inputs
    empty = tmp_path / "datasets"
    empty.mkdir()
    code = main(["--weights", str(weights), "--data", "coco.yaml", "--datasets-dir", str(empty), "--device", "cpu",
                 "--project", str(tmp_path / "runs")])
    errors = capsys.readouterr().err.strip().splitlines()
    # Looked for under the folder given, and says how to fill it: the flag reached the dataset resolver.
    assert code == 1 and len(errors) == 1 and str(empty / "coco") in errors[0]
    assert f"python -m detector download coco --datasets-dir {empty}" in errors[0]



def write_ultralytics_weights(path: Path, num_classes: int) -> Path:
    from tests.weights.lookalike import yolov8_lookalike_bytes

    path.write_bytes(yolov8_lookalike_bytes("n", num_classes=num_classes, seed=3))
    return path


def test_val_takes_ultralytics_weights_and_its_key_value_arguments(tmp_path: Path, capsys) -> None:
    data = write_dataset(tmp_path / "data")
    yolov8 = write_ultralytics_weights(tmp_path / "yolov8n.pt", num_classes=2)
    # The same weights converted into one of our checkpoints: the reference the direct read must equal exactly.
    from detector.weights import load_pretrained

    ours = build_model(num_classes=2, scale="n")
    load_pretrained(ours, yolov8)
    converted = tmp_path / "converted.pt"
    save_checkpoint({"model": ours.state_dict(), "ema": None, "model_args": {"num_classes": 2, "scale": "n",
                     "reg_max": 16}, "names": NAMES, "epoch": 0}, converted)
    common = [f"data={data}", "workers=0", "batch=4", "device=cpu", "conf=0", "imgsz=64", "plots=False",
              f"project={tmp_path / 'runs'}"]
    assert main([f"model={yolov8}", "fp32=True", *common, "name=yolov8"]) == 0
    captured = capsys.readouterr()
    assert "Ultralytics YOLOv8n weights (2 classes)" in captured.out and "FP32" in captured.out
    assert "note: Ultralytics' model=" in captured.err and "is weights=" in captured.err
    assert main([f"model={converted}", "fp32=True", *common, "name=ours"]) == 0
    results = [json.loads((tmp_path / "runs" / name / "predictions.json").read_text()) for name in ("yolov8", "ours")]
    assert results[0] and results[0] == results[1]  # the same model after conversion, the same code: identical


def test_key_value_arguments_with_no_equivalent_answer_in_one_line(val_inputs, tmp_path: Path, capsys) -> None:
    weights, data = val_inputs
    with pytest.raises(SystemExit) as exit_info:
        main([f"model={weights}", f"data={data}", "save_hybrid=True"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert "val: error: Ultralytics' save_hybrid=True has no equivalent here: no hybrid labels" in said
    with pytest.raises(SystemExit):
        main([f"weights={weights}", f"data={data}", "confidence=0.3"])
    assert "unknown argument confidence=0.3; did you mean conf?" in capsys.readouterr().err


def coco_as_detections(records: list[dict], image_ids: list[int]) -> list[dict[str, torch.Tensor]]:
    out = []
    for image_id in image_ids:
        rows = [r for r in records if r["image_id"] == image_id]
        boxes = torch.tensor([r["bbox"] for r in rows], dtype=torch.float32).view(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # COCO xywh -> xyxy
        out.append({"boxes": boxes, "scores": torch.tensor([r["score"] for r in rows]),
                    "labels": torch.tensor([r["category_id"] for r in rows], dtype=torch.long)})
    return out


def test_val_runs_an_onnx_export_through_its_backend(model, checkpoint: Path, onnx_fp32: Path, tmp_path: Path,
                                                      capsys) -> None:
    from detector.inference import prepare_batch
    from detector.postprocess import NMSConfig
    from tests.conftest import write_yolo_dataset
    from tests.tolerances import assert_same_detections, fp32_tolerance_on

    data = write_yolo_dataset(tmp_path / "data", val=3)
    common = ["--data", str(data), "--workers", "0", "--batch", "3", "--device", "cpu", "--fp32", "--no-plots",
              "--project", str(tmp_path / "runs")]
    assert main(["--weights", str(checkpoint), *common, "--name", "pt"]) == 0
    assert main(["--weights", str(onnx_fp32), *common, "--name", "onnx"]) == 0
    assert "onnxruntime" in capsys.readouterr().out  # the backend's name, in the header line
    records = [json.loads((tmp_path / "runs" / name / "predictions.json").read_text()) for name in ("pt", "onnx")]
    ids = sorted({r["image_id"] for r in records[0]} | {r["image_id"] for r in records[1]})
    images = sorted((tmp_path / "data" / "images" / "val").iterdir())
    letterboxed = prepare_batch([cv2.imread(str(p))[..., ::-1] for p in images], 64)[0]
    # The same FP32 network in another runtime: detections agree within FP32 accumulation error
    # (tests/tolerances.py); the 64 px images are evaluated at 64 px, so no rescaling enlarges it.
    assert_same_detections(coco_as_detections(records[0], ids), coco_as_detections(records[1], ids),
                           nms=NMSConfig(0.25, 0.7), tolerance=fp32_tolerance_on(model, letterboxed))
