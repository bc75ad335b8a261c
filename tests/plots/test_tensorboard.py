"""The optional TensorBoard logger writes event files, and fails in one clear line without tensorboard."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from detector.plots import plot_batch
from detector.plots.tensorboard import INSTALL_HINT, TensorBoardLogger, TensorBoardUnavailable


def test_logger_writes_scalars_and_images(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    import torch

    png = plot_batch(torch.zeros((1, 3, 32, 32), dtype=torch.uint8), torch.zeros(0, 6), ["a"], tmp_path / "b.png")
    with TensorBoardLogger(tmp_path / "tb") as logger:
        logger.scalars({"train/box": 1.5, "mAP50": None, "mAP50-95": float("nan"), "lr": np.float32(0.01)}, step=0)
        logger.image("train_batch", png, step=0)
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100


def test_missing_tensorboard_raises_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    with pytest.raises(TensorBoardUnavailable, match="pip install") as error:
        TensorBoardLogger(tmp_path / "tb")
    assert str(error.value) == INSTALL_HINT and "\n" not in INSTALL_HINT
    assert not (tmp_path / "tb").exists()
