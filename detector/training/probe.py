"""A timed probe before the first step: what one training step and one validation image cost on this machine.

A ``--time`` budget needs the epoch time before the first epoch, or epoch 0 runs a plan made for the
configured length (100 epochs' warm-up and decay for a run that fits 15). The probe trains a few
steps on copies of the model, optimizer and EMA, so the run itself starts from untouched weights and
optimizer state, and runs the validation model on part of one validation batch. From these the budget
fits the plan (detector/training/budget.py); the epochs then measured refine it.

The training steps are the loop's own (:func:`detector.training.engine.train_one_epoch`, one batch at a time), and
each timed step includes the wait for its batch, so a loader slower than the model shows. The batches the
workers prefetched (during the AMP check) are drawn first, untimed: timed steps served from that queue
hid a starved loader (BCCD at 320 px on a 2-core CPU shared with other jobs: 0.36 s per probe step, 2.3 s
per step in the epoch that followed; the workers run at the lowest priority, detector/data/workers.py). A
budget is better fitted short than long: a short plan grows at the next re-fit without a jump in the
schedule, while an epoch that overruns cannot be taken back. The first step is not timed: it pays one-time
costs (allocator growth, kernel selection) that the epochs do not. Warm-up steps step the optimizer on
every micro-batch, later ones accumulate: the probe's steps are the dearer kind, which errs towards fewer
epochs.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from detector.distributed import unwrap
from detector.training.budget import EpochPlan, RunClock, RunSettings, RunSoFar
from detector.training.engine import TrainStep, train_one_epoch
from detector.training.multiscale import MultiScale

Batch = tuple  # a training loader's batch: (images uint8 [B, 3, S, S], targets [N, 6], metas)


@dataclass(frozen=True)
class ProbeResult:
    """Seconds per training step at the nominal size, and per validation image (None: not probed)."""

    step_seconds: float
    steps_timed: int
    val_image_seconds: float | None = None

    def epoch_seconds(self, steps_per_epoch: int, *, size_factor: float = 1.0) -> float:
        """One epoch's training: ``size_factor`` is the mean step cost relative to the nominal size."""
        return self.step_seconds * steps_per_epoch * size_factor

    def val_seconds(self, images: int) -> float | None:
        return None if self.val_image_seconds is None else self.val_image_seconds * images

    def describe(self) -> str:
        validation = (f", validation {self.val_image_seconds * 1000:.3g} ms per image"
                      if self.val_image_seconds is not None else "")
        return f"probe: {self.steps_timed} timed training steps at {self.step_seconds:.3g} s each{validation}"


def plan_from_probe(
    clock: RunClock, settings: RunSettings, probe: ProbeResult, *, steps_per_epoch: int, size_factor: float,
    val_images: int,
) -> EpochPlan:
    """The first plan of a ``--time`` run, before any epoch: from the probe's estimates and what set-up spent.

    ``size_factor``: the epoch's mean step cost relative to the nominal size (:func:`size_factor`).
    """
    assert clock.budget is not None
    return clock.budget.fit(
        RunSoFar(clock.elapsed()), settings,
        prior_epoch_seconds=probe.epoch_seconds(steps_per_epoch, size_factor=size_factor),
        prior_val_seconds=probe.val_seconds(val_images),
    )


def time_training_steps(
    batches: Iterator[Batch],
    *,
    first: Batch,
    step: TrainStep,
    image_size: int,
    prefetched: int = 0,
    min_steps: int = 2,
    max_steps: int = 4,
    max_seconds: float = float("inf"),
) -> tuple[float, int]:
    """``(median seconds per timed step, steps timed)``: one untimed step on ``first``, then ``min_steps`` to
    ``max_steps`` timed ones.

    ``prefetched``: how many batches the loader keeps ready (workers x prefetch factor); that many are drawn
    untimed before the timed steps, so these wait for batches made at the loader's own pace.
    The steps run on copies of ``step``'s bare model (not its DDP wrapper), optimizer and EMA. Timing stops after ``min_steps`` once ``max_seconds``
    are spent on the steps; when ``batches`` runs out, the batches drawn so far are reused. Under
    torchrun every rank must call this (the loss and SyncBatchNorm meet across ranks). Torch's random
    state is left as it was.
    """
    devices = [step.device] if step.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        # One deepcopy of the three, so the copied optimizer and EMA refer to the copied model's parameters.
        model, optimizer, ema = copy.deepcopy((unwrap(step.model), step.optimizer, step.ema))
        # Eager steps: graphs of their own would hold a second pool of activations for a handful of timed steps,
        # two of them eager anyway before a capture; the re-fit after each epoch corrects for what graphs save.
        work = dataclasses.replace(step, model=model, optimizer=optimizer, ema=ema, scaler=step.precision.make_scaler(),
                                   cuda_graphs="off")
        fixed_size = MultiScale(image_size, enabled=False)

        def train(batch: Batch) -> None:
            train_one_epoch(work, [batch], multi_scale=fixed_size, epoch=0, seed=0, progress=False)

        seen = [first]
        start = time.perf_counter()
        train(first)
        spent = time.perf_counter() - start
        for _ in range(prefetched):  # ready already: not the loader's steady pace
            batch = next(batches, None)
            if batch is None:
                break
            seen.append(batch)
        timings: list[float] = []
        while len(timings) < max_steps and (len(timings) < min_steps or spent < max_seconds):
            start = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                batch = seen[len(timings) % len(seen)]
            else:
                seen.append(batch)
            train(batch)
            timings.append(time.perf_counter() - start)
            spent += timings[-1]
    return statistics.median(timings), len(timings)


PROBE_IMAGES = 4  # of the first validation batch, timed for the --time probe


def time_validation_images(
    infer: Callable[[torch.Tensor], object], images: torch.Tensor, *, max_images: int = PROBE_IMAGES
) -> float:
    """Seconds per image of ``infer`` (inference and NMS) on up to ``max_images`` of a validation batch.

    Run twice on the same images, the second timed: the first pays the validation model's one-time costs
    for this input shape (a one-image warm-up did not: on a 2-core CPU it left the timed pass at 2.3x the
    per-image time of the real validation). ``images`` are the validation loader's uint8 ``[B, 3, S, S]``.
    """
    timed = images[:max_images]
    infer(timed)
    start = time.perf_counter()
    infer(timed)
    return (time.perf_counter() - start) / len(timed)


def size_factor(sizes: Sequence[int], image_size: int) -> float:
    """Mean cost of steps at ``sizes`` relative to ``image_size``: the pixel ratio (compute grows with pixels)."""
    return sum((size / image_size) ** 2 for size in sizes) / max(len(sizes), 1)
