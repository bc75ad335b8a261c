"""Label formats -> one record per image: its path and a ``[n, 5]`` array (class, cx, cy, w, h), normalised.

YOLO txt labels are found by the ``images -> labels`` path convention; COCO JSON labels come from an
instances file. Problems are fixed or skipped with one warning line naming the file and the reason.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detector.data.spec import IMAGE_SUFFIXES, DatasetError

CLIP_TOLERANCE = 0.02  # coordinates this far outside [0, 1] are clipped; further out the box is dropped
MIN_SIDE = 1e-4  # boxes thinner than this (normalised) are dropped as zero-area


@dataclass
class ImageRecord:
    path: Path
    labels: np.ndarray  # [n, 5] float32: class, cx, cy, w, h in [0, 1]
    image_id: int  # COCO image id (the JSON's own, or the record's index for YOLO datasets)


def label_path_for(image: Path) -> Path:
    """``.../images/x/a.jpg`` -> ``.../labels/x/a.txt`` (the last ``images`` folder in the path)."""
    parts = list(image.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def parse_yolo_label_text(text: str, num_classes: int, source: str = "<labels>") -> tuple[np.ndarray, list[str]]:
    """Parse YOLO label lines -> (``[n, 5]`` array, problems found).

    Fixes what is safely fixable (slightly out-of-range coordinates, duplicate boxes) and drops the rest.
    """
    problems: list[str] = []
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5:
            problems.append(f"{source}:{number}: expected 5 columns, got {len(fields)}; line dropped")
            continue
        try:
            values = [float(v) for v in fields]
        except ValueError:
            problems.append(f"{source}:{number}: non-numeric value; line dropped")
            continue
        if not all(np.isfinite(values)):
            problems.append(f"{source}:{number}: non-finite value; line dropped")
            continue
        cls = values[0]
        if cls != int(cls) or not 0 <= cls < num_classes:
            problems.append(f"{source}:{number}: class {fields[0]} outside 0..{num_classes - 1}; line dropped")
            continue
        rows.append(values)
    if not rows:
        return np.zeros((0, 5), np.float32), problems
    labels = np.array(rows, np.float32)
    x1y1 = labels[:, 1:3] - labels[:, 3:5] / 2
    x2y2 = labels[:, 1:3] + labels[:, 3:5] / 2
    corners = np.concatenate((x1y1, x2y2), 1)
    absurd = ((corners < -CLIP_TOLERANCE) | (corners > 1 + CLIP_TOLERANCE)).any(1) | (labels[:, 3:5] < 0).any(1)
    if absurd.any():
        problems.append(f"{source}: {int(absurd.sum())} box(es) far outside the image or with negative size; dropped")
    if ((corners < 0) | (corners > 1)).any():
        problems.append(f"{source}: box coordinates slightly outside [0, 1]; clipped")
    corners = corners.clip(0, 1)
    labels = np.concatenate((labels[:, :1], (corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]), 1)
    tiny = (labels[:, 3:5] < MIN_SIDE).any(1) & ~absurd
    if tiny.any():
        problems.append(f"{source}: {int(tiny.sum())} zero-area box(es); dropped")
    labels = labels[~absurd & ~tiny]
    unique, first = np.unique(labels, axis=0, return_index=True)
    if len(unique) < len(labels):
        problems.append(f"{source}: {len(labels) - len(unique)} duplicate box(es); removed")
        labels = labels[np.sort(first)]
    return labels.astype(np.float32), problems


def load_yolo_records(images: list[Path], num_classes: int) -> tuple[list[ImageRecord], list[str]]:
    """Records for images with YOLO txt labels; a missing label file means a background image."""
    records, problems = [], []
    for index, image in enumerate(images):
        label_file = label_path_for(image)
        if label_file.is_file():
            labels, found = parse_yolo_label_text(label_file.read_text(errors="replace"), num_classes, str(label_file))
            problems.extend(found)
        else:
            labels = np.zeros((0, 5), np.float32)
        records.append(ImageRecord(path=image, labels=labels, image_id=index))
    return records, problems


def load_coco_records(json_path: Path, images_dir: Path, names: list[str]) -> tuple[list[ImageRecord], list[int]]:
    """Records from a COCO instances JSON.

    Category ids are mapped to contiguous class indices in the order of sorted category id; the YAML's
    ``names`` must list the same number of classes. Crowd annotations are left out of training.

    Returns the records and ``category_ids`` (class index -> COCO category id, for writing results).
    """
    try:
        coco = json.loads(json_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DatasetError(f"{json_path}: cannot read COCO JSON ({error})") from None
    categories = sorted(c["id"] for c in coco.get("categories", []))
    if len(categories) != len(names):
        raise DatasetError(f"{json_path}: {len(categories)} categories but the YAML 'names' lists {len(names)}")
    class_of = {cat: i for i, cat in enumerate(categories)}
    boxes_by_image: dict[int, list[list[float]]] = {}
    for ann in coco.get("annotations", []):
        if ann.get("iscrowd", 0):
            continue
        boxes_by_image.setdefault(ann["image_id"], []).append([class_of[ann["category_id"]], *ann["bbox"]])
    records = []
    for info in sorted(coco.get("images", []), key=lambda i: i["id"]):
        path = images_dir / info["file_name"]
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        width, height = float(info["width"]), float(info["height"])
        rows = np.array(boxes_by_image.get(info["id"], []), np.float32).reshape(-1, 5)
        labels = np.zeros((len(rows), 5), np.float32)
        if len(rows):
            labels[:, 0] = rows[:, 0]
            labels[:, 1] = (rows[:, 1] + rows[:, 3] / 2) / width
            labels[:, 2] = (rows[:, 2] + rows[:, 4] / 2) / height
            labels[:, 3] = rows[:, 3] / width
            labels[:, 4] = rows[:, 4] / height
            labels = labels[(labels[:, 3] > MIN_SIDE) & (labels[:, 4] > MIN_SIDE)]
            labels[:, 1:] = labels[:, 1:].clip(0, 1)
        records.append(ImageRecord(path=path, labels=labels, image_id=int(info["id"])))
    return records, categories


def warn_problems(problems: list[str], limit: int = 20) -> None:
    """One warning line per problem (up to ``limit``), then a count of the rest."""
    for problem in problems[:limit]:
        warnings.warn(problem, stacklevel=2)
    if len(problems) > limit:
        warnings.warn(f"... and {len(problems) - limit} more label problems", stacklevel=2)
