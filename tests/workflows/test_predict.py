"""The predict workflow's helpers (the command end to end: tests/cli/test_predict_and_benchmark.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from detector.workflows.predict import PredictOptions, input_size, iterate_source, run_predict, to_record


def test_to_record_rounds_for_json() -> None:
    result = {"file": "a.jpg", "frame": None, "boxes": np.array([[1.234, 2.0, 3.456, 4.0]], dtype=np.float32),
              "scores": np.array([0.123456], dtype=np.float32), "labels": np.array([2]), "names": ["cat"]}
    assert to_record(result) == {"file": "a.jpg", "frame": None, "boxes": [[1.23, 2.0, 3.46, 4.0]],
                                 "scores": [0.1235], "labels": [2], "names": ["cat"]}


def test_sources_that_hold_no_images_are_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no images"):
        next(iterate_source(tmp_path / "empty"))
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(FileNotFoundError, match="notes.txt: not an image, a folder or a video"):
        next(iterate_source(tmp_path / "notes.txt"))


def test_input_size_follows_the_model() -> None:
    fixed = SimpleNamespace(info=SimpleNamespace(imgsz=320, dynamic=False, stride=32))
    assert input_size(fixed, None) == 320 and input_size(fixed, 320) == 320
    with pytest.raises(ValueError, match="fixed 320 px; drop --imgsz or export with --dynamic"):
        input_size(fixed, 640)
    dynamic = SimpleNamespace(info=SimpleNamespace(imgsz=320, dynamic=True, stride=32))
    assert input_size(dynamic, 640) == 640
    with pytest.raises(ValueError, match="--imgsz must be a multiple of 32; got 100"):
        input_size(dynamic, 100)


def test_a_failed_predict_leaves_no_run_folder(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "clip.mp4").write_bytes(b"not a video")
    project = tmp_path / "runs" / "predict"
    options = PredictOptions(weights=checkpoint, source=tmp_path / "clip.mp4", project=project, device="cpu")
    with pytest.raises(FileNotFoundError, match="cannot open video"):
        run_predict(options)
    assert not project.exists()
