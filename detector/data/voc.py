"""Pascal VOC (``VOCdevkit/VOC<year>``, XML annotations) -> the YOLO txt layout ``data/VOC.yaml`` reads.

``python -m detector download voc`` extracts each archive into ``<root>/VOC/VOCdevkit`` and then calls
:func:`convert_voc`, which turns every image set the devkit holds (``ImageSets/Main/{trainval,test}.txt``)
into ``images/<set><year>/<id>.jpg`` + ``labels/<set><year>/<id>.txt`` and removes the devkit::

    VOC/VOCdevkit/VOC2007/JPEGImages/000005.jpg  ->  VOC/images/trainval2007/000005.jpg  (hard link)
    VOC/VOCdevkit/VOC2007/Annotations/000005.xml ->  VOC/labels/trainval2007/000005.txt  (class cx cy w h)

Each image set is written into hidden staging folders and renamed into place, so an interrupted
conversion leaves no half-written split; a set whose folder exists is skipped, so running it again is
safe. A malformed XML (also a size or coordinate that is not a finite number) skips its image; what was
skipped is reported as one warning line per kind, naming the first few files
(:mod:`detector.data.problems`). An ``ImageSets`` id that is not a plain file name (``../x``, ``/x``,
``a/b``) would make the conversion read and write outside the devkit: the whole image set is refused,
before anything is written, with one line naming the list file and the line.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path

from detector.data.containment import unsafe_file_name
from detector.data.problems import Problems

# The 20 classes in the standard order (the devkit's, torchvision's and Ultralytics' VOC.yaml); the label
# files use these indices, and data/VOC.yaml lists the same names (tests/data/test_voc.py checks it).
VOC_NAMES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)
IMAGE_SETS = ("trainval", "test")
# What the conversion skips, one summary line per kind (detector/data/problems.py).
MALFORMED = "malformed VOC annotation(s), image skipped"
NOT_A_CLASS = "object(s) of a class not in the names, skipped"
EMPTY_BOX = "object(s) with an empty box, skipped"


class MalformedAnnotation(ValueError):
    """An XML file that cannot be read as a VOC annotation; the message says why."""


class UnsafeImageId(ValueError):
    """An ``ImageSets`` id that is not a plain file name; the message names the list file and the line."""


def _number(element: ElementTree.Element, tag: str) -> float:
    text = element.findtext(tag)
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MalformedAnnotation(f"<{tag}> is {text!r:.40}, not a number") from None
    if not math.isfinite(value):  # float() reads "nan" and "inf"; either would make every box NaN
        raise MalformedAnnotation(f"<{tag}> is {text!r:.40}, not a finite number")
    return value


def yolo_rows(xml_path: Path, names: Sequence[str]) -> tuple[list[str], Problems]:
    """One VOC XML -> (YOLO label lines ``"class cx cy w h"`` normalised by the XML's size, objects skipped).

    VOC boxes are 1-based inclusive pixel indices, so a box covers ``[xmin - 1, xmax]`` in 0-based
    continuous pixels; that span (clipped to the image) is what is normalised.

    ``difficult=1`` objects are skipped, as Ultralytics' VOC conversion does: the VOC protocol ignores
    them in evaluation, and skipping them keeps our labels (and mAP) comparable with Ultralytics' numbers.
    Objects of a class not in ``names`` or with an empty box are skipped and counted. Raises
    :class:`MalformedAnnotation`.
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
    rows, skipped = [], Problems()
    for obj in root.iter("object"):
        name = (obj.findtext("name") or "").strip()
        if (obj.findtext("difficult") or "0").strip() == "1":
            continue
        if name not in names:
            skipped.add(NOT_A_CLASS, f"{xml_path} (object {name!r:.40})")
            continue
        box = obj.find("bndbox")
        if box is None:
            raise MalformedAnnotation(f"object {name!r} has no <bndbox>")
        x0, x1 = max(_number(box, "xmin") - 1, 0.0), min(_number(box, "xmax"), width)
        y0, y1 = max(_number(box, "ymin") - 1, 0.0), min(_number(box, "ymax"), height)
        if x1 <= x0 or y1 <= y0:
            skipped.add(EMPTY_BOX, f"{xml_path} (object {name!r:.40})")
            continue
        cx, cy, w, h = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height
        rows.append(f"{names.index(name)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
    return rows, skipped


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


def read_image_ids(list_file: Path) -> list[str]:
    """The ids an ``ImageSets/Main/<set>.txt`` lists (whitespace-separated, as the devkit writes them).

    Each id becomes a file name in the devkit and in the converted folders, so each must be one plain name:
    one that is not (``..``, a separator, an absolute path) raises :class:`UnsafeImageId` naming the line.
    """
    ids = []
    for number, line in enumerate(list_file.read_bytes().decode("utf-8", "surrogateescape").splitlines(), 1):
        for image_id in line.split():
            reason = unsafe_file_name(image_id)
            if reason:
                raise UnsafeImageId(f"{list_file}:{number}: image id {image_id!r:.80} {reason}; "
                                    "refusing to convert this devkit (nothing was written)")
            ids.append(image_id)
    return ids


def convert_image_set(year_dir: Path, image_set: str, folder: Path, names: Sequence[str]) -> int:
    """``year_dir``'s ``ImageSets/Main/<image_set>.txt`` -> ``folder/{images,labels}/<set><year>``.

    Returns the number of images converted; 0 (and nothing written) when the devkit lists the set but
    holds none of its JPEGs (the set comes with another archive).
    """
    split = split_name(year_dir, image_set)
    image_ids = read_image_ids(year_dir / "ImageSets" / "Main" / f"{image_set}.txt")
    staging = {kind: folder / kind / f".{split}.converting" for kind in ("images", "labels")}
    for path in staging.values():
        shutil.rmtree(path, ignore_errors=True)  # left by an interrupted run
        path.mkdir(parents=True)
    converted = missing = 0
    problems = Problems()
    for image_id in image_ids:
        jpeg = year_dir / "JPEGImages" / f"{image_id}.jpg"
        xml_path = year_dir / "Annotations" / f"{image_id}.xml"
        if not jpeg.is_file():
            missing += 1
            continue
        try:
            rows, skipped = yolo_rows(xml_path, names)
        except MalformedAnnotation as error:
            problems.add(MALFORMED, f"{xml_path} ({error})")
            continue
        problems.extend(skipped)
        (staging["labels"] / f"{image_id}.txt").write_text("".join(f"{row}\n" for row in rows))
        _link(jpeg, staging["images"] / jpeg.name)
        converted += 1
    for line in problems.lines(prefix=f"VOC {split}: "):
        _warn(line)
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
    years = sorted(path for path in devkit.glob("VOC*") if path.is_dir())
    for year_dir in years:  # every list checked before anything is written (the error says nothing was)
        for image_set in IMAGE_SETS:
            if (listing := year_dir / "ImageSets" / "Main" / f"{image_set}.txt").is_file():
                read_image_ids(listing)
    for year_dir in years:
        for image_set in IMAGE_SETS:
            split = split_name(year_dir, image_set)
            listed = (year_dir / "ImageSets" / "Main" / f"{image_set}.txt").is_file()
            if listed and not (folder / "images" / split).exists():
                count = convert_image_set(year_dir, image_set, folder, names)
                if count:
                    print(f"VOC: converted {count} images into {folder / 'images' / split}")
    shutil.rmtree(devkit)
