"""Checkpoints: atomic writes, safe loads (``weights_only=True``), stripping, and model rebuilding from a file.

A checkpoint is a plain dict of tensors and builtin types. Two kinds exist:

* **full** (``last.pt`` while a run goes on): everything ``--resume`` needs::

    {"model": state_dict, "ema": state_dict, "optimizer": ..., "scaler": ..., "epoch": int,
     "model_args": {"num_classes", "scale", "reg_max"[, "class_channels"]}, "names": [...], "config": {...},
     "precision": str, ...}

  :func:`run_checkpoint` writes one and :func:`restore_run` reads it back, with the same keys side by side.

* **stripped** (``best.pt``; ``last.pt`` once the run has finished), what inference and fine-tuning need:
  the EMA weights stored in FP16 under ``"model"``, ``"ema": None``, and the metadata; no optimizer, no
  second copy of the weights (a nano model: ~6 MB instead of ~49 MB). Loaders take both kinds: a FP16
  tensor loads into the FP32 model (``load_state_dict`` copies with a cast).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from detector.checkpoint_integrity import non_finite_weights, peak_magnitudes
from detector.checkpoint_problems import load_problem, torchscript_problem
from detector.files import atomic_file
from detector.model import YOLO, build_model
from detector.architecture import MODEL_NAMES
from detector.version import __version__


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""


# The most bytes gathered into one flat tensor on a GPU for one copy: a whole checkpoint of the x model (its weights,
# EMA and AdamW's two moments, FP32) is ~1.1 GB, which a GPU filled by a hand-set --batch may not have to spare; a
# nano model's (~48 MB) still goes in one copy per dtype.
GATHER_BYTES = 256 << 20


def host_copies(tensors: list[torch.Tensor], *,
                together: Callable[[torch.device], bool] = lambda device: device.type != "cpu") -> list[torch.Tensor]:
    """A CPU copy of each tensor, sharing no memory with it or with another copy (detached; same shape and dtype).

    Tensors on an accelerator (``together``) go in one transfer per device and dtype: each copy from a GPU waits for
    it, and a snapshot of a nano model's EMA is ~350 tensors, of a whole run's checkpoint ~1,100 (on the H100, BCCD's
    100 epochs spent 14.4 s in checkpoints, each epoch copying its EMA out tensor by tensor). They are gathered into
    one flat tensor on their device, copied once, and cut back into tensors of their own, each in its tensor's
    layout (a channels-last weight's optimizer state stays channels-last: see :func:`matched_to_parameters`; a
    tensor that is not dense comes back contiguous). The flat tensor is GPU memory beside the run's, so a group
    goes in parts of at most :data:`GATHER_BYTES` (a larger tensor alone). CPU tensors are copied one by one."""
    copies: list[torch.Tensor | None] = [None] * len(tensors)
    parts: list[list[int]] = []  # indices of the tensors gathered together, in order
    open_part: dict[tuple[torch.device, torch.dtype], tuple[list[int], int]] = {}  # its device and dtype's last, bytes
    for index, tensor in enumerate(tensors):
        if not together(tensor.device):
            copies[index] = tensor.detach().to("cpu", copy=True)
            continue
        size = tensor.numel() * tensor.element_size()
        part, filled = open_part.get((tensor.device, tensor.dtype), ([], 0))
        if not part or filled + size > GATHER_BYTES:
            part, filled = [], 0
            parts.append(part)
        part.append(index)
        open_part[tensor.device, tensor.dtype] = part, filled + size
    for indices in parts:
        flat = torch.cat([tensors[index].detach().reshape(-1) for index in indices]).to("cpu")
        sizes = [tensors[index].numel() for index in indices]
        for index, piece in zip(indices, flat.split(sizes)):
            tensor = tensors[index]  # flattened in its logical order; copy_ puts it back in the tensor's layout
            copies[index] = torch.empty_like(tensor, device="cpu").copy_(piece.view(tensor.shape))  # memory of its own
    return copies  # type: ignore[return-value]


def save_checkpoint(payload: dict[str, Any] | memoryview, path: str | Path) -> None:
    """Write atomically (:func:`detector.files.atomic_file`): a crash at any moment leaves either the old
    file or the new one, never half of one. Refuses to write non-finite weights, which would poison a resume.
    ``payload`` may be encoded already (:func:`~detector.training.checkpoint_writer.encode_checkpoint`, which
    checked it): its bytes are written."""
    path = Path(path)
    if isinstance(payload, memoryview):
        with atomic_file(path) as file:
            file.write(payload)
        return
    refuse_non_finite(payload, path)
    with atomic_file(path) as file:
        try:
            torch.save(payload, file)
        except RuntimeError as error:
            # torch's zip writer reports a failed write (a full disk, a file-size limit) as "unexpected pos ...",
            # the OSError that says why only chained inside it: raised as that OSError, it is one line that says so.
            cause = error.__cause__ or error.__context__
            if isinstance(cause, OSError):
                raise cause from None
            raise


def refuse_non_finite(payload: dict[str, Any], path: Path) -> None:
    """Raise :class:`CheckpointError` naming ``path`` when a weight of ``payload`` is NaN or infinite."""
    if key := non_finite_weights(payload):
        raise CheckpointError(f"{path}: refusing to save non-finite '{key}' weights")


# The oldest torch whose ``weights_only`` loader has no published bypass: CVE-2025-32434 (GHSA-53q9-r3pm-6pq6,
# remote code execution through ``torch.load(weights_only=True)``) is fixed in 2.6, and CVE-2026-24747
# (GHSA-63cw-57p8-fm3p, heap corruption in the weights_only unpickler from a crafted storage) in 2.10.
# pyproject.toml declares the same floor; this check covers an environment that installed around it.
TORCH_FLOOR = (2, 10)
_VERSION = re.compile(r"(\d+)\.(\d+)")


def torch_floor_problem(version: str | None = None) -> str | None:
    """Why this torch may not load files from others (one sentence), or None when it is at the floor or above.

    Only the release number counts: a ``2.10.0a0+nv...`` container build is 2.10.
    """
    version = version or torch.__version__
    match = _VERSION.match(version)
    if match and (int(match.group(1)), int(match.group(2))) >= TORCH_FLOOR:
        return None
    floor = ".".join(map(str, TORCH_FLOOR))
    return (f"torch {version} is older than {floor}, whose weights_only loader a crafted file can exploit "
            f"(CVE-2025-32434, CVE-2026-24747); install torch>={floor}")


def refuse_on_old_torch(path: str | Path) -> None:
    """Raise :class:`CheckpointError` naming ``path`` when :func:`torch_floor_problem` finds one."""
    if problem := torch_floor_problem():
        raise CheckpointError(f"{path}: refused to load: {problem}")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load without unpickling arbitrary objects (``weights_only=True``), on a torch at :data:`TORCH_FLOOR` or later.

    Raises:
        CheckpointError: one line naming the file: missing, refused (it names code to run, is a TorchScript
            archive, or torch is too old to read files from others safely), empty, truncated, no PyTorch checkpoint
            at all, or not a dict
            (:func:`detector.checkpoint_problems.load_problem` words it).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    refuse_on_old_torch(path)
    if problem := torchscript_problem(path):  # before torch.load, whose warning advises the load that runs its code
        raise CheckpointError(f"{path}: {problem}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for corrupt or foreign files; none is a bug of ours
        raise CheckpointError(f"{path}: {load_problem(error, path)}") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path}: not a detector checkpoint (holds a {type(checkpoint).__name__}, not a dict)")
    return checkpoint


# What a stripped checkpoint keeps besides the weights (:func:`strip_checkpoint`).
STRIPPED_KEYS = ("epoch", "model_args", "names", "metrics", "config", "precision", "best_fitness", "best_epoch",
                 "fitness_rule", "versions")
FP16_MAX = torch.finfo(torch.float16).max


def to_half(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FP32 tensors as FP16 on the CPU; integer tensors (BatchNorm counters) and any tensor with a value
    beyond FP16's range (65504, which would become inf) keep their type. Every tensor returned is a copy, sharing
    no memory with ``state_dict``'s: the result may be kept while training goes on changing the weights."""
    floats = [name for name, tensor in state_dict.items() if tensor.is_floating_point()]
    fits = {name for name, peak in zip(floats, peak_magnitudes([state_dict[name] for name in floats]))
            if not peak > FP16_MAX}  # a NaN converts too, as it would have before
    dtypes = {name: torch.float16 if name in fits else tensor.dtype for name, tensor in state_dict.items()}
    copies = {name: tensor.detach().to(dtype=dtypes[name], copy=True) for name, tensor in state_dict.items()
              if tensor.device.type == "cpu"}
    # The others converted where they are (on a GPU: a kernel each, no wait), then copied out together.
    elsewhere = [name for name in state_dict if name not in copies]
    copies.update(zip(elsewhere, host_copies([state_dict[name].detach().to(dtype=dtypes[name]) for name in elsewhere])))
    return {name: copies[name] for name in state_dict}


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


