"""Fixtures for export tests: a small nano model whose outputs look like a trained model's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from detector.export.parity import synthetic_images
from detector.model import YOLO
from tests.conftest import MODEL_IMGSZ, lively_model, one_torch_thread

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
