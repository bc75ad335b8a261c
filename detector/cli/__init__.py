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
    143  terminated (SIGTERM, 128 + 15 as a shell reports a process it killed) where a command unwinds from it
         (download); training takes a SIGTERM as a first Ctrl-C (last.pt saved, 0), the others die of it (143)
"""

from __future__ import annotations

import atexit
import difflib
import gc
import importlib
import os
import sys
from typing import NoReturn

OK, FAILED, USAGE, INTERRUPTED, TERMINATED = 0, 1, 2, 130, 143

# command -> (module, help). Each module exposes ``main(argv: list[str] | None) -> int`` and is imported only
# when its command runs, so ``--help`` stays instant.
COMMANDS = {
    "train": ("detector.cli.train", "train a detector (same as train.py)"),
    "val": ("detector.cli.val", "evaluate a checkpoint or an export: per-class table + COCO summary"),
    "predict": ("detector.cli.predict", "run a .pt/.onnx/.engine/.pt2 model on images, folders or videos"),
    "benchmark": ("detector.cli.benchmark", "time pre-process / inference / post-process per backend"),
    "export": ("detector.cli.export", "export to ONNX / TensorRT / pt2 (same as export.py)"),
    "tune": ("detector.cli.tune", "evolve train's hyperparameters over many short runs (Ultralytics' tune)"),
    "ablate-amp": ("detector.cli.ablate", "train with AMP and with --unamp, and report the difference"),
    "download": ("detector.cli.download",
                 "fetch a dataset (coco, coco128, voc, coco8...) or weights (yolov8n...x, yolo11n...x, yolo26n...x)"),
}


def program() -> str:
    """How the user started us, for usage and error lines: ``detector`` (the console script) or
    ``python -m detector`` (anything else: ``-m`` runs detector/__main__.py, a test calls :func:`main`)."""
    started_as = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "detector" if os.path.splitext(started_as)[0] == "detector" else "python -m detector"


def version() -> str:
    """The installed distribution's version; the package's own where it is not installed (a bare checkout on
    ``PYTHONPATH``)."""
    import importlib.metadata  # only for --version: the other commands never read the installed metadata

    from detector.extras import DISTRIBUTION

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        from detector.version import __version__

        return __version__


def usage() -> str:
    prog = program()
    lines = [f"usage: {prog} <command> [options]", f"       {prog} --version", "", "commands:"]
    return "\n".join(lines + [f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return OK
    if argv[0] in ("-V", "--version"):
        print(f"detector {version()}")
        return OK
    if argv[0] == "detect" and len(argv) > 1 and argv[1] in COMMANDS:
        # Ultralytics' task word (yolo detect train ...): the only task here, so it says nothing.
        print(f"note: Ultralytics' task word 'detect' is implied here: {program()} {argv[1]} ...", file=sys.stderr)
        argv = argv[1:]
    if argv[0] not in COMMANDS:
        # One line, as every command's usage error (detector/cli/parser.py): the command list printed first
        # pushed the line that said what was wrong out of sight.
        near = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"did you mean {near[0]}?" if near else f"the commands are {', '.join(COMMANDS)}"
        print(f"{program()}: error: unknown command {argv[0]!r}; {hint} (see {program()} --help)", file=sys.stderr)
        return USAGE
    module = importlib.import_module(COMMANDS[argv[0]][0])
    # Usage and error lines then name the command as it was typed: ``detector train``, not train.py.
    return int(module.main(argv[1:], prog=f"{program()} {argv[0]}") or 0)


_exit_code: int | None = None  # set by exit_with: the code _end_without_teardown ends the process with


def exit_with(code: int) -> NoReturn:
    """End the process with ``code``, after every atexit handler but without the interpreter's teardown.

    The teardown (module dictionaries cleared, a last garbage collection, extension modules finalised) does
    nothing a command needs: every file we write is closed before this (checkpoints and exports atomically,
    TensorBoard's events by the trainer), and what the libraries registered with atexit still runs (loader
    workers are stopped, temporary folders removed). It cost time and, on some installs, noise:

    * after a training run there are ~420k live objects (torch, sympy, matplotlib); collecting them took
      1.4-1.9 s after the last line on a 2-core EPYC. Frozen (``gc.freeze``) the teardown still took 0.4-0.9 s,
      skipped 0.2 s (``docs/training-log.md``, 2026-11-26);
    * with torch 2.15, whose triton (3.9) is built with nanobind, that frozen teardown printed ~30 lines of
      ``nanobind: leaked 4 instances!`` on stderr at the end of every command.

    :func:`_end_without_teardown` does it, as the last atexit handler; ``gc.freeze`` keeps the collector off the
    live objects while the handlers before it run. Only for the entry points (``train.py``, ``export.py``,
    ``python -m detector``, the ``detector`` script): a program that catches the ``SystemExit`` and goes on
    would still end with ``code`` when it exits.
    """
    global _exit_code
    _exit_code = code
    gc.freeze()
    sys.exit(code)


def _end_without_teardown() -> None:
    """The last atexit handler: it is registered when this module is first imported, which every entry point
    does before anything else (before torch, multiprocessing or tempfile register theirs), and atexit runs the
    handlers in reverse order. Python's buffered output is flushed, and the C library's (a library's printf,
    such as ``ONEDNN_VERBOSE``'s, to a pipe), which ``os._exit`` would otherwise drop."""
    if _exit_code is None:  # not ended through exit_with (tests, a program importing the package): as usual
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    if os.name == "posix":
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(_exit_code)


atexit.register(_end_without_teardown)


def run() -> NoReturn:
    """The ``detector`` console script."""
    exit_with(main())
