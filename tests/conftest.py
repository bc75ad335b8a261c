"""Shared fixtures: tiny datasets written by the tests themselves (no downloads, no shared data)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.data.synthetic import make_image, write_yolo_split

NAMES = ["circle", "square", "triangle"]


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the setting.

    The test machines share 2 cores between workers; there, OpenMP barriers between two threads make
    64 px convolutions ~5x slower than one thread (measured on the export tests: 118 s -> 22 s).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def write_yolo_dataset(root: Path, *, train: int = 8, val: int = 4, size: int = 64, seed: int = 0) -> Path:
    """Synthetic shapes in YOLO layout (images/ + labels/) with a data YAML; returns the YAML path."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        write_yolo_split(root, split, count, size, rng, suffix=".png")
    yaml_path = root / "data.yaml"
    yaml_path.write_text(f"path: .\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return yaml_path


def write_coco_dataset(root: Path, *, count: int = 4, size: int = 64, seed: int = 1) -> Path:
    """The same kind of images with a COCO instances JSON (category ids 7, 9, 11 to test the mapping)."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    category_ids = [7, 9, 11]
    images, annotations = [], []
    for index in range(count):
        image, labels = make_image(rng, size)
        name = f"{index:03d}.jpg"
        cv2.imwrite(str(root / "images" / name), image)
        images.append({"id": 100 + index, "file_name": name, "width": size, "height": size})
        for cls, cx, cy, w, h in labels.tolist():
            box = [(cx - w / 2) * size, (cy - h / 2) * size, w * size, h * size]
            annotations.append({"id": len(annotations) + 1, "image_id": 100 + index,
                                "category_id": category_ids[int(cls)], "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
    categories = [{"id": cid, "name": name} for cid, name in zip(category_ids, NAMES)]
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    yaml_path = root / "coco.yaml"
    yaml_path.write_text(
        "path: .\ntrain: {json: instances.json, images: images}\nval: {json: instances.json, images: images}\n"
        f"names: {NAMES}\n"
    )
    return yaml_path


@pytest.fixture
def yolo_yaml(tmp_path: Path) -> Path:
    return write_yolo_dataset(tmp_path / "yolo")


@pytest.fixture
def coco_yaml(tmp_path: Path) -> Path:
    return write_coco_dataset(tmp_path / "coco")
