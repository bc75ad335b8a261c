"""The Ultralytics alias table (detector/aliases.py): conversions, notes, refusals, and the docs that list it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from detector.aliases import TABLES, translate
from detector.training.config import TrainConfig
from detector.workflows.options import BenchmarkOptions, ExportOptions, PredictOptions, ValOptions

OPTIONS = {"train": TrainConfig, "val": ValOptions, "predict": PredictOptions, "export": ExportOptions,
           "benchmark": BenchmarkOptions}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def quiet(command: str, values: dict) -> tuple[dict, list[str]]:
    notes: list[str] = []
    return translate(command, values, note=notes.append), notes


def test_our_own_names_pass_through_silently() -> None:
    values = {"epochs": 3, "lr0": 0.02, "model": "s", "cache": "ram", "device": "cpu", "multi_scale": False}
    assert quiet("train", values) == (values, [])


@pytest.mark.parametrize("command,given,expected", [
    ("train", {"amp": True}, {"precision": "auto"}),
    ("train", {"amp": "bf16"}, {"precision": "bf16"}),
    ("train", {"model": "yolov8x"}, {"weights": "yolov8x.pt", "model": "x"}),
    ("train", {"model": "weights/yolov8l.pt"}, {"weights": "weights/yolov8l.pt", "model": "l"}),
    ("train", {"model": "yolov8n.yaml"}, {"model": "n"}),
    ("train", {"model": "yolo11n"}, {"weights": "yolo11n.pt", "model": "11n"}),  # these were "YOLO11 is not built"
    ("train", {"model": "weights/YOLO11m.pt"}, {"weights": "weights/YOLO11m.pt", "model": "11m"}),
    ("train", {"model": "yolo11x.yaml"}, {"model": "11x"}),
    ("val", {"model": "yolo11s"}, {"weights": "yolo11s.pt"}),
    ("train", {"model": "yolo26n"}, {"weights": "yolo26n.pt", "model": "26n"}),  # these were "YOLO26 is not built"
    ("train", {"model": "weights/YOLO26l.pt"}, {"weights": "weights/YOLO26l.pt", "model": "26l"}),
    ("train", {"model": "yolo26x.yaml"}, {"model": "26x"}),
    ("train", {"model": "26S"}, {"model": "26s"}),
    ("val", {"model": "yolo26m"}, {"weights": "yolo26m.pt"}),
    ("train", {"cache": False}, {"cache": "none"}),
    ("train", {"multi_scale": 0.0}, {"multi_scale": False}),
    ("train", {"resume": True}, {"resume": "auto"}),
    ("train", {"device": 1}, {"device": "cuda:1"}),
    ("train", {"device": -1}, {"device": ""}),  # Ultralytics' "an idle GPU, else the CPU", not cuda:-1
    ("val", {"device": "-1"}, {"device": ""}),
    ("val", {"model": "yolov8n"}, {"weights": "yolov8n.pt"}),
    ("predict", {"model": "best.onnx"}, {"weights": "best.onnx"}),
    ("val", {"nms": False}, {"end_to_end": True}),  # Ultralytics' "NMS-free head if available": YOLO26's
    ("predict", {"nms": "False"}, {"end_to_end": True}),
    ("export", {"nms": False}, {"end_to_end": True}),
])
def test_conversions(command: str, given: dict, expected: dict) -> None:
    converted, notes = quiet(command, given)
    assert converted == expected and len(notes) == 1 and notes[0].startswith("note: Ultralytics' ")


def test_unset_and_harmless_values_ask_for_nothing() -> None:
    assert quiet("predict", {"embed": None, "show_boxes": None}) == ({}, [])  # Ultralytics' "unset"
    converted, notes = quiet("train", {"deterministic": True, "profile": False, "exist_ok": True})
    assert converted == {} and len(notes) == 3 and all("changes nothing" in line for line in notes)
    # deterministic=False is what runs do here (it was refused): accepted with the same note
    assert quiet("train", {"deterministic": False})[0] == {}
    with pytest.raises(TypeError, match="profile=0 has no equivalent"):  # 0 is not False: a bool is expected
        quiet("train", {"profile": 0})


@pytest.mark.parametrize("value", [True, False])
def test_rect_is_ours_in_train_and_val(value: bool) -> None:
    """Ultralytics' rect=True trains in rectangular batches here too (--rect); val's rect is its --rect, as it was:
    both spelled the same, so they pass through without a note."""
    assert quiet("train", {"rect": value}) == ({"rect": value}, [])
    assert quiet("val", {"rect": value}) == ({"rect": value}, [])
    with pytest.raises(TypeError, match=r"^predict: Ultralytics' show=True has no equivalent here: save annotated"):
        quiet("predict", {"show": True})


def test_every_alias_lands_on_a_real_field() -> None:
    """What an alias converts to must be a flag of its command (a renamed field would fail here)."""
    samples = {"amp": False, "model": "yolov8n.pt", "cache": True, "multi_scale": 0.5, "resume": True, "device": 0,
               "half": True, "val": False, "imgsz": [320, 320], "optimizer": "adam", "batch": 8, "nms": False}
    for command, table in TABLES.items():
        known = {item.name for item in fields(OPTIONS[command])}
        for name, alias in table.items():
            if alias.means is not None:
                converted = alias.means(samples.get(name, 1.0))
                assert set(converted) <= known, (command, name, converted)


def test_nms_true_or_unset_asks_for_nothing_outside_export() -> None:
    """Ultralytics' default ``nms=None`` (and ``True`` for val and predict) is NMS after the usual head: ours too.
    On export ``nms=True`` is our own flag (NMS in the graph)."""
    assert quiet("val", {"nms": None}) == ({}, [])
    converted, notes = quiet("predict", {"nms": True})
    assert converted == {} and notes == ["note: Ultralytics' nms=True changes nothing here"]
    assert quiet("export", {"nms": True}) == ({"nms": True}, [])  # NMS in the graph: our name too, silently
    with pytest.raises(ValueError, match="^val: nms='sometimes': expected True or False"):
        quiet("val", {"nms": "sometimes"})


def test_val_false_evaluates_the_last_epoch_alone_and_val_true_asks_for_nothing() -> None:
    assert quiet("train", {"val": False})[0] == {"val_interval": 0}
    converted, notes = quiet("train", {"val": True})
    assert converted == {} and notes == ["note: Ultralytics' val=True changes nothing here"]
    assert quiet("train", {"fraction": 0.1})[0] == {"fraction": 0.1}  # our name too


def test_the_training_docs_list_every_alias() -> None:
    text = DOCS.read_text().split("## Coming from Ultralytics", 1)[1]
    missing = sorted({name for table in TABLES.values() for name in table if f"`{name}" not in text})
    assert not missing, f"docs/training.md 'Coming from Ultralytics' does not mention: {missing}"


def test_resume_true_beside_a_weights_file_resumes_it() -> None:
    """Ultralytics' documented ``model=.../last.pt resume=True``, from Python as from the command line."""
    converted, notes = quiet("train", {"model": "runs/train/x/weights/last.pt", "resume": True})
    assert converted == {"resume": "runs/train/x/weights/last.pt"}
    assert notes == ["note: Ultralytics' resume=True beside weights 'runs/train/x/weights/last.pt' resumes that "
                     "file: resume='runs/train/x/weights/last.pt' here"]
    assert quiet("train", {"weights": "a.pt", "resume": "true"})[0] == {"resume": "a.pt"}
    assert quiet("train", {"weights": "a.pt", "resume": False})[0] == {"weights": "a.pt", "resume": ""}
    with pytest.raises(TypeError, match=r"^train: resume='a/last.pt' and weights='b.pt' name different files"):
        quiet("train", {"resume": "a/last.pt", "weights": "b.pt"})


