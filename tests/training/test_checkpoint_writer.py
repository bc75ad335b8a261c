import errno
import threading
from pathlib import Path

import pytest
import torch

from detector.checkpoint import CheckpointError, is_stripped, load_checkpoint, save_checkpoint
from detector.training import checkpoint_writer
from detector.training.checkpoint_writer import (Cadence, CheckpointWriter, RunCheckpoints, encode_checkpoint, snapshot,
                                                 stripped_snapshot)
from tests.conftest import FakeClock


def payload(epoch: int) -> dict:
    return {"model": {"w": torch.full((4,), float(epoch))}, "ema": None, "epoch": epoch, "model_args": {}}


def test_a_snapshot_does_not_move_with_the_live_tensors():
    weights = torch.zeros(3)
    state = {"model": {"w": weights}, "optimizer": {"state": [(1, weights)]}, "epoch": 2}
    copied = snapshot(state)
    weights.add_(1)  # training goes on
    assert torch.equal(copied["model"]["w"], torch.zeros(3))
    assert torch.equal(copied["optimizer"]["state"][0][1], torch.zeros(3)) and copied["epoch"] == 2


def test_a_stripped_snapshot_does_not_move_with_the_live_run():
    ema, metrics = {"w": torch.zeros(3), "n": torch.tensor(2)}, {"mAP50-95": 0.5}
    live = {"model": {"w": torch.ones(3)}, "ema": ema, "optimizer": {}, "epoch": 4, "metrics": metrics}
    copied = stripped_snapshot(live)
    ema["w"].add_(1), ema["n"].add_(1), metrics.update({"mAP50-95": 0.9})  # training goes on
    assert copied["model"]["w"].dtype == torch.float16 and copied["model"]["w"].tolist() == [0.0] * 3
    assert copied["model"]["n"].item() == 2 and copied["metrics"] == {"mAP50-95": 0.5} and is_stripped(copied)


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


