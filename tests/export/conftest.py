"""Fixtures for export tests: a small nano checkpoint whose outputs look like a trained model's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from detector.export.parity import synthetic_images
from detector.model import YOLO
from tests.conftest import MODEL_IMGSZ, lively_model, one_torch_thread, write_checkpoint

IMGSZ = MODEL_IMGSZ


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def model() -> YOLO:
    with one_torch_thread():
        return lively_model()


@pytest.fixture(scope="session")
def images() -> torch.Tensor:
    """uint8 [4, 3, 64, 64] letterboxed synthetic images."""
    return synthetic_images(IMGSZ)


@pytest.fixture()
def checkpoint(model: YOLO, tmp_path: Path) -> Path:
    """A fresh ``runs/train/exp/weights/best.pt`` under ``tmp_path`` for each test (outputs land beside it)."""
    return write_checkpoint(model, tmp_path / "runs" / "train" / "exp" / "weights" / "best.pt")