@pytest.mark.parametrize(("model", "family"), [("yolo12n.yaml", "YOLO12"), ("yolo12n", "YOLO12"),
                                               ("yolo26n-seg.yaml", "YOLO26 segmentation"),
                                               ("yolo26s-pose", "YOLO26 pose"),
                                               ("yolo26m-obb.yaml", "YOLO26 oriented-box"),
                                               ("yolo26l-cls", "YOLO26 classification"),
                                               ("yolo11n-seg.yaml", "YOLO11 segmentation"),
                                               ("yolov8n-p2.yaml", "YOLOv8 with a P2 head"),
                                               ("yolov8n-seg.yaml", "YOLOv8 segmentation")])
def test_a_model_name_of_another_architecture_says_it_is_not_built(model: str, family: str) -> None:
    said = (rf"^train: model={model!r}: {family} is not built here, only YOLOv8, YOLO11 and YOLO26 detection: "
            r"expected a model \(n \.\.\. x, 11n \.\.\. 11x, 26n \.\.\. 26x\)")
    with pytest.raises(ValueError, match=said):
        quiet("train", {"model": model})


def test_a_model_name_reads_in_any_case() -> None:
    assert quiet("train", {"model": "N"})[0] == {"model": "n"}
    assert quiet("train", {"model": "11S"})[0] == {"model": "11s"}


