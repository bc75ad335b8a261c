"""``export --end-to-end`` (YOLO26's one-to-one head, NMS-free): the file traces that branch, says so in its metadata,
passes parity against the PyTorch model in the same branch, and every load of it postprocesses by top-k."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from detector.exporting.parity import check_parity, synthetic_images
from detector.exporting.wrapper import pack_top_k
from detector.inference import load_backend
from detector.inference.torch_backend import TorchBackend
from detector.model import YOLO
from detector.model.metadata import ModelInfo, decode_metadata, encode_metadata
from detector.postprocess import NMSConfig, non_max_suppression
from detector.workflows.export import run_export
from detector.workflows.options import ExportOptions
from tests.conftest import MODEL_IMGSZ, NAMES, lively_model, write_checkpoint

pytest.importorskip("onnx", reason="ONNX export is the 'export' extra")
pytest.importorskip("onnxruntime", reason="ONNX parity runs onnxruntime (the 'export' extra)")


@pytest.fixture(scope="module")
def yolo26() -> YOLO:
    """A small YOLO26n whose two branches score differently (lively_model draws each its own weights). Its box
    weights are then shrunk tenfold: YOLO26 regresses the distances directly (2 grid cells a side at the bias), and
    lively_model's random ones gave 0.3-0.6% of the boxes a negative side, whose IoU with its partner is 0."""
    model = lively_model(scale="26n")
    with torch.no_grad():
        for branch in (*model.head.cv2, *model.head.one2one_cv2):
            branch[-1].weight.mul_(0.1)
    return model


def export_end_to_end(model: YOLO, folder: Path, **flags: object) -> Path:
    weights = write_checkpoint(model, folder / "best.pt")
    return run_export(ExportOptions(weights=weights, end_to_end=True, device="cpu", **flags))[0]


