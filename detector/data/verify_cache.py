"""Image verification, cached: each image is decoded once, and again only when its file changes.

The cache is a small JSON file beside the split's first image folder (``<folder>.verified.json``),
keyed by each file's path, size and modification time. An unwritable folder just means no cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from detector.data.dataset import verify_images
from detector.data.labels import ImageRecord
from detector.files import write_atomically

VERSION = 1


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def cache_path_for(records: list[ImageRecord]) -> Path | None:
    return records[0].path.parent.with_suffix(".verified.json") if records else None


def verify_images_cached(records: list[ImageRecord]) -> tuple[list[ImageRecord], list[tuple[int, int]], list[str]]:
    """Same contract as :func:`verify_images`; unchanged files are answered from the cache."""
    cache_file = cache_path_for(records)
    cached: dict = {}
    if cache_file is not None and cache_file.is_file():
        try:
            content = json.loads(cache_file.read_text())
            cached = content["images"] if content.get("version") == VERSION else {}
        except (OSError, ValueError, KeyError):
            cached = {}  # a corrupt cache is rebuilt, never trusted
    kept, sizes, problems, fresh, unknown = [], [], [], {}, []
    for record in records:
        try:
            stamp = _stamp(record.path)
        except OSError as error:
            problems.append(f"{record.path}: cannot read ({error.strerror}); skipped")
            continue
        entry = cached.get(str(record.path))
        if entry is not None and entry["stamp"] == stamp:
            fresh[str(record.path)] = entry
        else:
            unknown.append(record)
    checked, checked_sizes, checked_problems = verify_images(unknown)
    for record, size in zip(checked, checked_sizes):
        fresh[str(record.path)] = {"stamp": _stamp(record.path), "hw": list(size)}
    for path, problem in checked_problems:
        fresh[str(path)] = {"stamp": _stamp(path), "problem": problem}
    for record in records:
        entry = fresh.get(str(record.path))
        if entry is None:
            continue
        if "problem" in entry:
            problems.append(entry["problem"])
        else:
            kept.append(record)
            sizes.append((int(entry["hw"][0]), int(entry["hw"][1])))
    if cache_file is not None and unknown:
        # Through a temporary file of this process's own, then a rename: several processes (torchrun nodes on
        # one file system) may write the cache at once, and readers see one whole file, never a mix.
        try:
            write_atomically(cache_file, json.dumps({"version": VERSION, "images": fresh}).encode())
        except OSError:
            pass  # read-only dataset folder: verify again next time
    return kept, sizes, problems
