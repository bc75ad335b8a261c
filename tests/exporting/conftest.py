"""Fixtures for export tests: a small nano model whose outputs look like a trained model's."""

from __future__ import annotations

import pytest
import torch

from detector.exporting.parity import synthetic_images
from detector.model import YOLO
from tests.conftest import MODEL_IMGSZ, lively_model

IMGSZ = MODEL_IMGSZ


@pytest.fixture(scope="session")
def model() -> YOLO:
    """Overrides tests/conftest.py's: random box branches too, so exported boxes vary."""
    return lively_model()


@pytest.fixture(scope="session")
def images() -> torch.Tensor:
    """uint8 [4, 3, 64, 64] letterboxed synthetic images."""
    return synthetic_images(IMGSZ)
