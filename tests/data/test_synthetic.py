"""The built-in set's generator: the same files whichever thread makes which image."""

from pathlib import Path

import pytest

from detector.data import synthetic
from detector.data.synthetic import write_shapes


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_one_thread_and_many_write_the_same_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(synthetic, "usable_cores", lambda: 1)
    alone = _files(write_shapes(tmp_path / "one", train=6, val=2, size=64))
    monkeypatch.setattr(synthetic, "usable_cores", lambda: 4)
    together = _files(write_shapes(tmp_path / "four", train=6, val=2, size=64))
    assert len(alone) == 2 * 8 + 1 and alone == together  # images, labels and the stamp


def test_a_smaller_set_is_the_start_of_a_larger_one(tmp_path: Path):
    """Each image has its own seed (seed, split name, index), so adding images leaves the first ones as they were."""
    small = _files(write_shapes(tmp_path / "small", train=2, val=1, size=64))
    large = _files(write_shapes(tmp_path / "large", train=4, val=2, size=64))
    shared = {name: data for name, data in small.items() if not name.startswith(".complete")}
    assert len(shared) == 6 and all(large[name] == data for name, data in shared.items())
    assert large["images/train/train_00003.jpg"] != large["images/train/train_00000.jpg"]
