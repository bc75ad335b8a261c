"""Checkpoints: atomic writes, safe loads (``weights_only=True``), stripping, and model rebuilding from a file.

A checkpoint is a plain dict of tensors and builtin types. Two kinds exist:

* **full** (``last.pt`` while a run goes on): everything ``--resume`` needs::

    {"model": state_dict, "ema": state_dict, "optimizer": ..., "scaler": ..., "epoch": int,
     "model_args": {"num_classes", "scale", "reg_max"}, "names": [...], "config": {...}, "precision": str, ...}

* **stripped** (``best.pt``; ``last.pt`` once the run has finished), what inference and fine-tuning need:
  the EMA weights stored in FP16 under ``"model"``, ``"ema": None``, and the metadata; no optimizer, no
  second copy of the weights (a nano model: ~6 MB instead of ~49 MB). Loaders take both kinds: a FP16
  tensor loads into the FP32 model (``load_state_dict`` copies with a cast).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

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
