"""``python -m detector benchmark``: the command line of :mod:`detector.workflows.benchmark`.

The table goes to stdout, one progress line per backend to stderr, so ``> table.md`` keeps only the table.
"""

from __future__ import annotations

import argparse
import sys

from detector.cli.errors import one_process, run_command
from detector.cli.flags import add_flags, options_from_args, parse_command
from detector.cli.parser import CommandParser
from detector.workflows.options import BenchmarkOptions


PROG = "python -m detector benchmark"  # detector.cli.main passes how the command was started


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog, command="benchmark",
        description="Time pre-process / inference / post-process per image for each available backend.",
    )
    add_flags(parser, BenchmarkOptions)
    return parser


def benchmark(args: argparse.Namespace) -> None:
    """Time every backend and print the table; the workflow is imported only now so that ``--help`` is instant."""
    from detector.workflows.benchmark import run_benchmark

    options = options_from_args(BenchmarkOptions, args)
    print(run_benchmark(options, progress=lambda line: print(line, file=sys.stderr)))


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    if (refused := one_process("benchmark")) is not None:
        return refused
    # --flags and Ultralytics' key=value arguments (yolo benchmark model=... imgsz=... half=True) alike
    return run_command(benchmark, parse_command(build_parser(prog), BenchmarkOptions, "benchmark", argv))
