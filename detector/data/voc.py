"""Pascal VOC (``VOCdevkit/VOC<year>``, XML annotations) -> the YOLO txt layout ``data/VOC.yaml`` reads.

``python -m detector download voc`` extracts each archive into ``<root>/VOC/VOCdevkit`` and then calls
:func:`convert_voc`, which turns every image set the devkit holds (``ImageSets/Main/{trainval,test}.txt``)
into ``images/<set><year>/<id>.jpg`` + ``labels/<set><year>/<id>.txt`` and removes the devkit::

    VOC/VOCdevkit/VOC2007/JPEGImages/000005.jpg  ->  VOC/images/trainval2007/000005.jpg  (hard link)
    VOC/VOCdevkit/VOC2007/Annotations/000005.xml ->  VOC/labels/trainval2007/000005.txt  (class cx cy w h)

Each image set is written into hidden staging folders and renamed into place, so an interrupted
conversion leaves no half-written split; a set whose folder exists is skipped, so running it again is
safe. A malformed XML skips its image with one warning line naming the file.
"""

from __future__ import annotations

import os
import shutil
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path

# The 20 classes in the standard order (the devkit's, torchvision's and Ultralytics' VOC.yaml); the label
# files use these indices, and data/VOC.yaml lists the same names (tests/data/test_voc.py checks it).
VOC_NAMES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)
IMAGE_SETS = ("trainval", "test")


class MalformedAnnotation(ValueError):
    """An XML file that cannot be read as a VOC annotation; the message says why."""


def _number(element: ElementTree.Element, tag: str) -> float:
    text = element.findtext(tag)
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MalformedAnnotation(f"<{tag}> is {text!r}, not a number") from None


def yolo_rows(xml_path: Path, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """One VOC XML -> (YOLO label lines ``"class cx cy w h"`` normalised by the XML's size, notes).

    VOC boxes are 1-based inclusive pixel indices, so a box covers ``[xmin - 1, xmax]`` in 0-based
    continuous pixels; that span (clipped to the image) is what is normalised.

    ``difficult=1`` objects are skipped, as Ultralytics' VOC conversion does: the VOC protocol ignores
    them in evaluation, and skipping them keeps our labels (and mAP) comparable with Ultralytics' numbers.
    Objects of a class not in ``names`` are skipped with a note. Raises :class:`MalformedAnnotation`.
    """
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (ElementTree.ParseError, OSError) as error:
        raise MalformedAnnotation(str(error)) from None
    size = root.find("size")
    if size is None:
        raise MalformedAnnotation("no <size>")
    width, height = _number(size, "width"), _number(size, "height")
    if width <= 0 or height <= 0:
        raise MalformedAnnotation(f"image size {width:g}x{height:g}")
    rows, notes = [], []
    for obj in root.iter("object"):
        name = (obj.findtext("name") or "").strip()
        if (obj.findtext("difficult") or "0").strip() == "1":
            continue
        if name not in names:
            notes.append(f"object {name!r} is not a VOC class")
            continue
        box = obj.find("bndbox")
        if box is None:
            raise MalformedAnnotation(f"object {name!r} has no <bndbox>")
        x0, x1 = max(_number(box, "xmin") - 1, 0.0), min(_number(box, "xmax"), width)
        y0, y1 = max(_number(box, "ymin") - 1, 0.0), min(_number(box, "ymax"), height)
        if x1 <= x0 or y1 <= y0:
            notes.append(f"object {name!r} has an empty box")
            continue
        cx, cy, w, h = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height
        rows.append(f"{names.index(name)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
    return rows, notes


def _link(source: Path, target: Path) -> None:
    """A hard link (no second copy on disk), or a copy where the filesystem has no hard links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def split_name(year_dir: Path, image_set: str) -> str:
    """``VOCdevkit/VOC2007`` + ``trainval`` -> ``trainval2007``: the folder name under ``images``/``labels``."""
    return f"{image_set}{year_dir.name.removeprefix('VOC')}"


def convert_image_set(year_dir: Path, image_set: str, folder: Path, names: Sequence[str]) -> int:
    """``year_dir``'s ``ImageSets/Main/<image_set>.txt`` -> ``folder/{images,labels}/<set><year>``.

    Returns the number of images converted; 0 (and nothing written) when the devkit lists the set but
    holds none of its JPEGs (the set comes with another archive).
    """
    split = split_name(year_dir, image_set)
    image_ids = (year_dir / "ImageSets" / "Main" / f"{image_set}.txt").read_text().split()
    staging = {kind: folder / kind / f".{split}.converting" for kind in ("images", "labels")}
    for path in staging.values():
        shutil.rmtree(path, ignore_errors=True)  # left by an interrupted run
        path.mkdir(parents=True)
    converted = missing = 0
    for image_id in image_ids:
        jpeg = year_dir / "JPEGImages" / f"{image_id}.jpg"
        xml_path = year_dir / "Annotations" / f"{image_id}.xml"
        if not jpeg.is_file():
            missing += 1
            continue
        try:
            rows, notes = yolo_rows(xml_path, names)
        except MalformedAnnotation as error:
            _warn(f"{xml_path}: malformed VOC annotation ({error}); image skipped")
            continue
        if notes:
            _warn(f"{xml_path}: {'; '.join(notes)}; skipped")
        (staging["labels"] / f"{image_id}.txt").write_text("".join(f"{row}\n" for row in rows))
        _link(jpeg, staging["images"] / jpeg.name)
        converted += 1
    if converted == 0 and missing == len(image_ids):
        for path in staging.values():
            shutil.rmtree(path)
        return 0
    if missing:
        _warn(f"{year_dir}: {missing} of the {len(image_ids)} images {image_set}.txt lists have no JPEG; skipped")
    # labels first: the images folder existing is what marks the set as converted (and the archive as done)
    shutil.rmtree(folder / "labels" / split, ignore_errors=True)
    staging["labels"].rename(folder / "labels" / split)
    staging["images"].rename(folder / "images" / split)
    return converted


def convert_voc(folder: Path, names: Sequence[str] = VOC_NAMES) -> None:
    """Convert every image set in ``folder/VOCdevkit`` not converted yet, then delete the devkit."""
    devkit = folder / "VOCdevkit"
    if not devkit.is_dir():
        return
    for year_dir in sorted(path for path in devkit.glob("VOC*") if path.is_dir()):
        for image_set in IMAGE_SETS:
            split = split_name(year_dir, image_set)
            listed = (year_dir / "ImageSets" / "Main" / f"{image_set}.txt").is_file()
            if listed and not (folder / "images" / split).exists():
                count = convert_image_set(year_dir, image_set, folder, names)
                if count:
                    print(f"VOC: converted {count} images into {folder / 'images' / split}")
    shutil.rmtree(devkit)
