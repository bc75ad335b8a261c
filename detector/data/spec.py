"""Data YAML -> a resolved :class:`DatasetSpec` (image lists, class names, optional COCO JSON).

Accepts Ultralytics-style YAMLs::

    path: ../datasets/coco128   # root; relative paths resolve against the YAML's own folder
    train: images/train2017     # a folder, a list of folders, or a .txt file of image paths
    val: images/train2017
    names: {0: person, 1: bicycle}   # or a list

and COCO-JSON datasets, where a split is a mapping naming the JSON and the image folder::

    train: {json: annotations/instances_train2017.json, images: images/train2017}

YAMLs are read with ``yaml.safe_load``; a ``download:`` entry is never executed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}


class DatasetError(ValueError):
    """A dataset YAML or split that cannot be used; the message names the file and the field."""


@dataclass
class Split:
    images: list[Path]
    coco_json: Path | None = None  # labels come from this JSON instead of YOLO txt files


@dataclass
class DatasetSpec:
    yaml_path: Path
    names: list[str]
    train: Split
    val: Split
    test: Split | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.names)


def _parse_names(raw: object, source: Path) -> list[str]:
    if isinstance(raw, list) and raw:
        return [str(n) for n in raw]
    if isinstance(raw, dict) and raw:
        keys = sorted(int(k) for k in raw)
        if keys != list(range(len(keys))):
            raise DatasetError(f"{source}: 'names' keys must be 0..{len(keys) - 1}, got {keys[:5]}...")
        return [str(raw[k] if k in raw else raw[str(k)]) for k in keys]
    raise DatasetError(f"{source}: 'names' is missing or empty (a list or a {{id: name}} mapping is needed)")


def list_images(entry: str | Path, root: Path, source: Path, field_name: str) -> list[Path]:
    """A folder, a .txt list of image paths, or a single image -> sorted image paths."""
    path = Path(entry)
    path = path if path.is_absolute() else root / path
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if path.suffix == ".txt" and path.is_file():
        images = []
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                image = Path(line)
                images.append(image if image.is_absolute() else (path.parent / image).resolve())
        return images
    if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        return [path]
    raise DatasetError(f"{source}: '{field_name}' path does not exist: {path}")


def _parse_split(raw: object, root: Path, source: Path, field_name: str) -> Split:
    if isinstance(raw, dict):
        if "json" not in raw or "images" not in raw:
            raise DatasetError(f"{source}: '{field_name}' mapping needs both 'json' and 'images'")
        json_path = Path(raw["json"]) if Path(raw["json"]).is_absolute() else root / raw["json"]
        if not json_path.is_file():
            raise DatasetError(f"{source}: '{field_name}.json' does not exist: {json_path}")
        images_dir = Path(raw["images"]) if Path(raw["images"]).is_absolute() else root / raw["images"]
        if not images_dir.is_dir():
            raise DatasetError(f"{source}: '{field_name}.images' folder does not exist: {images_dir}")
        return Split(images=[images_dir], coco_json=json_path)
    entries = raw if isinstance(raw, list) else [raw]
    images: list[Path] = []
    for entry in entries:
        images.extend(list_images(entry, root, source, field_name))
    if not images:
        raise DatasetError(f"{source}: '{field_name}' split holds no images")
    return Split(images=images)


def load_dataset_spec(yaml_path: str | Path) -> DatasetSpec:
    """Read and validate a data YAML; raises :class:`DatasetError` with a one-line reason."""
    source = Path(yaml_path)
    if not source.is_file():
        raise DatasetError(f"{source}: data YAML not found")
    try:
        raw = yaml.safe_load(source.read_text())
    except yaml.YAMLError as error:
        raise DatasetError(f"{source}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise DatasetError(f"{source}: expected a mapping with 'train', 'val' and 'names'")
    root = Path(raw.get("path") or ".")
    root = (root if root.is_absolute() else source.parent / root).resolve()
    if not root.is_dir():
        hint = "; its 'download:' entry is never executed: fetch the data by hand" if raw.get("download") else ""
        raise DatasetError(f"{source}: 'path' folder does not exist: {root}{hint}")
    names = _parse_names(raw.get("names"), source)
    if "nc" in raw and int(raw["nc"]) != len(names):
        raise DatasetError(f"{source}: 'nc' is {raw['nc']} but 'names' lists {len(names)} classes")
    for key in ("train", "val"):
        if not raw.get(key):
            raise DatasetError(f"{source}: '{key}' is missing")
    test = _parse_split(raw["test"], root, source, "test") if raw.get("test") else None
    return DatasetSpec(
        yaml_path=source.resolve(),
        names=names,
        train=_parse_split(raw["train"], root, source, "train"),
        val=_parse_split(raw["val"], root, source, "val"),
        test=test,
        extra={k: v for k, v in raw.items() if k == "download"},
    )
