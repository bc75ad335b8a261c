"""The run's plan, the part of :class:`~detector.training.trainer.Trainer` that fits it: the input shapes still to
train, the epochs, close-mosaic and warm-up epochs as ``--time`` fits them (from a timed probe before the first step,
then after every epoch), and what every rank does with rank 0's decision.

A base class of the Trainer, kept in its own module so that each reads in one sitting; it reads the Trainer's
objects, listed below, and changes only the plan (``epochs``, ``close_mosaic``, ``warmup_epochs``, the schedule, the
multi-scale list, and under ``--optimizer auto`` the optimizer chosen for the fitted length).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader

from detector.data.build import SplitData
from detector.data.sampler import RectBatchSampler
from detector.distributed import DistInfo, decide_on_main, unwrap
from detector.plots.reporter import RunReporter
from detector.precision import Precision
from detector.training.budget import RunClock, RunSettings
from detector.training.builders import build_optimization, warmup_steps
from detector.training.config import TrainConfig
from detector.training.decision import EpochDecision
from detector.training.engine import TrainStep
from detector.training.multiscale import MultiScale, images_per_step
from detector.training.probe import ProbeResult, plan_from_probe, size_factor, time_training_steps
from detector.training.schedule import StepSchedule
from detector.training.step_input import sized_shape
from detector.training.validator import Validator
from detector.tuning import autotune_convolutions

# At most this fraction of a --time budget goes to timing training steps before the first one (at least two
# steps are timed): on a 2-core CPU a 640 px step takes seconds, and a 3-minute budget should keep most of them.
PROBE_BUDGET_FRACTION = 0.02


class RunPlans:
    """Fits and follows the run's plan (see the module docstring); the Trainer sets every attribute below."""

    config: TrainConfig
    clock: RunClock
    step: TrainStep
    dist: DistInfo
    device: torch.device
    multi_scale: MultiScale
    sampler: object  # the training sampler: its len() is the images of a pass (a RectBatchSampler's: the batches)
    train_loader: DataLoader
    validator: Validator | None
    reporter: RunReporter | None  # rank 0's: what a figure takes here sizes the final report's allowance
    val_data: SplitData | None
    optimizer_name: str
    start_epoch: int
    epochs: int
    close_mosaic: int
    warmup_epochs: float
    mosaic_closed_at: int | None
    log: Callable[[str], None]  # the Trainer's method: rank 0 prints

    def input_shapes(self) -> list[tuple[int, ...]]:
        """The distinct (batch, size) training inputs of the epochs still to run (for cuDNN and the header); under
        ``--rect`` (batch, height, width): each canvas at each size multi-scale draws (:func:`sized_shape`)."""
        rect = isinstance(self.sampler, RectBatchSampler)
        shapes = self.multi_scale.input_shapes(
            steps_per_epoch=len(self.train_loader),
            batch=self.sampler.batch if rect else images_per_step(len(self.sampler), self.config.batch),
            seed=self.config.seed, start_epoch=self.start_epoch)
        if not rect:
            return shapes
        canvases = self.sampler.input_shapes()
        return sorted({(batch, *sized_shape(height, width, size)) for batch, height, width in canvases
                       for _, size in shapes})

    def _settings(self, *, warmup_epochs: float) -> RunSettings:
        config = self.config
        # --val-interval 0 validates after the last epoch alone: an interval no run reaches.
        figure_seconds = self.reporter.figure_seconds() if self.reporter is not None else None
        return RunSettings(config.epochs, config.close_mosaic, warmup_epochs, val_interval=config.val_interval or 2**62,
                           final_seconds=self.clock.final_seconds(report=config.plots, fp32_again=config.final_fp32,
                                                                  figure_seconds=figure_seconds))

    def _fit_to_budget(self, epoch: int) -> tuple[int, int, float]:
        """(epochs, close-mosaic, warm-up epochs) for the rest of the run: as they are, or fitted to ``--time``."""
        plan = self.clock.refit(self._settings(warmup_epochs=self.warmup_epochs), epochs_done=epoch + 1,
                                mosaic_closed_at=self.mosaic_closed_at)
        if plan is None:
            return self.epochs, self.close_mosaic, self.warmup_epochs
        if plan.epochs != self.epochs or epoch == 0:
            at_step = (epoch + 1) * self.step.schedule.steps_per_epoch
            self.log(plan.describe(warmup_epochs=self._warmup_epochs(plan.epochs, plan.warmup_epochs, at_step)))
        return plan.epochs, plan.close_mosaic, plan.warmup_epochs

    def _plan_before_first_step(self, first: tuple, batches: Iterator) -> None:
        """Fit the plan to ``--time`` from a timed probe (detector/training/probe.py), before step 0; every rank
        follows. ``--optimizer auto`` then chooses from the fitted length: nothing has stepped yet, so the
        optimizer can be rebuilt and the schedule replaced outright."""
        config, budget = self.config, self.clock.budget
        assert budget is not None
        step_seconds, steps_timed = time_training_steps(
            batches, first=first, step=self.step, image_size=config.imgsz,
            prefetched=config.workers * (self.train_loader.prefetch_factor or 0),
            # Under torchrun the ranks must step the same number of times: no clock-dependent stop there.
            max_seconds=PROBE_BUDGET_FRACTION * budget.seconds if not self.dist.enabled else float("inf"),
        )

        def plan() -> tuple[int, int, float, float | None]:
            probe = ProbeResult(step_seconds, steps_timed, self.validator and self.validator.seconds_per_image(
                self.step.ema.module, self.step.precision, self.step.criterion))
            sizes = self.multi_scale.sizes(len(self.train_loader), seed=config.seed, epoch=0)
            val_images = len(self.val_data.records) if self.val_data else 0
            plan = plan_from_probe(self.clock, self._settings(warmup_epochs=config.warmup_epochs), probe,
                                   steps_per_epoch=len(self.train_loader), size_factor=size_factor(sizes, config.imgsz),
                                   val_images=val_images)
            warmup = self._warmup_epochs(plan.epochs, plan.warmup_epochs, at_step=0)
            self.log(f"{probe.describe()}\n{plan.describe(warmup_epochs=warmup)}")
            return plan.epochs, plan.close_mosaic, plan.warmup_epochs, probe.val_seconds(val_images)

        epochs, close_mosaic, warmup_epochs, self.clock.prior_val_seconds = decide_on_main(plan, self.dist)
        if config.optimizer == "auto":
            choice, self.step.schedule = build_optimization(
                config, unwrap(self.step.model), steps_per_epoch=len(self.train_loader),
                world_size=self.dist.world_size, epochs=epochs, warmup_epochs=warmup_epochs,
            )
            self.step.optimizer, self.optimizer_name = choice.optimizer, choice.name
        self._plan_epochs(epochs, close_mosaic, warmup_epochs, at_step=0)
        autotune_convolutions(self.device, input_shapes=len(self.input_shapes()), policy=config.cudnn_benchmark,
                              steps=len(self.train_loader) * epochs)  # decided again for the fitted length

    def _apply(self, decision: EpochDecision, *, epochs_done: int) -> None:
        """Make this rank follow ``decision``, taken after ``epochs_done`` epochs."""
        if decision.precision != self.step.precision.name:
            self.step.set_precision(Precision(decision.precision, self.device.type, decision.precision_reason))
        if (decision.epochs, decision.close_mosaic, decision.warmup_epochs) != (self.epochs, self.close_mosaic,
                                                                                self.warmup_epochs):
            self._plan_epochs(decision.epochs, decision.close_mosaic, decision.warmup_epochs,
                              at_step=epochs_done * self.step.schedule.steps_per_epoch)

    def _plan_epochs(self, epochs: int, close_mosaic: int, warmup_epochs: float, *, at_step: int) -> None:
        """Follow a new plan from step ``at_step`` on; the schedule changes only ahead (training/schedule.py)."""
        self.epochs, self.close_mosaic, self.warmup_epochs = epochs, close_mosaic, warmup_epochs
        self.step.schedule = self._replanned(epochs, warmup_epochs, at_step)
        self.multi_scale = dataclasses.replace(self.multi_scale, epochs=epochs, fixed_last_epochs=close_mosaic)

    def _replanned(self, epochs: int, warmup_epochs: float, at_step: int) -> StepSchedule:
        """The schedule re-planned at ``at_step`` for ``epochs`` (its warm-up capped for that length)."""
        schedule = self.step.schedule
        return schedule.replan(at_step=at_step, epochs=epochs,
                               warmup_steps=warmup_steps(warmup_epochs, schedule.steps_per_epoch, epochs))

    def _warmup_epochs(self, epochs: int, warmup_epochs: float, at_step: int) -> float:
        """The warm-up, in epochs, that the schedule would get from this plan: what the plan's line says (the plan's own
        figure left out the 100-step floor: "2.2 epochs" for a 73-step warm-up of 4-step epochs)."""
        schedule = self._replanned(epochs, warmup_epochs, at_step)
        return schedule.warmup_steps / schedule.steps_per_epoch
