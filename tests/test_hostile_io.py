"""Hostile input at the IO edges, command by command: every bad model file, checkpoint or download ends in one
``error:`` line naming the file, exit 1, no traceback, and nothing written outside the run folder (a failed
command leaves no run folder at all). The data side (labels, lists, images) is tests/test_hostile.py.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from detector.checkpoint import save_checkpoint
from detector.cli import download as download_command
from detector.cli import predict as predict_command
from detector.cli import train as train_command
from detector.cli import val as val_command
from detector.model import build_model
from detector.model.metadata import ModelInfo
from detector.inference.tensorrt_backend import write_engine_file
from tests.conftest import write_yolo_dataset


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def _ours(path: Path, **changes: object) -> Path:
    payload = {"model": build_model(num_classes=2).state_dict(), "ema": None,
               "model_args": {"num_classes": 2, "scale": "n", "reg_max": 16}, "names": ["a", "b"],
               "config": {"imgsz": 64}}
    payload.update(changes)
    save_checkpoint(payload, path)
    return path


def _hostile(path: Path) -> Path:
    torch.save({"model": _Exploit(), "model_args": {"num_classes": 2, "scale": "n"}}, path)
    return path


def _truncated(path: Path) -> Path:
    _ours(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    return path


def _odd_zip(path: Path) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("archive/data.pkl", b"not a pickle")
    path.write_bytes(buffer.getvalue())
    return path


def _engine_with_bad_length(path: Path) -> Path:
    write_engine_file(path, ModelInfo(names=["a"], strides=(8, 16, 32), imgsz=64), b"engine")
    path.write_bytes(b"\xff\xff\xff\x00" + path.read_bytes()[4:])
    return path


# name -> (file maker, what the one line must say)
BAD_WEIGHTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "empty.pt": (lambda p: (p.write_bytes(b""), p)[1], "empty or cut short"),
    "truncated.pt": (_truncated, "truncated.pt"),
    "odd-zip.pt": (_odd_zip, "odd-zip.pt"),
    "hostile.pt": (_hostile, "refused: it names the Python global"),
    "no-scale.pt": (lambda p: _ours(p, model_args={"num_classes": 2}), "scale is None"),
    "bad-args.pt": (lambda p: _ours(p, model_args="n"), "'model_args' is a str"),
    "other-model.pt": (lambda p: _ours(p, model=build_model(num_classes=2, scale="s").state_dict()), "do not fit"),
    "garbage.onnx": (lambda p: (p.write_bytes(b"\x08\x07garbage" * 10), p)[1], "not a loadable ONNX model"),
    "two-bytes.engine": (lambda p: (p.write_bytes(b"ab"), p)[1], "not an engine file"),
    "garbage.pt2": (lambda p: (p.write_bytes(b"garbage"), p)[1], "not a loadable pt2 package"),
    "long-header.engine": (_engine_with_bad_length, "shorter than the header"),
}


def _files(root: Path) -> set[Path]:
    return {path.relative_to(root) for path in root.rglob("*")}


def _one_error_line(capsys: pytest.CaptureFixture[str], *must_say: str, silent: bool = False) -> str:
    """The command's one ``error:`` line (after asserting it is alone); ``silent``: nothing on stdout either."""
    captured = capsys.readouterr()
    err = captured.err
    assert not silent or captured.out == "", captured.out
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "weights_only=False" not in err and "Re-running" not in err
    for text in must_say:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name", sorted(BAD_WEIGHTS))
