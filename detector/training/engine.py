"""The training loop, as plain functions (evaluation: :mod:`detector.metrics.loop` over :mod:`detector.inference`)."""

from __future__ import annotations

import math
import resource
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from detector.data.batch_augment import carried_pixel_ops
from detector.data.device_augment import WarpBatch
from detector.distributed import gradients_reduced, unwrap
from detector.loss import DetectionLoss, most_boxes_per_image, targets_to_padded
from detector.precision import Precision
from detector.training.cuda_graph import Body, DeviceEMA, StaticBatch, StepGraphs, graphs_unavailable, skip_on_device
from detector.training.ema import ModelEMA
from detector.training.feed import EpochBatches, uploaded_ahead
from detector.training.multiscale import MultiScale
from detector.training.musgd import MuSGD
from detector.training.schedule import StepSchedule, StepValues, step_role
from detector.training.step_input import step_input, step_input_dtype

T = TypeVar("T")


def set_learning_rates(optimizer: torch.optim.Optimizer, step: int, schedule: StepSchedule) -> StepValues:
    """Apply the schedule's values at ``step`` (detector/training/schedule.py). Groups: [decay, no-decay, bias], or
    MuSGD's, which name their role (``param_group``) and carry an ``lr_scale`` (3 on the class branches).

    A scaled group's rate is the schedule's curve at ``lr_scale`` times its target, as Ultralytics interpolates
    each group to its own ``initial_lr``: weights ``scale * weight_lr``; biases from ``warmup_bias_lr`` to ``scale *
    target``, which is ``bias_lr + (scale - 1) * weight_lr`` (weight_lr = ramp * target). Scale 1: the plain values.
    """
    values = schedule.values(step)
    for index, group in enumerate(optimizer.param_groups):
        scale = group.get("lr_scale", 1.0)
        bias = group["param_group"] == "bias" if "param_group" in group else index == 2
        group["lr"] = values.bias_lr + (scale - 1.0) * values.weight_lr if bias else scale * values.weight_lr
        if "betas" in group:  # ours: Ultralytics' warm-up ramps only a "momentum" key, not the Adam family's beta1
            group["betas"] = (values.momentum, group["betas"][1])
        elif "momentum" in group:
            group["momentum"] = values.momentum
    return values


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA; peak resident memory of this process elsewhere."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# GradScaler starts at 2**16 and halves its scale on every overflow: early skipped steps are its calibration,
# not a sign of trouble. A skip counts as instability when the loss itself was not finite, when no scaler is
# in play (BF16/FP32: nothing to calibrate), or when the scale is already down to 1 (the gradients overflow
# FP16 even unscaled, so more halving cannot help).
SCALER_EXHAUSTED = 1.0


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's outcome, as 0-dim tensors on the training device: reading them on the host would
    wait for the GPU, so the loop adds them up there and reads the sums once per epoch."""

    applied: torch.Tensor  # bool: the gradients were finite and the optimizer stepped
    unstable: torch.Tensor  # bool: skipped for a reason more loss scaling cannot fix (see SCALER_EXHAUSTED)
    scale: torch.Tensor  # float: loss scale used for this step (1.0 without a scaler)


def optimizer_step(
    *,
    model: nn.Module,
    parameters: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    ema: ModelEMA | None,
    precision: Precision,
    clip_grad: float,
    loss_was_finite: torch.Tensor | bool,
) -> StepResult:
    """Unscale, clip, step (or skip on non-finite gradients), clear the gradients, update the EMA.

    Nothing here waits for the GPU with a fused optimizer (every run's on a CPU or a GPU, detector/training/
    optim.py): with a scaler (FP16) GradScaler hands its inf check to the fused kernel on the device, and without
    one (BF16, FP32) the check goes to the kernel the same way (:func:`skip_on_device`). Only an optimizer that is
    not fused is skipped on the host's decision, one wait. The EMA updates after every step, skipped or not (as
    Ultralytics does): a skipped step left the model unchanged, so the average only moves towards the same weights.
    """
    finite, scale = unscale_and_clip(optimizer, scaler, parameters, clip_grad)
    if precision.uses_scaler:
        scaler.step(optimizer)  # skips the step itself when it found inf/nan
        scaler.update()
    elif optimizer.defaults.get("fused"):
        skip_on_device(optimizer, finite)  # BF16/FP32 eager steps on a GPU: warm-up under graphs, DDP, graphs off
    elif finite:
        optimizer.step()
    # Zeroed in place, not dropped: a backward pass replayed from a CUDA graph accumulates into the very tensors it
    # was captured with, and in warm-up this eager step runs between such replays. Every path (CPU, DDP, graphs off,
    # the graphed step itself) thus hands the optimizer the same kind of gradient: a weight that got none in a step
    # would be stepped with zeros, not skipped; every trainable weight of the model gets one every step.
    optimizer.zero_grad(set_to_none=False)
    if ema is not None:
        ema.update(model)
    return step_outcome(finite, scale, loss_was_finite, precision)


def finite_parts(parts: dict[str, torch.Tensor], finite_loss: torch.Tensor) -> torch.Tensor:
    """``[box, cls, dfl]`` of one step for the epoch's sums, zeros where its loss was not finite (not counted)."""
    return torch.where(finite_loss, torch.stack([parts["box"], parts["cls"], parts["dfl"]]).nan_to_num(0.0), 0.0)


