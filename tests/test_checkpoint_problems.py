"""A ``.pt`` that does not load is named for what it is: no checkpoint at all, a damaged one, or one refused because
it would run code. The sentence comes from the file's first bytes, not from which of torch's readers tripped."""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.checkpoint import CheckpointError, load_checkpoint
from detector.checkpoint_problems import is_torch_file, not_a_checkpoint
from detector.inference.pt_model import model_from_pt
from detector.weights.safe_pickle import UnsafeCheckpointError
from detector.weights.safe_pickle import load_checkpoint as load_foreign


def _jpeg() -> bytes:
    return cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes()


def _zip_without_a_pickle() -> bytes:  # an .npz, a dataset archive renamed .pt
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("x.npy", b"\x93NUMPY")
    return buffer.getvalue()


def _cut_short_checkpoint() -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(1000)}, buffer)
    return buffer.getvalue()[: len(buffer.getvalue()) // 2]


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


@pytest.mark.parametrize("content, says", [
    # torch's words were "not a loadable checkpoint (Memo value not found at index 101)"
    (b"hello, this is text\n", "not a PyTorch checkpoint"),
    # ... and, for a JPEG, "refused: not plain tensors and values (Unsupported operand 255)", as if it were unsafe
    (_jpeg(), "not a PyTorch checkpoint"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 6\n",
     "not a PyTorch checkpoint; it is a Git LFS pointer, not the file itself: fetch it with git lfs pull"),
    (_zip_without_a_pickle(), "a zip archive, not a PyTorch checkpoint"),
    (_cut_short_checkpoint(), "a damaged PyTorch checkpoint: cut short or corrupt (its zip archive cannot be read)"),
    (b"", "empty or cut short (0 bytes), not a PyTorch checkpoint"),
])
@pytest.mark.parametrize("load", [load_checkpoint, load_foreign], ids=["ours", "restricted unpickler"])
def test_a_file_that_is_no_checkpoint_says_what_it_is(tmp_path: Path, content: bytes, says: str, load) -> None:
    path = tmp_path / "weights.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError) as failed:  # CheckpointError is a ValueError, as the foreign reader's errors are
        load(path)
    assert str(failed.value) == f"{path}: {says}"


def test_a_refusal_stays_a_refusal(tmp_path: Path) -> None:
    """A real pickle that names code is refused as such (docs/security.md), never called "not a checkpoint"."""
    path = tmp_path / "hostile.pt"
    torch.save({"model": _Exploit()}, path)
    assert is_torch_file(path.read_bytes()[:4])
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert str(refused.value).startswith(f"{path}: refused: it names the Python global ")
    assert "not a PyTorch checkpoint" not in str(refused.value)


def test_an_ultralytics_checkpoint_where_ours_is_expected_says_what_reads_it(tmp_path: Path) -> None:
    """``--resume`` of an Ultralytics run's last.pt read as a refusal on security grounds ("it names the Python global
    ultralytics.nn.tasks.DetectionModel, which loading would import and run"), though --weights reads such a file."""
    path = tmp_path / "last.pt"
    path.write_bytes(b"\x80\x02cultralytics.nn.tasks\nDetectionModel\n)\x81.")  # what names Ultralytics' model
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert str(refused.value) == (
        f"{path}: an Ultralytics checkpoint (it names ultralytics.nn.tasks.DetectionModel): its weights are read with "
        f"--weights {path} (train starts a fine-tune from them; val, predict and export take them), but an Ultralytics "
        "run cannot be resumed here")


def test_the_readers_that_tried_are_named_once() -> None:
    assert not_a_checkpoint(b"<!DOCTYPE html>", which="neither A nor B") == (
        "not a PyTorch checkpoint (neither A nor B); it is an HTML page: a download that fetched an error or login "
        "page?")


@pytest.mark.parametrize("load", [load_checkpoint, load_foreign, model_from_pt],
                         ids=["ours", "restricted unpickler", "val and predict"])
def test_a_torchscript_archive_is_refused_in_one_line_without_torchs_advice(tmp_path: Path, load, recwarn) -> None:
    """torch.load warned, advising torch.jit.load (which runs the archive's code), before our line; the archive is now
    told by its constants.pkl before torch opens it, and every reader says the same sentence."""
    path = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.save's own deprecation warning, not the load's
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    recwarn.clear()
    with pytest.raises((ValueError, UnsafeCheckpointError)) as refused:
        load(path)
    assert str(refused.value) == (f"{path}: refused: a TorchScript archive (torch.jit.save), whose loading would run "
                                  "the code it holds; checkpoints are read as tensors and plain values only")
    assert [str(warning.message) for warning in recwarn] == []
