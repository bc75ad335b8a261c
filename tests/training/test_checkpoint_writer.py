import errno
import threading
from pathlib import Path

import pytest
import torch

from detector.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from detector.training.checkpoint_writer import CheckpointWriter, snapshot


def payload(epoch: int) -> dict:
    return {"model": {"w": torch.full((4,), float(epoch))}, "ema": None, "epoch": epoch, "model_args": {}}


def test_a_snapshot_does_not_move_with_the_live_tensors():
    weights = torch.zeros(3)
    state = {"model": {"w": weights}, "optimizer": {"state": [(1, weights)]}, "epoch": 2}
    copied = snapshot(state)
    weights.add_(1)  # training goes on
    assert torch.equal(copied["model"]["w"], torch.zeros(3))
    assert torch.equal(copied["optimizer"]["state"][0][1], torch.zeros(3)) and copied["epoch"] == 2


def test_the_writer_writes_one_file_at_a_time_and_the_newest_per_file_wins(tmp_path: Path):
    started, release = threading.Event(), threading.Event()
    active, most_active, written = [0], [0], []
    lock = threading.Lock()

    def slow_save(data: dict, path: Path) -> None:
        with lock:
            active[0] += 1
            most_active[0] = max(most_active[0], active[0])
        started.set()
        assert release.wait(timeout=10)
        save_checkpoint(data, path)
        written.append((path.name, data["epoch"]))
        with lock:
            active[0] -= 1

    writer = CheckpointWriter(save=slow_save)
    writer.submit(tmp_path / "last.pt", payload(0))
    assert started.wait(timeout=10)  # epoch 0 is being written; the next two wait, and epoch 2 replaces epoch 1
    writer.submit(tmp_path / "last.pt", payload(1))
    writer.submit(tmp_path / "best.pt", payload(1), strip=True)
    writer.submit(tmp_path / "last.pt", payload(2))
    release.set()
    writer.close()
    assert most_active[0] == 1
    assert written == [("last.pt", 0), ("best.pt", 1), ("last.pt", 2)]
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == 1 and best["model"]["w"].dtype == torch.float16  # written stripped
    assert writer.writes == 3


def test_a_full_disk_leaves_the_previous_checkpoint_and_stops_with_one_line(tmp_path: Path, monkeypatch):
    import detector.files

    writer = CheckpointWriter()
    writer.submit(tmp_path / "last.pt", payload(0))
    writer.drain()

    def disk_full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(detector.files.os, "fsync", disk_full)  # the data went out, the disk refused it
    writer.submit(tmp_path / "last.pt", payload(1))
    with pytest.raises(CheckpointError) as failure:
        writer.drain()
    message = str(failure.value)
    assert message == f"{tmp_path / 'last.pt'}: could not write the checkpoint (No space left on device); " \
                      "the previous one is intact"
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left behind
    with pytest.raises(CheckpointError):  # the error stays: nothing more is accepted
        writer.submit(tmp_path / "last.pt", payload(2))
    with pytest.raises(CheckpointError):
        writer.close()
    assert not writer._thread.is_alive()


def test_synchronous_mode_writes_on_the_callers_thread(tmp_path: Path):
    threads = []

    def recording_save(data: dict, path: Path) -> None:
        threads.append(threading.current_thread())
        save_checkpoint(data, path)

    writer = CheckpointWriter(save=recording_save, background=False)
    writer.submit(tmp_path / "last.pt", payload(3))
    assert threads == [threading.current_thread()] and load_checkpoint(tmp_path / "last.pt")["epoch"] == 3
    writer.close()
