"""Label formats -> per-image ``[n, 5]`` arrays (class, cx, cy, w, h), normalised, and the problems found.

YOLO txt labels are found by the ``images -> labels`` path convention; COCO JSON labels come from an
instances file, read once into arrays. What is safely fixable is fixed (slightly out-of-range coordinates,
duplicate boxes), the rest dropped; each problem is recorded in a :class:`Problems` (one summary line per
kind, see :mod:`detector.data.problems`), never raised.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from detector.data.problems import (
    BAD_BBOX,
    BAD_IMAGE_SIZE,
    CLASS_OUT_OF_RANGE,
    CLIPPED,
    CLIPPED_FAR,
    DUPLICATE,
    FAR_OUTSIDE,
    MISSING_IMAGE_ENTRY,
    NOT_AN_IMAGE_NAME,
    NOT_NUMERIC,
    OTHER_CATEGORY_NAMES,
    SCORE_COLUMN,
    UNKNOWN_CATEGORY,
    WRONG_COLUMNS,
    ZERO_AREA,
    Problems,
)
from detector.data.containment import unsafe_relative
from detector.data.spec import IMAGE_SUFFIXES, DatasetError

# Past [0, 1] by this much is a tool's rounding: a YOLO box's centre or size (further: its image skipped), a COCO
# box's corners (further: named as reaching far outside).
CLIP_TOLERANCE = 0.02
# Overshoot this small is rounding, clipped without a word: a corner is x +- w / 2 of two values written to d decimals,
# each within 0.5e-d, so off by up to 0.75e-d: under 1e-3 for labels written with 3 decimals or more (Ultralytics and
# COCO's converters write 6: 1.0000003 is common in coco128 and BCCD), and 1e-3 is 0.64 px at 640. COCO's float boxes
# in pixels end a rounding error past the border the same way.
ROUNDING_OVERSHOOT = 1e-3
MIN_SIDE = 1e-4  # boxes thinner than this (normalised) are dropped as zero-area


def label_path_for(image: Path) -> Path:
    """``.../images/x/a.jpg`` -> ``.../labels/x/a.txt`` (the last ``images`` folder in the path)."""
    parts = list(image.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def polygon_box(fields: list[str]) -> list[float]:
    """A segmentation line ``class x1 y1 x2 y2 ...`` -> ``[class, cx, cy, w, h]``, its points' bounding box (as
    Ultralytics reads a segment dataset for detection). Raises ValueError on a field that is not a number; a NaN
    point makes the box NaN (dropped with the non-finite rows)."""
    values = np.array(fields, np.float64)
    xs, ys = values[1::2], values[2::2]
    x1, x2, y1, y2 = xs.min(), xs.max(), ys.min(), ys.max()
    return [values[0], (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]


def _numeric_rows(text: str, source: str, problems: Problems) -> tuple[np.ndarray, list[int]]:
    """The box lines (5 columns) and polygon lines (class, then 3 or more x y points: their bounding box) as float64
    ``[n, 5]``, and their line numbers; malformed lines recorded, dropped."""
    rows: list[list[str] | list[float]] = []
    numbers = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) >= 7 and len(fields) % 2:
            try:
                rows.append(polygon_box(fields))
            except ValueError:
                problems.add(NOT_NUMERIC, f"{source}:{number}")
                continue
        elif len(fields) == 5:
            rows.append(fields)
        elif len(fields) == 6:
            problems.add(SCORE_COLUMN, f"{source}:{number}")
            continue
        else:
            problems.add(WRONG_COLUMNS, f"{source}:{number}")
            continue
        numbers.append(number)
    if not rows:
        return np.zeros((0, 5)), []
    try:
        values = np.array(rows, dtype=np.float64)  # one C-level conversion for the common, clean file
    except ValueError:  # some field is not a number: convert line by line to find which
        kept_values, kept_numbers = [], []
        for fields, number in zip(rows, numbers):
            try:
                kept_values.append([float(v) for v in fields])
                kept_numbers.append(number)
            except ValueError:
                problems.add(NOT_NUMERIC, f"{source}:{number}")
        values, numbers = np.array(kept_values, np.float64).reshape(-1, 5), kept_numbers
    finite = np.isfinite(values).all(1)
    for number in np.asarray(numbers)[~finite]:
        problems.add(NOT_NUMERIC, f"{source}:{number}")
    return values[finite], [n for n, ok in zip(numbers, finite) if ok]


def parse_yolo_label_text(text: str, num_classes: int, source: str = "<labels>") -> tuple[np.ndarray, Problems]:
    """Parse YOLO label lines -> (``[n, 5]`` float32 array, problems found)."""
    problems = Problems()
    values, numbers = _numeric_rows(text, source, problems)
    classes = values[:, 0]
    valid_class = (classes == np.floor(classes)) & (classes >= 0) & (classes < num_classes)
    for number in np.asarray(numbers, np.int64)[~valid_class]:
        problems.add(CLASS_OUT_OF_RANGE, f"{source}:{number}")
    # Float64 until the boxes are checked: a finite 1e39 is inf in float32, and inf - inf would be a NaN
    # box that passes every comparison below.
    labels = values[valid_class]
    if not len(labels):
        return np.zeros((0, 5), np.float32), problems
    with np.errstate(over="ignore"):  # 1e308 + 1e308 is inf: far outside, dropped below
        x1y1 = labels[:, 1:3] - labels[:, 3:5] / 2
        x2y2 = labels[:, 1:3] + labels[:, 3:5] / 2
    corners = np.concatenate((x1y1, x2y2), 1)
    # As Ultralytics checks a label (centre and size in [0, 1]), with the clipping tolerance: a box centred in the
    # image may reach past its edge (an object partly out of frame, its box not clipped by the tool) and is clipped.
    absurd = ((labels[:, 1:5] < -CLIP_TOLERANCE) | (labels[:, 1:5] > 1 + CLIP_TOLERANCE)).any(1) | (
        labels[:, 3:5] < 0).any(1)
    problems.add(FAR_OUTSIDE, source, int(absurd.sum()))
    outside = ((corners < -ROUNDING_OVERSHOOT) | (corners > 1 + ROUNDING_OVERSHOOT)).any(1) & ~absurd
    far = ((corners < -CLIP_TOLERANCE) | (corners > 1 + CLIP_TOLERANCE)).any(1) & ~absurd
    problems.add(CLIPPED, source, int((outside & ~far).sum()))
    problems.add(CLIPPED_FAR, source, int(far.sum()))
    corners = corners.clip(0, 1)
    labels = np.concatenate((labels[:, :1], (corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]), 1)
    tiny = (labels[:, 3:5] < MIN_SIDE).any(1) & ~absurd
    problems.add(ZERO_AREA, source, int(tiny.sum()))
    labels = labels[~absurd & ~tiny].astype(np.float32)
    # First occurrence of each distinct row, in order (a dict of row tuples: ~5x faster than np.unique(axis=0)
    # on a file's handful of boxes, and the label pass reads every file of the dataset).
    first = list(dict.fromkeys(map(tuple, labels.tolist())).keys())
    if len(first) < len(labels):
        problems.add(DUPLICATE, source, len(labels) - len(first))
        labels = np.array(first, np.float32).reshape(-1, 5)
    return labels, problems


class UnreadableLabels(OSError):
    """A label file that exists but cannot be read (a folder, a pipe, no permission); names the file."""


def read_yolo_labels(image: Path, num_classes: int) -> tuple[np.ndarray, Problems]:
    """The labels of one image (none when its label file is missing: a background image).

    Raises :class:`UnreadableLabels` when the label file exists but is not a readable regular file: the
    image cannot be trained on as a background image, its boxes are just unknown. Only regular files are
    opened (opening a named pipe would wait for a writer forever).
    """
    label_file = label_path_for(image)
    try:
        if not stat.S_ISREG(os.stat(label_file).st_mode):
            raise UnreadableLabels(f"{label_file} (not a regular file)")
        # utf-8-sig: a byte-order mark (Windows Notepad writes one) is not part of the first line's class id.
        text = label_file.read_text(encoding="utf-8-sig", errors="replace")
    except FileNotFoundError:
        return np.zeros((0, 5), np.float32), Problems()
    except UnreadableLabels:
        raise
    except OSError as error:
        raise UnreadableLabels(f"{label_file} ({error.strerror or error})") from None
    return parse_yolo_label_text(text, num_classes, str(label_file))


@dataclass
class CocoLabels:
    """A COCO instances JSON reduced to arrays: one entry per listed image (sorted by id) with a usable suffix."""

    paths: list[Path]
    image_ids: np.ndarray  # int64 [n]
    labels: list[np.ndarray]  # [n_i, 5] float32 per image, normalised by the JSON's width and height
    category_ids: list[int]  # class index -> COCO category id (sorted ids)
    sizes: list[tuple[int, int]]  # (height, width) per image, as the JSON lists them
    problems: Problems = field(default_factory=Problems)


def whole_number(value: object) -> bool:
    """A JSON integer in int64's range (COCO's ids; ``7.0`` too): not a bool, a NaN or a list, so it hashes
    and sorts with the rest."""
    if isinstance(value, float):
        return value.is_integer() and abs(value) < 2**63
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63  # ids are int64 arrays


def _entries(coco: dict, key: str, json_path: Path) -> list[dict]:
    """``coco[key]`` as a list of objects (missing: empty); anything else names the file and the key."""
    entries = coco.get(key, [])
    if not isinstance(entries, list):
        raise DatasetError(f"{json_path}: '{key}' must be a list, got {type(entries).__name__}")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DatasetError(f"{json_path}: {key}[{index}] must be an object, got {type(entry).__name__}")
    return entries


def _field(entry: dict, key: str, index: int, section: str, json_path: Path) -> object:
    if key not in entry:
        raise DatasetError(f"{json_path}: {section}[{index}] has no '{key}'")
    return entry[key]


def valid_bbox(bbox: object) -> bool:
    """``[x, y, w, h]``: four finite numbers (Python's JSON reader accepts NaN and Infinity), ``w, h >= 0``."""
    if not (isinstance(bbox, list) and len(bbox) == 4):
        return False
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox):
        return False
    return bbox[2] >= 0 and bbox[3] >= 0