def test_the_export_traces_the_one_to_one_branch_passes_parity_and_says_so(yolo26: YOLO, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    path = export_end_to_end(yolo26, tmp_path)
    assert "parity onnxruntime fp32 end-to-end vs pytorch fp32" in capsys.readouterr().out  # run_export checked it
    exported = load_backend(path)  # no flag: the file's metadata decides
    assert exported.info.end_to_end and exported.name == "onnxruntime fp32 end-to-end"
    images = synthetic_images(MODEL_IMGSZ)
    info = ModelInfo(names=NAMES, strides=yolo26.strides, imgsz=MODEL_IMGSZ, dynamic=True)
    boxes, scores = exported.infer(images)
    one_to_one = TorchBackend(yolo26, dataclasses.replace(info, end_to_end=True)).infer(images)[1]
    usual = TorchBackend(yolo26, info).infer(images)[1]
    # The graph's scores are the one-to-one branch's: FP32 ORT vs FP32 torch differ by rounding (~1e-6 at these
    # sizes; parity measured 4e-5 at most), while the usual branch's differ by the weights lively_model drew apart.
    assert (scores - one_to_one).abs().max() < 1e-3 < (scores - usual).abs().max()
    # Its postprocess is the top-k: pairs, several classes of one box allowed, no NMS.
    detections = exported.postprocess((boxes, scores))
    expected = TorchBackend(yolo26, info, nms=NMSConfig(end_to_end=True)).postprocess((boxes, scores))
    for mine, reference in zip(detections, expected):
        assert torch.equal(mine["labels"], reference["labels"]) and torch.equal(mine["boxes"], reference["boxes"])


def test_in_graph_top_k_at_another_size_passes_parity(yolo26: YOLO, tmp_path: Path) -> None:
    """``--nms --end-to-end``: the top-k in the graph (detections + num_detections), dynamic, checked at 96 px.

    At conf 0.4 fewer pairs pass than the cap (189 anchors at 96 px): where the cap cuts among pairs scored above
    parity's floor, a rounding of 1e-5 may swap the last pair kept for the next, which parity counts as lost; the cap
    itself is checked on exact inputs (:func:`test_the_graphs_top_k_is_the_python_top_k`)."""
    path = export_end_to_end(yolo26, tmp_path, nms=True, dynamic=True, conf=0.4)
    exported = load_backend(path)
    assert exported.info.nms.end_to_end and exported.name == "onnxruntime fp32 end-to-end +top-k"
    info = ModelInfo(names=NAMES, strides=yolo26.strides, imgsz=96, dynamic=True, end_to_end=True)
    report = check_parity(TorchBackend(yolo26, info), exported, images=synthetic_images(96))
    assert report.passed and report.sure > 0 and report.unmatched == 0, report.summary()
    counts = exported.infer(synthetic_images(96))[1]
    assert 0 < int(counts.max()) < 189


@pytest.mark.parametrize("anchors", [20, 400], ids=["anchors<K", "anchors>K"])
def test_the_graphs_top_k_is_the_python_top_k(anchors: int) -> None:
    """The in-graph form (eager here; ONNX's TopK orders ties as this does) against detector/topk.py on continuous
    scores: the same pairs in the same order, the cap at ``min(K, anchors)`` included, padding rows zero."""
    generator = torch.Generator().manual_seed(anchors)
    boxes = torch.rand(2, anchors, 4, generator=generator) * 96
    scores = torch.rand(2, anchors, 3, generator=generator)
    config = NMSConfig(conf_threshold=0.2, max_detections=50, end_to_end=True)
    detections, counts = pack_top_k(boxes, scores, config)
    expected = non_max_suppression(torch.cat((boxes, scores), -1), config)
    assert counts.tolist() == [len(image["scores"]) for image in expected] == [min(50, anchors)] * 2
    for rows, count, image in zip(detections, counts.tolist(), expected):
        assert torch.equal(rows[:count], torch.cat((image["boxes"], image["scores"][:, None],
                                                    image["labels"][:, None].float()), 1))
        assert not rows[count:].any()


def test_parity_refuses_a_reference_in_the_other_branch(yolo26: YOLO, tmp_path: Path) -> None:
    exported = load_backend(export_end_to_end(yolo26, tmp_path, no_check=True))
    info = ModelInfo(names=NAMES, strides=yolo26.strides, imgsz=MODEL_IMGSZ, dynamic=True)
    with pytest.raises(ValueError, match=r"runs the one-to-one \(end-to-end\) head, the reference the usual head"):
        check_parity(TorchBackend(yolo26, info), exported, images=synthetic_images(MODEL_IMGSZ))


def test_a_yolov8_checkpoint_and_export_are_refused_in_one_line(onnx_fp32: Path, tmp_path: Path) -> None:
    weights = write_checkpoint(lively_model(), tmp_path / "v8.pt")
    with pytest.raises(ValueError, match=rf"^{weights}: --end-to-end runs YOLO26's NMS-free \(one-to-one\) head, "
                                         r"which only YOLO26 models have; this is a YOLOv8n model$"):
        run_export(ExportOptions(weights=weights, end_to_end=True, device="cpu"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["v8.pt"]  # nothing written
    with pytest.raises(ValueError, match=rf"^{onnx_fp32}: --end-to-end .* this export was written without it"):
        load_backend(onnx_fp32, nms=NMSConfig(end_to_end=True))


def test_files_without_the_key_read_as_not_end_to_end() -> None:
    info = ModelInfo(names=NAMES, strides=(8, 16, 32), imgsz=64, end_to_end=True)
    props = encode_metadata(info)
    assert props["end_to_end"] == "true" and decode_metadata(props).end_to_end
    del props["end_to_end"]  # an export from before the key
    assert decode_metadata(props) == dataclasses.replace(info, end_to_end=False)
    with pytest.raises(ValueError, match=r"end_to_end is 'yes', not true or false"):
        decode_metadata({**props, "end_to_end": '"yes"'})
