"""``train(config)``: build everything from the config, then run the phases of a run.

``Trainer.fit`` reads top to bottom: :meth:`~Trainer.before_train` (the AMP check, the first batch's plot, the
``--time`` probe), then per epoch :meth:`~Trainer.train_in_epoch` and :meth:`~Trainer.after_epoch` (evaluate,
decide, checkpoint), then :meth:`~Trainer.after_train`. The step's state is one :class:`TrainStep`
(detector/training/engine.py), the ``--time`` bookkeeping one :class:`RunClock` (detector/training/budget.py), the
plan it fits its base class :class:`RunPlans` (detector/training/plans.py), the final report on best.pt its base
class :class:`FinalReports` (detector/training/final_report.py), the verdict on each epoch one
:class:`Verdicts` (detector/training/verdicts.py), and a checkpoint's payload and its restore one pair in
detector/checkpoint.py.

Under torchrun every rank runs this same code. What one rank alone can know (metrics, a Ctrl-C, the clock)
becomes an :class:`EpochDecision` on rank 0 that every rank then applies (detector/training/decision.py).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from detector.checkpoint import CheckpointError, RunState, Trained, restore_run, run_checkpoint, saved_precision
from detector.data.workers import capped_workers, default_workers, usable_cores
from detector.distributed import agreed_precision, any_rank, decide_on_main, group_ended_on_error
from detector.distributed import init_distributed, local_main_first, unwrap
from detector.metrics.loop import Validation
from detector.model.recompute import recompute_activations, recompute_wanted
from detector.plots.batches import PLOTTED_IMAGES
from detector.plots.reporter import RunReporter
from detector.plots.worker import figures_in_background
from detector.precision import Precision, fp32_settings_kept, resolve_precision, safest
from detector.runs import append_results, keep_results_through
from detector.training.amp_check import CHECK_IMAGES, check_first_batch
from detector.training.autobatch import AUTO_BATCH, batch_for
from detector.training.budget import RunClock, TimeBudget, format_duration
from detector.training.builders import (build_criterion, build_data, build_optimization, build_run_model,
                                        freeze_layers)
from detector.training.builders import build_train_loader, load_resume, make_run_dir, seed_everything
from detector.training.builders import wrap_distributed
from detector.training.checkpoint_writer import RunCheckpoints
from detector.training.config import TrainConfig
from detector.training.decision import EpochDecision, fallback_after_epoch
from detector.training.feed import EpochFeed
from detector.training.final_report import FinalReports
from detector.training.ema import ModelEMA
from detector.training.engine import TrainStep, train_one_epoch
from detector.training.step_input import as_trained
from detector.training.header import run_header
from detector.training.interrupt import CtrlC
from detector.training.multiscale import MultiScale
from detector.training.plans import RunPlans
from detector.training.rect import cuda_graphs_choice, rect_notes
from detector.training.resolved import write_resolved
from detector.training.results import results_row
from detector.training.time_account import TimeAccount, process_age
from detector.training.validator import Validator, scores_in_background
from detector.training.verdicts import Pending, Verdicts, patience_note
from detector.tuning import autotune_convolutions, tune_process

class Trainer(RunPlans, FinalReports):
    """Holds the objects of one run; ``fit()`` runs it. Built only from the config, in reading order."""

    def __init__(self, config: TrainConfig, *, progress: bool = True, process_start: bool = False) -> None:
        # First: the account and the --time clock count set-up, the AMP check and evaluation too; a command's run
        # (process_start) also counts the interpreter's start and the imports before it.
        before = process_age() if process_start else 0.0
        self.account, self.clock = TimeAccount(before=before), RunClock(before=before)
        self.account.watch_collections()
        asked = config.changed()  # before the defaults fill in: a resumed run names what it ignores
        self.config = config.with_defaults().validate()
        self.progress = progress
        self.dist, self.device = init_distributed(self.config.device)
        tune_process(self.device)  # before the data cache and the workers' fork: see detector/tuning.py
        asked_workers = self.config.workers  # auto's own choice is capped too, without a note
        workers = default_workers(self.device.type, processes_per_node=self.dist.local_world_size) if (
            asked_workers < 0) else asked_workers
        self.config.workers = capped_workers(workers, processes_per_node=self.dist.local_world_size)
        if self.config.workers < asked_workers:
            cores = f"{self.config.workers} core{'s' if self.config.workers != 1 else ''}"
            self.log(f"note: --workers {asked_workers} is more than the {cores} each process may use here: as many "
                     "loader workers (Ultralytics caps workers= the same way)")
        checkpoint = None
        if self.config.resume:
            self.config, self.resume_path, checkpoint = load_resume(self.config, asked)
        config = self.config  # the resumed run's own, budget included
        self.clock.budget = TimeBudget.parse(config.time) if config.time else None
        if self.clock.budget is not None and "epochs" in asked and checkpoint is None:
            self.log(f"--time {config.time} sets the number of epochs (as Ultralytics' time= does); --epochs "
                     f"{config.epochs} only sets how close-mosaic ({config.close_mosaic}) and warm-up scale with it")
        if note := patience_note(config.patience, config.val_interval):
            self.log(note)
        seed_everything(config.seed + self.dist.rank)
        for note in rect_notes(config, self.device, world_size=self.dist.world_size):  # what --rect turns off
            self.log(note)
        self._build_data()
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        model = build_run_model(config, list(self.spec.names), self.log,
                                None if checkpoint is None else (checkpoint, self.resume_path))
        config.model = model.scale  # the weights file may have chosen the scale; resume must rebuild it
        freeze_layers(model, config.freeze, self.log)  # before the optimizer: it takes trainable parameters only
        model.to(self.device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format)
        # Before the batch is sized from memory: the recomputed activations are memory the step no longer holds.
        # Not where --sync-bn will make SyncBatchNorm layers (wrap_distributed): those keep their own forward.
        sync_bn = config.sync_bn and self.dist.enabled and self.device.type == "cuda"
        self.recomputed = recompute_activations(model, recompute_wanted(config.recompute, self.device) and not sync_bn)
        precision = agreed_precision(resolve_precision(config.precision, self.device, unamp=config.unamp), self.dist)
        self.resolved_precision = precision.name  # what this device gives the run; anything else was a fallback
        # One criterion for the batch's sizing and the run: it keeps nothing from a call (no assignment is kept).
        criterion = build_criterion(config, model, self.train_data.records.class_counts(model.num_classes))
        if criterion.class_weights is not None:  # as Ultralytics prints its cls_pw weights
            self.log(f"class weights (--cls-pw {config.cls_pw:g}): " + ", ".join(
                f"{name} {weight:.3g}" for name, weight in zip(self.spec.names, criterion.class_weights.tolist())))
        if config.batch == AUTO_BATCH:  # rank 0 measures, every rank follows
            most_boxes = int(self.train_data.records.box_counts().max(initial=0))
            config.batch = decide_on_main(lambda: batch_for(config, model, criterion, most_boxes,
                precision, self.device, self.log, world_size=self.dist.world_size), self.dist)
        self.sampler, self.train_loader = build_train_loader(self.train_data, config, self.dist, self.device)
        self.feed = EpochFeed(self.sampler, self.train_loader)
        saved_choice = (checkpoint or {}).get("optimizer_choice")  # what auto chose, for its saved state
        choice, schedule = build_optimization(
            config, model, steps_per_epoch=len(self.train_loader), world_size=self.dist.world_size,
            resolved=(saved_choice["name"], saved_choice["lr"]) if saved_choice else None)
        self.step = TrainStep(model, criterion, choice.optimizer, precision.make_scaler(),
                              ModelEMA(model, decay=config.ema_decay), precision, schedule, self.device,
                              channels_last=config.channels_last, world_size=self.dist.world_size,
                              cuda_graphs=cuda_graphs_choice(config))
        self.optimizer_name = choice.name
        self.multi_scale = MultiScale(config.imgsz, low=config.multi_scale_min, high=config.multi_scale_max,
                                      hold=config.multi_scale_hold, epochs=config.epochs,
                                      fixed_last_epochs=config.close_mosaic, enabled=config.multi_scale)
        self.epochs, self.close_mosaic, self.warmup_epochs = config.epochs, config.close_mosaic, config.warmup_epochs
        self.start_epoch = 0
        self.mosaic_closed_at: int | None = None
        self.verdicts = Verdicts(config.patience, log=self.log, record=self._record)  # best fitness, patience
        self.final: dict[str, Any] | None = None  # best.pt's final report: its metrics and epoch
        if checkpoint is not None:
            self._restore(checkpoint)
        autotune_convolutions(self.device, input_shapes=len(self.input_shapes()), policy=config.cudnn_benchmark,
                              steps=len(self.train_loader) * (self.epochs - self.start_epoch))
        self.step.model = wrap_distributed(model, config, self.dist, self.device)
        self.run_dir = make_run_dir(config, self.dist, resumed=self.resume_path if checkpoint is not None else None)
        if checkpoint is not None and self.dist.is_main:  # the rows of epochs it trains (or judges) again go
            keep_results_through(self.run_dir / "results.csv", self.start_epoch - (self.verdicts.saved is not None))
        self.validator = Validator(self.val_data, config, self.device, progress=progress) if self.val_data else None
        figures_helper = figures_in_background(self.device, usable_cores())
        self.reporter = RunReporter(self.run_dir, self.spec.names, plots=config.plots, tensorboard=config.tensorboard,
                                    background=figures_helper) if self.dist.is_main else None
        # Rank 0's checkpoints, written by a thread of their own. On the CPU the training thread serialises them: a
        # writer thread that serialised took cores from the step (2-core EPYC, 30 epochs: 87-93 s wall against 66-75 s).
        self.checkpoints = RunCheckpoints(self.run_dir / "weights", serialise_here=self.device.type == "cpu",
                                          log=self.log, detail=self.account.detail, period=config.save_period)
        self.ctrl_c = CtrlC(single_process=not self.dist.enabled, announce=self.dist.is_main)

    # ----------------------------------------------------------------------------------------- set-up
    def log(self, message: str) -> None:
        if self.dist.is_main:
            print(message, flush=True)

    def _build_data(self) -> None:
        with local_main_first(self.dist), self.account.detail("data"):  # one process per node prepares the data
            self.spec, self.train_data, self.val_data = build_data(self.config, with_val=self.dist.is_main,
                                                                   device=self.device, dist=self.dist)
        if self.dist.enabled:  # every rank has mapped the node's shared image cache: its file name can go
            torch.distributed.barrier()
            if self.train_data.dataset.image_cache is not None:
                self.train_data.dataset.image_cache.release_name()

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        saved, fell_back = saved_precision(checkpoint)
        if saved in ("fp16", "bf16", "fp32") and fell_back and not self.config.unamp:
            # A precision the run had fallen back to is kept where it is safer than what this device resolves to; a
            # GPU run's FP16 resumed on a CPU, or BF16 on a CPU without it, is not. One its device merely resolved to
            # (a CPU run's FP32 or BF16 resumed on a GPU) is not a fallback: the device's own choice stands.
            reason = "restored from the checkpoint (the run had fallen back)"
            restored = safest(self.step.precision, Precision(saved, self.device.type, reason))
            if restored.name != self.step.precision.name:
                self.step.set_precision(restored)
        state = restore_run(checkpoint, self._trained())
        self.step.ema.updates = state.ema_updates
        self.start_epoch = state.epoch + 1
        self.verdicts.restore(state)
        self.verdicts.keep_best_on_disk(self.resume_path.parent / "best.pt")
        self.clock.restore(state.time_spent, state.epoch_seconds, state.val_seconds)
        self.mosaic_closed_at = state.mosaic_closed_at
        plan = state.plan
        self._plan_epochs(plan.get("epochs", self.epochs), plan.get("close_mosaic", self.close_mosaic),
                          plan.get("warmup_epochs", self.warmup_epochs), at_step=0)
        if state.schedule is not None:  # the schedule as re-planned so far (older checkpoints: rebuilt from the plan)
            self.step.schedule = self.step.schedule.restored(state.schedule, at_epoch=self.start_epoch)
        if self.start_epoch >= self.epochs:
            raise CheckpointError(f"{self.resume_path}: run already finished all {self.epochs} epochs")

    # ------------------------------------------------------------------------------------- the run
    def fit(self, *, stop_after_epochs: int | None = None) -> dict[str, Any]:
        """Run the remaining epochs; ``stop_after_epochs`` ends early as a Ctrl-C in that epoch would (for tests)."""
        decision, epoch = None, self.start_epoch
        try:  # the loaders' workers start in before_train: the finally stops them, whatever happens after
            self.before_train()
            self.account.switch("other")
            self.ctrl_c.install()
            start = time.perf_counter()
            while epoch < self.epochs:
                with self.account.phase("training"):
                    stats = self.train_in_epoch(epoch)
                # A Ctrl-C seen by any rank stops all.
                stop_asked = any_rank(self.ctrl_c.requested, self.dist)
                stop_asked |= stop_after_epochs is not None and epoch + 1 >= stop_after_epochs
                if self.clock.budget is None and epoch + 1 < self.epochs and not stop_asked:
                    self.feed.begin(epoch + 1, use_mosaic=self.uses_mosaic(epoch + 1))  # begun as it validates
                decision = decide_on_main(lambda: self.after_epoch(epoch, stats, stop_asked=stop_asked), self.dist)
                if not self.dist.is_main:  # rank 0 applied it in after_epoch, before its checkpoint
                    self._apply(decision, epochs_done=epoch + 1)
                    self.final = decision.final or self.final  # every rank's train() returns best.pt's report
                epoch += 1
                if decision.stop:
                    self.log(decision.stop)
                    break
        finally:
            self.ctrl_c.restore()
            try:
                with self.account.phase("checkpoints"):
                    self.checkpoints.close()  # every checkpoint on disk before a Ctrl-C or an error returns
            finally:
                self.feed.stop()  # the loaders' workers end with the run, not at exit (workers.stop_workers)
                if self.validator is not None:
                    self.validator.close()
                if self.reporter is not None:  # its figures and TensorBoard events on disk, also after a stop
                    with self.account.phase("final evaluation"):  # the figures of the final report, at the latest
                        self.reporter.close()
        interrupted = bool(decision and decision.stop.startswith("interrupted"))
        summary = {"run_dir": self.run_dir.absolute(), "metrics": decision.metrics if decision else {},
                   "seconds": time.perf_counter() - start, "epochs_done": epoch,
                   "precision": self.step.precision.name, "interrupted": interrupted, **(self.final or {})}
        if self.dist.is_main and not interrupted:
            self.after_train(summary)
        self.account.close()
        if self.dist.is_main:
            totals = self.account.save(self.run_dir / "time.json")
            self.log(self.account.table(totals))
            summary["time_account"] = totals
        return summary

    def before_train(self) -> None:
        """The loader's first batch of epoch 0 feeds the AMP check, the batch plot and the ``--time`` probe."""
        config = self.config
        if self.validator is not None and scores_in_background(config.val_background, self.device, epoch_seconds=0.0):
            self.validator.scorer().start()  # a run that may score in the background forks before its loaders do
        if self.reporter is not None:
            self.reporter.start(self.train_data)  # so does its figures' helper
        if self.start_epoch == 0 and (config.amp_check or self.reporter is not None or self.clock.budget is not None):
            # Asking the loader (not collating by hand) also forks its workers now, before the AMP check's freed
            # activations fill this process's heap: forked later, the first steps pay copy-on-write faults for
            # all of that memory (measured: ~2 s on the first step, 2-core CPU).
            batches = self.feed.begin(0, use_mosaic=self.uses_mosaic(0))
            with self.account.detail("first batch"):
                loaded = next(batches)
            first_batch = as_trained(loaded, first=max(CHECK_IMAGES, PLOTTED_IMAGES))  # what the two read
            if config.amp_check:
                with self.account.detail("AMP check"):
                    self._preflight(first_batch)
            if self.reporter is not None:
                with self.account.detail("figures"):  # matplotlib's import and labels.png: ~0.4 s on a 2-core CPU
                    self.reporter.on_start(self.train_data, first_batch)
            if self.clock.budget is not None:
                with self.account.detail("--time probe"):
                    self._plan_before_first_step(loaded, batches)
                self.feed.forget()  # the probe drew more of epoch 0's pass: it begins anew
            else:
                self.feed.put_back([loaded])  # epoch 0 goes on from this batch (detector/training/feed.py)
            if self.device.type == "cuda":  # what the check and the probe cached (GBs at batch 64) goes back: the
                torch.cuda.synchronize(self.device)  # graphs' warm-up steps on their own stream could not reuse it
                torch.cuda.empty_cache()
        self.log(run_header(self))
        if self.dist.is_main:  # what auto chose, now the AMP check has settled the precision (config.yaml keeps auto)
            write_resolved(self)
        if self.verdicts.saved is not None and self.dist.is_main:
            self._judge_saved(*self.verdicts.saved)

    def _judge_saved(self, epoch: int, unjudged: dict[str, Any]) -> None:
        """A resumed run whose last.pt was written while its last epoch was scored in the background: score and
        judge that epoch now (last.pt holds its EMA weights), its row, best.pt and a last.pt that knows."""
        with self.account.phase("validation"):
            validation = self.evaluate()
        self.verdicts.judge(epoch, unjudged["stats"], validation, unjudged["precision"])
        self.verdicts.saved = None
        self._checkpoint(epoch, validation.metrics, improved=self.verdicts.improved(epoch), finished=False, wait=False)

    def uses_mosaic(self, epoch: int) -> bool:
        return epoch < self.epochs - self.close_mosaic  # the last close_mosaic epochs train without

    def train_in_epoch(self, epoch: int) -> dict[str, float]:
        self.clock.epoch_starts()
        use_mosaic = self.uses_mosaic(epoch)
        if not use_mosaic and self.mosaic_closed_at is None:
            self.mosaic_closed_at = epoch
        return train_one_epoch(self.step, self.feed.epoch(epoch, use_mosaic=use_mosaic), multi_scale=self.multi_scale,
                               epoch=epoch, seed=self.config.seed, progress=self.progress and self.dist.is_main)

    def after_epoch(self, epoch: int, stats: dict[str, float], *, stop_asked: bool) -> EpochDecision:
        """Rank 0: evaluate, log, decide what happens next, checkpoint. Returns the decision for all ranks. A pass
        scored in the background is judged at the next epoch's end (detector/training/verdicts.py), or at once where
        the run ends or may stop here (patience ran out as of the last judged epoch). ``stop_asked``: a Ctrl-C was seen
        in this epoch (or ``fit``'s ``stop_after_epochs`` ends the run here, as one would)."""
        if self.verdicts.pending is not None:  # best.pt's candidate gets its verdict too
            self._scored(self.verdicts.pending.validation)
            self.checkpoints.judged(*self.verdicts.judge_pending())
        interval = self.config.val_interval  # 0: only after the last epoch
        validation = self._evaluate_if_due(epoch, stats, due=bool(interval) and (epoch + 1) % interval == 0,
                                           background=not stop_asked and epoch + 1 < self.epochs)
        self.clock.epoch_ends(validation.seconds if validation else None)
        epochs, close_mosaic, warmup = self._fit_to_budget(epoch)
        self.clock.replanned()
        last = epoch + 1 >= epochs
        # Against the plan as re-fitted: a Ctrl-C in the last epoch lets the run finish as it would.
        interrupted = stop_asked and not last
        if last:  # the last epoch is always evaluated, and ends with the final report
            validation = validation or self._evaluate_if_due(epoch, stats, due=True)
        # Judged at once where the run stops here or may (patience: it stops at the same epoch as scored inline).
        defer = bool(validation and validation.in_background and not (last or interrupted)
                     and not self.verdicts.patience_ran_out(epoch))
        if defer:
            self.verdicts.defer(Pending(epoch, stats, validation, self.step.precision.name))
        else:  # before the final report, whose results.png shows this row too
            self.verdicts.judge(epoch, stats, self._scored(validation), self.step.precision.name)
        # Where patience runs out, a stop asked in the same epoch changes nothing: the run ends as it would have.
        patience_ran_out = bool(validation and not (defer or last) and self.verdicts.patience_ran_out(epoch))
        interrupted &= not patience_ran_out
        if (last or patience_ran_out) and validation:  # an early stop gets the final report too
            with self.account.phase("final evaluation"):
                self._final_report(epoch, validation)
        metrics = validation.metrics if validation and not defer else {}
        precision, reason = self.step.precision.name, self.step.precision.reason
        if (fallback := fallback_after_epoch(self.step.precision, stats, self.device.type,
                                             ending=last or patience_ran_out)) is not None:
            precision, reason = fallback
            self.log(f"warning: {reason}")
        stop = f"interrupted: saved {self.run_dir / 'weights/last.pt'} after epoch {epoch + 1}" if interrupted else ""
        if patience_ran_out:
            stop = self.verdicts.early_stop_text(epoch)
        decision = EpochDecision(precision, reason, epochs, close_mosaic, warmup, stop, metrics, self.final)
        self._apply(decision, epochs_done=epoch + 1)  # before the checkpoint: a resume continues as the run would
        self._checkpoint(epoch, metrics, improved=None if defer else self.verdicts.improved(epoch),
                         finished=(last or patience_ran_out) and not interrupted, wait=bool(decision.stop))
        return decision

    def after_train(self, summary: dict[str, Any]) -> None:
        """Rank 0, a run that finished (its last.pt was written stripped: see _checkpoint): the final FP32
        evaluation of best.pt when asked for (detector/training/final_report.py), and the last line."""
        if self.config.final_fp32:
            self._final_fp32(summary)
        metrics, best = summary["metrics"], summary.get("best_epoch")
        self.log(f"done in {format_duration(summary['seconds'])}: mAP50-95 {metrics.get('mAP50-95', float('nan')):.4f} "
                 f"mAP50 {metrics.get('mAP50', float('nan')):.4f} | best "
                 f"{'' if best is None else f'(epoch {best + 1}) '}{self.run_dir / 'weights' / 'best.pt'}")

    # ------------------------------------------------------------------------------------- evaluation
    def evaluate(self, *, keep_predictions: bool = False, background: bool = False) -> Validation:
        assert self.validator is not None
        return self.validator.run(self.step.ema.module, self.step.precision, keep_predictions=keep_predictions,
                                  background=background, criterion=self.step.criterion)

    def _evaluate_if_due(self, epoch: int, stats: dict[str, float], *, due: bool,
                         background: bool = False) -> Validation | None:
        if not due:
            return None
        # Predictions are kept for the final report wherever this may be the last epoch (--time, --patience).
        keep = self.clock.budget is not None or epoch + 1 >= self.epochs or self.verdicts.patience_ran_out(epoch)
        background = background and scores_in_background(self.config.val_background, self.device,
                                                         stats["epoch_seconds"])
        with self.account.phase("validation"):
            return self.evaluate(keep_predictions=keep, background=background)

    def _scored(self, validation: Validation | None) -> Validation | None:
        """``validation`` with its scores in: waiting for the background worker counts as validation."""
        if validation is not None and validation.in_background:
            with self.account.phase("validation"):
                validation.result  # noqa: B018 - reading it waits for the worker's answer
        return validation

    def _record(self, epoch: int, stats: dict[str, float], validation: Validation | None, precision: str) -> None:
        """One ``results.csv`` row (and TensorBoard / plots through the reporter)."""
        row = results_row(epoch, stats, validation, precision)
        append_results(self.run_dir / "results.csv", row)
        if self.reporter is not None:
            self.reporter.on_epoch_end(row, epoch)

    # ------------------------------------------------------------------------------------- checkpoints
    def _checkpoint(self, epoch: int, metrics: dict[str, float], *, improved: bool | None, finished: bool,
                    wait: bool) -> None:
        """Hand the run to its checkpoints (training goes on while they are written): last.pt when due, best.pt
        when this epoch improved on the best. A run that ``finished`` no longer needs the optimizer for --resume,
        so its last.pt is written stripped too (detector/checkpoint.py). ``wait``: the run stops here and its
        last line says the file is saved, so wait for the disk."""
        with self.account.phase("checkpoints"):
            if self.device.type == "cuda":  # what the GPU still had queued, apart from the copies that wait for it
                with self.account.detail("GPU wait"):
                    torch.cuda.synchronize(self.device)
            self.checkpoints.epoch_done(lambda: self._run_checkpoint(epoch, metrics), improved=improved,
                                        finished=finished, wait=wait, epoch=epoch)
            self.account.background["checkpoint writes"] = self.checkpoints.writer.write_seconds

    def _run_checkpoint(self, epoch: int, metrics: dict[str, float]) -> dict[str, Any]:
        with self.account.detail("state"):
            return run_checkpoint(self._trained(), self._run_state(epoch, metrics))

    def _trained(self) -> Trained:
        return Trained(unwrap(self.step.model), self.step.ema.module, self.step.optimizer, self.step.scaler)

    def _run_state(self, epoch: int, metrics: dict[str, float]) -> RunState:
        return RunState(
            epoch=epoch, config=self.config.to_dict(), names=self.spec.names, precision=self.step.precision.name,
            precision_fell_back=self.step.precision.name != self.resolved_precision,
            ema_updates=self.step.ema.updates,
            plan={"epochs": self.epochs, "close_mosaic": self.close_mosaic, "warmup_epochs": self.warmup_epochs},
            schedule=self.step.schedule.state(),
            optimizer_choice={"name": self.optimizer_name, "lr": self.step.schedule.base_lr},
            time_spent=self.clock.elapsed(), epoch_seconds=self.clock.epoch_seconds,
            val_seconds=self.clock.val_seconds, mosaic_closed_at=self.mosaic_closed_at,
            **self.verdicts.state(), metrics=metrics, unjudged=self.verdicts.unjudged(epoch),
        )

    def _preflight(self, batch: tuple) -> None:
        """AMP check on rank 0's first batch, without collectives; every rank adopts its verdict."""
        name, reason = decide_on_main(lambda: check_first_batch(
            self.step, batch, channels_last=self.config.channels_last, save_to=self.run_dir / "amp_check.json",
            log=self.log), self.dist)
        if name != self.step.precision.name:
            self.step.set_precision(Precision(name, self.device.type, reason))


def train(config: TrainConfig, *, progress: bool = True, stop_after_epochs: int | None = None,
          process_start: bool = False) -> dict[str, Any]:
    """Train from a config; returns ``{"run_dir", "metrics", "seconds", "epochs_done", "precision",
    "time_account", ...}``. ``process_start``: the process runs only this (a command), so the time account
    starts at the process's start."""
    with fp32_settings_kept():  # --unamp's strict FP32 (TF32 off) ends with its run
        with group_ended_on_error():  # fit's end destroys it, after a set-up that did not fail
            trainer = Trainer(config, progress=progress, process_start=process_start)
        return trainer.fit(stop_after_epochs=stop_after_epochs)
