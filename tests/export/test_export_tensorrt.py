"""TensorRT: the engine header round-trips here; building and running need TensorRT and a GPU (skipped here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detector.export import ExportWrapper, ModelInfo, export_onnx
from detector.export.tensorrt import build_engine, read_engine_file, write_engine_file
from detector.model import YOLO
from detector.postprocess import NMSConfig

IMGSZ = 64  # conftest fixtures use 64 px images
NAMES = ["circle", "square", "triangle"]


def test_engine_header_round_trips(tmp_path: Path) -> None:
    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=IMGSZ, precision="fp16", nms=NMSConfig(max_detections=7))
    path = write_engine_file(tmp_path / "m.engine", info, b"\x00engine-bytes")
    assert read_engine_file(path) == (info, b"\x00engine-bytes")


def test_engine_matches_pytorch(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT needs a CUDA GPU")
    from detector.inference.tensorrt_backend import TensorRTBackend

    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=IMGSZ, batch=4)
    engine = build_engine(export_onnx(model, tmp_path / "m.onnx", info), tmp_path / "m.engine", info)
    boxes, scores = TensorRTBackend(engine).infer(images)
    with torch.no_grad():
        ref_boxes, ref_scores = ExportWrapper(model)(images.float() / 255)
    torch.testing.assert_close(boxes.cpu(), ref_boxes, rtol=1e-3, atol=1e-2)  # TF32 convolutions allowed
    torch.testing.assert_close(scores.cpu(), ref_scores, rtol=1e-3, atol=1e-3)
