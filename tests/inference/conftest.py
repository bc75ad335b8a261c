"""Fixtures for inference tests: a nano checkpoint with varied scores, and its FP32 ONNX export."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from detector.checkpoint import save_checkpoint
from detector.export import ModelInfo, export_onnx
from detector.export.parity import synthetic_images
from detector.model import YOLO, build_model
from tests.conftest import one_torch_thread

NAMES = ["circle", "square", "triangle"]
IMGSZ = 64



@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield

def varied_model() -> YOLO:
    """Nano model whose scores spread over (0, 1), so NMS has no ties to break differently per runtime.

    BatchNorm statistics are set from one pass over synthetic images (fresh statistics shrink activations
    to ~1e-9 by the head), then the class convs get random weights.
    """
    torch.manual_seed(0)
    model = build_model(num_classes=len(NAMES), scale="n")
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None
    with torch.no_grad():
        model.train()(synthetic_images(IMGSZ, count=8, seed=1).float() / 255)
        for class_branch in model.head.cv3:
            class_branch[-1].weight.normal_(0, 0.01)
            class_branch[-1].bias.fill_(-1.0)
    return model.eval()


@pytest.fixture(scope="session")
def model() -> YOLO:
    with one_torch_thread():
        return varied_model()


@pytest.fixture(scope="session")
def checkpoint(model: YOLO, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "best.pt"
    args = {"num_classes": model.num_classes, "scale": model.scale, "reg_max": model.reg_max}
    save_checkpoint({"model": model.state_dict(), "ema": None, "model_args": args, "names": NAMES,
                     "config": {"imgsz": IMGSZ}, "epoch": 0}, path)
    return path


@pytest.fixture(scope="session")
def onnx_fp32(model: YOLO, checkpoint: Path) -> Path:
    """Fixed-shape FP32 export with batch 2 (so a 3-image batch exercises the chunking)."""
    info = ModelInfo(names=NAMES, strides=model.strides, imgsz=IMGSZ, batch=2)
    with one_torch_thread():
        return export_onnx(model, checkpoint.with_suffix(".onnx"), info)
