"""``python export.py`` / ``python -m detector export``: the command line of :mod:`detector.workflows.export`."""

from __future__ import annotations

import argparse
from pathlib import Path

from detector.cli.errors import one_process, run_command
from detector.cli.flags import add_flags, options_from_args, parse_command
from detector.cli.parser import CommandParser
from detector.workflows.options import ExportOptions


PROG = "export.py"  # the script's name; ``detector export`` passes its own (detector.cli.main)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog,
        command="export",
        description="Export a checkpoint to ONNX, TensorRT and/or pt2 (AOTInductor), then check it against the FP32 PyTorch model.",
        epilog="Input 'images' float32 [B,3,H,W] RGB in [0,1]. Outputs: 'boxes' [B,A,4] xyxy px + 'scores' [B,A,C]; "
        "with --nms 'detections' [B,K,6] (x1,y1,x2,y2,score,label; zero rows pad) + 'num_detections' [B].",
    )
    add_flags(parser, ExportOptions)
    return parser


def export(options: ExportOptions) -> list[Path]:
    """:func:`detector.workflows.export.run_export`, imported only now so that ``--help`` is instant."""
    from detector.workflows.export import run_export

    return run_export(options)


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """``--flags`` and ``key=value`` arguments (ours or Ultralytics' names: detector/aliases.py) alike."""
    return parse_command(build_parser(prog), ExportOptions, "export", argv)


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    if (refused := one_process("export")) is not None:
        return refused
    args = parse_args(argv, prog)
    return run_command(lambda: export(options_from_args(ExportOptions, args)))
