"""The RAM cache: exact size from the records, the same pixels as decoding, and one copy per node."""

import numpy as np
import pytest

import detector.data.ram_cache as ram_cache
from detector.data.dataset import DetectionDataset
from tests.conftest import write_records


@pytest.fixture
def dataset(tmp_path):
    return DetectionDataset(write_records(tmp_path, 5, seed=6), image_size=48)


def _load(dataset: DetectionDataset):
    return lambda index: dataset.load_resized(index)[0]


def test_single_process_cache_holds_the_decoded_pixels(dataset: DetectionDataset):
    cache = ram_cache.build_image_cache(dataset.records, 48, _load(dataset), mode="ram")
    assert cache.nbytes == ram_cache.cache_bytes(dataset.records, 48) == 5 * 48 * 48 * 3 and cache.path is None
    for index in range(5):
        np.testing.assert_array_equal(cache.image(index), dataset.load_resized(index)[0])
    assert ram_cache.build_image_cache(dataset.records, 48, _load(dataset), mode="none") is None


def test_node_processes_share_one_copy_decided_once(dataset: DetectionDataset, monkeypatch, tmp_path):
    monkeypatch.setattr(ram_cache.tempfile, "gettempdir", lambda: str(tmp_path))
    one_copy = ram_cache.cache_bytes(dataset.records, 48)
    # Free RAM such that one copy fits the budget and two would not: the node caches, once.
    monkeypatch.setattr(ram_cache, "available_ram", lambda: int(1.5 * one_copy / ram_cache.CACHE_RAM_FRACTION))
    common = dict(mode="auto", local_world_size=2, run_id="run-1")
    first = ram_cache.build_image_cache(dataset.records, 48, _load(dataset), local_rank=0, **common)
    decoded = []
    second = ram_cache.build_image_cache(dataset.records, 48, lambda i: decoded.append(i), local_rank=1, **common)
    assert decoded == []  # the second process decoded nothing: it maps what the first wrote
    assert isinstance(first.buffer, np.memmap) and isinstance(second.buffer, np.memmap)
    assert first.path == second.path and first.path.stat().st_size == one_copy
    for index in range(5):
        np.testing.assert_array_equal(second.image(index), dataset.load_resized(index)[0])
    private = sum(cache.buffer.nbytes for cache in (first, second) if not isinstance(cache.buffer, np.memmap))
    assert private + first.path.stat().st_size <= 1.5 * one_copy  # the node's cached bytes: one copy
    first.release_name()
    assert not list(tmp_path.glob(f"{ram_cache.PREFIX}*"))  # no file left behind
    np.testing.assert_array_equal(second.image(4), dataset.load_resized(4)[0])  # mappings outlive the name

    # When one copy does not fit, local rank 0 does not cache, and the other ranks follow.
    monkeypatch.setattr(ram_cache, "available_ram", lambda: int(0.5 * one_copy / ram_cache.CACHE_RAM_FRACTION))
    common["run_id"] = "run-2"
    assert ram_cache.build_image_cache(dataset.records, 48, _load(dataset), local_rank=0, **common) is None
    assert ram_cache.build_image_cache(dataset.records, 48, _load(dataset), local_rank=1, **common) is None


def test_image_unreadable_while_filling_is_left_to_the_dataset(dataset: DetectionDataset):
    dataset.records.path(2).write_bytes(b"broken")
    dataset.image_cache = ram_cache.build_image_cache(dataset.records, 48, _load(dataset), mode="ram")
    assert dataset.image_cache.unreadable.tolist() == [False, False, True, False, False]
    with pytest.warns(UserWarning, match="2.png: failed to decode"):
        assert dataset[2][2].unreadable.endswith("2.png")


def _shared(dataset, monkeypatch, tmp_path, run_id: str):
    """Local rank 0 and 1 of a two-process node, with the temporary folder under ``tmp_path`` and room to cache."""
    monkeypatch.setattr(ram_cache.tempfile, "gettempdir", lambda: str(tmp_path))
    common = dict(mode="ram", local_world_size=2, run_id=run_id)
    path = ram_cache.shared_cache_path(dataset.records, 48, run_id)
    return path, (lambda: ram_cache.build_image_cache(dataset.records, 48, _load(dataset), local_rank=0, **common),
                  lambda: ram_cache.build_image_cache(dataset.records, 48, _load(dataset), local_rank=1, **common))


def test_the_shared_file_sits_in_a_private_folder(dataset, monkeypatch, tmp_path):
    import os
    import stat

    path, (rank0, rank1) = _shared(dataset, monkeypatch, tmp_path, "private")
    first = rank0()
    assert path.parent.parent == tmp_path and str(os.getuid()) in path.parent.name
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert rank1() is not None
    first.release_name()
    assert not path.parent.exists()  # the folder goes with the name


def test_a_symlink_in_place_of_the_folder_or_the_file_is_refused(dataset, monkeypatch, tmp_path):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    path, (rank0, rank1) = _shared(dataset, monkeypatch, tmp_path, "planted")
    path.parent.symlink_to(elsewhere, target_is_directory=True)  # planted before the run: the predictable name
    with pytest.warns(UserWarning, match="is a symlink, not a folder; not caching"):
        assert rank0() is None
    assert rank1() is None and not any(elsewhere.iterdir())  # nothing written into, or read from, the target
    path.parent.unlink()

    path, (rank0, rank1) = _shared(dataset, monkeypatch, tmp_path, "file-link")
    first = rank0()
    path.unlink()
    (elsewhere / "decoy.u8").write_bytes(b"\0" * first.nbytes)
    path.symlink_to(elsewhere / "decoy.u8")  # the file's name now points elsewhere: O_NOFOLLOW refuses it
    with pytest.warns(UserWarning, match="not opened"):
        assert rank1() is None


def test_a_folder_that_is_not_private_is_not_used(dataset, monkeypatch, tmp_path):
    path, (rank0, rank1) = _shared(dataset, monkeypatch, tmp_path, "open-folder")
    path.parent.mkdir(mode=0o755)
    path.parent.chmod(0o755)
    with pytest.warns(UserWarning, match="has mode 755, not 700"):
        assert rank0() is None
    assert rank1() is None
    path.parent.chmod(0o700)  # a folder of ours left by a crashed run, private: reused
    assert rank0() is not None and rank1() is not None


def test_an_image_decoded_at_another_size_is_resized_as_predict_resizes(dataset: DetectionDataset):
    """A file replaced since the scan by one of another size is fitted to its planned slot bilinearly, as every
    resize on the way into the model (detector.data.letterbox.RESIZE_INTERPOLATION), not with INTER_AREA."""
    import cv2

    noise = np.random.default_rng(0).integers(0, 256, (96, 80, 3), dtype=np.uint8)  # planned: 48x48
    cache = ram_cache.build_image_cache(dataset.records, 48, lambda index: noise, mode="ram", threads=1)
    np.testing.assert_array_equal(cache.image(0), cv2.resize(noise, (48, 48), interpolation=cv2.INTER_LINEAR))
