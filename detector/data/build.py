"""Spec + split name -> a ready dataset, its COCO ground truth and its category ids."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pycocotools.coco import COCO

from detector.data.augment import AugmentConfig
from detector.data.dataset import DetectionDataset
from detector.data.disk_cache import open_disk_cache
from detector.data.ground_truth import (
    build_coco_ground_truth,
    json_pixel_scale,
    load_coco,
    one_category,
    usable_ground_truth,
)
from detector.data.labels import label_path_for
from detector.data.ram_cache import build_image_cache
from detector.data.records import Records
from detector.data.scan import cache_locations, scan_split, scan_threads
from detector.data.spec import DatasetError, DatasetSpec


@dataclass
class SplitData:
    dataset: DetectionDataset
    records: Records
    category_ids: list[int]  # class index -> COCO category id
    ground_truth: COCO | None = None  # evaluation splits only (augment=None)
    # image id -> the JSON's pixels per file pixel, where a COCO JSON lists an image at another size than its file
    json_scale: dict[int, float] | None = None

    @property
    def image_hw(self) -> list[tuple[int, int]]:
        """Upright original ``(height, width)`` per record."""
        return self.records.hw_list()


def load_records(spec: DatasetSpec, split: str, *, training: bool = False) -> tuple[Records, list[int], Path | None]:
    """Labels parsed and images checked for one split (cached, see :mod:`detector.data.scan`); one warning
    line per kind of problem. Returns the usable records, the category ids and the split's COCO JSON. ``training``:
    the split is trained on (a split without boxes is an error, not a warning: :func:`no_boxes`)."""
    entry = getattr(spec, split)
    if entry is None:
        raise DatasetError(spec.test_problem if split == "test" and spec.test_problem
                           else f"{spec.yaml_path}: no '{split}' split")
    scan = scan_split(entry, spec.label_names or spec.names)
    scan.problems.warn(prefix=f"{spec.yaml_path.name} '{split}': ", listed_in=scan.problems_file)
    records, category_ids = scan.records, scan.category_ids
    if spec.include_classes is not None:  # train --classes: the other classes' boxes left out
        records = records.with_rows(np.isin(records.labels[:, 0], spec.include_classes))
    if spec.label_names is not None:  # one class (train --single-cls): every box is class 0, its first category's
        labels = records.labels.copy()
        labels[:, 0] = 0
        records, category_ids = Records.from_arrays({**records.arrays(), "labels": labels}), category_ids[:1]
    if not len(records):
        raise DatasetError(f"{spec.yaml_path}: '{split}' split has no readable images")
    if entry.fraction < 1.0:  # Ultralytics' fraction: the split's first share of images, in its order, at least one
        kept = max(1, round(len(records) * entry.fraction))
        print(f"{spec.yaml_path.name} '{split}': the first {kept} of {len(records)} images (--fraction "
              f"{entry.fraction:g})")
        records = records.select(range(kept))
    if not records.box_counts().any():
        no_boxes(spec, split, records, entry.coco_json, training=training)
    return records, category_ids, entry.coco_json


def no_boxes(spec: DatasetSpec, split: str, records: Records, coco_json: Path | None, *, training: bool) -> None:
    """A split without one box: an error for training, which would learn that nothing is ever there (a misnamed
    labels folder is the usual cause), a warning for evaluation, whose mAP is then undefined (COCO's -1, reported as
    0): as Ultralytics stops or warns with "No labels found"."""
    source = (f"its COCO JSON {coco_json}" if coco_json is not None else
              f"its {len(records)} images' label files (read from {label_path_for(records.path(0)).parent}/, the "
              "image folder's path with its last 'images' folder named 'labels')")
    message = f"{spec.yaml_path}: '{split}' split has no boxes: none in {source}"
    if training:
        raise DatasetError(message)
    print(f"warning: {message}; its mAP cannot be measured (reported as 0)", file=sys.stderr)


def json_ground_truth(coco_json: Path, spec: DatasetSpec, first_category: int) -> dict:
    """A split's COCO JSON as the evaluators read it (:func:`usable_ground_truth`), with only ``--classes``' boxes
    (class i is the JSON's i-th category by id) and, for a single-class run, all in its one category."""
    truth = usable_ground_truth(coco_json)
    if spec.include_classes is not None:
        ids = sorted(category["id"] for category in truth["categories"])
        wanted = {ids[index] for index in spec.include_classes}
        truth = {**truth, "annotations": [ann for ann in truth["annotations"] if ann["category_id"] in wanted]}
    return one_category(truth, first_category, spec.names[0]) if spec.label_names is not None else truth


def build_split(
    spec: DatasetSpec,
    split: str,
    *,
    image_size: int,
    augment: AugmentConfig | None,
    cache: str = "auto",
    local_rank: int = 0,
    local_world_size: int = 1,
    run_id: str = "",
) -> SplitData:
    """The split's records, dataset (with its RAM or disk cache per ``cache``) and, for evaluation, its ground truth.

    ``local_rank`` / ``local_world_size`` / ``run_id``: this process's place on its node, for a RAM cache
    the node's processes share (:func:`detector.data.ram_cache.build_image_cache`).
    """
    records, category_ids, coco_json = load_records(spec, split, training=augment is not None)
    dataset = DetectionDataset(records, image_size=image_size, augment=augment)
    def load(index: int) -> np.ndarray:
        return dataset.load_resized(index)[0]

    if cache == "disk":  # kept with the dataset for later runs; local rank 0 fills it (called first)
        locations = cache_locations(getattr(spec, split))
        dataset.image_cache = open_disk_cache(records, image_size, load, locations=locations, fill=local_rank == 0,
                                              threads=scan_threads())
    else:
        dataset.image_cache = build_image_cache(records, image_size, load, mode=cache, local_rank=local_rank,
                                                local_world_size=local_world_size, run_id=run_id,
                                                threads=scan_threads())
    data = SplitData(dataset, records, category_ids)
    if augment is None:
        data.ground_truth = (
            load_coco(build_coco_ground_truth(records, data.image_hw, spec.names, category_ids))
            if coco_json is None
            else load_coco(json_ground_truth(coco_json, spec, category_ids[0]))
        )
        if coco_json is not None:
            data.json_scale = json_pixel_scale(data.ground_truth, records.image_ids, records.image_hw,
                                               f"{spec.yaml_path.name} '{split}'")
    return data
