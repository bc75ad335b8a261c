"""What a run's figures cost: each PNG the trainer draws, timed as the trainer draws it, from a finished run.

A training run draws ``labels.png`` and ``train_batch0.png`` before its first step, ``results.png`` now and then
while it trains and once at the end, and at the end ``PR_curve.png``, ``confusion_matrix.png`` and
``val_batch0_pred.png``; on a small set with short epochs these are a visible share of the run's fixed costs (the
time account's start-up, "other" and final evaluation). This script takes a finished run's folder (its
``config.yaml``, ``results.csv`` and ``weights/best.pt``), validates best.pt once to get the predictions, then
draws each figure ``--repeats`` times in one process and prints the median and range. matplotlib's first import
is timed in a fresh process (after torch, as a run imports it), ``--imports`` times.

    python train.py --data /tmp/shapes64/shapes.yaml --imgsz 160 --epochs 30 --project /tmp/runs --name plots
    python benchmarks/plot_speed.py --run /tmp/runs/plots
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from detector.checkpoint import model_from_checkpoint
from detector.data.dataset import collate
from detector.precision import resolve_precision
from detector.training.builders import build_data
from detector.training.config import TrainConfig
from detector.training.validator import Validator

IMPORT_MATPLOTLIB = "import time, torch; t = time.perf_counter(); import detector.plots.canvas; " \
                    "print(time.perf_counter() - t)"


def timed(draw: Callable[[], object], repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        draw()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished run's folder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--imports", type=int, default=3, help="fresh processes timing matplotlib's first import")
    args = parser.parse_args()

    config = TrainConfig.from_dict(yaml.safe_load((args.run / "config.yaml").read_text())).with_defaults()
    config.workers, config.device = 0, "cpu"
    device = torch.device("cpu")
    spec, train, val = build_data(config, with_val=True, device=device)
    model, _ = model_from_checkpoint(args.run / "weights" / "best.pt")
    validation = Validator(val, config, device, progress=False).run(
        model, resolve_precision(config.precision, device), keep_predictions=True)
    first_batch = collate([train.dataset[i] for i in range(min(config.batch, len(train.dataset)))])

    from detector.plots import plot_batch, plot_label_stats, plot_results  # matplotlib from here on
    from detector.plots.reporter import validation_report

    out = Path(tempfile.mkdtemp(prefix="plot_speed_"))
    rows = sum(1 for _ in open(args.run / "results.csv")) - 1
    figures = {
        "labels.png": lambda: plot_label_stats(train.records, spec.names, out / "labels.png"),
        "train_batch0.png": lambda: plot_batch(first_batch[0], first_batch[1], spec.names, out / "train_batch0.png"),
        f"results.png ({rows} rows)": lambda: plot_results(args.run / "results.csv", out / "results.png"),
        "PR curve + confusion matrix + val_batch0_pred.png (with the table)":
            lambda: validation_report(validation, val, spec.names, plot_dir=out),
        "the per-class table alone (--no-plots)": lambda: validation_report(validation, val, spec.names, plot_dir=None),
    }
    imports = [float(subprocess.run([sys.executable, "-c", IMPORT_MATPLOTLIB], capture_output=True, text=True,
                                    check=True, cwd=checkout.ROOT).stdout) for _ in range(args.imports)]
    print(f"run {args.run} ({len(train.records)} train / {len(val.records)} val images, {len(spec.names)} classes); "
          f"median of {args.repeats} draws in one process (the first included), seconds\n")
    print("| figure | median s | min | max |\n|---|---:|---:|---:|")
    print(f"| matplotlib's first import (fresh processes: {args.imports}) | {statistics.median(imports):.3f} | "
          f"{min(imports):.3f} | {max(imports):.3f} |")
    for name, draw in figures.items():
        seconds = timed(draw, args.repeats)
        print(f"| {name} | {statistics.median(seconds):.3f} | {min(seconds):.3f} | {max(seconds):.3f} |")


if __name__ == "__main__":
    main()
