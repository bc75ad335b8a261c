"""The test helpers themselves: detection matching excuses only threshold cases; optional packages skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detector.postprocess import NMSConfig
from tests.tolerances import Tolerance, assert_same_detections, max_iou_within

NMS = NMSConfig(conf_threshold=0.3, iou_threshold=0.5)
TOLERANCE = Tolerance(logit=0.04, score=0.01, box=0.1)
REPO = Path(__file__).resolve().parents[1]


def detections(boxes: list[list[float]], scores: list[float], labels: list[int] | None = None) -> list[dict]:
    labels = [0] * len(scores) if labels is None else labels
    return [{"boxes": torch.tensor(boxes).view(-1, 4), "scores": torch.tensor(scores), "labels": torch.tensor(labels)}]


def test_iou_bound_covers_every_moved_box() -> None:
    box, other = torch.tensor([[0.0, 0.0, 10.0, 10.0]]), torch.tensor([[5.0, 0.0, 15.0, 10.0]])  # IoU 1/3
    bound = float(max_iou_within(box, other, 0.5))
    moved = torch.tensor([[0.5, -0.5, 10.5, 10.5]])  # one of the boxes within 0.5 px
    assert 1 / 3 < float(max_iou_within(moved, other, 0.0)) <= bound < 0.5


def test_box_suppressed_on_the_nms_threshold_is_excused() -> None:
    # IoU(first, second) = 0.5 / 1.5 + a hair: above 0.5 on one side, possibly below it on the other.
    first, second = [0.0, 0.0, 10.0, 10.0], [3.32, 0.0, 13.32, 10.0]
    both, one = detections([first, second], [0.9, 0.8]), detections([first], [0.9])
    summary = assert_same_detections(both, one, nms=NMSConfig(0.3, iou_threshold=0.5023), tolerance=TOLERANCE)
    assert summary.excused == 1 and summary.matched == 2


def test_missing_box_far_from_the_nms_threshold_fails() -> None:
    both = detections([[0, 0, 10, 10], [6, 0, 16, 10]], [0.9, 0.8])  # IoU 0.25: NMS at 0.5 keeps both
    with pytest.raises(AssertionError, match="no partner"):
        assert_same_detections(both, detections([[0, 0, 10, 10]], [0.9]), nms=NMS, tolerance=TOLERANCE)


def test_score_on_the_conf_threshold_may_be_missing() -> None:
    near = detections([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, NMS.conf_threshold + 0.005])
    summary = assert_same_detections(near, detections([[0, 0, 10, 10]], [0.9]), nms=NMS, tolerance=TOLERANCE)
    assert summary.compared == summary.matched == 2  # the 0.9 box each way; the 0.305 one not at all


def test_moved_box_or_changed_label_fails() -> None:
    reference = detections([[0, 0, 10, 10]], [0.9])
    with pytest.raises(AssertionError, match="no partner"):
        assert_same_detections(reference, detections([[0, 0, 10, 10.5]], [0.9]), nms=NMS, tolerance=TOLERANCE)
    with pytest.raises(AssertionError, match="no partner"):
        assert_same_detections(reference, detections([[0, 0, 10, 10]], [0.9], [1]), nms=NMS, tolerance=TOLERANCE)


@pytest.mark.parametrize(("package", "folder"), [("onnx", "tests/exporting"), ("hypothesis", "tests/test_properties.py")])
def test_missing_optional_package_skips_instead_of_failing(package: str, folder: str, tmp_path: Path) -> None:
    (tmp_path / f"{package}.py").write_text(f"raise ModuleNotFoundError('no {package}', name='{package}')\n")
    # No GPU for the child: collecting needs none, and a GPU host's CUDA start-up warnings would read as errors below.
    environment = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    # hypothesis's pytest plugin would load the stand-in too; without the package there is no plugin either.
    command = [sys.executable, "-m", "pytest", folder, "--collect-only", "-q", "-p", "no:cacheprovider", "-rs",
               "-p", "no:hypothesispytest"]
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=180)
    assert done.returncode in (0, 5), done.stdout[-3000:]  # 5: everything skipped, nothing collected
    assert "error" not in done.stdout.lower() and "SKIPPED" in done.stdout
