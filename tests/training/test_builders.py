"""detector/training/builders.py: ``--freeze N`` (which modules, and what training then does), the warm-up length and
what ``--weights`` says of a file it cannot read."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from detector.checkpoint import CheckpointError
from detector.inference.pt_model import model_from_pt
from detector.model import build_model
from detector.training.builders import (
    build_model_from_weights,
    build_optimization,
    build_run_model,
    freeze_layers,
    warmup_steps,
)
from detector.training.config import TrainConfig
from detector.training.optim import build_optimizer

BACKBONE = ("stem", "down2", "stage2", "down3", "stage3", "down4", "stage4", "down5", "stage5", "sppf")


def test_freeze_maps_yolov8_layer_numbers_onto_our_modules() -> None:
    lines: list[str] = []
    model = build_model(num_classes=3, scale="n")
    assert freeze_layers(model, 10, lines.append) == BACKBONE  # YOLOv8 layers 0-9: the backbone
    assert lines and lines[0].startswith("freeze: YOLOv8 layers 0-9 (stem, ")
    # 12 adds layer 10 (upsample, no parameters) and 11 (concat, none): the same modules
    assert freeze_layers(build_model(num_classes=3, scale="n"), 12, lines.append) == BACKBONE
    assert freeze_layers(build_model(num_classes=3, scale="n"), 13, lines.append)[-1] == "top_down4"
    everything_but_head = freeze_layers(build_model(num_classes=3, scale="n"), 22, lines.append)
    assert "head" not in everything_but_head and everything_but_head[-1] == "bottom_up5"
    assert freeze_layers(build_model(num_classes=3, scale="n"), 0, lines.append) == ()


def test_freeze_maps_yolo11_layer_numbers_onto_our_modules() -> None:
    """YOLO11 numbers its layers as its YAML does: C2PSA attention is layer 10 of the backbone, the head 23."""
    lines: list[str] = []
    assert freeze_layers(build_model(num_classes=3, scale="11n"), 11, lines.append) == (*BACKBONE, "psa")
    assert lines[0].startswith("freeze: YOLO11 layers 0-10 (stem, ") and lines[0].endswith(" parameters frozen")
    # 13 adds layer 11 (upsample) and 12 (concat), neither with parameters; 14 the first neck block
    assert freeze_layers(build_model(num_classes=3, scale="11n"), 13, lines.append) == (*BACKBONE, "psa")
    assert freeze_layers(build_model(num_classes=3, scale="11n"), 14, lines.append)[-1] == "top_down4"
    model = build_model(num_classes=3, scale="11n")
    everything_but_head = freeze_layers(model, 23, lines.append)
    assert everything_but_head[-1] == "bottom_up5" and "head" not in everything_but_head
    assert {name.split(".")[0] for name, p in model.named_parameters() if p.requires_grad} == {"head"}


def test_freeze_maps_yolo26_layer_numbers_as_yolo11s() -> None:
    """YOLO26 numbers its layers as YOLO11 (same types at the same indices); --freeze 23 leaves both head branches."""
    lines: list[str] = []
    assert freeze_layers(build_model(num_classes=3, scale="26n"), 11, lines.append) == (*BACKBONE, "psa")
    assert lines[0].startswith("freeze: YOLO26 layers 0-10 (stem, ")
    model = build_model(num_classes=3, scale="26n")
    assert freeze_layers(model, 23, lines.append)[-1] == "bottom_up5"
    trainable = {name.split(".")[1] for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"cv2", "cv3", "one2one_cv2", "one2one_cv3"}
    with pytest.raises(ValueError, match=r"^--freeze 24: YOLO26n numbers its layers 0-23"):
        freeze_layers(build_model(num_classes=3, scale="26n"), 24, lambda line: None)


def test_freeze_past_a_yolov8_head_is_refused_once_the_weights_decide_the_family(tmp_path: Path) -> None:
    """--freeze 23 passes the configuration beside --weights (a YOLO11 file's head is 23); a YOLOv8 model's is 22."""
    torch.save({}, tmp_path / "yolov8n.pt")
    TrainConfig(freeze=23, weights=str(tmp_path / "yolov8n.pt"), epochs=1, imgsz=64).validate()
    with pytest.raises(ValueError, match=r"^--freeze 23: YOLOv8n numbers its layers 0-22, its head 22; --freeze 22 "
                                         r"trains the head alone$"):
        freeze_layers(build_model(num_classes=3, scale="n"), 23, lambda line: None)


def test_frozen_parameters_leave_the_optimizer_and_keep_their_values() -> None:
    torch.manual_seed(0)
    model = build_model(num_classes=3, scale="n")
    freeze_layers(model, 10, lambda line: None)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if name.split(".")[0] in BACKBONE}
    assert frozen and not any(p.requires_grad for n, p in model.named_parameters() if n in frozen)
    choice = build_optimizer(model, name="AdamW", lr=0.01, momentum=0.9, weight_decay=5e-4, num_classes=3,
                             total_steps=10)
    in_optimizer = {id(p) for group in choice.optimizer.param_groups for p in group["params"]}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert in_optimizer == trainable and not in_optimizer & {id(p) for n, p in model.named_parameters() if n in frozen}
    stem_bn = model.stem.bn.running_mean.clone()
    head_before = model.head.cv2[0][0].conv.weight.detach().clone()
    model.train()
    for _ in range(2):
        choice.optimizer.zero_grad()
        sum(out.square().mean() for out in model(torch.rand(2, 3, 64, 64))).backward()
        choice.optimizer.step()
    for name, parameter in model.named_parameters():
        if name in frozen:
            torch.testing.assert_close(parameter, frozen[name], rtol=0, atol=0)  # not one bit moved
    assert not torch.equal(model.head.cv2[0][0].conv.weight, head_before)  # the rest trains
    # BatchNorm statistics of frozen layers follow the data, as in Ultralytics (the choice: builders.py)
    assert not torch.equal(model.stem.bn.running_mean, stem_bn)


@pytest.mark.parametrize(("count", "model", "weights", "most", "heads"), [
    (-1, "n", "", 22, "22 = all but the head"),
    (23, "n", "", 22, "22 = all but the head"),
    (24, "11n", "", 23, "23 = all but the head"),
    (24, "n", "any.pt", 23, "all but the head: 22 for YOLOv8, 23 for YOLO11 and YOLO26"),  # the file decides
])
def test_freeze_beyond_the_layers_is_refused(count: int, model: str, weights: str, most: int, heads: str,
                                             tmp_path: Path) -> None:
    if weights:
        weights = str(tmp_path / weights)
        torch.save({}, weights)  # the configuration checks that it is a torch file, not what it holds
    with pytest.raises(ValueError, match=rf"--freeze must be in \[0, {most}\] \({heads}; got {count}\)"):
        TrainConfig(freeze=count, model=model, weights=weights, epochs=1, imgsz=64).validate()
    TrainConfig(freeze=most, model=model, weights=weights, epochs=1, imgsz=64).validate()


@pytest.mark.parametrize("saved", [{}, {"val_rect": True}, {"val_rect": False}])
def test_a_resumed_run_validates_as_it_did_before_rect_batches_existed(saved, tmp_path) -> None:
    """A checkpoint without ``val_rect`` comes from a run that validated on square batches: it resumes so."""
    from detector.checkpoint import save_checkpoint
    from detector.training.builders import load_resume

    written = TrainConfig(data="shapes", project=str(tmp_path), epochs=3).to_dict()
    values = {key: value for key, value in written.items() if key != "val_rect"} | saved
    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": values}, path)
    resumed, resumed_path, _ = load_resume(TrainConfig(data="shapes", resume=str(path), device="cpu"))
    assert resumed_path == path and resumed.epochs == 3
    assert resumed.val_rect is saved.get("val_rect", False)


def test_resume_takes_a_run_folder_for_its_last_pt(tmp_path) -> None:
    """``--resume runs/train/exp`` (or its weights folder) resumes that run's last.pt; a folder without one is one
    line (it said "checkpoint not found" of a folder that exists)."""
    from detector.checkpoint import CheckpointError, save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data="shapes", project=str(tmp_path), epochs=3).to_dict()
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": config}, path)
    for folder in (tmp_path / "exp", path.parent):
        assert load_resume(TrainConfig(resume=str(folder), device="cpu"))[1] == path
    with pytest.raises(CheckpointError, match=r"/other: a folder without weights/last.pt; resume names a run folder"):
        (tmp_path / "other").mkdir()
        load_resume(TrainConfig(resume=str(tmp_path / "other")))


def test_a_run_whose_dataset_moved_resumes_on_the_data_given(tmp_path) -> None:
    """The run's data YAML is gone (the dataset moved): --resume alone says to give --data (it said only "data
    YAML not found"); with --data the run resumes on it, with one warning, as Ultralytics resumes then."""
    from detector.checkpoint import CheckpointError, save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data=str(tmp_path / "old" / "d.yaml"), project=str(tmp_path), epochs=3).to_dict()
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": config}, path)
    with pytest.raises(CheckpointError, match=r"old/d.yaml is gone; if the dataset moved, resume with --data NEW.yaml"):
        load_resume(TrainConfig(resume=str(path)))
    moved = str(tmp_path / "new" / "d.yaml")
    with pytest.warns(UserWarning, match=r"old/d.yaml is gone; resuming on .*new/d.yaml$"):
        resumed, _, _ = load_resume(TrainConfig(resume=str(path), data=moved), {"data": moved})
    assert resumed.data == moved and resumed.epochs == 3


