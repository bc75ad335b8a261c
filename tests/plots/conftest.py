"""Fixtures for the plotting tests: a PNG checker and a tiny on-disk YOLO dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import pytest

from detector.data.build import SplitData, build_split
from detector.data.spec import load_dataset_spec

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAMES = ["square", "bar"]
# Per image: (height, width) and YOLO label rows (class, cx, cy, w, h normalised).
TINY_IMAGES = [
    ((64, 64), [(0, 0.30, 0.30, 0.25, 0.25), (1, 0.70, 0.70, 0.30, 0.15)]),
    ((48, 64), [(0, 0.50, 0.50, 0.40, 0.40)]),
    ((64, 64), [(1, 0.40, 0.60, 0.50, 0.20)]),
    ((64, 48), []),  # background image
]


@pytest.fixture
def assert_png() -> Callable[[Path], np.ndarray]:
    """Check a file is a decodable PNG of non-trivial size; return the decoded BGR array."""

    def check(path: Path, min_side: int = 32) -> np.ndarray:
        path = Path(path)
        assert path.is_file(), path
        assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        assert image is not None and min(image.shape[:2]) >= min_side, f"{path} did not decode to a real image"
        return image

    return check


def write_tiny_dataset(root: Path) -> Path:
    """Write ``TINY_IMAGES`` as PNGs with filled rectangles and YOLO labels; return the data YAML path."""
    images_dir, labels_dir = root / "images" / "val", root / "labels" / "val"
    images_dir.mkdir(parents=True)
    labels_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index, ((height, width), rows) in enumerate(TINY_IMAGES):
        image = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
        for cls, cx, cy, w, h in rows:
            x1, y1 = round((cx - w / 2) * width), round((cy - h / 2) * height)
            x2, y2 = round((cx + w / 2) * width), round((cy + h / 2) * height)
            image[y1:y2, x1:x2] = (200, 80, 80) if cls == 0 else (80, 200, 80)
        cv2.imwrite(str(images_dir / f"img{index}.png"), image)
        if rows:
            lines = [" ".join(str(value) for value in row) for row in rows]
            (labels_dir / f"img{index}.txt").write_text("\n".join(lines) + "\n")
    yaml_path = root / "tiny.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return yaml_path


@pytest.fixture
def tiny_split(tmp_path: Path) -> SplitData:
    """The tiny dataset's val split, letterboxed to 64 x 64, with its COCO ground truth."""
    spec = load_dataset_spec(write_tiny_dataset(tmp_path / "data"))
    return build_split(spec, "val", image_size=64, augment=None, cache="false")
