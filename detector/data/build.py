"""Spec + split name -> a ready dataset, its COCO ground truth and its category ids."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pycocotools.coco import COCO

from detector.data.augment import AugmentConfig
from detector.data.dataset import DetectionDataset, estimate_cache_bytes
from detector.data.labels import ImageRecord, load_coco_records, load_yolo_records, warn_problems
from detector.data.spec import DatasetError, DatasetSpec
from detector.data.verify_cache import verify_images_cached
from detector.metrics.coco import build_coco_ground_truth, load_coco

CACHE_RAM_FRACTION = 0.3  # `--cache auto` caches when the images need under this share of free RAM


@dataclass
class SplitData:
    dataset: DetectionDataset
    records: list[ImageRecord]
    category_ids: list[int]  # class index -> COCO category id
    image_hw: list[tuple[int, int]]  # upright original sizes, per record
    ground_truth: COCO | None = None  # evaluation splits only (augment=None)


def load_records(spec: DatasetSpec, split: str) -> tuple[list[ImageRecord], list[int], list[tuple[int, int]], Path | None]:
    """Parse labels and verify images for one split; warn once per problem."""
    entry = getattr(spec, split)
    if entry is None:
        raise DatasetError(f"{spec.yaml_path}: no '{split}' split")
    if entry.coco_json is not None:
        records, category_ids = load_coco_records(entry.coco_json, entry.images[0], spec.names)
        problems: list[str] = []
    else:
        records, problems = load_yolo_records(entry.images, spec.num_classes)
        category_ids = list(range(1, spec.num_classes + 1))
    records, image_hw, bad_images = verify_images_cached(records)
    warn_problems(problems + bad_images)
    if not records:
        raise DatasetError(f"{spec.yaml_path}: '{split}' split has no readable images")
    return records, category_ids, image_hw, entry.coco_json


def should_cache(records: list[ImageRecord], image_size: int, mode: str) -> bool:
    if mode in ("ram", "true", "yes"):
        return True
    if mode != "auto":
        return False
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: stay off
        return False
    return estimate_cache_bytes(records, image_size) < CACHE_RAM_FRACTION * available


def build_split(
    spec: DatasetSpec, split: str, *, image_size: int, augment: AugmentConfig | None, cache: str = "auto"
) -> SplitData:
    records, category_ids, image_hw, coco_json = load_records(spec, split)
    dataset = DetectionDataset(
        records, image_size=image_size, augment=augment, cache_ram=should_cache(records, image_size, cache)
    )
    data = SplitData(dataset, records, category_ids, image_hw)
    if augment is None:
        data.ground_truth = (
            load_coco(coco_json)
            if coco_json is not None
            else load_coco(build_coco_ground_truth(records, image_hw, spec.names, category_ids))
        )
    return data
