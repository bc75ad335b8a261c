"""One split's per-image records, stored flat: a handful of NumPy arrays, no Python object per image.

Loader workers are forked from the training process. A Python object per image (a ``Path``, an array, a
dataclass) would have its reference count written whenever a worker touches it, and each write copies the
page it sits on into that worker: over an epoch every worker ends up with a private copy of the whole
label set (PyTorch's known copy-on-write problem; detectron2 serialises its records into one byte buffer
for the same reason). Here the paths are one byte buffer with offsets, the boxes one ``[N, 5]`` array
with per-image offsets, and the ids and sizes plain arrays: a worker reads them without writing a byte,
so the pages stay shared. The same arrays are what the records cache stores (:mod:`detector.data.cache`).

``records[i]`` builds a small :class:`ImageRecord` view on demand, so code that iterates records reads
as it would over a list.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARRAY_NAMES = ("path_bytes", "path_offsets", "labels", "label_offsets", "image_ids", "image_hw")


@dataclass(frozen=True)
class ImageRecord:
    """One image: its path, its ``[n, 5]`` float32 labels (class, cx, cy, w, h in [0, 1]) and its COCO id
    (the JSON's own, or the image's index in the split for YOLO datasets)."""

    path: Path
    labels: np.ndarray
    image_id: int


class Records(Sequence[ImageRecord]):
    """Every image of a split in flat arrays.

    - ``path_bytes`` uint8 ``[total path bytes]``, ``path_offsets`` int64 ``[n + 1]``: image ``i``'s path is
      ``path_bytes[path_offsets[i]:path_offsets[i + 1]]`` (file-system encoding).
    - ``labels`` float32 ``[N, 5]``, ``label_offsets`` int64 ``[n + 1]``: image ``i``'s boxes.
    - ``image_ids`` int64 ``[n]``; ``image_hw`` int32 ``[n, 2]``: upright (EXIF-applied) height and width in
      pixels, or ``-1`` where not known yet (before the images are checked).
    """

    def __init__(
        self,
        *,
        path_bytes: np.ndarray,
        path_offsets: np.ndarray,
        labels: np.ndarray,
        label_offsets: np.ndarray,
        image_ids: np.ndarray,
        image_hw: np.ndarray,
    ) -> None:
        self.path_bytes = np.ascontiguousarray(path_bytes, np.uint8)
        self.path_offsets = np.ascontiguousarray(path_offsets, np.int64)
        self.labels = np.ascontiguousarray(labels, np.float32).reshape(-1, 5)
        self.label_offsets = np.ascontiguousarray(label_offsets, np.int64)
        self.image_ids = np.ascontiguousarray(image_ids, np.int64)
        self.image_hw = np.ascontiguousarray(image_hw, np.int32).reshape(-1, 2)
        count = len(self.image_ids)
        if not (len(self.path_offsets) == len(self.label_offsets) == count + 1 and len(self.image_hw) == count):
            raise ValueError("records: offsets, ids and sizes disagree on the number of images")

    @classmethod
    def from_lists(
        cls,
        paths: Sequence[Path],
        labels: Sequence[np.ndarray],
        image_ids: Sequence[int],
        image_hw: Sequence[tuple[int, int]] | np.ndarray | None = None,
    ) -> Records:
        """Pack per-image lists (as parsed) into the flat form."""
        encoded = [os.fsencode(path) for path in paths]
        path_offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=path_offsets[1:])
        arrays = [np.asarray(a, np.float32).reshape(-1, 5) for a in labels]
        label_offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([len(a) for a in arrays], out=label_offsets[1:])
        hw = np.full((len(encoded), 2), -1, np.int32) if image_hw is None else np.asarray(image_hw, np.int32)
        return cls(
            path_bytes=np.frombuffer(b"".join(encoded), np.uint8),
            path_offsets=path_offsets,
            labels=np.concatenate(arrays) if arrays else np.zeros((0, 5), np.float32),
            label_offsets=label_offsets,
            image_ids=np.asarray(image_ids, np.int64),
            image_hw=hw.reshape(-1, 2),
        )

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Records:
        return cls(**{name: arrays[name] for name in ARRAY_NAMES})

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAY_NAMES}

    def __len__(self) -> int:
        return len(self.image_ids)

    def path(self, index: int) -> Path:
        start, end = self.path_offsets[index], self.path_offsets[index + 1]
        return Path(os.fsdecode(self.path_bytes[start:end].tobytes()))

    def labels_of(self, index: int) -> np.ndarray:
        """Image ``index``'s ``[n, 5]`` labels: a view into the flat array (copy it before changing it)."""
        return self.labels[self.label_offsets[index] : self.label_offsets[index + 1]]

    def class_counts(self, num_classes: int) -> np.ndarray:
        """int64 ``[num_classes]``: boxes per class id."""
        return np.bincount(self.labels[:, 0].astype(np.int64), minlength=num_classes)[:num_classes]

    def box_counts(self) -> np.ndarray:
        """int64 ``[n]``: boxes per image."""
        return np.diff(self.label_offsets)

    def __getitem__(self, index: int) -> ImageRecord:  # type: ignore[override]
        if not isinstance(index, (int, np.integer)):
            raise TypeError("records[i] takes one index; use select() for a subset")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range for {len(self)} images")
        return ImageRecord(self.path(index), self.labels_of(index), int(self.image_ids[index]))

    def __iter__(self) -> Iterator[ImageRecord]:
        return (self[i] for i in range(len(self)))

    def paths(self) -> list[Path]:
        return [self.path(i) for i in range(len(self))]

    def select(self, indices: np.ndarray | Sequence[int]) -> Records:
        """The records at ``indices`` (in that order), packed anew."""
        indices = np.asarray(indices, np.int64)
        path_parts = [self.path_bytes[self.path_offsets[i] : self.path_offsets[i + 1]] for i in indices]
        path_offsets = np.zeros(len(indices) + 1, np.int64)
        np.cumsum([len(p) for p in path_parts], out=path_offsets[1:])
        counts = self.box_counts()[indices]
        label_offsets = np.zeros(len(indices) + 1, np.int64)
        np.cumsum(counts, out=label_offsets[1:])
        rows = (
            np.concatenate([np.arange(self.label_offsets[i], self.label_offsets[i + 1]) for i in indices])
            if counts.sum()
            else np.zeros(0, np.int64)
        )
        return Records(
            path_bytes=np.concatenate(path_parts) if path_parts else np.zeros(0, np.uint8),
            path_offsets=path_offsets,
            labels=self.labels[rows],
            label_offsets=label_offsets,
            image_ids=self.image_ids[indices],
            image_hw=self.image_hw[indices],
        )

    def with_rows(self, keep: np.ndarray) -> Records:
        """The same images with only the label rows where ``keep`` (bool ``[N]``) is true."""
        image_of_row = np.repeat(np.arange(len(self)), self.box_counts())
        counts = np.bincount(image_of_row[keep], minlength=len(self))
        label_offsets = np.zeros(len(self) + 1, np.int64)
        np.cumsum(counts, out=label_offsets[1:])
        return Records.from_arrays({**self.arrays(), "labels": self.labels[keep], "label_offsets": label_offsets})

    def inconsistency(self, num_classes: int) -> str:
        """What in these arrays the scan could not have written, in a few words; "" when nothing. The records cache
        is checked so when it is read back (:mod:`detector.data.scan`): the label parser's own guarantees (class ids
        that the names hold, finite boxes inside the image) and offsets that cut the flat arrays into images."""
        for what, offsets, total in (("path", self.path_offsets, len(self.path_bytes)),
                                     ("label", self.label_offsets, len(self.labels))):
            if offsets[0] != 0 or offsets[-1] != total or bool((np.diff(offsets) < 0).any()):
                return f"its {what} offsets do not cut its {what}s into images"
        labels = self.labels
        if not np.isfinite(labels).all():
            return "a box that is not finite"
        classes = labels[:, 0]
        if bool(((classes != np.floor(classes)) | (classes < 0) | (classes >= num_classes)).any()):
            return f"a class id outside 0..{num_classes - 1}"
        if bool((labels[:, 1:] < 0).any() or (labels[:, 1:] > 1).any() or (labels[:, 3:] <= 0).any()):
            return "a box outside the image or of no size"
        if not bool(((self.image_hw == -1).all(1) | (self.image_hw >= 1).all(1)).all()):
            return "an image size that is neither unknown nor positive"
        if len(np.unique(self.image_ids)) != len(self):
            return "an image id given twice"
        return ""

    def hw_list(self) -> list[tuple[int, int]]:
        """Upright ``(height, width)`` per image, as Python ints."""
        return [(int(h), int(w)) for h, w in self.image_hw]
