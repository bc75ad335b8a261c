"""``--batch -1``: the largest batch whose training step fits a set fraction of the GPU's memory.

As Ultralytics' AutoBatch does: time nothing, measure the peak memory (``torch.cuda.max_memory_allocated``) of one
forward and backward pass at a few batch sizes, fit a straight line (activation memory grows linearly with the
batch; the intercept is the weights, gradients and workspaces), and take the batch where the line meets
``--batch-memory`` of the device's memory (``FRACTION``, Ultralytics' default). Unlike Ultralytics' probe, ours
runs the training loss too, over random targets padded to the box slots of the dataset's fullest image: the assigner's ``[batch, slots, anchors]``
tensors grow with the batch as the activations do (about 9 MB per image at 640 px and 16 slots, 150 MB at 256
slots), so a dataset with many boxes per image gets a smaller batch. The rest of the fraction's complement is
for what the probe does not hold: the optimizer's moments, the EMA copy, a mosaic fuller than any one image and
validation. The memory is what this process can have: the driver's free memory (other processes on the card
left out) plus what torch holds already. Where the run will replay CUDA graphs, the activations count twice: the
graphs' memory pool keeps one step's for as long as they live, and each new graph key first runs eagerly beside it.

On a CPU there is nothing to fit (memory is the machine's, and speed, not memory, limits the batch): the run keeps
the default batch and says so in one line. The CUDA path is unreachable without CUDA.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from detector.loss import DetectionLoss, PaddedTargets, box_slots
from detector.precision import Precision
from detector.training.config import TrainConfig
from detector.training.multiscale import MultiScale
from detector.training.step_input import step_input_dtype

AUTO_BATCH = -1
DEFAULT_BATCH = 16
FRACTION = 0.60  # of the device's total memory (Ultralytics' default), for the step the probe measures
PROBE_BATCHES = (1, 2, 4, 8, 16)
MAX_BATCH = 1024
ALLOCATOR_ROUNDING = 512  # bytes


def fit_batch(measurements: Sequence[tuple[int, float]], budget_bytes: float, *, default: int = DEFAULT_BATCH,
              activation_copies: int = 1) -> int:
    """The largest batch whose peak memory, on the least-squares line through ``measurements`` with its slope (the
    activations) counted ``activation_copies`` times, is within ``budget_bytes``.

    Args:
        measurements: ``(batch, peak bytes)`` pairs, at least two distinct batches.
        budget_bytes: the memory the step may use.
        default: returned when the line cannot be trusted (fewer than two batches, no measurable growth).
        activation_copies: 2 where CUDA graphs hold one step's activations beside an eager step's.

    Returns at least 1 and at most ``MAX_BATCH``; 1 when even the intercept exceeds the budget (the caller warns).
    """
    batches = np.array([batch for batch, _ in measurements], dtype=np.float64)
    peaks = np.array([peak for _, peak in measurements], dtype=np.float64)
    if len(np.unique(batches)) < 2:
        return default
    slope, intercept = np.polyfit(batches, peaks, 1)
    # CUDA's caching allocator rounds every block up to 512 bytes: a slope below that is no measured growth.
    if not math.isfinite(slope) or slope < ALLOCATOR_ROUNDING:
        return default
    return int(min(max(math.floor((budget_bytes - intercept) / (activation_copies * slope)), 1), MAX_BATCH))


# The loss of a batch's head outputs: (outputs, batch size, square image size) -> a scalar to backpropagate.
StepLoss = Callable[[list[torch.Tensor], int, int], torch.Tensor]


def padded_loss(criterion: DetectionLoss, slots: int) -> StepLoss:
    """The training loss over random targets padded to ``slots`` boxes per image, every slot a real box (random
    xyxy pixel boxes inside the image): the assignment runs at the shapes a full batch gives it."""
    def loss(outputs: list[torch.Tensor], batch: int, image_size: int) -> torch.Tensor:
        device = outputs[0].device
        corner = torch.rand(batch, slots, 2, device=device) * image_size * 0.8
        size = 2.0 + torch.rand(batch, slots, 2, device=device) * image_size * 0.2
        targets = PaddedTargets(torch.randint(0, criterion.num_classes, (batch, slots), device=device),
                                torch.cat([corner, corner + size], -1),
                                torch.ones(batch, slots, dtype=torch.bool, device=device))
        value, _ = criterion(outputs, targets, (image_size, image_size), across_ranks=False)
        return value.sum()

    return loss


def probe_step(model: nn.Module, image_size: int, batch: int, precision: Precision, device: torch.device,
               loss: StepLoss | None = None, *, channels_last: bool = False) -> None:
    """One forward pass of ``batch`` random images, ``loss`` (default: the sum of the outputs) and backward.

    ``channels_last``: the images in the layout the training step gives the model. Given channels-first images, a
    channels-last model converts them first, and that copy (4.7 MiB per 640 px image) would count in the peak. The
    images are in the dtype the step makes its input in (:func:`~detector.training.step_input.step_input_dtype`:
    FP16 under CUDA's FP16 autocast), so neither an FP32 input nor autocast's copy of it counts either."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    images = torch.rand(batch, 3, image_size, image_size, device=device,
                        dtype=step_input_dtype(precision, device)).contiguous(memory_format=layout)
    with precision.autocast():
        outputs = model(images)
    if loss is None:
        total = sum(output.float().sum() for output in _tensors(outputs))
    else:
        total = loss(_tensors(outputs), batch, image_size)
    total.backward()


