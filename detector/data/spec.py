"""Data YAML -> a resolved :class:`DatasetSpec` (image lists, class names, optional COCO JSON).

Accepts Ultralytics-style YAMLs::

    path: ../datasets/coco128   # root; relative paths resolve against the YAML's own folder
    train: images/train2017     # a folder, a list of folders, or a .txt file of image paths
    val: images/train2017
    names: {0: person, 1: bicycle}   # or a list

and COCO-JSON datasets, where a split is a mapping naming the JSON and the image folder::

    train: {json: annotations/instances_train2017.json, images: images/train2017}

``relative_to: datasets`` makes a relative ``path`` resolve against the datasets root instead of the
YAML's folder (the shipped YAMLs do this; see :mod:`detector.data.catalog`). ``yaml_path`` may also be
the name of a shipped YAML (``coco``, ``coco.yaml``). ``generate: shapes`` (the shipped ``shapes.yaml``) makes
the built-in synthetic set in ``path`` first, if it is not there (:mod:`detector.data.synthetic`).

YAMLs are read with ``yaml.safe_load``; a ``download:`` entry is never executed.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from detector.data.containment import lexically_inside
from detector.data.catalog import (
    DATASETS_ENV,
    datasets_root,
    datasets_root_source,
    download_hint,
    fetching_command,
    resolve_data_yaml,
    shipped_yaml_dir,
    shipped_yaml_names,
)
from detector.data.synthetic import write_shapes
from detector.files import folder_files

# What Pillow decodes (.mpo: a phone's multi-picture JPEG, its first picture; .jp2 and .avif where the Pillow build has
# them, else the scan names the file as unreadable), as Ultralytics' list less HEIC/HEIF and DNG (they need other
# packages): those are named once instead of left out without a word (:data:`UNREAD_IMAGE_SUFFIXES`).
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".jpe", ".jfif", ".mpo", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2", ".avif"}
UNREAD_IMAGE_SUFFIXES = {".heic", ".heif", ".dng"}


class DatasetError(ValueError):
    """A dataset YAML or split that cannot be used; the message names the file and the field."""


@dataclass
class Split:
    images: list[Path]
    coco_json: Path | None = None  # labels come from this JSON instead of YOLO txt files
    # What the YAML named for this split (folders, .txt lists, images, or the JSON): the records cache is
    # kept beside the first of them (detector/data/scan.py).
    sources: list[Path] = field(default_factory=list)
    fraction: float = 1.0  # the share of its images a run takes, the first ones (train --fraction)


# The one class of a single-class run (train --single-cls), named as Ultralytics names it.
SINGLE_CLASS_NAME = "item"


@dataclass
class DatasetSpec:
    yaml_path: Path
    names: list[str]
    train: Split
    val: Split
    test: Split | None = None
    test_problem: str | None = None  # why the YAML's 'test' split cannot be read, said when it is asked for
    extra: dict = field(default_factory=dict)
    # The YAML's own names where ``names`` was collapsed to one class (:func:`single_class`): the label files'
    # class ids are checked against these, then every box becomes class 0.
    label_names: list[str] | None = None
    # Only these class ids' boxes are trained on and scored (train --classes); None: every class.
    include_classes: tuple[int, ...] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.names)


def only_classes(spec: DatasetSpec, classes: tuple[int, ...]) -> DatasetSpec:
    """``spec`` with only ``classes``' boxes, in training and in the ground truth (Ultralytics' ``classes``); the
    class ids and names stay as they are. ``DatasetError`` for an id the YAML does not name."""
    names = spec.label_names or spec.names
    if unknown := [index for index in classes if not 0 <= index < len(names)]:
        raise DatasetError(f"{spec.yaml_path}: --classes {' '.join(map(str, unknown))}: its names hold class ids "
                           f"0 to {len(names) - 1}")
    return dataclasses.replace(spec, include_classes=tuple(sorted(set(classes))))


def single_class(spec: DatasetSpec) -> DatasetSpec:
    """``spec`` as one class, ``item`` (Ultralytics' ``single_cls``): every box of every class counts as it, in
    training and in the ground truth scored against."""
    if spec.label_names is not None:
        return spec
    return dataclasses.replace(spec, names=[SINGLE_CLASS_NAME], label_names=list(spec.names))


def _text(value: object, source: Path, key: str) -> str:
    """A YAML value that names a path: text (a bare number such as ``2024`` is read as its text)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise DatasetError(f"{source}: '{key}' must be a path (text), got {type(value).__name__} {value!r:.60}")


def _first_few(values: Sequence[object], limit: int) -> str:
    """``a, b, c, ...``: the first ``limit`` values, the dots only where some are left out."""
    return ", ".join(map(str, values[:limit])) + (", ..." if len(values) > limit else "")


def _class_id(key: object) -> int | None:
    """A ``names`` mapping's key as a class id: a whole number, or its digits as text (Ultralytics reads both with
    ``int(k)``); None for anything else (``1.5``, which int() would cut to 1, text that is not digits, a bool)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return None


def _class_name(value: object, source: Path, index: int) -> str:
    """A class name as text: YAML text or a number (``names: [2020, 2021]``); a list, a mapping or null (an alias
    bomb's lists made 25 MB names once turned into text; ``[a, null, b]`` named class 1 'None') is refused."""
    if isinstance(value, bool):  # YAML reads yes/no/on/off/true/false as booleans: 'True' is not what was written
        raise DatasetError(f"{source}: 'names' class {index} is the boolean {value} (YAML reads yes, no, on, off, "
                           "true and false so): put the name in quotes")
    if isinstance(value, (str, int, float)):
        return str(value)
    kind = "null" if value is None else {list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)
    raise DatasetError(f"{source}: 'names' class {index} is {kind}, not a name: each class name must be text")


def _parse_names(raw: object, source: Path) -> list[str]:
    if isinstance(raw, list) and raw:
        names = [_class_name(name, source, index) for index, name in enumerate(raw)]
    elif isinstance(raw, dict) and raw:
        by_id: dict[int, object] = {}
        for key, value in raw.items():
            class_id = _class_id(key)
            if class_id is None:
                raise DatasetError(f"{source}: 'names' key {key!r:.40} is not a class id (0, 1, 2, ...)")
            if class_id in by_id:
                raise DatasetError(f"{source}: 'names' gives class {class_id} twice (keys {class_id} and {key!r:.40})")
            by_id[class_id] = value
        if missing := sorted(set(range(len(by_id))) - set(by_id)):
            raise DatasetError(f"{source}: 'names' keys must be the class ids 0..{len(by_id) - 1} without gaps; no "
                               f"name for {_first_few(missing, 5)} (keys given: {_first_few(sorted(by_id), 10)})")
        names = [_class_name(by_id[index], source, index) for index in range(len(by_id))]
    else:
        raise DatasetError(f"{source}: 'names' is missing or empty (a list or a {{id: name}} mapping is needed)")
    if repeated := sorted(name for name, count in collections.Counter(names).items() if count > 1):
        print(f"warning: {source}: 'names' gives {_first_few([repr(name)[:40] for name in repeated], 3)} to several "
              "classes: their results are told apart only by class id", file=sys.stderr)
    return names


def _coco_names(splits: Sequence[Split], source: Path) -> list[str]:
    """A YAML without ``names``: its COCO JSON's category names in id order (the order the label reader maps ids to
    classes in), from the first split that has one (val's first: COCO's val JSON is 1/18 of train's, and the scan
    reads it again); without a COCO split, the missing ``names`` error."""
    json_path = next((split.coco_json for split in splits if split.coco_json is not None), None)
    if json_path is None:
        return _parse_names(None, source)
    missing = f"list the classes as 'names' in {source.name}"
    try:
        coco = json.loads(json_path.read_bytes())
    except (OSError, ValueError, RecursionError) as error:
        raise DatasetError(f"{json_path}: cannot read COCO JSON for the class names ({str(error)[:200]})") from None
    categories = coco.get("categories") if isinstance(coco, dict) else None
    try:
        ordered = sorted(categories, key=lambda category: int(category["id"]))  # type: ignore[arg-type]
        names = [category["name"] for category in ordered]
    except (KeyError, TypeError, ValueError):
        raise DatasetError(f"{json_path}: its 'categories' give no id and name each to take the class names from; "
                           f"{missing}") from None
    if not names or not all(isinstance(name, str) and name for name in names):
        raise DatasetError(f"{json_path}: its 'categories' give no class names; {missing}")
    return names


def list_images(entry: str | Path, root: Path, source: Path, field_name: str) -> list[Path]:
    """A folder, a .txt list of image paths, or a single image -> sorted image paths."""
    path = Path(entry)
    path = path if path.is_absolute() else root / path
    if not path.exists() and isinstance(entry, str) and entry.startswith("../") and (root / entry[3:]).exists():
        # Roboflow's exports write 'train: ../train/images' beside a YAML in the dataset's own folder: Ultralytics
        # reads such a path inside the dataset folder when it is not found above it, and so does this.
        path = root / entry[3:]
    if path.is_dir():
        not_files: list[Path] = []
        files = [p for p in folder_files(path, not_files) if p.suffix.lower() in IMAGE_SUFFIXES | UNREAD_IMAGE_SUFFIXES]
        if broken := [p for p in not_files if p.suffix.lower() in IMAGE_SUFFIXES]:
            print(f"warning: {source.name} '{field_name}': {len(broken)} image name(s) in {path} that are not files (a "
                  f"link whose target is gone?) left out: {_first_few(broken, 3)}", file=sys.stderr)
        if unread := sorted({p.suffix.lower() for p in files} & UNREAD_IMAGE_SUFFIXES):
            count = sum(p.suffix.lower() in UNREAD_IMAGE_SUFFIXES for p in files)
            print(f"warning: {source.name} '{field_name}': {count} {'/'.join(unread)} image(s) in {path} left out "
                  "(not read here: convert them to JPEG or PNG)", file=sys.stderr)
        return sorted(p for p in files if p.suffix.lower() in IMAGE_SUFFIXES)
    if path.suffix.lower() == ".txt" and path.is_file():
        return _read_image_list(path, root)
    if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        return [path]
    if path.is_file():
        raise DatasetError(f"{source}: '{field_name}' is neither a folder of images, an image nor a .txt list of "
                           f"image paths: {path}")
    raise DatasetError(f"{source}: '{field_name}' path does not exist: {path}")


def _read_image_list(listing: Path, root: Path) -> list[Path]:
    """A ``.txt`` list of image paths, one a line.

    An absolute line is taken as written (Ultralytics' lists often hold them, and the list is the user's own
    file). A relative line resolves against the list's folder and must stay, once ``..`` is folded (reading a
    backslash as a separator too), inside the dataset root or the list's own folder: one that climbs out is
    refused naming the list and the line. Links are not followed for this check (a dataset may link its
    images from elsewhere; its list's own text may not climb out).
    Bytes that are not UTF-8 are kept as the file system's own (``surrogateescape``), as ``os.listdir`` does.
    """
    images = []
    folders = [root, listing.parent.absolute()]
    for number, line in enumerate(listing.read_bytes().decode("utf-8", "surrogateescape").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if "\x00" in line:
            raise DatasetError(f"{listing}:{number}: image path holds a NUL byte")
        image = Path(line)
        if not image.is_absolute():
            # A backslash is a separator on Windows: a line must stay inside read either way.
            if not all(lexically_inside(listing.parent.absolute() / text, folders)
                       for text in (line, line.replace("\\", "/"))):
                raise DatasetError(f"{listing}:{number}: image path {line!r:.80} climbs out of the dataset "
                                   f"folder {root} (write it inside, or as an absolute path)")
            # Folded, not resolved: a linked image keeps the path its label is found beside (images/ -> labels/).
            image = Path(os.path.normpath(listing.parent.absolute() / image))
        images.append(image)
    return images


def _parse_split(raw: object, root: Path, source: Path, field_name: str, hint: str = "") -> Split:
    if isinstance(raw, dict):
        if "json" not in raw or "images" not in raw:
            raise DatasetError(f"{source}: '{field_name}' mapping needs both 'json' and 'images'")
        json_name = _text(raw["json"], source, f"{field_name}.json")
        json_path = Path(json_name) if Path(json_name).is_absolute() else root / json_name
        if not json_path.is_file():
            raise DatasetError(f"{source}: '{field_name}.json' does not exist: {json_path}{hint}")
        images_name = _text(raw["images"], source, f"{field_name}.images")
        images_dir = Path(images_name) if Path(images_name).is_absolute() else root / images_name
        if not images_dir.is_dir():
            raise DatasetError(f"{source}: '{field_name}.images' folder does not exist: {images_dir}{hint}")
        return Split(images=[images_dir], coco_json=json_path, sources=[json_path])
    if isinstance(raw, list) and any(isinstance(entry, dict) for entry in raw):
        raise DatasetError(f"{source}: '{field_name}' lists several COCO JSON splits; a split is one {{json, images}} "
                           "mapping: merge the JSONs into one (with distinct image ids)")
    entries = [_text(entry, source, field_name) for entry in (raw if isinstance(raw, list) else [raw])]
    images: list[Path] = []
    sources = [Path(entry) if Path(entry).is_absolute() else root / entry for entry in entries]
    for entry in entries:
        try:
            images.extend(list_images(entry, root, source, field_name))
        except DatasetError as error:
            raise DatasetError(f"{error}{hint}") from None
    if not images:
        raise DatasetError(f"{source}: '{field_name}' split holds no images")
    return Split(images=images, sources=sources)


ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
# scheme:// as RFC 3986 spells a scheme, two letters at least so that C:/data.yaml stays a path (Path() folds the
# double slash: https:/host/...)
URL_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def _refuse_url_or_archive(typed: str | Path) -> None:
    """One line for a URL or an archive given as the data YAML: the URL's lost slash ("https:/host...: data YAML
    not found") and the zip's bytes ("not UTF-8 text") said nothing useful."""
    text = str(typed)
    url = URL_PREFIX.match(text) is not None
    if not url and not text.lower().endswith(ARCHIVE_SUFFIXES):
        return
    filename = text.rstrip("/").rsplit("/", 1)[-1]
    known = fetching_command(filename)
    if url:
        what = "a URL; data is read from local files only, nothing is downloaded"
        instead = ("download it and pass the file" if filename.lower().endswith((".yaml", ".yml"))
                   else "download and unzip it, then pass the data YAML it holds")
    else:
        what = "an archive; data is not read from inside one"
        instead = "unzip it and pass the data YAML it holds"
    if known is not None:
        where = " (it reads an archive already in the datasets root instead of fetching it)" if not url else ""
        instead = f"fetch the dataset with {known[0]}{where}, then pass --data {known[1]}"
    raise DatasetError(f"{text}: {what}: {instead}")


def _read_yaml(source: Path) -> dict:
    if not source.is_file():
        # Ultralytics' names for sets we do not ship that have a shipped neighbour here.
        nearest = {"coco8-grayscale": "coco8", "voc2007": "VOC", "voc2012": "VOC"}.get(
            source.stem.lower()) if len(source.parts) == 1 else None
        hint = f"; did you mean {nearest}?" if nearest else ""
        raise DatasetError(f"{source}: data YAML not found (nor a shipped one in {shipped_yaml_dir()}: "
                           f"{', '.join(shipped_yaml_names())}){hint}")
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise DatasetError(f"{source}: not valid YAML ({str(error).splitlines()[0]})") from None
    except UnicodeDecodeError as error:
        raise DatasetError(f"{source}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                           f"{error.start}): save it as UTF-8") from None
    except OSError as error:
        raise DatasetError(f"{source}: cannot read the data YAML ({error.strerror or error})") from None
    if not isinstance(raw, dict):
        raise DatasetError(f"{source}: expected a mapping with 'train', 'val' and 'names'")
    return raw


def _dataset_root(raw: dict, source: Path, datasets_dir: str | Path | None) -> tuple[Path, str]:
    """The dataset folder ``path`` names, and the download hint for paths missing under it."""
    relative_to = raw.get("relative_to", "yaml")
    if relative_to not in ("yaml", "datasets"):
        raise DatasetError(f"{source}: 'relative_to' must be 'yaml' or 'datasets' (got {relative_to!r})")
    in_datasets = relative_to == "datasets"
    base = datasets_root(datasets_dir) if in_datasets else source.parent
    typed = Path(_text(raw.get("path") or ".", source, "path"))
    root = (typed if typed.is_absolute() else base / typed).resolve()
    if (generator := raw.get("generate")) is not None:  # the built-in set: generated, never downloaded
        if generator != "shapes":
            raise DatasetError(f"{source}: 'generate' can only be 'shapes' (the built-in set), got {generator!r}")
        try:
            write_shapes(root)
        except OSError as error:  # a read-only or full datasets root: say where, and how to choose another
            raise DatasetError(f"{source}: cannot generate the built-in set into {root} ({error.strerror or error}); "
                               f"choose another datasets root with --datasets-dir or ${DATASETS_ENV}") from None
    hint = download_hint(root, base.resolve()) if in_datasets else ""
    if not root.is_dir() and not in_datasets and not typed.is_absolute():
        # Ultralytics resolves a relative 'path' under its datasets folder: its own YAMLs (path: coco128,
        # path: ../datasets/coco128) work here once the data sits under our datasets root.
        elsewhere = (datasets_root(datasets_dir) / typed).resolve()
        if elsewhere.is_dir():
            print(f"note: {source}: 'path' {typed} is not beside the YAML; using {elsewhere} under the datasets root, "
                  "as Ultralytics does (add 'relative_to: datasets' to the YAML to say so)", file=sys.stderr)
            return elsewhere, download_hint(elsewhere, datasets_root(datasets_dir).resolve())
    if not root.is_dir():
        where = f" (datasets root {base}, {datasets_root_source(datasets_dir)})" if in_datasets else ""
        if not in_datasets and not typed.is_absolute():
            where = (f" (a relative 'path' is read from the YAML's folder, then under the datasets root "
                     f"{datasets_root(datasets_dir)}, not from the folder the command runs in")
            where += f"; {typed.resolve()} is there: write it as an absolute path)" if typed.is_dir() else ")"
        never = "; its 'download:' entry is never executed: fetch the data by hand" if raw.get("download") else ""
        raise DatasetError(f"{source}: 'path' folder does not exist: {root}{where}{hint or never}")
    return root, hint


def load_dataset_spec(yaml_path: str | Path, *, datasets_dir: str | Path | None = None) -> DatasetSpec:
    """Read and validate a data YAML (a path or a shipped YAML's name); raises :class:`DatasetError`.

    ``datasets_dir`` is the datasets root for ``relative_to: datasets`` YAMLs (default: see
    :func:`detector.data.catalog.datasets_root`). Every error is one line naming the file and field.
    """
    _refuse_url_or_archive(yaml_path)
    source = resolve_data_yaml(yaml_path)
    raw = _read_yaml(source)
    root, hint = _dataset_root(raw, source, datasets_dir)
    if not raw.get("val") and raw.get("validation"):  # some exported datasets' key; Ultralytics renames it too
        print(f"warning: {source}: 'validation' read as 'val'", file=sys.stderr)
        raw["val"] = raw["validation"]
    for key in ("train", "val"):
        if not raw.get(key):
            raise DatasetError(f"{source}: '{key}' is missing")
    if raw.get("channels", 3) != 3:  # Ultralytics 8.4's grayscale (1) or multispectral datasets
        print(f"note: {source}: 'channels: {raw['channels']}' is read as 3: images are decoded to RGB (a gray image's "
              "one channel repeated), and the model takes 3 channels", file=sys.stderr)
    train = _parse_split(raw["train"], root, source, "train", hint)
    val = _parse_split(raw["val"], root, source, "val", hint)
    if "nc" in raw and (not isinstance(raw["nc"], int) or isinstance(raw["nc"], bool) or raw["nc"] < 1):
        raise DatasetError(f"{source}: 'nc' must be a whole number of classes, got {raw['nc']!r:.60}")
    if raw.get("names"):
        names = _parse_names(raw["names"], source)
    elif "nc" in raw and not any(split.coco_json for split in (val, train)):
        # As Ultralytics names them: the run trains, and its results say which classes had no name.
        names = [f"class_{index}" for index in range(raw["nc"])]
        print(f"warning: {source}: no 'names', so its {raw['nc']} classes are named class_0 .. class_{raw['nc'] - 1}; "
              "list them as 'names' for readable results", file=sys.stderr)
    else:
        names = _coco_names((val, train), source)
    if "nc" in raw and raw["nc"] != len(names):
        raise DatasetError(f"{source}: 'nc' is {raw['nc']} but 'names' lists {len(names)} classes")
    test, test_problem = None, None
    try:  # needed only by val --split test: a 'test' folder that is missing (Roboflow's exports) must not stop training
        test = _parse_split(raw["test"], root, source, "test", hint) if raw.get("test") else None
    except DatasetError as error:
        test_problem = str(error)
    return DatasetSpec(
        yaml_path=source.resolve(),
        names=names,
        train=train,
        val=val,
        test=test,
        test_problem=test_problem,
        extra={k: v for k, v in raw.items() if k == "download"},
    )


def load_split(yaml_path: str | Path, split: str, *, datasets_dir: str | Path | None = None) -> Split:
    """One split of a data YAML, for checking part of a dataset (``download coco --split val``)."""
    _refuse_url_or_archive(yaml_path)
    source = resolve_data_yaml(yaml_path)
    raw = _read_yaml(source)
    root, hint = _dataset_root(raw, source, datasets_dir)
    if not raw.get(split):
        raise DatasetError(f"{source}: '{split}' is missing")
    return _parse_split(raw[split], root, source, split, hint)
