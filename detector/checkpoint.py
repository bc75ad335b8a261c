"""Checkpoints: atomic writes, safe loads (``weights_only=True``), stripping, and model rebuilding from a file.

A checkpoint is a plain dict of tensors and builtin types. Two kinds exist:

* **full** (``last.pt`` while a run goes on): everything ``--resume`` needs::

    {"model": state_dict, "ema": state_dict, "optimizer": ..., "scaler": ..., "epoch": int,
     "model_args": {"num_classes", "scale", "reg_max"}, "names": [...], "config": {...}, "precision": str, ...}

  :func:`run_checkpoint` writes one and :func:`restore_run` reads it back, with the same keys side by side.

* **stripped** (``best.pt``; ``last.pt`` once the run has finished), what inference and fine-tuning need:
  the EMA weights stored in FP16 under ``"model"``, ``"ema": None``, and the metadata; no optimizer, no
  second copy of the weights (a nano model: ~6 MB instead of ~49 MB). Loaders take both kinds: a FP16
  tensor loads into the FP32 model (``load_state_dict`` copies with a cast).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from detector.files import atomic_file
from detector.model import YOLO, build_model


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""


def all_finite(state_dict: dict[str, torch.Tensor]) -> bool:
    return all(torch.isfinite(t).all() for t in state_dict.values() if t.is_floating_point())


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Write atomically (:func:`detector.files.atomic_file`): a crash at any moment leaves either the old
    file or the new one, never half of one. Refuses to write non-finite weights, which would poison a resume.
    """
    path = Path(path)
    for key in ("model", "ema"):
        if payload.get(key) is not None and not all_finite(payload[key]):
            raise CheckpointError(f"{path}: refusing to save non-finite '{key}' weights")
    with atomic_file(path) as file:
        torch.save(payload, file)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt or foreign files
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path}: not a loadable detector checkpoint ({first_line})") from None


# What a stripped checkpoint keeps besides the weights (:func:`strip_checkpoint`).
STRIPPED_KEYS = ("epoch", "model_args", "names", "metrics", "config", "precision", "best_fitness", "best_epoch")
FP16_MAX = torch.finfo(torch.float16).max


