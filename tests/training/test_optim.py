"""The optimizer recipe: what ``auto`` picks and what the schedule then applies."""

import torch

from detector.model import build_model
from detector.training.engine import StepSchedule, set_learning_rates
from detector.training.optim import build_optimizer


def _schedule(choice, warmup_steps: int = 10) -> StepSchedule:
    return StepSchedule(epochs=10, steps_per_epoch=10, warmup_steps=warmup_steps, base_lr=choice.lr,
                        final_lr_fraction=0.01, cosine=False, warmup_bias_lr=choice.warmup_bias_lr,
                        warmup_momentum=0.8, momentum=choice.momentum, batch_size=16, nominal_batch=64, clip_grad=10.0)


def test_auto_adamw_changes_only_the_optimizer_and_learning_rate():
    choice = build_optimizer(build_model(num_classes=80), name="auto", lr=0.01, momentum=0.937, weight_decay=5e-4,
                             num_classes=80, total_steps=100, warmup_bias_lr=0.1)
    assert choice.name == "AdamW" and choice.lr == round(0.01 / 84, 6)
    # The configured warm-up is kept (measured on BCCD: a bias start of 0, as Ultralytics' auto uses, lost
    # 0.04-0.07 mAP50-95 at 40 epochs; see detector/training/optim.py).
    assert choice.warmup_bias_lr == 0.1 and choice.momentum == 0.937
    set_learning_rates(choice.optimizer, 0, _schedule(choice))
    assert choice.optimizer.param_groups[2]["lr"] == 0.1 and choice.optimizer.param_groups[0]["lr"] == 0.0


def test_sgd_keeps_the_configured_bias_warmup():
    choice = build_optimizer(build_model(num_classes=3), name="SGD", lr=0.01, momentum=0.937, weight_decay=5e-4,
                             num_classes=3, total_steps=100, warmup_bias_lr=0.1)
    set_learning_rates(choice.optimizer, 0, _schedule(choice))
    assert choice.optimizer.param_groups[2]["lr"] == 0.1


def test_explicit_adamw_keeps_its_beta1_after_warmup():
    choice = build_optimizer(build_model(num_classes=3), name="AdamW", lr=0.001, momentum=0.937, weight_decay=0.0,
                             num_classes=3, total_steps=100)
    set_learning_rates(choice.optimizer, 50, _schedule(choice))  # past the 10 warm-up steps
    assert all(group["betas"][0] == 0.937 for group in choice.optimizer.param_groups)
    assert isinstance(choice.optimizer, torch.optim.AdamW)
