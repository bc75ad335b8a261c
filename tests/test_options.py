"""The option objects (detector/options.py; TrainConfig and detector/workflows/options.py): the flags' names,
defaults and checks, for the CLI and the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.options import build_options
from detector.training.config import TrainConfig
from detector.workflows.options import BenchmarkOptions, ExportOptions, PredictOptions, ValOptions

# (options class, the required values, one bad value, the flag its one-line message must name)
CASES = {
    "val": (ValOptions, {"weights": "best.pt", "data": "my.yaml"}, {"split": "bogus"}, "--split"),
    "val coco-eval": (ValOptions, {"weights": "best.pt", "data": "my.yaml"}, {"coco_eval": "x"}, "--coco-eval"),
    "predict": (PredictOptions, {"source": "images/"}, {"conf": "high"}, "--conf"),
    "export": (ExportOptions, {}, {"format": "tflite"}, "--format"),
    "benchmark": (BenchmarkOptions, {}, {"runs": 2.5}, "--runs"),
    "train": (TrainConfig, {}, {"model": "z"}, "--model"),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_bad_value_is_one_line_naming_the_flag(case: str) -> None:
    options_class, required, bad, flag = CASES[case]
    with pytest.raises(ValueError) as error:
        build_options(options_class, {**required, **bad}, command=case)
    assert flag in str(error.value) and "\n" not in str(error.value)
    if options_class is not TrainConfig:  # the workflows' own classes refuse it as they are made, API or not
        with pytest.raises(ValueError, match=flag):
            options_class(**required, **bad)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_an_unknown_argument_is_one_line_listing_the_known_ones(case: str) -> None:
    options_class, required, _, _ = CASES[case]
    with pytest.raises(TypeError) as error:
        build_options(options_class, {**required, "max_dets": 5}, command="predict")
    message = str(error.value)
    assert message.startswith("predict: unknown argument 'max_dets'; known: ") and "\n" not in message
    assert "device" in message.split("known: ")[1]


def test_a_missing_required_argument_names_its_flag() -> None:
    with pytest.raises(TypeError, match=r"^val: missing argument 'weights' \(--weights\)$"):
        build_options(ValOptions, {"data": "data.yaml"}, command="val")
    with pytest.raises(TypeError, match="'source'"):
        build_options(PredictOptions, {"source": None}, command="predict")  # None: left at its (absent) default


def test_values_become_the_flags_types_as_on_the_command_line() -> None:
    options = build_options(ValOptions, {"weights": "best.pt", "data": Path("my.yaml"), "imgsz": "320", "conf": 1,
                                         "datasets_dir": "datasets", "batch": None}, command="val")
    assert options.weights == Path("best.pt") and options.datasets_dir == Path("datasets")
    assert options.imgsz == 320 and options.conf == 1.0 and isinstance(options.conf, float)
    assert options.batch == 32 and options.project == Path("runs/val")  # None and absent: the flag's default
    # A checkpoint stores the config and loads only plain types back: a Path for a text field becomes text.
    config = build_options(TrainConfig, {"project": Path("runs/x"), "epochs": "3"}, command="train")
    assert config.project == "runs/x" and config.epochs == 3


@pytest.mark.parametrize("bad", [{"plots": "no"}, {"batch": True}, {"imgsz": 320.5}, {"weights": 3}])
def test_values_of_the_wrong_kind_are_refused(bad: dict) -> None:
    flag = "--" + next(iter(bad)).replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag}: expected "):
        ValOptions(**{"weights": "best.pt", "data": "my.yaml", **bad})


def test_export_formats_are_checked_and_may_be_a_list() -> None:
    assert build_options(ExportOptions, {"format": ["onnx", "engine"]}, command="export").format == "onnx,engine"
    with pytest.raises(ValueError, match=r"^--format 'onnx,pdf': choose from onnx, engine"):
        ExportOptions(format="onnx,pdf")


def test_a_choice_in_another_case_is_that_choice_from_python_and_the_command_line() -> None:
    """``--optimizer adamw`` (torch's and many scripts' spelling) is AdamW; ``--cache RAM`` is ram."""
    from detector.cli.train import build_parser

    config = build_options(TrainConfig, {"optimizer": "adamw", "cache": "RAM"}, command="train")
    assert (config.optimizer, config.cache) == ("AdamW", "ram")
    args = build_parser().parse_args(["--optimizer", "rmsprop", "--precision", "FP32"])
    assert (args.optimizer, args.precision) == ("RMSprop", "fp32")
    with pytest.raises(ValueError, match="^--optimizer: invalid choice: 'lion'"):
        build_options(TrainConfig, {"optimizer": "lion"}, command="train")
