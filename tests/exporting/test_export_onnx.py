"""ONNX export: onnxruntime matches PyTorch at FP32 and FP16, metadata round-trips, in-graph NMS agrees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from detector.exporting.parity import synthetic_images
from detector.inference.onnx_backend import OnnxBackend
from detector.model import YOLO
from detector.postprocess import NMSConfig, decode_outputs, non_max_suppression
from tests.conftest import lively_model, write_checkpoint
from tests.tolerances import FP32_EPS, assert_same_detections, fp32_tolerance_on, rounded_relative_error

onnx = pytest.importorskip("onnx", reason="ONNX export needs onnx (the 'export' extra)")
pytest.importorskip("onnxruntime", reason="parity is checked with onnxruntime (the 'export' extra)")

from detector.exporting import ExportWrapper, ModelInfo, export_onnx, read_onnx_info  # noqa: E402  (imports onnx)

IMGSZ = 64  # conftest fixtures use 64 px images
REPO = Path(__file__).resolve().parents[2]
NAMES = ["circle", "square", "triangle"]


def info_for(**overrides: Any) -> ModelInfo:
    return ModelInfo(**{"names": NAMES, "strides": (8, 16, 32), "imgsz": IMGSZ, "batch": 4, **overrides})


def reference(model: YOLO, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return ExportWrapper(model)(images.float() / 255)


FP16_EPS = torch.finfo(torch.float16).eps  # 9.8e-4 = 2^-10


def test_wrapper_decode_equals_postprocess_decode(model: YOLO, images: torch.Tensor) -> None:
    boxes, scores = reference(model, images)
    with torch.no_grad():
        decoded = decode_outputs(model(images.float() / 255), model.strides, model.reg_max)
    # The same decode written twice: the DFL expectation (a reg_max-term sum, worst case one rounding of
    # eps per term) and the anchor +- distance may round differently, eps times the largest coordinate each.
    atol = FP32_EPS * (model.reg_max + 1) * float(decoded[..., :4].abs().max())
    torch.testing.assert_close(boxes, decoded[..., :4], rtol=0, atol=atol)
    torch.testing.assert_close(scores, decoded[..., 4:])


def test_fp32_onnx_matches_pytorch(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    path = export_onnx(model, tmp_path / "fp32.onnx", info_for())
    boxes, scores = OnnxBackend(path).infer(images)
    ref_boxes, ref_scores = reference(model, images)
    # Same FP32 arithmetic in another order: tolerances from the model's depth, fan-in and outputs.
    tolerance = fp32_tolerance_on(model, images)
    torch.testing.assert_close(boxes, ref_boxes, rtol=0, atol=tolerance.box)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=tolerance.score)


def test_fp16_onnx_close_to_pytorch_fp32(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    path = export_onnx(model, tmp_path / "fp16.onnx", info_for(precision="fp16"))
    proto = onnx.load(str(path))
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # FP32 I/O ...
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in proto.graph.initializer)  # ... FP16 weights inside
    boxes, scores = OnnxBackend(path).infer(images)
    ref_boxes, ref_scores = reference(model, images)
    # FP16 rounds every weight and stored activation: depth * eps16 relative (tests/tolerances.py), carried
    # to scores and boxes like the FP32 bound.
    tolerance = fp32_tolerance_on(model, images, relative=rounded_relative_error(model, FP16_EPS))
    assert (boxes - ref_boxes).abs().max() <= tolerance.box
    assert (scores - ref_scores).abs().max() <= tolerance.score


@pytest.mark.parametrize(("scale", "precision"), [("11n", "fp32"), ("11n", "fp16"), ("26n", "fp32")])
def test_yolo11_and_yolo26_export_within_the_same_bounds(images: torch.Tensor, tmp_path: Path, precision: str,
                                                         scale: str) -> None:
    """YOLO11's attention (reshapes, two matrix products, a softmax) and depthwise class branch through ONNX: the
    bounds of the YOLOv8 tests above, whose layer count takes in the attention's products. YOLO26 (its usual head,
    the distances direct, attention in a neck block too) within the same in FP32. Not in FP16 with these random
    weights: its neck attention's logits reach ~4,400 here (YOLO11n's ~280), where FP16's rounding (2^-10 of a
    value) moves one by ~4, which a softmax passes on whole, and the per-layer bound above assumes each layer adds
    at most its rounding; a trained YOLO26's FP16 export meets the export's own parity gate instead."""
    model = lively_model(scale=scale)
    path = export_onnx(model, tmp_path / f"{precision}.onnx", info_for(precision=precision))
    boxes, scores = OnnxBackend(path).infer(images)
    ref_boxes, ref_scores = reference(model, images)
    relative = rounded_relative_error(model, FP16_EPS) if precision == "fp16" else None
    tolerance = fp32_tolerance_on(model, images, relative=relative)
    assert (boxes - ref_boxes).abs().max() <= tolerance.box
    assert (scores - ref_scores).abs().max() <= tolerance.score
    assert (scores - ref_scores).abs().max() > 0 or precision == "fp32"  # FP16 inside: it did round somewhere


def test_dynamic_slimmed_graph_takes_other_batch_and_size(model: YOLO, tmp_path: Path) -> None:
    pytest.importorskip("onnxslim", reason="simplify=True slims the graph with onnxslim")
    path = export_onnx(model, tmp_path / "dynamic.onnx", info_for(batch=1, dynamic=True), simplify=True)
    backend = OnnxBackend(path)
    inputs = synthetic_images(96, count=2)[..., 16:80].contiguous()  # [2, 3, 96, 64]: other batch, not square
    boxes, scores = backend.infer(inputs)
    ref_boxes, ref_scores = reference(model, inputs)
    tolerance = fp32_tolerance_on(model, inputs)  # FP32 in another summation order, as above
    torch.testing.assert_close(boxes, ref_boxes, rtol=0, atol=tolerance.box)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=tolerance.score)


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
    got = [{"boxes": rows[: int(count), :4], "scores": rows[: int(count), 4], "labels": rows[: int(count), 5].long()}
           for rows, count in zip(detections, counts)]
    # Paired by IoU within the FP32 tolerances; a detection on a threshold may exist on one side only.
    summary = assert_same_detections(expected, got, nms=config, tolerance=fp32_tolerance_on(model, images))
    assert summary.matched > 10  # the comparison is not vacuous
    for rows, count in zip(detections, counts):
        assert (rows[int(count) :] == 0).all()  # padding rows are zeros


def test_the_lowest_opsets_export_the_same_detections(model: YOLO, images: torch.Tensor, tmp_path: Path) -> None:
    """Opset 9 (11 with NMS), free batch and size: edge runtimes ask for old opsets. The DFL's unflatten (opset
    13) and an integer Clip in the NMS (opset 12) made these a traceback."""
    from detector.exporting.onnx import MIN_NMS_OPSET, MIN_OPSET

    path = export_onnx(model, tmp_path / "old.onnx", info_for(dynamic=True), opset=MIN_OPSET)
    assert onnx.load(str(path)).opset_import[0].version == MIN_OPSET
    boxes, scores = OnnxBackend(path).infer(images)
    ref_boxes, ref_scores = reference(model, images)
    tolerance = fp32_tolerance_on(model, images)  # FP32 in another summation order, as above
    torch.testing.assert_close(boxes, ref_boxes, rtol=0, atol=tolerance.box)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=tolerance.score)
    config = NMSConfig(conf_threshold=0.3, iou_threshold=0.5, max_detections=20)
    path = export_onnx(model, tmp_path / "old-nms.onnx", info_for(nms=config, dynamic=True), opset=MIN_NMS_OPSET)
    detections, counts = OnnxBackend(path).infer(images)
    with torch.no_grad():
        expected = non_max_suppression(decode_outputs(model(images.float() / 255), model.strides, model.reg_max),
                                       config)
    got = [{"boxes": rows[: int(count), :4], "scores": rows[: int(count), 4], "labels": rows[: int(count), 5].long()}
           for rows, count in zip(detections, counts)]
    summary = assert_same_detections(expected, got, nms=config, tolerance=tolerance)
    assert summary.matched > 10  # the comparison is not vacuous


@pytest.mark.parametrize("opset,nms,message", [
    (8, False, "--opset 8: this export needs opset 9 or later"),
    (10, True, "--opset 10: this export needs opset 11 or later with --nms"),
    (99, False, "--opset 99: torch .* exports ONNX opsets up to [0-9]+"),
])
def test_an_opset_the_graph_cannot_take_is_one_line(model: YOLO, tmp_path: Path, opset: int, nms: bool,
                                                    message: str) -> None:
    info = info_for(nms=NMSConfig() if nms else None)
    with pytest.raises(ValueError, match=f"^{message}$"):
        export_onnx(model, tmp_path / "x.onnx", info, opset=opset)
    assert not (tmp_path / "x.onnx").exists()


def test_the_nms_export_command_runs_in_a_fresh_process(model: YOLO, tmp_path: Path) -> None:
    """The command, not the function: the test process has imported torchvision already, the command has not. Its
    first import, inside the trace, crashed the export (``unsupported output type: int ... _cuda_version``)."""
    weights = write_checkpoint(model, tmp_path / "best.pt")
    command = [sys.executable, "-m", "detector", "export", "--weights", str(weights), "--imgsz", str(IMGSZ),
               "--device", "cpu", "nms=True"]  # Ultralytics' spelling of --nms: the same flag
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "+nms" in done.stdout and f"export: wrote {weights.with_suffix('.onnx')}" in done.stdout
    assert read_onnx_info(weights.with_suffix(".onnx")).nms is not None


def test_ultralytics_weights_export_as_predict_reads_them(tmp_path: Path) -> None:
    """Ultralytics' yolov8n.pt exports as it predicts and validates here (read by the safe reader, no code run), with
    its class names; it was refused as 'not one of our checkpoints'."""
    from detector.workflows.export import run_export
    from detector.workflows.options import ExportOptions
    from tests.weights.lookalike import yolov8_lookalike_bytes

    weights = tmp_path / "yolov8n.pt"
    weights.write_bytes(yolov8_lookalike_bytes("n", num_classes=3, seed=1))
    written = run_export(ExportOptions(weights=weights, imgsz=IMGSZ, device="cpu"))
    assert written == [weights.with_suffix(".onnx")]
    assert read_onnx_info(written[0]).names == ["class0", "class1", "class2"]