def test_a_run_resumed_on_a_dataset_of_other_classes_says_so_in_one_line(tmp_path, yolo_yaml) -> None:
    """``--resume --data NEW.yaml`` with another number of classes ended in torch's size-mismatch traceback; other
    names were taken without a word."""
    from detector.checkpoint import CheckpointError, save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data=str(tmp_path / "gone.yaml"), project=str(tmp_path), epochs=3).to_dict()

    def resume_with(names: list[str]) -> TrainConfig:
        save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": config,
                         "names": names}, path)
        return load_resume(TrainConfig(resume=str(path), data=str(yolo_yaml)), {"data": str(yolo_yaml)})[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the data YAML is gone: said, and tested above
        with pytest.raises(CheckpointError, match=rf"its run trains 2 classes and .*data.yaml names 3; a resumed run "
                                                  rf"keeps its model: .* start a fine-tune: --weights {path}$"):
            resume_with(["circle", "square"])
    with pytest.warns(UserWarning, match=r"classes are named otherwise than the run's \(star -> triangle\)"):
        assert resume_with(["circle", "square", "star"]).data == str(yolo_yaml)


def test_a_damaged_last_pt_is_refused_before_it_trains(tmp_path) -> None:
    """torch.load does not check the zip's CRCs: a last.pt with flipped bits loaded, trained an epoch on NaN weights,
    then refused to save them, blaming the save."""
    from detector.checkpoint import CheckpointError, save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data="shapes", project=str(tmp_path), epochs=3).to_dict()
    state = {"model": {"w": torch.zeros(1 << 18)}, "ema": None, "optimizer": {"state": {}}, "epoch": 0,
             "config": config}
    save_checkpoint(state, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # inside the tensor's bytes: still loads
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["model"]["w"].isnan().any()
    with pytest.raises(CheckpointError, match=r"last.pt: damaged \(its part .*/data/0 does not match its checksum\)"):
        load_resume(TrainConfig(resume=str(path)))
    torch.save({**state, "model": {"w": torch.full((4,), float("inf"))}}, path)  # save_checkpoint would refuse
    with pytest.raises(CheckpointError, match=r"damaged \(its 'model' weights are not finite\)"):
        load_resume(TrainConfig(resume=str(path)))


def test_a_checkpoint_out_of_its_run_resumes_under_the_project_given(tmp_path) -> None:
    """The new run folder of a checkpoint out of its run's weights/ went under the project saved in it (another
    machine's path, perhaps), whatever --project said."""
    from detector.checkpoint import save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "Downloads" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data="shapes", project="/elsewhere/runs", epochs=3).to_dict()
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": config}, path)
    resumed, _, _ = load_resume(TrainConfig(resume=str(path), project=str(tmp_path / "new")))
    assert resumed.project == str(tmp_path / "new")