def test_predict_with_bad_weights_is_one_line_and_leaves_nothing(name: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime")
    monkeypatch.chdir(tmp_path)  # a payload that ran would write pwned.txt here
    make, says = BAD_WEIGHTS[name]
    weights = make(tmp_path / name)
    (tmp_path / "images").mkdir()
    # A readable image: predict opens the source before the model, so the weights are what fails.
    cv2.imwrite(str(tmp_path / "images" / "a.jpg"), np.full((32, 32, 3), 114, np.uint8))
    before = _files(tmp_path)
    code = predict_command.main(["--weights", str(weights), "--source", str(tmp_path / "images"),
                                 "--project", str(tmp_path / "runs"), "--device", "cpu"])
    assert code == 1
    _one_error_line(capsys, name, says)
    assert _files(tmp_path) == before  # no run folder, no pwned.txt, nothing else


@pytest.mark.parametrize("name", ["hostile.pt", "other-model.pt", "no-scale.pt", "truncated.pt"])
def test_val_with_a_bad_checkpoint_is_one_line_and_leaves_nothing(name: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = write_yolo_dataset(tmp_path / "data", train=2, val=2)
    make, says = BAD_WEIGHTS[name]
    weights = make(tmp_path / name)
    before = _files(tmp_path)
    code = val_command.main(["--weights", str(weights), "--data", str(data), "--project", str(tmp_path / "runs"),
                             "--device", "cpu", "--workers", "0"])
    assert code == 1
    _one_error_line(capsys, name, says)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("weights, says", [
    ("foreign", "only 0/355 tensors fit the model"),
    ("other-scale", "tensors fit the model (under 50%)"),
    ("empty.pt", "empty or cut short"),
    ("hostile.pt", "refused: it names the Python global"),
])
def test_train_from_weights_that_do_not_fit_is_one_line(weights: str, says: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = write_yolo_dataset(tmp_path / "data", train=2, val=2)
    if weights == "foreign":
        path = _ours(tmp_path / "foreign.pt", model={"backbone.weight": torch.zeros(3)})
    elif weights == "other-scale":  # an n checkpoint whose tensors are those of an s model
        path = _ours(tmp_path / "other-scale.pt", model=build_model(num_classes=2, scale="s").state_dict())
    else:
        path = BAD_WEIGHTS[weights][0](tmp_path / weights)
    before = _files(tmp_path)
    code = train_command.main(["--weights", str(path), "--data", str(data), "--epochs", "1", "--imgsz", "64",
                               "--batch", "2", "--workers", "0", "--device", "cpu", "--project",
                               str(tmp_path / "runs"), "--no-plots"])
    assert code == 1
    _one_error_line(capsys, path.name, says)
    assert {p for p in _files(tmp_path) - before if not p.parts[0] == "data"} == set()  # no run folder


def test_download_over_plain_http_is_one_line_without_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETECTOR_DOWNLOAD_URL", "http://127.0.0.1:9")  # never contacted: refused before
    assert download_command.main(["coco128", "--datasets-dir", str(tmp_path / "datasets")]) == 1
    _one_error_line(capsys, "http://127.0.0.1:9/coco128.zip", "plain http refused", "--allow-http", silent=True)
    assert not (tmp_path / "datasets").exists() or not any((tmp_path / "datasets").iterdir())


hypothesis = pytest.importorskip("hypothesis", reason="the property-based cases need hypothesis")


@hypothesis.settings(max_examples=30, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(content=hypothesis.strategies.binary(max_size=256),
                  suffix=hypothesis.strategies.sampled_from([".pt", ".engine", ".onnx"]))
def test_any_bytes_as_a_model_file_are_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                           content: bytes, suffix: str) -> None:
    """Random bytes under each model suffix: a user error of one line naming the file, never another exception."""
    from detector.cli.errors import user_errors
    from detector.inference import load_backend

    if suffix == ".onnx":
        pytest.importorskip("onnxruntime")
    path = tmp_path_factory.mktemp("random") / f"model{suffix}"
    path.write_bytes(content)
    with pytest.raises(user_errors()) as refused:
        load_backend(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value).strip()


def test_weights_over_plain_http_are_refused_before_anything_is_made(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETECTOR_DOWNLOAD_URL", "http://127.0.0.1:9")
    assert download_command.main(["yolov8n", "--weights-dir", str(tmp_path / "weights")]) == 1
    _one_error_line(capsys, "http://127.0.0.1:9/yolov8n.pt", "plain http refused")
    assert not (tmp_path / "weights").exists()


def test_a_val_that_fails_midway_removes_its_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from detector.data.synthetic import NAMES
    from detector.workflows import val as val_workflow

    data = write_yolo_dataset(tmp_path / "data", train=2, val=2)
    weights = _ours(tmp_path / "ok.pt", model=build_model(num_classes=len(NAMES)).state_dict(),
                    model_args={"num_classes": len(NAMES), "scale": "n"}, names=list(NAMES))

    def bad_image(*args: object, **kwargs: object) -> None:
        raise ValueError("images/val/1.png: cannot be decoded")  # a user error raised once the folder is claimed

    monkeypatch.setattr(val_workflow, "run_validation", bad_image)
    code = val_command.main(["--weights", str(weights), "--data", str(data), "--project", str(tmp_path / "runs"),
                             "--device", "cpu", "--workers", "0"])
    assert code == 1
    _one_error_line(capsys, "1.png: cannot be decoded")
    assert not (tmp_path / "runs").exists()  # neither the run folder nor the project made for it
