"""``python -m detector download yolov8n`` against a real HTTP server on 127.0.0.1 (the dataset tests' server).

The served file is laid out like Ultralytics' release (tests/weights/lookalike.py); the catalogue's size is
swapped for its size. Nothing can hang: 5 s socket timeouts, the server thread joined with a timeout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from detector.cli import download as download_command
from detector.data import transfer
from detector.data import lock
from detector.data.transfer import DownloadError
from detector.weights import resolve_weights
from detector.weights.catalog import PRETRAINED, PretrainedWeights
from detector.weights.download import download_weights
from tests.data.test_download import TIMEOUT_S, Served, server  # noqa: F401 - the fixture, shared
from tests.weights.lookalike import lookalike_bytes, yolov8_lookalike_bytes

OPTIONS = {"timeout": TIMEOUT_S, "retry_wait": 0.0, "allow_http": True}  # the local server speaks plain http


def pinned(content: bytes, name: str = "yolov8n", **changes: object) -> PretrainedWeights:
    """``name``'s catalogue entry with the size and SHA-256 of ``content`` (what the local server holds)."""
    fields = {"size": len(content), "sha256": hashlib.sha256(content).hexdigest(), **changes}
    return dataclasses.replace(PRETRAINED[name], **fields)


def serve_pinned(name: str, content: bytes, served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local server holds ``content`` as ``name``'s file, and the catalogue pins ``name`` to it."""
    served.files[PRETRAINED[name].filename] = content
    monkeypatch.setitem(PRETRAINED, name, pinned(content, name))


@pytest.fixture(scope="module")
def body() -> bytes:
    return yolov8_lookalike_bytes("n")


@pytest.fixture
def served_weights(server: tuple[str, Served], body: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Served]:
    base, served = server
    serve_pinned("yolov8n", body, served, monkeypatch)
    monkeypatch.setenv(transfer.BASE_URL_ENV, base)
    return base, served


def test_the_command_fetches_checks_and_names_the_licence(tmp_path: Path, served_weights: tuple[str, Served],
                                                          body: bytes, capsys: pytest.CaptureFixture):
    base, served = served_weights
    folder = tmp_path / "weights"
    assert download_command.main(["YOLOv8n.pt", "--weights-dir", str(folder), "--allow-http"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["yolov8n.pt"]  # no .part left behind
    assert (folder / "yolov8n.pt").read_bytes() == body and served.requests == [("yolov8n.pt", None)]
    out = capsys.readouterr().out
    assert "AGPL-3.0" in out and "never imports Ultralytics" in out
    assert f"fetching {base}/yolov8n.pt" in out and "loads: YOLOv8n, 80 classes, 355 tensors" in out
    assert resolve_weights("yolov8n.pt", weights_dir=folder) == folder / "yolov8n.pt"
    assert download_command.main(["yolov8n", "--weights-dir", str(folder), "--allow-http"]) == 0  # again: checked, not fetched
    assert len(served.requests) == 1 and "already in" in capsys.readouterr().out


def test_a_cut_transfer_leaves_only_the_part_file_and_the_next_run_resumes_it(
        tmp_path: Path, served_weights: tuple[str, Served], body: bytes):
    _, served = served_weights
    served.cut_first = True
    folder = tmp_path / "weights"
    with pytest.raises(DownloadError, match="run the command again to resume"):
        download_weights("yolov8n", weights_dir=folder, attempts=1, **OPTIONS)
    # Written atomically: the real name appears only once the whole file is there.
    assert sorted(p.name for p in folder.iterdir()) == ["yolov8n.pt.part"]
    half = (folder / "yolov8n.pt.part").stat().st_size
    assert 0 < half < len(body)
    assert download_weights("yolov8n", weights_dir=folder, **OPTIONS) == folder / "yolov8n.pt"
    assert served.requests == [("yolov8n.pt", None), ("yolov8n.pt", f"bytes={half}-")]
    assert (folder / "yolov8n.pt").read_bytes() == body and sorted(os.listdir(folder)) == ["yolov8n.pt"]


def test_a_file_of_another_size_is_refused_before_it_is_fetched(tmp_path: Path, served_weights: tuple[str, Served],
                                                                 body: bytes, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(PRETRAINED, "yolov8n", pinned(body, size=len(body) + 1))
    folder = tmp_path / "weights"
    with pytest.raises(DownloadError) as error:
        download_weights("yolov8n", weights_dir=folder, **OPTIONS)
    message = str(error.value)
    assert "\n" not in message and f"announces {len(body)} bytes, expected {len(body) + 1}" in message
    assert not any(folder.iterdir())


class _Exploit:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.mark.parametrize("kind", ["junk", "hostile", "yolov8s"])
def test_a_file_that_does_not_load_as_the_expected_weights_is_deleted(kind: str, tmp_path: Path,
                                                                     served_weights: tuple[str, Served],
                                                                     monkeypatch: pytest.MonkeyPatch):
    _, served = served_weights
    if kind == "junk":
        content = b"\0" * 1000
    elif kind == "hostile":
        content = tmp_path / "hostile.pt"
        torch.save({"model": _Exploit(), "ema": None}, content)
        content = content.read_bytes()
    else:
        content = yolov8_lookalike_bytes("s")
    serve_pinned("yolov8n", content, served, monkeypatch)
    folder = tmp_path / "weights"
    expected = {"junk": "does not load", "hostile": "refuses to load global", "yolov8s": "holds YOLOv8s weights"}[kind]
    with pytest.raises(DownloadError, match=expected) as error:
        download_weights("yolov8n", weights_dir=folder, **OPTIONS)
    assert "\n" not in str(error.value) and "deleted it" in str(error.value)
    assert not any(folder.iterdir())


def test_missing_catalogued_weights_name_the_download_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'yolov8n\.pt' not found .*; fetch it: python -m detector download "
                                                r"yolov8n --weights-dir ") as error:
        resolve_weights("yolov8n.pt", weights_dir=tmp_path / "weights")
    assert "\n" not in str(error.value)


def test_help_names_the_checks_and_the_http_flag(capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit):
        download_command.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "yolov8n" in out and "SHA-256" in out and "--allow-http" in out and "AGPL-3.0" in out


def test_a_file_of_the_right_size_but_another_sha256_is_deleted(tmp_path: Path, served_weights: tuple[str, Served],
                                                                 body: bytes, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(PRETRAINED, "yolov8n", pinned(body, sha256="f" * 64))
    folder = tmp_path / "weights"
    with pytest.raises(DownloadError, match=f"SHA-256 {hashlib.sha256(body).hexdigest()}, expected {'f' * 64}"):
        download_weights("yolov8n", weights_dir=folder, **OPTIONS)
    assert not any(folder.iterdir())


def test_every_catalogued_file_is_pinned_and_fetched_over_https():
    for weights in PRETRAINED.values():
        assert len(weights.sha256) == 64 and int(weights.sha256, 16) >= 0 and weights.size > 1_000_000
        assert weights.url.startswith("https://") and weights.url.endswith(f"/{weights.filename}")


def test_yolo11_and_yolo26_weights_are_pinned_where_ultralytics_publishes_them():
    """YOLO11: the files Ultralytics' Hugging Face repository holds at the pinned commit; YOLO26: Ultralytics' GitHub
    release assets, pinned by size and SHA-256 (no Hugging Face commit to pin)."""
    assert [(weights.scale, weights.url.split("/resolve/")[0]) for name, weights in PRETRAINED.items()
            if name.startswith("yolo11")] == [(f"11{letter}", "https://huggingface.co/Ultralytics/YOLO11")
                                             for letter in "nsmlx"]
    assert [(weights.scale, weights.url) for name, weights in PRETRAINED.items() if name.startswith("yolo26")] == [
        (f"26{letter}", f"https://github.com/ultralytics/assets/releases/download/v8.4.0/yolo26{letter}.pt")
        for letter in "nsmlx"]


@pytest.mark.parametrize(("name", "typed", "loads", "impostor", "refusal"), [
    ("yolo11n", "YOLO11n.pt", "YOLO11n, 80 classes, 499 tensors", lambda: yolov8_lookalike_bytes("n"), "YOLOv8n"),
    ("yolo26n", "yolo26n.pt", "YOLO26n, 80 classes, 708 tensors", lambda: lookalike_bytes("11n"), "YOLO11n"),
])
def test_yolo11_and_yolo26_weights_are_fetched_and_read_as_theirs(
    tmp_path: Path, server: tuple[str, Served], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    name: str, typed: str, loads: str, impostor: Callable[[], bytes], refusal: str,
):
    """``download yolo11n`` (any case) and ``yolo26n``: the pinned file, read as its family; the family before it served
    in its place (for YOLO26, YOLO11: the same layer types) is deleted, named for what it is."""
    base, served = server
    monkeypatch.setenv(transfer.BASE_URL_ENV, base)
    serve_pinned(name, lookalike_bytes(name.removeprefix("yolo")), served, monkeypatch)
    assert download_command.main([typed, "--weights-dir", str(tmp_path / "a"), "--allow-http"]) == 0
    assert f"(loads: {loads})" in capsys.readouterr().out
    serve_pinned(name, impostor(), served, monkeypatch)
    with pytest.raises(DownloadError, match=rf"holds {refusal} weights; deleted it"):
        download_weights(name, weights_dir=tmp_path / "b", **OPTIONS)
    assert not any((tmp_path / "b").iterdir())


def test_a_second_download_of_the_same_weights_stops_at_once(tmp_path: Path, served_weights: tuple[str, Served]):
    _, served = served_weights
    folder = tmp_path / "weights"
    folder.mkdir()
    with lock.exclusive(folder / "yolov8n.pt.lock"):  # what a first download holds while it runs
        with pytest.raises(DownloadError) as error:
            download_weights("yolov8n", weights_dir=folder, **OPTIONS)
    message = str(error.value)
    assert "\n" not in message
    assert f"another download of yolov8n.pt into {folder} is running (pid {os.getpid()})" in message
    assert served.requests == [] and not any(folder.iterdir())


@pytest.mark.parametrize("change", ["size", "sha256"])
def test_a_file_the_user_already_had_is_never_deleted(change: str, tmp_path: Path, served_weights: tuple[str, Served],
                                                      body: bytes, capsys: pytest.CaptureFixture):
    """A fine-tuned yolov8n.pt, say: the command used to delete it for not being the pinned release."""
    _, served = served_weights
    folder = tmp_path / "weights"
    folder.mkdir()
    theirs = body[:-1] if change == "size" else body[:-1] + bytes([body[-1] ^ 1])
    (folder / "yolov8n.pt").write_bytes(theirs)
    assert download_command.main(["yolov8n", "--weights-dir", str(folder), "--allow-http"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    expected = f"{len(theirs)} bytes, expected {len(body)}" if change == "size" else "SHA-256"
    assert str(folder / "yolov8n.pt") in lines[0] and expected in lines[0]
    assert "left it as it is: move it away" in lines[0] and "deleted" not in lines[0]
    assert (folder / "yolov8n.pt").read_bytes() == theirs and served.requests == []
    assert sorted(p.name for p in folder.iterdir()) == ["yolov8n.pt"]


def test_suggested_commands_quote_a_weights_folder_with_spaces(tmp_path: Path, served_weights: tuple[str, Served],
                                                               capsys: pytest.CaptureFixture):
    folder = tmp_path / "my weights"
    with pytest.raises(FileNotFoundError) as error:
        resolve_weights("yolov8n.pt", weights_dir=folder)
    assert str(error.value).endswith(f"python -m detector download yolov8n --weights-dir '{folder}'")
    download_weights("yolov8n", weights_dir=folder, **OPTIONS)
    assert f"python -m detector train --weights '{folder / 'yolov8n.pt'}' --data" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "hint"), [
    ("yolov8n.yaml", "a .yaml names an architecture, not weights: --model n ... x"),  # was: "obtain the file by hand"
    ("yolo11n.yaml", "a .yaml names an architecture, not weights: --model n ... x, 11n ... 11x or 26n ... 26x"),
    ("yolo26n.yaml", "a .yaml names an architecture, not weights: --model n ... x, 11n ... 11x or 26n ... 26x"),
    ("yolo26n-seg.yaml", "YOLO26 segmentation is not built here: only YOLOv8, YOLO11 and YOLO26 detection are "
                         "(--model n ... x, 11n ... 11x, 26n ... 26x)"),
    ("yolov8n-p2.yaml", "YOLOv8 with a P2 head is not built here"),
])
def test_an_architecture_yaml_given_as_weights_says_what_to_do(tmp_path: Path, name: str, hint: str) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        resolve_weights(name, weights_dir=tmp_path)
    assert hint in str(missing.value) and "by hand" not in str(missing.value)
