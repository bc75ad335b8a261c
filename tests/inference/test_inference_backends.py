"""One Backend interface over PyTorch and ONNX Runtime: same letterbox, same NMS, same detections."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from detector.model.metadata import ModelInfo
from detector.exporting.parity import synthetic_images
from detector.inference.tensorrt_backend import tensorrt_missing, write_engine_file
from detector.inference import load_backend, prepare_batch, to_original_pixels
from detector.inference.onnx_backend import OnnxBackend
from detector.inference.torch_backend import TorchBackend
from detector.model import YOLO
from detector.postprocess import NMSConfig
from tests.tolerances import assert_same_detections, fp32_tolerance_on

NMS = NMSConfig(conf_threshold=0.3, iou_threshold=0.5)

IMGSZ = 64  # conftest fixtures use 64 px images


def test_suffix_picks_the_runtime(checkpoint: Path, onnx_fp32: Path, tmp_path: Path) -> None:
    assert isinstance(load_backend(checkpoint), TorchBackend)
    assert isinstance(load_backend(onnx_fp32), OnnxBackend)
    (tmp_path / "model.tflite").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown weights type"):
        load_backend(tmp_path / "model.tflite")


@pytest.mark.skipif(tensorrt_missing() is None, reason="TensorRT and a GPU are present")
def test_engine_without_tensorrt_says_why(tmp_path: Path) -> None:
    info = ModelInfo(names=["a"], strides=(8, 16, 32), imgsz=IMGSZ, dynamic=False)
    write_engine_file(tmp_path / "m.engine", info, b"\x00" * 8)  # a well-formed file: only TensorRT is missing
    with pytest.raises(RuntimeError, match="needs"):
        load_backend(tmp_path / "m.engine")


@pytest.mark.parametrize("name, content, problem", [
    ("m.engine", b"ab", "not an engine file from export.py \\(2 bytes"),
    ("m.engine", b"", "not an engine file from export.py \\(0 bytes"),
    ("m.engine", b"\xff\xff\x00\x00{}", "shorter than the header"),
    ("m.engine", b"\x02\x00\x00\x00{}", "missing or malformed detector metadata"),
    ("m.onnx", b"not a protobuf at all", "not a loadable ONNX model"),
    ("m.onnx", b"", "not a loadable ONNX model"),
    ("m.pt", b"", "empty or cut short"),
])
def test_a_broken_model_file_is_one_line_naming_it(tmp_path: Path, name: str, content: bytes, problem: str) -> None:
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=problem) as refused:  # CheckpointError is a ValueError too
        load_backend(tmp_path / name)
    assert str(refused.value).startswith(str(tmp_path / name)) and "\n" not in str(refused.value)


def test_onnx_and_pytorch_give_the_same_detections(model: YOLO, checkpoint: Path, onnx_fp32: Path) -> None:
    images = synthetic_images(IMGSZ, count=3)  # 3 images through a batch-2 graph: padded chunking
    expected = load_backend(checkpoint, nms=NMS)(images)
    got = load_backend(onnx_fp32, nms=NMS)(images)
    # Same FP32 network, other summation order: tolerances from the model's depth, fan-in and outputs;
    # detections are paired by IoU, and those on a threshold may exist on one side only.
    assert_same_detections(expected, got, nms=NMS, tolerance=fp32_tolerance_on(model, images))


def test_fixed_shape_graph_rejects_other_sizes(onnx_fp32: Path) -> None:
    with pytest.raises(ValueError, match="exported at 64 px"):
        load_backend(onnx_fp32)(torch.zeros(1, 3, 96, 96, dtype=torch.uint8))


def test_bf16_autocast_runs_on_cpu(checkpoint: Path) -> None:
    boxes, scores = load_backend(checkpoint, precision="bf16").infer(synthetic_images(IMGSZ, count=1))
    assert boxes.dtype == scores.dtype == torch.float32  # decode stays FP32 under autocast


def test_letterbox_is_undone() -> None:
    image = np.zeros((50, 100, 3), np.uint8)  # wide: padded top and bottom
    batch, (transform,) = prepare_batch([image], 64)
    assert batch.shape == (1, 3, 64, 64) and transform.ratio == 0.64 and transform.pad == (0.0, 16.0)
    boxed = {"boxes": torch.tensor([[6.4, 22.4, 64.0, 48.0]]), "scores": torch.ones(1), "labels": torch.zeros(1)}
    torch.testing.assert_close(to_original_pixels(boxed, transform)["boxes"], torch.tensor([[10.0, 10.0, 100.0, 50.0]]))


def test_nms_graph_backend_matches_python_nms(model: YOLO, checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="the graph is an ONNX export (the 'export' extra)")
    pytest.importorskip("onnxruntime", reason="the graph runs on onnxruntime (the 'export' extra)")
    from detector.exporting import export_onnx  # imports onnx

    baked = NMSConfig(conf_threshold=0.2, iou_threshold=0.5, max_detections=50)
    info = ModelInfo(names=["circle", "square", "triangle"], strides=model.strides, imgsz=IMGSZ, batch=1, nms=baked)
    graph = load_backend(export_onnx(model, tmp_path / "nms.onnx", info), nms=NMS)  # conf 0.3 filters the 0.2 graph
    images = synthetic_images(IMGSZ, count=2)
    python_nms = NMSConfig(conf_threshold=0.3, iou_threshold=0.5, max_detections=50)
    expected = load_backend(checkpoint, nms=python_nms)(images)
    got = graph(images)
    assert_same_detections(expected, got, nms=python_nms, tolerance=fp32_tolerance_on(model, images))
