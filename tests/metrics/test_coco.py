"""evaluate_coco reports pycocotools' own numbers for the same predictions (any faster evaluator must pass this)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
from pycocotools.cocoeval import COCOeval

from detector.data.records import ImageRecord
from detector.metrics.coco import METRIC_NAMES, build_coco_ground_truth, evaluate_coco, load_coco


def noisy_detections(ground_truth: dict, *, per_image: int, seed: int) -> list[dict]:
    """Jittered copies of the ground truth (some with the wrong class) among random boxes: a lively result list."""
    rng = np.random.default_rng(seed)
    by_image: dict[int, list[dict]] = {}
    for annotation in ground_truth["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append(annotation)
    detections = []
    for image in ground_truth["images"]:
        width, height, truths = image["width"], image["height"], by_image.get(image["id"], [])
        for _ in range(per_image):
            if truths and rng.random() < 0.5:
                truth = truths[rng.integers(len(truths))]
                x, y, w, h = truth["bbox"]
                box = [x + rng.normal(0, w / 10), y + rng.normal(0, h / 10), w * rng.uniform(0.8, 1.2),
                       h * rng.uniform(0.8, 1.2)]
                category = truth["category_id"] if rng.random() < 0.8 else int(rng.integers(1, 4))
            else:
                w, h = rng.uniform(5, width / 3), rng.uniform(5, height / 3)
                box, category = [rng.uniform(0, width - w), rng.uniform(0, height - h), w, h], int(rng.integers(1, 4))
            detections.append({"image_id": image["id"], "category_id": category,
                               "bbox": [round(v, 3) for v in box], "score": round(float(rng.random()), 5)})
    return detections


def test_metrics_are_pycocotools_numbers() -> None:
    rng = np.random.default_rng(0)
    records = []
    for index in range(12):
        count = int(rng.integers(0, 8))
        labels = np.column_stack((rng.integers(0, 3, count), rng.uniform(0.2, 0.8, (count, 2)),
                                  rng.uniform(0.02, 0.3, (count, 2)))).astype(np.float32)
        records.append(ImageRecord(Path(f"{index}.jpg"), labels, index))
    ground_truth = build_coco_ground_truth(records, [(480, 640)] * len(records), ["a", "b", "c"], [1, 2, 3])
    detections = noisy_detections(ground_truth, per_image=300, seed=1)

    result = evaluate_coco(load_coco(ground_truth), detections, image_ids=[r.image_id for r in records])
    reference_gt = load_coco(ground_truth)
    with contextlib.redirect_stdout(io.StringIO()):
        reference = COCOeval(reference_gt, reference_gt.loadRes(detections), "bbox")
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
    assert result.metrics == {name: max(float(v), 0.0) for name, v in zip(METRIC_NAMES, reference.stats[:6])}
    assert result.metrics["mAP50"] > 0  # the jittered copies score: not a vacuous all-zero comparison
    precision = reference.eval["precision"][:, :, :, 0, -1]
    for k in range(3):
        valid = precision[:, :, k] > -1
        assert result.per_class_ap[k] == precision[:, :, k][valid].mean()
