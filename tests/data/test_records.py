"""The flat records: packing round-trips, subsets, and no Python object per image."""

import gc
from pathlib import Path

import numpy as np
import pytest

from detector.data.records import ImageRecord, Records


def _records() -> tuple[Records, list[Path], list[np.ndarray]]:
    paths = [Path("/d/images/a.jpg"), Path("/d/images/ünï côde.png"), Path("/d/images/c.jpg")]
    labels = [np.array([[0, 0.5, 0.5, 0.2, 0.2]], np.float32), np.zeros((0, 5), np.float32),
              np.array([[1, 0.1, 0.2, 0.1, 0.1], [2, 0.7, 0.7, 0.3, 0.2]], np.float32)]
    return Records.from_lists(paths, labels, [7, 8, 9], [(10, 20), (30, 40), (50, 60)]), paths, labels


def test_records_round_trip_and_select():
    records, paths, labels = _records()
    assert len(records) == 3 and records.labels.shape == (3, 5) and records.box_counts().tolist() == [1, 0, 2]
    for index, record in enumerate(records):
        assert record == ImageRecord(paths[index], record.labels, [7, 8, 9][index])
        np.testing.assert_array_equal(record.labels, labels[index])
    assert records[-1].path == paths[2] and records.hw_list() == [(10, 20), (30, 40), (50, 60)]
    subset = records.select([2, 0])
    assert subset.paths() == [paths[2], paths[0]] and subset.image_ids.tolist() == [9, 7]
    np.testing.assert_array_equal(subset.labels, np.concatenate([labels[2], labels[0]]))
    again = Records.from_arrays(records.arrays())
    assert again.paths() == paths
    with pytest.raises(IndexError):
        records[3]


def test_with_rows_keeps_every_image_and_only_the_rows_asked_for():
    records, paths, labels = _records()  # 1, 0 and 2 boxes: classes 0; -; 1, 2
    kept = records.with_rows(records.labels[:, 0] != 1)
    assert kept.paths() == paths and kept.box_counts().tolist() == [1, 0, 1]
    np.testing.assert_array_equal(kept.labels_of(2), labels[2][1:])
    assert records.with_rows(np.zeros(3, bool)).box_counts().tolist() == [0, 0, 0]
    last_empty = records.select([0, 1])  # an image without boxes last
    assert last_empty.with_rows(np.ones(1, bool)).box_counts().tolist() == [1, 0]


def test_records_hold_a_fixed_number_of_python_objects_whatever_the_size():
    # Forked loader workers copy every page whose reference counts they touch: the store must not grow
    # per-image Python objects (that was one Path and one array per image before).
    counts = []
    for size in (10, 5000):
        paths = [Path(f"/d/images/{i:06d}.jpg") for i in range(size)]
        labels = [np.full((3, 5), 0.5, np.float32)] * size
        gc.collect()
        before = len(gc.get_objects())
        records = Records.from_lists(paths, labels, range(size), [(480, 640)] * size)
        del paths, labels
        gc.collect()
        counts.append(len(gc.get_objects()) - before)
        assert len(records) == size
    assert counts[1] <= counts[0] + 5  # tracked objects do not scale with the image count
