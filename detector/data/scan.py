"""Scanning a split: every label parsed and every image checked once, in parallel, and cached beside the data.

The cache is one file per split, ``<source>.records.npz`` beside the first folder, list or JSON that the
YAML names for the split (``images/train`` -> ``images/train.records.npz``). It holds the flat records of
every listed image (:class:`detector.data.records.Records`), whether each image passed its check, the
problems found, and each image's and label file's size and modification time. A later run stats every
file, answers the unchanged ones from the cache and scans only the rest, so a second run on COCO costs the
stats (about a second) instead of a pass over 118k labels and images. A COCO JSON is parsed only when its
own size or time changes.

The file is written atomically (a temporary file and a rename), so torchrun ranks and nodes that share a
file system read one whole file: each node's local rank 0 scans, the others read what it wrote
(:func:`detector.distributed.local_main_first`). A read-only dataset folder keeps its cache under
``$XDG_CACHE_HOME/detector/records`` (``~/.cache/...``) instead; a cache that is corrupt, of another
version or of other settings is rebuilt, never trusted. A cache of this version is checked as it is read, as the
label parser checks labels (class ids the names hold, finite boxes inside the image, offsets that cut the arrays
into images: :meth:`Records.inconsistency`): one that fails (forged or damaged) is named in one warning line and
rebuilt.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import multiprocessing
import os
import sys
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from detector.data.images import check_image
from detector.data.labels import LARGEST_ID, UnreadableLabels, label_path_for, read_coco_labels, read_yolo_labels
from detector.data.problems import SIDEWAYS_JSON, SKIPS_IMAGE, UNREADABLE_IMAGE, UNREADABLE_LABELS, Problems
from detector.data.records import Records
from detector.data.spec import Split
from detector.data.workers import usable_cores
from detector.files import write_atomically

VERSION = 4  # 2: polygon lines read as their boxes, a byte-order mark ignored; 3: an unreadable label line skips
# its image, a box centred inside and reaching past the edge is clipped (label files read anew); 4: a PNG turned by
# an EXIF chunk after its pixels is recorded at its turned size (it was the stored one)
SUFFIX = ".records.npz"
CHUNK = 256  # paths per task: large enough that the pool's overhead is small, small enough to balance
# A COCO JSON at least this large is parsed in a child process (see _read_coco_listing); COCO val2017's 25 MB
# JSON peaks near 200 MB parsed, so below this the peak stays small anyway.
JSON_IN_CHILD_BYTES = 64 * 2**20
NO_STAMP = (-1, -1)  # a file that does not exist (a background image's missing label file)


def scan_threads() -> int:
    """Threads for stat-ing every file (and for filling the RAM cache).

    Stats are waits on the file system (far longer on a cold or network disk, where many requests in flight
    are what helps), which release the GIL. Sized like Python's own default for I/O pools: cores + 4, at most 32.
    """
    return min(32, usable_cores() + 4)


@dataclass
class ScanResult:
    records: Records  # the usable images, in listing order, with their upright sizes
    category_ids: list[int]  # class index -> COCO category id
    problems: Problems
    cache_file: Path | None  # the cache read or written; None when no folder could hold it
    cached_images: int  # images answered from the cache without being opened
    problems_file: Path | None = None  # every problem's place, beside the cache, where a summary line shows a few


def _stamp(path: Path) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return NO_STAMP
    return stat.st_size, stat.st_mtime_ns


def _parallel(function: Callable, items: Sequence, *, threads: int) -> list:
    """``[function(item) for item in items]`` over a thread pool in chunks."""
    chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return [out for result in pool.map(lambda chunk: [function(item) for item in chunk], chunks) for out in result]


def _scan_files(paths: Sequence[Path], num_classes: int | None) -> list[tuple]:
    """Per image: ``(upright (h, w) or None, reason, labels or None, problem entries)``; labels are read from
    YOLO txt files when ``num_classes`` is given (COCO labels come from the JSON). An image whose label file
    cannot be read is unusable with no reason of its own (its entry names the label file)."""
    out = []
    for path in paths:
        hw, reason = check_image(path)
        if num_classes is None:
            out.append((hw, reason, None, []))
            continue
        try:
            labels, problems = read_yolo_labels(path, num_classes)
        except UnreadableLabels as error:
            out.append((None, "", None, [(UNREADABLE_LABELS, str(error), 1)]))
            continue
        if any(kind in SKIPS_IMAGE for kind, _, _ in problems.entries):
            hw, reason = None, ""  # a line that cannot be read: the image's boxes are unknown, it is skipped
        out.append((hw, reason, labels, problems.entries))
    return out


def _scan_files_parallel(paths: list[Path], num_classes: int | None, *, desc: str) -> list[tuple]:
    """:func:`_scan_files` over one process per core (forked) for large scans.

    Processes, not threads: checking headers and parsing labels is Python code holding the GIL (measured on 20k
    images: 6 threads were no faster than one). Forking is cheap next to that work only for thousands of files.
    """
    processes = usable_cores()
    if processes <= 1 or len(paths) < 8 * CHUNK or "fork" not in multiprocessing.get_all_start_methods():
        return _scan_files(paths, num_classes)
    chunks = [paths[i : i + CHUNK] for i in range(0, len(paths), CHUNK)]
    out: list[tuple] = []
    show = sys.stderr.isatty()
    with multiprocessing.get_context("fork").Pool(processes) as pool, tqdm(
        total=len(paths), desc=desc, disable=not show, leave=False, unit="img"
    ) as bar:
        for result in pool.imap(functools.partial(_scan_files, num_classes=num_classes), chunks):
            out.extend(result)
            bar.update(len(result))
    return out


def _coco_listing_arrays(json_path: Path, images_dir: Path, names: list[str]) -> tuple[dict, list[int], list]:
    """The JSON's listing as flat arrays (cheap to pickle between processes), its category ids and problems."""
    parsed = read_coco_labels(json_path, images_dir, names)
    listed_sizes = np.array(parsed.sizes, np.int32).reshape(-1, 2)  # the JSON's: the image checks measure the files
    flat = Records.from_lists(parsed.paths, parsed.labels, parsed.image_ids, listed_sizes)
    return flat.arrays(), parsed.category_ids, parsed.problems.entries


