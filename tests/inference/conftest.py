"""Fixtures for inference tests: a nano checkpoint with varied scores, and its FP32 ONNX export."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from detector.export.metadata import ModelInfo
from detector.model import YOLO
from tests.conftest import MODEL_IMGSZ, NAMES, lively_model, one_torch_thread, write_checkpoint

IMGSZ = MODEL_IMGSZ


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def model() -> YOLO:
    with one_torch_thread():
        return lively_model(randomise_boxes=False)  # scores varied, so NMS has no ties to break


@pytest.fixture(scope="session")
def checkpoint(model: YOLO, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(model, tmp_path_factory.mktemp("weights") / "best.pt")


@pytest.fixture(scope="session")
def onnx_fp32(model: YOLO, checkpoint: Path) -> Path:
    """Fixed-shape FP32 export with batch 2 (so a 3-image batch exercises the chunking)."""
    pytest.importorskip("onnx", reason="the ONNX backend needs an ONNX export (the 'export' extra)")
    pytest.importorskip("onnxruntime", reason="the ONNX backend runs on onnxruntime (the 'export' extra)")
    from detector.export import export_onnx  # imports onnx
    info = ModelInfo(names=NAMES, strides=model.strides, imgsz=IMGSZ, batch=2)
    with one_torch_thread():
        return export_onnx(model, checkpoint.with_suffix(".onnx"), info)
