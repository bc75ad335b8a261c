"""TrainConfig.validate (detector/training/config.py): values that cannot work are one line naming the flag, before
the data scan, as Ultralytics' settings check refuses them."""

from __future__ import annotations

import re

import pytest

from detector.training.config import TrainConfig


@pytest.mark.parametrize(("flags", "message"), [
    ({"scale": 2.0}, "--scale must be in [0, 1] (got 2.0)"),  # zooms from -1 to 3 were drawn
    ({"lr0": -1.0}, "--lr0 must be in [0, 1] (got -1.0)"),  # trained uphill
    ({"hsv_h": 2.0}, "--hsv-h must be in [0, 1] (got 2.0)"),
    ({"val_conf": 2.0}, "--val-conf must be in [0, 1] (got 2.0)"),
    ({"momentum": 1.5}, "--momentum must be in [0, 1) (got 1.5)"),  # torch's Adam refused it after the data scan
    ({"ema_decay": 2.0}, "--ema-decay must be in [0, 1) (got 2.0)"),
    ({"nominal_batch": 0}, "--nominal-batch must be at least 1 (got 0)"),  # was a traceback
    ({"max_det": 0}, "--max-det must be at least 1 (got 0)"),
    ({"close_mosaic": -1}, "--close-mosaic must be at least 0 (got -1)"),
    ({"warmup_epochs": -1.0}, "--warmup-epochs must be at least 0 (got -1.0)"),
    ({"seed": -1}, "--seed must be at least 0 (got -1)"),
    ({"mixup": 1.5}, "--mixup is a probability in [0, 1] (got 1.5)"),
    ({"cutmix": -0.5}, "--cutmix is a probability in [0, 1] (got -0.5)"),
    ({"bgr": 1.5}, "--bgr is a probability in [0, 1] (got 1.5)"),
    ({"perspective": -0.001}, "--perspective must be in [0, 1] (got -0.001)"),  # Ultralytics' range check
    ({"seed": 2**32}, "--seed must be at most 2**32 - 1 = 4294967295 (got 4294967296)"),  # NumPy's words before
])
def test_values_that_cannot_work_are_refused_naming_the_flag(flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        TrainConfig(epochs=1, imgsz=64, **flags).validate()


def test_the_defaults_and_ultralytics_recipes_pass() -> None:
    TrainConfig(epochs=1, imgsz=64).validate()
    TrainConfig(epochs=1, imgsz=64, scale=0.9, mixup=0.15, cutmix=0.5, lr0=0.01, momentum=0.937,
                degrees=180.0, perspective=0.001, bgr=1.0).validate()


def test_classes_travel_through_config_yaml_and_checkpoints_as_the_tuple_given() -> None:
    import yaml

    config = TrainConfig(epochs=1, imgsz=64, classes=(0, 2))
    written = yaml.safe_load(yaml.safe_dump(config.to_dict()))  # config.yaml: safe_dump writes no tuples
    assert written["classes"] == [0, 2] and TrainConfig.from_dict(written).classes == (0, 2)
    assert TrainConfig.from_dict(TrainConfig(epochs=1).to_dict()).classes is None


def test_a_relative_data_path_is_kept_as_a_path_from_anywhere(tmp_path, monkeypatch) -> None:
    """config.yaml and checkpoints hold the YAML's absolute path: a resume from another folder said the dataset was
    "gone" though nothing had moved. A shipped name stays a name."""
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "d.yaml").write_text("names: [a]\n")
    monkeypatch.chdir(tmp_path)
    assert TrainConfig(data="sets/d.yaml").with_defaults().data == str(tmp_path / "sets" / "d.yaml")
    assert TrainConfig(data="coco128").with_defaults().data == "coco128"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_unamp_beside_another_precision_is_refused(precision: str) -> None:
    # --unamp won silently: "--unamp --precision bf16" trained FP32 without a word about the other flag.
    with pytest.raises(ValueError, match=f"--unamp is true FP32 and --precision {precision} asks otherwise; give one"):
        TrainConfig(epochs=1, imgsz=64, unamp=True, precision=precision).validate()
    TrainConfig(epochs=1, imgsz=64, unamp=True, precision="fp32").validate()
