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
    with pytest.raises(ValueError, match="unknown model 'q'"):
        build_model(num_classes=1, scale="q")


# Ultralytics' yolo11.yaml states each scale's parameter count at 80 classes (its model summary); the same count
# here, with the module shapes of tests/weights (its state dict copied tensor for tensor), is the architecture.
@pytest.mark.parametrize(("name", "parameters"), [("11n", 2_624_080), ("11s", 9_458_752), ("11m", 20_114_688),
                                                  ("11l", 25_372_160), ("11x", 56_966_176)])
def test_yolo11_parameter_counts_match_ultralytics(name, parameters):
    with torch.device("meta"):  # shapes only: the x scale's weights need not be allocated
        model = build_model(num_classes=80, scale=name)
    assert sum(p.numel() for p in model.parameters()) == parameters


@pytest.mark.parametrize("size", [(64, 64), (96, 160)])
def test_yolo11_trains_and_infers_in_both_memory_layouts(size):
    """Its attention reshapes a map's positions into a sequence: in channels-last memory a view would fail."""
    torch.manual_seed(0)
    model = build_model(num_classes=3, scale="11n")
    images = torch.rand(2, 3, *size)
    outputs = model(images)
    assert [tuple(o.shape) for o in outputs] == [(2, 64 + 3, size[0] // s, size[1] // s) for s in (8, 16, 32)]
    sum(o.float().square().mean() for o in outputs).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        plain = model(images)
        model.to(memory_format=torch.channels_last)
        last = model(images.contiguous(memory_format=torch.channels_last))
    for a, b in zip(plain, last):
        # Same arithmetic in another memory order: only the summation order of the convolutions differs (FP32,
        # ~1e-6 relative per layer over ~100 layers).
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


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


# Ultralytics' yolo26.yaml states each scale's parameter count at 80 classes (its model summary, both heads).
@pytest.mark.parametrize(("name", "parameters"), [("26n", 2_572_280), ("26s", 10_009_784), ("26m", 21_896_248),
                                                  ("26l", 26_299_704), ("26x", 58_993_368)])
def test_yolo26_parameter_counts_match_ultralytics(name, parameters):
    with torch.device("meta"):
        model = build_model(num_classes=80, scale=name)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model.reg_max == 1 and model.head.end_to_end


def test_yolo26_trains_both_branches_and_infers_with_one():
    """In training its head returns the usual maps then the one-to-one branch's (6 maps of 4 + C channels: distances,
    no DFL bins); the one-to-one branch's loss reaches the head alone (its inputs are detached). In evaluation one
    branch's 3 maps: the usual one by default, the one-to-one with ``head.one_to_one``."""
    torch.manual_seed(0)
    model = build_model(num_classes=3, scale="26n")
    images = torch.rand(2, 3, 64, 96)
    outputs = model(images)
    assert [tuple(o.shape) for o in outputs] == [(2, 4 + 3, 64 // s, 96 // s) for s in (8, 16, 32)] * 2
    sum(o.float().square().mean() for o in outputs[3:]).backward()  # the one-to-one branch's alone
    one_to_one = {name for name, _ in model.named_parameters() if name.startswith("head.one2one_")}
    reached = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert one_to_one and reached == one_to_one
    model.eval()
    with torch.no_grad():
        usual = model(images)
        model.head.one_to_one = True
        paired = model(images)
    assert len(usual) == len(paired) == 3
    for a, b, c, d in zip(usual, paired, outputs[:3], outputs[3:]):
        # The branches start as copies (Ultralytics deep-copies them), so at initialisation they agree; evaluation
        # differs from training in BatchNorm's statistics only, which both branches share upstream.
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, d)


def test_yolo26_refuses_dfl_bins():
    with pytest.raises(ValueError, match="regresses box distances directly"):
        build_model(num_classes=3, scale="26n", reg_max=16)
