"""--cache disk (detector/data/disk_cache.py): filled once, mapped by later runs, named by what it holds, never
trusted half-written, and a warning where it cannot be written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from detector.data.dataset import DetectionDataset
from detector.data.disk_cache import SUFFIX, open_disk_cache
from detector.data.ram_cache import resized_shapes
from tests.conftest import write_records


def _split(tmp_path: Path):
    (tmp_path / "images").mkdir()
    records = write_records(tmp_path / "images", 4, seed=1)
    dataset = DetectionDataset(records, image_size=48)
    return records, dataset, [tmp_path / "images" / "train.records.npz", tmp_path / "user" / "x-train.records.npz"]


def load_counting(dataset: DetectionDataset, calls: list[int]):
    def load(index: int) -> np.ndarray:
        calls.append(index)
        return dataset.load_resized(index)[0]

    return load


def test_filled_once_then_mapped_with_the_decoded_pixels(tmp_path: Path) -> None:
    records, dataset, locations = _split(tmp_path)
    calls: list[int] = []
    first = open_disk_cache(records, 48, load_counting(dataset, calls), locations=locations, fill=True)
    assert first is not None and sorted(calls) == [0, 1, 2, 3]
    files = list((tmp_path / "images").glob(f"train.48px.*{SUFFIX}"))
    assert len(files) == 1 and first.path == files[0] and not list(tmp_path.rglob("*.partial"))
    again = open_disk_cache(records, 48, load_counting(dataset, calls), locations=locations, fill=False)
    assert again is not None and len(calls) == 4  # a later run (or rank) decodes nothing
    for index in range(4):
        np.testing.assert_array_equal(again.image(index), dataset.load_resized(index)[0])
    again.release_name()  # the trainer's call once every rank mapped it: a disk cache stays for later runs
    assert files[0].is_file()


def test_an_image_that_fails_to_decode_is_remembered_and_a_changed_one_makes_a_new_file(tmp_path: Path) -> None:
    records, dataset, locations = _split(tmp_path)
    broken = records.path(2)
    original = broken.read_bytes()
    broken.write_bytes(b"not an image")
    cache = open_disk_cache(records, 48, lambda i: dataset.load_resized(i)[0], locations=locations, fill=True)
    assert cache.unreadable.tolist() == [False, False, True, False]
    reopened = open_disk_cache(records, 48, lambda i: 1 / 0, locations=locations, fill=False)
    assert reopened.unreadable.tolist() == [False, False, True, False]  # read from its file: no zeros trusted
    broken.write_bytes(original)  # mended: its size and time change, so does the file's name
    os.utime(broken, ns=(1, 1))
    assert open_disk_cache(records, 48, lambda i: 1 / 0, locations=locations, fill=False) is None
    mended = open_disk_cache(records, 48, lambda i: dataset.load_resized(i)[0], locations=locations, fill=True)
    assert not mended.unreadable.any()
    assert list((tmp_path / "images").glob(f"train.*{SUFFIX}")) == [mended.path]  # the old one removed


def test_a_half_written_file_is_never_trusted(tmp_path: Path) -> None:
    records, dataset, locations = _split(tmp_path)

    def dies(index: int) -> np.ndarray:
        raise KeyboardInterrupt  # a run killed while filling

    with pytest.raises(KeyboardInterrupt):
        open_disk_cache(records, 48, dies, locations=locations, fill=True)
    assert not list(tmp_path.rglob(f"*{SUFFIX}*"))  # nothing, not even the staging file
    assert open_disk_cache(records, 48, dies, locations=locations, fill=False) is None


def test_an_unwritable_place_passes_to_the_next_and_nowhere_is_one_warning(tmp_path: Path) -> None:
    """A dataset folder that cannot be written (here: a file where a folder should be, which stops root as well as
    a read-only mount would) leaves the cache in the next place, the user's cache folder; none at all is a warning
    and a run without the cache."""
    records, dataset, _ = _split(tmp_path)
    (tmp_path / "blocked").write_text("a file, not a folder")
    locations = [tmp_path / "blocked" / "train.records.npz", tmp_path / "user" / "x-train.records.npz"]
    cache = open_disk_cache(records, 48, lambda i: dataset.load_resized(i)[0], locations=locations, fill=True)
    assert cache is not None and cache.path.parent == tmp_path / "user"
    with pytest.warns(UserWarning, match=r"--cache disk: no image cache written \(.*blocked: "):
        assert open_disk_cache(records, 48, lambda i: dataset.load_resized(i)[0], locations=locations[:1],
                               fill=True) is None


@pytest.mark.skipif(os.name != "posix", reason="the lock is flock's")
def test_two_runs_starting_at_once_fill_it_once(tmp_path: Path) -> None:
    """Two runs on one dataset at once (here two threads, each with its own lock handle, as two processes have): the
    second waits for the first's file and reads it; the images are decoded once, and no lock or staging file
    stays behind."""
    import threading
    import time

    records, dataset, locations = _split(tmp_path)
    calls: list[int] = []

    def slow(index: int) -> np.ndarray:
        time.sleep(0.05)  # long enough for the second run to arrive while the first fills
        calls.append(index)
        return dataset.load_resized(index)[0]

    caches: list = []
    runs = [threading.Thread(target=lambda: caches.append(open_disk_cache(records, 48, slow, locations=locations,
                                                                          fill=True, threads=1))) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=60)
    assert len(caches) == 2 and all(cache is not None for cache in caches)
    assert sorted(calls) == [0, 1, 2, 3]
    assert [path.name for path in (tmp_path / "images").iterdir() if SUFFIX in path.name] == [caches[0].path.name]


def test_a_file_of_the_inter_area_kind_is_not_read_but_replaced(tmp_path: Path) -> None:
    """Files written before PIXELS_VERSION 2 hold images shrunk with INTER_AREA, where training now resizes as
    predict does (bilinear): a complete one, named as they were named, is neither mapped nor kept once the new
    one is filled."""
    import hashlib

    records, dataset, locations = _split(tmp_path)
    old_key = hashlib.sha1(records.path_bytes.tobytes() + records.image_hw.tobytes() + b":48")
    for path in records.paths():  # the fingerprint as version 1 computed it: no pixels version in it
        info = path.stat()
        old_key.update(f"{info.st_size}:{info.st_mtime_ns};".encode())
    old = tmp_path / "images" / f"train.48px.{old_key.hexdigest()[:20]}{SUFFIX}"
    old.write_bytes(bytes(int(resized_shapes(records, 48).prod(1).sum()) + len(records)))  # complete, as sizes go
    assert open_disk_cache(records, 48, lambda i: 1 / 0, locations=locations, fill=False) is None
    cache = open_disk_cache(records, 48, lambda i: dataset.load_resized(i)[0], locations=locations, fill=True)
    assert cache.path != old and not old.exists()
    np.testing.assert_array_equal(cache.image(1), dataset.load_resized(1)[0])
