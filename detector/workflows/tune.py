"""``detector tune``: hyperparameter evolution, as Ultralytics' ``model.tune`` / ``yolo tune``.

Each iteration trains in a process of its own (``python -m detector train ... --project <tune folder> --name iterN
--no-plots``, the same seed every time) with settings mutated from the fittest so far
(detector/workflows/tune_mutation.py); its fitness is the best epoch's mAP50-95 in its results.csv. The child's output
streams through as it is: its progress, and the one line that says why it failed, are what a user watching a long
iteration needs, and filtering them would tie this loop to the training's output. After each iteration the records
(detector/workflows/tune_records.py) are rewritten atomically and one summary line is printed.

The fittest iteration's weights are kept in ``<tune folder>/weights`` (best.pt, last.pt); every iteration's own
weights are deleted once it is recorded (a tune of 300 iterations would keep 300 pairs), its results.csv and
config.yaml kept. A first iteration that fails stops the tune (exit 1): the data or flags are wrong, and every
iteration would fail alike. A later one is recorded with fitness 0 and the tune goes on. Ctrl-C kills the training
child and leaves the finished iterations' records; ``--resume`` continues from the next iteration.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detector.options import flag_name
from detector.runs import claim_run_dir
from detector.signals import sigterm_as_ctrl_c
from detector.training.run_lock import hold_run_lock, release_run_lock
from detector.training.config import TrainConfig
from detector.workflows.options import DEFAULT_ITERATIONS, TuneOptions
from detector.workflows.tune_mutation import mutate
from detector.workflows.tune_records import (
    BEST,
    RESULTS,
    SETTINGS,
    append_row,
    best_row,
    read_rows,
    read_settings,
    run_metrics,
    value_text,
    write_best,
    write_settings,
)
from detector.workflows.tune_space import DEFAULT_SPACE, Bounds, check_against_train, read_space, space_from, \
    space_to_dict

# The tune's own: each iteration's folder is the tune's, and its figures are the tune's one plot.
OWNED = ("project", "name", "resume")
# How long one iteration's training may run; None = as long as it takes (tests set a limit: a hang fails them).
ITERATION_TIMEOUT_S: float | None = None


class FirstIterationFailed(ValueError):
    """The first iteration's training failed: its own error line is above; this one says the tune stopped."""


@dataclass
class Tune:
    """A tune under way: its folder, space, the run's settings (and as train's flags), iteration 1's values."""

    folder: Path
    space: dict[str, Bounds]
    config: TrainConfig
    fixed: list[str]
    baseline: dict[str, Any]
    iterations: int


def say(line: str) -> None:
    print(f"tune: {line}", flush=True)


def recorded_train_settings(config: TrainConfig) -> dict[str, Any]:
    """The run's settings away from train's defaults, as tune_args.yaml holds them (lists, not tuples)."""
    changed = config.changed()
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in changed.items() if name not in OWNED}


def train_flags(settings: dict[str, Any]) -> list[str]:
    """Our field values -> train's flags (its parser is generated from TrainConfig, every switch with a --no- form);
    the plots switch is left to the tune (each iteration trains with --no-plots)."""
    tokens: list[str] = []
    for name, value in settings.items():
        flag = flag_name(name)
        if name == "plots":
            continue
        if isinstance(value, bool):
            tokens.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            tokens += [flag, *map(str, value)]
        else:
            tokens += [flag, value_text(value) if isinstance(value, (int, float)) else str(value)]
    return tokens


