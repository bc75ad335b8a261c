import pytest
import torch

from detector.training.config import TrainConfig
from detector.model import build_model, image_size_problem
from detector.postprocess import NMSConfig, postprocess


@pytest.mark.parametrize("size", [(64, 64), (96, 160), (320, 256)])
def test_output_shapes_at_several_sizes(size):
    model = build_model(num_classes=5).eval()
    with torch.no_grad():
        outputs = model(torch.rand(2, 3, *size))
    assert [tuple(o.shape) for o in outputs] == [(2, 64 + 5, size[0] // s, size[1] // s) for s in (8, 16, 32)]


def test_parameter_counts_match_yolov8():
    # Same count as YOLOv8n/s at 80 classes, so YOLOv8 checkpoints map one to one.
    assert sum(p.numel() for p in build_model(num_classes=80, scale="n").parameters()) == 3_157_200
    assert sum(p.numel() for p in build_model(num_classes=80, scale="s").parameters()) == 11_166_560


def test_unknown_scale_is_rejected():
    with pytest.raises(ValueError, match="unknown model scale"):
        build_model(num_classes=1, scale="q")


def test_postprocess_returns_boxes_inside_input_and_respects_max_detections():
    model = build_model(num_classes=2).eval()
    with torch.no_grad():
        outputs = model(torch.rand(1, 3, 64, 96))
    detections = postprocess(outputs, strides=model.strides, reg_max=16,
                             config=NMSConfig(conf_threshold=0.0, max_detections=7, multi_label=True))
    assert len(detections) == 1 and len(detections[0]["scores"]) == 7
    assert detections[0]["labels"].max() < 2


def test_one_image_size_rule_for_every_command():
    """``val`` and ``export`` refuse what training refuses, with training's own message."""
    with pytest.raises(ValueError) as refused:
        TrainConfig(imgsz=100).validate()
    assert image_size_problem(100) in str(refused.value)
    assert image_size_problem(320) is None and image_size_problem(0) is not None
