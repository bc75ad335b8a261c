"""``--cache disk``: the RAM cache's buffer (:mod:`detector.data.ram_cache`) as a file kept with the dataset, filled
once and mapped by every later run (Ultralytics' ``cache='disk'``, which keeps a ``.npy`` per image instead).

The file holds every image of a split decoded and resized to the run's size, row after row, then one byte per
image saying whether it failed to decode (the dataset then reads that one from its file, and says so). Its name
carries a fingerprint of the split's images (paths, recorded sizes, each file's size and modification time), the
image size and :data:`PIXELS_VERSION`, so a changed image, another ``--imgsz``, another subset or another way of
resizing is another file; nothing stale is read.
Pages come from the operating system's page cache: a split larger than the RAM is read from the disk image by
image, still without decoding a JPEG, and every process of the node (torchrun, the loader workers) shares them.

It is written as ``<name>.partial`` and renamed once complete, so a run killed while filling it leaves no file a
later run would trust; it lives beside the split's first source, else (a read-only dataset) in the user's cache
folder, like the records cache (:func:`detector.data.scan.cache_locations`). A full disk or no writable place is
one warning, and the run goes on without the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock (see filling)
    fcntl = None

import numpy as np

from detector.data.letterbox import RESIZE_INTERPOLATION
from detector.data.ram_cache import ImageCache, resized_shapes
from detector.data.records import Records
from detector.data.scan import SUFFIX as RECORDS_SUFFIX

SUFFIX = ".images.u8"
# How the stored pixels are made from a file, in the fingerprint with the interpolation itself: bump it whenever the
# same image at the same size would be stored with other pixels, so no file of the old kind is read (the new one then
# replaces it: remove_older). 1 (not in the key): shrunk with INTER_AREA. 2: RESIZE_INTERPOLATION (bilinear).
PIXELS_VERSION = 2


def fingerprint(records: Records, image_size: int) -> str:
    """What the file's content depends on: the images (paths, sizes as recorded, bytes and modification time of
    each file), the size they are resized to and how (:data:`PIXELS_VERSION`)."""
    digest = hashlib.sha1(records.path_bytes.tobytes() + records.image_hw.tobytes() + f":{image_size}".encode())
    digest.update(f"pixels{PIXELS_VERSION}:{RESIZE_INTERPOLATION};".encode())
    for path in records.paths():
        try:
            info = path.stat()
            digest.update(f"{info.st_size}:{info.st_mtime_ns};".encode())
        except OSError:
            digest.update(b"missing;")  # unreadable now: its slot is marked as such when filled
    return digest.hexdigest()[:20]


def cache_files(locations: list[Path], records: Records, image_size: int) -> list[Path]:
    """The file's possible places: beside each of ``locations`` (where the split's records cache may live), named
    as it is (``train``) with the image size and this split's fingerprint: ``train.640px.<key>.images.u8``."""
    key = fingerprint(records, image_size)
    return [location.with_name(f"{split_name(location)}.{image_size}px.{key}{SUFFIX}") for location in locations]


def split_name(location: Path) -> str:
    return location.name.removesuffix(RECORDS_SUFFIX)


def remove_older(path: Path, split: str) -> None:
    """Delete ``split``'s other disk caches in ``path``'s folder (another size, or images since changed): one per
    split on the disk. A run still reading one keeps its mapping (the file goes once it is closed)."""
    pattern = re.compile(rf"{re.escape(split)}\.\d+px\.[0-9a-f]{{20}}{re.escape(SUFFIX)}")
    for other in path.parent.iterdir():
        if other != path and pattern.fullmatch(other.name):
            other.unlink(missing_ok=True)


def open_disk_cache(
    records: Records, image_size: int, load: Callable[[int], np.ndarray], *, locations: list[Path], fill: bool,
    threads: int = 8,
) -> ImageCache | None:
    """The split's disk cache, mapped read-only: an existing complete file, else (``fill``: local rank 0, called
    first) one filled now in the first place that takes it. None, with a warning, where none can be written."""
    shapes = resized_shapes(records, image_size)
    total = int(shapes.prod(1).sum())
    candidates = cache_files(locations, records, image_size)
    for path in candidates:
        if path.is_file() and path.stat().st_size == total + len(shapes):
            return _mapped(path, shapes, total)
    if not fill:
        return None  # local rank 0 could not write one: said there
    problems = []
    for path, location in zip(candidates, locations):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with filling(path):  # another run filling the same file: wait for it, then read what it wrote
                if path.is_file() and path.stat().st_size == total + len(shapes):
                    return _mapped(path, shapes, total)
                stats = os.statvfs(path.parent)
                if stats.f_bavail * stats.f_frsize < total + len(shapes):
                    problems.append(f"{path.parent}: no room for {total / 1e9:.1f} GB")
                    continue
                _fill(path, shapes, total, load, threads)
            remove_older(path, split_name(location))
            return _mapped(path, shapes, total)
        except OSError as error:  # a read-only folder, a full disk while filling
            problems.append(f"{path.parent}: {error.strerror or error}")
    warnings.warn(f"--cache disk: no image cache written ({'; '.join(problems)}); images are decoded as they are "
                  "read", stacklevel=2)
    return None


@contextlib.contextmanager
def filling(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` exclusively (``flock``; released by the system if the process dies), so two runs that
    start at once on one dataset fill its cache once: the second waits, then finds the file complete. The lock file
    is removed after; a run that arrives then locks a new one and finds the file too. Without ``fcntl`` (Windows)
    no lock: two such runs would each fill their own staging file."""
    if fcntl is None:
        yield
        return
    lock = path.with_name(path.name + ".lock")
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)


def _fill(path: Path, shapes: np.ndarray, total: int, load: Callable[[int], np.ndarray], threads: int) -> None:
    """Decode every image into ``<path>.partial`` (its images, then the unreadable bytes), then rename it."""
    staging = path.with_name(f"{path.name}.{os.getpid()}.partial")  # this process's own, whatever the lock
    try:
        with open(staging, "w+b") as file:
            mapped = np.memmap(file, np.uint8, mode="w+", shape=(max(total + len(shapes), 1),))
        cache = ImageCache(mapped[:total], shapes)
        cache.fill(load, threads=threads)
        mapped[total : total + len(shapes)] = cache.unreadable
        mapped.flush()
        del cache, mapped
        os.replace(staging, path)  # complete: a later run (or another rank) may trust it now
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _mapped(path: Path, shapes: np.ndarray, total: int) -> ImageCache:
    mapped = np.memmap(path, np.uint8, mode="r")
    cache = ImageCache(mapped[:total], shapes, path=path, owner=False)  # owner=False: the file is kept for later runs
    cache.unreadable = mapped[total : total + len(shapes)].astype(bool)
    return cache
