"""A synthetic COCO-sized dataset, written in minutes, in both layouts the trainer reads (for data_scale.py).

What makes COCO slow to start is the number of files and boxes, not the pixels, so the images are a pool of a
few hundred distinct tiny JPEGs (64x48), hard-linked to as many file names as asked (118,287 by default: COCO
train2017). Both layouts share the image folder:

    <root>/yolo/images/{train,val}/000000000001.jpg ...   (hard links into <root>/pool/)
    <root>/yolo/labels/{train,val}/000000000001.txt ...   (~7.3 boxes an image, Poisson, 80 classes)
    <root>/yolo/data.yaml
    <root>/coco/annotations/instances_{train,val}.json    (the same boxes; polygons and fields as COCO's, so the
    <root>/coco/data.yaml                                  JSON is about as large: ~450 MB at 118k images)

Plus a handful of bad files, each of a kind a large real dataset holds: a truncated JPEG, a file of non-image
bytes, a zero-byte image, a label file with malformed rows (too few columns, a word, a class outside the names,
a box far outside the image), and in the JSON an image entry whose file is missing, annotations naming an image
the JSON does not list, a category it does not list, and boxes outside the image.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml

POOL_SIZE = 300  # distinct images: enough that decoding is not one cached image, few enough to write in a second
WIDTH, HEIGHT = 64, 48
BOXES_PER_IMAGE = 7.3  # COCO train2017: 860k boxes / 118k images
POLYGON_POINTS = 24  # COCO's polygons: ~520 bytes an annotation in all, most of it the polygon
COCO_CATEGORY_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]  # 80 of 1..90
MARKER = "synthetic_coco.json"  # written last: a folder with it is complete (what --keep reuses)

# The bad files (train split). Their names sort last, after the good images.
TRUNCATED, NOT_IMAGE, EMPTY, MISSING = "zz_truncated.jpg", "zz_not_an_image.jpg", "zz_empty.jpg", "zz_missing.jpg"
BAD_LABEL_ROWS = "0 0.5 0.5 0.1\nperson 0.5 0.5 0.1 0.1\n99 0.5 0.5 0.1 0.1\n3 1.8 0.5 0.2 0.2\n"


@dataclass
class SyntheticSet:
    root: Path
    yolo_yaml: Path
    coco_yaml: Path
    train_images: int  # files listed in the train split, bad ones included
    train_boxes: int


def coco_names() -> list[str]:
    """The 80 COCO class names, from the shipped coco.yaml."""
    return yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "coco.yaml").read_text())["names"]


def write_pool(folder: Path, rng: np.random.Generator) -> list[Path]:
    """``POOL_SIZE`` distinct small JPEGs: a random colour gradient, a few rectangles, noise."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    ramp = np.linspace(0, 1, WIDTH, dtype=np.float32)[None, :, None]
    for index in range(POOL_SIZE):
        low, high = rng.integers(0, 256, (2, 3)).astype(np.float32)
        image = (low + (high - low) * ramp).repeat(HEIGHT, 0)
        for _ in range(3):
            x1, y1 = rng.integers(0, WIDTH - 8), rng.integers(0, HEIGHT - 8)
            image[y1 : y1 + rng.integers(4, 24), x1 : x1 + rng.integers(4, 24)] = rng.integers(0, 256, 3)
        image = (image + rng.normal(0, 8, image.shape)).clip(0, 255).astype(np.uint8)
        path = folder / f"{index:04d}.jpg"
        cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        paths.append(path)
    return paths


