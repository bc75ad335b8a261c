"""resolved.yaml: what a run's auto settings became on this host, beside config.yaml, which keeps auto."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import yaml

import detector
from detector.training.config import TrainConfig
from detector.training.optim import resolve_optimizer
from detector.training.trainer import Trainer


def test_a_run_writes_what_auto_chose(yolo_yaml: Path, tmp_path: Path, capsys) -> None:
    config = TrainConfig(data=str(yolo_yaml), device="cpu", imgsz=64, epochs=1, batch=4, workers=0,
                         project=str(tmp_path), name="run", plots=False, amp_check=True, close_mosaic=0, seed=0,
                         precision="auto",
                         optimizer="auto", cache="auto", pixel_augment="auto")
    trainer = Trainer(config, progress=False)
    summary = trainer.fit()
    run_dir = summary["run_dir"]
    asked = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert {key: asked[key] for key in ("precision", "optimizer", "cache", "pixel_augment")} == dict.fromkeys(
        ("precision", "optimizer", "cache", "pixel_augment"), "auto")  # cfg=config.yaml asks the same again
    chosen = yaml.safe_load((run_dir / "resolved.yaml").read_text())
    row = next(csv.DictReader((run_dir / "results.csv").open()))
    assert chosen["precision"] == row["precision"] == trainer.step.precision.name  # after the AMP check
    # 1 epoch of 2 steps is short: auto is AdamW at its class-count-scaled rate (3 classes).
    assert (chosen["optimizer"], chosen["lr0"]) == resolve_optimizer("auto", config.lr0, num_classes=3, total_steps=2)
    assert chosen["momentum"] == config.momentum
    printed = capsys.readouterr().out
    assert chosen["pixel_augment"] == "workers" and "| augmentation in the workers |" in printed  # auto on a CPU
    assert chosen["cache"] == "ram" and "| RAM cache " in printed  # auto: 8 tiny images fit in memory
    assert (chosen["workers"], chosen["device"], chosen["world_size"], chosen["batch"], chosen["model"]) == (
        0, "cpu", 1, 4, "n")
    assert (chosen["detector"], chosen["torch"]) == (detector.__version__, torch.__version__)