def _positive_size(info: dict) -> bool:
    """A listed image's ``width`` and ``height``: finite numbers above 0 (a 0 would divide every box by 0)."""
    sides = (info["width"], info["height"])
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in sides)


def read_coco_json(json_path: Path) -> dict:
    try:
        with open(json_path, "rb") as file:
            coco = json.load(file)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise DatasetError(f"{json_path}: cannot read COCO JSON ({str(error)[:200]})") from None
    if not isinstance(coco, dict):
        raise DatasetError(f"{json_path}: not a COCO JSON (an object with 'images', 'annotations', 'categories')")
    return coco


# Image and category ids travel to the evaluators in float64 rows (detector/metrics/coco.py), exact up to 2**53.
LARGEST_ID = 2**53


def _coco_id(value: object, index: int, section: str, json_path: Path) -> int:
    """An image's or category's ``id``: an integer within :data:`LARGEST_ID`; anything else one line."""
    if not whole_number(value):
        raise DatasetError(f"{json_path}: {section}[{index}] 'id' must be an integer, got {value!r:.40}")
    if abs(value) > LARGEST_ID:  # type: ignore[operator]
        raise DatasetError(f"{json_path}: {section}[{index}] 'id' {value} is beyond 2**53, which the evaluation "
                           "cannot hold exactly; renumber the JSON's ids")
    return int(value)  # type: ignore[call-overload]


