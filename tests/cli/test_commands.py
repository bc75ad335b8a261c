"""One command registry behind ``python -m detector`` and the ``detector`` console script."""

from __future__ import annotations

import gc
import importlib
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest

import detector.cli as cli
from detector.cli import COMMANDS, main, run

REPO = Path(__file__).resolve().parents[2]
# command -> (module, class) of the option dataclass its flags are generated from
OPTIONS = {
    "train": ("detector.training.config", "TrainConfig"),
    "val": ("detector.workflows.options", "ValOptions"),
    "predict": ("detector.workflows.options", "PredictOptions"),
    "export": ("detector.workflows.options", "ExportOptions"),
    "benchmark": ("detector.workflows.options", "BenchmarkOptions"),
}
# What --help must not import: torch and its companions took ~7 s of every command's --help on a 2-core EPYC.
HEAVY = ("torch", "torchvision", "albumentations", "cv2")


def test_console_script_is_the_dispatcher_and_skips_the_exit_time_collection(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["detector"].partition(":")
    assert getattr(importlib.import_module(module), function) is run
    monkeypatch.setattr(sys, "argv", ["detector", "--help"])
    monkeypatch.setattr(cli, "_exit_code", None)  # put back after: else pytest itself would end with this code
    try:
        with pytest.raises(SystemExit) as exit_:
            run()
        assert exit_.value.code == 0 and "commands:" in capsys.readouterr().out
        assert gc.get_freeze_count() > 0  # what is alive is left to the operating system
    finally:
        gc.unfreeze()


# A command's end: exit_with's code, the atexit handlers registered after the entry point's first import (the
# loaders', tempfile's) run, Python's and the C library's buffered output reaches a pipe, and the interpreter's
# teardown, which would run the __del__ of an object kept by a module (here sys) even when gc.freeze has frozen it,
# does not run (with torch 2.15's nanobind-built triton that teardown printed a leak report for objects of triton's
# that were frozen; the suite's torch cannot show that).
ENDING = textwrap.dedent("""
    import atexit, ctypes, os, sys
    from detector.cli import exit_with

    class Teardown:
        def __del__(self, write=os.write):
            write(1, b"teardown ran\\n")

    sys.kept_until_teardown = Teardown()
    atexit.register(print, "atexit handler ran")
    ctypes.CDLL(None).printf(b"printed by C\\n")
    print("printed by Python")
    {end}(3)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="the C library's printf through ctypes.CDLL(None)")
@pytest.mark.parametrize("end", ["exit_with", "sys.exit"])
def test_a_command_ends_after_the_atexit_handlers_without_the_teardown(end: str) -> None:
    done = subprocess.run([sys.executable, "-c", ENDING.format(end=end)], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 3, done.stderr
    printed = done.stdout.splitlines()
    assert {"printed by C", "printed by Python", "atexit handler ran"} <= set(printed), done.stdout
    assert ("teardown ran" in printed) == (end == "sys.exit")  # sys.exit: the control, teardown as usual


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_module_has_a_main(command: str) -> None:
    assert callable(importlib.import_module(COMMANDS[command][0]).main)


def test_help_lists_every_command_and_unknown_commands_fail(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in COMMANDS)
    assert main(["nonsense"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (  # one line: the command list before it hid it
        f"python -m detector: error: unknown command 'nonsense'; the commands are {', '.join(COMMANDS)} "
        "(see python -m detector --help)\n")
    assert main(["trian", "--epochs", "3"]) == 2
    assert capsys.readouterr().err.startswith("python -m detector: error: unknown command 'trian'; did you mean train?")
    # Ultralytics' task word before a command (yolo detect val ...) is implied here: said once, then the command.
    with pytest.raises(SystemExit) as done:  # argparse's --help exits
        main(["detect", "val", "--help"])
    captured = capsys.readouterr()
    assert done.value.code == 0
    assert "task word 'detect' is implied" in captured.err and "--weights" in captured.out
    assert main(["detect"]) == 2 and "unknown command 'detect'" in capsys.readouterr().err


def test_an_unknown_command_is_a_usage_error_for_the_shell() -> None:
    result = subprocess.run([sys.executable, "-m", "detector", "nonsense"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "unknown command 'nonsense'" in result.stderr


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_the_parser_has_exactly_the_option_objects_fields(command: str) -> None:
    """The flags are generated from the dataclass: a flag the API cannot pass (or the reverse) fails here."""
    module, name = OPTIONS[command]
    options_class = getattr(importlib.import_module(module), name)
    parser = importlib.import_module(COMMANDS[command][0]).build_parser()
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    assert dests == {item.name for item in fields(options_class)}


@pytest.mark.parametrize("command", [*sorted(COMMANDS), "train.py", "export.py"])
def test_help_imports_no_torch(command: str) -> None:
    """Every command's ``--help`` prints from its parser alone (0.2 s, where importing torch and the workflow
    first took 6.7-7.7 s), the workflow being imported only when the command runs. A fresh interpreter, since
    this one has torch already; the entry-point scripts are run as ``python train.py --help`` runs them."""
    if command.endswith(".py"):
        run = f"sys.argv = [{command!r}, '--help']; runpy.run_path({str(REPO / command)!r}, run_name='__main__')"
    else:
        run = f"from detector.cli import main; main([{command!r}, '--help'])"
    code = (f"import runpy, sys\ntry:\n    {run}\nexcept SystemExit as exit_:\n    print('EXIT', exit_.code)\n"
            f"print('HEAVY', [name for name in {HEAVY!r} if name in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: " in done.stdout and "EXIT 0" in done.stdout, done.stdout[-500:] + done.stderr[-500:]
    assert "HEAVY []" in done.stdout, done.stdout[-500:]


@pytest.mark.parametrize("argv", [["val", "--data", "a.yaml"], ["predict", "--source", "x", "--no-such-flag"]])
def test_argparse_refusals_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and "error:" in capsys.readouterr().err


def test_val_command_runs_validation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse of the val command itself: --weights and --data are required
        main(["val"])
    assert "python -m detector val" in capsys.readouterr().err
