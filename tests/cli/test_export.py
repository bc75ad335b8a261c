"""``export.py`` end to end: files appear only after a passing parity check; failures leave nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx", reason="export.py writes ONNX (the 'export' extra)")
pytest.importorskip("onnxruntime", reason="export.py checks parity with onnxruntime (the 'export' extra)")

from detector.cli.export import build_parser, main  # noqa: E402  (after the skips: it imports onnx)
from detector.data.synthetic import generate_shapes  # noqa: E402
from detector.exporting import read_onnx_info  # noqa: E402
from detector.inference.onnx_backend import OnnxBackend  # noqa: E402
from detector.inference.tensorrt_backend import tensorrt_missing  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
IMGSZ = 64  # the conftest checkpoint's training size


def leftovers(folder: Path) -> list[str]:
    """Everything in the weights folder but the checkpoint itself (staging folders, temp files, exports)."""
    return sorted(p.name for p in folder.iterdir() if p.name != "best.pt")


def test_help_shows_every_default() -> None:
    for action in build_parser()._actions:
        if action.dest != "help":
            assert "default" in action.help, action.dest


def test_newest_checkpoint_is_exported_at_fp16(
    run_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import detector.workflows.export as workflow
    from detector.precision import fp32_settings_kept

    monkeypatch.chdir(run_checkpoint.parents[4])  # the folder holding runs/
    # The parity check's reference is true FP32 on a GPU too (cuDNN's default, TF32, has 10 mantissa bits), and the
    # session's TF32 settings are put back after it (the flags exist and are set the same way without a GPU).
    seen, check_parity = [], workflow.check_parity
    monkeypatch.setattr(workflow, "check_parity", lambda *args, **kwargs: seen.append(
        (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)) or check_parity(*args, **kwargs))
    with fp32_settings_kept():  # this session's own settings back after the test
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        assert main(["--half", "--device", "cpu"]) == 0
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert seen == [(False, False)]
    out = capsys.readouterr().out
    assert "using the newest checkpoint runs/train/exp/weights/best.pt" in out
    assert "parity onnxruntime fp16 vs pytorch fp32" in out and "max box diff" in out
    assert leftovers(run_checkpoint.parent) == ["best.onnx"]
    info = read_onnx_info(run_checkpoint.with_suffix(".onnx"))
    assert info.precision == "fp16" and info.imgsz == IMGSZ and info.names == ["circle", "square", "triangle"]
    # An FP32 export of the same checkpoint takes the same name: the FP16 file goes, and the line says so.
    assert main(["--device", "cpu", "--no-check"]) == 0
    assert "best.onnx (replacing the earlier export there)" in capsys.readouterr().out
    assert read_onnx_info(run_checkpoint.with_suffix(".onnx")).precision == "fp32"


def test_failed_parity_exits_nonzero_and_writes_nothing(
    run_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = OnnxBackend.infer

    def perturbed(self: OnnxBackend, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        boxes, scores = original(self, images)
        return boxes, (scores + 0.2).clamp(max=1)  # what a broken export would look like

    monkeypatch.setattr(OnnxBackend, "infer", perturbed)
    assert main(["--weights", str(run_checkpoint), "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert "parity FAILED" in captured.out and "nothing was written" in captured.err
    assert leftovers(run_checkpoint.parent) == []


def test_map_check_on_a_dataset(run_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = generate_shapes(tmp_path / "data", train=1, val=4, size=IMGSZ)
    common = ["--weights", str(run_checkpoint), "--data", str(data), "--workers", "0", "--device", "cpu"]
    # An untrained model scores ~0 mAP either way; a negative margin demands a gain, so this must fail.
    assert main([*common, "--map-margin", "-1"]) == 1
    assert "mAP50-95 on 4 val images (NMS conf 0.001, IoU 0.7): pytorch fp32" in capsys.readouterr().out
    assert leftovers(run_checkpoint.parent) == []
    assert main(common) == 0
    assert leftovers(run_checkpoint.parent) == ["best.onnx"]


@pytest.mark.skipif(tensorrt_missing() is None, reason="TensorRT and a GPU are present")
def test_engine_without_tensorrt_is_one_line_error(run_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--weights", str(run_checkpoint), "--format", "onnx,engine", "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "TensorRT" in lines[0] and "nothing was written" in lines[0]
    assert captured.out == ""
    assert leftovers(run_checkpoint.parent) == []


def test_bad_format_and_size_are_rejected(run_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--weights", str(run_checkpoint), "--format", "tflite", "--device", "cpu"]) == 1
    assert main(["--weights", str(run_checkpoint), "--imgsz", "50", "--device", "cpu"]) == 1
    assert "multiple of 32" in capsys.readouterr().err
    assert leftovers(run_checkpoint.parent) == []


def test_torch_state_is_untouched_by_export(run_checkpoint: Path) -> None:
    """Export deep-copies: the FP16 cast must not leak into the default dtype or grad mode."""
    assert main(["--weights", str(run_checkpoint), "--half", "--no-check", "--device", "cpu"]) == 0
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
