import json

import pytest
import torch
from torch import nn

from detector.loss import DetectionLoss
from detector.model import build_model
from detector.precision import cpu_has_native_bf16
from detector.training.amp_check import amp_preflight, median_tensor_cosine, save_preflight
from tests.conftest import make_train_step


class OverflowsInFP16(nn.Module):
    """A planted failure: activations beyond FP16's range (65504) but fine in FP32/BF16."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        return self.model(images * 1e6)


def _batch():
    torch.manual_seed(0)
    images = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.4], [1, 0, 0.3, 0.3, 0.2, 0.3]])
    return images, targets


def test_healthy_model_keeps_its_precision():
    model = build_model(num_classes=2)
    images, targets = _batch()
    name = "bf16" if cpu_has_native_bf16() else "fp16"
    chosen, result = amp_preflight(make_train_step(model, precision=name), images, targets)
    assert chosen.name == name and not result.fell_back and result.checks[0].passed
    assert result.checks[0].loss_relative_error < 0.05


def test_planted_fp16_overflow_is_detected_and_falls_back(tmp_path):
    inner = build_model(num_classes=2)
    model = OverflowsInFP16(inner)
    images, targets = _batch()
    step = make_train_step(inner, precision="fp16")
    step.model, step.criterion = model, DetectionLoss(num_classes=2, strides=inner.strides)
    chosen, result = amp_preflight(step, images, targets)
    assert chosen.name in ("bf16", "fp32") and result.fell_back
    assert result.checks[0].precision == "fp16" and not result.checks[0].passed
    assert "falling back" in result.line()
    save_preflight(result, tmp_path / "amp_check.json")

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    # Strict JSON: the overflowed loss is null, not NaN/Infinity (which strict parsers refuse)
    evidence = json.loads((tmp_path / "amp_check.json").read_text(), parse_constant=refuse)
    assert evidence["chosen"] == chosen.name and evidence["checks"][0]["loss_amp"] is None


def test_a_gradient_unrelated_to_fp32s_fails_the_check(monkeypatch):
    """A precision whose loss is right but whose gradient points anywhere, with the real one's magnitudes (FP32's
    gradient with random signs: its energy in the same few coordinates, the hardest unrelated case): the median
    tensor's cosine is what catches it, ~0 against the bound of 0.1."""
    from detector.training import amp_check

    real_step = amp_check._step
    generator = torch.Generator().manual_seed(0)

    def scrambled(model, criterion, images, targets, precision, assigned=None):
        loss, grads, kept = real_step(model, criterion, images, targets, precision, assigned)
        if precision.name == "fp32":
            return loss, grads, kept
        return loss, [grad * (torch.randint(0, 2, grad.shape, generator=generator) * 2 - 1) for grad in grads], kept

    monkeypatch.setattr(amp_check, "_step", scrambled)
    images, targets = _batch()
    name = "bf16" if cpu_has_native_bf16() else "fp16"
    chosen, result = amp_preflight(make_train_step(build_model(num_classes=2), precision=name), images, targets)
    check = result.checks[0]
    assert result.fell_back and not check.passed and abs(check.median_tensor_cosine) < 0.1
    assert check.reason.startswith("gradient direction differs from FP32 (cosine per tensor")


def test_the_median_tensor_cosine_ignores_tensors_without_a_reference_direction():
    ones, zero = torch.ones(4), torch.zeros(4)
    assert median_tensor_cosine([ones, -ones, ones], [ones, ones, ones]) == 1.0  # median of 1, -1, 1
    assert median_tensor_cosine([-ones, ones], [zero, ones]) == 1.0  # the zero reference says nothing
    assert median_tensor_cosine([-ones], [ones]) == -1.0


def test_the_check_steps_on_the_first_images_of_the_batch_with_their_targets():
    from detector.training.amp_check import CHECK_IMAGES, first_images

    images = torch.zeros(CHECK_IMAGES + 4, 3, 32, 32)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.1, 0.1], [CHECK_IMAGES - 1, 2, 0.5, 0.5, 0.1, 0.1],
                            [CHECK_IMAGES, 0, 0.5, 0.5, 0.1, 0.1]])
    kept_images, kept_targets = first_images(images, targets)
    assert len(kept_images) == CHECK_IMAGES and kept_targets[:, 0].tolist() == [0, CHECK_IMAGES - 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN autotuning exists on CUDA only")
def test_the_check_runs_under_cudnn_heuristics_and_restores_autotuning(monkeypatch):
    # Its shapes are never trained on, so autotuning them would be paid for nothing (detector/training/amp_check.py).
    model = build_model(num_classes=2).cuda()
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(torch.backends.cudnn.benchmark))
    images, targets = _batch()
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # a run that autotunes
    amp_preflight(make_train_step(model, precision="fp16", device="cuda"), images.cuda(), targets.cuda())
    assert seen and not any(seen)  # the FP32 reference and each candidate's step: the hook is deep-copied with them
    assert torch.backends.cudnn.benchmark is True


@pytest.mark.parametrize("name", ["fp32", "fp16"])
def test_the_runs_check_reads_its_first_loader_batch_and_keeps_its_evidence(name, tmp_path):
    """``check_first_batch``: what the trainer runs before step 0, on the loader's uint8 batch (collate output)."""
    from detector.training.amp_check import check_first_batch

    images, targets = _batch()
    batch = ((images * 255).to(torch.uint8), targets, None)
    step, lines = make_train_step(build_model(num_classes=2), precision=name), []
    chosen, reason = check_first_batch(step, batch, channels_last=False, save_to=tmp_path / "amp_check.json",
                                       log=lines.append)
    if name == "fp32":  # nothing to check: no line, no file
        assert (chosen, lines) == ("fp32", []) and not (tmp_path / "amp_check.json").exists()
        return
    evidence = json.loads((tmp_path / "amp_check.json").read_text())
    assert evidence["requested"] == name and evidence["chosen"] == chosen and len(lines) == 1
    assert reason == ("chosen by the AMP check" if chosen != name else step.precision.reason)
