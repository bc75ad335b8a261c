"""The Python API (detector/api.py): each verb on a tiny synthetic dataset, against the command it wraps."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import cv2
import PIL.Image

import numpy as np
import pytest
import torch

import detector.model

import detector.api
from detector import export, load, predict, train, tune, val
from detector.checkpoint import is_stripped, load_checkpoint
from detector.training.config import TrainConfig
from detector.workflows.options import ExportOptions, PredictOptions, TuneOptions, ValOptions
from detector.cli.predict import main as predict_main
from tests.conftest import write_yolo_dataset

TRAIN_FLAGS = dict(device="cpu", imgsz=64, epochs=1, batch=4, workers=0, cache="none", plots=False,
                   amp_check=False, close_mosaic=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One tiny training run through the API, shared by the tests below."""
    root = tmp_path_factory.mktemp("api")
    data = write_yolo_dataset(root / "data")
    summary = train(data=str(data), project=root / "runs", name="exp", **TRAIN_FLAGS)
    return {**summary, "data": data, "root": root}


def test_import_detector_stays_cheap():
    code = ("import sys, detector; from detector import train, val, predict, export, load; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_keywords_are_the_option_objects_fields():
    # Checked before any work: no model is loaded, no file is read.
    with pytest.raises(TypeError, match=r"^predict: unknown argument 'max_dets'; known: .*\bmax_det\b"):
        predict("x.jpg", max_dets=5)
    with pytest.raises(TypeError, match=r"^predict: missing argument 'source' \(--source\)$"):
        predict(weights="x.pt")
    with pytest.raises(TypeError, match=r"^train: unknown argument 'epoch'; known: .*\bepochs\b"):
        train(epoch=3)
    with pytest.raises(ValueError, match=r"^train: model='z': expected a model \(n \.\.\. x, 11n \.\.\. 11x, 26n "
                                         r"\.\.\. 26x\), yolov8n"):
        train(model="z")  # a scale or Ultralytics' model= (detector/aliases.py)
    with pytest.raises(ValueError, match=r"^train: optimizer='Lion': choose one of auto, SGD, AdamW, Adam, "):
        train(optimizer="Lion")
    with pytest.raises(ValueError, match=r"^--conf: expected float, got 'high'$"):
        predict("x.jpg", conf="high")


def test_tune_checks_its_space_and_trains_settings_before_any_training(tmp_path: Path):
    with pytest.raises(ValueError, match=r"^space: optimizer: 'optimizer' is not a number train takes"):
        tune(data="x.yaml", space={"box": (1, 10), "optimizer": (0, 1)}, project=tmp_path)
    with pytest.raises(TypeError, match=r"^train: unknown argument 'epoch'; known: .*\bepochs\b"):
        tune(epoch=3, project=tmp_path)
    with pytest.raises(ValueError, match=r"^--iterations must be at least 1"):
        tune(iterations=0, project=tmp_path)
    assert not list(tmp_path.iterdir())


def test_train_returns_metrics_the_run_folder_and_a_stripped_best(run: dict):
    assert 0 <= run["metrics"]["mAP50-95"] <= 1 and run["epochs_done"] == 1 and not run["interrupted"]
    assert run["best"] == Path(run["run_dir"]) / "weights" / "best.pt" and is_stripped(load_checkpoint(run["best"]))


def test_val_returns_the_metrics(run: dict):
    metrics = val(weights=run["best"], data=run["data"], device="cpu", workers=0, plots=False,
                  project=run["root"] / "val")
    assert {"mAP50-95", "mAP50", "mAP75"} <= metrics.keys() and all(0 <= v <= 1 for v in metrics.values())
    with pytest.raises(ValueError, match="--split: invalid choice: 'bogus'"):
        val(weights=run["best"], data=run["data"], split="bogus")


def test_predict_and_a_loaded_model_give_the_commands_detections(run: dict, tmp_path: Path):
    images = Path(run["data"]).parent / "images" / "val"
    flags = dict(conf=0.001, device="cpu")
    results = predict(images, weights=run["best"], **flags)
    names = sorted(p.name for p in images.iterdir())
    assert [r["file"] for r in results] == names and sum(len(r["boxes"]) for r in results) > 0
    for result in results:
        assert result["boxes"].dtype == np.float32 and result["boxes"].shape == (len(result["scores"]), 4)
        assert result["scores"].dtype == np.float32 and result["labels"].dtype == np.int64
        assert len(result["names"]) == len(result["labels"])
    assert predict_main(["--source", str(images), "--weights", str(run["best"]), "--conf", "0.001", "--device", "cpu",
                         "--project", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "exp" / "predictions.json").read_text())
    for record, result in zip(records, results, strict=True):
        np.testing.assert_allclose(np.array(record["boxes"]).reshape(-1, 4), result["boxes"], atol=0.005 + 1e-4)
        assert record["labels"] == result["labels"].tolist()
    model = load(run["best"], device="cpu")
    assert model.names == ["circle", "square", "triangle"]
    for loaded, result in zip(model.predict(images, conf=0.001), results, strict=True):
        np.testing.assert_array_equal(loaded["boxes"], result["boxes"])  # same code, same weights: identical
        np.testing.assert_array_equal(loaded["scores"], result["scores"])
    called = model(images, conf=0.001)  # Ultralytics' model(source)
    assert [r["file"] for r in called] == names and all(
        np.array_equal(c["boxes"], r["boxes"]) for c, r in zip(called, results, strict=True))


def test_two_streams_on_one_loaded_model_keep_their_own_thresholds(run: dict):
    """Each stream reads with its own conf, read in turns: the thresholds were set on the shared model, so the stream
    started last decided both (the low-conf stream lost its boxes)."""
    images = Path(run["data"]).parent / "images" / "val"
    model = load(run["best"], device="cpu")
    low = model.predict(images, conf=0.001, stream=True)
    high = model.predict(images, conf=0.5, stream=True)
    expected_low, expected_high = model.predict(images, conf=0.001), model.predict(images, conf=0.5)
    for got_low, got_high, want_low, want_high in zip(low, high, expected_low, expected_high, strict=True):
        np.testing.assert_array_equal(got_low["scores"], want_low["scores"])
        np.testing.assert_array_equal(got_high["scores"], want_high["scores"])
    assert sum(len(r["scores"]) for r in expected_low) > sum(len(r["scores"]) for r in expected_high)


def test_a_loaded_cpu_models_predict_tunes_the_process_for_the_cpu_on_a_machine_with_a_gpu(run: dict, monkeypatch):
    """predict of a model loaded on the CPU used to tune the process for the default device, CUDA where a GPU is
    present, and so skip the CPU's heap setting (detector/tuning.py)."""
    import detector.workflows.predict as predict_workflow

    model = load(run["best"], device="cpu")
    tuned = []
    monkeypatch.setattr(predict_workflow, "tune_process", tuned.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only the device choice reads it here
    model.predict(Path(run["data"]).parent / "images" / "val", conf=0.5)
    assert tuned == [torch.device("cpu")]


def test_a_loaded_model_takes_half_at_load_and_refuses_it_at_predict(run: dict):
    """``model.predict(..., half=True)`` used to run the loaded FP32 model without a word."""
    from detector.inference.torch_backend import half_precision

    image = next((Path(run["data"]).parent / "images" / "val").iterdir())
    model = load(run["best"], device="cpu")
    for flags in ({"half": True}, {"device": "cpu"}):
        with pytest.raises(ValueError, match=r"chosen when it loads: detector.load\(weights, device=..., half=True\)"):
            model.predict(image, **flags)
    half = load(run["best"], device="cpu", half=True)
    assert half.backend.name == f"pytorch {half_precision('cpu')}" and len(half.predict(image)) == 1


def test_load_refuses_an_input_size_the_model_cannot_take_at_once(run: dict):
    """``load(weights, imgsz=100)`` was accepted and failed only at the first call, far from its cause."""
    with pytest.raises(ValueError, match="must be a multiple of 32; got 100"):
        load(run["best"], device="cpu", imgsz=100)
    assert load(run["best"], device="cpu", imgsz=96).backend is not None


def test_verbose_false_prints_nothing_and_changes_nothing_else(run: dict, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture):
    """Ultralytics' verbose=False, ours too for predict and val: no line per image, no table, no note; the
    same results, and val's table still in results.txt."""
    images = Path(run["data"]).parent / "images" / "val"
    flags = dict(weights=run["best"], device="cpu", conf=0.001)
    loud = predict(images, **flags)
    assert "images/frames at" in capsys.readouterr().out
    quiet = predict(images, verbose=False, **flags)
    assert [len(r["boxes"]) for r in quiet] == [len(r["boxes"]) for r in loud]
    metrics = val(weights=run["best"], data=run["data"], device="cpu", workers=0, plots=False, verbose=False,
                  project=tmp_path / "val")
    said = capsys.readouterr()
    assert said.out == "" and "note:" not in said.err
    assert "mAP50-95" in metrics and "AP50-95" in (tmp_path / "val" / "exp" / "results.txt").read_text()


def test_predict_writes_nothing_unless_asked(run: dict, tmp_path: Path):
    image = next((Path(run["data"]).parent / "images" / "val").iterdir())
    predict(image, weights=run["best"], device="cpu", project=tmp_path / "quiet")
    assert not (tmp_path / "quiet").exists()
    predict(image, weights=run["best"], device="cpu", project=tmp_path / "saved", save=True)
    assert sorted(p.name for p in (tmp_path / "saved" / "exp").iterdir()) == sorted([image.name, "predictions.json"])


def test_export_returns_the_checked_files(run: dict, tmp_path: Path):
    pytest.importorskip("onnx", reason="the 'export' extra")
    pytest.importorskip("onnxruntime", reason="the 'export' extra")
    best = tmp_path / "best.pt"
    best.write_bytes(Path(run["best"]).read_bytes())
    assert export(weights=best, format="onnx", device="cpu") == [tmp_path / "best.onnx"]
    assert (tmp_path / "best.onnx").is_file()
    assert load(tmp_path / "best.onnx", device="cpu").names == ["circle", "square", "triangle"]


def test_a_stripped_best_starts_a_fine_tune_with_its_backbone_frozen(run: dict, capsys: pytest.CaptureFixture):
    summary = train(data=str(run["data"]), weights=str(run["best"]), project=run["root"] / "runs", name="tune",
                    freeze=10, **TRAIN_FLAGS)
    assert summary["epochs_done"] == 1
    out = capsys.readouterr().out
    assert f"tensors from {run['best']} (YOLOv8n)" in out and "freeze: YOLOv8 layers 0-9 (stem, " in out
    before, after = (load_checkpoint(path)["model"] for path in (run["best"], summary["best"]))
    backbone = ("stem.", "down2.", "stage2.", "down3.", "stage3.", "down4.", "stage4.", "down5.", "stage5.", "sppf.")
    parameters = {name for name, _ in detector.model.build_model(num_classes=3).named_parameters()}
    frozen = [key for key in parameters if key.startswith(backbone)]
    # Frozen weights never move, and the EMA's lerp of x towards x is x: best.pt holds them bit for bit.
    assert frozen and all(torch.equal(before[key], after[key]) for key in frozen)
    assert not torch.equal(before["head.cv3.0.2.weight"], after["head.cv3.0.2.weight"])  # the head trained


def test_the_verbs_stay_functions_after_every_subpackage_is_imported():
    # No subpackage is named like a verb: importing one sets it as an attribute of `detector`.
    import detector.exporting.onnx  # noqa: F401
    import detector.training.trainer  # noqa: F401

    assert detector.export is export and detector.train is train
    assert all(callable(getattr(detector, verb)) for verb in ("train", "val", "predict", "export", "load", "tune"))


# ------------------------------------------------------------------------------------ signatures an editor shows
VERBS = [(train, TrainConfig), (val, ValOptions), (predict, PredictOptions), (export, ExportOptions),
         (tune, TuneOptions)]
# Where a verb's parameter may differ from its field, and why: val's required weights/data are None-defaulted so
# that Ultralytics' model= can stand for weights (the option object still requires them); predict's source is the
# first positional parameter and takes arrays, images and lists as well as text.
REQUIRED_BUT_NONE_HERE = {("val", "weights"), ("val", "data")}


def members(hint: object) -> set:
    """``str | Path | None`` -> {str, Path, NoneType}; ``tuple[int, ...]`` -> {tuple[int, ...]}."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return set(typing.get_args(hint))
    return {hint}


@pytest.mark.parametrize("verb,options_class", VERBS, ids=[verb.__name__ for verb, _ in VERBS])
def test_the_verbs_parameters_are_the_option_classes_fields(verb, options_class) -> None:
    """Names, order, defaults and types: the API cannot drift from the command's single source of truth."""
    signature = inspect.signature(verb)
    namespace = {**vars(detector.api), "np": np, "Image": PIL.Image}
    hints = typing.get_type_hints(verb, globalns=namespace)
    field_hints = typing.get_type_hints(options_class)
    parameters = [p for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY and p.name != "stream"]
    fields = [f for f in dataclasses.fields(options_class) if not (verb is predict and f.name == "source")]
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields):
        where = f"{verb.__name__}({parameter.name})"
        if field.default is dataclasses.MISSING:
            assert (verb.__name__, field.name) in REQUIRED_BUT_NONE_HERE and parameter.default is None, where
        else:
            assert parameter.default == field.default and type(parameter.default) is type(field.default), where
        # The annotation admits at least what the field takes (it may add Path where the field is text, or
        # Ultralytics' spellings such as cache=True).
        assert members(field_hints[field.name]) <= members(hints[parameter.name]), where
    assert list(signature.parameters.values())[-1].kind is inspect.Parameter.VAR_KEYWORD  # Ultralytics' names
    assert verb.__doc__ and len(verb.__doc__.split()) > 20


def test_predict_takes_its_source_first_and_a_stream_switch() -> None:
    parameters = inspect.signature(predict).parameters
    assert list(parameters)[0] == "source" and parameters["stream"].default is False
    hints = typing.get_type_hints(predict, globalns={**vars(detector.api), "np": np, "Image": PIL.Image})
    assert {str, Path, int, np.ndarray, PIL.Image.Image, list} <= members(hints["source"])


# ------------------------------------------------------------------------------------- Ultralytics' names
def test_ultralytics_names_become_the_config_and_say_so(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    seen = []
    monkeypatch.setattr("detector.training.trainer.train", lambda config: seen.append(config) or {"run_dir": "r"})
    train(model="yolov8s.pt", amp=False, cos_lr=True, nbs=32, box=5.0, cls=1.0, dfl=2.0, lr0=0.02, epochs=3)
    config = seen[0]
    assert (config.weights, config.model, config.precision, config.cosine) == ("yolov8s.pt", "s", "fp32", True)
    assert (config.nominal_batch, config.box_gain, config.cls_gain, config.dfl_gain) == (32, 5.0, 1.0, 2.0)
    assert (config.lr0, config.epochs) == (0.02, 3)  # the same name here: no note
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 7 and "note: Ultralytics' amp=False is precision='fp32' here" in notes
    with pytest.raises(TypeError, match=r"^train: cosine and cos_lr both set cosine \(True vs False\)"):
        train(cosine=True, cos_lr=False)
    with pytest.raises(TypeError, match=r"^train: Ultralytics' copy_paste=0.5 has no equivalent here: segmentation"):
        train(copy_paste=0.5)
    with pytest.raises(TypeError, match=r"^val: missing argument 'weights'"):
        val(data="coco128.yaml")


def test_predict_takes_ultralytics_weights_directly(run: dict, tmp_path: Path, capsys: pytest.CaptureFixture):
    from tests.weights.lookalike import yolov8_lookalike_bytes

    weights = tmp_path / "yolov8n.pt"
    weights.write_bytes(yolov8_lookalike_bytes("n", num_classes=3, seed=1))
    images = Path(run["data"]).parent / "images" / "val"
    results = predict(images, model=str(weights), device="cpu", conf=0.001)  # Ultralytics' model= for weights
    assert len(results) == len(list(images.iterdir())) and results[0]["names"] is not None
    captured = capsys.readouterr()
    assert "Ultralytics YOLOv8n weights (3 classes)" in captured.out and "is weights=" in captured.err
    assert load(weights, device="cpu").names == ["class0", "class1", "class2"]


# ------------------------------------------------------------------------------------------- predict sources
def test_arrays_pil_images_and_lists_give_the_files_detections(run: dict):
    files = sorted((Path(run["data"]).parent / "images" / "val").iterdir())[:2]
    flags = dict(weights=run["best"], device="cpu", conf=0.001)
    from_files = [predict(file, **flags)[0] for file in files]
    from_arrays = predict([cv2.imread(str(file)) for file in files], **flags)  # BGR, as OpenCV reads
    from_pil = predict(PIL.Image.open(files[0]), **flags)
    assert [r["file"] for r in from_arrays] == ["image0.jpg", "image1.jpg"] and from_pil[0]["file"] == files[0].name
    for expected, got in zip(from_files, [*from_arrays, from_pil[0]]):  # the same pixels: the same detections
        np.testing.assert_array_equal(expected["boxes"], got["boxes"])
        np.testing.assert_array_equal(expected["scores"], got["scores"])
    np.testing.assert_array_equal(from_pil[0]["boxes"], from_files[0]["boxes"])


def test_stream_is_a_generator_with_the_lists_results(run: dict, tmp_path: Path):
    frames = [cv2.imread(str(p)) for p in sorted((Path(run["data"]).parent / "images" / "val").iterdir())]
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, frames[0].shape[1::-1])
    for frame in frames:
        writer.write(frame)
    writer.release()
    flags = dict(weights=run["best"], device="cpu", conf=0.001)
    listed = predict(video, **flags)
    streamed = predict(video, stream=True, **flags)
    assert isinstance(streamed, types.GeneratorType)
    count = 0
    for expected, got in zip(listed, streamed, strict=True):
        assert got["frame"] == expected["frame"] == count and got["image"].shape == frames[0].shape
        np.testing.assert_array_equal(expected["boxes"], got["boxes"])
        assert "image" not in expected  # the list keeps no frame's pixels
        count += 1
    assert count == len(frames)


def test_classes_and_save_txt(run: dict, tmp_path: Path):
    images = Path(run["data"]).parent / "images" / "val"
    flags = dict(weights=run["best"], device="cpu", conf=0.001)
    everything = predict(images, **flags)
    labels = np.concatenate([r["labels"] for r in everything])
    keep = int(np.bincount(labels).argmax())  # a class the one-epoch model finds (the filter's unit test: workflows)
    only = predict(images, classes=[keep], save_txt=True, save_conf=True, project=tmp_path, **flags)
    none = predict(images, classes=[c for c in range(3) if c not in labels.tolist()] or [99], **flags)
    assert sum(len(r["labels"]) for r in none) == 0
    for full, kept in zip(everything, only, strict=True):
        assert set(kept["labels"].tolist()) <= {keep}
        np.testing.assert_array_equal(kept["boxes"], full["boxes"][full["labels"] == keep])
        height, width = cv2.imread(str(images / full["file"])).shape[:2]
        lines = (tmp_path / "exp" / "labels" / f"{Path(full['file']).stem}.txt").read_text().splitlines()
        assert len(lines) == len(kept["labels"])
        for line, box, score in zip(lines, kept["boxes"], kept["scores"]):
            label, cx, cy, w, h, conf = line.split()
            assert label == str(keep) and float(conf) == pytest.approx(score, rel=1e-5)  # 6 significant digits
            x1, y1, x2, y2 = box.tolist()
            assert [float(cx), float(cy), float(w), float(h)] == pytest.approx(
                [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height], rel=1e-5)
    assert sum(len(r["labels"]) for r in only) > 0