def child_environment() -> dict[str, str]:
    """The environment with this package first on the path: each iteration runs the code this process runs (a
    checkout on PYTHONPATH, or the installed one), whatever the working folder holds."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the detector package
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def train_once(command: list[str]) -> int:
    """Run one training child; on Ctrl-C (or anything else) it is killed before the error goes up."""
    process = subprocess.Popen(command, env=child_environment())
    try:
        return process.wait(timeout=ITERATION_TIMEOUT_S)
    except BaseException:
        process.kill()
        process.wait()
        raise


def settings_for(options: TuneOptions, config: TrainConfig, space_values: dict[Any, Any] | None
                 ) -> tuple[Path, dict[str, Bounds], TrainConfig, bool, int]:
    """-> (the tune folder, its space, the run's settings, whether the folder is new, its iterations), checked before
    any training; the folder locked for this process (a second tune of it, a scheduler's requeue while the first
    still runs, stops in one line instead of both writing its records).

    A new tune claims ``project/name`` (``name2``... when taken). ``--resume`` continues ``project/name`` with the
    settings it recorded, to the iterations it was started with unless ``--iterations`` is given; train flags or a
    space given beside it must be those (or none)."""
    gave_train_settings = bool(recorded_train_settings(config))  # before the defaults fill epochs and imgsz
    config = config.with_defaults().validate()
    if config.resume:
        raise ValueError("tune: train's resume is not a tune's; continue a tune with --resume (resume=True)")
    space = (space_from(space_values, "space") if space_values is not None
             else read_space(options.space) if options.space is not None else dict(DEFAULT_SPACE))
    if not options.resume:
        check_against_train(space, config)
        folder = claim_run_dir(options.project, options.name)
        hold_run_lock(folder, "running this tune")
        iterations = options.iterations or DEFAULT_ITERATIONS
        write_settings(folder, {"train": recorded_train_settings(config), "space": space_to_dict(space),
                                "iterations": iterations})
        return folder, space, config, True, iterations
    folder = Path(options.project) / options.name
    if not (folder / RESULTS).is_file():
        raise ValueError(f"--resume: {folder} holds no {RESULTS}: no tune to continue there (check --project and "
                         f"--name)")
    hold_run_lock(folder, "running this tune")
    recorded = read_settings(folder)
    given, before = recorded_train_settings(config), recorded.get("train") or {}
    if gave_train_settings and given != before:
        different = next(name for name in sorted({*given, *before}) if given.get(name) != before.get(name))
        raise ValueError(f"--resume continues {folder} with the train settings it recorded ({folder / 'tune_args.yaml'}"
                         f"); {different} differs: give the same ones or none, or start a new tune")
    if (options.space is not None or space_values is not None) and space_to_dict(space) != recorded.get("space"):
        raise ValueError(f"--resume continues {folder} with the space it recorded; give the same or none")
    config = TrainConfig.from_dict(recorded.get("train") or {}).with_defaults().validate()
    space = space_from(recorded.get("space") or {}, f"{folder / 'tune_args.yaml'}: space")
    if options.iterations is not None and options.iterations != recorded.get("iterations"):
        # Recorded: the resume line a later interrupt prints (without --iterations) goes on to this count.
        write_settings(folder, {**recorded, "iterations": options.iterations})
    elif recorded.get("iterations") is None:
        raise ValueError(f"--resume: {folder / SETTINGS} records no iteration count; give --iterations")
    return folder, space, config, False, int(options.iterations or recorded["iterations"])


# What an iteration's folder loses once it is recorded: its weights (the fittest's move to <tune>/weights) and its
# COCO results (predictions.json: ~190 MB an iteration on COCO val at 300 detections an image, against 12 MB of nano
# weights); its results.csv and config.yaml stay.
DISCARDED = ("weights", "predictions.json")


def keep_weights(folder: Path, rows: list[dict[str, Any]]) -> None:
    """After a record: the fittest recorded iteration's weights moved into ``folder/weights`` (renames: the same
    disk), every other recorded iteration's :data:`DISCARDED` deleted. Also what a tune interrupted between its
    record and these moves left: a resume calls it first, so ``weights/`` is always the recorded best's."""
    best = best_row(rows)
    for row in rows:
        run_dir = folder / f"iter{row['iteration']}"
        if best is not None and row["iteration"] == best["iteration"] and (run_dir / "weights").is_dir():
            (folder / "weights").mkdir(exist_ok=True)
            for name in ("best.pt", "last.pt"):
                if (run_dir / "weights" / name).is_file():
                    os.replace(run_dir / "weights" / name, folder / "weights" / name)
        for name in DISCARDED:
            path = run_dir / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def draw_fitness(folder: Path, rows: list[dict[str, Any]]) -> None:
    """tune_fitness.png, drawn here: the tune waits on nothing else between iterations. A figure that fails is one
    warning line, never the tune's end."""
    try:
        from detector.plots import draw

        draw("plot_tune_fitness", [row["iteration"] for row in rows], [row["fitness"] for row in rows],
             folder / "tune_fitness.png")
    except Exception as error:  # noqa: BLE001 - said; the records are what matters
        print(f"warning: tune_fitness.png not drawn ({type(error).__name__}: {error})", file=sys.stderr)


def changes(settings: dict[str, Any], baseline: dict[str, Any]) -> str:
    moved = [f"{name}={value_text(value)}" for name, value in settings.items() if value != baseline.get(name)]
    return " ".join(moved) if moved else "the run's own settings"


def run_iteration(folder: Path, iteration: int, command: list[str]) -> tuple[int, float]:
    """Train iteration ``iteration`` into ``folder/iterN``; -> (exit code, seconds). An unrecorded folder of that
    name (a tune killed mid-iteration) is replaced; an interrupted one is removed."""
    run_dir = folder / f"iter{iteration}"
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    try:
        code = train_once(command)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return code, time.perf_counter() - start


