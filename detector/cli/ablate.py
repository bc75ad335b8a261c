"""``python -m detector ablate-amp``: the same training under AMP and under --unamp, side by side.

Each variant trains in its own process (so peak memory is its own), with the same seed, data and
settings; the report is a markdown table and a bar chart in ``runs/ablate/<name>/``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from detector.cli.errors import CommandFailed, run_command
from detector.cli.parser import CommandParser
from detector.files import write_text_atomically
from detector.runs import claim_run_dir

if TYPE_CHECKING:
    import torch


def variants(device: torch.device) -> list[tuple[str, list[str]]]:
    """Precisions worth comparing here: BF16 vs FP32 on a BF16 CPU; FP16, BF16 vs FP32 (TF32 off) on a GPU."""
    from detector.precision import has_native_bf16  # imports torch: when the command runs, not for --help

    on_gpu = device.type == "cuda"
    chosen = []
    if on_gpu:
        chosen.append(("fp16", ["--precision", "fp16"]))
    if has_native_bf16(device.type):
        chosen.append(("bf16", ["--precision", "bf16"]))
    chosen.append(("fp32", ["--unamp"]))
    return chosen


def summarise(results_csv: Path) -> dict[str, float]:
    rows = list(csv.DictReader(results_csv.open()))
    last = rows[-1]
    return {
        "images_per_s": statistics.median(float(r["images_per_s"]) for r in rows),
        "epoch_seconds": statistics.mean(float(r["epoch_seconds"]) for r in rows),
        "peak_mem_mb": max(float(r["peak_mem_mb"]) for r in rows),
        "mAP50-95": float(last["mAP50-95"]),
        "mAP50": float(last["mAP50"]),
    }


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    reference = results.get("fp32")
    lines = ["| precision | images/s | speed-up vs FP32 | s/epoch | peak memory (MB) | mAP50-95 | mAP50 | ΔmAP50-95 vs FP32 (points) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        speedup = f"{r['images_per_s'] / reference['images_per_s']:.2f}x" if reference else "-"
        delta = f"{100 * (r['mAP50-95'] - reference['mAP50-95']):+.2f}" if reference else "-"
        lines.append(f"| {name} | {r['images_per_s']:.1f} | {speedup} | {r['epoch_seconds']:.1f} | {r['peak_mem_mb']:.0f} | "
                     f"{r['mAP50-95']:.4f} | {r['mAP50']:.4f} | {delta} |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, float]], out_png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from detector.plots.canvas import save_figure

    figure = Figure(figsize=(10, 3), constrained_layout=True)
    names = list(results)
    for index, (key, title) in enumerate((("images_per_s", "images/s"), ("peak_mem_mb", "peak memory (MB)"),
                                          ("mAP50-95", "mAP50-95"))):
        axis = figure.add_subplot(1, 3, index + 1)
        axis.bar(names, [results[n][key] for n in names], color=["tab:green", "tab:orange", "tab:blue"][: len(names)])
        axis.set_title(title)
    return save_figure(figure, out_png)  # atomic, as every run output


PROG = "python -m detector ablate-amp"  # detector.cli.main passes how the command was started


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The report's own flags; every other flag is passed on to each training run (``parse_known_args``)."""
    parser = CommandParser(prog=prog, description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data", default="", help="data YAML; empty = built-in shapes dataset")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per variant")
    parser.add_argument("--device", default="", help="cpu, cuda, cuda:N or N; empty = cuda if available")
    parser.add_argument("--project", default="runs/ablate", help="parent folder of the report")
    parser.add_argument("--name", default="exp", help="report folder name")
    return parser


def ablate(args: argparse.Namespace, train_args: list[str]) -> None:
    """Train each variant in its own process, then write the report; :class:`CommandFailed` when a run fails."""
    from detector.device import resolve_device  # imports torch: when the command runs, not for --help

    device = resolve_device(args.device)
    out_dir = claim_run_dir(args.project, args.name)
    results = {}
    for name, flags in variants(device):
        command = [sys.executable, "-m", "detector", "train", "--epochs", str(args.epochs), "--project", str(out_dir),
                   "--name", name, "--no-plots", "--no-amp-check", *flags, *train_args]
        if args.data:
            command += ["--data", args.data]
        if args.device:
            command += ["--device", args.device]
        print(f"ablate-amp: training {name}: {' '.join(command[1:])}", flush=True)
        if subprocess.run(command).returncode != 0:
            raise CommandFailed(f"the {name} run failed (its error is above)")
        results[name] = summarise(out_dir / name / "results.csv")
    table = markdown_table(results)
    write_text_atomically(out_dir / "ablation.md", f"# AMP ablation ({args.epochs} epochs, same seed)\n\n{table}\n")
    plot(results, out_dir / "ablation.png")
    print(table)
    print(f"report: {out_dir / 'ablation.md'}, {out_dir / 'ablation.png'}")


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    args, train_args = build_parser(prog).parse_known_args(argv)
    return run_command(ablate, args, train_args)