def to_half(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FP32 tensors as FP16 on the CPU; integer tensors (BatchNorm counters) and any tensor with a value
    beyond FP16's range (65504, which would become inf) stay as they are."""
    def convert(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach().cpu()
        if not tensor.is_floating_point() or (tensor.numel() and tensor.abs().max() > FP16_MAX):
            return tensor
        return tensor.half()

    return {name: convert(tensor) for name, tensor in state_dict.items()}


def is_stripped(checkpoint: dict[str, Any]) -> bool:
    """True for a checkpoint without optimizer state (stripped by us, or any file that cannot resume)."""
    return checkpoint.get("optimizer") is None


def strip_checkpoint(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The inference / fine-tuning part of ``checkpoint``: EMA weights (raw ones when there is no EMA) in
    FP16 under ``"model"``, ``"ema": None``, and :data:`STRIPPED_KEYS`."""
    weights = checkpoint["ema"] if checkpoint.get("ema") is not None else checkpoint["model"]
    kept = {key: checkpoint[key] for key in STRIPPED_KEYS if key in checkpoint}
    return {"model": to_half(weights), "ema": None, **kept}


def strip_checkpoint_file(path: str | Path) -> None:
    """Rewrite ``path`` (atomically) as its stripped form; a file already stripped is left alone."""
    checkpoint = load_checkpoint(path)
    if not is_stripped(checkpoint):
        save_checkpoint(strip_checkpoint(checkpoint), path)


def model_from_checkpoint(path: str | Path, *, use_ema: bool = True) -> tuple[YOLO, dict[str, Any]]:
    """Rebuild the model (EMA weights when present) in eval mode; return it and the checkpoint dict."""
    checkpoint = load_checkpoint(path)
    if "model_args" not in checkpoint or "model" not in checkpoint:
        raise CheckpointError(f"{path}: missing 'model_args' or 'model'; not a detector checkpoint")
    model = build_model(**checkpoint["model_args"])
    weights = checkpoint["ema"] if use_ema and checkpoint.get("ema") is not None else checkpoint["model"]
    model.load_state_dict(weights)
    return model.eval(), checkpoint


# --------------------------------------------------------------------------------------------- a run's checkpoint
@dataclass
class Trained:
    """The objects whose state a full checkpoint holds: the bare model (not its DDP wrapper), the EMA's module,
    the optimizer and the loss scaler."""

    model: nn.Module
    ema: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler


@dataclass
class RunState:
    """Where a training run stands, besides its weights: what ``--resume`` continues from. Plain data.

    Attributes:
        epoch: the last completed epoch (0-based).
        ema_updates: how many updates the EMA has averaged (its warm-up ramp depends on it).
        plan: ``{"epochs", "close_mosaic", "warmup_epochs"}`` as (re)planned so far.
        schedule: the learning-rate schedule's state (``StepSchedule.state()``); None in older checkpoints.
        optimizer_choice: ``{"name", "lr"}``, what ``--optimizer auto`` chose; None in older checkpoints.
        time_spent, epoch_seconds, val_seconds: the run's clock (detector/training/budget.py, ``RunClock``).
        mosaic_closed_at: the epoch mosaic was turned off at, if it was.
        best_fitness, best_epoch: the best evaluation so far (best.pt's).
        metrics: the last evaluation's metrics; names: class names; config: ``TrainConfig.to_dict()``.
        precision: the precision the run trains in (it may have fallen back).
    """

    epoch: int
    config: dict[str, Any]
    names: list[str]
    precision: str
    ema_updates: int = 0
    plan: dict[str, float] = field(default_factory=dict)
    schedule: dict[str, float] | None = None
    optimizer_choice: dict[str, Any] | None = None
    time_spent: float = 0.0
    epoch_seconds: list[float] = field(default_factory=list)
    val_seconds: list[float | None] = field(default_factory=list)
    mosaic_closed_at: int | None = None
    best_fitness: float = -1.0
    best_epoch: int = -1
    metrics: dict[str, float] = field(default_factory=dict)


def run_checkpoint(trained: Trained, state: RunState) -> dict[str, Any]:
    """The full checkpoint of a run: every weight and optimizer state, and ``state``; :func:`restore_run` reads it."""
    model = trained.model
    return {
        "model": model.state_dict(),
        "ema": trained.ema.state_dict(),
        "ema_updates": state.ema_updates,
        "optimizer": trained.optimizer.state_dict(),
        "scaler": trained.scaler.state_dict(),
        "epoch": state.epoch,
        "plan": state.plan,
        "schedule": state.schedule,
        "optimizer_choice": state.optimizer_choice,
        "time_spent": state.time_spent,
        "epoch_seconds": state.epoch_seconds,
        "val_seconds": state.val_seconds,
        "mosaic_closed_at": state.mosaic_closed_at,
        "best_fitness": state.best_fitness,
        "best_epoch": state.best_epoch,
        "metrics": state.metrics,
        "model_args": {"num_classes": model.num_classes, "scale": model.scale, "reg_max": model.reg_max},
        "names": state.names,
        "config": state.config,
        "precision": state.precision,
    }


def restore_run(checkpoint: dict[str, Any], trained: Trained) -> RunState:
    """Load a :func:`run_checkpoint` into ``trained`` (the scaler only where it is enabled) and return its state.

    Keys that older checkpoints lack get the defaults of :class:`RunState`.
    """
    trained.model.load_state_dict(checkpoint["model"])
    trained.ema.load_state_dict(checkpoint["ema"])
    trained.optimizer.load_state_dict(checkpoint["optimizer"])
    if checkpoint.get("scaler") and trained.scaler.is_enabled():
        trained.scaler.load_state_dict(checkpoint["scaler"])
    return RunState(
        epoch=checkpoint["epoch"],
        config=checkpoint["config"],
        names=list(checkpoint.get("names") or []),
        precision=checkpoint.get("precision", ""),
        ema_updates=checkpoint["ema_updates"],
        plan=dict(checkpoint.get("plan") or {}),
        schedule=checkpoint.get("schedule"),
        optimizer_choice=checkpoint.get("optimizer_choice"),
        time_spent=checkpoint.get("time_spent", 0.0),
        epoch_seconds=list(checkpoint.get("epoch_seconds", [])),
        val_seconds=list(checkpoint.get("val_seconds", [])),
        mosaic_closed_at=checkpoint.get("mosaic_closed_at"),
        best_fitness=checkpoint.get("best_fitness", -1.0),
        best_epoch=checkpoint.get("best_epoch", -1),
        metrics=dict(checkpoint.get("metrics") or {}),
    )
