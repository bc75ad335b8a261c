"""COCO-format ground truth: built from our records, or read from the dataset's own JSON."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import torch
from pycocotools.coco import COCO

from detector.boxes import cxcywh_to_xyxy
from detector.data.records import ImageRecord


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
