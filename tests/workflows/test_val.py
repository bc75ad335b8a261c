"""The val workflow's helpers (the command end to end: tests/cli/test_val.py)."""

from __future__ import annotations

import pytest

from detector.workflows.val import resolve_image_size


def test_image_size_resolution() -> None:
    assert resolve_image_size(None, {"imgsz": 320}) == 320
    assert resolve_image_size(None, None) == 640
    with pytest.raises(ValueError, match=r"must be a positive multiple of 32 \(got 100\); try 96"):
        resolve_image_size(100, {"imgsz": 320})  # refused, as training refuses it


def test_half_runs_the_prepared_backend_and_refuses_fp32(checkpoint, yolo_yaml, tmp_path, capsys) -> None:
    from detector.inference.torch_backend import half_precision
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val

    common = {"weights": checkpoint, "data": yolo_yaml, "workers": 0, "batch": 2, "device": "cpu", "plots": False,
              "project": tmp_path}
    metrics = run_val(ValOptions(**common, half=True))
    assert 0.0 <= metrics["mAP50-95"] <= 1.0
    assert f"cpu {half_precision('cpu').upper()} (--half: weights converted, no autocast)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--half and --fp32"):
        run_val(ValOptions(**common, half=True, fp32=True))


def test_rect_batches_where_the_model_takes_any_shape(checkpoint, onnx_fp32, yolo_yaml, tmp_path, capsys) -> None:
    """PyTorch weights validate in rectangular batches unless --no-rect; a fixed-shape export always in squares."""
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val

    common = {"data": yolo_yaml, "workers": 0, "batch": 2, "device": "cpu", "plots": False, "project": tmp_path}
    headers = []
    for weights, rect in ((checkpoint, True), (checkpoint, False), (onnx_fp32, True)):
        run_val(ValOptions(weights=weights, rect=rect, **common))
        headers.append(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("val: ")))
    assert ["(rect batches)" in header for header in headers] == [True, False, False]
