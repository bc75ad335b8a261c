"""The RAM cache (``--cache``): every image of a split decoded once, resized, in one flat buffer per node.

Each image is stored at the size training reads it (long side ``image_size``), row after row in one uint8
buffer with per-image offsets; the shapes follow from the records' sizes, so the whole size is known before
anything is decoded, and ``--cache auto`` can decide from it.

Under torchrun the processes of a node share one copy: local rank 0 decodes into a memory-mapped file in
the temporary folder (tmpfs or disk, page cache either way) and the other ranks map the same file
read-only once it is complete, so the decision ("does it fit?") counts the bytes once per node and is taken
once, by local rank 0; the others follow what it wrote (a complete file, or none). A single process keeps
the buffer in its own anonymous memory. Loader workers are forked after the cache is filled and read the
same pages (one NumPy buffer: no per-image reference counts to copy).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from detector.data.records import Records

CACHE_RAM_FRACTION = 0.3  # `--cache auto` caches when the images need under this share of the node's free RAM
PREFIX = "detector-image-cache-"


def resized_shapes(records: Records, image_size: int) -> np.ndarray:
    """int64 ``[n, 3]``: each image's ``(height, width, 3)`` once resized to ``image_size`` on its long side
    (the rounding of :meth:`detector.data.dataset.DetectionDataset.load_resized`)."""
    height, width = records.image_hw[:, 0].astype(np.float64), records.image_hw[:, 1].astype(np.float64)
    ratio = image_size / np.maximum(np.maximum(height, width), 1)
    shapes = np.stack([np.round(height * ratio), np.round(width * ratio), np.full_like(height, 3)], 1)
    return np.maximum(shapes, 1).astype(np.int64)


def cache_bytes(records: Records, image_size: int) -> int:
    return int(resized_shapes(records, image_size).prod(1).sum())


def available_ram() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def should_cache(records: Records, image_size: int, mode: str) -> bool:
    """``--cache``: ram always, none never, auto when one copy takes under ``CACHE_RAM_FRACTION`` of free RAM.

    One copy, whatever the number of processes on the node: they share it (see the module's docstring).
    """
    if mode in ("ram", "true", "yes"):
        return True
    if mode != "auto":
        return False
    available = available_ram()
    return available is not None and cache_bytes(records, image_size) < CACHE_RAM_FRACTION * available


class ImageCache:
    """Resized images of one split in one uint8 buffer: ``image(i)`` is a ``[h, w, 3]`` view, no copy."""

    def __init__(self, buffer: np.ndarray, shapes: np.ndarray, *, path: Path | None = None, owner: bool = True):
        self.buffer, self.shapes, self.path, self.owner = buffer, shapes, path, owner
        self.offsets = np.zeros(len(shapes) + 1, np.int64)
        np.cumsum(shapes.prod(1), out=self.offsets[1:])
        self.unreadable = np.zeros(len(shapes), bool)  # images that failed to decode while filling

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])

    def image(self, index: int) -> np.ndarray:
        start, end = self.offsets[index], self.offsets[index + 1]
        return self.buffer[start:end].reshape(tuple(self.shapes[index]))

    def fill(self, load: Callable[[int], np.ndarray], *, threads: int) -> None:
        """Decode every image with ``load(i) -> [h, w, 3]`` into the buffer, in a thread pool (decoding and
        resizing release the GIL)."""

        def store(index: int) -> None:
            try:
                image = load(index)
            except OSError:  # fails to decode: left to the dataset, which replaces it and says so
                self.unreadable[index] = True
                return
            expected = tuple(self.shapes[index])
            if image.shape != expected:  # the header's size and the decoded one disagree: keep the planned shape
                import cv2

                image = cv2.resize(image, (expected[1], expected[0]), interpolation=cv2.INTER_AREA)
            self.buffer[self.offsets[index] : self.offsets[index + 1]] = image.reshape(-1)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(store, range(len(self.shapes))))

    def release_name(self) -> None:
        """Remove the shared file's name once every process of the node has mapped it (the mappings stay)."""
        if self.path is not None and self.owner:
            self.path.unlink(missing_ok=True)
            self.path = None


def shared_cache_path(records: Records, image_size: int, run_id: str) -> Path:
    """The file the node's processes share: named by the run and the split, so no other run can pick it up."""
    key = hashlib.sha1(records.path_bytes.tobytes() + records.image_hw.tobytes())
    key.update(f"{image_size}:{run_id}".encode())
    return Path(tempfile.gettempdir()) / f"{PREFIX}{key.hexdigest()[:20]}.u8"


def build_image_cache(
    records: Records,
    image_size: int,
    load: Callable[[int], np.ndarray],
    *,
    mode: str,
    local_rank: int = 0,
    local_world_size: int = 1,
    run_id: str = "",
    threads: int = 8,
) -> ImageCache | None:
    """The split's cache for this process, or None.

    One process: decide, allocate, fill. Several on the node: local rank 0 decides and writes the shared file
    (called first, see :func:`detector.distributed.local_main_first`); the others map it if it is there.
    """
    shapes = resized_shapes(records, image_size)
    if local_world_size <= 1:
        if not should_cache(records, image_size, mode):
            return None
        cache = ImageCache(np.empty(int(shapes.prod(1).sum()), np.uint8), shapes)
        cache.fill(load, threads=threads)
        return cache
    path = shared_cache_path(records, image_size, run_id)
    if local_rank != 0:
        if not path.is_file():  # local rank 0 decided not to cache, or could not
            return None
        return ImageCache(np.memmap(path, np.uint8, mode="r"), shapes, path=path, owner=False)
    if not should_cache(records, image_size, mode):
        return None
    total = int(shapes.prod(1).sum())
    if os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize < total:
        import warnings

        warnings.warn(f"{path.parent}: no room for the {total / 1e9:.1f} GB image cache the node would share; "
                      "not caching", stacklevel=2)
        return None
    staging = path.with_suffix(".partial")
    try:
        buffer = np.memmap(staging, np.uint8, mode="w+", shape=(max(total, 1),))
        cache = ImageCache(buffer, shapes, path=path)
        cache.fill(load, threads=threads)
        buffer.flush()
        os.replace(staging, path)  # complete: the other ranks may map it now
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return cache