def model_args(checkpoint: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``checkpoint["model_args"]`` checked: ``num_classes`` a positive int, ``scale`` a model name (``n`` ... ``x``,
    ``11n`` ... ``11x``), ``reg_max`` (optional, 16) and ``class_channels`` (optional, ``None``: the default width)
    positive ints; anything else is a :class:`CheckpointError` naming the key."""
    if "model_args" not in checkpoint or "model" not in checkpoint:
        raise CheckpointError(f"{path}: missing 'model_args' or 'model'; not a detector checkpoint")
    args = checkpoint["model_args"]
    if not isinstance(args, dict):
        raise CheckpointError(f"{path}: 'model_args' is a {type(args).__name__}, not a dict")
    unknown = sorted(map(str, set(args) - {"num_classes", "scale", "reg_max", "class_channels"}))
    if unknown:
        raise CheckpointError(f"{path}: 'model_args' has unknown key {unknown[0]!r}")
    checked = {"num_classes": args.get("num_classes"), "scale": args.get("scale"), "reg_max": args.get("reg_max", 16),
               "class_channels": args.get("class_channels")}
    for key in ("num_classes", "reg_max", "class_channels"):
        value = checked[key]
        if key == "class_channels" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 100_000:
            raise CheckpointError(f"{path}: 'model_args' {key} is {value!r}; expected a positive integer")
    if checked["scale"] not in MODEL_NAMES:
        raise CheckpointError(f"{path}: 'model_args' scale is {checked['scale']!r}; expected one of "
                              f"{' '.join(MODEL_NAMES)}")
    return checked


def load_weights(model: nn.Module, state_dict: object, path: str | Path, *, what: str = "weights") -> None:
    """``model.load_state_dict(state_dict)`` (strict); a mismatch is one :class:`CheckpointError` line naming
    the file and the first differing keys instead of torch's multi-line list."""
    if not isinstance(state_dict, dict):
        raise CheckpointError(f"{path}: '{what}' is a {type(state_dict).__name__}, not a state dict")
    own = model.state_dict()
    missing = [key for key in own if key not in state_dict]
    unexpected = [key for key in state_dict if key not in own]
    misshapen = [key for key in own if key in state_dict and not _same_shape(state_dict[key], own[key])]
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("of another shape", misshapen)):
        if keys:
            raise CheckpointError(f"{path}: the {what} do not fit the model: {len(keys)} tensors {label} "
                                  f"(first: {keys[0]}); was it written by another version or model?")
    model.load_state_dict(state_dict)