@pytest.mark.parametrize("encoded", [False, True])
def test_a_write_torch_fails_is_one_line_and_never_a_silent_thread_death(tmp_path: Path, monkeypatch, encoded: bool):
    """A full disk inside torch.save came out as torch's "RuntimeError: [enforce fail at inline_container.cc] unexpected
    pos", the OSError saying why only chained inside it: a writer thread that died of it, its run going on without
    checkpoints. A file-size limit fails the same write, for real, without a small disk; the CPU's encoded bytes
    (``encoded``) fail in the write itself, and say so in the same line."""
    resource = pytest.importorskip("resource", reason="no file-size limit here (not a Unix)")

    writer = CheckpointWriter()
    writer.submit(tmp_path / "last.pt", payload(0))
    writer.drain()
    big = {**payload(1), "model": {"w": torch.zeros(1 << 20)}}  # 4 MB, over the limit below
    if encoded:
        big = encode_checkpoint(big, tmp_path / "last.pt")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))  # Python ignores SIGXFSZ: the write fails, EFBIG
    try:
        with pytest.raises(CheckpointError, match=r"last.pt: could not write the checkpoint \(File too large\); "
                                                  r"the previous one is intact$"):
            writer.submit(tmp_path / "last.pt", big)
            writer.drain()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    # Any other failure of a write reaches the training thread too, as it is (a bug keeps its traceback).
    failing = CheckpointWriter(lambda payload, path: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.submit(tmp_path / "best.pt", payload(2))
        failing.drain()
    with pytest.raises(ZeroDivisionError):
        failing.close()
    assert not failing._busy and (failing._thread is None or not failing._thread.is_alive())


def test_encoded_bytes_are_written_as_they_are_and_refuse_non_finite_weights(tmp_path: Path):
    """The CPU's checkpoints: serialised on the training thread, the writer thread writes the bytes. The file is what
    ``save_checkpoint`` writes from the dict; non-finite weights are refused at encoding, naming the file."""
    threads, kinds = [], []

    def recording_save(data: object, path: Path) -> None:
        threads.append(threading.current_thread()), kinds.append(type(data))
        save_checkpoint(data, path)

    writer = CheckpointWriter(save=recording_save)
    writer.submit(tmp_path / "last.pt", encode_checkpoint(payload(3), tmp_path / "last.pt"))
    writer.close()
    assert kinds == [memoryview] and threads[0] is not threading.current_thread()
    save_checkpoint(payload(3), tmp_path / "direct.pt")
    assert (tmp_path / "last.pt").read_bytes() == (tmp_path / "direct.pt").read_bytes()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 3
    poisoned = {**payload(4), "model": {"w": torch.tensor([1.0, float("nan")])}}
    with pytest.raises(CheckpointError, match=r"last.pt: refusing to save non-finite 'model' weights"):
        encode_checkpoint(poisoned, tmp_path / "last.pt")


def test_the_cadence_keeps_writes_to_their_share_of_the_run():
    clock = FakeClock()
    cadence = Cadence(share=0.02, clock=clock)
    assert cadence.due()  # the first epoch always writes
    started, clock.now = clock.now, 0.25  # a 0.25 s write
    cadence.wrote(started)
    clock.now += 12.0  # 12 s of training: 0.25 / 12 > 2%
    assert not cadence.due() and cadence.due(must=True)
    clock.now += 0.5  # 12.5 s: exactly 2%
    assert cadence.due()
    # On the CPU the writer thread's seconds for those files count too: 0.25 + 0.25 s wait for 25 s
    assert not cadence.due(writer_seconds=0.25)
    clock.now += 12.5
    assert cadence.due(writer_seconds=0.25)


def full_checkpoint(epoch: int) -> dict:
    weights = {"w": torch.full((4,), float(epoch))}
    return {"model": weights, "ema": weights, "optimizer": {"state": {}}, "epoch": epoch,
            "model_args": {"num_classes": 1, "scale": "n", "reg_max": 16}}


def test_best_pt_keeps_an_improvement_made_between_writes(tmp_path: Path):
    clock, said = FakeClock(tick=0.1), []  # every write costs 0.1 s: due again 5 s after the last one
    checkpoints = RunCheckpoints(tmp_path, serialise_here=True, log=said.append,
                                 cadence=Cadence(share=0.02, clock=clock))
    clock.now = 1.0
    checkpoints.epoch_done(lambda: full_checkpoint(0), improved=True, finished=False, wait=False)
    checkpoints.writer.drain()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 0
    for epoch in (1, 2):  # short epochs: last.pt is not due, and epoch 1 was the best
        clock.now += 1.0
        checkpoints.epoch_done(lambda epoch=epoch: full_checkpoint(epoch), improved=epoch == 1, finished=False,
                               wait=False)
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 0
    assert load_checkpoint(tmp_path / "best.pt")["epoch"] == 0
    assert len(said) == 1 and "last.pt is written every" in said[0]
    checkpoints.close()  # a stop, a Ctrl-C or an error: the held improvement is written
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == 1 and is_stripped(best) and best["model"]["w"].dtype == torch.float16
    assert torch.equal(best["model"]["w"], torch.ones(4, dtype=torch.float16))


@pytest.mark.parametrize("due", [True, False])
def test_an_epoch_still_being_scored_leaves_a_candidate_that_its_verdict_makes_best_pt(tmp_path: Path, due: bool):
    """--val-background: an epoch's best.pt is known one epoch later; its candidate is that epoch's weights, with
    the metrics and best fitness its verdict brings, whether or not its own last.pt was due."""
    clock = FakeClock(tick=0.1)  # every write costs 0.1 s: due again 5 s after the last one
    checkpoints = RunCheckpoints(tmp_path, serialise_here=True, log=print, cadence=Cadence(share=0.02, clock=clock))
    checkpoints.epoch_done(lambda: full_checkpoint(0), improved=True, finished=False, wait=False)
    clock.now += 100.0 if due else 1.0
    checkpoints.epoch_done(lambda: full_checkpoint(1), improved=None, finished=False, wait=False)
    checkpoints.writer.drain()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == (1 if due else 0)
    checkpoints.judged(True, {"metrics": {"mAP50-95": 0.5}, "best_fitness": 0.5, "best_epoch": 1})
    checkpoints.epoch_done(lambda: full_checkpoint(2), improved=None, finished=False, wait=False)
    checkpoints.judged(False, {"metrics": {"mAP50-95": 0.1}, "best_fitness": 0.5, "best_epoch": 1})  # dropped
    checkpoints.close()
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == 1 and is_stripped(best) and torch.equal(best["model"]["w"], torch.ones(4).half())
    assert best["metrics"] == {"mAP50-95": 0.5} and (best["best_fitness"], best["best_epoch"]) == (0.5, 1)


@pytest.mark.parametrize("serialise_here", [False, True])
@pytest.mark.parametrize("improved", [False, True])
def test_a_finished_run_writes_at_once_and_strips_last_pt(tmp_path: Path, serialise_here: bool, improved: bool):
    clock = FakeClock()
    checkpoints = RunCheckpoints(tmp_path, serialise_here=serialise_here, log=print,
                                 cadence=Cadence(share=0.02, clock=clock))
    checkpoints.epoch_done(lambda: full_checkpoint(0), improved=True, finished=False, wait=False)
    clock.now += 0.1  # far too soon for the cadence, but the run finished
    checkpoints.epoch_done(lambda: full_checkpoint(1), improved=improved, finished=True, wait=False)
    last = load_checkpoint(tmp_path / "last.pt")  # on disk before epoch_done returned
    assert last["epoch"] == 1 and is_stripped(last)
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == (1 if improved else 0) and is_stripped(best)
    checkpoints.close()


@pytest.mark.parametrize("serialise_here", [False, True])
def test_the_written_file_holds_the_epochs_values_and_only_a_gpu_run_copies_them(tmp_path: Path, monkeypatch,
                                                                               serialise_here: bool):
    """The next steps change the live tensors while the writer thread works. A GPU run hands it a copy to serialise;
    a CPU run (``serialise_here``) serialises the live state before epoch_done returns, with no copy. Either way
    the files hold that epoch's values, not a later step's."""
    start_writing = threading.Event()
    kinds = []

    def slow_save(checkpoint: object, path: Path) -> None:
        start_writing.wait(timeout=10)  # the live weights change before this write starts
        kinds.append(type(checkpoint))
        save_checkpoint(checkpoint, path)

    copies = []
    monkeypatch.setattr(checkpoint_writer, "snapshot", lambda value: copies.append(value) or snapshot(value))
    live = full_checkpoint(1)
    checkpoints = RunCheckpoints(tmp_path, serialise_here=serialise_here, log=print)
    checkpoints.writer._save = slow_save
    checkpoints.epoch_done(lambda: live, improved=True, finished=False, wait=False)
    live["model"]["w"].fill_(7.0)  # the next step
    start_writing.set()
    checkpoints.close()
    assert len(copies) == (0 if serialise_here else 1)
    assert kinds == [memoryview if serialise_here else dict] * 2
    for name in ("last.pt", "best.pt"):
        assert torch.equal(load_checkpoint(tmp_path / name)["model"]["w"].float(), torch.ones(4))
    assert is_stripped(load_checkpoint(tmp_path / "best.pt")) and not is_stripped(load_checkpoint(tmp_path / "last.pt"))


@pytest.mark.parametrize("serialise_here", [False, True])
def test_save_period_keeps_every_nth_epoch_as_a_resumable_file_of_its_own(tmp_path: Path, serialise_here: bool):
    """--save-period 2 (Ultralytics' save_period): epochs 2 and 4 (counted from 1) each leave epoch<N>.pt, a full
    last.pt of that epoch, though short epochs make last.pt due only now and then; the others leave none."""
    clock = FakeClock(tick=0.1)  # every write costs 0.1 s: due again 5 s after the last one
    checkpoints = RunCheckpoints(tmp_path, serialise_here=serialise_here, log=print,
                                 cadence=Cadence(share=0.02, clock=clock), period=2)
    for epoch in range(5):
        clock.now += 0.5  # far too soon for the cadence
        checkpoints.epoch_done(lambda epoch=epoch: full_checkpoint(epoch), improved=False, finished=epoch == 4,
                               wait=False, epoch=epoch)
    checkpoints.close()
    assert sorted(path.name for path in tmp_path.glob("epoch*.pt")) == ["epoch2.pt", "epoch4.pt"]
    for name, epoch in (("epoch2.pt", 1), ("epoch4.pt", 3)):
        kept = load_checkpoint(tmp_path / name)
        assert kept["epoch"] == epoch and not is_stripped(kept)  # resumable, as last.pt was then
