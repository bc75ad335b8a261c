"""Data problems, reported as one summary line per kind: a count, and the first few places it was found.

On COCO-sized data a line per box buries the log (BCCD alone has ~60 files with clipped boxes), so every
problem is recorded as ``(kind, where, count)`` and reported once per kind::

    labels: 61 box(es) slightly outside [0, 1], clipped, in 60 file(s): /d/labels/a.txt, /d/labels/b.txt, ... (57 more)

``kind`` is the sentence after the count; ``where`` is a file, optionally with ``:line``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

EXAMPLES = 3  # places named per kind; the rest are counted
# "labels/a.txt:7", "instances.json (annotation 12)", "instances.json (image 3)" and "a.xml (object 'cat')" are
# places in the files "labels/a.txt", "instances.json" and "a.xml"
PLACE_IN_FILE = re.compile(r"(:\d+| \((annotation|image|object) [^)]*\))$")

# The kinds, one constant each, so the parsers, the cache and the tests name them the same way.
UNREADABLE_IMAGE = "unreadable image(s), skipped"
UNREADABLE_LABELS = "image(s) whose label file cannot be read, skipped"
# A label line that cannot be read leaves its image's boxes unknown: training on the rest would teach its object as
# background, and scoring would count a detection of it as a false positive. The image is skipped, as Ultralytics
# skips an image whose label file fails its checks (:data:`SKIPS_IMAGE`).
WRONG_COLUMNS = ("label line(s) neither a box (5 columns) nor a polygon (class and 3 or more x y points): their "
                 "image(s) skipped")
SCORE_COLUMN = ("label line(s) of 6 columns, a box and a score (predict --save-txt --save-conf writes them): their "
                "image(s) skipped; labels for training are written without --save-conf")
NOT_NUMERIC = "label line(s) with a non-numeric or non-finite value: their image(s) skipped"
CLASS_OUT_OF_RANGE = "label line(s) with a class id outside the YAML's names: their image(s) skipped"
# Pixel coordinates (a converter that did not divide by the image's size) land here too: the hint says what to fix.
FAR_OUTSIDE = ("box(es) centred outside the image, larger than it or with a negative size (a YOLO label's centre and "
               "size are fractions 0-1 of the image's width and height, not pixels): their image(s) skipped")
CLIPPED = "box(es) slightly outside [0, 1], clipped"
# A COCO JSON box more than CLIP_TOLERANCE outside its image: kept, clipped to what is inside (pycocotools scores the
# JSON's own box); one wholly outside is clipped to nothing and dropped as zero-area.
CLIPPED_FAR = "box(es) reaching far outside the image, clipped to it"
ZERO_AREA = "zero-area box(es), dropped"
DUPLICATE = "duplicate box(es), removed"
MISSING_IMAGE_ENTRY = "annotation(s) naming an image the JSON does not list, dropped"
UNKNOWN_CATEGORY = "annotation(s) with a category the JSON does not list, dropped"
BAD_BBOX = ("annotation(s) without a valid [x, y, w, h] bbox, dropped from training and scoring (pycocotools run on the "
            "JSON itself counts one of finite numbers as a box no detection can match: its mAP is lower)")
BAD_IMAGE_SIZE = "image(s) listed with a non-positive or non-finite width or height, skipped"
SIDEWAYS_JSON = ("image(s) whose JSON width and height are their upright size turned by 90 degrees (an EXIF "
                 "orientation 5-8 the annotation tool ignored: the boxes would land elsewhere), skipped")
NOT_AN_IMAGE_NAME = "image(s) listed under a name without an image suffix this reader takes (.jpg, .png, ...), skipped"
SKIPS_IMAGE = frozenset({WRONG_COLUMNS, SCORE_COLUMN, NOT_NUMERIC, CLASS_OUT_OF_RANGE, FAR_OUTSIDE})
OTHER_CATEGORY_NAMES = ("JSON(s) whose category names in id order differ from the classes' names (class i is its i-th "
                        "category by id)")


@dataclass
class Problems:
    """Problems found in one split, in the order found."""

    entries: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, where, count)

    def add(self, kind: str, where: str, count: int = 1) -> None:
        if count > 0:
            self.entries.append((kind, where, int(count)))

    def extend(self, other: Problems | Iterable[tuple[str, str, int]]) -> None:
        self.entries.extend(other.entries if isinstance(other, Problems) else other)

    def __len__(self) -> int:
        return len(self.entries)

    def lines(self, prefix: str = "", listed_in: Path | None = None) -> list[str]:
        """One line per kind, in the order each kind was first seen; one naming more places than it shows says
        where all are listed (``listed_in``, :meth:`write_list`)."""
        grouped: dict[str, tuple[int, list[str]]] = {}
        for kind, where, count in self.entries:
            total, places = grouped.get(kind, (0, []))
            if not places or places[-1] != where:
                places.append(where)
            grouped[kind] = (total + count, places)
        out = []
        for kind, (total, places) in grouped.items():
            files = len({PLACE_IN_FILE.sub("", place) for place in places})
            shown = ", ".join(places[:EXAMPLES])
            every = f"; every one in {listed_in}" if listed_in is not None else ""
            more = f", ... ({len(places) - EXAMPLES} more{every})" if len(places) > EXAMPLES else ""
            out.append(f"{prefix}{total} {kind}, in {files} file(s): {shown}{more}")
        return out

    def needs_list(self) -> bool:
        """Whether some kind has more places than its summary line shows."""
        places: dict[str, set[str]] = {}
        for kind, where, _ in self.entries:
            places.setdefault(kind, set()).add(where)
        return any(len(found) > EXAMPLES for found in places.values())

    def write_list(self, path: Path) -> Path:
        """Every place, one line each (``kind: where``, ``x N`` where it counts several), written whole."""
        from detector.files import write_text_atomically

        return write_text_atomically(path, "".join(f"{kind}: {where}{f' x {count}' if count > 1 else ''}\n"
                                                    for kind, where, count in self.entries))

    def warn(self, prefix: str = "", listed_in: Path | None = None) -> None:
        for line in self.lines(prefix, listed_in):
            warnings.warn(line, stacklevel=2)
