"""The run's plan (detector/training/plans.py): what its line says of the warm-up."""

from __future__ import annotations

from types import SimpleNamespace

from detector.training.budget import EpochPlan
from detector.training.plans import RunPlans
from detector.training.schedule import StepSchedule


def plans_with(schedule: StepSchedule) -> RunPlans:
    plans = RunPlans()
    plans.step = SimpleNamespace(schedule=schedule)  # type: ignore[assignment]  # all the warm-up reads
    return plans


def schedule(epochs: int, warmup_steps: int) -> StepSchedule:
    return StepSchedule(epochs=epochs, steps_per_epoch=4, warmup_steps=warmup_steps, base_lr=0.01,
                        final_lr_fraction=0.01, cosine=False, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.937,
                        batch_size=16, nominal_batch=64, clip_grad=10.0)


def test_the_plan_line_says_the_warm_up_the_schedule_gets():
    """The review's --time 40s: 73 epochs of 4 steps, warm-up 2.2 epochs scaled, so 100 steps by the floor and 73 by
    the quarter-of-the-run cap: ~18 epochs, which the line said as "2.2"."""
    plans = plans_with(schedule(epochs=100, warmup_steps=100))
    warmup = plans._warmup_epochs(73, 2.2, at_step=0)
    assert warmup == 73 / 4
    plan = EpochPlan(epochs=73, close_mosaic=7, warmup_epochs=2.2, budget_seconds=40.0, epoch_seconds=0.3,
                     val_seconds=0.05, measured=False, budget_text="40s")
    assert "warm-up 18 epochs" in plan.describe(warmup_epochs=warmup)
    # Mid-run, a re-fit to a shorter run: the warm-up under way ends early (detector/training/schedule.py).
    plans = plans_with(schedule(epochs=95, warmup_steps=95))
    assert plans._warmup_epochs(17, 2.9, at_step=40) == 50 / 4