def test_a_resume_names_the_settings_it_ignores_in_one_warning(tmp_path) -> None:
    """``--resume --epochs 200`` used to go on for the run's own 3 epochs without a word."""
    from detector.checkpoint import save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    saved = TrainConfig(data="shapes", project=str(tmp_path), epochs=3, batch=8).to_dict()
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": saved}, path)

    def resume(**flags) -> tuple[TrainConfig, list[str]]:
        asked = TrainConfig(resume=str(path), **flags)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed, _, _ = load_resume(asked, asked.changed())
        return resumed, [str(warning.message) for warning in caught]

    resumed, messages = resume(epochs=200, unamp=True, device="cpu", workers=2)
    assert (resumed.epochs, resumed.unamp, resumed.device, resumed.workers) == (3, False, "cpu", 2)
    assert len(messages) == 1 and "ignored: epochs=200 (the run's: 3), unamp=True (the run's: False)." in messages[0]
    assert f"--weights {path}" in messages[0] and "device" not in messages[0] and "workers" not in messages[0]
    # The run's own command again (batch -1 saved the batch it chose), or nothing: no warning.
    assert resume(data="shapes", epochs=3, batch=-1)[1] == [] and resume()[1] == []


# Ultralytics 8.4's warm-up length (engine/trainer.py) for (epochs, batches an epoch), in a child: importing it
# patches this process for good (tests/test_loss_oracle.py).
ULTRALYTICS_WARMUP = """
import types
from ultralytics.engine.trainer import BaseTrainer
lengths = []
for epochs, nb in ((40, 13), (100, 8), (300, 1849)):
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(warmup_epochs=3.0), epochs=epochs)
    lengths.append(BaseTrainer._get_warmup_iterations(trainer, nb))
print(*lengths)  # the last line: Ultralytics may print its settings' notice before
"""


