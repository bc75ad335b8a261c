"""Spec + split name -> a ready dataset, its COCO ground truth and its category ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pycocotools.coco import COCO

from detector.data.augment import AugmentConfig
from detector.data.dataset import DetectionDataset
from detector.data.ground_truth import build_coco_ground_truth, load_coco
from detector.data.ram_cache import build_image_cache
from detector.data.records import Records
from detector.data.scan import scan_split, scan_threads
from detector.data.spec import DatasetError, DatasetSpec


@dataclass
class SplitData:
    dataset: DetectionDataset
    records: Records
    category_ids: list[int]  # class index -> COCO category id
    ground_truth: COCO | None = None  # evaluation splits only (augment=None)

    @property
    def image_hw(self) -> list[tuple[int, int]]:
        """Upright original ``(height, width)`` per record."""
        return self.records.hw_list()


def load_records(spec: DatasetSpec, split: str) -> tuple[Records, list[int], Path | None]:
    """Labels parsed and images checked for one split (cached, see :mod:`detector.data.scan`); one warning
    line per kind of problem. Returns the usable records, the category ids and the split's COCO JSON."""
    entry = getattr(spec, split)
    if entry is None:
        raise DatasetError(f"{spec.yaml_path}: no '{split}' split")
    scan = scan_split(entry, spec.names)
    scan.problems.warn(prefix=f"{spec.yaml_path.name} '{split}': ")
    if not len(scan.records):
        raise DatasetError(f"{spec.yaml_path}: '{split}' split has no readable images")
    return scan.records, scan.category_ids, entry.coco_json


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
    """The split's records, dataset (with its RAM cache per ``cache``) and, for evaluation, its ground truth.

    ``local_rank`` / ``local_world_size`` / ``run_id``: this process's place on its node, for a RAM cache
    the node's processes share (:func:`detector.data.ram_cache.build_image_cache`).
    """
    records, category_ids, coco_json = load_records(spec, split)
    dataset = DetectionDataset(records, image_size=image_size, augment=augment)
    dataset.image_cache = build_image_cache(
        records, image_size, lambda index: dataset.load_resized(index)[0], mode=cache, local_rank=local_rank,
        local_world_size=local_world_size, run_id=run_id, threads=scan_threads(),
    )
    data = SplitData(dataset, records, category_ids)
    if augment is None:
        data.ground_truth = (
            load_coco(coco_json)
            if coco_json is not None
            else load_coco(build_coco_ground_truth(records, data.image_hw, spec.names, category_ids))
        )
    return data