def _read_coco_listing(json_path: Path, images_dir: Path, names: list[str]) -> _Listing:
    """Read a COCO JSON in a forked child process and keep only the compact arrays it returns.

    ``json.load`` of COCO train2017's 450 MB JSON peaks near 3 GB of Python objects (the polygons, which box
    training never reads). In a child that memory is returned to the system when it exits, and the training
    process, which lives on for days, never grows to that size (CPython rarely returns a freed arena).
    Small JSONs (and platforms without ``fork``) are read here: a child costs more than it saves there.
    """
    if json_path.stat().st_size >= JSON_IN_CHILD_BYTES and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(1) as pool:
            arrays, category_ids, entries = pool.apply(_coco_listing_arrays, (json_path, images_dir, names))
    else:
        arrays, category_ids, entries = _coco_listing_arrays(json_path, images_dir, names)
    flat = Records.from_arrays(arrays)
    return _Listing(flat.paths(), flat.image_ids, [flat.labels_of(i) for i in range(len(flat))], category_ids,
                    Problems([tuple(entry) for entry in entries]), flat.image_hw)


def cache_locations(split: Split) -> list[Path]:
    """Where this split's cache may live: beside its first source, then in the user's cache folder."""
    sources = split.sources or split.images[:1]
    if not sources:
        return []
    first = sources[0]
    name = first.name + (f".{_digest([str(s) for s in sources])[:10]}" if len(sources) > 1 else "") + SUFFIX
    user_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "detector" / "records"
    return [first.with_name(name), user_root / f"{_digest([str(first.resolve())])[:16]}-{name}"]


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _read_cache(locations: list[Path], settings: dict) -> tuple[dict[str, np.ndarray], dict, Path] | None:
    for location in locations:
        try:
            with np.load(location, allow_pickle=False) as content:
                arrays = {key: content[key] for key in content.files}
            meta = json.loads(arrays.pop("meta").tobytes())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            continue  # missing, corrupt or foreign: rebuilt below
        if meta.get("version") != VERSION or meta.get("settings") != settings:
            continue  # another version's or other settings': rebuilt below
        if reason := _cache_inconsistency(arrays, meta, settings["classes"]):
            print(f"warning: {location}: records cache not trusted ({reason}): the split is scanned anew",
                  file=sys.stderr)
            continue
        return arrays, meta, location
    return None


