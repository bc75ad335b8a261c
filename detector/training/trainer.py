"""``train(config)``: build everything from the config, run the epochs, evaluate, checkpoint.

Under torchrun every rank runs this same code. What one rank alone can know (metrics, a Ctrl-C, the
clock) becomes an :class:`EpochDecision` on rank 0 that every rank then applies (detector/distributed.py).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader

from detector.checkpoint import (
    CheckpointError,
    is_stripped,
    load_checkpoint,
    save_checkpoint,
    strip_checkpoint,
    strip_checkpoint_file,
)
from detector.data.workers import default_workers
from detector.distributed import (
    any_rank,
    broadcast_from_main,
    cleanup,
    decide_on_main,
    init_distributed,
    local_main_first,
    unwrap,
)
from detector.inference.preprocess import model_input
from detector.inference.torch_backend import make_torch_infer, validation_model
from detector.metrics.coco import EvalResult, evaluator_name, resolve_backend, write_results_json
from detector.metrics.loop import make_val_loader, run_validation
from detector.model import build_model
from detector.plots.reporter import RunReporter
from detector.postprocess import NMSConfig
from detector.precision import Precision, resolve_precision, safer_precision, safest
from detector.runs import append_results, newest_file, next_run_dir
from detector.training.amp_check import amp_preflight, save_preflight
from detector.training.budget import TimeBudget
from detector.training.builders import (
    build_criterion,
    build_data,
    build_model_from_weights,
    build_optimization,
    build_train_loader,
    warmup_steps,
    wrap_distributed,
)
from detector.training.config import TrainConfig
from detector.training.ema import ModelEMA
from detector.training.engine import as_trained, train_one_epoch
from detector.training.multiscale import MultiScale, images_per_step
from detector.training.probe import ProbeResult, size_factor, time_training_steps, time_validation_images
from detector.tuning import autotune_convolutions, tune_for_training


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fitness(metrics: dict[str, float]) -> float:
    """Checkpoint selection score: mostly mAP50-95, a little mAP50 (as YOLO tools do)."""
    return 0.9 * metrics.get("mAP50-95", 0.0) + 0.1 * metrics.get("mAP50", 0.0)


# --------------------------------------------------------------------------------------------- decisions
# The end of a run beyond one more validation: the per-class table, PR curves, confusion matrix and
# prediction images. An allowance, not a measurement; the demo runs in docs/training.md ended inside their
# budgets.
FINAL_REPORT_SECONDS = 10.0
# At most this fraction of a --time budget goes to timing training steps before the first one (at least two
# steps are timed): on a 2-core CPU a 640 px step takes seconds, and a 3-minute budget should keep most of them.
PROBE_BUDGET_FRACTION = 0.02
@dataclass(frozen=True)
class EpochDecision:
    """What rank 0 decided after an epoch; every rank applies it (see the module docstring)."""

    precision: str  # for the next epoch
    precision_reason: str
    epochs: int  # planned total (a time budget may change it), with the two below
    close_mosaic: int
    warmup_epochs: float
    stop: str = ""  # why the run ends after this epoch; "" = go on
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


def fallback_after_epoch(precision: Precision, stats: dict[str, float], device_type: str) -> tuple[str, str] | None:
    """``(safer precision, message)`` when most optimizer steps were unstable; None when all is well.

    Counts ``unstable_steps``, not every skipped step: GradScaler's normal calibration skips are not a
    reason to leave FP16 (see detector/training/engine.py). Raises FloatingPointError when FP32 itself diverged.
    """
    unstable, steps = stats["unstable_steps"], stats["optimizer_steps"]
    if not unstable or unstable < max(steps // 2, 1):
        return None
    message = f"{unstable}/{steps} optimizer steps had non-finite gradients"
    safer = safer_precision(precision.name, device_type)
    if safer is None:
        raise FloatingPointError(f"{message} in FP32: training diverged; lower --lr0 or check the data")
    return safer, f"{message}; switching {precision.name} -> {safer}"


class Trainer:
    """Holds the objects of one run; ``fit()`` runs it. Built only from the config."""

    def __init__(self, config: TrainConfig, *, progress: bool = True) -> None:
        self.clock_start = time.monotonic()  # a --time budget counts set-up, the AMP check and evaluation too
        self.config = config.with_defaults().validate()
        self.progress = progress
        self.dist, self.device = init_distributed(self.config.device)
        tune_for_training(self.device)  # before the data cache and the workers' fork: see detector/tuning.py
        if self.config.workers < 0:
            self.config.workers = default_workers(self.device.type, processes_per_node=self.dist.local_world_size)
        self.resume_state = self._load_resume(self.config.resume) if self.config.resume else None
        config = self.config
        seed_everything(config.seed + self.dist.rank)
        with local_main_first(self.dist):  # one process per node prepares the data; the others then read it
            self.spec, self.train_data, self.val_data = build_data(config, with_val=self.dist.is_main,
                                                                   device=self.device, dist=self.dist)
        if self.dist.enabled:  # every rank has mapped the node's shared image cache: its file name can go
            torch.distributed.barrier()
            if self.train_data.dataset.image_cache is not None:
                self.train_data.dataset.image_cache.release_name()
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
        self.sampler, self.train_loader = build_train_loader(self.train_data, config, self.dist, self.device)
        saved_choice = (self.resume_state or {}).get("optimizer_choice")  # what auto chose, for its saved state
        choice, self.schedule = build_optimization(
            config, self.model, steps_per_epoch=len(self.train_loader), world_size=self.dist.world_size,
            resolved=(saved_choice["name"], saved_choice["lr"]) if saved_choice else None,
        )
        self.optimizer, self.optimizer_name = choice.optimizer, choice.name
        self.multi_scale = MultiScale(
            config.imgsz, low=config.multi_scale_min, high=config.multi_scale_max, hold=config.multi_scale_hold,
            epochs=config.epochs, fixed_last_epochs=config.close_mosaic, enabled=config.multi_scale,
        )
        self.ema = ModelEMA(self.model, decay=config.ema_decay)
        self.scaler = self.precision.make_scaler()
        self.epochs, self.start_epoch, self.best_fitness, self.best_epoch = config.epochs, 0, -1.0, -1
        self.close_mosaic, self.warmup_epochs = config.close_mosaic, config.warmup_epochs
        self.budget = TimeBudget.parse(config.time) if config.time else None
        # Rank 0's measurements, for the budget: per epoch, the wall time from its start to the next epoch's
        # start less its validation (so checkpoint writes and plots count), and its validation.
        self.epoch_seconds: list[float] = []
        self.val_seconds: list[float | None] = []
        self.epoch_started = self.replanned_at = None  # monotonic clock; see _epoch_cost
        self.epoch_tail = 0.0  # seconds from a re-plan to the next epoch's start: results row, plots, checkpoints
        self.prior_val_seconds: float | None = None  # the probe's estimate, until a validation is timed
        self.mosaic_closed_at: int | None = None
        if self.resume_state is not None:
            self._restore(self.resume_state)
        autotune_convolutions(self.device, input_shapes=len(self.input_shapes()))
        self.model = wrap_distributed(self.model, config, self.dist, self.device)
        self.run_dir = self._make_run_dir()
        self.reporter = RunReporter(self.run_dir, self.spec.names, plots=config.plots,
                                    tensorboard=config.tensorboard) if self.dist.is_main else None
        self.stop_requested = False
        self.pid = os.getpid()  # the process whose Ctrl-C handler this is (see _on_interrupt)

    # ----------------------------------------------------------------------------------------- set-up
    def log(self, message: str) -> None:
        if self.dist.is_main:
            print(message, flush=True)

    def _load_resume(self, resume: str) -> dict[str, Any]:
        path = newest_file(self.config.project, "*/weights/last.pt") if resume == "auto" else Path(resume)
        if path is None:
            raise CheckpointError(f"{self.config.project}: no last.pt to resume from")
        state = load_checkpoint(path)
        if is_stripped(state):
            raise CheckpointError(f"{path}: holds no optimizer state (stripped: a best.pt, or a finished run's "
                                  f"last.pt), so it cannot be resumed; to train on from it, start a fine-tune: "
                                  f"--weights {path}")
        saved = TrainConfig.from_dict(state["config"])
        # Keep the run's own settings; only the device and worker count may change on resume.
        saved.device, saved.workers, saved.resume = self.config.device, self.config.workers, str(path)
        self.config = saved.with_defaults().validate()
        self.resume_path = path
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        saved = state.get("precision", self.precision.name)
        if saved in ("fp16", "bf16", "fp32") and not self.config.unamp:
            # The saved precision is kept only where it is safer than what this device resolves to (the run
            # had fallen back); a GPU run's FP16 resumed on a CPU, or BF16 on a CPU without it, is not.
            restored = safest(self.precision, Precision(saved, self.device.type, "restored from the checkpoint "
                                                              "(the run had fallen back)"))
            if restored.name != self.precision.name:
                self._set_precision(restored.name, restored.reason)
        self.model.load_state_dict(state["model"])
        self.ema.module.load_state_dict(state["ema"])
        self.ema.updates = state["ema_updates"]
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler") and self.precision.uses_scaler:
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch = state["epoch"] + 1
        self.best_fitness = state.get("best_fitness", -1.0)
        self.best_epoch = state.get("best_epoch", -1)
        self.clock_start -= state.get("time_spent", 0.0)  # the budget covers the whole run, before and after
        self.epoch_seconds = list(state.get("epoch_seconds", []))
        self.val_seconds = list(state.get("val_seconds", []))
        self.mosaic_closed_at = state.get("mosaic_closed_at")
        plan = state.get("plan", {})
        self._plan_epochs(plan.get("epochs", self.epochs), plan.get("close_mosaic", self.close_mosaic),
                          plan.get("warmup_epochs", self.warmup_epochs), at_step=0)
        if "schedule" in state:  # the schedule as re-planned so far (older checkpoints: rebuilt from the plan)
            self.schedule = self.schedule.restored(state["schedule"])
        if self.start_epoch >= self.epochs:
            raise CheckpointError(f"{self.resume_path}: run already finished all {self.epochs} epochs")

    def _make_run_dir(self) -> Path:
        if self.resume_state is not None:
            run_dir = self.resume_path.parent.parent
        else:
            run_dir = next_run_dir(self.config.project, self.config.name)
        if self.dist.is_main:
            (run_dir / "weights").mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(self.config.to_dict(), sort_keys=False))
        return broadcast_from_main(run_dir, self.dist)  # the others would see rank 0's folder and pick name2

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
            "plan": {"epochs": self.epochs, "close_mosaic": self.close_mosaic, "warmup_epochs": self.warmup_epochs},
            "schedule": self.schedule.state(),
            "optimizer_choice": {"name": self.optimizer_name, "lr": self.schedule.base_lr},
            "time_spent": time.monotonic() - self.clock_start,
            "epoch_seconds": self.epoch_seconds,
            "val_seconds": self.val_seconds,
            "mosaic_closed_at": self.mosaic_closed_at,
            "best_fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            "metrics": metrics,
            "model_args": {"num_classes": model.num_classes, "scale": model.scale, "reg_max": model.reg_max},
            "names": self.spec.names,
            "config": self.config.to_dict(),
            "precision": self.precision.name,
        }

    def evaluate(self, *, force_fp32: bool = False, keep_predictions: bool = False) -> tuple[EvalResult, dict]:
        assert self.val_data is not None
        precision = Precision("fp32", self.device.type, "final FP32 evaluation") if force_fp32 else self.precision
        # predictions.json is written by the final evaluations only (_end_epoch, fit): at COCO size (1.5M
        # detections) its json.dumps costs seconds, every epoch, for a file that the next epoch replaces.
        return run_validation(self._make_infer(precision), self.val_data, loader=self.val_loader(),
                              keep_predictions=keep_predictions, progress=self.progress,
                              coco_eval=resolve_backend(self.config.coco_eval))

    def _make_infer(self, precision: Precision) -> Callable[[torch.Tensor], list[dict[str, torch.Tensor]]]:
        nms = NMSConfig(conf_threshold=self.config.val_conf, iou_threshold=self.config.val_iou,
                        max_detections=self.config.max_det, multi_label=True)
        return make_torch_infer(validation_model(self.ema.module, precision), precision=precision, nms=nms,
                                device=self.device, channels_last=self.config.channels_last)

    def val_loader(self) -> DataLoader:
        """The validation loader, made once (its workers persist between validations)."""
        assert self.val_data is not None
        if not hasattr(self, "_val_loader"):
            self._val_loader = make_val_loader(self.val_data, batch_size=self.config.batch * 2,
                                               workers=self.config.workers, cpu_compute=self.device.type == "cpu",
                                               pin_memory=self.device.type == "cuda")
        return self._val_loader

    def header(self) -> str:
        model = unwrap(self.model)
        params = sum(p.numel() for p in model.parameters())
        data = self.config.data or "built-in shapes"
        return (
            f"detector: YOLO-{model.scale} ({params / 1e6:.2f}M params, {model.num_classes} classes) | data {data} "
            f"({len(self.train_data.records)} train / {len(self.val_data.records) if self.val_data else '?'} val) | "
            f"{self.device} x{self.dist.world_size}, {self.config.workers} loader workers | "
            f"precision {self.precision.name}: {self.precision.reason} | "
            f"HSV/flips {'on the device' if self.train_data.dataset.pixel_ops_on_device else 'in the workers'} | "
            f"{self.cache_text()} | COCO eval {evaluator_name(self.config.coco_eval)} | "
            f"{self.optimizer_name} lr {self.schedule.base_lr:g} | {self.epochs_text()} | "
            f"{self.multi_scale.describe(len(self.input_shapes()))} | run {self.run_dir}"
        )

    def cache_text(self) -> str:
        cache = self.train_data.dataset.image_cache
        if cache is None:
            return f"RAM cache off (--cache {self.config.cache})"
        where = (f"shared by the {self.dist.local_world_size} processes of this node"
                 if self.dist.local_world_size > 1 else "in this process")
        return f"RAM cache {cache.nbytes / 2**20:.1f} MiB {where}"

    def input_shapes(self) -> list[tuple[int, int]]:
        """The distinct (batch, size) training inputs of the epochs still to run (for cuDNN and the header)."""
        return self.multi_scale.input_shapes(
            steps_per_epoch=len(self.train_loader), batch=images_per_step(len(self.sampler), self.config.batch),
            seed=self.config.seed, start_epoch=self.start_epoch,
        )

    def epochs_text(self) -> str:
        if self.budget is None:
            return f"{self.epochs} epochs"
        count = f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"
        return f"{count} fitted to the time budget {self.budget.text}, re-fitted after every epoch"

    def fit(self, *, stop_after_epochs: int | None = None) -> dict[str, Any]:
        """Run the remaining epochs; ``stop_after_epochs`` ends early as an interruption would (for tests)."""
        config = self.config
        if self.start_epoch == 0 and (config.amp_check or self.reporter is not None or self.budget is not None):
            # The loader's first batch of epoch 0: input to the AMP check, the batch plot and the budget's probe.
            # Asking the loader (not collating by hand) also forks its workers now, before the AMP check's freed
            # activations fill this process's heap: forked later, the first steps pay copy-on-write faults for
            # all of that memory (measured: ~2 s on the first step, 2-core CPU).
            self.sampler.set_epoch(0, use_mosaic=self.close_mosaic < self.epochs)
            batches = iter(self.train_loader)
            loaded = next(batches)
            first_batch = as_trained(loaded)
            if config.amp_check:
                self._preflight(first_batch)
            if self.reporter is not None:
                self.reporter.on_start(self.train_data, first_batch)
            if self.budget is not None:
                self._plan_before_first_step(loaded, batches)
        self.log(self.header())
        previous_handler = signal.signal(signal.SIGINT, self._on_interrupt)
        decision = None
        start = time.perf_counter()
        epoch = self.start_epoch
        try:
            while epoch < self.epochs:
                self._mark_epoch_start()
                use_mosaic = epoch < self.epochs - self.close_mosaic
                if not use_mosaic and self.mosaic_closed_at is None:
                    self.mosaic_closed_at = epoch
                self.sampler.set_epoch(epoch, use_mosaic=use_mosaic)
                stats = train_one_epoch(
                    model=self.model, criterion=self.criterion, loader=self.train_loader, optimizer=self.optimizer,
                    scaler=self.scaler, ema=self.ema, precision=self.precision, schedule=self.schedule,
                    multi_scale=self.multi_scale, epoch=epoch, seed=config.seed, device=self.device,
                    channels_last=config.channels_last, world_size=self.dist.world_size,
                    progress=self.progress and self.dist.is_main,
                )
                interrupted = any_rank(self.stop_requested, self.dist)  # a Ctrl-C seen by any rank stops all
                if stop_after_epochs is not None and epoch + 1 >= stop_after_epochs:
                    interrupted = True
                decision = decide_on_main(lambda: self._end_epoch(epoch, stats, interrupted=interrupted), self.dist)
                if not self.dist.is_main:  # rank 0 applied it in _end_epoch, before its checkpoint
                    self._apply(decision, epochs_done=epoch + 1)
                epoch += 1
                if decision.stop:
                    self.log(decision.stop)
                    break
        finally:
            signal.signal(signal.SIGINT, previous_handler)
            cleanup(self.dist)
        interrupted = bool(decision and decision.stop.startswith("interrupted"))
        metrics = decision.metrics if decision else {}
        summary = {"run_dir": self.run_dir, "metrics": metrics, "seconds": time.perf_counter() - start,
                   "epochs_done": epoch, "precision": self.precision.name, "interrupted": interrupted}
        if self.dist.is_main and not interrupted:
            # The run is over: last.pt no longer needs the optimizer for --resume (detector/checkpoint.py).
            if (last := self.run_dir / "weights" / "last.pt").is_file():
                strip_checkpoint_file(last)
            if config.final_fp32:
                result, info = self.evaluate(force_fp32=True)
                write_results_json(self.run_dir / "predictions.json", info["detections"])
                self.log(f"final FP32 evaluation: mAP50-95 {result.metrics['mAP50-95']:.4f} ({result.evaluator})")
                summary["metrics_fp32"] = result.metrics
            self.log(f"done in {summary['seconds'] / 60:.1f} min: mAP50-95 {metrics.get('mAP50-95', float('nan')):.4f} "
                     f"mAP50 {metrics.get('mAP50', float('nan')):.4f} | best {self.run_dir / 'weights' / 'best.pt'}")
        return summary

    def _end_epoch(self, epoch: int, stats: dict[str, float], *, interrupted: bool) -> EpochDecision:
        """Rank 0: evaluate, log, decide what happens next, checkpoint. Returns the decision for all ranks."""
        evaluation = self._evaluate_if_due(epoch, stats, due=(epoch + 1) % self.config.val_interval == 0)
        self.val_seconds.append(evaluation[1]["seconds"] if evaluation else None)
        self.epoch_seconds.append(self._epoch_cost(self.val_seconds[-1]))
        epochs, close_mosaic, warmup = self._fit_to_budget(epoch)
        self.replanned_at = time.monotonic()
        last = epoch + 1 >= epochs
        if last:  # the last epoch is always evaluated, and ends with the final report
            evaluation = evaluation or self._evaluate_if_due(epoch, stats, due=True)
        if evaluation and fitness(evaluation[0].metrics) > self.best_fitness:
            self.best_fitness, self.best_epoch = fitness(evaluation[0].metrics), epoch
        patience_ran_out = bool(self.config.patience and evaluation and not interrupted and not last
                                and epoch - self.best_epoch >= self.config.patience)
        if (last or patience_ran_out) and evaluation:  # an early stop gets the final report too
            write_results_json(self.run_dir / "predictions.json", evaluation[1]["detections"])
            if self.reporter is not None:
                self.log(f"{self.reporter.on_final(*evaluation, self.val_data)}\n{evaluation[0].evaluator}:\n"
                         f"{evaluation[0].summary}")
        metrics = evaluation[0].metrics if evaluation else {}
        self._record(epoch, stats, metrics, evaluation[1]["seconds"] if evaluation else float("nan"),
                     evaluation[0].evaluator if evaluation else "")
        precision, reason = self.precision.name, self.precision.reason
        if (fallback := fallback_after_epoch(self.precision, stats, self.device.type)) is not None:
            precision, reason = fallback
            self.log(f"warning: {reason}")
        stop = ""
        if interrupted:
            stop = f"interrupted: saved {self.run_dir / 'weights' / 'last.pt'} after epoch {epoch + 1}"
        elif patience_ran_out:
            stop = (f"early stop: no better fitness for {self.config.patience} epochs (best at epoch "
                    f"{self.best_epoch + 1}); --patience 0 turns this off")
        decision = EpochDecision(precision, reason, epochs, close_mosaic, warmup, stop, metrics)
        self._apply(decision, epochs_done=epoch + 1)  # before the checkpoint: a resume continues as the run would
        payload = self.checkpoint_payload(epoch, metrics)
        save_checkpoint(payload, self.run_dir / "weights" / "last.pt")
        if self.best_epoch == epoch:  # never resumed from: only what inference and fine-tuning need
            save_checkpoint(strip_checkpoint(payload), self.run_dir / "weights" / "best.pt")
        return decision

    def _evaluate_if_due(self, epoch: int, stats: dict[str, float], *, due: bool) -> tuple[EvalResult, dict] | None:
        if not due:
            return None
        # Predictions are kept whenever this may be the last epoch, for the final report: a time budget can
        # decide so afterwards, and so can --patience when this epoch does not improve on the best.
        patience_may_end = bool(self.config.patience) and epoch - self.best_epoch >= self.config.patience
        keep = self.budget is not None or epoch + 1 >= self.epochs or patience_may_end
        result, info = self.evaluate(keep_predictions=keep)
        metrics = result.metrics
        self.log(
            f"epoch {epoch + 1}: mAP50-95 {metrics['mAP50-95']:.4f}  mAP50 {metrics['mAP50']:.4f}  "
            f"mAP75 {metrics['mAP75']:.4f} | {stats['images_per_s']:.1f} img/s | val {info['seconds']:.1f}s"
        )
        return result, info

    def _final_seconds(self) -> float:
        """What the end of the run costs beyond one validation: the report, and a ``--final-fp32`` evaluation
        (FP32 runs at about half the reduced-precision speed, so twice the slowest validation so far)."""
        report = FINAL_REPORT_SECONDS if self.config.plots else 0.0
        measured = [seconds for seconds in self.val_seconds if seconds is not None] or [self.prior_val_seconds or 0.0]
        return report + (2 * max(measured) if self.config.final_fp32 else 0.0)

    def _fit_to_budget(self, epoch: int) -> tuple[int, int, float]:
        """(epochs, close-mosaic, warm-up epochs) for the rest of the run: as they are, or fitted to ``--time``."""
        if self.budget is None:
            return self.epochs, self.close_mosaic, self.warmup_epochs
        config = self.config
        plan = self.budget.fit(
            # This epoch's checkpoints and plots are still to come: counted as already spent.
            elapsed_seconds=time.monotonic() - self.clock_start + self.epoch_tail, epoch_seconds=self.epoch_seconds,
            val_seconds=self.val_seconds, epochs_done=epoch + 1, configured_epochs=config.epochs,
            close_mosaic=config.close_mosaic, warmup_epochs=self.warmup_epochs, warmup_started=True,
            final_seconds=self._final_seconds(), val_interval=config.val_interval,
            prior_val_seconds=self.prior_val_seconds, mosaic_closed_at=self.mosaic_closed_at,
        )
        if plan.epochs != self.epochs or epoch == 0:
            self.log(plan.describe())
        return plan.epochs, plan.close_mosaic, plan.warmup_epochs

    def _mark_epoch_start(self) -> None:
        now = time.monotonic()
        if self.replanned_at is not None:
            self.epoch_tail = now - self.replanned_at
        self.epoch_started = now

    def _epoch_cost(self, val_seconds: float | None) -> float:
        """This epoch's cost for the budget, validation left out: the wall time since it started (training,
        and the loop's own overheads) plus the last measured tail (results row, plots, checkpoint writes,
        which follow the re-plan), so the sum over epochs is the wall time between epoch starts."""
        assert self.epoch_started is not None
        return time.monotonic() - self.epoch_started - (val_seconds or 0.0) + self.epoch_tail

    def _plan_before_first_step(self, first: tuple, batches: Iterator) -> None:
        """Fit the plan to ``--time`` from a timed probe (detector/training/probe.py), before step 0; every rank follows.

        ``--optimizer auto`` then chooses from the fitted length. Nothing has stepped yet, so the optimizer
        can be rebuilt and the schedule replaced outright.
        """
        assert self.budget is not None
        config = self.config
        step_seconds, steps_timed = time_training_steps(
            batches, first=first, model=unwrap(self.model), optimizer=self.optimizer, ema=self.ema,
            criterion=self.criterion, precision=self.precision, schedule=self.schedule, image_size=config.imgsz,
            device=self.device, channels_last=config.channels_last, world_size=self.dist.world_size,
            prefetched=config.workers * (self.train_loader.prefetch_factor or 0),
            # Under torchrun the ranks must step the same number of times: no clock-dependent stop there.
            max_seconds=PROBE_BUDGET_FRACTION * self.budget.seconds if not self.dist.enabled else float("inf"),
        )

        def plan() -> tuple[int, int, float, float | None]:
            probe = ProbeResult(step_seconds, steps_timed, self._probe_validation())
            sizes = self.multi_scale.sizes(len(self.train_loader), seed=config.seed, epoch=0)
            val_seconds = probe.val_seconds(len(self.val_data.records) if self.val_data else 0)
            plan = self.budget.fit(
                elapsed_seconds=time.monotonic() - self.clock_start, epoch_seconds=[], val_seconds=[],
                epochs_done=0, configured_epochs=config.epochs, close_mosaic=config.close_mosaic,
                warmup_epochs=config.warmup_epochs, final_seconds=self._final_seconds(),
                val_interval=config.val_interval,
                prior_epoch_seconds=probe.epoch_seconds(len(self.train_loader),
                                                        size_factor=size_factor(sizes, config.imgsz)),
                prior_val_seconds=val_seconds,
            )
            self.log(f"probe: {steps_timed} timed training steps at {step_seconds:.3g} s each"
                     + (f", validation {probe.val_image_seconds * 1000:.3g} ms per image"
                        if probe.val_image_seconds is not None else "")
                     + f"\n{plan.describe()}")
            return plan.epochs, plan.close_mosaic, plan.warmup_epochs, val_seconds

        epochs, close_mosaic, warmup_epochs, self.prior_val_seconds = decide_on_main(plan, self.dist)
        if config.optimizer == "auto":
            choice, self.schedule = build_optimization(
                config, unwrap(self.model), steps_per_epoch=len(self.train_loader), world_size=self.dist.world_size,
                epochs=epochs, warmup_epochs=warmup_epochs,
            )
            self.optimizer, self.optimizer_name = choice.optimizer, choice.name
        self._plan_epochs(epochs, close_mosaic, warmup_epochs, at_step=0)

    def _probe_validation(self) -> float | None:
        """Rank 0: seconds per validation image (inference and NMS) on part of the first validation batch."""
        if self.val_data is None or not len(self.val_data.records):
            return None
        images = next(iter(self.val_loader()))[0]
        return time_validation_images(self._make_infer(self.precision), images)

    def _record(
        self, epoch: int, stats: dict[str, float], metrics: dict[str, float], val_seconds: float, evaluator: str
    ) -> None:
        """One ``results.csv`` row (and TensorBoard / plots through the reporter); ``evaluator`` names the library
        that produced the row's mAP (empty where the epoch was not evaluated)."""
        row: dict[str, object] = {"epoch": epoch + 1, **{k: stats[k] for k in ("train/box", "train/cls", "train/dfl", "lr")}}
        row.update({k: metrics.get(k, "") for k in ("mAP50-95", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large")})
        row.update({"precision": self.precision.name, "val_seconds": val_seconds, "evaluator": evaluator})
        row.update({k: v for k, v in stats.items() if k not in row})
        append_results(self.run_dir / "results.csv", row)
        if self.reporter is not None:
            self.reporter.on_epoch_end(row, epoch)

    def _apply(self, decision: EpochDecision, *, epochs_done: int) -> None:
        """Make this rank follow ``decision``, taken after ``epochs_done`` epochs."""
        if decision.precision != self.precision.name:
            self._set_precision(decision.precision, decision.precision_reason)
        if (decision.epochs, decision.close_mosaic, decision.warmup_epochs) != (self.epochs, self.close_mosaic,
                                                                                self.warmup_epochs):
            self._plan_epochs(decision.epochs, decision.close_mosaic, decision.warmup_epochs,
                              at_step=epochs_done * self.schedule.steps_per_epoch)

    def _plan_epochs(self, epochs: int, close_mosaic: int, warmup_epochs: float, *, at_step: int) -> None:
        """Follow a new plan from step ``at_step`` on; the schedule changes only ahead (detector/training/schedule.py)."""
        self.epochs, self.close_mosaic, self.warmup_epochs = epochs, close_mosaic, warmup_epochs
        self.schedule = self.schedule.replan(
            at_step=at_step, epochs=epochs, warmup_steps=warmup_steps(warmup_epochs, self.schedule.steps_per_epoch)
        )
        self.multi_scale = dataclasses.replace(self.multi_scale, epochs=epochs, fixed_last_epochs=close_mosaic)

    def _preflight(self, batch: tuple) -> None:
        """AMP check on rank 0's first batch, without collectives; every rank adopts its verdict."""

        def check() -> tuple[str, str]:
            if self.precision.name == "fp32":
                return self.precision.name, self.precision.reason
            images = model_input(batch[0], self.device, channels_last=self.config.channels_last)
            precision, result = amp_preflight(unwrap(self.model), self.criterion, images, batch[1].to(self.device),
                                              self.precision)
            save_preflight(result, self.run_dir / "amp_check.json")
            self.log(result.line())
            return precision.name, ("chosen by the AMP check" if result.fell_back else self.precision.reason)

        name, reason = decide_on_main(check, self.dist)
        if name != self.precision.name:
            self._set_precision(name, reason)

    def _set_precision(self, name: str, reason: str) -> None:
        self.precision = Precision(name, self.device.type, reason)
        self.scaler = self.precision.make_scaler()

    def _on_interrupt(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:  # a loader worker forked after this handler, before its worker_init_fn
            return  # set SIGINT to ignored (detector/data/workers.py): the parent decides, not the worker
        # Under torchrun a Ctrl-C reaches each worker twice (from the terminal and forwarded by the launcher),
        # so only a single process aborts on a second one; torchrun ends its workers itself when they linger.
        if self.stop_requested and not self.dist.enabled:
            raise KeyboardInterrupt
        self.stop_requested = True
        if self.dist.is_main:
            print("\nCtrl-C: finishing this epoch and saving last.pt (press again to abort)", flush=True)


def train(config: TrainConfig, *, progress: bool = True, stop_after_epochs: int | None = None) -> dict[str, Any]:
    """Train from a config; returns ``{"run_dir", "metrics", "seconds", "epochs_done", "precision", ...}``."""
    return Trainer(config, progress=progress).fit(stop_after_epochs=stop_after_epochs)
