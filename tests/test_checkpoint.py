import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from detector.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint
from detector.model import build_model

WRITER = """
import sys, torch
from detector.checkpoint import save_checkpoint
path = sys.argv[1]
big = {"model": {"w": torch.randn(4_000_000)}, "epoch": 0}
for epoch in range(10_000):
    big["epoch"] = epoch
    save_checkpoint(big, path)
    print(epoch, flush=True)
"""


def test_sigkill_during_writes_leaves_a_loadable_checkpoint(tmp_path: Path):
    path = tmp_path / "last.pt"
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, process.kill)  # a writer hung before its first line ends readline() too
    watchdog.start()
    try:
        assert process.stdout.readline()  # at least one complete write
        for delay in (0.05, 0.11, 0.17):  # kill at different points of a write
            time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        watchdog.cancel()
        process.kill()
    state = load_checkpoint(path)
    assert state["model"]["w"].shape == (4_000_000,) and state["epoch"] >= 0
    assert not list(tmp_path.glob("*.tmp")) or all(p.name.startswith(".") for p in tmp_path.glob("*.tmp"))


def test_non_finite_weights_are_never_written(tmp_path: Path):
    with pytest.raises(CheckpointError, match="non-finite"):
        save_checkpoint({"model": {"w": torch.tensor([1.0, float("nan")])}}, tmp_path / "bad.pt")
    assert not any(tmp_path.iterdir())


def test_checkpoints_load_weights_only_and_refuse_pickled_code(tmp_path: Path):
    model = build_model(num_classes=2)
    save_checkpoint({"model": model.state_dict(), "ema": None, "model_args": {"num_classes": 2, "scale": "n", "reg_max": 16},
                     "names": ["a", "b"], "config": {}}, tmp_path / "ok.pt")
    rebuilt, checkpoint = model_from_checkpoint(tmp_path / "ok.pt")
    assert checkpoint["names"] == ["a", "b"] and not rebuilt.training

    class Hostile:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"model": Hostile()}, tmp_path / "hostile.pt")
    with pytest.raises(CheckpointError, match="hostile.pt"):
        load_checkpoint(tmp_path / "hostile.pt")
