"""The learning rate, momentum and gradient accumulation of every training step: a pure function of the step.

Warm-up (YOLOv5 style) over the first ``warmup_steps`` steps: weight LR rises from 0, bias LR falls from
``warmup_bias_lr``, both to the decayed target; momentum rises from ``warmup_momentum``; accumulation rises
from 1 micro-batch per optimizer step to ``nominal_batch / batch_size``. The target decays (linear or
cosine) from ``base_lr`` to ``base_lr * final_lr_fraction`` at the run's last step.

A ``--time`` budget changes the run's length while it trains (detector/training/budget.py). Recomputing a
``lr(step, epochs)`` curve for the new length would move the LR of the very next step: issue 23 computed
0.0033 -> 0.0093 for VOC with ``--time 3h``. So a re-plan goes through :meth:`StepSchedule.replan`, which
changes only what lies ahead: the decay continues from the point it has reached at that step (same
progress along the curve, so the same LR and momentum), stretched or compressed to end at the new last
step. A started warm-up is never made longer; one that a shorter run caps (a quarter of the run: the plan passes the
capped length) ends early: its ramp is re-anchored at the re-plan's step, from the fraction reached there to 1, over
the fewest steps that rise no faster than a fresh ramp of the capped length (a 95-step warm-up re-planned at step 40
to a 68-step run: 40 % done, the rest over 10 steps, warm-up ends at step 50; kept, the run was all warm-up and its LR
peaked at 0.31 x lr0). The next step's LR then differs from the previous step's by the old schedule's own slope,
never more::

    schedule = schedule.replan(at_step=steps_done, epochs=new_total)
    lr = schedule.values(steps_done).weight_lr  # == the old schedule's value at steps_done
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["StepRole", "StepSchedule", "StepValues", "step_role"]


@dataclass(frozen=True)
class StepValues:
    """What the optimizer uses at one step. ``accumulate`` is micro-batches per optimizer step."""

    weight_lr: float
    bias_lr: float
    momentum: float
    accumulate: int


@dataclass(frozen=True)
class StepSchedule:
    """Warm-up, decay and accumulation of a run of ``epochs * steps_per_epoch`` steps.

    ``anchor_step`` and ``anchor_progress`` place the decay after a re-plan: from ``anchor_step`` on, the
    progress along the decay curve runs linearly from ``anchor_progress`` to 1 at the run's last step,
    ``total_steps - 1``. A run that was never re-planned has (0, 0): progress is ``step / (total_steps - 1)``.
    """

    epochs: int
    steps_per_epoch: int
    warmup_steps: int
    base_lr: float
    final_lr_fraction: float
    cosine: bool
    warmup_bias_lr: float
    warmup_momentum: float
    momentum: float
    batch_size: int  # images per step across all processes
    nominal_batch: int
    clip_grad: float
    anchor_step: int = 0
    anchor_progress: float = 0.0
    # A warm-up shortened mid-ramp (see replan): the ramp's fraction runs 0 -> warmup_anchor_fraction over steps
    # 0 -> warmup_anchor_step, then linearly to 1 at warmup_steps. (0, 0): the plain ramp step / warmup_steps.
    warmup_anchor_step: int = 0
    warmup_anchor_fraction: float = 0.0

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def progress(self, step: int) -> float:
        """Fraction of the decay done at ``step``, in [0, 1]: 1 at the run's last step, ``total_steps - 1`` (it was
        ``step / total_steps``, 1 a step after the last: 4 epochs of 2 steps ended at 13x lr0 * lrf)."""
        remaining = self.total_steps - 1 - self.anchor_step
        # A run of one step, or re-planned to end at (or before) the anchor: the decay stops where it was (a jump to
        # the final rate would be a step the schedule never takes elsewhere).
        if remaining <= 0:
            return min(max(self.anchor_progress, 0.0), 1.0)
        progress = self.anchor_progress + (1.0 - self.anchor_progress) * (step - self.anchor_step) / remaining
        return min(max(progress, 0.0), 1.0)

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``base_lr`` at ``step`` after warm-up: linear or cosine from 1 to ``final_lr_fraction``."""
        progress, final = self.progress(step), self.final_lr_fraction
        if self.cosine:
            return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))
        return (1 - progress) * (1.0 - final) + final

    def warmup_fraction(self, step: int) -> float:
        """How far along the warm-up ramp ``step`` is, in [0, 1] (1: warm-up over)."""
        if step >= self.warmup_steps:
            return 1.0
        if self.warmup_anchor_step <= 0:
            return float(np.interp(step, [0, self.warmup_steps], [0.0, 1.0]))
        return float(np.interp(step, [0, self.warmup_anchor_step, self.warmup_steps],
                               [0.0, self.warmup_anchor_fraction, 1.0]))

    def values(self, step: int) -> StepValues:
        """Weight LR, bias LR, momentum and accumulation at ``step`` (0-based, counted over the whole run)."""
        target = self.base_lr * self.lr_factor(step)
        full_accumulation = max(round(self.nominal_batch / self.batch_size), 1)
        if step >= self.warmup_steps:
            return StepValues(target, target, self.momentum, full_accumulation)
        ramp = self.warmup_fraction(step)
        return StepValues(
            weight_lr=ramp * target,
            bias_lr=self.warmup_bias_lr + ramp * (target - self.warmup_bias_lr),
            momentum=self.warmup_momentum + ramp * (self.momentum - self.warmup_momentum),
            accumulate=max(1, round(1 + ramp * (full_accumulation - 1))),
        )

    def replan(self, *, at_step: int, epochs: int, warmup_steps: int | None = None) -> StepSchedule:
        """The schedule for a run re-planned to ``epochs`` when ``at_step`` steps are done.

        Equal to this one at ``at_step``; only the rest changes (see the module docstring). ``warmup_steps`` (the
        warm-up a plan of ``epochs`` gets, capped) replaces the warm-up before the first step; after it, a shorter one
        ends a ramp still under way early (:meth:`_warmup_ended_early`), and a longer one is ignored.
        """
        if epochs < 1 or at_step < 0:
            raise ValueError(f"replan needs epochs >= 1 and at_step >= 0 (got {epochs}, {at_step})")
        if at_step == 0 and warmup_steps is not None:
            warmup = {"warmup_steps": warmup_steps, "warmup_anchor_step": 0, "warmup_anchor_fraction": 0.0}
        else:
            warmup = self._warmup_ended_early(at_step, warmup_steps)
        return dataclasses.replace(self, epochs=epochs, anchor_step=at_step, anchor_progress=self.progress(at_step),
                                   **warmup)

    def _warmup_ended_early(self, at_step: int, capped: int | None) -> dict[str, float | int]:
        """The warm-up fields after a re-plan at ``at_step`` (> 0) whose plan caps the warm-up at ``capped`` steps:
        the ramp, if still under way and longer, re-anchored at ``at_step`` (same fraction there, so the same LR,
        momentum and accumulation) and finished as soon as a ramp no steeper than ``capped`` steps' allows."""
        kept = {"warmup_steps": self.warmup_steps, "warmup_anchor_step": self.warmup_anchor_step,
                "warmup_anchor_fraction": self.warmup_anchor_fraction}
        if capped is None or capped >= self.warmup_steps or at_step >= self.warmup_steps:
            return kept
        reached = self.warmup_fraction(at_step)
        ends = max(capped, at_step + math.ceil((1.0 - reached) * max(capped, 1)))
        if ends >= self.warmup_steps:  # the old ramp ends sooner anyway
            return kept
        return {"warmup_steps": ends, "warmup_anchor_step": at_step, "warmup_anchor_fraction": reached}

    def state(self) -> dict[str, float | int]:
        """What a checkpoint keeps so that ``--resume`` continues this very schedule (see :meth:`restored`)."""
        return {"epochs": self.epochs, "warmup_steps": self.warmup_steps, "anchor_step": self.anchor_step,
                "anchor_progress": self.anchor_progress, "steps_per_epoch": self.steps_per_epoch,
                "warmup_anchor_step": self.warmup_anchor_step, "warmup_anchor_fraction": self.warmup_anchor_fraction}

    def restored(self, state: dict[str, float | int], *, at_epoch: int | None = None) -> StepSchedule:
        """This schedule continued from ``state``. Its steps (warm-up, the re-plan's anchor) are counted in the saved
        run's steps per epoch: a resume under torchrun with another number of processes (or ``--batch``) has other
        epochs' worth of steps, so they are carried over by the epochs they stand for (mixed, the learning rate
        jumped by ~40% at the first resumed step). The decay by epochs still differs by up to one step of the
        coarser run, as its last step, where the decay ends, lies at epoch ``epochs - 1 / steps_per_epoch``; given
        ``at_epoch``, the epoch the run resumes at, it is re-anchored there (as a re-plan is) so that the first
        resumed step has the saved run's decay exactly. Older checkpoints: as saved."""
        saved = int(state.get("steps_per_epoch", self.steps_per_epoch)) or self.steps_per_epoch
        scale = self.steps_per_epoch / saved

        def carried(factor: float) -> StepSchedule:
            return dataclasses.replace(self, epochs=int(state["epochs"]), steps_per_epoch=round(saved * factor),
                                       warmup_steps=round(int(state["warmup_steps"]) * factor),
                                       anchor_step=round(int(state["anchor_step"]) * factor),
                                       anchor_progress=float(state["anchor_progress"]),
                                       warmup_anchor_step=round(int(state.get("warmup_anchor_step", 0)) * factor),
                                       warmup_anchor_fraction=float(state.get("warmup_anchor_fraction", 0.0)))

        restored = carried(scale)
        if at_epoch is None or saved == self.steps_per_epoch:
            return restored
        reached = carried(1.0).progress(at_epoch * saved)  # the saved run's decay at that epoch
        return dataclasses.replace(restored, anchor_step=at_epoch * self.steps_per_epoch, anchor_progress=reached)


