"""The parity check itself: detection matching and the pass/fail rules."""

from __future__ import annotations

import torch

from detector.model.metadata import ModelInfo
from detector.exporting.parity import check_parity, match_detections
from detector.inference.torch_backend import TorchBackend
from detector.model import YOLO

IMGSZ = 64  # conftest fixtures use 64 px images


def detections(boxes: list[list[float]], scores: list[float], labels: list[int]) -> dict[str, torch.Tensor]:
    return {"boxes": torch.tensor(boxes).view(-1, 4), "scores": torch.tensor(scores), "labels": torch.tensor(labels)}


def test_match_detections_pairs_same_class_overlaps() -> None:
    reference = [detections([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, 0.8], [0, 1])]
    exported = [detections([[0, 0, 10, 11], [20, 20, 30, 30], [50, 50, 60, 60]], [0.85, 0.8, 0.5], [0, 0, 1])]
    box_diff, score_diff, unmatched = match_detections(reference, exported)
    # box 2 overlaps box 2 but has another class; box 3 overlaps nothing: 2 exported + 1 reference unmatched
    assert (box_diff, round(score_diff, 4), unmatched) == (1.0, 0.05, 3)


class Shifted(TorchBackend):
    """A stand-in for a broken export: every score 0.1 higher."""

    def infer(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        boxes, scores = super().infer(images)
        return boxes, scores + 0.1


def test_check_parity_flags_score_drift(model: YOLO, images: torch.Tensor) -> None:
    info = ModelInfo(names=["a", "b", "c"], strides=model.strides, imgsz=IMGSZ, dynamic=True)
    reference = TorchBackend(model, info)
    same = check_parity(reference, TorchBackend(model, info), images=images)
    assert same.passed and same.max_score_diff == 0 and same.max_box_diff == 0
    shifted = check_parity(reference, Shifted(model, info), images=images)
    assert not shifted.passed and "--score-tol" in shifted.summary()
    assert abs(shifted.max_score_diff - 0.1) < 1e-6


class SaysHowItRan(TorchBackend):
    """A backend whose name is known only once it has run, as the pt2 backend's ("cuda graph" or "eager")."""

    ran = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return "late eager" if self.ran else "late untried"

    def infer(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.ran = True
        return super().infer(images)


def test_the_report_names_the_backend_as_it_ran(model: YOLO, images: torch.Tensor) -> None:
    info = ModelInfo(names=["a", "b", "c"], strides=model.strides, imgsz=IMGSZ, dynamic=True)
    report = check_parity(TorchBackend(model, info), SaysHowItRan(model, info), images=images)
    assert report.name == "late eager" and report.summary().count("late eager") >= 1
