"""One command registry behind ``python -m detector`` and the ``detector`` console script."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from detector.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def test_console_script_is_the_dispatcher() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["detector"].partition(":")
    assert getattr(importlib.import_module(module), function) is main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_module_has_a_main(command: str) -> None:
    assert callable(importlib.import_module(COMMANDS[command][0]).main)


def test_help_lists_every_command_and_unknown_commands_fail(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in COMMANDS)
    assert main(["nonsense"]) == 2


def test_val_command_runs_validation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # argparse of the val command itself: --weights and --data are required
        main(["val"])
    assert "python -m detector val" in capsys.readouterr().err