@dataclass(frozen=True)
class StepRole:
    """What one training step does beyond its forward and backward passes. The loop reads it from
    :func:`step_role`, and so does ``benchmarks/graph_keys.py``, whose count of CUDA-graph keys must follow the
    loop's own rules."""

    stepping: bool  # it ends with the optimizer: accumulation is complete, or it is the epoch's last batch
    # ... and warm-up is over: a CUDA graph bakes in momentum (AdamW's beta1), which warm-up ramps each step, so
    # until then graphs run the forward and backward passes only and the optimizer steps eagerly after them
    graphed_optimizer: bool
    warmup_ended: bool  # the first step after warm-up, without accumulation: no forward-and-backward-only step follows


def step_role(schedule: StepSchedule, step: int, *, accumulate: int, last_optimizer_step: int,
              last_in_epoch: bool) -> StepRole:
    """The role of ``step`` (counted over the run), whose accumulation is ``accumulate`` (``schedule.values(step)``),
    when the optimizer last stepped at ``last_optimizer_step``; ``last_in_epoch``: the epoch's last batch, which
    always steps (accumulation needs nothing baked into a graph: it only chooses the steps that end with the
    optimizer). Ours, not Ultralytics' (which carries accumulation across epochs): an epoch's end, where last.pt is
    written, then holds no half-accumulated gradients, which no checkpoint stores, so --resume and a Ctrl-C'd run go
    on as the uninterrupted run does; the cost is one smaller step an epoch (docs/training.md, "Optimizer and
    warm-up")."""
    stepping = step - last_optimizer_step >= accumulate or last_in_epoch
    return StepRole(stepping=stepping, graphed_optimizer=stepping and step >= schedule.warmup_steps,
                    warmup_ended=step == schedule.warmup_steps and accumulate == 1)
