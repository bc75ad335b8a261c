"""Usage errors: one line naming the problem, a suggestion where one is near, the program as it was started, exit 2.

Every argv here fails to parse, so nothing runs (no torch import, no training).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import detector
from detector.cli import main
from detector.cli import train as train_command

REPO = Path(__file__).resolve().parents[2]


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str], *, command=main) -> str:
    """The one stderr line of a command line argparse refuses (exit 2, nothing on stdout)."""
    with pytest.raises(SystemExit) as exited:
        command(argv)
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err  # argparse printed the whole usage first: ~40 lines for train
    return lines[0]


@pytest.mark.parametrize("argv, says", [
    (["train", "--data", "x.yaml", "--bogus"], "python -m detector train: error: unrecognized arguments: --bogus"),
    (["train", "--precision", "fp8"], "python -m detector train: error: argument --precision: invalid choice: 'fp8'"),
    (["predict", "--source", "x", "--bogus"], "python -m detector predict: error: unrecognized arguments: --bogus"),
    (["val", "--data", "a.yaml"], "python -m detector val: error: the following arguments are required: --weights"),
    (["export", "--imgsz", "big"], "python -m detector export: error: argument --imgsz: invalid int value: 'big'"),
    (["benchmark", "--bogus"], "python -m detector benchmark: error: unrecognized arguments: --bogus"),
    (["download", "yolov9"], "python -m detector download: error: argument name: invalid choice: 'yolov9'"),
    (["ablate-amp", "--epochs", "many"], "python -m detector ablate-amp: error: argument --epochs: invalid int"),
])
def test_a_usage_error_is_one_line_with_where_help_is(argv: list[str], says: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, argv)
    assert line.startswith(says), line
    assert line.endswith(f"(see python -m detector {argv[0]} --help)"), line


def test_the_scripts_name_themselves_and_detector_names_the_command(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, ["--bogus"], command=train_command.main).startswith("train.py: error: ")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/detector", "train", "--bogus"])  # the console script
    assert usage_error(capsys, ["train", "--bogus"]).startswith("detector train: error: ")
    monkeypatch.setattr(sys, "argv", [str(REPO / "detector" / "__main__.py"), "export", "--bogus"])  # python -m
    assert usage_error(capsys, ["export", "--bogus"]).startswith("python -m detector export: error: ")


def test_an_ultralytics_error_names_the_program_once(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, ["copy_paste=0.5"], command=train_command.main)
    assert line.startswith("train.py: error: Ultralytics' copy_paste=0.5 has no equivalent here: segmentation only")


@pytest.mark.parametrize("argv, hint", [
    (["train", "--max_det", "3"], "; did you mean --max-det?"),
    (["train", "--epochz", "3"], "; did you mean --epochs?"),
    (["export", "--imgsize", "320"], "; did you mean --imgsz?"),
    (["train", "--cos-lr"], "; did you mean --cosine? (Ultralytics' cos_lr is cosine here)"),
    (["train", "--nbs", "32"], "; did you mean --nominal-batch? (Ultralytics' nbs=32 is nominal_batch=32 here)"),
    (["val", "--data", "d.yaml", "--weights", "a.pt", "--model", "b.pt"],
     "; did you mean --weights? (Ultralytics' model='b.pt' is weights='b.pt' here)"),
])
def test_an_unknown_flag_suggests_ours(argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert hint in usage_error(capsys, argv)


def test_a_flag_unlike_any_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean" not in usage_error(capsys, ["export", "--bogus"])  # not --iou, as difflib said with the --


@pytest.mark.parametrize("flag", [["--copy_paste", "0.5"], ["--copy-paste", "0.5"], ["--copy-paste=0.5"]])
def test_an_ultralytics_name_as_a_flag_gets_its_note(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, ["train", *flag])
    assert "Ultralytics' copy_paste=0.5 has no equivalent here: segmentation only" in line, line


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        assert capsys.readouterr().out == f"detector {importlib.metadata.version('detector-yolo')}\n"


def test_version_without_installed_metadata_is_the_packages(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert main(["--version"]) == 0 and capsys.readouterr().out == f"detector {detector.__version__}\n"


def test_the_script_refuses_an_unknown_flag_in_one_line() -> None:
    """As a user runs it: the exit code the shell sees, and stderr with nothing before the line."""
    done = subprocess.run([sys.executable, "train.py", "--data", "x.yaml", "--bogus"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "train.py: error: unrecognized arguments: --bogus (see train.py --help)\n"


def test_a_flag_is_never_taken_for_an_abbreviation(capsys) -> None:
    """argparse's default took --epoch for --epochs without a word, and --amp False for --amp-check; spelled out or
    refused, with the flag it was close to."""
    from detector.cli.train import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(["--epoch", "3"])
    assert stopped.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "unrecognized arguments: --epoch 3; did you mean --epochs?" in said[0]


@pytest.mark.parametrize("command", ["train", "val", "predict", "export", "benchmark", "download", "ablate-amp"])
def test_every_optional_flag_s_help_names_its_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """README: each command answers --help "with every option and its default" (val's --batch read "images per
    batch", its 32 nowhere). Required flags have none; --help and --version are not options of the run; an alias
    ("same as --val-interval") has its flag's."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    options = text[text.index("options:"):]
    entries = re.split(r"\n(?=  -)", options)[1:]  # one entry per flag, its wrapped lines included
    required = {"val": ("--weights",), "predict": ("--source",)}.get(command, ())
    missing = [entry.split()[0] for entry in entries
               if not entry.lstrip().startswith(("-h", "-V", "--version", *required))
               and "default" not in " ".join(entry.split()) and "same as --" not in entry]
    assert not missing, f"{command} --help names no default for {missing}"
