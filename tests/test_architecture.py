"""A model YAML given as model=PATH is read: only the standard YOLOv8, YOLO11 and YOLO26 architectures are built,
whatever the name says."""

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
# Ultralytics' cfg/models/11/yolo11.yaml, as published.
YOLO11_YAML = """\
nc: 80 # number of classes
scales: # model compound scaling constants, i.e. 'model=yolo11n.yaml' will call yolo11.yaml with scale 'n'
  n: [0.50, 0.25, 1024]
  s: [0.50, 0.50, 1024]
  m: [0.50, 1.00, 512]
  l: [1.00, 1.00, 512]
  x: [1.00, 1.50, 512]
backbone:
  - [-1, 1, Conv, [64, 3, 2]] # 0-P1/2
  - [-1, 1, Conv, [128, 3, 2]] # 1-P2/4
  - [-1, 2, C3k2, [256, False, 0.25]]
  - [-1, 1, Conv, [256, 3, 2]] # 3-P3/8
  - [-1, 2, C3k2, [512, False, 0.25]]
  - [-1, 1, Conv, [512, 3, 2]] # 5-P4/16
  - [-1, 2, C3k2, [512, True]]
  - [-1, 1, Conv, [1024, 3, 2]] # 7-P5/32
  - [-1, 2, C3k2, [1024, True]]
  - [-1, 1, SPPF, [1024, 5]] # 9
  - [-1, 2, C2PSA, [1024]] # 10
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 6], 1, Concat, [1]] # cat backbone P4
  - [-1, 2, C3k2, [512, False]] # 13
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 4], 1, Concat, [1]] # cat backbone P3
  - [-1, 2, C3k2, [256, False]] # 16 (P3/8-small)
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 13], 1, Concat, [1]] # cat head P4
  - [-1, 2, C3k2, [512, False]] # 19 (P4/16-medium)
  - [-1, 1, Conv, [512, 3, 2]]
  - [[-1, 10], 1, Concat, [1]] # cat head P5
  - [-1, 2, C3k2, [1024, True]] # 22 (P5/32-large)
  - [[16, 19, 22], 1, Detect, [nc]] # Detect(P3, P4, P5)
"""
REFUSED = "a custom architecture ({}); only the standard YOLOv8, YOLO11 and YOLO26 n/s/m/l/x are built here"


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


@pytest.mark.parametrize("letter", ["n", "s", "m", "l", "x"])
def test_the_standard_yolo11_file_is_its_named_model(tmp_path: Path, letter: str) -> None:
    """yolo11n.yaml was refused as a custom architecture ("layer 2 differs"): it is YOLO11n, built here as 11n."""
    assert standard_scale(written(tmp_path, f"yolo11{letter}.yaml", YOLO11_YAML))[0] == f"11{letter}"


def test_the_yolo11_file_as_ultralytics_ships_it(tmp_path: Path) -> None:
    """The oracle's own copy, when the dev extra has it: the constant above is that file."""
    import importlib.util

    spec = importlib.util.find_spec("ultralytics")
    if spec is None or spec.origin is None:
        pytest.skip("ultralytics is not installed (the dev extra)")
    shipped = Path(spec.origin).parent / "cfg" / "models" / "11" / "yolo11.yaml"  # read as text: nothing imported
    assert standard_scale(written(tmp_path, "yolo11m.yaml", shipped.read_text()))[0] == "11m"


@pytest.mark.parametrize(("old", "new", "what"), [
    ("[-1, 2, C3k2, [256, False, 0.25]]", "[-1, 2, C3k2, [256, True, 0.25]]", "layer 2 differs"),  # C3k at n
    ("[-1, 2, C2PSA, [1024]] # 10", "[-1, 1, C2PSA, [1024]] # 10", "layer 10 differs"),
    ("x: [1.00, 1.50, 512]", "x: [1.00, 1.25, 512]", "scale x: [1.0, 1.25, 512], not YOLO11x's [1.0, 1.5, 512]"),
])
def test_an_edited_yolo11_file_is_refused(tmp_path: Path, old: str, new: str, what: str) -> None:
    assert old in YOLO11_YAML
    with pytest.raises(ValueError) as error:
        standard_scale(written(tmp_path, "yolo11x.yaml", YOLO11_YAML.replace(old, new)))
    assert str(error.value) == REFUSED.format(what)


