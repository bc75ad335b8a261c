"""The val workflow's helpers (the command end to end: tests/cli/test_val.py)."""

from __future__ import annotations

import pytest
import torch

from detector.precision import Precision
from detector.workflows.val import resolve_image_size, trained_in


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


def test_without_data_a_checkpoint_is_scored_on_the_dataset_it_trained_on(model, yolo_yaml, onnx_fp32, tmp_path,
                                                                         capsys) -> None:
    """As Ultralytics' ``val`` without ``data=``: the training run's --data, said in a line; an export or a
    checkpoint that names none is asked for it in one line."""
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val
    from tests.conftest import write_checkpoint

    trained = write_checkpoint(model, tmp_path / "trained.pt")
    payload = torch.load(trained, weights_only=False)
    payload["config"]["data"] = str(yolo_yaml)
    torch.save(payload, trained)
    common = {"workers": 0, "batch": 2, "device": "cpu", "plots": False, "project": tmp_path}
    with_data = run_val(ValOptions(weights=trained, data=yolo_yaml, **common))
    capsys.readouterr()
    assert run_val(ValOptions(weights=trained, **common)) == with_data
    assert f"val: --data {yolo_yaml}, the dataset trained.pt trained on" in capsys.readouterr().out
    bare = write_checkpoint(model, tmp_path / "bare.pt")  # its config has no data
    with pytest.raises(ValueError, match=r"bare\.pt is a checkpoint that names no dataset: give"):
        run_val(ValOptions(weights=bare, **common))
    with pytest.raises(ValueError, match=r"\.onnx is an export: give the dataset to score with --data$"):
        run_val(ValOptions(weights=onnx_fp32, **common))
    with pytest.raises(ValueError, match=r"missing\.onnx: weights not found$"):
        run_val(ValOptions(weights=tmp_path / "missing.onnx", **common))


def test_a_one_class_model_is_scored_as_one_class_on_a_dataset_of_several(yolo_yaml, tmp_path, capsys) -> None:
    """A --single-cls checkpoint against its (3-class) data YAML: every box counts as its one class, with a note;
    it was "3 classes but ... was trained for 1"."""
    from detector.checkpoint import load_checkpoint, save_checkpoint
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val
    from tests.conftest import lively_model, write_checkpoint

    path = write_checkpoint(lively_model(num_classes=1), tmp_path / "one.pt")
    save_checkpoint({**load_checkpoint(path), "names": ["item"]}, path)
    metrics = run_val(ValOptions(weights=path, data=yolo_yaml, workers=0, batch=2, device="cpu", plots=False,
                                 project=tmp_path, conf=0.001))
    out = capsys.readouterr().out
    assert "has one class: every box of" in out and "3 classes counts as it" in out
    assert "\nitem " in out and 0.0 <= metrics["mAP50-95"] <= 1.0


def test_a_model_trained_on_some_classes_is_scored_on_them(yolo_yaml, tmp_path, capsys) -> None:
    """A checkpoint of train --classes 0 2 scores those classes' boxes alone, as its training validated: the other
    class has no ground truth (its AP undefined, left out of the mean) instead of boxes it was never taught."""
    from detector.checkpoint import load_checkpoint, save_checkpoint
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val
    from tests.conftest import lively_model, write_checkpoint

    path = write_checkpoint(lively_model(), tmp_path / "some.pt")
    checkpoint = load_checkpoint(path)
    save_checkpoint({**checkpoint, "config": {**checkpoint["config"], "classes": [0, 2]}}, path)
    run_val(ValOptions(weights=path, data=yolo_yaml, workers=0, batch=2, device="cpu", plots=False, project=tmp_path))
    out = capsys.readouterr().out
    assert "trained on classes 0 2 alone: only their boxes are scored" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.split()[:1] in (["circle"], ["square"], ["triangle"])}
    assert rows["square"][1:] == ["0", "-", "-", "-", "-"]  # no instance of class 1 scored
    assert int(rows["circle"][1]) > 0 and int(rows["triangle"][1]) > 0


def test_the_runtime_line_names_a_training_precision_other_than_its_own() -> None:
    # val's default (auto: BF16 on a CPU with native BF16) scored an --unamp run without saying it trained in FP32
    bf16 = Precision("bf16", "cpu", "auto")
    assert trained_in({"precision": "fp32"}, bf16) == "; trained in FP32"
    assert trained_in({"precision": "bf16"}, bf16) == "" and trained_in({}, bf16) == ""


def test_augment_on_an_export_with_nms_inside_is_refused_before_any_note(onnx_fp32, yolo_yaml, tmp_path, capsys,
                                                                         monkeypatch) -> None:
    """The refusal alone: the NMS-inside note talks about a pass that will not run."""
    import dataclasses

    import detector.workflows.val as val_workflow
    from detector.inference import load_backend
    from detector.postprocess import NMSConfig
    from detector.workflows.options import ValOptions
    from detector.workflows.val import run_val

    def with_nms_inside(*args, **kwargs):
        backend = load_backend(*args, **kwargs)
        backend.info = dataclasses.replace(backend.info, nms=NMSConfig(), dynamic=True)  # as an --nms --dynamic export
        return backend

    monkeypatch.setattr(val_workflow, "load_backend", with_nms_inside)
    with pytest.raises(ValueError, match=r"^--augment needs the boxes before NMS"):
        run_val(ValOptions(weights=onnx_fp32, data=yolo_yaml, augment=True, workers=0, device="cpu", plots=False,
                           project=tmp_path))
    assert "has NMS inside" not in capsys.readouterr().out
