"""``train(config)``: build everything from the config, run the epochs, evaluate, checkpoint."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from detector.amp_check import amp_preflight, save_preflight
from detector.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from detector.config import TrainConfig
from detector.data.augment import AugmentConfig
from detector.data.build import SplitData, build_split
from detector.data.dataset import collate, model_input
from detector.data.sampler import EpochSampler
from detector.data.spec import DatasetSpec, load_dataset_spec
from detector.data.synthetic import generate_shapes
from detector.data.workers import worker_init
from detector.distributed import barrier, cleanup, init_distributed
from detector.ema import ModelEMA, unwrap
from detector.engine import StepSchedule, make_torch_infer, train_one_epoch
from detector.evaluate import EvalResult
from detector.loss import DetectionLoss, LossGains
from detector.model import YOLO, build_model
from detector.multiscale import MultiScale, images_per_step, keeps_full_batches_only
from detector.optim import build_optimizer
from detector.postprocess import NMSConfig
from detector.precision import Precision, resolve_precision
from detector.reporting import RunReporter
from detector.runs import append_results, newest_file, next_run_dir
from detector.runtime import autotune_convolutions, tune_for_training
from detector.validate import make_val_loader, run_validation


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fitness(metrics: dict[str, float]) -> float:
    """Checkpoint selection score: mostly mAP50-95, a little mAP50 (as YOLO tools do)."""
    return 0.9 * metrics.get("mAP50-95", 0.0) + 0.1 * metrics.get("mAP50", 0.0)


def build_augment(config: TrainConfig) -> AugmentConfig:
    return AugmentConfig(
        mosaic=config.mosaic, degrees=config.degrees, translate=config.translate, scale=config.scale,
        shear=config.shear, hsv_h=config.hsv_h, hsv_s=config.hsv_s, hsv_v=config.hsv_v,
        fliplr=config.fliplr, flipud=config.flipud, albumentations=config.albumentations,
    )


def resolve_data(config: TrainConfig) -> DatasetSpec:
    yaml_path = config.data or generate_shapes()
    return load_dataset_spec(yaml_path)


def build_criterion(config: TrainConfig, model: YOLO) -> DetectionLoss:
    return DetectionLoss(
        num_classes=model.num_classes, strides=model.strides, reg_max=model.reg_max,
        gains=LossGains(box=config.box_gain, cls=config.cls_gain, dfl=config.dfl_gain),
        top_k=config.assigner_topk, alpha=config.assigner_alpha, beta=config.assigner_beta,
    )


def build_model_from_weights(config: TrainConfig, num_classes: int, log) -> YOLO:
    """A fresh model, or one started from ``--weights``: our own checkpoint or an Ultralytics YOLOv8 file.

    The scale comes from the weights file when there is one; a mismatch with ``--model`` is reported.
    Ultralytics files are read with a restricted unpickler (no code from the file runs).
    """
    if not config.weights:
        return build_model(num_classes=num_classes, scale=config.model)
    from detector.weights import load_pretrained, read_ultralytics_checkpoint, resolve_weights

    path = resolve_weights(config.weights)
    try:
        ours = load_checkpoint(path)
    except CheckpointError:
        ours = None  # not one of ours: try the Ultralytics reader, which gives its own clear errors
    if ours is not None and "model_args" in ours:
        scale = ours["model_args"]["scale"]
        model = build_model(num_classes=num_classes, scale=scale)
        state = ours.get("ema") or ours["model"]
        own = model.state_dict()
        compatible = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(compatible, strict=False)
        log(f"weights: {len(compatible)}/{len(own)} tensors from {path} (scale {scale})")
        return model
    checkpoint = read_ultralytics_checkpoint(path)
    if checkpoint.scale != config.model:
        log(f"weights: {path.name} is YOLOv8{checkpoint.scale}; building scale {checkpoint.scale} instead of --model {config.model}")
    model = build_model(num_classes=num_classes, scale=checkpoint.scale)
    log(f"weights: {load_pretrained(model, checkpoint).summary()}")
    return model


class Trainer:
    """Holds the objects of one run; ``fit()`` runs it. Built only from the config."""

    def __init__(self, config: TrainConfig, *, progress: bool = True) -> None:
        self.config = config.with_defaults().validate()
        self.progress = progress
        self.dist, self.device = init_distributed(config.device)
        tune_for_training(self.device)  # before the data cache and the workers' fork: see detector/runtime.py
        self.resume_state: dict[str, Any] | None = None
        if config.resume:
            self._load_resume(config.resume)
        config = self.config
        seed_everything(config.seed + self.dist.rank)
        self.spec = resolve_data(config)
        self.train_data = build_split(
            self.spec, "train", image_size=config.imgsz, augment=build_augment(config), cache=config.cache
        )
        self.train_data.dataset.seed = config.seed
        self.val_data: SplitData | None = (
            build_split(self.spec, "val", image_size=config.imgsz, augment=None, cache=config.cache)
            if self.dist.is_main else None
        )
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        if self.resume_state is None:
            self.model = build_model_from_weights(config, self.spec.num_classes, self.log)
        else:
            self.model = build_model(num_classes=self.spec.num_classes, scale=config.model)
        config.model = self.model.scale  # the weights file may have chosen the scale; resume must rebuild it
        self.precision: Precision = resolve_precision(config.precision, self.device, unamp=config.unamp)
        self.model.to(self.device)
        if config.channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.criterion = build_criterion(config, self.model)
        self.sampler = EpochSampler(
            len(self.train_data.dataset), seed=config.seed, rank=self.dist.rank, world_size=self.dist.world_size
        )
        self.train_loader = DataLoader(
            self.train_data.dataset, batch_size=config.batch, sampler=self.sampler, num_workers=config.workers,
            collate_fn=collate, persistent_workers=config.workers > 0, pin_memory=self.device.type == "cuda",
            drop_last=keeps_full_batches_only(len(self.sampler), config.batch),
            worker_init_fn=worker_init(shares_cores_with_compute=self.device.type == "cpu"),
        )
        steps_per_epoch = len(self.train_loader)
        global_batch = config.batch * self.dist.world_size
        accumulate = max(round(config.nominal_batch / global_batch), 1)
        self.optimizer, self.optimizer_name, base_lr = build_optimizer(
            self.model, name=config.optimizer, lr=config.lr0, momentum=config.momentum,
            weight_decay=config.weight_decay * global_batch * accumulate / config.nominal_batch,
            num_classes=self.spec.num_classes, total_steps=steps_per_epoch * config.epochs // accumulate,
        )
        self.schedule = StepSchedule(
            epochs=config.epochs, steps_per_epoch=steps_per_epoch,
            warmup_steps=max(round(config.warmup_epochs * steps_per_epoch), 100) if config.warmup_epochs > 0 else 0,
            base_lr=base_lr, final_lr_fraction=config.lrf, cosine=config.cosine,
            warmup_bias_lr=config.warmup_bias_lr, warmup_momentum=config.warmup_momentum,
            momentum=config.momentum if self.optimizer_name == "SGD" else 0.9,
            batch_size=global_batch, nominal_batch=config.nominal_batch, clip_grad=config.clip_grad,
        )
        self.multi_scale = MultiScale(
            config.imgsz, low=config.multi_scale_min, high=config.multi_scale_max, hold=config.multi_scale_hold,
            epochs=config.epochs, fixed_last_epochs=config.close_mosaic, enabled=config.multi_scale,
        )
        self.input_shapes = self.multi_scale.input_shapes(
            steps_per_epoch=steps_per_epoch, batch=images_per_step(len(self.sampler), config.batch), seed=config.seed
        )
        autotune_convolutions(self.device, input_shapes=len(self.input_shapes))
        self.ema = ModelEMA(self.model, decay=config.ema_decay)
        self.scaler = self.precision.make_scaler()
        self.start_epoch, self.best_fitness = 0, -1.0
        if self.resume_state is not None:
            self._restore(self.resume_state)
        if self.dist.enabled:
            if config.sync_bn and self.device.type == "cuda":
                self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
            self.model = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.run_dir = self._make_run_dir()
        self.reporter = RunReporter(self.run_dir, self.spec.names, plots=config.plots,
                                    tensorboard=config.tensorboard) if self.dist.is_main else None
        self.interrupted = False

    # ----------------------------------------------------------------------------------------- set-up
    def log(self, message: str) -> None:
        if self.dist.is_main:
            print(message, flush=True)

    def _load_resume(self, resume: str) -> None:
        path = newest_file(self.config.project, "*/weights/last.pt") if resume == "auto" else Path(resume)
        if path is None:
            raise CheckpointError(f"{self.config.project}: no last.pt to resume from")
        state = load_checkpoint(path)
        saved = TrainConfig.from_dict(state["config"])
        # Keep the run's own settings; only the device and worker count may change on resume.
        saved.device, saved.workers, saved.resume = self.config.device, self.config.workers, str(path)
        self.config = saved.with_defaults().validate()
        self.resume_state = state
        self.resume_path = path

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("precision", self.precision.name) != self.precision.name and not self.config.unamp:
            # The run had fallen back (AMP check or non-finite steps): keep the precision it ended with.
            self._set_precision(state["precision"], "restored from the checkpoint (the run had fallen back)")
        self.model.load_state_dict(state["model"])
        self.ema.module.load_state_dict(state["ema"])
        self.ema.updates = state["ema_updates"]
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch = state["epoch"] + 1
        self.best_fitness = state.get("best_fitness", -1.0)
        if self.start_epoch >= self.config.epochs:
            raise CheckpointError(f"{self.resume_path}: run already finished all {self.config.epochs} epochs")

    def _make_run_dir(self) -> Path:
        if self.resume_state is not None:
            run_dir = self.resume_path.parent.parent
        else:
            run_dir = next_run_dir(self.config.project, self.config.name)
        if self.dist.is_main:
            (run_dir / "weights").mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(self.config.to_dict(), sort_keys=False))
        return run_dir

    # ------------------------------------------------------------------------------------- the run
    def checkpoint_payload(self, epoch: int, metrics: dict[str, float]) -> dict[str, Any]:
        model = unwrap(self.model)
        return {
            "model": model.state_dict(),
            "ema": self.ema.module.state_dict(),
            "ema_updates": self.ema.updates,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "best_fitness": self.best_fitness,
            "metrics": metrics,
            "model_args": {"num_classes": model.num_classes, "scale": model.scale, "reg_max": model.reg_max},
            "names": self.spec.names,
            "config": self.config.to_dict(),
            "precision": self.precision.name,
        }

    def evaluate(self, *, force_fp32: bool = False, keep_predictions: bool = False) -> tuple[EvalResult, dict]:
        assert self.val_data is not None
        precision = Precision("fp32", self.device.type, "final FP32 evaluation") if force_fp32 else self.precision
        nms = NMSConfig(conf_threshold=self.config.val_conf, iou_threshold=self.config.val_iou,
                        max_detections=self.config.max_det, multi_label=True)
        infer = make_torch_infer(self.ema.module, precision=precision, nms=nms, device=self.device,
                                 channels_last=self.config.channels_last)
        if not hasattr(self, "_val_loader"):
            self._val_loader = make_val_loader(self.val_data, batch_size=self.config.batch * 2,
                                               workers=self.config.workers, cpu_compute=self.device.type == "cpu")
        return run_validation(infer, self.val_data, loader=self._val_loader, keep_predictions=keep_predictions,
                              results_json=self.run_dir / "predictions.json", progress=self.progress)

    def header(self) -> str:
        model = unwrap(self.model)
        params = sum(p.numel() for p in model.parameters())
        data = self.config.data or "built-in shapes"
        return (
            f"detector: YOLO-{model.scale} ({params / 1e6:.2f}M params, {model.num_classes} classes) | data {data} "
            f"({len(self.train_data.records)} train / {len(self.val_data.records) if self.val_data else '?'} val) | "
            f"{self.device} x{self.dist.world_size} | precision {self.precision.name}: {self.precision.reason} | "
            f"{self.optimizer_name} lr {self.schedule.base_lr:g} | "
            f"{self.multi_scale.describe(len(self.input_shapes))} | run {self.run_dir}"
        )

    def fit(self, *, stop_after_epochs: int | None = None) -> dict[str, Any]:
        """Run the remaining epochs; ``stop_after_epochs`` ends early as an interruption would (for tests)."""
        config = self.config
        if self.start_epoch == 0 and (config.amp_check or self.reporter is not None):
            # The loader's first batch of epoch 0: input to the AMP check and the batch plot. Asking the loader
            # (not collating by hand) also forks its workers now, before the AMP check's freed activations
            # fill this process's heap: forked later, the first steps pay copy-on-write faults for all of
            # that memory (measured: ~2 s on the first step, 2-core CPU).
            self.sampler.set_epoch(0, use_mosaic=config.close_mosaic < config.epochs)
            first_batch = next(iter(self.train_loader))
            if config.amp_check:
                self._preflight(first_batch)
            if self.reporter is not None:
                self.reporter.on_start(self.train_data, first_batch)
        self.log(self.header())
        previous_handler = signal.signal(signal.SIGINT, self._on_interrupt) if self.dist.is_main else None
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        epoch = self.start_epoch - 1
        try:
            for epoch in range(self.start_epoch, config.epochs):
                use_mosaic = epoch < config.epochs - config.close_mosaic
                self.sampler.set_epoch(epoch, use_mosaic=use_mosaic)
                stats = train_one_epoch(
                    model=self.model, criterion=self.criterion, loader=self.train_loader, optimizer=self.optimizer,
                    scaler=self.scaler, ema=self.ema, precision=self.precision, schedule=self.schedule,
                    multi_scale=self.multi_scale, epoch=epoch, seed=config.seed, device=self.device,
                    channels_last=config.channels_last, world_size=self.dist.world_size,
                    progress=self.progress and self.dist.is_main,
                )
                last = epoch == config.epochs - 1
                if self.dist.is_main:
                    metrics = self._end_epoch(epoch, stats, last=last)
                barrier(self.dist)
                if stop_after_epochs is not None and epoch + 1 >= stop_after_epochs:
                    self.interrupted = True
                if self.interrupted:
                    self.log(f"interrupted: saved {self.run_dir / 'weights' / 'last.pt'} after epoch {epoch + 1}")
                    break
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
            cleanup(self.dist)
        summary = {"run_dir": self.run_dir, "metrics": metrics, "seconds": time.perf_counter() - start,
                   "epochs_done": epoch + 1, "precision": self.precision.name}
        if self.dist.is_main and not self.interrupted:
            if config.final_fp32:
                result, _ = self.evaluate(force_fp32=True)
                self.log(f"final FP32 evaluation: mAP50-95 {result.metrics['mAP50-95']:.4f}")
                summary["metrics_fp32"] = result.metrics
            self.log(f"done in {summary['seconds'] / 60:.1f} min: mAP50-95 {metrics.get('mAP50-95', float('nan')):.4f} "
                     f"mAP50 {metrics.get('mAP50', float('nan')):.4f} | best {self.run_dir / 'weights' / 'best.pt'}")
        return summary

    def _end_epoch(self, epoch: int, stats: dict[str, float], *, last: bool) -> dict[str, float]:
        metrics: dict[str, float] = {}
        val_seconds = float("nan")
        if last or (epoch + 1) % self.config.val_interval == 0:
            result, info = self.evaluate(keep_predictions=last)
            metrics, val_seconds = result.metrics, info["seconds"]
            self.log(
                f"epoch {epoch + 1}: mAP50-95 {metrics['mAP50-95']:.4f}  mAP50 {metrics['mAP50']:.4f}  "
                f"mAP75 {metrics['mAP75']:.4f} | {stats['images_per_s']:.1f} img/s | val {val_seconds:.1f}s"
            )
            if last and self.reporter is not None:
                self.log(self.reporter.on_final(result, info, self.val_data) + "\n" + result.summary)
        row: dict[str, object] = {"epoch": epoch + 1, **{k: stats[k] for k in ("train/box", "train/cls", "train/dfl", "lr")}}
        row.update({k: metrics.get(k, "") for k in ("mAP50-95", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large")})
        row.update({"precision": self.precision.name, "val_seconds": val_seconds})
        row.update({k: v for k, v in stats.items() if k not in row})
        append_results(self.run_dir / "results.csv", row)
        if self.reporter is not None:
            self.reporter.on_epoch_end(row, epoch)
        self._fall_back_if_unstable(stats)
        if metrics and fitness(metrics) > self.best_fitness:
            self.best_fitness = fitness(metrics)
            is_best = True
        else:
            is_best = False
        payload = self.checkpoint_payload(epoch, metrics)
        weights_dir = self.run_dir / "weights"
        save_checkpoint(payload, weights_dir / "last.pt")
        if is_best:
            save_checkpoint(payload, weights_dir / "best.pt")
        return metrics

    def _preflight(self, batch: tuple) -> None:
        """AMP check on rank 0's first batch; every rank adopts its verdict."""
        chosen = [self.precision.name]
        if self.dist.is_main and self.precision.name != "fp32":
            images = model_input(batch[0], self.device, channels_last=self.config.channels_last)
            precision, result = amp_preflight(unwrap(self.model), self.criterion, images, batch[1].to(self.device),
                                              self.precision)
            save_preflight(result, self.run_dir / "amp_check.json")
            self.log(result.line())
            chosen = [precision.name]
        if self.dist.enabled:
            torch.distributed.broadcast_object_list(chosen, src=0)
        if chosen[0] != self.precision.name:
            self._set_precision(chosen[0], "chosen by the AMP check")

    def _set_precision(self, name: str, reason: str) -> None:
        self.precision = Precision(name, self.device.type, reason)
        self.scaler = self.precision.make_scaler()

    def _fall_back_if_unstable(self, stats: dict[str, float]) -> None:
        """Most steps of an epoch non-finite: drop to a safer precision, or stop in FP32."""
        if not stats["skipped_steps"] or stats["skipped_steps"] < max(stats["optimizer_steps"] // 2, 1):
            return
        message = f"{stats['skipped_steps']}/{stats['optimizer_steps']} optimizer steps had non-finite gradients"
        safer = {"fp16": "bf16" if self.device.type == "cpu" or torch.cuda.is_bf16_supported() else "fp32", "bf16": "fp32"}
        if self.precision.name == "fp32":
            raise FloatingPointError(f"{message} in FP32: training diverged; lower --lr0 or check the data")
        self.log(f"warning: {message}; switching {self.precision.name} -> {safer[self.precision.name]}")
        self._set_precision(safer[self.precision.name], "fallback after non-finite steps")

    def _on_interrupt(self, signum: int, frame: object) -> None:
        if self.interrupted:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.interrupted = True
        print("\nCtrl-C: finishing this epoch and saving last.pt (press again to abort)", flush=True)


def train(config: TrainConfig, *, progress: bool = True, stop_after_epochs: int | None = None) -> dict[str, Any]:
    """Train from a config; returns ``{"run_dir", "metrics", "seconds", "epochs_done", "precision"}``."""
    return Trainer(config, progress=progress).fit(stop_after_epochs=stop_after_epochs)
