"""Fixtures for the command tests, beside the shared checkpoint and ONNX export of tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.model import YOLO
from tests.conftest import lively_model, write_checkpoint


@pytest.fixture(scope="session")
def export_model() -> YOLO:
    return lively_model()


@pytest.fixture()
def run_checkpoint(export_model: YOLO, tmp_path: Path) -> Path:
    """A fresh ``runs/train/exp/weights/best.pt`` under ``tmp_path`` for each test (outputs land beside it)."""
    return write_checkpoint(export_model, tmp_path / "runs" / "train" / "exp" / "weights" / "best.pt")
