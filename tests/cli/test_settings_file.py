"""``cfg=args.yaml`` (detector/cli/settings_file.py): an Ultralytics run's settings file read under the command
line's own arguments, with one note naming what was left."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from detector.cli.flags import options_from_args, parse_command
from detector.cli.train import build_parser
from detector.cli.val import build_parser as build_val_parser
from detector.training.config import TrainConfig
from detector.workflows.options import ValOptions

# What an Ultralytics 8.4 run writes to its args.yaml, abridged: train settings beside other modes' and its own.
ARGS_YAML = {
    "task": "detect", "mode": "train", "model": "yolov8s.pt", "data": "bccd.yaml", "epochs": 50, "batch": 8,
    "imgsz": 320, "save": True, "cache": False, "device": None, "workers": 4, "project": None, "name": "bccd",
    "exist_ok": False, "optimizer": "SGD", "cos_lr": True, "close_mosaic": 5, "amp": True, "multi_scale": 0.0,
    "lr0": 0.005, "mosaic": 0.5, "rect": True, "conf": None, "iou": 0.7, "source": None, "format": "torchscript",
    "tracker": "botsort.yaml", "save_dir": "runs/detect/bccd",
}


def write(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def parse(argv: list[str]) -> TrainConfig:
    return options_from_args(TrainConfig, parse_command(build_parser(), TrainConfig, "train", argv))


def test_an_ultralytics_args_yaml_is_the_run_it_describes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = parse([f"cfg={write(tmp_path, ARGS_YAML)}"])
    assert (config.weights, config.model, config.data, config.epochs, config.batch, config.imgsz) == (
        "yolov8s.pt", "s", "bccd.yaml", 50, 8, 320)
    assert (config.optimizer, config.cosine, config.close_mosaic, config.lr0, config.mosaic) == ("SGD", True, 5,
                                                                                                 0.005, 0.5)
    assert (config.cache, config.multi_scale, config.precision, config.workers, config.name) == (
        "none", False, "auto", 4, "bccd")
    assert config.rect  # rect=True: rectangular training batches, as that run had
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1, notes  # one line, not one per key
    assert "left, with no equivalent here: save_dir='runs/detect/bccd'" in notes[0]
    assert "left, not train's settings: format, tracker" in notes[0]  # conf, source: None (unset); iou: --val-iou


def test_the_command_lines_own_arguments_win_in_any_position(tmp_path: Path) -> None:
    path = write(tmp_path, ARGS_YAML)
    config = parse(["--epochs", "3", f"cfg={path}", "lr0=0.02", "--no-cosine"])
    assert (config.epochs, config.lr0, config.cosine, config.batch) == (3, 0.02, False, 8)
    # Another weights file takes the file's scale with it: the scale is the new file's to decide.
    config = parse([f"cfg={path}", "--weights", "mine.pt"])
    assert (config.weights, config.model) == ("mine.pt", "n")


def test_val_reads_the_settings_it_takes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, {**ARGS_YAML, "model": "best.pt", "split": "test"})
    args = parse_command(build_val_parser(), ValOptions, "val", [f"cfg={path}"])
    options = options_from_args(ValOptions, args)
    assert (str(options.weights), options.split, options.imgsz, options.batch, options.iou) == (
        "best.pt", "test", 320, 8, 0.7)
    assert "left, not val's settings" in capsys.readouterr().err


@pytest.mark.parametrize("content, problem", [
    (None, "cannot read it"),
    ("epochs: [1,\n", "not a YAML file"),
    ("- epochs\n", "expected 'key: value' settings, found list"),
    ("optimizer: Lion\n", "optimizer='Lion'"),
])
def test_a_bad_settings_file_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture, content: str | None,
                                                    problem: str) -> None:
    path = tmp_path / "args.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit):
        parse([f"cfg={path}"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"cfg={path}: " in error and problem in error
