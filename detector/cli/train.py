"""``train.py`` / ``python -m detector train``: flags generated from :class:`TrainConfig`."""

from __future__ import annotations

import argparse
from typing import Any

from detector.cli.errors import run_command, uncollected_imports
from detector.cli.flags import add_flags, options_from_args, parse_command
from detector.cli.parser import CommandParser
from detector.training.config import TrainConfig


PROG = "train.py"  # the script's name; ``detector train`` passes its own (detector.cli.main)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        command="train",
        description="Train an anchor-free YOLO detector (mixed precision by default).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_flags(parser, TrainConfig, negatable=True)
    # Common spellings users bring from other tools.
    parser.add_argument("--img", dest="imgsz", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--val-period", dest="val_interval", type=int, metavar="N", default=argparse.SUPPRESS,
                        help="same as --val-interval (Ultralytics' name)")
    resume = parser._option_string_actions["--resume"]  # a bare --resume is --resume auto
    resume.nargs, resume.const = "?", "auto"
    return parser


def run_train(config: TrainConfig) -> dict[str, Any]:
    """:func:`detector.training.trainer.train`, imported only now so that ``--help`` is instant. With it
    ``torch._dynamo``, which every ``torch.optim`` optimizer imports at its first parameter group (2 s on a 2-core
    CPU; ``val`` and ``predict`` never import it, detector/nms.py): here, its objects are frozen with the other
    imports' instead of being walked by the garbage collector while the run builds (:func:`uncollected_imports`)."""
    with uncollected_imports():
        import torch._dynamo  # noqa: F401

        from detector.training.trainer import train

    return train(config, process_start=True)  # the time account and --time count the imports before the run


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """``--flags`` and ``key=value`` arguments (ours or Ultralytics' names: detector/aliases.py) alike."""
    return parse_command(build_parser(prog), TrainConfig, "train", argv)


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    return run_command(lambda: run_train(options_from_args(TrainConfig, args)))