def _cache_inconsistency(arrays: dict[str, np.ndarray], meta: dict, num_classes: int) -> str:
    """What in a cache of this version the scan could not have written (a forged or damaged file), or "": the
    parser's checks over the records (:meth:`Records.inconsistency`), then the stamps' and the problems' shapes."""
    try:
        records = Records.from_arrays(arrays)
        count = len(records)
        if reason := records.inconsistency(num_classes):
            return reason
        stamps = arrays["stamps"]
        image_problems, listing_problems = meta["image_problems"], meta["listing_problems"]
        category_ids = meta["category_ids"]
    except (KeyError, TypeError, ValueError, IndexError):
        return "arrays missing or of the wrong shape"
    if stamps.shape != (count, 4) or not np.issubdtype(stamps.dtype, np.integer):
        return "file stamps of the wrong shape"
    if not (isinstance(category_ids, list) and len(category_ids) == num_classes
            and all(type(category) is int for category in category_ids)):
        return "category ids that are not one whole number per class"
    entries_ok = isinstance(image_problems, list) and isinstance(listing_problems, list) and all(
        isinstance(entry, list) and len(entry) == 4 and type(entry[0]) is int and 0 <= entry[0] < count
        and _problem_entry(entry[1:]) for entry in image_problems) and all(map(_problem_entry, listing_problems))
    return "" if entries_ok else "problem entries of the wrong shape"


def _problem_entry(entry: object) -> bool:
    """``[kind, where, count]`` as :class:`Problems` holds one."""
    return (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], str)
            and type(entry[2]) is int)


def _write_cache(locations: list[Path], arrays: dict[str, np.ndarray], meta: dict) -> Path | None:
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    for location in locations:
        try:
            return write_atomically(location, buffer.getvalue())
        except OSError:
            continue  # a read-only dataset folder: try the next place
    return None


# COCO's 80 detection classes by their official category ids (1-90, with gaps), as Ultralytics'
# coco80_to_coco91_class maps them.
COCO_CATEGORY_IDS = [*range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70, *range(72, 83),
                     *range(84, 91)]


@functools.cache
def coco_names() -> tuple[str, ...]:
    """The 80 COCO class names, in category-id order (the shipped coco.yaml's)."""
    import yaml

    from detector.data.catalog import shipped_yaml_dir

    return tuple(yaml.safe_load((shipped_yaml_dir() / "coco.yaml").read_text(encoding="utf-8"))["names"])


def yolo_category_ids(names: list[str]) -> list[int]:
    """A YOLO-layout split's category ids for its results: COCO's own where its classes are COCO's 80 (coco128,
    COCO in Ultralytics' layout), so its predictions.json scores against COCO's JSON; else 1, 2, ..."""
    return list(COCO_CATEGORY_IDS) if tuple(names) == coco_names() else list(range(1, len(names) + 1))


