"""Where run_export writes: beside the checkpoint, or the current folder for a bare name from the weights folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.weights import locate
from tests.conftest import MODEL_IMGSZ, lively_model, write_checkpoint


@pytest.fixture
def weights_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A weights folder holding yolov8n.pt (a checkpoint of ours under that name), and an empty current folder."""
    folder = tmp_path / "weights"
    folder.mkdir()
    write_checkpoint(lively_model(), folder / "yolov8n.pt")
    monkeypatch.setattr(locate, "default_weights_dir", lambda: folder)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    return folder


def test_a_bare_name_from_the_weights_folder_exports_into_the_current_folder(
        weights_folder: Path, capsys: pytest.CaptureFixture) -> None:
    """As Ultralytics writes beside the .pt it loaded (for a bare name, here): it went into the weights folder."""
    pytest.importorskip("onnx", reason="ONNX export needs the 'export' extra")
    from detector.workflows.export import run_export
    from detector.workflows.options import ExportOptions

    written = run_export(ExportOptions(weights=Path("yolov8n.pt"), imgsz=MODEL_IMGSZ, device="cpu", no_check=True))
    here = Path.cwd() / "yolov8n.onnx"
    assert written == [here] and here.is_file()
    assert sorted(p.name for p in weights_folder.iterdir()) == ["yolov8n.pt"]  # no export, no staging folder left
    assert f"export: wrote {here}" in capsys.readouterr().out.splitlines()


def test_a_path_given_exports_beside_the_file(weights_folder: Path) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs the 'export' extra")
    from detector.workflows.export import run_export
    from detector.workflows.options import ExportOptions

    weights = weights_folder / "yolov8n.pt"
    written = run_export(ExportOptions(weights=weights, imgsz=MODEL_IMGSZ, device="cpu", no_check=True))
    assert written == [weights_folder / "yolov8n.onnx"] and list(Path.cwd().iterdir()) == []


def test_a_model_loaded_by_a_bare_name_exports_into_the_current_folder_too(weights_folder: Path) -> None:
    """detector.export(weights=detector.load("yolov8n.pt")) went into the weights folder (the loaded model carried
    the resolved path), where export(weights="yolov8n.pt") writes into the current folder."""
    pytest.importorskip("onnx", reason="ONNX export needs the 'export' extra")
    import detector

    model = detector.load("yolov8n.pt", device="cpu")
    written = detector.export(weights=model, imgsz=MODEL_IMGSZ, device="cpu", no_check=True)
    assert [Path(path) for path in written] == [Path.cwd() / "yolov8n.onnx"]
    assert sorted(p.name for p in weights_folder.iterdir()) == ["yolov8n.pt"]
