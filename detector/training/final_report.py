"""The end of a run's evaluation, the part of :class:`~detector.training.trainer.Trainer` that reports on best.pt:
its final report (the per-class table, plots, ``predictions.json`` and the metrics ``train()`` returns) and
``--final-fp32``'s pass of the same weights in true FP32.

Both describe best.pt, the file a user takes away (as Ultralytics' final validation does), so that the two figures
set side by side differ by the precision alone. Before, the FP32 pass ran the last epoch's EMA beside best.pt's
figures and replaced best.pt's predictions.json with its own: a BF16 run read "BF16 0.0255 vs FP32 0.0231" where
best.pt's weights gave 0.0226 vs 0.0231.

A base class of the Trainer, kept in its own module as :class:`~detector.training.plans.RunPlans` is; it reads the
Trainer's objects listed below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from detector.checkpoint import CheckpointError, load_checkpoint
from detector.data.build import SplitData
from detector.metrics.coco import write_results_json
from detector.metrics.loop import Validation
from detector.plots.reporter import RunReporter
from detector.precision import Precision, fp32_settings_kept, set_strict_fp32
from detector.training.checkpoint_writer import RunCheckpoints
from detector.training.engine import TrainStep
from detector.training.time_account import TimeAccount
from detector.training.validator import Validator
from detector.training.verdicts import Verdicts

FP32_PREDICTIONS = "predictions_fp32.json"  # --final-fp32's: predictions.json stays best.pt's final report's


class FinalReports:
    """best.pt's final report and its ``--final-fp32`` pass (see the module docstring); the Trainer sets every
    attribute below."""

    step: TrainStep
    validator: Validator | None
    val_data: SplitData | None
    verdicts: Verdicts
    checkpoints: RunCheckpoints
    reporter: RunReporter | None
    account: TimeAccount
    run_dir: Path
    final: dict[str, Any] | None
    log: Callable[[str], None]  # the Trainer's method: rank 0 prints

    def _final_report(self, epoch: int, validation: Validation) -> None:
        """best.pt's report (the file a user takes away, as Ultralytics' final validation is): this epoch's
        validation when it is the best, else a pass of best.pt's weights as written (EMA, FP16)."""
        best, state = self.verdicts.best_epoch, None
        if 0 <= best != epoch and (state := self.checkpoints.best_state()) is not None and self.validator:
            self.log(f"final report: best.pt, epoch {best + 1} (the last epoch: mAP50-95 "
                     f"{validation.metrics['mAP50-95']:.4f})")
            validation = self.validator.run_weights(self.step.ema.module, state["model"], self.checkpoints.best,
                                                    self.step.precision)
        self.final = {"metrics": validation.metrics, "best_epoch": epoch if state is None else state.get("epoch", best)}
        write_results_json(self.run_dir / "predictions.json", validation.detections, self.val_data.ground_truth)
        if self.reporter is not None:
            self.log(f"{self.reporter.on_final(validation, self.val_data)}\n{validation.result.evaluator}:\n"
                     f"{validation.result.summary}")

    def _final_fp32(self, summary: dict[str, Any]) -> None:
        """``--final-fp32``: best.pt's weights as written (what the final report scored) evaluated in true FP32, its
        line naming the epoch, its predictions in :data:`FP32_PREDICTIONS`, its metrics ``summary["metrics_fp32"]``.
        Runs after the checkpoints are closed: best.pt is on disk."""
        assert self.validator is not None and self.val_data is not None
        path = self.checkpoints.best
        try:
            state = load_checkpoint(path) if path.is_file() else None
        except CheckpointError as error:
            self.log(f"warning: {error}; no final FP32 evaluation")
            return
        if state is None:
            self.log(f"warning: {path}: missing; no final FP32 evaluation")
            return
        # True FP32, as --unamp trains: on Ampere and newer GPUs cuDNN's FP32 convolutions otherwise run in TF32
        # (a 10-bit mantissa, FP16's), and this pass would not be the FP32 it says it is.
        with self.account.phase("final evaluation"), fp32_settings_kept():
            set_strict_fp32()
            try:
                validation = self.validator.run_weights(self.step.ema.module, state["model"], path, Precision(
                    "fp32", self.step.precision.device_type, "final FP32 evaluation"))
            finally:  # workers it started again if it kept no batches (see fit)
                self.validator.close()
            write_results_json(self.run_dir / FP32_PREDICTIONS, validation.detections, self.val_data.ground_truth)
        self.log(f"final FP32 evaluation of best.pt (epoch {int(state.get('epoch', -1)) + 1}): mAP50-95 "
                 f"{validation.metrics['mAP50-95']:.4f} ({validation.result.evaluator}), predictions in "
                 f"{self.run_dir / FP32_PREDICTIONS}")
        summary["metrics_fp32"] = validation.metrics
