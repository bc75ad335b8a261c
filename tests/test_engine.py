import pytest
import torch

from detector.ema import ModelEMA
from detector.engine import StepSchedule, resize_batch, step_input, train_one_epoch
from detector.loss import DetectionLoss
from detector.model import build_model
from detector.multiscale import MultiScale
from detector.optim import build_optimizer
from detector.precision import Precision, cpu_has_native_bf16, resolve_precision


def _loader(batches: int = 2):
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(batches, 2, 3, 64, 64, generator=generator) * 255).to(torch.uint8)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4], [1, 0, 0.3, 0.3, 0.2, 0.3]])
    return [(images[i], targets, [None, None]) for i in range(batches)]


def _run_epoch(precision: Precision):
    torch.manual_seed(0)
    model = build_model(num_classes=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer, _, lr = build_optimizer(model, name="AdamW", lr=1e-3, momentum=0.9, weight_decay=0.0,
                                       num_classes=2, total_steps=2)
    schedule = StepSchedule(epochs=1, steps_per_epoch=2, warmup_steps=0, base_lr=lr, final_lr_fraction=1.0,
                            cosine=False, warmup_bias_lr=0.0, warmup_momentum=0.9, momentum=0.9, batch_size=2,
                            nominal_batch=2, clip_grad=10.0)
    ema = ModelEMA(model)
    stats = train_one_epoch(model=model, criterion=DetectionLoss(num_classes=2, strides=model.strides),
                            loader=_loader(), optimizer=optimizer, scaler=precision.make_scaler(), ema=ema,
                            precision=precision, schedule=schedule, multi_scale=MultiScale(64, enabled=False),
                            epoch=0, seed=0, device=torch.device("cpu"), channels_last=True, progress=False)
    changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items() if v.is_floating_point())
    return stats, changed, ema


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_one_training_step_updates_weights(name):
    if name == "bf16" and not cpu_has_native_bf16():
        pytest.skip("CPU without native BF16")
    stats, changed, ema = _run_epoch(Precision(name, "cpu", "test"))
    assert changed and stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
    assert all(stats[k] > 0 for k in ("train/box", "train/cls", "train/dfl"))
    assert ema.updates == 2


def test_unamp_means_fp32_without_scaler():
    precision = resolve_precision("auto", torch.device("cpu"), unamp=True)
    assert precision.name == "fp32" and precision.dtype is None and not precision.make_scaler().is_enabled()
    assert not torch.backends.cuda.matmul.allow_tf32


def test_auto_precision_on_cpu_follows_hardware():
    precision = resolve_precision("auto", torch.device("cpu"))
    assert precision.name == ("bf16" if cpu_has_native_bf16() else "fp32") and precision.reason


def test_step_input_resizes_in_uint8_on_cpu_close_to_the_float_path():
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(2, 3, 64, 64, generator=generator) * 255).to(torch.uint8)
    images = images.contiguous(memory_format=torch.channels_last)
    out = step_input(images, 96, torch.device("cpu"), channels_last=True)
    assert out.shape == (2, 3, 96, 96) and out.dtype == torch.float32
    assert out.is_contiguous(memory_format=torch.channels_last)
    # The float path (what a GPU step does): resizing before or after the conversion differs by the uint8
    # rounding of the interpolated value, one grey level at most (plus float error).
    reference = resize_batch(images.float() / 255, 96)
    assert (out - reference).abs().max() <= 1.01 / 255
