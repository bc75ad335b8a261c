"""ONNX export: onnxruntime matches PyTorch at FP32 and FP16, metadata round-trips, in-graph NMS agrees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from detector.export import ExportWrapper, ModelInfo, export_onnx, read_onnx_info
from detector.export.parity import synthetic_images
from detector.inference.onnx_backend import OnnxBackend
from detector.model import YOLO
from detector.postprocess import NMSConfig, decode_outputs, non_max_suppression

IMGSZ = 64  # conftest fixtures use 64 px images
NAMES = ["circle", "square", "triangle"]


def info_for(**overrides: Any) -> ModelInfo:
    return ModelInfo(**{"names": NAMES, "strides": (8, 16, 32), "imgsz": IMGSZ, "batch": 4, **overrides})


def reference(model: YOLO, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return ExportWrapper(model)(images.float() / 255)


def anchor_strides(imgsz: int) -> torch.Tensor:
    """``[A, 1]`` stride of every anchor, in the wrapper's level order."""
    return torch.cat([torch.full(((imgsz // s) ** 2, 1), float(s)) for s in (8, 16, 32)])


def test_wrapper_decode_equals_postprocess_decode(model: YOLO, images: torch.Tensor) -> None:
    boxes, scores = reference(model, images)
    with torch.no_grad():
        decoded = decode_outputs(model(images.float() / 255), model.strides, model.reg_max)
    torch.testing.assert_close(boxes, decoded[..., :4], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(scores, decoded[..., 4:])


def test_fp32_onnx_matches_pytorch(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    path = export_onnx(model, tmp_path / "fp32.onnx", info_for())
    boxes, scores = OnnxBackend(path).infer(images)
    ref_boxes, ref_scores = reference(model, images)
    # Same FP32 arithmetic in another order: 1e-4 relative to the coordinate or to the image side
    # (a per-value relative test means nothing for coordinates near 0).
    torch.testing.assert_close(boxes, ref_boxes, rtol=1e-4, atol=1e-4 * IMGSZ)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-4, atol=1e-5)


def test_fp16_onnx_close_to_pytorch_fp32(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    path = export_onnx(model, tmp_path / "fp16.onnx", info_for(precision="fp16"))
    proto = onnx.load(str(path))
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # FP32 I/O ...
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in proto.graph.initializer)  # ... FP16 weights inside
    boxes, scores = OnnxBackend(path).infer(images)
    ref_boxes, ref_scores = reference(model, images)
    # FP16 rounds each of ~60 layers at 2^-11 relative; on this model that moves logits by ~1% (measured
    # 0.09 on logits of +-9). A DFL distance then shifts by a fraction of one bin (= one stride in px):
    # measured 0.20 bins at most, so allow half a bin; sigmoid scores measured 0.019 off, allow 0.03.
    assert ((boxes - ref_boxes).abs() <= 0.5 * anchor_strides(IMGSZ)).all()
    assert (boxes - ref_boxes).abs().mean() < 0.5
    assert (scores - ref_scores).abs().max() < 0.03


def test_dynamic_slimmed_graph_takes_other_batch_and_size(model: YOLO, tmp_path: Path) -> None:
    path = export_onnx(model, tmp_path / "dynamic.onnx", info_for(batch=1, dynamic=True), simplify=True)
    backend = OnnxBackend(path)
    inputs = synthetic_images(96, count=2)[..., 16:80].contiguous()  # [2, 3, 96, 64]: other batch, not square
    boxes, scores = backend.infer(inputs)
    ref_boxes, ref_scores = reference(model, inputs)
    torch.testing.assert_close(boxes, ref_boxes, rtol=1e-4, atol=1e-4 * 96)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("multi_label", [False, True])
def test_nms_graph_equals_python_postprocess(
    model: YOLO, images: torch.Tensor, tmp_path: Path, multi_label: bool
) -> None:
    config = NMSConfig(conf_threshold=0.3, iou_threshold=0.5, max_detections=20, multi_label=multi_label)
    info = info_for(nms=config, precision="fp32", dynamic=multi_label)  # one of the two with free batch
    path = export_onnx(model, tmp_path / "nms.onnx", info)
    assert read_onnx_info(path) == info  # metadata round-trips, NMS thresholds included
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert props["names"] == '["circle", "square", "triangle"]' and props["stride"] == "32"
    assert props["precision"] == '"fp32"' and props["nms"] == "true" and props["imgsz"] == str(IMGSZ)
    detections, counts = OnnxBackend(path).infer(images)
    assert detections.shape == (4, 20, 6) and counts.dtype == torch.int64
    with torch.no_grad():
        decoded = decode_outputs(model(images.float() / 255), model.strides, model.reg_max)
    expected = non_max_suppression(decoded, config)
    assert sum(len(e["scores"]) for e in expected) > 10  # the comparison is not vacuous
    for rows, count, wanted in zip(detections, counts, expected):
        assert int(count) == len(wanted["scores"])
        rows = rows[: int(count)]
        torch.testing.assert_close(rows[:, :4], wanted["boxes"], rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(rows[:, 4], wanted["scores"], rtol=1e-4, atol=1e-5)
        assert rows[:, 5].long().tolist() == wanted["labels"].tolist()
    assert (detections[0, int(counts[0]) :] == 0).all()  # padding rows are zeros
    np.testing.assert_array_equal(counts.numpy(), [len(e["scores"]) for e in expected])
