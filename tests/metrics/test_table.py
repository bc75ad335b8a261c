"""The per-class table against pycocotools, on hand-made detections with known answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from detector.data.records import ImageRecord
from detector.data.letterbox import ImageMeta
from detector.metrics.coco import evaluate_coco, to_coco_detections
from detector.data.ground_truth import build_coco_ground_truth, load_coco
from detector.metrics.table import per_class_rows, per_class_table

NAMES = ["cat", "dog"]


def hand_made_result():
    """Three 100x100 images: both cat boxes found (one false positive outranks them), no dog ever found."""
    labels = [
        [[0, 0.3, 0.3, 0.2, 0.2], [1, 0.7, 0.7, 0.2, 0.2]],
        [[0, 0.5, 0.5, 0.4, 0.4]],
        [[1, 0.5, 0.5, 0.3, 0.3]],
    ]
    records = [ImageRecord(Path(f"{i}.jpg"), np.array(rows, np.float32), i) for i, rows in enumerate(labels)]
    image_hw = [(100, 100)] * 3
    ground_truth = load_coco(build_coco_ground_truth(records, image_hw, NAMES, [1, 2]))
    # Image 0: the cat box exactly, plus a false positive scoring above it; image 1: the cat box exactly.
    boxes = [torch.tensor([[20.0, 20, 40, 40], [70, 10, 90, 30]]), torch.tensor([[30.0, 30, 70, 70]]),
             torch.zeros(0, 4)]
    scores = [torch.tensor([0.9, 0.95]), torch.tensor([0.8]), torch.zeros(0)]
    detections = [
        {"boxes": box, "scores": score, "labels": torch.zeros(len(score), dtype=torch.long)}
        for box, score in zip(boxes, scores)
    ]
    metas = [ImageMeta(i, (100, 100), 1.0, (0.0, 0.0)) for i in range(3)]
    result = evaluate_coco(ground_truth, to_coco_detections(detections, metas, [1, 2]))
    return records, result


def test_table_ap_columns_are_the_pycocotools_numbers() -> None:
    records, result = hand_made_result()
    assert result.per_class_ap50[1] == 0 and 0 < result.per_class_ap50[0] < 1  # the FP ranks above both TPs
    precision, recall = np.array([2 / 3, 0.0]), np.array([1.0, 0.0])
    rows = per_class_rows(NAMES, records, result, precision, recall)
    assert [(r.name, r.images, r.instances) for r in rows] == [("all", 3, 4), ("cat", 2, 2), ("dog", 2, 2)]
    assert rows[0].ap50 == result.metrics["mAP50"] and rows[0].ap50_95 == result.metrics["mAP50-95"]
    for row, ap50, ap in zip(rows[1:], result.per_class_ap50, result.per_class_ap):
        assert row.ap50 == ap50 and row.ap50_95 == ap
    table = per_class_table(NAMES, records, result, precision, recall).splitlines()
    assert table[0].split() == ["Class", "Images", "Instances", "P", "R", "AP50", "AP50-95"]
    assert table[1].split() == ["all", "3", "4", "0.333", "0.500",
                                f"{result.metrics['mAP50']:.3f}", f"{result.metrics['mAP50-95']:.3f}"]
    assert table[2].split()[-2:] == [f"{result.per_class_ap50[0]:.3f}", f"{result.per_class_ap[0]:.3f}"]
    assert table[3].split()[-2:] == ["0.000", "0.000"]
    assert len({len(line) for line in table}) == 1  # fixed width


def test_table_marks_classes_without_ground_truth() -> None:
    records, result = hand_made_result()
    result.per_class_ap50[1] = result.per_class_ap[1] = np.nan
    table = per_class_table(NAMES, records, result, np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    assert table.splitlines()[3].split()[3:] == ["-", "-", "-", "-"]
