"""The optimizer recipe: what ``auto`` picks and what the schedule then applies."""

import copy

import pytest
import torch

from detector.model import build_model
from detector.training.engine import StepSchedule, set_learning_rates
from detector.training.optim import AUTO_ADAMW_MAX_STEPS, build_optimizer, resolve_optimizer


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


@pytest.mark.parametrize(("total_steps", "expected"), [(9_999, "AdamW"), (10_000, "AdamW"), (10_001, "SGD")])
def test_auto_takes_adamw_up_to_and_including_10000_steps(total_steps: int, expected: str) -> None:
    """Ultralytics 8.4 (engine/trainer.py build_optimizer) leaves AdamW for ``iterations > 10000``: a run of exactly
    10,000 optimizer steps is a short one there, and here."""
    assert AUTO_ADAMW_MAX_STEPS == 10_000
    assert resolve_optimizer("auto", 0.01, num_classes=80, total_steps=total_steps)[0] == expected


def test_sgd_keeps_the_configured_bias_warmup():
    choice = build_optimizer(build_model(num_classes=3), name="SGD", lr=0.01, momentum=0.937, weight_decay=5e-4,
                             num_classes=3, total_steps=100, warmup_bias_lr=0.1)
    set_learning_rates(choice.optimizer, 0, _schedule(choice))
    assert choice.optimizer.param_groups[2]["lr"] == 0.1


def test_warm_up_ramps_an_explicit_adamws_beta1_which_ultralytics_leaves_alone():
    """docs/training.md "Optimizer and warm-up": our warm-up ramps beta1 from --warmup-momentum (0.8) as it ramps
    SGD's momentum; Ultralytics' sets only groups' ``momentum``, which torch's AdamW groups do not have."""
    choice = build_optimizer(build_model(num_classes=3), name="AdamW", lr=0.001, momentum=0.937, weight_decay=0.0,
                             num_classes=3, total_steps=100)
    assert all("momentum" not in group for group in choice.optimizer.param_groups)  # nothing for Ultralytics to ramp
    set_learning_rates(choice.optimizer, 0, _schedule(choice))
    assert all(group["betas"][0] == 0.8 for group in choice.optimizer.param_groups)


def test_explicit_adamw_keeps_its_beta1_after_warmup():
    choice = build_optimizer(build_model(num_classes=3), name="AdamW", lr=0.001, momentum=0.937, weight_decay=0.0,
                             num_classes=3, total_steps=100)
    set_learning_rates(choice.optimizer, 50, _schedule(choice))  # past the 10 warm-up steps
    assert all(group["betas"][0] == 0.937 for group in choice.optimizer.param_groups)
    assert isinstance(choice.optimizer, torch.optim.AdamW)


def test_fused_sgd_after_an_overflowed_first_step_is_a_fresh_one():
    """A GradScaler steps a fused optimizer even on overflow (with ``found_inf`` set) and its kernel then changes
    nothing; torch's fused SGD had made its momentum buffers with ``empty_like`` just before, so the next step
    read uninitialised memory. After a skipped first step, one finite step must move the weights exactly as the
    first step of a stock SGD does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    reference_model = copy.deepcopy(model)
    choice = build_optimizer(model, name="SGD", lr=0.01, momentum=0.937, weight_decay=5e-4, num_classes=3,
                             total_steps=100_000)
    assert choice.optimizer.defaults["fused"]  # float32 weights on the CPU: the fused kernel, as on a GPU
    reference = build_optimizer(reference_model, name="SGD", lr=0.01, momentum=0.937, weight_decay=5e-4,
                                num_classes=3, total_steps=100_000).optimizer
    for group in reference.param_groups:
        group["fused"] = False  # the for-loop implementation, which makes its buffers from the gradient
    reference.state.clear()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(()))  # the scaler's state exists from its first scale(loss); the gradients are set below
    for param in model.parameters():  # leave NaN in freed memory, where an empty_like buffer would come from
        garbage = torch.full_like(param, float("nan"))
        del garbage
        param.grad = torch.full_like(param, float("inf"))
    before = [param.detach().clone() for param in model.parameters()]
    scaler.step(choice.optimizer)
    scaler.update()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))  # the overflow step was skipped
    gradients = [torch.randn_like(param) for param in model.parameters()]
    for param, reference_param, gradient in zip(model.parameters(), reference_model.parameters(), gradients):
        param.grad = gradient * scaler.get_scale()  # a power of two: unscaling gives the gradient back exactly
        reference_param.grad = gradient.clone()
    scaler.step(choice.optimizer)
    reference.step()
    # The same update summed in another order (fused kernel against for-loop): float32 round-off only.
    for param, reference_param in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(param, reference_param)


@pytest.mark.parametrize("name", ["Adam", "Adamax", "NAdam", "RAdam", "RMSprop"])
def test_every_optimizer_ultralytics_names_builds_with_momentum_where_it_takes_it(name: str) -> None:
    """Ultralytics' optimizer=Adam/Adamax/NAdam/RAdam/RMSprop were refused: built as there, the Adam family with
    --momentum as beta1 and RMSprop with it as momentum; three groups, the first decayed."""
    model = build_model(num_classes=2, scale="n")
    choice = build_optimizer(model, name=name, lr=0.001, momentum=0.8, weight_decay=5e-4, num_classes=2,
                             total_steps=10)
    assert type(choice.optimizer).__name__ == name and choice.name == name
    group = choice.optimizer.param_groups[0]
    assert (group["betas"][0] if "betas" in group else group["momentum"]) == 0.8
    assert [g["weight_decay"] for g in choice.optimizer.param_groups] == [5e-4, 0.0, 0.0]
    before = model.stem.conv.weight.detach().clone()
    model(torch.rand(1, 3, 64, 64))[0].sum().backward()
    choice.optimizer.step()
    assert not torch.equal(before, model.stem.conv.weight)
