"""``python -m detector predict`` and ``benchmark`` on tiny inputs."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.cli.benchmark import main as benchmark_main
from detector.workflows.benchmark import device_name
from detector.cli.predict import main as predict_main
from detector.data.synthetic import make_image
from detector.inference import prepare_batch
from detector.model import YOLO
from detector.postprocess import NMSConfig
from tests.tolerances import Tolerance, assert_same_detections, fp32_tolerance_on


def write_images(folder: Path) -> list[str]:
    rng = np.random.default_rng(0)
    folder.mkdir()
    names = []
    for index, (height, width) in enumerate([(80, 100), (100, 60), (64, 64)]):
        image = make_image(rng, max(height, width))[0][:height, :width]
        names.append(f"{index}.jpg")
        cv2.imwrite(str(folder / names[-1]), image[..., ::-1])
    (folder / "notes.txt").write_text("not an image")
    return names


def as_detections(records: list[dict]) -> list[dict[str, torch.Tensor]]:
    return [{"boxes": torch.tensor(r["boxes"], dtype=torch.float32).view(-1, 4),
             "scores": torch.tensor(r["scores"], dtype=torch.float32), "labels": torch.tensor(r["labels"])}
            for r in records]


def test_predict_folder_writes_images_and_json(model: YOLO, checkpoint: Path, onnx_fp32: Path, tmp_path: Path) -> None:
    names = write_images(tmp_path / "images")
    common = ["--source", str(tmp_path / "images"), "--project", str(tmp_path / "runs"), "--conf", "0.3",
              "--device", "cpu"]
    assert predict_main(["--weights", str(checkpoint), "--save", *common]) == 0
    out = tmp_path / "runs" / "exp"
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "predictions.json"])
    records = json.loads((out / "predictions.json").read_text())
    assert [r["file"] for r in records] == names
    assert sum(len(r["boxes"]) for r in records) > 0
    for record, (height, width) in zip(records, [(80, 100), (100, 60), (64, 64)]):
        assert set(record) == {"file", "frame", "boxes", "scores", "labels", "names"}
        boxes = np.array(record["boxes"]).reshape(-1, 4)
        assert (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all() and (boxes >= 0).all()
        assert len(record["scores"]) == len(record["labels"]) == len(record["names"]) == len(boxes)
    # Same source through ONNX Runtime: a new run folder, the same detections.
    assert predict_main(["--weights", str(onnx_fp32), *common]) == 0
    again = json.loads((tmp_path / "runs" / "exp2" / "predictions.json").read_text())
    # FP32 in another summation order (tests/tolerances.py), paired by IoU; boxes are in original-image
    # pixels, so the 64 px tolerance grows by the largest undo-letterbox scale, 100 / 64.
    letterboxed = prepare_batch([cv2.imread(str(tmp_path / "images" / name))[..., ::-1] for name in names], 64)[0]
    tolerance = fp32_tolerance_on(model, letterboxed)
    tolerance = Tolerance(tolerance.logit, tolerance.score, tolerance.box * 100 / 64)
    assert_same_detections(as_detections(records), as_detections(again), nms=NMSConfig(0.3, 0.7), tolerance=tolerance)


def test_predict_augmented_runs_the_pt_weights_and_refuses_a_fixed_size_export(
    checkpoint: Path, onnx_fp32: Path, tmp_path: Path, capsys
) -> None:
    """``--augment`` (Ultralytics' augment=True): three views of each image, one NMS, boxes still inside each image
    (predict's own padding is not square on the CPU: the views of a 100 x 60 image are not square either)."""
    names = write_images(tmp_path / "images")
    common = ["--source", str(tmp_path / "images"), "--project", str(tmp_path / "runs"), "--conf", "0.3",
              "--device", "cpu"]
    assert predict_main(["--weights", str(checkpoint), "--augment", *common]) == 0
    assert "pytorch fp32, augmented on 3 images/frames" in capsys.readouterr().out
    records = json.loads((tmp_path / "runs" / "exp" / "predictions.json").read_text())
    assert [r["file"] for r in records] == names and sum(len(r["boxes"]) for r in records) > 0
    for record, (height, width) in zip(records, [(80, 100), (100, 60), (64, 64)]):
        boxes = np.array(record["boxes"]).reshape(-1, 4)
        assert (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all() and (boxes >= 0).all()
    assert predict_main(["--weights", str(onnx_fp32), "augment=True", *common]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == ("error: --augment runs smaller views of each image: this export takes 64 px alone (export with "
                     "--dynamic, or use the .pt weights)")


def test_predict_video_writes_annotated_video(checkpoint: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, (96, 64))
    for _ in range(3):
        writer.write(make_image(rng, 96)[0][:64])
    writer.release()
    runs = tmp_path / "runs"
    args = ["--weights", str(checkpoint), "--source", str(video), "--save", "--project", str(runs), "--name", "v",
            "--device", "cpu"]
    assert predict_main(args) == 0
    records = json.loads((runs / "v" / "predictions.json").read_text())
    assert [r["frame"] for r in records] == [0, 1, 2]
    capture = cv2.VideoCapture(str(runs / "v" / "clip.mp4"))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 3
    capture.release()


def test_predict_missing_source_is_an_error(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--weights", str(checkpoint), "--source", str(tmp_path / "nope.jpg"), "--project", str(tmp_path),
            "--device", "cpu"]
    assert predict_main(args) == 1
    assert "nope.jpg" in capsys.readouterr().err


def test_benchmark_prints_a_markdown_row_per_backend(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnx", reason="the onnxruntime rows need an ONNX export (the 'export' extra)")
    pytest.importorskip("onnxruntime", reason="the onnxruntime rows need onnxruntime (the 'export' extra)")
    # pt2 is left out: its compile takes minutes here (tests/exporting/test_export_pt2.py covers it).
    args = ["--weights", str(checkpoint), "--imgsz", "64", "--runs", "1", "--warmup", "0", "--device", "cpu",
            "--throughput-batch", "3", "--throughput-runs", "1", "--skip", "pt2"]
    assert benchmark_main(args) == 0
    table = capsys.readouterr().out
    assert ("| backend | pre-process ms | inference ms | post-process ms | total ms | batch-3 images/s | "
            "batch-3 pre / inference / post ms |") in table
    assert f"on cpu ({device_name('cpu')}," in table
    for name in ("| pytorch fp32 |", "| onnxruntime fp32 |", "| onnxruntime fp16 |"):
        assert name in table
    assert "tensorrt" in table  # timed where present, otherwise a skip note saying why


def test_a_source_that_cannot_be_read_fails_before_any_run_folder(checkpoint: Path, tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    assert predict_main(["--weights", str(checkpoint), "--source", str(tmp_path / "missing"), "--project", str(runs),
                         "--device", "cpu"]) == 1
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing'}: no such image, folder, video or glob"
    assert not runs.exists()


def test_key_value_arguments_save_txt_and_classes(checkpoint: Path, tmp_path: Path, capsys) -> None:
    names = write_images(tmp_path / "images")
    (tmp_path / "images" / "nested").mkdir()
    (tmp_path / "images" / "nested" / "deep.jpg").write_bytes((tmp_path / "images" / names[0]).read_bytes())
    assert predict_main([f"model={checkpoint}", f"source={tmp_path / 'images'}", "save_txt=True", "classes=[0,2]",
                         "conf=0.3", "device=cpu", f"project={tmp_path / 'runs'}"]) == 0
    assert "note: Ultralytics' model=" in capsys.readouterr().err
    out = tmp_path / "runs" / "exp"
    records = json.loads((out / "predictions.json").read_text())
    assert [r["file"] for r in records] == [*names, "nested/deep.jpg"]  # recursive, paths relative to the folder
    assert records[0]["boxes"] == records[-1]["boxes"]  # the same file
    assert all(set(r["labels"]) <= {0, 2} for r in records) and sum(len(r["labels"]) for r in records) > 0
    labels = sorted(p.relative_to(out / "labels").as_posix() for p in (out / "labels").rglob("*.txt"))
    assert labels == sorted([*(Path(n).stem + ".txt" for n in names), "nested/deep.txt"])
    for record in records:
        lines = (out / "labels" / Path(record["file"]).with_suffix(".txt")).read_text().splitlines()
        assert [int(line.split()[0]) for line in lines] == record["labels"] and all(len(l.split()) == 5 for l in lines)
