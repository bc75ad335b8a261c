"""``detector tune`` end to end on a tiny dataset (each iteration a real training child), and what it refuses."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from detector.cli.tune import main
from detector.workflows import tune as workflow
from detector.workflows.tune_mutation import mutate
from detector.workflows.tune_space import DEFAULT_SPACE

TINY = ["--epochs", "1", "--imgsz", "64", "--batch", "4", "--workers", "0", "--cache", "none", "--device", "cpu",
        "--no-amp-check"]


@pytest.fixture(autouse=True)
def bounded_children(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each iteration trains in a child process: one that hangs must fail the test, not stall the suite.
    monkeypatch.setattr(workflow, "ITERATION_TIMEOUT_S", 300)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 64 px steps: two threads on 2 shared cores only wait on each other


def rows_of(folder: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((folder / "tune_results.csv").open()))


def test_a_tune_records_each_iteration_keeps_one_weights_folder_and_resumes(yolo_yaml: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture):
    argv = ["--data", str(yolo_yaml), *TINY, "--project", str(tmp_path), "--name", "t"]
    assert main([*argv, "--iterations", "2"]) == 0
    folder = tmp_path / "t"
    rows = rows_of(folder)
    assert [row["iteration"] for row in rows] == ["1", "2"]
    assert all(0 <= float(row["fitness"]) <= 1 and float(row["seconds"]) > 0 for row in rows)
    assert rows[0]["lr0"] == "0.01" and rows[0]["close_mosaic"] == "10"  # iteration 1: train's own values
    assert rows[0] != rows[1]
    assert sorted(p.name for p in (folder / "weights").iterdir()) == ["best.pt", "last.pt"]
    assert not list(folder.glob("iter*/weights")) and (folder / "iter2" / "results.csv").is_file()
    assert (folder / "tune_fitness.png").read_bytes()[:4] == b"\x89PNG"
    best = yaml.safe_load((folder / "best_hyperparameters.yaml").read_text())
    fittest = max(rows, key=lambda row: float(row["fitness"]))  # the first of equals
    assert set(best) == set(DEFAULT_SPACE) and best["close_mosaic"] == int(fittest["close_mosaic"])
    assert best["lr0"] == float(fittest["lr0"])
    out = capsys.readouterr().out
    assert "tune: iteration 2/2: fitness " in out and f"best {float(fittest['fitness']):.4g} at iteration" in out

    assert not list(folder.glob("iter*/predictions.json"))  # ~190 MB an iteration on COCO: not kept
    # The tune's lock goes when it ends, not when its process does (a notebook's tune resumed from a shell).
    probe = subprocess.run([sys.executable, "-c", "import fcntl, sys; fcntl.flock(open(sys.argv[1], 'a+'), "
                            "fcntl.LOCK_EX | fcntl.LOCK_NB)", str(folder / ".lock")], capture_output=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    before = (folder / "tune_results.csv").read_text()
    # A resume goes to the iterations the tune was started with (2: done, nothing trains), unless given more.
    assert main(["--project", str(tmp_path), "--name", "t", "--resume"]) == 0
    assert (folder / "tune_results.csv").read_text() == before
    assert main(["--project", str(tmp_path), "--name", "t", "--iterations", "3", "--resume"]) == 0
    after = rows_of(folder)
    assert len(after) == 3 and (folder / "tune_results.csv").read_text().startswith(before)
    # The resumed draw is the one an uninterrupted tune makes from the same results.
    history = [(float(row["fitness"]), {name: (int if name == "close_mosaic" else float)(row[name])
                                       for name in DEFAULT_SPACE}) for row in after[:2]]
    baseline = history[0][1]
    drawn = mutate(DEFAULT_SPACE, history, baseline, seed=0, iteration=3)
    assert {name: after[2][name] for name in DEFAULT_SPACE} == {name: str(v) for name, v in drawn.items()}
    assert not list(folder.glob("iter*/weights")) and not list(tmp_path.glob("t2"))
    # --iterations given to a resume is recorded: the plain resume a later interrupt suggests goes on to it.
    assert yaml.safe_load((folder / "tune_args.yaml").read_text())["iterations"] == 3
    assert main(["--project", str(tmp_path), "--name", "t", "--resume"]) == 0 and len(rows_of(folder)) == 3


def test_a_bad_train_flag_is_refused_before_any_training(tmp_path: Path, capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as exited:
        main(["--data", "x.yaml", "--epochs", "1", "--bogus", "--project", str(tmp_path / "runs")],
             prog="detector tune")
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("detector tune: error: unrecognized arguments: --bogus") and "\n" not in err
    assert not (tmp_path / "runs").exists()


def test_a_bad_space_or_value_or_resume_is_one_line_and_leaves_no_folder(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture):
    space = tmp_path / "space.yaml"
    space.write_text("box: [1, 10]\noptimizer: [0, 1]\n")
    project = tmp_path / "runs"
    assert main(["--data", "x.yaml", "--space", str(space), "--project", str(project)]) == 1
    assert main(["--data", "x.yaml", "lr0=2", "--project", str(project)]) == 1
    assert main(["--project", str(project), "--name", "none", "resume=True"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and "optimizer" in errors[0] and "--lr0 must be in [0, 1]" in errors[1]
    assert "--resume: " in errors[2] and "holds no tune_results.csv" in errors[2]
    assert not project.exists() or not list(project.iterdir())


def test_a_failed_first_iteration_stops_the_tune_with_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["--data", str(tmp_path / "missing.yaml"), *TINY, "--project", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "error: tune: the first iteration's training failed (exit code 1" in err
    assert not list((tmp_path / "runs").iterdir())  # nothing recorded: no tune folder to mistake for one


@pytest.mark.parametrize("signal_name,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_kills_the_child_and_keeps_the_finished_iterations(yolo_yaml: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture, signal_name: str,
                                                                  code: int):
    """Ctrl-C, or SIGTERM (a job's time limit, ``kill``): 130 or 143, as a process the signal ended."""
    import os
    import signal

    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, command: list[str], **kwargs: object) -> None:
            if len(started) == 1:  # iteration 2: a child that would run for a minute, then Ctrl-C while it runs
                command = [sys.executable, "-c", "import time; time.sleep(60)"]
            super().__init__(command, **kwargs)
            started.append(self)

        def wait(self, timeout: float | None = None) -> int:
            if len(started) == 2 and self.returncode is None and timeout is not None:
                os.kill(os.getpid(), getattr(signal, signal_name))  # its handler runs in the wait below
            return super().wait(timeout)

    monkeypatch.setattr(workflow.subprocess, "Popen", Recorded)
    argv = ["--data", str(yolo_yaml), *TINY, "--project", str(tmp_path), "--name", "t", "--iterations", "3"]
    assert main(argv) == code
    assert started[1].poll() is not None  # killed, not left running
    folder = tmp_path / "t"
    assert len(rows_of(folder)) == 1 and not (folder / "iter2").exists()
    assert "interrupted: the iteration under way discarded, 1 iteration recorded" in capsys.readouterr().err