def test_the_100_step_floor_is_ours_ultralytics_8_4_has_none(tmp_path: Path) -> None:
    """docs/training.md "Optimizer and warm-up": Ultralytics up to 8.3 warmed up for at least 100 steps, 8.4 for
    ``round(min(warmup_epochs, epochs - 1) * nb)``; we keep the floor. BCCD-sized (13 batches, 40 epochs) and
    coco128-sized (8, 100) runs differ, a COCO-sized one (1849, 300) does not."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("ultralytics") is None:
        pytest.skip("ultralytics (the dev extra) is not installed")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", ULTRALYTICS_WARMUP], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [int(word) for word in result.stdout.splitlines()[-1].split()] == [39, 24, 5547]
    assert [warmup_steps(3.0, nb, epochs) for epochs, nb in ((40, 13), (100, 8), (300, 1849))] == [100, 100, 5547]


def test_the_warm_up_is_3_epochs_at_least_100_steps_and_never_more_than_a_quarter_of_the_run() -> None:
    assert warmup_steps(3.0, steps_per_epoch=64, epochs=100) == 192  # 3 epochs
    assert warmup_steps(3.0, steps_per_epoch=13, epochs=100) == 100  # BCCD at batch 16: the 100-step floor
    # 2 epochs of 64 steps: 192 asked, the run has 128; a quarter of it (the floor does not lift it back)
    assert warmup_steps(3.0, steps_per_epoch=64, epochs=2) == 32
    assert warmup_steps(3.0, steps_per_epoch=13, epochs=30) == 97  # 390 steps: just under the floor
    assert warmup_steps(3.0, steps_per_epoch=1, epochs=1) == 1  # at least one step, as the floor of 100 gave before
    assert warmup_steps(0.0, steps_per_epoch=64, epochs=2) == 0  # --warmup-epochs 0: none


def test_a_resumed_checkpoint_outside_a_runs_weights_folder_gets_a_run_folder_of_its_own(tmp_path, capsys) -> None:
    """``--resume ~/Downloads/last.pt`` made ``~`` the run folder (results.csv, config.yaml, weights/ there); a
    checkpoint in ``<run>/weights/`` still resumes into ``<run>``."""
    from detector.distributed import DistInfo
    from detector.training.builders import make_run_dir

    config = TrainConfig(project=str(tmp_path / "runs"), name="exp", epochs=1)
    inside = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    inside.parent.mkdir(parents=True)
    assert make_run_dir(config, DistInfo(), resumed=inside) == tmp_path / "runs" / "exp"
    loose = tmp_path / "Downloads" / "last.pt"
    assert make_run_dir(config, DistInfo(), resumed=loose) == tmp_path / "runs" / "exp2"
    assert not (tmp_path / "weights").exists() and "is not in a run's weights/ folder" in capsys.readouterr().out


def test_config_yaml_names_the_folder_claimed_and_holds_no_resume(tmp_path) -> None:
    """A run that landed in ``exp2`` (``exp`` taken) recorded ``name: exp``, and a resumed run ``resume: <its
    last.pt>``, so ``train.py cfg=config.yaml`` said its run had finished instead of starting it anew."""
    import yaml

    from detector.distributed import DistInfo
    from detector.training.builders import make_run_dir

    (tmp_path / "exp").mkdir()
    config = TrainConfig(project=str(tmp_path), name="exp", epochs=3)
    run_dir = make_run_dir(config, DistInfo(), resumed=None)
    assert run_dir == tmp_path / "exp2"
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (written["project"], written["name"], written["resume"], written["epochs"]) == (str(tmp_path), "exp2", "", 3)
    last = run_dir / "weights" / "last.pt"
    resumed = TrainConfig(project="elsewhere", name="exp", epochs=3, resume=str(last))  # as a resume's config is
    assert make_run_dir(resumed, DistInfo(), resumed=last) == run_dir
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (written["project"], written["name"], written["resume"]) == (str(tmp_path), "exp2", "")
    assert TrainConfig.from_dict(written).resume == ""


def test_a_run_whose_images_moved_but_yaml_stayed_resumes_on_the_data_given(tmp_path) -> None:
    """The YAML still there, its 'path' folder moved: --data NEW.yaml is taken (it was ignored, and the run could not
    go on without editing the old YAML); without it the error says to give it."""
    from detector.checkpoint import CheckpointError, save_checkpoint
    from detector.training.builders import load_resume
    from tests.conftest import write_yolo_dataset

    old = write_yolo_dataset(tmp_path / "old")
    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data=str(old), project=str(tmp_path), epochs=3).to_dict()
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": config}, path)
    new = write_yolo_dataset(tmp_path / "new")
    for child in old.parent.iterdir():  # the images and labels moved away; the YAML stayed
        if child.is_dir():
            child.rename(tmp_path / f"moved-{child.name}")
    with pytest.raises(CheckpointError, match=r"no longer loads \(.*\); if the dataset moved, resume with --data"):
        load_resume(TrainConfig(resume=str(path)))
    with pytest.warns(UserWarning, match=r"no longer loads .*; resuming on .*new"):
        resumed, _, _ = load_resume(TrainConfig(resume=str(path), data=str(new)), {"data": str(new)})
    assert resumed.data == str(new)


def test_resume_auto_takes_the_newest_run_that_did_not_finish(tmp_path) -> None:
    """A run finished since (its last.pt stripped) no longer hides an older interrupted one: it was taken, and the
    resume refused as "stripped"."""
    import os

    from detector.checkpoint import CheckpointError, save_checkpoint
    from detector.training.builders import load_resume

    config = TrainConfig(data="shapes", project=str(tmp_path), epochs=3).to_dict()
    for age, (name, payload) in enumerate([("finished", {"ema": None}), ("stopped", {"optimizer": {"state": {}}})]):
        path = tmp_path / name / "weights" / "last.pt"
        path.parent.mkdir(parents=True)
        save_checkpoint({"model": {}, "ema": None, "epoch": 0, "config": config, **payload}, path)
        os.utime(path, (2_000_000_000 - age, 2_000_000_000 - age))  # "finished" is the newer
    chosen = load_resume(TrainConfig(resume="auto", project=str(tmp_path)))[1]
    assert chosen == tmp_path / "stopped" / "weights" / "last.pt"
    (tmp_path / "stopped" / "weights" / "last.pt").unlink()
    with pytest.raises(CheckpointError, match="no last.pt to resume from \\(none of an unfinished run\\)"):
        load_resume(TrainConfig(resume="auto", project=str(tmp_path)))


def test_a_run_folder_is_trained_by_one_process_at_a_time(tmp_path) -> None:
    """Two resumes of one run at once wrote the same results.csv (rows 3, 3, 4, 4) and checkpoints: the second
    process stops with one line; a checkpoint write a killed run left half-done is removed on resume."""
    import subprocess
    import sys

    from detector.distributed import DistInfo
    from detector.training.builders import make_run_dir

    config = TrainConfig(project=str(tmp_path), name="exp", epochs=1)
    run_dir = make_run_dir(config, DistInfo(), resumed=None)  # this process holds exp's lock
    stale = run_dir / "weights" / ".last.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    script = ("import sys; from pathlib import Path; from detector.distributed import DistInfo; "
              "from detector.training.builders import make_run_dir; from detector.training.config import TrainConfig; "
              "make_run_dir(TrainConfig(epochs=1), DistInfo(), resumed=Path(sys.argv[1]))")
    other = subprocess.run([sys.executable, "-c", script, str(run_dir / "weights" / "last.pt")], capture_output=True,
                           text=True, timeout=120)
    assert other.returncode != 0 and f"another process (pid {os.getpid()}) is training this run now" in other.stderr
    assert stale.exists()  # the refused process touched nothing
    assert make_run_dir(config, DistInfo(), resumed=run_dir / "weights" / "last.pt") == run_dir  # this process: fine
    assert not stale.exists()


def test_a_killed_runs_loader_workers_do_not_keep_its_run_locked(tmp_path) -> None:
    """A flock belongs to the open file, which a fork shares: the loader workers of a trainer killed with SIGKILL
    outlive it by seconds, and held the run locked, so an immediate --resume was told another process was training
    it. Forked children drop their copies of the lock."""
    import signal
    import subprocess
    import sys

    trainer = ("import multiprocessing, os, sys, time; from detector.distributed import DistInfo; "
               "from detector.training.builders import make_run_dir; from detector.training.config import TrainConfig; "
               "make_run_dir(TrainConfig(project=sys.argv[1], name='exp', epochs=1), DistInfo(), resumed=None); "
               "worker = multiprocessing.get_context('fork').Process(target=time.sleep, args=(120,)); worker.start(); "
               "print(worker.pid, flush=True); os._exit(0)")  # dies as a killed trainer does; its worker lives on
    # Popen and one line read, not run(): the worker holds the pipe open after the trainer has gone
    with subprocess.Popen([sys.executable, "-c", trainer, str(tmp_path)], stdout=subprocess.PIPE, text=True) as started:
        worker = int(started.stdout.readline())
        started.wait(timeout=120)
    try:
        resume = ("import sys; from pathlib import Path; from detector.distributed import DistInfo; "
                  "from detector.training.builders import make_run_dir; "
                  "from detector.training.config import TrainConfig; "
                  "make_run_dir(TrainConfig(epochs=1), DistInfo(), resumed=Path(sys.argv[1]))")
        os.kill(worker, 0)  # still running: the case in question
        other = subprocess.run([sys.executable, "-c", resume, str(tmp_path / "exp" / "weights" / "last.pt")],
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr
    finally:
        os.kill(worker, signal.SIGKILL)


def test_a_resume_takes_what_does_not_change_the_weights_and_keeps_the_rest(tmp_path, capsys) -> None:
    """--patience, --save-period, --plots, --cache ... and --batch given with a resume are taken (Ultralytics lets a
    resume change them; here they were all ignored); --imgsz stays the run's, with the warning."""
    from detector.checkpoint import save_checkpoint
    from detector.training.builders import load_resume

    path = tmp_path / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    config = TrainConfig(data="shapes", project=str(tmp_path), epochs=3, batch=8).to_dict()
    save_checkpoint({"model": {}, "ema": None, "optimizer": {"state": {}}, "epoch": 0, "config": config}, path)
    asked = TrainConfig(resume=str(path), patience=5, save_period=2, plots=False, cache="disk", batch=4, imgsz=320)
    with pytest.warns(UserWarning, match=r"ignored: imgsz=320 \(the run's: 0\)\."):
        resumed, _, _ = load_resume(asked, asked.changed())
    assert (resumed.patience, resumed.save_period, resumed.plots, resumed.cache, resumed.batch) == (5, 2, False,
                                                                                                   "disk", 4)
    assert resumed.imgsz != 320
    printed = capsys.readouterr().out
    assert "note: the resumed run takes patience=5 (it had 100)" in printed
    assert "note: the resumed run takes batch=4 (it had 8)" in printed