def _coco_images(coco: dict, json_path: Path, problems: Problems) -> tuple[dict[int, dict], set[int]]:
    """id -> image entry, of the entries with a usable size, and the ids of those without (dropped and counted
    here; their annotations go with them). A missing key, an id that is not an integer, or one that two entries
    share (whose annotations would land on one of the two photos) is an error naming the file and the entries."""
    images, skipped, first = {}, set(), {}
    for index, info in enumerate(_entries(coco, "images", json_path)):
        image_id = _coco_id(_field(info, "id", index, "images", json_path), index, "images", json_path)
        if image_id in first:
            raise DatasetError(f"{json_path}: images[{index}] has the id {image_id} of images[{first[image_id]}]: "
                               "each image needs an id of its own (two exports merged, each numbered from 1?)")
        first[image_id] = index
        name = _field(info, "file_name", index, "images", json_path)
        if not isinstance(name, str):
            raise DatasetError(f"{json_path}: images[{index}] 'file_name' must be text, got {name!r:.40}")
        reason = unsafe_relative(name)
        if reason:  # joined to the image folder it would name a file outside it
            raise DatasetError(f"{json_path}: images[{index}] (id {image_id}) 'file_name' {name!r:.80} {reason}")
        for key in ("width", "height"):
            _field(info, key, index, "images", json_path)
        if not _positive_size(info):
            problems.add(BAD_IMAGE_SIZE, f"{json_path} (image {image_id})")
            skipped.add(image_id)
            continue
        images[image_id] = info
    return images, skipped


