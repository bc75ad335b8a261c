"""``python -m detector predict``: the command line of :mod:`detector.workflows.predict` (what it writes)."""

from __future__ import annotations

import argparse
from collections import deque

from detector.cli.errors import one_process, run_command
from detector.cli.flags import add_flags, options_from_args, parse_command
from detector.cli.parser import CommandParser
from detector.workflows.options import PredictOptions


PROG = "python -m detector predict"  # detector.cli.main passes how the command was started


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        command="predict",
        description="Run a .pt / .onnx / .engine model on images, folders, globs, videos, webcams or streams.",
    )
    add_flags(parser, PredictOptions)
    return parser


def predict(options: PredictOptions) -> None:
    """:func:`detector.workflows.predict.run_predict`, imported only now so that ``--help`` is instant.

    Streamed and dropped: a webcam or a long video keeps nothing but predictions.json's records.
    """
    from detector.workflows.predict import run_predict

    deque(run_predict(options, stream=True), maxlen=0)


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """``--flags`` and ``key=value`` arguments (ours or Ultralytics' names: detector/aliases.py) alike."""
    return parse_command(build_parser(prog), PredictOptions, "predict", argv)


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    if (refused := one_process("predict")) is not None:
        return refused
    args = parse_args(argv, prog)
    return run_command(lambda: predict(options_from_args(PredictOptions, args)))
