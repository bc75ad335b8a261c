"""The parity check itself: detection matching and the pass/fail rules."""

from __future__ import annotations

import copy

import torch

from detector.model.metadata import ModelInfo
from detector.exporting.parity import ParityReport, check_parity, match_detections
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


def test_sure_detections_need_a_partner_of_their_class() -> None:
    from detector.exporting.parity import unpartnered

    reference = [detections([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]], [0.9, 0.8, 0.31], [0, 1, 0])]
    exported = [detections([[0, 0, 10, 11], [20, 20, 30, 30]], [0.88, 0.8], [0, 0])]
    # box 1: a partner at IoU 0.91; box 2: one of another class only; box 3 (0.31): nothing, but under the floor
    assert unpartnered(reference, exported, floor=0.35) == (2, 1)
    assert unpartnered(exported, reference, floor=0.35) == (2, 1)  # exported box 2 has no class-0 partner there
    assert unpartnered(reference, [detections([], [], [])], floor=0.3) == (3, 3)


class Halved(TorchBackend):
    """A broken decode: every box half its size, scores untouched (the score gate alone passed it)."""

    def infer(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        boxes, scores = super().infer(images)
        return boxes / 2, scores


def test_boxes_that_moved_fail_even_without_a_dataset(model: YOLO, images: torch.Tensor) -> None:
    sure = copy.deepcopy(model)
    with torch.no_grad():
        for branch in sure.head.cv3:  # every anchor confident: detections to compare on any image
            branch[-1].bias.fill_(4.0)
    info = ModelInfo(names=["a", "b", "c"], strides=sure.strides, imgsz=IMGSZ, dynamic=True)
    reference = TorchBackend(sure, info)
    same = check_parity(reference, TorchBackend(sure, info), images=images)
    assert same.passed and same.sure > 0 and same.lost == 0 and "no box was compared" not in same.summary()
    halved = check_parity(reference, Halved(sure, info), images=images)
    assert not halved.passed and halved.max_score_diff == 0
    assert "have no partner of their class with IoU > 0.5" in halved.summary()


def test_a_check_with_nothing_sure_to_compare_says_so(model: YOLO, images: torch.Tensor) -> None:
    quiet = copy.deepcopy(model)
    with torch.no_grad():
        for branch in quiet.head.cv3:
            branch[-1].bias.fill_(-20.0)  # no score near any threshold
    info = ModelInfo(names=["a", "b", "c"], strides=quiet.strides, imgsz=IMGSZ, dynamic=True)
    report = check_parity(TorchBackend(quiet, info), Halved(quiet, info), images=images)
    assert report.passed and report.sure == 0 and "so no box was compared" in report.summary()


def test_the_no_detection_note_suggests_data_only_when_it_was_not_given() -> None:
    """The note that no box was compared pointed to --data even when the mAP comparison on --data followed it."""
    without = ParityReport(name="onnx", images=4).summary()
    assert "no box was compared (--data compares mAP" in without
    with_data = ParityReport(name="onnx", images=4, map_reference=50.0, map_exported=50.0, map_images=16).summary()
    assert "no box was compared\n" in with_data and "--data" not in with_data