def read_coco_labels(json_path: Path, images_dir: Path, names: list[str]) -> CocoLabels:
    """Read a COCO instances JSON once into arrays.

    Category ids map to contiguous class indices in sorted-id order; the YAML's ``names`` must list as many.
    Crowd annotations are left out of training. Annotations naming an unknown image or category, or
    without a usable bbox (non-finite, negative size), and images of a non-positive or non-finite size are
    dropped and counted; boxes are clipped to the image (counted). A JSON that is not COCO's shape (a
    missing key, an id that is not an integer, a ``file_name`` leaving the image folder) raises
    :class:`DatasetError` naming the file and the entry.
    """
    coco = read_coco_json(json_path)
    named: dict[int, object] = {}
    for index, category in enumerate(_entries(coco, "categories", json_path)):
        category_id = _field(category, "id", index, "categories", json_path)
        named[_coco_id(category_id, index, "categories", json_path)] = category.get("name")
    categories = sorted(named)
    if len(categories) != len(names):
        raise DatasetError(f"{json_path}: {len(categories)} categories but the YAML 'names' lists {len(names)}")
    class_of = {cat: i for i, cat in enumerate(categories)}
    problems = Problems()
    check_category_names([named[category] for category in categories], names, json_path, problems)
    images, skipped = _coco_images(coco, json_path, problems)
    rows_by_image: dict[int, list[list[float]]] = {}
    where = str(json_path)
    for ann in _entries(coco, "annotations", json_path):
        if ann.get("iscrowd", 0):
            continue
        place = f"{where} (annotation {str(ann.get('id'))[:40]})"
        image_id, category_id = ann.get("image_id"), ann.get("category_id")
        if whole_number(image_id) and image_id in skipped:
            continue  # its image was counted as unusable
        if not whole_number(image_id) or image_id not in images:
            problems.add(MISSING_IMAGE_ENTRY, place)
            continue
        if not whole_number(category_id) or category_id not in class_of:
            problems.add(UNKNOWN_CATEGORY, place)
            continue
        bbox = ann.get("bbox")
        if not valid_bbox(bbox):
            problems.add(BAD_BBOX, place)
            continue
        rows_by_image.setdefault(image_id, []).append([class_of[category_id], *bbox])
    coco.clear()  # the parsed JSON's objects can go before the arrays are built
    paths, image_ids, labels, sizes = [], [], [], []
    for image_id in sorted(images):
        info = images[image_id]
        name = info["file_name"]
        if "\\" in name and not (images_dir / name).exists():  # a JSON written on Windows: sub\a.jpg
            name = name.replace("\\", "/")
        path = images_dir / name
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            problems.add(NOT_AN_IMAGE_NAME, f"{where} (image {image_id})")
            continue
        rows = np.array(rows_by_image.get(image_id, []), np.float64).reshape(-1, 5)
        paths.append(path)
        image_ids.append(int(image_id))
        labels.append(_normalise_coco_boxes(rows, float(info["width"]), float(info["height"]), path.name, problems))
        sizes.append((round(float(info["height"])), round(float(info["width"]))))
    return CocoLabels(paths, np.array(image_ids, np.int64), labels, categories, sizes, problems)


def check_category_names(by_id: list[object], names: list[str], json_path: Path, problems: Problems) -> None:
    """The JSON's category names in id order against the classes' ``names`` (the YAML's, or else the first JSON's):
    the same names in another order would name or score classes wrongly, so that is an error naming both lists;
    other names (a YAML that renames its classes) are counted, said in one line; a JSON without names, nothing."""
    if not all(isinstance(name, str) for name in by_id) or list(by_id) == list(names):
        return
    if sorted(by_id) == sorted(names):  # type: ignore[type-var]
        raise DatasetError(f"{json_path}: its categories in id order are {', '.join(map(str, by_id))[:200]}, but "
                           f"the classes are named {', '.join(names)[:200]}: class i is the JSON's i-th category by "
                           "id, so list 'names' in id order (or leave them out), and give every split's JSON the "
                           "same ids")
    problems.add(OTHER_CATEGORY_NAMES, f"{json_path} ({', '.join(map(str, by_id))[:120]})")


def _normalise_coco_boxes(rows: np.ndarray, width: float, height: float, name: str, problems: Problems) -> np.ndarray:
    """``[n, 5]`` (class, x, y, w, h pixels, top-left) -> normalised (class, cx, cy, w, h), clipped to the image."""
    if not len(rows):
        return np.zeros((0, 5), np.float32)
    scale = np.array([width, height, width, height])
    with np.errstate(over="ignore"):  # x + w past float64's range is inf, clipped to the border below
        corners = np.concatenate((rows[:, 1:3], rows[:, 1:3] + rows[:, 3:5]), 1) / scale
    # COCO's float boxes often end a rounding error past the border; only real overshoot is reported, and a box
    # reaching beyond the tolerance YOLO labels are clipped within is named as such (not "slightly outside").
    outside = ((corners < -ROUNDING_OVERSHOOT) | (corners > 1 + ROUNDING_OVERSHOOT)).any(1)
    far = ((corners < -CLIP_TOLERANCE) | (corners > 1 + CLIP_TOLERANCE)).any(1)
    problems.add(CLIPPED, name, int((outside & ~far).sum()))
    problems.add(CLIPPED_FAR, name, int(far.sum()))
    corners = corners.clip(0, 1)
    sides = corners[:, 2:] - corners[:, :2]
    labels = np.concatenate((rows[:, :1], (corners[:, :2] + corners[:, 2:]) / 2, sides), 1)
    tiny = (sides <= MIN_SIDE).any(1)
    problems.add(ZERO_AREA, name, int(tiny.sum()))
    return labels[~tiny].astype(np.float32)