def test_a_fine_tune_from_our_checkpoint_keeps_its_class_width_and_rows_by_name(tmp_path: Path) -> None:
    """Our 80-class nano (class branch 80 wide) fine-tuned on 3 classes: built 80 wide, so every tensor but the final
    class convs loads; "dog" starts from the file's "dog" row. Then the run's checkpoints say the width, so a resume
    (and val, export) builds it again: a default 3-class nano is 64 wide."""
    from detector.checkpoint import load_checkpoint, model_args, save_checkpoint

    torch.manual_seed(0)
    source = build_model(num_classes=80, scale="n")
    names = [f"class{index}" for index in range(80)]
    names[5] = "dog"
    path = tmp_path / "coco.pt"
    save_checkpoint({"model": source.state_dict(), "ema": None, "model_args": source.rebuild_args(), "names": names,
                     "config": {}}, path)
    lines: list[str] = []
    model = build_run_model(TrainConfig(weights=str(path)), ["cat", "DOG", "bird"], lines.append, None)
    assert model.head.class_channels == 80 and model.rebuild_args()["class_channels"] == 80
    assert "1 of 3 classes start from its class of the same name, 2 fresh" in lines[-1]
    assert f"/{len(model.state_dict())}" in lines[-1]
    state, incoming = model.state_dict(), source.state_dict()
    for key, tensor in state.items():
        if key.endswith((".2.weight", ".2.bias")) and key.startswith("head.cv3."):
            assert torch.equal(tensor[1], incoming[key][5]), key
        else:
            assert torch.equal(tensor, incoming[key]), key
    resumed = {"model": state, "model_args": model.rebuild_args()}
    again = build_run_model(TrainConfig(model="n"), ["cat", "dog", "bird"], lines.append, (resumed, path))
    again.load_state_dict(state)  # strict: the same shapes
    assert build_model(num_classes=3, scale="n").rebuild_args() == {"num_classes": 3, "scale": "n", "reg_max": 16}
    save_checkpoint({"model": state, "ema": None, "model_args": model.rebuild_args(), "names": ["a", "b", "c"],
                     "config": {}}, tmp_path / "tuned.pt")
    assert model_args(load_checkpoint(tmp_path / "tuned.pt"), "tuned.pt")["class_channels"] == 80


