"""train.py's flags: the Ultralytics spellings (``--val-period``, ``key=value`` arguments, ``--model yolov8n.pt``)
fill the same config fields as ours, each saying once what our name is."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.cli.flags import options_from_args, parse_command
from detector.cli.train import build_parser
from detector.training.config import TrainConfig


def parse(argv: list[str]) -> TrainConfig:
    return options_from_args(TrainConfig, parse_command(build_parser(), TrainConfig, "train", argv))


def test_val_period_is_val_interval() -> None:
    parser = build_parser()
    assert parser.parse_args([]).val_interval == 1  # the alias leaves the config default alone
    assert parser.parse_args(["--val-period", "5"]).val_interval == 5
    assert parser.parse_args(["--val-interval", "3"]).val_interval == 3
    assert parser.parse_args(["--img", "416"]).imgsz == 416


def test_key_value_arguments_are_flags(capsys: pytest.CaptureFixture) -> None:
    config = parse(["data=coco128.yaml", "epochs=3", "imgsz=320", "--batch", "8", "lr0=0.02", "name=run=1",
                    "plots=False", "channels_last=false", "time=1.5", "cutmix=0.5", "perspective=0.0005", "bgr=0.05"])
    assert (config.data, config.epochs, config.imgsz, config.batch, config.lr0) == ("coco128.yaml", 3, 320, 8, 0.02)
    assert config.cutmix == 0.5 and parse(["--cutmix", "0.25"]).cutmix == 0.25  # Ultralytics' cutmix, the same name
    assert config.perspective == 0.0005 and parse(["--perspective", "0.001"]).perspective == 0.001  # and perspective
    assert config.bgr == 0.05 and parse(["--bgr", "0.5"]).bgr == 0.5  # and bgr: no longer refused
    assert config.name == "run=1" and config.plots is False and config.channels_last is False and config.time == "1.5"
    assert capsys.readouterr().err == ""  # our own names: nothing to say
    assert parse(["--name", "a=b"]).name == "a=b"  # a flag's value is never read as key=value


def test_rect_is_ultralytics_rect(capsys: pytest.CaptureFixture) -> None:
    """``rect=True`` (it was refused) is --rect: the same name, said nothing about; --no-rect spells the default."""
    assert parse(["rect=True"]).rect is True and parse(["--rect"]).rect is True and parse(["rect"]).rect is True
    assert parse([]).rect is False and parse(["--no-rect"]).rect is False and parse(["rect=False"]).rect is False
    assert capsys.readouterr().err == ""


def test_ultralytics_names_say_once_what_ours_are(capsys: pytest.CaptureFixture) -> None:
    config = parse(["amp=False", "cos_lr=True", "nbs=32", "box=5", "cls=1.0", "dfl=2", "cache=True", "device=cpu",
                    "multi_scale=0.25", "copy_paste=0.0", "resume=False"])
    assert (config.precision, config.cosine, config.nominal_batch) == ("fp32", True, 32)
    assert (config.box_gain, config.cls_gain, config.dfl_gain, config.cache) == (5.0, 1.0, 2.0, "ram")
    assert (config.multi_scale, config.multi_scale_min, config.multi_scale_max) == (True, 0.75, 1.25)
    notes = capsys.readouterr().err.splitlines()
    assert "note: Ultralytics' amp=False is precision='fp32' here" in notes
    assert "note: Ultralytics' cos_lr=True is cosine=True here" in notes
    assert "note: Ultralytics' nbs=32 is nominal_batch=32 here" in notes
    assert any(line.startswith("note: Ultralytics' copy_paste=0.0 has no equivalent here and changes nothing")
               for line in notes)
    assert "note: Ultralytics' resume=False is resume='' here" in notes
    assert len(notes) == 10  # one line per alias whose name or value differs from ours (device=cpu does not)


def test_model_as_a_weights_file_means_weights_with_its_scale(capsys: pytest.CaptureFixture) -> None:
    for argv in (["--model", "yolov8s.pt"], ["--model=yolov8s.pt"], ["model=yolov8s.pt"], ["model=yolov8s"]):
        config = parse(argv)
        assert (config.weights, config.model) == ("yolov8s.pt", "s"), argv
    assert "note: Ultralytics' model='yolov8s.pt' is weights='yolov8s.pt' model='s' here" in capsys.readouterr().err
    assert (parse(["model=yolov8m.yaml"]).model, parse(["model=yolov8m.yaml"]).weights) == ("m", "")  # from scratch
    assert (parse(["--model", "runs/x/best.pt"]).weights, parse(["--model", "l"]).model) == ("runs/x/best.pt", "l")


@pytest.mark.parametrize("argv,message", [
    (["dropout=0.2"], "train.py: error: Ultralytics' dropout=0.2 has no equivalent here: classification only"),
    (["amp=maybe"], "train.py: error: amp='maybe': expected True or False"),
    (["device=0,1"], "train.py: error: device='0,1': one device per process here; for several GPUs launch with"),
    (["epoch=3"], "unknown argument epoch=3; did you mean epochs?"),
    (["cos_lr=True", "cosine=False"], "train.py: error: cos_lr and cosine both set cosine (True vs False); give one"),
    (["plots=maybe"], "plots=maybe: expected True or False"),
])
def test_what_cannot_be_done_answers_in_one_line(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]



@pytest.mark.parametrize("argv,epochs", [
    (["data=X", "imgsz=160", "epochs=1", "--epochs", "2"], 2),
    (["--epochs", "2", "epochs=1"], 1),
    (["epochs=1", "--epochs", "2", "epochs=3", "--batch", "4"], 3),
    (["epochs=1", "epochs=4"], 4),
])
def test_the_later_argument_wins_whatever_its_form(argv: list[str], epochs: int) -> None:
    """key=value arguments were parsed after every flag, so ``epochs=1 --epochs 2`` trained 1 epoch silently."""
    assert parse(argv).epochs == epochs


def test_a_later_alias_beats_an_earlier_flag() -> None:
    assert parse(["--precision", "bf16", "amp=False"]).precision == "fp32"
    assert parse(["amp=False", "--precision", "bf16"]).precision == "bf16"


def test_an_alias_overridden_by_a_later_flag_says_so(capsys: pytest.CaptureFixture) -> None:
    """The note of an alias a later flag overrode must not contradict the run: amp=False --precision bf16 is BF16."""
    assert parse(["amp=False", "--precision", "bf16"]).precision == "bf16"
    assert capsys.readouterr().err.splitlines() == [
        "note: Ultralytics' amp=False is precision='fp32' here; overridden by the later --precision bf16"]
    config = parse(["multi_scale=0.25", "--no-multi-scale", "cos_lr=True", "--cosine"])
    assert config.multi_scale is False and config.multi_scale_min == 0.75
    notes = capsys.readouterr().err.splitlines()
    assert notes[0].endswith("; multi_scale overridden by the later --no-multi-scale")
    assert notes[1] == "note: Ultralytics' cos_lr=True is cosine=True here; overridden by the later --cosine"
    parse(["--precision", "bf16", "amp=False"])  # the alias is the later one: its note stands as is
    assert capsys.readouterr().err.splitlines() == ["note: Ultralytics' amp=False is precision='fp32' here"]


@pytest.mark.parametrize("argv", [
    ["model=runs/train/x/weights/last.pt", "resume=True"],
    ["resume=True", "model=runs/train/x/weights/last.pt"],
    ["--model", "runs/train/x/weights/last.pt", "resume=True"],
    ["resume=True", "--weights", "runs/train/x/weights/last.pt"],
    ["--resume", "runs/train/x/weights/last.pt", "model=runs/train/x/weights/last.pt"],
    ["--resume", "runs/train/x/weights/last.pt", "--weights", "./runs/train/x/weights/last.pt"],
    ["resume", "model=runs/train/x/weights/last.pt"],  # Ultralytics' documented `yolo train resume model=...`
])
def test_resume_true_beside_a_weights_file_resumes_that_file(argv: list[str]) -> None:
    config = parse(argv)
    assert (config.resume, config.weights) == ("runs/train/x/weights/last.pt", "")


def test_resume_true_alone_is_the_newest_run_and_auto_stays_auto() -> None:
    assert (parse(["resume=True"]).resume, parse(["resume=True"]).weights) == ("auto", "")
    assert parse(["resume"]).resume == parse(["--resume"]).resume == "auto"  # were "unrecognized", "expected one"
    assert parse(["--resume", "--epochs", "3"]).resume == "auto"
    assert parse(["cosine"]).cosine is True  # any switch alone is on, as Ultralytics reads it
    with pytest.raises(SystemExit):  # a value's name alone is no switch: argparse names the mistake
        parse(["epochs", "3"])
    config = parse(["--resume", "auto", "--weights", "x.pt"])  # explicit: load_resume warns that x.pt is ignored
    assert (config.resume, config.weights) == ("auto", "x.pt")


def test_pretrained_false_without_weights_is_from_scratch(capsys: pytest.CaptureFixture) -> None:
    config = parse(["model=yolov8n.yaml", "pretrained=False"])
    assert (config.model, config.weights) == ("n", "")
    assert "trains from scratch" in capsys.readouterr().err
    assert parse(["model=yolov8s.pt", "pretrained=True"]).weights == "yolov8s.pt"  # as before: a note, no change


@pytest.mark.parametrize("argv,message", [
    (["--resume", "a/last.pt", "--weights", "b/last.pt"], "resume='a/last.pt' and weights='b/last.pt' name "
                                                          "different files"),
    (["resume=a/last.pt", "model=b.pt"], "resume='a/last.pt' and weights='b.pt' name different files"),
    (["model=a/last.pt", "resume=True", "--weights", "b.pt"], "resume='a/last.pt' and weights='b.pt'"),
    (["model=yolov8n.pt", "pretrained=False"], "pretrained=False beside weights='yolov8n.pt': that file's weights "
                                               "would be loaded all the same"),
    (["pretrained=False", "--weights", "x.pt"], "pretrained=False beside weights='x.pt'"),
    (["pretrained=x.pt"], "Ultralytics' pretrained='x.pt' has no equivalent here: start from weights with --weights"),
])
def test_conflicting_weights_and_refused_names_answer_in_one_line(argv: list[str], message: str,
                                                                  capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # no note first about an argument the error then refuses
    assert exit_info.value.code == 2 and message in lines[0] and lines[0].startswith("train.py: error: ")


def test_model_flag_with_an_edited_yaml_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--model PATH reads the file: an edited architecture is a usage error, not a standard YOLOv8 under its name."""
    from tests.test_architecture import YOLOV8_YAML

    path = tmp_path / "yolov8s.yaml"
    path.write_text(YOLOV8_YAML.replace("[-1, 1, SPPF, [1024, 5]]", "[-1, 1, SPPF, [1024, 9]]"))
    with pytest.raises(SystemExit) as exit_info:
        parse(["--model", str(path)])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.count(str(path)) == 1, line  # the alias names the file; the architecture check does not again
    assert f"model={str(path)!r}: a custom architecture (layer 9 differs); only the standard YOLOv8, YOLO11 and " \
           "YOLO26 n/s/m/l/x are built here" in line
    path.write_text(YOLOV8_YAML)
    assert parse(["--model", str(path)]).model == "s"