def yolo_image_ids(paths: Sequence[Path]) -> np.ndarray:
    """A YOLO-layout split's image ids: each file's number where every name is one, unique (COCO's
    ``000000000009.jpg`` is image 9, as Ultralytics numbers it and COCO's JSON does), else the position in the
    listing, 0, 1, ..."""
    stems = [path.stem for path in paths]
    if stems and all(stem.isascii() and stem.isdigit() for stem in stems):
        numbers = [int(stem) for stem in stems]
        if len(set(numbers)) == len(numbers) and max(numbers) <= LARGEST_ID:  # as a COCO JSON's ids
            return np.array(numbers, np.int64)
    return np.arange(len(paths))


@dataclass
class _Listing:
    """Every image the split lists, before checks: paths, labels (COCO) and the per-file stamps."""

    paths: list[Path]
    image_ids: np.ndarray
    labels: list[np.ndarray] | None  # COCO: from the JSON; YOLO: None (read per image while scanning)
    category_ids: list[int]
    problems: Problems  # problems of the listing itself (the JSON's), not of single images
    listed_hw: np.ndarray | None = None  # COCO, freshly parsed: (height, width) per image as the JSON lists them


def scan_split(split: Split, names: list[str], *, threads: int | None = None) -> ScanResult:
    """Records of the usable images of ``split``, answered from the cache where files are unchanged."""
    threads = threads or scan_threads()
    locations = cache_locations(split)
    coco = split.coco_json is not None
    settings = {"format": "coco" if coco else "yolo", "classes": len(names)}
    if coco:
        # Where the JSON and its images are too: the listing holds absolute paths, so a moved or copied dataset, or
        # the same JSON beside another images folder, is listed anew instead of read from the old place.
        settings.update(json=list(_stamp(split.coco_json)), where=[str(split.coco_json.resolve()),
                                                                    str(split.images[0].resolve())])
        # The listing was checked against these names (check_category_names: the same names in another order is an
        # error): a cache made under one YAML's names must not answer for a YAML that orders them otherwise.
        settings["names"] = list(names)
    cached = _read_cache(locations, settings)

    if coco and cached is not None:  # the JSON is unchanged: its listing comes from the cache
        old = Records.from_arrays(cached[0])
        listing = _Listing(old.paths(), old.image_ids, [old.labels_of(i) for i in range(len(old))],
                           cached[1]["category_ids"], Problems([tuple(p) for p in cached[1]["listing_problems"]]))
    elif coco:
        listing = _read_coco_listing(split.coco_json, split.images[0], names)
    else:
        listing = _Listing(list(split.images), yolo_image_ids(split.images), None, yolo_category_ids(names),
                           Problems())

    def stamps(path: Path) -> tuple[int, int, int, int]:
        return (*_stamp(path), *(NO_STAMP if coco else _stamp(label_path_for(path))))

    new_stamps = np.array(_parallel(stamps, listing.paths, threads=threads), np.int64).reshape(-1, 4)
    old_index = _reusable(cached, listing.paths, new_stamps)

    stale = np.flatnonzero(old_index < 0)

    stale_paths = [listing.paths[i] for i in stale.tolist()]
    scanned = _scan_files_parallel(stale_paths, None if coco else len(names), desc=f"scanning {len(stale)} images")

    count = len(listing.paths)
    hw = np.full((count, 2), -1, np.int32)
    labels: list[np.ndarray] = [np.zeros((0, 5), np.float32)] * count
    per_image: list[list] = []  # [index, kind, where, count] of problems that belong to one image
    if cached is not None:
        old = Records.from_arrays(cached[0])
        reused = np.flatnonzero(old_index >= 0)
        hw[reused] = old.image_hw[old_index[reused]]
        for index in reused:
            labels[index] = old.labels_of(int(old_index[index]))
        new_position = {int(old_index[i]): int(i) for i in reused}
        per_image += [[new_position[p[0]], *p[1:]] for p in cached[1]["image_problems"] if p[0] in new_position]
    if listing.labels is not None:
        labels = listing.labels
    for index, (size, reason, parsed, entries) in zip(stale.tolist(), scanned):
        if size is None and reason:
            per_image.append([index, UNREADABLE_IMAGE, f"{listing.paths[index]} ({reason})", 1])
        elif size is not None and sideways(listing.listed_hw, index, size):
            # The file is shown turned by 90 degrees while the JSON gives its stored size: its boxes were drawn on
            # the unturned pixels and would land elsewhere on the upright image (trained and scored wrongly).
            per_image.append([index, SIDEWAYS_JSON, str(listing.paths[index]), 1])
        elif size is not None:
            hw[index] = size
        if parsed is not None:
            labels[index] = parsed
        per_image += [[index, *entry] for entry in entries]

    everything = Records.from_lists(listing.paths, labels, listing.image_ids, hw)
    cache_file = cached[2] if cached is not None else None
    if cached is None or len(stale) or len(old_index) != len(cached[0]["image_ids"]):
        per_image.sort(key=lambda entry: entry[0])
        meta = {"version": VERSION, "settings": settings, "category_ids": listing.category_ids,
                "listing_problems": listing.problems.entries, "image_problems": per_image}
        cache_file = _write_cache(locations, {**everything.arrays(), "stamps": new_stamps}, meta)
    problems = Problems(list(listing.problems.entries))
    problems.extend((kind, where, n) for _, kind, where, n in per_image)
    usable = np.flatnonzero(everything.image_hw[:, 0] >= 0)
    records = everything if len(usable) == count else everything.select(usable)
    return ScanResult(records, listing.category_ids, problems, cache_file, count - len(stale),
                      problems_list(problems, cache_file))


