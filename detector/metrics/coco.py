"""COCO mAP with pycocotools: ground truth from our records (or the dataset's own JSON), results JSON out.

Detections enter as per-image dicts in original-image pixels; category ids are 1-based class indices
for YOLO-label datasets and the JSON's own ids for COCO datasets.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detector.boxes import cxcywh_to_xyxy
from detector.data.records import ImageRecord
from detector.data.letterbox import ImageMeta, unletterbox_boxes

METRIC_NAMES = ("mAP50-95", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large")


@dataclass
class EvalResult:
    metrics: dict[str, float]  # METRIC_NAMES -> value in [0, 1]
    per_class_ap: np.ndarray  # [C] AP50-95 per class (nan where a class has no ground truth)
    per_class_ap50: np.ndarray  # [C]
    summary: str = ""  # pycocotools' printed table
    coco_eval: COCOeval | None = field(default=None, repr=False)


def build_coco_ground_truth(
    records: list[ImageRecord], image_hw: list[tuple[int, int]], names: list[str], category_ids: list[int]
) -> dict:
    """COCO-format ground truth from normalised YOLO labels; box area stands in for mask area."""
    images, annotations = [], []
    for record, (height, width) in zip(records, image_hw):
        images.append({"id": record.image_id, "width": width, "height": height, "file_name": record.path.name})
        labels = torch.as_tensor(record.labels, dtype=torch.float64).reshape(-1, 5)  # float64: Python's arithmetic
        corners = cxcywh_to_xyxy(labels[:, 1:5])[:, :2] * torch.tensor([width, height], dtype=torch.float64)
        for cls, (left, top), (w, h) in zip(labels[:, 0].tolist(), corners.tolist(), labels[:, 3:5].tolist()):
            box = [left, top, w * width, h * height]  # COCO's xywh, top-left corner
            annotations.append({
                "id": len(annotations) + 1, "image_id": record.image_id, "category_id": category_ids[int(cls)],
                "bbox": box, "area": box[2] * box[3], "iscrowd": 0,
            })
    categories = [{"id": cid, "name": name} for cid, name in zip(category_ids, names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def load_coco(ground_truth: dict | Path) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        if isinstance(ground_truth, dict):
            coco = COCO()
            coco.dataset = ground_truth
            coco.createIndex()
        else:
            coco = COCO(str(ground_truth))
    return coco


def to_coco_detections(
    detections: list[dict[str, torch.Tensor]], metas: list[ImageMeta], category_ids: list[int]
) -> list[dict]:
    """Undo the letterbox and clip to the original image; -> COCO results entries (xywh pixels)."""
    results = []
    for detection, meta in zip(detections, metas):
        if not len(detection["scores"]):
            continue
        boxes = unletterbox_boxes(detection["boxes"], meta)
        boxes[:, 2:] -= boxes[:, :2]  # xyxy -> COCO's xywh
        for box, score, label in zip(boxes.tolist(), detection["scores"].tolist(), detection["labels"].tolist()):
            results.append({
                "image_id": meta.image_id, "category_id": category_ids[int(label)],
                "bbox": [round(v, 3) for v in box], "score": round(score, 5),
            })
    return results


def evaluate_coco(
    ground_truth: COCO,
    detections: list[dict],
    *,
    image_ids: list[int] | None = None,
    results_json: Path | None = None,
) -> EvalResult:
    """Run COCOeval (bbox) over ``image_ids`` (default: every ground-truth image); optionally write the results JSON."""
    num_classes = len(ground_truth.getCatIds())
    if results_json is not None:
        results_json.parent.mkdir(parents=True, exist_ok=True)
        results_json.write_text(json.dumps(detections))
    if not detections:  # pycocotools cannot load an empty result list
        nan = np.full(num_classes, np.nan)
        return EvalResult({name: 0.0 for name in METRIC_NAMES}, nan, nan.copy(), "no detections")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        coco_eval = COCOeval(ground_truth, ground_truth.loadRes(detections), "bbox")
        if image_ids is not None:  # images skipped as unreadable must not count as misses
            coco_eval.params.imgIds = sorted(image_ids)
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    metrics = {name: float(max(value, 0.0)) for name, value in zip(METRIC_NAMES, coco_eval.stats[:6])}
    precision = coco_eval.eval["precision"][:, :, :, 0, -1]  # [IoU thresholds, recall, classes], all areas, 100 dets
    per_class = np.full(num_classes, np.nan)
    per_class50 = np.full(num_classes, np.nan)
    for k in range(precision.shape[2]):
        valid = precision[:, :, k] > -1
        if valid.any():
            per_class[k] = precision[:, :, k][valid].mean()
            valid50 = precision[0, :, k] > -1
            per_class50[k] = precision[0, :, k][valid50].mean() if valid50.any() else np.nan
    summary = "\n".join(line for line in printed.getvalue().splitlines() if line.startswith(" Average"))
    return EvalResult(metrics, per_class, per_class50, summary, coco_eval)
