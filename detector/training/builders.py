"""Everything a training run is built from, one function per object, each taking the config (and only these
see the whole config): data, loss, loader, optimizer with its schedule, the model, its DDP wrapper.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from detector.architecture import HEAD_LAYER, display_name, family_and_scale, family_name
from detector.assigner import AssignerConfig
from detector.checkpoint import CheckpointError, is_stripped, load_checkpoint, load_matching, model_args
from detector.checkpoint_integrity import damage
from detector.data.augment import AugmentConfig
from detector.data.build import SplitData, build_split
from detector.data.catalog import resolve_data_yaml
from detector.data.dataset import collate
from detector.data.letterbox import rect_batches
from detector.data.sampler import EpochSampler, RectBatchSampler
from detector.data.spec import DatasetError, DatasetSpec, load_dataset_spec, only_classes, single_class
from detector.data.workers import PREFETCH_FACTOR, worker_init
from detector.distributed import DistInfo, broadcast_from_main
from detector.files import write_text_atomically
from detector.loss import DetectionLoss, LossGains, frequency_weights
from detector.model import YOLO, build_model
from detector.model.head import class_width_key
from detector.model.yolo import INPUT_MULTIPLE
from detector.runs import claim_run_dir
from detector.training.budget import MAX_WARMUP_SHARE, MIN_WARMUP_STEPS
from detector.training.config import SEED_MAX, TrainConfig
from detector.training.optim import OptimizerChoice, build_optimizer
from detector.training.rect import augment_placement, mixing
from detector.training.run_lock import hold_run_lock
from detector.training.schedule import StepSchedule


def build_augment(config: TrainConfig) -> AugmentConfig:
    """The workers' augmentation; ``--rect`` mixes no images (detector/training/rect.py)."""
    return AugmentConfig(
        **mixing(config), degrees=config.degrees,
        translate=config.translate, scale=config.scale, shear=config.shear, perspective=config.perspective,
        hsv_h=config.hsv_h, hsv_s=config.hsv_s, hsv_v=config.hsv_v, fliplr=config.fliplr, flipud=config.flipud,
        bgr=config.bgr, albumentations=config.albumentations,
    )


def resolve_data(config: TrainConfig) -> DatasetSpec:
    yaml_path = config.data or "shapes"  # the shipped shapes.yaml: generated into the datasets root on first use
    return load_dataset_spec(yaml_path, datasets_dir=config.datasets_dir or None)


def build_data(
    config: TrainConfig, *, with_val: bool, device: torch.device, dist: DistInfo | None = None
) -> tuple[DatasetSpec, SplitData, SplitData | None]:
    """The dataset spec, the augmented training split, and (where evaluation runs) the validation split.

    Under torchrun, call it on each node's local rank 0 first (:func:`detector.distributed.local_main_first`):
    that process scans the data and fills the RAM cache the node's processes share.

    ``device`` decides where ``--pixel-augment auto`` puts mosaic, affine, HSV and flips
    (:func:`~detector.training.rect.augment_placement`).
    """
    dist = dist or DistInfo()
    spec = resolve_data(config)
    spec = only_classes(spec, config.classes) if config.classes is not None else spec
    spec = single_class(spec) if config.single_cls else spec
    spec.train = dataclasses.replace(spec.train, fraction=config.fraction)
    train = build_split(spec, "train", image_size=config.imgsz, augment=build_augment(config), cache=config.cache,
                        local_rank=dist.local_rank, local_world_size=dist.local_world_size, run_id=run_id())
    train.dataset.seed = config.seed
    where = augment_placement(config, device)
    train.dataset.pixel_ops_on_device = where in ("pixels", "device")
    train.dataset.geometry_on_device = where == "device"
    val = build_split(spec, "val", image_size=config.imgsz, augment=None, cache=config.cache) if with_val else None
    return spec, train, val