def unscale_and_clip(
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, parameters: list[torch.Tensor], clip_grad: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unscale and clip the gradients: -> (0-dim bool: their norm is finite, the loss scale they had)."""
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    grad_norm = nn.utils.clip_grad_norm_(parameters, clip_grad)
    return torch.isfinite(grad_norm), loss_scale(scaler, grad_norm.device)


def step_outcome(
    finite: torch.Tensor, scale: torch.Tensor, loss_was_finite: torch.Tensor | bool, precision: Precision
) -> StepResult:
    """Applied, unstable (see SCALER_EXHAUSTED) and scale of a step, all on the device."""
    scaler_can_help = torch.as_tensor(loss_was_finite, device=finite.device) & (scale > SCALER_EXHAUSTED)
    unstable = ~finite & ~scaler_can_help if precision.uses_scaler else ~finite
    return StepResult(applied=finite, unstable=unstable, scale=scale)


def loss_scale(scaler: torch.amp.GradScaler, device: torch.device) -> torch.Tensor:
    """The scaler's current scale as a 0-dim FP32 tensor on ``device`` (1.0 when disabled), without a host sync.

    ``GradScaler.get_scale()`` copies the scale to the host, which waits for the GPU; GradScaler's own
    accessor keeps it on the device. Cloned, because ``update()`` changes it in place.
    """
    scale = scaler._get_scale_async() if scaler.is_enabled() else None
    if scale is None:  # disabled, or nothing scaled yet
        return torch.ones((), device=device)
    return scale.detach().clone().float().to(device)


@dataclass
class TrainStep:
    """What one optimizer step reads and changes: the run's loop, the ``--time`` probe and the AMP check share it.

    ``model`` is the model as trained (the DDP wrapper under torchrun); ``ema`` may be None (a bare step).
    ``schedule`` gives each step's learning rate, momentum and accumulation (detector/training/schedule.py).
    ``cuda_graphs`` (auto/on/off): whether steps after warm-up replay captured CUDA graphs
    (detector/training/cuda_graph.py); the graphs themselves are made on first use and belong to this
    object alone (a ``dataclasses.replace`` copy, as the ``--time`` probe makes, starts without them).
    """

    model: nn.Module
    criterion: DetectionLoss
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    precision: Precision
    schedule: StepSchedule
    device: torch.device
    channels_last: bool = False
    world_size: int = 1
    cuda_graphs: str = "off"
    graphs: StepGraphs | None = field(default=None, init=False, repr=False)
    graphs_checked: bool = field(default=False, init=False, repr=False)

    def set_precision(self, precision: Precision) -> None:
        """Train on in ``precision``, with a fresh loss scaler of its kind (none outside FP16)."""
        self.precision = precision
        self.scaler = precision.make_scaler()
        dropped, self.graphs, self.graphs_checked = self.graphs, None, False  # captured in the old dtype and scaler
        if dropped is not None:
            # Their pool (a step's activations) goes back to the GPU now, not at the new graphs' first capture: the
            # eager steps before it would otherwise hold a second step's memory beside it.
            del dropped
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def step_graphs(self, parameters: list[torch.Tensor]) -> StepGraphs | None:
        """The captured steps, made on first call where ``cuda_graphs`` allows (None elsewhere: the CPU, ...).

        ``--cuda-graphs on`` says in one line why it cannot be; ``auto`` stays quiet.
        """
        if self.graphs is None and not self.graphs_checked:
            self.graphs_checked = True
            reason = graphs_unavailable(self.cuda_graphs, self.device, world_size=self.world_size)
            # MuSGD cannot skip a non-finite step on the device (no found_inf): it steps eagerly, on the host's check
            reason = reason or ("MuSGD steps eagerly" if isinstance(self.optimizer, MuSGD) else None)
            if reason is None:
                ema = DeviceEMA(self.ema, unwrap(self.model)) if self.ema is not None else None
                self.graphs = StepGraphs(graphed_body(self, parameters, ema), optimizer=self.optimizer,
                                         scaler=self.scaler, ema=ema)
            elif self.cuda_graphs == "on" and not (dist.is_available() and dist.is_initialized()
                                                   and dist.get_rank()):  # said once, by rank 0
                print(f"cuda graphs: off, {reason}", flush=True)
        return self.graphs


def graphed_body(step: TrainStep, parameters: list[torch.Tensor], ema: DeviceEMA | None) -> Body:
    """The training step on a graph's static buffers: forward, loss, backward and, ``with_optimizer``, unscale,
    clip, step (skipped on the device when not finite), zeroed gradients and the EMA. The same work as the
    eager loop below, minus every host read; -> its outputs as device tensors."""

    def body(batch: StaticBatch, with_optimizer: bool) -> dict[str, torch.Tensor]:
        with step.precision.autocast():
            outputs = step.model(batch.images)
        loss, parts = step.criterion(outputs, batch.targets, batch.images.shape[2:], across_ranks=False)
        finite_loss = torch.isfinite(loss)
        step.scaler.scale(loss).backward()  # one process: no world-size factor
        result = {"parts": finite_parts(parts, finite_loss), "finite_loss": finite_loss}
        if with_optimizer:
            finite, scale = unscale_and_clip(step.optimizer, step.scaler, parameters, step.schedule.clip_grad)
            if step.precision.uses_scaler:
                step.scaler.step(step.optimizer)  # the fused kernel reads GradScaler's found_inf on the device
                step.scaler.update()  # one in-place kernel on the scale and its growth tracker
            else:
                skip_on_device(step.optimizer, finite)
            step.optimizer.zero_grad(set_to_none=False)  # the graphs' gradient tensors stay where they are
            if ema is not None:
                ema.update()
            outcome = step_outcome(finite, scale, batch.earlier_finite & finite_loss, step.precision)
            result.update(applied=outcome.applied, unstable=outcome.unstable, scale=outcome.scale)
        return result

    return body


def graphed_step(
    graphs: StepGraphs, images: torch.Tensor, targets: torch.Tensor, *, with_optimizer: bool,
    earlier_finite: torch.Tensor,
) -> dict[str, torch.Tensor] | None:
    """One step through ``graphs``: targets padded on the host to the box count of the key its book chose
    (detector/training/graph_keys.py), the EMA weight filled.

    None when the graphs gave up (a failed capture): the caller steps eagerly, as it would have.
    """
    batch = len(images)
    key = graphs.book.key(tuple(images.shape), most_boxes_per_image(targets, batch), with_optimizer)
    padded = targets_to_padded(targets, batch, images.shape[2:], slots=key[1], pin=True)  # graphs: on CUDA only
    ema = graphs.ema
    if with_optimizer and ema is not None:
        ema.advance()
    outputs = graphs.run(key, images, padded, earlier_finite)
    if outputs is None and with_optimizer and ema is not None:
        ema.retreat()
    return outputs


class StatisticsGuard:
    """The float buffers (BatchNorm running statistics) of the model and its EMA as they stood when made, put back
    if any became non-finite since.

    BatchNorm updates them inside the forward pass, before anything can tell the step will be skipped: one FP16
    forward whose activations overflowed leaves inf or NaN there, the EMA averages them in, and NaN stays NaN in a
    running average. The EMA then validates at mAP 0 and no checkpoint can be written (non-finite weights are
    refused), so the precision fallback after the epoch would come too late. Parameters need no guard: a step
    with non-finite gradients is skipped. Made at an epoch's start and checked at its end (one host read); the
    copy back is in place, so a captured CUDA graph still points at the same tensors.
    """

    def __init__(self, *modules: nn.Module) -> None:
        self.buffers = [buffer for module in modules for buffer in module.buffers() if buffer.is_floating_point()]
        self.saved = [buffer.detach().clone() for buffer in self.buffers]

    def restore_if_not_finite(self) -> bool:
        """Put every buffer back when any is non-finite; True when it did."""
        if not self.buffers or bool(torch.stack([torch.isfinite(b).all() for b in self.buffers]).all()):
            return False
        torch._foreach_copy_(self.buffers, self.saved)
        return True


def timed(batches: Iterable[T], waited: list[float]) -> Iterator[T]:
    """``batches``, adding to ``waited[0]`` the seconds each ``next`` blocked: the loader's lag behind the step.

    On a GPU the step only queues work, so a loop that waits here is fed too slowly; one that does not, yet
    leaves the GPU idle, is held by its own host work (launches, syncs). The first batch's wait includes the
    workers' start.
    """
    iterator = iter(batches)
    while True:
        began = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        waited[0] += time.perf_counter() - began
        yield batch


def train_one_epoch(
    step: TrainStep, loader: DataLoader | EpochBatches, *, multi_scale: MultiScale, epoch: int, seed: int,
    progress: bool = True,
) -> dict[str, float]:
    """One pass over ``loader`` (or an epoch's batches from detector/training/feed.py); returns mean losses and
    telemetry for ``results.csv``."""
    model, criterion, optimizer, scaler, ema = step.model, step.criterion, step.optimizer, step.scaler, step.ema
    precision, schedule, device, world_size = step.precision, step.schedule, step.device, step.world_size
    channels_last = step.channels_last
    model.train()
    criterion.set_epoch(epoch, schedule.epochs)  # an end-to-end head's branch weights (a captured step reads them)
    steps = len(loader)
    sizes = multi_scale.sizes(steps, seed=seed, epoch=epoch)
    # Running totals stay on the device: the host reads them once, after the epoch (no per-step sync).
    loss_sums = torch.zeros(3, device=device)
    nonfinite_losses = torch.zeros((), device=device, dtype=torch.long)
    skipped = torch.zeros((), device=device, dtype=torch.long)
    unstable = torch.zeros((), device=device, dtype=torch.long)
    scale_min = torch.full((), math.inf, device=device)
    scale_max = torch.full((), -math.inf, device=device)
    optimizer_steps = images_seen = unreadable_images = 0
    last_step = epoch * steps - 1  # accumulation starts afresh each epoch (the last one stepped: schedule.step_role)
    losses_before_step = nonfinite_losses.clone()
    parameters = [p for p in model.parameters() if p.requires_grad]
    graphs = step.step_graphs(parameters)
    input_dtype = step_input_dtype(precision, device)  # FP16 / BF16 on CUDA under autocast: no FP32 copy kept
    costs_before = replace(graphs.costs) if graphs is not None else None
    guard = StatisticsGuard(unwrap(model), *([ema.module] if ema is not None else []))
    waited = [0.0]  # seconds this loop spent blocked on the loader: the step starved of data
    # On CUDA each batch's pixels are copied to the GPU while the step before runs (detector/training/feed.py).
    bar = tqdm(uploaded_ahead(timed(loader, waited), device), total=steps, desc=f"epoch {epoch + 1}/{schedule.epochs}",
               disable=not progress, leave=True)
    start = last_shown = time.perf_counter()
    for index, (images, targets, metas) in enumerate(bar):
        step = epoch * steps + index
        role = step_role(schedule, step, accumulate=set_learning_rates(optimizer, step, schedule).accumulate,
                         last_optimizer_step=last_step, last_in_epoch=index == steps - 1)
        pixel_ops = carried_pixel_ops([meta.pixel_ops for meta in metas])
        unreadable_images += sum(1 for meta in metas if meta.unreadable)  # replaced by the dataset (it warned)
        # A captured step reads its input from a fixed buffer: the input is made there, not made and then copied in.
        out = None if graphs is None or graphs.failed is not None else graphs.inputs.image_buffer(
            (len(images), 3, sizes[index], sizes[index]), device, channels_last=channels_last,
            largest_side=multi_scale.largest(), dtype=input_dtype)
        loaded, images = images, step_input(images, sizes[index], device, channels_last=channels_last,
                                            pixel_ops=pixel_ops, out=out)
        if isinstance(loaded, WarpBatch) and device.type == "cuda":
            # Rendered: its atlas (~130 MB a mosaic batch at 640 px and batch 64) goes now, not when the loop's
            # iterators let go of the batch, after the step, so that it is not at the step's peak beside the next
            # batch's, already uploaded. Freed in stream order: the render queued before it still reads it.
            loaded.atlas.set_()
        del loaded
        images = images.to(input_dtype)  # made in FP32 without a buffer: the half-precision copy only from here
        if graphs is not None and role.warmup_ended:
            graphs.forget_partial_steps()  # warm-up's forward-and-backward graphs: no such step follows
        captured = None
        if graphs is not None and graphs.failed is None:
            captured = graphed_step(graphs, images, targets, with_optimizer=role.graphed_optimizer,
                                    earlier_finite=nonfinite_losses == losses_before_step)
        if captured is None:
            with gradients_reduced(model, role.stepping):  # DDP reduces once per optimizer step
                with precision.autocast():
                    outputs = model(images)
                # The loss runs in FP32 outside autocast; x world_size because DDP averages gradients over ranks.
                # Targets stay on the host: the loss pads them there, so it need not wait for the GPU to count them.
                loss, parts = criterion(outputs, targets, images.shape[2:])
                finite_loss = torch.isfinite(loss)
                nonfinite_losses += ~finite_loss
                scaler.scale(loss * world_size).backward()
            # Nothing may hold this step's graph into the next one: its parameters' AccumulateGrad nodes would live
            # on, and a CUDA graph's capture (on its own stream) fails on nodes made on the default stream.
            del outputs, loss
            loss_sums += finite_parts(parts, finite_loss)
        else:
            nonfinite_losses += ~captured["finite_loss"]
            loss_sums += captured["parts"]
        images_seen += len(images)

        if role.stepping:
            if captured is not None and role.graphed_optimizer:
                result = StepResult(captured["applied"], captured["unstable"], captured["scale"])
            else:
                result = optimizer_step(
                    model=model, parameters=parameters, optimizer=optimizer, scaler=scaler, ema=ema,
                    precision=precision, clip_grad=schedule.clip_grad,
                    loss_was_finite=nonfinite_losses == losses_before_step,
                )
            losses_before_step = nonfinite_losses.clone()
            scale_min, scale_max = torch.minimum(scale_min, result.scale), torch.maximum(scale_max, result.scale)
            optimizer_steps += 1
            skipped += ~result.applied
            unstable += result.unstable
            last_step = step
        # The progress line reads the losses (a host sync): about once a second, not every few steps.
        if progress and (time.perf_counter() - last_shown >= 1.0 or index == steps - 1):
            means = (loss_sums / (index + 1 - nonfinite_losses).clamp(min=1)).tolist()
            bar.set_postfix(box=f"{means[0]:.3f}", cls=f"{means[1]:.3f}", dfl=f"{means[2]:.3f}", size=sizes[index])
            last_shown = time.perf_counter()
    if world_size > 1:  # each rank holds its share of the global loss: the sum is the whole
        torch.distributed.all_reduce(loss_sums)
        # A forward pass that overflowed on one rank alone is the run's instability too: rank 0 decides from these.
        worst = torch.stack([nonfinite_losses, unstable])
        torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
        nonfinite_losses, unstable = worst[0], worst[1]
    # The mean over the steps whose loss was finite (NaN when none was): a non-finite one counted as 0 showed a broken
    # epoch as a low loss. Under DDP the count is the worst rank's. Waits for the device, so the time below includes
    # the last step.
    means = (loss_sums / (steps - nonfinite_losses)).tolist()
    seconds = time.perf_counter() - start
    scales = (scale_min.item(), scale_max.item()) if optimizer_steps else (1.0, 1.0)
    if guard.restore_if_not_finite():
        warnings.warn(f"epoch {epoch + 1}: BatchNorm running statistics became non-finite (a forward pass overflowed "
                      f"{precision.name.upper()}); put back as they were at the epoch's start", stacklevel=2)
    return {
        "train/box": means[0],
        "train/cls": means[1],
        "train/dfl": means[2],
        "lr": optimizer.param_groups[0]["lr"] / optimizer.param_groups[0].get("lr_scale", 1.0),  # MuSGD's may be 3x
        "images_per_s": images_seen * world_size / seconds,
        "epoch_seconds": seconds,
        "data_wait": waited[0] / seconds,  # the share of the epoch the loop waited for the loader
        "peak_mem_mb": peak_memory_mb(device),
        # What the allocator held from the GPU at most (nvidia-smi's view, what a small card runs out of): the graphs'
        # pools and cached blocks beside the tensors; the run's maximum so far, as peak_mem_mb.
        **({"peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20} if device.type == "cuda" else {}),
        "loss_scale_min": scales[0],
        "loss_scale_max": scales[1],
        "optimizer_steps": optimizer_steps,
        "skipped_steps": int(skipped),
        "unstable_steps": int(unstable),
        "nonfinite_losses": int(nonfinite_losses),
        "unreadable_images": unreadable_images,  # this rank's images that failed to decode and were replaced
        # With CUDA graphs, what this epoch's new keys cost: captures, their host seconds, eager warm-up steps.
        **(graphs.costs.since(costs_before) if graphs is not None and costs_before is not None else {}),
    }
