"""``train.py`` / ``python -m detector train``: flags generated from :class:`TrainConfig`."""

from __future__ import annotations

import argparse
import pickle
import sys
import warnings
from dataclasses import MISSING, fields
from typing import Any

from detector.checkpoint import CheckpointError
from detector.data.spec import DatasetError
from detector.training.config import TrainConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train an anchor-free YOLO detector (mixed precision by default).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for item in fields(TrainConfig):
        flag = "--" + item.name.replace("_", "-")
        default = item.default if item.default is not MISSING else None
        help_text = item.metadata.get("help", "")
        if isinstance(default, bool):
            parser.add_argument(flag, dest=item.name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            parser.add_argument(flag, dest=item.name, type=type(default), default=default, help=help_text,
                                choices=item.metadata.get("choices"))
    # Common spellings users bring from other tools.
    parser.add_argument("--img", dest="imgsz", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--val-period", dest="val_interval", type=int, metavar="N", default=argparse.SUPPRESS,
                        help="same as --val-interval (Ultralytics' name)")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def run_train(args: argparse.Namespace) -> dict[str, Any]:
    """The command without its error handling; returns :func:`detector.training.trainer.train`'s summary."""
    from detector.training.trainer import train  # heavy imports after argument parsing, so --help is instant

    return train(config_from_args(args))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = lambda message, category, *_: f"warning: {message}\n"
    try:
        run_train(args)
    except (DatasetError, CheckpointError, ValueError, FileNotFoundError, FloatingPointError, pickle.UnpicklingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
