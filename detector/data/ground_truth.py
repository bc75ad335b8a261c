"""COCO-format ground truth: built from our records, or read from the dataset's own JSON."""

from __future__ import annotations

import contextlib
import io
import math
import sys
from pathlib import Path

import numpy as np
import torch
from pycocotools.coco import COCO

from detector.boxes import cxcywh_to_xyxy
from detector.data.labels import read_coco_json, valid_bbox, whole_number
from detector.data.records import ImageRecord

COCO_SECTIONS = ("images", "annotations", "categories")


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


def usable_ground_truth(json_path: Path) -> dict:
    """A dataset's COCO JSON with only what the evaluators can score.

    The annotations the training labels drop (:func:`detector.data.labels.read_coco_labels`: no bbox, a
    non-finite or negative one, an unknown image or category) are left out here too, so a NaN box cannot
    reach the IoU maths; a missing ``area`` is the box's, a missing ``iscrowd`` 0, and a missing, repeated or
    non-positive ``id`` a new one above the file's largest (pycocotools indexes by it, and both evaluators' matching
    reads an id of 0 or below as "no match": such a box could never be found, and a detection on it counted false).
    The images and categories are kept as they are; images the records left out are excluded from scoring by id
    (:mod:`detector.metrics.coco`).
    """
    coco = read_coco_json(json_path)
    sections = {key: coco.get(key) if isinstance(coco.get(key), list) else [] for key in COCO_SECTIONS}
    images = [i for i in sections["images"] if isinstance(i, dict) and whole_number(i.get("id"))]
    categories = [c for c in sections["categories"] if isinstance(c, dict) and whole_number(c.get("id"))]
    image_ids, category_ids = {i["id"] for i in images}, {c["id"] for c in categories}
    annotations, seen = [], set()
    fresh = max((ann["id"] for ann in sections["annotations"] if isinstance(ann, dict) and whole_number(ann.get("id"))),
                default=0)
    for ann in sections["annotations"]:
        if not (isinstance(ann, dict) and whole_number(ann.get("image_id")) and ann["image_id"] in image_ids
                and whole_number(ann.get("category_id")) and ann["category_id"] in category_ids
                and valid_bbox(ann.get("bbox"))):
            continue
        ann = dict(ann)
        area = ann.get("area")
        if not (isinstance(area, (int, float)) and math.isfinite(area) and area >= 0):
            ann["area"] = ann["bbox"][2] * ann["bbox"][3]
        ann["iscrowd"] = 1 if ann.get("iscrowd") else 0
        if not whole_number(ann.get("id")) or ann["id"] <= 0 or ann["id"] in seen:
            fresh = max(fresh, 0) + 1  # above every id of the file: never one of its own
            ann["id"] = fresh
        seen.add(ann["id"])
        annotations.append(ann)
    return {**coco, "images": images, "categories": categories, "annotations": annotations}


def json_pixel_scale(ground_truth: COCO, image_ids: np.ndarray, image_hw: np.ndarray,
                     where: str) -> dict[int, float] | None:
    """Per image id, what turns the file's pixels into those of its JSON entry, where the two differ by one scale
    (images resized after they were annotated): the JSON's boxes are in its ``width`` x ``height``, the detections
    in the file's, and scored as they are a resized image's every box would miss. None where every size agrees.
    One warning line names how many differ; sizes that differ in shape too are named, not scaled (those turned by
    90 degrees, an EXIF rotation the JSON ignored, were skipped by the scan already: detector/data/scan.py)."""
    scales, odd = {}, []
    for image_id, (height, width) in zip(image_ids.tolist(), image_hw.tolist()):
        entry = ground_truth.imgs.get(image_id)
        if entry is None or height <= 0 or width <= 0 or (entry["width"], entry["height"]) == (width, height):
            continue
        scale_x, scale_y = entry["width"] / width, entry["height"] / height
        if abs(scale_x / scale_y - 1) <= 0.01:  # one scale, within the rounding of a resized side
            scales[image_id] = (scale_x + scale_y) / 2
        else:
            odd.append(f"{entry.get('file_name', image_id)} ({entry['width']}x{entry['height']} listed, "
                       f"{width}x{height} read)")
    if scales:
        example = ground_truth.imgs[next(iter(scales))]
        print(f"warning: {where}: {len(scales)} image(s) are another size than their JSON entry says (e.g. "
              f"{example.get('file_name')}: {example['width']}x{example['height']} listed); their detections are "
              "scaled to the JSON's pixels for scoring and predictions.json", file=sys.stderr)
    if odd:
        print(f"warning: {where}: {len(odd)} image(s) differ in shape from their JSON entry (no one scale maps one "
              f"onto the other): their detections are scored as read, against boxes drawn on another picture: "
              f"{', '.join(odd[:3])}", file=sys.stderr)
    return scales or None


def one_category(ground_truth: dict, category_id: int, name: str) -> dict:
    """``ground_truth`` with every annotation in one category, ``category_id`` named ``name``: what a single-class
    model (train --single-cls) is scored against, as Ultralytics' ``single_cls`` scores."""
    annotations = [{**ann, "category_id": category_id} for ann in ground_truth["annotations"]]
    return {**ground_truth, "annotations": annotations, "categories": [{"id": category_id, "name": name}]}


def load_coco(ground_truth: dict | Path) -> COCO:
    """A COCO index of ``ground_truth``: a dict as built above, or a dataset's JSON (cleaned on the way in)."""
    dataset = ground_truth if isinstance(ground_truth, dict) else usable_ground_truth(ground_truth)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = dataset
        coco.createIndex()
    return coco
