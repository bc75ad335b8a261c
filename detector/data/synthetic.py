"""The built-in dataset: coloured circles, squares and triangles on noisy backgrounds.

Deterministic (fixed seed), generated on first use into ``data/shapes/`` in YOLO format, so
``python train.py`` needs no download. Boxes are the exact extents of the drawn shapes. The data YAML,
``data/shapes.yaml``, is committed (it is :data:`SHAPES_YAML`); only the images are generated.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np

NAMES = ["circle", "square", "triangle"]
VERSION = "1"  # bump when the generator changes, so stale caches are rebuilt
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "data"
SHAPES_YAML = (
    "# Built-in synthetic dataset: images generated into data/shapes/ by detector.data.synthetic on first use.\n"
    "path: shapes  # relative to this file's folder\ntrain: images/train\nval: images/val\n"
    f"names: {NAMES}\n"
)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A smooth two-colour gradient plus Gaussian noise."""
    start, end = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:size, 0:size] / size
    t = (np.cos(angle) * xs + np.sin(angle) * ys)
    t = (t - t.min()) / (t.max() - t.min() + 1e-9)
    image = start + t[..., None] * (end - start)
    image += rng.normal(0, rng.uniform(5, 25), image.shape)
    return image.clip(0, 255).astype(np.uint8)


def _draw_shape(image: np.ndarray, kind: int, centre: np.ndarray, radius: float, rng: np.random.Generator) -> np.ndarray:
    """Draw one filled shape; return its xyxy box."""
    colour = tuple(int(c) for c in rng.uniform(0, 255, 3))
    if kind == 0:
        points = centre + radius * np.stack([np.cos(a := np.linspace(0, 2 * math.pi, 64)), np.sin(a)], 1)
    else:
        sides = 4 if kind == 1 else 3
        angles = rng.uniform(0, 2 * math.pi) + np.arange(sides) * 2 * math.pi / sides
        points = centre + radius * np.stack([np.cos(angles), np.sin(angles)], 1)
    cv2.fillPoly(image, [np.round(points * 16).astype(np.int32)], colour, lineType=cv2.LINE_AA, shift=4)
    return np.concatenate((points.min(0), points.max(0)))


def make_image(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One image and its labels ``[n, 5]`` (class, cx, cy, w, h normalised)."""
    image = _background(rng, size)
    labels, boxes = [], []
    for _ in range(int(rng.integers(1, 7))):
        for _attempt in range(20):  # find a spot that does not bury an earlier shape
            radius = rng.uniform(0.04, 0.2) * size
            centre = rng.uniform(radius, size - radius, 2)
            box = np.concatenate((centre - radius, centre + radius))
            if all(_overlap(box, other) < 0.2 for other in boxes):
                break
        else:
            continue
        kind = int(rng.integers(0, 3))
        drawn = _draw_shape(image, kind, centre, radius, rng).clip(0, size)
        boxes.append(box)
        labels.append([kind, (drawn[0] + drawn[2]) / 2 / size, (drawn[1] + drawn[3]) / 2 / size,
                       (drawn[2] - drawn[0]) / size, (drawn[3] - drawn[1]) / size])
    return image, np.array(labels, np.float32).reshape(-1, 5)


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return inter / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


def write_yolo_split(folder: Path, split: str, count: int, size: int, rng: np.random.Generator, *,
                     suffix: str = ".jpg") -> None:
    """Write ``count`` images to ``folder/images/split`` and their YOLO labels to ``folder/labels/split``."""
    (folder / "images" / split).mkdir(parents=True, exist_ok=True)
    (folder / "labels" / split).mkdir(parents=True, exist_ok=True)
    for index in range(count):
        image, labels = make_image(rng, size)
        name = f"{split}_{index:05d}"
        cv2.imwrite(str(folder / "images" / split / f"{name}{suffix}"), image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
        lines = "".join(f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in labels)
        (folder / "labels" / split / f"{name}.txt").write_text(lines)


def generate_shapes(
    root: Path = DEFAULT_ROOT, *, train: int = 512, val: int = 128, size: int = 320, seed: int = 0
) -> Path:
    """Write the dataset under ``root/shapes`` (once) and return its data YAML path."""
    folder = root / "shapes"
    yaml_path = root / "shapes.yaml"
    stamp = folder / f".complete-v{VERSION}-{train}-{val}-{size}-{seed}"
    if stamp.is_file() and yaml_path.is_file():
        return yaml_path
    # Written into a private folder and renamed into place, so a process that finds the folder finds all of
    # it: several torchrun nodes on one shared file system may generate at the same time.
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".shapes-", dir=root))
    try:
        rng = np.random.default_rng(seed)
        for split, count in (("train", train), ("val", val)):
            write_yolo_split(work, split, count, size, rng)
        (work / stamp.name).touch()
        if folder.exists() and not stamp.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # another version's images, or an interrupted older run
        try:
            os.rename(work, folder)
        except OSError:
            if not stamp.is_file():  # not because another process finished first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # The repository's data/shapes.yaml is committed with this text: rewrite only when it differs, so a
    # built-in run leaves the working tree clean (tests write their own roots).
    if not yaml_path.is_file() or yaml_path.read_text() != SHAPES_YAML:
        yaml_path.write_text(SHAPES_YAML)
    return yaml_path
