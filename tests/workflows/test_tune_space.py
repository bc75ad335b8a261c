"""detector tune's search space (detector/workflows/tune_space.py): the default, a space file, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.training.config import TrainConfig
from detector.workflows.tune_space import DEFAULT_SPACE, Bounds, check_against_train, read_space, tunable


def test_the_default_space_is_tunable_holds_trains_defaults_and_train_takes_its_bounds():
    config = TrainConfig(data="x.yaml").with_defaults()
    for name, bounds in DEFAULT_SPACE.items():
        assert tunable(name) and bounds.low <= getattr(config, name) <= bounds.high, name
    check_against_train(DEFAULT_SPACE, config)
    assert type(DEFAULT_SPACE["close_mosaic"].low) is int
    assert DEFAULT_SPACE["bgr"] == Bounds(0.0, 1.0)  # Ultralytics 8.4's, now that train has the channel swap


def test_a_space_file_in_ultralytics_names_is_translated(tmp_path: Path):
    path = tmp_path / "space.yaml"
    path.write_text("box: [1, 10]\ncls: [0.2, 2.0, 0.5]\nclose_mosaic: [0.5, 7.5]\nlr0: [0.001, 0.01]\n")
    space = read_space(path)
    assert space == {"box_gain": Bounds(1.0, 10.0), "cls_gain": Bounds(0.2, 2.0, 0.5),
                     "close_mosaic": Bounds(1, 7), "lr0": Bounds(0.001, 0.01)}
    assert type(space["close_mosaic"].low) is int


@pytest.mark.parametrize("text,said", [
    ("optimizer: [0, 1]", r"optimizer: 'optimizer' is not a number train takes that a tune evolves"),
    ("bogus: [0, 1]", r"bogus: 'bogus' is not a number"),
    ("epochs: [1, 10]", r"epochs: 'epochs' is not a number"),
    ("iou: [0.5, 0.8]", r"iou: 'iou' \(val_iou\) is not a number"),
    ("copy_paste: [0.0, 1.0]", r"copy_paste: Ultralytics' 'copy_paste' has no equivalent here"),
    ("lr0: [0.1, 0.01]", r"lr0: expected low <= high"),
    ("lr0: 0.01", r"lr0: expected \[low, high\] or \[low, high, gain\], got 0.01"),
    ("close_mosaic: [0.2, 0.8]", r"close_mosaic: no whole number lies in \[0.2, 0.8\]"),
    ("- lr0", r"expected 'name: \[low, high\]' lines, found list"),
])
def test_a_bad_space_is_refused_in_one_line_naming_it(tmp_path: Path, text: str, said: str):
    path = tmp_path / "space.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=f"^--space {path}: {said}") as caught:
        read_space(path)
    assert "\n" not in str(caught.value)


def test_bounds_train_would_refuse_are_refused_before_any_training():
    with pytest.raises(ValueError, match=r"^space: lr0: \[0, 2\] reaches values train refuses \(--lr0 must be in"):
        check_against_train({"lr0": Bounds(0.0, 2.0)}, TrainConfig(data="x.yaml").with_defaults())
