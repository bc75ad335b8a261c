"""The timed probe (detector/training/probe.py): it times the loop's own steps and leaves the run's state untouched."""

from __future__ import annotations

import torch

from detector.data.letterbox import ImageMeta
from detector.loss import DetectionLoss
from detector.model import build_model
from detector.precision import Precision
from detector.training.ema import ModelEMA
from detector.training.engine import TrainStep
from detector.training.optim import build_optimizer
from detector.training.probe import ProbeResult, size_factor, time_training_steps, time_validation_images
from detector.training.schedule import StepSchedule


def _batch(seed: int) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8, generator=generator)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.3], [1, 0, 0.4, 0.6, 0.2, 0.4]])
    metas = [ImageMeta(image_id=index, original_hw=(64, 64), ratio=1.0, pad=(0.0, 0.0)) for index in range(2)]
    return images, targets, metas


def test_probe_times_steps_on_copies_and_leaves_the_run_untouched():
    torch.manual_seed(0)
    model = build_model(num_classes=3, scale="n")
    choice = build_optimizer(model, name="SGD", lr=0.01, momentum=0.9, weight_decay=5e-4, num_classes=3, total_steps=10)
    ema = ModelEMA(model)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    averaged = {k: v.clone() for k, v in ema.module.state_dict().items()}
    schedule = StepSchedule(epochs=1, steps_per_epoch=4, warmup_steps=0, base_lr=0.01, final_lr_fraction=1.0,
                            cosine=False, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.9, batch_size=2,
                            nominal_batch=2, clip_grad=10.0)
    criterion = DetectionLoss(num_classes=3, strides=model.strides, reg_max=model.reg_max)
    rng_before = torch.random.get_rng_state()
    step = TrainStep(model, criterion, choice.optimizer, Precision("fp32", "cpu", "test").make_scaler(), ema,
                     Precision("fp32", "cpu", "test"), schedule, torch.device("cpu"))
    seconds, timed = time_training_steps(iter([_batch(1)]), first=_batch(0), step=step, image_size=64, min_steps=1,
                                         max_steps=2)
    assert seconds > 0 and timed == 2  # the iterator ran out after one batch: the drawn batches are reused
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    for name, tensor in ema.module.state_dict().items():
        assert torch.equal(tensor, averaged[name]), name
    assert ema.updates == 0  # and the real optimizer's momentum buffers still the zeros it was built with:
    assert choice.optimizer.state and all(not s["momentum_buffer"].any() for s in choice.optimizer.state.values())
    assert torch.equal(torch.random.get_rng_state(), rng_before)


def test_probe_stops_at_its_time_allowance_after_its_minimum_steps():
    model = build_model(num_classes=3, scale="n")
    choice = build_optimizer(model, name="SGD", lr=0.01, momentum=0.9, weight_decay=0.0, num_classes=3, total_steps=10)
    schedule = StepSchedule(epochs=1, steps_per_epoch=4, warmup_steps=0, base_lr=0.01, final_lr_fraction=1.0,
                            cosine=False, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.9, batch_size=2,
                            nominal_batch=2, clip_grad=10.0)
    batches = iter([_batch(seed) for seed in range(1, 7)])
    precision = Precision("fp32", "cpu", "test")
    step = TrainStep(model, DetectionLoss(num_classes=3, strides=model.strides, reg_max=model.reg_max),
                     choice.optimizer, precision.make_scaler(), ModelEMA(model), precision, schedule, torch.device("cpu"))
    _, timed = time_training_steps(batches, first=_batch(0), step=step, image_size=64, prefetched=3, min_steps=2,
                                   max_steps=4, max_seconds=0.0)
    assert timed == 2
    assert len(list(batches)) == 1  # 3 prefetched batches drawn untimed, then 2 timed steps: 1 of 6 left


def test_validation_probe_and_estimates():
    calls: list[int] = []
    per_image = time_validation_images(lambda images: calls.append(len(images)), torch.zeros(16, 3, 8, 8),
                                       max_images=8)
    assert calls == [8, 8] and per_image >= 0  # an untimed pass on the same shape, then the timed one
    probe = ProbeResult(step_seconds=0.5, steps_timed=3, val_image_seconds=0.01)
    assert probe.epoch_seconds(100, size_factor=1.2) == 60.0 and probe.val_seconds(400) == 4.0
    assert ProbeResult(0.5, 1).val_seconds(400) is None
    # Multi-scale 448-576 around 512: the mean pixel cost of the ladder, not 1.
    assert size_factor([448, 512, 576], 512) == (448**2 + 512**2 + 576**2) / 3 / 512**2
    assert size_factor([640] * 5, 640) == 1.0
