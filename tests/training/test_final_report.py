"""The end of a run's evaluation (detector/training/final_report.py): --final-fp32's pass is best.pt's."""

from __future__ import annotations

from pathlib import Path

import torch

from detector.checkpoint import load_checkpoint
from detector.training.config import TrainConfig
from detector.training.trainer import train


def test_the_final_fp32_evaluation_is_best_pts_in_true_fp32(yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys):
    """--final-fp32 evaluates best.pt's weights as written (what the final report scored: epoch 1 here, not the last
    epoch's EMA it ran before) in true FP32 (TF32 off: on an Ampere+ GPU cuDNN's FP32 convolutions are TF32
    otherwise; here the flags are read, which holds on any device), then the session's settings are back; its line
    names the epoch, and its predictions go to predictions_fp32.json, leaving best.pt's predictions.json."""
    import detector.training.verdicts as verdicts
    from detector.precision import fp32_settings_kept
    from detector.training.final_report import FinalReports
    from detector.training.validator import Validator

    scores = iter([0.9, 0.1, 0.2])  # epoch 1 is the best
    monkeypatch.setattr(verdicts, "fitness", lambda metrics, rule: next(scores))
    passes = []
    real_run_weights = Validator.run_weights

    def recorded(self, model, weights, path, precision):
        validation = real_run_weights(self, model, weights, path, precision)
        passes.append((weights, precision.name, validation, torch.backends.cudnn.allow_tf32,
                       torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()))
        return validation

    monkeypatch.setattr(Validator, "run_weights", recorded)
    reported = {}
    real_final_fp32 = FinalReports._final_fp32

    def after_the_final_report(self, summary):
        reported["predictions"] = (self.run_dir / "predictions.json").read_bytes()
        real_final_fp32(self, summary)

    monkeypatch.setattr(FinalReports, "_final_fp32", after_the_final_report)
    config = TrainConfig(data=str(yolo_yaml), device="cpu", imgsz=64, epochs=3, batch=4, workers=0, cache="none",
                         project=str(tmp_path), name="run", plots=False, amp_check=False, close_mosaic=1, seed=0,
                         warmup_epochs=0.5, final_fp32=True)
    with fp32_settings_kept():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        summary = train(config, progress=False)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    run_dir = summary["run_dir"]
    best = load_checkpoint(run_dir / "weights" / "best.pt")
    assert best["epoch"] == summary["best_epoch"] == 0
    # Two passes of best.pt's weights: the final report's, in the run's precision, then the FP32 one, TF32 off.
    [(report_weights, report_precision, _, *_), (weights, precision, validation, *settings)] = passes
    assert precision == "fp32" and settings == [False, False, "highest"]
    for given in (report_weights, weights):
        assert given.keys() == best["model"].keys() and all(torch.equal(given[k], best["model"][k]) for k in given)
    assert summary["metrics_fp32"] == validation.metrics
    assert (run_dir / "predictions.json").read_bytes() == reported["predictions"]  # best.pt's final report's
    assert (run_dir / "predictions_fp32.json").is_file()
    assert f"final FP32 evaluation of best.pt (epoch 1): mAP50-95 {validation.metrics['mAP50-95']:.4f}" in (
        capsys.readouterr().out)
