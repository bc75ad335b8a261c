"""A validation pass's loss (detector/metrics/val_loss.py) against the training criterion run on the same batches."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from detector.inference.preprocess import model_input
from detector.inference.torch_backend import make_torch_infer
from detector.loss import DetectionLoss, LossGains
from detector.metrics.loop import make_val_loader, run_validation
from detector.metrics.val_loss import LOSS_COLUMNS, InferWithLoss, LossMeter
from detector.postprocess import NMSConfig
from detector.precision import Precision
from tests.conftest import lively_model
from tests.metrics.test_loop import write_split

FP32 = Precision("fp32", "cpu", "test")
NMS = NMSConfig(conf_threshold=0.001, iou_threshold=0.7, max_detections=300, multi_label=True)


def _criterion(model: torch.nn.Module) -> DetectionLoss:
    # Gains of their own: the columns must carry the criterion's, not the defaults.
    return DetectionLoss(num_classes=model.num_classes, strides=model.strides, reg_max=model.reg_max,
                         gains=LossGains(box=5.0, cls=0.75, dfl=2.0))


def test_a_passs_loss_is_the_training_criterion_on_its_batches_averaged_over_images(tmp_path: Path):
    """Rectangular batches of 2, 2 and 1 images, each its own canvas (128x160, 160x160, 160x96: the targets are
    normalised to it, tests/metrics/test_loop.py checks): the pass's columns are the criterion's parts of each
    batch, from the maps its detections came from, weighted by the batch's images."""
    split = write_split(tmp_path)
    batches = list(make_val_loader(split, batch_size=2, workers=0, rect=True))
    assert [len(images) for images, _, _ in batches] == [2, 2, 1]
    model = lively_model(num_classes=2).eval()
    criterion = _criterion(model)
    infer = make_torch_infer(model, precision=FP32, nms=NMS, device=torch.device("cpu"), with_maps=True)
    validation = run_validation(InferWithLoss(infer, LossMeter(criterion)), split, batches, progress=False)

    weighted, images = torch.zeros(3, dtype=torch.float64), 0
    with torch.no_grad():
        for batch_images, targets, _ in batches:
            maps = model(model_input(batch_images, torch.device("cpu"), channels_last=False))
            _, parts = criterion(maps, targets, batch_images.shape[2:], across_ranks=False)
            weighted += torch.stack([parts["box"], parts["cls"], parts["dfl"]]).double() * len(batch_images)
            images += len(batch_images)
    expected = (weighted / images).tolist()
    assert list(validation.losses) == list(LOSS_COLUMNS)
    assert all(value > 0 for value in expected)
    # The same batches through the same operations: the parts agree to the bit; the meter adds three weighted terms
    # in FP32 and divides once, a relative rounding of at most 4 units of FP32's 2**-24 each.
    assert [validation.losses[name] for name in LOSS_COLUMNS] == pytest.approx(expected, rel=4 * 2**-24)


def test_a_pass_without_a_meter_has_no_losses_and_a_meter_without_batches_reads_nothing(tmp_path: Path):
    split = write_split(tmp_path)
    model = lively_model(num_classes=2).eval()
    infer = make_torch_infer(model, precision=FP32, nms=NMS, device=torch.device("cpu"))
    batches = list(make_val_loader(split, batch_size=4, workers=0))
    assert run_validation(infer, split, batches, progress=False).losses == {}
    assert LossMeter(_criterion(model)).means() == {}


def test_a_batch_whose_loss_is_not_finite_is_left_out_as_training_leaves_out_its_step(tmp_path: Path):
    """A forward that overflowed (inf in the maps) would turn the pass's mean into NaN: it counts for nothing, as
    a training step whose loss was not finite does; a pass of such batches only reads NaN."""
    split = write_split(tmp_path)
    (images, targets, _), (other_images, other_targets, _) = list(make_val_loader(split, batch_size=2, workers=0))[:2]
    model = lively_model(num_classes=2).eval()
    with torch.no_grad():
        maps = model(model_input(images, torch.device("cpu"), channels_last=False))
        other_maps = model(model_input(other_images, torch.device("cpu"), channels_last=False))
    broken = [torch.full_like(level, math.inf) for level in other_maps]
    alone, mixed, failed = (LossMeter(_criterion(model)) for _ in range(3))
    alone.add(maps, targets, tuple(images.shape[2:]))
    mixed.add(maps, targets, tuple(images.shape[2:]))
    mixed.add(broken, other_targets, tuple(other_images.shape[2:]))
    failed.add(broken, other_targets, tuple(other_images.shape[2:]))
    assert mixed.means() == alone.means() and all(math.isfinite(v) for v in alone.means().values())
    assert all(math.isnan(value) for value in failed.means().values())
