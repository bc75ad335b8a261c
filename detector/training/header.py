"""The line a run starts with: model, data, machine, precision, augmentation, cache, evaluator, plan, folder."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from detector.architecture import display_name
from detector.data.build import SplitData
from detector.distributed import DistInfo, unwrap
from detector.metrics.coco import evaluator_name
from detector.training.budget import MIN_WARMUP_STEPS, RunClock
from detector.training.config import TrainConfig
from detector.training.engine import TrainStep
from detector.training.multiscale import MultiScale
from detector.training.rect import mixing
from detector.training.validator import background_text


class Run(Protocol):
    """What the header reads of a run (the Trainer; a protocol, so this module need not import it)."""

    config: TrainConfig
    step: TrainStep
    dist: DistInfo
    device: torch.device
    train_data: SplitData
    val_data: SplitData | None
    clock: RunClock
    epochs: int
    start_epoch: int
    resume_path: Path | None
    optimizer_name: str
    multi_scale: MultiScale
    run_dir: Path
    recomputed: list[str]

    def input_shapes(self) -> list[tuple[int, ...]]: ...


def mixing_text(config: TrainConfig) -> str:
    """``", MixUp 0.1 (in the workers), CutMix 0.5 (in the workers)"``, those asked for; nothing where every epoch
    is a close-mosaic one, whose items are never mixed, nor under ``--rect``, which mixes none."""
    if config.epochs <= config.close_mosaic:
        return ""
    asked = mixing(config)
    mixes = [(name, value) for name, value in (("MixUp", asked["mixup"]), ("CutMix", asked["cutmix"])) if value]
    return "".join(f", {name} {value:g} (in the workers)" for name, value in mixes)


def run_header(trainer: Run) -> str:
    config, step = trainer.config, trainer.step
    model = unwrap(step.model)
    params = sum(p.numel() for p in model.parameters())
    val_count = len(trainer.val_data.records) if trainer.val_data else "?"
    on_device = {"device": "mosaic/affine/HSV/flips", "pixels": "HSV/flips"}.get(pixel_augment_path(trainer), "")
    swap = f", channel swap {config.bgr:g}" if config.bgr else ""  # --bgr: the last pixel operation, where they run
    augment = f"{on_device}{swap} on the device" if on_device else f"augmentation in the workers{swap}"
    augment += mixing_text(config)
    if config.perspective:  # the device warp is affine: these items come to it warped
        augment += f", perspective {config.perspective:g} (in the workers)"
    only = f", classes {' '.join(map(str, config.classes))} only" if config.classes is not None else ""
    if trainer.recomputed:
        augment += f" | BatchNorm outputs of {', '.join(trainer.recomputed)} recomputed in backward (--recompute)"
    return (
        f"detector: {display_name(model.scale)} ({params / 1e6:.2f}M params, {model.num_classes} "
        f"class{'es' if model.num_classes != 1 else ''}) | "
        f"data {config.data or 'built-in shapes'} ({len(trainer.train_data.records)} train / {val_count} val{only}) | "
        f"{trainer.device} x{trainer.dist.world_size}, {config.workers} loader "
        f"worker{'s' if config.workers != 1 else ''} | "
        f"precision {step.precision.name}: {step.precision.reason} | {augment} | "
        f"{cache_text(trainer)} | COCO eval {evaluator_name(config.coco_eval)}"
        f"{background_text(config.val_background, trainer.device)} | "
        f"{trainer.optimizer_name} lr {step.schedule.base_lr:g}{lr_text(trainer)} | {epochs_text(trainer)}"
        f"{warmup_text(trainer)} | "
        f"{shapes_text(trainer)} | run {trainer.run_dir}"
    )


def shapes_text(trainer: Run) -> str:
    """The training inputs: multi-scale's scheme (:meth:`MultiScale.describe`), after ``--rect``'s canvases."""
    scheme = trainer.multi_scale.describe(len(trainer.input_shapes()))
    if not trainer.config.rect:
        return scheme
    canvases = trainer.sampler.input_shapes()  # type: ignore[attr-defined]  # a RectBatchSampler's, at --imgsz
    listed = ", ".join(f"{height}x{width}" for _, height, width in canvases[:4]) + (" ..." if len(canvases) > 4 else "")
    return (f"rectangular batches (--rect): {len(canvases)} canvas{'es' if len(canvases) != 1 else ''} of height x "
            f"width {listed} at --imgsz {trainer.config.imgsz}, the batches' order shuffled every epoch, no mosaic; "
            f"{scheme} (each canvas's long side)")


def lr_text(trainer: Run) -> str:
    """Why a ``--lr0`` the user gave is not the run's: ``--optimizer auto`` chose AdamW with its own rate (as
    Ultralytics' optimizer=auto ignores lr0, which it says too); empty otherwise."""
    config = trainer.config
    if config.optimizer != "auto" or trainer.optimizer_name != "AdamW" or config.lr0 == TrainConfig().lr0:
        return ""
    return f" (--optimizer auto chose AdamW and its own lr, not --lr0 {config.lr0:g}: name an optimizer to use it)"


def pixel_augment_path(run: Run) -> str:
    """Where augmentation runs, as ``--pixel-augment`` names it: ``device``, ``pixels`` or ``workers``."""
    dataset = run.train_data.dataset
    if dataset.geometry_on_device:
        return "device"
    return "pixels" if dataset.pixel_ops_on_device else "workers"


def cache_used(run: Run) -> str:
    """The image cache the run holds (``ram``, ``disk`` or ``none``), which ``--cache auto`` decides by memory."""
    if run.train_data.dataset.image_cache is None:
        return "none"
    return "disk" if run.config.cache == "disk" else "ram"


def cache_text(trainer: Run) -> str:
    cache = trainer.train_data.dataset.image_cache
    used = cache_used(trainer)
    if used == "none":
        return f"image cache off (--cache {trainer.config.cache})"
    if used == "disk":
        return f"disk cache {cache.nbytes / 2**20:.1f} MiB, {cache.path}"
    processes = trainer.dist.local_world_size
    where = f"shared by the {processes} processes of this node" if processes > 1 else "in this process"
    return f"RAM cache {cache.nbytes / 2**20:.1f} MiB {where}"


def epochs_text(trainer: Run) -> str:
    budget, epochs = trainer.clock.budget, trainer.epochs
    count = f"{epochs} epoch{'s' if epochs != 1 else ''}"
    if trainer.start_epoch:  # a resumed run says where it goes on from
        count += f", resumed at epoch {trainer.start_epoch + 1} from {trainer.resume_path}"
    if budget is None:
        return count
    return f"{count} fitted to the time budget {budget.text}, re-fitted after every epoch"


def warmup_text(trainer: Run) -> str:
    """``, warm-up 100 steps (12.5 epochs: ...)`` where the schedule's warm-up is not ``--warmup-epochs``' steps (the
    floor of :data:`~detector.training.budget.MIN_WARMUP_STEPS` raised it, or the cap at a quarter of the run lowered
    it), so the run says what it does; empty otherwise, and under ``--time``, whose plan line says the warm-up."""
    schedule, asked = trainer.step.schedule, trainer.config.warmup_epochs
    steps, per_epoch = schedule.warmup_steps, schedule.steps_per_epoch
    if trainer.clock.budget is not None or asked <= 0 or steps == round(asked * per_epoch):
        return ""
    return (f", warm-up {steps} step{'s' * (steps != 1)} ({steps / per_epoch:.3g} epochs: --warmup-epochs {asked:g}, "
            f"at least {MIN_WARMUP_STEPS} steps, at most a quarter of the run)")