def test_yolo11_multipliers_without_scales_follow_the_letter_in_the_name(tmp_path: Path) -> None:
    """Without ``scales``, Ultralytics still takes the name's letter as the scale, and m/l/x turn its C3k blocks on:
    YOLO11s's multipliers in a file named for m give C3k blocks at s's widths, which is no model built here."""
    text = "depth_multiple: 0.50\nwidth_multiple: 0.50\n" + YOLO11_YAML[YOLO11_YAML.index("backbone:"):]
    assert standard_scale(written(tmp_path, "a.yaml", text))[0] == "11s"
    assert standard_scale(written(tmp_path, "my-yolo11s.yaml", text))[0] == "11s"
    with pytest.raises(ValueError, match="width_multiple 0.5 match no YOLO11 scale"):
        standard_scale(written(tmp_path, "my-yolo11m.yaml", text))


def test_model_alias_reads_a_yolo11_file(tmp_path: Path) -> None:
    notes: list[str] = []
    path = written(tmp_path, "yolo11s.yaml", YOLO11_YAML.replace("nc: 80", "nc: 2"))
    assert translate("train", {"model": path}, note=notes.append) == {"model": "11s"}
    assert notes == [f"note: Ultralytics' model={path!r} is model='11s' here (the file's architecture is YOLO11s's; "
                     f"its nc: 2 is not read, the data YAML's names set the classes)"]


# Ultralytics' cfg/models/26/yolo26.yaml (8.4): YOLO11's file with three layers and two keys changed.
YOLO26_YAML = (YOLO11_YAML.replace("nc: 80 # number of classes\n", "nc: 80\nend2end: True\nreg_max: 1\n")
               .replace("[-1, 1, SPPF, [1024, 5]] # 9", "[-1, 1, SPPF, [1024, 5, 3, True]] # 9")
               .replace("C3k2, [512, False]]", "C3k2, [512, True]]")
               .replace("C3k2, [256, False]]", "C3k2, [256, True]]")
               .replace("[-1, 2, C3k2, [1024, True]] # 22", "[-1, 1, C3k2, [1024, True, 0.5, True]] # 22"))


@pytest.mark.parametrize("letter", ["n", "s", "m", "l", "x"])
def test_the_standard_yolo26_file_is_its_named_model(tmp_path: Path, letter: str) -> None:
    assert YOLO26_YAML.count("True") == YOLO11_YAML.count("True") + 6  # every replacement above took
    assert standard_scale(written(tmp_path, f"yolo26{letter}.yaml", YOLO26_YAML))[0] == f"26{letter}"


def test_the_yolo26_file_as_ultralytics_ships_it(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.find_spec("ultralytics")
    if spec is None or spec.origin is None:
        pytest.skip("ultralytics is not installed (the dev extra)")
    shipped = Path(spec.origin).parent / "cfg" / "models" / "26" / "yolo26.yaml"
    if not shipped.exists():
        pytest.skip("this Ultralytics predates YOLO26 (8.4)")
    assert standard_scale(written(tmp_path, "yolo26s.yaml", shipped.read_text()))[0] == "26s"


@pytest.mark.parametrize(("old", "new", "what"), [
    ("end2end: True\n", "", "end2end: None"),  # the head would be YOLOv8's kind, with NMS alone
    ("reg_max: 1\n", "reg_max: 16\n", "reg_max: 16"),
    ("[-1, 1, C3k2, [1024, True, 0.5, True]] # 22", "[-1, 1, C3k2, [1024, True]] # 22", "layer 22 differs"),
])
def test_an_edited_yolo26_file_is_refused(tmp_path: Path, old: str, new: str, what: str) -> None:
    assert old in YOLO26_YAML
    with pytest.raises(ValueError) as error:
        standard_scale(written(tmp_path, "yolo26n.yaml", YOLO26_YAML.replace(old, new)))
    assert str(error.value) == REFUSED.format(what)
