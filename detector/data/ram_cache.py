"""The RAM cache (``--cache``): every image of a split decoded once, resized, in one flat buffer per node.

Each image is stored at the size training reads it (long side ``image_size``), row after row in one uint8
buffer with per-image offsets; the shapes follow from the records' sizes, so the whole size is known before
anything is decoded, and ``--cache auto`` can decide from it.

Under torchrun the processes of a node share one copy: local rank 0 decodes into a memory-mapped file in a
private folder of the temporary folder (tmpfs or disk, page cache either way) and the other ranks map the
same file read-only once it is complete, so the decision ("does it fit?") counts the bytes once per node and is taken
once, by local rank 0; the others follow what it wrote (a complete file, or none). A single process keeps
the buffer in its own anonymous memory. Loader workers are forked after the cache is filled and read the
same pages (one NumPy buffer: no per-image reference counts to copy).

The shared file holds the training images, so it is private: local rank 0 creates its folder with ``mkdir``
mode 0700 (which fails if the name exists: no one else's folder is ever used), the file inside with
``O_CREAT | O_EXCL | O_NOFOLLOW`` mode 0600, and every rank checks the folder (a real directory, not a link,
owned by this user, no access for group or others) and opens the file with ``O_NOFOLLOW`` before mapping it.
Every rank of the node computes the same path from the launch (``run_id``), the split and the user id, so no
message has to carry it; someone who takes that name first only turns the cache off, with a warning.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import warnings
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

                from detector.data.letterbox import RESIZE_INTERPOLATION

                image = cv2.resize(image, (expected[1], expected[0]), interpolation=RESIZE_INTERPOLATION)
            self.buffer[self.offsets[index] : self.offsets[index + 1]] = image.reshape(-1)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(store, range(len(self.shapes))))

    def release_name(self) -> None:
        """Remove the shared file's name and its private folder once every process of the node has mapped it
        (the mappings stay)."""
        if self.path is not None and self.owner:
            self.path.unlink(missing_ok=True)
            try:
                self.path.parent.rmdir()
            except OSError:
                pass  # not empty (a staging file of a failed fill) or already gone: left for the next run to reuse
            self.path = None


def shared_cache_path(records: Records, image_size: int, run_id: str) -> Path:
    """The file the node's processes share, in its private folder: named by the user, the run and the split, so
    no other run can pick it up."""
    key = hashlib.sha1(records.path_bytes.tobytes() + records.image_hw.tobytes())
    key.update(f"{image_size}:{run_id}".encode())
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}{os.getuid()}-{key.hexdigest()[:20]}"
    return folder / "images.u8"


def private_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a safe home for the cache, or None: it must be a real directory (not a symlink),
    owned by this user, with no permission for group or others."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return "does not exist"
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink, not a folder"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.getuid():
        return f"belongs to user {info.st_uid}, not to this process's user {os.getuid()}"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"has mode {stat.S_IMODE(info.st_mode):o}, not 700"
    return None


def claim_private_folder(folder: Path) -> str | None:
    """Create ``folder`` with mode 0700 (``mkdir`` fails if the name exists, so nothing is ever taken over); a folder
    left by an earlier run of ours is reused once :func:`private_folder_problem` clears it. -> the problem, or None."""
    try:
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask, which may only remove bits; be exact
        return None
    except FileExistsError:
        return private_folder_problem(folder)


def open_private(path: Path, *, create: bool) -> int:
    """A file descriptor on ``path`` that never follows a symlink: created exclusively (mode 0600) or read-only."""
    flags = os.O_NOFOLLOW | (os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDONLY)
    return os.open(path, flags, 0o600)


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
        return _map_shared(path, shapes)
    if not should_cache(records, image_size, mode):
        return None
    total = int(shapes.prod(1).sum())
    if os.statvfs(path.parent.parent).f_bavail * os.statvfs(path.parent.parent).f_frsize < total:
        warnings.warn(f"{path.parent.parent}: no room for the {total / 1e9:.1f} GB image cache the node would share; "
                      "not caching", stacklevel=2)
        return None
    if problem := claim_private_folder(path.parent):
        warnings.warn(f"{path.parent}: {problem}; not caching images in it", stacklevel=2)
        return None
    staging = path.with_suffix(".partial")
    staging.unlink(missing_ok=True)  # a failed fill of an earlier run of ours (the folder is ours: checked above)
    path.unlink(missing_ok=True)
    try:
        with os.fdopen(open_private(staging, create=True), "w+b") as file:
            buffer = np.memmap(file, np.uint8, mode="w+", shape=(max(total, 1),))
        cache = ImageCache(buffer, shapes, path=path)
        cache.fill(load, threads=threads)
        buffer.flush()
        os.replace(staging, path)  # complete: the other ranks may map it now
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return cache


def _map_shared(path: Path, shapes: np.ndarray) -> ImageCache | None:
    """What local rank 0 wrote, mapped read-only after checking its folder; None when it did not cache."""
    if private_folder_problem(path.parent) is not None:  # no folder (rank 0 did not cache), or not a private one
        return None
    try:
        descriptor = open_private(path, create=False)
    except FileNotFoundError:  # local rank 0 decided not to cache, or could not
        return None
    except OSError as error:  # ELOOP: a symlink where the file should be
        warnings.warn(f"{path}: not opened ({error.strerror}); not using the shared image cache", stacklevel=3)
        return None
    with os.fdopen(descriptor, "rb") as file:
        return ImageCache(np.memmap(file, np.uint8, mode="r"), shapes, path=path, owner=False)