# ``train --weights``: the share of the model's tensors a file must fill for the run to count as a fine-tune. Measured
# on our models: the same scale with another class count fills 90% (nano: 319/355, its whole class branch depends
# on the count) to 98% (s: 349/355); a file of another scale fills 20-26% (BatchNorm counters and the DFL conv,
# whose shapes never change); a foreign file, none. Half sits well between the two.
MIN_MATCHED_SHARE = 0.5


def load_matching(model: nn.Module, state_dict: object, path: str | Path) -> tuple[int, int]:
    """Copy the tensors of ``state_dict`` whose names and shapes match ``model``; -> (copied, the model's total).

    Raises:
        CheckpointError: fewer than :data:`MIN_MATCHED_SHARE` of the model's tensors match (one line, with the count):
            training would silently start from scratch.
    """
    if not isinstance(state_dict, dict):
        raise CheckpointError(f"{path}: the weights are a {type(state_dict).__name__}, not a state dict")
    own = model.state_dict()
    compatible = {key: value for key, value in state_dict.items() if key in own and _same_shape(value, own[key])}
    if len(compatible) < MIN_MATCHED_SHARE * len(own):
        raise CheckpointError(f"{path}: only {len(compatible)}/{len(own)} tensors fit the model (under "
                              f"{MIN_MATCHED_SHARE:.0%}); these weights are for another model, so training would "
                              "start from scratch")
    model.load_state_dict(compatible, strict=False)
    return len(compatible), len(own)