def test_a_fine_tune_from_our_yolo11_checkpoint_keeps_its_class_width(tmp_path: Path) -> None:
    """Our 80-class YOLO11n (class branch 80 wide): the width is read from the 1x1 conv after the branch's depthwise
    one (``head.cv3.0.0.1``; the depthwise conv keeps its input's 64), so a 3-class fine-tune builds it 80 wide."""
    from detector.checkpoint import save_checkpoint

    source = build_model(num_classes=80, scale="11n")
    path = tmp_path / "ours.pt"
    save_checkpoint({"model": source.state_dict(), "ema": None, "model_args": source.rebuild_args(),
                     "names": [f"class{index}" for index in range(80)], "config": {}}, path)
    lines: list[str] = []
    model = build_run_model(TrainConfig(weights=str(path)), ["a", "b", "c"], lines.append, None)
    assert (model.scale, model.head.class_channels) == ("11n", 80)
    assert f"{len(model.state_dict()) - 6}/{len(model.state_dict())} tensors" in lines[-1]  # all but the logits


def test_yolo11_weights_build_yolo11_whatever_model_was_asked(tmp_path: Path) -> None:
    """``--weights yolo11n.pt`` (``model=yolo11n.pt``) with the default ``--model n``: the file decides, and says so;
    the class branch keeps the file's width (80) and the rows of classes named alike."""
    from tests.weights.lookalike import lookalike_bytes

    path = tmp_path / "yolo11n.pt"
    path.write_bytes(lookalike_bytes("11n", num_classes=80))
    lines: list[str] = []
    model = build_model_from_weights(TrainConfig(weights=str(path), model="n"), ["class7", "zebra"], lines.append)
    assert (model.scale, model.num_classes, model.head.class_channels) == ("11n", 2, 80)
    assert lines[0] == ("weights: yolo11n.pt is YOLO11n; building it instead of --model n (YOLOv8n): the file "
                        "decides")
    assert lines[1].startswith(f"weights: loaded {len(model.state_dict())} tensors from {path} (YOLO11n, 80 classes); "
                               "1 of the model's 2 classes start from the weights' class of the same name, 1 fresh")
    quiet: list[str] = []
    assert build_model_from_weights(TrainConfig(weights=str(path), model="11n"), ["a"], quiet.append).scale == "11n"
    assert len(quiet) == 1  # asked for what the file is: no note


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