def run_id() -> str:
    """What tells this torchrun launch from any other (empty for a single process)."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}:{os.environ.get('MASTER_PORT', '')}"


def build_criterion(config: TrainConfig, model: YOLO, class_counts: np.ndarray | None = None) -> DetectionLoss:
    """The run's loss on ``model``'s device; ``class_counts``: the training split's boxes per class, which
    ``--cls-pw`` weights the classes by (:func:`~detector.loss.frequency_weights`; without them, no weights)."""
    weights = None if class_counts is None else frequency_weights(torch.from_numpy(class_counts), config.cls_pw)
    return DetectionLoss.for_model(
        model, gains=LossGains(box=config.box_gain, cls=config.cls_gain, dfl=config.dfl_gain),
        assigner=AssignerConfig(top_k=config.assigner_topk, alpha=config.assigner_alpha, beta=config.assigner_beta),
        class_weights=None if weights is None else weights.to(next(model.parameters()).device),
    ).to(next(model.parameters()).device)  # its buffers (the end-to-end branch weight) where the maps are


def build_train_loader(
    data: SplitData, config: TrainConfig, dist: DistInfo, device: torch.device
) -> tuple[EpochSampler | RectBatchSampler, DataLoader]:
    """The training sampler and loader: whole batches of ``--batch`` images a rank (one batch size, see
    detector/training/multiscale.py), shuffled images, or under ``--rect`` batches of one canvas each."""
    pinned = device.type == "cuda"
    # Pinned, every batch is copied out by the pin thread, which frees the worker's pooled buffer (BatchPool; its
    # docstring says why PREFETCH_FACTOR buffers a worker).
    workers: dict[str, Any] = dict(
        num_workers=config.workers, collate_fn=collate, persistent_workers=config.workers > 0, pin_memory=pinned,
        prefetch_factor=PREFETCH_FACTOR if config.workers > 0 else None,
        worker_init_fn=worker_init(shares_cores_with_compute=device.type == "cpu",
                                   pool_slots=PREFETCH_FACTOR if pinned else 0))
    if config.rect:  # after --batch -1 is sized: the batches (and so their canvases) are cut at the batch size
        order, canvases = rect_batches(data.records.image_hw, config.imgsz, config.batch, INPUT_MULTIPLE)
        batches = RectBatchSampler(order, canvases, batch=config.batch, seed=config.seed, rank=dist.rank,
                                   world_size=dist.world_size)
        return batches, DataLoader(data.dataset.with_canvases(canvases), batch_sampler=batches, **workers)
    sampler = EpochSampler(len(data.dataset), seed=config.seed, rank=dist.rank, world_size=dist.world_size,
                           batch=config.batch)
    return sampler, DataLoader(data.dataset, batch_size=config.batch, sampler=sampler, **workers)


def build_optimization(
    config: TrainConfig,
    model: YOLO,
    *,
    steps_per_epoch: int,
    world_size: int,
    epochs: int | None = None,
    warmup_epochs: float | None = None,
    resolved: tuple[str, float] | None = None,
) -> tuple[OptimizerChoice, StepSchedule]:
    """The optimizer (three parameter groups) and the schedule the loop follows.

    ``epochs`` and ``warmup_epochs`` are the planned run (a ``--time`` budget's fit; default: the config's):
    ``--optimizer auto`` chooses from its length. ``resolved`` is the ``(optimizer, lr)`` a resumed run had
    chosen: its saved optimizer state belongs to that choice, whatever auto would pick now.
    """
    epochs = config.epochs if epochs is None else epochs
    warmup_epochs = config.warmup_epochs if warmup_epochs is None else warmup_epochs
    global_batch = config.batch * world_size
    accumulate = max(round(config.nominal_batch / global_batch), 1)
    name, lr = resolved or (config.optimizer, config.lr0)
    choice = build_optimizer(
        model, name=name, lr=lr, momentum=config.momentum,
        weight_decay=config.weight_decay * global_batch * accumulate / config.nominal_batch,
        num_classes=model.num_classes, total_steps=optimizer_steps(steps_per_epoch, accumulate, epochs),
        warmup_bias_lr=config.warmup_bias_lr,
    )
    schedule = StepSchedule(
        epochs=epochs, steps_per_epoch=steps_per_epoch,
        warmup_steps=warmup_steps(warmup_epochs, steps_per_epoch, epochs),
        base_lr=choice.lr, final_lr_fraction=config.lrf, cosine=config.cosine,
        warmup_bias_lr=choice.warmup_bias_lr, warmup_momentum=config.warmup_momentum, momentum=choice.momentum,
        batch_size=global_batch, nominal_batch=config.nominal_batch, clip_grad=config.clip_grad,
    )
    return choice, schedule


def optimizer_steps(steps_per_epoch: int, accumulate: int, epochs: int) -> int:
    """The optimizer steps a run of ``epochs`` takes after its warm-up: each epoch ends with one, so a partial
    accumulation counts (BCCD at batch 16: 13 batches, accumulate 4, 4 steps an epoch; ``13 // 4`` counted 3.25).
    Ultralytics' ``ceil(images / max(batch, nbs))`` an epoch is the same count for a batch that divides 64."""
    return math.ceil(steps_per_epoch / accumulate) * epochs


def warmup_steps(warmup_epochs: float, steps_per_epoch: int, epochs: int) -> int:
    """Warm-up length in steps: ``warmup_epochs`` of them, at least :data:`MIN_WARMUP_STEPS` (ours: Ultralytics had
    that floor up to 8.3, 8.4 has none), at most a quarter of the run's ``epochs`` (none when ``warmup_epochs`` is
    0)."""
    if warmup_epochs <= 0:
        return 0
    cap = max(1, int(MAX_WARMUP_SHARE * epochs * steps_per_epoch))
    return min(max(round(warmup_epochs * steps_per_epoch), MIN_WARMUP_STEPS), cap)


def build_run_model(config: TrainConfig, names: list[str], log, resumed: tuple[dict, Path] | None) -> YOLO:
    """The run's model: the resumed run's own (``resumed``: its checkpoint and path), its class branch's width
    included, or one from ``--weights`` or fresh (:func:`build_model_from_weights`)."""
    if resumed is None:
        return build_model_from_weights(config, names, log)
    checkpoint, path = resumed
    width = model_args(checkpoint, path)["class_channels"]
    return build_model(num_classes=len(names), scale=config.model, class_channels=width)


def build_model_from_weights(config: TrainConfig, names: list[str], log) -> YOLO:
    """A fresh model, or one started from ``--weights``: our own checkpoint or an Ultralytics YOLOv8, YOLO11 or YOLO26
    file.

    The model (family and scale) comes from the weights file when there is one; a mismatch with ``--model`` is
    reported. So does the
    class branch's width, so that its hidden layers carry over to another class count (as in Ultralytics 8.4), and
    the class-logit rows of classes the weights name alike start from those (:mod:`detector.weights.class_rows`).
    Ultralytics files are read with a restricted unpickler (no code from the file runs).
    """
    if not config.weights:
        return build_model(num_classes=len(names), scale=config.model)
    from detector.inference.pt_model import read_foreign_weights
    from detector.weights import load_pretrained, read_ultralytics_checkpoint, resolve_weights
    from detector.weights.class_rows import moved_class_rows

    path = resolve_weights(config.weights)
    refused: CheckpointError | None = None
    try:
        ours = load_checkpoint(path)
    except CheckpointError as error:
        ours, refused = None, error  # not one of ours: the Ultralytics reader's turn, then both reasons if it fails
    if ours is not None and "model_args" in ours:
        scale, weights = model_args(ours, path)["scale"], ours.get("ema") or ours["model"]
        first = "head." + class_width_key(depthwise=family_and_scale(scale)[0] != "v8")
        width = weights.get(first) if isinstance(weights, dict) else None
        model = build_model(num_classes=len(names), scale=scale,
                            class_channels=int(width.shape[0]) if isinstance(width, torch.Tensor) else None)
        moved, matched = (moved_class_rows(weights, model.state_dict(), [str(name) for name in ours.get("names") or []],
                                           names) if isinstance(weights, dict) else ({}, 0))
        kept = {key: value for key, value in weights.items() if key not in moved} if moved else weights
        copied, total = load_matching(model, kept, path)  # refuses under half
        model.load_state_dict(moved, strict=False)
        named = (f"; {matched} of {len(names)} classes start from its class of the same name, {len(names) - matched} "
                 "fresh") if moved else ""
        log(f"weights: {copied + len(moved)}/{total} tensors from {path} ({display_name(scale)}){named}")
        return model
    # As val and predict say it: our reader's refusal (naming the global the file would run) was dropped here.
    checkpoint = read_ultralytics_checkpoint(path) if refused is None else read_foreign_weights(path, refused)
    if checkpoint.scale != config.model:
        log(f"weights: {path.name} is {display_name(checkpoint.scale)}; building it instead of --model {config.model} "
            f"({display_name(config.model)}): the file decides")
    model = build_model(num_classes=len(names), scale=checkpoint.scale, class_channels=checkpoint.class_channels)
    log(f"weights: {load_pretrained(model, checkpoint, names).summary()}")
    return model


def freeze_layers(model: YOLO, count: int, log) -> tuple[str, ...]:
    """``--freeze N``: layers ``0..N-1`` stop training, numbered as Ultralytics numbers the model's family and as its
    ``freeze=N`` freezes them; -> our modules frozen.

    The family's layer numbers map onto our attributes (:data:`detector.weights.ultralytics.LAYERS`). YOLOv8: 0-9 are
    the backbone (``stem`` ... ``sppf``), 10-21 the neck (upsample and concat layers have no parameters), 22 the head.
    YOLO11: 0-10 the backbone (its C2PSA attention, ``psa``, is 10), 11-22 the neck, 23 the head. Frozen parameters
    get ``requires_grad=False``, so :func:`build_optimizer` leaves them out and no gradient is computed for them.
    BatchNorm layers inside keep updating their running statistics in training mode, as in Ultralytics: the frozen
    weights stay the pretrained ones, while the statistics follow the new data's distribution (the cheapest part of
    adapting to it), and the same ``--freeze`` trains what it trains there. The module types stay as they are, so
    checkpoints, the EMA and export see the same model.

    Raises:
        ValueError: ``count`` reaches past the family's head (``--freeze 23`` on YOLOv8, whose head is 22: the
            configuration allows 23 for YOLO11 before the weights file has decided the family).
    """
    from detector.weights.ultralytics import LAYERS

    family = model.family
    if count > HEAD_LAYER[family]:
        raise ValueError(f"--freeze {count}: {display_name(model.scale)} numbers its layers 0-{HEAD_LAYER[family]}, "
                         f"its head {HEAD_LAYER[family]}; --freeze {HEAD_LAYER[family]} trains the head alone")
    names = tuple(name for _, name in LAYERS[family][:count] if name is not None)
    for name in names:
        getattr(model, name).requires_grad_(False)
    if names:
        frozen = sum(p.numel() for name in names for p in getattr(model, name).parameters())
        total = sum(p.numel() for p in model.parameters())
        log(f"freeze: {family_name(family)} layers 0-{count - 1} ({', '.join(names)}): {frozen:,} of {total:,} "
            "parameters frozen")
    return names


# Options added since a checkpoint may have been written, where the new default would change what a resumed run
# measures: a run that began before them continues as it ran. Rectangular validation batches (2026-11) move
# mAP slightly (other padding), so a run that validated on squares keeps squares: one method for its whole curve.
# (Not --rect: its default, off, is how every run before it trained, and a missing key takes the default.)
BEFORE_THEIR_TIME: dict[str, Any] = {"val_rect": False}


# What a resumed run takes from the command line (--project: where --resume auto looks), and what it may change
# besides: when to stop early, what it keeps and draws, how it caches and scores, none of which changes the weights
# it trains (Ultralytics lets a resume change these too). Every other setting is the run's own, since its schedule,
# optimizer state and curves were made with them.
RESUME_MAY_CHANGE = frozenset({"device", "workers", "resume", "project"})
RESUME_MAY_SET = frozenset({"patience", "save_period", "plots", "tensorboard", "cache", "coco_eval", "val_background",
                            # A run out of GPU memory goes on with a smaller batch, as Ultralytics lets it: the
                            # schedule is carried over by epochs (StepSchedule.restored), the rest is the run's own.
                            "batch"})


def ignored_on_resume(asked: dict[str, Any], saved: TrainConfig) -> list[str]:
    """The settings asked for (:meth:`TrainConfig.changed`) that a resumed run does not take, as ``name=value (the
    run's: value)``: those that differ from the run's own, and none :data:`RESUME_MAY_SET` takes (a resumed
    ``--batch -1`` keeps the batch the run chose: :func:`load_resume`)."""
    return [f"{name}={value} (the run's: {getattr(saved, name)})" for name, value in asked.items()
            if name not in RESUME_MAY_CHANGE | RESUME_MAY_SET and value != getattr(saved, name)]


def newest_resumable(project: str) -> Path | None:
    """``--resume auto``: the newest ``<project>/*/weights/last.pt`` of a run that did not finish (a finished run's
    is stripped), so a run finished since does not hide an older interrupted one; None where there is none."""
    for path in sorted(Path(project).glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            if not is_stripped(load_checkpoint(path)):
                return path
        except CheckpointError:
            continue  # a damaged file is no run to resume
    return None


def data_problem(saved: TrainConfig) -> str | None:
    """Why a resumed run cannot train on its own data YAML: it ``is gone``, or its dataset no longer loads (the
    images moved, the YAML stayed); None where it can (the YAML read, its folders listed: no scan)."""
    if not resolve_data_yaml(saved.data).is_file():
        return "is gone"
    try:
        load_dataset_spec(saved.data, datasets_dir=saved.datasets_dir or None)
    except DatasetError as error:
        return f"no longer loads ({error})"
    return None


def load_resume(config: TrainConfig, asked: dict[str, Any] | None = None) -> tuple[TrainConfig, Path, dict[str, Any]]:
    """``--resume``: the run's own config (only the device and worker count may change), its last.pt and that file.

    ``--resume auto`` takes the newest ``<project>/*/weights/last.pt``, a run folder its ``weights/last.pt``. A
    stripped file holds no optimizer state and is refused, naming the fine-tune that starts from it instead. Other
    settings in ``asked`` that differ from the run's are named in one warning: ignoring them silently would let
    ``--resume --epochs 200`` look as if it trained on.
    """
    path = newest_resumable(config.project) if config.resume == "auto" else Path(config.resume)
    if path is None:
        raise CheckpointError(f"{config.project}: no last.pt to resume from (none of an unfinished run)")
    if path.is_dir():  # a run folder (runs/train/exp) or its weights folder: the last.pt in it
        inside = [found for found in (path / "weights" / "last.pt", path / "last.pt") if found.is_file()]
        if not inside:
            raise CheckpointError(f"{path}: a folder without weights/last.pt; resume names a run folder or its last.pt")
        path = inside[0]
    checkpoint = load_checkpoint(path)
    if is_stripped(checkpoint):
        epochs, done = (checkpoint.get("config") or {}).get("epochs"), checkpoint.get("epoch", -1) + 1
        what = (f"its run finished all {epochs} epochs" if path.name == "last.pt" and epochs and done >= epochs
                else "it holds no optimizer state (stripped: a best.pt, or a finished run's last.pt)")
        raise CheckpointError(f"{path}: {what}, so it cannot be resumed; to train on from it, start a fine-tune: "
                              f"--weights {path}")
    if problem := damage(path, checkpoint):
        raise CheckpointError(f"{path}: damaged ({problem}); resume from another checkpoint of the run (a "
                              "--save-period epoch<N>.pt) or start again")
    saved = TrainConfig.from_dict({**BEFORE_THEIR_TIME, **checkpoint["config"]})
    asked = dict(asked or {})
    if saved.data and (problem := data_problem(saved)):  # the dataset moved since (as Ultralytics allows)
        if "data" not in asked:
            raise CheckpointError(f"{path}: its run's data YAML {saved.data} {problem}; if the dataset moved, resume "
                                  "with --data NEW.yaml")
        warnings.warn(f"{path}: its run's data YAML {saved.data} {problem}; resuming on {asked['data']}")
        saved.data = asked.pop("data")
        same_classes(path, saved, list(checkpoint.get("names") or []))
    if ignored := ignored_on_resume(asked, saved):
        warnings.warn(f"{path}: a resumed run keeps its own settings; ignored: {', '.join(ignored)}. To train with "
                      f"other settings, start a new run from its weights: --weights {path}")
    # --project too: a checkpoint outside a run's weights/ folder resumes into a new run under it (make_run_dir); the
    # saved one may be another machine's path.
    saved.device, saved.workers, saved.resume, saved.project = config.device, config.workers, str(path), config.project
    for name in sorted(RESUME_MAY_SET & asked.keys()):
        if asked[name] != getattr(saved, name) and (name, asked[name]) != ("batch", -1):  # said: not the run's own
            print(f"note: the resumed run takes {name}={asked[name]} (it had {getattr(saved, name)})")
            setattr(saved, name, asked[name])
    return saved.with_defaults().validate(), path, checkpoint


def same_classes(path: Path, saved: TrainConfig, names: list[str]) -> None:
    """A run resumed on a moved dataset (``--data NEW.yaml``) keeps its model: another number of classes is refused
    in one line (it was torch's size-mismatch traceback), other names are said in a warning (they were taken
    silently)."""
    if not names:  # a checkpoint that does not say
        return
    spec = resolve_data(saved)
    new = single_class(spec).names if saved.single_cls else spec.names
    if len(new) != len(names):
        raise CheckpointError(f"{path}: its run trains {len(names)} classes and {saved.data} names {len(new)}; a "
                              f"resumed run keeps its model: to train on {saved.data}, start a fine-tune: --weights "
                              f"{path}")
    if new != names:
        changed = [f"{old} -> {name}" for old, name in zip(names, new) if old != name]
        warnings.warn(f"{saved.data}: its classes are named otherwise than the run's ({', '.join(changed[:5])}"
                      f"{' ...' if len(changed) > 5 else ''}); the resumed run takes the new names")


def wrap_distributed(model: YOLO, config: TrainConfig, dist: DistInfo, device: torch.device) -> torch.nn.Module:
    if not dist.enabled:
        return model
    if config.sync_bn and device.type == "cuda":
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators from one seed (data order, augmentation, initial weights). Taken
    modulo 2**32, NumPy's legacy range: each rank seeds with ``--seed`` + its rank, which passed the largest seed."""
    seed %= SEED_MAX + 1
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_run_dir(config: TrainConfig, dist: DistInfo, *, resumed: Path | None) -> Path:
    """The run's folder, with ``weights/`` and the run's ``config.yaml``: a resumed run's own (``resumed``: its
    checkpoint), else a new one claimed under ``--project``/``--name``. Rank 0 alone claims it (atomically: a run
    started beside it takes name2) and tells the others, which would see rank 0's folder and pick name2."""
    run_dir = None
    if dist.is_main:
        if resumed is not None and resumed.parent.name == "weights":  # <run>/weights/last.pt (or epochN.pt)
            run_dir = resumed.parent.parent
        else:  # a checkpoint taken out of its run (~/Downloads/last.pt): a run folder of its own, never its grandparent
            run_dir = claim_run_dir(config.project, config.name)
            if resumed is not None:
                print(f"note: {resumed} is not in a run's weights/ folder: the resumed run goes to {run_dir}, its "
                      "results.csv from the epoch it resumes at")
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        hold_run_lock(run_dir)
        if resumed is not None:  # what a run killed while writing a checkpoint left: never to be renamed now
            for stale in (run_dir / "weights").glob(".*.pt.*.tmp"):
                stale.unlink(missing_ok=True)
        # config.yaml starts the run anew (``cfg=config.yaml``): it names the folder claimed (``full8`` taken, the run
        # is ``full82``), and holds no resume (a resumed run's pointed at its last.pt, finished once the run is).
        settings = {**config.to_dict(), "project": str(run_dir.parent), "name": run_dir.name, "resume": ""}
        write_text_atomically(run_dir / "config.yaml", yaml.safe_dump(settings, sort_keys=False))
    return broadcast_from_main(run_dir, dist)
