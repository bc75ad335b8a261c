"""``python -m detector tune``: hyperparameter evolution (detector/workflows/tune.py), as Ultralytics' ``yolo tune``.

The tune's own flags (--iterations, --space, --project, --name, --resume) are parsed here; every other argument is
train's, for each iteration, read by train's own parser once before the first iteration (``key=value`` spellings
and Ultralytics' names as train takes them), so a bad flag is one line and exit 2 before any training.
"""

from __future__ import annotations

import argparse
import sys

from detector.cli.errors import one_process, run_command
from detector.cli.flags import KEY_VALUE, add_flags, options_from_args, parse_value
from detector.cli.parser import CommandParser
from detector.cli.train import parse_args as parse_train_args
from detector.training.config import TrainConfig
from detector.workflows.options import TuneOptions

PROG = "python -m detector tune"  # detector.cli.main passes how the command was started


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = CommandParser(prog=prog, description="Evolve train's hyperparameters over many short training runs.",
                           epilog="Every other argument is train's, given to each iteration: --data, --epochs, "
                                  f"--imgsz, --model, ... ({prog.rsplit(' ', 1)[0]} train --help lists them).")
    add_flags(parser, TuneOptions)
    return parser


def own_key_values(argv: list[str]) -> list[str]:
    """Ultralytics' ``iterations=10``, ``name=x``, ``resume`` / ``resume=True`` spellings of the tune's own flags as
    flags; a token that is the value of the flag before it is left alone."""
    own = {name for name in TuneOptions.__dataclass_fields__}
    out: list[str] = []
    for index, token in enumerate(argv):
        match = KEY_VALUE.fullmatch(token)
        is_value = index > 0 and argv[index - 1].startswith("-") and "=" not in argv[index - 1]
        if token == "resume" and not is_value:
            out.append("--resume")
        elif token in ("--save", "--no-save") or (match and match.group(1) == "save" and not is_value):
            # Ultralytics' own tune example passes save=False; train refuses it (checkpoints are always saved)
            print(f"note: Ultralytics' {token.lstrip('-')} is not needed here: a tune deletes each iteration's weights "
                  "once it is recorded, keeping the fittest's", file=sys.stderr)
        elif match and match.group(1) in own and not is_value:
            name, text = match.groups()
            if name == "resume":
                out += ["--resume"] if parse_value(text) is True else []
            else:
                out += ["--" + name, text]
        else:
            out.append(token)
    return out


def parse_args(argv: list[str] | None, prog: str = PROG) -> tuple[TuneOptions, TrainConfig]:
    parser = build_parser(prog)
    args, rest = parser.parse_known_args(own_key_values(list(argv or [])))
    try:
        options = options_from_args(TuneOptions, args)
    except ValueError as error:
        parser.error(str(error))
    # Train's parser, under the tune's name: its one-line usage errors (exit 2) name `detector tune`.
    return options, options_from_args(TrainConfig, parse_train_args(rest, prog))


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    if (refused := one_process("tune")) is not None:  # each iteration is a process of its own: launch it alone
        return refused
    options, config = parse_args(sys.argv[1:] if argv is None else argv, prog)

    def tune() -> None:
        from detector.workflows.tune import run_tune

        run_tune(options, config)

    return run_command(tune)