def _same_shape(value: object, reference: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.shape == reference.shape


def model_from_checkpoint(path: str | Path, *, use_ema: bool = True) -> tuple[YOLO, dict[str, Any]]:
    """Rebuild the model (EMA weights when present) in eval mode; return it and the checkpoint dict.

    Raises:
        CheckpointError: one line naming the file (unreadable, bad ``model_args``, weights that do not fit).
    """
    checkpoint = load_checkpoint(path)
    model = build_model(**model_args(checkpoint, path))
    weights = checkpoint["ema"] if use_ema and checkpoint.get("ema") is not None else checkpoint["model"]
    load_weights(model, weights, path)
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
        patience_epoch: the epoch ``--patience`` counts from (detector/training/verdicts.py); None in older checkpoints.
        fitness_rule: how best_fitness was scored (detector/training/decision.py); None in older checkpoints.
        metrics: the last evaluation's metrics; names: class names; config: ``TrainConfig.to_dict()``.
        precision: the precision the run trains in; ``precision_fell_back``: it is not what the run's device
            resolved (the AMP check or a fallback during training chose it), so a resume keeps it where it is safer.
        unjudged: ``{"stats", "precision"}`` of epoch ``epoch`` when its validation was still being scored in the
            background as this was written (``--val-background``): a resume scores and judges it first.
    """

    epoch: int
    config: dict[str, Any]
    names: list[str]
    precision: str
    precision_fell_back: bool = True  # older checkpoints did not say: kept where safer, as they always were
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
    patience_epoch: int | None = None
    fitness_rule: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    unjudged: dict[str, Any] | None = None


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
        "patience_epoch": state.patience_epoch,
        "fitness_rule": state.fitness_rule,
        "metrics": state.metrics,
        "unjudged": state.unjudged,
        "model_args": model.rebuild_args(),
        "names": state.names,
        "config": state.config,
        "precision": state.precision,
        "precision_fell_back": state.precision_fell_back,
        "versions": software_versions(),
    }


def software_versions() -> dict[str, str]:
    """What wrote a checkpoint: detector's and torch's versions (Ultralytics keeps its version in each checkpoint too).
    No date: a run repeated with the same seed writes the same bytes."""
    return {"detector": __version__, "torch": str(torch.__version__)}  # a str subclass would pickle as a global


def matched_to_parameters(optimizer: torch.optim.Optimizer) -> int:
    """Give each of ``optimizer``'s state tensors of its parameter's shape that parameter's memory layout (in place of
    the loaded one); -> how many it changed.

    ``load_state_dict`` moves the saved state to the parameter's device and dtype but keeps the layout it was saved
    in, and the fused optimizers assume the parameter's: a channels-last weight with channels-first moments (a
    checkpoint whose copies lost their layout, or a resume that switched ``--channels-last``) stopped the fused CUDA
    kernels with an error, and the fused CPU kernels, which walk the memory flat, stepped with another element's
    moment without a word."""
    changed = 0
    for parameter, state in optimizer.state.items():
        for name, value in state.items():
            if (isinstance(value, torch.Tensor) and value.shape == parameter.shape and value.dim() > 1
                    and value.stride() != parameter.stride()):
                state[name] = torch.empty_like(parameter, dtype=value.dtype).copy_(value)
                changed += 1
    return changed


def saved_precision(checkpoint: dict[str, Any]) -> tuple[str, bool]:
    """The precision a :func:`run_checkpoint` trained in ("" where it does not say) and whether the run had fallen
    back to it; older files did not say, and count as fallen back (kept where safer, as they always were)."""
    return checkpoint.get("precision", ""), bool(checkpoint.get("precision_fell_back", True))


def restore_run(checkpoint: dict[str, Any], trained: Trained) -> RunState:
    """Load a :func:`run_checkpoint` into ``trained`` (the scaler only where it is enabled) and return its state.

    Keys that older checkpoints lack get the defaults of :class:`RunState`.
    """
    trained.model.load_state_dict(checkpoint["model"])
    trained.ema.load_state_dict(checkpoint["ema"])
    # The file gives the optimizer's state; its groups' settings stay this run's: load_state_dict replaces them with
    # the saved ones, and weight decay is scaled by the global batch (another number of torchrun processes).
    settings = [{key: value for key, value in group.items() if key != "params"}
                for group in trained.optimizer.param_groups]
    trained.optimizer.load_state_dict(checkpoint["optimizer"])
    for group, own in zip(trained.optimizer.param_groups, settings):
        group.update(own)
    matched_to_parameters(trained.optimizer)
    if checkpoint.get("scaler") and trained.scaler.is_enabled():
        trained.scaler.load_state_dict(checkpoint["scaler"])
    precision, fell_back = saved_precision(checkpoint)
    return RunState(
        epoch=checkpoint["epoch"],
        config=checkpoint["config"],
        names=list(checkpoint.get("names") or []),
        precision=precision,
        precision_fell_back=fell_back,
        ema_updates=checkpoint.get("ema_updates", 0),
        plan=dict(checkpoint.get("plan") or {}),
        schedule=checkpoint.get("schedule"),
        optimizer_choice=checkpoint.get("optimizer_choice"),
        time_spent=checkpoint.get("time_spent", 0.0),
        epoch_seconds=list(checkpoint.get("epoch_seconds", [])),
        val_seconds=list(checkpoint.get("val_seconds", [])),
        mosaic_closed_at=checkpoint.get("mosaic_closed_at"),
        best_fitness=checkpoint.get("best_fitness", -1.0),
        best_epoch=checkpoint.get("best_epoch", -1),
        patience_epoch=checkpoint.get("patience_epoch"),
        fitness_rule=checkpoint.get("fitness_rule"),
        metrics=dict(checkpoint.get("metrics") or {}),
        unjudged=checkpoint.get("unjudged"),
    )
