"""Every command in one place: ``python -m detector <command>`` and the ``detector`` console script.

``train.py`` and ``export.py`` call the ``train`` and ``export`` commands' ``main`` directly. A command module
only parses its flags (generated from its option dataclass: detector/workflows/options.py, train's
detector/training/config.py) and calls the workflow through :func:`detector.cli.errors.run_command`, so every
command ends the same way. The workflow is imported only when the command runs: ``--help`` never imports torch
(tests/cli/test_commands.py).

Exit codes, the same for every command:

    0    done
    1    the command failed on its input (a missing file, a bad value, a failed check): one line ``error: ...``
    2    usage error: argparse's own (an unknown flag, a missing required one), or an unknown command
    130  interrupted (Ctrl-C): one line; a first Ctrl-C in training saves last.pt and exits 0
"""

from __future__ import annotations

import gc
import importlib
import sys
from typing import NoReturn

OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130

# command -> (module, help). Each module exposes ``main(argv: list[str] | None) -> int`` and is imported only
# when its command runs, so ``--help`` stays instant.
COMMANDS = {
    "train": ("detector.cli.train", "train a detector (same as train.py)"),
    "val": ("detector.cli.val", "evaluate a checkpoint or an export: per-class table + COCO summary"),
    "predict": ("detector.cli.predict", "run a .pt/.onnx/.engine/.pt2 model on images, folders or videos"),
    "benchmark": ("detector.cli.benchmark", "time pre-process / inference / post-process per backend"),
    "export": ("detector.cli.export", "export to ONNX / TensorRT / pt2 (same as export.py)"),
    "ablate-amp": ("detector.cli.ablate", "train with AMP and with --unamp, and report the difference"),
    "download": ("detector.cli.download", "fetch a dataset (coco, coco128, voc) or YOLOv8 weights (yolov8n...x)"),
}


def usage() -> str:
    lines = ["usage: python -m detector <command> [options]", "", "commands:"]
    return "\n".join(lines + [f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return OK
    if argv[0] not in COMMANDS:
        # As argparse reports a usage error: on stderr, the usage first, the complaint last.
        print(f"{usage()}\n\npython -m detector: error: unknown command {argv[0]!r}", file=sys.stderr)
        return USAGE
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


def exit_with(code: int) -> NoReturn:
    """End the process with ``code`` without the garbage collection Python runs over every live object at exit.

    After torch, sympy and matplotlib are imported there are ~420k of them, more after a run: that pass took
    1.4-1.9 s after a training run's last line on a 2-core EPYC, 0.4-0.6 s once they are frozen (``gc.freeze``:
    the operating system frees them). atexit handlers still run (loader workers are stopped), and every file we
    write is closed before this: checkpoints and exports atomically, TensorBoard's events by the trainer.
    """
    gc.freeze()
    sys.exit(code)


def run() -> NoReturn:
    """The ``detector`` console script."""
    exit_with(main())