def test_resume_refuses_train_flags_other_than_the_recorded_ones(tmp_path: Path, capsys: pytest.CaptureFixture):
    from detector.workflows.tune_records import append_row, write_settings

    folder = tmp_path / "t"
    folder.mkdir()
    data = tmp_path / "data.yaml"
    data.write_text("names: [a]\n")  # with_defaults resolves an existing file: the record holds the absolute path
    write_settings(folder, {"train": {"data": str(data), "imgsz": 640, "epochs": 3},
                            "space": {"lr0": [0.001, 0.01, 1.0]}})
    append_row(folder, 1, (0.1, 0.2), 1.0, {"lr0": 0.01})
    assert main(["--data", str(data), "--epochs", "4", "--project", str(tmp_path), "--name", "t", "--resume"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --resume continues") and "epochs differs" in err and "\n" not in err
    assert len(rows_of(folder)) == 1


def test_a_training_stopped_on_its_own_is_not_recorded_as_finished(yolo_yaml: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture):
    """A SIGTERM to the training alone ends it after its epoch with exit 0 and last.pt, but no final report
    (predictions.json): the tune records nothing of it and stops as interrupted, for a --resume to run it again."""
    started: list[subprocess.Popen] = []

    class Stopped(subprocess.Popen):
        def __init__(self, command: list[str], **kwargs: object) -> None:
            if started:  # iteration 2: exits 0 having written no final report, as a stopped training does
                command = [sys.executable, "-c", "pass"]
            super().__init__(command, **kwargs)
            started.append(self)

    monkeypatch.setattr(workflow.subprocess, "Popen", Stopped)
    argv = ["--data", str(yolo_yaml), *TINY, "--project", str(tmp_path), "--name", "t", "--iterations", "3"]
    assert main(argv) == 130
    folder = tmp_path / "t"
    assert len(rows_of(folder)) == 1 and not (folder / "iter2").exists() and len(started) == 2
    assert "interrupted: the iteration under way discarded, 1 iteration recorded" in capsys.readouterr().err


def test_weights_are_the_recorded_best_s_even_after_an_interrupted_move(tmp_path: Path):
    """The record comes first, then the moves: a tune stopped between them (a SIGTERM at the wrong millisecond) left
    weights/ from an unrecorded iteration; now a resume finishes the move, and every other recorded iteration loses
    its weights and predictions.json."""
    from detector.workflows.tune_records import append_row, read_rows

    folder = tmp_path / "t"
    for iteration, fitness in ((1, 0.1), (2, 0.3), (3, 0.2)):
        run = folder / f"iter{iteration}"
        (run / "weights").mkdir(parents=True)
        for name in ("best.pt", "last.pt"):
            (run / "weights" / name).write_text(f"iter{iteration}")
        (run / "predictions.json").write_text("[]")
        append_row(folder, iteration, (fitness, fitness), 1.0, {"lr0": 0.01 * iteration})
    (folder / "weights").mkdir()
    (folder / "weights" / "best.pt").write_text("iter1")  # iteration 2 recorded, its move not made
    workflow.keep_weights(folder, read_rows(folder))
    assert [(folder / "weights" / name).read_text() for name in ("best.pt", "last.pt")] == ["iter2", "iter2"]
    assert not list(folder.glob("iter*/weights")) and not list(folder.glob("iter*/predictions.json"))


def test_a_second_tune_of_one_folder_stops_in_one_line(yolo_yaml: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture):
    """A scheduler's requeue while the first still runs: both wrote the records (rows 1, 2, 2, 3, 3) and one read
    the other's results."""
    from detector.workflows.tune_records import append_row, write_settings

    folder = tmp_path / "t"
    folder.mkdir()
    write_settings(folder, {"train": {"data": str(yolo_yaml)}, "space": {"lr0": [0.001, 0.01, 1.0]},
                            "iterations": 3})
    append_row(folder, 1, (0.1, 0.2), 1.0, {"lr0": 0.01})
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); print('held', flush=True); "
                               "time.sleep(60)", str(folder / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["--project", str(tmp_path), "--name", "t", "--resume"]) == 1
    finally:
        holder.kill()
        holder.wait(timeout=30)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (f"error: {folder}: another process (pid 4242) is running this tune now; wait for it, or stop it "
                     "first")


def test_under_torchrun_a_tune_is_refused_and_save_false_is_a_note(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["--data", "x.yaml"]) == 1
    assert "error: tune runs in one process" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    from detector.cli.tune import own_key_values

    assert own_key_values(["save=False", "--epochs", "3", "--no-save"]) == ["--epochs", "3"]  # Ultralytics' example
    err = capsys.readouterr().err
    assert "note: Ultralytics' save=False is not needed here" in err and "Ultralytics' no-save is not needed" in err
    monkeypatch.setenv("WORLD_SIZE", "2")
    from detector import tune

    with pytest.raises(ValueError, match="^tune runs in one process"):  # from Python too: each rank would tune
        tune(data="x.yaml", iterations=1)


def test_a_resume_of_a_tune_that_recorded_no_iteration_count_asks_for_one(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture):
    from detector.workflows.tune_records import append_row, write_settings

    folder = tmp_path / "t"
    folder.mkdir()
    write_settings(folder, {"train": {}, "space": {"lr0": [0.001, 0.01, 1.0]}})
    append_row(folder, 1, (0.1, 0.2), 1.0, {"lr0": 0.01})
    assert main(["--project", str(tmp_path), "--name", "t", "--resume"]) == 1
    assert capsys.readouterr().err.strip().endswith("tune_args.yaml records no iteration count; give --iterations")
