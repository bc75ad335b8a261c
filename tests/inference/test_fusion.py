"""BatchNorm folded into the convolutions: no BatchNorm left, the same outputs within FP32 summation order."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from detector.exporting.parity import synthetic_images
from detector.inference.fusion import fuse_conv_bn
from detector.model import YOLO
from tests.tolerances import fp32_tolerance_on


def test_fused_model_has_no_batchnorm_and_the_same_outputs(model: YOLO) -> None:
    images = synthetic_images(64, count=2)
    fused = fuse_conv_bn(copy.deepcopy(model).eval())
    assert not any(isinstance(module, nn.BatchNorm2d) for module in fused.modules())
    with torch.no_grad():
        expected, got = model(images.float() / 255), fused(images.float() / 255)
    # Folding rounds each weight once more (eps/2 relative): inside the depth * sqrt(fan-in) * eps bound.
    tolerance = fp32_tolerance_on(model, images)
    for want, have in zip(expected, got):
        assert (want - have).abs().max() <= tolerance.logit


def test_fusing_a_training_model_is_refused() -> None:
    with pytest.raises(ValueError, match="eval"):
        fuse_conv_bn(YOLO(num_classes=2).train())