def test_pretrained_false_is_refused_only_beside_weights() -> None:
    assert quiet("train", {"pretrained": False, "model": "s"})[0] == {"model": "s"}
    with pytest.raises(TypeError, match=r"^train: Ultralytics' pretrained=False beside weights='yolov8n.pt'"):
        quiet("train", {"pretrained": False, "model": "yolov8n"})


def test_single_cls_trains_one_class_and_val_names_how_a_one_class_model_is_scored() -> None:
    """train takes single_cls as its own setting; val's answer says a one-class model is scored as one class."""
    assert quiet("train", {"single_cls": True}) == ({"single_cls": True}, [])
    with pytest.raises(TypeError, match="a one-class model .* is scored as one class on its own"):
        quiet("val", {"single_cls": True})


def test_benchmark_takes_ultralytics_arguments(capsys) -> None:
    """``yolo benchmark model=best.onnx imgsz=128 half=True data=coco8.yaml`` was refused as unrecognized."""
    from detector.cli.benchmark import build_parser
    from detector.cli.flags import parse_command

    args = parse_command(build_parser(), BenchmarkOptions, "benchmark",
                         ["model=best.onnx", "imgsz=128", "half=True", "data=coco8.yaml", "--runs", "3"])
    assert (str(args.weights), args.imgsz, args.runs) == ("best.onnx", 128, 3)
    notes = capsys.readouterr().err
    assert "model='best.onnx' is weights='best.onnx'" in notes and "half=True has no equivalent here and changes " \
        "nothing: every backend is timed" in notes and "data='coco8.yaml' changes nothing here" in notes
    with pytest.raises(SystemExit):
        parse_command(build_parser(), BenchmarkOptions, "benchmark", ["model=best.onnx", "int8=True"])
    assert "int8=True has no equivalent here: FP32 and FP16 only" in capsys.readouterr().err


def test_train_takes_ultralytics_yolo11_names_on_the_command_line(capsys) -> None:
    """``detector train model=yolo11n.yaml`` trains YOLO11n from scratch, ``--model yolo11n.pt`` from the file."""
    from detector.cli.train import parse_args

    assert (parse_args(["model=yolo11n.yaml"]).model, parse_args(["model=yolo11n.yaml"]).weights) == ("11n", "")
    args = parse_args(["--model", "yolo11n.pt"])
    assert (args.model, args.weights) == ("11n", "yolo11n.pt")
    assert "model='yolo11n.pt' is weights='yolo11n.pt' model='11n' here" in capsys.readouterr().err


def test_train_takes_ultralytics_yolo26_names_on_the_command_line(capsys) -> None:
    """``detector train model=yolo26n.yaml`` trains YOLO26n from scratch, ``--model yolo26s.pt`` from the file."""
    from detector.cli.train import parse_args

    assert (parse_args(["model=yolo26n.yaml"]).model, parse_args(["model=yolo26n.yaml"]).weights) == ("26n", "")
    args = parse_args(["--model", "yolo26s.pt"])
    assert (args.model, args.weights) == ("26s", "yolo26s.pt")
    assert "model='yolo26s.pt' is weights='yolo26s.pt' model='26s' here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["model=yolo26n-seg.yaml"])
    assert "YOLO26 segmentation is not built here" in capsys.readouterr().err