def measure_peak_memory(model: nn.Module, image_size: int, batch: int, precision: Precision,
                        device: torch.device, loss: StepLoss | None = None, *, channels_last: bool = False) -> float:
    """Peak bytes allocated on ``device`` by :func:`probe_step` (CUDA)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    probe_step(model, image_size, batch, precision, device, loss, channels_last=channels_last)
    peak = torch.cuda.max_memory_allocated(device)
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    return float(peak)


def _tensors(outputs: object) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    return [tensor for item in outputs for tensor in _tensors(item)]  # type: ignore[union-attr]


@dataclass(frozen=True)
class RunStep:
    """What the run's step is like, for the probe: its loss (default: the sum of the outputs), the layout of its
    batches, and whether it will replay CUDA graphs (their pool holds a second copy of the activations)."""

    loss: StepLoss | None = None
    channels_last: bool = False
    cuda_graphs: bool = False


def auto_batch(model: nn.Module, image_size: int, precision: Precision, device: torch.device,
               log: Callable[[str], None], *, fraction: float = FRACTION, step: RunStep = RunStep()) -> int:
    """The batch for ``--batch -1`` on ``device`` (the module docstring says how); logs one line saying why."""
    if device.type != "cuda":
        log(f"--batch -1: no CUDA device, so the default batch {DEFAULT_BATCH} (it sizes a batch to GPU memory)")
        return DEFAULT_BATCH
    measurements = []
    probe = copy.deepcopy(model).train()  # a copy: random images must not move the run's BatchNorm statistics
    for batch in PROBE_BATCHES:
        try:
            measurements.append((batch, measure_peak_memory(probe, image_size, batch, precision, device, step.loss,
                                                            channels_last=step.channels_last)))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            break
    del probe
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    available = min(total, free + torch.cuda.memory_reserved(device))  # other processes' memory left out
    copies = 2 if step.cuda_graphs else 1
    chosen = fit_batch(measurements, fraction * available, activation_copies=copies)
    peaks = ", ".join(f"{batch}: {peak / 2**30:.2f}" for batch, peak in measurements)
    graphs = "; activations counted twice for CUDA graphs' pool" if step.cuda_graphs else ""
    log(f"--batch -1: batch {chosen} fits {fraction:.0%} of the {available / 2**30:.1f} GiB this process can have "
        f"of {total / 2**30:.1f} on {device} (peak GiB per batch measured: {peaks}; a straight line fitted through "
        f"them{graphs})")
    return chosen


def batch_for(config: TrainConfig, model: nn.Module, criterion: DetectionLoss, most_boxes: int,
              precision: Precision, device: torch.device, log: Callable[[str], None], *, world_size: int = 1) -> int:
    """:func:`auto_batch` for a run's config, at its largest training input (multi-scale's top size), with the
    loss over the box slots of the dataset's fullest image (``most_boxes``), counting CUDA graphs' pool where the
    run (``world_size`` processes) will replay them."""
    from detector.training.cuda_graph import graphs_unavailable
    from detector.training.rect import cuda_graphs_choice

    # Under --rect the square at the largest size: every canvas, scaled to it, fits in it.
    largest = MultiScale(config.imgsz, low=config.multi_scale_min, high=config.multi_scale_max,
                         enabled=config.multi_scale).ladder()[-1]
    step = RunStep(padded_loss(criterion, box_slots(most_boxes)), config.channels_last,
                   cuda_graphs=graphs_unavailable(cuda_graphs_choice(config), device, world_size=world_size) is None)
    return auto_batch(model, largest, precision, device, log, fraction=config.batch_memory, step=step)
