"""``python -m detector predict``: the command line of :mod:`detector.workflows.predict` (what it writes)."""

from __future__ import annotations

import argparse

from detector.cli.errors import run_command
from detector.cli.flags import add_flags, options_from_args
from detector.workflows.predict import PredictOptions, run_predict


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m detector predict",
        description="Run a .pt / .onnx / .engine model on an image, a folder of images or a video.",
    )
    add_flags(parser, PredictOptions)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(lambda: run_predict(options_from_args(PredictOptions, args)))