def draw_boxes(images: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-image counts ``[images]`` and all boxes ``[N, 5]`` (class, cx, cy, w, h normalised, inside the image)."""
    counts = np.minimum(rng.poisson(BOXES_PER_IMAGE, images), 60)
    total = int(counts.sum())
    sides = rng.uniform(0.03, 0.6, (total, 2))
    centres = sides / 2 + rng.uniform(0, 1, (total, 2)) * (1 - sides)
    classes = rng.integers(0, 80, total)
    return counts, np.column_stack([classes, centres, sides])


def write_yolo_labels(folder: Path, names: list[str], counts: np.ndarray, boxes: np.ndarray) -> None:
    """One ``.txt`` per image with boxes (an image without boxes has no label file, as in COCO's YOLO export)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["%d %.6f %.6f %.6f %.6f" % tuple(row) for row in boxes.tolist()]
    offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
    for name, start, end in zip(names, offsets[:-1], offsets[1:]):
        if end > start:
            with open(folder / (Path(name).stem + ".txt"), "w") as file:
                file.write("\n".join(lines[start:end]) + "\n")


def coco_json(names: list[str], counts: np.ndarray, boxes: np.ndarray, rng: np.random.Generator) -> dict:
    """A COCO instances dict for these images and boxes, with COCO's fields (so its size is COCO's)."""
    categories = [{"supercategory": "thing", "id": category_id, "name": name}
                  for category_id, name in zip(COCO_CATEGORY_IDS, coco_names())]
    images = [{"license": 1, "file_name": name, "coco_url": f"http://images.cocodataset.org/train2017/{name}",
               "height": HEIGHT, "width": WIDTH, "date_captured": "2013-11-14 17:02:52",
               "flickr_url": "http://farm4.staticflickr.com/3153/2970773875_164f0c0b83_z.jpg", "id": index + 1}
              for index, name in enumerate(names)]
    # Polygons: a pool shared by reference (json writes each out in full, memory holds each once).
    polygons = [[[round(v, 2) for v in rng.uniform(0, WIDTH, 2 * POLYGON_POINTS).tolist()]] for _ in range(256)]
    image_of_box = np.repeat(np.arange(1, len(names) + 1), counts).tolist()
    pixels = boxes[:, 1:] * [WIDTH, HEIGHT, WIDTH, HEIGHT]
    xywh = np.column_stack([pixels[:, :2] - pixels[:, 2:] / 2, pixels[:, 2:]]).round(2).tolist()
    category = [COCO_CATEGORY_IDS[int(c)] for c in boxes[:, 0]]
    annotations = [{"segmentation": polygons[index % 256], "area": round(box[2] * box[3], 2), "iscrowd": 0,
                    "image_id": image_id, "bbox": box, "category_id": cat, "id": index + 1}
                   for index, (image_id, box, cat) in enumerate(zip(image_of_box, xywh, category))]
    return {"info": {"description": "synthetic COCO-sized set (benchmarks/synthetic_coco.py)"},
            "licenses": [{"url": "http://creativecommons.org/licenses/by/2.0/", "id": 1, "name": "CC BY 2.0"}],
            "images": images, "annotations": annotations, "categories": categories}


def add_bad_json_entries(coco: dict) -> None:
    """Annotations naming an unlisted image and an unlisted category, boxes outside the image, a missing file."""
    first = coco["annotations"][0]
    next_id = len(coco["annotations"]) + 1
    bad = [{**first, "image_id": 10**9}, {**first, "image_id": 10**9 + 1}, {**first, "category_id": 999},
           {**first, "bbox": [50.0, 40.0, 30.0, 20.0]},  # runs past the right and bottom edges: clipped
           {**first, "bbox": [-100.0, -100.0, 10.0, 10.0]}]  # wholly outside: zero area once clipped
    coco["annotations"] += [{**entry, "id": next_id + i} for i, entry in enumerate(bad)]
    coco["images"].append({**coco["images"][0], "file_name": MISSING, "id": len(coco["images"]) + 1})


def write_bad_images(folder: Path, pool: list[Path]) -> list[str]:
    """The bad image files (own files, not links, so nothing can change the pool through them)."""
    data = pool[0].read_bytes()
    (folder / TRUNCATED).write_bytes(data[: len(data) * 6 // 10])
    (folder / NOT_IMAGE).write_bytes(b"<html>404 Not Found</html>\n" * 20)
    (folder / EMPTY).write_bytes(b"")
    return [TRUNCATED, NOT_IMAGE, EMPTY]


def write_split(root: Path, split: str, images: int, pool: list[Path], rng: np.random.Generator, *,
                bad_files: bool) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Image links, YOLO labels (bad rows included) for one split; returns the names, box counts and boxes."""
    image_dir = root / "yolo" / "images" / split
    image_dir.mkdir(parents=True, exist_ok=True)
    good = images - (3 if bad_files else 0)
    names = [f"{index + 1:012d}.jpg" for index in range(good)]
    for index, name in enumerate(names):
        os.link(pool[index % len(pool)], image_dir / name)
    if bad_files:
        names += write_bad_images(image_dir, pool)
    counts, boxes = draw_boxes(len(names), rng)
    write_yolo_labels(root / "yolo" / "labels" / split, names, counts, boxes)
    if bad_files:
        with open(root / "yolo" / "labels" / split / (Path(names[0]).stem + ".txt"), "a") as file:
            file.write(BAD_LABEL_ROWS)
    return names, counts, boxes


def generate(root: Path, *, images: int, val_images: int = 64, seed: int = 0) -> SyntheticSet:
    """Write the set under ``root`` (its ``pool``, ``yolo`` and ``coco`` folders are replaced)."""
    for part in ("pool", "yolo", "coco", MARKER):
        target = root / part
        if target.is_dir():
            shutil.rmtree(target)
        target.unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    pool = write_pool(root / "pool", rng)
    class_names = coco_names()
    (root / "coco" / "annotations").mkdir(parents=True)
    train_boxes = 0
    for split, count in (("train", images), ("val", val_images)):
        names, counts, boxes = write_split(root, split, count, pool, rng, bad_files=split == "train")
        coco = coco_json(names, counts, boxes, rng)
        if split == "train":
            add_bad_json_entries(coco)
            train_boxes = len(boxes)
        # json.dumps, not json.dump: only the one-shot form uses the C encoder (dump's chunked one is pure Python).
        (root / "coco" / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
    yolo_yaml, coco_yaml = root / "yolo" / "data.yaml", root / "coco" / "data.yaml"
    yolo_yaml.write_text(yaml.safe_dump({"path": str(root / "yolo"), "train": "images/train", "val": "images/val",
                                         "names": class_names}, sort_keys=False))
    images_dir = root / "yolo" / "images"
    coco_yaml.write_text(yaml.safe_dump({
        "path": str(root / "coco"), "names": class_names,
        "train": {"json": "annotations/instances_train.json", "images": str(images_dir / "train")},
        "val": {"json": "annotations/instances_val.json", "images": str(images_dir / "val")}}, sort_keys=False))
    made = SyntheticSet(root, yolo_yaml, coco_yaml, images, train_boxes)
    (root / MARKER).write_text(json.dumps({"images": images, "val_images": val_images, "seed": seed,
                                           "train_boxes": train_boxes}))
    return made


def reuse_or_generate(root: Path, *, images: int, val_images: int = 64, seed: int = 0) -> tuple[SyntheticSet, bool]:
    """The set already under ``root`` when it was made with the same settings, else a new one; and whether reused."""
    try:
        made = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        made = {}
    if made and (made["images"], made["val_images"], made["seed"]) == (images, val_images, seed):
        return SyntheticSet(root, root / "yolo" / "data.yaml", root / "coco" / "data.yaml", images,
                            made["train_boxes"]), True
    return generate(root, images=images, val_images=val_images, seed=seed), False