def problems_list(problems: Problems, cache_file: Path | None) -> Path | None:
    """``images/train.problems.txt`` beside the cache, listing every place a summary line names only a few of
    (written when missing or older than the cache); None when none is needed or it cannot be written."""
    if cache_file is None or not problems.needs_list():
        return None
    path = cache_file.with_name(cache_file.name.removesuffix(SUFFIX) + ".problems.txt")
    try:
        if not path.is_file() or path.stat().st_mtime_ns < cache_file.stat().st_mtime_ns:
            problems.write_list(path)
    except OSError:
        return None
    return path


def sideways(listed_hw: np.ndarray | None, index: int, size: tuple[int, int]) -> bool:
    """The JSON lists image ``index`` at the upright ``size`` turned by 90 degrees (a non-square image whose EXIF
    orientation swaps its axes, annotated on its stored pixels)."""
    if listed_hw is None:
        return False
    listed = (int(listed_hw[index, 0]), int(listed_hw[index, 1]))
    return listed != tuple(size) and listed == (size[1], size[0])


def _reusable(cached: tuple[dict, dict, Path] | None, paths: list[Path], stamps: np.ndarray) -> np.ndarray:
    """For each listed image, its index in the cache when its files are unchanged there, else -1."""
    reuse = np.full(len(paths), -1, np.int64)
    if cached is None:
        return reuse
    old = Records.from_arrays(cached[0])
    old_stamps = cached[0]["stamps"]
    if len(old) == len(paths):
        encoded = [os.fsencode(p) for p in paths]
        same_list = np.array_equal(old.path_bytes, np.frombuffer(b"".join(encoded), np.uint8)) and np.array_equal(
            np.diff(old.path_offsets), [len(e) for e in encoded])
        if same_list:  # the common case: one vectorised comparison
            unchanged = (old_stamps == stamps).all(1) & (stamps[:, 0] >= 0)
            reuse[unchanged] = np.flatnonzero(unchanged)
            return reuse
    position = {path: i for i, path in enumerate(old.paths())}
    for index, path in enumerate(paths):
        old_index = position.get(path)
        if old_index is not None and (old_stamps[old_index] == stamps[index]).all() and stamps[index, 0] >= 0:
            reuse[index] = old_index
    return reuse
