"""TensorRT: the engine header round-trips here; building and running need TensorRT and a GPU (skipped here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detector.model.metadata import ModelInfo
from detector.exporting.tensorrt import build_engine
from detector.inference.tensorrt_backend import read_engine_file, write_engine_file
from detector.model import YOLO
from detector.postprocess import NMSConfig
from tests.tolerances import fp32_tolerance_on, rounded_relative_error

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
    pytest.importorskip("onnx", reason="the engine is built from an ONNX export")
    from detector.exporting import ExportWrapper, export_onnx
    from detector.inference.tensorrt_backend import TensorRTBackend

    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=IMGSZ, batch=4)
    engine = build_engine(export_onnx(model, tmp_path / "m.onnx", info), tmp_path / "m.engine", info)
    boxes, scores = TensorRTBackend(engine).infer(images)
    with torch.no_grad():
        ref_boxes, ref_scores = ExportWrapper(model)(images.float() / 255)
    # TensorRT may run convolutions in TF32 (10-bit mantissa): depth * 2^-10 relative, as for FP16 storage.
    tf32_eps = 2.0**-10
    tolerance = fp32_tolerance_on(model, images, relative=rounded_relative_error(model, tf32_eps))
    torch.testing.assert_close(boxes.cpu(), ref_boxes, rtol=0, atol=tolerance.box)
    torch.testing.assert_close(scores.cpu(), ref_scores, rtol=0, atol=tolerance.score)
