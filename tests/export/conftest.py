"""Fixtures for export tests: a small nano checkpoint whose outputs look like a trained model's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from detector.checkpoint import save_checkpoint
from detector.export.parity import synthetic_images
from detector.model import YOLO, build_model
from tests.conftest import one_torch_thread

NAMES = ["circle", "square", "triangle"]
IMGSZ = 64



@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield

def lively_model(seed: int = 0) -> YOLO:
    """A nano model with varied scores and peaked box bins (a fresh one gives near-uniform outputs).

    BatchNorm statistics are calibrated on a few images (fresh BN stats shrink activations to ~1e-9 by
    the head), then the last head convs get random weights: scores spread over (0, 1), boxes differ.
    """
    torch.manual_seed(seed)
    model = build_model(num_classes=len(NAMES), scale="n")
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average: one pass sets the statistics
    with torch.no_grad():
        model.train()(synthetic_images(IMGSZ, count=8, seed=1).float() / 255)
        for box_branch, class_branch in zip(model.head.cv2, model.head.cv3):
            class_branch[-1].weight.normal_(0, 0.01)
            class_branch[-1].bias.fill_(-1.0)
            box_branch[-1].weight.normal_(0, 0.01)
    return model.eval()


def write_checkpoint(model: YOLO, path: Path, imgsz: int = IMGSZ) -> Path:
    model_args = {"num_classes": model.num_classes, "scale": model.scale, "reg_max": model.reg_max}
    payload = {"model": model.state_dict(), "ema": None, "model_args": model_args, "names": NAMES,
               "config": {"imgsz": imgsz}, "epoch": 0}
    save_checkpoint(payload, path)
    return path


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
