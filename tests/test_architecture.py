"""A model YAML given as model=PATH is read: only the standard YOLOv8 architecture is built, whatever the name says."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.aliases import translate
from detector.architecture import standard_scale

# Ultralytics' cfg/models/v8/yolov8.yaml (its layers and scales as published), the file users copy and edit.
YOLOV8_YAML = """\
nc: 80 # number of classes
scales:
  n: [0.33, 0.25, 1024]
  s: [0.33, 0.50, 1024]
  m: [0.67, 0.75, 768]
  l: [1.00, 1.00, 512]
  x: [1.00, 1.25, 512]
backbone:
  - [-1, 1, Conv, [64, 3, 2]] # 0-P1/2
  - [-1, 1, Conv, [128, 3, 2]] # 1-P2/4
  - [-1, 3, C2f, [128, True]]
  - [-1, 1, Conv, [256, 3, 2]] # 3-P3/8
  - [-1, 6, C2f, [256, True]]
  - [-1, 1, Conv, [512, 3, 2]] # 5-P4/16
  - [-1, 6, C2f, [512, True]]
  - [-1, 1, Conv, [1024, 3, 2]] # 7-P5/32
  - [-1, 3, C2f, [1024, True]]
  - [-1, 1, SPPF, [1024, 5]] # 9
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 6], 1, Concat, [1]] # cat backbone P4
  - [-1, 3, C2f, [512]] # 12
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 4], 1, Concat, [1]] # cat backbone P3
  - [-1, 3, C2f, [256]] # 15 (P3/8-small)
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 12], 1, Concat, [1]] # cat head P4
  - [-1, 3, C2f, [512]] # 18 (P4/16-medium)
  - [-1, 1, Conv, [512, 3, 2]]
  - [[-1, 9], 1, Concat, [1]] # cat head P5
  - [-1, 3, C2f, [1024]] # 21 (P5/32-large)
  - [[15, 18, 21], 1, Detect, [nc]] # Detect(P3, P4, P5)
"""
REFUSED = "a custom architecture ({}); only the standard YOLOv8 n/s/m/l/x is built here"


def written(folder: Path, name: str, text: str = YOLOV8_YAML) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("scale", ["n", "s", "m", "l", "x"])
def test_the_standard_file_is_its_named_scale(tmp_path: Path, scale: str) -> None:
    assert standard_scale(written(tmp_path, f"my-yolov8{scale}.yaml"))[0] == scale


def test_nc_may_differ_and_the_note_says_the_data_sets_it(tmp_path: Path) -> None:
    scale, note = standard_scale(written(tmp_path, "yolov8s.yaml", YOLOV8_YAML.replace("nc: 80", "nc: 3")))
    assert scale == "s" and "its nc: 3 is not read, the data YAML's names set the classes" in note
    text = YOLOV8_YAML.replace("Detect, [nc]]", "Detect, [3]]")  # a literal class count in the head: the same
    assert standard_scale(written(tmp_path, "yolov8m.yaml", text))[0] == "m"


@pytest.mark.parametrize(("old", "new", "what"), [
    ("[-1, 3, C2f, [128, True]]", "[-1, 4, C2f, [128, True]]", "layer 2 differs"),  # an edited backbone
    ("[-1, 1, SPPF, [1024, 5]]", "[-1, 1, SPPF, [1024, 7]]", "layer 9 differs"),
    ("[-1, 3, C2f, [256]] # 15", "[-1, 3, C3, [256]] # 15", "layer 15 differs"),  # an edited head
    ("[[15, 18, 21], 1, Detect, [nc]]", "[[15, 18, 21], 1, Detect, [nc]]\n  - [-1, 1, Conv, [64, 3, 1]]",
     "24 layers, not 23"),
    ("nc: 80", "nc: 80\nactivation: nn.ReLU()", "activation: 'nn.ReLU()'"),
    ("n: [0.33, 0.25, 1024]", "n: [0.50, 0.25, 1024]",
     "scale n: [0.5, 0.25, 1024], not YOLOv8n's [0.33, 0.25, 1024]"),
])
def test_an_edited_architecture_is_refused_in_one_line(tmp_path: Path, old: str, new: str, what: str) -> None:
    assert old in YOLOV8_YAML
    path = written(tmp_path, "yolov8n.yaml", YOLOV8_YAML.replace(old, new))
    with pytest.raises(ValueError) as error:
        standard_scale(path)
    assert str(error.value) == REFUSED.format(what)  # the caller names the file (test below)


def test_multipliers_without_scales_choose_the_scale(tmp_path: Path) -> None:
    """Ultralytics' older form: depth_multiple/width_multiple, no channel cap (only n and s match one)."""
    layers = YOLOV8_YAML[YOLOV8_YAML.index("backbone:"):]
    text = "depth_multiple: 0.33\nwidth_multiple: 0.50\n" + layers
    assert standard_scale(written(tmp_path, "a.yaml", text))[0] == "s"
    path = written(tmp_path, "b.yaml", "depth_multiple: 0.67\nwidth_multiple: 0.75\n" + layers)
    with pytest.raises(ValueError, match="width_multiple 0.75 match no YOLOv8 scale"):
        standard_scale(path)  # uncapped, 1024 x 0.75 channels: not YOLOv8m's (capped at 768)


def test_a_name_without_a_scale_takes_the_first_as_ultralytics_does(tmp_path: Path) -> None:
    scale, note = standard_scale(written(tmp_path, "custom.yaml"))
    assert scale == "n" and "no scale letter in its name: the first of its scales, n, as in Ultralytics" in note


def test_not_a_model_yaml_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a model YAML"):
        standard_scale(written(tmp_path, "yolov8n.yaml", "path: ../datasets\nnames: [a]\n"))


def test_model_alias_reads_an_existing_file_and_keeps_the_name_otherwise(tmp_path: Path) -> None:
    notes: list[str] = []
    path = written(tmp_path, "yolov8l.yaml", YOLOV8_YAML.replace("nc: 80", "nc: 2"))
    assert translate("train", {"model": path}, note=notes.append) == {"model": "l"}
    assert notes == [f"note: Ultralytics' model={path!r} is model='l' here (the file's architecture is YOLOv8l's; "
                     f"its nc: 2 is not read, the data YAML's names set the classes)"]
    edited = written(tmp_path, "my-yolov8n.yaml", YOLOV8_YAML.replace("[-1, 6, C2f, [256, True]]",
                                                                    "[-1, 6, C2f, [256, False]]"))
    with pytest.raises(ValueError) as error:
        translate("train", {"model": edited}, note=notes.append)
    assert str(error.value) == f"train: model={edited!r}: " + REFUSED.format("layer 4 differs")  # the path once
    missing = str(tmp_path / "nowhere" / "yolov8x.yaml")  # no file: the name alone, as before
    assert translate("train", {"model": missing}, note=notes.append) == {"model": "x"}
