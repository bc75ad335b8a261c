"""BatchNorm folded into the convolutions: no BatchNorm left, the same outputs within FP32 summation order."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from detector.exporting.parity import synthetic_images
from detector.inference.fusion import FusedCopy, fuse_conv_bn
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


def _trained_on(source: nn.Module, seed: int) -> None:
    """Move every weight and BatchNorm statistic, as training steps and EMA updates would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*source.parameters(), *source.buffers()]:
            if tensor.is_floating_point():
                tensor.add_(torch.rand(tensor.shape, generator=generator) * 0.01)  # positive: variances stay positive


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_refreshed_copy_is_a_fresh_fold_of_the_weights_as_they_are_now(model: YOLO, dtype: torch.dtype) -> None:
    source = copy.deepcopy(model).eval()
    folded = FusedCopy(source, dtype=dtype)
    before = {name: tensor.clone() for name, tensor in folded.module.state_dict().items()}
    _trained_on(source, seed=0)
    refreshed = folded.refresh()
    assert refreshed is folded.module  # written in place, not copied again
    fresh = fuse_conv_bn(copy.deepcopy(source).eval()).to(dtype)
    expected, got = fresh.state_dict(), refreshed.state_dict()
    assert expected.keys() == got.keys()
    for name in expected:  # the same formula on the same FP32 numbers, cast once: equal bit for bit
        assert got[name].dtype == dtype or not got[name].is_floating_point()
        assert torch.equal(got[name], expected[name]), name
    assert any(not torch.equal(before[name], got[name]) for name in got)
    assert any(isinstance(module, nn.BatchNorm2d) for module in source.modules())  # the source is left alone