def run_tune(options: TuneOptions, config: TrainConfig, space_values: dict[Any, Any] | None = None
             ) -> dict[str, Any]:
    """Evolve ``config``'s hyperparameters over ``options.iterations`` training runs; -> the fittest settings.

    ``space_values``: a space given from Python (a dict), instead of ``options.space``'s file."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:  # each rank would run the whole tune (the CLI says it once)
        raise ValueError("tune runs in one process: start it with python (or detector tune), not torchrun; each "
                         "iteration is a training process of its own")
    folder, space, config, new, iterations = settings_for(options, config, space_values)
    try:
        with sigterm_as_ctrl_c():  # a job's time limit: the child killed, the finished iterations kept, exit 143
            return evolve(options, folder, space, config, new, iterations)
    finally:
        release_run_lock(folder)  # a tune from Python ends before its process: a shell may resume it then


def evolve(options: TuneOptions, folder: Path, space: dict[str, Bounds], config: TrainConfig, new: bool,
           iterations: int) -> dict[str, Any]:
    """:func:`run_tune`'s iterations, in its claimed and locked ``folder``."""
    rows = read_rows(folder)
    keep_weights(folder, rows)  # a tune interrupted between a record and its weights' move: finished here
    tune = Tune(folder, space, config, train_flags(recorded_train_settings(config)),
                {name: getattr(config, name) for name in space}, iterations)
    if "lr0" in space and config.optimizer == "auto":
        print("note: --optimizer auto picks AdamW, with its own learning rate, for runs under 10k steps: lr0 then "
              "changes nothing; name the optimizer (--optimizer SGD) for lr0 to count", file=sys.stderr)
    if rows:
        say(f"resuming {folder} after iteration {rows[-1]['iteration']} ({len(rows)} recorded)")
    try:
        for iteration in range((rows[-1]["iteration"] if rows else 0) + 1, iterations + 1):
            rows = tune_step(tune, iteration, rows)
    except BaseException as error:
        if new and not rows:  # nothing recorded: no tune folder left to resume or to mistake for one
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(error, KeyboardInterrupt) and rows:  # its type kept: a SIGTERM's (Terminated) exits 143
            recorded = f"{len(rows)} iteration{'s' if len(rows) != 1 else ''}"
            raise type(error)(f"interrupted: the iteration under way discarded, {recorded} recorded in {folder}; "
                              f"continue with --resume --project {options.project} --name {folder.name}") from None
        raise
    best = best_row(rows)
    if len(rows) >= iterations and best is not None:
        say(f"done: best fitness {best['fitness']:.4g} at iteration {best['iteration']}; {folder / BEST}, "
            f"{folder / 'weights'}")
    return dict(best["settings"]) if best else {}


def tune_step(tune: Tune, iteration: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Draw, train and record iteration ``iteration``; -> the records with its row."""
    folder = tune.folder
    history = [(row["fitness"], row["settings"]) for row in rows]
    settings = mutate(tune.space, history, tune.baseline, seed=tune.config.seed, iteration=iteration)
    say(f"iteration {iteration}/{tune.iterations}: {changes(settings, tune.baseline)}")
    command = [sys.executable, "-m", "detector", "train", *tune.fixed, *train_flags(settings),
               "--project", str(folder), "--name", f"iter{iteration}", "--no-plots"]
    code, seconds = run_iteration(folder, iteration, command)
    run_dir = folder / f"iter{iteration}"
    if code == 0 and not (run_dir / "predictions.json").is_file():
        # Stopped (a Ctrl-C or SIGTERM to the training alone): it saved last.pt and exited 0 short of its epochs,
        # without the final report a finished run writes. Its fitness would be a shorter run's: not recorded.
        shutil.rmtree(run_dir, ignore_errors=True)
        raise KeyboardInterrupt
    metrics = run_metrics(run_dir / "results.csv") if code == 0 else None
    if metrics is None and iteration == 1:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise FirstIterationFailed(f"tune: the first iteration's training failed (exit code {code}, its error above): "
                                   "the data or the flags are wrong, and every iteration would fail alike")
    append_row(folder, iteration, metrics, seconds, settings)
    rows = read_rows(folder)
    keep_weights(folder, rows)  # after the record: weights/ is the recorded best's, or the resume finishes the move
    best = best_row(rows)
    if best is not None:
        write_best(folder, best, len(rows), tune.iterations, tune.fixed)
    if tune.config.plots:
        draw_fitness(folder, rows)
    result = (f"fitness {metrics[0]:.4g} (mAP50-95; mAP50 {metrics[1]:.4g})" if metrics is not None
              else f"failed (exit code {code}): fitness 0 recorded")
    best_text = f"best {best['fitness']:.4g} at iteration {best['iteration']}" if best else "none trained yet"
    say(f"iteration {iteration}/{tune.iterations}: {result} in {seconds:.0f} s; {best_text}")
    return rows
