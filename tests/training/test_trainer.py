import csv
import errno
import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

import detector
from detector.checkpoint import CheckpointError, load_checkpoint
from detector.cli.train import main as train_main
from detector.training.config import TrainConfig
from detector.training.time_account import PARTS
from detector.training.trainer import train


def _config(data: Path, project: Path, **overrides) -> TrainConfig:
    # device="cpu": the default '' means CUDA when one is visible, which would change what these tests test.
    values = dict(data=str(data), device="cpu", imgsz=64, epochs=2, batch=4, workers=0, cache="none", project=str(project),
                  name="run", plots=False, amp_check=False, close_mosaic=1, seed=0, warmup_epochs=0.5)
    values.update(overrides)
    return TrainConfig(**values)


def test_tiny_train_and_eval_end_to_end(yolo_yaml: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    summary = train(_config(yolo_yaml, Path("runs"), plots=True), progress=False)  # --project relative
    run_dir = summary["run_dir"]
    assert run_dir == tmp_path / "runs" / "run"  # absolute: it still names the run after the caller's chdir
    assert math.isfinite(summary["metrics"]["mAP50-95"]) and 0 <= summary["metrics"]["mAP50-95"] <= 1
    rows = list(csv.DictReader((run_dir / "results.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    for column in ("train/box", "mAP50-95", "precision", "images_per_s", "peak_mem_mb", "loss_scale_min", "skipped_steps"):
        assert rows[-1][column] != ""
    assert all(0 <= float(row["data_wait"]) <= 1 for row in rows)  # the share of each epoch spent waiting for data
    assert all(row["evaluator"].startswith("faster-coco-eval ") for row in rows)  # which library made each mAP
    # Ultralytics' val/box_loss...: each evaluated epoch's loss on the val split, beside the training losses.
    assert list(rows[0])[1:7] == ["train/box", "train/cls", "train/dfl", "val/box", "val/cls", "val/dfl"]
    assert all(math.isfinite(float(row[k])) and float(row[k]) > 0 for row in rows for k in ("val/box", "val/cls",
                                                                                            "val/dfl"))
    checkpoint = load_checkpoint(run_dir / "weights" / "last.pt")  # weights_only=True inside
    assert checkpoint["epoch"] == 1 and checkpoint["names"] == ["circle", "square", "triangle"]
    assert (run_dir / "weights" / "best.pt").is_file() and (run_dir / "predictions.json").is_file()
    # best.pt's fitness is its epoch's mAP50-95 as results.csv has it (4 decimals), and it names its rule.
    best = load_checkpoint(run_dir / "weights" / "best.pt")
    assert best["fitness_rule"] == "mAP50-95" == checkpoint["fitness_rule"]
    assert best["best_fitness"] == pytest.approx(float(rows[best["best_epoch"]]["mAP50-95"]), abs=5e-5)
    assert float(rows[best["best_epoch"]]["mAP50-95"]) == max(float(row["mAP50-95"]) for row in rows)
    # The run finished: best.pt and last.pt hold FP16 EMA weights and metadata, no optimizer; nano fits in 7 MB.
    for name in ("best.pt", "last.pt"):
        path = run_dir / "weights" / name
        stripped = load_checkpoint(path)
        assert "optimizer" not in stripped and "scaler" not in stripped and stripped["ema"] is None, name
        assert {"model_args", "names", "metrics", "config", "precision"} <= stripped.keys(), name
        assert stripped["versions"] == {"detector": detector.__version__, "torch": torch.__version__}, name  # who wrote it
        assert {t.dtype for t in stripped["model"].values() if t.is_floating_point()} == {torch.float16}, name
        assert path.stat().st_size <= 7e6, (name, path.stat().st_size)
    with pytest.raises(CheckpointError, match=r"last.pt: its run finished all 2 epochs, so it cannot be resumed; .* "
                                              r"--weights .*last.pt$"):
        train(_config(yolo_yaml, tmp_path, resume=str(run_dir / "weights" / "last.pt")), progress=False)
    with pytest.raises(CheckpointError, match=r"best.pt: it holds no optimizer state .* --weights .*best.pt$"):
        train(_config(yolo_yaml, tmp_path, resume=str(run_dir / "weights" / "best.pt")), progress=False)
    for name in ("labels", "train_batch0", "results", "PR_curve", "confusion_matrix", "val_batch0_pred"):
        assert (run_dir / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    printed = capsys.readouterr().out
    assert "AP50-95" in printed and "Average Precision" in printed  # per-class table + COCO summary
    assert "| COCO eval faster-coco-eval " in printed  # the run header names the evaluator
    assert "| augmentation in the workers |" in printed  # --pixel-augment auto on the CPU
    assert "): 1 input shape |" in printed  # 64 px: the default list is [64]; 8 images, batch 4: no partial batch
    # The time account: printed at the end, kept in the run folder, its parts summing to the wall clock (each
    # part is a difference of clock readings that telescopes: float round-off only, 1e-9 s for 6 terms).
    account = json.loads((run_dir / "time.json").read_text())["seconds"]
    assert summary["time_account"] == account and all(account[part] >= 0 for part in PARTS)
    assert sum(account[part] for part in PARTS) == pytest.approx(account["wall"], abs=1e-9)
    assert all(account[part] > 0 for part in ("start-up", "training", "validation", "checkpoints"))
    assert "time account (wall " in printed and "  checkpoints " in printed


def test_pixel_augment_on_the_device_trains_and_says_so(yolo_yaml: Path, tmp_path: Path, capsys):
    """Mosaic, affine, HSV, flips and the channel swap (--bgr 0.5) in the training step (what CUDA gets by default),
    here on the CPU; the plot and the AMP check see the batch with them applied (detector/training/step_input.py
    as_trained)."""
    summary = train(_config(yolo_yaml, tmp_path, epochs=1, close_mosaic=0, plots=True, amp_check=True,
                            pixel_augment="device", bgr=0.5), progress=False)
    rows = list(csv.DictReader((summary["run_dir"] / "results.csv").open()))
    assert all(math.isfinite(float(rows[-1][k])) for k in ("train/box", "train/cls", "train/dfl"))
    assert (summary["run_dir"] / "train_batch0.png").is_file()
    assert "| mosaic/affine/HSV/flips, channel swap 0.5 on the device |" in capsys.readouterr().out


def test_resume_matches_uninterrupted_run(yolo_yaml: Path, tmp_path: Path):
    from detector.training.trainer import Trainer

    sizes = dict(multi_scale_min=0.5, multi_scale_hold=1, close_mosaic=0)  # 32 or 64 px: resume replays them
    # Both runs finish (their last.pt stripped to FP16), so the weights are compared in memory, at full precision.
    full = Trainer(_config(yolo_yaml, tmp_path / "a", epochs=3, **sizes), progress=False)
    assert full.fit()["epochs_done"] == 3
    partial = train(_config(yolo_yaml, tmp_path / "b", epochs=3, **sizes), progress=False, stop_after_epochs=2)
    assert partial["epochs_done"] == 2
    last = str(partial["run_dir"] / "weights" / "last.pt")
    resumed = Trainer(_config(yolo_yaml, tmp_path / "c", epochs=3, **sizes, resume=last), progress=False)
    summary = resumed.fit()
    assert summary["run_dir"] == partial["run_dir"] and summary["epochs_done"] == 3 and not summary["interrupted"]
    for name, expected, actual in (("model", full.step.model, resumed.step.model),
                                   ("ema", full.step.ema.module, resumed.step.ema.module)):
        actual_state = actual.state_dict()
        for key, tensor in expected.state_dict().items():
            if tensor.is_floating_point():
                torch.testing.assert_close(actual_state[key], tensor, rtol=1e-4, atol=1e-5, msg=f"{name}.{key}")


def test_a_yolo11_run_resumes_and_its_weights_come_back_as_yolo11(yolo_yaml: Path, tmp_path: Path, capsys):
    """--model 11n end to end: the header names it, last.pt and best.pt keep its name, a resume rebuilds it (not
    YOLOv8n at the same letter), and the best weights load for inference as YOLO11 with their attention."""
    from detector.checkpoint import model_from_checkpoint

    partial = train(_config(yolo_yaml, tmp_path, model="11n"), progress=False, stop_after_epochs=1)
    last = partial["run_dir"] / "weights" / "last.pt"
    assert load_checkpoint(last)["model_args"]["scale"] == "11n"
    summary = train(_config(yolo_yaml, tmp_path, resume=str(last)), progress=False)  # --model left at its default
    assert summary["epochs_done"] == 2 and math.isfinite(summary["metrics"]["mAP50-95"])
    model, checkpoint = model_from_checkpoint(summary["run_dir"] / "weights" / "best.pt")
    assert checkpoint["model_args"]["scale"] == "11n" and model.family == "11" and model.psa is not None
    assert sum(p.numel() for p in model.parameters()) == 2_590_425  # YOLO11n at 3 classes (2,624,080 at 80)
    assert capsys.readouterr().out.count("detector: YOLO11n (2.59M params, 3 classes)") == 2


def test_a_yolo26_run_resumes_with_both_branches_and_its_weights_come_back_as_yolo26(yolo_yaml: Path, tmp_path: Path,
                                                                                     capsys):
    """--model 26n end to end: last.pt keeps its name and its reg_max 1, a resume rebuilds it with both head branches
    (their weights set by the epoch, not kept), and best.pt loads as YOLO26 evaluating its usual branch."""
    from detector.checkpoint import model_from_checkpoint

    partial = train(_config(yolo_yaml, tmp_path, model="26n"), progress=False, stop_after_epochs=1)
    last = partial["run_dir"] / "weights" / "last.pt"
    assert {k: load_checkpoint(last)["model_args"][k] for k in ("scale", "reg_max")} == {"scale": "26n", "reg_max": 1}
    summary = train(_config(yolo_yaml, tmp_path, resume=str(last)), progress=False)
    assert summary["epochs_done"] == 2 and math.isfinite(summary["metrics"]["mAP50-95"])
    model, checkpoint = model_from_checkpoint(summary["run_dir"] / "weights" / "best.pt")
    assert (model.family, model.reg_max, model.head.end_to_end, model.head.one_to_one) == ("26", 1, True, False)
    assert sum(p.numel() for p in model.parameters()) == 2_504_970  # YOLO26n at 3 classes (2,572,280 at 80)
    assert capsys.readouterr().out.count("detector: YOLO26n (2.50M params, 3 classes)") == 2


def test_the_loader_workers_change_nothing_in_the_weights(yolo_yaml: Path, tmp_path: Path):
    """docs/training.md, reproducibility: augmentation is keyed by seed, epoch and image, not by the worker that draws
    it, so --workers 0 and 2 train the same run bit for bit (mosaic on: close_mosaic=0)."""
    from detector.training.trainer import Trainer

    runs = [Trainer(_config(yolo_yaml, tmp_path / str(workers), epochs=1, workers=workers, close_mosaic=0),
                    progress=False) for workers in (0, 2)]
    for run in runs:
        run.fit()
    expected, actual = (run.step.model.state_dict() for run in runs)
    assert all(torch.equal(expected[key], actual[key]) for key in expected)


def test_more_workers_than_cores_are_capped_with_a_note(yolo_yaml: Path, tmp_path: Path, capsys):
    """Ultralytics' workers=8 (every args.yaml has it) on a machine of fewer cores: the run takes what the cores
    hold, says so, and its header names the number it runs."""
    from detector.data.workers import usable_cores
    from detector.training.trainer import Trainer

    cores = usable_cores()
    trainer = Trainer(_config(yolo_yaml, tmp_path, workers=cores + 3), progress=False)
    assert trainer.config.workers == cores
    said = f"{cores} core{'s' if cores != 1 else ''}"
    assert f"note: --workers {cores + 3} is more than the {said} each process may use here" in capsys.readouterr().out


def test_auto_workers_are_capped_at_the_cores_too_without_a_note(yolo_yaml: Path, tmp_path: Path, capsys,
                                                                  monkeypatch):
    """On one core, auto's 2 CPU workers would take turns with the model on it (and PyTorch warns)."""
    import detector.data.workers
    from detector.training.trainer import Trainer

    monkeypatch.setattr(detector.data.workers, "usable_cores", lambda: 1)
    trainer = Trainer(_config(yolo_yaml, tmp_path, workers=-1), progress=False)
    assert trainer.config.workers == 1 and "note: --workers" not in capsys.readouterr().out


def test_cls_pw_weights_the_run_s_classes_by_their_training_boxes(yolo_yaml: Path, tmp_path: Path, capsys):
    from detector.loss import frequency_weights
    from detector.training.trainer import Trainer

    trainer = Trainer(_config(yolo_yaml, tmp_path, cls_pw=0.5), progress=False)
    counts = trainer.train_data.records.class_counts(3)
    expected = frequency_weights(torch.from_numpy(counts), 0.5)
    assert counts.sum() == len(trainer.train_data.records.labels) and torch.equal(trainer.step.criterion.class_weights,
                                                                                  expected)
    assert "class weights (--cls-pw 0.5): circle " in capsys.readouterr().out
    assert Trainer(_config(yolo_yaml, tmp_path, name="off"), progress=False).step.criterion.class_weights is None


def test_cli_rejects_bad_values_with_exit_code_1(capsys):
    assert train_main(["--epochs", "-1", "--imgsz", "100"]) == 1
    message = capsys.readouterr().err
    assert "--epochs" in message and "multiple of 32" in message and message.count("\n") == 1


def test_cli_reports_missing_data_yaml(tmp_path: Path, capsys):
    assert train_main(["--data", str(tmp_path / "none.yaml"), "--project", str(tmp_path), "--device", "cpu"]) == 1
    assert "none.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--unamp", "--precision=fp32"])
def test_training_runs_in_fp32(flag, yolo_yaml: Path, tmp_path: Path):
    """And --unamp's TF32-off ends with its run: a later train() or val() in the same session gets the settings
    it had before (they used to stay strict for the rest of the process)."""
    from detector.precision import fp32_settings_kept

    with fp32_settings_kept():  # this session's own settings back after the test, whatever it finds
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        assert train_main(["--data", str(yolo_yaml), "--imgsz", "64", "--epochs", "1", "--batch", "4",
                           "--workers", "0", "--device", "cpu", "--project", str(tmp_path), "--no-plots",
                           "--no-amp-check", flag]) == 0
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    rows = list(csv.DictReader((tmp_path / "exp" / "results.csv").open()))
    assert rows[0]["precision"] == "fp32"


def test_ctrl_c_saves_last_checkpoint_and_exits_cleanly(yolo_yaml: Path, tmp_path: Path):
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, str(root / "train.py"), "--data", str(yolo_yaml), "--imgsz", "64", "--epochs", "200",
         "--batch", "4", "--workers", "0", "--cache", "none", "--no-plots", "--no-amp-check", "--device", "cpu",
         "--project", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = tmp_path / "exp" / "weights" / "last.pt"
    deadline = time.time() + 120
    try:
        while not last.exists() and time.time() < deadline and process.poll() is None:
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()  # no-op once it has exited; a hung run must not outlive the test
    assert process.returncode == 0, output[-2000:]
    assert "interrupted: saved" in output
    state = load_checkpoint(last)
    assert 0 <= state["epoch"] < 199


@pytest.mark.parametrize("sent", ["SIGINT", "SIGTERM", "SIGTERM to the group"])
def test_ctrl_c_to_the_process_group_of_a_run_with_workers_prints_one_line(yolo_yaml: Path, tmp_path: Path, sent: str):
    """A terminal's Ctrl-C reaches the whole foreground group: the trainer and its loader workers (train and
    validation). Only the trainer may act on it: one "Ctrl-C" line, last.pt saved, exit code 0 (issue 23). A
    SIGTERM to the trainer (``kill``, ``docker stop``, Kubernetes) is the same: it was exit 143, no line, nothing
    saved. So is a SIGTERM to the whole group, as torchrun sends it to each rank and SLURM to a job step: the workers
    died of it and the trainer stopped with "DataLoader worker exited unexpectedly", saving nothing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "output.txt"
    with log.open("w") as output:  # a file, not a pipe: a pipe nobody reads while waiting could fill and block
        process = subprocess.Popen(
            [sys.executable, str(root / "train.py"), "--data", str(yolo_yaml), "--imgsz", "64", "--epochs", "200",
             "--batch", "4", "--workers", "2", "--cache", "none", "--no-plots", "--no-amp-check", "--device", "cpu",
             "--project", str(tmp_path)],
            stdout=output, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    last = tmp_path / "exp" / "weights" / "last.pt"
    deadline = time.time() + 120
    try:
        # last.pt exists after the first epoch's validation: the validation loader's workers were forked after
        # the trainer installed its handler, the case that printed one line per worker.
        while not last.exists() and time.time() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert process.poll() is None, log.read_text()[-2000:]
        if sent == "SIGINT":
            os.killpg(process.pid, signal.SIGINT)  # as a terminal does: every process of the group
        elif sent == "SIGTERM":
            os.kill(process.pid, signal.SIGTERM)  # as kill, docker stop and Kubernetes do: the trainer alone
        else:
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # a hung run must not outlive the test
    printed = log.read_text()
    assert process.returncode == 0, printed[-2000:]
    assert printed.count("finishing this epoch") == 1, printed[-2000:]
    assert f"{'Ctrl-C' if sent == 'SIGINT' else 'SIGTERM'}: finishing this epoch" in printed
    assert "interrupted: saved" in printed
    assert 0 <= load_checkpoint(last)["epoch"] < 199


def test_time_budget_plans_before_the_first_step_and_the_lr_never_jumps(tmp_path: Path, monkeypatch, capsys):
    """``--time`` with loader workers: the plan is fitted from a timed probe before step 0 and re-fitted after
    every epoch without moving the next step's LR by more than the schedule's own slope (issue 23)."""
    import multiprocessing
    import time

    import detector.training.engine
    import detector.training.plans
    import detector.training.trainer
    from detector.training.trainer import Trainer
    from tests.conftest import write_yolo_dataset

    data = write_yolo_dataset(tmp_path / "data", train=48, val=4)  # batch 4: 12 steps per epoch
    real_set_learning_rates = detector.training.engine.set_learning_rates
    per_optimizer: dict[int, list[tuple[int, float]]] = {}

    def recording(optimizer, step, schedule):  # every step's weight LR, per optimizer (the probe has copies)
        values = real_set_learning_rates(optimizer, step, schedule)
        per_optimizer.setdefault(id(optimizer), []).append((step, values.weight_lr))
        return values

    monkeypatch.setattr(detector.training.engine, "set_learning_rates", recording)
    autotune_steps: list[int] = []  # cuDNN's autotuning is decided for the configured length, then the fitted one
    record_autotuning = lambda device, *, steps, **_: autotune_steps.append(steps) or False  # noqa: E731
    monkeypatch.setattr(detector.training.trainer, "autotune_convolutions", record_autotuning)  # the configured length
    monkeypatch.setattr(detector.training.plans, "autotune_convolutions", record_autotuning)  # the fitted one
    # Configured: 20,000 epochs at one micro-batch per optimizer step (240k steps: auto would pick SGD) with a
    # 10-epoch warm-up (120 steps). The budget fits ~5-20 epochs: AdamW, and the 100-step warm-up floor.
    # Re-planning the whole curve (the code before issue 23) failed the LR check below 9x over.
    config = _config(data, tmp_path, epochs=20_000, workers=2, time="15s", nominal_batch=4, warmup_epochs=10.0,
                     close_mosaic=2)
    start = time.monotonic()
    children = set(multiprocessing.active_children())
    trainer = Trainer(config, progress=False)  # kept, for what it measured (a finished run's last.pt is stripped)
    summary = trainer.fit()
    wall = time.monotonic() - start
    # The loaders' workers (train and validation, 2 each) end with the run, not with the trainer object: kept
    # alive, as here, they would otherwise last until the process exits (detector.data.workers.stop_workers).
    assert set(multiprocessing.active_children()) <= children
    printed = capsys.readouterr().out
    assert printed.index("probe: ") < printed.index("detector: YOLO")  # fitted before the first step
    assert autotune_steps[0] == 12 * 20_000 and len(autotune_steps) == 2 and 12 <= autotune_steps[1] < 12 * 1000
    assert autotune_steps[1] % 12 == 0
    assert "| AdamW lr " in printed  # chosen from the fitted plan, not the configured 20,000 epochs
    # --epochs given with --time: the budget decides the count, and the run says so once.
    assert printed.count("--time 15s sets the number of epochs (as Ultralytics' time= does); --epochs 20000 only") == 1

    rows = list(csv.DictReader((summary["run_dir"] / "results.csv").open()))
    # The run does what its last plan said. How many epochs fit 15 s depends on the machine and its load (a GPU
    # host fitted 2; a 2-core CPU shared with 8 busy processes, 1), so the count follows the plan rather than a
    # fixed number; the LR check at the re-plans below needs at least 2.
    assert len(rows) == summary["epochs_done"] == trainer.epochs >= 1 and trainer.optimizer_name == "AdamW"
    # The run ends inside the budget, give or take the end of the run the last re-fit had to predict: at most
    # one epoch (wall time between epoch starts, checkpoints included) and one validation more than planned.
    overrun = max(trainer.clock.epoch_seconds) + max(float(row["val_seconds"]) for row in rows)
    assert wall <= 15.0 + overrun, (wall, overrun)

    steps = max(per_optimizer.values(), key=len)  # the run's own optimizer
    assert [step for step, _ in steps] == list(range(12 * len(rows)))
    lr = [value for _, value in steps]
    # results.csv's LR is the epoch's last step's, written to 6 significant digits (relative error <= 5e-6).
    assert [float(row["lr"]) for row in rows] == pytest.approx([lr[12 * (e + 1) - 1] for e in range(len(rows))],
                                                               rel=5e-6)
    # Re-plans happen between epochs. Re-anchored, the first step of epoch e has the old schedule's LR, so it
    # differs from the last step of epoch e-1 by the old schedule's next step. Within one plan the LR is at most
    # quadratic in the step (the warm-up ramp times the linear decay; linear after the warm-up), so its steps
    # change by a constant second difference: the old plan's next step is at most its largest step in epoch e-1
    # plus that difference. (A plan short enough to end inside the 100-step warm-up falls ever more steeply at
    # its end, so the largest step alone is not a bound there.) The new plan's steps in epoch e are allowed too.
    # 1e-12: float round-off of the re-anchoring (LRs ~1e-3).
    for epoch in range(1, len(rows)):
        boundary = 12 * epoch
        before = [lr[s + 1] - lr[s] for s in range(boundary - 12, boundary - 1)]
        curvature = max((abs(b - a) for a, b in zip(before, before[1:])), default=0.0)
        inside = [abs(lr[s + 1] - lr[s]) for s in range(boundary - 12, boundary + 11) if s + 1 != boundary]
        assert abs(lr[boundary] - lr[boundary - 1]) <= max(inside) + curvature + 1e-12, epoch
    if len(rows) < 2:
        pytest.skip(f"only {len(rows)} epoch fitted the 15 s budget on this machine: no re-plan to check the LR at")


@pytest.mark.parametrize("saved, fell_back", [("fp16", True), ("fp32", True), ("fp32", False)])
def test_resume_re_resolves_the_precision_on_this_device(saved, fell_back, yolo_yaml: Path, tmp_path: Path):
    """A GPU run's FP16 resumed on a CPU gets the CPU's choice; a run that had fallen back to FP32 stays there; a
    run whose FP32 was its device's own choice (a CPU without BF16) gets this device's (a GPU's FP16)."""
    from detector.checkpoint import save_checkpoint
    from detector.precision import resolve_precision

    partial = train(_config(yolo_yaml, tmp_path, device="cpu"), progress=False, stop_after_epochs=1)
    last = partial["run_dir"] / "weights" / "last.pt"
    state = load_checkpoint(last)
    cpu_choice = resolve_precision("auto", torch.device("cpu")).name
    assert state["precision"] == cpu_choice and state["precision_fell_back"] is False  # as this CPU resolved it
    state["precision"], state["precision_fell_back"] = saved, fell_back
    save_checkpoint(state, last)
    resumed = train(_config(yolo_yaml, tmp_path, resume=str(last), device="cpu"), progress=False)
    assert resumed["precision"] == ("fp32" if saved == "fp32" and fell_back else cpu_choice)


@pytest.mark.parametrize("background", ["off", "on"])
def test_early_stop_ends_with_the_final_report(background, yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys):
    import detector.training.verdicts

    # Epoch 1 is the best there will be, above 0 (while all score 0, --patience waits, as Ultralytics' does)
    scores = iter([0.5, 0.4, 0.4, 0.4])
    monkeypatch.setattr(detector.training.verdicts, "fitness", lambda metrics, rule: next(scores))
    summary = train(_config(yolo_yaml, tmp_path, epochs=4, patience=1, plots=True, val_background=background),
                    progress=False)
    # Scored in the background, epoch 2 is judged at once all the same (patience runs out there if it does not
    # improve): the run stops where it stops with the scoring inline.
    assert summary["epochs_done"] == 2 and not summary["interrupted"]
    printed = capsys.readouterr().out
    assert "early stop: no better fitness for 1 epoch (best at epoch 1, --patience 1)" in printed
    assert "Average Precision" in printed  # the pycocotools summary of the final report
    for name in ("PR_curve", "confusion_matrix", "val_batch0_pred"):
        assert (summary["run_dir"] / f"{name}.png").is_file(), name
    assert load_checkpoint(summary["run_dir"] / "weights" / "best.pt")["epoch"] == 0


def test_scoring_in_the_background_makes_the_same_run(yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys):
    """--val-background on (forced here: auto keeps the CPU's scoring inline) judges each epoch one epoch later,
    from a forked worker's scores: the same rows, the same best epoch and the same best.pt as scoring inline."""
    import detector.training.verdicts
    from detector.metrics.background import BackgroundScorer

    submitted = []
    real_submit = BackgroundScorer.submit
    monkeypatch.setattr(BackgroundScorer, "submit", lambda self, *args: submitted.append(1) or real_submit(self, *args))
    runs = {}
    for background in ("off", "on"):
        scores = iter([0.1, 0.3, 0.2])  # epoch 2 is the best: scored in the background, its best.pt waits a verdict
        monkeypatch.setattr(detector.training.verdicts, "fitness", lambda metrics, rule: next(scores))
        config = _config(yolo_yaml, tmp_path, epochs=3, name=background, val_background=background)
        runs[background] = train(config, progress=False)["run_dir"]
    printed = capsys.readouterr().out
    assert all(f"epoch {n}: mAP50-95" in printed for n in range(1, 4))
    assert printed.count(", in the background | ") == 1  # the "on" run's header says where it scores
    assert len(submitted) == 2  # epochs 1-2 of the "on" run (the last is scored inline: the run ends there)
    timing = {"val_seconds", "epoch_seconds", "images_per_s", "data_wait", "peak_mem_mb"}  # measured, not computed
    rows = {name: [{k: v for k, v in row.items() if k not in timing} for row in csv.DictReader(
            (run / "results.csv").open())] for name, run in runs.items()}
    assert [row["epoch"] for row in rows["on"]] == ["1", "2", "3"] and rows["on"] == rows["off"]
    best = {name: load_checkpoint(run / "weights" / "best.pt") for name, run in runs.items()}
    assert best["on"]["epoch"] == best["off"]["epoch"] == 1
    assert best["on"]["metrics"] == best["off"]["metrics"] and best["on"]["metrics"]["mAP50"] == float(rows["on"][1]["mAP50"])
    assert best["on"]["best_fitness"] == best["off"]["best_fitness"] == 0.3
    assert all(torch.equal(best["on"]["model"][key], value) for key, value in best["off"]["model"].items())

    # A run that dies in epoch 3, its last.pt written while its epoch was being scored, then resumed: that epoch
    # is scored and judged first, and results.csv ends with every epoch's row once.
    import detector.training.trainer
    from detector.training.decision import fitness

    monkeypatch.setattr(detector.training.verdicts, "fitness", fitness)
    real_epoch, calls = detector.training.trainer.train_one_epoch, []

    def dies_in_epoch_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(detector.training.trainer, "train_one_epoch", dies_in_epoch_3)
    with pytest.raises(RuntimeError, match="killed"):
        train(_config(yolo_yaml, tmp_path, epochs=3, name="died", val_background="on"), progress=False)
    last = tmp_path / "died" / "weights" / "last.pt"
    unjudged = load_checkpoint(last)["unjudged"]  # written while its epoch was scored
    assert unjudged["precision"] == rows["on"][1]["precision"]  # this CPU's: bf16 where it has native BF16, else fp32
    monkeypatch.setattr(detector.training.trainer, "train_one_epoch", real_epoch)
    train(_config(yolo_yaml, tmp_path, epochs=3, name="died", val_background="on", resume=str(last)), progress=False)
    resumed = [{k: v for k, v in row.items() if k not in timing} for row in csv.DictReader(
               (tmp_path / "died" / "results.csv").open())]
    assert [row["epoch"] for row in resumed] == ["1", "2", "3"]
    assert resumed[0] == rows["on"][0]  # epoch 1 trained before the run died: its row as the whole run wrote it


def test_resume_of_a_time_budget_run_continues_its_schedule_and_optimizer(yolo_yaml: Path, tmp_path: Path):
    """The re-anchored schedule and auto's choice (made from the fitted plan) come back from last.pt: the
    configured 20,000 epochs would now pick SGD, whose state the saved AdamW state does not fit."""
    from detector.training.trainer import Trainer

    config = _config(yolo_yaml, tmp_path, epochs=20_000, time="1m", nominal_batch=4)
    partial = train(config, progress=False, stop_after_epochs=2)
    last = partial["run_dir"] / "weights" / "last.pt"
    state = load_checkpoint(last)
    assert state["optimizer_choice"]["name"] == "AdamW" and state["schedule"]["epochs"] < 20_000
    resumed = Trainer(_config(yolo_yaml, tmp_path, epochs=20_000, time="1m", nominal_batch=4, resume=str(last)),
                      progress=False)  # the same command again, plus --resume
    assert resumed.step.schedule.state() == state["schedule"] and resumed.epochs == state["plan"]["epochs"]
    assert resumed.optimizer_name == "AdamW" and resumed.step.schedule.base_lr == state["optimizer_choice"]["lr"]


def test_a_commands_time_budget_starts_at_the_process_start(yolo_yaml: Path, tmp_path: Path, monkeypatch):
    """--time covers the imports before the Trainer, as the time account does: they overran --time 12s by 2 s."""
    from detector.training import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "process_age", lambda: 1000.0)  # far above any set-up here
    command = trainer_module.Trainer(_config(yolo_yaml, tmp_path, time="1h", name="command"), progress=False,
                                     process_start=True)
    assert command.clock.elapsed() >= 1000.0
    api = trainer_module.Trainer(_config(yolo_yaml, tmp_path, time="1h", name="api"), progress=False)
    assert api.clock.elapsed() < 1000.0  # from Python the run starts with the Trainer, not the caller's process


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_stops_with_one_line(
        yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys):
    """ENOSPC in the checkpoint writer's second last.pt: the first stays whole, the run ends with one line."""
    real_fsync, checkpoints_written = os.fsync, []

    def fsync_fails_when_the_disk_is_full(descriptor: int) -> None:
        name = os.readlink(f"/proc/self/fd/{descriptor}")
        if "/weights/.last.pt." in name:  # the atomic writer's temporary file for last.pt
            checkpoints_written.append(name)
            if len(checkpoints_written) > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync_fails_when_the_disk_is_full)
    code = train_main(["--data", str(yolo_yaml), "--imgsz", "64", "--epochs", "3", "--batch", "4", "--workers", "0",
                       "--cache", "none", "--device", "cpu", "--project", str(tmp_path), "--no-plots",
                       "--no-amp-check"])
    error = capsys.readouterr().err
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert code == 1 and "Traceback" not in error and error.count("error:") == 1  # (stderr has progress bars too)
    assert error.splitlines()[-1] == (f"error: {last}: could not write the checkpoint (No space left on device); "
                                      "the previous one is intact")
    assert load_checkpoint(last)["epoch"] == 0  # the first epoch's, whole
    assert sorted(p.name for p in last.parent.iterdir()) == ["best.pt", "last.pt"]  # no temporary file left


def test_a_run_failing_before_its_first_epoch_stops_its_loader_workers(tmp_path: Path, monkeypatch):
    """The workers start with the first batch, before the AMP check: a failure there (or a Ctrl-C) still stops
    them, not the process's exit (torch 2.11 waits 5 s per worker there: detector.data.workers.stop_workers)."""
    import multiprocessing

    from detector.training.trainer import Trainer
    from tests.conftest import write_yolo_dataset

    data = write_yolo_dataset(tmp_path / "data", train=8, val=2)
    trainer = Trainer(_config(data, tmp_path, workers=2, amp_check=True), progress=False)

    def failing(batch):
        raise RuntimeError("AMP check failed")

    monkeypatch.setattr(trainer, "_preflight", failing)
    children = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="AMP check failed"):
        trainer.fit()
    assert trainer.train_loader._iterator is None  # its pass was begun (the first batch), then stopped
    assert set(multiprocessing.active_children()) <= children


def test_recompute_on_trains_the_same_weights_and_says_so(yolo_yaml: Path, tmp_path: Path, capsys):
    """--recompute on (CUDA's default) on the CPU, whose kernels are the plain path's: the same run bit for bit."""
    weights = []
    for choice in ("off", "on"):
        summary = train(_config(yolo_yaml, tmp_path, name=choice, recompute=choice, epochs=1), progress=False)
        weights.append(load_checkpoint(summary["run_dir"] / "weights" / "last.pt")["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    printed = capsys.readouterr().out
    assert printed.count("BatchNorm outputs of stem, down2, stage2 recomputed in backward (--recompute)") == 1


def test_a_resume_beats_best_pt_on_disk_not_an_older_best_in_last_pt(yolo_yaml: Path, tmp_path: Path):
    """best.pt may be newer than last.pt (an improvement held while last.pt was not due, written as the run failed):
    the resumed run judges against best.pt's fitness, so a weaker epoch does not replace it."""
    from detector.checkpoint import save_checkpoint

    partial = train(_config(yolo_yaml, tmp_path, epochs=3), progress=False, stop_after_epochs=1)
    weights = partial["run_dir"] / "weights"
    last = load_checkpoint(weights / "last.pt")
    last["best_fitness"], last["best_epoch"] = -1.0, -1  # last.pt as written before any improvement
    save_checkpoint(last, weights / "last.pt")
    best = load_checkpoint(weights / "best.pt")
    best["best_fitness"], best["best_epoch"] = 2.0, 0  # beyond any fitness (at most 1): no epoch may replace it
    save_checkpoint(best, weights / "best.pt")
    train(_config(yolo_yaml, tmp_path, epochs=3, resume=str(weights / "last.pt")), progress=False)
    assert load_checkpoint(weights / "best.pt")["best_fitness"] == 2.0


@pytest.mark.parametrize("best", [0, 2])
def test_the_final_report_is_best_pts(yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys, best: int):
    """The run's last lines (per-class table, predictions.json, the metrics it returns) describe best.pt, the file a
    user takes away: when an earlier epoch was the best, best.pt's weights as written (FP16) get a pass of their own;
    when the last epoch was the best, its own validation is that pass and nothing runs again."""
    import detector.training.verdicts as verdicts
    from detector.training.validator import Validator

    scores = iter([0.9, 0.1, 0.2] if best == 0 else [0.1, 0.2, 0.9])
    monkeypatch.setattr(verdicts, "fitness", lambda metrics, rule: next(scores))
    passes = []
    real = Validator.run_weights

    def recorded(self, model, weights, path, precision):
        validation = real(self, model, weights, path, precision)
        passes.append((weights, validation))
        return validation

    monkeypatch.setattr(Validator, "run_weights", recorded)
    summary = train(_config(yolo_yaml, tmp_path, epochs=3), progress=False)
    weights = summary["run_dir"] / "weights"
    saved = load_checkpoint(weights / "best.pt")
    assert saved["epoch"] == best and summary["best_epoch"] == best
    printed = capsys.readouterr().out
    assert f"| best (epoch {best + 1}) {weights / 'best.pt'}" in printed
    if best == 2:
        assert not passes and "final report: best.pt" not in printed
        return
    [(given, validation)] = passes
    assert given.keys() == saved["model"].keys() and all(torch.equal(given[k], saved["model"][k]) for k in given)
    assert summary["metrics"] == validation.metrics
    assert "final report: best.pt, epoch 1 (the last epoch: mAP50-95 " in printed


def test_weights_that_are_no_checkpoint_stop_the_run_before_the_data_scan(yolo_yaml: Path, tmp_path: Path,
                                                                         monkeypatch):
    """A text file given as --weights: one line naming it, before the data scan (minutes on COCO) starts."""
    import detector.training.trainer as trainer

    monkeypatch.setattr(trainer, "build_data", lambda *args, **kwargs: pytest.fail("scanned the data first"))
    notes = tmp_path / "notes.pt"
    notes.write_text("not weights\n")
    said = (r"notes.pt: not a PyTorch checkpoint \(neither this project's nor Ultralytics' YOLOv8, YOLO11 or YOLO26 "
            r"weights\)$")
    with pytest.raises(ValueError, match=said):
        train(_config(yolo_yaml, tmp_path, weights=str(notes)), progress=False)


@pytest.mark.parametrize("damage", ["damaged", "missing"])
def test_a_resumed_run_whose_best_pt_is_damaged_or_missing_writes_it_anew(yolo_yaml: Path, tmp_path: Path,
                                                                          monkeypatch, capsys, damage: str):
    """A best.pt that does not load, or is gone (last.pt copied alone), is said at the start of the resume, and the
    next epoch evaluated writes one anew; before, no later epoch beat the lost best (epoch 1 here), so no best.pt
    was written and the last line named a file that did not exist (or a damaged one)."""
    import detector.training.verdicts as verdicts

    scores = iter([0.9, 0.1, 0.2])  # epoch 1 the best
    monkeypatch.setattr(verdicts, "fitness", lambda metrics, rule: next(scores))
    first = train(_config(yolo_yaml, tmp_path, epochs=3), progress=False, stop_after_epochs=2)
    weights = first["run_dir"] / "weights"
    if damage == "damaged":
        (weights / "best.pt").write_bytes(b"PK\x03\x04 damaged")
    else:
        (weights / "best.pt").unlink()
    summary = train(_config(yolo_yaml, tmp_path, epochs=3, resume=str(weights / "last.pt")), progress=False)
    assert summary["epochs_done"] == 3 and not summary["interrupted"]
    printed = capsys.readouterr().out
    assert "so the best so far (epoch 1) is lost; the next epoch evaluated writes best.pt anew" in printed
    assert load_checkpoint(weights / "best.pt")["epoch"] == 2 and summary["best_epoch"] == 2
    assert f"| best (epoch 3) {weights / 'best.pt'}" in printed


def test_val_interval_0_evaluates_the_last_epoch_alone_and_fraction_trains_on_part(yolo_yaml: Path, tmp_path: Path,
                                                                                   capsys):
    """Ultralytics' ``val=False`` (``--val-interval 0``): no evaluation before the last epoch, which still gets one;
    ``fraction=0.5`` (``--fraction``): the training split's first half, validation whole."""
    summary = train(_config(yolo_yaml, tmp_path, epochs=3, val_interval=0, fraction=0.5), progress=False)
    rows = list(csv.DictReader((summary["run_dir"] / "results.csv").open()))
    assert [row["mAP50-95"] != "" for row in rows] == [False, False, True]
    assert "mAP50-95" in summary["metrics"] and summary["best_epoch"] == 2
    printed = capsys.readouterr().out
    assert "'train': the first 4 of 8 images (--fraction 0.5)" in printed and "(4 train / 4 val)" in printed
    for bad, message in (({"fraction": 0.0}, "--fraction must be above 0"), ({"val_interval": -1}, "0 or more")):
        with pytest.raises(ValueError, match=message):
            _config(yolo_yaml, tmp_path, **bad).validate()


def test_ultralytics_data_options_train_end_to_end(yolo_yaml: Path, tmp_path: Path, capsys):
    """--classes 0 2 --single-cls --mixup 1 --cutmix 1 --perspective 0.001 --bgr 0.5 --save-period 1 together (each
    unit-tested in detector/data): a run of one class 'item' from classes 0 and 2's boxes, MixUp then CutMix in its
    mosaic epochs, every item tilted, half of them in BGR, a kept checkpoint per epoch, and the header saying so."""
    from detector.checkpoint import load_checkpoint

    summary = train(_config(yolo_yaml, tmp_path, epochs=3, classes=(0, 2), single_cls=True, mixup=1.0, cutmix=1.0,
                            perspective=0.001, bgr=0.5, save_period=1, close_mosaic=1), progress=False)
    weights = summary["run_dir"] / "weights"
    assert sorted(path.name for path in weights.glob("epoch*.pt")) == ["epoch1.pt", "epoch2.pt", "epoch3.pt"]
    best = load_checkpoint(weights / "best.pt")
    assert best["names"] == ["item"] and best["model_args"]["num_classes"] == 1
    assert list(best["config"]["classes"]) == [0, 2] and best["config"]["single_cls"] and best["config"]["mixup"] == 1.0
    assert best["config"]["cutmix"] == 1.0 and best["config"]["perspective"] == 0.001 and best["config"]["bgr"] == 0.5
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("detector:"))
    assert "1 class)" in header and "classes 0 2 only" in header and "MixUp 1 (in the workers)" in header
    assert "CutMix 1 (in the workers)" in header and "perspective 0.001 (in the workers)" in header
    assert "| augmentation in the workers, channel swap 0.5, MixUp 1 (in the workers)" in header


def test_a_ctrl_c_in_the_last_epoch_lets_the_run_finish(yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys):
    """The last epoch was trained when the Ctrl-C is seen: the run ends as a finished one (its final report, a
    stripped last.pt, the done line); it said "interrupted", kept an unstripped last.pt and could not be resumed
    ("already finished")."""
    from detector.checkpoint import is_stripped
    from detector.training import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "any_rank", lambda value, dist: True)  # a Ctrl-C seen after every epoch
    summary = train(_config(yolo_yaml, tmp_path, epochs=1), progress=False)
    printed = capsys.readouterr().out
    assert not summary["interrupted"] and "interrupted" not in printed and "done in" in printed
    # A run under a minute says its seconds ("done in 0.0 min" before); longer ones 7m44s, as --time is written.
    assert re.search(r"^done in \d+(\.\d+)?s: mAP50-95 ", printed, re.MULTILINE)
    assert is_stripped(load_checkpoint(summary["run_dir"] / "weights" / "last.pt"))


def test_a_run_resumed_with_a_smaller_batch_goes_on_at_the_same_point_of_its_schedule(yolo_yaml: Path,
                                                                                      tmp_path: Path):
    """--batch on a resume (a run out of GPU memory, as Ultralytics allows): taken, twice the steps per epoch, and
    the learning rate where the run left it (the schedule carried over by epochs); the run then finishes."""
    from detector.training.trainer import Trainer

    partial = train(_config(yolo_yaml, tmp_path, epochs=3, batch=4, warmup_epochs=0.0), progress=False,
                    stop_after_epochs=1)
    last = partial["run_dir"] / "weights" / "last.pt"
    before = Trainer(_config(yolo_yaml, tmp_path, epochs=3, batch=4, warmup_epochs=0.0, resume=str(last)),
                     progress=False).step.schedule
    after = Trainer(_config(yolo_yaml, tmp_path, epochs=3, batch=2, warmup_epochs=0.0, resume=str(last)),
                    progress=False)
    schedule = after.step.schedule
    assert after.config.batch == 2 and schedule.steps_per_epoch == 2 * before.steps_per_epoch
    assert schedule.lr_factor(schedule.steps_per_epoch) == pytest.approx(before.lr_factor(before.steps_per_epoch))
    summary = train(_config(yolo_yaml, tmp_path, epochs=3, batch=2, warmup_epochs=0.0, resume=str(last)),
                    progress=False)
    assert summary["epochs_done"] == 3 and not summary["interrupted"]


@pytest.mark.parametrize("stop", ["ctrl-c", "stop_after_epochs"])
def test_a_stop_asked_in_the_epoch_where_patience_runs_out_ends_as_the_early_stop(
        yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys, stop: str):
    """Patience 1 runs out at epoch 2 (epoch 1 the best); a Ctrl-C seen there (or the API's stop_after_epochs, the
    same path) ended the run as interrupted: an unstripped last.pt whose --resume then trained epoch 3, one more
    than the run that was not interrupted. The early stop wins: the final report, a stripped last.pt, the done line."""
    import detector.training.verdicts as verdicts
    from detector.checkpoint import is_stripped
    from detector.training import trainer as trainer_module

    scores = iter([0.5, 0.1, 0.1, 0.1])
    monkeypatch.setattr(verdicts, "fitness", lambda metrics, rule: next(scores))
    seen = iter([False, True, True, True])  # the Ctrl-C arrives in epoch 2
    if stop == "ctrl-c":
        monkeypatch.setattr(trainer_module, "any_rank", lambda value, dist: next(seen))
    summary = train(_config(yolo_yaml, tmp_path, epochs=4, patience=1), progress=False,
                    stop_after_epochs=2 if stop == "stop_after_epochs" else None)
    printed = capsys.readouterr().out
    assert summary["epochs_done"] == 2 and not summary["interrupted"] and summary["best_epoch"] == 0
    assert "early stop: no better fitness for 1 epoch (best at epoch 1" in printed and "interrupted" not in printed
    assert "done in" in printed and "Average Precision" in printed
    assert is_stripped(load_checkpoint(summary["run_dir"] / "weights" / "last.pt"))


@pytest.mark.parametrize("stop", ["ctrl-c", "stop_after_epochs"])
def test_a_ctrl_c_in_the_epoch_a_time_refit_makes_the_last_lets_the_run_finish(yolo_yaml: Path, tmp_path: Path,
                                                                               monkeypatch, capsys, stop: str):
    """--time planned more epochs, and the re-fit after epoch 3 (the host slowed) makes it the last: a Ctrl-C seen
    in that epoch (or the API's stop_after_epochs, the same path) was judged against the plan from before the re-fit,
    so the run said "interrupted", kept an unstripped last.pt and no done line, and its --resume failed "run already
    finished all 3 epochs". Judged against the re-fitted plan, the run finished: it ends as one."""
    import dataclasses

    from detector.checkpoint import is_stripped
    from detector.training import budget
    from detector.training import trainer as trainer_module

    real_fit = budget.TimeBudget.fit

    def slowed(self, so_far, settings, **kwargs):
        plan = real_fit(self, so_far, settings, **kwargs)
        return dataclasses.replace(plan, epochs=3) if so_far.epochs_done == 3 else plan

    monkeypatch.setattr(budget.TimeBudget, "fit", slowed)
    seen = iter([False, False, True])  # the Ctrl-C arrives in epoch 3
    if stop == "ctrl-c":
        monkeypatch.setattr(trainer_module, "any_rank", lambda value, dist: next(seen))
    trainer = trainer_module.Trainer(_config(yolo_yaml, tmp_path, epochs=50, time="10m"), progress=False)
    summary = trainer.fit(stop_after_epochs=3 if stop == "stop_after_epochs" else None)
    printed = capsys.readouterr().out
    planned = [int(count) for count in re.findall(r"time budget 10m: (\d+) epochs? fit", printed)]
    assert planned[0] > 3 and planned[-1] == 3  # more planned before the re-fit after epoch 3
    assert summary["epochs_done"] == trainer.epochs == 3 and not summary["interrupted"]
    assert "interrupted" not in printed and "done in" in printed
    assert is_stripped(load_checkpoint(summary["run_dir"] / "weights" / "last.pt"))


def test_patience_under_the_val_interval_is_noted_and_its_stop_says_the_epochs_that_passed(
        yolo_yaml: Path, tmp_path: Path, monkeypatch, capsys):
    """--val-interval 3 --patience 2: validated after epochs 3 and 6, the run stops at the first that does not improve
    (patience counts epochs, as Ultralytics' does: said at the start) and says the 3 epochs that passed, not 2."""
    import detector.training.verdicts as verdicts

    scores = iter([0.5, 0.4])
    monkeypatch.setattr(verdicts, "fitness", lambda metrics, rule: next(scores))
    summary = train(_config(yolo_yaml, tmp_path, epochs=9, val_interval=3, patience=2), progress=False)
    printed = capsys.readouterr().out
    assert summary["epochs_done"] == 6 and summary["best_epoch"] == 2
    assert printed.count("note: --patience 2 counts epochs (as Ultralytics' patience does) and --val-interval 3") == 1
    assert "early stop: no better fitness for 3 epochs (best at epoch 3, --patience 2)" in printed


def test_a_run_that_scores_0_throughout_takes_away_its_last_epoch(yolo_yaml: Path, tmp_path: Path, monkeypatch):
    """Ties keep the latest for best.pt, as Ultralytics' do (tests/training/test_verdicts.py): best.pt was the first
    validated epoch, nearly untrained, of a run whose every score was 0."""
    import detector.training.verdicts as verdicts

    monkeypatch.setattr(verdicts, "fitness", lambda metrics, rule: 0.0)
    summary = train(_config(yolo_yaml, tmp_path, epochs=3), progress=False)
    assert summary["best_epoch"] == 2 and load_checkpoint(summary["run_dir"] / "weights" / "best.pt")["epoch"] == 2