@pytest.mark.parametrize("content", ["code", "numpy"])
def test_train_weights_refused_by_both_readers_are_said_as_val_says_them(tmp_path: Path, monkeypatch, content: str):
    """train showed only the Ultralytics reader's reason: "refuses to load global 'posix.system'" where val gave the
    full sentence, and "not an Ultralytics checkpoint" for a NumPy pickle, hiding that ours had refused a global."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"{content}.pt"
    torch.save({"model": _Exploit() if content == "code" else np.zeros(3), "model_args": {"num_classes": 2}}, path)
    with pytest.raises(CheckpointError) as in_train:
        build_model_from_weights(TrainConfig(weights=str(path)), ["a", "b"], lambda line: None)
    with pytest.raises(CheckpointError) as in_val:
        model_from_pt(path)
    assert str(in_train.value) == str(in_val.value)
    assert str(in_train.value).startswith(f"{path}: refused: it names the Python global ")
    assert not (tmp_path / "pwned.txt").exists()


def test_each_ranks_seed_stays_in_numpys_range() -> None:
    """Rank r seeds with --seed + r: the largest valid --seed crashed rank 1 of a torchrun job with NumPy's 'Seed must
    be between 0 and 2**32 - 1'. Seeds wrap round instead."""
    import numpy as np

    from detector.training.builders import seed_everything

    seed_everything(2**32 - 1 + 1)  # rank 1 of --seed 4294967295
    after_wrap = np.random.rand()
    seed_everything(0)
    assert np.random.rand() == after_wrap


def test_auto_counts_the_optimizer_steps_the_run_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """BCCD at batch 16: 13 batches an epoch, accumulation 4, and every epoch ends with a step: 4 steps an epoch, as
    Ultralytics counts (ceil(205 / 64)). Counted as 13 * epochs // 4, a 2,600-epoch run was 8,450 steps and took
    AdamW, where it takes 10,400 and Ultralytics picks its long-run optimizer."""
    model = build_model(num_classes=3, scale="n")
    config = TrainConfig(data="unused.yaml", batch=16, optimizer="auto")
    choice, _ = build_optimization(config, model, steps_per_epoch=13, world_size=1, epochs=2600)
    assert choice.name == "SGD"
    choice, _ = build_optimization(config, model, steps_per_epoch=13, world_size=1, epochs=2500)  # 10,000 steps
    assert choice.name == "AdamW"
