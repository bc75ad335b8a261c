"""``--weights x.pt`` for val and predict: ours, else Ultralytics' YOLOv8 or YOLO11; a file that is neither is one
sentence."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.checkpoint import CheckpointError
from detector.inference.pt_model import model_from_pt

NEITHER = "not a PyTorch checkpoint (neither this project's nor Ultralytics' YOLOv8, YOLO11 or YOLO26 weights)"


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


@pytest.mark.parametrize("content", [
    b"not a checkpoint\n",  # was: "not a loadable checkpoint (101); nor is it ... (Memo value not found at index 101)"
    cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes(),  # was: "refused: not plain tensors ..."
], ids=["text", "jpeg"])
def test_a_file_that_is_no_checkpoint_is_one_plain_sentence(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notckpt.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as failed:
        model_from_pt(path)
    assert str(failed.value) == f"{path}: {NEITHER}"


def test_a_damaged_checkpoint_is_said_once(tmp_path: Path) -> None:
    """Both readers fail on the same bytes the same way: one reason, the file named once."""
    path = tmp_path / "cut.pt"
    torch.save({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError) as failed:
        model_from_pt(path)
    message = str(failed.value)
    assert message.startswith(f"{path}: a damaged PyTorch checkpoint") and message.count(str(path)) == 1, message
    assert "nor is it" not in message


def test_a_file_that_would_run_code_is_still_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "hostile.pt"
    torch.save({"model": _Exploit()}, path)
    with pytest.raises(CheckpointError) as refused:
        model_from_pt(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: refused: it names the Python global ") and message.count(str(path)) == 1
    assert "not a PyTorch checkpoint" not in message and not (tmp_path / "pwned.txt").exists()


def test_an_ultralytics_file_of_another_architecture_names_it_without_advice_to_do_what_failed(
        tmp_path: Path) -> None:
    """A file neither family's layers make up said "its weights are read with --weights FILE ...; nor is it Ultralytics
    YOLOv8 weights": the user had given --weights FILE. Now: what it is, what loads here."""
    from tests.weights.lookalike import mixed_lookalike_bytes

    path = tmp_path / "edited.pt"
    path.write_bytes(mixed_lookalike_bytes())
    with pytest.raises(CheckpointError) as failed:
        model_from_pt(path)
    assert str(failed.value) == (f"{path}: an Ultralytics checkpoint, but not a YOLOv8, YOLO11 or YOLO26 detection "
                                 "model (built from yolo11n.yaml: layer 4 is C2f, expected C3k2); only YOLOv8, YOLO11 "
                                 "and YOLO26 n/s/m/l/x detection weights are supported")


def test_a_yolo11_file_runs_and_says_what_it_is(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """yolo11n.pt (what Ultralytics trains from by default now) was refused as not YOLOv8; val and predict run it."""
    from tests.weights.lookalike import lookalike_bytes

    path = tmp_path / "yolo11n.pt"
    path.write_bytes(lookalike_bytes("11n", num_classes=3))
    model, meta = model_from_pt(path)
    assert (model.scale, model.family, model.training) == ("11n", "11", False)
    assert meta == {"names": ["class0", "class1", "class2"], "source": "ultralytics"}
    assert f"{path}: Ultralytics YOLO11n weights (3 classes), read without running code" in capsys.readouterr().out
    assert [level.shape[1] for level in model(torch.rand(1, 3, 64, 64))] == [64 + 3] * 3
